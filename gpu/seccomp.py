"""A seccomp filter for confined processes: the system calls a kernel candidate has no use for and
that widen what it can reach are refused with EPERM (new namespaces, ptrace and other processes'
memory, mounts, kernel keyrings, BPF, io_uring, modules, kexec, reboot, swap, accounting,
userfaultfd, handles that open files by inode). Everything a candidate needs (CUDA's ioctls,
threads, fork and exec of compilers) stays allowed.

Installed last, after the namespaces are made and privileges dropped, on every thread of the
process (a warm process may have started threads). Written for x86_64; other machines say so.
"""

import ctypes
import errno
import platform

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

# x86_64 system call numbers.
_DENIED = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429, "open_tree": 428,
    "mount_setattr": 442,
    "keyctl": 250, "add_key": 248, "request_key": 249,
    "bpf": 321, "userfaultfd": 323, "perf_event_open": 298,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_by_handle_at": 304, "name_to_handle_at": 303,
    "init_module": 175, "finit_module": 313, "delete_module": 176,
    "kexec_load": 246, "kexec_file_load": 320, "reboot": 169,
    "swapon": 167, "swapoff": 168, "acct": 163, "settimeofday": 164, "clock_settime": 227,
    "adjtimex": 159, "clock_adjtime": 305, "iopl": 172, "ioperm": 173, "syslog": 103,
}
_CLONE = 56
_CLONE3 = 435
# clone(2) flags that make namespaces: refused. clone3 passes its flags in memory a filter
# cannot read: it answers ENOSYS, and the C library falls back to clone.
_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1
_SYS_SECCOMP = 317
_PR_SET_NO_NEW_PRIVS = 38


class _Instr(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instr))]


def program():
    """The filter, as (code, jt, jf, k) tuples: offsets into struct seccomp_data are nr at 0,
    arch at 4, the first argument's low 32 bits at 16 (little-endian)."""
    deny = (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)
    p = [(_LD_W_ABS, 0, 0, 4),
         (_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
         deny,  # another ABI (i386 through int 0x80): nothing a candidate needs
         (_LD_W_ABS, 0, 0, 0),
         (_JGE_K, 0, 1, _X32_BIT),
         deny]  # the x32 ABI
    for nr in sorted(_DENIED.values()):
        p += [(_JEQ_K, 0, 1, nr), deny]
    p += [(_JEQ_K, 0, 1, _CLONE3), (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
          (_JEQ_K, 1, 0, _CLONE), (_RET_K, 0, 0, _RET_ALLOW),
          (_LD_W_ABS, 0, 0, 16),
          (_JSET_K, 0, 1, _NAMESPACE_FLAGS), deny,
          (_RET_K, 0, 0, _RET_ALLOW)]
    return p


def install() -> str:
    """Filters this process (every thread). Returns what it did, or "none: why"."""
    if platform.machine() != "x86_64":
        return f"none: the filter is written for x86_64, not {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    code = program()
    instrs = (_Instr * len(code))(*[_Instr(*i) for i in code])
    prog = _Prog(len(code), instrs)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(_SYS_SECCOMP), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if rc != 0:
        err = ctypes.get_errno()
        return f"none: seccomp refused ({errno.errorcode.get(err, err)})"
    return f"filter ({len(_DENIED)} calls refused, no new namespaces)"
