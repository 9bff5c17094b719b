"""configs/local.toml, the embedded default: the small policy in policies/local learns from
execution-grounded rewards on this machine's CPU.

A shortened run of its rl arm (as `launch check` resolves it, with the held-out evaluation pointed
at the train split: versions 0 and 8 each sample every train task 8 times) must end with a higher
train-split fast_1 and correct rate than the SFT starting point; `launch analyze --json` shows the
fast_1 of every step; the progress line shows the step, the samples, fast_1, reward and an ETA.
The whole config is checked too: three arms, best_of_n and ttt compared, both starting from rl's
best checkpoint at the same budget.

Multi-turn with the same policy: a 2-turn train run ([experiment] turns = 2, TRLOO) on the train split,
then a 2-turn evaluation of its last checkpoint, each started as `launch CONFIG`. After training, the
second turns must repair the first turns' format errors: fewer format errors at turn 2 than at turn 1,
and most turn-2 samples whose parent was a format error are none (`launch analyze --json`, checked
against an independent count over `launch export`).
"""
import json
import os
import re
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
LOCAL = os.path.join(ROOT, "configs", "local.toml")


def arms_of(check_stdout):
    """The resolved config of each arm printed by `launch check` on a comparison config."""
    parts = re.split(r"^# arm (\S+).*$", check_stdout, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


class LocalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-local-")
        p = subprocess.run([LAUNCH, "check", LOCAL], capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise AssertionError(p.stderr)
        cls.check = p.stdout
        cls.arms = arms_of(p.stdout)

    def test_the_config_trains_then_compares_best_of_n_and_ttt_from_what_rl_learned(self):
        self.assertIn("a comparison of 3 arms, each valid (budgets must match); compared: best_of_n, ttt", self.check)
        self.assertEqual(list(self.arms), ["rl", "best_of_n", "ttt"])
        self.assertIn("(policy.adapter: arm rl's best checkpoint)", self.check.split("# arm best_of_n")[1].splitlines()[0])
        self.assertIn("(policy.adapter: arm rl's best checkpoint)", self.check.split("# arm ttt")[1].splitlines()[0])
        self.assertIn("mode = 'train'", self.arms["rl"])
        self.assertIn("eval_split = 'eval'", self.arms["rl"])
        self.assertIn("model = '%s'" % os.path.join(ROOT, "policies", "local"), self.arms["rl"])
        # Equal budgets: best-of-16 against 2 TTT steps of 8 rollouts, on the same eval tasks.
        self.assertIn("k = 16", self.arms["best_of_n"])
        self.assertRegex(self.arms["ttt"], r"(?m)^steps = 2$")
        self.assertRegex(self.arms["ttt"], r"(?m)^group_size = 8$")

    def test_rl_raises_the_train_split_fast_1_above_the_sft_start(self):
        cfg = self.arms["rl"]
        for old, new in [("eval_split = 'eval'", "eval_split = 'train'"), ("eval_every = 4", "eval_every = 0"),
                         ("eval_samples = 4", "eval_samples = 8")]:
            self.assertIn(old, cfg)
            cfg = cfg.replace(old, new)
        path = os.path.join(self.tmp, "rl.toml")
        with open(path, "w") as f:
            f.write(cfg)
        run_dir = os.path.join(self.tmp, "rl")
        p = subprocess.run([LAUNCH, path, "--run-dir", run_dir, "--log-level", "info"], capture_output=True, text=True,
                           timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertRegex(p.stderr, r"\[train\] step \d+/8 \| \d+ samples \| fast_1 last step [0-9.]+ .*\| reward [0-9.]+ .*"
                                   r"\| ETA \d+:\d\d")
        # The sampler and the learner of this one process hold one copy of the base weights.
        with open(os.path.join(run_dir, "launch.log")) as f:
            self.assertRegex(f.read(), r"base weights of \S+ on cpu are shared with another model of this process "
                                       r"\([0-9.]+ MB saved\)")
        a = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        self.assertEqual([s["step"] for s in a["steps"]], list(range(8)))
        for s in a["steps"]:
            self.assertEqual(s["samples"], 64)
            self.assertIn("fast_1", s)
        start, end = a["eval"]["steps"][0], a["eval"]["steps"][-1]
        self.assertEqual((start["step"], end["step"]), (0, 8))
        self.assertEqual(start["samples"], 28 * 8)
        self.assertEqual(end["samples"], 28 * 8)
        # 224 samples each: 0.21 -> 0.39 and 0.46 -> 0.67 when this was written; the bars leave room
        # for CPU timing noise in the rewards.
        self.assertGreater(end["fast_1"], start["fast_1"] + 0.05, (start, end))
        self.assertGreater(end["correct_rate"], start["correct_rate"] + 0.05, (start, end))


TURNS_STEPS = 4
# Bars for the trained policy's 2-turn evaluation (112 samples a turn). Seen on 2026-11-26 with the committed
# policies/local at seeds 0, 1, 2: turn-1 format errors 49, 42, 44, turn-2 12, 12, 17 (a gap of 0.24 to 0.34);
# of the turn-2 samples after a format error 82-86% are none (40/49, 36/42, 39/44).
FEWER = 0.1      # turn 2's format-error rate must be below turn 1's by more than this
REPAIRED = 0.6   # share of turn-2 samples after a format error that are none
TURNS_SEED = int(os.environ.get("KERNELRL_TURNS_SEED", "0"))  # the seed of the run (to try others by hand)
TURNS_CONFIG = """
[cluster]
name = "local-turns"
log_level = "warn"
[[node]]
name = "local"
host = "127.0.0.1"
roles = ["supervisor", "learner", "sampler", "evaluator", "monitor"]
cpu_slots = 2
gpus = []
[tasks]
dir = "%(root)s/tasks/bundled"
split = "train"
[policy]
model = "%(root)s/policies/local"
dtype = "f32"
device = "cpu"
%(adapter)s
[sampler]
backend = "libtorch"
temperature = 1.0
max_tokens = 96
batch_prompts = 8
samples_per_task = 4
seed = %(seed)d
[evaluator]
action_space = "forward_body"
mode = "fast"
correctness_trials = 3
warmup = 1
fast_trials = 5
timeout_s = 20
torch_threads = 1
[reward]
shape = "speedup"
max_speedup = 10.0
[learner]
algorithm = "trloo"
steps = %(steps)d
batch_size = 8
group_size = 8
minibatch_size = 8
lora_rank = 8
lora_alpha = 16
learning_rate = 5e-3
dtype = "f32"
keep_last = 1
[experiment]
name = "local-turns"
mode = "%(mode)s"
turns = 2
seed = %(seed)d
[monitor]
progress = false
"""


def turns_config(tmp, name, mode, adapter=""):
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write(TURNS_CONFIG % {"root": ROOT, "adapter": 'adapter = "%s"' % adapter if adapter else "",
                                "seed": TURNS_SEED, "steps": TURNS_STEPS, "mode": mode})
    return path


def turn_counts(samples):
    """Per turn: samples, format errors, samples after a format error, and those of them that are none."""
    by_id = {s["sample_id"]: s for s in samples}
    out = {}
    for s in samples:
        c = out.setdefault(s["turn"], {"samples": 0, "format_errors": 0, "after_format_error": 0, "format_fixed": 0})
        c["samples"] += 1
        c["format_errors"] += s["status"] == "format_error"
        if s["parent_id"] and by_id[s["parent_id"]]["status"] == "format_error":
            c["after_format_error"] += 1
            c["format_fixed"] += s["status"] != "format_error"
    return out


class LocalMultiTurnTest(unittest.TestCase):
    def test_after_training_second_turns_repair_format_errors(self):
        tmp = tempfile.mkdtemp(prefix="kernelrl-local-turns-")
        train = os.path.join(tmp, "train")
        p = subprocess.run([LAUNCH, turns_config(tmp, "train", "train"), "--run-dir", train], capture_output=True,
                           text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        last = os.path.join(train, "checkpoints", "step-%d" % TURNS_STEPS)
        self.assertTrue(os.path.isdir(last), os.listdir(os.path.join(train, "checkpoints")))
        # The trained policy, 4 episodes of 2 turns on each of the 28 train tasks.
        after = os.path.join(tmp, "after")
        p = subprocess.run([LAUNCH, turns_config(tmp, "after", "eval", adapter=last), "--run-dir", after],
                           capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])

        def export(run_dir):
            out = subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True, text=True, check=True)
            return [json.loads(line) for line in out.stdout.splitlines()]
        samples = export(after)
        self.assertEqual(len(samples), 28 * 4 * 2)
        a = json.loads(subprocess.run([LAUNCH, "analyze", after, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        mine = turn_counts(samples)
        self.assertEqual([t["turn"] for t in a["turns"]], [1, 2])
        for t in a["turns"]:
            for key, value in mine[t["turn"]].items():
                self.assertEqual(t[key], value, (t["turn"], key))
        one, two = a["turns"]
        # Before training, for the record: the train run's step 0 (sampled by the policy as built).
        before = turn_counts([s for s in export(train) if s["step"] == 0])
        figures = "after training: %s; step 0 (before training): %s" % (
            {t["turn"]: {k: t[k] for k in mine[1]} for t in a["turns"]}, before)
        print(figures)
        rate1 = one["format_errors"] / one["samples"]
        rate2 = two["format_errors"] / two["samples"]
        self.assertGreater(one["format_errors"], 10, figures)  # enough first-turn format errors to repair
        self.assertEqual(two["after_format_error"], one["format_errors"])
        # The second turns make fewer format errors than the first ...
        self.assertLess(rate2, rate1 - FEWER, figures)
        # ... and repair most of the first turns' ones.
        self.assertGreater(two["format_fixed"] / two["after_format_error"], REPAIRED, figures)


if __name__ == "__main__":
    unittest.main()
