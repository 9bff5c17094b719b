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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    if estimator == "rloo":
        loo = (r.sum() - r) / (len(r) - 1)
        return (r - loo).tolist(), False
    a = r - r.mean()
    if estimator == "grpo":
        a = a / (r.std(unbiased=True) + eps)
    return a.tolist(), False


def ref_loss(logp, old, adv, mask, ref=None, clip_low=0.2, clip_high=0.2, agg="token_mean", kl_coef=0.0):
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    ratio = (logp - old).exp()
    loss_tok = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))
    if ref is not None and kl_coef:
        loss_tok = loss_tok + kl_coef * ((ref - logp).exp() - (ref - logp) - 1)
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
        for est in ["grpo", "dr_grpo", "rloo"]:
            for g in groups:
                out = json.loads(run([PROBE, "advantages", "--estimator", est, "--rewards", ",".join(map(str, g))]))
                want, skipped = ref_advantages(g, est)
                self.assertEqual(out["skipped"], skipped, (est, g))
                for a, b in zip(out["advantages"], want):
                    self.assertAlmostEqual(a, b, delta=1e-10, msg=(est, g))

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
        for agg in ["token_mean", "seq_mean"]:
            run([PROBE, "lora-grad", "--model", d, "--adapter", adapter, "--in", f, "--out", out, "--agg", agg,
                 "--clip-high", "0.28"])
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
                self.assertLess(diff, 1e-5, "%s (%s): max |difference| %.3g" % (key, agg, diff))
                n += 1
            self.assertEqual(n, 2 * 2 * 5)
            self.assertGreater(max(g.abs().max().item() for k, g in got.items() if k != "loss"), 1e-4)


if __name__ == "__main__":
    unittest.main()
