"""What a candidate's process (gpu/harness.py) and the judge (gpu/judge.py) share: the check
protocol's names and seeds (each check's label, index and input distribution decide its inputs;
neither side takes them from the other) and the link between them (framing, the output's pieces,
the candidate's end, ``Link``). Its wire format is described in gpu/judge.py. Imports neither
side: harness.py and judge.py import it, and judge.py imports harness.py, never the reverse.
"""

import ctypes
import os
import socket

import msgpack

# The input distributions a check may draw from beyond the task's own draw ([evaluator]
# input_distributions; gpu/harness.py makes each).
INPUT_DISTRIBUTIONS = ("signed", "large", "zeros")

FRAME_LIMIT = 1 << 20
# Bytes per piece of an output on the link: one pinned staging buffer this size on each side.
LINK_CHUNK_BYTES = 64 << 20
# The device buffer a session's outputs move through on CUDA (allocated per session) has two
# halves, a piece in each. Each piece costs a device synchronisation and a socket round trip on
# both sides (about 1 ms on an H200), so a half holds a check's whole output where it can: the
# candidate's process says how many bytes its first check's outputs take, and the judge sizes each
# half to that, at least DEVICE_HALF_MIN_BYTES and at most a 128th of the device's memory (1 GB on
# an H200, 0.6 GB on an 80 GB card) or DEVICE_HALF_MAX_BYTES. A 6.4 GB output crosses in 6 pieces
# a check instead of 24.
DEVICE_HALF_MIN_BYTES = 32 << 20
DEVICE_HALF_MAX_BYTES = 1 << 30


def device_half_bytes(wanted, device_total):
    """Bytes of each half of a session's device buffer, for outputs of `wanted` bytes (the
    candidate's process's word, so only a hint: bounded either way) on a device of
    `device_total` bytes."""
    try:
        wanted = int(wanted)
    except (TypeError, ValueError, OverflowError):
        wanted = 0
    cap = max(DEVICE_HALF_MIN_BYTES, min(DEVICE_HALF_MAX_BYTES, int(device_total) // 128))
    return max(DEVICE_HALF_MIN_BYTES, min(cap, wanted))

LABELS = ("trial", "dist", "ordering", "post", "refill", "reverify")


def distributions(s):
    """The input distributions beyond the task's own draw that settings `s` ask for, in order
    (INPUT_DISTRIBUTIONS when they name none; unknown names are dropped here and refused
    by the configuration's reader)."""
    names = s.get("input_distributions")
    if names is None:
        return tuple(INPUT_DISTRIBUTIONS)
    return tuple(x for x in names if x in INPUT_DISTRIBUTIONS)


def distribution_of(label, index, dists):
    """The input distribution of a check (None: the task's own draw): dist i is the i-th of
    `dists`; re-verification cycles through the task's own draw and every one of them."""
    if label == "dist":
        return dists[index]
    if label == "reverify" and dists:
        return ((None,) + tuple(dists))[index % (len(dists) + 1)]
    return None


def seed_of(label, index, seed, n, d=0):
    """The inputs' seed of a check of the protocol (None for a check that is not in it):
    n correctness trials, d trials under other input distributions, the ordering check (CUDA),
    one trial after timing and one on the same tensors refilled, and 4n trials on
    re-verification."""
    if not isinstance(index, int) or isinstance(index, bool):
        return None
    if label == "trial" and 0 <= index < n:
        return seed * 1000 + index + 1
    if label == "dist" and 0 <= index < d:
        return seed * 1000 + 20_001 + index
    if label == "ordering" and index == 0:
        return seed * 1000 + 556
    if label == "post" and index == 0:
        return seed * 1000 + 10_001
    if label == "refill" and index == 0:
        return seed * 1000 + 10_002
    if label == "reverify" and 0 <= index < 4 * n:
        return (seed + 7_919) * 1000 + index + 1
    return None


def trial_name(label, index, n, d=0):
    """How messages name a check: trials are numbered as they run."""
    number = {"trial": index, "dist": n + index, "post": n + d, "refill": n + d + 1,
              "reverify": n + d + 2 + index}.get(label)
    return f"trial {number}" if number is not None else label


def check_name(label, index, n, dists, seed):
    """trial_name with the check's inputs: 'trial 6 (inputs: signed, seed 42020002)'."""
    trial_seed = seed_of(label, index, seed, n, len(dists))
    dist = distribution_of(label, index, dists) or "the task's own"
    return f"{trial_name(label, index, n, len(dists))} (inputs: {dist}, seed {trial_seed})"


TIMING_SEED = 999  # seed * 1000 + this: the timing inputs (their output is remembered too)


class LinkError(Exception):
    pass


def device_pieces(tensors, piece_bytes):
    """How many pieces of at most piece_bytes the device link moves outputs of these (numel,
    element size) in."""
    return sum(-(-n // max(1, piece_bytes // size)) for n, size in tensors)


def _recv_exact_into(sock, view):
    while len(view):
        got = sock.recv_into(view)
        if not got:
            raise LinkError("the other side closed the link")
        view = view[got:]


def _recv_exact(sock, n):
    buf = bytearray(n)
    _recv_exact_into(sock, memoryview(buf))
    return bytes(buf)


def _framed(obj):
    data = msgpack.packb(obj, use_bin_type=True)
    return len(data).to_bytes(4, "little") + data


def send_frame(sock, obj):
    sock.sendall(_framed(obj))


def recv_frame(sock, length=None):
    """The next frame's map; `length`: its 4-byte length, when already read."""
    n = int.from_bytes(length if length is not None else _recv_exact(sock, 4), "little")
    if n > FRAME_LIMIT:
        raise LinkError(f"a frame of {n} bytes (the limit is {FRAME_LIMIT})")
    try:
        obj = msgpack.unpackb(_recv_exact(sock, n), raw=False)
    except Exception as e:  # noqa: BLE001
        raise LinkError(f"an unreadable frame ({type(e).__name__})")
    if not isinstance(obj, dict):
        raise LinkError("a frame that is not a map")
    return obj


def _memory(t, nbytes):
    """A writable view of the first nbytes of a contiguous CPU tensor's memory."""
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _staging(torch, cuda):
    return torch.empty(LINK_CHUNK_BYTES, dtype=torch.uint8, pin_memory=cuda)


class Link:
    """The candidate's process's end of its link to the judge."""

    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)
        self.buf = None
        self.shared = None   # the session's device buffer (gpu/devshare.py), once the judge gave one
        self.asked = False   # asked for it already (at most once a session)
        self.why_bytes = ""  # why not through the device, when they could have (told the judge)

    def _share(self, device, nbytes):
        """Asks the judge for the session's device buffer (for outputs of `nbytes` bytes, the
        first check's) and maps it; on any failure the outputs go as bytes (why_bytes says why)."""
        self.asked = True
        send_frame(self.sock, {"op": "share", "bytes": int(nbytes)})
        length, fds, _, _ = socket.recv_fds(self.sock, 4, 1)  # the descriptor comes with the frame's first bytes
        try:
            if len(length) < 4:
                length += _recv_exact(self.sock, 4 - len(length))
            answer = recv_frame(self.sock, length)
            size = int(answer.get("share", 0))
            if size <= 0 or not fds:
                self.why_bytes = str(answer.get("why", "the judge gave no device buffer"))
                return
            from . import devshare
            try:
                self.shared = devshare.Shared.attach(fds[0], size, device.index)
            except devshare.DevShareError as e:
                self.why_bytes = f"mapping the judge's buffer failed: {e}"
        finally:
            for fd in fds:
                os.close(fd)

    def check(self, label, index, tensors, error=""):
        """Ships one check's outputs (plain tensors, flattened) or why they cannot be shipped;
        returns the judge's answer."""
        import torch
        if error:
            send_frame(self.sock, {"op": "check", "label": label, "index": index, "error": error})
            return recv_frame(self.sock)
        cuda = [t.device for t in tensors if t.device.type == "cuda"]
        if cuda and len(cuda) == len(tensors) and len(set(cuda)) == 1 and not self.asked:
            self._share(cuda[0], sum(t.numel() * t.element_size() for t in tensors))
        device = self.shared is not None and len(cuda) == len(tensors) and len(set(cuda)) == 1 \
            and cuda[0].index == self.shared.device_index
        header = {"op": "check", "label": label, "index": index,
                  "tensors": [{"dtype": str(t.dtype), "shape": list(t.shape)} for t in tensors]}
        if device:
            header["via"] = "device"
        elif cuda and self.why_bytes:
            header["bytes_why"] = self.why_bytes[:300]
        send_frame(self.sock, header)
        answer = recv_frame(self.sock)
        if not answer.get("go"):
            return answer
        if device:
            self._ship_device(tensors)
            return recv_frame(self.sock)
        for t in tensors:
            flat = t.detach().reshape(-1)
            size = t.element_size()
            per = max(1, LINK_CHUNK_BYTES // size)
            for a in range(0, flat.numel(), per):
                c = flat[a:a + per]
                nbytes = c.numel() * size
                if c.device.type == "cpu":
                    c = c.contiguous()
                    self.sock.sendall(_memory(c, nbytes))
                    continue
                if self.buf is None:
                    self.buf = _staging(torch, True)
                self.buf[:nbytes].view(t.dtype).copy_(c)
                self.sock.sendall(_memory(self.buf, nbytes))
        return recv_frame(self.sock)

    def _ship_device(self, tensors):
        """Each output through the session's device buffer, a piece at a time, alternating halves
        (see the module's docstring)."""
        import torch
        buf, half = self.shared.tensor, self.shared.nbytes // 2
        k = 0
        for t in tensors:
            flat = t.detach().reshape(-1)
            size = t.element_size()
            per = max(1, half // size)
            for a in range(0, flat.numel(), per):
                if k >= 2 and _recv_exact(self.sock, 1) != b"N":
                    raise LinkError("the judge did not take a piece of the output")
                c = flat[a:a + per]
                at = (k % 2) * half
                buf[at:at + c.numel() * size].view(t.dtype).copy_(c)
                torch.cuda.synchronize(t.device)
                self.sock.sendall(b"C")
                k += 1

    def domain(self, label, index):
        """Asks the judge whether a check's inputs (another input distribution) are inside the
        reference's domain; returns its answer ({"valid", "why"}; {"ok": false, ...} when it
        refused the question)."""
        send_frame(self.sock, {"op": "domain", "label": label, "index": index})
        return recv_frame(self.sock)

    def prepare(self, label, index):
        """Tells the judge the check this process is about to make inputs for and run, so it
        computes the reference's output meanwhile (no answer: the check's answer follows it)."""
        send_frame(self.sock, {"op": "prepare", "label": label, "index": index})

    def end(self):
        try:
            send_frame(self.sock, {"op": "end"})
        except OSError:
            pass
