"""A cluster on loopback, every part started as a user starts it: `launch CONFIG` (the head) and
`launch CONFIG --node NAME` (evaluator nodes), real processes talking through CAF's middleman.

One run: the head and node a start; once samples are being recorded node b joins and must get
work; once b has evaluated some, node a is killed with SIGKILL (its whole process group, as a
machine dies). Every replayed sample must still be in the store exactly once with a verdict. A
peer with the wrong secret is refused, and the secret appears in no log and not in the store."""

import glob
import os
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
TASKS = os.path.join(ROOT, "tasks", "bundled")
REPLAY = os.path.join(ROOT, "tasks", "replay")
SECRET = "test-secret-" + os.urandom(12).hex()
VERDICTS = {"ok", "incorrect", "format_error", "compile_error", "runtime_error", "timeout", "hacked"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(d, port):
    path = os.path.join(d, "cluster.toml")
    with open(os.path.join(d, "cluster.secret"), "w") as f:
        f.write(SECRET + "\n")
    with open(path, "w") as f:
        f.write(f"""
[cluster]
name = "test-cluster"
secret_file = "cluster.secret"
heartbeat_s = 0.5
peer_timeout_s = 3.0
join_wait_s = 60.0
[[node]]
name = "head"
host = "127.0.0.1"
port = {port}
roles = ["supervisor", "sampler", "monitor"]
[[node]]
name = "a"
roles = ["evaluator"]
cpu_slots = 1
[[node]]
name = "b"
roles = ["evaluator"]
cpu_slots = 1
[tasks]
dir = "{TASKS}"
[sampler]
replay = "{REPLAY}"
[evaluator]
timeout_s = 8
[experiment]
run_root = "{d}/runs"
[monitor]
progress = false
""")
    return path


def replayed_count():
    n = 0
    for p in glob.glob(os.path.join(REPLAY, "*.jsonl")):
        with open(p) as f:
            n += sum(1 for line in f if line.strip())
    return n


def recorded(store, where="1=1"):
    try:
        con = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute(f"SELECT COUNT(*) FROM samples WHERE {where}").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def wait_for(cond, timeout, what):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class ClusterTest(unittest.TestCase):
    def test_kill_join_and_wrong_secret(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, free_port())
            run_dir = os.path.join(d, "run")
            store = os.path.join(run_dir, "store.sqlite")
            logs = {k: open(os.path.join(d, k + ".log"), "w+") for k in ("head", "a", "b", "bad")}

            def start(name, *args, env=None):
                return subprocess.Popen([LAUNCH, cfg, *args], stdout=logs[name], stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)

            procs = []
            try:
                head = start("head", "--run-dir", run_dir)
                procs.append(head)
                a = start("a", "--node", "a")
                procs.append(a)
                wait_for(lambda: recorded(store) >= 8, 240, "8 samples recorded with node a")

                # A stranger with the wrong secret: refused, exit 2, the run goes on.
                bad_env = dict(os.environ, KERNELRL_CLUSTER_SECRET="wrong-" + "x" * 20)
                bad_cfg = cfg.replace("cluster.toml", "bad.toml")
                with open(cfg) as f, open(bad_cfg, "w") as g:
                    g.write(f.read().replace('secret_file = "cluster.secret"\n', ""))
                bad = subprocess.run([LAUNCH, bad_cfg, "--node", "b"], capture_output=True, text=True,
                                     env=bad_env, timeout=120)
                self.assertEqual(bad.returncode, 2, bad.stderr)
                self.assertIn("authentication failed", bad.stderr)

                # Node b joins mid-run and gets work.
                b = start("b", "--node", "b")
                procs.append(b)
                wait_for(lambda: recorded(store, "evaluator_id = 'b/cpu-0'") >= 3, 240,
                         "node b, which joined mid-run, to evaluate 3 samples")

                # Node a dies like a machine: its whole process group, SIGKILL.
                os.killpg(a.pid, signal.SIGKILL)
                a.wait(timeout=30)
                rc = head.wait(timeout=600)
                logs["head"].seek(0)
                head_log = logs["head"].read()
                self.assertEqual(rc, 0, head_log[-3000:])
            finally:
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                for f in logs.values():
                    f.close()

            n = replayed_count()
            con = sqlite3.connect(store)
            rows = con.execute("SELECT sample_id, status, evaluator_id FROM samples").fetchall()
            ids = [r[0] for r in rows]
            self.assertEqual(len(ids), n, "every replayed sample is in the store")
            self.assertEqual(len(set(ids)), n, "and each exactly once")
            self.assertTrue(all(r[1] in VERDICTS for r in rows), {r[1] for r in rows})
            by_node = {r[2].split("/")[0] for r in rows}
            self.assertIn("a", by_node)
            self.assertIn("b", by_node)
            self.assertIn('node "a" joined', head_log)
            self.assertIn("refused: authentication failed", head_log)
            self.assertIn("is down", head_log)  # the dispatcher noticed node a's evaluator go

            # The secret is in no log, no worker log and not in the store.
            for path in glob.glob(os.path.join(d, "*.log")) + glob.glob(os.path.join(d, "**", "*.log"),
                                                                        recursive=True) + [store]:
                with open(path, "rb") as f:
                    self.assertNotIn(SECRET.encode(), f.read(), path)


if __name__ == "__main__":
    unittest.main()
