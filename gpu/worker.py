"""kernelrl evaluation worker: a fork server, one per evaluator stage, driven over ZeroMQ with msgpack.

The evaluator (gpu/worker_client.cpp) binds a REQ socket and starts this program, which connects
a REP socket and answers one request at a time:

  {"op": "ping"}                                   -> {"ok": true, "pid", "torch_version", "device",
                                                       "capability", "cuda_init_s", "network"}
  {"op": "eval", "request": EvalRequest, "settings": {...}}     -> EvalResult fields (status by name)
  {"op": "compile", "request": EvalRequest, "settings": {...}}  -> {"status": ok|compile_error, ...}
  {"op": "exit"}                                   -> {"ok": true}, then the process ends

This process imports torch and loads task files but never initialises CUDA: every candidate runs
in a child forked from it (gpu/sandbox.py), confined (namespaces, a read-only view of the files
with the home folder, the cache and this worker's scratch hidden, an unprivileged uid, a scrubbed
environment), which initialises CUDA for itself, so a crash, a hang, a memory blow-up, a CUDA
fault or a monkeypatched torch ends with that child. Only trusted code decides: the judge
(gpu/judge.py), a process of its own that runs no candidate code, holds the reference, compares
every check's outputs the candidate's process ships to it, and times the reference (cached here
per task, size, mode and trials); a reply is `ok` only when the judge saw every check pass, and
the speedup is computed here from the judge's timing and the candidate's own measurements;
nothing a candidate's process replies reaches another candidate. Kernel builds are asked of this
process over a channel and run in a confined builder (gpu/compile_cache.py). The "compile" op runs
the candidate's module with CUDA hidden so its kernels build on a CPU while the GPU stage times
another candidate.
"""

import argparse
import fcntl
import gc
import hashlib
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback

import msgpack
import zmq

# This process must never initialise CUDA (its children could not use it after fork): have
# torch.cuda.is_available() ask NVML instead of the CUDA runtime.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__" and not __package__:
    # Started as a program (`python gpu/worker.py`, as the evaluator starts it): the modules beside
    # it are the gpu package's, imported by their package names only (never also as top-level
    # modules of this folder, which would make second copies that the watch does not freeze).
    # (Python put the script's folder there resolved; HERE may name it through a symlink.)
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != os.path.realpath(HERE)]
    sys.path.insert(0, os.path.dirname(HERE))
    import gpu  # noqa: E402,F401
    __package__ = "gpu"


# Device memory a replied candidate's process may still hold (its allocator's bookkeeping) for
# its exit to overlap the next candidate; above it the worker waits for the exit first.
HELD_AFTER_REPLY = 64 << 20


# Top-level folders that hold the system's own software, configuration and kernel interfaces.
# Every other folder at / (home folders, /mnt, /srv, data disks, a workspace holding other runs)
# is covered for candidates, and what they need from it put back read-only.
SYSTEM_FOLDERS = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt", "var", "dev", "proc",
                  "sys", "run", "tmp", "snap", "nix", "gnu"}
# Under the system's folders, what holds secrets or other users' sessions.
PRIVATE_SYSTEM_FOLDERS = ("/run/secrets", "/run/user")


def beyond_the_system():
    """What a candidate is not shown at / (folders and files), and the system's private folders."""
    try:
        names = sorted(os.listdir("/"))
    except OSError:
        names = []
    return ["/" + n for n in names if n not in SYSTEM_FOLDERS] + [p for p in PRIVATE_SYSTEM_FOLDERS
                                                                  if os.path.isdir(p)]


def toolchain_paths():
    """Folders the compilers and libraries live in, as the environment names them (CUDA_HOME,
    CUDA_PATH, LD_LIBRARY_PATH, PATH): put back where they lie outside the system's folders."""
    paths = [os.environ.get(k, "") for k in ("CUDA_HOME", "CUDA_PATH")]
    for k in ("LD_LIBRARY_PATH", "PATH"):
        paths += os.environ.get(k, "").split(":")
    home = os.path.abspath(os.path.expanduser("~"))
    return [p for p in paths if p and os.path.isabs(p) and os.path.isdir(p) and os.path.abspath(p) not in ("/", home)]


def default_cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kernelrl", "build-cache")


class _Marks:
    """Seconds between successive marks, summed by name."""

    def __init__(self, t0):
        self.t, self.phases = t0, {}

    def __call__(self, name):
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now


class ForkServer:
    """The worker's logic without the socket: usable from Python tests and benchmarks."""

    def __init__(self, device="cpu", threads=1, cache_root=None, tmp_root=None, isolate_net=True, hide=(),
                 lock_dir=None, shared_dir=None):
        import torch  # noqa: F401  (imported once here, inherited by every child)
        from . import sandbox
        from .harness import Harness
        # cpp_extension asks torch.cuda.is_available() when imported; with the NVML-based check
        # that creates no CUDA context, so children inherit the import instead of paying for it.
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1":
            from . import compile_cache  # noqa: F401
        if torch.cuda.is_initialized():
            raise RuntimeError("the worker initialised CUDA before forking candidates (its children "
                               "could not use the GPU); is PYTORCH_NVML_BASED_CUDA_CHECK=1 honoured?")
        self.torch = torch
        self.sandbox = sandbox
        self.device_given = device  # (as the user named it: in messages)
        device, self.visible = device_view(device)
        self.device = device
        self.cache_root = cache_root or default_cache_root()
        self.tmp_root = tmp_root or os.environ.get("TMPDIR", "/tmp")
        self.isolate_net = isolate_net
        # What candidates may see: the system's folders, and read-only the Python installation,
        # this code, the build cache and the toolchain; not the home folder, anything else at /
        # (other runs' folders wherever they are), this worker's scratch folder (locks, socket)
        # or the run's folders (hide).
        home = os.path.expanduser("~")
        # (Of the source tree only gpu/: the folder above it is on sys.path for the package, and
        # may hold other runs' folders.)
        keep = ([sys.prefix, sys.base_prefix, HERE, self.cache_root]
                + [p for p in sys.path
                   if p and os.path.isdir(p) and os.path.realpath(p) != os.path.realpath(os.path.dirname(HERE))]
                + toolchain_paths())
        hidden = [home, "/root", self.tmp_root] + beyond_the_system() + list(hide) + ([shared_dir] if shared_dir else [])
        self.conf = sandbox.Confinement(enabled=isolate_net, hide=hidden,
                                        expose=sorted(set(os.path.abspath(p) for p in keep)))
        os.makedirs(os.path.join(self.cache_root, ".staging"), exist_ok=True)
        self.spare = None
        self.judge = None  # the trusted judge's process (gpu/judge.py), started at the first evaluation
        self.bandwidth = None  # the device's measured bandwidth and cache (Harness.measure_bandwidth)
        from .shared_timings import SharedTimings
        self.shared = SharedTimings(shared_dir)  # the references' timings, shared with the launch's other workers
        self.exit_hold = False  # the device's lock held shared while a replied candidate exits (_defer_exit)
        self.exiting = []  # (pid, tmpdir) killed after their reply, not yet reaped (by self.reaper)
        self.exits = threading.Condition()  # guards exiting and exit_hold
        self.reaper = None  # the thread that reaps them (_reaper), started at the first such exit
        self.harness = Harness(device, threads, self.cache_root)
        self.build_timeout_s = 600.0
        self.info = {"device": "cpu", "capability": "", "cuda_init_s": 0.0, "network": "", "sandbox": ""}
        self.env = dict(self.visible)
        sandbox.cgroups.setup()
        self._probe()
        # The device's share with this machine's other workers (gpu/devlock.py): its identity, so
        # workers that number GPUs differently find the same lock.
        from . import devlock
        self.lock_path, self.gate_path = devlock.paths(self.info.get("uuid") or "cpu", lock_dir)
        self.lock_fd = devlock.open_file(self.lock_path)
        os.close(devlock.open_file(self.gate_path))  # (created by the worker: candidates open it by path)
        # The device's memory among its workers: an evaluation that ran out of memory beside
        # another worker's is evaluated again with the memory to itself (evaluate, "alone").
        self.memory = (devlock.MemoryShare(self.info.get("uuid") or "cpu", lock_dir)
                       if self.device.startswith("cuda") else None)
        # Everything imported so far (torch's hundreds of thousands of objects) is left out of
        # every later collection, here and in each forked child: the collections that free an
        # evaluation's tensors then take milliseconds, not a tenth of a second.
        gc.freeze()

    def _probe(self):
        """Learns the device's name and architecture in a child (this process stays CUDA-free)."""
        torch = self.torch
        dev = self.device

        exposed = list(self.conf.expose)

        def probe():
            # What a candidate needs must be within its reach as the user it runs as: without a
            # private file view (no namespaces), a folder under a 0700 home is not.
            blocked = [p for p in exposed if not os.access(p, os.R_OK | os.X_OK)]
            if not os.access(".", os.W_OK | os.X_OK):
                blocked.append(os.getcwd() + " (its temp dir, to write)")
            if blocked:
                shown = ", ".join(blocked[:4]) + (f" and {len(blocked) - 4} more" if len(blocked) > 4 else "")
                return {"status": "runtime_error", "blocked": blocked,
                        "error": f"a candidate's process (running as uid {os.getuid()}) cannot reach {shown}"}
            t0 = time.monotonic()
            if dev.startswith("cuda"):
                d = torch.device(dev)
                torch.cuda.set_device(d)
                torch.empty(1, device=d)
                cap = torch.cuda.get_device_capability(d)
                uuid = str(getattr(torch.cuda.get_device_properties(d), "uuid", "") or "")
                from . import fused_check
                cubins = {p: list(fused_check.cubin(p, f"{cap[0]}{cap[1]}")) for p in fused_check.programs()}
                return {"status": "ok", "device": torch.cuda.get_device_name(d), "cubins": cubins,
                        "capability": f"{cap[0]}.{cap[1]}", "cuda_init_s": time.monotonic() - t0,
                        "uuid": "gpu-" + (uuid or f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}-{dev}")}
            return {"status": "ok", "device": "cpu", "capability": "", "cuda_init_s": 0.0, "uuid": "cpu"}

        reply, failure = self.sandbox.run_isolated(
            probe, timeout_s=120, memory_limit_mb=0, env=dict(self.visible), conf=self.conf,
            address_space_limit=False, tmp_root=self.tmp_root)
        if reply and reply.get("blocked"):
            iso = reply.get("isolation", {})
            raise RuntimeError(
                f"the sandbox cannot run candidates here: {reply['error']} (namespaces: "
                f"{iso.get('namespaces', '?')}; user: {iso.get('user', '?')}). Where the kernel refuses "
                f"namespaces (a container's default seccomp profile), candidates run as that user on "
                f"this machine's own files: put the Python environment and the build cache where all "
                f"may read them (KERNELRL_CACHE and XDG_CACHE_HOME outside /root, as the Dockerfile "
                f"does), or allow namespaces (docker run --privileged)")
        if failure or "device" not in reply:
            why = (failure or reply).get("error", "no reply")
            raise RuntimeError(f"device probe on {self.device_given} failed: {why} "
                               f"{(reply or {}).get('compile_log', '')}")
        self.info = {k: reply[k] for k in ("device", "capability", "cuda_init_s", "uuid")}
        iso = reply.get("isolation", {})
        self.info["network"] = iso.get("network", "")
        self.info["sandbox"] = ", ".join(f"{k}: {iso.get(k, '?')}"
                                         for k in ("namespaces", "files", "user", "cgroup", "seccomp"))
        self.harness.device_name = self.info["device"]
        if self.info["capability"]:
            # Builds target exactly this GPU (and the compile key records it).
            self.env["TORCH_CUDA_ARCH_LIST"] = self.info["capability"]
            # The judge's one-pass comparison and the side-stream check's digest, compiled by the
            # probe (NVRTC initialises the CUDA driver, which a process that forks CUDA users
            # must not): the judge and every candidate's process inherit them and only load them.
            from . import fused_check
            for program in fused_check.programs():
                binary, why = (reply.get("cubins") or {}).get(program) or (None, "the probe did not compile it")
                fused_check.keep_cubin(program, self.info["capability"], binary or None, why)

    def ping(self):
        return {"ok": True, "pid": os.getpid(), "torch_version": self.torch.__version__, **self.info}

    def _limits(self, req, s, compile_stage):
        from .scaffold import declares_build
        limit = float(s.get("timeout_s", 60))
        builds = declares_build(req.get("action", ""))
        if compile_stage:
            limit = float(s.get("compile_timeout_s", 600))
        elif builds and not s.get("precompiled", False):
            limit += float(s.get("compile_timeout_s", 600))
        return limit

    def _spawn(self, key, env, memory_limit_mb, cpu):
        def warm():
            self.harness._setup_device(candidate=True)

        def handler(msg):
            self.harness.given_ref = msg.get("ref") or {}
            self.harness.given_bound = msg.get("bound") or {}
            return self.harness.evaluate(msg["request"], msg["settings"])

        return self.sandbox.Spare(handler=handler, warm=warm, key=key, env=env,
                                  conf=self.conf, service=lambda r: self._serve(r, env),
                                  address_space_limit=cpu,
                                  memory_limit_mb=memory_limit_mb, tmp_root=self.tmp_root,
                                  lock_path=self.lock_path, judge_link=True)

    def _judge_process(self, env):
        """The worker's judge (gpu/judge.py), started again if it is gone."""
        from . import judge
        if self.judge is not None and not self.judge.alive():
            self.judge.stop()
            self.judge = None
        if self.judge is None:
            self.judge = judge.JudgeProcess(harness=self.harness, conf=self.conf, env=env, tmp_root=self.tmp_root)
        return self.judge

    def _hand_over(self, spare, msg, env):
        """Starts the judge's session on spare's link, then gives spare the request. Returns
        whether spare has it (when not, spare is gone and the judge's session drained)."""
        judge = self._judge_process(env)
        if not judge.begin(msg["request"], msg["settings"], spare.link):
            judge.stop()
            self.judge = None
            spare.discard()
            return False
        spare.close_link()
        if not spare.send(msg):
            if judge.finish(float(msg["settings"].get("timeout_s", 60))) is None:
                self.judge = None
            return False
        return True

    @staticmethod
    def _decide(full, verdict):
        """The status, from the candidate's process's reply and the judge's verdict. Only the
        judge says a candidate is correct: a reply of ok stands only when the judge saw every
        check of the protocol pass. A failure the candidate's process reports stands (it can
        only hurt itself), as does hacked from its own defenses."""
        if verdict is None:
            if full["status"] == "ok":
                full.update(status="runtime_error", speedup=0.0,
                            error="the judge gave no verdict (its process failed or hung); no verdict on the candidate")
            return full
        full["correctness"] = dict(full.get("correctness") or {}, **verdict.get("correctness", {}))
        full["judge_phases"] = verdict.get("phases", {})
        # The reference's outputs the judge computed for this candidate, those it had from the
        # task's earlier candidates (judge.ReferenceCache), and the checks whose reference output
        # was ready before the candidate's came (judge._prepare).
        full["judge_reference"] = {"runs": int(verdict.get("reference_runs", 0)),
                                   "reused": int(verdict.get("reference_reused", 0)),
                                   "ahead": int(verdict.get("reference_ahead", 0))}
        js, cs = verdict.get("status"), full.get("status")
        if cs == "hacked":
            return full
        if js in ("incorrect", "hacked") or (cs == "ok" and js in ("runtime_error", "out_of_memory")):
            full.update(status=js, error=verdict.get("error", ""), speedup=0.0)
        elif cs == "ok" and js == "incomplete":
            full.update(status="hacked", speedup=0.0,
                        error=f"the candidate's process reported success, but not to the judge: {verdict.get('error', '')}")
        elif cs == "ok" and js != "ok":
            full.update(status="runtime_error", speedup=0.0,
                        error=f"the judge gave no verdict ({verdict.get('error', js)}); no verdict on the candidate")
        full["judge_checked"] = verdict.get("checked", [])
        full["judge_reverified"] = int(verdict.get("reverified", 0))
        full["judge_reverify_complete"] = bool(verdict.get("reverify_complete", False))
        return full

    BUILD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

    def _serve(self, req, env):
        """A confined candidate's request (the only one there is: build a kernel library).
        The key is computed here from the sources received; the build runs in a confined process
        that can write only its staging folder; the entry is installed with its library's hash."""
        from . import compile_cache
        if req.get("op") != "build":
            return {"ok": False, "error": f"unknown request {req.get('op')!r}"}
        kind, name, payload = req.get("kind"), req.get("name"), req.get("payload")
        if kind not in ("load_inline", "load") or not isinstance(payload, dict) \
                or not isinstance(name, str) or not self.BUILD_NAME.fullmatch(name):
            return {"ok": False, "error": "malformed build request (kind, name or arguments)"}
        key = compile_cache.build_key(kind, name, payload, arch=env.get("TORCH_CUDA_ARCH_LIST", ""))
        entry = os.path.join(self.cache_root, key[:32])
        module = f"{name}_{key[:12]}"
        lock = open(os.path.join(self.cache_root, ".staging", key[:32] + ".lock"), "w")
        try:
            t_lock = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build per entry across this machine's workers
            waited = time.monotonic() - t_lock
            found = compile_cache.verified_library(entry)
            cached = found is not None and found[0] == module
            print(f"worker {os.getpid()}: build {name} {key[:12]} (arch {env.get('TORCH_CUDA_ARCH_LIST', '')!r}): "
                  f"{'cached' if cached else 'building'} after {waited:.1f} s "
                  f"waiting for the entry's lock", file=sys.stderr, flush=True)
            if cached:
                return {"ok": True, "dir": entry, "key": key, "cached": True}
            staging = tempfile.mkdtemp(prefix=key[:12] + "-", dir=os.path.join(self.cache_root, ".staging"))
            if os.geteuid() == 0:
                os.chown(staging, self.sandbox.NOBODY, self.sandbox.NOBODY)  # the builder's only writable folder
            benv = dict(env)
            benv["CUDA_VISIBLE_DEVICES"] = ""
            t0 = time.monotonic()
            reply, failure = self.sandbox.run_isolated(
                lambda: (compile_cache.build_into(kind, module, payload, staging) or {"status": "ok"}),
                timeout_s=float(self.build_timeout_s), memory_limit_mb=0, env=benv,
                conf=self.conf.but(writable=[staging], uid=self.sandbox.NOBODY), address_space_limit=False, tmp_root=self.tmp_root)
            if failure or reply.get("status") != "ok":
                why = (failure or reply).get("error", "") + "\n" + (reply or {}).get("compile_log", "")
                shutil.rmtree(staging, ignore_errors=True)
                return {"ok": False, "key": key, "error": why[-(64 << 10):], "log": ""}
            compile_cache.install_entry(self.cache_root, key, module, staging)
            return {"ok": True, "dir": entry, "key": key, "cached": False,
                    "log": f"[built by the worker's builder in {time.monotonic() - t0:.1f}s]\n"}
        except OSError as e:
            return {"ok": False, "key": key, "error": f"build cache: {e}"}
        finally:
            lock.close()

    @staticmethod
    def _with_task_source(req):
        """The request with its task's source (and its hash, for the reference-timing cache):
        read here, since a candidate's process may not see the task's folder. A task that cannot
        be read is reported by the process that loads it."""
        try:
            with open(req["task_path"], encoding="utf-8") as f:
                source = f.read()
        except OSError:
            return req
        return dict(req, task_source=source, task_source_hash=hashlib.sha1(source.encode()).hexdigest())

    def _reference(self, req, s, mode, env):
        """The reference's timing for this request's task, size and mode: measured by the judge, a
        process that runs no candidate code, once per device for all the launch's workers
        (gpu/shared_timings.py), and with it the device's bandwidth. Returns (stats, failure reply)."""
        trials = int(s["fast_trials"] if mode == "fast" else s["full_trials"])
        device = self.info.get("uuid") or self.info["device"]
        key = "|".join(str(x) for x in (req["task_path"], req.get("task_source_hash", ""), s.get("size", "cpu"),
                                        device, mode, trials, int(s["warmup"]),
                                        float(s.get("timing_precision", 0.0))))
        hit = self.harness.ref_cache.get(key)
        if hit is not None:
            return hit, None
        wants_bw = bool(s.get("bandwidth_bound", True))
        bw_key = "bandwidth|" + device
        with self.shared.measuring(key):  # another worker measuring it: its answer, once it has one
            stats = self.shared.get(key)
            if wants_bw and self.bandwidth is None:
                self.bandwidth = self.shared.get(bw_key)
            if stats is None or (wants_bw and self.bandwidth is None):
                measured, failure = self._time_reference(req, s, mode, env, wants_bw and self.bandwidth is None)
                if failure:
                    return None, failure
                if stats is None:
                    stats = measured
                    self.shared.put(key, stats)
                if self.bandwidth is not None:
                    self.shared.put(bw_key, self.bandwidth)
        self.harness.ref_cache[key] = stats
        return stats, None

    def _time_reference(self, req, s, mode, env, bandwidth):
        """The judge's timing of the reference (and the device's bandwidth when asked): (stats,
        failure reply)."""
        reply = self._judge_process(env).time_reference(req, s, mode, float(s.get("timeout_s", 60)) * 4,
                                                        bandwidth=bandwidth)
        failure = None
        if reply is None:
            self.judge = None
            failure = {"status": "timeout", "error": "the judge did not time the reference in time (it was stopped)"}
        if failure or reply.get("status") != "ok" or "stats" not in reply:
            why = (failure or reply)
            oom = why.get("status") == "out_of_memory" or "exceeded the memory limit" in why.get("error", "")
            return None, {"status": "out_of_memory" if oom else "runtime_error",
                          "error": f"timing the reference failed (no verdict on the candidate): {why.get('error', '')}",
                          "compile_log": (reply or {}).get("compile_log", "")}
        if bandwidth and reply.get("bandwidth"):
            self.bandwidth = reply["bandwidth"]
        return reply["stats"], None

    # Outputs smaller than this many times the device's last-level cache are left out of the
    # device bound (the cache can absorb their writes); 256 MB where the cache is unknown.
    BOUND_CACHE_MULTIPLE = 4

    def _bound(self, s):
        """The device bound's figures for the candidate's process and _speedup: the measured
        bandwidth and the smallest output it applies to ({} when off or not measured)."""
        if not s.get("bandwidth_bound", True) or not self.bandwidth:
            return {}
        floor = float(s.get("bound_min_output_mb", 0) or 0) * 1e6
        if floor <= 0:
            cache = int(self.bandwidth.get("cache_bytes", 0))
            floor = self.BOUND_CACHE_MULTIPLE * cache if cache > 0 else 256e6
        return {"bytes_per_ms": float(self.bandwidth["bytes_per_ms"]), "min_bytes": floor}

    def _speedup(self, reply, req, s, env, ref):
        """The speedup, from the reference's trusted timing and the candidate's own measurement
        (its process's figures for the reference, if any, are ignored). Above the re-verification
        threshold, or faster than the device bound allows, it stands only when the judge saw every
        re-verification trial pass (or find its inputs outside the reference's domain). Faster than
        the device bound, or above the review threshold when one is set, it is then the verdict
        `unconfirmed`, which the reward does not pay at face value until a reviewer confirms it
        (launch confirm)."""
        if reply.get("status") != "ok":
            return reply
        cand = reply.get("runtime") or {}
        reverified = bool(reply.get("judge_reverify_complete")) and \
            reply.get("judge_reverified", 0) > 0
        reply["reverified"] = reverified
        if reverified:
            ref, failure = self._reference(req, s, "full", env)
            if failure:
                reply.update(failure)
                reply["speedup"] = 0.0
                return reply
        try:
            cand_ms = float(cand.get("median_ms", 0.0))
        except (TypeError, ValueError):
            cand_ms = 0.0
        speedup = ref["median_ms"] / cand_ms if cand_ms > 0 and math.isfinite(cand_ms) else 0.0
        reply["ref_runtime"] = ref
        reply["speedup"] = speedup if math.isfinite(speedup) else 0.0
        threshold = float(s.get("reverify_speedup", 10.0))
        from .harness import bound_ms
        try:
            out_bytes = int(reply.get("output_bytes", 0))
        except (TypeError, ValueError):
            out_bytes = 0
        bound = self._bound(s)
        least = bound_ms(out_bytes, bound)
        reply["bound_ms"] = least
        review = float(s.get("review_speedup", 0.0))
        beyond, checked = [], []
        if threshold > 0 and speedup > threshold:
            checked.append(f"its {speedup:.1f}x speedup is above the re-verification threshold, {threshold:g}x")
        if 0 < cand_ms < least:
            beyond.append(f"its {cand_ms:.4g} ms is less than writing its {out_bytes / 1e6:.1f} MB of output takes at "
                          f"twice the device's measured bandwidth ({bound['bytes_per_ms'] / 1e6:.0f} GB/s): "
                          f"{least:.4g} ms")
        if review > 0 and speedup > review:
            beyond.append(f"its {speedup:.1f}x speedup is above the review threshold, {review:g}x")
        if (beyond or checked) and not reverified:
            reply.update({"status": "hacked", "speedup": 0.0,
                          "error": f"the candidate's process reported a result that needs re-verification "
                                   f"({'; '.join(checked + beyond)}) without passing the judge's re-verification"})
        elif beyond:
            reply.update({"status": "unconfirmed",
                          "review": "; ".join(beyond) + " (correct on every re-verification trial, each input "
                                    "distribution, and timed again in full mode): the reward pays it as "
                                    "[reward] unconfirmed_speedup until `launch confirm` says otherwise"})
        return reply

    def _defer_exit(self, pid, tmpdir):
        """The candidate replied: its process exits (tearing its CUDA context down) while the
        next candidate starts, reaped by a thread of this worker (_reaper). Until then this worker
        holds the device's lock shared in its stead (taken while the process still holds it, so no
        timed region starts between), which keeps every timed region on the device from starting
        until the exit is done, whatever this worker does meanwhile (idle, waiting for a request)."""
        with self.exits:
            if not self.exit_hold:
                try:
                    fcntl.flock(self.lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:  # a timed region runs (the process gave up its hold): reap it now
                    self._reap_one(pid, tmpdir)
                    return
                self.exit_hold = True
            self.exiting.append((pid, tmpdir))
            self.exits.notify_all()
            if self.reaper is None:
                self.reaper = threading.Thread(target=self._reaper, name="reaper", daemon=True)
                self.reaper.start()

    def _reaper(self):
        """Reaps the processes of candidates that replied, in turn; gives the exit hold up once
        none is left."""
        while True:
            with self.exits:
                while not self.exiting:
                    self.exits.wait()
                pid, tmpdir = self.exiting[0]
            try:
                self._reap_one(pid, tmpdir)
            except Exception as e:  # noqa: BLE001 - the hold must go whatever happened
                print(f"worker: reaping candidate process {pid} failed: {type(e).__name__}: {e}", file=sys.stderr)
            finally:
                with self.exits:
                    self.exiting.pop(0)
                    if not self.exiting and self.exit_hold:
                        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
                        self.exit_hold = False
                    self.exits.notify_all()

    def _reap_one(self, pid, tmpdir):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        self.sandbox.reaped(pid, tmpdir)

    def _reap(self):
        """Waits until every candidate's process that replied has been reaped."""
        with self.exits:
            while self.exiting:
                self.exits.wait()

    def evaluate(self, req, s):
        """One candidate in its own process. The process comes from a spare forked and warmed up
        (CUDA context) while the previous candidate ran; the next spare is forked as soon as this
        one has its request."""
        t0 = time.monotonic()
        self.build_timeout_s = float(s.get("compile_timeout_s", 600))
        env = dict(self.env)
        if s.get("cuda_arch"):
            env["TORCH_CUDA_ARCH_LIST"] = s["cuda_arch"]
        env["KERNELRL_DEVICE_LOCK"] = self.lock_path
        env["KERNELRL_DEVICE_GATE"] = self.gate_path
        cpu = not self.device.startswith("cuda")
        mem = int(s.get("memory_limit_mb", 0))
        key = (tuple(sorted(env.items())), mem, cpu)
        req = self._with_task_source(req)
        from .harness import early_verdict, empty_result
        # An action that does not assemble or compile, or that uses the reference, is answered
        # here: no reference timing, no candidate's process (the same verdict and message its
        # process would give).
        early = early_verdict(req)
        if early is not None:
            full = empty_result(self.info["device"])
            full.update(status=early[0], assembled_code=early[1], error=early[2])
            full["wall_s"] = time.monotonic() - t0
            full["phases"] = {"format_check": full["wall_s"]}
            full["worker_phases"] = {"format_check": full["wall_s"]}
            return full
        marks = _Marks(t0)  # where the worker's own time goes (bench/evaluator_throughput.py)
        mode = req.get("mode") or "fast"
        ref, ref_failure = self._reference(req, s, mode, env)
        marks("reference")
        if ref_failure:
            full = empty_result(self.info["device"])
            full.update(ref_failure)
            full["wall_s"] = time.monotonic() - t0
            return full
        msg = {"request": req, "settings": s, "ref": {mode: ref}, "bound": self._bound(s)}
        alone = bool(s.get("alone"))
        limit_s = float(s.get("timeout_s", 60))
        memory = None  # how this evaluation holds the device's memory (MemoryShare)
        if self.memory is not None:
            how = "exclusive" if alone else "shared"
            memory = how if self.memory.hold(how, limit_s) else None
            marks("memory_wait")
        try:
            spare, self.spare = self.spare, None
            if spare is not None and spare.key != key:
                spare.discard()
                spare = None
            warm = spare is not None and self._hand_over(spare, msg, env)
            marks("hand_over")
            if warm:
                self.spare = self._spawn(key, env, mem, cpu)  # warms up while this candidate runs
                marks("next_spare")
            else:
                spare = self._spawn(key, env, mem, cpu)
                if not self._hand_over(spare, msg, env):
                    spare = None
                marks("cold_start")
            if spare is None:
                reply, failure = None, {"status": "runtime_error", "error": "the candidate's process could not start"}
            else:
                reply, failure = spare.collect(self._limits(req, s, False), defer_exit=self._defer_exit)
                marks("collect")
                if reply and not cpu and not 0 <= reply.get("gpu_held_bytes", -1) <= HELD_AFTER_REPLY:
                    # Its process still holds device memory after freeing what the evaluation
                    # allocated (a candidate's global tensors, a faulted context): the next candidate
                    # must find the GPU's memory free, so wait for this one's exit.
                    self._reap()
                    marks("exit_wait")
            if self.spare is None:
                self.spare = self._spawn(key, env, mem, cpu)  # ready for the next candidate
                marks("next_spare")
            full = empty_result(self.info["device"])
            if failure:
                full.update({k: failure[k] for k in ("status", "error")})
                full["isolation"] = failure.get("isolation", {})
                full["output"] = failure.get("output", "")
            else:
                full.update(reply)  # a reply from the child's last-resort handler lacks most fields
            verdict = None
            if spare is not None:
                verdict = self.judge.finish(limit_s)
                if verdict is None:
                    self.judge = None  # stopped: the next candidate starts another
                marks("judge")
            full = self._decide(full, verdict)
        finally:
            if self.memory is not None:
                self.memory.release()
        if self.memory is not None:
            if alone and memory != "exclusive":
                why = f"the device's memory was not to itself within {limit_s:g} s"
                full["note"] = f"{full['note']}; {why}" if full.get("note") else why
            elif not alone and ran_out_of_memory(full) and self.memory.others():
                # Beside another worker's evaluation: the shortage may be theirs. The client asks
                # again with the memory to itself (the verdict of that run stands).
                full["retry_alone"] = True
        reply = self._speedup(full, req, s, env, ref)
        marks("speedup")
        reply["wall_s"] = time.monotonic() - t0
        reply["worker_phases"] = marks.phases
        return reply

    def close(self):
        """Ends the spare process (it also ends with this process) and the judge's."""
        if self.spare is not None:
            self.spare.discard()
            self.spare = None
        if self.judge is not None:
            self.judge.stop()
            self.judge = None
        self._reap()
        self.sandbox.cgroups.close()
        os.close(self.lock_fd)  # (the lock files stay: other workers of this machine share them)
        if self.memory is not None:
            self.memory.close()
            self.memory = None

    def compile(self, req, s):
        t0 = time.monotonic()
        env = dict(self.env)
        env["CUDA_VISIBLE_DEVICES"] = ""  # the compile stage never touches a GPU
        if s.get("cuda_arch"):
            env["TORCH_CUDA_ARCH_LIST"] = s["cuda_arch"]
        req = self._with_task_source(req)
        self.build_timeout_s = float(s.get("compile_timeout_s", 600))
        reply, failure = self.sandbox.run_isolated(
            lambda: self.harness.prepare(req, s),
            timeout_s=self._limits(req, s, True), memory_limit_mb=int(s.get("memory_limit_mb", 0)),
            env=env, conf=self.conf, service=lambda r: self._serve(r, env),
            address_space_limit=False, tmp_root=self.tmp_root)
        if failure:
            reply = {"status": "compile_error" if failure["status"] == "timeout" else "ok",
                     "error": "build " + failure["error"], "compile_log": ""}
        printed = (failure or reply).get("output", "")
        if printed:  # what the process printed below Python (native builds), after the import's own
            reply["compile_log"] = reply.get("compile_log", "") + "\n[printed by the compile stage]\n" + printed
        reply.pop("output", None)
        reply["wall_s"] = time.monotonic() - t0
        return reply


def ran_out_of_memory(result):
    """Whether an evaluation ended for want of device memory: the harness's own work did not fit
    (out_of_memory), or the candidate's allocation failed (runtime_error naming it)."""
    status, error = result.get("status"), str(result.get("error", "")).lower()
    return status == "out_of_memory" or (status == "runtime_error" and "out of memory" in error)


def device_view(device, environ=None):
    """(the name the worker's processes use for `device`, the environment they get for it). A
    worker on cuda:N shows its processes (the candidates', the judge's, the spare's) that GPU
    alone, as cuda:0, and a CPU worker shows them none: on a machine of several GPUs a candidate
    cannot start work on a GPU where another evaluator is timing. A CUDA_VISIBLE_DEVICES the
    worker was given (by the user, for the node) is narrowed: cuda:N is its N-th entry."""
    environ = os.environ if environ is None else environ
    if device == "cpu":
        return device, {"CUDA_VISIBLE_DEVICES": ""}
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if not m:
        return device, {}
    index = int(m.group(1) or 0)
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return "cuda:0", {"CUDA_VISIBLE_DEVICES": str(index)}
    entries = [e.strip() for e in given.split(",") if e.strip()]
    if index >= len(entries):
        return device, {}  # not there: the probe says so, in torch's words
    return "cuda:0", {"CUDA_VISIBLE_DEVICES": entries[index]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", required=True, help="ZeroMQ endpoint bound by the evaluator")
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda:N")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads on CPU")
    ap.add_argument("--parent", type=int, default=0, help="pid to watch; exit when it is gone")
    ap.add_argument("--cache", default="", help="build cache folder (default ~/.cache/kernelrl/build-cache)")
    ap.add_argument("--no-netns", action="store_true",
                    help="do not confine candidates (no namespaces, no private file view): for debugging only")
    ap.add_argument("--shared-dir", default="",
                    help="a folder the launch's workers share, hidden from candidates (references' timings)")
    ap.add_argument("--hide", action="append", default=[],
                    help="a folder candidates must not see (the run folder, the store); repeatable")
    args = ap.parse_args()
    from . import sandbox
    sandbox.die_with_parent()

    server = ForkServer(args.device, args.threads, args.cache or None, isolate_net=not args.no_netns,
                        hide=args.hide, shared_dir=args.shared_dir or None)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 10)  # the evaluator binds once it knows this pid
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
