"""The common way to evaluate one candidate, for bench/evaluator_throughput.py to compare against.

One fresh Python process per candidate, as common KernelBench-style harnesses run it: import torch,
execute the task and the candidate program, build Model and ModelNew on the GPU after the same seed,
check correctness on inputs that get_inputs builds on the CPU and that are then copied to the GPU,
time the candidate with CUDA events (a host clock on --device cpu) (warm-up, then trials, a synchronize after each), and print one
JSON line. The reference's time comes from a per-task JSON cache (common harnesses precompute it
once per GPU), measured by the first candidate of a task that needs it.

The workload matches the evaluator's so verdicts compare: the same assembled program
(gpu/scaffold.py), the tasks' GPU sizes, the same trial counts, seeds and tolerances.

Usage: python bench/baseline_eval.py --task TASK.py --candidate FILE [--device cuda:0]
                                      [--trials 50] [--ref-cache FILE.json]
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import types

T0 = time.monotonic()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # for the gpu package

import torch  # noqa: E402

from gpu.scaffold import assemble  # noqa: E402

CORRECTNESS_TRIALS, WARMUP = 5, 3
TOL = {torch.float32: 1e-4, torch.float64: 1e-4}  # fp16/bf16: 1e-2, as the evaluator


def run_module(source, name, gpu):
    mod = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
    sizes = getattr(mod, "GPU_SIZES", None)
    if gpu and isinstance(sizes, dict):
        mod.__dict__.update(sizes)
    return mod


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(xs, device):
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]


def time_events(fn, inputs, trials, device, flush=None):
    """The common harness's timing: events around forward on the current stream, a synchronize
    after each trial (and, given a `flush` buffer, an L2 flush and a synchronize before it)."""
    times = []
    with torch.no_grad():
        for _ in range(WARMUP):
            fn(*inputs)
        sync(device)
        for _ in range(trials):
            if device.type != "cuda":
                t0 = time.perf_counter()
                fn(*inputs)
                times.append((time.perf_counter() - t0) * 1e3)
                continue
            if flush is not None:
                flush.zero_()
                torch.cuda.synchronize(device)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(*inputs)
            e.record()
            torch.cuda.synchronize(device)
            times.append(s.elapsed_time(e))
    return statistics.median(times)


def evaluate(args):
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.set_device(device)
    with open(args.task) as f:
        task_src = f.read()
    with open(args.candidate) as f:
        action = f.read()
    task_id = os.path.splitext(os.path.basename(args.task))[0]
    out = {"status": "", "error": "", "runtime_ms": 0.0, "ref_runtime_ms": 0.0}
    try:
        program = assemble(action, "forward_body", task_src, task_id)
        cand = run_module(program, "candidate", gpu)
        ref = run_module(task_src, "reference", gpu)
        init = ref.get_init_inputs()
        torch.manual_seed(args.seed)
        model = ref.Model(*to_device(init, device)).to(device)
        torch.manual_seed(args.seed)
        new = cand.ModelNew(*to_device(init, device)).to(device)
    except Exception as e:  # noqa: BLE001
        out["status"], out["error"] = "compile_error", f"{type(e).__name__}: {e}"
        return out
    try:
        with torch.no_grad():
            for t in range(CORRECTNESS_TRIALS):
                torch.manual_seed(args.seed * 1000 + t)
                inputs = to_device(ref.get_inputs(), device)
                expected = model(*inputs)
                got = new(*inputs)
                sync(device)
                if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                    out["status"], out["error"] = "incorrect", "output shape differs"
                    return out
                tol = TOL.get(expected.dtype, 1e-2)
                if got.dtype != expected.dtype or not torch.isfinite(got).all() or \
                        not torch.allclose(got, expected, atol=tol, rtol=tol):
                    out["status"], out["error"] = "incorrect", f"values differ (trial {t})"
                    return out
        torch.manual_seed(args.seed * 1000 + 999)
        inputs = to_device(ref.get_inputs(), device)
        out["runtime_ms"] = time_events(new, inputs, args.trials, device)
        cache = {}
        if args.ref_cache and os.path.exists(args.ref_cache):
            with open(args.ref_cache) as f:
                cache = json.load(f)
        if task_id not in cache:
            cache[task_id] = time_events(model, inputs, args.trials, device)
            if args.ref_cache:
                with open(args.ref_cache, "w") as f:
                    json.dump(cache, f)
        out["ref_runtime_ms"] = cache[task_id]
        out["status"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["status"], out["error"] = "runtime_error", f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()[-2000:]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--ref-cache", default="")
    args = ap.parse_args()
    res = evaluate(args)
    res["process_s"] = time.monotonic() - T0
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
