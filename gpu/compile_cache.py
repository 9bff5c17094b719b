"""Content-addressed build cache for candidates that compile kernels (torch.utils.cpp_extension).

Written only by trusted code: inside a candidate's (confined) process, ``install(cache_root,
builder=sandbox.ask)`` makes ``load_inline``/``load`` send their arguments (sources included) to
the worker, which computes the key itself, builds in a confined builder process whose only
writable folder is a fresh staging folder (``build_into``), and installs the result under the key
with a manifest naming the library's SHA-256 (``install_entry``); candidates see the cache read-only
and every library is checked against its manifest before it is imported (``verified_library``).

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


MANIFEST = "manifest.json"


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verified_library(entry: str):
    """(module name, library path) of a finished cache entry whose library matches its manifest,
    or None (absent, unfinished, or altered since it was built)."""
    try:
        with open(os.path.join(entry, MANIFEST)) as f:
            m = json.load(f)
        path = os.path.join(entry, os.path.basename(m["library"]))
        if _sha256(path) != m["sha256"]:
            return None
        return m["module"], path
    except (OSError, ValueError, KeyError, TypeError):
        return None


def install_entry(root: str, key: str, module: str, staging: str) -> str:
    """Trusted side: moves a finished build from its staging folder to root/<key>, with a
    manifest naming its library's hash. Returns the entry's folder."""
    entry = os.path.join(root, key[:32])
    lib = os.path.join(staging, module + ".so")
    manifest = {"key": key, "module": module, "library": module + ".so", "sha256": _sha256(lib)}
    with open(os.path.join(staging, MANIFEST), "w") as f:
        json.dump(manifest, f)
    # The worker's from now on, readable by every candidate (each runs as a uid of its own) and
    # writable by none, the builder's uid included.
    # (each path once: the staging folder itself, then what each folder holds)
    for folder, dirs, files in os.walk(staging):
        for name in ([None] if folder == staging else []) + dirs + files:
            path = folder if name is None else os.path.join(folder, name)
            if os.path.islink(path):
                continue
            if os.geteuid() == 0:
                os.chown(path, os.getuid(), os.getgid())
            os.chmod(path, 0o755 if name is None or name in dirs or path.endswith(".so") else 0o644)
    if os.path.isdir(entry):  # an earlier, unverifiable entry (older layout, or altered): replace it
        import shutil
        shutil.rmtree(entry, ignore_errors=True)
    os.rename(staging, entry)
    return entry


def build_into(kind: str, module: str, payload: dict, staging: str):
    """In the confined builder process (trusted code, the candidate's sources as data): builds
    the library into ``staging`` without loading it."""
    cpp_ext._import_module_from_library = lambda *a, **k: None
    torch.ops.load_library = lambda *a, **k: None
    kw = dict(payload.get("kw") or {})
    kw["build_directory"] = staging
    if kind == "load_inline":
        _orig_load_inline(module, payload["cpp"], payload.get("cuda"), *payload.get("args", []), **kw)
    elif kind == "load":
        srcs = []
        os.makedirs(os.path.join(staging, "src"), exist_ok=True)
        for i, src in enumerate(payload["files"]):
            path = os.path.join(staging, "src", f"{i}_{os.path.basename(src['name'])}")
            with open(path, "w") as f:
                f.write(src["text"])
            srcs.append(path)
        _orig_load(module, srcs, *payload.get("args", []), **kw)
    else:
        raise ValueError(f"unknown build kind {kind!r}")
    if not os.path.exists(os.path.join(staging, module + ".so")):
        raise RuntimeError(f"the build left no {module}.so")


def build_key(kind: str, name: str, payload: dict, arch=None) -> str:
    """The entry of one build: the module's name is compiled into the library (its init symbol),
    so two extensions of the same sources under different names are two entries (with one entry
    for both, each build replaced the other's library, and a candidate's evaluation waited for a
    rebuild of what its compile stage had built)."""
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "arch": os.environ.get("TORCH_CUDA_ARCH_LIST", "") if arch is None else arch,
        "python": sys.version.split()[0],
        "cxx": os.environ.get("CXX", ""),
    }
    blob = json.dumps({"kind": kind, "name": name, "payload": _norm(payload), "env": env}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class BuildRecorder:
    def __init__(self, cache_root: str, builder=None):
        self.root = cache_root
        self.builder = builder
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

    def _ask(self, kind, name, payload, kw):
        """Has the trusted worker build (or find) it; imports the verified library."""
        rec = {"name": name, "key": "", "cached": False, "seconds": 0.0, "ok": False, "log": ""}
        self.builds.append(rec)
        t0 = time.monotonic()
        try:
            reply = self.builder({"op": "build", "kind": kind, "name": name, "payload": payload})
            rec["key"], rec["cached"] = str(reply.get("key", ""))[:32], bool(reply.get("cached"))
            rec["log"] = str(reply.get("log", ""))[-LOG_LIMIT:]
            if not reply.get("ok"):
                rec["log"] = (rec["log"] + str(reply.get("error", "")))[-LOG_LIMIT:]
                raise RuntimeError(f"Error building extension '{name}': {reply.get('error', '')}\n{rec['log']}"[-LOG_LIMIT:])
            found = verified_library(reply["dir"])
            if found is None:
                raise RuntimeError(f"the cache entry for extension '{name}' does not match its manifest")
            module, path = found
            result = self._import_built(module, os.path.dirname(path), kw or {})
            rec["ok"] = True
            return result
        finally:
            rec["seconds"] = time.monotonic() - t0

    def _run(self, kind, name, payload, call, kw=None):
        if self.builder is not None:
            return self._ask(kind, name, payload, kw)
        key = build_key(kind, name, payload)
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
        if self.builder is not None:  # the builder cannot see this process's files: send them
            files = []
            for path in srcs:
                with open(path, encoding="utf-8") as f:
                    files.append({"name": path, "text": f.read()})
            payload = {"files": files, "args": list(args),
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


def install(cache_root: str, builder=None) -> BuildRecorder:
    """Routes the process's extension builds through the cache: through ``builder`` (a
    candidate's process: see the module's docstring) or built here (a process that may write
    the cache). Triton's cache is the process's own where builds go through the builder (a
    shared one would be written by candidates)."""
    rec = BuildRecorder(cache_root, builder)
    cpp_ext.load_inline = rec.load_inline
    cpp_ext.load = rec.load
    if builder is None:
        os.makedirs(cache_root, exist_ok=True)
        os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache_root, "triton"))
    else:
        import tempfile
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "triton")
    return rec

