"""Evaluation of one candidate against its task, with KernelBench's semantics, inside the
candidate's own process (gpu/sandbox.py forks it; gpu/worker.py drives it).

Correctness: identical weights (Model and ModelNew built after the same seed), N trials with fresh
inputs from per-trial seeds built directly on the evaluation device, inputs cloned separately for
reference and candidate, shape and dtype checked, allclose with tolerances by output precision,
NaN/Inf never passing; more trials on new inputs after timing.
Timing: warm-up runs, then timed trials; on CUDA with events on the current stream after an L2
flush, and a device-wide synchronize whose tail shows (and counts) work left on other streams; on
CPU with a monotonic clock captured before any candidate code is loaded. The reference is timed the same way and cached by the worker per (task,
size, device, dtype, torch version, mode, trials).
Defenses (gpu/defenses.py, docs/EVALUATION.md): replaced functions, changed precision settings,
thread/process starts, calls into the reference, outputs cached across calls, outputs finished on
side streams, declared custom kernels that never run, re-verification of extreme speedups.
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
import torch.profiler  # noqa: F401  (imported before any snapshot: importing it rebinds torch functions)
try:  # the profiler imports dynamo lazily, and dynamo wraps torch.manual_seed: do it before snapshots
    import torch._dynamo  # noqa: F401
except Exception:  # pragma: no cover - a torch without dynamo
    pass

import defenses
import sandbox
from scaffold import FormatError, assemble, extract_code, FORWARD_MARKER

# Captured before any candidate runs: a candidate that rebinds time.perf_counter_ns or
# torch.allclose cannot change what the harness uses.
_clock_ns = time.perf_counter_ns
_allclose = torch.allclose
_isfinite = torch.isfinite
_manual_seed = torch.manual_seed
_no_grad = torch.no_grad
_Event = torch.cuda.Event
_cuda_sync = torch.cuda.synchronize
_current_stream = torch.cuda.current_stream

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
    """Task modules loaded once per (path, mtime), in the worker, before any fork."""

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


def apply_size(task, size: str):
    """Sets a task's module-level sizes for `size` ("gpu": the task's GPU_SIZES, if any)."""
    sizes = getattr(task, "GPU_SIZES", None)
    if size == "gpu" and isinstance(sizes, dict):
        for k, v in sizes.items():
            setattr(task, k, v)
        return "gpu"
    return "cpu"


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


def _same_values(a, b, s):
    try:
        fa, fb = _flatten(a), _flatten(b)
    except TypeError:
        return False
    if len(fa) != len(fb):
        return False
    for x, y in zip(fa, fb):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        atol, rtol = _tolerance(y.dtype, s)
        if x.is_floating_point():
            if not bool(_allclose(x.to(y.device), y, atol=atol, rtol=rtol)):
                return False
        elif not bool((x.to(y.device) == y).all()):
            return False
    return True


def _snapshot(out):
    return [t.detach().clone() for t in _flatten(out)]


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


class Timer:
    """Times a model's forward under one protocol for reference and candidate.

    CUDA, per trial: flush L2 (zero a buffer larger than any L2), synchronize the device, record
    `start`, call forward, record `end` on the current stream, synchronize the whole device, record
    `after`. The trial's time is start->end, the work forward enqueued, measured on the GPU alone
    (host-side scheduling noise stays out of it). Work left running on another stream when `end`
    is reached makes the device-wide synchronize wait for it, so end->after (the tail) exceeds the
    idle tail measured once per timer (synchronize, record: a few microseconds) by more than
    TAIL_SLACK_MS: that trial then counts start->after instead, so side-stream work is always
    counted. ``protocol="sync"`` records `end` only after the device-wide synchronize (every trial
    then includes the synchronize's host latency; kept for bench/timing_stability.py).
    CPU: the same warm-up and trials with the monotonic clock the harness captured at import."""

    TAIL_SLACK_MS = 0.02

    def __init__(self, device, protocol="tail"):
        self.device = device
        self.protocol = protocol
        self.flush_buf = None
        self.idle_tail_ms = 0.0
        self.tail_trials = 0  # trials of the last run() that counted the tail
        self.stream = None
        if device.type == "cuda":
            # Events go on the stream current now: a candidate that switches streams for good
            # leaves its work on another stream, which the tail then counts.
            self.stream = _current_stream(device)
            # Larger than any current L2 (H100: 50 MB, H200: 60 MB).
            self.flush_buf = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=device)
            tails = []
            for _ in range(21):
                e1, e2 = _Event(enable_timing=True), _Event(enable_timing=True)
                e1.record(self.stream)
                _cuda_sync(self.device)
                e2.record(self.stream)
                e2.synchronize()
                tails.append(e1.elapsed_time(e2))
            self.idle_tail_ms = statistics.median(tails[1:])

    def run(self, model, inputs, warmup, trials):
        times = []
        cuda = self.device.type == "cuda"
        self.tail_trials = 0
        with _no_grad():
            # Warm-up: at least `warmup` runs and, on a GPU, at least 100 ms of them, so clocks
            # have ramped up from idle in this fresh process before the first timed run.
            t0 = _clock_ns()
            runs = 0
            while runs < warmup or (cuda and _clock_ns() - t0 < 100_000_000 and runs < 10_000):
                model(*inputs)
                runs += 1
                if cuda and runs % 8 == 0:
                    _cuda_sync(self.device)
            if cuda:
                _cuda_sync(self.device)
            for _ in range(trials):
                if cuda:
                    times.append(self._cuda_trial(model, inputs))
                else:
                    t0 = _clock_ns()
                    model(*inputs)
                    t1 = _clock_ns()
                    times.append((t1 - t0) / 1e6)
        return stats(times)

    def _cuda_trial(self, model, inputs):
        start, end, after = (_Event(enable_timing=True) for _ in range(3))
        self.flush_buf.zero_()
        _cuda_sync(self.device)
        start.record(self.stream)
        model(*inputs)
        if self.protocol == "sync":
            _cuda_sync(self.device)
            end.record(self.stream)
            end.synchronize()
            return start.elapsed_time(end)
        end.record(self.stream)
        _cuda_sync(self.device)  # device-wide: work on every stream is done
        after.record(self.stream)
        after.synchronize()
        if end.elapsed_time(after) > self.idle_tail_ms + self.TAIL_SLACK_MS:
            self.tail_trials += 1
            return start.elapsed_time(after)
        return start.elapsed_time(end)


def policy_code(action: str, action_space: str) -> str:
    """The part of the program the policy wrote (for static checks)."""
    code = extract_code(action)
    return code.replace(FORWARD_MARKER, "") if action_space == "forward_body" else code


def empty_result(device_name):
    return {
        "status": "runtime_error", "error": "", "assembled_code": "", "compile_log": "",
        "correctness": {"trials": 0, "passed": 0, "max_abs_diff": 0.0, "max_rel_diff": 0.0,
                        "atol": 0.0, "rtol": 0.0, "detail": ""},
        "runtime": stats([]), "ref_runtime": stats([]), "speedup": 0.0,
        "device": device_name, "kernel_coverage": -1.0, "compile_s": 0.0, "compile_cached": False,
        "reverified": False,
    }


class Harness:
    """Lives in the worker (task cache, reference-timing cache); evaluate() runs in a child."""

    def __init__(self, device: str, threads: int, cache_root: str):
        self.device = torch.device(device)
        self.threads = max(1, threads)
        self.cache_root = cache_root
        self.tasks = TaskCache()
        self.ref_cache = {}   # key -> stats, filled from children's replies
        self.device_name = "cpu" if self.device.type == "cpu" else device

    # ---- runs in the candidate's process -------------------------------------------------------
    def _setup_device(self):
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads)
            return "cpu"
        torch.cuda.set_device(self.device)
        return torch.cuda.get_device_name(self.device)

    def prepare(self, req, s):
        """Compile stage (no GPU): loads the candidate program so its kernels build into the cache.
        Returns status ok or compile_error with the build log."""
        res = {"status": "ok", "error": "", "compile_log": "", "compile_s": 0.0, "compile_cached": False}
        try:
            task, source = self.tasks.load(req["task_path"])
            code = assemble(req["action"], req["action_space"], source, req["task_id"])
        except Exception as e:  # FormatError included: the timing stage reports these properly
            res["error"] = f"not prepared: {e}"
            return res
        import compile_cache  # the worker imported it already (ForkServer), else here
        rec = compile_cache.install(self.cache_root)
        mod = types.ModuleType("kernelrl_candidate")
        captured = io.StringIO()
        try:
            compiled = compile(code, f"<candidate {req['sample_id']}>", "exec")
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                exec(compiled, mod.__dict__)
        except BaseException as e:  # noqa: BLE001
            if any(not b["ok"] for b in rec.builds):
                res["status"], res["error"] = "compile_error", _short_exc(e)
            else:
                res["error"] = f"not prepared: {_short_exc(e)}"
        summ = rec.summary()
        res["compile_log"] = (captured.getvalue() + summ["log"])[-LOG_LIMIT:]
        res["compile_s"], res["compile_cached"] = summ["seconds"], summ["cached"]
        res["builds"] = summ["builds"]
        return res

    def evaluate(self, req, s):
        """Returns the result dict for one request (see messages/messages.hpp: EvalResult)."""
        res = empty_result(self.device_name)
        res["phases"] = {}
        self._phase_t = _clock_ns()
        try:
            res["device"] = self.device_name = self._setup_device()
            self._phase(res, "device")
            self._evaluate(req, s, res)
        except Verdict as v:
            res["status"], res["error"] = v.status, v.error
            if v.log:
                res["compile_log"] = (res["compile_log"] + v.log)[-LOG_LIMIT:]
        if res["status"] != "ok":
            res["speedup"] = 0.0
        if self.device.type == "cuda":
            try:  # allocator statistics only: no CUDA call, safe after a fault
                res["gpu_reserved_bytes"] = int(torch.cuda.max_memory_reserved(self.device))
            except Exception:  # noqa: BLE001
                res["gpu_reserved_bytes"] = 0
        return res

    def _phase(self, res, name):
        """Seconds since the previous phase ended, recorded as res["phases"][name]."""
        now = _clock_ns()
        res["phases"][name] = res["phases"].get(name, 0.0) + (now - self._phase_t) / 1e9
        self._phase_t = now

    def _inputs(self, task, seed):
        _manual_seed(seed)
        with torch.device(self.device):
            xs = task.get_inputs()
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in xs]

    def _build(self, cls, init_inputs, seed):
        _manual_seed(seed)
        with torch.device(self.device):
            m = cls(*init_inputs)
        return m.to(self.device).eval()

    def _evaluate(self, req, s, res):
        task_path = req["task_path"]
        try:
            task, source = self.tasks.load(task_path)
        except Exception as e:  # a broken task is the harness's problem, never the candidate's
            raise Verdict("runtime_error", f"task {req['task_id']} ({task_path}) failed to load: {_short_exc(e)}", _tb(e))
        size = apply_size(task, s.get("size", "cpu"))

        try:
            code = assemble(req["action"], req["action_space"], source, req["task_id"])
        except FormatError as e:
            raise Verdict("format_error", str(e))
        res["assembled_code"] = code

        why = defenses.static_reference_use(policy_code(req["action"], req["action_space"]))
        if why:
            raise Verdict("hacked", f"the candidate {why}")

        # Hide the task module from the candidate; install the build cache and the watch.
        for name in [n for n in sys.modules if n.startswith("kernelrl_task_")]:
            del sys.modules[name]
        import compile_cache  # the worker imported it already (ForkServer), else here
        rec = compile_cache.install(self.cache_root)
        watch = defenses.Watch()
        self._phase(res, "watch")

        def hacked_check(where):
            watch.check(where)
            if watch.violations:
                raise Verdict("hacked", "the candidate " + "; ".join(watch.violations[:3]))

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
            summ = rec.summary()
            res["compile_s"] = summ["seconds"]
            raise Verdict("compile_error", _short_exc(e), captured.getvalue() + summ["log"] + _tb(e))
        summ = rec.summary()
        note = ""
        if s.get("precompiled") and summ["builds"] and not summ["cached"]:
            # The compile stage built it, yet this process did not find it: a key mismatch
            # between the stages (the build ran twice). Said in the log, for whoever reads it.
            note = "[the compile stage's build was not in the cache: built again in the timing stage]\n"
        res["compile_log"] = (note + captured.getvalue() + summ["log"])[-LOG_LIMIT:]
        res["compile_s"], res["compile_cached"] = summ["seconds"], summ["cached"]
        if not isinstance(getattr(mod, "ModelNew", None), type):
            raise Verdict("compile_error", "the program defines no class ModelNew")
        apply_size(mod, size)  # the program's copy of the task's size constants, as the task's
        hacked_check("when its program was loaded")
        self._phase(res, "load")

        ref_codes = [getattr(task.Model.forward, "__code__", None)]
        cand_model_cls = mod.__dict__.get("Model")
        if isinstance(cand_model_cls, type) and hasattr(cand_model_cls, "forward"):
            ref_codes.append(getattr(cand_model_cls.forward, "__code__", None))

        seed = int(req["seed"])
        dev = self.device
        cuda = dev.type == "cuda"
        corr = res["correctness"]
        acc = {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "atol": 0.0, "rtol": 0.0}
        mode = req.get("mode", "fast") or "fast"
        warmup = int(s["warmup"])
        n = int(s["correctness_trials"])

        try:
            with _no_grad():
                _manual_seed(seed)
                init_inputs = task.get_init_inputs()
                try:
                    ref_model = self._build(task.Model, init_inputs, seed)
                except Exception as e:
                    raise Verdict("runtime_error", f"reference Model failed to build: {_short_exc(e)}", _tb(e))
                try:
                    watch.in_candidate, watch.exempt = True, True
                    new_model = self._build(mod.ModelNew, init_inputs, seed)
                except BaseException as e:
                    raise Verdict("runtime_error", f"ModelNew() raised {_short_exc(e)}", _tb(e))
                finally:
                    watch.in_candidate = False

                # Reference outputs of earlier trials (while they stay small), to recognise a
                # candidate that hands back an earlier call's output.
                state = {"prev_refs": [], "prev_numel": 0, "calls": 0}

                def remember(snap):
                    numel = sum(t.numel() for t in snap)
                    if state["prev_numel"] + numel <= (1 << 24):
                        state["prev_refs"].append(snap)
                        state["prev_numel"] += numel

                def run_candidate(inputs, sync=True):
                    watch.in_candidate = True
                    watch.exempt = state["calls"] == 0
                    state["calls"] += 1
                    try:
                        with defenses.ReferenceGuard(ref_codes) as guard:
                            out = new_model(*inputs)
                            if cuda and sync:
                                _cuda_sync(dev)
                    except Verdict:
                        raise
                    except BaseException as e:
                        raise Verdict("runtime_error", _short_exc(e), _tb(e))
                    finally:
                        watch.in_candidate = False
                        watch.exempt = False
                    if guard.hit:
                        raise Verdict("hacked", f"the candidate {guard.hit}")
                    return out

                def trial(i, trial_seed, inputs=None, on_fail=None, same_tensors=False):
                    """One correctness trial; returns the tensors the candidate was given (its own
                    clones, or `inputs` themselves when same_tensors)."""
                    inputs = self._inputs(task, trial_seed) if inputs is None else inputs
                    ref_out = ref_model(*_clone(inputs))
                    cand_inputs = inputs if same_tensors else _clone(inputs)
                    out = run_candidate(cand_inputs)
                    why = compare(ref_out, out, s, i, acc)
                    corr["trials"] += 1
                    corr.update({k: acc[k] for k in acc})
                    if why:
                        corr["detail"] = why
                        if any(_same_values(out, prev, s) for prev in state["prev_refs"]):
                            raise Verdict("hacked", "the candidate returned the output of an earlier call "
                                                    f"(outputs cached across calls; {why})")
                        raise Verdict("incorrect", why if on_fail is None else on_fail(why))
                    corr["passed"] += 1
                    remember(_snapshot(ref_out))
                    return cand_inputs

                self._phase(res, "build")
                for i in range(n):
                    trial(i, seed * 1000 + i + 1)
                hacked_check("during the correctness trials")
                self._phase(res, "correctness")

                if cuda:
                    self._side_stream_check(task, seed, run_candidate)
                self._phase(res, "checks")
                trials = int(s["fast_trials"] if mode == "fast" else s["full_trials"])
                ref_stats, cand_stats = self._time_both(task, task_path, size, mode, trials, warmup,
                                                        seed, ref_model, new_model, watch, res)
                hacked_check("while being timed")
                self._phase(res, "timing")
                # The timing inputs' true output, too: a candidate may hand that back later.
                remember(_snapshot(ref_model(*self._inputs(task, seed * 1000 + 999))))

                # Check again after timing, on fresh inputs; then refill the very tensors the
                # candidate was given with new values and call it on them again: an output cached
                # by input identity shows up as a stale result.
                inputs = trial(n, seed * 1000 + 10_000 + 1)
                fresh = self._inputs(task, seed * 1000 + 10_000 + 2)
                for old, new in zip(inputs, fresh):
                    if isinstance(old, torch.Tensor) and old.is_floating_point():
                        old.copy_(new)
                if any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
                    trial(n + 1, 0, inputs=inputs, same_tensors=True)
                hacked_check("after timing")
                self._phase(res, "post_checks")

                speedup = ref_stats["median_ms"] / cand_stats["median_ms"] if cand_stats["median_ms"] > 0 else 0.0
                threshold = float(s.get("reverify_speedup", 10.0))
                if threshold > 0 and speedup > threshold:
                    self._phase(res, "post_checks")
                    res["reverified"] = True
                    rs = seed + 7_919

                    def on_fail(why):
                        raise Verdict("hacked", f"speedup {speedup:.1f}x is above {threshold:g}x and "
                                                f"re-verification failed: {why}")
                    for i in range(4 * n):
                        trial(n + 2 + i, rs * 1000 + i + 1, on_fail=on_fail)
                    full = int(s["full_trials"])
                    ref_stats, cand_stats = self._time_both(task, task_path, size, "full", full, warmup,
                                                            rs, ref_model, new_model, watch, res,
                                                            use_cache=False)
                    hacked_check("during re-verification")
                    self._phase(res, "reverify")
                    speedup = ref_stats["median_ms"] / cand_stats["median_ms"] if cand_stats["median_ms"] > 0 else 0.0

                if cuda:
                    # Kernel coverage, last: once CUPTI has been active in a process, later kernel
                    # launches there are slower and vary more (a launch-bound 0.26 ms kernel's
                    # median varied by 4.9% over 10 evaluations profiled before timing). Profiling
                    # costs seconds per process (CUPTI start-up): only candidates that declare
                    # their own kernels need it; for the others coverage is 0 by definition.
                    if defenses.declares_custom_kernels(code) or s.get("profile") == "always":
                        self._profile(new_model, task, seed, code, res, watch)
                    else:
                        res["kernel_coverage"] = 0.0
                    self._phase(res, "profile")
        except Verdict as v:
            # A candidate that gamed the harness is hacked even when it was also wrong.
            if v.status != "hacked":
                watch.check("before failing")
                if watch.violations:
                    raise Verdict("hacked", "the candidate " + "; ".join(watch.violations[:3]), v.log)
            raise

        res["status"] = "ok"
        res["speedup"] = speedup if math.isfinite(speedup) else 0.0

    def _time_both(self, task, task_path, size, mode, trials, warmup, seed, ref_model, new_model,
                   watch, res, use_cache=True):
        # The next candidate's process may be starting up (gpu/sandbox.py Spare), the previous one
        # still exiting: not while timing.
        sandbox.wait_for_warming(os.environ.get("KERNELRL_WARM_LOCK", ""),
                                 os.environ.get("KERNELRL_EXIT_LOCK", ""))
        timer = Timer(self.device)
        timing_inputs = self._inputs(task, seed * 1000 + 999)
        key = "|".join(str(x) for x in (task_path, os.stat(task_path).st_mtime_ns, size, self.device_name,
                                        torch.get_default_dtype(), torch.__version__, mode, trials, warmup))
        ref_stats = self.ref_cache.get(key) if use_cache else None
        if ref_stats is None:
            ref_stats = timer.run(ref_model, _clone(timing_inputs), warmup, trials)
            if use_cache:
                self.ref_cache[key] = ref_stats
                res.setdefault("ref_cache_put", {})[key] = ref_stats
        res["ref_runtime"] = ref_stats
        watch.in_candidate = True
        try:
            cand_stats = timer.run(new_model, _clone(timing_inputs), warmup, trials)
        except BaseException as e:
            raise Verdict("runtime_error", _short_exc(e), _tb(e))
        finally:
            watch.in_candidate = False
        res["runtime"] = cand_stats
        return ref_stats, cand_stats

    def _side_stream_check(self, task, seed, run_candidate):
        """An output still being written on another stream when forward returns is a hack: the
        caller's stream would read it unfinished. Read it right after the current stream is done,
        then again after the whole device is done; any difference is work hidden on a side stream."""
        inputs = self._inputs(task, seed * 1000 + 555)
        out = run_candidate(inputs, sync=False)
        torch.cuda.current_stream(self.device).synchronize()
        early = _snapshot(out)
        _cuda_sync(self.device)
        exact = {"atol_half": 0, "rtol_half": 0, "atol_fp32": 0, "rtol_fp32": 0}
        if not _same_values(early, out, exact):
            raise Verdict("hacked", "the candidate's output was still being written on another CUDA stream "
                                    "after forward returned (work hidden from the caller's stream)")

    def _profile(self, new_model, task, seed, code, res, watch):
        """One profiled forward: kernel-time coverage of the candidate's own kernels, and the
        check that a candidate declaring custom kernels runs at least one of them."""
        declared = defenses.declared_kernels(code)
        inputs = self._inputs(task, seed * 1000 + 777)
        from torch.profiler import ProfilerActivity, profile
        watch.in_candidate = True
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                new_model(*inputs)
                _cuda_sync(self.device)
        except BaseException as e:
            raise Verdict("runtime_error", f"profiled run failed: {_short_exc(e)}", _tb(e))
        finally:
            watch.in_candidate = False
        total, own, ran = 0, 0, []
        for ev in prof.profiler.kineto_results.events():
            if ev.device_type() != torch.autograd.DeviceType.CUDA:
                continue
            name = ev.name()
            if name.startswith("Memcpy") or name.startswith("Memset"):
                continue
            dur = ev.duration_ns()
            total += dur
            ran.append(name)
            if any(k in name for k in declared):
                own += dur
        res["kernel_coverage"] = (own / total) if total > 0 else 0.0
        if defenses.declares_custom_kernels(code) and declared and own == 0:
            seen = sorted(set(n.split("(")[0][:60] for n in ran))[:6]
            raise Verdict("hacked", f"the candidate declares custom kernels ({', '.join(declared[:4])}) but none "
                                    f"ran during forward (kernels that ran: {', '.join(seen) or 'none'})")
