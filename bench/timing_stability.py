"""Timing stability of the evaluator's GPU timing protocol, against the common harness's.

The same one-kernel operation (SiLU over a 4096 x 16384 fp32 tensor, memory-bound, ~0.2 ms on an
H100) is timed in N separate processes, each forked from a parent that imported torch without
initialising CUDA, exactly as the evaluation worker forks a candidate (gpu/sandbox.py). In each
process every protocol times it three times (50 trials, median), protocols interleaved:

  harness  gpu/harness.py's Timer as the evaluator runs it (events on the stream, the device-wide
           synchronize's tail counted only when work outlasts the stream)
  sync     the Timer's earlier protocol: the end event recorded after a device-wide synchronize
  events   the common harness: L2 flush, synchronize, event, forward, event, synchronize

While the harness protocol runs, NVML is sampled every 5 ms (SM and memory clocks, temperature,
power, clock-event reasons), so a drift can be put down to the GPU's clocks or not.

Printed: each protocol's coefficient of variation of the median across processes (the figure the
issue's target is about: <= 0.5%), and within a process.

Usage: python bench/timing_stability.py [--device cuda:0] [--processes 10] [--json OUT.json]
"""

import argparse
import ctypes
import json
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "gpu"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

import harness  # noqa: E402
import sandbox  # noqa: E402
from baseline_eval import time_events  # noqa: E402  (the common harness's protocol)

TRIALS, WARMUP, REPEATS = 50, 3, 3
PROTOCOLS = ("harness", "sync", "events")


class Nvml:
    """The GPU's clocks, temperature, power and clock-event (throttle) reasons through NVML (the
    driver's libnvidia-ml, by ctypes), sampled every 5 ms in a thread while a measurement runs."""

    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit failed")
        self.h = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)) != 0:
            raise OSError("no NVML handle")

    def read(self):
        v, r = ctypes.c_uint(), ctypes.c_ulonglong()
        out = {}
        for name, clock in (("sm_mhz", 1), ("mem_mhz", 2)):  # NVML_CLOCK_SM, NVML_CLOCK_MEM
            self.lib.nvmlDeviceGetClockInfo(self.h, clock, ctypes.byref(v))
            out[name] = v.value
        self.lib.nvmlDeviceGetTemperature(self.h, 0, ctypes.byref(v))
        out["temp_c"] = v.value
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(v))
        out["power_w"] = v.value / 1000
        self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.h, ctypes.byref(r))
        out["reasons"] = r.value
        return out

    def during(self, fn):
        """fn()'s result and a summary of the samples taken while it ran."""
        samples, stop = [], threading.Event()

        def loop():
            while not stop.is_set():
                samples.append(self.read())
                time.sleep(0.005)

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        try:
            result = fn()
        finally:
            stop.set()
            t.join()
        summ = {k: [min(x[k] for x in samples), max(x[k] for x in samples)]
                for k in ("sm_mhz", "mem_mhz", "temp_c", "power_w")} if samples else {}
        reasons = 0
        for x in samples:
            reasons |= x["reasons"]
        summ["reasons"] = hex(reasons)
        summ["samples"] = len(samples)
        return result, summ


def one_process(device_name):
    device = torch.device(device_name)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    x = torch.randn(4096, 16384, device=device)
    model = torch.nn.SiLU()
    timer = harness.Timer(device)
    sync_timer = harness.Timer(device, protocol="sync")
    out = {k: [] for k in PROTOCOLS}
    out["tail_trials"], out["gpu"] = [], []
    try:
        nvml = Nvml(device.index or 0)
    except OSError:
        nvml = None
    for _ in range(REPEATS):
        if nvml is not None:
            stats, gpu = nvml.during(lambda: timer.run(model, [x], WARMUP, TRIALS))
            out["gpu"].append(gpu)
        else:
            stats = timer.run(model, [x], WARMUP, TRIALS)
        out["harness"].append(stats["median_ms"])
        out["tail_trials"].append(timer.tail_trials)
        out["sync"].append(sync_timer.run(model, [x], WARMUP, TRIALS)["median_ms"])
        out["events"].append(time_events(model, [x], TRIALS, device, flush=timer.flush_buf))
    out["idle_tail_ms"] = timer.idle_tail_ms
    # The same operation on other allocations of the input, all alive at once, interleaved: if
    # the medians follow the allocation rather than the time, placement in memory is the cause.
    xs = [x] + [torch.randn(4096, 16384, device=device) for _ in range(3)]
    out["placement"] = [[], [], [], []]
    for _ in range(2):
        for j, xj in enumerate(xs):
            out["placement"][j].append(timer.run(model, [xj], WARMUP, TRIALS)["median_ms"])
    out["device"] = torch.cuda.get_device_name(device)
    return out


def cv(xs):
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    runs = []
    for i in range(args.processes):
        reply, failure = sandbox.run_isolated(lambda: one_process(args.device), timeout_s=300,
                                              memory_limit_mb=1 << 20, env={}, isolate_net=False,
                                              address_space_limit=False, tmp_root="/tmp")
        if failure:
            raise SystemExit(f"process {i}: {failure}")
        runs.append(reply)
        print(f"process {i}: " + "  ".join(f"{k} {[round(v, 4) for v in reply[k]]}"
                                           for k in PROTOCOLS)
              + f"  idle tail {reply['idle_tail_ms']:.4f} ms, tail-counted trials {reply['tail_trials']}"
              + f"  by allocation {[[round(v, 4) for v in p] for p in reply['placement']]}"
              + (f"  GPU during the harness's runs {reply['gpu']}" if reply["gpu"] else ""),
              flush=True)
    summary = {"device": runs[0]["device"], "processes": args.processes, "trials": TRIALS}
    for k in PROTOCOLS:
        first = [r[k][0] for r in runs]
        within = statistics.fmean(cv(r[k]) for r in runs)
        summary[k] = {"medians_first_ms": first, "cv_across": cv(first), "cv_within_mean": within,
                      "mean_ms": statistics.fmean(first)}
        print(f"{k:8} mean median {statistics.fmean(first):.4f} ms  CV across processes "
              f"{100 * cv(first):.3f}%  CV within a process {100 * within:.3f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
