"""How an evaluation ends early: a status and a one-line error (gpu/harness.py, gpu/timed_region.py,
gpu/judge.py)."""


class Verdict(Exception):
    """Ends an evaluation early with a status and a one-line error."""

    def __init__(self, status, error, log=""):
        super().__init__(error)
        self.status, self.error, self.log = status, error, log


class ShapeChanged(Exception):
    """A task whose inputs change shape with the seed: no refill in place."""
