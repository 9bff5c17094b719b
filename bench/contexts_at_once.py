"""Do device-wide operations run in parallel on one GPU? N fresh Python processes at once (N = 1,
2, 4, 8) each do one kind of work on device 0, and print the seconds it took inside them (their
torch import and, except for `context`, their context's start-up left out). If the driver did this
work for one process at a time, the inside figures would grow with N.

  context   create the context and run a first matmul (cuBLAS's start-up)
  alloc     --reps times: allocate 1 GiB, touch it, free it and empty PyTorch's cache (cudaMalloc,
            cudaFree: what each candidate's process does once)
  devshare  --reps times: the judge's shared buffer of a session (gpu/devshare.py: cuMemCreate of
            256 MiB, reserve, map, set access, export a descriptor, map it again as the other side
            does, then unmap and release both)

    python3 bench/contexts_at_once.py [--what context,alloc,devshare] [--counts 1,2,4,8] [--reps 10]
                                      [--device 0]     (on the GPU machine)
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

START = ("import sys, time, torch\n"
         "sys.path.insert(0, {gpu!r})\n"
         "t = time.monotonic()\n"
         "torch.cuda.set_device({dev})\n")
WARM = "torch.ones(1, device='cuda').sum().item()\nt = time.monotonic()\n"
WORK = {
    "context": ("x = torch.ones(256, 256, device='cuda')\n"
                "(x @ x).sum().item()\n"),
    "alloc": ("for _ in range({reps}):\n"
              "    x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
              "    x[::1 << 20].fill_(1)\n"
              "    torch.cuda.synchronize()\n"
              "    del x\n"
              "    torch.cuda.empty_cache()\n"),
    "devshare": ("import os\nfrom gpu import devshare\n"
                 "for _ in range({reps}):\n"
                 "    s = devshare.Shared.create(256 << 20, {dev})\n"
                 "    fd = s.export()\n"
                 "    o = devshare.Shared.attach(fd, s.nbytes, {dev})\n"
                 "    os.close(fd)\n"
                 "    o.tensor[:1 << 20].fill_(7)\n"
                 "    torch.cuda.synchronize()\n"
                 "    o.close()\n"
                 "    s.close()\n"),
}


def child(what, dev, reps):
    body = WORK[what].format(reps=reps, dev=dev)
    return START.format(gpu=ROOT, dev=dev) + ("" if what == "context" else WARM) + body + \
        "print(time.monotonic() - t)\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--what", default="context")
    ap.add_argument("--counts", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    for what in a.what.split(","):
        if what not in WORK:
            ap.error(f"--what: no kind of work {what!r} (there are {', '.join(WORK)})")
        per = "" if what == "context" else f" (per repetition, {a.reps} each)"
        for n in (int(x) for x in a.counts.split(",")):
            t0 = time.monotonic()
            procs = [subprocess.Popen([sys.executable, "-c", child(what, a.device, a.reps)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(n)]
            got = [p.communicate() for p in procs]
            inside = []
            for out, err in got:
                try:
                    inside.append(float(out.strip()))
                except ValueError:
                    sys.stderr.write(err[-2000:])
                    inside.append(float("nan"))
            scale = 1 if what == "context" else a.reps
            print(f"[{what}] {n} at once: wall {time.monotonic() - t0:.2f} s; seconds inside each{per}: "
                  + " ".join(f"{x / scale:.4f}" for x in inside), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
