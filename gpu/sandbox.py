"""Per-candidate process isolation for the evaluation worker.

The worker (gpu/worker.py) imports torch once and never touches CUDA itself; each candidate runs
in a forked child: a ``Spare`` started ahead of it, or one ``run_isolated`` forks. The child gets its own process group, dies with the worker,
runs in a private temporary directory, without network (a fresh network namespace where the kernel
allows one), under an address-space limit on CPU, and hands back one msgpack reply through a pipe.
The parent enforces the wall-clock limit and a resident-memory limit by polling, and kills the
child's whole process group when either is passed. Whatever the candidate does to its interpreter
(monkeypatching torch, a poisoned CUDA context, a segfault) ends with the child.
"""

import ctypes
import fcntl
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


def _child_setup(env, isolate_net, address_space_limit, memory_limit_mb, tmpdir):
    """First steps of a candidate's process: own process group, death with the parent, no
    network, the environment, a private temp dir, the address-space limit. Returns the network
    state."""
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
    return net


def _write_all(fd, data: bytes):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _child_run(fn, wfd, memory_limit_mb, t0, net):
    """Runs fn in the child, writes its msgpack reply to wfd, and ends the process."""
    code = 0
    try:
        started = time.monotonic()
        try:
            reply = fn()
        except MemoryError:
            reply = {"status": "runtime_error",
                     "error": f"candidate exceeded the memory limit ({memory_limit_mb} MB)"}
        reply.setdefault("isolation", {})
        reply["isolation"].update({"child_start_s": started - t0, "network": net})
        data = msgpack.packb(reply, use_bin_type=True)
    except BaseException as e:  # noqa: BLE001 - the child reports everything
        data = msgpack.packb({"status": "runtime_error",
                              "error": f"evaluation process failed: {type(e).__name__}: {e}",
                              "compile_log": traceback.format_exc()[-65536:]},
                             use_bin_type=True)
        code = 1
    try:
        _write_all(wfd, data)
        os.close(wfd)  # the parent sees the end of the reply now, not after the process is gone
    finally:
        os._exit(code)


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
        try:
            os.close(rfd)
            net = _child_setup(env, isolate_net, address_space_limit, memory_limit_mb, tmpdir)
        except BaseException as e:  # noqa: BLE001
            net = f"setup failed: {e}"
        _child_run(fn, wfd, memory_limit_mb, t_fork, net)
    os.close(wfd)
    return _collect(pid, rfd, t_fork, timeout_s, memory_limit_mb, tmpdir)


class Spare:
    """A candidate's process started ahead of its candidate: forked, isolated and through
    ``warm()`` (CUDA context creation, ~0.3-0.4 s on an H100) while the previous candidate runs,
    then waiting for its request. ``send(request)`` then ``collect(timeout_s)`` run
    ``handler(request)`` in it under the same limits as run_isolated. While warming it holds an
    exclusive lock on ``lock_path``; a running candidate takes that lock (shared) before it times
    anything, so another process's start-up never overlaps a timed region."""

    def __init__(self, *, handler, warm, key, env, isolate_net, address_space_limit,
                 memory_limit_mb, tmp_root, lock_path, close_fds=()):
        self.key = key
        self.memory_limit_mb = memory_limit_mb
        self.tmpdir = tempfile.mkdtemp(prefix="cand-", dir=tmp_root)
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # child
            os.close(self.req_w)
            os.close(self.rep_r)
            for fd in close_fds:  # the worker's locks: held by the worker, not by this process
                os.close(fd)
            net = "setup failed"
            try:
                with open(lock_path, "w") as lock:  # first, before the running candidate can time
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    net = _child_setup(env, isolate_net, address_space_limit, memory_limit_mb, self.tmpdir)
                    try:
                        warm()
                    except Exception:  # noqa: BLE001 - the evaluation meets it again and reports it
                        pass
                chunks = []
                while True:
                    chunk = os.read(req_r, 1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
                os.close(req_r)
                t0 = time.monotonic()
                request = msgpack.unpackb(b"".join(chunks), raw=False) if chunks else None
            except BaseException as e:  # noqa: BLE001
                request, t0 = None, time.monotonic()
                net = f"{net}; {type(e).__name__}: {e}"
            if request is None:
                os._exit(0)  # discarded before it got a request
            _child_run(lambda: handler(request), rep_w, memory_limit_mb, t0, net)
        os.close(req_r)
        os.close(rep_w)

    def alive(self) -> bool:
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return pid == 0

    def send(self, request) -> bool:
        """Hands the request over (the timeout counts from here); False when this spare could
        not take it (it is gone), in which case it is cleaned up."""
        self.t0 = time.monotonic()
        if not self.alive():
            self.discard()
            return False
        try:
            _write_all(self.req_w, msgpack.packb(request, use_bin_type=True))
            os.close(self.req_w)
            self.req_w = -1
        except OSError:
            self.discard()
            return False
        return True

    def collect(self, timeout_s, on_poll=None, defer_exit=None):
        """Waits for the reply: (reply, failure) as run_isolated. ``on_poll()`` is called while
        waiting; given ``defer_exit(pid, tmpdir)``, a process that replied is killed but not
        waited for (its exit, CUDA context teardown included, overlaps the next candidate):
        the caller reaps it and removes its temp dir."""
        return _collect(self.pid, self.rep_r, self.t0, timeout_s, self.memory_limit_mb, self.tmpdir,
                        on_poll, defer_exit)

    def discard(self):
        for fd in (self.req_w, self.rep_r):
            try:
                if fd >= 0:
                    os.close(fd)
            except OSError:
                pass
        _kill_group(self.pid)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def wait_for_warming(*lock_paths):
    """Blocks while another candidate's process is starting up (see Spare) or still exiting
    (the worker holds the exit lock until it has reaped it); a no-op when none is."""
    for path in lock_paths:
        if not path:
            continue
        try:
            with open(path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_SH)
        except OSError:
            pass


def _collect(pid, rfd, t0, timeout_s, memory_limit_mb, tmpdir, on_poll=None, defer_exit=None):
    chunks = []
    failure = None
    deadline = t0 + timeout_s
    limit = memory_limit_mb * 1024 * 1024
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                failure = {"status": "timeout",
                           "error": f"candidate exceeded the {timeout_s:g} s limit; its process group was killed"}
                break
            ready, _, _ = select.select([rfd], [], [], min(left, 0.05))
            if on_poll is not None:
                on_poll()
            if ready:
                chunk = os.read(rfd, 1 << 20)
                if not chunk:
                    break  # child closed the pipe: done (or died)
                chunks.append(chunk)
                continue
            if limit > 0:
                rss = rss_bytes(pid)
                if rss > limit:
                    failure = {"status": "runtime_error",
                               "error": f"candidate exceeded the memory limit: resident {rss >> 20} MB > "
                                        f"{memory_limit_mb} MB; its process group was killed"}
                    break
    finally:
        os.close(rfd)
        if failure is None and chunks and defer_exit is not None:
            _kill_group(pid)  # it replied: end it and anything it left behind, reap it later
            defer_exit(pid, tmpdir)
            status = 0
        else:
            if failure is not None:
                _kill_group(pid)
            _, status = os.waitpid(pid, 0)
            _kill_group(pid)  # anything the candidate left behind in its group
            shutil.rmtree(tmpdir, ignore_errors=True)
    wall = time.monotonic() - t0
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
