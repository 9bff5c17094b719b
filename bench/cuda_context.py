"""What a candidate's process costs the GPU around its own work, and what other processes' start-ups,
exits and kernels do to a timed region: the figures behind the evaluator's schedule (gpu/worker.py).

Part `lifecycle`: processes forked from a parent that imported torch but never initialised CUDA (as
the worker's fork server), each creating its CUDA context (torch.cuda.set_device and a first tensor),
then cuBLAS (a first matmul), then killed as the worker kills a replied candidate; the parent times
fork to context, the first matmul, and SIGKILL to reaped (the context's teardown). With every GPU of
the machine visible and with CUDA_VISIBLE_DEVICES naming the one GPU.

Part `disturb`: a timed process measures two kernels with CUDA events (a 256 MB copy, memory-bound;
a 4096^3 bf16 matmul, compute-bound), N trials each, synchronised between trials, while beside it
  quiet       nothing runs;
  start-ups   another process forks children that create their context and a 64 MB tensor, in a loop;
  exits       12 such children started before, killed one every 50 ms (contexts torn down);
  kernels     another process runs its own kernels back to back (what time-slicing costs a trial);
  frozen      that process stopped (SIGSTOP) after its last launch, the GPU drained of it.
Each condition prints the median, the CV, the 95th percentile, the largest trial and the share of
trials over 1.5x the median for both kernels, and how many start-ups or exits happened during them.

Part `cross` (a machine of two GPUs or more): what another GPU's evaluator costs this GPU's
candidates. --reps fresh processes on --device, each with its context made first (untimed, as the
worker's spare), time their first calls (new allocations, elementwise, reductions, softmax, cuBLAS,
cuDNN, comparisons, a copy back; each the first of its kind in the process) and the same again,
while on --other nothing runs, contexts start, contexts exit, candidates' lives follow one another
(context, first calls, exit), or kernels run back to back.

Usage: python bench/cuda_context.py [--device 0] [--parts lifecycle,disturb,cross] [--reps 10]
           [--trials 3000] [--other 1] [--json OUT.json]
"""

import argparse
import json
import os
import signal
import statistics
import sys
import time

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
import torch  # noqa: E402  (imported before any fork, never initialising CUDA here)


def _child(fn):
    """Forks a child that runs fn(write) and then waits to be killed; returns (pid, read fd)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn(w)
        except BaseException as e:  # noqa: BLE001
            os.write(w, f"error {type(e).__name__}: {e}\n".encode())
        finally:
            os.close(w)
        while True:
            time.sleep(3600)
    os.close(w)
    return pid, r


def _read_line(fd):
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode().strip()


def _kill(pid):
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return time.monotonic() - t0


def lifecycle_once(device, visible):
    def run(w):
        if visible is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
        t0 = time.monotonic()
        dev = torch.device("cuda", 0 if visible is not None else device)
        torch.cuda.set_device(dev)
        torch.empty(1, device=dev)
        torch.cuda.synchronize()
        t1 = time.monotonic()
        a = torch.ones(64, 64, device=dev)
        (a @ a).sum().item()
        t2 = time.monotonic()
        os.write(w, f"{t1 - t0} {t2 - t1}\n".encode())

    t0 = time.monotonic()
    pid, r = _child(run)
    line = _read_line(r)
    ready = time.monotonic() - t0
    os.close(r)
    teardown = _kill(pid)
    if line.startswith("error") or not line:
        raise RuntimeError(f"child failed: {line}")
    ctx, blas = (float(x) for x in line.split())
    return {"fork_to_ready_s": ready, "context_s": ctx, "cublas_s": blas, "teardown_s": teardown}


def part_lifecycle(args, out):
    n_gpus = torch.cuda.device_count()
    res = {}
    for label, visible in (("all visible", None), ("one visible", str(args.device))):
        rows = [lifecycle_once(args.device, visible) for _ in range(args.reps)]
        summ = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        summ["max_teardown_s"] = max(r["teardown_s"] for r in rows)
        res[label] = summ
        print(f"[lifecycle] {label} ({n_gpus} GPUs on the machine): " + ", ".join(
            f"{k} {1000 * v:.1f} ms" for k, v in summ.items()), flush=True)
    out["lifecycle"] = {"gpus": n_gpus, **res}


def _neighbour(device, kind, w):
    """The neighbour process: kernels back to back, or stopped after its launches."""
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    x @ x
    torch.cuda.synchronize()
    os.write(w, b"ready\n")
    if kind == "frozen":
        for _ in range(20):
            x @ x  # ~20 matmuls in flight, then this process is stopped by the parent
        torch.cuda.synchronize()
        os.write(w, b"launched\n")
        return
    while True:
        x @ x
        torch.cuda.synchronize()


def _churn(device, mode, stop_r, count_w, ready_w):
    """start-ups: forks children that create a context and a 64 MB tensor, one after another, kept
    until the end; exits: 12 such children started first, then killed one every 50 ms."""
    def start(w):
        dev = torch.device("cuda", device)
        torch.cuda.set_device(dev)
        torch.empty(16 << 20, device=dev)
        torch.cuda.synchronize()
        os.write(w, b"up\n")

    def up():
        pid, r = _child(start)
        _read_line(r)
        os.close(r)
        return pid

    def stopped():
        try:
            return bool(os.read(stop_r, 1))
        except BlockingIOError:
            return False

    def firsts():  # a candidate's life: context, first calls, killed
        pid, r = _child(lambda w: _firsts_child(device, w))
        _read_line(r)
        os.close(r)
        _kill(pid)

    kept, n = [], 0
    if mode == "exits":
        kept = [up() for _ in range(12)]
    os.write(ready_w, b"ready\n")
    while not stopped():
        if mode == "start-ups":
            kept.append(up())
            n += 1
        elif mode == "candidates":
            firsts()
            n += 1
        elif kept:
            _kill(kept.pop())
            n += 1
            time.sleep(0.05)
        else:
            time.sleep(0.01)
    for pid in kept:
        _kill(pid)
    os.write(count_w, f"{n}\n".encode())


def _firsts(dev):
    """A candidate's first calls in a fresh process whose context exists (as the worker's spare):
    allocations of new sizes, elementwise, reductions, softmax, cuBLAS, cuDNN, comparisons and a
    copy back, each the first of its kind here (its module loaded lazily, its memory new), each
    synchronised; seconds per step, then the same steps again (what is left once loaded)."""
    def steps():
        x = torch.randn(1 << 20, device=dev)
        yield "alloc_4MB_randn"
        y = torch.empty(64 << 20, device=dev).fill_(1.0)
        yield "alloc_256MB_fill"
        z = torch.relu(x * 2.0 + 1.0)
        yield "elementwise"
        z.sum().item(), z.amax()
        yield "reductions"
        torch.softmax(x.view(1024, 1024), dim=-1)
        yield "softmax"
        a = x.view(1024, 1024)
        a @ a
        yield "matmul"
        torch.nn.functional.conv2d(x.view(1, 16, 256, 256), torch.randn(16, 16, 3, 3, device=dev))
        yield "conv2d"
        (torch.isclose(z, z + 1e-7).all().item(), (z - x).abs().max().item())
        yield "compare"
        y[:1 << 20].cpu()
        yield "copy_back"

    rows = []
    for _ in range(2):
        row, t0 = {}, time.monotonic()
        for name in steps():
            torch.cuda.synchronize()
            t1 = time.monotonic()
            row[name] = t1 - t0
            t0 = t1
        rows.append(row)
    return rows


def _firsts_child(device, w):
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    torch.empty(1, device=dev)
    torch.cuda.synchronize()
    os.write(w, (json.dumps(_firsts(dev)) + "\n").encode())


def _stats(ts):
    ts = sorted(ts)
    med = statistics.median(ts)
    return {"median_ms": med, "cv": statistics.pstdev(ts) / statistics.fmean(ts),
            "p95_ms": ts[int(0.95 * (len(ts) - 1))], "max_ms": ts[-1],
            "slow_share": sum(t > 1.5 * med for t in ts) / len(ts)}


def timed_trials(device, trials, w):
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    src = torch.empty(64 << 20, device=dev)  # 256 MB
    dst = torch.empty_like(src)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    res = {}
    for name, fn in (("copy_256MB", lambda: dst.copy_(src)), ("matmul_4096_bf16", lambda: a @ a)):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(trials):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        res[name] = _stats(ts)
    os.write(w, (json.dumps(res) + "\n").encode())


def disturb(args, condition):
    helpers, count, finish = [], None, None
    if condition == "frozen":
        pid, r = _child(lambda w: _neighbour(args.device, condition, w))
        _read_line(r)
        _read_line(r)
        os.kill(pid, signal.SIGSTOP)
        helpers.append(pid)
    elif condition != "quiet":
        finish = _helper(args.device, condition)
    pid, r = _child(lambda w: timed_trials(args.device, args.trials, w))
    line = _read_line(r)
    os.close(r)
    _kill(pid)
    if finish is not None:
        count = finish()
    for h in helpers:
        os.kill(h, signal.SIGCONT)
        _kill(h)
    if line.startswith("error") or not line:
        raise RuntimeError(f"timed process failed ({condition}): {line}")
    res = json.loads(line)
    if count is not None:
        res["churned"] = count
    return res


def _helper(device, condition):
    """Processes beside the timed ones (parts disturb and cross), started: kernels back to back,
    or start-ups, exits or candidates' lives (_churn). Returns finish(), which ends them and
    returns how many start-ups, exits or lives happened meanwhile (None for kernels)."""
    if condition == "kernels":
        pid, r = _child(lambda w: _neighbour(device, condition, w))
        _read_line(r)
        return lambda: (_kill(pid), None)[1]
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_r, False)
    count_r, count_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(stop_w)
        os.close(count_r)
        os.close(ready_r)
        _churn(device, condition, stop_r, count_w, ready_w)
        os._exit(0)
    os.close(stop_r)
    os.close(count_w)
    os.close(ready_w)
    _read_line(ready_r)
    os.close(ready_r)

    def finish():
        os.write(stop_w, b"x")
        n = int(_read_line(count_r) or 0)
        os.waitpid(pid, 0)
        return n
    return finish


def part_cross(args, out):
    """What another GPU's evaluator costs this GPU's candidates: --reps fresh processes (context
    made first, untimed, as the worker's spare), each timing its first calls (_firsts), while on
    --other nothing runs, contexts start, contexts exit, candidates' lives (context, first calls,
    exit) follow one another, or kernels run back to back."""
    other = args.other if args.other >= 0 else (args.device + 1) % max(1, torch.cuda.device_count())
    res = {"device": args.device, "other": other}
    for cond in ("quiet", "start-ups", "exits", "candidates", "kernels", "quiet"):
        finish = None if cond == "quiet" else _helper(other, cond)
        rows = []
        for _ in range(args.reps):
            pid, r = _child(lambda w: _firsts_child(args.device, w))
            line = _read_line(r)
            os.close(r)
            _kill(pid)
            if line.startswith("error") or not line:
                raise RuntimeError(f"firsts failed ({cond}): {line}")
            rows.append(json.loads(line))
        churned = finish() if finish else None
        first = {k: statistics.median(r[0][k] for r in rows) for k in rows[0][0]}
        again = statistics.median(sum(r[1].values()) for r in rows)
        total = statistics.median(sum(r[0].values()) for r in rows)
        name = cond if cond not in res else cond + " again"
        res[name] = {"first_total_s": total, "again_total_s": again, "first_s": first, "churned": churned}
        print(f"[cross] GPU {args.device} while GPU {other}: {name:14} first calls {1000 * total:.1f} ms "
              f"(again {1000 * again:.1f} ms){'' if churned is None else f', {churned} there during it'}: "
              + " ".join(f"{k} {1000 * v:.1f}" for k, v in first.items()), flush=True)
    out["cross"] = res


def part_disturb(args, out):
    res = {}
    for cond in ("quiet", "start-ups", "exits", "kernels", "frozen", "quiet"):
        r = disturb(args, cond)
        name = cond if cond not in res else cond + " again"
        res[name] = r
        extra = f" ({r['churned']} processes during it)" if "churned" in r else ""
        print(f"[disturb] {name:12}" + "  ".join(
            f"{k}: median {v['median_ms']:.4f} ms cv {100 * v['cv']:.2f}% p95 {v['p95_ms']:.4f} "
            f"max {v['max_ms']:.4f} slow {100 * v['slow_share']:.1f}%"
            for k, v in r.items() if isinstance(v, dict)) + extra, flush=True)
    out["disturb"] = res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--parts", default="lifecycle,disturb")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--trials", type=int, default=3000)
    ap.add_argument("--other", type=int, default=-1, help="part cross: the other GPU (default the next)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if torch.cuda.is_initialized():
        sys.exit("CUDA was initialised before forking")
    out = {}
    for part in args.parts.split(","):
        {"lifecycle": part_lifecycle, "disturb": part_disturb, "cross": part_cross}[part](args, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
