"""configs/local.toml, the embedded default: the small policy in policies/local learns from
execution-grounded rewards on this machine's CPU.

A shortened run of its rl arm (as `launch check` resolves it, with the held-out evaluation pointed
at the train split: versions 0 and 8 each sample every train task 8 times) must end with a higher
train-split fast_1 and correct rate than the SFT starting point; `launch analyze --json` shows the
fast_1 of every step; the progress line shows the step, the samples, fast_1, reward and an ETA.
The whole config is checked too: three arms, best_of_n and ttt compared, both starting from rl's
best checkpoint at the same budget.

Multi-turn RL that learns what the second turn is for (issue 56): `policies/local-turns` evaluated
over 2 turns, trained by the recipe of docs/EXPERIMENTS.md ("A penalty for broken code": GRPO on the
last turn, a progress bonus, -1 for a format error), and its last checkpoint evaluated the same way,
each started as `launch CONFIG`. Over training, the second turns must repair more of the first turns'
format errors and be faster more often (`launch analyze --json`, checked against an independent count
over `launch export`).
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


# The tasks whose second turns the base policy repairs least: of the 28 train tasks, the 8 with the
# lowest share of format errors repaired in five 2-turn evaluations of policies/local-turns (seeds 0-4,
# 2026-12-07, pooled: 30_bias_gelu_scale 0/17 ... 05_layernorm_manual 7/17, against 0.64 over all
# tasks), chosen before any of the runs the bars below come from. Every step trains on all eight.
TURNS_TASKS = ["30_bias_gelu_scale", "13_group_norm", "22_avg_pool2d", "23_max_pool1d", "27_huber_loss",
               "18_matvec", "08_softplus_manual", "05_layernorm_manual"]
TURNS_STEPS = 8
TURNS_EPISODES = 16  # a task, in each evaluation (8 tasks x 16 episodes x 2 turns)
TURNS_SEED = int(os.environ.get("KERNELRL_TURNS_SEED", "7"))  # the seed of the runs (to try others by hand)
# Bars on what training lifts at turn 2, as the test counts it (docs/EXPERIMENTS.md, "Eight tasks, all in every
# step"). Seen at seeds 7, 8, 9 and 7 twice more (2026-12-07): repairs +0.21, +0.15, +0.18, +0.10, +0.13
# (0.43-0.54 before, 0.61-0.72 after); fast_1 +0.19, +0.21, +0.14, +0.12, +0.19 (0.125-0.227 before). A normal
# fit to these lifts puts the bars 2.9 and 3.6 standard deviations below their means: about one run in 500
# fails by chance.
REPAIRED_LIFT = 0.03  # the share of turn-2 samples after a format error that are none
FAST_1_LIFT = 0.03    # turn 2's fast_1 (correct and faster than the task's reference)

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
ids = %(ids)s
[policy]
model = "%(root)s/policies/local-turns"
dtype = "f32"
device = "cpu"
%(adapter)s
[sampler]
backend = "libtorch"
temperature = 1.0
max_tokens = 96
batch_prompts = 8
samples_per_task = %(episodes)d
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
failure_reward = -1.0
[learner]
algorithm = "grpo"
learn_turns = "last"
turn_progress = 2.0
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


def turns_values(seed=TURNS_SEED, steps=TURNS_STEPS, mode="train", adapter=""):
    """TURNS_CONFIG's placeholders."""
    return {"root": ROOT, "ids": json.dumps(TURNS_TASKS), "episodes": TURNS_EPISODES, "seed": seed,
            "steps": steps, "mode": mode, "adapter": 'adapter = "%s"' % adapter if adapter else ""}


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


def repaired(samples):
    """Of the turn-2 samples whose parent was a format error (each sample's parent among samples): (none, all)."""
    c = turn_counts(samples).get(2, {"format_fixed": 0, "after_format_error": 0})
    return c["format_fixed"], c["after_format_error"]


def reference_ms(samples):
    """Each task's reference time in the run the samples come from (a launch times it once)."""
    return {s["task_id"]: s["ref_runtime_ms"] for s in samples if s["ref_runtime_ms"] > 0}


def fast_1_against(samples, ref_ms):
    """Turn 2's fast_1, each correct body's time set against ref_ms[task] instead of its own run's reference."""
    two = [s for s in samples if s["turn"] == 2]
    return sum(s["status"] == "ok" and ref_ms[s["task_id"]] > s["runtime_ms"] for s in two) / len(two)


def second_turn_lifts(before, trained, after, steps=TURNS_STEPS):
    """What the test asserts, from the three runs' exports: turn 2's repairs as (none, after a format error),
    early (the base policy's evaluation and the train run's first half of steps) and late (the second half
    and the last checkpoint's evaluation), and turn 2's fast_1 in the two evaluations against one reference
    time a task for both (the geometric mean of the two launches' own, or the one there is)."""
    half = steps // 2
    # Summed run by run: sample ids repeat across runs, and a parent is looked up within its own run.
    early = [a + b for a, b in zip(repaired(before), repaired([x for x in trained if x["step"] < half]))]
    late = [a + b for a, b in zip(repaired(after), repaired([x for x in trained if x["step"] >= half]))]
    own = reference_ms(before), reference_ms(after)
    shared = {t: (own[0][t] * own[1][t]) ** 0.5 if t in own[0] and t in own[1] else own[0].get(t) or own[1][t]
              for t in set(own[0]) | set(own[1])}
    return early, late, (fast_1_against(before, shared), fast_1_against(after, shared))


class LocalMultiTurnTest(unittest.TestCase):
    def test_training_lifts_the_second_turns_repairs_and_fast_1(self):
        tmp = tempfile.mkdtemp(prefix="kernelrl-local-turns-")

        def launch(name, mode, adapter=""):
            cfg = os.path.join(tmp, name + ".toml")
            with open(cfg, "w") as f:
                f.write(TURNS_CONFIG % turns_values(mode=mode, adapter=adapter))
            run_dir = os.path.join(tmp, name)
            p = subprocess.run([LAUNCH, cfg, "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            out = subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True, text=True, check=True)
            samples = [json.loads(line) for line in out.stdout.splitlines()]
            # `launch analyze`'s table by turn against an independent count over the export.
            a = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                          check=True).stdout)
            mine = turn_counts(samples)
            self.assertEqual([t["turn"] for t in a["turns"]], [1, 2])
            for t in a["turns"]:
                for key, value in mine[t["turn"]].items():
                    self.assertEqual(t[key], value, (name, t["turn"], key))
            self.assertEqual(mine[2]["after_format_error"], mine[1]["format_errors"])
            turn2 = [x for x in samples if x["turn"] == 2]
            self.assertAlmostEqual(a["turns"][1]["fast_1"], sum(x["status"] == "ok" and x["speedup"] > 1
                                                                  for x in turn2) / len(turn2))
            return run_dir, samples

        _, before = launch("before", "eval")
        train, trained = launch("train", "train")
        last = os.path.join(train, "checkpoints", "step-%d" % TURNS_STEPS)
        self.assertTrue(os.path.isdir(last), os.listdir(os.path.join(train, "checkpoints")))
        _, after = launch("after", "eval", adapter=last)
        for run in (before, after):
            self.assertEqual(len(run), len(TURNS_TASKS) * TURNS_EPISODES * 2)
        self.assertEqual(len(trained), TURNS_STEPS * 8 * 8 * 2)

        # Repairs pool the evaluations with the train run's halves: whether a second turn parses does
        # not depend on the machine's timings. fast_1 sets both evaluations against one reference time a
        # task: a launch times a task's reference once, and on this machine that time moves by up to 8x
        # between launches, far more than a body's.
        early, late, fast = second_turn_lifts(before, trained, after)
        figures = "turn 2: repaired %d/%d -> %d/%d; fast_1 (one reference) %.3f -> %.3f; evaluations: %s -> %s" % (
            early[0], early[1], late[0], late[1], fast[0], fast[1], turn_counts(before)[2], turn_counts(after)[2])
        print(figures)
        self.assertGreater(early[1], 50, figures)  # enough first-turn format errors to repair
        self.assertGreater(late[0] / late[1], early[0] / early[1] + REPAIRED_LIFT, figures)
        self.assertGreater(fast[1], fast[0] + FAST_1_LIFT, figures)


if __name__ == "__main__":
    unittest.main()
