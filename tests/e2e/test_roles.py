"""Roles off the head, every process started as a user starts it (`launch CONFIG` for the head,
`launch CONFIG --node NAME` for each other machine), real processes talking through CAF's
middleman on loopback.

SamplerNodesTest: a train run whose head has no sampler. Two sampler nodes, each a built-in
sampler of a tiny random Qwen2 on the CPU: the first joins as the run starts; the second joins
once a later step is under way and must be brought to the current policy version before it
samples; then the first is killed with SIGKILL (its whole process group, as a machine dies) while
it holds work. The run must finish with every planned sample stored exactly once, each sampled by
the policy of its step, the dead node's unfinished groups sampled by the other.

LearnerNodeTest: a train run whose learner (and checkpoint selector) runs on a node of its own,
which writes the run's checkpoints; that node is killed with SIGKILL once step 2's checkpoint is
written. The head must end the run naming the last checkpoint and the way on; then the head with
--resume and the learner node started again finish the run, every step learned once and every
planned sample stored once, each by the policy of its step. Also: the monitor on a node of its own
(telemetry, metrics.jsonl, the store's snapshots and `launch monitor` through the head; the run
outlives it), a sampler node whose prompts differ from the head's refused, and a sampler and
learner node on the far side of a veth link between two network namespaces.
"""
import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cluster import PROBE, NamespaceTest, free_port, recorded, start_launch, wait_for, SECRET  # noqa: E402
from test_train import tiny_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
STEPS, BATCH, GROUP = 10, 4, 2


def read_log(f):
    f.flush()
    f.seek(0)
    return f.read()


@contextlib.contextmanager
def launched(logs):
    """The test's `launch` processes by name: on a failure every log's tail goes to stderr, and
    whatever still runs at the end is killed (its whole process group)."""
    procs = {}
    try:
        yield procs
    except BaseException:
        for n, f in logs.items():
            sys.stderr.write("---- %s ----\n%s\n" % (n, read_log(f)[-3000:]))
        raise
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def stored_once_on_policy(test, run_dir, steps=STEPS):
    """The run's samples (`launch export`), checked: every planned sample stored once, each by the
    policy of its step."""
    export = [json.loads(line) for line in subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True,
                                                          text=True, check=True).stdout.splitlines()]
    test.assertEqual(len(export), steps * BATCH * GROUP)
    test.assertEqual(len({x["sample_id"] for x in export}), len(export))
    for x in export:
        test.assertEqual(x["policy_version"], x["step"], x["sample_id"])
    return export


def head_node(role):
    """The head's [[node]] (port left to fill in): supervisor, evaluator, monitor and `role`."""
    return """
[[node]]
name = "head"
host = "127.0.0.1"
port = {port}
roles = ["supervisor", "%s", "evaluator", "monitor"]
cpu_slots = 1""" % role


class TinyModelCase(unittest.TestCase):
    """A scratch folder with a tiny random Qwen2 in it, for the whole class."""
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-roles-")
        cls.model = tiny_model(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)


class SamplerNodesTest(TinyModelCase):

    def config(self, port, nodes=None, max_tokens=8, peer_timeout_s=3.0):
        nodes = nodes or head_node("learner") + """
[[node]]
name = "gen-a"
roles = ["sampler"]
sampler_devices = ["cpu"]
[[node]]
name = "gen-b"
roles = ["sampler"]
sampler_devices = ["cpu"]
"""
        with open(os.path.join(self.tmp, "cluster.secret"), "w") as f:
            f.write(SECRET + "\n")
        os.chmod(os.path.join(self.tmp, "cluster.secret"), 0o600)  # a secret only its owner reads (launch refuses others)
        path = os.path.join(self.tmp, "roles.toml")
        with open(path, "w") as f:
            f.write(f"""
[cluster]
name = "roles-test"
secret_file = "cluster.secret"
heartbeat_s = 0.5
peer_timeout_s = {peer_timeout_s}
join_wait_s = 120.0
{nodes.format(port=port)}
[tasks]
dir = "{os.path.join(ROOT, "tasks", "bundled")}"
ids = ["06_swish", "07_hardtanh_scale", "09_row_sum", "10_row_max"]
[policy]
model = "{self.model}"
dtype = "f32"
template = "plain"
[sampler]
backend = "libtorch"
max_tokens = {max_tokens}
batch_prompts = 1
[learner]
steps = {STEPS}
batch_size = {BATCH}
group_size = {GROUP}
lora_rank = 4
lora_alpha = 8
sync_timeout_s = 60
[evaluator]
timeout_s = 60
[experiment]
mode = "train"
seed = 7
name = "roles"
run_root = "{os.path.join(self.tmp, "runs")}"
[monitor]
progress = false
""")
        return path

    def test_samplers_on_other_nodes_join_late_and_one_dies_holding_work(self):
        # Longer completions than the other tests' (a step takes about half a second, not a tenth),
        # and peers declared gone after 30 s: gen-a, stopped below while it holds work, is gone
        # only once gen-b (seconds to start) has joined, and its work then moves to gen-b.
        cfg = self.config(free_port(), max_tokens=32, peer_timeout_s=30.0)
        run_dir = os.path.join(self.tmp, "run")
        store = os.path.join(run_dir, "store.sqlite")
        logs = {n: open(os.path.join(self.tmp, n + ".log"), "w+") for n in ("head", "gen-a", "gen-b")}
        with launched(logs) as procs:
            procs["head"] = start_launch(cfg, logs["head"], "--run-dir", run_dir)
            procs["gen-a"] = start_launch(cfg, logs["gen-a"], "--node", "gen-a")
            wait_for(lambda: recorded(store, "step >= 2") > 0, 300, "samples of step 2")
            # Its machine stops (and is killed below): the run cannot end before gen-b has joined.
            os.killpg(procs["gen-a"].pid, signal.SIGSTOP)
            procs["gen-b"] = start_launch(cfg, logs["gen-b"], "--node", "gen-b")
            wait_for(lambda: recorded(store, "sampler_id = 'sampler-gen-b-0'") > 0, 600, "gen-b's first sample")
            os.killpg(procs["gen-a"].pid, signal.SIGKILL)  # as its machine dies, wherever the step is
            procs["gen-a"].wait(timeout=30)
            self.assertEqual(procs["head"].wait(timeout=900), 0, self.read(logs["head"])[-4000:])
            self.assertEqual(procs["gen-b"].wait(timeout=60), 0, self.read(logs["gen-b"])[-3000:])
        head_log = self.read(logs["head"])
        for f in logs.values():
            f.close()
        export = stored_once_on_policy(self, run_dir)
        by = {}
        for x in export:
            by.setdefault(x["sampler_id"], []).append(x["step"])
        self.assertEqual(set(by), {"sampler-gen-a-0", "sampler-gen-b-0"})
        self.assertEqual(min(by["sampler-gen-a-0"]), 0)
        self.assertGreaterEqual(min(by["sampler-gen-b-0"]), 2)  # it joined late
        # After the kill only gen-b samples: the last step is all its own.
        self.assertEqual({x["sampler_id"] for x in export if x["step"] == STEPS - 1}, {"sampler-gen-b-0"})
        self.assertIn("the head runs no sampler", head_log)
        self.assertRegex(head_log, r"sampler-gen-b-0 joined at policy version [1-9]")
        self.assertIn("sampler-gen-b-0 joined (2 sampler(s) running)", head_log)
        gone = re.search(r"sampler-gen-a-0 is gone \(.*\): (\d+) of its samples not yet stored; (\d+) planned again", head_log)
        self.assertIsNotNone(gone, head_log[-3000:])
        print("gen-a killed holding %s samples not yet stored, %s planned again" % gone.groups(), file=sys.stderr)
        # Every step learned once; each new version went to the samplers (its size and the time
        # until every live sampler acknowledged it are in the step's figures).
        steps = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                          check=True).stdout)["steps"]
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        for s in steps:
            self.assertGreater(s["learner"]["weight_sync_mb"], 0, s)
            self.assertGreater(s["learner"]["weight_sync_s"], 0, s)

    def test_a_sampler_node_rendering_other_prompts_is_refused(self):
        # The node's own copy of the config asks for another prompt template: its prompts are not
        # the head's, and the head refuses its sampler rather than learn from other prompts.
        cfg = self.config(free_port())
        with open(cfg) as f:
            text = f.read()
        other = cfg.replace(".toml", "-other.toml")
        with open(other, "w") as f:
            f.write(text.replace('template = "plain"', 'template = "chatml"'))
        logs = {n: open(os.path.join(self.tmp, "digest-" + n + ".log"), "w+") for n in ("head", "gen-a")}
        with launched(logs) as procs:
            procs["head"] = start_launch(cfg, logs["head"], "--run-dir", os.path.join(self.tmp, "digest-run"))
            procs["gen-a"] = start_launch(other, logs["gen-a"], "--node", "gen-a")
            self.assertEqual(procs["gen-a"].wait(timeout=300), 1, self.read(logs["gen-a"])[-3000:])
            node_log = self.read(logs["gen-a"])
            os.killpg(procs["head"].pid, signal.SIGTERM)
            procs["head"].wait(timeout=60)
        for f in logs.values():
            f.close()
        self.assertIn('sampler-gen-a-0: node "gen-a" renders the tasks\' prompts differently from the head', node_log)
        self.assertIn("give every node the same config, task files and model tokenizer", node_log)

    read = staticmethod(read_log)


class LearnerNodeTest(TinyModelCase):
    NODES = head_node("sampler") + """
[[node]]
name = "trainer"
roles = ["learner"]
"""

    def test_the_learner_on_its_own_node_dies_and_the_run_resumes(self):
        cfg = SamplerNodesTest.config(self, free_port(), self.NODES)
        run_dir = os.path.join(self.tmp, "run")
        logs = {n: open(os.path.join(self.tmp, n + ".log"), "w+") for n in ("head", "trainer", "head2", "trainer2")}
        read = read_log
        with launched(logs) as procs:
            procs["head"] = start_launch(cfg, logs["head"], "--run-dir", run_dir)
            procs["trainer"] = start_launch(cfg, logs["trainer"], "--node", "trainer")
            marker = os.path.join(run_dir, "checkpoints", "step-2", "learner.json")
            wait_for(lambda: os.path.exists(marker) or procs["head"].poll() is not None, 600, "step 2's checkpoint")
            self.assertTrue(os.path.exists(marker), read(logs["head"])[-3000:])
            # A joined peer that is not the learner node gets neither the run directory nor the role.
            with open(cfg) as f:
                port = re.search(r"port = (\d+)", f.read()).group(1)
            r = subprocess.run([PROBE, "127.0.0.1", port, "--cluster", "roles-test", "--secret", SECRET, "--name",
                                "intruder", "learner"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
            self.assertIn("refused: refused by the head: this run's learner is node \"trainer\"'s", r.stdout)
            os.killpg(procs["trainer"].pid, signal.SIGKILL)  # as its machine dies
            procs["trainer"].wait(timeout=30)
            self.assertNotEqual(procs["head"].wait(timeout=120), 0)
            first = read(logs["head"])
            self.assertIn("the learner of node trainer joined", first)
            self.assertRegex(first, r"the learner of node trainer is gone \(.*\); its last checkpoint is \S+step-\d+ "
                                    r"\(on node trainer\); once the node runs again, `launch CONFIG --resume \S+` "
                                    r"continues the run")
            # Started again, the other way round: the node first, it waits for the head.
            procs["trainer2"] = start_launch(cfg, logs["trainer2"], "--node", "trainer")
            procs["head2"] = start_launch(cfg, logs["head2"], "--resume", run_dir)
            self.assertEqual(procs["head2"].wait(timeout=900), 0, read(logs["head2"])[-4000:])
            self.assertEqual(procs["trainer2"].wait(timeout=60), 0, read(logs["trainer2"])[-3000:])
        trainer2_log = read(logs["trainer2"])
        for f in logs.values():
            f.close()
        self.assertIn("resuming from", trainer2_log)
        self.assertIn("the learner runs here; checkpoints in", trainer2_log)
        stored_once_on_policy(self, run_dir)
        steps = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                          check=True).stdout)["steps"]
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        self.assertTrue(os.path.isdir(os.path.join(run_dir, "checkpoints", "step-%d" % STEPS)))

    def test_the_monitor_on_a_node_of_its_own_and_the_run_outliving_it(self):
        # The head runs no monitor; node "watch" does: it draws the telemetry of the head's
        # actors across the network, writes metrics.jsonl, publishes on its own ZeroMQ socket,
        # has the head store its snapshots, and answers `launch monitor` through the gate. Killed
        # mid-run, it takes only the telemetry with it.
        from test_cluster import Subscriber
        port, pub_port = free_port(), free_port()
        nodes = """
[[node]]
name = "head"
host = "127.0.0.1"
port = {port}
roles = ["supervisor", "sampler", "learner", "evaluator"]
cpu_slots = 1
[[node]]
name = "watch"
host = "127.0.0.1"
roles = ["monitor"]
"""
        cfg = SamplerNodesTest.config(self, port, nodes)
        with open(cfg) as f:
            text = f.read()
        # Long enough to outlast the query and the node's kill below: its candidates are all
        # format errors, answered without a process, and ten steps took 3.5 s (CI, 2026-11-28).
        with open(cfg, "w") as f:
            f.write(text.replace(f"steps = {STEPS}\n", "steps = 80\n"))
        with open(cfg, "a") as f:  # [monitor] is the config's last table
            f.write('interval_s = 0.2\npublish = "tcp://127.0.0.1:%d"\n' % pub_port)
        run_dir = os.path.join(self.tmp, "watched")
        store = os.path.join(run_dir, "store.sqlite")
        logs = {n: open(os.path.join(self.tmp, "watch-" + n + ".log"), "w+") for n in ("head", "watch")}
        sub = Subscriber(f"tcp://127.0.0.1:{pub_port}")
        sub.start()
        try:
            with launched(logs) as procs:
                procs["head"] = start_launch(cfg, logs["head"], "--run-dir", run_dir)
                procs["watch"] = start_launch(cfg, logs["watch"], "--node", "watch")
                wait_for(lambda: "the monitor runs here" in read_log(logs["watch"]), 120, "the monitor node")
                wait_for(lambda: recorded(store, "step >= 2") > 0, 300, "samples of step 2")
                m = subprocess.run([LAUNCH, "monitor", f"127.0.0.1:{port}", "--once", "--json", "--secret-file",
                                    os.path.join(self.tmp, "cluster.secret")], capture_output=True, text=True,
                                   timeout=60)
                self.assertEqual(m.returncode, 0, m.stderr)
                v = json.loads(m.stdout.strip().splitlines()[-1])["values"]
                self.assertGreaterEqual(v["supervisor.step"], 2)
                self.assertGreater(v["supervisor.samples_done"], 0)
                self.assertIn("dispatcher.queue_depth", v)
                self.assertIn("learner.updates", v)
                wait_for(lambda: len(sub.frames) > 0, 30, "a snapshot on the monitor node's socket")
                os.killpg(procs["watch"].pid, signal.SIGKILL)
                procs["watch"].wait(timeout=30)
                self.assertEqual(procs["head"].wait(timeout=900), 0, read_log(logs["head"])[-4000:])
                head_log = read_log(logs["head"])
        finally:
            sub.stop = True
            sub.join()
        for f in logs.values():
            f.close()
        self.assertIn("the monitor runs on node watch", head_log)
        self.assertIn('the monitor of node "watch" registered', head_log)
        self.assertIn('the monitor of node "watch" is gone', head_log)
        stored_once_on_policy(self, run_dir, steps=80)
        self.assertEqual(sub.frames[0][0], b"kernelrl.telemetry")
        # Its snapshots, on its machine's disk under the run directory and in the head's store.
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        self.assertGreater(len(lines), 0)
        db = sqlite3.connect(store)
        rows = db.execute("SELECT COUNT(*) FROM telemetry").fetchone()[0]
        db.close()
        self.assertGreater(rows, 0)

    def test_the_monitor_role_is_the_monitor_nodes_alone(self):
        # Another joined node asking for the monitor's place is refused by the head.
        nodes = head_node("learner").replace('"monitor"', '"sampler"') + """
[[node]]
name = "watch"
host = "127.0.0.1"
roles = ["monitor"]
"""
        port = free_port()
        cfg = SamplerNodesTest.config(self, port, nodes)
        run_dir = os.path.join(self.tmp, "intruded")
        logs = {"head": open(os.path.join(self.tmp, "intruded-head.log"), "w+")}
        with launched(logs) as procs:
            procs["head"] = start_launch(cfg, logs["head"], "--run-dir", run_dir)
            wait_for(lambda: "the monitor runs on node watch" in read_log(logs["head"]), 120, "the head")
            r = subprocess.run([PROBE, "127.0.0.1", str(port), "--cluster", "roles-test", "--secret", SECRET, "--name",
                                "intruder", "monitor"], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
            self.assertIn('refused: refused by the head: this run\'s monitor is node "watch"\'s', r.stdout)
            os.killpg(procs["head"].pid, signal.SIGTERM)
            procs["head"].wait(timeout=60)
        logs["head"].close()


class RolesAcrossNamespacesTest(TinyModelCase, NamespaceTest):
    """A train run whose sampler and learner run on a node in another network namespace, joined to
    the head's by a veth pair only (as two machines): the sampler's rollouts, the weights of every
    version and the learner's checkpoint notices all cross that link."""

    # The namespaces come from NamespaceTest (setUp/tearDown); its own test is not repeated here.
    test_a_node_in_another_namespace_evaluates_over_the_veth_link = None

    def test_sampler_and_learner_on_the_far_side_of_a_link(self):
        head_ip, node_ip = self.subnet + ".1", self.subnet + ".2"
        port = 47900 + os.getpid() % 90
        nodes = f"""
[[node]]
name = "head"
host = "{head_ip}"
port = {{port}}
roles = ["supervisor", "evaluator", "monitor"]
cpu_slots = 1
[[node]]
name = "far"
host = "{node_ip}"
roles = ["sampler", "learner"]
sampler_devices = ["cpu"]
"""
        cfg = SamplerNodesTest.config(self, port, nodes)
        run_dir = os.path.join(self.tmp, "run")
        logs = {n: open(os.path.join(self.tmp, "ns-" + n + ".log"), "w+") for n in ("head", "far")}
        with launched(logs) as procs:
            procs["head"] = subprocess.Popen(["ip", "netns", "exec", self.ns_head, LAUNCH, cfg, "--run-dir", run_dir],
                                             stdout=logs["head"], stderr=subprocess.STDOUT, start_new_session=True)
            procs["far"] = subprocess.Popen(["ip", "netns", "exec", self.ns_node, LAUNCH, cfg, "--node", "far"],
                                            stdout=logs["far"], stderr=subprocess.STDOUT, start_new_session=True)
            self.assertEqual(procs["head"].wait(timeout=900), 0, read_log(logs["head"])[-4000:])
            self.assertEqual(procs["far"].wait(timeout=60), 0, read_log(logs["far"])[-3000:])
            head_log, far_log = read_log(logs["head"]), read_log(logs["far"])
        for f in logs.values():
            f.close()
        self.assertIn(f"head listening on {head_ip}:{port}", head_log)
        self.assertIn("the learner runs here", far_log)
        export = stored_once_on_policy(self, run_dir)
        self.assertEqual({x["sampler_id"] for x in export}, {"sampler-far-0"})
        self.assertTrue(os.path.isdir(os.path.join(run_dir, "checkpoints", "step-%d" % STEPS)))
        steps = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                          check=True).stdout)["steps"]
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))

if __name__ == "__main__":
    unittest.main()
