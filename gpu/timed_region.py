"""The candidate's timing and the checks that run in its timed region (gpu/harness.py calls
them with itself as `h`; the reference's timing process uses the same protocol): the warm-up in
the device's shared hold, the timed trials held alone (Timer), the fresh-values probe that finds a
result kept by input values, the ordering check (work not ordered after the caller's stream) and
the side-stream check (work left running after forward returns).

Imported before any candidate code runs, and frozen by the harness's watch (harness._watch).
"""

import statistics

import torch

from . import protocol
from .checks import _shapes, digest
from .timing import Timer, stats
# The clock and CUDA functions timing.py captured at import (one capture, which the watch guards).
from .timing import _cuda_sync, _Event
from .verdict import ShapeChanged, Verdict


# Trials of each arm of the fresh-values probe, and how much slower the fresh arm must be than
# the repeated one to count instead (its fastest trial than the other's slowest, by this
# ratio; its median by this many milliseconds).
FRESH_TRIALS = 4
FRESH_RATIO = 1.25
FRESH_MIN_MS = 0.02

# Inputs of this many bytes or fewer, made for the warm-up in the shared hold, are kept for the
# timed region; larger ones are made again there (the same seed: the same values), so the
# checks between do not hold a third set of KernelBench-size inputs.
KEEP_TIMING_INPUTS_BYTES = 256 << 20


def timing_seed(seed):
    return seed * 1000 + 999


def timing_inputs(h, task, seed):
    with h._harness_step("generating inputs"):
        return h._inputs(task, timing_seed(seed))


def warm(h, timer, task, model, warmup, seed, warmed_ms=0.0):
    """The warm-up before a timed region, run in the shared hold (untimed: beside other
    candidates' work) on the timing inputs of seed: `warmup` runs, and runs until the model
    has run for Timer.WARM_UP_MS, of which `warmed_ms` the device spent on it just before (the
    correctness trials: a 6.4 GB-input candidate has warmed the clocks up there already).
    Returns those inputs when they are small enough to keep for the timed region, else None."""
    inputs = timing_inputs(h, task, seed)
    timer.warm(model, inputs, warmup, min_ms=max(0.0, Timer.WARM_UP_MS - warmed_ms))
    small = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
    return inputs if small <= KEEP_TIMING_INPUTS_BYTES else None


def time_model(h, timer, task, model, trials, warmup, seed, fresh=0, inputs=None, warm_ms=None,
               precision=0.0):
    """model's timing on the timing inputs of seed (the reference's, or a candidate's; made
    here unless given), in a timed region the caller holds alone (_alone): Timer.run with
    warm_ms and precision. With `fresh`, also the fresh-values probe: 2 x `fresh` more
    trials, alternating, before each of which the inputs are refilled outside the timed region
    (the task's own draw, generated and copied alike): with the same values again (arm
    "repeated") or with new ones (arm "fresh"); a probe that finds the fresh arm slower is run
    again and the second one stands. Returns (stats, (repeated, fresh) trial times or None; None for a
    task whose inputs change shape with the seed or hold no floating-point tensor)."""
    same_seed = timing_seed(seed)
    if inputs is None:
        inputs = timing_inputs(h, task, seed)
    out = timer.run(model, inputs, warmup, trials, warm_ms=warm_ms, precision=precision)
    out["tail_trials"] = timer.tail_trials
    if not fresh or not any(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
        return out, None

    rounds = [0]

    def refill(i):
        with h._harness_step("generating inputs"):
            fresh_seed = seed * 1000 + 30_001 + 100 * rounds[0] + i
            new = h._inputs(task, same_seed if i % 2 == 0 else fresh_seed)
            if _shapes(new) != _shapes(inputs):
                raise ShapeChanged()
            for old, value in zip(inputs, new):
                if isinstance(old, torch.Tensor):
                    old.copy_(value)
            del new

    def probe():
        rounds[0] += 1  # new values each round: a cache filled by the first has none of them
        timer.run(model, inputs, warmup, 2 * fresh, refill=refill, warm_up=False)
        times = timer.last_times
        return times[0::2], times[1::2]

    try:
        arms = probe()
        if kept_by_values(*arms):
            arms = probe()  # once more: what a result kept by values does every time, noise does not
    except ShapeChanged:
        return out, None
    return out, arms


def kept_by_values(repeated, fresh):
    """Whether the fresh-values probe's arms (their trial times, ms) say the timing holds a
    result kept by input values: every fresh trial but its fastest more than FRESH_RATIO
    slower than every repeated one but its slowest (one trial of each arm disturbed by the
    host, e.g. a process scheduled in, does not hide the cache; noise does not move three of
    four trials past three of four of the other arm, twice), and the medians FRESH_MIN_MS
    apart."""
    f, r = sorted(fresh), sorted(repeated)
    fast, slow = (f[1], r[-2]) if len(f) >= 3 and len(r) >= 3 else (f[0], r[-1])
    return (fast > FRESH_RATIO * slow
            and statistics.median(f) - statistics.median(r) > FRESH_MIN_MS)


def run(h, timer, task, new_model, watch, res, warmup, precision, trials, seed, checks=None, warmed_ms=0.0):
    """The candidate's warm-up in the shared hold (beside other candidates' work: it is not
    timed; phase warm_up; `warmed_ms` as warm's), then the timed region alone: `checks`
    first, then the timing (time_candidate), warmed up again for REWARM_MS and stopped at
    `precision`. Returns its stats."""
    with h._as_candidate(watch):
        inputs = warm(h, timer, task, new_model, warmup, seed, warmed_ms)
    h._phase(res, "warm_up")
    with h._alone(res):
        if checks is not None:
            checks()
        return time_candidate(h, timer, task, trials, warmup, seed, new_model, watch, res, inputs=inputs,
                              warm_ms=Timer.REWARM_MS, precision=precision)


def time_candidate(h, timer, task, trials, warmup, seed, new_model, watch, res, **how):
    """The candidate's timing on repeated inputs (as KernelBench times), checked by the
    fresh-values probe (time_model): a result kept by input values (a cache keyed by a sample
    of them) is fast only when the values repeat, so when the probe's fresh arm is more than
    FRESH_RATIO slower than its repeated arm (kept_by_values: all but one trial of each), the
    fresh arm's timing is the candidate's (and res["note"] says so). Timing noise moves a
    median or a trial, not the rest of one arm past the other."""
    with h._as_candidate(watch):
        cand_stats, probe = time_model(h, timer, task, new_model, trials, warmup, seed, FRESH_TRIALS, **how)
    if probe is not None:
        kept = kept_by_values(*probe)
        repeated, fresh = stats(probe[0]), stats(probe[1])
        cand_stats["repeated_median_ms"] = repeated["median_ms"]
        cand_stats["fresh_median_ms"] = fresh["median_ms"]
        if kept:
            res["note"] = (f"the runtime is the fresh-values timing: {fresh['median_ms']:.4g} ms over "
                           f"{fresh['trials']} trials whose inputs were refilled with new values, against "
                           f"{repeated['median_ms']:.4g} ms refilled with the same values (and "
                           f"{cand_stats['median_ms']:.4g} ms on repeated inputs): a result kept by input "
                           f"values is fast only when they repeat")
            fresh["repeated_median_ms"] = repeated["median_ms"]
            fresh["fresh_median_ms"] = fresh["median_ms"]
            cand_stats = fresh
    res["runtime"] = cand_stats
    return cand_stats


ORDER_SPIN_MS = 2.0


def ordering_check(h, task, seed, n, run_candidate, timer, corr):
    """The candidate's work must come after what the caller's stream did before the call, as
    every CUDA caller assumes: its input tensors are written on the caller's stream behind a
    spin of ORDER_SPIN_MS, and forward is called at once; the judge compares the output with
    the reference's on the written values. A forward whose work runs on a stream that does
    not wait for the caller's reads the tensors before they are written. (The timing's head
    start would otherwise let such work run, unseen, before the start event.)"""
    at = protocol.seed_of("ordering", 0, seed, n)
    with h._harness_step("generating inputs"):
        given = h._inputs(task, at + 1)  # what the tensors hold before the write
        values = h._inputs(task, at)
    if _shapes(given) != _shapes(values):
        return  # a task whose inputs change shape with the seed: nothing to overwrite in place
    _cuda_sync(h.device)
    timer.spin(ORDER_SPIN_MS)
    for old, new in zip(given, values):
        if isinstance(old, torch.Tensor):
            old.copy_(new)  # on the caller's stream, behind the spin
    del values
    h._judged("ordering", 0, run_candidate(given), corr)


SIDE_WORK_CALLS = 3
SIDE_WORK_RECHECK_CALLS = 12
SIDE_WORK_MIN_MS = 0.05
SIDE_WORK_FRACTION = 0.1


def side_stream_check(h, task, seed, run_candidate, timer):
    """Work the caller's stream does not wait for is a hack: the caller would read an
    unfinished output. Two checks on calls of the candidate's forward:
    - its output read (an exact digest of every bit) once the caller's stream is done, and
      again once the whole device is done: any difference means it was still being written;
    - how long the device stays busy after the caller's stream is done (side_work): when even
      the shortest of SIDE_WORK_CALLS calls exceeds the host's wake-up after a wait as long
      (Timer's busy tail) by max(SIDE_WORK_MIN_MS, SIDE_WORK_FRACTION of the forward's own
      time), work was left running on another stream. This one sees what the first cannot:
      hidden work that fills the GPU keeps a kernel that reads the output from starting until
      the work is nearly done. A first measurement over the limit is taken again, over
      SIDE_WORK_RECHECK_CALLS calls against the host's wake-up measured anew, and the second
      one stands: hidden work is there in every call, a host that woke late for a moment is
      not (seen on the lent H100: an honest 0.66 ms forward's three calls 0.079 ms over a
      0.066 ms limit, with an idle CUDA process beside it)."""
    with h._harness_step("generating inputs"):
        inputs = h._inputs(task, seed * 1000 + 555)
    out = run_candidate(inputs, sync=False)
    with h._harness_step("reading the candidate's output"):
        torch.cuda.current_stream(h.device).synchronize()
        early = digest(out, h.fused_digest)
        _cuda_sync(h.device)
        late = digest(out, h.fused_digest)
    del out
    if early != late:
        raise Verdict("hacked", "the candidate's output was still being written on another CUDA stream "
                                "after forward returned (work hidden from the caller's stream)")
    hidden, own_ms, limit = side_work(h, inputs, run_candidate, timer, SIDE_WORK_CALLS)
    if hidden <= limit:
        return
    first = hidden
    hidden, own_ms, limit = side_work(h, inputs, run_candidate, timer, SIDE_WORK_RECHECK_CALLS)
    if hidden > limit:
        raise Verdict("hacked", f"the candidate left work running on another CUDA stream after forward "
                                f"returned: the device stayed busy {hidden:.3f} ms after the caller's "
                                f"stream was done, in each of {SIDE_WORK_RECHECK_CALLS} calls (its own "
                                f"stream's work took {own_ms:.3f} ms; {first:.3f} ms in each of the first "
                                f"{SIDE_WORK_CALLS})")


def side_work(h, inputs, run_candidate, timer, calls):
    """How long the device stayed busy after the caller's stream was done, beyond the host's
    wake-up, in the shortest of `calls` calls of forward (an event after forward on the
    current stream; the host waits for it, synchronizes the device, records another). Returns
    (that excess, the forward's own median time, the excess allowed), in ms."""
    own, tails = [], []
    for _ in range(calls):
        start, end, after = (_Event(enable_timing=True) for _ in range(3))
        _cuda_sync(h.device)
        start.record(timer.stream)
        out = run_candidate(inputs, sync=False)
        end.record(timer.stream)
        end.synchronize()  # the caller's stream is done
        _cuda_sync(h.device)
        after.record(timer.stream)
        after.synchronize()
        own.append(start.elapsed_time(end))
        tails.append(end.elapsed_time(after))
        del out
    own_ms = statistics.median(own)
    hidden = min(tails) - timer.busy_tail(own_ms)
    return hidden, own_ms, max(SIDE_WORK_MIN_MS, SIDE_WORK_FRACTION * own_ms)
