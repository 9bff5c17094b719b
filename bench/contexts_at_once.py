"""Do CUDA contexts start in parallel on one GPU? N fresh Python processes at once (N = 1, 2, 4,
8), each creating its context on device 0 and running a first matmul (cuBLAS's start-up), then
exiting: the wall of the N, and the seconds each spent on its context and first matmul (its
torch import left out). If the driver created contexts one at a time, the inside figures would
grow with N.

    python3 bench/contexts_at_once.py [--counts 1,2,4,8] [--device 0]     (on the GPU machine)
"""
import argparse
import subprocess
import sys
import time

CHILD = ("import torch, time\n"
         "t = time.monotonic()\n"
         "torch.cuda.set_device({dev})\n"
         "x = torch.ones(256, 256, device='cuda')\n"
         "(x @ x).sum().item()\n"
         "print(time.monotonic() - t)\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="1,2,4,8")
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    for n in (int(x) for x in a.counts.split(",")):
        t0 = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", CHILD.format(dev=a.device)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True) for _ in range(n)]
        inside = [float(p.communicate()[0].strip() or "nan") for p in procs]
        print(f"{n} at once: wall {time.monotonic() - t0:.2f} s; context and first matmul inside each: "
              + " ".join(f"{x:.2f}" for x in inside), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
