"""[tracking] end to end: `launch CONFIG` with backend tensorboard, mlflow and wandb (offline) logs a train run's steps
(reward, fast_1, fast_1.2, correct rate, the learner's loss, entropy, grad norm, samples/s, staleness), its held-out
fast_1 per version, its config and its summary through each library's own client, and a comparison's table. Read back
with each library's own reader (TensorBoard's EventAccumulator, MLflow's MlflowClient, W&B's offline datastore) from the
tracking environment (scripts/tracking-python) and checked against the run's store."""
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
TRACKING_PYTHON = os.path.join(ROOT, "scripts", "tracking-python")

# Reads what a backend wrote, in the tracking environment: {"metrics": {name: [[step, value], ...]}, "config": {...},
# "summary": {...}, "tables": {name: [columns, rows]}}.
READER = r'''
import glob, json, os, sys
backend, folder, name = sys.argv[1:4]
out = {"metrics": {}, "config": {}, "summary": {}, "tables": {}}
if backend == "tensorboard":
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(os.path.join(folder, "tensorboard", name), size_guidance={"tensors": 0})
    ea.Reload()
    for tag in ea.Tags()["scalars"]:
        out["metrics"][tag] = [[e.step, e.value] for e in ea.Scalars(tag)]
    for tag in ea.Tags()["tensors"]:
        text = ea.Tensors(tag)[0].tensor_proto.string_val[0].decode()
        out["tables" if tag.startswith("comparison") else "config" if tag.startswith("config") else "summary"][tag] = text
elif backend == "mlflow":
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    from mlflow.tracking import MlflowClient
    c = MlflowClient(tracking_uri="file:" + os.path.join(folder, "mlruns"))
    exp = c.get_experiment_by_name("kernelrl")
    run = [r for r in c.search_runs([exp.experiment_id]) if r.info.run_name == name][0]
    for key in run.data.metrics:
        out["metrics"][key] = [[m.step, m.value] for m in c.get_metric_history(run.info.run_id, key)]
    out["config"] = run.data.params
    out["status"] = run.info.status
    local = c.download_artifacts(run.info.run_id, "")
    for f in os.listdir(local):
        with open(os.path.join(local, f)) as fh:
            out["tables" if f.startswith("comparison") else "summary"][f] = json.load(fh)
else:
    from wandb.sdk.internal import datastore
    from wandb.proto import wandb_internal_pb2
    for f in glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb")):
        ds = datastore.DataStore()
        ds.open_for_scan(f)
        records = []
        while True:
            data = ds.scan_data()
            if data is None:
                break
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            records.append(rec)
        runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        if not runs or runs[0].display_name != name:
            continue
        for r in records:
            kind = r.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                axis = items.get("version", items.get("step"))  # the step metric each series is drawn on
                for k, v in items.items():
                    if not k.startswith("_") and k not in ("step", "version") and isinstance(v, (int, float)):
                        out["metrics"].setdefault(k, []).append([axis, v])
                    elif isinstance(v, dict) and v.get("_type") == "table-file":
                        out["tables"][k] = v
            elif kind == "config":
                for i in r.config.update:
                    out["config"][i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
            elif kind == "summary":
                for i in r.summary.update:
                    out["summary"][i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
        for r in runs:
            for i in r.config.update:
                out["config"][i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
print(json.dumps(out))
'''


def read_back(backend, folder, name):
    p = subprocess.run([TRACKING_PYTHON, "-c", READER, backend, folder, name], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def write_config(d, backend, extra=""):
    path = os.path.join(d, "track-%s.toml" % backend)
    with open(path, "w") as f:
        f.write("""
[cluster]
log_level = "warn"
[[node]]
name = "local"
roles = ["supervisor", "learner", "sampler", "evaluator", "monitor"]
cpu_slots = 2
[tasks]
dir = "%s"
split = "train"
[policy]
model = "%s"
dtype = "f32"
[sampler]
backend = "libtorch"
max_tokens = 96
batch_prompts = 8
[evaluator]
mode = "fast"
correctness_trials = 2
warmup = 1
fast_trials = 3
timeout_s = 20
torch_threads = 1
[learner]
steps = 2
batch_size = 4
group_size = 4
lora_rank = 4
lora_alpha = 8
learning_rate = 5e-3
dtype = "f32"
[experiment]
mode = "train"
eval_ids = ["06", "09"]
eval_samples = 2
name = "track"
run_root = "%s"
[monitor]
progress = false
interval_s = 0.2
[tracking]
backend = "%s"
""" % (os.path.join(ROOT, "tasks", "bundled"), os.path.join(ROOT, "policies", "local"), os.path.join(d, "runs"),
       backend) + extra)
    return path


def store_steps(run_dir):
    db = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
    rows = {s: json.loads(j) for s, j in db.execute("SELECT step, stats_json FROM steps")}
    db.close()
    return rows


class TrackingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-tracking-")

    def run_backend(self, backend):
        run_dir = os.path.join(self.tmp, backend)
        p = subprocess.run([LAUNCH, write_config(self.tmp, backend), "--run-dir", run_dir], capture_output=True,
                           text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        got = read_back(backend, os.path.join(run_dir, "tracking"), backend)
        steps = store_steps(run_dir)
        m = got["metrics"]
        for key in ["reward", "fast_1", "fast_1.2", "correct_rate", "learner/loss", "learner/entropy",
                    "learner/grad_norm", "learner/kl", "throughput/samples_per_s", "staleness/mean"]:
            self.assertIn(key, m, (backend, sorted(m)))
        self.assertEqual([s for s, _ in m["fast_1"]], [0, 1])
        for s, v in m["fast_1"]:
            self.assertAlmostEqual(v, steps[s]["fast_1"], places=5)
        for s, v in m["learner/loss"]:
            self.assertAlmostEqual(v, steps[s]["learner"]["loss"], places=5)
        for s, v in m["reward"]:
            self.assertAlmostEqual(v, steps[s]["mean_reward"], places=5)
        # The held-out rounds, at the versions they evaluated (the first and the last).
        a = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        held = {e["step"]: e["fast_1"] for e in a["eval"]["steps"]}
        self.assertEqual(sorted(s for s, _ in m["heldout/fast_1"]), sorted(held))
        for s, v in m["heldout/fast_1"]:
            self.assertAlmostEqual(v, held[s], places=5)
        return got

    def test_tensorboard(self):
        got = self.run_backend("tensorboard")
        self.assertIn("learner.steps = 2", got["config"]["config/text_summary"])
        self.assertIn('"mode": "train"', got["summary"]["summary/text_summary"])

    def test_mlflow(self):
        got = self.run_backend("mlflow")
        self.assertEqual(got["status"], "FINISHED")
        self.assertEqual(got["config"]["learner.steps"], "2")
        self.assertEqual(got["summary"]["summary.json"]["mode"], "train")

    def test_wandb_offline(self):
        got = self.run_backend("wandb")
        self.assertEqual(got["config"]["learner.steps"], 2)
        self.assertEqual(got["summary"]["mode"], "train")

    def test_a_comparison_logs_its_table(self):
        cfg = write_config(self.tmp, "tensorboard", extra="""
[comparison]
arms = ["a", "b"]
[arm.a.evaluator]
seed = 1
[arm.b.evaluator]
seed = 2
""").replace("track-tensorboard", "track-cmp")
        os.rename(os.path.join(self.tmp, "track-tensorboard.toml"), cfg)
        with open(cfg) as f:
            text = f.read().replace('mode = "train"', 'mode = "eval"').replace('eval_ids = ["06", "09"]\neval_samples = 2\n',
                                                                            "")
        text = text.replace("[learner]\nsteps = 2\nbatch_size = 4\ngroup_size = 4\n", "[learner]\n")
        with open(cfg, "w") as f:
            f.write(text.replace('[sampler]\nbackend = "libtorch"', '[sampler]\nbackend = "libtorch"\nsamples_per_task = 1'))
        root = os.path.join(self.tmp, "cmp")
        p = subprocess.run([LAUNCH, cfg, "--run-dir", root], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:] + p.stdout[-2000:])
        folder = os.path.join(root, "tracking")
        for arm in ["a", "b"]:  # each arm's run under its name, in the comparison's one folder
            self.assertIn("fast_1", read_back("tensorboard", folder, arm)["metrics"])
        table = read_back("tensorboard", folder, "cmp")["tables"]
        text = next(iter(table.values()))
        self.assertIn("| run | arm | seed | mode | rollouts", text)
        self.assertIn("| a | a |", text)
        self.assertIn("| b | b |", text)


if __name__ == "__main__":
    unittest.main()
