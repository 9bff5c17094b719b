"""One device's share among the evaluation processes of this machine: several candidates load,
build and check at once on a GPU (or the machine's CPU), while a timed region runs alone.

Two lock files per device (flock), named by the device's identity so every worker of the machine
finds the same ones whatever its CUDA_VISIBLE_DEVICES says (a GPU's UUID; "cpu" for the CPU
evaluators, which share the machine's cores):

- the lock: held shared by each candidate's process from its program's load to its exit (its
  correctness trials and the judge's comparisons on its behalf), by a process creating its CUDA
  context, and by the worker while a candidate's process that replied is still exiting; held
  exclusively for a timed region (timing, the timing-based checks, the reference's timing, the
  bandwidth probe);
- the gate: a turnstile. A process that wants the lock exclusively holds the gate while it waits,
  and a candidate's process passes through the gate before it takes the lock shared, so a stream
  of new candidates cannot keep a timed region waiting for ever.

No process waits at the gate or for the exclusive lock while it holds the lock shared, and a
holder of the exclusive lock waits for no other process: there is no cycle to deadlock on. The
start-up and exit holds take the lock shared without the gate (they only wait while a timed region
runs, and nothing that region waits for waits on them). (Start-ups through the gate were tried:
with four workers a GPU, no faster; docs/BENCHMARKS.md.)

The lock is advisory: a candidate's process could run GPU work outside it (from a thread it
starts, which the harness's defences report, or before it takes it). Its timing does not gain from
that; another candidate's could lose. Seconds spent waiting for the lock are added to a shared
counter the worker reads (``waited``), so waiting for another candidate's timed region does not
count against a candidate's own time limit.
"""

import contextlib
import fcntl
import mmap
import os
import re
import struct
import tempfile
import time

# Where the lock files live: one folder for the whole machine (KERNELRL_LOCK_DIR overrides).
DEFAULT_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()

# In a candidate's process: the counter of seconds waited, shared with its worker (see Spare).
WAITED = None


def lock_dir():
    return os.environ.get("KERNELRL_LOCK_DIR") or DEFAULT_DIR


def paths(key, folder=None):
    """(lock, gate) for the device named ``key`` (a GPU's UUID, or "cpu")."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key) or "device"
    base = os.path.join(folder or lock_dir(), f"kernelrl-device-{safe}")
    return base + ".lock", base + ".gate"


def open_file(path):
    """A descriptor on the lock file at ``path``, created if missing. Opened read-only (flock needs
    no more), and without O_CREAT when it exists: in a sticky world-writable folder (/dev/shm,
    /tmp) the kernel refuses O_CREAT on another user's file (fs.protected_regular)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)
        except OSError:
            pass
        return fd


def counter():
    """Memory shared with the processes forked after this call: seconds waited so far, and since
    when the process has been waiting (its monotonic clock; 0: not waiting), two doubles."""
    m = mmap.mmap(-1, 16)
    m[:16] = struct.pack("dd", 0.0, 0.0)
    return m


def read_counter(m):
    """Seconds the process has waited for the lock, the wait in progress included."""
    try:
        waited, since = struct.unpack("dd", m[:16])
    except (ValueError, struct.error):
        return 0.0
    now = time.monotonic()
    if since == since and 0 < since <= now:
        waited += now - since
    return waited if waited == waited and waited >= 0 else 0.0  # NaN or negative (a candidate wrote it): nothing


def _count(waited, since):
    if WAITED is not None:
        try:
            before = struct.unpack("dd", WAITED[:16])[0]
            WAITED[:16] = struct.pack("dd", before + waited, since)
        except (ValueError, TypeError, struct.error):
            pass


class DeviceLock:
    """This process's hold on one device: none, "shared" or "exclusive". ``windows`` lists each
    hold as [how, start, end] on the system's monotonic clock (comparable across processes)."""

    def __init__(self, lock_fd, gate_fd):
        self.lock_fd, self.gate_fd = lock_fd, gate_fd
        self.state = None
        self.since = 0.0
        self.windows = []
        self.waited_s = 0.0

    @classmethod
    def from_env(cls, env=None):
        env = os.environ if env is None else env
        try:
            return cls(int(env["KERNELRL_DEVICE_LOCK_FD"]), int(env["KERNELRL_DEVICE_GATE_FD"]))
        except (KeyError, ValueError):
            return None

    def _close_window(self, now):
        if self.state is not None:
            self.windows.append([self.state, self.since, now])

    def acquire(self, how, within_s=None):
        """Holds the device as ``how`` ("shared", "exclusive" or None: not at all), giving up
        the current hold first. Returns the seconds spent waiting. With ``within_s``, gives up
        after that many seconds of waiting and returns None, holding nothing (the locks then
        polled every few milliseconds; the turnstile is the same: a process that wants the lock
        exclusively holds the gate while it waits)."""
        if how == self.state:
            return 0.0
        t0 = time.monotonic()
        deadline = None if within_s is None else t0 + max(0.0, within_s)

        def take(fd, op):
            if deadline is None:
                fcntl.flock(fd, op)
                return True
            while True:
                try:
                    fcntl.flock(fd, op | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.005)

        self._close_window(t0)
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        self.state = None
        _count(0.0, t0)  # waiting from now (the worker sees the wait while it lasts)
        ok = True
        try:
            if how is not None:
                ok = take(self.gate_fd, fcntl.LOCK_EX)  # through the turnstile
                if ok and how == "exclusive":
                    try:
                        ok = take(self.lock_fd, fcntl.LOCK_EX)
                    finally:
                        fcntl.flock(self.gate_fd, fcntl.LOCK_UN)
                elif ok:
                    fcntl.flock(self.gate_fd, fcntl.LOCK_UN)
                    ok = take(self.lock_fd, fcntl.LOCK_SH)
            if ok:
                self.state = how
        finally:
            now = time.monotonic()
            self.since = now
            waited = now - t0
            self.waited_s += waited
            _count(waited, 0.0)
        return waited if ok else None

    @contextlib.contextmanager
    def alone(self):
        """The device held exclusively for the block, then as before."""
        before = self.state
        self.acquire("exclusive")
        try:
            yield
        finally:
            self.acquire(before)

    def starting(self):
        """The lock held shared for a block without the gate, as held_shared (the judge's
        start-up, in a process that reached its lock through descriptors)."""
        return _shared(self.lock_fd)

    @contextlib.contextmanager
    def beside(self):
        """The lock held shared for the block if no timed region holds it now (yields True), else
        not at all, at once (yields False): work done on a candidate's behalf that must neither
        overlap a timed region nor wait for one (the judge computing a reference ahead, which
        would otherwise outlast a candidate's process that ended before its check). Only while
        this process holds nothing else."""
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)

    def record(self):
        """The holds so far (the current one up to now) and the seconds waited."""
        windows = list(self.windows)
        if self.state is not None:
            windows.append([self.state, self.since, time.monotonic()])
        return {"waited_s": self.waited_s, "windows": windows}


class MemoryShare:
    """The device's memory among this machine's workers that evaluate on it (files beside the
    device's lock, ``paths(key + ".memory")``). Each worker holds a member's slot for its life
    (a file of its own, locked exclusively), and the memory lock shared from handing a candidate
    over to the judge's verdict: an evaluation that ran out of memory while another worker was on
    the device is evaluated again with the memory lock held exclusively, once every other
    evaluation has ended (their candidates' processes have given their memory back) and none
    starts until it is done. The gate is the device lock's turnstile again, so a stream of
    evaluations cannot keep that retry waiting."""

    SLOTS = 256

    def __init__(self, key, folder=None):
        lock, gate = paths(key + ".memory", folder)
        self.base = lock[:-len(".lock")]
        self.slot, self.member = None, -1
        for i in range(self.SLOTS):
            fd = open_file(f"{self.base}.member{i}")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.slot, self.member = i, fd
            break
        self.lock = DeviceLock(open_file(lock), open_file(gate))

    def others(self):
        """Whether another worker is on this device now (a member's slot besides this worker's
        is locked). Without a slot of its own (all taken), a worker assumes there are others."""
        if self.slot is None:
            return True
        for i in range(self.SLOTS):
            if i == self.slot:
                continue
            try:
                fd = os.open(f"{self.base}.member{i}", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # never taken
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return True
            finally:
                os.close(fd)
        return False

    def hold(self, how, within_s):
        """Holds the memory lock as ``how`` ("shared" or "exclusive"); gives up after
        ``within_s`` seconds of waiting (returns False, holding nothing) so that a worker never
        outwaits its client's deadline."""
        return self.lock.acquire(how, within_s) is not None

    def release(self):
        self.lock.acquire(None)

    def close(self):
        self.release()
        for fd in (self.lock.lock_fd, self.lock.gate_fd, self.member):
            if fd >= 0:
                os.close(fd)


@contextlib.contextmanager
def _shared(fd):
    """The lock on ``fd`` held shared for the block, without the gate; the wait counted."""
    t0 = time.monotonic()
    _count(0.0, t0)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        _count(time.monotonic() - t0, 0.0)  # (a wait after the request came extends its limit)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def held_shared(path):
    """The lock at ``path`` held shared for the block, without the gate (a CUDA context's start-up
    in a spare process or the judge's): it waits only while a timed region runs."""
    if not path:
        yield
        return
    try:
        fd = open_file(path)
    except OSError:
        yield
        return
    try:
        with _shared(fd):
            yield
    finally:
        os.close(fd)
