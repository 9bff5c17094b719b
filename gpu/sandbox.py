"""Per-candidate process isolation for the evaluation worker.

The worker (gpu/worker.py) imports torch once and never touches CUDA itself; for each candidate it
forks a child with ``run_isolated``. The child gets its own process group, dies with the worker,
runs in a private temporary directory, without network (a fresh network namespace where the kernel
allows one), under an address-space limit on CPU, and hands back one msgpack reply through a pipe.
The parent enforces the wall-clock limit and a resident-memory limit by polling, and kills the
child's whole process group when either is passed. Whatever the candidate does to its interpreter
(monkeypatching torch, a poisoned CUDA context, a segfault) ends with the child.
"""

import ctypes
import os
import resource
import select
import shutil
import signal
import tempfile
import time
import traceback

import msgpack

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_PR_SET_PDEATHSIG = 1
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000


def die_with_parent():
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def isolate_network() -> str:
    """Moves this (single-threaded) process into a new network namespace: only a loopback that is
    down remains. Returns "netns", or "none: <reason>" where the kernel refuses."""
    flags = _CLONE_NEWNET if os.geteuid() == 0 else (_CLONE_NEWUSER | _CLONE_NEWNET)
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        return f"none: unshare failed ({os.strerror(err)})"
    return "netns"


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)} before reporting"
    return f"ended (status {status})"


def run_isolated(fn, *, timeout_s: float, memory_limit_mb: int, env: dict, isolate_net: bool,
                 address_space_limit: bool, tmp_root: str):
    """Runs ``fn()`` (which returns a msgpack-able dict) in a forked child.

    Returns (reply, failure): reply is fn's dict when the child reported one; otherwise failure is
    {"status": "timeout"|"runtime_error", "error": why}. Also returns the child's overhead timings
    in reply["isolation"] (fork to first instruction, and exit)."""
    rfd, wfd = os.pipe()
    tmpdir = tempfile.mkdtemp(prefix="cand-", dir=tmp_root)
    t_fork = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(rfd)
            os.setpgid(0, 0)
            die_with_parent()
            net = isolate_network() if isolate_net else "none: disabled"
            os.environ.update(env)
            os.environ["TMPDIR"] = tmpdir
            tempfile.tempdir = tmpdir
            os.chdir(tmpdir)
            if address_space_limit and memory_limit_mb > 0:
                # On top of what the worker had mapped already (torch's libraries alone map
                # gigabytes of address space): the candidate gets memory_limit_mb more.
                lim = _address_space_bytes() + memory_limit_mb * 1024 * 1024
                resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
            started = time.monotonic()
            try:
                reply = fn()
            except MemoryError:
                reply = {"status": "runtime_error",
                         "error": f"candidate exceeded the memory limit ({memory_limit_mb} MB)"}
            reply.setdefault("isolation", {})
            reply["isolation"].update({"child_start_s": started - t_fork, "network": net})
            data = msgpack.packb(reply, use_bin_type=True)
        except BaseException as e:  # noqa: BLE001 - the child reports everything
            data = msgpack.packb({"status": "runtime_error",
                                  "error": f"evaluation process failed: {type(e).__name__}: {e}",
                                  "compile_log": traceback.format_exc()[-65536:]},
                                 use_bin_type=True)
            code = 1
        try:
            view = memoryview(data)
            while view:
                n = os.write(wfd, view)
                view = view[n:]
        finally:
            os._exit(code)

    # parent
    os.close(wfd)
    chunks = []
    failure = None
    deadline = t_fork + timeout_s
    limit = memory_limit_mb * 1024 * 1024
    peak = 0
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                failure = {"status": "timeout",
                           "error": f"candidate exceeded the {timeout_s:g} s limit; its process group was killed"}
                break
            ready, _, _ = select.select([rfd], [], [], min(left, 0.05))
            if ready:
                chunk = os.read(rfd, 1 << 20)
                if not chunk:
                    break  # child closed the pipe: done (or died)
                chunks.append(chunk)
                continue
            if limit > 0:
                rss = rss_bytes(pid)
                peak = max(peak, rss)
                if rss > limit:
                    failure = {"status": "runtime_error",
                               "error": f"candidate exceeded the memory limit: resident {rss >> 20} MB > "
                                        f"{memory_limit_mb} MB; its process group was killed"}
                    break
    finally:
        os.close(rfd)
        if failure is not None:
            _kill_group(pid)
        _, status = os.waitpid(pid, 0)
        _kill_group(pid)  # anything the candidate left behind in its group
        shutil.rmtree(tmpdir, ignore_errors=True)
    wall = time.monotonic() - t_fork
    if failure is not None:
        failure["isolation"] = {"wall_s": wall}
        return None, failure
    data = b"".join(chunks)
    if not data:
        return None, {"status": "runtime_error",
                      "error": f"candidate process {describe_status(status)}",
                      "isolation": {"wall_s": wall}}
    try:
        reply = msgpack.unpackb(data, raw=False)
    except Exception as e:  # noqa: BLE001
        return None, {"status": "runtime_error",
                      "error": f"candidate process sent an unreadable reply ({e}); {describe_status(status)}"}
    reply.setdefault("isolation", {})["wall_s"] = wall
    return reply, None


def _kill_group(pid: int):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
