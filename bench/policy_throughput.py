"""The built-in policy on a GPU against transformers, in one run on the same machine:

0. float32 decode on the GPU (CUDA graphs and eager): every reported logprob equals a full forward pass's.
1. bf16 CUDA parity: a tiny Qwen2 and Llama (random weights, saved with save_pretrained); kernelrl's
   bf16 logits against transformers' bf16 logits, with transformers' own bf16-vs-fp32 difference as
   the yardstick, and greedy next-token agreement.
2. Sampling throughput in generated tokens/s: kernelrl (bench/policy_bench) against transformers'
   generate on the same model, batch, prompt length and number of new tokens (sampling at
   temperature 1, no early stop), for each model size in --sizes. Target: at least 2x.

    python3 bench/policy_throughput.py --probe build/tests/policy_probe --bench build/policy_bench \
        --launch build/launch [--device cuda:0] [--sizes tiny,small] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

SIZES = {  # name: (hidden, intermediate, layers, heads, kv heads, vocab)
    "tiny": (256, 768, 4, 8, 2, 4096),
    "small": (1024, 2816, 12, 16, 4, 32000),
}


def tokenizer(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    lines = ["def forward(self, x): return torch.relu(x)", "__global__ void add(float* a, const float* b)"] * 50
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)


def make_model(kind, size, d):
    h, i, l, nh, nkv, v = SIZES[size]
    common = dict(vocab_size=v, hidden_size=h, intermediate_size=i, num_hidden_layers=l, num_attention_heads=nh,
                  num_key_value_heads=nkv, initializer_range=0.05, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    torch.manual_seed(0)
    if kind == "qwen2":
        m = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **common))
    else:
        m = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    m.to(torch.bfloat16).save_pretrained(d)
    tokenizer(os.path.join(d, "tokenizer.json"))
    return d


def parity(probe, device, tmp):
    out = {}
    for kind in ["qwen2", "llama"]:
        d = make_model(kind, "tiny", os.path.join(tmp, kind + "-tiny"))
        ids = torch.randint(10, SIZES["tiny"][5], (96,), generator=torch.Generator().manual_seed(5)).tolist()
        f = os.path.join(tmp, "logits.safetensors")
        subprocess.run([probe, "logits", "--model", d, "--device", device, "--dtype", "bf16", "--ids",
                        ",".join(map(str, ids)), "--out", f], check=True)
        ours = load_file(f)["logits"].to(device)
        cls = Qwen2ForCausalLM if kind == "qwen2" else LlamaForCausalLM
        x = torch.tensor([ids], device=device)
        with torch.no_grad():
            ref16 = cls.from_pretrained(d, dtype=torch.bfloat16).to(device).eval()(x).logits[0].float()
            ref32 = cls.from_pretrained(d, dtype=torch.float32).to(device).eval()(x).logits[0].float()
        r = {
            "max_abs_ours_vs_hf_bf16": (ours - ref16).abs().max().item(),
            "max_abs_hf_bf16_vs_hf_fp32": (ref16 - ref32).abs().max().item(),
            "max_abs_ours_vs_hf_fp32": (ours - ref32).abs().max().item(),
            "argmax_agreement_vs_hf_bf16": (ours.argmax(-1) == ref16.argmax(-1)).float().mean().item(),
            "logit_scale": ref32.abs().max().item(),
        }
        r["ok"] = r["max_abs_ours_vs_hf_fp32"] <= 2 * r["max_abs_hf_bf16_vs_hf_fp32"] + 1e-3
        out[kind] = r
        print("parity %-6s %s" % (kind, json.dumps(r)), flush=True)
    return out


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def graph_check(launch, probe, device, tmp):
    """Float32 generation on the GPU with CUDA-graph decode and with eager decode: the logprob each
    run reports for each token equals the logprob a full forward pass (no cache) gives that token
    after the same prefix. Greedy paths of a random model fork wherever two logits tie to rounding,
    so where they first differ (from each other and from transformers' greedy) is reported only."""
    d = make_model("qwen2", "tiny", os.path.join(tmp, "qwen2-f32"))
    prompts = ["def forward(self, x):", "__global__ void add(float* a, const float* b) {", "x"]
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    outs, worst = {}, {}
    for graphs in ["1", "0"]:
        args = [launch, "generate", "--model", d, "--device", device, "--dtype", "f32", "--temperature", "0",
                "--max-tokens", "48", "--json"]
        for p in prompts:
            args += ["--prompt", p]
        env = dict(os.environ, KERNELRL_CUDA_GRAPHS=graphs)
        comps = json.loads(subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout)["completions"]
        outs[graphs] = [c["token_ids"] for c in comps]
        worst[graphs] = 0.0
        for p, c in zip(prompts, comps):
            pids = tok.encode(p).ids
            ids = pids + c["token_ids"]
            f = os.path.join(tmp, "check.safetensors")
            subprocess.run([probe, "logits", "--model", d, "--device", device, "--dtype", "f32", "--ids",
                            ",".join(map(str, ids)), "--out", f], check=True)
            lg = load_file(f)["logits"][len(pids) - 1: len(ids) - 1]
            ref = torch.log_softmax(lg, -1).gather(-1, torch.tensor(c["token_ids"])[:, None])[:, 0]
            worst[graphs] = max(worst[graphs], (ref - torch.tensor(c["logprobs"])).abs().max().item())
    m = Qwen2ForCausalLM.from_pretrained(d, dtype=torch.float32).to(device).eval()
    hf = []
    for p in prompts:
        ids = tok.encode(p).ids
        with torch.no_grad():
            o = m.generate(torch.tensor([ids], device=device), do_sample=False, max_new_tokens=48, min_new_tokens=48,
                           attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device), pad_token_id=0)
        hf.append(o[0, len(ids):].tolist())
    r = {"max_abs_logprob_vs_full_forward_graph": worst["1"], "max_abs_logprob_vs_full_forward_eager": worst["0"],
         "first_divergence_graph_vs_eager": [first_divergence(a, b) for a, b in zip(outs["1"], outs["0"])],
         "first_divergence_graph_vs_transformers": [first_divergence(a, b) for a, b in zip(outs["1"], hf)],
         "prompts": len(prompts), "tokens_each": 48}
    r["ok"] = worst["1"] < 1e-3 and worst["0"] < 1e-3
    print("decode f32 %s" % json.dumps(r), flush=True)
    return r


def hf_throughput(d, device, batch, plen, new, repeats):
    m = Qwen2ForCausalLM.from_pretrained(d, dtype=torch.bfloat16).to(device).eval()
    vocab = m.config.vocab_size
    x = torch.randint(10, vocab, (batch, plen), generator=torch.Generator().manual_seed(1)).to(device)
    mask = torch.ones_like(x)
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new,
              attention_mask=mask, pad_token_id=0)
    with torch.no_grad():
        m.generate(x, **kw)  # warm-up
        runs = []
        for r in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            out = m.generate(x, **kw)
            sync(device)
            s = time.perf_counter() - t0
            toks = (out.shape[1] - plen) * batch
            runs.append({"seconds": s, "tokens": toks, "tokens_per_s": toks / s})
    del m
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"runs": runs, "tokens_per_s_best": max(r["tokens_per_s"] for r in runs),
            "tokens_per_s_mean": sum(r["tokens_per_s"] for r in runs) / len(runs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--launch", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--shapes", default="16x64x128,64x64x128", help="BATCHxPROMPTxNEW, comma separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kernelrl-policy-bench-")
    result = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu", "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "parity": parity(args.probe, args.device, tmp),
              "greedy": graph_check(args.launch, args.probe, args.device, tmp), "throughput": []}
    for size in args.sizes.split(","):
        d = make_model("qwen2", size, os.path.join(tmp, "qwen2-" + size))
        for shape in args.shapes.split(","):
            b, p, n = map(int, shape.split("x"))
            ours = json.loads(subprocess.run(
                [args.bench, "--model", d, "--device", args.device, "--dtype", "bf16", "--batch", str(b),
                 "--prompt-len", str(p), "--new-tokens", str(n), "--repeats", str(args.repeats)],
                check=True, capture_output=True, text=True).stdout)
            hf = hf_throughput(d, args.device, b, p, n, args.repeats)
            row = {"model": "qwen2-" + size, "params_m": round(sum(
                       t.numel() for t in load_file(os.path.join(d, "model.safetensors")).values()) / 1e6, 1),
                   "batch": b, "prompt_len": p, "new_tokens": n,
                   "kernelrl_tokens_per_s": ours["tokens_per_s_mean"], "hf_tokens_per_s": hf["tokens_per_s_mean"],
                   "speedup": ours["tokens_per_s_mean"] / hf["tokens_per_s_mean"], "kernelrl": ours, "hf": hf}
            print("throughput %s b=%d p=%d n=%d: kernelrl %.0f tok/s, transformers %.0f tok/s, %.2fx" % (
                row["model"], b, p, n, row["kernelrl_tokens_per_s"], row["hf_tokens_per_s"], row["speedup"]), flush=True)
            result["throughput"].append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    ok = all(r["ok"] for r in result["parity"].values()) and result["greedy"]["ok"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
