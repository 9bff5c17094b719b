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
    if mode == "best_of_n":  # K episodes of `turns` turns each (one turn: K samples)
        return cfg["experiment"]["k"] * cfg["experiment"].get("turns", 1)
    if mode in ("ttt", "sdpo"):
        return cfg["learner"]["steps"] * cfg["learner"]["group_size"]
    return None


class ConfigLayout(unittest.TestCase):
    """configs/FOLDER copied into a scratch repository layout, with an (empty) checkpoint folder
    where the configs expect the policy; `checked` runs `launch check` on one of them."""
    FOLDER = ""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-%s-" % cls.FOLDER)
        os.makedirs(os.path.join(cls.tmp, "configs"))
        shutil.copytree(os.path.join(ROOT, "configs", cls.FOLDER), os.path.join(cls.tmp, "configs", cls.FOLDER))
        os.makedirs(os.path.join(cls.tmp, "models", "policy"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def checked(self, name):
        p = subprocess.run([LAUNCH, "check", os.path.join(self.tmp, "configs", self.FOLDER, name)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, name + ":\n" + p.stderr)
        return p


class ExperimentConfigsTest(ConfigLayout):
    FOLDER = "experiments"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        os.symlink(os.path.join(ROOT, "tasks"), os.path.join(cls.tmp, "tasks"))

    def check(self, name):
        p = self.checked(name)
        if "# arm " not in p.stdout:
            return {None: tomllib.loads(p.stdout.split("\n", 1)[1])}
        arms = {}
        for part in p.stdout.split("\n# arm ")[1:]:
            arm, text = part.split("\n", 1)
            arms[arm.strip()] = tomllib.loads(text)
        return arms

    def test_the_protocols_are_all_there(self):
        names = {os.path.basename(c)[:-5] for c in CONFIGS}
        self.assertEqual(names, {"rlvr", "bon-vs-ttt", "ttt-batched", "selection", "sdpo", "ttt-entropy", "ttt-sparse",
                                 "multi-turn", "refine-vs-bon"})
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
            # A multi-turn arm is read on a best-of-N arm's fast_1@k curve (launch compare): that arm's K at
            # least its rollouts a task; every other arm spends the same rollouts a task.
            multi = {a for a, c in arms.items() if c["experiment"].get("turns", 1) > 1}
            budget = {a: rollouts_per_task(c) for a, c in arms.items() if a not in multi}
            self.assertEqual(len(set(budget.values())), 1, "%s: rollouts per task differ: %s" % (name, budget))
            for a in multi:
                self.assertGreaterEqual(next(iter(budget.values())), rollouts_per_task(arms[a]), "%s arm %s" % (name, a))
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
        # The Dr. Kernel recipe: 3 turns, groups of 16, 16 tasks a step, lr 1e-6, TRLOO, profiling reward 0.5 and
        # profiling rejection below 30% coverage.
        m = self.check("multi-turn.toml")[None]
        self.assertEqual((m["experiment"]["turns"], m["learner"]["group_size"], m["learner"]["batch_size"]), (3, 16, 16))
        self.assertEqual((m["learner"]["learning_rate"], m["learner"]["algorithm"]), (1e-6, "trloo"))
        self.assertEqual((m["reward"]["coverage_weight"], m["reward"]["reject_coverage_below"]), (0.5, 0.3))
        v = self.check("refine-vs-bon.toml")
        self.assertEqual((v["refine"]["experiment"]["turns"], v["refine"]["experiment"]["k"]), (3, 8))
        self.assertEqual(v["best_of_n"]["experiment"]["k"], 64)  # a curve past refinement's 24 rollouts a task


SEEDS = sorted(glob.glob(os.path.join(ROOT, "configs", "seeds", "*.toml")))
TEN = ["4", "5", "12", "14", "15", "18", "28", "29", "30", "32"]  # the seeds' KernelBench level-1 problems


def numbers(ids):
    """Problem numbers that a [tasks] ids list of numbers and ranges selects."""
    out = set()
    for i in ids:
        lo, _, hi = i.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


class SeedConfigsTest(ConfigLayout):
    """configs/seeds/: the seeds' protocols with the seeds' settings, on KernelBench level 1 by path."""
    FOLDER = "seeds"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        level = os.path.join(cls.tmp, "KernelBench", "KernelBench", "level1")  # a checkout's 100 problems
        os.makedirs(level)
        for n in range(1, 101):
            with open(os.path.join(level, "%d_problem.py" % n), "w") as f:
                f.write("# a KernelBench problem\n")

    def check(self, name):
        p = self.checked(name)
        arms, starts = {}, {}
        for part in p.stdout.split("\n# arm ")[1:]:
            head, text = part.split("\n", 1)
            arm = head.split(" ")[0]
            arms[arm] = tomllib.loads(text)
            starts[arm] = "policy.adapter: arm rlvr's best checkpoint" in head
        compared = p.stdout.split("compared: ", 1)[1].split("\n", 1)[0].split(", ")
        return arms, starts, compared

    def test_the_seed_configs_are_there_and_documented(self):
        names = {os.path.basename(c)[:-5] for c in SEEDS}
        self.assertEqual(names, {"bon-vs-ttt", "bon-vs-ttt-1gpu", "selection", "sdpo"})
        with open(os.path.join(ROOT, "docs", "EXPERIMENTS.md")) as f:
            doc = f.read()
        self.assertIn("## Reproducing the seeds", doc)
        for n in names:
            self.assertIn("configs/seeds/%s.toml" % n, doc)

    def test_the_seeds_settings_and_equal_budgets(self):
        for path in SEEDS:
            name = os.path.basename(path)
            arms, starts, compared = self.check(name)
            one_gpu = "1gpu" in name
            for arm in compared:
                c = arms[arm]
                msg = "%s arm %s" % (name, arm)
                self.assertEqual((c["sampler"]["temperature"], c["sampler"]["max_tokens"]), (0.25, 1024), msg)
                self.assertEqual(c["evaluator"]["mode"], "full", msg)  # 50 timed trials
                self.assertEqual(c["evaluator"]["full_trials"], 50, msg)
                self.assertEqual(c["reward"]["max_speedup"], 0, msg)  # raw speedup, no cap
                self.assertEqual(c["tasks"]["level"], 1, msg)
                self.assertEqual(c["tasks"]["ids"], TEN[:5] if one_gpu else TEN, msg)
                self.assertEqual(starts[arm], not one_gpu, msg)  # from the RLVR checkpoint (1 GPU: the base)
                if c["experiment"]["mode"] in ("ttt", "sdpo"):
                    self.assertTrue(c["experiment"]["per_task"], msg)  # one adapter per task
            budget = {a: rollouts_per_task(arms[a]) for a in compared}
            self.assertEqual(len(set(budget.values())), 1, "%s: rollouts per task differ: %s" % (name, budget))
            self.assertEqual(next(iter(budget.values())), 16 if one_gpu else 64, name)
            if "rlvr" in arms:  # 40 constant-lr steps, no clip-higher, trained on level 1 less the ten
                r = arms["rlvr"]
                self.assertEqual((r["learner"]["steps"], r["learner"]["lr_schedule"]), (40, "constant"))
                self.assertEqual(r["learner"]["clip_high"], r["learner"]["clip_low"])
                self.assertEqual(numbers(r["tasks"]["ids"]), set(range(1, 101)) - {int(n) for n in TEN})
                self.assertEqual(r["experiment"]["eval_ids"], TEN)
        a, _, _ = self.check("bon-vs-ttt.toml")
        self.assertEqual((a["ttt"]["learner"]["steps"], a["ttt"]["learner"]["group_size"]), (2, 32))
        self.assertEqual((a["ttt"]["experiment"]["patience"], a["bon"]["experiment"]["k"]), (1, 64))
        s, _, _ = self.check("selection.toml")
        self.assertEqual(s["top3"]["experiment"]["evaluate_top_m"], 3)
        d, _, _ = self.check("sdpo.toml")
        self.assertEqual(d["sdpo"]["sdpo"]["context"], "feedback")


class LaptopSeedConfigTest(unittest.TestCase):
    """The seeds' comparisons on the embedded policy, valid as shipped and run over three seeds:
    configs/seed-bon-vs-ttt-local.toml (seed 001's) and configs/seed-sdpo-local.toml (seed 002's SDPO pair) at one
    equal budget (64 rollouts a task each), configs/seed-refine-vs-bon-local.toml (seed 003's refinement) against
    best-of-64, which `launch compare` reads at refinement's rollouts and tokens; configs/seed-nll-probe-local.toml
    (seed 002's NLL probe) keeps every checkpoint of one batched adapter for `launch probe`."""

    def arms(self, name):
        """configs/NAME's arms as `launch check` resolves them, checked valid and run over seeds 0-2."""
        p = subprocess.run([LAUNCH, "check", os.path.join(ROOT, "configs", name)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("each run with seeds 0, 1, 2", p.stdout)
        arms = {}
        for part in p.stdout.split("\n# arm ")[1:]:
            arm, text = part.split("\n", 1)
            arms[arm.strip()] = tomllib.loads(text)
        return arms

    def test_valid_as_shipped_at_equal_rollouts_over_seeds(self):
        arms = self.arms("seed-bon-vs-ttt-local.toml")
        self.assertEqual({a: rollouts_per_task(c) for a, c in arms.items()}, {"bon": 64, "ttt": 64})
        self.assertTrue(arms["ttt"]["experiment"]["per_task"])
        self.assertEqual({c["sampler"]["temperature"] for c in arms.values()}, {0.25})

    def test_the_sdpo_pair_is_valid_as_shipped_at_seed_002s_budget(self):
        # configs/seed-sdpo-local.toml: seed 002's SDPO, feedback against prompt-only, per task.
        arms = self.arms("seed-sdpo-local.toml")
        self.assertEqual({a: rollouts_per_task(c) for a, c in arms.items()}, {"feedback": 64, "prompt": 64})
        self.assertEqual({a: c["sdpo"]["context"] for a, c in arms.items()}, {"feedback": "feedback", "prompt": "prompt"})
        self.assertEqual({(c["experiment"]["mode"], c["experiment"]["per_task"], c["sdpo"]["beta"],
                           c["sampler"]["temperature"]) for c in arms.values()}, {("sdpo", True, 1.0, 0.25)})


    def test_the_refinement_pair_is_valid_as_shipped_and_compared_at_both_budgets(self):
        # configs/seed-refine-vs-bon-local.toml: seed 003's refinement (8 episodes x 3 turns) against 64 samples.
        arms = self.arms("seed-refine-vs-bon-local.toml")
        self.assertEqual({a: rollouts_per_task(c) for a, c in arms.items()}, {"bon": 64, "refine": 24})
        self.assertEqual((arms["refine"]["experiment"]["turns"], arms["bon"]["experiment"]["turns"]), (3, 1))
        self.assertEqual({c["sampler"]["temperature"] for c in arms.values()}, {1.0})

    def test_the_nll_probe_pair_keeps_every_checkpoint_of_one_batched_adapter(self):
        # configs/seed-nll-probe-local.toml: best-of-64 samples rescored under each checkpoint of batched TTT
        # (`launch probe RUN_DIR/ttt/seed-S --samples-from RUN_DIR/bon/seed-S --samples 0`).
        arms = self.arms("seed-nll-probe-local.toml")
        self.assertEqual(arms["bon"]["experiment"]["mode"], "best_of_n")
        self.assertEqual({a: rollouts_per_task(c) for a, c in arms.items()}, {"bon": 64, "ttt": 64})  # compare takes it
        ttt = arms["ttt"]
        self.assertEqual((ttt["experiment"]["mode"], ttt["experiment"]["per_task"], ttt["experiment"]["patience"]),
                         ("ttt", False, 0))  # one adapter over every task, no early stop: steps 0-8 all exist
        self.assertEqual((ttt["learner"]["steps"], ttt["learner"]["keep_last"]), (8, 0))
        self.assertEqual({c["sampler"]["temperature"] for c in arms.values()}, {0.25})
        self.assertEqual({c["policy"]["model"] for c in arms.values()}, {arms["bon"]["policy"]["model"]})


class KernelBenchConfigTest(unittest.TestCase):
    """configs/kernelbench-level1.toml (the README's "A real model, step by step") is valid as shipped, next to a
    KernelBench checkout and a checkpoint folder, and `--set` switches it to a vLLM server as the README says."""

    def test_valid_as_shipped_and_with_the_readme_overrides(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "configs"))
            shutil.copy(os.path.join(ROOT, "configs", "kernelbench-level1.toml"), os.path.join(d, "configs"))
            os.makedirs(os.path.join(d, "models", "policy"))
            level = os.path.join(d, "KernelBench", "KernelBench", "level1")
            os.makedirs(level)
            for n in range(1, 101):
                with open(os.path.join(level, "%d_problem.py" % n), "w") as f:
                    f.write("# a KernelBench problem\n")
            cfg = os.path.join(d, "configs", "kernelbench-level1.toml")
            p = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            c = tomllib.loads(p.stdout.split("\n", 1)[1])
            self.assertEqual((c["tasks"]["level"], c["experiment"]["mode"], c["policy"]["template"]), (1, "train", "auto"))
            with open(os.path.join(ROOT, "README.md")) as f:
                readme = f.read()
            self.assertIn("configs/kernelbench-level1.toml", readme)
            sets = ["sampler.backend=openai", "sampler.url=http://127.0.0.1:8000", "sampler.served_model=models/policy",
                    "sampler.adapter_dir=" + os.path.join(d, "adapters")]
            for s in sets:
                self.assertIn("--set " + s.split("=")[0] + "=", readme)
            p = subprocess.run([LAUNCH, "check", cfg] + [x for s in sets for x in ("--set", s)], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(tomllib.loads(p.stdout.split("\n", 1)[1])["sampler"]["backend"], "openai")

if __name__ == "__main__":
    unittest.main()
