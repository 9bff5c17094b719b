"""Roles off the head, every process started as a user starts it (`launch CONFIG` for the head,
`launch CONFIG --node NAME` for each other machine), real processes talking through CAF's
middleman on loopback.

SamplerNodesTest: a train run whose head has no sampler. Two sampler nodes, each a built-in
sampler of a tiny random Qwen2 on the CPU: the first joins as the run starts; the second joins
once a later step is under way and must be brought to the current policy version before it
samples; then the first is killed with SIGKILL (its whole process group, as a machine dies) while
it holds work. The run must finish with every planned sample stored exactly once, each sampled by
the policy of its step, the dead node's unfinished groups sampled by the other.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cluster import free_port, recorded, start_launch, wait_for, SECRET  # noqa: E402
from test_train import tiny_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
STEPS, BATCH, GROUP = 10, 4, 2


class SamplerNodesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-roles-")
        cls.model = tiny_model(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def config(self, port):
        with open(os.path.join(self.tmp, "cluster.secret"), "w") as f:
            f.write(SECRET + "\n")
        path = os.path.join(self.tmp, "roles.toml")
        with open(path, "w") as f:
            f.write(f"""
[cluster]
name = "roles-test"
secret_file = "cluster.secret"
heartbeat_s = 0.5
peer_timeout_s = 3.0
join_wait_s = 120.0
[[node]]
name = "head"
host = "127.0.0.1"
port = {port}
roles = ["supervisor", "learner", "evaluator", "monitor"]
cpu_slots = 1
[[node]]
name = "gen-a"
roles = ["sampler"]
sampler_devices = ["cpu"]
[[node]]
name = "gen-b"
roles = ["sampler"]
sampler_devices = ["cpu"]
[tasks]
dir = "{os.path.join(ROOT, "tasks", "bundled")}"
ids = ["06_swish", "07_hardtanh_scale", "09_row_sum", "10_row_max"]
[policy]
model = "{self.model}"
dtype = "f32"
template = "plain"
[sampler]
backend = "libtorch"
max_tokens = 8
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
        cfg = self.config(free_port())
        run_dir = os.path.join(self.tmp, "run")
        store = os.path.join(run_dir, "store.sqlite")
        logs = {n: open(os.path.join(self.tmp, n + ".log"), "w+") for n in ("head", "gen-a", "gen-b")}
        procs = {}
        try:
            procs["head"] = start_launch(cfg, logs["head"], "--run-dir", run_dir)
            procs["gen-a"] = start_launch(cfg, logs["gen-a"], "--node", "gen-a")
            wait_for(lambda: recorded(store, "step >= 2") > 0, 300, "samples of step 2")
            procs["gen-b"] = start_launch(cfg, logs["gen-b"], "--node", "gen-b")
            wait_for(lambda: recorded(store, "sampler_id = 'sampler-gen-b-0'") > 0, 600, "gen-b's first sample")
            os.killpg(procs["gen-a"].pid, signal.SIGKILL)  # as its machine dies, wherever the step is
            procs["gen-a"].wait(timeout=30)
            self.assertEqual(procs["head"].wait(timeout=900), 0, self.read(logs["head"])[-4000:])
            self.assertEqual(procs["gen-b"].wait(timeout=60), 0, self.read(logs["gen-b"])[-3000:])
        except BaseException:
            for n, f in logs.items():
                sys.stderr.write("---- %s ----\n%s\n" % (n, self.read(f)[-3000:]))
            raise
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            head_log = self.read(logs["head"])
            for f in logs.values():
                f.close()
        export = [json.loads(line) for line in subprocess.run([LAUNCH, "export", run_dir, "--jsonl"],
                                                              capture_output=True, text=True,
                                                              check=True).stdout.splitlines()]
        # Every planned sample stored once, each by the policy of its step.
        self.assertEqual(len(export), STEPS * BATCH * GROUP)
        self.assertEqual(len({x["sample_id"] for x in export}), len(export))
        for x in export:
            self.assertEqual(x["policy_version"], x["step"], x["sample_id"])
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

    @staticmethod
    def read(f):
        f.flush()
        f.seek(0)
        return f.read()


if __name__ == "__main__":
    unittest.main()
