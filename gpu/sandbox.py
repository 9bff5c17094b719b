"""Per-candidate process isolation for the evaluation worker.

The worker (gpu/worker.py) imports torch once and never touches CUDA itself; each candidate runs
in a forked child: a ``Spare`` started ahead of it, or one ``run_isolated`` forks. The child gets its own process group, dies with the worker,
runs in a private temporary directory, without network (a fresh network namespace where the kernel
allows one), under an address-space limit on CPU, and hands back one msgpack reply through a pipe.
The parent enforces the wall-clock limit, and kills the child's whole process group when it is
passed; the kernel enforces the memory and task limits of the child's control group (cgroups.py)
over its whole tree (where it has none, the parent polls the tree's proportional memory and
RLIMIT_NPROC caps the processes of the child's own uid), and a seccomp filter (seccomp.py)
refuses the system calls that would widen what it reaches. Whatever the candidate does to its interpreter
(monkeypatching torch, a poisoned CUDA context, a segfault) ends with the child.
"""

import ctypes
import errno
import os
import re
import resource
import select
import shutil
import signal
import socket
import tempfile
import time
import traceback

import msgpack

from . import bounded
from . import cgroups
from . import devlock
from . import seccomp

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


_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWCGROUP = 0x02000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND = 32, 1024, 2048, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME, _MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_MOUNT_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": _MS_NOATIME,
                "nodiratime": _MS_NODIRATIME, "relatime": _MS_RELATIME, "strictatime": _MS_STRICTATIME}
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

# The unprivileged uid the worker's builder runs as when the worker runs as root (nobody): it owns
# nothing, so it can write none of the worker's files, read none of root's private ones, and
# signal none of the worker's processes.
NOBODY = 65534
# Candidates run as a uid of their own, CANDIDATE_UID_BASE + the pid of the process the worker
# forked (no passwd entry, no group): like nobody, and besides, no candidate can signal another's
# processes or use up a count the kernel keeps per uid (RLIMIT_NPROC) that a neighbour needs.
CANDIDATE_UID_BASE = 0x40000000
# Processes (threads included) a candidate may have: torch's thread pools and a build's compilers
# fit; a fork bomb does not. Counted by the candidate's control group (pids.max) where it has one,
# else by RLIMIT_NPROC on its own uid.
PROCESS_LIMIT = 1024
# Environment variables a candidate's process keeps (names, or prefixes ending in "_"); every
# other one (secrets, API keys, the cluster's key) is removed.
ENV_ALLOW = ("PATH", "LANG", "LANGUAGE", "TZ", "LC_", "CUDA_", "NVIDIA_", "TORCH_CUDA_ARCH_LIST",
             "PYTORCH_", "LD_LIBRARY_PATH", "CC", "CXX", "NVCC_", "MAX_JOBS", "OMP_NUM_THREADS",
             "MKL_NUM_THREADS", "VIRTUAL_ENV", "PYTHONHASHSEED")


class Confinement:
    """What every candidate's process is confined to (decided once by the worker).

    hide: folders covered by an empty read-only tmpfs, and files replaced by /dev/null (the home
    folder, root's, the build cache, the worker's scratch folder with its locks and socket, the
    run folders and their stores, the cluster's secret and keys);
    expose: folders put back, read-only, even under a hidden one (the Python installation, the
    harness's own code, the build cache for the timing stage); writable: folders bound
    read-write (a trusted builder's staging folder only). Everything else is read-only; /tmp and
    /dev/shm are private and empty; /proc shows only the candidate's own processes."""

    def __init__(self, enabled=True, hide=(), expose=(), writable=(), tmp_size_mb=2048, uid=None):
        self.enabled = enabled
        self.hide = [os.path.abspath(p) for p in hide if p]
        self.expose = [os.path.abspath(p) for p in expose if p]
        self.writable = [os.path.abspath(p) for p in writable if p]
        self.tmp_size_mb = tmp_size_mb
        self.uid = uid  # when the worker is root: the uid to run as (None: one of the process's own)

    def but(self, **changes):
        c = Confinement(self.enabled, self.hide, self.expose, self.writable, self.tmp_size_mb, self.uid)
        for k, v in changes.items():
            setattr(c, k, [os.path.abspath(p) for p in v] if isinstance(v, (list, tuple)) else v)
        return c


def _mount(src, target, fstype, flags, data=None):
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if _libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mounts():
    """(mount point, flags to keep) of every mount this process sees, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
            keep = 0
            for opt in parts[5].split(","):
                keep |= _MOUNT_FLAGS.get(opt, 0)
            out.append((point, keep))
    return out


def _under(path, folder):
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _scrub_environment(env):
    keep = {k: v for k, v in os.environ.items()
            if any(k == a or (a.endswith("_") and k.startswith(a)) for a in ENV_ALLOW)}
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update(env)


def _wait_for(pid, reap_others):
    """(Only trusted code runs here, every descriptor closed.) Waits until pid ends, reaping any
    other child that ends meanwhile when reap_others (PID 1 of a namespace inherits orphans);
    returns its status. A process left with nothing to wait for ends."""
    os.closerange(3, 1 << 16)
    while True:
        try:
            done, status = os.wait() if reap_others else os.waitpid(pid, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            return status


def _outer_wait(pid):
    """The process outside the candidate's PID namespace: waits for its init (PID 1 in it, whose
    end ends every process in the namespace) and ends with the candidate's status."""
    status = _wait_for(pid, reap_others=False)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
    if not sig and code > 128 and code - 128 in _FATAL:  # the namespace's init passes a signal on
        sig = code - 128
    if sig:
        if sig != signal.SIGKILL:  # (SIGKILL's action cannot be set, and needs no reset)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code)


_FATAL = {int(s) for s in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE,
                           signal.SIGILL, signal.SIGTERM, signal.SIGXCPU)}


def _init_wait(pid):
    """PID 1 of the candidate's namespace: reaps whatever ends there until the candidate does,
    then ends (and with it every process left in the namespace), passing its status on."""
    status = _wait_for(pid, reap_others=True)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _drop_privileges(root, uid, tasks_counted):
    """No way back: an unprivileged uid (root) or no capabilities (user namespace), no new
    privileges through exec, a cap on the number of processes where no control group counts
    them (RLIMIT_NPROC counts per uid: with root, the uid is the candidate's own)."""
    if not tasks_counted:
        resource.setrlimit(resource.RLIMIT_NPROC, (PROCESS_LIMIT, PROCESS_LIMIT))
    _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if root:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        return f"uid {uid}"
    for cap in range(64):
        _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    data = (Data * 2)()
    if _libc.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    return "no capabilities"


def _confine_files(conf):
    """In the new mount namespace: hides, exposes, makes everything else read-only, gives a
    private /tmp and /dev/shm and a /proc of the new PID namespace. Returns what it could not do."""
    problems = []
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host
    keep_fds = {}
    for p in conf.expose + conf.writable:
        try:
            keep_fds[p] = os.open(p, os.O_PATH | os.O_DIRECTORY)
        except OSError:
            pass  # absent: nothing to put back
    # Private /tmp and /dev/shm, hidden folders, then what is put back inside them, parents first.
    covers = {"/tmp": f"mode=1777,size={conf.tmp_size_mb}m"}
    if os.path.isdir("/dev/shm"):
        covers["/dev/shm"] = "mode=1777,size=1024m"
    for h in conf.hide:
        if os.path.isdir(h) and not any(_under(h, w) for w in conf.writable):
            covers.setdefault(h, "mode=755,size=64k")
    # Hidden files (a secret, a key) the candidate would still see (outside every covered folder,
    # or inside a folder put back): /dev/null in their place.
    def seen(f):
        holders = [c for c in covers if _under(f, c)] + [p for p in keep_fds if _under(f, p)]
        return not holders or max(holders, key=len) in keep_fds
    nulled = [h for h in conf.hide if os.path.isfile(h) and seen(h)]
    steps = [(h, "cover") for h in covers] + [(p, "bind") for p in keep_fds]
    for p, what in sorted(steps, key=lambda x: (len(x[0]), x[1] == "bind")):
        if what == "cover":
            if os.path.isdir(p):  # (not when an earlier cover already took it out of sight)
                _mount("tmpfs", p, "tmpfs", _MS_NOSUID | _MS_NODEV, covers[p])
            continue
        if p in conf.writable or any(_under(p, h) for h in covers):
            try:
                os.makedirs(p, exist_ok=True)  # inside the tmpfs over a hidden parent
            except OSError as e:
                problems.append(f"cannot put back {p} ({e.strerror})")
                continue
            _mount(f"/proc/self/fd/{keep_fds[p]}", p, None, _MS_BIND | _MS_REC)
    for f in nulled:
        try:
            _mount("/dev/null", f, None, _MS_BIND)
        except OSError as e:
            problems.append(f"cannot hide {f} ({e.strerror})")
    # Everything read-only but the kernel's own file systems, the private /tmp and /dev/shm and
    # what is writable on purpose.
    for point, keep in _mounts():
        if point in ("/proc", "/dev", "/sys", "/tmp", "/dev/shm") or any(_under(point, d) for d in ("/proc",)):
            continue
        if any(_under(point, w) for w in conf.writable) or (_under(point, "/dev") and point != "/dev/shm"):
            continue
        try:
            _mount(None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep)
        except OSError as e:
            if e.errno == errno.ENOENT and any(_under(point, h) for h in covers):
                continue  # a mount under a covered folder: out of sight, nothing to make read-only
            problems.append(f"{point} stays writable ({e.strerror})")
    for fd in keep_fds.values():
        os.close(fd)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    return problems


def candidate_uid(conf) -> int:
    """The uid a process confined by conf runs as when the worker is root (call before confine)."""
    return conf.uid if conf.uid is not None else CANDIDATE_UID_BASE + os.getpid()


def confine(conf, env, own=(), tasks_counted=False):
    """Confines this freshly forked (single-threaded) process; returns a dict describing its
    isolation. With ``conf.enabled``: new user (unless root), PID, mount, network, IPC and UTS
    namespaces; this process stays outside as the candidate's parent, and the call returns in
    the candidate, PID 1 of its namespace (every process it starts ends with it, setsid or not).
    Whatever the kernel refuses is said in the result ("none: why"), never skipped silently.

    own: folders the candidate must write where it gets no private file view (its temp dir):
    when the kernel refuses namespaces (a container's default seccomp profile) and this runs as
    root, the candidate runs as its own uid on the worker's own files, so these are given to it.
    tasks_counted: its control group limits its processes (no RLIMIT_NPROC then)."""
    iso = {"namespaces": "none: disabled", "network": "none: disabled", "files": "none: disabled",
           "user": "none: disabled", "seccomp": "none: disabled"}
    os.setpgid(0, 0)
    die_with_parent()
    _scrub_environment(env)
    os.environ["HOME"] = "/tmp"
    # Its uid may have no passwd entry: what asks for a user name (getpass.getuser(), as torch's
    # compile caches do) finds one here.
    os.environ["USER"] = os.environ["LOGNAME"] = "candidate"
    if not conf.enabled:
        return iso
    root = os.geteuid() == 0
    run_as = candidate_uid(conf)
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWCGROUP
    if not root:
        flags |= _CLONE_NEWUSER
    if _libc.unshare(flags) != 0:
        err = os.strerror(ctypes.get_errno())
        iso["namespaces"] = f"none: unshare refused ({err})"
        iso["network"] = isolate_network()
        iso["files"] = "none: no mount namespace"
        try:
            if root:
                for path in own:
                    os.chown(path, run_as, run_as)
            iso["user"] = _drop_privileges(root, run_as, tasks_counted)
        except OSError as e:
            iso["user"] = f"none: {e}"
        iso["seccomp"] = seccomp.install()
        return iso
    if not root:
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                           ("/proc/self/gid_map", f"0 {gid} 1")):
            with open(path, "w") as f:
                f.write(text)
    pid = os.fork()
    if pid:
        try:
            _outer_wait(pid)
        finally:  # never returns into the caller's code, whatever happens
            os._exit(1)
    die_with_parent()
    iso["namespaces"] = "pid,mount,net,ipc,uts,cgroup" + ("" if root else ",user")
    iso["network"] = "netns"
    try:
        problems = _confine_files(conf)
        iso["files"] = "private" + (f" ({'; '.join(problems)})" if problems else "")
    except OSError as e:
        iso["files"] = f"none: {e}"
    # The candidate is PID 2: PID 1 (trusted, waiting) ends the namespace when it ends, and the
    # candidate's own signals (a deliberate crash) act on it as on any process.
    pid = os.fork()
    if pid:
        try:
            _init_wait(pid)
        finally:
            os._exit(1)
    die_with_parent()
    try:
        iso["user"] = _drop_privileges(root, run_as, tasks_counted)
    except OSError as e:
        iso["user"] = f"none: {e}"
    iso["seccomp"] = seccomp.install()
    return iso


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


def tree_rss_bytes(pid: int, measure=rss_bytes) -> int:
    """Resident memory of a process and all its descendants (the candidate runs as a child of
    the process the worker forked, in its own PID namespace), each measured by measure."""
    def children(p):
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                return [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            return []

    # The process the worker forked and the namespace's init only wait for the candidate:
    # counting them too would count the pages all of them inherited from the worker three times.
    todo, seen, total = children(pid) or [pid], set(), 0
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        if not _namespace_init(p):
            total += measure(p)
        todo.extend(children(p))
    return total


def pss_bytes(pid: int) -> int:
    """Proportional set size of a process: each resident page divided by the number of processes
    sharing it (0 once it is gone, or where the kernel gives no smaps_rollup)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_memory_bytes(pid: int) -> int:
    """The memory a process tree holds: the sum of its proportional sizes (a tree of forks shares
    its copy-on-write pages, which the resident sizes count once per process), or of its resident
    sizes where the kernel gives no proportional ones."""
    pss = tree_rss_bytes(pid, pss_bytes)
    return pss if pss > 0 else tree_rss_bytes(pid)


def _namespace_init(pid: int) -> bool:
    """Whether pid is PID 1 of a PID namespace below this one (confine's waiting init)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) > 1 and ids[-1] == "1"
    except OSError:
        pass
    return False


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


def _child_setup(conf, env, address_space_limit, memory_limit_mb, tmpdir):
    """First steps of a candidate's process: confinement (see confine), the environment, a
    private temp dir, the address-space limit. Returns the isolation it got."""
    env = dict(env)
    for name in ("KERNELRL_DEVICE_LOCK", "KERNELRL_DEVICE_GATE"):
        # The device's locks (gpu/devlock.py) are reached through descriptors opened now: their
        # folder may be hidden.
        path = env.pop(name, "")
        if path:
            try:
                env[name + "_FD"] = str(devlock.open_file(path))
            except OSError:
                pass
    # Its own control group first (the worker's rights are still its own): every process the
    # candidate starts is counted against its memory and task limits, and removed with it.
    group = cgroups.enter(memory_limit_mb, PROCESS_LIMIT)
    iso = confine(conf, env, own=[tmpdir], tasks_counted=group.startswith("own group") and cgroups.limits_tasks())
    iso["cgroup"] = group
    if iso["files"].startswith("private"):
        tmpdir = "/tmp"  # the private one
    os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = tmpdir
    os.chdir(tmpdir)
    # No file it writes grows past the size of its private /tmp (EFBIG, see _output_to), wherever
    # it writes: without a private file view, its temp dir is on the worker's disk.
    fsize = conf.tmp_size_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    if address_space_limit and memory_limit_mb > 0:
        # On top of what the worker had mapped already (torch's libraries alone map
        # gigabytes of address space): the candidate gets memory_limit_mb more.
        lim = _address_space_bytes() + memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    return iso


def _write_all(fd, data: bytes):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# In a candidate's process: the descriptors of its channel to the worker (see ask()).
_SERVICE = None
SERVICE_FRAME_LIMIT = 64 << 20


def ask(request: dict) -> dict:
    """From inside a candidate's process: one request to the trusted worker (a kernel build) and
    its answer. Raises RuntimeError when this process has no channel."""
    if _SERVICE is None:
        raise RuntimeError("no channel to the worker in this process")
    wfd, rfd = _SERVICE
    data = msgpack.packb(request, use_bin_type=True)
    _write_all(wfd, len(data).to_bytes(4, "little") + data)
    head = _read_exact(rfd, 4)
    return msgpack.unpackb(_read_exact(rfd, int.from_bytes(head, "little")), raw=False)


def _read_exact(fd, n):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise RuntimeError("the worker closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Service:
    """The worker's end of a candidate's channel: frames (4-byte length, msgpack) read without
    ever blocking on a candidate, answered by ``handler(request) -> dict``."""

    def __init__(self, handler):
        self.handler = handler
        self.from_child, self.child_w = os.pipe()
        self.child_r, self.to_child = os.pipe()
        self.buf = b""

    def child_side(self):
        global _SERVICE
        os.close(self.from_child)
        os.close(self.to_child)
        _SERVICE = (self.child_w, self.child_r)

    def parent_side(self):
        os.close(self.child_w)
        os.close(self.child_r)

    def pump(self):
        """Reads what the candidate wrote; answers each complete request. False once the
        candidate closed its end or broke the framing."""
        try:
            chunk = os.read(self.from_child, 1 << 20)
        except OSError:
            return False
        if not chunk:
            return False
        self.buf += chunk
        while len(self.buf) >= 4:
            n = int.from_bytes(self.buf[:4], "little")
            if n > SERVICE_FRAME_LIMIT:
                return False
            if len(self.buf) < 4 + n:
                break
            frame, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
            try:
                req = msgpack.unpackb(frame, raw=False)
                reply = self.handler(req) if isinstance(req, dict) else {"ok": False, "error": "not a map"}
            except Exception as e:  # noqa: BLE001 - a malformed request: answered, never fatal
                reply = {"ok": False, "error": f"bad request: {type(e).__name__}: {e}"}
            data = msgpack.packb(reply, use_bin_type=True)
            try:
                _write_all(self.to_child, len(data).to_bytes(4, "little") + data)
            except OSError:
                return False
        return True

    def close(self):
        _close_fds(self.from_child, self.to_child)
        self.from_child = self.to_child = -1


def _close_fds(*fds):
    """Closes the open ones (-1: already closed)."""
    for fd in fds:
        try:
            if fd >= 0:
                os.close(fd)
        except OSError:
            pass


def close_inherited(keep):
    """In a freshly forked child: closes every descriptor inherited from the worker but stdin,
    stdout, stderr and ``keep`` (the worker's ZeroMQ connection, its judge's control socket,
    other candidates' channels and locks are none of a candidate's business)."""
    last = 2
    for fd in sorted(set(int(k) for k in keep if k > 2)):
        os.closerange(last + 1, fd)
        last = fd
    os.closerange(last + 1, 1 << 20)


# In a candidate's process: the descriptor of its link to the judge (gpu/judge.py), if any.
JUDGE_LINK = None
# In a spare's process (Spare): wait to be killed after replying instead of exiting.
HOLD_AFTER_REPLY = False


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
        reply["isolation"].update({"child_start_s": started - t0, **net})
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
        if HOLD_AFTER_REPLY:
            # It holds its device's lock (gpu/devlock.py) until the worker, having taken a hold in
            # its stead, kills it: its exit (a CUDA context's teardown) stays inside a hold.
            while True:
                signal.pause()
    finally:
        os._exit(code)


def _refuse(why):
    """What a process whose confinement failed runs instead of the candidate."""
    return lambda: {"status": "runtime_error", "error": f"the candidate's sandbox could not be set up ({why}); "
                                                         f"the candidate was not run"}


def run_isolated(fn, *, timeout_s: float, memory_limit_mb: int, env: dict, isolate_net: bool = True,
                 address_space_limit: bool, tmp_root: str, conf=None, service=None):
    """Runs ``fn()`` (which returns a msgpack-able dict) in a forked child.

    Returns (reply, failure): reply is fn's dict when the child reported one; otherwise failure is
    {"status": "timeout"|"runtime_error", "error": why}. Also returns the child's overhead timings
    in reply["isolation"] (fork to first instruction, and exit)."""
    rfd, wfd = os.pipe()
    out_r, out_w = os.pipe()
    conf = conf or Confinement(enabled=isolate_net)
    svc = _Service(service) if service else None
    tmpdir = tempfile.mkdtemp(prefix="cand-", dir=tmp_root)
    t_fork = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(rfd)
            _output_to(out_r, out_w)
            if svc:
                svc.child_side()
            close_inherited([wfd] + (list(_SERVICE) if svc else []))
            net = _child_setup(conf, env, address_space_limit, memory_limit_mb, tmpdir)
        except BaseException as e:  # noqa: BLE001
            net = {"setup": f"failed: {type(e).__name__}: {e}"}
            fn = _refuse(net["setup"])
        _child_run(fn, wfd, memory_limit_mb, t_fork, net)
    os.close(wfd)
    os.close(out_w)
    if svc:
        svc.parent_side()
    try:
        return _collect(pid, rfd, t_fork, timeout_s, memory_limit_mb, tmpdir, service=svc, out=out_r)
    finally:
        if svc:
            svc.close()


class Spare:
    """A candidate's process started ahead of its candidate: forked, isolated and through
    ``warm()`` (CUDA context creation, ~0.3-0.4 s on an H100) while the previous candidate runs,
    then waiting for its request. ``send(request)`` then ``collect(timeout_s)`` run
    ``handler(request)`` in it under the same limits as run_isolated. While warming it holds its
    device's lock (gpu/devlock.py, ``lock_path``) shared, so its start-up never overlaps a timed
    region; the seconds its process then waits for that lock extend its time limit (``waited``)."""

    def __init__(self, *, handler, warm, key, env, isolate_net=True, address_space_limit,
                 memory_limit_mb, tmp_root, lock_path, conf=None, service=None, judge_link=False):
        conf = conf or Confinement(enabled=isolate_net)
        # With judge_link: a socket pair, one end the process's (JUDGE_LINK), the other kept
        # here (self.link) for the worker to hand to its judge with the request.
        self.link, child_link = socket.socketpair() if judge_link else (None, None)
        self.svc = _Service(service) if service else None
        self.key = key
        self.waited = devlock.counter()
        self.memory_limit_mb = memory_limit_mb
        self.tmpdir = tempfile.mkdtemp(prefix="cand-", dir=tmp_root)
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # child
            global JUDGE_LINK, HOLD_AFTER_REPLY
            os.close(self.req_w)
            os.close(self.rep_r)
            _output_to(self.out_r, out_w)
            if self.svc:
                self.svc.child_side()
            if child_link is not None:
                JUDGE_LINK = child_link.detach()
            close_inherited([req_r, rep_w] + (list(_SERVICE) if self.svc else [])
                            + ([JUDGE_LINK] if JUDGE_LINK is not None else []))
            net = {"setup": "failed"}
            try:
                HOLD_AFTER_REPLY = lock_path is not None
                devlock.WAITED = self.waited
                with devlock.held_shared(lock_path):  # first, before a timed region can start
                    net = _child_setup(conf, env, address_space_limit, memory_limit_mb, self.tmpdir)
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
                net = {**net, "setup": f"failed: {type(e).__name__}: {e}"}
            if request is None:
                os._exit(0)  # discarded before it got a request
            run = _refuse(net["setup"]) if "setup" in net else (lambda: handler(request))
            _child_run(run, rep_w, memory_limit_mb, t0, net)
        os.close(req_r)
        os.close(rep_w)
        os.close(out_w)
        if child_link is not None:
            child_link.close()
        if self.svc:
            self.svc.parent_side()

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
        try:
            return _collect(self.pid, self.rep_r, self.t0, timeout_s, self.memory_limit_mb, self.tmpdir,
                            on_poll, defer_exit, self.svc, self.out_r, waited=lambda: devlock.read_counter(self.waited))
        finally:
            if self.svc:
                self.svc.close()

    def discard(self):
        _close_fds(self.req_w, self.rep_r, self.out_r)
        self.close_link()
        if self.svc:
            self.svc.close()
        _kill_group(self.pid)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        reaped(self.pid, self.tmpdir)


    def close_link(self):
        """The worker's end of the judge link: closed once handed to the judge (or unused)."""
        if self.link is not None:
            self.link.close()
            self.link = None


def _output_to(out_r, out_w):
    """In a candidate's process: its stdout and stderr become the pipe the worker drains (bounded:
    gpu/bounded.py), not the worker's log; a file it writes is at most the size of its private /tmp,
    and writing past that is an error (EFBIG) rather than a signal."""
    os.close(out_r)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.close(out_w)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _drain(fd, tail, block=False):
    """Reads what the candidate printed into ``tail``; False once the pipe is closed."""
    while True:
        if not block and not select.select([fd], [], [], 0)[0]:
            return True
        try:
            chunk = os.read(fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        if not chunk:
            return False
        tail.add(chunk)


def _collect(pid, rfd, t0, timeout_s, memory_limit_mb, tmpdir, on_poll=None, defer_exit=None, service=None,
             out=-1, waited=None):
    """The candidate's reply, or its failure. ``waited()``: seconds its process spent waiting for
    its device's lock (other candidates' timed regions), added to its time (at most timeout_s)."""
    chunks = []
    failure = None
    tail = bounded.OutputTail()
    extra = 0.0
    limit = memory_limit_mb * 1024 * 1024
    kernel_counts = False
    try:
        while True:
            if waited is not None:
                extra = min(timeout_s, waited())
            left = t0 + timeout_s + extra - time.monotonic()
            if left <= 0:
                more = f" (and {extra:.1f} s it waited for other candidates' timed trials)" if extra >= 0.05 else ""
                failure = {"status": "timeout",
                           "error": f"candidate exceeded the {timeout_s:g} s limit{more}; its process group was killed"}
                if limit > 0 and cgroups.held_at_limit(pid, limit):  # it ran out of time held at its memory limit
                    failure = {"status": "runtime_error",
                               "error": f"candidate exceeded the memory limit: it was held at {memory_limit_mb} MB "
                                        f"(the kernel reclaiming to keep it there) until the {timeout_s:g} s limit; "
                                        f"its process group was killed"}
                break
            watch = [rfd] + ([service.from_child] if service is not None else []) + ([out] if out >= 0 else [])
            ready, _, _ = select.select(watch, [], [], min(left, 0.05))
            if on_poll is not None:
                on_poll()
            if out >= 0 and out in ready:
                if not _drain(out, tail):
                    os.close(out)
                    out = -1
                continue
            if service is not None and service.from_child in ready:
                if not service.pump():
                    service.close()
                    service = None
                continue
            if rfd in ready:
                chunk = os.read(rfd, 1 << 20)
                if not chunk:
                    break  # child closed the pipe: done (or died)
                chunks.append(chunk)
                continue
            # Where its control group limits its memory, the kernel counts and enforces it (each
            # page once); else the tree is measured here, shared pages shared out among its sharers.
            if limit > 0 and not kernel_counts:
                kernel_counts = cgroups.memory_limited(pid, limit)
                used = 0 if kernel_counts or tree_rss_bytes(pid) <= limit else tree_memory_bytes(pid)
                if used > limit:
                    failure = {"status": "runtime_error",
                               "error": f"candidate exceeded the memory limit: resident {used >> 20} MB > "
                                        f"{memory_limit_mb} MB; its process group was killed"}
                    break
    finally:
        os.close(rfd)
        if out >= 0:  # what it printed up to its reply (or its end); the rest is not waited for
            _drain(out, tail)
            os.close(out)
        if failure is None and chunks and defer_exit is not None:
            defer_exit(pid, tmpdir)  # (its device hold taken over while the process still holds it)
            _kill_group(pid)  # it replied: end it and anything it left behind, reap it later
            status = 0
        else:
            if failure is not None or chunks:  # (one that replied may wait to be killed: Spare)
                _kill_group(pid)
            _, status = os.waitpid(pid, 0)
            _kill_group(pid)  # anything the candidate left behind in its group
            if failure is None and not chunks and cgroups.oom_killed(pid):
                failure = {"status": "runtime_error",
                           "error": f"candidate exceeded the memory limit: its processes together passed "
                                    f"{memory_limit_mb} MB and the kernel killed them"}
            reaped(pid, tmpdir)
    wall = time.monotonic() - t0
    output = tail.text()
    if failure is not None:
        failure["isolation"] = {"wall_s": wall}
        failure["output"] = output
        return None, failure
    data = b"".join(chunks)
    if not data:
        return None, {"status": "runtime_error",
                      "error": f"candidate process {describe_status(status)}",
                      "isolation": {"wall_s": wall}, "output": output}
    try:
        reply = msgpack.unpackb(data, raw=False)
    except Exception as e:  # noqa: BLE001
        return None, {"status": "runtime_error", "output": output,
                      "error": f"candidate process sent an unreadable reply ({e}); {describe_status(status)}"}
    reply.setdefault("isolation", {})["wall_s"] = wall
    reply["output"] = output
    return reply, None


def reaped(pid: int, tmpdir: str):
    """A confined process was reaped: whatever is left in its control group, and its temp dir, go."""
    cgroups.release(pid)
    shutil.rmtree(tmpdir, ignore_errors=True)


def _kill_group(pid: int):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
