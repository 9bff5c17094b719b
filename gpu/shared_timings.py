"""Measurements of the device that the workers of one launch share: each task's reference timing
and the device's bandwidth, measured once a device rather than once a worker.

With N evaluators on a GPU (`[[node]] per_gpu = N`) every worker would otherwise time every task's
reference itself, each time alone on the device (a timed region), so N evaluators spent N times the
device's exclusive time on references, and more on KernelBench-size inputs, where one reference's
timing takes seconds. Here the first worker that needs a timing measures it while holding the
entry's lock; the others wait on that lock and read its answer.

The folder is the launch's own temp folder (the parent of every worker's folder), which
candidates' processes cannot see (the worker hides it) and, running as another user, could not
write. Entries are JSON files named by a hash of their key, written whole (a rename), so a reader
sees a whole entry or none. A failed measurement is not stored: the next worker measures again.

Waiting on an entry's lock cannot deadlock with the device lock (gpu/devlock.py): the worker that
waits holds the device only through its reaper's exit hold, which its own thread gives up when the
exiting process is gone, whatever the waiting thread does.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile


class SharedTimings:
    """Entries by key in ``folder`` (None: nothing shared, every call measures)."""

    def __init__(self, folder):
        self.folder = None
        if folder:
            path = os.path.join(folder, "timings")
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
                self.folder = path
            except OSError:
                pass

    def _path(self, key):
        return os.path.join(self.folder, hashlib.sha1(key.encode()).hexdigest())

    def get(self, key):
        """The stored value for ``key``, or None."""
        if not self.folder:
            return None
        try:
            with open(self._path(key) + ".json", encoding="utf-8") as f:
                entry = json.load(f)
        except (OSError, ValueError):
            return None
        return entry.get("value") if isinstance(entry, dict) and entry.get("key") == key else None

    def put(self, key, value):
        if not self.folder or value is None:
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".entry-")
        except OSError:
            return
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"key": key, "value": value}, f)
            os.replace(tmp, self._path(key) + ".json")
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    @contextlib.contextmanager
    def measuring(self, key):
        """Held while this worker measures ``key``: another worker asking for it waits, then reads
        what this one stored."""
        if not self.folder:
            yield
            return
        try:
            fd = os.open(self._path(key) + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # (releases the lock)
