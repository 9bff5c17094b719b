"""configs/local.toml, the embedded default: the small policy in policies/local learns from
execution-grounded rewards on this machine's CPU.

A shortened run of its rl arm (as `launch check` resolves it, with the held-out evaluation pointed
at the train split: versions 0 and 8 each sample every train task 8 times) must end with a higher
train-split fast_1 and correct rate than the SFT starting point; `launch analyze --json` shows the
fast_1 of every step; the progress line shows the step, the samples, fast_1, reward and an ETA.
The whole config is checked too: three arms, best_of_n and ttt compared, both starting from rl's
best checkpoint at the same budget.
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


if __name__ == "__main__":
    unittest.main()
