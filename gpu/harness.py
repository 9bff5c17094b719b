"""Evaluation of one candidate against its task, with KernelBench's semantics: the candidate's
side runs inside the candidate's own process (gpu/sandbox.py forks it; gpu/worker.py drives it),
the reference's side in the judge's (gpu/judge.py), which compares with gpu/checks.py.

Correctness: identical weights (Model and ModelNew built after the same seed), N trials with fresh
inputs from per-trial seeds built directly on the evaluation device, generated separately by the
judge (for the reference) and the candidate's process, shape and dtype checked, allclose with
tolerances by output precision, NaN/Inf never passing; more trials on new inputs after timing.
Timing: warm-up runs, then timed trials; on CUDA with events on the current stream after an L2
flush, and a device-wide synchronize whose tail shows (and counts) work left on other streams; on
CPU with a monotonic clock captured before any candidate code is loaded. The reference is timed the
same way by the judge and cached by the worker per (task, size, device, mode, trials).
Defenses (gpu/defenses.py, docs/EVALUATION.md): replaced functions, changed precision settings,
thread/process starts, calls into the reference, outputs cached across calls, outputs finished on
side streams, declared custom kernels that never run, re-verification of extreme speedups.
"""

import ast
import collections
import contextlib
import gc
import hashlib
import linecache
import math
import os
import random
import re
import sys
import tempfile
import traceback
import types
import warnings

import torch
import torch.profiler  # noqa: F401  (imported before any snapshot: importing it rebinds torch functions)
try:  # the profiler imports dynamo lazily, and dynamo wraps torch.manual_seed: do it before snapshots
    import torch._dynamo  # noqa: F401
except Exception:  # pragma: no cover - a torch without dynamo
    pass

from . import bounded
from . import checks
from . import defenses
from . import devlock
from . import fused_check
from . import protocol
from . import sandbox
from . import timed_region
from .checks import _PLAIN_TENSORS, _flatten, _shapes
from .scaffold import FormatError, assemble, embedded_task_lines, extract_code, FORWARD_MARKER
from .timing import Timer, stats
from .verdict import Verdict
# The clock and CUDA functions timing.py captured at import (one capture, which the watch guards).
from .timing import _clock_ns, _cuda_sync, _Event, _no_grad

# Captured before any candidate runs: a candidate that rebinds torch.manual_seed or
# Watch.check cannot change what the harness uses.
_manual_seed = torch.manual_seed
_watch_check = defenses.Watch.check  # a candidate replacing Watch.check does not silence it


def _hacked_check(watch, where, log=""):
    """The watch's check at `where`: what it found makes the candidate hacked (with `log`, the
    log of the verdict it replaces)."""
    _watch_check(watch, where)
    if watch.violations:
        raise Verdict("hacked", "the candidate " + "; ".join(watch.violations[:3]), log)


# One candidate's program as _load_candidate leaves it (immutable: the phases after read it).
_Program = collections.namedtuple("_Program", "task source code mod compiled watch allocated_before")


LOG_LIMIT = 64 * 1024


_CANDIDATE_FILES = set()  # the files candidate programs were compiled under


def _compile_candidate(code: str, sample_id: str):
    """The candidate program compiled under a file of its own in this process's temporary folder
    (Triton's @triton.jit reads its kernels' source through inspect; exec'd text has none), also
    registered in linecache; "<candidate ID>" when no file can be written. Triton's kernel cache
    goes to that folder too unless TRITON_CACHE_DIR says where. Returns (code object, file name)."""
    name = f"<candidate {sample_id}>"
    try:
        folder = tempfile.mkdtemp(prefix="kernelrl-candidate-")
        path = os.path.join(folder, "candidate_%s.py" % re.sub(r"[^A-Za-z0-9_.-]", "_", sample_id)[:100])
        with open(path, "w") as f:
            f.write(code)
        name = path
        os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(tempfile.gettempdir(), "kernelrl-triton-cache"))
    except OSError:
        pass
    _CANDIDATE_FILES.add(name)
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    return compile(code, name, "exec"), name


def _short_exc(e: BaseException) -> str:
    """'Type: message (candidate line N)' for an exception raised by candidate code."""
    line = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename.startswith("<candidate") or frame.filename in _CANDIDATE_FILES:
            line = f" (candidate line {frame.lineno})"
            break
    msg = str(e).strip().splitlines()
    if _nvml_report_failed(str(e)):
        msg = ["CUDA out of memory (PyTorch's report of the device's processes then failed: NVML did not "
               "initialise)"]
    return f"{type(e).__name__}: {msg[0] if msg else ''}{line}"[:500]


def _is_oom(e: BaseException) -> bool:
    """Whether an exception is an allocation failure (CUDA's caching allocator, a CUDA library's
    own allocation, the CPU allocator under the address-space limit, Python's MemoryError)."""
    if isinstance(e, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    text = str(e)
    return ("out of memory" in text or "can't allocate memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text
            or _nvml_report_failed(text))


def _nvml_report_failed(text: str) -> bool:
    """PyTorch's caching allocator, out of memory, lists the device's processes through NVML for
    its message, and asserts that NVML initialised: where it cannot (a container, a sandbox
    without the management device), the allocation failure reads as this assertion instead."""
    return "nvmlInit" in text and "CUDACachingAllocator" in text


def _tb(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-LOG_LIMIT:]


class TaskCache:
    """Task modules loaded once per (path, mtime), in the worker, before any fork."""

    def __init__(self):
        self._mods = {}

    def load(self, path: str, source=None):
        """The task module at path; given its source (read by the worker: a candidate's process
        may not see the task's folder), from that text."""
        mtime = os.stat(path).st_mtime_ns if source is None else hashlib.sha1(source.encode()).hexdigest()
        hit = self._mods.get(path)
        if hit and hit[0] == mtime:
            return hit[1], hit[2]
        if source is None:
            with open(path, "r", encoding="utf-8") as f:
                source = f.read()
        name = "kernelrl_task_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        mod = types.ModuleType(name)
        mod.__file__ = path
        sys.modules[name] = mod  # as an import would (dataclasses and pickling look it up)
        exec(compile(source, path, "exec"), mod.__dict__)
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


# Share of the device's memory the candidate's program and ModelNew may hold before an
# out-of-memory in the harness's own work is put down to the candidate (runtime_error).
CANDIDATE_HELD_LIMIT = 0.25


# Input distributions beyond the task's own draw (docs/EVALUATION.md, "Inputs beyond the task's
# draw"): each a deterministic transform of get_inputs()'s floating-point tensors, seeded by the
# check's seed, so the judge and the candidate's process make the same inputs. Integer and bool
# tensors (indices, masks, labels) and non-tensors stay as drawn.
#   signed: every element's sign flipped with probability 1/2 (the task's magnitudes, both signs)
#   large:  every element times 256 (exact in binary floating point)
#   zeros:  a random eighth of the elements set to exactly 0
INPUT_DISTRIBUTIONS = protocol.INPUT_DISTRIBUTIONS  # (one definition, shared with the judge)
LARGE_SCALE = 256.0
ZERO_SHARE = 0.125


def distribute(xs, name, seed):
    """get_inputs()'s list with distribution `name` applied (None or "task": unchanged), into new
    tensors (get_inputs may hand out a tensor it keeps), a chunk at a time (a few hundred MB of
    temporaries whatever the inputs' size)."""
    if not name or name == "task":
        return xs
    if name not in INPUT_DISTRIBUTIONS:
        raise ValueError(f"unknown input distribution {name!r} (known: {', '.join(INPUT_DISTRIBUTIONS)})")
    out = []
    for i, x in enumerate(xs):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            out.append(x)
            continue
        if name == "large":
            out.append(x * LARGE_SCALE)
            continue
        gen = torch.Generator(device=x.device)
        gen.manual_seed((int(seed) * 1_000_003 + 7_919 * (i + 1)) % (2**63))
        src = x.detach().contiguous().reshape(-1)
        y = torch.empty_like(src)
        for a in range(0, src.numel(), checks.CHUNK):
            piece = src[a:a + checks.CHUNK]
            u = torch.rand(piece.numel(), generator=gen, device=x.device)
            if name == "signed":
                torch.where(u < 0.5, -piece, piece, out=y[a:a + checks.CHUNK])
            else:
                torch.where(u < ZERO_SHARE, torch.zeros((), dtype=piece.dtype, device=x.device), piece,
                            out=y[a:a + checks.CHUNK])
            del u
        y = y.reshape(x.shape)
        if not x.is_contiguous():  # the layout the task gives (a transposed input, say) stays
            y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(y)
        out.append(y)
    return out


def distribution_name(dist):
    return dist or "task"



def _builder():
    """Kernel builds go to the trusted worker when this process has a channel to it."""
    return sandbox.ask if sandbox._SERVICE is not None else None


_LOCK = [None, None]  # (pid, DeviceLock or None): this process's hold on its device


def device_lock():
    """This process's hold on its device (gpu/devlock.py), from the descriptors gpu/sandbox.py
    opened for it; None where the worker gave none (a test's bare Harness)."""
    if _LOCK[0] != os.getpid():
        _LOCK[:] = [os.getpid(), devlock.DeviceLock.from_env()]
    return _LOCK[1]


def syntax_message(e: SyntaxError) -> str:
    return f"the program does not parse: {e.msg} (line {e.lineno})"


def early_verdict(req):
    """(status, assembled code, error) when the request's action is judged before anything of it runs,
    with the very verdict and message the harness gives (Harness._evaluate, in its order): a format
    error where it does not assemble into a program (scaffold.FormatError); hacked where the part the
    policy wrote uses the reference (defenses.static_reference_use); a format error where the
    program does not compile. None where the action is none of these, or where the answer could
    differ from the harness's (the task's own source missing or broken, a compiler failure other
    than a syntax error): those go to a candidate's process as usual. Parsing and compiling run no
    code of the action."""
    source = req.get("task_source")
    if not isinstance(source, str):
        return None
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    try:
        code = assemble(req["action"], req["action_space"], source, req["task_id"])
    except FormatError as e:
        return "format_error", "", str(e)
    except Exception:  # noqa: BLE001 - the harness's own failure, reported by the harness
        return None
    try:
        why = reference_use(req)
    except Exception:  # noqa: BLE001 - the harness's own failure, reported by the harness
        return None
    if why:
        return "hacked", code, why
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(code, "<candidate>", "exec", dont_inherit=True)
        return None
    except SyntaxError as e:
        return "format_error", code, syntax_message(e)
    except Exception:  # noqa: BLE001 - ValueError (a NUL byte), RecursionError, MemoryError
        return None


def reference_use(req):
    """The hacked verdict's message where the part of the program the policy wrote uses the
    reference (defenses.static_reference_use), else None: one message for the early verdict and the
    candidate's process."""
    why = defenses.static_reference_use(policy_code(req["action"], req["action_space"]), req["action_space"])
    return f"the candidate {why}" if why else None


def policy_code(action: str, action_space: str) -> str:
    """The part of the program the policy wrote (for static checks)."""
    code = extract_code(action)
    return code.replace(FORWARD_MARKER, "") if action_space == "forward_body" else code


def empty_result(device_name):
    return {
        "status": "runtime_error", "error": "", "assembled_code": "", "compile_log": "", "output": "",
        "correctness": {"trials": 0, "passed": 0, "max_abs_diff": 0.0, "max_rel_diff": 0.0,
                        "atol": 0.0, "rtol": 0.0, "detail": ""},
        "runtime": stats([]), "ref_runtime": stats([]), "speedup": 0.0,
        "device": device_name, "kernel_coverage": -1.0, "compile_s": 0.0, "compile_cached": False,
        "reverified": False, "note": "", "review": "", "output_bytes": 0, "bound_ms": 0.0,
    }


def _cpu_cache_bytes():
    """The largest cache sysfs lists for CPU 0, in bytes (0: unknown)."""
    best = 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(root):
            try:
                with open(os.path.join(root, entry, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
            digits = text[:-1] if unit > 1 else text
            if digits.isdigit():
                best = max(best, int(digits) * unit)
    except OSError:
        pass
    return best


def written_bytes(t):
    """The bytes an output tensor's values occupy: its elements', or its storage's when smaller
    (a broadcast view of a small tensor)."""
    dense = t.numel() * t.element_size()
    try:
        return min(dense, int(t.untyped_storage().nbytes()))
    except Exception:  # noqa: BLE001
        return dense


# The device bound (docs/EVALUATION.md): a candidate whose median is below the time writing its
# outputs takes at BOUND_FRACTION^-1 times the device's measured bandwidth (a copy's bytes read
# and written over its time) is faster than the device allows; it is re-verified and, if it
# stands, its verdict is `unconfirmed`. Applied only to outputs of at least the bound's minimum
# (by default 4x the device's last-level cache, which can absorb smaller writes).
BOUND_FRACTION = 0.5


def bound_ms(output_bytes, bound):
    """The least time, ms, writing output_bytes takes under the device bound; 0 where it does not
    apply (no measured bandwidth, outputs under the minimum)."""
    rate = float((bound or {}).get("bytes_per_ms", 0.0))
    if rate <= 0 or output_bytes < float(bound.get("min_bytes", 0)) or output_bytes <= 0:
        return 0.0
    return BOUND_FRACTION * output_bytes / rate


class _Calls:
    """How the harness calls one candidate's forward (frozen by the watch, as Harness is)."""

    def __init__(self, harness, model, watch, ref_codes, own_codes, task, seed, n, dists, corr):
        self.h, self.model, self.watch = harness, model, watch
        self.ref_codes, self.own_codes = ref_codes, own_codes
        self.task, self.seed, self.n, self.dists, self.corr = task, seed, n, dists, corr
        self.calls = 0
        self.given_shapes = None  # the shapes of the last check's inputs
        self.spans = []  # (start, end) events on the caller's stream around each call but the first

    def device_ms(self):
        """The caller's stream's time over the calls so far but the first (its lazy compilation
        and first loads), in ms: how long the device has run this candidate's forward (every call
        so far synchronised: the correctness trials)."""
        return sum(a.elapsed_time(b) for a, b in self.spans)

    def run(self, inputs, sync=True):
        """forward(*inputs) as candidate code: the watch knows (its first call exempt from the
        checks of later ones), the reference's code may not run inside, and what it raises is its
        runtime_error."""
        watch, h = self.watch, self.h
        watch.exempt = self.calls == 0
        self.calls += 1
        try:
            on_gpu = h.device.type == "cuda"
            span = (_Event(enable_timing=True), _Event(enable_timing=True)) if self.calls > 1 and on_gpu else None
            stream = torch.cuda.current_stream(h.device) if span else None
            with h._as_candidate(watch), defenses.ReferenceGuard(self.ref_codes, self.own_codes) as guard:
                if span:
                    span[0].record(stream)
                out = self.model(*inputs)
                if span:
                    span[1].record(stream)
                    self.spans.append(span)
                if sync and on_gpu:
                    _cuda_sync(h.device)
        finally:
            watch.exempt = False
        if guard.hit:
            raise Verdict("hacked", f"the candidate {guard.hit}")
        return out

    def trial(self, label, index=0, into=None):
        """One check of the judge's protocol: the candidate's output on inputs from the check's
        seed (copied into `into`, tensors it was given before, when given) goes to the judge,
        which runs the reference on its own copy of them. Under another input distribution the
        judge is asked first whether the inputs are inside the reference's domain (None when not:
        no check). Returns the tensors the candidate was given."""
        h, dists = self.h, self.dists
        dist = protocol.distribution_of(label, index, dists)
        if dist is not None and not h._in_domain(label, index):
            return None
        h._prepare(label, index)
        with h._harness_step("generating inputs"):
            inputs = h._inputs(self.task, protocol.seed_of(label, index, self.seed, self.n, len(dists)), dist)
            if into is not None and _shapes(into) == _shapes(inputs):
                for old, new in zip(into, inputs):
                    if isinstance(old, torch.Tensor):
                        old.copy_(new)
                inputs = into
        self.given_shapes = _shapes(inputs)
        h._judged(label, index, self.run(inputs), self.corr)
        return inputs


class Harness:
    """Lives in the worker (task cache, reference-timing cache); evaluate() runs in a child."""

    def __init__(self, device: str, threads: int, cache_root: str):
        self.device = torch.device(device)
        self.threads = max(1, threads)
        self.cache_root = cache_root
        self.tasks = TaskCache()
        self.ref_cache = {}   # (worker) key -> the reference's timing, measured by trusted processes
        self.given_ref = {}   # (candidate's process) mode -> the reference's timing the worker gave
        self.link = None      # (candidate's process) its link to the judge (gpu/judge.py)
        self.given_bound = {}  # (candidate's process) the device's measured bandwidth (see bound_ms)
        self._output_bytes = 0  # (candidate's process) bytes its first trial's outputs span
        self.device_name = "cpu" if self.device.type == "cpu" else device
        self.fused_digest, self.fused_digest_why = None, "not on a GPU"  # (candidate's process) _setup_device

    # ---- runs in the candidate's process -------------------------------------------------------
    def _setup_device(self, candidate=False):
        """Sets the process's device; returns its name. `candidate`: a candidate's own process
        (the spare's warm-up, evaluate), whose side-stream check digests the candidate's outputs,
        also loads the one-pass digest's kernels; the judge, the reference's timing and the
        bandwidth probe never digest and skip it."""
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads)
            return "cpu"
        torch.cuda.set_device(self.device)
        name = torch.cuda.get_device_name(self.device)
        if candidate:
            # The worker compiled the kernels before forking (its device probe); a spare loads
            # them while it waits for its candidate, so evaluate finds them loaded. Where they do
            # not load, digest() makes the same figures with PyTorch's operations.
            self.fused_digest, self.fused_digest_why = fused_check.load_digest(self.device)
        return name

    def prepare(self, req, s):
        """Compile stage (no GPU): loads the candidate program so its kernels build into the cache.
        Returns status ok or compile_error with the build log."""
        res = {"status": "ok", "error": "", "compile_log": "", "compile_s": 0.0, "compile_cached": False}
        try:
            task, source = self.tasks.load(req["task_path"], req.get("task_source"))
            code = assemble(req["action"], req["action_space"], source, req["task_id"])
        except Exception as e:  # FormatError included: the timing stage reports these properly
            res["error"] = f"not prepared: {e}"
            return res
        from . import compile_cache  # the worker imported it already (ForkServer), else here
        rec = compile_cache.install(self.cache_root, _builder())
        mod = types.ModuleType("kernelrl_candidate")
        captured = bounded.BoundedText()  # the first and last 4 KB of what import prints
        try:
            compiled, mod.__dict__["__file__"] = _compile_candidate(code, req["sample_id"])
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
        self._candidate_bytes = 0
        self.memory_limit_mb = int(s.get("memory_limit_mb", 0))
        try:
            res["device"] = self.device_name = self._setup_device(candidate=True)
            self._phase(res, "device")
            self._evaluate(req, s, res)
        except Verdict as v:
            res["status"], res["error"] = v.status, v.error
            if v.log:
                res["compile_log"] = (res["compile_log"] + v.log)[-LOG_LIMIT:]
            self._phase(res, "until_verdict")  # the phase it failed in, up to its verdict
        if res["status"] != "ok":
            res["speedup"] = 0.0
        if self.link is not None:
            self.link.end()
        self._release(res)
        self._phase(res, "release")
        lock = device_lock()
        if lock is not None:  # (it keeps its hold until it exits)
            res["device_lock"] = lock.record()
        return res

    def _hold(self, res, how):
        """This process's hold on its device becomes ``how`` (gpu/devlock.py): the seconds spent
        waiting for it are the phase device_wait, not part of the phase they interrupt."""
        lock = device_lock()
        if lock is None or how == lock.state:
            return
        if self.device.type == "cuda":
            try:
                _cuda_sync(self.device)  # this process's work so far is inside the hold it leaves
            except Exception:  # noqa: BLE001 - a faulted context: the evaluation meets it again
                pass
        waited = lock.acquire(how)
        phases = res.setdefault("phases", {})
        phases["device_wait"] = phases.get("device_wait", 0.0) + waited
        self._phase_t = getattr(self, "_phase_t", 0) + int(waited * 1e9)
        res["device_lock"] = lock.record()

    @contextlib.contextmanager
    def _alone(self, res):
        """A timed region: the device held exclusively (no other candidate's work, start-up or
        exit on it), then as before."""
        lock = device_lock()
        before = lock.state if lock is not None else None
        try:
            self._hold(res, "exclusive")
            yield
        finally:
            self._hold(res, before)

    def _phase(self, res, name):
        """Seconds since the previous phase ended, recorded as res["phases"][name]."""
        now = _clock_ns()
        res["phases"][name] = res["phases"].get(name, 0.0) + (now - self._phase_t) / 1e9
        self._phase_t = now

    def _inputs(self, task, seed, dist=None):
        """The task's get_inputs() after seeding torch (and Python's and NumPy's generators, so a
        task drawing from them gives the judge and the candidate the same values too), under
        input distribution `dist` (None: the task's own draw; see distribute)."""
        _manual_seed(seed)
        random.seed(seed)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(seed % 2**32)
        with torch.device(self.device):
            xs = task.get_inputs()
        xs = [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in xs]
        return distribute(xs, dist, seed) if dist else xs

    def _build(self, cls, init_inputs, seed):
        _manual_seed(seed)
        with torch.device(self.device):
            m = cls(*init_inputs)
        return m.to(self.device).eval()

    def _load_task(self, req):
        """The request's task module and source; a broken task is the harness's problem, never the
        candidate's."""
        try:
            return self.tasks.load(req["task_path"], req.get("task_source"))
        except Exception as e:  # noqa: BLE001
            raise Verdict("runtime_error", f"task {req['task_id']} ({req['task_path']}) failed to load: "
                                           f"{_short_exc(e)}", _tb(e))

    def _build_reference(self, task, init_inputs, seed):
        try:
            with self._harness_step("building the reference Model"):
                return self._build(task.Model, init_inputs, seed)
        except Verdict:
            raise
        except Exception as e:  # noqa: BLE001
            raise Verdict("runtime_error", f"reference Model failed to build: {_short_exc(e)}", _tb(e))

    @staticmethod
    def _watch(task):
        """The defences' watch over what the candidate must leave as it is: the task's module and
        Model, and the judge's own code (its modules and classes: a candidate replacing the
        comparison or the clock is caught; gpu/worker.py computes the speedup itself)."""
        watch = defenses.Watch()
        watch.freeze("the task's module", task)
        watch.freeze("the task's Model", task.Model)
        for name in ("harness", "checks", "fused_check", "timing", "timed_region", "verdict", "defenses", "judge",
                     "protocol", "sandbox", "compile_cache", "scaffold"):
            if f"{__package__}.{name}" in sys.modules:
                watch.freeze(f"the harness module {name}", sys.modules[f"{__package__}.{name}"])
        for cls in (Harness, _Calls, Timer, defenses.Watch, defenses.ReferenceGuard, protocol.Link,
                    fused_check.Digest):
            watch.freeze(f"the harness class {cls.__name__}", cls)
        return watch

    @staticmethod
    def _load_program(req, s, res, code, rec):
        """Runs the candidate's program as module kernelrl_candidate: module-level errors
        (imports, kernel builds through the cache `rec`) are compile errors, with what it printed
        (its first and last 4 KB) and the build log. Returns (module, its compiled code)."""
        mod = types.ModuleType("kernelrl_candidate")
        captured = bounded.BoundedText()
        try:
            compiled, mod.__dict__["__file__"] = _compile_candidate(code, req["sample_id"])
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                exec(compiled, mod.__dict__)
        except SyntaxError as e:
            raise Verdict("format_error", syntax_message(e))
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
        return mod, compiled

    @staticmethod
    def _reference_codes(req, task, source, compiled):
        """(the reference's forward code objects, the program's own): the reference matched by
        identity is the task module's and, in the forward_body space, the copy the scaffold embeds
        in the candidate's program."""
        ref_codes = [getattr(task.Model.forward, "__code__", None)]
        if req["action_space"] == "forward_body":
            first, last = embedded_task_lines(source)
            ref_codes += defenses.embedded_reference_codes(compiled, first, last)
        return ref_codes, defenses.program_codes(compiled)

    def _reverifies(self, s, speedup, cand_stats, res):
        """Whether the speedup must be re-verified: above `reverify_speedup` (or `review_speedup`,
        when set and lower: one that could be unconfirmed is re-verified first), or a runtime
        below the device bound (res records the output's bytes and the bound)."""
        threshold = float(s.get("reverify_speedup", 10.0))
        review = float(s.get("review_speedup", 0.0))
        if review > 0:
            threshold = min(threshold, review) if threshold > 0 else review
        res["output_bytes"] = self._output_bytes
        res["bound_ms"] = bound_ms(self._output_bytes, self.given_bound)
        return (threshold > 0 and speedup > threshold) or cand_stats["median_ms"] < res["bound_ms"]

    def _coverage(self, s, code, new_model, task, seed, res, watch):
        """Kernel coverage, last: once CUPTI has been active in a process, later kernel launches
        there are slower and vary more (a launch-bound 0.26 ms kernel's median varied by 4.9% over
        10 evaluations profiled before timing). Profiling costs seconds per process (CUPTI
        start-up): only candidates that declare their own kernels need it; for the others
        coverage is 0 by definition."""
        if defenses.declares_custom_kernels(code) or s.get("profile") == "always":
            self._profile(new_model, task, seed, code, res, watch)
        else:
            res["kernel_coverage"] = 0.0
        self._phase(res, "profile")

    def _evaluate(self, req, s, res):
        """One candidate, phase by phase: its program loaded under the watch (_load_candidate, no
        hold on the device), then beside other candidates' work its correctness trials
        (_check_correctness), then its timed region alone and the checks after it
        (_time_and_recheck). A candidate that gamed the harness is hacked even when it also
        failed."""
        prog = self._load_candidate(req, s, res)
        # From here to its exit this process works on the device beside other candidates' (its
        # builds, done above, needed no hold); its timed regions hold the device alone.
        self._hold(res, "shared")
        ref_codes, own_codes = self._reference_codes(req, prog.task, prog.source, prog.compiled)
        try:
            with _no_grad():
                calls = self._check_correctness(req, s, res, prog, ref_codes, own_codes)
                speedup = self._time_and_recheck(req, s, res, prog, calls)
            # The phases are the harness's methods: one the candidate replaced did not check.
            _hacked_check(prog.watch, "before its verdict")
        except Verdict as v:
            if v.status != "hacked":
                _hacked_check(prog.watch, "before failing", v.log)
            raise
        res["status"] = "ok"
        res["speedup"] = speedup if math.isfinite(speedup) else 0.0

    def _load_candidate(self, req, s, res):
        """The phases watch and load: the program assembled from the action (a format error
        otherwise), the reference's code refused in it, the task module hidden, the build cache
        and the watch installed, the program run as a module. Returns its _Program."""
        task, source = self._load_task(req)
        size = apply_size(task, s.get("size", "cpu"))
        try:
            code = assemble(req["action"], req["action_space"], source, req["task_id"])
        except FormatError as e:
            raise Verdict("format_error", str(e))
        res["assembled_code"] = code

        why = reference_use(req)
        if why:
            raise Verdict("hacked", why)

        # Hide the task module from the candidate; install the build cache and the watch.
        for name in [n for n in sys.modules if n.startswith("kernelrl_task_")]:
            del sys.modules[name]
        from . import compile_cache  # the worker imported it already (ForkServer), else here
        rec = compile_cache.install(self.cache_root, _builder())
        watch = self._watch(task)
        self._phase(res, "watch")

        allocated_before = self._allocated()
        mod, compiled = self._load_program(req, s, res, code, rec)
        apply_size(mod, size)  # the program's copy of the task's size constants, as the task's
        _hacked_check(watch, "when its program was loaded")
        self._phase(res, "load")
        return _Program(task, source, code, mod, compiled, watch, allocated_before)

    def _check_correctness(self, req, s, res, prog, ref_codes, own_codes):
        """The phases build and correctness, beside other candidates' work: ModelNew built after
        the reference's seed, then the judge's trials (the task's own draw, then each other input
        distribution). Returns the _Calls that call its forward from here on."""
        seed = int(req["seed"])
        dists = protocol.distributions(s)
        n = int(s["correctness_trials"])
        watch = prog.watch
        _manual_seed(seed)
        init_inputs = prog.task.get_init_inputs()
        try:
            watch.in_candidate, watch.exempt = True, True
            new_model = self._build(prog.mod.ModelNew, init_inputs, seed)
        except BaseException as e:
            raise Verdict("runtime_error", f"ModelNew() raised {self._candidate_exc(e)}", _tb(e))
        finally:
            watch.in_candidate = False
        self._candidate_bytes = max(0, self._allocated() - prog.allocated_before)
        calls = _Calls(self, new_model, watch, ref_codes, own_codes, prog.task, seed, n, dists, res["correctness"])
        self._phase(res, "build")
        for i in range(n):
            calls.trial("trial", i)
        for i in range(len(dists)):
            calls.trial("dist", i)
        _hacked_check(watch, "during the correctness trials")
        self._phase(res, "correctness")
        return calls

    def _time_and_recheck(self, req, s, res, prog, calls):
        """The phases checks and timing (the timed region, alone on the device: timed_region),
        then post_checks (fresh inputs, and the candidate's own input tensors refilled), a
        re-verification of an extreme speedup, and kernel coverage. Returns the fast speedup."""
        task, watch, seed, n, corr = prog.task, prog.watch, calls.seed, calls.n, calls.corr
        cuda = self.device.type == "cuda"
        mode = req.get("mode", "fast") or "fast"
        warmup = int(s["warmup"])
        warmed_ms = calls.device_ms() if cuda else 0.0
        trials = int(s["fast_trials"] if mode == "fast" else s["full_trials"])
        # The reference's timing comes from the worker, measured by a process that runs no
        # candidate code (time_reference).
        ref_stats = self.given_ref.get(mode)
        if not ref_stats:
            raise Verdict("runtime_error", f"the worker gave no timing of the reference in {mode} mode")
        res["ref_runtime"] = ref_stats
        with self._harness_step("allocating the L2 flush buffer"):
            timer = Timer(self.device)

        def checks():  # the checks that time, in the timed region
            if cuda:
                timer._calibrate_spin()  # for both checks' spins
                corr["digest"] = "fused" if self.fused_digest is not None else self.fused_digest_why
                timed_region.side_stream_check(self, task, seed, calls.run, timer)
                timed_region.ordering_check(self, task, seed, n, calls.run, timer, corr)
            self._phase(res, "checks")

        timed = (timer, task, calls.model, watch, res, warmup, float(s.get("timing_precision", 0.0)))
        cand_stats = timed_region.run(self, *timed, trials, seed, checks, warmed_ms=warmed_ms)
        _hacked_check(watch, "while being timed")
        self._phase(res, "timing")

        # Check again after timing, on fresh inputs; then refill the very tensors the candidate
        # was given with new values and call it on them again: an output cached by input
        # identity shows up as a stale result.
        given = calls.trial("post")
        if _shapes(given) != calls.given_shapes:
            raise Verdict("incorrect", f"{protocol.check_name('post', 0, n, calls.dists, seed)}: the candidate "
                                       f"changed the shape or strides of its input tensors (a caller's "
                                       f"tensors are not its to resize)")
        if any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in given):
            # (a task whose inputs change shape with the seed is refilled into fresh tensors)
            calls.trial("refill", into=given)
        del given
        _hacked_check(watch, "after timing")
        self._phase(res, "post_checks")

        speedup = ref_stats["median_ms"] / cand_stats["median_ms"] if cand_stats["median_ms"] > 0 else 0.0
        if self._reverifies(s, speedup, cand_stats, res):
            # The judge checks 4n more trials on new inputs, cycling through the task's own draw
            # and every other input distribution; the candidate is timed again in full mode (the
            # worker divides the reference's trusted full-mode timing by it; the speedup reported
            # from here is the fast one).
            res["reverified"] = True
            for i in range(4 * n):
                calls.trial("reverify", i)
            self._phase(res, "reverify")
            timed_region.run(self, *timed, int(s["full_trials"]), seed + 7_919)
            _hacked_check(watch, "during re-verification")
            self._phase(res, "reverify")

        if cuda:
            self._coverage(s, prog.code, calls.model, task, seed, res, watch)
        return speedup

    def _judged(self, label, index, out, corr):
        """Ships one check's output to the judge (gpu/judge.py) and raises its verdict when the
        check failed. The judge's answer is also what the reply's correctness figures say."""
        error, tensors = "", []
        try:
            tensors = _flatten(out)
        except TypeError as e:
            error = f"candidate returned an unsupported {e}"
        for o in tensors:
            if type(o) not in _PLAIN_TENSORS:
                # A subclass's methods are the candidate's code; the judge gets plain bytes.
                error = f"candidate returned a {type(o).__name__} (expected a plain torch.Tensor)"
        if label == "trial" and index == 0 and not error:
            self._output_bytes = sum(written_bytes(t) for t in tensors)
        self._open_link()
        try:
            with self._harness_step("handing the outputs to the judge"):
                answer = self.link.check(label, index, tensors, error)
        except (protocol.LinkError, OSError) as e:
            raise Verdict("runtime_error", f"the judge's link failed ({e}); no verdict on the candidate")
        acc = answer.get("acc") or {}
        corr.update({k: acc[k] for k in ("max_abs_diff", "max_rel_diff", "atol", "rtol") if k in acc})
        if answer.get("counted", label != "ordering"):
            corr["trials"] += 1
        if not answer.get("ok"):
            corr["detail"] = str(answer.get("why", ""))
            raise Verdict(str(answer.get("status", "incorrect")), str(answer.get("why", "")))
        corr["passed"] += 1 if answer.get("counted") else 0

    def _open_link(self):
        if self.link is None:
            if sandbox.JUDGE_LINK is None:
                raise Verdict("runtime_error", "this process has no link to a judge; no verdict on the candidate")
            self.link = protocol.Link(sandbox.JUDGE_LINK)

    def _prepare(self, label, index):
        """Has the judge compute a check's reference output while this process makes its inputs
        and runs the candidate (the judge takes a shared hold on the device of its own, only
        where no timed region holds it)."""
        self._open_link()
        try:
            self.link.prepare(label, index)
        except OSError as e:
            raise Verdict("runtime_error", f"the judge's link failed ({e}); no verdict on the candidate")

    def _in_domain(self, label, index):
        """Whether the judge finds a check's inputs (another input distribution) inside the
        reference's domain; the candidate runs only on those."""
        self._open_link()
        try:
            answer = self.link.domain(label, index)
        except (protocol.LinkError, OSError) as e:
            raise Verdict("runtime_error", f"the judge's link failed ({e}); no verdict on the candidate")
        if "valid" not in answer:
            raise Verdict(str(answer.get("status", "runtime_error")), str(answer.get("why", "")))
        return bool(answer["valid"])

    # ---- memory ------------------------------------------------------------------------------
    def _memory_note(self):
        """'peak X GiB of the device's Y GiB' for this process, or '' where unknown."""
        if self.device.type != "cuda":
            return ""
        try:
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
            total = self._device_total() / 2**30
        except Exception:  # noqa: BLE001 - a faulted context
            return ""
        return f"peak {peak:.2f} GiB allocated by this evaluation of the device's {total:.2f} GiB"

    def _device_total(self):
        try:
            return torch.cuda.get_device_properties(self.device).total_memory
        except Exception:  # noqa: BLE001
            return 0

    def _allocated(self):
        return int(torch.cuda.memory_allocated(self.device)) if self.device.type == "cuda" else 0

    def _candidate_exc(self, e):
        """_short_exc, with the memory figures when the candidate ran out of memory (on the CPU:
        the candidate memory limit its allocation failed at, the address-space limit that the
        sandbox sets, which may stop a fast allocator before the resident-memory watch does)."""
        msg = _short_exc(e)
        if _is_oom(e):
            note = self._memory_note()
            if not note and self.device.type != "cuda" and self.memory_limit_mb > 0:
                note = f"its allocation failed at the candidate memory limit, {self.memory_limit_mb} MB"
            if note:
                msg = f"{msg[:300]} ({note})"
        return msg

    @contextlib.contextmanager
    def _harness_step(self, what):
        """Runs a step of the harness's own work (inputs, the reference, comparisons, timing
        buffers): running out of memory there is the evaluation's size, not the candidate's
        fault, and becomes status out_of_memory with the figures, never runtime_error."""
        try:
            yield
        except Verdict:
            raise
        except BaseException as e:
            if not _is_oom(e):
                raise
            held = self._candidate_bytes
            if self.device.type == "cuda" and held > CANDIDATE_HELD_LIMIT * self._device_total():
                # The candidate's module and model hold much of the device: its doing, not the
                # evaluation's size.
                raise Verdict("runtime_error",
                              f"out of memory while {what}: the candidate's program and ModelNew hold "
                              f"{held / 2**30:.2f} GiB of the device's {self._device_total() / 2**30:.2f} GiB "
                              f"({self._memory_note()})", _tb(e))
            where = (f"the candidate memory limit ({self.memory_limit_mb} MB)"
                     if self.device.type == "cpu" else self.device_name)
            note = self._memory_note()
            raise Verdict("out_of_memory",
                          f"the evaluation needs more memory than {where} has: out of memory while {what}"
                          + (f" ({note})" if note else "") + "; no verdict on the candidate",
                          _tb(e))

    def _release(self, res):
        """Frees everything the evaluation allocated before the reply goes out: the process is
        killed once it has replied and its exit overlaps the next candidate's start, which must
        find the device's memory free. Reports what is still held (a candidate may keep tensors
        alive in some global); the worker waits for the exit when anything is."""
        checks._WEIGHTS.clear()
        gc.collect()
        if self.device.type != "cuda":
            return
        try:
            res["gpu_peak_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
            res["gpu_reserved_bytes"] = int(torch.cuda.max_memory_reserved(self.device))
            torch.cuda.empty_cache()
            res["gpu_held_bytes"] = int(torch.cuda.memory_reserved(self.device))
        except Exception:  # noqa: BLE001 - a faulted context: unknown, the worker waits
            res["gpu_held_bytes"] = -1

    @contextlib.contextmanager
    def _as_candidate(self, watch):
        """Candidate code runs inside: the watch knows it, and what it raises is the candidate's
        runtime_error."""
        watch.in_candidate = True
        try:
            yield
        except Verdict:
            raise
        except BaseException as e:
            raise Verdict("runtime_error", self._candidate_exc(e), _tb(e))
        finally:
            watch.in_candidate = False

    def time_reference(self, req, s, mode):
        """In a process of its own that runs no candidate code: the reference's timing under the
        same protocol the candidate gets (the worker caches it per task, size, mode and trials)."""
        res = {"status": "ok", "error": "", "compile_log": ""}
        self._candidate_bytes, self.memory_limit_mb = 0, int(s.get("memory_limit_mb", 0))
        try:
            self.device_name = self._setup_device()
            task, _ = self._load_task(req)
            apply_size(task, s.get("size", "cpu"))
            seed = int(req["seed"])
            trials = int(s["fast_trials"] if mode == "fast" else s["full_trials"])
            warmup = int(s["warmup"])
            ref_model = timer = inputs = None
            try:
                with _no_grad():
                    # Built and warmed up beside candidates' work (shared), timed alone: the
                    # protocol a candidate gets.
                    self._hold(res, "shared")
                    _manual_seed(seed)
                    ref_model = self._build_reference(task, task.get_init_inputs(), seed)
                    with self._harness_step("allocating the L2 flush buffer"):
                        timer = Timer(self.device)
                    with self._harness_step("warming up the reference Model"):
                        inputs = timed_region.warm(self, timer, task, ref_model, warmup, seed)
                    with self._alone(res), self._harness_step("timing the reference Model"):
                        res["stats"], _ = timed_region.time_model(self, timer, task, ref_model, trials, warmup, seed,
                                                           inputs=inputs, warm_ms=Timer.REWARM_MS,
                                                           precision=float(s.get("timing_precision", 0.0)))
            finally:
                ref_model = timer = inputs = None
                self._release(res)
                self._hold(res, None)
        except Verdict as v:
            res["status"], res["error"] = v.status, v.error
            res["compile_log"] = v.log[-LOG_LIMIT:]
        return res

    def measure_bandwidth(self):
        """The device's memory bandwidth as a copy achieves it (bytes read and written per ms, the
        best of 5 copies of up to 1 GiB, an eighth of the free memory at most; 64 MB on a CPU) and
        its last-level cache's size (GPU: L2; CPU: the largest cache sysfs lists; 0: unknown).
        Measured once per device for a launch's workers (gpu/shared_timings.py) by the judge (a
        process that runs no candidate code), holding the device alone."""
        with self._alone({}):
            return self._measure_bandwidth()

    def _measure_bandwidth(self):
        self._setup_device()
        best = math.inf
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            n = int(min(1 << 30, free // 8)) // 256 * 256
            a = torch.ones(n, dtype=torch.uint8, device=self.device)
            b = torch.empty_like(a)
            for _ in range(5):
                e1, e2 = _Event(enable_timing=True), _Event(enable_timing=True)
                e1.record()
                b.copy_(a)
                e2.record()
                e2.synchronize()
                best = min(best, e1.elapsed_time(e2))
            cache = int(getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0))
        else:
            n = 64 << 20
            a = torch.ones(n, dtype=torch.uint8)
            b = torch.empty_like(a)
            for _ in range(5):
                t0 = _clock_ns()
                b.copy_(a)
                best = min(best, (_clock_ns() - t0) / 1e6)
            cache = _cpu_cache_bytes()
        del a, b
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"bytes_per_ms": 2 * n / best if best > 0 else 0.0, "cache_bytes": cache, "probe_bytes": n}

    def _profile(self, new_model, task, seed, code, res, watch):
        """One profiled forward: kernel-time coverage of the candidate's own kernels, and the
        check that a candidate declaring custom kernels runs at least one of them."""
        declared = defenses.declared_kernels(code)
        with self._harness_step("generating inputs"):
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
