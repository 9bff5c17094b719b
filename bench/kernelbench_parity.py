"""kernelrl's evaluator beside KernelBench's own harness, on KernelBench's own problems, on one GPU
(scripts/gpu-check --kernelbench DIR; DIR is a KernelBench checkout, read as it is).

The candidate of a problem is its reference file with the class renamed to ModelNew (and
`super(Model, self)` with it): the baseline a policy that copies the reference writes, its forward
at the reference's own line numbers. Both harnesses must call it correct, at a speedup of about 1.

Parts (--parts, default all of them):
  verdicts     every level-1 problem and every Nth level-2 problem (--level2-stride), through one
               `launch evaluate --action full_program --mode full`: verdict, speedup, seconds and
               peak device memory of each; any verdict other than ok is evaluated again by
               KernelBench's eval_kernel_against_ref (its own process) to set the two side by side.
  adversarial  KernelBench's unit-test adversarial kernels (src/kernelbench/unit_tests/
               test_kernels) against level1/1, as its unit tests run them, and ours
               (tests/fixtures/gpu_candidates/unordered_side_stream_matmul.py): none may be ok.
  timing       per problem of --timing: the candidate evaluated --repeats times by kernelrl (one
               `launch evaluate`, a process per evaluation, as in a run) and --repeats times by
               KernelBench's eval_kernel_against_ref in one process (5 correctness trials, 50
               timed trials, cuda_event timing); per side the median runtime of each evaluation,
               their coefficient of variation, and the median of those medians.
  throughput   the first --throughput verdict candidates: one `launch evaluate` over all of them
               (start-up included) against KernelBench's batch practice, a fresh Python process
               per candidate running eval_kernel_against_ref with performance measured.
  blindspots   issue 52's answers that KernelBench's correctness check cannot see, on every level-1
               problem, each through `launch evaluate --mode fast` twice, with the evaluator's
               blind-spot rules off (no input distributions beyond the task's own, no scale rule,
               no device bound: the harness before issue 52) and on (the defaults): "zeros" (the
               outputs' shapes, filled with zeros), "identity" (the first input handed back, where
               its shape and dtype are the output's; elsewhere not applicable), and "float64" (the
               reference computed in float64 and cast back: a legitimate answer that rounds
               differently, which must keep its verdict). Counts how many problems each passed
               (ok or unconfirmed) before and after, and lists every problem whose verdict moved.
  phases       (not in the default) the renamed references of --phase-problems at KernelBench's own
               sizes through the evaluator's fork server in this process, phase by phase (the
               candidate's process's, the worker's, the judge's), once per --phase-links entry
               (device: outputs through device memory, compared in one fused pass; device-torch:
               the same link compared with PyTorch operations; bytes: through the host), each
               against issue 53's target (wall at most twice the evaluation's device work + 0.5 s).

Printed: one table per part and a summary of the targets (every renamed reference ok;
adversarial kernels rejected; timing CV at most KernelBench's and at most 0.5% for kernels of
50 us and more; medians within 2%; throughput at least 10x; no zeros or identity answer passing
and no float64 answer losing its verdict). --json writes everything.

Usage: python bench/kernelbench_parity.py --kernelbench DIR --launch PATH [--device cuda:0]
           [--parts verdicts,adversarial,timing,throughput,blindspots] [--level2-stride 5] [--limit N]
           [--timing 1/12,1/7,1/9] [--repeats 10] [--throughput 12] [--json OUT.json]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from kb_import import import_kernelbench, problem_file, problems  # noqa: E402

PY = os.environ.get("KERNELRL_PYTHON", sys.executable)
MARK = "KBRESULT "  # prefix of the KernelBench runner's result lines (its harness prints freely)


def renamed_reference(src: str) -> str:
    """The reference program with Model renamed ModelNew, line for line."""
    out = re.sub(r"\bclass\s+Model\b", "class ModelNew", src)
    out = re.sub(r"super\(\s*Model\s*,", "super(ModelNew,", out)
    if out.count("\n") != src.count("\n"):
        raise AssertionError("renaming changed the line count")
    return out


def cv(xs):
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 and statistics.mean(xs) > 0 else 0.0


# ---- KernelBench's side --------------------------------------------------------------------------
def kb_run(args):
    """In this process: KernelBench's eval_kernel_against_ref on one candidate, --repeats times;
    one MARK line per evaluation with its verdict and the median and mean of its timed trials."""
    import torch
    kb_eval, kb_timing = import_kernelbench(args.kernelbench)
    raw = []
    original = kb_timing.get_timing_stats

    def recording(elapsed, device=None):  # the trial times behind its statistics, kept for the median
        raw.append(list(elapsed))
        return original(elapsed, device=device)

    kb_timing.get_timing_stats = recording
    with open(args.ref) as f:
        ref_src = f.read()
    with open(args.cand) as f:
        cand_src = f.read()
    device = torch.device(args.device)
    for i in range(args.repeats):
        raw.clear()
        t0 = time.monotonic()
        rec = {"run": i}
        try:
            with tempfile.TemporaryDirectory() as build:
                r = kb_eval.eval_kernel_against_ref(
                    original_model_src=ref_src, custom_model_src=cand_src, seed_num=42,
                    num_correct_trials=5, num_perf_trials=50, measure_performance=args.measure,
                    timing_method="cuda_event", verbose=False, build_dir=build, device=device,
                    backend="cuda", precision=torch.float32, check_for_excessive_speedup=args.measure)
            if r is None:
                rec.update(compiled=False, correct=False, error="eval returned None (a lock-file error: retry)")
            else:
                rec.update(compiled=bool(r.compiled), correct=bool(r.correctness),
                           excessive_speedup=bool(r.metadata.get("excessive_speedup", False)),
                           error=str({k: str(v)[:300] for k, v in r.metadata.items()
                                      if "error" in k or "issue" in k}) if not r.correctness else "")
                if len(raw) >= 1:
                    rec["runtime_ms"] = statistics.median(raw[0])
                    rec["runtime_mean_ms"] = statistics.fmean(raw[0])
                if len(raw) >= 2:
                    rec["ref_runtime_ms"] = statistics.median(raw[1])
        except Exception as e:  # noqa: BLE001 - reported, as KernelBench's own callers do
            rec.update(compiled=False, correct=False, error=f"{type(e).__name__}: {str(e)[:300]}")
        rec["seconds"] = time.monotonic() - t0
        print(MARK + json.dumps(rec), flush=True)
    return 0


def kb_process(args, ref, cand, repeats=1, measure=True, timeout_s=900):
    """A fresh Python process running KernelBench's harness: (records, wall seconds)."""
    cmd = [PY, os.path.abspath(__file__), "--kb-run", "--kernelbench", args.kernelbench, "--device",
           args.device, "--ref", ref, "--cand", cand, "--repeats", str(repeats)]
    if measure:
        cmd.append("--measure")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [{"compiled": False, "correct": False, "error": f"over {timeout_s} s"}], time.monotonic() - t0
    wall = time.monotonic() - t0
    recs = [json.loads(l[len(MARK):]) for l in p.stdout.splitlines() if l.startswith(MARK)]
    if not recs:
        recs = [{"compiled": False, "correct": False,
                 "error": f"KernelBench process ended with {p.returncode}: {(p.stderr or p.stdout)[-600:]}"}]
    return recs, wall


# ---- our side ------------------------------------------------------------------------------------
def launch_evaluate(args, pairs, timeout_s=600, mode="full", extra=()):
    """One `launch evaluate` over [(task, candidate file)]: (results in order, wall seconds)."""
    cmd = [args.launch, "evaluate", "--device", args.device, "--mode", mode, "--action", "full_program",
           "--timeout", str(timeout_s), "--json", *extra]
    if args.timing_precision is not None:
        cmd += ["--timing-precision", str(args.timing_precision)]
    for task, cand in pairs:
        cmd += ["--task", task, "--candidate", cand]
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(args.work, "cache"))
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3 * 3600)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(f"launch evaluate exited {p.returncode}")
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip()], wall


def write_candidate(args, level, number, path):
    with open(path) as f:
        src = f.read()
    cand = os.path.join(args.work, f"L{level}_{number}.py")
    with open(cand, "w") as f:
        f.write(renamed_reference(src))
    return cand


def verdict_problems(args):
    out = [(1, n, p) for n, p in problems(args.kernelbench, 1)]
    out += [(2, n, p) for n, p in problems(args.kernelbench, 2)][::args.level2_stride]
    out = out[args.offset:]
    return out[:args.limit] if args.limit else out


def part_verdicts(args, report):
    probs = verdict_problems(args)
    pairs = [(p, write_candidate(args, lv, n, p)) for lv, n, p in probs]
    print(f"[verdicts] {len(pairs)} problems (level 1: {sum(1 for p in probs if p[0] == 1)}, "
          f"level 2: {sum(1 for p in probs if p[0] == 2)}), the reference renamed as the candidate", flush=True)
    results, wall = launch_evaluate(args, pairs)
    rows = []
    for (lv, n, path), r in zip(probs, results):
        row = {"problem": f"L{lv}/{n}", "name": os.path.basename(path)[:-3], "status": r["status"],
               "error": r["error"][:400], "speedup": r["speedup"], "runtime_ms": r["runtime_ms"],
               "ref_runtime_ms": r["ref_runtime_ms"], "seconds": r["wall_s"],
               "peak_gib": r.get("device_peak_bytes", 0) / 2**30}
        if r["status"] != "ok":
            kb, _ = kb_process(args, path, write_candidate(args, lv, n, path), measure=False)
            row["kernelbench"] = kb[0]
        rows.append(row)
        print(f"  {row['problem']:7} {row['name'][:44]:44} {row['status']:13} x{row['speedup']:.3f} "
              f"{row['ref_runtime_ms']:9.4f} ms  peak {row['peak_gib']:6.2f} GiB  {row['seconds']:6.1f} s"
              + (f"  {row['error'][:160]}" if row["error"] else "")
              + (f"  | KernelBench: correct={row['kernelbench'].get('correct')} "
                 f"{row['kernelbench'].get('error', '')[:160]}" if "kernelbench" in row else ""), flush=True)
    ok = sum(r["status"] == "ok" for r in rows)
    sp = [r["speedup"] for r in rows if r["status"] == "ok"]
    summary = {"problems": len(rows), "ok": ok, "wall_s": wall,
               "speedup_median": statistics.median(sp) if sp else 0.0,
               "speedup_range": [min(sp), max(sp)] if sp else [],
               "peak_gib_max": max((r["peak_gib"] for r in rows), default=0.0)}
    print(f"[verdicts] {ok}/{len(rows)} ok in {wall:.0f} s; speedup median {summary['speedup_median']:.3f} "
          f"(range {summary['speedup_range']}); largest peak {summary['peak_gib_max']:.2f} GiB", flush=True)
    report["verdicts"] = {"summary": summary, "rows": rows}
    return ok == len(rows)


def part_adversarial(args, report):
    folder = os.path.join(args.kernelbench, "src", "kernelbench", "unit_tests", "test_kernels")
    paths = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".py")]
    # and ours for the same problem: work on a stream that does not wait for the caller's
    paths.append(os.path.join(ROOT, "tests", "fixtures", "gpu_candidates", "unordered_side_stream_matmul.py"))
    kernels = [os.path.basename(p) for p in paths]
    task = problem_file(args.kernelbench, 1, 1)
    results, wall = launch_evaluate(args, [(task, p) for p in paths])
    rows = [{"kernel": k, "status": r["status"], "error": r["error"][:300], "speedup": r["speedup"]}
            for k, r in zip(kernels, results)]
    for r in rows:
        print(f"  [adversarial] {r['kernel']:32} {r['status']:13} {r['error'][:200]}", flush=True)
    rejected = sum(r["status"] != "ok" for r in rows)
    print(f"[adversarial] {rejected}/{len(rows)} rejected ({wall:.0f} s)", flush=True)
    report["adversarial"] = {"rows": rows, "rejected": rejected, "kernels": len(rows)}
    return rejected == len(rows)


def part_timing(args, report):
    rows, good = [], True
    for spec in [s for s in args.timing.split(",") if s]:
        lv, n = (int(x) for x in spec.split("/"))
        path = problem_file(args.kernelbench, lv, n)
        cand = write_candidate(args, lv, n, path)
        ours, _ = launch_evaluate(args, [(path, cand)] * args.repeats)
        kb, _ = kb_process(args, path, cand, repeats=args.repeats)
        o_ms = [r["runtime_ms"] for r in ours if r["status"] == "ok"]
        o_ref = [r["ref_runtime_ms"] for r in ours if r["status"] == "ok"]
        k_ms = [r["runtime_ms"] for r in kb if r.get("correct") and "runtime_ms" in r]
        row = {"problem": f"L{lv}/{n}", "name": os.path.basename(path)[:-3],
               "ours_ms": o_ms, "ours_ref_ms": o_ref, "kb_ms": k_ms,
               "ours_statuses": [r["status"] for r in ours], "kb_errors": [r.get("error", "") for r in kb if not r.get("correct")]}
        if o_ms and k_ms:
            row.update(ours_median=statistics.median(o_ms), ours_cv=cv(o_ms), kb_median=statistics.median(k_ms),
                       kb_cv=cv(k_ms))
            row["median_ratio"] = row["ours_median"] / row["kb_median"]
            # at most KernelBench's CV, and at most 0.5% for kernels of 50 us and more
            row["cv_target"] = row["ours_cv"] <= row["kb_cv"] and (row["kb_median"] < 0.05 or row["ours_cv"] <= 0.005)
            row["median_ok"] = abs(row["median_ratio"] - 1) <= 0.02
            good &= row["cv_target"] and row["median_ok"]
            print(f"  [timing] {row['problem']:7} {row['name'][:36]:36} ours {row['ours_median']:.4f} ms CV "
                  f"{100 * row['ours_cv']:.2f}% | KernelBench {row['kb_median']:.4f} ms CV {100 * row['kb_cv']:.2f}% "
                  f"| ratio {row['median_ratio']:.4f}", flush=True)
        else:
            good = False
            print(f"  [timing] {row['problem']}: no comparison ({row['ours_statuses']}, {row['kb_errors'][:1]})",
                  flush=True)
        rows.append(row)
    report["timing"] = {"rows": rows, "repeats": args.repeats}
    return good


def part_throughput(args, report):
    every = verdict_problems(args)
    probs = every[::max(1, len(every) // max(1, args.throughput))][:args.throughput]  # spread over both levels
    pairs = [(p, write_candidate(args, lv, n, p)) for lv, n, p in probs]
    ours, wall = launch_evaluate(args, pairs)
    print(f"  [throughput] kernelrl: {len(pairs)} in {wall:.1f} s ({[o['status'] for o in ours]})", flush=True)
    kb_wall, kb_recs = 0.0, []
    for task, cand in pairs:
        recs, w = kb_process(args, task, cand, repeats=1, measure=True)
        kb_wall += w
        kb_recs.append(recs[0])
        print(f"  [throughput] KernelBench {os.path.basename(cand)}: {w:.1f} s, correct={recs[0].get('correct')}",
              flush=True)
    agree = sum((o["status"] == "ok") == bool(k.get("correct")) for o, k in zip(ours, kb_recs))
    ratio = kb_wall / wall if wall > 0 else 0.0
    print(f"[throughput] {len(pairs)} candidates: kernelrl {wall:.1f} s (one launch evaluate, start-up included), "
          f"KernelBench {kb_wall:.1f} s (a fresh process each): {ratio:.1f}x; verdicts agree {agree}/{len(pairs)}",
          flush=True)
    report["throughput"] = {"candidates": [os.path.basename(c) for _, c in pairs], "ours_s": wall,
                            "kernelbench_s": kb_wall, "ratio": ratio, "agree": agree,
                            "kernelbench": kb_recs, "ours": [o["status"] for o in ours]}
    return ratio >= 10


def part_phases(args, report):
    """Where a renamed reference's time goes at KernelBench's own sizes: the evaluator's fork
    server in this process, phase by phase (bench/evaluator_throughput.py phase_breakdown), against
    the device work of its own timed trials. Target (issue 53): wall at most twice the device work
    of the evaluation plus 0.5 s."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from evaluator_throughput import phase_breakdown
    cands = []
    for spec in args.phase_problems.split(","):
        level, number = (int(x) for x in spec.split("/"))
        path = dict(problems(args.kernelbench, level))[number]
        cands.append((path, write_candidate(args, level, number, path), "ok"))
    met = True
    for link in args.phase_links.split(","):
        print(f"[phases] outputs to the judge through {link}", flush=True)
        # device-torch: the device link, compared with PyTorch's operations (before the fused check)
        extra = ({"output_link": "device", "output_check": "torch"} if link == "device-torch"
                 else {"output_link": link})
        out = phase_breakdown(args, cands, action_space="full_program", size="cpu", tag=f"phases/{link}",
                              extra=extra)
        report[f"phases_{link}"] = out
        for row in out.get("rows", []):
            # The evaluation's own device work: every check runs the candidate and the judge the
            # reference once; the timed region the candidate's warm-up and trials (50 in full mode).
            work = (row["checks"] * (row["runtime_ms"] + row["ref_ms"]) + 52 * row["runtime_ms"]) / 1000
            bound = 2 * work + 0.5
            row["device_work_s"], row["target_s"] = work, bound
            ok = row["status"] == "ok" and row["wall_s"] <= bound
            met &= ok or link != "device"
            print(f"[phases/{link}] {row['candidate']:12} {row['status']:8} wall {row['wall_s']:.2f} s, device work "
                  f"~{work:.3f} s ({row['checks']} checks, {row['runtime_ms']:.3f} ms a call, reference "
                  f"{row['ref_ms']:.3f} ms): target <= {bound:.2f} s {'met' if ok else 'MISSED'}; link {row['link']}, comparison {row['comparison']}",
                  flush=True)
    return met


# ---- blind spots (issue 52) ----------------------------------------------------------------------
# Each candidate is the reference renamed _Reference (its forward the program's own code) and a
# ModelNew inheriting it whose forward is one of these bodies.
BLIND_BODIES = {
    "zeros": (
        "        if not hasattr(self, '_shapes'):\n"
        "            out = super().forward(*xs)\n"
        "            self._tuple = isinstance(out, (tuple, list))\n"
        "            self._shapes = [(o.shape, o.dtype, o.device) for o in (out if self._tuple else [out])]\n"
        "        zs = [torch.zeros(s, dtype=d, device=v) for s, d, v in self._shapes]\n"
        "        return tuple(zs) if self._tuple else zs[0]\n"),
    "identity": (
        "        if not hasattr(self, '_same'):\n"
        "            out, x = super().forward(*xs), xs[0]\n"
        "            self._same = (isinstance(out, torch.Tensor) and isinstance(x, torch.Tensor)\n"
        "                          and out.shape == x.shape and out.dtype == x.dtype)\n"
        "        if not self._same:\n"
        "            raise RuntimeError('identity: not applicable (the output is not shaped as the first input)')\n"
        "        return xs[0]\n"),
    "float64": (
        "        if not hasattr(self, '_f64'):\n"
        "            import copy\n"
        "            self._f64 = [copy.deepcopy(self).double()]\n"
        "        xs64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]\n"
        "        out = _Reference.forward(self._f64[0], *xs64)\n"
        "        back = lambda o: o.float() if isinstance(o, torch.Tensor) and o.dtype == torch.float64 else o\n"
        "        return tuple(back(o) for o in out) if isinstance(out, (tuple, list)) else back(out)\n"),
}
# The evaluator's blind-spot rules off: the harness as it judged before issue 52.
RULES_OFF = """[tasks]
dir = "{tasks}"
[sampler]
replay = "{replay}"
[evaluator]
input_distributions = []
scale_tol_fp32 = 0
scale_tol_half = 0
bandwidth_bound = false
"""


def blind_candidate(src, body):
    ref = re.sub(r"\bclass\s+Model\b", "class _Reference", src)
    ref = re.sub(r"super\(\s*Model\s*,", "super(_Reference,", ref)
    return (ref + "\n\nimport torch as torch\n\n\nclass ModelNew(_Reference):\n"
            "    def forward(self, *xs):\n" + body)


def part_blindspots(args, report):
    probs = [(1, n, p) for n, p in problems(args.kernelbench, 1)][args.offset::args.blind_stride]
    if args.blind_problems:
        wanted = {int(x) for x in args.blind_problems.split(",")}
        probs = [q for q in probs if q[1] in wanted]
    if args.limit:
        probs = probs[:args.limit]
    off, replay = os.path.join(args.work, "rules_off.toml"), os.path.join(args.work, "no_replay.jsonl")
    open(replay, "w").close()  # a config needs a sampler; launch evaluate never uses it
    with open(off, "w") as f:
        f.write(RULES_OFF.format(tasks=os.path.dirname(probs[0][2]), replay=replay))
    kinds = [k for k in args.blind_kinds.split(",") if k]
    rule_sets = [r for r in args.blind_rules.split(",") if r]
    if set(kinds) - set(BLIND_BODIES) or set(rule_sets) - {"before", "after"}:
        raise SystemExit(f"--blind-kinds: {', '.join(BLIND_BODIES)}; --blind-rules: before, after")
    pairs, keys = [], []
    for kind, body in ((k, BLIND_BODIES[k]) for k in kinds):
        for lv, n, path in probs:
            with open(path) as f:
                src = f.read()
            cand = os.path.join(args.work, f"blind_{kind}_L{lv}_{n}.py")
            with open(cand, "w") as f:
                f.write(blind_candidate(src, body))
            pairs.append((path, cand))
            keys.append((kind, f"L{lv}/{n}", os.path.basename(path)[:-3]))
    out = {}
    for rules, extra in (("before", ["--config", off]), ("after", [])):
        if rules not in rule_sets:
            continue
        results, wall = launch_evaluate(args, pairs, mode="fast", extra=extra)
        out[rules] = results
        print(f"[blindspots] rules {rules}: {len(pairs)} evaluations in {wall:.0f} s", flush=True)
    passed = lambda r: r is not None and r["status"] == "ok"  # noqa: E731 (unconfirmed: not paid as such)
    rows, counts = [], {}
    for i, (kind, prob, name) in enumerate(keys):
        got = {rules: out[rules][i] for rules in out}
        b, a = got.get("before"), got.get("after")
        applicable = not (kind == "identity" and any("not applicable" in r["error"] for r in got.values()))
        c = counts.setdefault(kind, {"problems": 0, **{rules: 0 for rules in out},
                                     **{rules + "_unconfirmed": 0 for rules in out}})
        c["problems"] += applicable
        for rules, r in got.items():
            c[rules] += applicable and passed(r)
            c[rules + "_unconfirmed"] += applicable and r["status"] == "unconfirmed"
        row = {"kind": kind, "problem": prob, "name": name, "applicable": applicable}
        for rules, r in got.items():
            corr = r.get("correctness", {})
            row[rules] = {"status": r["status"], "error": r["error"][:300], "review": r.get("review", "")[:300],
                          "speedup": r["speedup"], "seconds": r["wall_s"],
                          "distributions": corr.get("distributions", ""), "max_scale_err": corr.get("max_scale_err", 0.0),
                          "ref_noise": corr.get("ref_noise", 0.0)}
        rows.append(row)
        moved = a is not None and b is not None and a["status"] != b["status"]
        if applicable and (moved or (kind != "float64" and a and a["status"] in ("ok", "unconfirmed"))
                           or (kind == "float64" and a and not passed(a))):
            print(f"  [blindspots] {kind:8} {prob:7} {name[:40]:40} {b['status'] if b else '':12} -> "
                  f"{a['status'] if a else '':12} {((a or b)['error'] or (a or b).get('review', ''))[:160]}", flush=True)
    for kind, c in counts.items():
        print(f"[blindspots] {kind}: ok on " + ", ".join(f"{c[r]}/{c['problems']} {r} ({c[r + '_unconfirmed']} "
                                                     f"unconfirmed)" for r in out) + " (of the problems where it "
              "applies)", flush=True)
    report["blindspots"] = {"counts": counts, "rows": rows}
    # The exploits pass nowhere with the rules on; the legitimate float64 answer loses no verdict.
    good = all(c.get("after", 0) == 0 for k, c in counts.items() if k != "float64")
    lost = [r for r in rows if r["kind"] == "float64" and "after" in r and r["after"]["status"] != "ok"
            and ("before" not in r or r["before"]["status"] == "ok")]
    return good and not lost


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", required=True, help="a KernelBench checkout (read as it is)")
    ap.add_argument("--launch", default="")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--parts", default="verdicts,adversarial,timing,throughput,blindspots",
                    help="any of these and phases")
    ap.add_argument("--level2-stride", type=int, default=5)
    ap.add_argument("--limit", type=int, default=0, help="at most this many verdict problems")
    ap.add_argument("--offset", type=int, default=0, help="skip this many verdict (or blindspots) problems first")
    ap.add_argument("--timing", default="1/12,1/7,1/9,1/19,1/23,1/40")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--timing-precision", type=float, default=None,
                    help="launch evaluate --timing-precision (default: [evaluator] timing_precision's default)")
    ap.add_argument("--throughput", type=int, default=12)
    ap.add_argument("--blind-kinds", default="zeros,identity,float64", help="blindspots: which answers")
    ap.add_argument("--blind-rules", default="before,after", help="blindspots: the rules off (before), on (after)")
    ap.add_argument("--blind-stride", type=int, default=1, help="blindspots: every Nth level-1 problem")
    ap.add_argument("--blind-problems", default="", help="blindspots: these level-1 problems only (numbers)")
    ap.add_argument("--phase-problems", default="1/19,1/23,1/36,1/12", help="phases: these problems (L/N)")
    ap.add_argument("--phase-links", default="device,device-torch",
                    help="phases: the ways outputs reach and are compared by the judge (device, device-torch, bytes)")
    ap.add_argument("--json", default="")
    # the KernelBench runner (a process of its own)
    ap.add_argument("--kb-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ref", default="", help=argparse.SUPPRESS)
    ap.add_argument("--cand", default="", help=argparse.SUPPRESS)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kb_run:
        return kb_run(args)
    if not args.launch:
        ap.error("--launch is required")
    report, verdict = {"device": args.device}, {}
    with tempfile.TemporaryDirectory(prefix="kb-parity-") as work:
        args.work = work
        for part in [p for p in args.parts.split(",") if p]:
            fn = {"verdicts": part_verdicts, "adversarial": part_adversarial, "timing": part_timing,
                  "throughput": part_throughput, "blindspots": part_blindspots, "phases": part_phases}.get(part)
            if fn is None:
                ap.error(f"--parts: unknown part {part!r}")
            t0 = time.monotonic()
            verdict[part] = fn(args, report)
            print(f"[{part}] target {'met' if verdict[part] else 'MISSED'} ({time.monotonic() - t0:.0f} s)", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(dict(report, targets=verdict), f, indent=1)
    return 0 if all(verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
