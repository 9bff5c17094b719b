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
    "1.5b": (1536, 8960, 28, 12, 2, 151936),  # Qwen2.5-1.5B's shape (tied embeddings)
    "7b": (3584, 18944, 28, 28, 4, 152064),   # Qwen2.5-7B's shape (untied)
}
UNTIED = {"7b"}


def tokenizer(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    lines = ["def forward(self, x): return torch.relu(x)", "__global__ void add(float* a, const float* b)"] * 50
    tok.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)


def make_model(kind, size, d, device="cpu"):
    """Random weights at a size's shape, saved in bf16 by transformers. Models of billions of
    parameters are initialised on `device` in bf16 (minutes on the CPU otherwise)."""
    if os.path.exists(os.path.join(d, "config.json")):
        return d
    h, i, l, nh, nkv, v = SIZES[size]
    common = dict(vocab_size=v, hidden_size=h, intermediate_size=i, num_hidden_layers=l, num_attention_heads=nh,
                  num_key_value_heads=nkv, initializer_range=0.05, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    torch.manual_seed(0)
    big = h * l > 10000
    with torch.device(device if big else "cpu"):
        if big:
            torch.set_default_dtype(torch.bfloat16)
        try:
            if kind == "qwen2":
                m = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=size not in UNTIED, **common))
            else:
                m = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
        finally:
            torch.set_default_dtype(torch.float32)
    m.to(torch.bfloat16).save_pretrained(d)
    del m
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    tokenizer(os.path.join(d, "tokenizer.json"))
    return d


def copy_bandwidth(device):
    """Device memory bandwidth measured as METHOD.md says: a large device-to-device copy, bytes read
    plus bytes written over the median time of 20 copies (CUDA events)."""
    if not device.startswith("cuda"):
        return None
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device).random_(0, 255)
    b = torch.empty_like(a)
    times = []
    for i in range(25):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        if i >= 5:
            times.append(e0.elapsed_time(e1) / 1e3)
    times.sort()
    del a, b
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / times[len(times) // 2]


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
    so where they first differ (from each other and from transformers' greedy) is reported only. Then
    the graph decode again with 2 rows for the 3 prompts and a stop string that ends a first-row
    completion early: the third prompt is admitted into its row mid-generation (the windows of steps
    after it run two in flight), and every token's logprob must still equal the full forward pass's."""
    d = make_model("qwen2", "tiny", os.path.join(tmp, "qwen2-f32"))
    prompts = ["def forward(self, x):", "__global__ void add(float* a, const float* b) {", "x"]
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    outs, worst, texts = {}, {}, {}

    def generate(env_graphs, extra=()):
        args = [launch, "generate", "--model", d, "--device", device, "--dtype", "f32", "--temperature", "0",
                "--max-tokens", "48", "--json"] + list(extra)
        for p in prompts:
            args += ["--prompt", p]
        env = dict(os.environ, KERNELRL_CUDA_GRAPHS=env_graphs)
        return json.loads(subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout)["completions"]

    def worst_vs_full_forward(comps):
        w = 0.0
        for p, c in zip(prompts, comps):
            pids = tok.encode(p).ids
            ids = pids + c["token_ids"]
            f = os.path.join(tmp, "check.safetensors")
            subprocess.run([probe, "logits", "--model", d, "--device", device, "--dtype", "f32", "--ids",
                            ",".join(map(str, ids)), "--out", f], check=True)
            lg = load_file(f)["logits"][len(pids) - 1: len(ids) - 1]
            ref = torch.log_softmax(lg, -1).gather(-1, torch.tensor(c["token_ids"])[:, None])[:, 0]
            w = max(w, (ref - torch.tensor(c["logprobs"])).abs().max().item())
        return w

    for graphs in ["1", "0"]:
        comps = generate(graphs)
        outs[graphs] = [c["token_ids"] for c in comps]
        texts[graphs] = [c["text"] for c in comps]
        worst[graphs] = worst_vs_full_forward(comps)
    # A row refilled mid-generation: the 3 prompts in 2 rows, with a stop string from a first-row
    # completion's text, so that it ends before the other and the third prompt takes its row. (Most of the random model's tokens have no text: the
    # tokenizer knows 300 of its 4,096; where neither first-row completion has any, it is skipped.)
    rows = {"skipped": True}
    first = next((i for i in range(2) if texts["1"][i]), None)
    if first is not None:
        stop = texts["1"][first][0]
        comps = generate("1", ["--max-rows", "2", "--stop", stop])
        rows = {"stop": stop, "stopped": first, "finish_reasons": [c["finish_reason"] for c in comps],
                "max_abs_logprob_vs_full_forward": worst_vs_full_forward(comps),
                "first_divergence_vs_all_rows": [first_divergence(a, b["token_ids"])
                                                 for a, b in zip(outs["1"], comps)]}
        rows["ok"] = (len(comps) == len(prompts) and comps[first]["finish_reason"] == "stop" and
                      rows["max_abs_logprob_vs_full_forward"] < 1e-3)
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
         "prompts": len(prompts), "tokens_each": 48, "rows_refilled": rows}
    r["ok"] = worst["1"] < 1e-3 and worst["0"] < 1e-3 and rows.get("ok", True)
    print("decode f32 %s" % json.dumps(r), flush=True)
    return r


def random_adapter(d, path, rank, seed):
    """A PEFT adapter on all seven projections of the bf16 model in d with random A and B (B scaled
    down, so that it moves the logits without swamping them), saved to path."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(seed)
    pm = get_peft_model(Qwen2ForCausalLM.from_pretrained(d, dtype=torch.bfloat16),
                        LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False, target_modules=[
                            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():
        for name, prm in pm.named_parameters():
            if "lora_B" in name:
                prm.mul_(0.05)
    pm.save_pretrained(path)
    return path


def decode_check(launch, device, d, tmp):
    """bf16 sampling on the GPU down each decode path (the fused kernels in CUDA graphs, LibTorch ops in
    CUDA graphs, LibTorch ops eager), with and without a LoRA adapter (PEFT, random B): every sampled
    token's reported logprob against transformers' (+ PEFT's) bf16 forward pass over the same prefix, and
    the sampler's bias: tokens drawn from p have E[log p(token)] = -H(p), so the mean of (log p + H) over
    the sampled tokens, in standard errors, says whether the draws follow the distribution (|z| < 4). Each
    path's logprobs are also compared with the float32 forward pass (the same weights, upcast), beside
    transformers' bf16 pass on the same tokens: a path is ok when it is unbiased, within twice
    transformers' bf16 distance from float32 (+ 0.02), and the decode step that ran is the one the path
    names (`launch generate --json`'s decode_path); fused-rows decodes the 12 sequences in 5 rows,
    refilling rows as sequences end. (Agreement with transformers' bf16 pass alone
    would favour paths that round where it rounds over paths closer to the exact model.)"""
    import math
    from peft import PeftModel
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    prompts = ["def forward(self, x):", "__global__ void add(float* a, const float* b) { int i = threadIdx.x;", "x"]
    n, new = 4, 96
    base = Qwen2ForCausalLM.from_pretrained(d, dtype=torch.bfloat16).to(device).eval()
    base32 = Qwen2ForCausalLM.from_pretrained(d, dtype=torch.float32).to(device).eval()
    adir = random_adapter(d, os.path.join(tmp, "check-adapter"), rank=8, seed=3)
    out = {}
    for adapter in (None, adir):
        ref_model = base if adapter is None else PeftModel.from_pretrained(base, adapter).to(device).eval()
        ref32 = base32 if adapter is None else PeftModel.from_pretrained(base32, adapter).to(device).eval()
        # (fused-graph: the Hopper products with the norms, SwiGLU and residual adds fused in where the
        # device and shapes allow them and no adapter is on; fused-cublas: the same step with cuBLAS's.)
        # Each path's decode step as `launch generate --json` reports it (decode_path): the Hopper
        # products where the decoder takes them (compute capability 9.0, hidden size up to 2,048, no
        # adapter), else the fused kernels with cuBLAS's products.
        hopper = torch.cuda.get_device_capability(device) == (9, 0) and base.config.hidden_size <= 2048
        # fused-rows: the fused path with 5 rows for the 12 sequences, rows refilled as sequences end.
        paths = [("fused-graph", {}, []), ("graph", {"KERNELRL_FUSED": "0"}, []),
                 ("eager", {"KERNELRL_FUSED": "0", "KERNELRL_CUDA_GRAPHS": "0"}, [])]
        if adapter is None:
            paths.insert(1, ("fused-cublas", {"KERNELRL_WGMMA": "0"}, []))
            paths.insert(2, ("fused-rows", {}, ["--max-rows", "5"]))
        expected = {"fused-graph": "fused-wgmma-graph" if hopper and adapter is None else "fused-graph",
                    "fused-cublas": "fused-graph", "graph": "graph", "eager": "eager"}
        expected["fused-rows"] = expected["fused-graph"]
        for path, env, extra in paths:
            args = [launch, "generate", "--model", d, "--device", device, "--dtype", "bf16", "--temperature", "1",
                    "--seed", "7", "--max-tokens", str(new), "--n", str(n), "--json"] + extra
            if adapter:
                args += ["--adapter", adapter]
            for p in prompts:
                args += ["--prompt", p]
            gen = json.loads(subprocess.run(args, check=True, capture_output=True, text=True,
                                            env=dict(os.environ, **env)).stdout)
            comps = gen["completions"]
            diffs, z_terms, d32, hf32 = [], [], [], []
            for i, c in enumerate(comps):
                pids = tok.encode(prompts[i // n]).ids
                ids = pids + c["token_ids"]
                toks = torch.tensor(c["token_ids"], device=device)[:, None]
                with torch.no_grad():
                    lg = ref_model(torch.tensor([ids], device=device)).logits[0].float()
                    lg32 = ref32(torch.tensor([ids], device=device)).logits[0].float()
                ls = torch.log_softmax(lg[len(pids) - 1:len(ids) - 1], -1)
                ref = ls.gather(-1, toks)[:, 0]
                exact = torch.log_softmax(lg32[len(pids) - 1:len(ids) - 1], -1).gather(-1, toks)[:, 0]
                ent = -(ls.exp() * ls).sum(-1)
                mine = torch.tensor(c["logprobs"], device=device)
                diffs += (ref - mine).abs().tolist()
                d32 += (exact - mine).abs().tolist()
                hf32 += (exact - ref).abs().tolist()
                z_terms += (ref + ent)[1:].tolist()  # the first token is drawn from the prefill's logits
            mean = sum(z_terms) / len(z_terms)
            sd = math.sqrt(sum((x - mean) ** 2 for x in z_terms) / (len(z_terms) - 1))
            key = path + ("+lora" if adapter else "")
            out[key] = {"max_abs_logprob_vs_transformers": max(diffs), "mean_abs": sum(diffs) / len(diffs),
                        "mean_abs_vs_fp32": sum(d32) / len(d32),
                        "transformers_bf16_mean_abs_vs_fp32": sum(hf32) / len(hf32),
                        "tokens": len(diffs), "bias_z": mean / (sd / math.sqrt(len(z_terms))),
                        "decode_path": gen.get("decode_path"), "expected_path": expected[path],
                        "completions": len(comps), "expected_completions": n * len(prompts),
                        "finish_reasons": {f: sum(c["finish_reason"] == f for c in comps)
                                           for f in sorted({c["finish_reason"] for c in comps})}}
        if adapter:
            del ref_model, ref32
    r = {"paths": out, "ok": all(abs(v["bias_z"]) < 4 and
                                  v["mean_abs_vs_fp32"] <= 2 * v["transformers_bf16_mean_abs_vs_fp32"] + 0.02 and
                                  v["decode_path"] == v["expected_path"] and
                                  v["completions"] == v["expected_completions"]
                                  for v in out.values())}
    print("decode bf16 %s %s" % (os.path.basename(d), json.dumps(r)), flush=True)
    del base, base32
    torch.cuda.empty_cache()
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
    ap.add_argument("--lora-rank", type=int, default=16, help="also sample through a rank-R adapter (0: not)")
    ap.add_argument("--baseline", help="another policy_bench (an earlier version) timed beside --bench")
    ap.add_argument("--cublas", action="store_true",
                    help="also time the step with cuBLAS's products and separate elementwise kernels (KERNELRL_WGMMA=0)")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' generate (its figure is known)")
    ap.add_argument("--no-checks", action="store_true", help="skip the tiny models' parity and f32 decode checks")
    ap.add_argument("--no-sample-check", action="store_true", help="skip the fused draw's check against float64")
    ap.add_argument("--no-attention-check", action="store_true",
                    help="skip the decode attention's check against LibTorch (policy_bench --attention-check)")
    ap.add_argument("--no-gemm-check", action="store_true",
                    help="skip the Hopper products' check against float64 (policy_bench --gemm-check)")
    ap.add_argument("--models", help="a folder for the random models (made once, reused by later runs)")
    ap.add_argument("--check-sizes", default="small", help="sizes whose bf16 decode paths are checked")
    ap.add_argument("--unfused", action="store_true", help="also time the decode step without the fused kernels")
    ap.add_argument("--group", type=int, default=8, help="also time batches of prompts sampled GROUP times each")
    ap.add_argument("--profile", help="a folder: a Chrome trace of one eager generation per row (fused kernels, "
                                      "no graphs) and its summary")
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kernelrl-policy-bench-")
    result = {"device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu", "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "throughput": [],
              "copy_bytes_per_s": copy_bandwidth(args.device)}
    if not args.no_checks:
        result["parity"] = parity(args.probe, args.device, tmp)
        result["greedy"] = graph_check(args.launch, args.probe, args.device, tmp)
    if args.device.startswith("cuda") and not args.no_sample_check:
        # the fused draw against float64 softmax (KS of the randomized PIT, bias, logprobs, argmax)
        r = subprocess.run([args.bench, "--sample-check", "1", "--device", args.device], capture_output=True, text=True)
        result["sample_check"] = json.loads(r.stdout) if r.stdout.strip() else {"ok": False, "stderr": r.stderr[-2000:]}
        for row in result["sample_check"].get("rows", []):
            print("sample check T=%s: %s" % (row["temperature"], json.dumps(row)), flush=True)
    if args.device.startswith("cuda") and not args.no_attention_check:
        # the decode attention against LibTorch float32, its repeat bits, and rows reading a shared prefix
        r = subprocess.run([args.bench, "--attention-check", "1", "--device", args.device], capture_output=True,
                           text=True)
        result["attention_check"] = json.loads(r.stdout) if r.stdout.strip() else {"ok": False,
                                                                                   "stderr": r.stderr[-2000:]}
        rows = result["attention_check"].get("rows", [])
        print("attention check: ok %s, %d cases, largest err %.2e, shared prefix the same bits in all: %s" % (
            result["attention_check"]["ok"], len(rows), max([x["err"] for x in rows] or [0]),
            all(x["shared_prefix_same"] for x in rows)), flush=True)
    if args.device.startswith("cuda") and not args.no_gemm_check:
        # the Hopper products with their fused steps against float64, beside the bf16 path transformers takes
        r = subprocess.run([args.bench, "--gemm-check", "1", "--device", args.device], capture_output=True, text=True)
        result["gemm_check"] = json.loads(r.stdout) if r.stdout.strip() else {"ok": False, "stderr": r.stderr[-2000:]}
        print("gemm check: ok %s, available %s" % (result["gemm_check"]["ok"], result["gemm_check"].get("available")),
              flush=True)
        for row in result["gemm_check"].get("rows", []):
            print("  gemm check %s" % json.dumps(row), flush=True)
    bw = result["copy_bytes_per_s"]
    if bw:
        print("device-to-device copy: %.2f TB/s (read + written)" % (bw / 1e12), flush=True)

    def ours(binary, d, b, p, n, lora, env=None, per_prompt=1):
        return json.loads(subprocess.run(
            [binary, "--model", d, "--device", args.device, "--dtype", "bf16", "--batch", str(b),
             "--prompt-len", str(p), "--new-tokens", str(n), "--repeats", str(args.repeats), "--lora-rank", str(lora),
             "--n", str(per_prompt)],
            check=True, capture_output=True, text=True, env=dict(os.environ, **(env or {}))).stdout)

    for size in args.sizes.split(","):
        d = make_model("qwen2", size, os.path.join(args.models or tmp, "qwen2-" + size), args.device)
        weight_bytes = sum(t.numel() * t.element_size() for t in load_file(os.path.join(d, "model.safetensors")).values()) \
            if os.path.exists(os.path.join(d, "model.safetensors")) else None
        if weight_bytes is None:  # sharded
            import glob
            weight_bytes = sum(sum(t.numel() * t.element_size() for t in load_file(f).values())
                               for f in glob.glob(os.path.join(d, "model-*.safetensors")))
        # Bytes of weights a decode step must read: all of them, less an untied embedding (a step
        # reads only its rows; the lm_head is read whole either way).
        h, _, _, _, _, vocab = SIZES[size]
        step_bytes = weight_bytes - (vocab * h * 2 if size in UNTIED else 0)
        if size in args.check_sizes.split(","):
            result.setdefault("decode_bf16", {})[size] = decode_check(args.launch, args.device, d, tmp)
            # a group's rows reading their prompt's keys from one row: the same tokens and logprobs
            r = subprocess.run([args.bench, "--share-check", "1", "--model", d, "--device", args.device],
                               capture_output=True, text=True)
            sc = json.loads(r.stdout) if r.stdout.strip() else {"ok": False, "stderr": r.stderr[-2000:]}
            result.setdefault("share_check", {})[size] = sc
            print("share check %s %s" % (size, json.dumps(sc)), flush=True)
        for shape in args.shapes.split(","):
            b, p, n = map(int, shape.split("x"))
            mine = ours(args.bench, d, b, p, n, 0)
            row = {"model": "qwen2-" + size, "params_m": round(weight_bytes / 2 / 1e6, 1), "weight_bytes": weight_bytes,
                   "step_weight_bytes": step_bytes,
                   "batch": b, "prompt_len": p, "new_tokens": n, "kernelrl_tokens_per_s": mine["tokens_per_s_mean"],
                   "kernelrl": mine, "decode_step_ms": mine["decode_step_ms"]}
            if bw:  # the bound: every weight a step needs read once at the measured bandwidth
                row["hbm_bound_step_ms"] = step_bytes / bw * 1e3
                row["fraction_of_hbm_bound"] = row["hbm_bound_step_ms"] / mine["decode_step_ms"]
            if args.lora_rank:
                lo = ours(args.bench, d, b, p, n, args.lora_rank)
                row["kernelrl_lora"] = lo
                row["kernelrl_lora_tokens_per_s"] = lo["tokens_per_s_mean"]
                row["decode_step_ms_lora"] = lo["decode_step_ms"]
            if args.profile:
                os.makedirs(args.profile, exist_ok=True)
                trace = os.path.join(args.profile, "decode-%s-%s.json" % (size, shape))
                subprocess.run([args.bench, "--model", d, "--device", args.device, "--dtype", "bf16", "--batch", str(b),
                                "--prompt-len", str(p), "--new-tokens", str(min(n, 64)), "--repeats", "1",
                                "--profile", trace], check=True, capture_output=True, text=True,
                               env=dict(os.environ, KERNELRL_CUDA_GRAPHS="0"))
                from profile_summary import summary
                row["profile"] = summary(trace, 30)
                for r in row["profile"]["top"][:15]:
                    print("  %8.2f ms %5.1f%% %6d x %8.2f us  %s" % (r["total_ms"], 100 * r["share"], r["count"],
                                                                    r["mean_us"], r["kernel"][:90]), flush=True)
                os.remove(trace)
            if args.unfused:  # the same binary with LibTorch ops in its CUDA graphs instead of the fused kernels
                un = ours(args.bench, d, b, p, n, 0, {"KERNELRL_FUSED": "0"})
                row["unfused"] = un
                row["unfused_decode_step_ms"] = un["decode_step_ms"]
            if args.group > 1 and b % args.group == 0:  # GRPO-shaped: b / group prompts, each sampled group times
                gr = ours(args.bench, d, b, p, n, 0, per_prompt=args.group)
                gu = ours(args.bench, d, b, p, n, 0, {"KERNELRL_SHARED_PREFIX": "0"}, per_prompt=args.group)
                row["grouped"] = gr
                row["grouped_unshared"] = gu  # each row reading its own copy of the prompt's keys
                row["grouped_prefill_seconds"] = gr["prefill_seconds"]
                row["grouped_decode_step_ms"] = gr["decode_step_ms"]
                row["grouped_unshared_decode_step_ms"] = gu["decode_step_ms"]
                row["grouped_tokens_per_s"] = gr["tokens_per_s_mean"]
                if bw:
                    row["grouped_fraction_of_hbm_bound"] = row["hbm_bound_step_ms"] / gr["decode_step_ms"]
            if args.cublas:
                cb = ours(args.bench, d, b, p, n, 0, {"KERNELRL_WGMMA": "0"})
                row["cublas"] = cb
                row["cublas_decode_step_ms"] = cb["decode_step_ms"]
            if args.baseline:
                base = ours(args.baseline, d, b, p, n, 0)
                row["baseline"] = base
                row["baseline_tokens_per_s"] = base["tokens_per_s_mean"]
                row["baseline_decode_step_ms"] = base.get("decode_step_ms")
            if not args.no_hf:
                hf = hf_throughput(d, args.device, b, p, n, args.repeats)
                row["hf"] = hf
                row["hf_tokens_per_s"] = hf["tokens_per_s_mean"]
                row["speedup"] = mine["tokens_per_s_mean"] / hf["tokens_per_s_mean"]
            line = "throughput %s b=%d p=%d n=%d: kernelrl %.0f tok/s (decode step %.2f ms" % (
                row["model"], b, p, n, row["kernelrl_tokens_per_s"], row["decode_step_ms"])
            if "fraction_of_hbm_bound" in row:
                line += ", %.0f%% of the HBM bound %.2f ms" % (100 * row["fraction_of_hbm_bound"], row["hbm_bound_step_ms"])
            line += ", prefill %.3f s, %s, peak %.1f GB)" % (mine["prefill_seconds"], mine.get("path"),
                                                             mine["peak_bytes"] / 1e9)
            if args.unfused:
                line += ", unfused %.2f ms" % row["unfused_decode_step_ms"]
            if args.cublas:
                line += ", with cuBLAS's products %.2f ms (%s)" % (row["cublas_decode_step_ms"], row["cublas"].get("path"))
            if "grouped" in row:
                line += ", groups of %d: step %.2f ms" % (args.group, row["grouped_decode_step_ms"])
                if "grouped_fraction_of_hbm_bound" in row:
                    line += " (%.1f%% of the bound)" % (100 * row["grouped_fraction_of_hbm_bound"])
                line += " against %.2f ms unshared, %.0f tok/s, prefill %.3f s" % (
                    row["grouped_unshared_decode_step_ms"], row["grouped_tokens_per_s"], row["grouped_prefill_seconds"])
            if args.lora_rank:
                line += ", with LoRA r=%d %.0f tok/s (%.2f ms)" % (args.lora_rank, row["kernelrl_lora_tokens_per_s"],
                                                                 row["decode_step_ms_lora"])
            if args.baseline:
                line += ", before %.0f tok/s (%.2f ms)" % (row["baseline_tokens_per_s"], row.get("baseline_decode_step_ms", 0))
            if not args.no_hf:
                line += ", transformers %.0f tok/s, %.2fx" % (row["hf_tokens_per_s"], row["speedup"])
            print(line, flush=True)
            result["throughput"].append(row)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(result, f, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    ok = (args.no_checks or (all(r["ok"] for r in result["parity"].values()) and result["greedy"]["ok"])) and all(
        r["ok"] for r in result.get("decode_bf16", {}).values()) and result.get("sample_check", {"ok": True})["ok"] \
        and result.get("gemm_check", {"ok": True})["ok"] and result.get("attention_check", {"ok": True})["ok"] \
        and all(r["ok"] for r in result.get("share_check", {}).values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
