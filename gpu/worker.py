"""kernelrl evaluation worker: one process per evaluator slot, driven over ZeroMQ with msgpack.

The evaluator (gpu/worker_client.cpp) binds a REQ socket and starts this program, which connects
a REP socket and answers one request at a time:

  {"op": "ping"}                                  -> {"ok": true, "pid", "torch_version", "device"}
  {"op": "eval", "request": EvalRequest, "settings": {...}}  -> EvalResult fields (status by name)
  {"op": "exit"}                                  -> {"ok": true}, then the process ends

The evaluator kills this process on a timeout or a crash and starts a new one; nothing here has to
survive a candidate. The process dies with its parent (PR_SET_PDEATHSIG).
"""

import argparse
import ctypes
import os
import signal
import sys
import time
import traceback

import msgpack
import zmq


def die_with_parent():
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="ZeroMQ endpoint bound by the evaluator")
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda:N")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on CPU")
    ap.add_argument("--parent", type=int, default=0, help="pid to watch; exit when it is gone")
    args = ap.parse_args()
    die_with_parent()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    import torch  # noqa: E402  (after PDEATHSIG, so a slow import never outlives the parent)
    from harness import Harness

    harness = Harness(args.device, args.threads)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.endpoint)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)

    while True:
        if not poller.poll(1000):
            if args.parent and os.getppid() != args.parent:
                return 0
            continue
        raw = sock.recv()
        try:
            msg = msgpack.unpackb(raw, raw=False)
            op = msg.get("op")
            if op == "ping":
                reply = {"ok": True, "pid": os.getpid(), "torch_version": torch.__version__,
                         "device": harness.device_name}
            elif op == "eval":
                t0 = time.monotonic()
                reply = harness.evaluate(msg["request"], msg["settings"])
                reply["wall_s"] = time.monotonic() - t0
            elif op == "exit":
                sock.send(msgpack.packb({"ok": True}))
                return 0
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as e:  # a harness bug: report it, keep serving
            reply = {"ok": False, "status": "runtime_error",
                     "error": f"worker error: {type(e).__name__}: {e}",
                     "compile_log": traceback.format_exc()[-65536:]}
        sock.send(msgpack.packb(reply, use_bin_type=True))


if __name__ == "__main__":
    sys.exit(main())
