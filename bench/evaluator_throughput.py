"""Evaluator throughput against a fresh-process-per-candidate baseline, on one device.

Part `torch` (torch-only candidates): the bundled replayed candidates (tasks/replay) except the
ones meant to hang or to be caught as hacks (a baseline has no such verdicts), evaluated
  ours      in one `launch evaluate` (one evaluator: compile stage, then the timing stage, a forked
            process per candidate), the whole command timed, start-up included;
  baseline  by bench/baseline_eval.py, one fresh Python process per candidate, one after another.
Both run the tasks' GPU sizes, 5 correctness trials and 50 timed trials. Verdicts must agree (ok,
incorrect, or an error of any kind); candidates per hour and their ratio are printed, whole (start-up
included) and in steady state (from the first candidate on the device to the last verdict: a
training run starts its evaluators once). --samples K evaluates each candidate K times in a row (a
task's group of samples, as training sends them; the baseline runs each once). --per-device N[,M...]: a run with N evaluators sharing the
device (their checks at once, each timed region alone; target >= 20x), then M...; --no-baseline
leaves the baseline out; --logs DIR keeps the workers' logs; --unlocked adds the control of N
launches of one evaluator at once, each with a lock of its own (what the lock costs).

Part `phases` (also the torch part's last step): --phases of those candidates evaluated twice by the
worker's fork server in this process, the second pass timed phase by phase: each candidate's own
phases (from its process), the worker's (reference, hand-over, spare start, collect, judge, exit
waits), the fixed cost (the wall outside the candidate's phases and the reference's timing; target
<= 50 ms median) and format and syntax errors' wall (answered without a process; target <= 5 ms).
With --at-once-devices cuda:0,cuda:1 one such breakdown on each device at once (what evaluators on
other GPUs of the machine cost each other); groups separated by ';' run one after another, and an
entry "spin" is a process keeping a core busy instead (cuda:0,cuda:1;cuda:0,spin: another GPU's
evaluator against a busy core). With --phases-at-once N, then N such breakdowns at once on the
device (N processes, one device lock, as N evaluators share a GPU), their mean phases beside the
first's and the cores busy.

Part `inline` (load_inline CUDA candidates): K distinct one-kernel extensions (the swish kernel of
tests/fixtures/gpu_candidates with a variant number in it, so each builds on its own), evaluated
  cold      `launch evaluate` with an empty build cache and --compile-workers W;
  warm      the same again with the cache now full;
  baseline  the first B of them, a fresh process each with a fresh extension directory.
Also measured: the CPU-seconds one build takes alone (a fresh process, its children's rusage),
giving the rate the cores allow (cores / CPU-seconds per build) that the cold compile stage's rate
is compared with; the device stage's idle time while built candidates waited (from the
evaluator's ready_at/device_start/device_end stamps); isolation overhead per candidate.

Part `parallel`: N plain builds at once outside kernelrl against one alone (how builds scale on
this machine). Part `cpu`: a fixed CPU-bound work in one process, then 2, 4, ... and one per core at
once (the cores the machine really delivers: quota, SMT siblings, turbo limits, a busy host).

Usage: python bench/evaluator_throughput.py --launch PATH [--device cuda:0]
           [--parts torch,phases,inline,parallel,cpu] [--limit N] [--stride N] [--samples K] [--per-device N[,M]]
           [--no-baseline]
           [--phases N] [--phases-at-once N] [--logs DIR] [--inline K]
           [--baseline-inline B] [--compile-workers W] [--parallel N] [--alone WALL,CPU] [--json OUT.json]
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = os.path.join(ROOT, "tasks", "bundled")
PY = os.environ.get("KERNELRL_PYTHON", sys.executable)


def verdict_class(status):
    return status if status in ("ok", "incorrect") else "error"


def run_launch(launch, device, cands, workers, cache_root, timeout_s=120, per_device=1, worker_log="", lock_dir="",
               reference_cache_mb=None):
    """cands: [(task_path, candidate_file)] -> (results, wall seconds, start unix time).
    `reference_cache_mb`: [evaluator] reference_cache_mb (None: the config's default)."""
    cmd = [launch, "evaluate", "--device", device, "--mode", "full", "--timeout", str(timeout_s),
           "--compile-workers", str(workers), "--per-device", str(per_device), "--json"]
    if reference_cache_mb is not None:
        cmd += ["--reference-cache-mb", f"{reference_cache_mb:g}"]
    if worker_log:
        cmd += ["--worker-log", worker_log]
    for task, f in cands:
        cmd += ["--task", task, "--candidate", f]
    env = dict(os.environ, XDG_CACHE_HOME=cache_root)
    if lock_dir:  # a device lock of its own: not shared with the other launches
        os.makedirs(lock_dir, exist_ok=True)
        env["KERNELRL_LOCK_DIR"] = lock_dir
    t_start = time.time()
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"launch evaluate exited {out.returncode}")
    return [json.loads(l) for l in out.stdout.splitlines() if l.strip()], wall, t_start


def run_baseline(device, task, cand, ref_cache, ext_dir, timeout_s=120):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext_dir)
    t0 = time.monotonic()
    try:
        p = subprocess.Popen([PY, os.path.join(ROOT, "bench", "baseline_eval.py"), "--task", task,
                              "--candidate", cand, "--device", device, "--ref-cache", ref_cache],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        stdout, stderr = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return {"status": "timeout", "error": f"over {timeout_s} s", "wall_s": time.monotonic() - t0}
    wall = time.monotonic() - t0
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"status": "runtime_error", "error": f"process ended with {p.returncode}: {stderr[-300:]}",
                "wall_s": wall}
    res = json.loads(lines[-1])
    res["wall_s"] = wall
    return res


def device_idle(results):
    """Seconds the device stage sat idle between two candidates while the next was already ready."""
    rs = sorted((r for r in results if r.get("device_start")), key=lambda r: r["device_start"])
    gaps = []
    for prev, nxt in zip(rs, rs[1:]):
        if nxt["ready_at"] <= prev["device_end"]:
            gaps.append(max(0.0, nxt["device_start"] - prev["device_end"]))
    return {"gaps": len(gaps), "total_s": sum(gaps), "max_s": max(gaps, default=0.0)}


def part_phases(args, work, out):
    """The phase-by-phase breakdown alone (the torch part's last step), on --phases candidates;
    with --phases-at-once N, then N such breakdowns at once on the device (N worker processes, one
    lock: as N evaluators share a GPU), their means beside the first's: which phase grows."""
    cands = replay_candidates(args, work)
    print(f"[phases] {min(len(cands), args.phases)} candidates, in the worker's process", flush=True)
    t0 = time.time()
    out["phases"] = phase_breakdown(args, cands[:args.phases])
    out["phases"]["unix_span"] = [t0, time.time()]  # (to read a GPU utilisation log sampled beside it)
    if args.at_once_devices and ";" in args.at_once_devices:
        out["phases_at_once_groups"] = [phases_at_once(args, work, out["phases"], devices=g.split(","))
                                        for g in args.at_once_devices.split(";")]
    elif args.phases_at_once > 1 or args.at_once_devices:
        out["phases_at_once"] = phases_at_once(args, work, out["phases"])
        if args.unlocked:
            out["phases_at_once_unlocked"] = phases_at_once(args, work, out["phases"], unlocked=True)


def _busy_cores():
    """(busy, total) jiffies of all cores: all but idle and iowait."""
    v = _cpu_jiffies()
    return sum(v) - v[3] - v[4], sum(v)


def _spin_until(stop):
    """A busy core (the CPU-bound loop of part cpu) until ``stop`` (an Event) is set."""
    while not stop.is_set():
        _spin(0.05)


def phases_at_once(args, work, alone, unlocked=False, devices=None):
    """N breakdowns (N processes, each a worker's fork server) at once; `unlocked`: each with a
    device lock of its own (nothing keeps their timed regions apart). A device named "spin" is a
    process keeping one core busy meanwhile in place of a breakdown (the control for the host's
    share: does a busy core cost what another GPU's evaluator costs?)."""
    if devices is None:
        devices = args.at_once_devices.split(",") if args.at_once_devices else [args.device] * args.phases_at_once
    spins = devices.count("spin")
    devices = [d for d in devices if d != "spin"]
    n = len(devices)
    argv = [PY, os.path.abspath(__file__), "--launch", args.launch, "--parts", "phases",
            "--phases", str(args.phases), "--stride", str(args.stride), "--limit", str(args.limit),
            "--timing-precision", str(args.timing_precision)] + (["--gpu-dir", args.gpu_dir] if args.gpu_dir else [])
    if args.reference_cache_mb[0] is not None:
        argv += ["--reference-cache-mb", f"{args.reference_cache_mb[0]:g}"]
    files = [os.path.join(work, f"at-once-{k}{'-unlocked' if unlocked else ''}.json") for k in range(n)]
    envs = [dict(os.environ, KERNELRL_LOCK_DIR=os.path.join(work, f"lock-{k}")) if unlocked else None
            for k in range(n)]
    for e in envs:
        if e:
            os.makedirs(e["KERNELRL_LOCK_DIR"], exist_ok=True)
    b0, t0 = _busy_cores()
    u0 = time.time()
    w0 = time.monotonic()
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    spinners = [ctx.Process(target=_spin_until, args=(stop,)) for _ in range(spins)]
    for s in spinners:
        s.start()
    procs = [subprocess.Popen(argv + ["--device", dev, "--json", f], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=e)
             for f, e, dev in zip(files, envs, devices)]
    logs = [p.communicate()[0] for p in procs]
    wall = time.monotonic() - w0
    stop.set()
    for s in spinners:
        s.join()
    b1, t1 = _busy_cores()
    busy = os.cpu_count() * (b1 - b0) / max(1, t1 - t0)
    got = []
    for k, (p, f) in enumerate(zip(procs, files)):
        if p.returncode != 0 or not os.path.exists(f):
            print(f"[phases] at once: breakdown {k} failed ({p.returncode}):\n{logs[k][-3000:]}", flush=True)
            continue
        with open(f) as g:
            got.append(json.load(g)["phases"])
    if not got:
        return {}

    def mean_of(key):
        keys = sorted({k for g in got for k in g.get(key, {})})
        return {k: statistics.fmean(g.get(key, {}).get(k, 0.0) for g in got) for k in keys}

    res = {"processes": n, "devices": devices, "spinning_cores": spins, "unlocked": unlocked, "completed": len(got),
           "wall_s": wall, "busy_cores": busy, "unix_span": [u0, time.time()],
           "wall_mean_s": statistics.fmean(g["wall_mean_s"] for g in got)}
    tag = (f"{n} breakdowns at once on {','.join(devices)}{', each its own lock' if unlocked else ''}"
           + (f", {spins} cores kept busy" if spins else ""))
    print(f"[phases] {tag} ({len(got)} completed) in {wall:.1f} s (both passes), {busy:.1f} of "
          f"{os.cpu_count()} cores busy on average; candidate wall mean {res['wall_mean_s']:.3f} s "
          f"(alone {alone['wall_mean_s']:.3f} s)", flush=True)
    for key, side in (("mean_s", "the candidate's process"), ("worker_mean_s", "the worker"),
                      ("judge_mean_s", "the judge")):
        m = res[key] = mean_of(key)
        print(f"[phases] {side}, mean, at once (alone): " + " ".join(
            f"{k} {v:.3f} ({alone.get(key, {}).get(k, 0.0):.3f})" for k, v in m.items()), flush=True)
    return res


def replay_candidates(args, work):
    cands = []
    replay = os.path.join(ROOT, "tasks", "replay")
    for name in sorted(os.listdir(replay)):
        with open(os.path.join(replay, name)) as f:
            for i, line in enumerate(l for l in f if l.strip()):
                rec = json.loads(line)
                if rec["expect_status"] in ("timeout", "hacked"):
                    continue
                path = os.path.join(work, f"{rec['task_id']}-{i}.txt")
                with open(path, "w") as g:
                    g.write(rec["completion"])
                cands.append((os.path.join(TASKS, rec["task_id"] + ".py"), path, rec["expect_status"]))
    cands = cands[::args.stride]
    return cands[:args.limit] if args.limit else cands


def part_torch(args, work, out):
    distinct = replay_candidates(args, work)
    # --samples K: each candidate K times in a row, as a training step's group of K samples of one
    # task reaches the evaluators (each task's reference is then timed once for K candidates, as in
    # a run, not once for about every candidate). The baseline runs the distinct candidates once:
    # its fresh process per candidate costs the same whatever K (its reference timings are cached
    # by task as well, after the first).
    cands = [c for c in distinct for _ in range(args.samples)]
    n = len(cands)
    print(f"[torch] {n} candidates over {len({c[0] for c in cands})} tasks ({len(distinct)} distinct, "
          f"{args.samples} sample(s) each)", flush=True)

    # No candidate here builds anything: the evaluator's default two compile workers. With
    # --per-device N[,M...], N evaluators share the device (issue 53, target 3: >= 20x the baseline),
    # one run of `launch evaluate` each. Steady state: candidates after the first over the span from
    # the first candidate on the device to the last verdict (the evaluators' start-up left out: a
    # training run starts them once).
    runs = []
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    for per, mb in [(p, m) for m in args.reference_cache_mb for p in args.per_device]:
        tag = f"{per}" + (f"-ref{mb:g}" if mb is not None else "")
        log = os.path.join(args.logs, f"worker-per{tag}.log") if args.logs else ""
        ours, wall, t_start = run_launch(args.launch, args.device, [(t, f) for t, f, _ in cands], 2,
                                         os.path.join(work, f"cache-torch-{tag}"), per_device=per, worker_log=log,
                                         reference_cache_mb=mb)
        iso = [r["isolation_s"] for r in ours]
        first = min(r["device_start"] for r in ours)
        startup = first - t_start
        span = max(r["device_end"] for r in ours) - first
        steady = 3600 * (n - 1) / span if span > 0 else 0.0
        print(f"[torch] ours, {per} evaluator(s) on the device"
              f"{'' if mb is None else f', reference_cache_mb = {mb:g}'}: {n} in {wall:.1f} s = {3600 * n / wall:.0f} "
              f"candidates/hour; start-up (launch start to the first candidate on the device) {startup:.2f} s; "
              f"steady state {steady:.0f} candidates/hour ({span:.1f} s from the first on the device to the last "
              f"verdict); isolation (fork to first instruction) median {statistics.median(iso):.4f} s, "
              f"max {max(iso):.4f} s", flush=True)
        raw = [{k: v for k, v in r.items() if k not in ("compile_log", "output")} for r in ours]
        runs.append({"per_device": per, "reference_cache_mb": mb, "ours": ours, "wall": wall, "startup_s": startup, "steady_per_hour": steady,
                     "span_s": span, "iso": iso, "raw": raw})
    # The control: N launches of one evaluator each at once on the device, each with a lock of its
    # own (nothing keeps their timed regions apart): what N evaluators give without the lock.
    unlocked = []
    for per in [p for p in args.per_device if p > 1] if args.unlocked else []:
        with concurrent.futures.ThreadPoolExecutor(per) as ex:
            futs = [ex.submit(run_launch, args.launch, args.device, [(t, f) for t, f, _ in cands[k::per]], 2,
                              os.path.join(work, f"cache-unlocked-{per}-{k}"), 120, 1, "",
                              os.path.join(work, f"lock-{per}-{k}")) for k in range(per)]
            got = [f.result()[0] for f in futs]
        every = [r for g in got for r in g]
        span = max(r["device_end"] for r in every) - min(r["device_start"] for r in every)
        # each launch's own start-up differs: the span while all of them were evaluating
        start = max(min(r["device_start"] for r in g) for g in got)
        end = min(max(r["device_end"] for r in g) for g in got)
        inside = sum(1 for r in every if r["device_start"] >= start and r["device_end"] <= end)
        both = 3600 * inside / (end - start) if end > start else 0.0
        print(f"[torch] control, {per} launches of one evaluator, each its own lock: {len(every)} candidates, "
              f"{3600 * (len(every) - 1) / span:.0f} candidates/hour from the first on the device to the last; "
              f"{both:.0f}/hour while all {per} evaluated ({inside} candidates in {end - start:.1f} s)", flush=True)
        unlocked.append({"per_device": per, "span_s": span, "per_hour": 3600 * (len(every) - 1) / span,
                         "all_busy_per_hour": both, "statuses": [r["status"] for r in every]})

    base, bwall = [], 0.0
    if not args.no_baseline:
        ref_cache = os.path.join(work, "baseline-ref.json")
        t0 = time.monotonic()
        for task, f, _ in distinct:
            b = run_baseline(args.device, task, f, ref_cache, os.path.join(work, "ext-torch"))
            base += [b] * args.samples
        bwall = (time.monotonic() - t0) * args.samples  # (the per-candidate rate of the distinct ones)
        print(f"[torch] baseline: {len(distinct)} in {bwall / args.samples:.1f} s = {3600 * n / bwall:.0f} "
              f"candidates/hour; "
              f"process wall mean {statistics.fmean(b['wall_s'] for b in base):.2f} s", flush=True)

    out["torch"] = {"candidates": n, "baseline_wall_s": bwall or None, "unlocked": unlocked,
                    "baseline_per_hour": 3600 * n / bwall if bwall else None, "runs": []}
    for run in runs:
        ours, wall, per = run["ours"], run["wall"], run["per_device"]
        agree, rows = 0, []
        for (task, f, expected), o, b in zip(cands, ours, base or [{}] * n):
            same = verdict_class(o["status"]) == verdict_class(b.get("status", expected))
            agree += same
            rows.append({"candidate": os.path.basename(f), "expected": expected, "ours": o["status"],
                         "baseline": b.get("status"), "agree": same, "ours_ms": o["runtime_ms"],
                         "baseline_ms": b.get("runtime_ms", 0.0), "ours_ref_ms": o["ref_runtime_ms"],
                         "baseline_ref_ms": b.get("ref_runtime_ms", 0.0), "ours_wall_s": o["wall_s"],
                         "baseline_wall_s": b.get("wall_s"), "ours_error": o["error"][:160],
                         "baseline_error": b.get("error", "")[:160]})
            if not same:
                print(f"[torch] DISAGREE {os.path.basename(f)}: ours {o['status']} ({o['error'][:80]}) "
                      f"{'baseline' if base else 'expected'} {b.get('status', expected)} "
                      f"({b.get('error', '')[:80]})", flush=True)
        idle = device_idle(ours)
        print(f"[torch] {per} evaluator(s): device stage idle while a candidate waited: {idle['total_s']:.4f} s "
              f"over {idle['gaps']} hand-overs (max {idle['max_s']:.4f} s)", flush=True)
        row = {"per_device": per, "reference_cache_mb": run["reference_cache_mb"], "ours_wall_s": wall, "ours_per_hour": 3600 * n / wall, "agree": agree,
               "steady_per_hour": run["steady_per_hour"], "span_s": run["span_s"], "startup_s": run["startup_s"],
               "isolation_median_s": statistics.median(run["iso"]), "isolation_max_s": max(run["iso"]),
               "device_idle": idle, "rows": rows, "raw": run["raw"]}
        if bwall:
            target = 5 if per == 1 else 20
            row["ratio"], row["steady_ratio"] = bwall / wall, run["steady_per_hour"] / (3600 * n / bwall)
            print(f"[torch] verdicts agree {agree}/{n}; throughput ours ({per} evaluator(s) on the device)/baseline "
                  f"{row['ratio']:.2f}x, steady state {row['steady_ratio']:.2f}x (target >= {target}x)", flush=True)
        else:
            print(f"[torch] verdicts as expected {agree}/{n} (no baseline run)", flush=True)
        out["torch"]["runs"].append(row)
    if args.phases:
        out["torch"]["phases"] = phase_breakdown(args, cands[:args.phases])


def phase_breakdown(args, cands, action_space="forward_body", size=None, tag="phases", extra=None):
    """Where a candidate's time goes inside its process (the worker's fork server, in-process):
    cands [(task path, action file, expected)], each evaluated twice, the second pass printed
    phase by phase (the candidate's process's, the worker's and the judge's). `size` is the
    harness's ("gpu": the bundled tasks' GPU sizes; "cpu": a task's own, KernelBench's); `extra`
    settings on top of the defaults. Returns the means, and a row per candidate."""
    if not cands:
        return {}
    gpu_dir = getattr(args, "gpu_dir", "")  # (bench/kernelbench_parity.py has no --gpu-dir)
    precision = args.timing_precision
    if precision is None:  # (kernelbench_parity's default: the config's, 0.005 in core/config.hpp)
        precision = 0.005
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    ForkServer = gpu_package(gpu_dir).ForkServer
    if size is None:
        size = "gpu" if args.device.startswith("cuda") else "cpu"
    settings = {"correctness_trials": 5, "warmup": 2, "fast_trials": 5, "full_trials": 50,
                "atol_fp32": 1e-4, "rtol_fp32": 1e-4, "atol_half": 1e-2, "rtol_half": 1e-2,
                "timeout_s": 600, "compile_timeout_s": 600, "memory_limit_mb": 0 if size == "cpu" else 16384,
                "reverify_speedup": 10.0, "size": size, "timing_precision": precision, **(extra or {})}
    mb = (getattr(args, "reference_cache_mb", None) or [None])[0]
    if mb is not None:
        settings["reference_cache_mb"] = mb
    server = ForkServer(args.device, 1)
    rows = []
    sums, walls, fixed, formats, worker_sums, judge_sums = {}, [], [], [], {}, {}
    for rep in range(2):  # the first pass times each task's reference; the second is measured
        for i, (task, f, _) in enumerate(cands):
            with open(f) as g:
                action = g.read()
            req = {"sample_id": os.path.basename(f), "task_id": os.path.splitext(os.path.basename(task))[0],
                   "task_path": task, "action": action, "action_space": action_space, "mode": "full", "seed": 42}
            r = server.evaluate(req, settings)
            if rep == 0:
                continue
            walls.append(r["wall_s"])
            ph = dict(r.get("phases", {}))
            wp = dict(r.get("worker_phases", {}))
            ph["fork"] = r.get("isolation", {}).get("child_start_s", 0.0)
            # The fixed cost: the wall outside the candidate's own phases (its process's phases,
            # from the first thing it does to its release) and the reference's timing.
            rest = r["wall_s"] - sum(ph.values()) - wp.get("reference", 0.0)
            ph["exit_and_rest"] = rest
            if r["status"] == "format_error":
                formats.append(r["wall_s"])
            else:
                fixed.append(rest)
            for k, v in ph.items():
                sums[k] = sums.get(k, 0.0) + v
            for k, v in wp.items():
                worker_sums[k] = worker_sums.get(k, 0.0) + v
            rows.append({"candidate": req["sample_id"], "status": r["status"], "wall_s": r["wall_s"],
                         "runtime_ms": (r.get("runtime") or {}).get("median_ms", 0.0),
                         "ref_ms": (r.get("ref_runtime") or {}).get("median_ms", 0.0),
                         "checks": len(r.get("judge_checked", [])),
                         "link": (r.get("correctness") or {}).get("link", ""),
                         "comparison": (r.get("correctness") or {}).get("comparison", ""),
                         "error": (r.get("error") or "")[:300],
                         "phases": ph, "worker_phases": wp, "judge_phases": r.get("judge_phases", {})})
            jp = dict(r.get("judge_phases", {}))
            for k, v in jp.items():
                judge_sums[k] = judge_sums.get(k, 0.0) + v
            print(f"[{tag}] {req['sample_id']:28} {r['status']:13} {r['wall_s']:.3f} s  "
                  + " ".join(f"{k} {v:.3f}" for k, v in ph.items())
                  + "  | worker " + " ".join(f"{k} {v:.3f}" for k, v in wp.items())
                  + "  | judge " + " ".join(f"{k} {v:.3f}" for k, v in jp.items())
                  + (f"  | {r['error'][:200]}" if r["status"] not in ("ok", "incorrect") and r.get("error") else ""),
                  flush=True)
    server.close()
    n = max(1, len(walls))
    mean = {k: v / n for k, v in sums.items()}
    print(f"[{tag}] mean per candidate: " + " ".join(f"{k} {v:.3f}" for k, v in mean.items())
          + f" (wall {statistics.fmean(walls):.3f} s, CUDA init at start-up {server.info['cuda_init_s']:.3f} s)",
          flush=True)
    print(f"[{tag}] the worker's side, mean: " + " ".join(f"{k} {v / n:.3f}" for k, v in worker_sums.items()),
          flush=True)
    print(f"[{tag}] the judge's side, mean: " + " ".join(f"{k} {v / n:.3f}" for k, v in judge_sums.items()),
          flush=True)
    out = {"mean_s": mean, "wall_mean_s": statistics.fmean(walls), "rows": rows,
           "worker_mean_s": {k: v / n for k, v in worker_sums.items()},
           "judge_mean_s": {k: v / n for k, v in judge_sums.items()}}
    if fixed:
        out["fixed_median_s"] = statistics.median(fixed)
        print(f"[{tag}] fixed cost (outside the candidate's phases and the reference's timing): median "
              f"{1000 * out['fixed_median_s']:.1f} ms over {len(fixed)} (target <= 50 ms)", flush=True)
    if formats:
        out["format_error_median_s"] = statistics.median(formats)
        print(f"[{tag}] format and syntax errors: median {1000 * out['format_error_median_s']:.2f} ms over "
              f"{len(formats)} (target <= 5 ms, no process started)", flush=True)
    return out


INLINE_TASK = os.path.join(TASKS, "06_swish.py")


def inline_variants(work, k):
    with open(os.path.join(ROOT, "tests", "fixtures", "gpu_candidates", "swish_cuda.txt")) as f:
        text = f.read()
    assert "swish_kernel" in text
    paths = []
    for i in range(k):
        p = os.path.join(work, f"swish_variant_{i:02d}.txt")
        with open(p, "w") as g:
            g.write(text.replace("swish_kernel", f"swish_kernel_v{i}"))
        paths.append(p)
    return paths


def gpu_package(gpu_dir):
    """The worker module of this tree's gpu package, or of the gpu/ folder gpu_dir (another tree's,
    for a comparison: a package, imported as `gpu` from there, or an older tree's flat modules)."""
    import importlib
    import importlib.util
    if not gpu_dir:
        sys.path.insert(0, ROOT)
        return importlib.import_module("gpu.worker")
    gpu_dir = os.path.abspath(gpu_dir)
    if not os.path.exists(os.path.join(gpu_dir, "__init__.py")):  # before gpu/ was a package
        sys.path.insert(0, gpu_dir)
        return importlib.import_module("worker")
    spec = importlib.util.spec_from_file_location("gpu", os.path.join(gpu_dir, "__init__.py"),
                                                  submodule_search_locations=[gpu_dir])
    sys.modules["gpu"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["gpu"])
    return importlib.import_module("gpu.worker")


def build_process(variant_file, ext_dir):
    """A fresh Python process that builds a variant's kernels (the code before its forward body)
    with torch's own load_inline, as a plain program would."""
    script = ("import sys, types; sys.path.insert(0, %r)\nfrom gpu.scaffold import FORWARD_MARKER\n"
              "code = open(sys.argv[1]).read().split(FORWARD_MARKER)[0]\n"
              "exec(compile(code, 'build', 'exec'), types.ModuleType('m').__dict__)\n"
              % ROOT)
    return subprocess.Popen([PY, "-c", script, variant_file], env=dict(os.environ, TORCH_EXTENSIONS_DIR=ext_dir))


def build_cpu_seconds(work, variant_file):
    """One build alone in a fresh process: (wall seconds, CPU seconds of it and its children)."""
    t0 = time.monotonic()
    p = build_process(variant_file, os.path.join(work, "ext-alone"))
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    if status != 0:
        raise SystemExit(f"the lone build failed ({status})")
    return wall, ru.ru_utime + ru.ru_stime


def alone_build(args, work, variant_file):
    """(wall, CPU seconds) of one build alone: --alone's "WALL,CPU" when given (measured before),
    else measured now on `variant_file`."""
    if args.alone:
        wall, cpu = (float(x) for x in args.alone.split(","))
        return wall, cpu
    return build_cpu_seconds(work, variant_file)


def _cpu_jiffies():
    """The machine's line of /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal, ..."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _cpu_times():
    v = _cpu_jiffies()
    return sum(v), v[7] if len(v) > 7 else 0  # all jiffies, steal


def _spin(seconds_of_work):
    """CPU-bound work of a fixed size (no memory traffic to speak of)."""
    x = 0
    for i in range(int(seconds_of_work * 2e7)):
        x += i * i
    return x


def part_cpu(args, work, out):
    """What the machine's cores deliver: the same fixed CPU-bound work in 1 process, then in one
    process per core at once; effective cores = cores * (time alone / time at once). A CPU quota
    (cgroup cpu.max), SMT siblings or a busy host show here, before any compiler runs."""
    import multiprocessing as mp
    cores = os.cpu_count()
    quota = ""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota = f.read().strip()
    except OSError:
        pass
    ctx = mp.get_context("fork")

    def timed(n):
        t0 = time.monotonic()
        ps = [ctx.Process(target=_spin, args=(1.0,)) for _ in range(n)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        return time.monotonic() - t0

    alone = timed(1)
    # The ladder: how a process's speed falls as more cores work (turbo limits, SMT siblings that
    # the guest sees as cores): the time of n at once against one alone.
    ladder = {}
    n = 2
    while n < cores:
        ladder[n] = timed(n)
        n *= 2
    tot0, steal0 = _cpu_times()
    full = timed(cores)
    tot1, steal1 = _cpu_times()
    ladder[cores] = full
    eff = cores * alone / full
    steal = (steal1 - steal0) / max(1, tot1 - tot0)
    threads = ""
    try:
        threads = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        threads = " ".join(l.split(":", 1)[1].strip() for l in threads.splitlines()
                           if l.startswith(("Thread(s) per core", "Core(s) per socket", "Socket(s)")))
    except OSError:
        pass
    print(f"[cpu] {cores} cores (affinity {len(os.sched_getaffinity(0))}, cgroup cpu.max '{quota}', "
          f"threads/core cores/socket sockets: {threads}); fixed work alone {alone:.2f} s, {cores} at once "
          f"{full:.2f} s: {eff:.1f} effective cores, steal {100 * steal:.1f}%", flush=True)
    print("[cpu] n at once: each as slow as alone x " + ", ".join(f"{k}: {v / alone:.2f}" for k, v in ladder.items()),
          flush=True)
    out["cpu"] = {"cores": cores, "cpu_max": quota, "lscpu": threads, "alone_s": alone, "all_s": full,
                  "effective_cores": eff, "steal_fraction": steal,
                  "ladder_s": {str(k): v for k, v in ladder.items()}}


def part_parallel(args, work, out):
    """The machine alone, without kernelrl: N standalone builds at once (plain processes), against
    one build alone: how far parallel builds scale here, and the hypervisor's steal time."""
    n = args.parallel
    files = inline_variants(work, n + 1)
    alone_wall, alone_cpu = alone_build(args, work, files[n])
    tot0, steal0 = _cpu_times()
    t0 = time.monotonic()
    procs = [build_process(f, os.path.join(work, f"ext-par-{i}")) for i, f in enumerate(files[:n])]
    cpu = 0.0
    for p in procs:
        _, status, ru = os.wait4(p.pid, 0)
        cpu += ru.ru_utime + ru.ru_stime
    wall = time.monotonic() - t0
    tot1, steal1 = _cpu_times()
    steal = (steal1 - steal0) / max(1, tot1 - tot0)
    print(f"[parallel] one build alone {alone_wall:.1f} s ({alone_cpu:.1f} CPU-s); {n} at once: {wall:.1f} s, "
          f"{cpu / n:.1f} CPU-s each, steal {100 * steal:.1f}% of CPU time; speed-up {n * alone_wall / wall:.2f}x "
          f"of {n}x", flush=True)
    out["parallel"] = {"n": n, "alone_wall_s": alone_wall, "alone_cpu_s": alone_cpu, "wall_s": wall,
                       "cpu_s_each": cpu / n, "steal_fraction": steal}


def part_inline(args, work, out):
    k, b = args.inline, args.baseline_inline
    files = inline_variants(work, k + 1)
    alone_wall, alone_cpu = alone_build(args, work, files[k])
    cores = os.cpu_count()
    allowed = cores / alone_cpu  # builds per second the cores allow
    print(f"[inline] one build alone: {alone_wall:.1f} s wall, {alone_cpu:.1f} CPU-s; {cores} cores "
          f"allow {3600 * allowed:.0f} builds/hour", flush=True)

    cache = os.path.join(work, "cache-inline")
    cands = [(INLINE_TASK, f) for f in files[:k]]
    cold, cold_wall, t_start = run_launch(args.launch, args.device, cands, args.compile_workers, cache)
    statuses = {r["status"] for r in cold}
    built = max(r["ready_at"] for r in cold) - t_start  # launch start to the last build done
    compile_rate = k / built
    print(f"[inline] cold: {k} in {cold_wall:.1f} s = {3600 * k / cold_wall:.0f}/hour (statuses {statuses}); "
          f"all built {built:.1f} s after start: {3600 * compile_rate:.0f} builds/hour = "
          f"{100 * compile_rate / allowed:.0f}% of what the cores allow (target >= 80%)", flush=True)
    cold_idle = device_idle(cold)
    print(f"[inline] device stage idle while a built candidate waited: {cold_idle['total_s']:.4f} s over "
          f"{cold_idle['gaps']} hand-overs (max {cold_idle['max_s']:.4f} s)", flush=True)

    warm, warm_wall, _ = run_launch(args.launch, args.device, cands, args.compile_workers, cache)
    cached = sum(1 for r in warm if r["compile_cached"])
    print(f"[inline] warm: {k} in {warm_wall:.1f} s = {3600 * k / warm_wall:.0f}/hour ({cached} from the cache)",
          flush=True)

    base = []
    t0 = time.monotonic()
    for i, (task, f) in enumerate(cands[:b]):
        base.append(run_baseline(args.device, task, f, os.path.join(work, "baseline-ref.json"),
                                 os.path.join(work, f"ext-baseline-{i}"), timeout_s=900))
    bwall = time.monotonic() - t0
    per = bwall / max(1, b)
    agree = sum(verdict_class(x["status"]) == verdict_class(y["status"]) for x, y in zip(base, cold))
    print(f"[inline] baseline: {b} in {bwall:.1f} s = {per:.1f} s each = {3600 / per:.0f}/hour; "
          f"statuses {[x['status'] for x in base]}, agree with ours {agree}/{b}; "
          f"ours cold {per * k / cold_wall:.1f}x, warm {per * k / warm_wall:.1f}x", flush=True)
    out["inline"] = {
        "candidates": k, "compile_workers": args.compile_workers, "cores": cores,
        "alone_build_wall_s": alone_wall, "alone_build_cpu_s": alone_cpu,
        "cores_allow_per_hour": 3600 * allowed, "cold_wall_s": cold_wall, "all_built_s": built,
        "compile_per_hour": 3600 * compile_rate, "compile_efficiency": compile_rate / allowed,
        "cold_per_hour": 3600 * k / cold_wall, "warm_wall_s": warm_wall, "warm_per_hour": 3600 * k / warm_wall,
        "warm_cached": cached, "device_idle_cold": cold_idle, "device_idle_warm": device_idle(warm),
        "baseline_candidates": b, "baseline_wall_s": bwall, "baseline_per_hour": 3600 / per,
        "baseline_agree": agree, "statuses_cold": sorted(statuses),
        "compile_s": [r["compile_s"] for r in cold], "isolation_s": [r["isolation_s"] for r in cold + warm],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--parts", default="torch,inline")
    ap.add_argument("--limit", type=int, default=0, help="torch part: first N candidates only")
    ap.add_argument("--stride", type=int, default=1, help="torch part: every Nth candidate")
    ap.add_argument("--samples", type=int, default=1, help="torch part: each candidate this many times in a row "
                    "(a task's group of samples; the baseline runs each once)")
    ap.add_argument("--phases", type=int, default=12, help="torch part: candidates timed phase by phase")
    ap.add_argument("--timing-precision", type=float, default=0.005,
                    help="phases part: [evaluator] timing_precision (0: every timed trial)")
    ap.add_argument("--gpu-dir", default="", help="phases part: the gpu/ folder to evaluate with (default this "
                    "tree's; e.g. a previous commit's, from git archive, to compare both in one call)")
    ap.add_argument("--phases-at-once", type=int, default=1, help="phases part: then N breakdowns at once "
                    "on the device, their phases beside the first's")
    ap.add_argument("--at-once-devices", default="", help="phases part: instead of --phases-at-once, one breakdown "
                    "on each of these devices at once (e.g. cuda:0,cuda:1: what evaluators of other GPUs cost)")
    ap.add_argument("--per-device", default="1", help="torch part: evaluators sharing the device, e.g. 1,4 (a run each)")
    ap.add_argument("--unlocked", action="store_true", help="torch part: for each N > 1 of --per-device, the "
                    "control: N launches of one evaluator at once, each with a device lock of its own (phases "
                    "part: the --phases-at-once breakdowns again, each with a lock of its own)")
    ap.add_argument("--reference-cache-mb", default="", help="[evaluator] reference_cache_mb, e.g. 2048,0 (torch "
                    "part: a run each, for each --per-device; phases part: the first; default the config's)")
    ap.add_argument("--no-baseline", action="store_true", help="torch part: leave out the fresh-process baseline")
    ap.add_argument("--logs", default="", help="torch part: the workers' logs go here")
    ap.add_argument("--inline", type=int, default=32, help="distinct load_inline candidates")
    ap.add_argument("--baseline-inline", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4, help="parallel part: standalone builds at once")
    ap.add_argument("--alone", default="", help="parallel and inline parts: WALL,CPU of one build alone, if known")
    ap.add_argument("--compile-workers", type=int, default=os.cpu_count())
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.per_device = [int(x) for x in str(args.per_device).split(",")]
    args.reference_cache_mb = [float(x) for x in args.reference_cache_mb.split(",")] if args.reference_cache_mb else [None]
    work = tempfile.mkdtemp(prefix="kernelrl-bench-")
    out = {"device": args.device, "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
           "compile_workers": args.compile_workers}
    try:
        for part in args.parts.split(","):
            {"torch": part_torch, "phases": part_phases, "inline": part_inline, "parallel": part_parallel, "cpu": part_cpu}[part](args, work, out)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
