"""A short train run with its roles in separate `launch` processes on one machine, beside the same
run in one process: the head (supervisor, monitor), a sampler node, a learner node and an evaluator
node, each started as a user starts it on its own machine, sharing this machine's GPU; then the same
config with every role in one process. Figures of each: samples per second over the run's wall
time, the median time between steps, and the weight sync (seconds until every sampler
acknowledged a new version, and the megabytes each was sent).

    scripts/gpu-check --roles [--roles-args "--size 1.5b --steps 4"]      (on the GPU machine)
    scripts/python bench/roles_run.py --device cpu --model DIR --steps 2  (anywhere, small)
"""
import argparse
import datetime
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(d, a, spread):
    """The run's config: with spread, four [[node]]s on loopback; else one node with every role."""
    evaluator = 'gpus = "auto"' if a.device.startswith("cuda") else "cpu_slots = 1"

    if spread:
        nodes = f"""
[[node]]
name = "head"
host = "127.0.0.1"
port = {free_port()}
roles = ["supervisor", "monitor"]
[[node]]
name = "gen"
host = "127.0.0.1"
roles = ["sampler"]
sampler_devices = ["{a.device}"]
[[node]]
name = "train"
host = "127.0.0.1"
roles = ["learner"]
[[node]]
name = "eval"
host = "127.0.0.1"
roles = ["evaluator"]
{evaluator}
"""
    else:
        nodes = f"""
[[node]]
name = "local"
roles = ["supervisor", "learner", "sampler", "evaluator", "monitor"]
{evaluator}
"""
    path = os.path.join(d, ("spread" if spread else "single") + ".toml")
    with open(path, "w") as f:
        f.write(f"""
[cluster]
name = "roles-bench"
secret_file = "cluster.secret"
log_level = "info"
join_wait_s = 600.0
{nodes}
[tasks]
dir = "{os.path.join(ROOT, "tasks", "bundled")}"
split = "train"
[policy]
model = "{a.model}"
dtype = "{a.dtype}"
device = "{a.device}"
template = "plain"
[sampler]
backend = "libtorch"
max_tokens = {a.max_tokens}
batch_prompts = {a.batch}
[learner]
steps = {a.steps}
batch_size = {a.batch}
group_size = {a.group}
minibatch_size = {a.batch * a.group}
lora_rank = 16
lora_alpha = 32
device = "{a.device}"
dtype = "{a.dtype}"
sync_timeout_s = 600
[evaluator]
timeout_s = 60
[experiment]
mode = "train"
seed = 1
name = "roles-bench"
run_root = "{os.path.join(d, "runs")}"
[monitor]
progress = false
""")
    return path


def figures(run_dir):
    db = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
    summary = json.loads(db.execute("SELECT summary_json FROM runs").fetchone()[0] or "{}")
    samples = db.execute("SELECT COUNT(*), COUNT(DISTINCT sample_id) FROM samples").fetchone()
    steps = [(json.loads(s), t) for s, t in db.execute("SELECT stats_json, created_at FROM steps ORDER BY step")]
    db.close()
    when = [datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for _, t in steps]
    gaps = [b - a for a, b in zip(when, when[1:])]
    learner = [s.get("learner", {}) for s, _ in steps]
    sync = [x["weight_sync_s"] for x in learner if "weight_sync_s" in x]
    mb = [x["weight_sync_mb"] for x in learner if "weight_sync_mb" in x]
    wall = summary.get("wall_s", 0.0)
    return {"ok": summary.get("ok", False), "error": summary.get("error", ""), "samples": samples[0],
            "distinct": samples[1], "steps": len(steps), "wall_s": wall,
            "samples_per_s": samples[0] / wall if wall else 0.0,
            "step_s_median": statistics.median(gaps) if gaps else None,
            "weight_sync_s_median": statistics.median(sync) if sync else None,
            "weight_sync_s_max": max(sync) if sync else None,
            "weight_sync_mb": mb[0] if mb else None}


def run_single(launch, cfg, d, env):
    run_dir = os.path.join(d, "single-run")
    with open(os.path.join(d, "single.log"), "w") as log:
        p = subprocess.run([launch, cfg, "--run-dir", run_dir], stdout=log, stderr=subprocess.STDOUT, env=env,
                           timeout=3600)
    return run_dir, p.returncode


def run_spread(launch, cfg, d, env):
    run_dir = os.path.join(d, "spread-run")
    logs = {n: open(os.path.join(d, "spread-%s.log" % n), "w") for n in ("head", "gen", "train", "eval")}
    procs = {"head": subprocess.Popen([launch, cfg, "--run-dir", run_dir], stdout=logs["head"],
                                      stderr=subprocess.STDOUT, env=env)}
    time.sleep(1)
    for n in ("eval", "train", "gen"):
        procs[n] = subprocess.Popen([launch, cfg, "--node", n], stdout=logs[n], stderr=subprocess.STDOUT, env=env)
    try:
        rc = procs["head"].wait(timeout=3600)
        for n in ("gen", "train", "eval"):
            procs[n].wait(timeout=120)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()
    return run_dir, rc, {n: p.returncode for n, p in procs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", default=os.path.join(ROOT, "build", "launch"))
    ap.add_argument("--model", help="a model directory (else one of --size is made with random weights)")
    ap.add_argument("--size", default="1.5b", help="with no --model: bench/policy_throughput.py's sizes")
    ap.add_argument("--models", default="/tmp/models", help="where a made model is kept")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="tasks a step")
    ap.add_argument("--group", type=int, default=8, help="samples a task")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the runs' folder (printed)")
    ap.add_argument("--logs", help="copy every process's log here")
    a = ap.parse_args()
    if not a.model:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import policy_throughput
        a.model = policy_throughput.make_model("qwen2", a.size, os.path.join(a.models, "qwen2-" + a.size), a.device)
    d = tempfile.mkdtemp(prefix="kernelrl-roles-bench-")
    with open(os.path.join(d, "cluster.secret"), "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    env = dict(os.environ)
    out = {"model": a.model, "device": a.device, "steps": a.steps, "batch": a.batch, "group": a.group,
           "max_tokens": a.max_tokens, "dir": d}
    single_dir, rc = run_single(a.launch, config(d, a, False), d, env)
    out["single"] = dict(figures(single_dir), rc=rc, processes=1)
    spread_dir, rc, rcs = run_spread(a.launch, config(d, a, True), d, env)
    out["spread"] = dict(figures(spread_dir), rc=rc, node_rcs=rcs, processes=4)
    print("%-28s %9s %8s %9s %10s %12s %12s %8s" % ("run", "samples", "wall s", "samples/s", "step s", "sync s (med)",
                                                   "sync s (max)", "MB/ver"))
    for k, label in (("single", "one process"), ("spread", "head+sampler+learner+eval")):
        f = out[k]
        fmt = lambda v, p=3: "-" if v is None else ("%.*f" % (p, v))  # noqa: E731
        print("%-28s %9d %8.1f %9.2f %10s %12s %12s %8s" % (label, f["samples"], f["wall_s"], f["samples_per_s"],
                                                           fmt(f["step_s_median"], 2), fmt(f["weight_sync_s_median"]),
                                                           fmt(f["weight_sync_s_max"]), fmt(f["weight_sync_mb"], 1)))
        if not f["ok"] or f["samples"] != f["distinct"] or f["rc"] != 0:
            print("  %s: FAILED (rc %s, %d samples, %d distinct): %s" % (label, f["rc"], f["samples"], f["distinct"],
                                                                        f["error"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if a.logs:
        import shutil
        os.makedirs(a.logs, exist_ok=True)
        for name in os.listdir(d):
            if name.endswith(".log"):
                shutil.copy(os.path.join(d, name), os.path.join(a.logs, "roles-" + name))
        for run in ("single-run", "spread-run"):
            if os.path.exists(os.path.join(d, run, "store.sqlite")):
                shutil.copy(os.path.join(d, run, "store.sqlite"), os.path.join(a.logs, "roles-%s.sqlite" % run))
    ok = all(out[k]["ok"] and out[k]["rc"] == 0 and out[k]["samples"] == out[k]["distinct"] == a.steps * a.batch *
             a.group for k in ("single", "spread"))
    if not a.keep and ok:
        import shutil
        shutil.rmtree(d, ignore_errors=True)
    else:
        print("runs and logs kept in %s" % d)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
