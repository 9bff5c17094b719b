"""Device memory one process allocates and another maps, through a file descriptor: how a
candidate's process hands its outputs to the judge (gpu/judge.py) without copying them to the host.

The judge allocates a buffer with the CUDA driver's virtual memory management (cuMemCreate, a
shareable POSIX file descriptor), sends the descriptor over the link (SCM_RIGHTS), and the
candidate's process maps the same physical memory (cuMemImportFromShareableHandle, cuMemMap). A
descriptor crosses the sandbox's namespaces as any file does; the legacy cudaIpc handles and
PyTorch's own sharing (which fetches descriptors with pidfd_getfd) need the other process's pid.
Each session gets a buffer of its own: a candidate that keeps writing to its mapping after its
reply reaches only memory no later session reads.

Only the CUDA driver library is needed (ctypes); both sides use the primary context PyTorch made
current. ``Shared`` wraps the mapping as a uint8 tensor.
"""

import ctypes
import os

# cuda.h
_ALLOCATION_TYPE_PINNED = 1
_HANDLE_TYPE_POSIX_FD = 1
_LOCATION_DEVICE = 1
_ACCESS_READWRITE = 3
_GRANULARITY_RECOMMENDED = 1


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class DevShareError(Exception):
    pass


_lib = None


def _cuda():
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise DevShareError(f"no CUDA driver library: {e}")
        u64, sz, vp = ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p
        sigs = {
            "cuMemGetAllocationGranularity": [ctypes.POINTER(sz), ctypes.POINTER(_Prop), ctypes.c_int],
            "cuMemCreate": [ctypes.POINTER(u64), sz, ctypes.POINTER(_Prop), u64],
            "cuMemExportToShareableHandle": [vp, u64, ctypes.c_int, u64],
            "cuMemImportFromShareableHandle": [ctypes.POINTER(u64), vp, ctypes.c_int],
            "cuMemAddressReserve": [ctypes.POINTER(u64), sz, sz, u64, u64],
            "cuMemMap": [u64, sz, sz, u64, u64],
            "cuMemSetAccess": [u64, sz, ctypes.POINTER(_AccessDesc), sz],
            "cuMemUnmap": [u64, sz],
            "cuMemAddressFree": [u64, sz],
            "cuMemRelease": [u64],
            "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, args in sigs.items():
            fn = getattr(lib, name, None)
            if fn is None:
                raise DevShareError(f"the CUDA driver has no {name}")
            fn.argtypes, fn.restype = args, ctypes.c_int
        _lib = lib
    return _lib


def _check(rc, what):
    if rc != 0:
        msg = ctypes.c_char_p()
        _cuda().cuGetErrorString(rc, ctypes.byref(msg))
        raise DevShareError(f"{what}: CUDA error {rc} ({(msg.value or b'?').decode()})")


def _prop(device_index):
    p = _Prop()
    p.type = _ALLOCATION_TYPE_PINNED
    p.requestedHandleTypes = _HANDLE_TYPE_POSIX_FD
    p.location.type = _LOCATION_DEVICE
    p.location.id = device_index
    return p


def granularity(device_index):
    g = ctypes.c_size_t()
    p = _prop(device_index)
    _check(_cuda().cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), _GRANULARITY_RECOMMENDED),
           "cuMemGetAllocationGranularity")
    return g.value


class _Interface:
    """__cuda_array_interface__ of a mapped range, for torch.as_tensor."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3}


class Shared:
    """A mapped range of shareable device memory: ``create`` (the owner's side, which can ``export``
    it as a descriptor) or ``attach`` (from a descriptor). ``tensor`` is a uint8 tensor over it.
    The current CUDA device must be `device` (torch.cuda.set_device) and its context initialised."""

    def __init__(self, handle, nbytes, device_index):
        import torch
        self.handle, self.nbytes, self.device_index = handle, nbytes, device_index
        self.ptr = 0
        lib = _cuda()
        ptr = ctypes.c_ulonglong()
        try:
            _check(lib.cuMemAddressReserve(ctypes.byref(ptr), nbytes, 0, 0, 0), "cuMemAddressReserve")
            self.ptr = ptr.value
            _check(lib.cuMemMap(self.ptr, nbytes, 0, handle, 0), "cuMemMap")
            access = _AccessDesc()
            access.location.type = _LOCATION_DEVICE
            access.location.id = device_index
            access.flags = _ACCESS_READWRITE
            _check(lib.cuMemSetAccess(self.ptr, nbytes, ctypes.byref(access), 1), "cuMemSetAccess")
        except DevShareError:
            self.close()
            raise
        self.tensor = torch.as_tensor(_Interface(self.ptr, nbytes), device=torch.device("cuda", device_index))

    @classmethod
    def create(cls, nbytes, device_index):
        g = granularity(device_index)
        nbytes = (nbytes + g - 1) // g * g
        h = ctypes.c_ulonglong()
        p = _prop(device_index)
        _check(_cuda().cuMemCreate(ctypes.byref(h), nbytes, ctypes.byref(p), 0), "cuMemCreate")
        try:
            return cls(h.value, nbytes, device_index)
        except DevShareError:
            _cuda().cuMemRelease(h.value)
            raise

    @classmethod
    def attach(cls, fd, nbytes, device_index):
        """Maps the memory behind descriptor `fd` (which stays the caller's to close)."""
        h = ctypes.c_ulonglong()
        _check(_cuda().cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), _HANDLE_TYPE_POSIX_FD),
               "cuMemImportFromShareableHandle")
        try:
            return cls(h.value, nbytes, device_index)
        except DevShareError:
            _cuda().cuMemRelease(h.value)
            raise

    def export(self):
        """A new file descriptor for this memory (the caller closes it)."""
        fd = ctypes.c_int(-1)
        _check(_cuda().cuMemExportToShareableHandle(ctypes.byref(fd), self.handle, _HANDLE_TYPE_POSIX_FD, 0),
               "cuMemExportToShareableHandle")
        return fd.value

    def close(self):
        """Unmaps and releases (the physical memory goes once every process that maps it has)."""
        lib = _cuda()
        self.tensor = None
        if self.ptr:
            lib.cuMemUnmap(self.ptr, self.nbytes)
            lib.cuMemAddressFree(self.ptr, self.nbytes)
            self.ptr = 0
        if self.handle:
            lib.cuMemRelease(self.handle)
            self.handle = 0


def _selftest(device_index=0, nbytes=64 << 20):
    """Two processes forked from this one (which never initialises CUDA): the first creates and
    exports, the second maps it through the descriptor, writes a pattern, and the first reads it."""
    import socket
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    a, b = socket.socketpair()
    owner = os.fork()
    if owner == 0:
        import torch
        torch.cuda.set_device(device_index)
        torch.empty(1, device="cuda")
        s = Shared.create(nbytes, device_index)
        s.tensor.zero_()
        torch.cuda.synchronize()
        fd = s.export()
        socket.send_fds(a, [b"fd"], [fd])
        os.close(fd)
        a.recv(1)
        ok = bool((s.tensor[:1 << 20] == 7).all()) and int(s.tensor[1 << 20]) == 0
        s.close()
        os._exit(0 if ok else 3)
    user = os.fork()
    if user == 0:
        import torch
        torch.cuda.set_device(device_index)
        torch.empty(1, device="cuda")
        _, fds, _, _ = socket.recv_fds(b, 16, 1)
        s = Shared.attach(fds[0], nbytes, device_index)
        os.close(fds[0])
        s.tensor[:1 << 20].fill_(7)
        torch.cuda.synchronize()
        b.send(b"w")
        s.close()
        os._exit(0)
    codes = [os.waitpid(p, 0)[1] for p in (owner, user)]
    return all(os.waitstatus_to_exitcode(c) == 0 for c in codes)


if __name__ == "__main__":
    import sys
    ok = _selftest(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print("devshare self-test:", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)
