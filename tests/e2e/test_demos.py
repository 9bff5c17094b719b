"""The demonstration corpus of the embedded small policy (tasks/demos.jsonl, written by
scripts/local_policy.py), and `launch prompts`.

The committed corpus is what the script generates from the bundled tasks and their replay files;
every task has a baseline (the reference's own body), a slow body and at least one other correct
one, and a wrong one; run through the real CPU evaluator (a replay run), each body gets the verdict
its kind promises, and the slow bodies measure slower than the reference. The prompts `launch prompts`
prints are the ones a libtorch run records with its samples.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
CORPUS = os.path.join(ROOT, "tasks", "demos.jsonl")
TASKS = os.path.join(ROOT, "tasks", "bundled")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class DemosTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-demos-")
        cls.demos = read_jsonl(CORPUS)
        cfg = os.path.join(cls.tmp, "demos.toml")
        with open(cfg, "w") as f:
            f.write('[[node]]\nname = "local"\nroles = ["supervisor", "sampler", "evaluator", "monitor"]\ncpu_slots = 2\n'
                    '[tasks]\ndir = "%s"\n[sampler]\nreplay = "%s"\n[evaluator]\ntimeout_s = 30\n'
                    '[experiment]\nname = "demos"\nrun_root = "%s"\n[monitor]\nprogress = false\n'
                    % (TASKS, CORPUS, os.path.join(cls.tmp, "runs")))
        cls.cfg = cfg
        run_dir = os.path.join(cls.tmp, "run")
        p = subprocess.run([LAUNCH, cfg, "--run-dir", run_dir], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise AssertionError(p.stderr[-3000:])
        cls.results = read_jsonl_text(subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True,
                                                      text=True, check=True).stdout)

    def test_the_committed_corpus_is_what_the_script_generates(self):
        out = os.path.join(self.tmp, "demos.jsonl")
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "local_policy.py"), "--corpus-only", "--corpus", out],
                       check=True, capture_output=True, text=True)
        self.assertEqual(read_jsonl(out), self.demos)

    def test_every_task_has_every_kind_of_body(self):
        tasks = sorted(f[:-3] for f in os.listdir(TASKS) if f.endswith(".py"))
        self.assertEqual(sorted({d["task_id"] for d in self.demos}), tasks)
        for t in tasks:
            kinds = [d["kind"] for d in self.demos if d["task_id"] == t]
            self.assertIn("baseline", kinds, t)
            self.assertIn("slow", kinds, t)
            self.assertIn("wrong", kinds, t)
            self.assertTrue({"fast", "alternative"} & set(kinds), t)
            for d in self.demos:
                self.assertTrue(d["completion"].startswith("```python\n") and d["completion"].endswith("\n```"), d)

    def test_each_body_gets_the_verdict_its_kind_promises(self):
        self.assertEqual(len(self.results), len(self.demos))
        by_task, slow = {}, []
        for r in self.results:
            by_task.setdefault(r["task_id"], []).append(r)
        for t, rs in by_task.items():
            rs.sort(key=lambda r: r["sample_index"])  # replay keeps the file's order within a task
            demos = [d for d in self.demos if d["task_id"] == t]
            for d, r in zip(demos, rs):
                self.assertEqual(r["completion"], d["completion"])
                if d["kind"] == "wrong":
                    self.assertEqual(r["status"], "incorrect", (t, d["kind"], r["error"]))
                else:
                    self.assertEqual(r["status"], "ok", (t, d["kind"], r["error"]))
                if d["kind"] == "slow":
                    slow.append(r["speedup"])
        # CPU timings of small ops are noisy on a busy machine: most, not all, slow bodies measure slower.
        self.assertGreaterEqual(sum(x < 1.0 for x in slow), 0.8 * len(slow), slow)

    def test_prompts_are_what_the_sampler_sends(self):
        p = subprocess.run([LAUNCH, "prompts", self.cfg], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        prompts = read_jsonl_text(p.stdout)
        self.assertEqual(len(prompts), 35)
        swish = next(x for x in prompts if x["task_id"] == "06_swish")
        self.assertEqual(swish["split"], "")
        with open(os.path.join(TASKS, "06_swish.py")) as f:
            self.assertIn(f.read(), swish["prompt"])
        self.assertTrue(swish["prompt"].startswith("<|im_start|>system\n"))
        self.assertTrue(swish["prompt"].endswith("<|im_start|>assistant\n"))
        self.assertIn("Here is a PyTorch program (task 06_swish)", swish["prompt"])
        bad = os.path.join(self.tmp, "bad.toml")
        with open(bad, "w") as f:
            f.write('[tasks]\ndir = "%s"\nids = ["99"]\n' % TASKS)
        p = subprocess.run([LAUNCH, "prompts", bad], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("tasks.ids[0]", p.stderr)


def read_jsonl_text(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


if __name__ == "__main__":
    unittest.main()
