"""GRPO math against an independent PyTorch implementation written here from the formulas (not from
kernelrl's code): group advantages (GRPO, Dr. GRPO, RLOO, zero-variance groups), the clipped
policy-gradient loss with separate low/high clips, token-mean and sequence-mean aggregation, the k3
KL to a reference, per-token advantages (SDPO), and LoRA gradients through the model, compared
with PEFT's. Tolerance 1e-5 (1e-10 where both sides compute in float64)."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = os.environ.get("KERNELRL_POLICY_PROBE", os.path.join(ROOT, "build", "tests", "policy_probe"))


def run(args):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError("%s failed:\n%s" % (" ".join(args), p.stderr))
    return p.stdout


def ref_advantages(rewards, estimator, eps=1e-4):
    r = torch.tensor(rewards, dtype=torch.float64)
    if bool((r == r[0]).all()):
        return [0.0] * len(rewards), True
    if estimator in ("rloo", "trloo"):
        loo = (r.sum() - r) / (len(r) - 1)
        return (r - loo).tolist(), False
    a = r - r.mean()
    if estimator == "grpo":
        a = a / (r.std(unbiased=True) + eps)
    return a.tolist(), False


def ref_loss(logp, old, adv, mask, ref=None, clip_low=0.2, clip_high=0.2, agg="token_mean", kl_coef=0.0,
             entropy=None, entropy_coef=0.0):
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    ratio = (logp - old).exp()
    loss_tok = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))
    if ref is not None and kl_coef:
        loss_tok = loss_tok + kl_coef * ((ref - logp).exp() - (ref - logp) - 1)
    if entropy is not None and entropy_coef:
        loss_tok = loss_tok - entropy_coef * entropy
    if agg == "token_mean":
        return (loss_tok * mask).sum() / mask.sum()
    return ((loss_tok * mask).sum(1) / mask.sum(1)).mean()


class GrpoMathTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-grpo-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_group_advantages(self):
        groups = [[1.0, 0.0, 0.0, 0.5], [2.5, 2.5, 0.0, 7.0, 1.0, 0.25, 3.0, 3.0], [0.0, 1.0], [0.3, 0.3, 0.3]]
        for est in ["grpo", "dr_grpo", "rloo", "trloo"]:
            for g in groups:
                out = json.loads(run([PROBE, "advantages", "--estimator", est, "--rewards", ",".join(map(str, g))]))
                want, skipped = ref_advantages(g, est)
                self.assertEqual(out["skipped"], skipped, (est, g))
                for a, b in zip(out["advantages"], want):
                    self.assertAlmostEqual(a, b, delta=1e-10, msg=(est, g))

    def test_trloo_over_episodes(self):
        # Multi-turn: returns G[:, t] = r[:, t] + gamma G[:, t + 1], then per turn the leave-one-out baseline over the
        # group's episodes, written as Dr. Kernel's code writes it: (G - mean) * N / (N - 1).
        episodes = [[[0.0, 1.0, 1.0], [1.0, 0.0, 0.5], [0.0, 0.0, 0.0], [0.25, 1.0, 2.0]], [[1.0, 2.0], [1.0, 0.0]],
                    [[3.0], [1.0], [2.0]]]
        for r in episodes:
            for gamma in [1.0, 0.8]:
                rt = torch.tensor(r, dtype=torch.float64)
                g = torch.zeros_like(rt)
                for t in reversed(range(rt.shape[1])):
                    g[:, t] = rt[:, t] + (gamma * g[:, t + 1] if t + 1 < rt.shape[1] else 0)
                n = rt.shape[0]
                want = (g - g.mean(0, keepdim=True)) * n / (n - 1)
                out = json.loads(run([PROBE, "episodes", "--estimator", "trloo", "--gamma", str(gamma), "--rewards",
                                      ";".join(",".join(map(str, e)) for e in r)]))
                got = torch.tensor(out["advantages"], dtype=torch.float64)
                for t in range(rt.shape[1]):
                    flat = bool((g[:, t] == g[0, t]).all())
                    self.assertEqual(out["skipped"][t], flat)
                    if not flat:
                        self.assertTrue(torch.allclose(got[:, t], want[:, t], atol=1e-12), (r, gamma, t, got, want))

    def test_loss_and_its_gradient(self):
        torch.manual_seed(0)
        B, T = 4, 7
        for case in range(8):
            logp = -torch.rand(B, T, dtype=torch.float64) * 3
            old = logp + torch.randn(B, T, dtype=torch.float64) * 0.3  # ratios well outside the clip range too
            ref = logp + torch.randn(B, T, dtype=torch.float64) * 0.2
            mask = (torch.rand(B, T) > 0.3).double()
            mask[:, 0] = 1
            adv = torch.randn(B, T, dtype=torch.float64) if case % 2 else torch.randn(B, dtype=torch.float64)
            opts = {"clip_low": 0.2, "clip_high": 0.28 if case % 4 >= 2 else 0.2,
                    "agg": "seq_mean" if case >= 4 else "token_mean", "kl_coef": 0.1 if case in (3, 5, 6) else 0.0}
            f, out = os.path.join(self.tmp, "in.safetensors"), os.path.join(self.tmp, "out.safetensors")
            save_file({"logp": logp, "old_logp": old, "adv": adv, "mask": mask, "ref_logp": ref}, f)
            run([PROBE, "loss", "--in", f, "--out", out, "--clip-low", str(opts["clip_low"]),
                 "--clip-high", str(opts["clip_high"]), "--agg", opts["agg"], "--kl-coef", str(opts["kl_coef"])])
            got = load_file(out)
            x = logp.clone().requires_grad_(True)
            want = ref_loss(x, old, adv, mask, ref, **opts)
            want.backward()
            self.assertAlmostEqual(got["loss"].item(), want.item(), delta=1e-10, msg=opts)
            self.assertLess((got["grad"] - x.grad).abs().max().item(), 1e-10, opts)
            ratio = (logp - old).exp()
            exp_adv = adv if adv.dim() == 2 else adv[:, None].expand_as(logp)
            clipped = -exp_adv * ratio.clamp(1 - opts["clip_low"], 1 + opts["clip_high"]) > -exp_adv * ratio
            self.assertAlmostEqual(got["clip_fraction"].item(), ((clipped.double() * mask).sum() / mask.sum()).item(),
                                   delta=1e-12)
            k3 = (ref - logp).exp() - (ref - logp) - 1
            self.assertAlmostEqual(got["kl"].item(), ((k3 * mask).sum() / mask.sum()).item(), delta=1e-10)
            self.assertGreater(clipped.sum().item(), 0, "the case must exercise clipping")

    def test_lora_gradients_equal_peft(self):
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(3)
        d = os.path.join(self.tmp, "model")
        base = Qwen2ForCausalLM(Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2))
        base.save_pretrained(d)
        pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                             target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]))
        pm.train()
        adapter = os.path.join(self.tmp, "adapter")
        pm.save_pretrained(adapter)
        B, L = 3, 9
        ids = torch.randint(0, 97, (B, L))
        mask = torch.zeros(B, L, dtype=torch.float64)
        mask[0, 4:] = 1
        mask[1, 3:7] = 1  # a shorter completion, then padding
        mask[2, 5:] = 1
        with torch.no_grad():
            lg = pm(ids).logits.double()
        cur = torch.log_softmax(lg[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        old = torch.zeros(B, L, dtype=torch.float64)
        old[:, 1:] = cur + torch.randn(B, L - 1, dtype=torch.float64) * 0.2
        adv = torch.tensor([1.0, -0.5, 0.7], dtype=torch.float64)
        f, out = os.path.join(self.tmp, "batch.safetensors"), os.path.join(self.tmp, "grads.safetensors")
        save_file({"ids": ids, "mask": mask, "old_logp": old, "adv": adv}, f)
        # Plain; with activation checkpointing (each layer recomputed in the backward pass); with the
        # vocabulary's log-softmax taken 5 positions at a time (24 positions: 5 chunks, the last short).
        variants = [("token_mean", [], {}), ("seq_mean", [], {}), ("token_mean", ["--checkpoint", "1"], {}),
                    ("seq_mean", ["--checkpoint", "1"], {"KERNELRL_LOGPROB_CHUNK": "5"})]
        for agg, extra, env in variants:
            p = subprocess.run([PROBE, "lora-grad", "--model", d, "--adapter", adapter, "--in", f, "--out", out,
                                "--agg", agg, "--clip-high", "0.28"] + extra, capture_output=True, text=True,
                               timeout=300, env=dict(os.environ, **env))
            self.assertEqual(p.returncode, 0, p.stderr)
            got = load_file(out)
            pm.zero_grad()
            logits = pm(ids).logits.double()
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = ref_loss(lp, old[:, 1:], adv, mask[:, 1:], clip_high=0.28, agg=agg)
            loss.backward()
            self.assertAlmostEqual(got["loss"].item(), loss.item(), delta=1e-5)
            n = 0
            for name, p in pm.named_parameters():
                if "lora_" not in name:
                    continue
                key = name.replace(".default", "")
                self.assertIn(key, got)
                diff = (got[key] - p.grad.double()).abs().max().item()
                self.assertLess(diff, 1e-5, "%s (%s %s %s): max |difference| %.3g" % (key, agg, extra, env, diff))
                n += 1
            self.assertEqual(n, 2 * 2 * 5)
            self.assertGreater(max(g.abs().max().item() for k, g in got.items() if k != "loss"), 1e-4)


class TrainerTest(unittest.TestCase):
    """LoraTrainer: one AdamW step equals PEFT + torch.optim.AdamW + clip_grad_norm_ on the same batch;
    streaming minibatches give the same update as the whole batch; a controlled reward raises the
    favoured completion's probability."""

    @classmethod
    def setUpClass(cls):
        from peft import LoraConfig, get_peft_model

        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-trainer-")
        torch.manual_seed(5)
        cls.model = os.path.join(cls.tmp, "model")
        Qwen2ForCausalLM(Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     initializer_range=0.2)).save_pretrained(cls.model)
        base = Qwen2ForCausalLM.from_pretrained(cls.model, dtype=torch.float32)
        cls.adapter = os.path.join(cls.tmp, "adapter")
        get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                        target_modules=["q_proj", "v_proj", "up_proj"])).save_pretrained(cls.adapter)
        B, L = 6, 10
        cls.ids = torch.randint(0, 61, (B, L))
        cls.mask = torch.zeros(B, L, dtype=torch.float64)
        for b in range(B):
            cls.mask[b, 4: 6 + b % 4] = 1
        cls.old = torch.zeros(B, L, dtype=torch.float64)
        cls.old[:, 1:] = -4.0 + torch.randn(B, L - 1, dtype=torch.float64) * 0.1
        cls.adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, 0.0], dtype=torch.float64)
        cls.batch = os.path.join(cls.tmp, "batch.safetensors")
        save_file({"ids": cls.ids, "mask": cls.mask, "old_logp": cls.old, "adv": cls.adv}, cls.batch)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def train(self, *extra, batch=None, chunk=None):
        out = tempfile.mkdtemp(prefix="out-", dir=self.tmp)
        env = dict(os.environ, KERNELRL_LOGPROB_CHUNK=str(chunk)) if chunk else None
        p = subprocess.run([PROBE, "train-step", "--model", self.model, "--adapter", self.adapter, "--in",
                            batch or self.batch, "--out", out] + list(extra), capture_output=True, text=True,
                           timeout=300, env=env)
        if p.returncode != 0:
            raise AssertionError("train-step failed:\n%s" % p.stderr)
        with open(os.path.join(out, "report.json")) as f:
            return load_file(os.path.join(out, "adapter_model.safetensors")), json.load(f), out

    def test_one_step_equals_peft_and_adamw(self):
        from peft import PeftModel

        for agg, max_norm in [("token_mean", 1.0), ("seq_mean", 0.05)]:
            got, report, _ = self.train("--lr", "0.01", "--max-grad-norm", str(max_norm), "--agg", agg)
            base = Qwen2ForCausalLM.from_pretrained(self.model, dtype=torch.float32)
            pm = PeftModel.from_pretrained(base, self.adapter, is_trainable=True)
            pm.train()
            params = [p for n, p in pm.named_parameters() if "lora_" in n]
            opt = torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
            logits = pm(self.ids).logits.double()
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, self.ids[:, 1:, None])[..., 0]
            loss = ref_loss(lp, self.old[:, 1:], self.adv, self.mask[:, 1:], agg=agg)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            opt.step()
            self.assertAlmostEqual(report[0]["loss"], loss.item(), delta=1e-5)
            self.assertAlmostEqual(report[0]["grad_norm"], norm.item(), delta=1e-5 * max(1, norm.item()))
            if agg == "seq_mean":
                self.assertGreater(norm.item(), max_norm, "this case must clip")
            for n, p in pm.named_parameters():
                if "lora_" in n:
                    diff = (got[n.replace(".default", "")].double() - p.detach().double()).abs().max().item()
                    self.assertLess(diff, 1e-5, "%s (%s)" % (n, agg))

    def peft_model(self):
        from peft import PeftModel
        base = Qwen2ForCausalLM.from_pretrained(self.model, dtype=torch.float32)
        pm = PeftModel.from_pretrained(base, self.adapter, is_trainable=True)
        pm.train()
        return pm, [p for n, p in pm.named_parameters() if "lora_" in n]

    def assert_same_adapter(self, got, pm, tol, what):
        for n, p in pm.named_parameters():
            if "lora_" in n:
                diff = (got[n.replace(".default", "")].double() - p.detach().double()).abs().max().item()
                self.assertLess(diff, tol, "%s (%s)" % (n, what))

    def test_loss_options_in_a_step_equal_peft(self):
        # Temperature, KL to the base policy (PEFT's adapter switched off), weight decay and
        # per-token advantages (SDPO), each in one AdamW step against PEFT + torch.
        per_token = os.path.join(self.tmp, "per-token.safetensors")
        tok_adv = torch.randn(self.ids.shape, dtype=torch.float64)
        save_file({"ids": self.ids, "mask": self.mask, "old_logp": self.old, "adv": tok_adv}, per_token)
        cases = [("temperature", ["--temperature", "0.7"], dict(T=0.7)),
                 ("kl", ["--kl-coef", "0.1"], dict(kl=0.1)),
                 ("weight decay", ["--weight-decay", "0.05"], dict(wd=0.05)),
                 ("per-token advantages", [], dict(adv=tok_adv)),
                 ("entropy bonus", ["--entropy-coef", "0.05"], dict(ent=0.05)),
                 ("entropy bonus, seq_mean, T", ["--entropy-coef", "0.1", "--agg", "seq_mean", "--temperature", "0.8"],
                  dict(ent=0.1, agg="seq_mean", T=0.8)),
                 ("entropy bonus, T, checkpointed, chunked", ["--entropy-coef", "0.1", "--temperature", "0.8",
                                                              "--checkpoint", "1"], dict(ent=0.1, T=0.8, chunk=4)),
                 ("everything, seq_mean", ["--temperature", "1.3", "--kl-coef", "0.2", "--weight-decay", "0.01",
                                           "--agg", "seq_mean", "--clip-low", "0.1", "--clip-high", "0.3"],
                  dict(T=1.3, kl=0.2, wd=0.01, agg="seq_mean", lo=0.1, hi=0.3))]
        for what, args, c in cases:
            batch = per_token if "adv" in c else None
            got, report, _ = self.train("--lr", "0.01", *args, batch=batch, chunk=c.get("chunk"))
            pm, params = self.peft_model()
            opt = torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=c.get("wd", 0.0))
            T = c.get("T", 1.0)
            logits = pm(self.ids).logits.double()[:, :-1] / T
            lsm = torch.log_softmax(logits, -1)
            lp = lsm.gather(-1, self.ids[:, 1:, None])[..., 0]
            ref = None
            if c.get("kl"):
                with torch.no_grad(), pm.disable_adapter():
                    ref = torch.log_softmax(pm(self.ids).logits.double()[:, :-1] / T, -1).gather(
                        -1, self.ids[:, 1:, None])[..., 0]
            adv = c["adv"][:, 1:] if "adv" in c else self.adv
            m = self.mask[:, 1:]
            entropy = -(lsm.exp() * lsm).sum(-1)  # differentiable: the bonus's gradient goes through it
            loss = ref_loss(lp, self.old[:, 1:], adv, m, ref=ref, clip_low=c.get("lo", 0.2),
                            clip_high=c.get("hi", 0.2), agg=c.get("agg", "token_mean"), kl_coef=c.get("kl", 0.0),
                            entropy=entropy, entropy_coef=c.get("ent", 0.0))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            self.assertAlmostEqual(report[0]["loss"], loss.item(), delta=1e-5, msg=what)
            self.assertAlmostEqual(report[0]["grad_norm"], norm.item(), delta=1e-5 * max(1, norm.item()), msg=what)
            entropy = entropy.detach()
            self.assertAlmostEqual(report[0]["entropy"], ((entropy * m).sum() / m.sum()).item(), delta=1e-5, msg=what)
            if ref is not None:
                k3 = ((ref - lp).exp() - (ref - lp) - 1)
                self.assertAlmostEqual(report[0]["kl"], ((k3 * m).sum() / m.sum()).item(), delta=1e-6, msg=what)
                self.assertGreater(report[0]["kl"], 1e-4, "the adapter must move the policy off the base: " + what)
            self.assert_same_adapter(got, pm, 1e-5, what)

    def test_learning_rate_schedules_equal_transformers(self):
        from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                                  get_linear_schedule_with_warmup)
        makers = {"constant": lambda o: get_constant_schedule_with_warmup(o, 2),
                  "linear": lambda o: get_linear_schedule_with_warmup(o, 2, 6),
                  "cosine": lambda o: get_cosine_schedule_with_warmup(o, 2, 6)}
        for name, make in makers.items():
            got, report, _ = self.train("--lr", "0.01", "--steps", "5", "--schedule", name, "--warmup", "2",
                                        "--total", "6")
            pm, params = self.peft_model()
            opt = torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
            sched = make(opt)
            lrs = []
            for _ in range(5):
                lrs.append(sched.get_last_lr()[0])
                logits = pm(self.ids).logits.double()
                lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, self.ids[:, 1:, None])[..., 0]
                ref_loss(lp, self.old[:, 1:], self.adv, self.mask[:, 1:]).backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
            for a, b in zip([r["lr"] for r in report], lrs):
                self.assertAlmostEqual(a, b, delta=1e-12, msg=name)
            self.assert_same_adapter(got, pm, 1e-5, name)

    def test_sft_step_equals_peft_cross_entropy(self):
        got, report, _ = self.train("--lr", "0.01", "--sft", "1", "--split", "3")
        pm, params = self.peft_model()
        opt = torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        labels = self.ids.clone()
        labels[self.mask == 0] = -100  # transformers' ignore index: only completion tokens count
        out = pm(self.ids, labels=labels)
        out.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        self.assertAlmostEqual(report[0]["loss"], out.loss.item(), delta=1e-5)
        self.assertAlmostEqual(report[0]["grad_norm"], norm.item(), delta=1e-5 * max(1, norm.item()))
        self.assert_same_adapter(got, pm, 1e-5, "sft")

    def test_optimizer_state_survives_a_save_and_load(self):
        straight, _, _ = self.train("--lr", "0.01", "--steps", "3")
        resumed, _, _ = self.train("--lr", "0.01", "--steps", "3", "--resume-after", "2")
        for k in straight:
            self.assertLess((straight[k] - resumed[k]).abs().max().item(), 1e-7, k)
        # Without the moments the third step differs: the check above can fail.
        dropped, _, _ = self.train("--lr", "0.01", "--steps", "3", "--resume-after", "2", "--drop-state", "1")
        self.assertTrue(any((straight[k] - dropped[k]).abs().max().item() > 1e-5 for k in straight))

    def test_streaming_minibatches_equal_the_whole_batch(self):
        for agg in ["token_mean", "seq_mean"]:
            whole, r1, _ = self.train("--lr", "0.01", "--agg", agg, "--steps", "2")
            parts, r3, _ = self.train("--lr", "0.01", "--agg", agg, "--steps", "2", "--split", "4")
            for k in whole:
                self.assertLess((whole[k] - parts[k]).abs().max().item(), 1e-6, (k, agg))
            self.assertAlmostEqual(r1[1]["loss"], r3[1]["loss"], delta=1e-6)

    def test_data_parallel_ranks_take_the_one_trainer_step(self):
        # Two learner ranks as real processes meeting in c10d's ProcessGroupGloo (a FileStore on
        # loopback), each learning every other of four minibatches: both end with the adapter one
        # trainer gets from all four, to 1e-5, and report its loss, gradient norm and token count.
        for agg in ["token_mean", "seq_mean"]:
            whole, rep, _ = self.train("--lr", "0.01", "--agg", agg, "--steps", "2", "--split", "4")
            store = os.path.join(tempfile.mkdtemp(prefix="dp-", dir=self.tmp), "store")
            outs, procs = [], []
            for rank in range(2):
                outs.append(tempfile.mkdtemp(prefix="rank%d-" % rank, dir=self.tmp))
                procs.append(subprocess.Popen(
                    [PROBE, "train-step", "--model", self.model, "--adapter", self.adapter, "--in", self.batch,
                     "--out", outs[-1], "--lr", "0.01", "--agg", agg, "--steps", "2", "--split", "4",
                     "--dp-size", "2", "--dp-rank", str(rank), "--dp-store", "file:" + store],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            try:
                for p in procs:
                    _, err = p.communicate(timeout=300)
                    self.assertEqual(p.returncode, 0, err)
            finally:  # a rank that failed must not leave the other waiting for it
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
            ranks = [load_file(os.path.join(o, "adapter_model.safetensors")) for o in outs]
            for k in whole:
                self.assertTrue(torch.equal(ranks[0][k], ranks[1][k]), (k, agg))
                self.assertLess((whole[k] - ranks[0][k]).abs().max().item(), 1e-5, (k, agg))
            # The check can fail: rank 0 stepping on its own half, without the collective, lands elsewhere.
            half, _, _ = self.train("--lr", "0.01", "--agg", agg, "--steps", "2", "--split", "4",
                                    "--dp-size", "2", "--dp-rank", "0")
            self.assertTrue(any((half[k] - whole[k]).abs().max().item() > 1e-4 for k in whole))
            for o in outs:
                with open(os.path.join(o, "report.json")) as f:
                    r = json.load(f)
                self.assertEqual(len(rep), len(r))
                for s1, s2 in zip(rep, r):
                    for key in ("loss", "grad_norm", "tokens"):
                        self.assertAlmostEqual(s1[key], s2[key], delta=1e-5 * max(1.0, abs(s1[key])), msg=(key, agg))

    def test_a_data_parallel_store_that_is_not_one_is_named(self):
        out = tempfile.mkdtemp(prefix="out-", dir=self.tmp)
        p = subprocess.run([PROBE, "train-step", "--model", self.model, "--adapter", self.adapter, "--in", self.batch,
                            "--out", out, "--dp-size", "2", "--dp-rank", "0", "--dp-store", "redis://x"],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('data-parallel store "redis://x": expected file:PATH or tcp://HOST:PORT', p.stderr)

    def test_a_controlled_reward_raises_the_favoured_completion(self):
        # Four completions of one prompt; the reward favours the first. GRPO advantages, on-policy
        # steps: the favoured completion's probability rises step after step.
        from peft import PeftModel

        prompt = [3, 14, 15, 9, 26]
        comps = [[5, 35, 8, 9], [7, 9, 32, 3], [8, 4, 6, 2], [6, 43, 38, 3]]
        ids = torch.tensor([prompt + c for c in comps])
        mask = torch.zeros(ids.shape, dtype=torch.float64)
        mask[:, len(prompt):] = 1
        rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        adv = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
        f = os.path.join(self.tmp, "learn.safetensors")
        save_file({"ids": ids, "mask": mask, "old_logp": torch.zeros(ids.shape, dtype=torch.float64), "adv": adv}, f)

        def favoured_logprob(adapter):
            base = Qwen2ForCausalLM.from_pretrained(self.model, dtype=torch.float32)
            pm = PeftModel.from_pretrained(base, adapter).eval()
            with torch.no_grad():
                lg = pm(ids[:1]).logits.double()
            lp = torch.log_softmax(lg[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            return lp[len(prompt) - 1:].sum().item()

        before = favoured_logprob(self.adapter)
        seen = [before]
        for steps in [1, 3, 6]:
            _, report, out = self.train("--lr", "0.02", "--steps", str(steps), "--on-policy", "1", batch=f)
            seen.append(favoured_logprob(out))
        self.assertEqual(seen, sorted(seen), "log P(favoured) should rise with every step count: %s" % seen)
        self.assertGreater(seen[-1] - before, 1.0, seen)


if __name__ == "__main__":
    unittest.main()
