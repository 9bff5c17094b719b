"""`launch sft`, and train mode end to end, started the way a user starts it (`launch CONFIG`, `launch CONFIG --resume
RUN_DIR`): GRPO on a tiny Qwen2 with a LoRA adapter, samples from tests/fixtures/openai_server.py --policy
(a real policy restricted to a menu of three bodies, its token ids and logprobs computed by
transformers + PEFT under the adapter the learner published), evaluated by the real CPU evaluator.

Checked against references no one here wrote: every published adapter is loaded by PEFT in the
server, and the learner's recomputed logprobs of the server's tokens match transformers' (the
importance ratio of every step is 1); the final adapter raises PEFT's probability of the correct
body; a run killed with SIGKILL between steps and resumed ends with the same adapter as the run
that was never interrupted (which needs the optimizer state restored) and counts no sample twice.
"""
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_analysis import report_marks, rho  # noqa: E402
from test_policy import run_and_export, start_openai_server, train_tokenizer, write_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
PROBE = os.environ.get("KERNELRL_POLICY_PROBE", os.path.join(ROOT, "build", "tests", "policy_probe"))
TASKS = ["06_swish", "07_hardtanh_scale", "09_row_sum"]
STEPS, BATCH, GROUP = 4, 2, 4


def export_of(run_dir):
    """`launch export RUN_DIR --jsonl`, one dict a sample."""
    out = subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def assert_check_refuses(test, cfg, edit, message):
    """`launch check` on a copy of `cfg` changed by `edit` (text -> text) exits 2 naming `message`."""
    with open(cfg) as f:
        text = f.read()
    bad = cfg[:-len(".toml")] + "-bad.toml"
    with open(bad, "w") as f:
        f.write(edit(text))
    p = subprocess.run([LAUNCH, "check", bad], capture_output=True, text=True)
    test.assertEqual(p.returncode, 2, p.stderr)
    test.assertIn(message, p.stderr)


def in_process_comparison(tmp, model, name, tasks, arms):
    """A comparison config on the in-process sampler (the embedded policy, 8 tokens) over `tasks`:
    2 steps x 2 samples for the learning arms; `arms` is its [comparison] and [arm.*] tables."""
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write("""
[[node]]
name = "local"
roles = ["supervisor", "learner", "sampler", "evaluator", "monitor"]
cpu_slots = 1
[tasks]
dir = "%s"
ids = %s
[policy]
model = "%s"
dtype = "f32"
template = "plain"
[sampler]
backend = "libtorch"
max_tokens = 8
[learner]
steps = 2
batch_size = 2
group_size = 2
lora_rank = 4
lora_alpha = 8
learning_rate = 0.05
[experiment]
name = "%s"
run_root = "%s"
[monitor]
progress = false
""" % (os.path.join(ROOT, "tasks", "bundled"), json.dumps(tasks), model, name, os.path.join(tmp, "runs")) + arms)
    return path


def config(tmp, url, model, name, mode="train", steps=STEPS, extra="", experiment="", learner=""):
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write("""
[cluster]
name = "train-test"
[[node]]
name = "local"
roles = ["supervisor", "learner", "sampler", "evaluator", "monitor"]
# One evaluator: verdicts come back in dispatch order, so groups complete (and their gradients
# are summed) in the same order in every run, and a resumed run can match bit for bit.
cpu_slots = 1
[tasks]
dir = "%s"
ids = %s
[policy]
model = "%s"
dtype = "f32"
template = "plain"
# As configs/local.toml has it: `launch probe` resolves it from the run's config (issue 57).
device = "auto"
[sampler]
backend = "openai"
url = "%s"
served_model = "menu"
temperature = 1.0
max_tokens = 128
batch_prompts = 2
adapter_dir = "%s"
[reward]
shape = "none"
correct_bonus = 1.0
[learner]
steps = %d
batch_size = %d
group_size = %d
minibatch_size = 4
lora_rank = 4
lora_alpha = 8
lora_targets = ["q_proj", "v_proj", "down_proj"]
learning_rate = 0.05
keep_last = 10
sync_timeout_s = 60
%s
[evaluator]
timeout_s = 60
compile_workers = 0
[experiment]
mode = "%s"
seed = 5
name = "%s"
run_root = "%s"
%s
[monitor]
progress = false
""" % (os.path.join(ROOT, "tasks", "bundled"), json.dumps(TASKS), model, url, os.path.join(tmp, "adapters-" + name),
       steps, BATCH, GROUP, learner, mode, name, os.path.join(tmp, "runs"), experiment) + extra)
    return path


def steps_of(run_dir):
    db = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
    rows = [json.loads(r[0]) for r in db.execute("SELECT stats_json FROM steps ORDER BY step")]
    samples = db.execute("SELECT step, policy_version, sample_id FROM samples").fetchall()
    db.close()
    return rows, samples


def adapter(run_dir, step):
    return load_file(os.path.join(run_dir, "checkpoints", "step-%d" % step, "adapter_model.safetensors"))


def tiny_model(tmp, hidden=32, init=0.05):
    """A random two-layer Qwen2 with a byte-level BPE tokenizer trained on this repository's text."""
    # Trained on the bundled tasks (what the prompts hold), not on the docs: an edit of the README
    # must not change what this random model writes, nor so how far a few steps move it.
    tasks = sorted(os.path.join("tasks", "bundled", f) for f in os.listdir(os.path.join(ROOT, "tasks", "bundled"))
                   if f.endswith(".py"))
    tok = train_tokenizer("qwen2", os.path.join(tmp, "tokenizer.json"), files=tasks)
    torch.manual_seed(3)
    d = os.path.join(tmp, "tiny")
    m = Qwen2ForCausalLM(Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
                                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                     initializer_range=init, eos_token_id=tok.token_to_id("<|im_end|>")))
    m.save_pretrained(d)
    shutil.copy(os.path.join(tmp, "tokenizer.json"), d)
    return d


class SftTest(unittest.TestCase):
    """`launch sft`: LoRA SFT on prompt/completion lines; PEFT loads the result and finds the
    demonstrations likelier than before; bad lines are refused with FILE:LINE."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-sft-")
        cls.model = tiny_model(cls.tmp, hidden=64, init=0.2)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_sft_raises_the_demonstrations_likelihood(self):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        demos = [{"prompt": "Task: swish.\n", "completion": "return x * torch.sigmoid(x)"},
                 {"prompt": "Task: row sum.\n", "completion": "return x.sum(dim=1, keepdim=True)"},
                 {"prompt": "Task: hardtanh.\n", "completion": "return torch.clamp(x, -1.0, 1.0) * self.scale"}]
        data = os.path.join(self.tmp, "demos.jsonl")
        with open(data, "w") as f:
            for d in demos:
                f.write(json.dumps(d) + "\n")
        out = os.path.join(self.tmp, "sft-out")
        p = subprocess.run([LAUNCH, "sft", "--model", self.model, "--data", data, "--out", out, "--steps", "60",
                            "--batch", "3", "--lr", "0.02", "--rank", "8", "--alpha", "16", "--json"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        losses = [json.loads(line)["loss"] for line in p.stdout.splitlines()]
        self.assertEqual(len(losses), 60)
        self.assertLess(losses[-1], 0.5 * losses[0], losses)
        tok = AutoTokenizer.from_pretrained(self.model)
        eos = tok.convert_tokens_to_ids("<|im_end|>")

        def nll(model):
            total = 0.0
            for d in demos:
                pi = tok(d["prompt"], add_special_tokens=False)["input_ids"]
                ci = tok(d["completion"], add_special_tokens=False)["input_ids"] + [eos]
                with torch.no_grad():
                    lp = torch.log_softmax(model(input_ids=torch.tensor([pi + ci])).logits[0, :-1], -1)
                total -= lp[len(pi) - 1:].gather(-1, torch.tensor(ci)[:, None]).sum().item()
            return total

        base = AutoModelForCausalLM.from_pretrained(self.model, dtype=torch.float32)
        before = nll(base)
        after = nll(PeftModel.from_pretrained(base, out).eval())
        self.assertLess(after, 0.5 * before, (before, after))

    def test_bad_demonstrations_are_refused_with_their_line(self):
        data = os.path.join(self.tmp, "bad.jsonl")
        with open(data, "w") as f:
            f.write(json.dumps({"prompt": "a", "completion": "b"}) + "\n" + json.dumps({"prompt": "a"}) + "\n")
        p = subprocess.run([LAUNCH, "sft", "--model", self.model, "--data", data, "--out", os.path.join(self.tmp, "x")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 2)
        self.assertIn("bad.jsonl:2: expected an object with string fields", p.stderr)


class DataParallelEngineTest(unittest.TestCase):
    """The learner's engine as `launch` makes it from [learner] devices (policy_probe engine-step):
    ranks on threads of one process, gradients summed by c10d's ProcessGroupGloo, against the
    one-rank engine on the same groups."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-dp-")
        cls.model = tiny_model(cls.tmp)
        # An adapter whose B is not zero (a fresh one's is), so every LoRA tensor has a gradient.
        cls.adapter = os.path.join(cls.tmp, "adapter")
        subprocess.run([PROBE, "lora-init", "--model", cls.model, "--rank", "4", "--alpha", "8", "--targets",
                        "q_proj,v_proj,down_proj", "--seed", "1", "--b-std", "0.05", "--out", cls.adapter], check=True)
        with open(os.path.join(cls.model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        rng = np.random.default_rng(7)

        def group(rewards):
            return [{"prompt": "Task %d: write the kernel.\n" % int(rng.integers(100)),
                     "token_ids": [int(t) for t in rng.integers(0, vocab, int(rng.integers(3, 12)))],
                     "reward": r} for r in rewards]

        cls.groups = [group([1.0, 0.0, 0.5, 0.0]), group([0.2, 0.9, 0.1, 0.4]), group([1.0, 1.0, 1.0, 1.0]),
                      group([0.0, 0.0, 1.0, 0.3]), group([0.7, 0.1, 0.0, 0.2])]
        for g in cls.groups:
            for x in g:
                x["logprobs"] = [float(v) for v in -4.0 + 0.1 * rng.standard_normal(len(x["token_ids"]))]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def step(self, devices, groups, *extra):
        path = tempfile.mktemp(suffix=".json", dir=self.tmp)
        with open(path, "w") as f:
            json.dump(groups, f)
        out = tempfile.mkdtemp(prefix="out-", dir=self.tmp)
        p = subprocess.run([PROBE, "engine-step", "--model", self.model, "--adapter", self.adapter, "--groups", path,
                            "--out", out, "--devices", devices, "--steps", "2", "--lr", "0.01", "--minibatch", "3"]
                           + list(extra),
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise AssertionError("engine-step %s failed:\n%s" % (devices, p.stderr))
        with open(os.path.join(out, "report.json")) as f:
            return load_file(os.path.join(out, "adapter_model.safetensors")), json.load(f), p.stderr

    def assert_same(self, got, want, what):
        (a, ra, _), (b, rb, _) = got, want
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertLess((a[k] - b[k]).abs().max().item(), 1e-5, (what, k))
        for s1, s2 in zip(ra, rb):
            for key in ("loss", "grad_norm", "tokens", "sequences"):
                self.assertAlmostEqual(s1[key], s2[key], delta=1e-5 * max(1.0, abs(s2[key])), msg=(what, key))
            self.assertEqual(s1["version"], s2["version"])

    def test_mismatch_rejection_leaves_out_the_tokens_and_sequences_the_sampler_got_wrong(self):
        # The sampler's logprobs set to PEFT's own (float32) under the starting adapter, then a few
        # tokens (and, for the sequence mode, one whole sequence) moved by 2: those leave the loss.
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(self.model)
        m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(self.model, dtype=torch.float32),
                                      self.adapter).eval()
        groups = json.loads(json.dumps(self.groups))
        for g in groups:
            for x in g:
                p = tok(x["prompt"], add_special_tokens=False)["input_ids"]
                with torch.no_grad():
                    lp = torch.log_softmax(m(input_ids=torch.tensor([p + x["token_ids"]])).logits[0, :-1], -1)
                x["logprobs"] = lp[len(p) - 1:].gather(-1, torch.tensor(x["token_ids"])[:, None])[:, 0].tolist()
        truth = json.loads(json.dumps(groups))
        moved = [(0, 1, 0), (1, 2, 1), (4, 0, 2)]  # (group, sample, token)
        for gi, si, ti in moved:
            groups[gi][si]["logprobs"][ti] += 2.0
        learned = [g for g in groups if len(set(x["reward"] for x in g)) > 1]  # (equal rewards: no gradient)
        total = sum(len(x["token_ids"]) for g in learned for x in g)
        off = self.step("cpu", groups)[1][0]
        token = self.step("cpu", groups, "--mismatch", "token", "--mismatch-threshold", "0.5")[1][0]
        self.assertEqual((off["tokens"], off["mismatch_tokens"]), (total, 0))
        self.assertEqual((token["tokens"], token["mismatch_tokens"], token["mismatch_sequences"]),
                         (total - len(moved), len(moved), 0))
        # The token mean of -A x ratio over the tokens kept (ratio 1 up to float32: the logprobs are
        # the learner's own), A the group's (r - mean) / (sample std + 1e-4).
        num = den = 0.0
        for gi, g in enumerate(groups):
            r = np.array([x["reward"] for x in g])
            if len(set(r)) == 1:
                continue
            adv = (r - r.mean()) / (r.std(ddof=1) + 1e-4)
            for si, x in enumerate(g):
                kept = len(x["token_ids"]) - sum(1 for a, b, _ in moved if (a, b) == (gi, si))
                num += -adv[si] * kept
                den += kept
        self.assertAlmostEqual(token["loss"], num / den, delta=1e-4)
        # Sequence mode: a sequence goes when the mean of its log ratios is beyond the threshold.
        whole = json.loads(json.dumps(groups))
        whole[1][0]["logprobs"] = [v + 1.0 for v in whole[1][0]["logprobs"]]
        seq = self.step("cpu", whole, "--mismatch", "sequence", "--mismatch-threshold", "0.5")[1][0]
        # (a sample with one token moved by 2 goes too when it has fewer than 4 tokens)
        dropped = [(gi, si) for gi, g in enumerate(whole) if len(set(x["reward"] for x in g)) > 1
                   for si, x in enumerate(g)
                   if abs(np.mean(np.array(x["logprobs"]) - np.array(truth[gi][si]["logprobs"]))) > 0.5]
        self.assertIn((1, 0), dropped)
        self.assertEqual(seq["mismatch_sequences"], len(dropped))
        self.assertEqual(seq["tokens"], total - sum(len(whole[gi][si]["token_ids"]) for gi, si in dropped))

    def test_ranks_take_the_one_rank_step_on_the_same_groups(self):
        one = self.step("cpu", self.groups)
        two = self.step("cpu,cpu", self.groups)
        self.assertIn("data-parallel over 2 ranks (cpu, cpu), gradients summed by c10d gloo", two[2])
        self.assertGreater(one[1][0]["tokens"], 0)
        self.assertEqual([r["version"] for r in one[1]], [1, 2])
        self.assert_same(two, one, "2 ranks")
        # More ranks than groups with data: a rank that learned nothing still takes the step.
        few = [self.groups[0], self.groups[2]]
        self.assert_same(self.step("cpu,cpu,cpu", few), self.step("cpu", few), "3 ranks, one group")
        # The check can fail: one rank on part of the groups lands elsewhere.
        part, _, _ = self.step("cpu", self.groups[:2])
        self.assertTrue(any((part[k] - one[0][k]).abs().max().item() > 1e-4 for k in part))

    def test_a_step_of_skipped_groups_counts_the_version_on_every_rank(self):
        adapter, report, _ = self.step("cpu,cpu", [self.groups[2]])
        self.assertEqual([r["version"] for r in report], [1, 2])
        self.assertEqual([r["sequences"] for r in report], [0, 0])
        fresh, _, _ = self.step("cpu", [self.groups[2]])
        for k in adapter:
            self.assertTrue(torch.equal(adapter[k], fresh[k]), k)

    def test_ranks_that_mix_the_cpu_and_gpus_are_refused(self):
        path = os.path.join(self.tmp, "g.json")
        with open(path, "w") as f:
            json.dump(self.groups, f)
        p = subprocess.run([PROBE, "engine-step", "--model", self.model, "--groups", path, "--devices", "cpu,cuda:0",
                            "--out", os.path.join(self.tmp, "x")], capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("data-parallel learner: the ranks mix the CPU and GPUs", p.stderr)


class PolicyServerCase(unittest.TestCase):
    """Tests sharing a tiny model (cls.model) served by tests/fixtures/openai_server.py --policy at cls.url (its
    request log cls.log), in a scratch folder cls.tmp."""
    PREFIX = "kernelrl-train-"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix=cls.PREFIX)
        cls.model = tiny_model(cls.tmp)
        cls.log = os.path.join(cls.tmp, "requests.jsonl")
        cls.server, port = start_openai_server(cls.log, "--policy", cls.model)
        cls.url = "http://127.0.0.1:%s" % port

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.server.wait()
        cls.server.stdout.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)


class TrainRunTest(PolicyServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The uninterrupted run every test compares with.
        cls.full_dir = os.path.join(cls.tmp, "full")
        p = subprocess.run([LAUNCH, config(cls.tmp, cls.url, cls.model, "full"), "--run-dir", cls.full_dir],
                           capture_output=True, text=True, timeout=900)
        cls.full = p
        if p.returncode != 0:
            raise AssertionError("train run failed (%d):\n%s" % (p.returncode, p.stderr[-4000:]))

    def test_every_step_is_sampled_on_policy_and_learned(self):
        steps, samples = steps_of(self.full_dir)
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        for s in steps:
            self.assertEqual(s["samples"], BATCH * GROUP)
            self.assertEqual(s["policy_version"], s["step"])
            learner = s["learner"]
            # The learner's logprobs of the server's tokens (prompt tokenised by our tokenizer, adapter
            # published by weight sync, temperature applied) equal transformers + PEFT's.
            self.assertAlmostEqual(learner["ratio_mean"], 1.0, delta=1e-4, msg=s)
            self.assertEqual(learner["clip_fraction"], 0.0)
            self.assertGreater(learner["entropy"], 0.0)
        self.assertEqual(len(samples), STEPS * BATCH * GROUP)
        for step, version, _ in samples:
            self.assertEqual(version, step)
        # The server loaded each version once, in order, before sampling with it.
        with open(self.log) as f:
            loads = [json.loads(line)["body"]["lora_name"] for line in f if "load_lora_adapter" in line
                     and "unload" not in line]
        self.assertEqual(loads[:STEPS + 1], ["kernelrl-v%d" % v for v in range(STEPS + 1)])
        # launch analyze shows every step's fast_1 and the learner's figures.
        a = json.loads(subprocess.run([LAUNCH, "analyze", self.full_dir, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        self.assertEqual([s["step"] for s in a["steps"]], list(range(STEPS)))
        for mine, stored in zip(a["steps"], steps):
            self.assertAlmostEqual(mine["fast_1"], stored["fast_1"], places=12)
            self.assertAlmostEqual(mine["learner"]["loss"], stored["learner"]["loss"], places=12)
        out = self.full.stdout
        self.assertIn("policy version %d" % STEPS, out)
        self.assertIn("grad norm", out)

    def every_sample_once_and_on_policy(self, run_dir):
        """Every step learned, every planned sample stored once, each by the policy of its step: the steps' rows."""
        steps, samples = steps_of(run_dir)
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        ids = [sid for _, _, sid in samples]
        self.assertEqual(len(ids), STEPS * BATCH * GROUP)
        self.assertEqual(len(set(ids)), len(ids))
        for step, version, _ in samples:
            self.assertEqual(version, step)
        return steps

    def test_two_samplers_share_each_step_and_both_serve_every_version(self):
        # [sampler] urls: one sampler per inference server; each step's groups are spread over both,
        # every version is published to both, and every sample is stored once.
        log2 = os.path.join(self.tmp, "requests-2.jsonl")
        server2, port2 = start_openai_server(log2, "--policy", self.model)
        try:
            path = config(self.tmp, self.url, self.model, "two")
            with open(path) as f:
                text = f.read()
            url2 = "http://127.0.0.1:%s" % port2
            with open(path, "w") as f:
                f.write(text.replace('url = "%s"' % self.url, 'urls = ["%s", "%s"]' % (self.url, url2)))
            run_dir = os.path.join(self.tmp, "two")
            p = subprocess.run([LAUNCH, path, "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("2 samplers (openai backend)", p.stderr)
        finally:
            server2.kill()
            server2.wait()
            server2.stdout.close()
        steps = self.every_sample_once_and_on_policy(run_dir)
        for s in steps:  # the learner's logprobs equal what each server reported
            self.assertAlmostEqual(s["learner"]["ratio_mean"], 1.0, delta=1e-4, msg=s)
        export = [json.loads(line) for line in subprocess.run([LAUNCH, "export", run_dir, "--jsonl"],
                                                              capture_output=True, text=True, check=True).stdout.splitlines()]
        by_sampler = {}
        for x in export:
            by_sampler.setdefault(x["sampler_id"], set()).add((x["task_id"], x["group_id"]))
        self.assertEqual(sorted(by_sampler), ["sampler-0", "sampler-1"])
        # Whole groups: no group is split between the two.
        self.assertFalse(by_sampler["sampler-0"] & by_sampler["sampler-1"])
        # Each server loaded every version, in order, from its own adapter folder.
        for log, i in ((self.log, 0), (log2, 1)):  # (the first server's log also holds the other tests' runs)
            with open(log) as f:
                loads = [json.loads(line)["body"] for line in f if "load_lora_adapter" in line and "unload" not in line]
            loads = [b for b in loads if os.sep + "sampler-%d" % i + os.sep in b["lora_path"]]
            # (The same version loaded twice in a row, seen once in CI on a busy machine, counts
            # once: a load is idempotent. Why it was sent twice is not known.)
            names = [b["lora_name"] for j, b in enumerate(loads) if j == 0 or b["lora_name"] != loads[j - 1]["lora_name"]]
            self.assertEqual(names[:STEPS + 1], ["kernelrl-v%d" % v for v in range(STEPS + 1)])

    def test_a_sampler_whose_server_dies_has_its_groups_sampled_by_the_other(self):
        # The second server exits at its second completion request (step 1), unanswered: that
        # sampler fails twice ([sampler] max_failures = 2) and stops; its group of step 1 is
        # planned again on the first sampler, the learner publishes later versions to the one
        # left, and the run ends with every sample stored once.
        log2 = os.path.join(self.tmp, "requests-dies.jsonl")
        server2, port2 = start_openai_server(log2, "--policy", self.model, "--exit-after", "1")
        try:
            path = config(self.tmp, self.url, self.model, "dies")
            with open(path) as f:
                text = f.read()
            # (No retries, so the dead server's sampler fails at once; its requests end when the
            # server exits, so no short timeout is needed: with 10 s, a first adapter load that
            # took longer on a busy machine failed the run in CI.)
            text = text.replace('url = "%s"' % self.url, 'urls = ["%s", "http://127.0.0.1:%s"]\nmax_failures = 2\n'
                                'max_retries = 0\ntimeout_s = 120' % (self.url, port2))
            with open(path, "w") as f:
                f.write(text)
            run_dir = os.path.join(self.tmp, "dies")
            p = subprocess.run([LAUNCH, path, "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertEqual(server2.wait(timeout=60), 3)  # it did exit mid-run
        finally:
            if server2.poll() is None:
                server2.kill()
                server2.wait()
            server2.stdout.close()
        self.assertIn("2 generations failed in a row ([sampler] max_failures)", p.stderr)
        self.assertRegex(p.stderr, r"sampler-1 is gone \(.*\): 4 of its samples not yet stored; 4 planned again on the 1 left")
        self.assertRegex(p.stderr, r"sampler-1 is gone; (policy version \d|the next policy version) goes to the 1 left")
        self.every_sample_once_and_on_policy(run_dir)
        export = [json.loads(line) for line in subprocess.run([LAUNCH, "export", run_dir, "--jsonl"],
                                                              capture_output=True, text=True, check=True).stdout.splitlines()]
        # Step 0 on both samplers; from step 1 on, everything on the first.
        self.assertEqual({x["sampler_id"] for x in export if x["step"] == 0}, {"sampler-0", "sampler-1"})
        self.assertEqual({x["sampler_id"] for x in export if x["step"] >= 1}, {"sampler-0"})

    def test_two_builtin_samplers_on_one_device_share_the_base_weights_and_each_step(self):
        # [sampler] devices: one built-in sampler per entry (two on the CPU here), each with its own
        # adapter over one copy of the base weights; each step's groups are spread over both.
        cfg = write_config(self.tmp, 'backend = "libtorch"\ndevices = ["cpu", "cpu"]\nmax_tokens = 8\nbatch_prompts = 1\n'
                           '[learner]\nsteps = 2\nbatch_size = 4\ngroup_size = 2\nlora_rank = 4\nlora_alpha = 8',
                           policy='model = "%s"\ndtype = "f32"\ntemplate = "plain"' % self.model,
                           tasks='ids = ["06_swish", "07_hardtanh_scale", "09_row_sum", "10_row_max"]',
                           experiment='mode = "train"')
        export, p = run_and_export(cfg)
        self.assertIn("2 samplers (libtorch backend)", p.stderr)
        self.assertIn("are shared with another model of this process", p.stderr)
        self.assertEqual(len(export), 2 * 4 * 2)
        self.assertEqual(len({x["sample_id"] for x in export}), len(export))
        for step in (0, 1):
            mine = [x for x in export if x["step"] == step]
            self.assertEqual({x["sampler_id"] for x in mine}, {"sampler-0", "sampler-1"}, step)
            self.assertEqual({x["policy_version"] for x in mine}, {step})

    def test_checkpoints_are_peft_adapters_and_learning_favours_the_correct_body(self):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        ck = os.path.join(self.full_dir, "checkpoints")
        self.assertEqual(sorted(os.listdir(ck)), ["step-%d" % i for i in range(STEPS + 1)])
        for i in range(STEPS):
            with open(os.path.join(ck, "step-%d" % i, "stats.json")) as f:
                self.assertEqual(json.load(f)["step"], i)
        for i in range(STEPS + 1):
            self.assertTrue(os.path.exists(os.path.join(ck, "step-%d" % i, "optimizer.safetensors")))
        tok = AutoTokenizer.from_pretrained(self.model)
        db = sqlite3.connect(os.path.join(self.full_dir, "store.sqlite"))
        rows = db.execute("SELECT task_id, prompt, raw_action FROM samples WHERE status = 'ok' GROUP BY task_id").fetchall()
        db.close()
        self.assertTrue(rows, "no correct sample in the run")
        wrong = "Here it is.\n```python\nreturn None\n```"  # the server's wrong body
        eos = tok.convert_tokens_to_ids("<|im_end|>")

        def margins(adapter_dir):
            # Per task: mean token logprob of the correct body minus that of the wrong one (with eos).
            base = AutoModelForCausalLM.from_pretrained(self.model, dtype=torch.float32)
            m = PeftModel.from_pretrained(base, adapter_dir).eval()
            out = []
            for _, prompt, correct in rows:
                p = tok(prompt, add_special_tokens=False)["input_ids"]
                means = []
                for text in [correct, wrong]:
                    c = tok(text, add_special_tokens=False)["input_ids"] + [eos]
                    with torch.no_grad():
                        lp = torch.log_softmax(m(input_ids=torch.tensor([p + c])).logits[0, :-1], -1)
                    means.append(lp[len(p) - 1:].gather(-1, torch.tensor(c)[:, None]).mean().item())
                out.append(means[0] - means[1])
            return out

        before, after = margins(os.path.join(ck, "step-0")), margins(os.path.join(ck, "step-%d" % STEPS))
        # GRPO pushes the rewarded body up and the unrewarded one down, task by task.
        for b, a, row in zip(before, after, rows):
            self.assertGreater(a, b, "task %s: correct-minus-wrong logprob margin %.4f -> %.4f" % (row[0], b, a))
        self.assertGreater(sum(after) - sum(before), 0.1 * len(rows), (before, after))

    def test_nll_probe_equals_peft_under_every_checkpoint(self):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        p = subprocess.run([LAUNCH, "probe", self.full_dir, "--samples", "3", "--json"], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        j = json.loads(p.stdout)
        self.assertEqual([c["step"] for c in j["checkpoints"]], list(range(STEPS + 1)))
        ids = [s["sample_id"] for s in j["samples"]]
        self.assertEqual(len(ids), 3)
        db = sqlite3.connect(os.path.join(self.full_dir, "store.sqlite"))
        rows = {r[0]: r for r in db.execute("SELECT sample_id, prompt, step FROM samples")}
        db.close()
        export = {json.loads(line)["sample_id"]: json.loads(line) for line in subprocess.run(
            [LAUNCH, "export", self.full_dir, "--jsonl"], capture_output=True, text=True, check=True).stdout.splitlines()}
        self.assertTrue(all(rows[i][2] == 0 for i in ids))  # fixed samples from the first step
        tok = AutoTokenizer.from_pretrained(self.model)
        for c in j["checkpoints"]:
            base = AutoModelForCausalLM.from_pretrained(self.model, dtype=torch.float32)
            m = PeftModel.from_pretrained(base, c["path"]).eval()
            for i, got in zip(ids, c["nll"]):
                prompt = tok(rows[i][1], add_special_tokens=False)["input_ids"]
                comp = export[i]["token_ids"]
                with torch.no_grad():
                    lp = torch.log_softmax(m(input_ids=torch.tensor([prompt + comp])).logits[0, :-1] / 1.0, -1)
                ref = -lp[len(prompt) - 1:].gather(-1, torch.tensor(comp)[:, None]).mean().item()
                self.assertAlmostEqual(got, ref, delta=1e-4, msg=(c["step"], i))
        # step-0 is the sampling policy of those samples: its NLL is minus their recorded mean logprob.
        for i, got in zip(ids, j["checkpoints"][0]["nll"]):
            self.assertAlmostEqual(got, -float(np.mean(export[i]["logprobs"])), delta=1e-4)

    def test_nll_probe_rescores_another_runs_samples_and_ranks_them_against_speedup(self):
        # The seeds' probe: a best-of-N run's samples rescored under every checkpoint of a train run
        # of the same model, with rho(NLL, speedup) over the correct ones, per checkpoint.
        bon = os.path.join(self.tmp, "probe-bon")
        p = subprocess.run([LAUNCH, config(self.tmp, self.url, self.model, "probe-bon", mode="best_of_n",
                                           experiment="k = 16"), "--run-dir", bon], capture_output=True, text=True,
                           timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        p = subprocess.run([LAUNCH, "probe", self.full_dir, "--samples-from", bon, "--samples", "0", "--json"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        j = json.loads(p.stdout)
        export = {x["sample_id"]: x for x in export_of(bon)}
        ids = [s["sample_id"] for s in j["samples"]]
        self.assertEqual(sorted(ids), sorted(export))  # every sample of the other run (all have tokens)
        self.assertEqual([c["step"] for c in j["checkpoints"]], list(range(STEPS + 1)))
        # step-0 (a fresh adapter: the base policy) sampled them: its NLL is minus their mean logprob.
        for i, got in zip(ids, j["checkpoints"][0]["nll"]):
            self.assertAlmostEqual(got, -float(np.mean(export[i]["logprobs"])), delta=1e-4)
        ok = [k for k, i in enumerate(ids) if export[i]["status"] == "ok"]
        self.assertGreaterEqual(len(ok), 8, "too few correct samples to rank")
        for c in j["checkpoints"]:
            v = c["nll_vs_speedup"]
            x, y = [c["nll"][k] for k in ok], [export[ids[k]]["speedup"] for k in ok]
            self.assertEqual(v["n"], len(ok))
            if v["spearman_rho"] is not None:
                self.assertAlmostEqual(v["spearman_rho"], rho(x, y), places=9)
            order = sorted(range(len(x)), key=lambda k: -x[k])  # Q1: the highest NLL
            for q, row in enumerate(v["quartiles"]):
                part = order[len(order) * q // 4: len(order) * (q + 1) // 4]
                self.assertEqual(row["n"], len(part))
                self.assertAlmostEqual(row["mean_speedup"], float(np.mean([y[k] for k in part])), places=9)
        text = subprocess.run([LAUNCH, "probe", self.full_dir, "--samples-from", bon, "--samples", "5"],
                              capture_output=True, text=True, timeout=300)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("5 samples of %s rescored" % bon, text.stdout)
        self.assertRegex(text.stdout, r"step-%d +[0-9.]+ +rho " % STEPS)
        missing = subprocess.run([LAUNCH, "probe", self.full_dir, "--samples-from", os.path.join(self.tmp, "nowhere")],
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(missing.returncode, 2)
        self.assertIn("--samples-from", missing.stderr)

    def test_best_of_n_with_the_policy_draws_k_per_task_and_selects_among_them(self):
        run_dir = os.path.join(self.tmp, "bon")
        k = 6
        p = subprocess.run([LAUNCH, config(self.tmp, self.url, self.model, "bon", mode="best_of_n", experiment="k = %d" % k),
                            "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        export = [json.loads(line) for line in subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True,
                                                              text=True, check=True).stdout.splitlines()]
        self.assertEqual(sorted(x["task_id"] for x in export), sorted(TASKS * k))
        for x in export:  # the base policy's draws, with their tokens and logprobs
            self.assertEqual(x["policy_version"], 0)
            self.assertEqual(len(x["token_ids"]), len(x["logprobs"]))
            self.assertGreater(len(x["token_ids"]), 0)
        with open(os.path.join(run_dir, "compute.json")) as f:
            compute = json.load(f)
        self.assertEqual(compute["rollouts"], len(TASKS) * k)
        self.assertEqual(compute["settings"]["samples_per_task"], str(k))
        # Student tokens: each sample's prompt (as the model's tokenizer in transformers counts it)
        # and completion; the total adds the teacher's (none here).
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(self.model)
        prompt_tokens = [len(tok(x["prompt"], add_special_tokens=False)["input_ids"]) for x in export]
        self.assertEqual([x["prompt_tokens"] for x in export], prompt_tokens)
        self.assertEqual(compute["student_prompt_tokens"], sum(prompt_tokens))
        self.assertEqual(compute["student_completion_tokens"], sum(len(x["token_ids"]) for x in export))
        self.assertEqual(compute["student_tokens"], compute["student_prompt_tokens"] + compute["student_completion_tokens"])
        self.assertEqual(compute["total_tokens"], compute["student_tokens"] + compute["teacher_tokens"])
        a = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        self.assertEqual(a["selection"]["groups"], len(TASKS))
        # The oracle keeps a task's fastest correct sample: its fast_1 is the share of tasks with one.
        tasks_won = sum(any(x["status"] == "ok" and x["speedup"] > 1.0 for x in export if x["task_id"] == t) for t in TASKS)
        self.assertAlmostEqual(a["selection"]["strategies"]["oracle"]["fast_1"], tasks_won / len(TASKS), places=12)
        self.assertEqual([x["k"] for x in a["at_k"]], [1, 2, 4])

    def test_a_comparison_starts_its_arms_from_what_an_earlier_arm_learned(self):
        # RL first, then best-of-N and TTT from its best checkpoint, compared at equal budgets (the
        # pipeline of configs/local.toml); the in-process sampler, so the adapter is loaded here.
        root = os.path.join(self.tmp, "pipeline")
        cfg = in_process_comparison(self.tmp, self.model, "pipeline", ["06_swish", "07_hardtanh_scale"], """
[comparison]
arms = ["rl", "bon", "ttt"]
compare = ["bon", "ttt"]
[arm.rl.experiment]
mode = "train"
[arm.rl.learner]
steps = 3
keep_last = 1
[arm.bon.experiment]
mode = "best_of_n"
k = 4
[arm.bon.policy]
adapter = "arm:rl"
[arm.ttt.experiment]
mode = "ttt"
[arm.ttt.policy]
adapter = "arm:rl"
""")
        chk = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True)
        self.assertEqual(chk.returncode, 0, chk.stderr)
        self.assertIn("compared: bon, ttt", chk.stdout)
        self.assertIn("# arm bon (policy.adapter: arm rl's best checkpoint)", chk.stdout)
        p = subprocess.run([LAUNCH, cfg, "--run-dir", root], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        db = sqlite3.connect(os.path.join(root, "rl", "store.sqlite"))
        boa = json.loads(db.execute("SELECT summary_json FROM runs").fetchone()[0])["boa"]["checkpoint"]
        db.close()
        # keep_last = 1 over versions 0..3: the selector deleted a checkpoint (in a process that links
        # LibTorch, whose own copy of std::filesystem::remove_all once crashed it here).
        kept = [d for d in os.listdir(os.path.join(root, "rl", "checkpoints")) if d.startswith("step-")]
        self.assertLess(len(kept), 4, kept)
        self.assertIn(os.path.basename(boa), kept)
        for arm in ("bon", "ttt"):
            with open(os.path.join(root, arm + ".toml")) as f:
                self.assertIn("adapter = '%s'" % boa, f.read())
            with open(os.path.join(root, arm, "compute.json")) as f:
                compute = json.load(f)
            self.assertEqual(compute["settings"]["checkpoint"], boa)
            self.assertEqual(compute["rollouts"], 2 * 4)  # equal budgets: 4 per task
        self.assertIn("arm bon starts from arm rl's best checkpoint: " + boa, p.stdout)
        with open(os.path.join(root, "comparison.json")) as f:
            c = json.load(f)
        self.assertEqual([os.path.basename(r["run_dir"]) for r in c["runs"]], ["bon", "ttt"])
        self.assertIn("report: " + os.path.join(os.path.realpath(root), "report.html"), p.stdout)
        self.assertTrue(os.path.exists(os.path.join(root, "report.html")))
        # A reference to an arm that is not earlier, or that learns nothing, is refused before anything runs.
        with open(cfg) as f:
            text = f.read()
        bad = os.path.join(self.tmp, "bad-pipeline.toml")
        with open(bad, "w") as f:
            f.write(text.replace('adapter = "arm:rl"\n[arm.ttt', 'adapter = "arm:ttt"\n[arm.ttt'))
        p = subprocess.run([LAUNCH, "check", bad], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn('arm bon: policy.adapter = "arm:ttt": expected an arm listed before "bon"', p.stderr)

    def test_per_task_adaptation_is_compared_with_best_of_n_task_by_task(self):
        # The seeds' per-task TTT: one adapter per task from the same start, each with its own
        # Best-of-Adaptation, aggregated into one arm, against best-of-N at the same rollouts per task.
        root = os.path.join(self.tmp, "per-task")
        tasks = ["06_swish", "07_hardtanh_scale"]
        cfg = in_process_comparison(self.tmp, self.model, "per-task", tasks, """
[comparison]
arms = ["bon", "ttt"]
[arm.bon.experiment]
mode = "best_of_n"
k = 4
[arm.ttt.experiment]
mode = "ttt"
per_task = true
""")
        p = subprocess.run([LAUNCH, cfg, "--run-dir", root], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        arm = os.path.join(root, "ttt")
        self.assertIn("per-task ttt: 2 tasks, each from the same start", p.stdout)
        boa = {}
        for t in tasks:  # a run of its own per task, on that task alone
            export = export_of(os.path.join(arm, "tasks", t))
            self.assertEqual({x["task_id"] for x in export}, {t})
            self.assertEqual(len(export), 2 * 2)
            db = sqlite3.connect(os.path.join(arm, "tasks", t, "store.sqlite"))
            boa[t] = json.loads(db.execute("SELECT summary_json FROM runs").fetchone()[0])["boa"]
            db.close()
            self.assertTrue(boa[t]["checkpoint"].startswith(os.path.join(os.path.realpath(arm), "tasks", t)))
        # Aggregated: every task run's samples in the arm's store, the compute summed, the score the
        # mean of the tasks' Best-of-Adaptation fast_1.
        export = export_of(arm)
        self.assertEqual(sorted(x["task_id"] for x in export), sorted(tasks * 4))
        with open(os.path.join(arm, "compute.json")) as f:
            compute = json.load(f)
        self.assertEqual(compute["rollouts"], 8)
        self.assertEqual((compute["settings"]["tasks"], compute["settings"]["per_task"]), ("2", "true"))
        with open(os.path.join(root, "comparison.json")) as f:
            c = json.load(f)
        self.assertEqual(c["differences"], [])  # equal budgets: 4 rollouts per task on both sides
        mean_boa = sum(boa[t]["fast_1"] for t in tasks) / 2
        self.assertAlmostEqual(c["runs"][1]["score"], mean_boa, places=12)
        bon = export_of(os.path.join(root, "bon"))
        rows = {r["task_id"]: r for r in c["per_task_bon_vs_boa"][0]["tasks"]}
        self.assertEqual(sorted(rows), sorted(tasks))
        for t in tasks:
            mine = [x for x in bon if x["task_id"] == t]
            self.assertEqual(rows[t]["bon_fast_1_at_k"], float(any(x["status"] == "ok" and x["speedup"] > 1 for x in mine)))
            self.assertAlmostEqual(rows[t]["boa_fast_1"], boa[t]["fast_1"], places=12)
            self.assertEqual(rows[t]["boa_step"], boa[t]["step"])
            self.assertEqual(rows[t]["regime"], "covered" if any(x["status"] == "ok" for x in mine) else "uncovered")
        self.assertIn("per task: bon's best-of-N (fast_1@K) against ttt's Best-of-Adaptation", p.stdout)
        with open(os.path.join(root, "report.html")) as f:
            self.assertIn("<h2>Per task: bon's best-of-N against ttt's Best-of-Adaptation</h2>", f.read())
        # The same command again: every task run is done, the arms are kept, nothing runs twice.
        again = subprocess.run([LAUNCH, os.path.join(root, "ttt.toml"), "--run-dir", arm], capture_output=True,
                               text=True, timeout=300)
        self.assertEqual(again.returncode, 0, again.stderr[-3000:])
        self.assertIn("task 1/2 06_swish: already done", again.stdout)
        self.assertEqual(len(export_of(arm)), 8)
        # per_task is for modes that adapt, and a per-task arm hands on no single checkpoint.
        assert_check_refuses(self, cfg, lambda t: t.replace('mode = "best_of_n"\nk = 4', 'mode = "best_of_n"\nk = 4\nper_task = true'),
                             'experiment.per_task: per_task is for mode = "ttt" or "sdpo"')
        assert_check_refuses(self, cfg, lambda t: t.replace('arms = ["bon", "ttt"]', 'arms = ["ttt", "bon"]').replace(
            'mode = "best_of_n"\nk = 4\n', 'mode = "best_of_n"\nk = 4\n[arm.bon.policy]\nadapter = "arm:ttt"\n'),
            "arm ttt adapts one adapter per task (per_task = true)")

    def test_a_seeded_comparison_aggregates_its_arms_over_seeds_with_significance_tests(self):
        # [comparison] seeds: each arm once per seed (its sampling and task order), then each arm's
        # mean and standard deviation over seeds and the tests of one arm against the other.
        import itertools
        import mpmath
        root = os.path.join(self.tmp, "seeded")
        cfg = in_process_comparison(self.tmp, self.model, "seeded", ["06_swish", "07_hardtanh_scale"], """
[comparison]
arms = ["bon", "ttt"]
seeds = [0, 1, 2]
[arm.bon.experiment]
mode = "best_of_n"
k = 4
[arm.ttt.experiment]
mode = "ttt"
""")
        chk = subprocess.run([LAUNCH, "check", cfg], capture_output=True, text=True)
        self.assertEqual(chk.returncode, 0, chk.stderr)
        self.assertIn("each run with seeds 0, 1, 2", chk.stdout)
        p = subprocess.run([LAUNCH, cfg, "--run-dir", root], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        for arm in ("bon", "ttt"):
            for seed in (0, 1, 2):
                with open(os.path.join(root, "%s.seed-%d.toml" % (arm, seed))) as f:
                    text = f.read()
                self.assertRegex(text, r"(?m)^seed = %d$" % seed)
                self.assertTrue(os.path.exists(os.path.join(root, arm, "seed-%d" % seed, "compute.json")))
        draws = [tuple(x["completion"] for x in export_of(os.path.join(root, "bon", "seed-%d" % s))) for s in (0, 1, 2)]
        self.assertEqual(len(set(draws)), 3)  # another seed, other samples
        with open(os.path.join(root, "comparison.json")) as f:
            c = json.load(f)
        self.assertEqual([(r["arm"], r["seed"]) for r in c["runs"]], [(a, s) for a in ("bon", "ttt") for s in (0, 1, 2)])
        score = {(r["arm"], r["seed"]): r["score"] for r in c["runs"]}
        arms = {a["arm"]: a for a in c["seeds"]["arms"]}
        for arm in ("bon", "ttt"):
            xs = [score[(arm, s)] for s in (0, 1, 2)]
            self.assertAlmostEqual(arms[arm]["score_mean"], float(np.mean(xs)), places=12)
            self.assertAlmostEqual(arms[arm]["score_std"], float(np.std(xs, ddof=1)), places=12)
            self.assertEqual([r["seed"] for r in arms[arm]["runs"]], [0, 1, 2])
        # Each seed's TTT score against best-of-N's fast_1@k at TTT's rollouts a task (seed 001's comparison:
        # Best-of-Adaptation against best-of-K at equal rollouts), best-of-N's counted here from its samples.
        def fast_at(samples, k):
            per = {}
            for x in samples:
                per.setdefault(x["task_id"], []).append(x["status"] == "ok" and x["speedup"] > 1)
            return float(np.mean([1 - math.comb(len(v) - sum(v), k) / math.comb(len(v), k) for v in per.values()]))
        runs = {(r["arm"], r["seed"]): r for r in c["runs"]}
        at_k = []
        for s in (0, 1, 2):
            m = runs[("ttt", s)]["matched"]
            bon = export_of(os.path.join(root, "bon", "seed-%d" % s))
            self.assertEqual(m["k_rollouts"], runs[("ttt", s)]["compute"]["rollouts"] / len({x["task_id"] for x in bon}))
            at_k.append(fast_at(bon, round(m["k_rollouts"])))
            self.assertAlmostEqual(m["fast_1_at_rollouts"], at_k[-1], places=12)
        eq = [x for x in c["seeds"]["tests"] if x["against"] == "bon's fast_1@k at equal rollouts" and x["arm"] == "ttt"]
        self.assertEqual(len(eq), 1)
        self.assertAlmostEqual(eq[0]["mean_difference"], float(np.mean([score[("ttt", s)] for s in (0, 1, 2)]) -
                                                                np.mean(at_k)), places=12)
        t = c["seeds"]["tests"][0]
        self.assertEqual((t["arm"], t["against"], t["paired_seeds"]), ("ttt", "bon", 3))
        a = np.array([score[("ttt", s)] for s in (0, 1, 2)])
        b = np.array([score[("bon", s)] for s in (0, 1, 2)])
        d = a - b
        self.assertAlmostEqual(t["mean_difference"], float(d.mean()), places=12)

        def p_of(tv, df):  # Student's t, two-sided, through mpmath
            return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + tv * tv), regularized=True))

        if d.std(ddof=1) > 0:
            tv = d.mean() / (d.std(ddof=1) / math.sqrt(3))
            self.assertAlmostEqual(t["paired_t"], tv, places=9)
            self.assertAlmostEqual(t["paired_p"], p_of(tv, 2), places=9)
        flips = [abs(sum(s * x for s, x in zip(signs, d))) >= abs(d.sum()) * (1 - 1e-12)
                 for signs in itertools.product([1, -1], repeat=3)]
        self.assertAlmostEqual(t["sign_flip_p"], sum(flips) / 8, places=12)
        qa, qb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
        if qa + qb > 0:
            df = (qa + qb) ** 2 / (qa ** 2 / 2 + qb ** 2 / 2)
            self.assertAlmostEqual(t["welch_df"], df, places=9)
            self.assertAlmostEqual(t["welch_p"], p_of((a.mean() - b.mean()) / math.sqrt(qa + qb), df), places=9)
        self.assertIn("over seeds (mean +- standard deviation):", p.stdout)
        self.assertIn("ttt against bon: score difference", p.stdout)
        with open(os.path.join(root, "report.html")) as f:
            page = f.read()
        for mark in ("<h2>Over seeds</h2>", "<td>bon/seed-2</td>", "<td>ttt vs bon</td>"):
            self.assertIn(mark, page)
        assert_check_refuses(self, cfg, lambda t: t.replace("seeds = [0, 1, 2]", "seeds = [0, 0]"),
                             "comparison.seeds: expected a non-empty array of distinct seeds")

    def test_train_evaluates_held_out_tasks_periodically_and_never_learns_from_them(self):
        run_dir = os.path.join(self.tmp, "held-out")
        held_out = ["10_row_max", "12_rms_norm"]
        p = subprocess.run([LAUNCH, config(self.tmp, self.url, self.model, "held-out", steps=3,
                                           experiment='eval_ids = %s\neval_every = 2\neval_samples = 3' % json.dumps(held_out)),
                            "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        export = [json.loads(line) for line in subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True,
                                                              text=True, check=True).stdout.splitlines()]
        train = [x for x in export if x["split"] == ""]
        held = [x for x in export if x["split"] == "eval"]
        # Versions 0 (the start), 2 (every second) and 3 (the last) sample every held-out task 3 times,
        # with the weights of that version; the training steps hold only training tasks.
        self.assertEqual(sorted({x["step"] for x in held}), [0, 2, 3])
        for v in (0, 2, 3):
            mine = [x for x in held if x["step"] == v]
            self.assertEqual(sorted(x["task_id"] for x in mine), sorted(held_out * 3))
            self.assertEqual({x["policy_version"] for x in mine}, {v})
        self.assertEqual(len(train), 3 * BATCH * GROUP)
        self.assertTrue(all(x["task_id"] in TASKS for x in train))
        steps, _ = steps_of(run_dir)
        self.assertEqual([s["samples"] for s in steps], [BATCH * GROUP] * 3)  # the learner's groups: training only
        with open(os.path.join(run_dir, "compute.json")) as f:
            compute = json.load(f)
        self.assertEqual(compute["eval_split_rollouts"], len(held))
        self.assertEqual(compute["rollouts"], len(export))

        def rates(rows):
            return (sum(x["status"] == "ok" for x in rows) / len(rows),
                    sum(x["status"] == "ok" and x["speedup"] > 1.0 for x in rows) / len(rows))
        db = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
        summary = json.loads(db.execute("SELECT summary_json FROM runs").fetchone()[0])
        db.close()
        self.assertEqual([e["policy_version"] for e in summary["eval"]], [0, 2, 3])
        a = json.loads(subprocess.run([LAUNCH, "analyze", run_dir, "--json"], capture_output=True, text=True,
                                      check=True).stdout)
        self.assertEqual([s["step"] for s in a["eval"]["steps"]], [0, 2, 3])
        self.assertEqual(a["samples"], len(train))
        self.assertAlmostEqual(a["fast_1"], rates(train)[1], places=12)
        for e, s, v in zip(summary["eval"], a["eval"]["steps"], (0, 2, 3)):
            correct, fast = rates([x for x in held if x["step"] == v])
            self.assertAlmostEqual(e["correct_rate"], correct, places=12)
            self.assertAlmostEqual(e["fast_1"], fast, places=12)
            self.assertAlmostEqual(s["correct_rate"], correct, places=12)
            self.assertAlmostEqual(s["fast_1"], fast, places=12)
        best = max(summary["eval"], key=lambda e: (e["fast_1"], -e["policy_version"]))
        self.assertEqual(summary["eval_best"]["policy_version"], best["policy_version"])
        self.assertIn("held-out evaluation (2 tasks)", p.stdout)
        # The report draws the held-out curve beside the training curve.
        _, page, _ = report_marks(run_dir)
        drawn = [(float(m["data-x"]), float(m["data-y"])) for m in page.marks
                 if m["data-chart"] == "training curves" and m["data-series"] == "held-out fast_1"]
        self.assertEqual(drawn, [(float(s["step"]), s["fast_1"]) for s in a["eval"]["steps"]])

    def test_ttt_adapts_on_every_task_and_reports_best_of_adaptation(self):
        run_dir = os.path.join(self.tmp, "ttt")
        p = subprocess.run([LAUNCH, config(self.tmp, self.url, self.model, "ttt", mode="ttt", steps=3), "--run-dir",
                            run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertIn("best of adaptation: step", p.stdout)
        steps, samples = steps_of(run_dir)
        self.assertEqual(len(steps), 3)
        for s in steps:
            self.assertEqual(s["samples"], len(TASKS) * GROUP)  # every task, every step
        best = max(range(3), key=lambda i: (steps[i]["fast_1"], -i))
        with open(os.path.join(run_dir, "compute.json")) as f:
            compute = json.load(f)
        self.assertEqual(compute["rollouts"], 3 * len(TASKS) * GROUP)
        self.assertGreater(compute["learner_seconds"], 0)
        self.assertEqual(compute["settings"]["mode"], "ttt")
        db = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
        summary = json.loads(db.execute("SELECT summary_json FROM runs").fetchone()[0])
        db.close()
        self.assertEqual(summary["boa"]["step"], best)
        self.assertTrue(os.path.exists(os.path.join(summary["boa"]["checkpoint"], "adapter_model.safetensors")))
        # The report draws the training curve and each task's trajectory from the stored samples.
        _, page, text = report_marks(run_dir)
        self.assertIn("Per-task trajectories", page.h2)
        self.assertIn("best of adaptation", text)
        curve = [(float(m["data-x"]), float(m["data-y"])) for m in page.marks if m["data-chart"] == "training curves" and m["data-series"] == "fast_1"]
        self.assertEqual(curve, [(float(s["step"]), s["fast_1"]) for s in steps])
        db = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
        rows = db.execute("SELECT task_id, step, status, speedup FROM samples").fetchall()
        db.close()
        for task in TASKS:
            drawn = [(float(m["data-x"]), float(m["data-y"])) for m in page.marks
                     if m["data-chart"] == "trajectories" and m["data-series"] == task]
            want = []
            for step in range(3):
                mine = [r for r in rows if r[0] == task and r[1] == step]
                want.append((float(step), sum(r[2] == "ok" and r[3] > 1.0 for r in mine) / len(mine)))
            self.assertEqual(len(drawn), 3, task)
            for d, w in zip(drawn, want):
                self.assertAlmostEqual(d[1], w[1], places=12)
                self.assertEqual(d[0], w[0])

    def sdpo_run(self, name, context, steps):
        run_dir = os.path.join(self.tmp, name)
        extra = '[sdpo]\ncontext = "%s"\nbeta = 0.5\n' % context
        p = subprocess.run([LAUNCH, config(self.tmp, self.url, self.model, name, mode="sdpo", steps=steps, extra=extra),
                            "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        with open(os.path.join(run_dir, "teacher.jsonl")) as f:
            log = [json.loads(line) for line in f]
        export = {}
        for line in subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            x = json.loads(line)
            export[x["sample_id"]] = x
        return run_dir, log, export

    def expected_demo(self, export, sample_id):
        # The fastest correct sample of the same group other than this one (the earliest on a tie).
        me = export[sample_id]
        group = sorted((x for x in export.values() if x["group_id"] == me["group_id"]), key=lambda x: x["sample_index"])
        best = None
        for x in group:
            if x["sample_id"] != sample_id and x["status"] == "ok" and (best is None or x["speedup"] > best["speedup"]):
                best = x
        return best

    def test_sdpo_teacher_sees_feedback_and_a_demonstration_and_its_logprobs_equal_peft(self):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
        run_dir, log, export = self.sdpo_run("sdpo", "feedback", 2)
        self.assertEqual(len(log), 2 * len(TASKS) * GROUP)  # every sample of every step
        self.assertEqual(sorted(x["sample_id"] for x in log), sorted(export))
        tok = AutoTokenizer.from_pretrained(self.model)
        models = {}
        demos = sum(self.expected_demo(export, x["sample_id"]) is not None for x in log)
        self.assertTrue(0 < demos < len(log), "the run must have samples with and without a demonstration")
        for x in log:
            s = export[x["sample_id"]]
            tp = x["teacher_prompt"]
            # The student's prompt is a prefix of the teacher's, and the feedback is this sample's own.
            self.assertTrue(tp.startswith(s["prompt"].rstrip("\n")), x["sample_id"])
            self.assertIn("Execution feedback on your previous attempt", tp)
            self.assertIn("- status: %s\n" % s["status"], tp)
            demo = self.expected_demo(export, x["sample_id"])
            if demo is None:
                self.assertNotIn("A correct answer to this task", tp)
            else:
                self.assertIn("<answer>\n%s\n</answer>" % demo["completion"].strip(), tp)
            self.assertAlmostEqual(x["student_logprob_sum"], float(np.sum(s["logprobs"])), delta=1e-3)
            ids = tok(tp, add_special_tokens=False)["input_ids"]
            self.assertEqual(x["teacher_tokens"], len(ids) + len(s["token_ids"]))
            # The teacher is the policy that sampled (on-policy): its logprobs of the sample's tokens
            # after the teacher's prompt, by transformers + PEFT.
            v = x["policy_version"]
            if v not in models:
                base = AutoModelForCausalLM.from_pretrained(self.model, dtype=torch.float32)
                models[v] = PeftModel.from_pretrained(base, os.path.join(run_dir, "checkpoints", "step-%d" % v)).eval()
            with torch.no_grad():
                lp = torch.log_softmax(models[v](input_ids=torch.tensor([ids + s["token_ids"]])).logits[0, :-1], -1)
            ref = lp[len(ids) - 1:].gather(-1, torch.tensor(s["token_ids"])[:, None]).sum().item()
            self.assertAlmostEqual(x["teacher_logprob_sum"], ref, delta=1e-3, msg=x["sample_id"])
            self.assertAlmostEqual(x["advantage_mean"], 0.5 * (ref - x["student_logprob_sum"]) / len(s["token_ids"]),
                                   delta=1e-4)
        steps, _ = steps_of(run_dir)
        self.assertEqual(len(steps), 2)
        for st in steps:
            self.assertAlmostEqual(st["learner"]["ratio_mean"], 1.0, delta=1e-4)
            self.assertEqual(st["learner"]["teacher_samples"], len(TASKS) * GROUP)
        with open(os.path.join(run_dir, "compute.json")) as f:
            compute = json.load(f)
        self.assertEqual(compute["teacher_tokens"], sum(x["teacher_tokens"] for x in log))
        self.assertEqual(compute["settings"]["sdpo_context"], "feedback")
        # The teacher's extra context moved the adapter: SDPO learned something.
        a0, a2 = adapter(run_dir, 0), adapter(run_dir, 2)
        self.assertGreater(max((a2[k] - a0[k]).abs().max().item() for k in a0), 1e-4)

    def test_sdpo_prompt_variant_shows_only_a_demonstration(self):
        run_dir, log, export = self.sdpo_run("sdpo-prompt", "prompt", 1)
        self.assertEqual(len(log), len(TASKS) * GROUP)
        self.assertTrue(0 < sum(x["teacher_tokens"] > 0 for x in log) < len(log), "both kinds of sample expected")
        for x in log:
            demo = self.expected_demo(export, x["sample_id"])
            if demo is None:  # nothing the student did not see: no teacher, no signal
                self.assertEqual(x["teacher_prompt"], "")
                self.assertEqual(x["teacher_tokens"], 0)
            else:
                self.assertIn("<answer>\n%s\n</answer>" % demo["completion"].strip(), x["teacher_prompt"])
                self.assertNotIn("Execution feedback", x["teacher_prompt"])
                self.assertGreater(x["teacher_tokens"], 0)
        with open(os.path.join(run_dir, "compute.json")) as f:
            self.assertEqual(json.load(f)["teacher_tokens"], sum(x["teacher_tokens"] for x in log))

    def test_a_run_killed_between_steps_resumes_to_the_same_adapter(self):
        run_dir = os.path.join(self.tmp, "killed")
        # A server that holds version 2's completions: the run is surely killed inside step 2.
        slow, slow_port = start_openai_server(self.log + ".slow", "--policy", self.model, "--delay", "kernelrl-v2:120")
        self.addCleanup(slow.stdout.close)
        self.addCleanup(slow.wait)
        self.addCleanup(slow.kill)
        slow_url = "http://127.0.0.1:%s" % slow_port
        cfg = config(self.tmp, slow_url, self.model, "killed")
        p = subprocess.Popen([LAUNCH, cfg, "--run-dir", run_dir], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        marker = os.path.join(run_dir, "checkpoints", "step-2", "learner.json")
        deadline = time.time() + 600
        while not os.path.exists(marker) and p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        if p.poll() is not None:
            self.fail("the run ended before its step-2 checkpoint: %s" % p.stderr.read()[-3000:])
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        p.stderr.close()
        steps, _ = steps_of(run_dir)
        with open(os.path.join(run_dir, "launch.log")) as f:
            self.assertEqual(len(steps), 2, f.read()[-5000:])
        cfg = config(self.tmp, self.url, self.model, "killed")  # the same run, served without the delay
        r = subprocess.run([LAUNCH, cfg, "--resume", run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        self.assertIn("resuming from", r.stderr)
        steps, samples = steps_of(run_dir)
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        for s in steps:
            self.assertEqual(s["samples"], BATCH * GROUP, s)  # no step counts a sample twice
        self.assertEqual(len({sid for _, _, sid in samples}), len(samples))
        # Same data, same updates: the adapter equals the uninterrupted run's (optimizer state restored).
        a, b = adapter(run_dir, STEPS), adapter(self.full_dir, STEPS)
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
        # Resuming a finished run does nothing and says so, at any log level (issue 57: it printed a
        # progress line and "wall time: 0.0 s", the message an info line the main job's level hid).
        r = subprocess.run([LAUNCH, cfg, "--resume", run_dir, "--log-level", "warn"], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn("all %d steps are done" % STEPS, r.stdout)
        self.assertIn("nothing to resume", r.stdout)
        self.assertNotIn("wall time", r.stdout)
        self.assertNotIn("samples/s", r.stdout + r.stderr)

    def test_a_data_parallel_learner_ends_with_the_one_rank_adapter(self):
        # [learner] devices: two ranks on the CPU (c10d gloo), the same run otherwise: the same
        # samples and rewards reach the learner, so each step's adapter is the one-rank run's.
        run_dir = os.path.join(self.tmp, "dp")
        cfg = config(self.tmp, self.url, self.model, "dp", learner='devices = ["cpu", "cpu"]')
        r = subprocess.run([LAUNCH, cfg, "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        self.assertIn("data-parallel over 2 ranks (cpu, cpu), gradients summed by c10d gloo", r.stderr)
        steps, samples = steps_of(run_dir)
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        self.assertEqual(len({sid for _, _, sid in samples}), len(samples))
        full, _ = steps_of(self.full_dir)
        self.assertEqual(len(samples), STEPS * BATCH * GROUP)
        for s, f in zip(steps, full):
            mine, one = s["learner"], f["learner"]
            self.assertAlmostEqual(mine["loss"], one["loss"], delta=1e-5 * max(1.0, abs(one["loss"])), msg=s)
            self.assertEqual(mine["tokens"], one["tokens"], s)
        for step in range(1, STEPS + 1):
            a, b = adapter(run_dir, step), adapter(self.full_dir, step)
            self.assertEqual(sorted(a), sorted(b))
            for k in a:
                torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=(step, k))

    def test_a_checkpoint_that_fails_to_write_stops_the_run_and_resume_continues_from_the_last_whole_one(self):
        files = ["learner.json", "adapter_model.safetensors", "optimizer.safetensors", "adapter_config.json",
                 "manifest.json"]
        for name in files:
            with self.subTest(file=name):
                run_dir = os.path.join(self.tmp, "enospc-" + name.split(".")[0])
                cfg = config(self.tmp, self.url, self.model, "enospc", steps=2)
                # The second checkpoint (step-1) finds the disk full while it writes this file.
                env = {**os.environ, "KERNELRL_INJECT_ENOSPC": "step-1.partial/" + name}
                p = subprocess.run([LAUNCH, cfg, "--run-dir", run_dir], capture_output=True, text=True, timeout=900,
                                   env=env)
                self.assertEqual(p.returncode, 1, p.stderr[-3000:])
                self.assertIn("cannot write checkpoint", p.stderr)
                self.assertIn("No space left on device", p.stderr)
                ck = os.path.join(run_dir, "checkpoints")
                self.assertEqual(sorted(n for n in os.listdir(ck) if n.startswith("step-")), ["step-0"])
                r = subprocess.run([LAUNCH, cfg, "--resume", run_dir], capture_output=True, text=True, timeout=900)
                self.assertEqual(r.returncode, 0, r.stderr[-4000:])
                self.assertIn("resuming from %s" % os.path.join(ck, "step-0"), r.stderr)
                steps, samples = steps_of(run_dir)
                self.assertEqual([s["step"] for s in steps], [0, 1])
                for s in steps:
                    self.assertEqual(s["samples"], BATCH * GROUP, s)
                self.assertEqual(len({sid for _, _, sid in samples}), len(samples))
                with open(os.path.join(run_dir, "compute.json")) as f:
                    self.assertEqual(json.load(f)["rollouts"], len(samples))
                for step in (1, 2):
                    with open(os.path.join(ck, "step-%d" % step, "manifest.json")) as f:
                        listed = json.load(f)["files"]
                    self.assertEqual(sorted(listed), sorted(files[:-1]))

    def test_resume_falls_back_past_a_damaged_checkpoint_and_refuses_a_changed_experiment(self):
        run_dir = os.path.join(self.tmp, "damaged")
        cfg = config(self.tmp, self.url, self.model, "damaged", steps=2)
        p = subprocess.run([LAUNCH, cfg, "--run-dir", run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        # A different experiment is refused, naming what differs; more steps are not.
        changed = config(self.tmp, self.url, self.model, "damaged", steps=3).replace("damaged.toml", "changed.toml")
        with open(config(self.tmp, self.url, self.model, "damaged", steps=3)) as f:
            text = f.read()
        with open(changed, "w") as f:
            f.write(text.replace("group_size = %d" % GROUP, "group_size = 2").replace("learning_rate = 0.05",
                                                                                     "learning_rate = 0.01"))
        r = subprocess.run([LAUNCH, changed, "--resume", run_dir], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 2, r.stderr[-3000:])
        self.assertIn("learner.group_size (%d in the run, 2 here)" % GROUP, r.stderr)
        self.assertIn("learner.learning_rate", r.stderr)
        # The newest checkpoint damaged (a file cut short): resume goes back to the one before it.
        with open(os.path.join(run_dir, "checkpoints", "step-2", "adapter_model.safetensors"), "r+b") as f:
            f.seek(100)
            f.write(b"\0" * 16)
        more = config(self.tmp, self.url, self.model, "damaged", steps=3)
        r = subprocess.run([LAUNCH, more, "--resume", run_dir], capture_output=True, text=True, timeout=900)
        self.assertEqual(r.returncode, 0, r.stderr[-4000:])
        self.assertIn("step-2 is not whole (adapter_model.safetensors: its contents changed", r.stderr)
        self.assertIn("resuming from %s" % os.path.join(run_dir, "checkpoints", "step-1"), r.stderr)
        steps, samples = steps_of(run_dir)
        self.assertEqual([s["step"] for s in steps], [0, 1, 2])
        self.assertEqual(len({sid for _, _, sid in samples}), len(samples))


if __name__ == "__main__":
    unittest.main()
