"""`launch analyze RUN_DIR` against an independent numpy computation on the same recorded samples.

The run: the bundled replay candidates of eight tasks (faster, slower, wrong, unparsable and raising
bodies) evaluated by `launch` on the CPU, each given made-up token ids and logprobs (seeded) so that
the logprob statistics have data. The reference below is written from the definitions: pass@k and
fast_1@k as 1 - C(n - c, k) / C(n, k) with exact binomials, Spearman's rho as Pearson's on average
ranks, the partial rho from the three pairwise rank correlations, quartiles by sorting.
"""
import html.parser
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
TASKS = ["01_diag_matmul", "02_gelu_tanh", "06_swish", "07_hardtanh_scale", "09_row_sum", "10_row_max",
         "12_rms_norm", "14_softmax_manual"]


def rankdata(x):
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rho(x, y):
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


class Plotted(html.parser.HTMLParser):
    """The report's plotted marks (elements with data-series), its tags, and every URL-bearing attribute."""

    def __init__(self):
        super().__init__()
        self.marks, self.tags, self.urls, self.h2 = [], [], [], []
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self._in_h2 = tag == "h2"
        for k in ("src", "href", "xlink:href"):
            if k in a:
                self.urls.append(a[k])
        if "data-series" in a:
            self.marks.append(a)

    def handle_data(self, data):
        if self._in_h2:
            self.h2.append(data.strip())
            self._in_h2 = False


def report_marks(run_dir, *args):
    """Runs `launch report` and returns (path printed, parsed page, raw text)."""
    p = subprocess.run([LAUNCH, "report", run_dir] + list(args), capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError(p.stderr)
    path = p.stdout.strip()
    with open(path) as f:
        text = f.read()
    page = Plotted()
    page.feed(text)
    return path, page, text


class AnalyzeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-analyze-")
        rng = random.Random(11)
        replay = os.path.join(cls.tmp, "replay.jsonl")
        with open(replay, "w") as out:
            for t in TASKS:
                with open(os.path.join(ROOT, "tasks", "replay", t + ".jsonl")) as f:
                    for line in f:
                        r = json.loads(line)
                        n = rng.randint(3, 40)
                        r["token_ids"] = [rng.randint(5, 500) for _ in range(n)]
                        r["logprobs"] = [-rng.random() * 3 for _ in range(n)]
                        out.write(json.dumps(r) + "\n")
            # One action that games the harness (it runs the reference itself): status hacked.
            out.write(json.dumps({"task_id": "06_swish", "completion": "return Model()(x)", "token_ids": [7, 8, 9],
                                  "logprobs": [-1.0, -2.0, -0.5]}) + "\n")
        cfg = os.path.join(cls.tmp, "eval.toml")
        with open(cfg, "w") as f:
            f.write("""
[[node]]
name = "local"
roles = ["supervisor", "sampler", "evaluator", "monitor"]
cpu_slots = 2
[tasks]
dir = "%s"
ids = %s
[sampler]
replay = "%s"
[evaluator]
timeout_s = 20
[experiment]
name = "analyze"
run_root = "%s"
[monitor]
progress = false
""" % (os.path.join(ROOT, "tasks", "bundled"), json.dumps(TASKS), replay, os.path.join(cls.tmp, "runs")))
        cls.cfg = cfg
        cls.run_dir = os.path.join(cls.tmp, "run")
        p = subprocess.run([LAUNCH, cfg, "--run-dir", cls.run_dir], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise AssertionError(p.stderr[-3000:])
        out = subprocess.run([LAUNCH, "export", cls.run_dir, "--jsonl"], capture_output=True, text=True, check=True).stdout
        cls.samples = [json.loads(line) for line in out.splitlines() if line.strip()]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def analyze(self, *args):
        p = subprocess.run([LAUNCH, "analyze", self.run_dir, "--json"] + list(args), capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def test_rates_and_speedups_equal_numpy(self):
        a = self.analyze("--p", "1.0,1.2,2")
        ok = np.array([s["status"] == "ok" for s in self.samples])
        sp = np.array([s["speedup"] for s in self.samples])
        self.assertEqual(a["samples"], len(self.samples))
        self.assertGreater(ok.sum(), 3)
        self.assertLess(ok.sum(), len(self.samples))
        self.assertAlmostEqual(a["correct_rate"], ok.mean(), places=12)
        for p, key in [(1.0, "fast_1"), (1.2, "fast_1.2"), (2.0, "fast_2")]:
            self.assertAlmostEqual(a[key], (ok & (sp > p)).mean(), places=12, msg=key)
        self.assertAlmostEqual(a["mean_speedup"], sp[ok].mean(), places=9)
        self.assertAlmostEqual(a["geomean_speedup"], float(np.exp(np.log(sp[ok]).mean())), places=9)
        per_task = {t["task_id"]: t for t in a["per_task"]}
        self.assertEqual(sorted(per_task), sorted(TASKS))
        for t in TASKS:
            m = np.array([s["task_id"] == t for s in self.samples])
            self.assertEqual(per_task[t]["samples"], m.sum())
            self.assertAlmostEqual(per_task[t]["fast_1"], (ok & m & (sp > 1)).sum() / m.sum(), places=12)
            if (ok & m).any():
                self.assertAlmostEqual(per_task[t]["best_speedup"], sp[ok & m].max(), places=9)
        self.assertEqual([s["step"] for s in a["steps"]], [0])
        self.assertAlmostEqual(a["steps"][0]["fast_1"], a["fast_1"], places=12)
        hacked = np.array([s["status"] == "hacked" for s in self.samples])
        # What the action that runs the reference got, should it not be hacked. Seen once in CI, on a
        # machine running three other tests, when its verdict came from a candidate's process under
        # a 20 s limit; the worker now answers it before any process (harness.early_verdict).
        gamed = [{k: s.get(k) for k in ("status", "error", "wall_s")} for s in self.samples
                 if s["completion"] == "return Model()(x)"]
        self.assertEqual(hacked.sum(), 1, gamed)
        self.assertAlmostEqual(a["hacked_share"], hacked.mean(), places=12)
        self.assertAlmostEqual(a["steps"][0]["hacked_share"], hacked.mean(), places=12)

    def test_pass_and_fast_at_k_use_the_unbiased_estimator(self):
        a = self.analyze("--k", "1,2,3,5", "--bootstrap", "400", "--seed", "3")
        by_task = {}
        for s in self.samples:
            n, c, f = by_task.get(s["task_id"], (0, 0, 0))
            ok = s["status"] == "ok"
            by_task[s["task_id"]] = (n + 1, c + ok, f + (ok and s["speedup"] > 1.0))
        for row in a["at_k"]:
            k = row["k"]
            used = [(n, c, f) for n, c, f in by_task.values() if n >= k]
            self.assertEqual(row["tasks"], len(used))
            ref_pass = np.mean([1 - math.comb(n - c, k) / math.comb(n, k) for n, c, f in used])
            ref_fast = np.mean([1 - math.comb(n - f, k) / math.comb(n, k) for n, c, f in used])
            self.assertAlmostEqual(row["pass"], ref_pass, places=12, msg=k)
            self.assertAlmostEqual(row["fast_1"], ref_fast, places=12, msg=k)
            for key in ["pass", "fast_1"]:
                lo, hi = row[key + "_ci"]
                self.assertLessEqual(lo, row[key] + 1e-12)
                self.assertGreaterEqual(hi, row[key] - 1e-12)
                self.assertTrue(0 <= lo <= hi <= 1)
        self.assertLess(a["at_k"][0]["pass"], a["at_k"][-1]["pass"])  # the scaling curve rises with k
        # The default curve: k = 1, 2, 4, ... up to the smallest task's sample count.
        self.assertEqual([r["k"] for r in self.analyze()["at_k"]],
                         [k for k in [1, 2, 4, 8, 16] if k <= min(n for n, _, _ in by_task.values())])
        self.assertNotIn("pass_ci", self.analyze("--bootstrap", "0")["at_k"][0])

    def test_logprob_statistics_equal_numpy(self):
        a = self.analyze()["logprob_vs_speedup"]
        c = [s for s in self.samples if s["status"] == "ok"]
        lp = [float(np.mean(s["logprobs"])) for s in c]
        sp = [s["speedup"] for s in c]
        ln = [len(s["token_ids"]) for s in c]
        self.assertEqual(a["n"], len(c))
        self.assertAlmostEqual(a["spearman_rho"], rho(lp, sp), places=9)
        rxy, rxz, ryz = rho(lp, sp), rho(lp, ln), rho(sp, ln)
        self.assertAlmostEqual(a["partial_spearman_rho_length"],
                               (rxy - rxz * ryz) / math.sqrt((1 - rxz ** 2) * (1 - ryz ** 2)), places=9)
        # p-values: Student's t with n - 2 (n - 3 with length partialled out) degrees of freedom,
        # through mpmath's regularized incomplete beta (scipy.stats.spearmanr's approximation).
        import mpmath

        def p_value(r, df):
            t2 = r * r * df / (1 - r * r)
            return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t2), regularized=True))

        n = len(c)
        self.assertAlmostEqual(a["spearman_p"], p_value(rxy, n - 2), places=10)
        self.assertAlmostEqual(a["partial_spearman_p_length"], p_value(a["partial_spearman_rho_length"], n - 3),
                               places=10)
        self.assertAlmostEqual(a["length_vs_speedup"]["spearman_rho"], rho(ln, sp), places=9)
        self.assertAlmostEqual(a["length_vs_speedup"]["spearman_p"], p_value(rho(ln, sp), n - 2), places=10)
        # Quartiles as the seeds number them: Q1 the most surprising (lowest mean logprob).
        order = sorted(range(len(c)), key=lambda i: lp[i])
        for q, row in enumerate(a["surprisal_quartiles"]):
            part = order[len(order) * q // 4: len(order) * (q + 1) // 4]
            self.assertEqual(row["n"], len(part))
            self.assertAlmostEqual(row["mean_speedup"], np.mean([sp[i] for i in part]), places=9)
            self.assertAlmostEqual(row["mean_logprob"], np.mean([lp[i] for i in part]), places=5)
            self.assertAlmostEqual(row["mean_tokens"], np.mean([ln[i] for i in part]), places=9)
        self.assertLess(a["surprisal_quartiles"][0]["mean_logprob"], a["surprisal_quartiles"][3]["mean_logprob"])

    def test_selection_strategies_equal_a_direct_computation(self):
        m = 2
        a = self.analyze("--m", str(m))["selection"]
        groups = {}
        for s in self.samples:
            groups.setdefault(s["task_id"], []).append(
                (s["status"] == "ok", s["speedup"], float(np.mean(s["logprobs"])), len(s["token_ids"])))
        groups = [g for g in groups.values() if len(g) >= 2]
        self.assertEqual(a["groups"], len(groups))

        def outcome(pick):
            return (0.0, 0.0, 0.0) if pick is None else (float(pick[1] > 1), 1.0, pick[1])

        ref = {k: [] for k in ["oracle", "random_correct", "confidence", "surprisal", "surprisal_top_m",
                               "deployable_top_m"]}
        evals = {k: [] for k in ref}
        for g in groups:
            ok = [x for x in g if x[0]]
            ref["oracle"].append(outcome(max(ok, key=lambda x: x[1]) if ok else None))
            ref["random_correct"].append((np.mean([x[1] > 1 for x in ok]), 1.0, np.mean([x[1] for x in ok]))
                                         if ok else (0.0, 0.0, 0.0))
            ref["confidence"].append(outcome(max(ok, key=lambda x: x[2]) if ok else None))
            ref["surprisal"].append(outcome(min(ok, key=lambda x: x[2]) if ok else None))
            top = sorted(ok, key=lambda x: x[2])[:m]
            ref["surprisal_top_m"].append(outcome(max(top, key=lambda x: x[1]) if top else None))
            ranked = sorted(g, key=lambda x: x[2])[:m]  # before evaluation: all samples
            hit = [x for x in ranked if x[0]]
            ref["deployable_top_m"].append(outcome(max(hit, key=lambda x: x[1]) if hit else None))
            for k in evals:
                evals[k].append(len(ranked) if k == "deployable_top_m" else len(g))
        for k, rows in ref.items():
            got = a["strategies"][k]
            self.assertAlmostEqual(got["fast_1"], np.mean([r[0] for r in rows]), places=12, msg=k)
            self.assertAlmostEqual(got["correct"], np.mean([r[1] for r in rows]), places=12, msg=k)
            self.assertAlmostEqual(got["mean_speedup"], np.mean([r[2] for r in rows]), places=9, msg=k)
            self.assertAlmostEqual(got["evaluations_per_group"], np.mean(evals[k]), places=12, msg=k)
        self.assertGreaterEqual(a["strategies"]["oracle"]["mean_speedup"], a["strategies"]["surprisal"]["mean_speedup"])

    COMPARISON = """
[comparison]
arms = ["all", "top2"]
[arm.all.experiment]
mode = "best_of_n"
k = 6
[arm.top2.experiment]
mode = "best_of_n"
k = 6
evaluate_top_m = 2
"""

    @classmethod
    def comparison(cls):
        """A comparison config run once: best-of-6 evaluating everything vs evaluating the top 2 by surprisal."""
        if not hasattr(cls, "_comparison"):
            with open(cls.cfg) as f:
                base = f.read()
            cfg = os.path.join(cls.tmp, "comparison.toml")
            with open(cfg, "w") as f:
                f.write(base + cls.COMPARISON)
            root = os.path.join(cls.tmp, "comparison")
            p = subprocess.run([LAUNCH, cfg, "--run-dir", root], capture_output=True, text=True, timeout=900)
            cls._comparison = (cfg, root, p)
        return cls._comparison

    def test_a_comparison_config_runs_every_arm_then_compares_them(self):
        cfg, root, p = self.comparison()
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("arm all (best_of_n)", p.stdout)
        self.assertIn("arm top2 (best_of_n)", p.stdout)
        self.assertIn("comparison: " + os.path.join(root, "comparison.json"), p.stdout)
        with open(os.path.join(root, "comparison.json")) as f:
            c = json.load(f)
        self.assertEqual([os.path.basename(r["run_dir"]) for r in c["runs"]], ["all", "top2"])
        for arm in ["all", "top2"]:
            with open(os.path.join(root, arm, "compute.json")) as f:
                self.assertEqual(json.load(f)["rollouts"], len(self.samples))
        # The comparison's own report: the arms' table and each arm's score on the reference curve.
        path, page, text = report_marks(root)
        self.assertEqual(path, os.path.join(os.path.realpath(root), "report.html"))
        self.assertEqual(page.urls, [])
        self.assertNotIn("script", page.tags)
        curve = [(float(m["data-x"]), float(m["data-y"])) for m in page.marks
                 if m["data-chart"] == "comparison" and m["data-series"] == "all fast_1@k"]
        ref = next(r for r in c["runs"] if r["run_dir"] == c["curve_of"])
        self.assertEqual(curve, [(float(p["k"]), p["fast_1"]) for p in ref["analysis"]["at_k"]])
        top2 = [m for m in page.marks if m["data-series"] == "top2 score"]
        run = next(r for r in c["runs"] if r["run_dir"].endswith("top2"))
        self.assertEqual(len(top2), 1)
        self.assertAlmostEqual(float(top2[0]["data-y"]), run["score"], places=12)
        if isinstance(run["equivalent_k"], str):  # "< 1": drawn at the curve's first k
            self.assertEqual(run["equivalent_k"], "< 1")
            self.assertEqual(float(top2[0]["data-x"]), curve[0][0])
        elif run["equivalent_k"] is not None:
            self.assertAlmostEqual(float(top2[0]["data-x"]), run["equivalent_k"], places=9)
        # Run again into the same folder: finished arms are kept, not run twice.
        again = subprocess.run([LAUNCH, cfg, "--run-dir", root], capture_output=True, text=True, timeout=300)
        self.assertEqual(again.returncode, 0, again.stderr[-2000:])
        self.assertIn("arm all: already done", again.stdout)
        # check validates every arm; a bad arm is named, and nothing runs.
        chk = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True)
        self.assertEqual(chk.returncode, 0, chk.stderr)
        self.assertIn("a comparison of 2 arms", chk.stdout)
        with open(cfg) as f:
            text = f.read()
        bad = os.path.join(self.tmp, "bad-comparison.toml")
        with open(bad, "w") as f:
            f.write(text.replace("evaluate_top_m = 2", "evaluate_top_m = 6") + "[arm.extra]\n")
        p = subprocess.run([LAUNCH, bad, "--run-dir", os.path.join(self.tmp, "never")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("arm.extra: not listed in comparison.arms", p.stderr)
        with open(bad, "w") as f:
            f.write(text.replace("evaluate_top_m = 2", "evaluate_top_m = 6"))
        p = subprocess.run([LAUNCH, bad, "--run-dir", os.path.join(self.tmp, "never")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("arm top2 (the file's settings with [arm.top2] merged in) is not a valid config", p.stderr)
        self.assertIn("experiment.evaluate_top_m: evaluate_top_m = 6 leaves nothing out of k = 6", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "never", "all")))

    def test_an_arms_errors_are_located_in_the_file_and_bring_no_follow_on_errors(self):
        with open(self.cfg) as f:
            base = f.read()
        bad = os.path.join(self.tmp, "located-comparison.toml")
        text = base + """
[comparison]
arms = ["rl", "all", "after"]
[arm.rl.experiment]
mode = "train"
bogus_key = 1
[arm.all.experiment]
mode = "best_of_n"
k = "six"
[arm.after.experiment]
mode = "best_of_n"
[arm.after.policy]
adapter = "arm:rl"
"""
        with open(bad, "w") as f:
            f.write(text)
        lines = text.splitlines()
        bogus = lines.index("bogus_key = 1") + 1
        six = lines.index('k = "six"') + 1
        p = subprocess.run([LAUNCH, "check", bad], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{bad}:{bogus}:13: experiment.bogus_key: unknown key", p.stderr)
        self.assertIn(f"{bad}:{six}:5: experiment.k: expected an integer", p.stderr)
        self.assertNotIn("arm after", p.stderr)  # it only refers to rl, whose errors are said
        self.assertNotIn("expected an arm listed before", p.stderr)

    def test_deployable_top_m_evaluates_only_the_most_surprising(self):
        # best_of_n with evaluate_top_m: each task's samples are ranked by mean logprob before any
        # evaluation; only the m lowest are evaluated, the rest stored as skipped (the comparison's top2 arm).
        m = 2
        _, root, p = self.comparison()
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        run_dir = os.path.join(root, "top2")
        out = subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True, text=True, check=True).stdout
        samples = [json.loads(line) for line in out.splitlines() if line.strip()]
        self.assertEqual(len(samples), len(self.samples))  # every rollout is kept, evaluated or not
        by_task = {}
        for s in samples:
            by_task.setdefault(s["task_id"], []).append(s)
        evaluated = 0
        for task, g in by_task.items():
            g.sort(key=lambda s: s["sample_index"])
            means = [float(np.mean(np.asarray(s["logprobs"], dtype=np.float32).astype(np.float64))) for s in g]
            top = set(np.argsort(means, kind="stable")[:m].tolist()) if len(g) > m else set(range(len(g)))
            for i, s in enumerate(g):
                if i in top:
                    self.assertNotEqual(s["status"], "skipped", (task, i))
                    self.assertTrue(s["evaluator_id"], (task, i))
                    evaluated += 1
                else:
                    self.assertEqual(s["status"], "skipped", (task, i))
                    self.assertIn("evaluate_top_m", s["error"])
                    self.assertEqual(s["evaluator_id"], "")
        self.assertLess(evaluated, len(samples))
        with open(os.path.join(run_dir, "compute.json")) as f:
            c = json.load(f)
        self.assertEqual(c["rollouts"], len(samples))
        self.assertEqual(c["evaluations"], evaluated)
        self.assertEqual(c["settings"]["evaluate_top_m"], str(m))
        # Rates count evaluated samples only; the deployable strategy is exactly what the run did.
        a = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json", "--m", str(m)], capture_output=True,
                                      text=True, check=True).stdout)
        ev = [s for s in samples if s["status"] != "skipped"]
        self.assertEqual(a["samples"], len(ev))
        self.assertAlmostEqual(a["correct_rate"], np.mean([s["status"] == "ok" for s in ev]), places=12)
        groups = [g for g in by_task.values() if len(g) >= 2]
        picks = []
        for g in groups:
            ok = [s for s in g if s["status"] == "ok"]
            picks.append(max((s["speedup"] for s in ok), default=None))
        dep = a["selection"]["strategies"]["deployable_top_m"]
        self.assertEqual(dep["groups"], len(groups))
        self.assertAlmostEqual(dep["fast_1"], np.mean([x is not None and x > 1 for x in picks]), places=12)
        self.assertAlmostEqual(dep["evaluations_per_group"], np.mean([min(len(g), m) for g in groups]), places=12)
        # The same verdicts as the full run's simulated deployable top-m (correctness does not vary).
        full = self.analyze("--m", str(m))["selection"]["strategies"]["deployable_top_m"]
        self.assertAlmostEqual(dep["correct"], full["correct"], places=12)

    def test_compute_is_accounted(self):
        with open(os.path.join(self.run_dir, "compute.json")) as f:
            c = json.load(f)
        self.assertEqual(c["rollouts"], len(self.samples))
        self.assertEqual(c["student_completion_tokens"], sum(len(s["token_ids"]) for s in self.samples))
        self.assertEqual(c["student_prompt_tokens"], 0)  # replayed text: no model, no tokenizer to count with
        self.assertEqual(c["student_tokens"], c["student_completion_tokens"])
        self.assertEqual(c["teacher_tokens"], 0)
        self.assertEqual(c["total_tokens"], c["student_tokens"])
        self.assertAlmostEqual(c["eval_seconds"], sum(s["wall_s"] for s in self.samples), places=6)
        self.assertGreater(c["eval_seconds"], 0)
        self.assertEqual(c["learner_seconds"], 0)
        self.assertEqual(c["settings"]["mode"], "eval")
        self.assertEqual(c["settings"]["tasks"], str(len(TASKS)))

    def test_compare_refuses_runs_whose_budgets_differ(self):
        twin = os.path.join(self.tmp, "twin")
        shutil.copytree(self.run_dir, twin, dirs_exist_ok=True)
        p = subprocess.run([LAUNCH, "compare", self.run_dir, twin], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("twin", p.stdout)
        compute = os.path.join(twin, "compute.json")
        with open(compute) as f:
            c = json.load(f)
        c["settings"]["temperature"] = "0.5"
        c["rollouts"] += 3
        self.assertEqual(c["settings"]["model"], "")  # a replay run has none: said as such, not as a blank
        c["settings"]["model"] = "models/policy"
        with open(compute, "w") as f:
            json.dump(c, f)
        p = subprocess.run([LAUNCH, "compare", self.run_dir, twin], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 3)
        self.assertIn("the budgets differ", p.stderr)
        self.assertIn("temperature: 1 in %s but 0.5 in %s" % (self.run_dir, twin), p.stderr)
        self.assertIn('model: "" (empty) in %s but models/policy in %s' % (self.run_dir, twin), p.stderr)
        self.assertIn("rollouts: %d in %s but %d in %s" % (c["rollouts"] - 3, self.run_dir, c["rollouts"], twin), p.stderr)
        p = subprocess.run([LAUNCH, "compare", self.run_dir, twin, "--allow-mismatch", "--json"], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        j = json.loads(p.stdout)
        self.assertEqual(len(j["differences"]), 3)
        self.assertEqual(j["runs"][1]["compute"]["rollouts"], c["rollouts"])

    def test_compare_places_each_run_on_the_best_of_n_curve(self):
        twin = os.path.join(self.tmp, "twin-k")
        shutil.copytree(self.run_dir, twin, dirs_exist_ok=True)
        db = sqlite3.connect(os.path.join(twin, "store.sqlite"))
        summary = json.loads(db.execute("SELECT summary_json FROM runs").fetchone()[0])
        first = json.loads(subprocess.run([LAUNCH, "analyze", self.run_dir, "--json"], capture_output=True, text=True,
                                          check=True).stdout)["at_k"][0]["fast_1"]
        self.assertGreater(first, 0)  # so that a score below the curve's start exists
        for target, expect_none in [(0.3, False), (first / 2, False), (1.01, True)]:
            summary["boa"] = {"step": 0, "fast_1": target}  # as an adapted run reports it
            db.execute("UPDATE runs SET summary_json = ?", (json.dumps(summary),))
            db.commit()
            p = subprocess.run([LAUNCH, "compare", self.run_dir, twin, "--json"], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            j = json.loads(p.stdout)
            self.assertEqual(j["curve_of"], self.run_dir)
            curve = [(a["k"], a["fast_1"]) for a in j["runs"][0]["analysis"]["at_k"]]
            self.assertEqual([k for k, _ in curve], list(range(1, len(curve) + 1)))  # every k, not powers of 2
            self.assertEqual(j["runs"][1]["score"], target)
            ks, vs = np.array([k for k, _ in curve], float), np.array([v for _, v in curve])
            if expect_none:
                self.assertIsNone(j["runs"][1]["equivalent_k"])
                continue
            self.assertTrue(np.all(np.diff(vs) >= -1e-12))  # the curve does not fall

            def crossing(t):  # the first point at or above t, linearly interpolated from the one before
                if t < vs[0]:
                    return "< 1"  # below the curve's start: fewer than one sample a task (the seeds' "< 1")
                i = int(np.argmax(vs >= t))
                if i == 0:
                    return ks[0]
                return float(ks[i - 1] + (t - vs[i - 1]) / (vs[i] - vs[i - 1]) * (ks[i] - ks[i - 1]))

            for run, t in ((j["runs"][1], target), (j["runs"][0], j["runs"][0]["score"])):
                want = crossing(t)
                if isinstance(want, str):
                    self.assertEqual(run["equivalent_k"], want)
                else:
                    self.assertAlmostEqual(run["equivalent_k"], want, places=9)
            if target == first / 2:
                self.assertEqual(j["runs"][1]["equivalent_k"], "< 1")
                table = subprocess.run([LAUNCH, "compare", self.run_dir, twin], capture_output=True, text=True,
                                       timeout=120).stdout
                self.assertRegex(table, r"twin-k .* < 1 ")  # (then the curve at its budget)
        db.close()

    def test_report_plots_what_analyze_computes_and_opens_offline(self):
        path, page, text = report_marks(self.run_dir, "--m", "2")
        self.assertEqual(path, os.path.join(os.path.realpath(self.run_dir), "report.html"))
        # Offline: no scripts, no external resources (the only URL is the SVG namespace).
        self.assertNotIn("script", page.tags)
        self.assertEqual(page.urls, [])
        self.assertEqual(set(u for u in __import__("re").findall(r"https?://[^\s\"']+", text)),
                         {"http://www.w3.org/2000/svg"})
        for section in ["Summary", "Compute (the budget)", "Scaling curve", "Selection strategies", "Per-task scatter",
                        "Tasks"]:
            self.assertIn(section, page.h2)
        a = self.analyze("--m", "2")

        def series(name):
            return [m for m in page.marks if m["data-series"] == name]

        # The scaling curve: every k's pass@k and fast_1@k, with their intervals.
        for name, key in [("pass@k", "pass"), ("fast_1@k", "fast_1")]:
            pts = series(name)
            self.assertEqual([int(float(m["data-x"])) for m in pts], [p["k"] for p in a["at_k"]])
            for m, p in zip(pts, a["at_k"]):
                self.assertAlmostEqual(float(m["data-y"]), p[key], places=12)
                self.assertAlmostEqual(float(m["data-lo"]), p[key + "_ci"][0], places=12)
                self.assertAlmostEqual(float(m["data-hi"]), p[key + "_ci"][1], places=12)
        # The selection strategies' bars.
        bars = {m["data-x"]: float(m["data-y"]) for m in series("selection fast_1")}
        self.assertEqual(set(bars), set(a["selection"]["strategies"]))
        for k, v in bars.items():
            self.assertAlmostEqual(v, a["selection"]["strategies"][k]["fast_1"], places=12)
        # The scatter: every correct sample with tokens, at (surprisal, speedup), in its task's series.
        correct = sorted((s["task_id"], -s["logprob_mean"], s["speedup"]) for s in self.samples
                         if s["status"] == "ok" and s["num_tokens"] > 0)
        drawn = sorted((m["data-series"], float(m["data-x"]), float(m["data-y"])) for m in page.marks
                       if m["data-chart"] == "per-task scatter")
        self.assertEqual(len(drawn), len(correct))
        for d, c in zip(drawn, correct):
            self.assertEqual(d[0], c[0])
            self.assertAlmostEqual(d[1], c[1], places=9)
            self.assertAlmostEqual(d[2], c[2], places=9)
        # --out writes elsewhere; a missing run is an error.
        other = os.path.join(self.tmp, "r.html")
        self.assertEqual(report_marks(self.run_dir, "--out", other)[0], other)
        p = subprocess.run([LAUNCH, "report", os.path.join(self.tmp, "nothing")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no run store here", p.stderr)

    def test_text_output_and_bad_arguments(self):
        p = subprocess.run([LAUNCH, "analyze", self.run_dir], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("pass@k", p.stdout)
        self.assertIn("Spearman rho", p.stdout)
        p = subprocess.run([LAUNCH, "analyze", self.run_dir, "--k", "0"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("analyze: --k: expected counts like 1,2,4", p.stderr)
        p = subprocess.run([LAUNCH, "analyze", os.path.join(self.tmp, "nothing")], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no run store here", p.stderr)
        # A folder of runs (a comparison's, a per-task run's): its runs are named.
        parent = os.path.join(self.tmp, "arms")
        os.makedirs(parent, exist_ok=True)
        arm = os.path.join(parent, "best_of_n")
        if not os.path.exists(arm):
            os.symlink(self.run_dir, arm)
        p = subprocess.run([LAUNCH, "analyze", parent], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"no run store here; it holds 1 run: {arm} (e.g. launch analyze {arm})", p.stderr)


if __name__ == "__main__":
    unittest.main()
