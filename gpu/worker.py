"""kernelrl evaluation worker: a fork server, one per evaluator stage, driven over ZeroMQ with msgpack.

The evaluator (gpu/worker_client.cpp) binds a REQ socket and starts this program, which connects
a REP socket and answers one request at a time:

  {"op": "ping"}                                   -> {"ok": true, "pid", "torch_version", "device",
                                                       "capability", "cuda_init_s", "network"}
  {"op": "eval", "request": EvalRequest, "settings": {...}}     -> EvalResult fields (status by name)
  {"op": "compile", "request": EvalRequest, "settings": {...}}  -> {"status": ok|compile_error, ...}
  {"op": "exit"}                                   -> {"ok": true}, then the process ends

This process imports torch and loads task files but never initialises CUDA: every candidate runs
in a child forked from it (gpu/sandbox.py), which initialises CUDA for itself, so a crash, a hang,
a memory blow-up, a CUDA fault or a monkeypatched torch ends with that child. Reference timings
measured by children are kept here and inherited by later children. The "compile" op runs the
candidate's module with CUDA hidden so its kernels build into the content-addressed cache
(gpu/compile_cache.py) on a CPU while the GPU stage times another candidate.
"""

import argparse
import fcntl
import os
import shutil
import sys
import time
import traceback

import msgpack
import zmq

# This process must never initialise CUDA (its children could not use it after fork): have
# torch.cuda.is_available() ask NVML instead of the CUDA runtime.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


# Device memory a replied candidate's process may still hold (its allocator's bookkeeping) for
# its exit to overlap the next candidate; above it the worker waits for the exit first.
HELD_AFTER_REPLY = 64 << 20


def default_cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kernelrl", "build-cache")


class ForkServer:
    """The worker's logic without the socket: usable from Python tests and benchmarks."""

    def __init__(self, device="cpu", threads=1, cache_root=None, tmp_root=None, isolate_net=True):
        import torch  # noqa: F401  (imported once here, inherited by every child)
        import sandbox
        from harness import Harness
        # cpp_extension asks torch.cuda.is_available() when imported; with the NVML-based check
        # that creates no CUDA context, so children inherit the import instead of paying for it.
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
            import compile_cache  # noqa: F401
        if torch.cuda.is_initialized():
            raise RuntimeError("the worker initialised CUDA before forking candidates (its children "
                               "could not use the GPU); is PYTORCH_NVML_BASED_CUDA_CHECK=1 honoured?")
        self.torch = torch
        self.sandbox = sandbox
        self.device = device
        self.cache_root = cache_root or default_cache_root()
        self.tmp_root = tmp_root or os.environ.get("TMPDIR", "/tmp")
        self.isolate_net = isolate_net
        self.spare = None
        self.warm_lock = os.path.join(self.tmp_root, f"kernelrl-warm-{os.getpid()}-{id(self)}.lock")
        # Held while a candidate's process that already replied is still exiting (see _defer_exit).
        self.exit_lock = os.path.join(self.tmp_root, f"kernelrl-exit-{os.getpid()}-{id(self)}.lock")
        self.exit_lock_file = None
        self.exiting = []  # (pid, tmpdir) killed after their reply, not yet reaped
        self.harness = Harness(device, threads, self.cache_root)
        self.info = {"device": "cpu", "capability": "", "cuda_init_s": 0.0, "network": ""}
        self.env = {}
        self._probe()

    def _probe(self):
        """Learns the device's name and architecture in a child (this process stays CUDA-free)."""
        torch = self.torch
        dev = self.device

        def probe():
            t0 = time.monotonic()
            if dev.startswith("cuda"):
                d = torch.device(dev)
                torch.cuda.set_device(d)
                torch.empty(1, device=d)
                cap = torch.cuda.get_device_capability(d)
                return {"status": "ok", "device": torch.cuda.get_device_name(d),
                        "capability": f"{cap[0]}.{cap[1]}", "cuda_init_s": time.monotonic() - t0}
            return {"status": "ok", "device": "cpu", "capability": "", "cuda_init_s": 0.0}

        reply, failure = self.sandbox.run_isolated(
            probe, timeout_s=120, memory_limit_mb=0, env={}, isolate_net=self.isolate_net,
            address_space_limit=False, tmp_root=self.tmp_root)
        if failure or "device" not in reply:
            why = (failure or reply).get("error", "no reply")
            raise RuntimeError(f"device probe on {dev} failed: {why} {(reply or {}).get('compile_log', '')}")
        self.info = {k: reply[k] for k in ("device", "capability", "cuda_init_s")}
        self.info["network"] = reply.get("isolation", {}).get("network", "")
        self.harness.device_name = self.info["device"]
        if self.info["capability"]:
            # Builds target exactly this GPU (and the compile key records it).
            self.env["TORCH_CUDA_ARCH_LIST"] = self.info["capability"]

    def ping(self):
        return {"ok": True, "pid": os.getpid(), "torch_version": self.torch.__version__, **self.info}

    def _limits(self, req, s, compile_stage):
        from scaffold import declares_build
        limit = float(s.get("timeout_s", 60))
        builds = declares_build(req.get("action", ""))
        if compile_stage:
            limit = float(s.get("compile_timeout_s", 600))
        elif builds and not s.get("precompiled", False):
            limit += float(s.get("compile_timeout_s", 600))
        return limit

    def _spawn(self, key, env, memory_limit_mb, cpu):
        def warm():
            self.harness._setup_device()

        def handler(msg):
            self.harness.ref_cache.update(msg.get("ref_cache") or {})
            return self.harness.evaluate(msg["request"], msg["settings"])

        return self.sandbox.Spare(handler=handler, warm=warm, key=key, env=env,
                                  isolate_net=self.isolate_net, address_space_limit=cpu,
                                  memory_limit_mb=memory_limit_mb, tmp_root=self.tmp_root,
                                  lock_path=self.warm_lock,
                                  close_fds=[self.exit_lock_file.fileno()] if self.exit_lock_file else [])

    def _defer_exit(self, pid, tmpdir):
        """The candidate replied: its process exits (tearing its CUDA context down) while the
        next candidate starts; the exit lock keeps that next candidate from timing until it is
        reaped."""
        self.exiting.append((pid, tmpdir))
        if self.exit_lock_file is None:
            f = open(self.exit_lock, "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a process still holds it shared: do not defer
                f.close()
                self._reap(block=True)
                return
            self.exit_lock_file = f

    def _reap(self, block=False):
        left = []
        for pid, tmpdir in self.exiting:
            try:
                done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                shutil.rmtree(tmpdir, ignore_errors=True)
            else:
                left.append((pid, tmpdir))
        self.exiting = left
        if not left and self.exit_lock_file is not None:
            self.exit_lock_file.close()  # releases the lock
            self.exit_lock_file = None

    def evaluate(self, req, s):
        """One candidate in its own process. The process comes from a spare forked and warmed up
        (CUDA context) while the previous candidate ran; the next spare is forked as soon as this
        one has its request."""
        t0 = time.monotonic()
        env = dict(self.env)
        if s.get("cuda_arch"):
            env["TORCH_CUDA_ARCH_LIST"] = s["cuda_arch"]
        env["KERNELRL_WARM_LOCK"] = self.warm_lock
        env["KERNELRL_EXIT_LOCK"] = self.exit_lock
        self._reap()
        cpu = not self.device.startswith("cuda")
        mem = int(s.get("memory_limit_mb", 0))
        key = (tuple(sorted(env.items())), mem, cpu)
        msg = {"request": req, "settings": s, "ref_cache": self.harness.ref_cache}
        spare, self.spare = self.spare, None
        warm = spare is not None and spare.key == key and spare.send(msg)
        if spare is not None and not warm:
            spare.discard()
        if warm:
            self.spare = self._spawn(key, env, mem, cpu)  # warms up while this candidate runs
        else:
            spare = self._spawn(key, env, mem, cpu)
            if not spare.send(msg):
                spare.discard()
                spare = None
        if spare is None:
            reply, failure = None, {"status": "runtime_error", "error": "the candidate's process could not start"}
        else:
            reply, failure = spare.collect(self._limits(req, s, False), on_poll=self._reap,
                                           defer_exit=self._defer_exit)
            if reply and not cpu and not 0 <= reply.get("gpu_held_bytes", -1) <= HELD_AFTER_REPLY:
                # Its process still holds device memory after freeing what the evaluation
                # allocated (a candidate's global tensors, a faulted context): the next candidate
                # must find the GPU's memory free, so wait for this one's exit.
                self._reap(block=True)
        if self.spare is None:
            self.spare = self._spawn(key, env, mem, cpu)  # ready for the next candidate
        from harness import empty_result
        full = empty_result(self.info["device"])
        if failure:
            full.update({k: failure[k] for k in ("status", "error")})
            full["isolation"] = failure.get("isolation", {})
        else:
            full.update(reply)  # a reply from the child's last-resort handler lacks most fields
        reply = full
        for k, v in (reply.pop("ref_cache_put", None) or {}).items():
            self.harness.ref_cache[k] = v
        reply["wall_s"] = time.monotonic() - t0
        return reply

    def close(self):
        """Ends the spare process (it also ends with this process) and removes its lock file."""
        if self.spare is not None:
            self.spare.discard()
            self.spare = None
        self._reap(block=True)
        for path in (self.warm_lock, self.exit_lock):
            try:
                os.remove(path)
            except OSError:
                pass

    def compile(self, req, s):
        t0 = time.monotonic()
        env = dict(self.env)
        env["CUDA_VISIBLE_DEVICES"] = ""  # the compile stage never touches a GPU
        if s.get("cuda_arch"):
            env["TORCH_CUDA_ARCH_LIST"] = s["cuda_arch"]
        reply, failure = self.sandbox.run_isolated(
            lambda: self.harness.prepare(req, s),
            timeout_s=self._limits(req, s, True), memory_limit_mb=int(s.get("memory_limit_mb", 0)),
            env=env, isolate_net=self.isolate_net, address_space_limit=False, tmp_root=self.tmp_root)
        if failure:
            reply = {"status": "compile_error" if failure["status"] == "timeout" else "ok",
                     "error": "build " + failure["error"], "compile_log": ""}
        reply["wall_s"] = time.monotonic() - t0
        return reply


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="ZeroMQ endpoint bound by the evaluator")
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda:N")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on CPU")
    ap.add_argument("--parent", type=int, default=0, help="pid to watch; exit when it is gone")
    ap.add_argument("--cache", default="", help="build cache folder (default ~/.cache/kernelrl/build-cache)")
    ap.add_argument("--no-netns", action="store_true", help="do not isolate candidates' network")
    args = ap.parse_args()
    import sandbox
    sandbox.die_with_parent()

    server = ForkServer(args.device, args.threads, args.cache or None, isolate_net=not args.no_netns)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(args.endpoint)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)

    while True:
        if not poller.poll(1000):
            if args.parent and os.getppid() != args.parent:
                server.close()
                return 0
            continue
        raw = sock.recv()
        try:
            msg = msgpack.unpackb(raw, raw=False)
            op = msg.get("op")
            if op == "ping":
                reply = server.ping()
            elif op == "eval":
                reply = server.evaluate(msg["request"], msg["settings"])
            elif op == "compile":
                reply = server.compile(msg["request"], msg["settings"])
            elif op == "exit":
                sock.send(msgpack.packb({"ok": True}))
                server.close()
                return 0
            else:
                reply = {"ok": False, "status": "runtime_error", "error": f"unknown op {op!r}"}
        except Exception as e:  # a harness bug: report it, keep serving
            reply = {"ok": False, "status": "runtime_error",
                     "error": f"worker error: {type(e).__name__}: {e}",
                     "compile_log": traceback.format_exc()[-65536:]}
        sock.send(msgpack.packb(reply, use_bin_type=True))


if __name__ == "__main__":
    sys.exit(main())
