"""How the harness times a forward (the timing phase): per-trial statistics and Timer, the same
protocol for the reference (timed by the judge) and the candidate (timed in its own process):
CUDA events after an L2 flush and a device-wide synchronisation whose tail counts work left on
other streams; on CPU a monotonic clock. Imported before any candidate code runs; its clock and
CUDA functions are captured at import, and the harness's watch freezes the module and Timer
(harness._watch), so a candidate that rebinds them changes nothing it is timed with.
"""

import math
import statistics
import time

import torch

# Captured at import, before any candidate runs.
_clock_ns = time.perf_counter_ns
_no_grad = torch.no_grad
_Event = torch.cuda.Event
_cuda_sync = torch.cuda.synchronize
_current_stream = torch.cuda.current_stream
_spin = torch.cuda._sleep
_bump_version = torch.autograd.graph.increment_version


def _fresh_versions(inputs):
    """Marks the input tensors as written (their version counters move on) before each timed
    call: a candidate that caches its output keyed by (data pointer, version) recomputes, as it
    would for a caller that refilled the tensors."""
    for x in inputs:
        if isinstance(x, torch.Tensor):
            _bump_version(x)


def stats(times):
    if not times:
        return {"median_ms": 0.0, "mean_ms": 0.0, "std_ms": 0.0, "min_ms": 0.0, "max_ms": 0.0, "trials": 0}
    return {
        "median_ms": float(statistics.median(times)),
        "mean_ms": float(statistics.fmean(times)),
        "std_ms": float(statistics.stdev(times)) if len(times) > 1 else 0.0,
        "min_ms": float(min(times)),
        "max_ms": float(max(times)),
        "trials": len(times),
    }


class Timer:
    """Times a model's forward under one protocol for reference and candidate.

    CUDA, per trial (protocol "head", the default): synchronize the device (the previous trial's
    work is done on every stream), flush L2 (zero a buffer of twice the device's L2), keep the GPU
    busy for HEAD_START_MS more (a spin kernel), record `start`, call forward, record `end` on the
    current stream, synchronize the whole device, record `after`. While the GPU flushes and spins,
    the host has queued the forward's launches, so start->end is the GPU's work, not the host's
    Python and launch latency, whatever the host's jitter (KernelBench's per-trial 256 MB fill gives
    its events the same head start, ~85 us on an H100).

    Work left running on other streams when `end` is reached makes the device-wide synchronize
    wait for it, so it lengthens end->after (the tail). The tail also holds the host's wake-up
    from the synchronize, which is larger after a long wait than after none and differs between
    processes, so it is compared with a busy tail measured in the same run: a spin kernel as long
    as the forward, then the same record, synchronize, record (BUSY_ROUNDS times). When the median
    tail exceeds the busy tail by more than max(TAIL_SLACK_MS, TAIL_SLACK_FRACTION of the median
    trial), the forward leaves work behind in most trials and every trial counts start->after
    (stats["tail_counted"] = 1). A forward that hides work in only a minority of trials cannot move
    the median it is judged by; one that does it in most trials is timed with that work.
    Other protocols, kept for bench/timing_stability.py: "presync" synchronizes between the flush
    and `start` (the GPU is idle at `start`: the host's launch latency lands in every trial; the
    protocol before this one), "sync" records `end` only after the device-wide synchronize.
    CPU: the same warm-up and trials with the monotonic clock the harness captured at import."""

    TAIL_SLACK_MS = 0.02
    TAIL_SLACK_FRACTION = 0.02
    HEAD_START_MS = 0.1
    BUSY_ROUNDS = 5
    BUSY_CAP_MS = 5.0  # the wake-up after a wait stops growing long before this

    def __init__(self, device, protocol="head", count_tail=True):
        self.device = device
        self.protocol = protocol
        self.count_tail = count_tail
        self.flush_buf = None
        self.busy_tail_ms = 0.0
        self.tail_trials = 0    # trials of the last run() whose tail exceeded the busy tail + slack
        self.tail_counted = False  # the last run() counted start->after for every trial
        self.tails = []         # the last run()'s tails (end->after), ms
        self.last_times = []    # the last run()'s trial times as counted, ms, in order
        self.cycles_per_ms = 0.0
        self.stream = None
        if device.type == "cuda":
            # Events go on the stream current now: a candidate that switches streams for good
            # leaves its work on another stream, which the tail then counts.
            self.stream = _current_stream(device)
            l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or (64 << 20)
            self.flush_buf = torch.empty(max(2 * l2, 16 << 20), dtype=torch.int8, device=device)

    def _tail_after(self, cycles):
        """end->after of the trial sequence (record, device-wide synchronize, record) after a
        spin of `cycles`: the host's wake-up when nothing else runs."""
        e1, e2 = _Event(enable_timing=True), _Event(enable_timing=True)
        if cycles:
            _spin(cycles)
        e1.record(self.stream)
        _cuda_sync(self.device)
        e2.record(self.stream)
        e2.synchronize()
        return e1.elapsed_time(e2)

    def spin(self, ms):
        """Keeps the current stream busy for about `ms` (after _calibrate_spin)."""
        _spin(int(self.cycles_per_ms * ms))

    def busy_tail(self, ms):
        """The host's wake-up after waiting `ms` (capped at BUSY_CAP_MS) for a spin: the median
        end->after of BUSY_ROUNDS such waits."""
        cycles = int(self.cycles_per_ms * min(ms, self.BUSY_CAP_MS))
        return statistics.median(self._tail_after(cycles) for _ in range(self.BUSY_ROUNDS))

    def _calibrate_spin(self):
        """Spin-kernel cycles per millisecond at the clocks of now (after warm-up)."""
        probe = 200_000
        times = []
        for _ in range(3):
            e1, e2 = _Event(enable_timing=True), _Event(enable_timing=True)
            e1.record(self.stream)
            _spin(probe)
            e2.record(self.stream)
            e2.synchronize()
            times.append(e1.elapsed_time(e2))
        ms = statistics.median(times)
        self.cycles_per_ms = probe / ms if ms > 0 else probe / 0.1

    WARM_UP_MS = 100  # the least warm-up before timed runs, when the caller has not warmed up
    REWARM_MS = 10     # the least warm-up in the timed region after warm() ran outside it
    MIN_TRIALS = 20    # with a precision: the least timed trials before the stopping rule applies
    CHECK_EVERY = 5    # ... and how often after that it is applied

    def warm(self, model, inputs, warmup, min_ms=None):
        """Untimed runs: at least `warmup` and at least `min_ms` (WARM_UP_MS) of them, so clocks
        have ramped up from idle in this fresh process before the first timed run (on a CPU too:
        the reference is timed in a process of its own that ran it only here, the candidate after
        its correctness trials; a single warm-up run timed the reference colder). The harness runs
        this in the device's shared hold, beside other candidates' work (it is not timed), and
        the timed region then warms up again for REWARM_MS (run's warm_ms)."""
        min_ms = self.WARM_UP_MS if min_ms is None else min_ms
        cuda = self.device.type == "cuda"
        with _no_grad():
            t0 = _clock_ns()
            runs = 0
            while runs < warmup or (_clock_ns() - t0 < min_ms * 1e6 and runs < 10_000):
                _fresh_versions(inputs)
                model(*inputs)
                runs += 1
                if cuda and runs % 8 == 0:
                    _cuda_sync(self.device)
            if cuda:
                _cuda_sync(self.device)

    @staticmethod
    def median_interval(times):
        """The distribution-free 95% confidence interval of the median of `times`: the order
        statistics n/2 -/+ 0.98 sqrt(n) (1-based: floor(n/2 - 0.98 sqrt n), ceil(1 + n/2 + 0.98 sqrt n)),
        clipped to the sample."""
        xs = sorted(times)
        n = len(xs)
        h = 0.98 * math.sqrt(n)
        return xs[max(0, math.floor(n / 2 - h) - 1)], xs[min(n - 1, math.ceil(n / 2 + h))]

    @classmethod
    def median_halfwidth(cls, times):
        """Half the width of median_interval relative to the median; inf for fewer than 6 times or
        a median of 0."""
        med = statistics.median(times) if len(times) >= 6 else 0.0
        if med <= 0:
            return math.inf
        lo, hi = cls.median_interval(times)
        return (hi - lo) / 2 / med

    def _settled(self, times, trials, precision):
        """The stopping rule of run(): with a precision, after MIN_TRIALS trials (every trial when
        `trials` is not more) and every CHECK_EVERY after, stop once the median's 95% confidence
        interval is within +-precision of it."""
        n = len(times)
        return (precision > 0 and n < trials and n >= self.MIN_TRIALS and n % self.CHECK_EVERY == 0
                and self.median_halfwidth(times) <= precision)

    def run(self, model, inputs, warmup, trials, refill=None, warm_up=True, warm_ms=None, precision=0.0):
        """Timing statistics of at most `trials` calls of model(*inputs) after the warm-up (none
        when not `warm_up`; at least warm_ms of it, WARM_UP_MS when None). With `precision` > 0
        the trials stop early once the median is known to within it (_settled; stats' "trials"
        says how many ran). refill(i), when given, is called before trial i, outside the timed
        region (it writes new values into the input tensors)."""
        cuda = self.device.type == "cuda"
        self.tail_trials, self.tail_counted, self.tails = 0, False, []
        with _no_grad():
            if warm_up:
                self.warm(model, inputs, warmup, warm_ms)
            if not cuda:
                times = []
                for i in range(trials):
                    if refill is not None:
                        refill(i)
                    _fresh_versions(inputs)
                    t0 = _clock_ns()
                    model(*inputs)
                    t1 = _clock_ns()
                    times.append((t1 - t0) / 1e6)
                    if self._settled(times, trials, precision):
                        break
                self.last_times = times
                return stats(times)
            _cuda_sync(self.device)
            self._calibrate_spin()
            spans, firsts = [], []
            for i in range(trials):
                if refill is not None:
                    refill(i)
                spans.append(self._cuda_trial(model, inputs))
                firsts.append(spans[-1][0])
                if self._settled(firsts, trials, precision):
                    break
        times = [a for a, _ in spans]
        self.last_times = times
        if self.protocol == "sync":
            return stats(times)
        self.tails = [b - a for a, b in spans]
        med = statistics.median(times)
        self.busy_tail_ms = self.busy_tail(med)
        slack = max(self.TAIL_SLACK_MS, self.TAIL_SLACK_FRACTION * med)
        self.tail_trials = sum(t > self.busy_tail_ms + slack for t in self.tails)
        if self.count_tail and statistics.median(self.tails) > self.busy_tail_ms + slack:
            self.tail_counted = True
            times = [b for _, b in spans]
            self.last_times = times
        out = stats(times)
        out["tail_counted"] = int(self.tail_counted)
        return out

    def _cuda_trial(self, model, inputs):
        """(start->end, start->after) of one trial, ms."""
        start, end, after = (_Event(enable_timing=True) for _ in range(3))
        _fresh_versions(inputs)
        _cuda_sync(self.device)
        self.flush_buf.zero_()
        if self.protocol == "head":
            self.spin(self.HEAD_START_MS)
        else:
            _cuda_sync(self.device)
        start.record(self.stream)
        model(*inputs)
        if self.protocol == "sync":
            _cuda_sync(self.device)
            end.record(self.stream)
            end.synchronize()
            t = start.elapsed_time(end)
            return t, t
        end.record(self.stream)
        _cuda_sync(self.device)  # device-wide: work on every stream is done
        after.record(self.stream)
        after.synchronize()
        return start.elapsed_time(end), start.elapsed_time(after)
