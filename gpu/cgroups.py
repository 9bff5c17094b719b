"""A control group per confined process (a candidate, a build, the judge), under one folder of the
worker's: the kernel counts the memory and the tasks of the process's whole tree against limits,
and the group is killed and removed whole when the process is reaped, so nothing it started
outlives it even where no PID namespace could be had.

Works with the unified hierarchy (cgroup v2: memory.max, pids.max, cgroup.kill) and with the
v1 memory and pids hierarchies (memory.limit_in_bytes, pids.max, killing what cgroup.procs
lists). Where neither can be written (no permission, no controller, a v2 parent holding
processes of its own), ``status`` says why and nothing else changes: the caller reports it.

Lifecycle: ``setup()`` in the worker before it forks anything; ``enter(memory_mb, tasks)`` in a
forked child, before it confines itself (it still has the worker's rights then); ``release(pid)``
in the worker once that child is reaped; ``close()`` when the worker ends.
"""

import os
import signal
import time

ROOT = "/sys/fs/cgroup"
_base = {}  # controller ("unified", "memory", "pids") -> this worker's folder in that hierarchy
status = "none: not set up"


def _own_paths():
    """controller -> this process's group path, from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controllers == "":
                paths["unified"] = path
            for c in controllers.split(","):
                if c in ("memory", "pids"):
                    paths[c] = path
    return paths


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _v2_root():
    if os.path.exists(os.path.join(ROOT, "cgroup.controllers")):
        return ROOT
    unified = os.path.join(ROOT, "unified")
    if os.path.exists(os.path.join(unified, "cgroup.controllers")):
        return unified
    return None


def setup():
    """Creates this worker's folder (``kernelrl-PID``) next to its own group, removing any a
    worker that died left behind; sets ``status``. Returns it."""
    global status
    _base.clear()
    try:
        paths = _own_paths()
    except OSError as e:
        status = f"none: cannot read /proc/self/cgroup ({e.strerror})"
        return status
    problems = []
    v2 = _v2_root()
    if v2 is not None and "unified" in paths:
        # The nearest group, from this process's own up to the root, whose children can have
        # the memory and pids controllers (a group holding processes cannot give them any).
        group = paths["unified"].strip("/")
        while True:
            parent = os.path.join(v2, group) if group else v2
            why = _v2_usable(parent)
            if why is None:
                base, why = _make(parent)
                if base:
                    _base["unified"] = base
                    break
            problems.append(why)
            if not group:
                break
            group = os.path.dirname(group)
    if "unified" not in _base:
        v2_problems, problems = problems, []
        for c in ("memory", "pids"):  # the v1 hierarchies
            if c in paths and os.path.isdir(os.path.join(ROOT, c)):
                base, why = _make(os.path.join(ROOT, c, paths[c].lstrip("/")))
                if base:
                    _base[c] = base
                else:
                    problems.append(why)
    if "unified" in _base:
        status = "v2 (memory, pids)"
    elif _base:
        status = "v1 (" + ", ".join(sorted(_base)) + ")" + (f"; {'; '.join(problems)}" if problems else "")
    else:
        status = "none: " + ("; ".join(v2_problems + problems)
                             or "no cgroup v2 with memory and pids, no v1 memory or pids hierarchy")
    return status


def limits_memory() -> bool:
    """Whether each group's memory is limited by the kernel."""
    return "unified" in _base or "memory" in _base


def limits_tasks() -> bool:
    """Whether each group's processes are limited by the kernel (pids.max)."""
    return "unified" in _base or "pids" in _base


def memory_limited(pid, limit_bytes) -> bool:
    """Whether pid's group exists with a memory limit of at most limit_bytes (the kernel then
    counts its whole tree's memory once, shared pages included, and enforces the limit)."""
    for c, base in _base.items():
        name = {"unified": "memory.max", "memory": "memory.limit_in_bytes"}.get(c)
        if name:
            value = _read(os.path.join(base, f"p{pid}", name)).strip()
            if value.isdigit() and 0 < int(value) <= limit_bytes:
                return True
    return False


def _v2_usable(parent):
    """None when children of parent get memory and pids (enabling them if need be), else why not."""
    enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
    missing = {"memory", "pids"} - enabled
    if not missing:
        return None
    available = set(_read(os.path.join(parent, "cgroup.controllers")).split())
    if not available >= missing:
        return f"{parent} has no {'/'.join(sorted(missing - available))} controller"
    try:
        _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in sorted(missing)))
        return None
    except OSError as e:
        return (f"cannot enable {'/'.join(sorted(missing))} below {parent} ({e.strerror}"
                + ("; it holds processes of its own" if e.errno == 16 else "") + ")")


def _make(parent):
    """(this worker's folder under parent, "") or ("", why not)."""
    if not os.access(parent, os.W_OK):
        return "", f"{parent} is not writable"
    for name in os.listdir(parent):  # left by workers that died
        if name.startswith("kernelrl-") and name[9:].isdigit() and not os.path.exists(f"/proc/{name[9:]}"):
            _remove_tree(os.path.join(parent, name))
    base = os.path.join(parent, f"kernelrl-{os.getpid()}")
    try:
        os.makedirs(base, exist_ok=True)
        if os.path.exists(os.path.join(base, "cgroup.subtree_control")):  # v2: limits for the children
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
    except OSError as e:
        return "", f"cannot create {base} ({e.strerror})"
    return base, ""


def enter(memory_mb=0, tasks=0):
    """In a forked child, before confinement: a group of its own (named by its pid) with the
    limits, joined. Returns what it got, or "none: why"."""
    if not _base:
        return status
    pid = os.getpid()
    try:
        for c, base in _base.items():
            group = os.path.join(base, f"p{pid}")
            os.makedirs(group, exist_ok=True)
            if memory_mb > 0 and c in ("unified", "memory"):
                limit = str(memory_mb << 20)
                if c == "unified":
                    _write(os.path.join(group, "memory.max"), limit)
                    if os.path.exists(os.path.join(group, "memory.swap.max")):
                        _write(os.path.join(group, "memory.swap.max"), "0")
                else:
                    _write(os.path.join(group, "memory.limit_in_bytes"), limit)
                    if os.path.exists(os.path.join(group, "memory.memsw.limit_in_bytes")):
                        _write(os.path.join(group, "memory.memsw.limit_in_bytes"), limit)
            if tasks > 0 and c in ("unified", "pids"):
                _write(os.path.join(group, "pids.max"), str(tasks))
            _write(os.path.join(group, "cgroup.procs"), "0")
    except OSError as e:
        return f"none: cannot enter a group ({e.strerror}: {e.filename})"
    limits = ([f"memory {memory_mb} MB"] if memory_mb > 0 else []) + ([f"{tasks} tasks"] if tasks > 0 else [])
    return "own group" + (f" ({', '.join(limits)})" if limits else "")


def oom_killed(pid) -> bool:
    """Whether the kernel killed a process of pid's group for passing its memory limit."""
    for c, base in _base.items():
        group = os.path.join(base, f"p{pid}")
        if c == "unified":
            events = _read(os.path.join(group, "memory.events"))
        elif c == "memory":
            events = _read(os.path.join(group, "memory.oom_control"))
        else:
            continue
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                return True
    return False


def held_at_limit(pid, limit_bytes) -> bool:
    """Whether pid's group is being held at its memory limit: it has met the limit (memory.events
    max or oom in v2, memory.failcnt in v1) and uses at least 90% of it now, or did at its peak
    (memory.peak in v2, memory.max_usage_in_bytes in v1: the kernel may have just reclaimed)."""
    for c, base in _base.items():
        group = os.path.join(base, f"p{pid}")
        if c == "unified":
            met = any(key in ("max", "oom", "oom_kill") and value.strip().isdigit() and int(value) > 0
                      for key, _, value in (line.partition(" ") for line in
                                            _read(os.path.join(group, "memory.events")).splitlines()))
            used = [_read(os.path.join(group, name)).strip() for name in ("memory.current", "memory.peak")]
        elif c == "memory":
            failcnt = _read(os.path.join(group, "memory.failcnt")).strip()
            met = failcnt.isdigit() and int(failcnt) > 0
            used = [_read(os.path.join(group, name)).strip()
                    for name in ("memory.usage_in_bytes", "memory.max_usage_in_bytes")]
        else:
            continue
        if met and any(u.isdigit() and int(u) >= 0.9 * limit_bytes for u in used):
            return True
    return False


def release(pid):
    """Kills whatever is left in pid's group and removes it (the process itself is reaped)."""
    for base in _base.values():
        _remove_tree(os.path.join(base, f"p{pid}"))


def close():
    """The worker ends: every group it made, killed and removed."""
    for base in list(_base.values()):
        _remove_tree(base)
    _base.clear()


def _remove_tree(group):
    if not os.path.isdir(group):
        return
    for name in os.listdir(group):
        sub = os.path.join(group, name)
        if os.path.isdir(sub):
            _remove_tree(sub)
    _kill(group)
    for _ in range(200):
        try:
            os.rmdir(group)
            return
        except FileNotFoundError:
            return
        except OSError:  # busy: its last processes are still exiting
            time.sleep(0.005)
            _kill(group)


def _kill(group):
    if os.path.exists(os.path.join(group, "cgroup.kill")):
        try:
            _write(os.path.join(group, "cgroup.kill"), "1")
            return
        except OSError:
            pass
    for line in _read(os.path.join(group, "cgroup.procs")).split():
        try:
            os.kill(int(line), signal.SIGKILL)
        except (OSError, ValueError):
            pass

