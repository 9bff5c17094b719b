"""configs/experiments/: every protocol's config is valid as shipped (with a checkpoint where it
expects one) and, where it compares strategies, its arms spend equal budgets by construction:
the same tasks, model, temperature, top_p, max_tokens and evaluation mode, and the same rollouts
per task. docs/EXPERIMENTS.md describes every one of them."""
import glob
import os
import shutil
import subprocess
import tempfile
import tomllib
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "experiments", "*.toml")))


def rollouts_per_task(cfg):
    mode = cfg["experiment"]["mode"]
    if mode == "best_of_n":
        return cfg["experiment"]["k"]
    if mode in ("ttt", "sdpo"):
        return cfg["learner"]["steps"] * cfg["learner"]["group_size"]
    return None


class ExperimentConfigsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The configs' layout, with an (empty) checkpoint folder where they expect the policy.
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-experiments-")
        os.makedirs(os.path.join(cls.tmp, "configs"))
        shutil.copytree(os.path.join(ROOT, "configs", "experiments"), os.path.join(cls.tmp, "configs", "experiments"))
        os.makedirs(os.path.join(cls.tmp, "models", "policy"))
        os.symlink(os.path.join(ROOT, "tasks"), os.path.join(cls.tmp, "tasks"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check(self, name):
        p = subprocess.run([LAUNCH, "check", os.path.join(self.tmp, "configs", "experiments", name)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, name + ":\n" + p.stderr)
        if "# arm " not in p.stdout:
            return {None: tomllib.loads(p.stdout.split("\n", 1)[1])}
        arms = {}
        for part in p.stdout.split("\n# arm ")[1:]:
            arm, text = part.split("\n", 1)
            arms[arm.strip()] = tomllib.loads(text)
        return arms

    def test_the_protocols_are_all_there(self):
        names = {os.path.basename(c)[:-5] for c in CONFIGS}
        self.assertEqual(names, {"rlvr", "bon-vs-ttt", "ttt-batched", "selection", "sdpo", "ttt-entropy", "ttt-sparse"})
        with open(os.path.join(ROOT, "docs", "EXPERIMENTS.md")) as f:
            doc = f.read()
        for n in names:
            self.assertIn("configs/experiments/%s.toml" % n, doc)

    def test_every_config_is_valid_and_comparisons_spend_equal_budgets(self):
        same = [("sampler", "temperature"), ("sampler", "top_p"), ("sampler", "max_tokens"), ("evaluator", "mode"),
                ("policy", "model"), ("policy", "adapter"), ("tasks", "split"), ("tasks", "ids")]
        for path in CONFIGS:
            name = os.path.basename(path)
            arms = self.check(name)
            if None in arms:
                continue
            self.assertGreaterEqual(len(arms), 2, name)
            first = next(iter(arms.values()))
            budget = {a: rollouts_per_task(c) for a, c in arms.items()}
            self.assertEqual(len(set(budget.values())), 1, "%s: rollouts per task differ: %s" % (name, budget))
            for arm, cfg in arms.items():
                for sec, key in same:
                    self.assertEqual(cfg[sec].get(key), first[sec].get(key), "%s arm %s: %s.%s" % (name, arm, sec, key))

    def test_the_protocol_settings(self):
        a = self.check("bon-vs-ttt.toml")
        self.assertEqual(a["best_of_n"]["experiment"]["k"], 960)
        self.assertEqual((a["ttt"]["learner"]["steps"], a["ttt"]["learner"]["group_size"]), (15, 64))
        self.assertEqual(a["ttt"]["experiment"]["patience"], 0)  # an early stop would spend less: unequal budgets
        b = self.check("ttt-batched.toml")[None]
        self.assertEqual((len(b["tasks"]["ids"]), b["learner"]["group_size"]), (5, 32))
        s = self.check("sdpo.toml")
        self.assertEqual({a: c["sdpo"]["context"] for a, c in s.items()}, {"feedback": "feedback", "prompt": "prompt"})
        self.assertEqual(self.check("selection.toml")["top8"]["experiment"]["evaluate_top_m"], 8)
        e = self.check("ttt-entropy.toml")
        self.assertEqual([e["plain"]["learner"]["entropy_coef"], e["entropy"]["learner"]["entropy_coef"]], [0.0, 0.01])
        r = self.check("ttt-sparse.toml")
        self.assertEqual([r["shaped"]["reward"]["shape"], r["sparse"]["reward"]["shape"]], ["speedup", "threshold"])
        self.assertEqual(self.check("rlvr.toml")[None]["experiment"]["mode"], "train")


if __name__ == "__main__":
    unittest.main()
