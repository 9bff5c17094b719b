"""Evaluation of one candidate against its task, with KernelBench's semantics.

Correctness: identical weights (Model and ModelNew built after the same seed), N trials with fresh
inputs from per-trial seeds, inputs cloned separately for reference and candidate, shape and
dtype checked, allclose with tolerances by output precision, NaN/Inf never passing; one more
trial on new inputs after timing.
Timing: warm-up runs, then timed trials; on CUDA with events plus a device-wide synchronize (so
side-stream work counts) after an L2 flush; on CPU with a monotonic clock captured before any
candidate code is loaded. The reference is timed the same way and cached per (task, device,
dtype, torch version, mode).
"""

import contextlib
import hashlib
import importlib.util
import io
import math
import os
import statistics
import sys
import time
import traceback
import types

import torch

from scaffold import FormatError, assemble

# Captured before any candidate runs: a candidate that rebinds time.perf_counter_ns or
# torch.allclose in its own module cannot change what the harness uses.
_clock_ns = time.perf_counter_ns
_allclose = torch.allclose
_isfinite = torch.isfinite
_manual_seed = torch.manual_seed

LOG_LIMIT = 64 * 1024


class Verdict(Exception):
    """Ends an evaluation early with a status and a one-line error."""

    def __init__(self, status, error, log=""):
        super().__init__(error)
        self.status, self.error, self.log = status, error, log


def _short_exc(e: BaseException) -> str:
    """'Type: message (candidate line N)' for an exception raised by candidate code."""
    line = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename.startswith("<candidate"):
            line = f" (candidate line {frame.lineno})"
            break
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}{line}"[:500]


def _tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-LOG_LIMIT:]


class TaskCache:
    """Task modules loaded once per (path, mtime)."""

    def __init__(self):
        self._mods = {}

    def load(self, path: str):
        mtime = os.stat(path).st_mtime_ns
        hit = self._mods.get(path)
        if hit and hit[0] == mtime:
            return hit[1], hit[2]
        with open(path, "r", encoding="utf-8") as f:
            source = f.read()
        name = "kernelrl_task_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for attr in ("Model", "get_inputs", "get_init_inputs"):
            if not hasattr(mod, attr):
                raise ValueError(f"task file {path} defines no {attr}")
        self._mods[path] = (mtime, mod, source)
        return mod, source


def _to_device(xs, device):
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]


def _clone(xs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        res = []
        for o in out:
            res.extend(_flatten(o))
        return res
    if isinstance(out, (int, float, bool)):
        return [torch.tensor(out)]
    raise TypeError(f"output of type {type(out).__name__} (expected tensors)")


def _tolerance(dtype, s):
    if dtype in (torch.float16, torch.bfloat16):
        return s["atol_half"], s["rtol_half"]
    return s["atol_fp32"], s["rtol_fp32"]


def compare(ref_out, out, s, trial, acc):
    """Compares one trial's outputs; updates acc (max diffs); returns '' or why it failed."""
    try:
        refs = _flatten(ref_out)
    except TypeError as e:
        raise ValueError(f"reference returned an unsupported {e}")
    try:
        outs = _flatten(out)
    except TypeError as e:
        return f"trial {trial}: candidate returned an unsupported {e}"
    if len(refs) != len(outs):
        return f"trial {trial}: {len(outs)} output tensors, reference has {len(refs)}"
    for i, (r, o) in enumerate(zip(refs, outs)):
        where = f"trial {trial}" + (f", output {i}" if len(refs) > 1 else "")
        if tuple(o.shape) != tuple(r.shape):
            return f"{where}: shape {list(o.shape)} != reference {list(r.shape)}"
        if o.dtype != r.dtype:
            return f"{where}: dtype {o.dtype} != reference {r.dtype}"
        atol, rtol = _tolerance(r.dtype, s)
        acc["atol"], acc["rtol"] = atol, rtol
        if o.device != r.device:
            o = o.to(r.device)
        if o.is_floating_point() or o.is_complex():
            if not bool(_isfinite(o).all()):
                return f"{where}: candidate output holds NaN or Inf"
            diff = (o.double() - r.double()).abs()
            if diff.numel():
                acc["max_abs_diff"] = max(acc["max_abs_diff"], float(diff.max()))
                rel = diff / (r.double().abs() + 1e-12)
                acc["max_rel_diff"] = max(acc["max_rel_diff"], float(rel.max()))
            if not bool(_allclose(o, r, atol=atol, rtol=rtol)):
                return (f"{where}: values differ (max abs diff {float(diff.max()):.3g}, "
                        f"atol {atol:g}, rtol {rtol:g})")
        elif not bool((o == r).all()):
            return f"{where}: values differ"
    return ""


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    def __init__(self, device):
        self.device = device
        if device.type == "cuda":
            # Larger than any current L2 (H100: 50 MB, H200: 60 MB).
            self.flush_buf = torch.empty(128 * 1024 * 1024, dtype=torch.int8, device=device)

    def run(self, model, inputs, warmup, trials):
        times = []
        with torch.no_grad():
            for _ in range(warmup):
                model(*inputs)
            _sync(self.device)
            for _ in range(trials):
                if self.device.type == "cuda":
                    self.flush_buf.zero_()
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize(self.device)
                    start.record()
                    model(*inputs)
                    end.record()
                    torch.cuda.synchronize(self.device)  # device-wide: side streams count
                    times.append(start.elapsed_time(end))
                else:
                    t0 = _clock_ns()
                    model(*inputs)
                    t1 = _clock_ns()
                    times.append((t1 - t0) / 1e6)
        return stats(times)


def stats(times):
    if not times:
        return {"median_ms": 0.0, "mean_ms": 0.0, "std_ms": 0.0, "min_ms": 0.0, "max_ms": 0.0, "trials": 0}
    return {
        "median_ms": float(statistics.median(times)),
        "mean_ms": float(statistics.fmean(times)),
        "std_ms": float(statistics.stdev(times)) if len(times) > 1 else 0.0,
        "min_ms": float(min(times)),
        "max_ms": float(max(times)),
        "trials": len(times),
    }


class Harness:
    def __init__(self, device: str, threads: int):
        self.device = torch.device(device)
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, threads))
            self.device_name = "cpu"
        else:
            torch.cuda.set_device(self.device)
            self.device_name = torch.cuda.get_device_name(self.device)
        self.tasks = TaskCache()
        self.ref_cache = {}
        self.timer = Timer(self.device)

    def _inputs(self, task, seed):
        _manual_seed(seed)
        return _to_device(task.get_inputs(), self.device)

    def _build(self, cls, init_inputs, seed):
        _manual_seed(seed)
        return cls(*init_inputs).to(self.device).eval()

    def evaluate(self, req, s):
        """Returns the result dict for one request (see messages/messages.hpp: EvalResult)."""
        res = {
            "status": "runtime_error", "error": "", "assembled_code": "", "compile_log": "",
            "correctness": {"trials": 0, "passed": 0, "max_abs_diff": 0.0, "max_rel_diff": 0.0,
                            "atol": 0.0, "rtol": 0.0, "detail": ""},
            "runtime": stats([]), "ref_runtime": stats([]), "speedup": 0.0,
            "device": self.device_name,
        }
        try:
            self._evaluate(req, s, res)
        except Verdict as v:
            res["status"], res["error"] = v.status, v.error
            if v.log:
                res["compile_log"] = (res["compile_log"] + v.log)[-LOG_LIMIT:]
        return res

    def _evaluate(self, req, s, res):
        task_path = req["task_path"]
        try:
            task, source = self.tasks.load(task_path)
        except Exception as e:  # a broken task is the harness's problem, never the candidate's
            raise Verdict("runtime_error", f"task {req['task_id']} ({task_path}) failed to load: {_short_exc(e)}", _tb(e))

        try:
            code = assemble(req["action"], req["action_space"], source, req["task_id"])
        except FormatError as e:
            raise Verdict("format_error", str(e))
        res["assembled_code"] = code

        # Load the candidate program: module-level errors (imports, kernel builds) are compile errors.
        mod = types.ModuleType("kernelrl_candidate")
        mod.__dict__["__file__"] = f"<candidate {req['sample_id']}>"
        captured = io.StringIO()
        try:
            compiled = compile(code, f"<candidate {req['sample_id']}>", "exec")
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                exec(compiled, mod.__dict__)
        except SyntaxError as e:
            raise Verdict("format_error", f"the program does not parse: {e.msg} (line {e.lineno})")
        except BaseException as e:
            raise Verdict("compile_error", _short_exc(e), captured.getvalue() + _tb(e))
        res["compile_log"] = captured.getvalue()[-LOG_LIMIT:]
        if not isinstance(getattr(mod, "ModelNew", None), type):
            raise Verdict("compile_error", "the program defines no class ModelNew")

        seed = int(req["seed"])
        dev = self.device
        with torch.no_grad():
            _manual_seed(seed)
            init_inputs = task.get_init_inputs()
            try:
                ref_model = self._build(task.Model, init_inputs, seed)
            except Exception as e:
                raise Verdict("runtime_error", f"reference Model failed to build: {_short_exc(e)}", _tb(e))
            try:
                new_model = self._build(mod.ModelNew, init_inputs, seed)
            except BaseException as e:
                raise Verdict("runtime_error", f"ModelNew() raised {_short_exc(e)}", _tb(e))

            corr = res["correctness"]
            acc = {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "atol": 0.0, "rtol": 0.0}

            def trial(i, trial_seed):
                inputs = self._inputs(task, trial_seed)
                ref_out = ref_model(*_clone(inputs))
                try:
                    out = new_model(*_clone(inputs))
                    _sync(dev)
                except BaseException as e:
                    raise Verdict("runtime_error", _short_exc(e), _tb(e))
                why = compare(ref_out, out, s, i, acc)
                corr["trials"] += 1
                corr.update({k: acc[k] for k in acc})
                if why:
                    corr["detail"] = why
                    raise Verdict("incorrect", why)
                corr["passed"] += 1

            n = int(s["correctness_trials"])
            for i in range(n):
                trial(i, seed * 1000 + i + 1)

            # Timing on one fixed input set, reference first (cached), then the candidate.
            mode = req.get("mode", "fast")
            trials = int(s["fast_trials"] if mode == "fast" else s["full_trials"])
            warmup = int(s["warmup"])
            timing_inputs = self._inputs(task, seed * 1000 + 999)
            key = (task_path, os.stat(task_path).st_mtime_ns, self.device_name,
                   str(torch.get_default_dtype()), torch.__version__, mode, trials, warmup)
            ref_stats = self.ref_cache.get(key)
            if ref_stats is None:
                ref_stats = self.timer.run(ref_model, _clone(timing_inputs), warmup, trials)
                self.ref_cache[key] = ref_stats
            res["ref_runtime"] = ref_stats
            try:
                cand_stats = self.timer.run(new_model, _clone(timing_inputs), warmup, trials)
            except BaseException as e:
                raise Verdict("runtime_error", _short_exc(e), _tb(e))
            res["runtime"] = cand_stats

            # Check again on fresh inputs after timing: caching an output by input pointer or
            # changing behaviour after the first calls does not pass.
            trial(n, seed * 1000 + 10_000 + 1)

        res["status"] = "ok"
        med = cand_stats["median_ms"]
        res["speedup"] = ref_stats["median_ms"] / med if med > 0 else 0.0
        if not math.isfinite(res["speedup"]):
            res["speedup"] = 0.0
