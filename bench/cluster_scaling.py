#!/usr/bin/env python3
"""Cluster benchmarks with synthetic evaluators ([evaluator] backend = "synthetic": each answers
one request at a time after a fixed latency and runs nothing), every process started as a user
starts it (`launch CONFIG`, `launch CONFIG --node NAME`) on loopback.

  capacity: samples/s through sampler -> dispatcher -> evaluators -> reward -> store with instant
            evaluators (latency 0): in the head's own process ("local") and on one node across
            the middleman ("remote"). The figure is the whole pipeline's, store included.
  scale:    nodes of E evaluators each with latency L ms, at 1, 2, 4, 8 nodes. Throughput is
            measured while every node is working (from the latest first start to the earliest
            last answer, from the evaluators' own stamps in the store), and compared with k times
            the one-node figure (linear = 1.0).
  gpus:     real candidates (tasks/replay at GPU sizes, --repeat times) on a machine of several
            GPUs: one evaluator node on the first of --gpus, then a node on each of them (--per-gpu
            N: N evaluators sharing each node's GPU). Samples/s from the first to the last sample
            stored, what each added GPU gives against the first, and whether both runs gave every
            candidate the same verdict; each node's device stage busy share (the evaluators' own
            stamps), the reference timings paid for, the processes' CPU seconds; --keep DIR keeps
            each run's store (every record, to read afterwards). On the GPU machine:
            scripts/gpu-check --cluster [--cluster-args "--gpus 0,1,2,3 --per-gpu 4"].

  scripts/python bench/cluster_scaling.py [--parts capacity,scale,gpus] [--nodes 1,2,4,8]
      [--evaluators 4] [--latency-ms 50] [--seconds 10] [--capacity-samples 20000]
      [--gpus 0,1] [--per-gpu 1] [--repeat 2] [--exclude-labels hangs] [--keep DIR] [--json FILE]
"""

import argparse
import glob
import json
import os
import platform
import resource
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
TASKS = os.path.join(ROOT, "tasks", "bundled")
SECRET = "bench-secret-" + os.urandom(12).hex()


def site_of(evaluator_id):
    """The node and device of an evaluator's id ("n/cuda:0" for "n/cuda:0#2", "n/cpu" for "n/cpu-1")."""
    node, _, dev = evaluator_id.partition("/")
    return node + "/" + ("cpu" if dev.startswith("cpu") else dev.split("#")[0])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_run(d, n_samples, nodes, evaluators, latency_ms, head_evaluators=0, max_in_flight=0, gpus=None,
              replay_lines=None, per_gpu=1):
    """A config with a head and `nodes` evaluator nodes (node-0, node-1, ...): synthetic
    evaluators, or with `gpus` per_gpu real evaluators per node on that GPU replaying replay_lines."""
    replay = os.path.join(d, "replay.jsonl")
    tasks = sorted(f[:-3] for f in os.listdir(TASKS) if f.endswith(".py"))
    with open(replay, "w") as f:
        if replay_lines is not None:
            f.writelines(replay_lines)
        for i in range(n_samples if replay_lines is None else 0):
            f.write(json.dumps({"task_id": tasks[i % len(tasks)], "completion": f"return None  # {i}"}) + "\n")
    with open(os.path.join(d, "secret"), "w") as f:
        f.write(SECRET)
    os.chmod(os.path.join(d, "secret"), 0o600)  # launch refuses a secret others can read
    port = free_port() if nodes else 0
    head_roles = '["supervisor", "sampler", "monitor"' + (', "evaluator"]' if head_evaluators else "]")
    text = f"""
[cluster]
name = "bench"
secret_file = "secret"
heartbeat_s = 1.0
peer_timeout_s = 10.0
join_wait_s = 60.0
log_level = "warn"
[[node]]
name = "head"
host = "127.0.0.1"
port = {port}
roles = {head_roles}
cpu_slots = {head_evaluators}
"""
    for k in range(nodes):
        devices = f"gpus = [{gpus[k]}]\nper_gpu = {per_gpu}" if gpus and gpus[k] != "cpu" else \
            f"cpu_slots = {per_gpu if gpus else evaluators}"
        text += f'[[node]]\nname = "node-{k}"\nroles = ["evaluator"]\n{devices}\n'
    evaluator = (f'backend = "synthetic"\nsynthetic_latency_ms = {latency_ms}\nmax_in_flight = {max_in_flight}'
                 if not gpus else 'task_size = "auto"\nmode = "fast"\ntimeout_s = 20\ncompile_workers = 4')
    text += f"""
[tasks]
dir = "{TASKS}"
[sampler]
replay = "{replay}"
[evaluator]
{evaluator}
[experiment]
run_root = "{d}/runs"
[monitor]
progress = false
"""
    path = os.path.join(d, "bench.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


# Each run's {process: CPU seconds (user + system) of it and of the descendants it reaped; a node
# killed at the end loses its workers' share (they die with it, unreaped)}.
CPU_SECONDS = []


def cpu_seconds(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run(cfg, d, nodes):
    """Starts the nodes, then the head; returns (head wall seconds, its output, rows of the store,
    what a check of the nodes shows when some never evaluated: their exit codes, their output's
    tail and the head's log)."""
    logs = open(os.path.join(d, "processes.log"), "w")
    procs = [subprocess.Popen([LAUNCH, cfg, "--node", f"node-{k}"], stdout=logs, stderr=subprocess.STDOUT)
             for k in range(nodes)]
    run_dir = os.path.join(d, "run")
    t0 = time.monotonic()
    before = cpu_seconds(resource.RUSAGE_CHILDREN)  # (every process this one reaped so far)
    head = subprocess.run([LAUNCH, cfg, "--run-dir", run_dir], capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    cpu = {"head": cpu_seconds(resource.RUSAGE_CHILDREN) - before}
    for k, p in enumerate(procs):
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        cpu[f"node-{k}"] = cpu_seconds(resource.RUSAGE_CHILDREN) - before - sum(cpu.values())
    CPU_SECONDS.append(cpu)
    logs.close()
    if head.returncode != 0:
        sys.exit(f"the head failed ({head.returncode}):\n{head.stdout[-2000:]}\n{head.stderr[-2000:]}")
    with open(os.path.join(d, "processes.log"), errors="replace") as f:
        tail = f.read()[-3000:]
    seen = "\n".join([f"exit codes {[p.returncode for p in procs]}", tail, head.stderr[-3000:]])
    con = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
    rows = con.execute("SELECT evaluator_id, record FROM samples").fetchall()
    con.close()
    return wall, head.stdout, rows, seen


def stamps(rows):
    """(evaluator_id, device_start, device_end) of each sample, from its stored msgpack record."""
    import msgpack
    out = []
    for ev, rec in rows:
        r = msgpack.unpackb(rec, raw=False, strict_map_key=False)["result"]
        out.append((ev, r["device_start"], r["device_end"]))
    return out


def node_spans(st):
    """{node: (first device start, last device end)} of stamps `st`, and the window while every
    node worked: (from the last node's first start, to the first node's last end)."""
    nodes = {}
    for ev, s, e in st:
        node = ev.split("/")[0]
        lo, hi = nodes.get(node, (s, e))
        nodes[node] = (min(lo, s), max(hi, e))
    return nodes, max((lo for lo, _ in nodes.values()), default=0.0), min((hi for _, hi in nodes.values()), default=0.0)


def working_window(st):
    """The window while every node evaluated (node_spans), the samples that ran wholly inside it,
    and when each node started."""
    st = [(ev, s, e) for ev, s, e in st if s > 0]  # (answered before the device: no stamps)
    nodes, t0, t1 = node_spans(st)
    if not nodes:
        return {"window_s": 0.0, "window_samples": 0, "window_per_s": 0.0, "node_starts_s": []}
    done = sum(1 for _, s, e in st if t0 <= s and e <= t1)
    first = min(lo for lo, _ in nodes.values())
    return {"window_s": t1 - t0, "window_samples": done, "window_per_s": done / (t1 - t0) if t1 > t0 else 0.0,
            "node_starts_s": sorted(lo - first for lo, _ in nodes.values())}


def sample_spans(rows):
    """{sample_id: (seconds its device stage held it, whether it was its task's first at its site)}."""
    import msgpack
    recs = sorted((msgpack.unpackb(rec, raw=False, strict_map_key=False)["result"] for ev, rec in rows if ev),
                  key=lambda r: r["device_start"])
    seen, out = set(), {}
    for r in recs:
        if r["device_start"] <= 0:
            continue
        key = (r["task_id"], site_of(r["evaluator_id"]))
        out[r["sample_id"]] = (r["device_end"] - r["device_start"], key not in seen)
        seen.add(key)
    return out


def span_growth(one, many):
    """What each candidate's device stage costs with more nodes: the samples that were not their
    task's first at their site (no reference timing) in either run, their seconds in each."""
    both = [sid for sid, (_, first) in one.items() if not first and sid in many and not many[sid][1]]
    if not both:
        return {}
    ratios = [many[s][0] / one[s][0] for s in both if one[s][0] > 0]
    return {"samples": len(both), "one_s": sum(one[s][0] for s in both), "many_s": sum(many[s][0] for s in both),
            "median_ratio": sorted(ratios)[len(ratios) // 2] if ratios else 0.0}


def node_busy(st):
    """{node: [samples, seconds some timing stage of the node held a candidate, its span]}: the
    share of a node's span its device stages were busy (the union of its evaluators' intervals;
    gaps are waits for work: dispatch, transport, the compile stage)."""
    out, intervals = {}, {}
    spans, _, _ = node_spans([(ev, s, e) for ev, s, e in st if s > 0])
    for ev, s, e in st:
        if s <= 0:
            continue
        node = ev.split("/")[0]
        out.setdefault(node, [0, 0.0, 0.0])[0] += 1
        intervals.setdefault(node, []).append((s, e))
    for node, iv in intervals.items():
        busy, end = 0.0, float("-inf")
        for s, e in sorted(iv):
            if e > end:
                busy += e - max(s, end)
                end = e
        out[node][1] = busy
        out[node][2] = spans[node][1] - spans[node][0]
    return out


def run_summary(d):
    con = sqlite3.connect(os.path.join(d, "run", "store.sqlite"))
    (text,) = con.execute("SELECT summary_json FROM runs").fetchone()
    con.close()
    return json.loads(text)


def capacity(args, out):
    res = {}
    for where in ("local", "remote"):
        with tempfile.TemporaryDirectory() as d:
            n = args.capacity_samples
            cfg = write_run(d, n, 0 if where == "local" else 1, args.evaluators, 0,
                            head_evaluators=args.evaluators if where == "local" else 0, max_in_flight=16)
            wall, stdout, rows, _ = run(cfg, d, 0 if where == "local" else 1)
            assert len(rows) == n and len({r[0] for r in rows}) >= 1, "every sample stored"
            summ = run_summary(d)
            span = summ["record_span_s"]
            rate = (n - 1) / span
            res[where] = {"samples": n, "evaluators": args.evaluators, "record_span_s": span,
                          "samples_per_s": rate, "head_wall_s": wall, "run_wall_s": summ["wall_s"]}
            print(f"capacity {where:6}: {n} samples, {args.evaluators} instant evaluators: "
                  f"{rate:,.0f} samples/s stored (first to last sample in the store {span:.2f} s; "
                  f"head process {wall:.1f} s)", flush=True)
    out["capacity"] = res


def scale(args, out):
    per_eval = 1000.0 / args.latency_ms
    res = []
    base = None
    for k in args.nodes:
        n = int(per_eval * args.evaluators * k * args.seconds)
        with tempfile.TemporaryDirectory() as d:
            # max_in_flight 2: enough that an evaluator never waits for the dispatcher's next
            # request across the link, small enough to keep the queue at the head.
            cfg = write_run(d, n, k, args.evaluators, args.latency_ms, max_in_flight=2)
            wall, stdout, rows, seen = run(cfg, d, k)
        st = stamps(rows)
        assert len(st) == n
        nodes, t0, t1 = node_spans(st)  # every node is working from t0 to t1
        if len(nodes) != k:
            missing = sorted(set(f"node-{i}" for i in range(k)) - set(nodes))
            sys.exit(f"{len(nodes)} of {k} nodes evaluated (none from {', '.join(missing)}); nodes' {seen}")
        done = sum(1 for _, s, e in st if t0 <= e <= t1)
        rate = done / (t1 - t0)
        ideal = per_eval * args.evaluators * k
        base = base or rate
        row = {"nodes": k, "evaluators": args.evaluators * k, "samples": n, "window_s": t1 - t0,
               "samples_per_s": rate, "ideal_per_s": ideal, "of_ideal": rate / ideal,
               "of_linear": rate / (base * k / args.nodes[0]), "head_wall_s": wall}
        res.append(row)
        print(f"scale {k} node(s) x {args.evaluators} evaluators at {args.latency_ms:g} ms: {rate:,.1f} samples/s "
              f"over {t1 - t0:.1f} s (ideal {ideal:,.0f}: {rate / ideal:.3f}); vs linear from "
              f"{args.nodes[0]} node(s): {row['of_linear']:.3f}", flush=True)
    out["scale"] = res


def gpus(args, out):
    lines = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tasks", "replay", "*.jsonl"))):
        with open(path) as f:
            lines += [line if line.endswith("\n") else line + "\n" for line in f
                      if line.strip() and json.loads(line).get("label") not in args.exclude_labels]
    lines = lines * args.repeat
    res, verdicts, spans = [], [], []
    for k in (1, len(args.gpus)):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_run(d, 0, k, 1, 0, gpus=args.gpus[:k], replay_lines=lines, per_gpu=args.per_gpu)
            wall, stdout, rows, _ = run(cfg, d, k)
            summ = run_summary(d)
            con = sqlite3.connect(os.path.join(d, "run", "store.sqlite"))
            verdicts.append(dict(con.execute("SELECT sample_id, status FROM samples").fetchall()))
            by_node = dict(con.execute("SELECT evaluator_id, COUNT(*) FROM samples GROUP BY evaluator_id").fetchall())
            # A task's reference is timed once per device of a node (its site): distinct (task, site)
            # pairs are the reference timings the run paid for (the dispatcher's task affinity keeps
            # them near one a task). Sites as actors/dispatcher.cpp site_of makes them.
            pairs = {(t, site_of(e)) for t, e in
                     con.execute("SELECT task_id, evaluator_id FROM samples WHERE evaluator_id != ''").fetchall()}
            con.close()
            if args.keep:  # every record, for reading afterwards
                os.makedirs(args.keep, exist_ok=True)
                shutil.copy(os.path.join(d, "run", "store.sqlite"), os.path.join(args.keep, f"gpus-{k}.sqlite"))
        span = summ["record_span_s"]
        st = stamps(r for r in rows if r[0])
        spans.append(sample_spans(rows))
        window = working_window(st)
        busy = node_busy(st)
        row = {"nodes": k, "gpus": args.gpus[:k], "samples": len(rows), "record_span_s": span,
               "samples_per_s": (len(rows) - 1) / span, "run_wall_s": summ["wall_s"], "by_evaluator": by_node,
               "statuses": summ["status_counts"], "task_site_pairs": len(pairs),
               "tasks": len({t for t, _ in pairs}), "node_busy": busy, "cpu_s": CPU_SECONDS[-1], **window}
        res.append(row)
        print(f"gpus: {k} node(s) on GPU(s) {args.gpus[:k]}: {len(rows)} candidates, {row['samples_per_s']:.2f}/s "
              f"(first to last stored {span:.1f} s, run {summ['wall_s']:.1f} s); {window['window_per_s']:.2f}/s "
              f"while every node evaluated ({window['window_samples']} in {window['window_s']:.1f} s; the nodes' "
              f"first candidates on the device {', '.join(f'{x:.1f}' for x in window['node_starts_s'])} s after the "
              f"first); by evaluator {by_node}; statuses {summ['status_counts']}; {row['task_site_pairs']} task x site "
              f"pairs (reference timings) for {row['tasks']} tasks; device stage busy "
              f"{', '.join(f'{n} {b / sp:.0%} of {sp:.1f} s ({c})' for n, (c, b, sp) in sorted(busy.items()) if sp)}; "
              f"CPU seconds {', '.join(f'{n} {v:.1f}' for n, v in CPU_SECONDS[-1].items())}", flush=True)
    same = sum(1 for sid, st in verdicts[0].items() if verdicts[1].get(sid) == st)
    growth = span_growth(*spans)
    if growth:
        print(f"gpus: the same {growth['samples']} candidates (none its task's first at its site in either run): "
              f"{growth['one_s']:.1f} s of device stage on 1 node, {growth['many_s']:.1f} s on {len(args.gpus)}; "
              f"median ratio {growth['median_ratio']:.2f}", flush=True)
    if res[0]["window_per_s"]:
        w = res[1]["window_per_s"] / res[0]["window_per_s"]
        print(f"gpus: while every node evaluated, {len(args.gpus)} nodes against 1: {w:.2f}x; each added GPU "
              f"{(w - 1) / max(1, len(args.gpus) - 1):.2f} of the first's", flush=True)
    speedup = res[1]["samples_per_s"] / res[0]["samples_per_s"]
    print(f"gpus: {len(args.gpus)} nodes against 1: {speedup:.2f}x samples/s; same verdict for "
          f"{same}/{len(verdicts[0])} candidates", flush=True)
    per_added = (res[1]["samples_per_s"] - res[0]["samples_per_s"]) / res[0]["samples_per_s"] / max(1, len(args.gpus) - 1)
    print(f"gpus: each added GPU gives {per_added:.2f} of the first's samples/s (target 0.9)", flush=True)
    out["gpus"] = {"runs": res, "ratio": speedup, "per_added_gpu": per_added, "same_verdicts": same,
                   "candidates": len(verdicts[0]), "per_gpu": args.per_gpu, "span_growth": growth}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="capacity,scale")
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--evaluators", type=int, default=4, help="synthetic evaluators per node")
    ap.add_argument("--latency-ms", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=10, help="work per scale point, in ideal seconds")
    ap.add_argument("--capacity-samples", type=int, default=20000)
    ap.add_argument("--gpus", default="0,1", help="GPU ids of the gpus part, one node each (cpu,cpu: a dry run on CPU)")
    ap.add_argument("--per-gpu", type=int, default=1, help="evaluators sharing each node's GPU (gpus)")
    ap.add_argument("--repeat", type=int, default=2, help="times the replayed candidates are evaluated (gpus)")
    ap.add_argument("--exclude-labels", default="", help="replayed candidates with these labels are left out (gpus)")
    ap.add_argument("--keep", default="", help="copy each run's store here (gpus: gpus-K.sqlite)")
    ap.add_argument("--launch", default="", help="the launch program (default: build/launch)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.nodes = [int(x) for x in args.nodes.split(",")]
    args.exclude_labels = [x for x in args.exclude_labels.split(",") if x]
    args.gpus = [x if x == "cpu" else int(x) for x in args.gpus.split(",")]  # "cpu,cpu": a dry run
    if args.launch:
        global LAUNCH
        LAUNCH = args.launch
    out = {"machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()})",
           "date": time.strftime("%Y-%m-%d"), "args": vars(args)}
    parts = args.parts.split(",")
    if "capacity" in parts:
        capacity(args, out)
    if "scale" in parts:
        scale(args, out)
    if "gpus" in parts:
        gpus(args, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
