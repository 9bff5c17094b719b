"""The side-stream check's decision (gpu/timed_region.py side_stream_check) on a scripted device
clock: work left running after forward returns is judged hacked, a host that woke late for one
measurement is not. No GPU: the events, the device synchronisation and the host's calibrated
wake-up are stand-ins that read and advance one clock."""

import contextlib
import os
import sys
import unittest
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # for the gpu package

from gpu import timed_region  # noqa: E402
from gpu.verdict import Verdict  # noqa: E402


class Device:
    """One clock (ms). A forward call takes `own_ms` of its stream; a device-wide synchronisation
    after the caller's stream is done takes the next of `tails` (the hidden work still running,
    plus the host's wake-up), the last one repeated. `wake_ms` is the host's calibrated wake-up."""

    def __init__(self, own_ms, tails, wake_ms):
        self.now, self.own_ms, self.tails, self.wake_ms = 0.0, own_ms, list(tails), wake_ms
        self.calls = 0
        self.calibrations = 0
        self.after_forward = False

    def event(self, enable_timing=True):
        device = self

        class Event:
            def record(self, stream=None):
                self.at = device.now

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.at - self.at
        return Event()

    def sync(self, _device=None):
        if self.after_forward:
            self.now += self.tails.pop(0) if len(self.tails) > 1 else self.tails[0]
            self.after_forward = False

    def forward(self, inputs, sync=True):
        self.calls += 1
        self.now += self.own_ms
        self.after_forward = True
        return "out"

    def busy_tail(self, ms):
        self.calibrations += 1
        return self.wake_ms


class Harness:
    device = "cuda:0"
    fused_digest = None

    def _harness_step(self, what):
        return contextlib.nullcontext()

    def _inputs(self, task, seed):
        return ["x"]


def check(device):
    timer = mock.Mock(stream=None, busy_tail=device.busy_tail)
    with mock.patch.object(timed_region, "_Event", device.event), \
            mock.patch.object(timed_region, "_cuda_sync", device.sync), \
            mock.patch.object(timed_region, "digest", lambda out, fused=None: "same"), \
            mock.patch("torch.cuda.current_stream"):
        timed_region.side_stream_check(Harness(), task=None, seed=1, run_candidate=device.forward, timer=timer)


class SideStreamTest(unittest.TestCase):
    # The first call reads the output twice (the digest check); SIDE_WORK_CALLS calls follow.
    FIRST = 1 + timed_region.SIDE_WORK_CALLS

    def test_a_forward_that_leaves_nothing_running_is_measured_once(self):
        device = Device(own_ms=0.656, tails=[0.0, 0.012, 0.015, 0.011], wake_ms=0.010)
        check(device)
        self.assertEqual(device.calls, self.FIRST)
        self.assertEqual(device.calibrations, 1)

    def test_a_host_that_woke_late_for_one_measurement_is_measured_again_and_passes(self):
        # What the lent H100 showed for an honest 0.656 ms forward: 0.079 ms over the wake-up in
        # each of three calls, against a limit of 0.066 ms (10% of its own time).
        late = 0.010 + 0.079
        device = Device(own_ms=0.656, tails=[0.0, late, late, late + 0.002, 0.013], wake_ms=0.010)
        check(device)
        self.assertEqual(device.calls, self.FIRST + timed_region.SIDE_WORK_RECHECK_CALLS)
        self.assertEqual(device.calibrations, 2)

    def test_work_left_running_in_every_call_is_hacked(self):
        # KernelBench's non_default_stream_kernel.py against L1/1: 2.494 ms busy after the
        # caller's stream was done.
        device = Device(own_ms=0.2, tails=[0.0, 2.504], wake_ms=0.010)
        with self.assertRaises(Verdict) as caught:
            check(device)
        self.assertEqual(caught.exception.status, "hacked")
        self.assertIn("2.494 ms", str(caught.exception))
        self.assertIn(f"each of {timed_region.SIDE_WORK_RECHECK_CALLS} calls", str(caught.exception))

    def test_the_limit_grows_with_the_forwards_own_time(self):
        # 0.3 ms of hidden work: over the 0.05 ms floor, under 10% of a 5 ms forward.
        check(Device(own_ms=5.0, tails=[0.0, 0.31], wake_ms=0.010))
        with self.assertRaises(Verdict):
            check(Device(own_ms=1.0, tails=[0.0, 0.31], wake_ms=0.010))


if __name__ == "__main__":
    unittest.main()
