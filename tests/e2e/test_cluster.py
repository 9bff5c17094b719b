"""A cluster on loopback, every part started as a user starts it: `launch CONFIG` (the head),
`launch CONFIG --node NAME` and `--join` (evaluator nodes), `launch monitor HOST:PORT`, real
processes talking through CAF's middleman.

ClusterTest, real evaluations: the head and node a start; once samples are being recorded node b
joins and must get work; once b has evaluated some, node a is killed with SIGKILL (its whole
process group, as a machine dies). Every replayed sample must still be in the store exactly once
with a verdict. A peer with the wrong secret is refused, and the secret appears in no log and not
in the store.

MembershipTest, synthetic evaluators (fixed latency, nothing run): a machine not in the file
joins with --join; monitors attach, read telemetry and detach; the ZeroMQ PUB socket carries the
same snapshots; strangers (another protocol version, another cluster, no join, a taken name, a
wrong secret) are refused with a clear message; a node that goes silent (SIGSTOP) is dropped
after peer_timeout_s and its work runs elsewhere, every sample exactly once.

CurveTelemetryTest: the telemetry socket with CURVE admits only the listed readers.

TlsTest: the same over mutual TLS ([cluster] tls), plain-text and foreign-CA peers refused.

NamespaceTest: the head and a node in two network namespaces joined by a veth pair, where the
machine permits it (root, iproute2); skipped with the reason where it does not."""

import glob
import json
import re
import os
import shutil
import threading
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
TASKS = os.path.join(ROOT, "tasks", "bundled")
REPLAY = os.path.join(ROOT, "tasks", "replay")
SECRET = "test-secret-" + os.urandom(12).hex()
VERDICTS = {"ok", "incorrect", "format_error", "compile_error", "runtime_error", "timeout", "hacked"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_head(d, port, peer_timeout_s, host="127.0.0.1"):
    """[cluster] and the head's [[node]]; writes the secret file beside the config."""
    with open(os.path.join(d, "cluster.secret"), "w") as f:
        f.write(SECRET + "\n")
    os.chmod(os.path.join(d, "cluster.secret"), 0o600)  # a secret only its owner reads (launch refuses others)
    return f"""
[cluster]
name = "test-cluster"
secret_file = "cluster.secret"
heartbeat_s = 0.5
peer_timeout_s = {peer_timeout_s}
join_wait_s = 60.0
[[node]]
name = "head"
host = "{host}"
port = {port}
roles = ["supervisor", "sampler", "monitor"]
"""


def write_config(d, port):
    path = os.path.join(d, "cluster.toml")
    with open(path, "w") as f:
        # A node is taken as gone after 10 s of silence. The tests here kill nodes (their connections
        # close at once) and never stop one; with 3 s, a node stalled a few seconds beside another
        # test (CI runs two at once on two cores) would be dropped and stop for good, which fits the
        # CI run where node b never evaluated. MembershipTest covers silence.
        f.write(cluster_head(d, port, peer_timeout_s=10.0) + f"""
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


def start_launch(cfg, log, *args, env=None):
    """`launch CONFIG ARGS` in a process group of its own (so a test can stop or kill it whole)."""
    return subprocess.Popen([LAUNCH, cfg, *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def wait_for(cond, timeout, what, logs=None):
    """Polls cond until it holds; a timeout names what it waited for and shows the tail of each log in
    logs (name -> open file), so a failure in CI says what the processes were doing."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return
        time.sleep(0.2)
    tails = ""
    for name, f in (logs or {}).items():  # read through a file of its own: f shares its offset with the child
        with open(f.name, errors="replace") as g:
            tails += f"\n--- {name}.log (last 40 lines) ---\n" + "".join(g.readlines()[-40:])
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{tails}")


class ClusterTest(unittest.TestCase):
    def test_a_node_started_before_its_head_says_what_it_waits_for(self):
        # Issue 57, point 3: it printed nothing for up to join_wait_s.
        with tempfile.TemporaryDirectory() as d:
            port = free_port()
            cfg = write_config(d, port)
            t0 = time.time()
            p = subprocess.run([LAUNCH, cfg, "--node", "a", "--set", "cluster.join_wait_s=3"], capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(f"waiting for the head at 127.0.0.1:{port} (up to 3 s, [cluster] join_wait_s)", p.stderr)
            self.assertEqual(p.stderr.count("waiting for the head"), 1, p.stderr)
            self.assertIn(f"cannot reach the head at 127.0.0.1:{port}", p.stderr)
            self.assertLess(time.time() - t0, 60)

    def test_kill_join_and_wrong_secret(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, free_port())
            run_dir = os.path.join(d, "run")
            store = os.path.join(run_dir, "store.sqlite")
            logs = {k: open(os.path.join(d, k + ".log"), "w+") for k in ("head", "a", "b", "bad")}

            def start(name, *args, env=None):
                return start_launch(cfg, logs[name], *args, env=env)

            procs = []
            try:
                # Node b is listed but starts mid-run: the head waits join_wait_s (20 s here) for
                # it, then starts with node a's evaluators, naming b.
                head = start("head", "--run-dir", run_dir, "--set", "cluster.join_wait_s=20")
                procs.append(head)
                a = start("a", "--node", "a")
                procs.append(a)
                wait_for(lambda: recorded(store) >= 8, 240, "8 samples recorded with node a", logs)

                # A stranger with the wrong secret: refused, exit 2, the run goes on.
                bad_env = dict(os.environ, KERNELRL_CLUSTER_SECRET="wrong-" + "x" * 20)
                bad_cfg = cfg.replace("cluster.toml", "bad.toml")
                with open(cfg) as f, open(bad_cfg, "w") as g:
                    g.write(f.read().replace('secret_file = "cluster.secret"\n', ""))
                bad = subprocess.run([LAUNCH, bad_cfg, "--node", "b"], capture_output=True, text=True,
                                     env=bad_env, timeout=120)
                self.assertEqual(bad.returncode, 2, bad.stderr)
                # The head proves the secret first: the stranger finds it cannot, and sends nothing.
                self.assertIn("could not prove the cluster secret", bad.stderr)

                # Node b joins mid-run and gets work.
                b = start("b", "--node", "b")
                procs.append(b)
                wait_for(lambda: recorded(store, "evaluator_id = 'b/cpu-0'") >= 3, 240,
                         "node b, which joined mid-run, to evaluate 3 samples", logs)

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
            self.assertIn('peer "a" joined', head_log)
            self.assertIn("node b brought no evaluator within 20 s ([cluster] join_wait_s); the run starts with 1 "
                          "evaluators", head_log)
            # (the stranger stopped at the head's proof: it never sent one of its own)
            self.assertIn("is down", head_log)  # the dispatcher noticed node a's evaluator go

            # The secret is in no log, no worker log and not in the store.
            for path in glob.glob(os.path.join(d, "*.log")) + glob.glob(os.path.join(d, "**", "*.log"),
                                                                        recursive=True) + [store]:
                with open(path, "rb") as f:
                    self.assertNotIn(SECRET.encode(), f.read(), path)


PROBE = os.environ.get("KERNELRL_PEER_PROBE", os.path.join(ROOT, "build", "tests", "peer_probe"))


def write_synthetic_config(d, port, pub_port, n_samples, latency_ms, host="127.0.0.1", node_host="127.0.0.1"):
    replay = os.path.join(d, "replay.jsonl")
    tasks = ["01_diag_matmul", "02_gelu_tanh", "03_matmul_rowsum"]
    with open(replay, "w") as f:
        for i in range(n_samples):
            k = i % 7 + 1
            f.write(json.dumps({"task_id": tasks[i % 3], "completion": f"return None  # {i}",
                                "token_ids": list(range(k)), "logprobs": [-0.5] * k}) + "\n")
    path = os.path.join(d, "cluster.toml")
    with open(path, "w") as f:
        f.write(cluster_head(d, port, peer_timeout_s=2.0, host=host) + f"""
[[node]]
name = "a"
host = "{node_host}"
roles = ["evaluator"]
cpu_slots = 1
[tasks]
dir = "{TASKS}"
[sampler]
replay = "{replay}"
[evaluator]
backend = "synthetic"
synthetic_latency_ms = {latency_ms}
[experiment]
run_root = "{d}/runs"
[monitor]
progress = false
interval_s = 0.2
publish = "tcp://127.0.0.1:{pub_port}"
""")
    return path


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


class Subscriber(threading.Thread):
    """Collects the telemetry the head publishes on its ZeroMQ PUB socket (with `curve`, a tuple
    (server public key, own public key, own secret key), through CURVE)."""

    def __init__(self, endpoint, curve=None):
        super().__init__(daemon=True)
        import zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        if curve:
            self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = (
                k.encode() for k in curve)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kernelrl.telemetry")
        self.sock.setsockopt(zmq.RCVTIMEO, 200)
        self.sock.connect(endpoint)
        self.frames = []
        self.stop = False

    def run(self):
        import zmq
        while not self.stop:
            try:
                self.frames.append(self.sock.recv_multipart())
            except zmq.Again:
                pass
        self.sock.close(0)
        self.ctx.term()


class MembershipTest(unittest.TestCase):
    def test_join_monitor_publish_strangers_and_a_silent_node(self):
        import msgpack
        # The run must outlast the monitors and probes below (about 10 s on an idle machine, in which
        # two evaluators at 40 ms a sample do about 500): at 600 samples a loaded machine saw the head
        # finish, and stop listening, before the last probe.
        n = 1500
        with tempfile.TemporaryDirectory() as d:
            port, pub_port = free_port(), free_port()
            cfg = write_synthetic_config(d, port, pub_port, n, latency_ms=40)
            secret_file = os.path.join(d, "cluster.secret")
            run_dir = os.path.join(d, "run")
            store = os.path.join(run_dir, "store.sqlite")
            logs = {k: open(os.path.join(d, k + ".log"), "w+") for k in ("head", "a", "c")}

            def start(name, *args):
                return start_launch(cfg, logs[name], *args)

            def monitor(*args, env=None):
                return subprocess.run([LAUNCH, "monitor", f"127.0.0.1:{port}", *args], capture_output=True,
                                      text=True, timeout=60, env=env)

            def probe(*args):
                return subprocess.run([PROBE, "127.0.0.1", str(port), *args], capture_output=True, text=True,
                                      timeout=60)

            sub = Subscriber(f"tcp://127.0.0.1:{pub_port}")
            sub.start()
            procs = []
            try:
                head = start("head", "--run-dir", run_dir)
                procs.append(head)
                a = start("a", "--node", "a")
                procs.append(a)
                # A machine that is not in the file.
                c = start("c", "--join", "--name", "c", "--cpu-slots", "1")
                procs.append(c)
                wait_for(lambda: recorded(store, "evaluator_id = 'c/cpu-0'") >= 10 or head.poll() is not None, 120,
                         "the joined machine c to evaluate 10 samples")

                # A monitor attaches, reads one snapshot, detaches.
                m = monitor("--once", "--json", "--secret-file", secret_file)
                self.assertEqual(m.returncode, 0, m.stderr)
                snap = json.loads(m.stdout.strip().splitlines()[-1])
                v = snap["values"]
                self.assertEqual(snap["cluster"], "test-cluster")
                for node in ("a", "c"):
                    self.assertEqual(v[f"dispatcher.node.{node}.evaluators"], 1)
                    self.assertGreater(v[f"dispatcher.node.{node}.completed"], 0)
                    self.assertGreaterEqual(v[f"dispatcher.node.{node}.utilisation"], 0)
                    self.assertLessEqual(v[f"dispatcher.node.{node}.utilisation"], 1)
                    self.assertLessEqual(v[f"dispatcher.node.{node}.in_flight"],
                                         v[f"dispatcher.node.{node}.capacity"])
                for key in ("supervisor.step", "supervisor.fast_1", "supervisor.correct_rate",
                            "supervisor.speedup.p50", "supervisor.reward_hist.0.5_1", "supervisor.staleness_max",
                            "sampler.tokens_per_s", "dispatcher.queue_depth"):
                    self.assertIn(key, v)
                self.assertGreater(v["supervisor.samples_done"], 0)
                # Synthetic verdicts: speedup 1, reward 1 (shape "speedup"), one token count per sample.
                self.assertEqual(v["supervisor.speedup.p50"], 1.0)
                self.assertEqual(v["supervisor.reward_hist.0.5_1"], v["supervisor.samples_done"])
                self.assertEqual(v["sampler.tokens"], sum(i % 7 + 1 for i in range(n)))
                # The text view names both nodes.
                m = monitor("--once", "--secret-file", secret_file)
                self.assertEqual(m.returncode, 0, m.stderr)
                self.assertIn("node a: 1 evaluator(s)", m.stdout)
                self.assertIn("node c: 1 evaluator(s)", m.stdout)

                # Strangers.
                bad = monitor("--once", env=dict(os.environ, KERNELRL_CLUSTER_SECRET="wrong-" + "x" * 20))
                self.assertEqual(bad.returncode, 2, bad.stdout + bad.stderr)
                self.assertIn("could not prove the cluster secret", bad.stderr)
                # A peer that proves a wrong secret after the head proved its own is refused by the head.
                r = probe("--cluster", "test-cluster", "--secret", "wrong-" + "x" * 20, "join")
                self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
                self.assertIn("authentication failed", r.stdout)
                r = probe("--cluster", "test-cluster", "--secret", SECRET, "--protocol", "4", "join")
                self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
                ours = re.search(r"\(protocol (\d+)\)", subprocess.run([LAUNCH, "version"], capture_output=True,
                                                                       text=True).stdout).group(1)
                self.assertIn("protocol version mismatch: the head runs protocol %s, node \"probe\" runs 4" % ours,
                              r.stdout)
                r = probe("--cluster", "other-cluster", "--secret", SECRET, "join")
                self.assertEqual(r.returncode, 3, r.stdout)
                self.assertIn('this is cluster \"test-cluster\", not \"other-cluster\"', r.stdout)
                r = probe("--cluster", "test-cluster", "--secret", SECRET, "--name", "c", "join")
                self.assertEqual(r.returncode, 3, r.stdout)
                self.assertIn('a peer named \"c\" has already joined', r.stdout)
                r = probe("--no-join", "stats")
                self.assertEqual(r.returncode, 3, r.stdout)
                self.assertIn("telemetry is for peers that have joined", r.stdout)
                r = probe("--no-join", "--name", "sneaky", "register")
                self.assertEqual(r.returncode, 0, r.stdout)  # the gate answers nothing; its log says
                r = probe("--cluster", "test-cluster", "--secret", SECRET, "--name", "ok-probe", "stats")
                self.assertEqual(r.returncode, 0, r.stdout)
                self.assertIn("ok stats", r.stdout)

                # Node a goes silent (its whole process group stopped, as a hung machine).
                done_before = recorded(store)
                os.killpg(a.pid, signal.SIGSTOP)
                t_stop = time.monotonic()
                wait_for(lambda: "evaluator a/cpu-0 is down" in read(os.path.join(d, "head.log")), 30,
                         "the head to notice node a went silent")
                noticed_s = time.monotonic() - t_stop
                rc = head.wait(timeout=300)
                logs["head"].seek(0)
                head_log = logs["head"].read()
                self.assertEqual(rc, 0, head_log[-3000:])
                os.killpg(a.pid, signal.SIGCONT)
                self.assertEqual(a.wait(timeout=60), 0, "node a ends once it finds the head gone")
                self.assertEqual(c.wait(timeout=60), 0)
            finally:
                sub.stop = True
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGCONT)
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                for f in logs.values():
                    f.close()
                sub.join(timeout=5)

            self.assertLess(done_before, n, "node a was stopped mid-run")
            # peer_timeout_s = 2 with heartbeats every 0.5 s: noticed within a few seconds.
            self.assertLess(noticed_s, 8.0, f"noticed after {noticed_s:.1f} s")
            con = sqlite3.connect(store)
            rows = con.execute("SELECT sample_id, status, evaluator_id FROM samples").fetchall()
            ids = [r[0] for r in rows]
            self.assertEqual(len(ids), n, "every sample is in the store")
            self.assertEqual(len(set(ids)), n, "and each exactly once")
            self.assertEqual({r[1] for r in rows}, {"ok"})
            self.assertEqual({r[2].split("/")[0] for r in rows}, {"a", "c"})
            self.assertIn('peer "c" joined', head_log)
            self.assertIn('left', head_log)  # monitors detach
            self.assertIn("evaluator sneaky/probe-0 from a peer that has not joined: dropped", head_log)
            self.assertIn("refused: protocol version mismatch", head_log)
            # The published telemetry: the same snapshots, msgpack, topic first.
            self.assertGreater(len(sub.frames), 3, "snapshots were published")
            topic, payload = sub.frames[-1]
            self.assertEqual(topic, b"kernelrl.telemetry")
            t = msgpack.unpackb(payload, raw=False)
            self.assertEqual(set(t), {"ts", "source", "step", "values"})
            self.assertEqual(t["source"], "monitor")
            self.assertEqual(t["values"]["supervisor.samples_done"], n)
            for path in glob.glob(os.path.join(d, "*.log")) + [store]:
                with open(path, "rb") as f:
                    self.assertNotIn(SECRET.encode(), f.read(), path)


def netns_unavailable():
    """Why a run across network namespaces cannot be made here ("" when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); this test runs as uid %d" % os.geteuid()
    if not shutil.which("ip"):
        return "the ip command (iproute2) is not installed"
    name = "krl-probe-%d" % os.getpid()
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return "`ip netns add` is not permitted here: " + r.stderr.strip()
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


CERTS = os.path.join(ROOT, "scripts", "cluster-certs")


def make_certs(dir, *names):
    subprocess.run([CERTS, dir, *names], check=True, capture_output=True, timeout=60)


class SecretFileTest(unittest.TestCase):
    """A cluster secret that others may read is refused where it is named (issue 54: what `openssl
    rand -hex 32 > cluster.secret` makes under the usual umask reached candidates)."""

    def test_a_secret_file_readable_by_others_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, free_port())
            secret = os.path.join(d, "cluster.secret")
            ok = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True, timeout=60)
            self.assertEqual(ok.returncode, 0, ok.stderr)
            os.chmod(secret, 0o644)
            r = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertRegex(r.stderr, r"cluster\.toml:\d+:\d+: cluster\.secret_file: a secret readable by group or "
                                       r"others \(mode 644\); `chmod 600 .*cluster\.secret` it")
            m = subprocess.run([LAUNCH, "monitor", "127.0.0.1:1", "--once", "--secret-file", secret, "--wait", "0.1"],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(m.returncode, 0)
            self.assertIn("a secret readable by group or others (mode 644)", m.stderr)


class TlsTest(unittest.TestCase):
    """[cluster] tls: the head and node a on loopback, each with its own certificate from the
    cluster's CA (each "machine" a folder of its own holding cluster.toml and certs/). A plain-text
    peer, a peer whose certificate another CA signed, and a monitor without a certificate are
    refused while the run goes on; a monitor with one reads telemetry; node a does the work and
    every sample is stored once. `launch check` refuses unusable TLS files at their key."""

    def write(self, machine_dir, text, cert):
        os.makedirs(machine_dir, exist_ok=True)
        text = text.replace('join_wait_s = 60.0\n', 'join_wait_s = 60.0\ntls = true\n'
                            f'tls_cert = "{cert}.pem"\ntls_key = "{cert}.key"\ntls_ca = "certs/ca.pem"\n')
        text = text.replace('secret_file = "cluster.secret"', 'secret_file = "../cluster.secret"')
        path = os.path.join(machine_dir, "cluster.toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_tls_cluster_refuses_plain_and_foreign_peers(self):
        n = 60
        with tempfile.TemporaryDirectory() as d:
            port = free_port()
            base = open(write_synthetic_config(d, port, free_port(), n, latency_ms=30)).read()
            make_certs(os.path.join(d, "head", "certs"), "head")
            shutil.copytree(os.path.join(d, "head", "certs"), os.path.join(d, "a", "certs"))
            make_certs(os.path.join(d, "a", "certs"), "a", "monitor")  # the same CA, more nodes
            make_certs(os.path.join(d, "other"), "a")  # a CA the cluster does not trust
            # The foreign peer trusts the cluster's CA too: only the head's check of its certificate
            # stands between it and the cluster.
            with open(os.path.join(d, "other", "both.pem"), "w") as f:
                for ca in (os.path.join(d, "other", "ca.pem"), os.path.join(d, "head", "certs", "ca.pem")):
                    f.write(read(ca))
            head_cfg = self.write(os.path.join(d, "head"), base, "certs/head")
            a_cfg = self.write(os.path.join(d, "a"), base, "certs/a")
            plain_cfg = os.path.join(d, "plain", "cluster.toml")
            os.makedirs(os.path.dirname(plain_cfg))
            with open(plain_cfg, "w") as f:
                f.write(base.replace("join_wait_s = 60.0", "join_wait_s = 2.0")
                        .replace('secret_file = "cluster.secret"', 'secret_file = "../cluster.secret"'))
            foreign_cfg = self.write(os.path.join(d, "foreign"), base, "../other/a")
            with open(foreign_cfg) as f:
                text = f.read().replace('tls_ca = "certs/ca.pem"', 'tls_ca = "../other/both.pem"')
                text = text.replace("join_wait_s = 60.0", "join_wait_s = 2.0")
            with open(foreign_cfg, "w") as f:
                f.write(text)
            run_dir = os.path.join(d, "run")
            store = os.path.join(run_dir, "store.sqlite")
            log = open(os.path.join(d, "head.log"), "w+")
            certs_a = os.path.join(d, "a", "certs")
            secret = os.path.join(d, "cluster.secret")

            def monitor(*args):
                return subprocess.run([LAUNCH, "monitor", f"127.0.0.1:{port}", "--once", "--json", "--secret-file",
                                       secret, "--wait", "2", *args], capture_output=True, text=True, timeout=60)

            head = start_launch(head_cfg, log, "--run-dir", run_dir)
            try:
                wait_for(lambda: "head listening" in read(log.name), 60, "the head to listen")
                # Refused at once (the head is up and ends the handshake), exit 2 as any refused
                # peer, whatever join_wait_s says (60 s here), and nothing left under run_root.
                for cfg, why in ((plain_cfg, "if the head uses [cluster] tls, so must this peer"),
                                 (foreign_cfg, "this peer uses TLS")):
                    with open(cfg) as f:
                        text = f.read().replace("join_wait_s = 2.0", "join_wait_s = 60.0")
                    with open(cfg, "w") as f:
                        f.write(text)
                    t0 = time.monotonic()
                    r = subprocess.run([LAUNCH, cfg, "--node", "a"], capture_output=True, text=True, timeout=60)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertLess(time.monotonic() - t0, 30, r.stderr)
                    self.assertIn("took the connection but ended the handshake", r.stderr)
                    self.assertIn(why, r.stderr)
                    self.assertNotIn("waiting for the head", r.stderr)
                    self.assertFalse(os.path.exists(os.path.join(d, "runs", "node-a")))
                m = monitor()
                self.assertEqual(m.returncode, 2, m.stderr)
                self.assertIn("if the head uses [cluster] tls", m.stderr)
                m = monitor("--tls-cert", os.path.join(certs_a, "monitor.pem"))
                self.assertEqual(m.returncode, 2, m.stderr)
                self.assertIn("needs all three of --tls-cert, --tls-key and --tls-ca", m.stderr)
                m = monitor("--tls-cert", os.path.join(certs_a, "monitor.pem"), "--tls-key",
                            os.path.join(certs_a, "monitor.key"), "--tls-ca", os.path.join(certs_a, "ca.pem"))
                self.assertEqual(m.returncode, 0, m.stderr)
                self.assertEqual(json.loads(m.stdout.splitlines()[-1])["cluster"], "test-cluster")
                self.assertEqual(recorded(store), 0)  # no refused peer got work

                a = subprocess.run([LAUNCH, a_cfg, "--node", "a"], capture_output=True, text=True, timeout=300)
                self.assertEqual(a.returncode, 0, a.stderr[-3000:])
                self.assertIn("node a joined cluster test-cluster", a.stdout)
                self.assertEqual(head.wait(timeout=120), 0, read(log.name)[-3000:])
            finally:
                if head.poll() is None:
                    os.killpg(head.pid, signal.SIGKILL)
                    head.wait()
                log.close()
            head_log = read(log.name)
            self.assertIn("links are TLS with certificates both ways: this head is /CN=head", head_log)
            self.assertNotIn("not encrypted", head_log)
            con = sqlite3.connect(store)
            ids = [r[0] for r in con.execute("SELECT sample_id FROM samples WHERE evaluator_id = 'a/cpu-0'")]
            self.assertEqual((len(ids), len(set(ids))), (n, n))

    def test_check_refuses_unusable_tls_files_at_their_key(self):
        with tempfile.TemporaryDirectory() as d:
            base = open(write_synthetic_config(d, free_port(), free_port(), 3, latency_ms=1)).read()
            make_certs(os.path.join(d, "m", "certs"), "head")
            make_certs(os.path.join(d, "other"), "head")
            cfg = self.write(os.path.join(d, "m"), base, "certs/head")

            def check(text):
                with open(cfg, "w") as f:
                    f.write(text)
                return subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True, timeout=60)

            good = open(cfg).read()
            r = check(good)
            self.assertEqual(r.returncode, 0, r.stderr)
            cases = [
                (good.replace('tls_ca = "certs/ca.pem"', 'tls_ca = "../other/ca.pem"'), "cluster.tls_cert",
                 "does not verify against the CA in"),
                (good.replace('tls_key = "certs/head.key"', 'tls_key = "../other/head.key"'), "cluster.tls_key",
                 "not the key of the certificate"),
                (good.replace('tls_cert = "certs/head.pem"', 'tls_cert = "certs/head.key"'), "cluster.tls_cert",
                 "not a PEM certificate"),
                (good.replace("tls = true", "tls = false"), "cluster.tls_cert", "set, but tls is false"),
                (re.sub(r'tls_ca = .*\n', "", good), "cluster.tls_ca", "missing required key"),
            ]
            for text, key, msg in cases:
                r = check(text)
                self.assertEqual(r.returncode, 2, (key, r.stderr))
                self.assertRegex(r.stderr, r"cluster\.toml:\d+:\d+: " + re.escape(key) + ": .*" + re.escape(msg))
            os.chmod(os.path.join(d, "m", "certs", "head.key"), 0o644)
            r = check(good)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("readable by group or others (mode 644); `chmod 600` it", r.stderr)


def key_of(path):
    """The key in a file `launch keygen` wrote."""
    return [l for l in read(path).splitlines() if l and not l.startswith("#")][0]


class CurveTelemetryTest(unittest.TestCase):
    """[monitor] publish_key and publish_clients: the telemetry socket is a CURVE server that
    admits only the listed readers. A listed reader gets the snapshots; a reader with another key
    and a plain one get nothing, and the head says it refused a reader."""

    def test_only_admitted_readers_get_telemetry(self):
        import zmq
        with tempfile.TemporaryDirectory() as d:
            port, pub_port = free_port(), free_port()
            cfg = write_synthetic_config(d, port, pub_port, 150, latency_ms=20)
            for name in ("server", "reader"):
                r = subprocess.run([LAUNCH, "keygen", os.path.join(d, name)], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(f"public key {d}/{name}.pub: ", r.stdout)
            self.assertEqual(os.stat(os.path.join(d, "server.key")).st_mode & 0o777, 0o600)
            with open(os.path.join(d, "readers.txt"), "w") as f:
                f.write("# who may read the telemetry\n" + key_of(os.path.join(d, "reader.pub")) + "  # me\n")
            with open(cfg) as f:
                text = f.read().replace(f'publish = "tcp://127.0.0.1:{pub_port}"',
                                        f'publish = "tcp://0.0.0.0:{pub_port}"\npublish_key = "server.key"\n'
                                        'publish_clients = "readers.txt"')
            with open(cfg, "w") as f:
                f.write(text)
            r = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)  # a non-loopback bind is fine with CURVE

            server_pub = key_of(os.path.join(d, "server.pub"))
            stranger_pub, stranger_sec = (k.decode() for k in zmq.curve_keypair())
            endpoint = f"tcp://127.0.0.1:{pub_port}"
            subs = {"admitted": Subscriber(endpoint, (server_pub, key_of(os.path.join(d, "reader.pub")),
                                                      key_of(os.path.join(d, "reader.key")))),
                    "stranger": Subscriber(endpoint, (server_pub, stranger_pub, stranger_sec)),
                    "plain": Subscriber(endpoint)}
            for sub in subs.values():
                sub.start()
            log = open(os.path.join(d, "head.log"), "w+")
            head = start_launch(cfg, log, "--run-dir", os.path.join(d, "run"))
            a_log = open(os.path.join(d, "a.log"), "w")
            a = start_launch(cfg, a_log, "--node", "a")
            try:
                self.assertEqual(head.wait(timeout=180), 0, read(log.name)[-3000:])
                a.wait(timeout=60)
                time.sleep(0.5)
            finally:
                for p in (head, a):
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                for sub in subs.values():
                    sub.stop = True
                    sub.join()
                log.close()
                a_log.close()
            self.assertGreater(len(subs["admitted"].frames), 0)
            self.assertEqual(subs["admitted"].frames[0][0], b"kernelrl.telemetry")
            self.assertEqual(subs["stranger"].frames, [])
            self.assertEqual(subs["plain"].frames, [])
            head_log = read(log.name)
            self.assertIn("CURVE: encrypted, 1 reader key(s) admitted, server public key " + server_pub, head_log)
            self.assertIn("telemetry: refused a reader at 127.0.0.1", head_log)

    def test_check_refuses_half_or_bad_curve_settings(self):
        with tempfile.TemporaryDirectory() as d:
            port, pub_port = free_port(), free_port()
            cfg = write_synthetic_config(d, port, pub_port, 3, latency_ms=1)
            subprocess.run([LAUNCH, "keygen", os.path.join(d, "server")], check=True, capture_output=True)
            base = read(cfg)
            pub = f'publish = "tcp://127.0.0.1:{pub_port}"'
            with open(os.path.join(d, "bad.txt"), "w") as f:
                f.write("not-a-key\n")
            os.chmod(os.path.join(d, "bad.txt"), 0o600)
            cases = [
                (pub + '\npublish_key = "server.key"', "monitor.publish_key", "set publish_key and publish_clients"),
                (pub + '\npublish_key = "server.key"\npublish_clients = "bad.txt"', "monitor.publish_clients",
                 "bad.txt:1: expected a public CURVE key of 40 Z85 characters"),
                (pub + '\npublish_key = "bad.txt"\npublish_clients = "server.pub"', "monitor.publish_key",
                 "expected a CURVE key of 40 Z85 characters"),
                (pub.replace("127.0.0.1", "0.0.0.0"), "monitor.publish", "unless publish_key and publish_clients"),
            ]
            for text, key, msg in cases:
                with open(cfg, "w") as f:
                    f.write(base.replace(pub, text))
                r = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True)
                self.assertEqual(r.returncode, 2, (key, r.stderr))
                self.assertRegex(r.stderr, r"cluster\.toml:\d+:\d+: " + re.escape(key) + ": .*" + re.escape(msg))
            os.chmod(os.path.join(d, "server.key"), 0o644)
            with open(cfg, "w") as f:
                f.write(base.replace(pub, pub + '\npublish_key = "server.key"\npublish_clients = "server.pub"'))
            r = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("a secret key readable by group or others; `chmod 600` it", r.stderr)


class NamespaceTest(unittest.TestCase):
    """The head and a node on two network stacks joined by a veth pair: nothing shared but the
    link (as two machines), and the head listening on its configured address only."""

    def setUp(self):
        why = netns_unavailable()
        if why:
            self.skipTest(why)
        tag = "%x" % (os.getpid() & 0xffff)
        self.ns_head, self.ns_node = "krl-h-" + tag, "krl-n-" + tag
        self.subnet = "10.231.%d" % (os.getpid() % 250 + 1)
        cmds = [["ip", "netns", "add", self.ns_head], ["ip", "netns", "add", self.ns_node],
                ["ip", "link", "add", "krlh" + tag, "type", "veth", "peer", "name", "krln" + tag],
                ["ip", "link", "set", "krlh" + tag, "netns", self.ns_head],
                ["ip", "link", "set", "krln" + tag, "netns", self.ns_node],
                ["ip", "-n", self.ns_head, "addr", "add", self.subnet + ".1/24", "dev", "krlh" + tag],
                ["ip", "-n", self.ns_node, "addr", "add", self.subnet + ".2/24", "dev", "krln" + tag],
                ["ip", "-n", self.ns_head, "link", "set", "krlh" + tag, "up"],
                ["ip", "-n", self.ns_node, "link", "set", "krln" + tag, "up"],
                ["ip", "-n", self.ns_head, "link", "set", "lo", "up"],
                ["ip", "-n", self.ns_node, "link", "set", "lo", "up"]]
        for c in cmds:
            r = subprocess.run(c, capture_output=True, text=True)
            if r.returncode != 0:
                self.tearDown()
                self.fail(f"{' '.join(c)}: {r.stderr.strip()}")

    def tearDown(self):
        for ns in (getattr(self, "ns_head", None), getattr(self, "ns_node", None)):
            if ns:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def test_a_node_in_another_namespace_evaluates_over_the_veth_link(self):
        n = 200
        with tempfile.TemporaryDirectory() as d:
            head_ip, node_ip = self.subnet + ".1", self.subnet + ".2"
            port = 47500 + os.getpid() % 400
            cfg = write_synthetic_config(d, port, port + 1, n, latency_ms=20, host=head_ip, node_host=node_ip)
            run_dir = os.path.join(d, "run")
            store = os.path.join(run_dir, "store.sqlite")
            logs = {k: open(os.path.join(d, k + ".log"), "w+") for k in ("head", "a")}
            head = subprocess.Popen(["ip", "netns", "exec", self.ns_head, LAUNCH, cfg, "--run-dir", run_dir],
                                    stdout=logs["head"], stderr=subprocess.STDOUT)
            a = subprocess.Popen(["ip", "netns", "exec", self.ns_node, LAUNCH, cfg, "--node", "a"],
                                 stdout=logs["a"], stderr=subprocess.STDOUT)
            try:
                wait_for(lambda: recorded(store) >= 5 or head.poll() is not None, 120, "samples over the veth link")
                # The head listens on its configured address only: not on its namespace's loopback.
                probe = "import socket,sys\ns=socket.socket()\ns.settimeout(3)\n" \
                        f"sys.exit(s.connect_ex(('127.0.0.1',{port})))"
                r = subprocess.run(["ip", "netns", "exec", self.ns_head, sys.executable, "-c", probe])
                self.assertNotEqual(r.returncode, 0, "the head must not listen on 127.0.0.1 when told " + head_ip)
                rc = head.wait(timeout=300)
                self.assertEqual(a.wait(timeout=60), 0)
            finally:
                for p in (head, a):
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                for f in logs.values():
                    f.close()
            head_log = read(os.path.join(d, "head.log"))
            self.assertEqual(rc, 0, head_log[-3000:])
            self.assertIn(f"head listening on {head_ip}:{port}", head_log)
            self.assertIn(f"{head_ip} is not a loopback address and the link between nodes is not encrypted", head_log)
            con = sqlite3.connect(store)
            rows = con.execute("SELECT sample_id, evaluator_id FROM samples").fetchall()
            self.assertEqual(len(rows), n)
            self.assertEqual(len({r[0] for r in rows}), n)
            self.assertEqual({r[1] for r in rows}, {"a/cpu-0"}, "every sample crossed the link")


if __name__ == "__main__":
    unittest.main()
