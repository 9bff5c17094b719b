"""A short train run with its roles in separate `launch` processes on one machine, beside the same
run in one process: the head (supervisor, monitor), a sampler node, a learner node and an evaluator
node, each started as a user starts it on its own machine, sharing this machine's GPU; then the same
config with every role in one process. Figures of each: samples per second over the run's wall
time, the median time between steps, the weight sync (seconds until every sampler acknowledged a
new version, and the megabytes each was sent), and each GPU's utilization over the run
(nvidia-smi, sampled every 0.5 s).

With --two-gpus (a machine of two GPUs): the one-process run, then the head, a sampler node on
GPU 0, a learner node on GPU 1 and an evaluator node on each GPU (five processes), then the same
with the learner data-parallel over both GPUs (c10d NCCL).

A model with random weights writes no program, so every sample would be a format error, which
costs an evaluator nothing. --mix DIR gives the evaluators the candidate mix of real training
instead: [sampler] bench_actions = DIR replaces each completion by a recorded program of its task
(tasks/replay: correct, slower, wrong, failing and malformed programs; --exclude-labels leaves
some out, "hangs" by default), evaluated at GPU sizes (task_size = "auto"), while the model still
generates and the learner still trains on its tokens. --per-gpu N runs N evaluators on each
evaluator node's GPU ([[node]] per_gpu), --staleness 0,1 runs each layout with [learner]
max_staleness = 0 (synchronous) and 1 (step k+1 sampled while step k is evaluated).

    scripts/gpu-check --roles [--roles-args "--size 1.5b --steps 4"]      (on the GPU machine)
    scripts/gpu-check --two-gpus                                          (on a two-GPU machine)
    scripts/gpu-check --two-gpus-parts run --two-gpus-args "--mix tasks/replay --per-gpu 4 --staleness 0,1"
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


# The processes of each layout, after the head: the nodes started with `launch CONFIG --node NAME`.
NODES = {"single": [], "spread": ["eval", "train", "gen"], "two-gpus": ["eval0", "eval1", "train", "gen"],
         "two-gpus-dp": ["eval0", "eval1", "train", "gen"]}


def config(d, a, layout, staleness=0):
    """The run's config: "single", one node with every role; "spread", four [[node]]s on loopback
    sharing the device; "two-gpus" / "two-gpus-dp", the sampler on GPU 0, the learner on GPU 1 (or
    data-parallel on both) and an evaluator node on each GPU."""
    evaluator = 'gpus = "auto"' if a.device.startswith("cuda") else "cpu_slots = 1"
    learner = f'device = "{a.device}"'

    def node(name, roles, extra=""):
        return "\n[[node]]\nname = \"%s\"\nhost = \"127.0.0.1\"\nroles = %s\n%s" % (name, json.dumps(roles), extra)

    if layout == "single":
        nodes = "\n[[node]]\nname = \"local\"\nroles = %s\n%s\n" % (
            json.dumps(["supervisor", "learner", "sampler", "evaluator", "monitor"]), evaluator)
    else:
        two = layout.startswith("two-gpus")
        nodes = node("head", ["supervisor", "monitor"], f"port = {free_port()}\n")
        nodes += node("gen", ["sampler"], 'sampler_devices = ["%s"]\n' % ("cuda:0" if two else a.device))
        nodes += node("train", ["learner"])
        if two:
            learner = 'devices = ["cuda:0", "cuda:1"]' if layout == "two-gpus-dp" else 'device = "cuda:1"'
            per = f"per_gpu = {a.per_gpu}\n" if a.per_gpu > 1 else ""
            nodes += node("eval0", ["evaluator"], "gpus = [0]\n" + per) + node("eval1", ["evaluator"], "gpus = [1]\n" + per)
        else:
            nodes += node("eval", ["evaluator"], evaluator + "\n")
    mix = f'bench_actions = "{a.mix_file}"\n' if a.mix else ""
    evaluating = 'task_size = "auto"\n' if a.mix else ""
    path = os.path.join(d, "%s-s%d.toml" % (layout, staleness))
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
{mix}[learner]
steps = {a.steps}
batch_size = {a.batch}
group_size = {a.group}
minibatch_size = {a.batch * a.group}
lora_rank = 16
lora_alpha = 32
{learner}
max_staleness = {staleness}
dtype = "{a.dtype}"
sync_timeout_s = 600
[evaluator]
timeout_s = {a.timeout}
{evaluating}[experiment]
mode = "{a.mode}"
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
    statuses = dict(db.execute("SELECT status, COUNT(*) FROM samples GROUP BY status").fetchall())
    steps = [(json.loads(s), t) for s, t in db.execute("SELECT stats_json, created_at FROM steps ORDER BY step")]
    db.close()
    when = [datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() for _, t in steps]
    gaps = [b - a for a, b in zip(when, when[1:])]
    learner = [s.get("learner", {}) for s, _ in steps]
    sync = [x["weight_sync_s"] for x in learner if "weight_sync_s" in x]
    mb = [x["weight_sync_mb"] for x in learner if "weight_sync_mb" in x]
    learned = sum(int(x.get("groups", 0) - x.get("groups_skipped", 0)) for x in learner)
    learner_s = [x["learner_s"] for x in learner if x.get("applied")]
    wall = summary.get("wall_s", 0.0)
    return {"ok": summary.get("ok", False), "error": summary.get("error", ""), "samples": samples[0],
            "distinct": samples[1], "steps": len(steps), "wall_s": wall,
            "samples_per_s": samples[0] / wall if wall else 0.0,
            "step_s_median": statistics.median(gaps) if gaps else None,
            "weight_sync_s_median": statistics.median(sync) if sync else None,
            "weight_sync_s_max": max(sync) if sync else None,
            "weight_sync_mb": mb[0] if mb else None, "groups_learned": learned,
            "learner_s_median": statistics.median(learner_s) if learner_s else None,
            "loss": [x.get("loss") for x in learner], "statuses": statuses}


class GpuSampler:
    """nvidia-smi's utilization and memory of every GPU every 0.5 s while a run goes."""

    def __init__(self, path):
        self.path = path
        self.proc = None

    def __enter__(self):
        try:
            self.out = open(self.path, "w")
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                                          "--format=csv,noheader,nounits", "-lms", "500"], stdout=self.out,
                                         stderr=subprocess.DEVNULL)
        except OSError:  # no nvidia-smi (a CPU machine)
            self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.out.close()

    def figures(self):
        per = {}
        if not self.proc:
            return per
        with open(self.path) as f:
            for line in f:
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 3 and all(p.isdigit() for p in parts):
                    per.setdefault(int(parts[0]), []).append((int(parts[1]), int(parts[2])))
        return {str(g): {"util_mean": statistics.mean(u for u, _ in v), "util_busy_share":
                         sum(1 for u, _ in v if u > 0) / len(v), "mem_max_mib": max(m for _, m in v),
                         "samples": len(v)} for g, v in sorted(per.items())}


def run_layout(launch, layout, cfg, d, env, key):
    """The head, then each node of the layout as its own process; the head's exit code and each node's."""
    run_dir = os.path.join(d, key + "-run")
    names = ["head"] + NODES[layout]
    logs = {n: open(os.path.join(d, "%s-%s.log" % (key, n)), "w") for n in names}
    with GpuSampler(os.path.join(d, key + "-gpus.csv")) as gpus:
        procs = {"head": subprocess.Popen([launch, cfg, "--run-dir", run_dir], stdout=logs["head"],
                                          stderr=subprocess.STDOUT, env=env)}
        if NODES[layout]:
            time.sleep(1)
        for n in NODES[layout]:
            procs[n] = subprocess.Popen([launch, cfg, "--node", n], stdout=logs[n], stderr=subprocess.STDOUT, env=env)
        try:
            rc = procs["head"].wait(timeout=3600)
            for n in NODES[layout]:
                procs[n].wait(timeout=120)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in logs.values():
                f.close()
    return run_dir, rc, {n: p.returncode for n, p in procs.items()}, gpus.figures()


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
    ap.add_argument("--mode", default="train", choices=["train", "sdpo"],
                    help="sdpo: per-token advantages from the teacher's execution feedback, so a random model, "
                         "whose groups are all equally wrong (skipped in train mode), still learns every step")
    ap.add_argument("--mix", help="recorded programs ([sampler] bench_actions), e.g. tasks/replay: the candidate mix "
                                  "of real training, at GPU sizes, in place of the model's completions")
    ap.add_argument("--exclude-labels", default="hangs", help="--mix: recorded programs with these labels left out")
    ap.add_argument("--per-gpu", type=int, default=1, help="evaluators on each evaluator node's GPU (two-gpus layouts)")
    ap.add_argument("--staleness", default="0", help="[learner] max_staleness values, each a run of every layout")
    ap.add_argument("--timeout", type=float, default=60, help="[evaluator] timeout_s")
    ap.add_argument("--layouts", help="which runs, comma-separated (single, spread, two-gpus, two-gpus-dp)")
    ap.add_argument("--two-gpus", action="store_true",
                    help="the sampler on GPU 0, the learner on GPU 1, then data-parallel on both (a two-GPU machine)")
    a = ap.parse_args()
    if not a.model:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import policy_throughput
        a.model = policy_throughput.make_model("qwen2", a.size, os.path.join(a.models, "qwen2-" + a.size), a.device)
    d = tempfile.mkdtemp(prefix="kernelrl-roles-bench-")
    a.mix_file = None
    if a.mix:  # one JSONL of the recorded programs kept
        skip = set(x for x in a.exclude_labels.split(",") if x)
        paths = [a.mix] if os.path.isfile(a.mix) else sorted(
            os.path.join(a.mix, x) for x in os.listdir(a.mix) if x.endswith(".jsonl"))
        a.mix_file = os.path.join(d, "mix.jsonl")
        with open(a.mix_file, "w") as f:
            for path in paths:
                for line in open(path):
                    if line.strip() and json.loads(line).get("label") not in skip:
                        f.write(line)
    with open(os.path.join(d, "cluster.secret"), "w") as f:
        f.write(os.urandom(24).hex() + "\n")
    os.chmod(os.path.join(d, "cluster.secret"), 0o600)  # a secret only its owner reads (launch refuses others)
    env = dict(os.environ)
    out = {"model": a.model, "device": a.device, "mode": a.mode, "steps": a.steps, "batch": a.batch, "group": a.group,
           "max_tokens": a.max_tokens, "dir": d, "mix": a.mix, "per_gpu": a.per_gpu}
    layouts = a.layouts.split(",") if a.layouts else ["single"] + (["two-gpus", "two-gpus-dp"] if a.two_gpus
                                                                    else ["spread"])
    labels = {"single": "one process", "spread": "head+sampler+learner+eval",
              "two-gpus": "sampler gpu0, learner gpu1", "two-gpus-dp": "learner NCCL over gpu0+1"}
    stale = [int(x) for x in a.staleness.split(",")]
    keys = []
    for layout in layouts:
        for s in stale:
            key = layout if s == 0 else "%s-stale%d" % (layout, s)
            run_dir, rc, rcs, gpus = run_layout(a.launch, layout, config(d, a, layout, s), d, env, key)
            out[key] = dict(figures(run_dir), rc=rc, node_rcs=rcs, processes=len(rcs), gpus=gpus, layout=layout,
                            max_staleness=s)
            keys.append(key)
    print("%-40s %9s %8s %9s %10s %12s %12s %8s %8s %9s  %s" % (
        "run", "samples", "wall s", "samples/s", "step s", "sync s (med)", "sync s (max)", "MB/ver", "learned",
        "learner s", "GPU util % (mean)"))
    for k in keys:
        f = out[k]
        fmt = lambda v, p=3: "-" if v is None else ("%.*f" % (p, v))  # noqa: E731
        util = " ".join("gpu%s %.0f" % (g, v["util_mean"]) for g, v in f["gpus"].items())
        print("%-40s %9d %8.1f %9.2f %10s %12s %12s %8s %8d %9s  %s" % (
            labels[f["layout"]] + ("" if not f["max_staleness"] else ", stale %d" % f["max_staleness"]), f["samples"], f["wall_s"], f["samples_per_s"], fmt(f["step_s_median"], 2),
            fmt(f["weight_sync_s_median"]), fmt(f["weight_sync_s_max"]), fmt(f["weight_sync_mb"], 1),
            f["groups_learned"], fmt(f["learner_s_median"], 2), util))
        print("  verdicts: %s" % ", ".join("%s %d" % kv for kv in sorted(f["statuses"].items())))
        if f["groups_learned"]:
            print("  losses: %s" % ", ".join("-" if x is None else "%.5g" % x for x in f["loss"]))
        if not f["ok"] or f["samples"] != f["distinct"] or f["rc"] != 0:
            print("  %s: FAILED (rc %s, %d samples, %d distinct): %s" % (labels[k], f["rc"], f["samples"],
                                                                        f["distinct"], f["error"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if a.logs:
        import shutil
        os.makedirs(a.logs, exist_ok=True)
        for name in os.listdir(d):
            if name.endswith(".log"):
                shutil.copy(os.path.join(d, name), os.path.join(a.logs, "roles-" + name))
            if name.endswith("-gpus.csv"):
                shutil.copy(os.path.join(d, name), os.path.join(a.logs, "roles-" + name))
        for key in keys:
            run = key + "-run"
            if os.path.exists(os.path.join(d, run, "store.sqlite")):
                shutil.copy(os.path.join(d, run, "store.sqlite"), os.path.join(a.logs, "roles-%s.sqlite" % run))
    # train: steps x batch x group samples; sdpo samples every task of the split each step
    ok = all(out[k]["ok"] and out[k]["rc"] == 0 and out[k]["samples"] == out[k]["distinct"] > 0 and
             (a.mode != "train" or out[k]["samples"] == a.steps * a.batch * a.group) for k in keys)
    if not a.keep and ok:
        import shutil
        shutil.rmtree(d, ignore_errors=True)
    else:
        print("runs and logs kept in %s" % d)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
