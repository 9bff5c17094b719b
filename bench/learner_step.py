"""A LoRA GRPO step of the learner (learner/trainer.hpp, through bench/policy_bench --train) against
PyTorch + PEFT doing the same step on the same data in the same run: a Qwen2 model in bf16 (random
weights), a fresh rank-16 adapter on all seven projections (float32, as PEFT keeps it), the
clipped GRPO loss of the completion tokens (token mean), gradient-norm clipping and AdamW. Reports
tokens/s (batch x sequence length per optimizer step, forward + backward + step): the median over
--repeats timed steps after one warm-up step, each side run --rounds times alternately (ours, PEFT,
ours, PEFT, ...), so the spread between rounds shows what is noise. Target: >= 1.0x.

    python3 bench/learner_step.py --bench build/policy_bench [--device cuda:0] [--sizes tiny,small]
        [--shapes 16x512,64x256] [--minibatch 8] [--repeats 10] [--rounds 2] [--json out.json]
"""
import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from policy_throughput import make_model  # noqa: E402


def batch(path, vocab, b, l, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (b, l), generator=g)
    mask = torch.zeros(b, l)
    mask[:, l // 4:] = 1  # the first quarter is the prompt
    old = torch.full((b, l), -8.0) + 0.1 * torch.randn(b, l, generator=g)
    adv = torch.randn(b, generator=g)
    save_file({"ids": ids, "mask": mask, "old_logp": old, "adv": adv}, path)
    return ids, mask, old, adv


def peft_step(d, device, data, minibatch, repeats, lr=1e-5):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM
    base = Qwen2ForCausalLM.from_pretrained(d, dtype=torch.bfloat16).to(device)
    m = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    m.train()
    params = [p for n, p in m.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    ids, mask, old, adv = (t.to(device) for t in data)
    B, L = ids.shape
    runs = []
    for r in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = mask[:, 1:].sum()
        loss_sum = 0.0
        for b0 in range(0, B, minibatch):
            x = ids[b0:b0 + minibatch]
            logits = m(input_ids=x).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None])[..., 0]
            ratio = (lp - old[b0:b0 + minibatch, 1:]).exp()
            a = adv[b0:b0 + minibatch, None]
            tok = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2)) * mask[b0:b0 + minibatch, 1:]
            loss = tok.sum() / total
            loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        s = time.perf_counter() - t0
        if r:
            runs.append({"seconds": s, "loss": loss_sum, "tokens_per_s": B * L / s})
        else:
            warmup_loss = loss_sum
    del m, base, opt
    torch.cuda.empty_cache()
    return {"runs": runs, "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in runs),
            "warmup_loss": warmup_loss}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--shapes", default="16x512,64x256", help="BATCHxSEQLEN, comma separated")
    ap.add_argument("--minibatch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kernelrl-learner-bench-")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "peft": __import__("peft").__version__, "rows": []}
    for size in args.sizes.split(","):
        d = make_model("qwen2", size, os.path.join(tmp, "qwen2-" + size))
        vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        for shape in args.shapes.split(","):
            b, l = map(int, shape.split("x"))
            f = os.path.join(tmp, "batch-%s.safetensors" % shape)
            data = batch(f, vocab, b, l)
            ours_rounds, ref_rounds = [], []
            for _ in range(args.rounds):
                o = json.loads(subprocess.run(
                    [args.bench, "--model", d, "--device", args.device, "--dtype", "bf16", "--train", f,
                     "--minibatch", str(args.minibatch), "--repeats", str(args.repeats)],
                    check=True, capture_output=True, text=True).stdout)
                o["tokens_per_s_median"] = statistics.median(r["tokens_per_s"] for r in o["runs"])
                ours_rounds.append(o)
                ref_rounds.append(peft_step(d, args.device, data, args.minibatch, args.repeats))
            ours_tps = statistics.median(r["tokens_per_s"] for o in ours_rounds for r in o["runs"])
            ref_tps = statistics.median(r["tokens_per_s"] for o in ref_rounds for r in o["runs"])
            row = {"model": "qwen2-" + size, "batch": b, "seq_len": l, "minibatch": args.minibatch,
                   "kernelrl_tokens_per_s": ours_tps, "peft_tokens_per_s": ref_tps, "speedup": ours_tps / ref_tps,
                   "rounds": [{"kernelrl": o["tokens_per_s_median"], "peft": r["tokens_per_s_median"]}
                              for o, r in zip(ours_rounds, ref_rounds)],
                   # The first step's loss: both adapters start with B = 0, so only the base model counts.
                   "first_loss": {"kernelrl": ours_rounds[0]["warmup_loss"], "peft": ref_rounds[0]["warmup_loss"]},
                   "kernelrl": ours_rounds, "peft": ref_rounds}
            print("grpo step %s b=%d l=%d: kernelrl %.0f tok/s, PyTorch+PEFT %.0f tok/s, %.2fx (rounds %s; loss %.5f vs %.5f)" % (
                row["model"], b, l, ours_tps, ref_tps, row["speedup"],
                ", ".join("%.0f/%.0f" % (x["kernelrl"], x["peft"]) for x in row["rounds"]),
                row["first_loss"]["kernelrl"], row["first_loss"]["peft"]), flush=True)
            result["rows"].append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
