"""Content-addressed build cache for candidates that compile kernels (torch.utils.cpp_extension).

Inside an evaluation process, ``install(cache_root)`` replaces ``load_inline`` and ``load`` with
wrappers that hash everything that decides the binary (sources, function list, compiler and linker
flags, include paths, torch and CUDA versions, target architectures, Python version) and build into
``cache_root/<hash>`` under a module name suffixed with the hash. Identical candidates therefore
build once, whichever process builds first (a file lock per directory serialises concurrent builds
of one entry); a later process finds the entry marked built and imports the library directly,
without torch's JIT build step. Triton's own cache is pointed at
``cache_root/triton``. Every build is recorded (name, key, cached or not, seconds, log).
"""

import fcntl
import hashlib
import importlib.util
import json
import os
import sys
import time

import torch
import torch.utils.cpp_extension as cpp_ext

LOG_LIMIT = 64 * 1024
_orig_load_inline = cpp_ext.load_inline
_orig_load = cpp_ext.load


def _norm(x):
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return [_norm(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _norm(v) for k, v in sorted(x.items())}
    return str(x)


def build_key(kind: str, payload: dict) -> str:
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
        "python": sys.version.split()[0],
        "cxx": os.environ.get("CXX", ""),
    }
    blob = json.dumps({"kind": kind, "payload": _norm(payload), "env": env}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class BuildRecorder:
    def __init__(self, cache_root: str):
        self.root = cache_root
        self.builds = []  # {"name", "key", "cached", "seconds", "ok", "log"}

    def _import_built(self, mod_name, build_dir, kw):
        """The library a finished build left, loaded without running torch's JIT build again
        (which always re-runs ninja in a fresh process, and ninja may decide to rebuild)."""
        path = os.path.join(build_dir, mod_name + ".so")
        if kw.get("is_standalone"):
            return path
        if not kw.get("is_python_module", True):
            torch.ops.load_library(path)
            return path
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    def _run(self, kind, name, payload, call, kw=None):
        key = build_key(kind, payload)
        build_dir = os.path.join(self.root, key[:32])
        os.makedirs(build_dir, exist_ok=True)
        mod_name = f"{name}_{key[:12]}"
        rec = {"name": name, "key": key[:32], "cached": False, "seconds": 0.0, "ok": False, "log": ""}
        self.builds.append(rec)
        t0 = time.monotonic()
        done = os.path.join(build_dir, mod_name + ".built")  # written once a build succeeded
        lock = None
        try:
            # A finished entry never changes: read it without the lock.
            if os.path.exists(done):
                try:
                    result = self._import_built(mod_name, build_dir, kw or {})
                    rec["cached"] = rec["ok"] = True
                    return result
                except Exception as e:  # noqa: BLE001 - a damaged entry: build it again
                    rec["log"] = f"cached library unusable ({e}); rebuilding\n"
            # One build per directory at a time across processes (compile workers may get the
            # same candidate at once); a later process waits, then finds the entry built.
            lock = open(os.path.join(build_dir, ".kernelrl.lock"), "w")
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(done) and not rec["log"]:
                result = self._import_built(mod_name, build_dir, kw or {})
                rec["cached"] = True
            else:
                result = call(mod_name, build_dir)
                with open(done, "w") as f:
                    f.write(key + "\n")
            rec["ok"] = True
            return result
        except BaseException as e:  # noqa: BLE001 - recorded, then re-raised to the candidate
            rec["log"] = (rec["log"] + str(e))[-LOG_LIMIT:]
            raise
        finally:
            rec["seconds"] = time.monotonic() - t0
            if lock is not None:
                lock.close()

    def load_inline(self, name, cpp_sources, cuda_sources=None, *args, **kw):
        kw.pop("build_directory", None)
        payload = {"cpp": cpp_sources, "cuda": cuda_sources, "args": list(args),
                   "kw": {k: v for k, v in kw.items() if k != "verbose"}}
        return self._run("load_inline", name, payload,
                         lambda n, d: _orig_load_inline(n, cpp_sources, cuda_sources, *args,
                                                        build_directory=d, **kw), kw)

    def load(self, name, sources, *args, **kw):
        kw.pop("build_directory", None)
        srcs = [sources] if isinstance(sources, str) else list(sources)
        contents = []
        for path in srcs:
            try:
                with open(path, "rb") as f:
                    contents.append(hashlib.sha256(f.read()).hexdigest())
            except OSError:
                contents.append(f"missing:{path}")
        payload = {"sources": srcs, "contents": contents, "args": list(args),
                   "kw": {k: v for k, v in kw.items() if k != "verbose"}}
        return self._run("load", name, payload,
                         lambda n, d: _orig_load(n, sources, *args, build_directory=d, **kw), kw)

    def summary(self):
        return {
            "builds": len(self.builds),
            "cached": all(b["cached"] for b in self.builds) if self.builds else False,
            "seconds": sum(b["seconds"] for b in self.builds),
            "log": "".join(f"[build {b['name']} {b['key'][:12]}{' cached' if b['cached'] else ''}"
                           f" {b['seconds']:.1f}s]\n{b['log']}" for b in self.builds)[-LOG_LIMIT:],
        }


def install(cache_root: str) -> BuildRecorder:
    os.makedirs(cache_root, exist_ok=True)
    rec = BuildRecorder(cache_root)
    cpp_ext.load_inline = rec.load_inline
    cpp_ext.load = rec.load
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache_root, "triton"))
    return rec

