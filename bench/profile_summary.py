"""Where the GPU time of a Chrome trace goes (policy_bench --profile FILE writes one): device kernels
grouped by name, their total and mean time, count and share of the kernel time, largest first.

    python3 bench/profile_summary.py TRACE.json [--top 25] [--json out.json] [--critical]

--critical: under programmatic dependent launch a kernel starts before the one it follows ends (its
duration counts its wait), so durations overlap. This charges each kernel only the time from the
previous kernel's end on its stream to its own end (what it adds to the stream's wall time; the
gaps between kernels go to the kernel after them), grouped by name.
"""
import argparse
import collections
import json


def summary(path, top, critical=False):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total = collections.Counter()
    count = collections.Counter()
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if critical:
        last_end = {}
        for e in sorted(device, key=lambda e: float(e.get("ts", 0))):
            key = (e.get("pid"), e.get("tid"))
            start, end = float(e.get("ts", 0)), float(e.get("ts", 0)) + float(e.get("dur", 0))
            prev = last_end.get(key, start)
            name = e.get("name", "?")
            total[name] += max(0.0, end - prev)
            count[name] += 1
            last_end[key] = max(prev, end)
    else:
        for e in device:
            name = e.get("name", "?")
            total[name] += float(e.get("dur", 0))
            count[name] += 1
    all_us = sum(total.values())
    rows = [{"kernel": k, "total_ms": v / 1e3, "count": count[k], "mean_us": v / count[k],
             "share": v / all_us if all_us else 0} for k, v in total.most_common(top)]
    return {"kernel_ms": all_us / 1e3, "kernels": sum(count.values()), "top": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    ap.add_argument("--critical", action="store_true")
    args = ap.parse_args()
    s = summary(args.trace, args.top, args.critical)
    print("%s: %.2f ms in %d kernels and copies" % (args.trace, s["kernel_ms"], s["kernels"]))
    for r in s["top"]:
        print("%8.3f ms %5.1f%% %7d x %8.2f us  %s" % (r["total_ms"], 100 * r["share"], r["count"], r["mean_us"],
                                                      r["kernel"][:110]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=1)


if __name__ == "__main__":
    main()
