"""Reward-hacking defenses of the evaluation harness (docs/EVALUATION.md lists each and the hack it
closes). Everything here runs inside the per-candidate process, after the harness has captured the
functions it relies on itself.

- ``Watch``: identity snapshot of the functions a candidate could replace to fake correctness or
  timing (torch, torch.nn.functional, Tensor methods, torch.cuda, the clocks, threading and process
  creation) and of the global numeric settings the reference depends on (TF32, matmul precision).
- thread / process starts: the creation functions are wrapped so a start during a timed or checked
  call of the candidate is recorded (the first call is exempt: lazy compilation may use helpers).
- reference reach: a profile hook, active while the candidate's forward runs during correctness
  checks, notices any call into the reference Model's forward, however the candidate got hold of it.
- static reach: the policy's own code naming ``Model``.
- custom kernels: kernel names a candidate declares (CUDA ``__global__`` functions, ``@triton.jit``
  functions), to compare with what the profiler saw run.
"""

import _thread
import ast
import os
import re
import subprocess
import sys
import threading
import time
import types

import torch
import torch.nn.functional as F

_setprofile = sys.setprofile
_getprofile = sys.getprofile


def _callables(obj, names=None):
    d = vars(obj)
    keys = names if names is not None else [k for k in d if not k.startswith("__") or k in
                                             ("__call__", "__eq__", "__getitem__", "__torch_function__")]
    out = {}
    for k in keys:
        v = d.get(k)
        if v is not None and (callable(v) or isinstance(v, (staticmethod, classmethod, property))):
            out[k] = v
    return out


def _precision_flags():
    flags = {"torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
             "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
             "torch.get_default_dtype()": str(torch.get_default_dtype())}
    try:
        flags["torch.backends.cuda.matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        flags["torch.backends.cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
        flags["torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"] = \
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        flags["torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"] = \
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    except (AttributeError, RuntimeError):
        pass
    return flags


# Entries Python itself adds to or changes in a module's dictionary (a warning raised from the
# task's code records itself in __warningregistry__).
_MUTABLE_DUNDERS = frozenset({"__warningregistry__"})


class Watch:
    """Records process/thread starts and snapshots everything a candidate must leave alone."""

    def __init__(self):
        self.violations = []       # one line per hack seen, in order
        self.in_candidate = False  # True while a checked/timed candidate call runs
        self.exempt = False        # True during the first candidate call (lazy compilation)
        self._wrap_starts()
        self.targets = [
            ("time", time, _callables(time, ["time", "time_ns", "perf_counter", "perf_counter_ns",
                                             "monotonic", "monotonic_ns", "process_time", "sleep"])),
            ("torch", torch, _callables(torch)),
            ("torch.nn.functional", F, _callables(F)),
            ("torch.Tensor", torch.Tensor, _callables(torch.Tensor)),
            ("torch._C.TensorBase", torch._C.TensorBase, _callables(torch._C.TensorBase)),
            ("torch.nn.Module", torch.nn.Module, _callables(torch.nn.Module)),
            ("torch.cuda", torch.cuda, _callables(torch.cuda, [k for k in (
                "synchronize", "Event", "Stream", "current_stream", "default_stream", "stream",
                "set_stream", "is_available", "device_count", "get_device_name", "empty_cache")
                if k in vars(torch.cuda)])),
            ("torch.cuda.Event", torch.cuda.Event, _callables(torch.cuda.Event)),
            ("threading", threading, _callables(threading, ["Thread", "Timer", "enumerate", "active_count"])),
            ("threading.Thread", threading.Thread, _callables(threading.Thread, ["start", "run"])),
            ("_thread", _thread, _callables(_thread, ["start_new_thread"] +
                                            (["start_joinable_thread"] if hasattr(_thread, "start_joinable_thread") else []))),
            ("os", os, _callables(os, [k for k in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp",
                                                   "execv", "execve", "popen", "kill", "_exit") if hasattr(os, k)])),
            ("subprocess", subprocess, _callables(subprocess, ["Popen", "run", "call", "check_output"])),
            ("subprocess.Popen", subprocess.Popen, _callables(subprocess.Popen, ["__init__"])),
            ("sys", sys, _callables(sys, ["setprofile", "settrace", "getprofile"])),
        ]
        self.snapshot = {(name, k): id(v) for name, obj, fns in self.targets for k, v in fns.items()}
        # Classes whose dictionaries must not grow either: a method added to torch.Tensor (say
        # `all` or `tolist`) shadows the C implementation every tensor inherits.
        self.closed = [(name, obj, set(vars(obj))) for name, obj in
                       (("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module))]
        self.frozen = []  # (name, obj, {key: id}) whose every entry must stay: see freeze()
        self.flags = _precision_flags()

    def freeze(self, name, obj):
        """Every entry of obj's dictionary (the task module, its reference Model) must stay the
        object it is now: a candidate that finds the task through the garbage collector and
        replaces the reference's forward, its input generator or a size is caught."""
        self.frozen.append((name, obj, {k: id(v) for k, v in vars(obj).items() if k not in _MUTABLE_DUNDERS}))

    def _violation(self, msg):
        if msg not in self.violations:
            self.violations.append(msg)

    # -- thread and process starts -------------------------------------------------------------
    def _note_start(self, what):
        if self.in_candidate and not self.exempt:
            self._violation(f"started {what} while being checked or timed")

    def _wrap_starts(self):
        watch = self
        orig_start = threading.Thread.start
        orig_new = _thread.start_new_thread
        orig_popen_init = subprocess.Popen.__init__
        orig_fork = os.fork

        def start(self_thread, *a, **k):
            watch._note_start("a thread (threading.Thread.start)")
            return orig_start(self_thread, *a, **k)

        def start_new_thread(*a, **k):
            watch._note_start("a thread (_thread.start_new_thread)")
            return orig_new(*a, **k)

        def popen_init(self_p, *a, **k):
            watch._note_start("a process (subprocess.Popen)")
            return orig_popen_init(self_p, *a, **k)

        def fork():
            watch._note_start("a process (os.fork)")
            return orig_fork()

        threading.Thread.start = start
        _thread.start_new_thread = start_new_thread
        subprocess.Popen.__init__ = popen_init
        os.fork = fork

    # -- replaced functions and changed settings -----------------------------------------------
    def check(self, where: str):
        for name, obj, fns in self.targets:
            d = vars(obj)
            for k in fns:
                if id(d.get(k)) != self.snapshot[(name, k)]:
                    self._violation(f"replaced {name}.{k} ({where})")
        for name, obj, keys in self.closed:
            for k in sorted(set(vars(obj)) - keys):
                self._violation(f"added {name}.{k} ({where})")
        for name, obj, ids in self.frozen:
            now_d = vars(obj)
            for k in sorted((set(ids) | set(now_d)) - _MUTABLE_DUNDERS):
                if id(now_d.get(k)) != ids.get(k):
                    self._violation(f"changed {name}.{k} ({where})")
        now = _precision_flags()
        for k, v in self.flags.items():
            if now.get(k) != v:
                self._violation(f"changed the global setting {k} from {v!r} to {now.get(k)!r} ({where})")

    def live_threads(self):
        return {t.ident for t in threading.enumerate()}


class ReferenceGuard:
    """While active, any Python call into one of `codes` (the reference's forward code objects) is a
    violation. Uses sys.setprofile, so it sees calls through any alias of the function (a saved
    bound method, a `globals()` lookup, an instance found through the garbage collector).

    Code objects are matched by identity, never by equality: two code objects compiled from the
    same text at the same line numbers compare equal (CPython compares bytecode, constants, names
    and line table, not the file name), so a candidate that copies the reference and renames the
    class would otherwise be taken for the reference itself. A code object with the reference's
    bytecode, constants and names that the candidate's program text did not compile (`own`) is a
    copy made at run time (code.replace(), types.CodeType, an exec of the reference's source) and
    is the reference too."""

    def __init__(self, codes, own=()):
        self._codes = [c for c in codes if c is not None]  # kept alive: their ids stay theirs
        self._ids = frozenset(id(c) for c in self._codes)
        self._bodies = {_body(c) for c in self._codes}
        self._own = own  # code objects compiled from the candidate's program text: its own
        self._seen = {}  # id(code) -> whether it is a copy of the reference made at run time
        self.hit = None

    def _hook(self, frame, event, arg):
        if event != "call" or self.hit is not None:
            return
        code = frame.f_code
        if id(code) in self._ids:
            self.hit = f"called the reference Model.forward (line {frame.f_lineno})"
            return
        copy = self._seen.get(id(code))
        if copy is None:
            # A code object with the reference's body that was not compiled from the program's
            # text (code.replace(), types.CodeType, an exec of its source): a copy of the
            # reference made at run time. A copy written into the program is the program's own.
            copy = code not in self._own and _body(code) in self._bodies
            self._seen[id(code)] = copy
            self._codes.append(code)  # kept alive: its id stays its own while remembered
        if copy:
            self.hit = (f"called a copy of the reference Model.forward made at run time "
                        f"({getattr(code, 'co_qualname', code.co_name)}, line {frame.f_lineno})")

    def __enter__(self):
        _setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        hooked = _getprofile() == self._hook
        _setprofile(None)
        if not hooked and self.hit is None:
            self.hit = "removed the harness's call hook (sys.setprofile) while running"
        return False


def _body(code):
    """What a function does, without where it was written: bytecode, constants, names."""
    return (code.co_code, code.co_consts, code.co_names, code.co_varnames, code.co_argcount)


class _Own:
    """The code objects a compiled module holds (its functions' and classes', nested), by
    identity."""

    def __init__(self, module_code):
        self._codes, stack = [], [module_code]
        while stack:
            code = stack.pop()
            self._codes.append(code)
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        self._ids = frozenset(id(c) for c in self._codes)

    def __contains__(self, code):
        return id(code) in self._ids


def program_codes(module_code):
    """The code objects compiled from a candidate's program text (see ReferenceGuard)."""
    return _Own(module_code)


def embedded_reference_codes(module_code, first_line: int, last_line: int):
    """The code objects of ``Model.forward`` that a module compiled from the lines
    [first_line, last_line] of its source: the reference the forward_body scaffold embeds in the
    candidate's program. Found in the compiled module itself, so a policy that rebinds the name
    ``Model`` later in the program cannot hide the embedded reference (nor pass its own class
    off as it)."""
    found, stack = [], [module_code]
    while stack:
        code = stack.pop()
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                stack.append(c)
                if (getattr(c, "co_qualname", c.co_name) == "Model.forward"
                        and first_line <= c.co_firstlineno <= last_line):
                    found.append(c)
    return found


def static_reference_use(policy_code: str, action_space: str = "forward_body"):
    """The policy-written code naming the reference class `Model` (in load context), or None.

    In the forward_body space the scaffold puts the task's reference ``Model`` in the candidate's
    program, so naming it reaches the reference. A full program is the policy's own module: a
    ``Model`` it defines or imports itself is its own code (a baseline that copies the reference
    file and subclasses or renames it is legitimate); only a name it never binds points elsewhere."""
    try:
        tree = ast.parse(policy_code)
    except SyntaxError:
        return None
    if action_space == "full_program" and _binds_name(tree, "Model"):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
            return f"refers to the reference class Model (line {node.lineno})"
        if isinstance(node, ast.Attribute) and node.attr == "Model" and isinstance(node.ctx, ast.Load):
            return f"refers to the reference class Model (line {node.lineno})"
    return None


def _binds_name(tree, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[0]) == name for a in node.names):
            return True
    return False


_GLOBAL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)")
_TRITON = re.compile(r"@triton\.(?:jit|autotune[^\n]*\n(?:\s*@[^\n]*\n)*\s*@triton\.jit)[^\n]*\n\s*def\s+([A-Za-z_]\w*)")


def declared_kernels(code: str):
    """Names of the custom GPU kernels a program defines (CUDA __global__, Triton jit)."""
    names = set(_GLOBAL.findall(code))
    names.update(_TRITON.findall(code))
    return sorted(names)


def declares_custom_kernels(code: str) -> bool:
    return bool(declared_kernels(code)) or "cuda_sources" in code
