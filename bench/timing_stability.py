"""Timing stability of the evaluator's GPU timing protocol, against the common harness's and
KernelBench's own.

The operation timed is SiLU over a 4096 x 16384 fp32 tensor (memory-bound, ~0.2 ms on an H100),
or with --kernelbench DIR --problems 1/12,1/7,... the reference Model of those KernelBench
problems at their own sizes. It is timed in N separate processes, each forked from a parent that
imported torch without initialising CUDA, exactly as the evaluation worker forks a candidate
(gpu/sandbox.py). In each process every protocol times it once in every position of the order
(50 trials, median; a Latin square shifted per process, since the GPU warms over a process's runs):

  head     gpu/timing.py's Timer as the evaluator runs it: flush, a spin kernel as head start,
           events on the stream, the device-wide synchronize's tail counted only when work
           outlasts the stream
  notail   the same without the tail rule (start->end always): what the tail rule costs
  presync  the Timer's previous protocol: a synchronize between the flush and the start event, so
           the host's launch latency lands inside every trial
  sync     the end event recorded after a device-wide synchronize
  events   the common harness: L2 flush, synchronize, event, forward, event, synchronize
  kb       KernelBench's time_execution_with_cuda_event from the checkout given (--kernelbench)

While the head protocol runs, NVML is sampled every 5 ms (SM and memory clocks, temperature,
power, clock-event reasons), so a drift can be put down to the GPU's clocks or not.

Printed: per protocol, the coefficient of variation across processes of each process's mean
median, the mean CV within a process, and the mean median; with the problems, one table each.

Usage: python bench/timing_stability.py [--device cuda:0] [--processes 10] [--json OUT.json]
                                        [--kernelbench DIR --problems 1/12,1/7]
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
sys.path.insert(0, ROOT)  # for the gpu package
sys.path.insert(0, os.path.join(ROOT, "bench"))

import torch  # noqa: E402

from gpu import harness  # noqa: E402
from gpu import sandbox  # noqa: E402
from baseline_eval import time_events  # noqa: E402  (the common harness's protocol)
from kb_import import import_kernelbench, problem_file  # noqa: E402

TRIALS, WARMUP = 50, 3
PROTOCOLS = ("head", "notail", "presync", "sync", "events")


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


def load_problem(kb_dir, problem):
    """(name, model, inputs) of a KernelBench problem "LEVEL/NUMBER" at its own sizes, on the GPU."""
    level, number = problem.split("/")
    path = problem_file(kb_dir, int(level), int(number))
    ns = {}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    torch.manual_seed(42)
    with torch.device("cuda"):
        model = ns["Model"](*ns["get_init_inputs"]()).eval()
        inputs = ns["get_inputs"]()
    return os.path.basename(path)[:-3], model.cuda(), [x.cuda() if isinstance(x, torch.Tensor) else x for x in inputs]


def kb_timer(kb_dir):
    """KernelBench's own per-trial timing function, imported from the checkout."""
    return import_kernelbench(kb_dir)[1].time_execution_with_cuda_event


def one_process(device_name, kb_dir="", problem="", rotation=0):
    device = torch.device(device_name)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    if problem:
        _, model, inputs = load_problem(kb_dir, problem)
    else:
        model, inputs = torch.nn.SiLU(), [torch.randn(4096, 16384, device=device)]
    timers = {"head": harness.Timer(device), "notail": harness.Timer(device, count_tail=False),
              "presync": harness.Timer(device, protocol="presync"),
              "sync": harness.Timer(device, protocol="sync")}
    kb = kb_timer(kb_dir) if kb_dir else None
    protocols = PROTOCOLS + (("kb",) if kb else ())
    out = {k: [] for k in protocols}
    out["tail_trials"], out["tails"], out["gpu"] = [], [], []
    try:
        nvml = Nvml(device.index or 0)
    except OSError:
        nvml = None
    runners = {name: (lambda t=timer: t.run(model, inputs, WARMUP, TRIALS)["median_ms"])
               for name, timer in timers.items()}
    runners["events"] = lambda: time_events(model, inputs, TRIALS, device, flush=timers["head"].flush_buf)
    if kb:
        runners["kb"] = lambda: statistics.median(kb(model, inputs, num_warmup=3, num_trials=TRIALS,
                                                     discard_first=1, verbose=False, device=device))
    with torch.no_grad():
        # Each protocol takes every position of the order once (a Latin square, shifted per
        # process): the GPU warms over a process's runs, and a fixed order would credit the
        # protocols that run first with its cooler state.
        for r in range(len(protocols)):
            for j in range(len(protocols)):
                name = protocols[(j + r + rotation) % len(protocols)]
                if name == "head" and nvml is not None:
                    median, gpu = nvml.during(runners[name])
                    out["gpu"].append(gpu)
                else:
                    median = runners[name]()
                out[name].append(median)
                if name == "head":
                    t = timers["head"]
                    out["tail_trials"].append(t.tail_trials)
                    out["tails"].append({"median_ms": statistics.median(t.tails), "max_ms": max(t.tails),
                                         "busy_ms": t.busy_tail_ms, "counted": t.tail_counted})
    out["idle_tail_ms"] = statistics.median(timers["head"]._tail_after(0) for _ in range(21))
    out["protocols"] = list(protocols)
    out["device"] = torch.cuda.get_device_name(device)
    return out


def cv(xs):
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--kernelbench", default="", help="a KernelBench checkout (its problems, its timing)")
    ap.add_argument("--problems", default="", help="LEVEL/NUMBER,... of KernelBench problems to time")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    problems = [p for p in args.problems.split(",") if p] or [""]
    if problems != [""] and not args.kernelbench:
        raise SystemExit("--problems needs --kernelbench DIR")
    report = {}
    for problem in problems:
        runs = []
        for i in range(args.processes):
            reply, failure = sandbox.run_isolated(lambda: one_process(args.device, args.kernelbench, problem, i),
                                                  timeout_s=300, memory_limit_mb=1 << 20, env={},
                                                  isolate_net=False, address_space_limit=False, tmp_root="/tmp")
            if failure:
                raise SystemExit(f"{problem or 'silu'} process {i}: {failure}")
            runs.append(reply)
            print(f"{problem or 'silu'} process {i}: "
                  + "  ".join(f"{k} {[round(v, 4) for v in reply[k]]}" for k in reply["protocols"])
                  + f"  idle tail {reply['idle_tail_ms']:.4f} ms, trials over the busy tail {reply['tail_trials']}, "
                    f"tails (median/max/busy ms, counted) "
                    f"{[(round(t['median_ms'], 4), round(t['max_ms'], 4), round(t['busy_ms'], 4), t['counted']) for t in reply['tails']]}"
                  + (f"  GPU during head {reply['gpu'][0]}" if reply["gpu"] else ""), flush=True)
        summary = {"device": runs[0]["device"], "processes": args.processes, "trials": TRIALS}
        print(f"== {problem or 'silu 4096x16384'} on {runs[0]['device']}")
        for k in runs[0]["protocols"]:
            per_process = [statistics.fmean(r[k]) for r in runs]  # over every position of the order
            within = statistics.fmean(cv(r[k]) for r in runs)
            summary[k] = {"process_means_ms": per_process, "cv_across": cv(per_process),
                          "cv_within_mean": within, "mean_ms": statistics.fmean(per_process)}
            print(f"{k:8} mean median {statistics.fmean(per_process):.4f} ms  CV across processes "
                  f"{100 * cv(per_process):.3f}%  CV within a process {100 * within:.3f}%")
        report[problem or "silu"] = {"summary": summary, "runs": runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
