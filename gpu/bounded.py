"""Bounded capture of what a candidate prints: the first and the last few KB, and how much was
cut between them. A candidate that floods its output costs the evaluation neither disk nor memory
(its stdout and stderr are a pipe the worker drains into an OutputTail; Python-level prints during
import go to a BoundedText)."""

import io

HEAD = 4096  # bytes kept from the start
TAIL = 4096  # bytes kept from the end


class OutputTail:
    """Bytes written in pieces; keeps the first HEAD and the last TAIL of them."""

    def __init__(self, head=HEAD, tail=TAIL):
        self.head_limit, self.tail_limit = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes):
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self.tail_limit:
            self.tail = bytearray(data[-self.tail_limit:])
        else:
            self.tail += data
            del self.tail[:max(0, len(self.tail) - self.tail_limit)]

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        """The output as kept: head, a line saying how many bytes were cut (when any), tail."""
        head = bytes(self.head).decode("utf-8", "replace")
        tail = bytes(self.tail).decode("utf-8", "replace")
        if self.cut <= 0:
            return head + tail
        return f"{head}\n[... {self.cut} bytes cut: the output was {self.total} bytes ...]\n{tail}"


class BoundedText(io.TextIOBase):
    """A text stream (for contextlib.redirect_stdout) that keeps what an OutputTail keeps."""

    def __init__(self, head=HEAD, tail=TAIL):
        super().__init__()
        self._out = OutputTail(head, tail)

    def writable(self):
        return True

    def write(self, s):
        self._out.add(s.encode("utf-8", "replace"))
        return len(s)

    def getvalue(self) -> str:
        return self._out.text()
