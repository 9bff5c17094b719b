"""The evaluator's GPU suite (run by scripts/gpu-check on an H100/H200 machine).

1. Every bundled replayed candidate, at the tasks' GPU sizes, through the worker (a process per
   candidate): each status must be the one its replay line expects.
2. CUDA load_inline candidates through `launch evaluate` (the C++ evaluator: compile stage, then
   timing stage): correct, incorrect, an illegal memory access followed by a correct one on the
   same evaluator, a declared kernel that never runs (hacked), a side-stream hack (hacked); the
   correct kernel's coverage comes from the profiler.
3. Timing stability: the same kernel's median over 10 full-mode evaluations, coefficient of
   variation (target <= 0.5%).
4. The sandbox's adversarial candidates (tests/e2e/test_evaluator.py SandboxTest, JudgeLinkTest and
   StatusTest) on this GPU: every finding of issue 19 and the judge's own, each with an honest
   candidate after it; and issue 52's blind spots (BlindSpotTest: near-zero outputs, answers right
   only on the task's own draw, a speedup beyond the device bound, a result kept by input values,
   a copy of the reference made at run time), at GPU-sized shapes where the size matters.
5. The judge's one-pass comparison (gpu/fused_check.py) against PyTorch's operations on the same
   pairs (`compare`): identical verdicts in every dtype it takes, and each way's time; the
   side-stream check's one-pass digest against PyTorch's: the same figures, bit for bit.

Usage: python tests/e2e/gpu_suite.py --launch PATH/TO/launch [--device cuda:0] [--json OUT.json]
           [--parts replay,compare,sandbox,cuda,triton,stability]
Exits 1 when any check fails.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # for the gpu package

from gpu.worker import ForkServer  # noqa: E402

SETTINGS = {"correctness_trials": 5, "warmup": 3, "fast_trials": 20, "full_trials": 50,
            "atol_fp32": 1e-4, "rtol_fp32": 1e-4, "atol_half": 1e-2, "rtol_half": 1e-2,
            "timeout_s": 120, "compile_timeout_s": 600, "memory_limit_mb": 65536,
            "reverify_speedup": 10.0, "size": "gpu"}
CANDS = os.path.join(ROOT, "tests", "fixtures", "gpu_candidates")
LOG_DIR = ""  # main(): the folder of --json, where the CUDA suite's worker logs go


def replay_suite(server, rows):
    bad = 0
    replay_dir = os.path.join(ROOT, "tasks", "replay")
    for name in sorted(os.listdir(replay_dir)):
        with open(os.path.join(replay_dir, name)) as f:
            for i, line in enumerate(l for l in f if l.strip()):
                rec = json.loads(line)
                settings = dict(SETTINGS, timeout_s=20 if rec["label"] == "hangs" else 120)
                req = {"sample_id": f"{rec['task_id']}#{i}", "task_id": rec["task_id"],
                       "task_path": os.path.join(ROOT, "tasks", "bundled", rec["task_id"] + ".py"),
                       "action": rec["completion"], "action_space": "forward_body", "mode": "fast",
                       "seed": 42}
                res = server.evaluate(req, settings)
                ok = res["status"] == rec["expect_status"]
                link = (res.get("correctness") or {}).get("link", "")
                how = (res.get("correctness") or {}).get("comparison", "")
                dig = (res.get("correctness") or {}).get("digest", "")
                if res["status"] == "ok" and dig != "fused":
                    # The side-stream check digests the output with one kernel (gpu/fused_check.py
                    # Digest), loaded in the candidate's process from the worker's compiled copy.
                    ok = False
                    res["error"] = f"the side-stream check's digest was not the fused one: {dig or 'none'}"
                if res["status"] == "ok" and (link != "device" or how != "fused"):
                    # On a GPU the outputs reach the judge through device memory (gpu/devshare.py)
                    # and are compared in one pass (gpu/fused_check.py); a fallback is a failure of
                    # the suite, with its reason.
                    ok = False
                    res["error"] = f"outputs reached the judge as {link or 'nothing'}, compared: {how or 'not'}"
                bad += not ok
                rows.append({"suite": "replay", "task_id": rec["task_id"], "label": rec["label"],
                             "status": res["status"], "expected": rec["expect_status"], "ok": ok,
                             "speedup": res["speedup"], "runtime_ms": res["runtime"]["median_ms"],
                             "ref_runtime_ms": res["ref_runtime"]["median_ms"],
                             "coverage": res["kernel_coverage"], "wall_s": res["wall_s"],
                             "isolation_s": res.get("isolation", {}).get("child_start_s", 0),
                             "error": res["error"][:200]})
                print(f"{'ok ' if ok else 'BAD'} {rec['task_id']:26} {rec['label']:12} {res['status']:13} "
                      f"x{res['speedup']:7.2f} cand {res['runtime']['median_ms']:8.4f} ms ref "
                      f"{res['ref_runtime']['median_ms']:8.4f} ms {res['wall_s']:5.2f}s {res['error'][:70]}",
                      flush=True)
    return bad


def launch_evaluate(launch, device, files, mode="fast", extra=()):
    cmd = [launch, "evaluate", "--task", os.path.join(ROOT, "tasks", "bundled", "06_swish.py"),
           "--device", device, "--mode", mode, "--timeout", "120", "--json", *extra]
    for f in files:
        cmd += ["--candidate", os.path.join(CANDS, f)]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        print(out.stderr[-3000:])
        raise SystemExit(f"launch evaluate exited {out.returncode}")
    return [json.loads(l) for l in out.stdout.splitlines()], wall


def judge(suite, expect, results, rows):
    """Each result against its (candidate, status, error fragment); an ok one must also have run its
    own kernels (coverage above 0.9). The count of mismatches."""
    bad = 0
    for (f, status, frag), r in zip(expect, results):
        ok = r["status"] == status and frag in r["error"]
        if status == "ok":
            ok = ok and r["kernel_coverage"] > 0.9
        bad += not ok
        rows.append({"suite": suite, "candidate": f, "status": r["status"], "expected": status, "ok": ok,
                     "speedup": r["speedup"], "runtime_ms": r["runtime_ms"], "coverage": r["kernel_coverage"],
                     "compile_s": r["compile_s"], "compile_cached": r["compile_cached"],
                     "wall_s": r["wall_s"], "error": r["error"][:300],
                     # where a slow one spent its time: the stages' stamps and its build records
                     "ready_at": r.get("ready_at", 0), "device_start": r.get("device_start", 0),
                     "device_end": r.get("device_end", 0), "compile_log": r.get("compile_log", "")[-2000:]})
        print(f"{'ok ' if ok else 'BAD'} {f:34} {r['status']:13} x{r['speedup']:6.2f} cov {r['kernel_coverage']:.3f} "
              f"compile {r['compile_s']:5.1f}s{' cached' if r['compile_cached'] else ''} {r['error'][:80]}",
              flush=True)
    return bad


def cuda_suite(launch, device, rows):
    expect = [("swish_cuda.txt", "ok", ""), ("swish_cuda_wrong.txt", "incorrect", "values differ"),
              ("swish_cuda_illegal_address.txt", "runtime_error", "illegal memory access"),
              ("swish_cuda.txt", "ok", ""), ("swish_cuda_unused.txt", "hacked", "none ran"),
              ("swish_side_stream.txt", "hacked", "another CUDA stream"), ("swish_cuda.txt", "ok", "")]
    extra = ["--compile-workers", "4"]
    if LOG_DIR:  # the workers' logs (builds, the build lock's waits) beside the suite's JSON
        extra += ["--worker-log", os.path.join(LOG_DIR, "cuda-worker.log")]
    results, wall = launch_evaluate(launch, device, [e[0] for e in expect], extra=extra)
    bad = judge("cuda", expect, results, rows)
    print(f"cuda suite: {len(results)} candidates in {wall:.1f} s (launch evaluate, cold cache)")
    return bad


def triton_suite(launch, device, rows):
    # Triton kernels (a @triton.jit kernel defined before the body, launched in it): the sandboxed
    # candidate process compiles them, the checks judge them, the kernel counts as the candidate's own.
    expect = [("swish_triton.txt", "ok", ""), ("swish_triton_wrong.txt", "incorrect", "values differ"),
              ("swish_triton.txt", "ok", "")]
    results, wall = launch_evaluate(launch, device, [e[0] for e in expect])
    bad = judge("triton", expect, results, rows)
    print(f"triton suite: {len(results)} candidates in {wall:.1f} s (launch evaluate)")
    return bad


def stability(launch, device, rows, n=10):
    results, wall = launch_evaluate(launch, device, ["swish_cuda.txt"] * n, mode="full")
    med = [r["runtime_ms"] for r in results]
    ref = [r["ref_runtime_ms"] for r in results]
    cv = statistics.stdev(med) / statistics.mean(med)
    ok = cv <= 0.005 and all(r["status"] == "ok" for r in results)
    rows.append({"suite": "stability", "medians_ms": med, "ref_medians_ms": ref, "cv": cv, "ok": ok,
                 "wall_s": wall})
    print(f"{'ok ' if ok else 'BAD'} timing stability: medians {[round(m, 4) for m in med]} ms, "
          f"CV {100 * cv:.3f}% (target <= 0.5%), {n} full-mode evaluations in {wall:.1f} s")
    return 0 if ok else 1


def sandbox_suite(device, rows):
    """The CPU suite's adversarial classes, run by `python -m unittest` with the worker on this
    GPU; each test's result read from unittest's report."""
    import re
    import unittest
    names = [f"tests.e2e.test_evaluator.{c}" for c in ("SandboxTest", "JudgeLinkTest", "StatusTest", "BlindSpotTest")]
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    ids = []
    for cls in unittest.defaultTestLoader.loadTestsFromNames(names):
        ids += [case.id() for case in cls]
    if any("_FailedTest" in i for i in ids):
        raise SystemExit(f"cannot load {names}: {ids}")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "unittest", "-v"] + names, cwd=ROOT,
                         env={**os.environ, "KERNELRL_TEST_DEVICE": device}, capture_output=True, text=True)
    wall = time.monotonic() - t0
    report = out.stderr
    bad = 0 if out.returncode == 0 and re.search(r"^OK", report, re.M) else 1
    failed = {}
    for m in re.finditer(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)\n-+\n(.*?)(?=^=====|^-----)", report, re.M | re.S):
        name = m.group(3) if m.group(3).endswith("." + m.group(2)) else f"{m.group(3)}.{m.group(2)}"
        failed[name] = (m.group(1), m.group(4).strip())
    skipped = set(re.findall(r"\(([\w.]+)\) \.\.\. skipped", report))
    for test in ids:
        kind, detail = failed.get(test, ("skipped", "") if test in skipped else ("ok", ""))
        ok = kind in ("ok", "skipped")  # skipped: a test of the CPU's side (its skip condition says)
        rows.append({"suite": "sandbox", "test": test, "result": kind, "detail": detail[-2000:], "ok": ok})
        print(f"{'ok ' if kind == 'ok' else 'BAD' if not ok else '-- '} sandbox {test.split('.', 2)[-1]}: {kind} {detail[-600:]}", flush=True)
    # A class's or module's fixture (setUpClass, tearDownClass) fails under a name no test has.
    for name, (kind, detail) in failed.items():
        if name not in ids:
            rows.append({"suite": "sandbox", "test": name, "result": kind, "detail": detail[-2000:], "ok": False})
            print(f"BAD sandbox {name}: {kind} {detail[-1500:]}", flush=True)
    bad = max(bad, sum(1 for r in rows if r["suite"] == "sandbox" and not r["ok"]))
    if bad and not failed:
        print(report[-6000:], flush=True)
    print(f"sandbox suite: {len(ids)} tests in {wall:.1f} s on {device}")
    return bad


def loaded(suite, name, pair, rows):
    """The kernels of a (kernels or None, why not) pair; a failed row saying why when None."""
    kernels, why = pair
    if kernels is None:
        rows.append({"suite": suite, "candidate": name, "status": why, "ok": False})
        print(f"BAD {name}: {why}", flush=True)
    return kernels


def wall_ms(fn, runs=5):
    """Median wall time of fn() in ms over `runs` calls, each from an idle device to its result
    read back on the host (fn's own reads synchronise: a check's verdict, a digest's figures)."""
    import torch
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def compare_suite(device, rows, cases=120):
    """The judge's one-pass comparison (gpu/fused_check.py) against PyTorch's operations (OutputCheck
    without it) on the same pairs, fed in the same pieces: in every dtype it takes, outputs at the
    tolerance's edge (both sides of it, where the output dtype's rounding decides), zeros, NaN and
    infinities on either side, references from 1e-6 to 1e3 in scale. Verdicts, flags and the largest
    difference must be identical; the excess, relative difference and sums equal to rounding.
    Then each way's time over a 1 GB float32 output in 256 MB pieces (a quarter of the device link's largest)."""
    import torch
    from gpu import checks as H
    from gpu import fused_check
    fused = loaded("compare", "fused_check", fused_check.load(device), rows)
    if fused is None:
        return 1
    g = torch.Generator(device=device).manual_seed(53)

    def uniform(n, lo, hi):
        return torch.rand(n, generator=g, device=device, dtype=torch.float64) * (hi - lo) + lo

    def pair(dtype, kind, n):
        scale = 10.0 ** float(uniform(1, -6, 3))
        ref = (torch.randn(n, generator=g, device=device, dtype=torch.float64) * scale).to(dtype)
        r64 = ref.double()
        atol, rtol = H._tolerance(dtype, SETTINGS)
        sign = torch.where(uniform(n, 0, 1) < 0.5, -1.0, 1.0)
        if kind == "edge":  # the allowed error times 0.98-1.02: rounding in the dtype decides
            out = r64 + sign * (atol + rtol * r64.abs()) * uniform(n, 0.98, 1.02)
        elif kind == "close":
            out = r64 + sign * (atol + rtol * r64.abs()) * uniform(n, 0, 0.5)
        elif kind == "far":
            out = r64 + sign * (atol + rtol * r64.abs()) * uniform(n, 0, 3)
        elif kind == "zeros":
            out = torch.zeros_like(r64)
        else:  # nonfinite: NaN and infinities in either, some where both hold the same
            out = r64 + sign * (atol + rtol * r64.abs()) * uniform(n, 0, 0.5)
            specials = torch.tensor([math.nan, math.inf, -math.inf], device=device, dtype=torch.float64)
            for t in (out, r64):
                at = (uniform(n, 0, 1) < 0.001).nonzero().reshape(-1)
                t[at] = specials[torch.randint(0, 3, (at.numel(),), generator=g, device=device)]
            same = (uniform(n, 0, 1) < 0.001).nonzero().reshape(-1)
            out[same] = r64[same] = math.inf
            ref = r64.to(dtype)
        return ref, out.to(dtype)

    def close_enough(a, b, rel):
        if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
            return (math.isnan(a) and math.isnan(b)) or a == b
        return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-30

    kinds = ("edge", "close", "far", "zeros", "nonfinite")
    bad, seen = 0, {}
    for dtype in fused_check.KERNELS:
        for case in range(cases):
            kind = kinds[case % len(kinds)]
            # Half the pairs of a few elements, so that a pair's verdict turns on single values.
            n = int(uniform(1, 1, 3_000_000)) if case % 2 else int(uniform(1, 1, 8))
            ref, out = pair(dtype, kind, n)
            checks = [H.OutputCheck(ref, SETTINGS), H.OutputCheck(ref, SETTINGS, fused=fused)]
            cut = sorted(int(x) for x in uniform(2, 0, n))
            for c in checks:
                for a, b in ((0, cut[0]), (cut[0], cut[1]), (cut[1], n)):
                    c.feed(out[a:b])
            want, got = (c.figures() for c in checks)
            verdicts = [c.result("t", {"max_abs_diff": 0.0, "max_rel_diff": 0.0}) for c in checks]
            same = (verdicts[0] == verdicts[1]
                    and all(want[k] == got[k] for k in ("close", "bad_nonfinite", "nonfinite"))
                    and close_enough(want["max_abs_diff"], got["max_abs_diff"], 0.0))
            if kind != "nonfinite":  # where a reference holds NaN, PyTorch's figures are NaN
                # The excess is a difference of nearly equal terms: PyTorch's in float32, the
                # fused one's in float64; they agree to float32's rounding of the terms.
                scale = want["max_abs_diff"] + H._tolerance(dtype, SETTINGS)[0]
                same = same and abs(want["excess"] - got["excess"]) <= 1e-6 * scale and all(
                    close_enough(want[k], got[k], tol) for k, tol in (("max_rel_diff", 1e-6), ("d2", 1e-3), ("r2", 1e-3)))
            key = (str(dtype).replace("torch.", ""), kind)
            tally = seen.setdefault(key, [0, 0, 0])
            tally[0] += 1
            tally[1] += not want["close"]
            if not same:
                tally[2] += 1
                bad += 1
                if tally[2] <= 2:
                    print(f"BAD {key} n={n}: torch {want} {verdicts[0]!r}\n    fused {got} {verdicts[1]!r}", flush=True)
    for (dt, kind), (n, failing, wrong) in sorted(seen.items()):
        rows.append({"suite": "compare", "candidate": f"{dt}/{kind}", "status": f"{n} pairs, {failing} not close",
                     "expected": "identical", "ok": wrong == 0})
        print(f"{'ok ' if not wrong else 'BAD'} compare {dt:9} {kind:9} {n} pairs, {failing} not close, "
              f"{wrong} differing", flush=True)
    # Time: a 1 GB float32 output against its reference, in 256 MB pieces (a quarter of the device link's largest).
    ref = torch.randn(1 << 28, generator=g, device=device)
    out = ref + 1e-6
    piece = 1 << 26
    def check(k):
        c = H.OutputCheck(ref, SETTINGS, fused=k)
        for a in range(0, out.numel(), piece):
            c.feed(out[a:a + piece])
        c.result("t", {"max_abs_diff": 0.0, "max_rel_diff": 0.0})

    for label, k in (("torch", None), ("fused", fused)):
        ms = wall_ms(lambda: check(k))
        rows.append({"suite": "compare", "candidate": f"time/{label}", "status": f"{ms:.2f} ms per GB", "ok": True})
        print(f"compare time {label}: {ms:.2f} ms for 1 GB of float32 output (median of 5; "
              f"{2 / (ms / 1000):.0f} GB/s read)", flush=True)
    # The kernel alone, one launch over the whole GB (CUDA events), against a plain copy's time.
    acc = fused.start(device)
    spans = {"fused kernel": lambda: fused.feed(acc, out, ref, 1e-4, 1e-4), "copy_ (same bytes moved)": lambda: out.copy_(ref)}
    for label, fn in spans.items():
        times = []
        for _ in range(6):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        ms = statistics.median(times[1:])
        rows.append({"suite": "compare", "candidate": f"kernel/{label}", "status": f"{ms:.3f} ms", "ok": True})
        print(f"compare {label}: {ms:.3f} ms over 1 GB ({2 / (ms / 1000):.0f} GB/s)", flush=True)
    return bad


def digest_suite(device, rows):
    """The side-stream check's one-pass digest (gpu/fused_check.py Digest) against PyTorch's
    operations (gpu/checks.py digest without it): the same figures, bit for bit, on outputs of
    every shape the check meets (32-bit words; bytes where a tensor's size or address is not a
    multiple of 4; across the weights' chunks and the kernel's pieces of 2^30 elements), and a
    digest that moves with one flipped bit. Then each way's time over 1 GB."""
    import torch
    from gpu import checks as H
    from gpu import fused_check
    fused = loaded("digest", "fused_check.Digest", fused_check.load_digest(device), rows)
    if fused is None:
        return 1
    g = torch.Generator(device=device).manual_seed(56)

    def rand(n, dtype):
        if dtype.is_floating_point:
            return torch.randn(n, generator=g, device=device, dtype=torch.float32).to(dtype)
        if dtype == torch.bool:
            return torch.rand(n, generator=g, device=device) < 0.5
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, (n,), generator=g, device=device, dtype=dtype)

    chunk = H.CHUNK
    cases = [("float32 of 1", rand(1, torch.float32)), ("float16 of 3 (bytes)", rand(3, torch.float16)),
             ("bfloat16 of 1000", rand(1000, torch.bfloat16)), ("int64 of 12345", rand(12345, torch.int64)),
             ("bool of 4097 (bytes)", rand(4097, torch.bool)), ("int8 of 2^24 + 5 (bytes)", rand(chunk + 5, torch.int8)),
             ("float32 of 3 x 2^24 + 7", rand(3 * chunk + 7, torch.float32)),
             ("float32 at an odd address (bytes)", rand(4001, torch.float32).view(torch.uint8)[1:4001 * 4 - 3]),
             ("a transposed float32 matrix", rand(513 * 257, torch.float32).reshape(513, 257).t()),
             ("(float32, int32) tuple", (rand(77, torch.float32), rand(99, torch.int32))),
             ("float32 of 2^30 + 2^24 + 3 (two pieces)", rand((1 << 30) + chunk + 3, torch.float32)),
             ("uint8 of 2^31 + 11 (three pieces of bytes)", rand((1 << 31) + 11, torch.uint8))]
    bad = 0
    for name, t in cases:
        want, got = H.digest(t), H.digest(t, fused)
        flipped = got
        first = t[0] if isinstance(t, tuple) else t
        flat = first.reshape(-1) if first.is_contiguous() else None
        if flat is not None and flat.numel():
            at = flat.numel() // 2
            raw = flat.view(torch.uint8)
            byte = (at * flat.element_size()) % raw.numel()
            raw[byte] ^= 4  # one bit
            flipped = H.digest(t, fused)
            raw[byte] ^= 4
        ok = want == got and (flat is None or flipped != got)
        bad += not ok
        rows.append({"suite": "digest", "candidate": name, "status": "identical" if want == got else f"{want} != {got}",
                     "expected": "identical", "ok": ok})
        print(f"{'ok ' if ok else 'BAD'} digest {name}: {'identical' if want == got else f'torch {want}, fused {got}'}"
              f"{'' if flipped != got or flat is None else ', blind to a flipped bit'}", flush=True)
        del t, first, flat
    t = rand(1 << 28, torch.float32)
    for label, k in (("torch", None), ("fused", fused)):
        ms = wall_ms(lambda: H.digest(t, k))
        rows.append({"suite": "digest", "candidate": f"time/{label}", "status": f"{ms:.2f} ms per GB", "ok": True})
        print(f"digest time {label}: {ms:.2f} ms for 1 GB (median of 5, result read; {1 / (ms / 1000):.0f} GB/s)",
              flush=True)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json", default="")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--only-stability", action="store_true", help="the timing-stability check alone")
    ap.add_argument("--parts", default="replay,compare,sandbox,cuda,triton,stability", help="which parts, comma-separated")
    args = ap.parse_args()
    global LOG_DIR
    LOG_DIR = os.path.dirname(os.path.abspath(args.json)) if args.json else ""
    parts = set(args.parts.split(","))
    if args.skip_replay:
        parts.discard("replay")
    if args.only_stability:
        parts = {"stability"}
    rows = []
    server = ForkServer(args.device, 1)
    print(f"device {server.info}", flush=True)
    bad = replay_suite(server, rows) if "replay" in parts else 0
    server.close()
    if "compare" in parts:
        bad += compare_suite(args.device, rows)
        bad += digest_suite(args.device, rows)
    if "sandbox" in parts:
        bad += sandbox_suite(args.device, rows)
    if "cuda" in parts:
        bad += cuda_suite(args.launch, args.device, rows)
    if "triton" in parts:
        bad += triton_suite(args.launch, args.device, rows)
    if "stability" in parts:
        bad += stability(args.launch, args.device, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": server.info, "rows": rows}, f, indent=1)
    print(f"gpu suite: {sum(1 for r in rows if r['ok'])} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
