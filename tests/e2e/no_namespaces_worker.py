"""The evaluation worker where the kernel refuses new namespaces, as in a container under Docker's
default seccomp profile: this process (root) installs a seccomp filter refusing unshare, mount and
namespace-making clone (gpu/seccomp.py's, which refuses what that profile refuses to a process
without CAP_SYS_ADMIN), starts a ForkServer and evaluates the candidates given on stdin (JSON:
{"settings": ..., "candidates": [{"action", "task_path"}]}), printing one JSON line: the worker's
sandbox description and each verdict, or {"start_error": why}.

With --readable-env, the Python installation and caches are first made reachable to every user
(a private mount namespace with a 0755 tmpfs over /root and those folders bound back), as a
container arranges by keeping them outside /root; without it they stay where they are."""

import ctypes
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # for the gpu package



def readable_env():
    from gpu import sandbox  # its mount helper and flags (importing it changes nothing)
    keep = [p for p in ("/root/.cache", "/root/.pyenv", "/root/.local") if os.path.isdir(p)]
    try:
        if sandbox._libc.unshare(sandbox._CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        sandbox._mount(None, "/", None, sandbox._MS_REC | sandbox._MS_PRIVATE)
    except OSError as e:
        raise OSError(e.errno, "no mount namespace for the test's file view") from e
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in keep}  # (opened in the new namespace)
    sandbox._mount("tmpfs", "/root", "tmpfs", 0, "mode=755")
    for p, fd in fds.items():
        os.makedirs(p)
        sandbox._mount(f"/proc/self/fd/{fd}", p, None, sandbox._MS_BIND | sandbox._MS_REC)


def main():
    job = json.load(sys.stdin)
    if "--readable-env" in sys.argv:
        readable_env()
    from gpu import seccomp
    filtered = seccomp.install()
    if not filtered.startswith("filter"):
        print(json.dumps({"start_error": f"no seccomp filter: {filtered}"}))
        return
    top = tempfile.mkdtemp()
    os.chmod(top, 0o711)  # as the evaluator's own temp folders (core/paths.cpp)
    scratch = os.path.join(top, "scratch")
    os.makedirs(scratch, mode=0o711)
    try:
        run(job, top, scratch)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def run(job, top, scratch):
    from gpu.worker import ForkServer
    try:
        server = ForkServer("cpu", 1, os.path.join(top, "cache"), tmp_root=scratch)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(json.dumps({"start_error": str(e)}))
        return
    out = {"sandbox": server.info["sandbox"], "scratch": scratch, "cache": server.cache_root, "verdicts": []}
    for i, c in enumerate(job["candidates"]):
        req = {"sample_id": f"nn#{i}", "task_id": os.path.basename(c["task_path"])[:-3],
               "task_path": c["task_path"], "action": c["action"], "action_space": "forward_body",
               "mode": "fast", "seed": 42}
        r = server.evaluate(req, job["settings"])
        out["verdicts"].append({"status": r["status"], "error": r["error"]})
    server.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
