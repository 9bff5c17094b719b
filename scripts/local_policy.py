"""Builds the embedded small policy that configs/local.toml trains (run it as scripts/make-local-policy).

1. The demonstration corpus, tasks/demos.jsonl: for each bundled task, forward bodies of several
   kinds, each a ```python block:
     fast         a faster formulation (tasks/replay, label "faster")
     alternative  another correct formulation (tasks/replay, label "alternative")
     baseline     the reference's own forward body
     slow         the reference's body with its result computed four times (or tasks/replay's
                  "slower" body)
     wrong        a plausible body with the wrong result (tasks/replay, label "wrong")
2. The prompts the sampler renders for those tasks (`launch prompts` on a config with
   configs/local.toml's [policy] template and system message).
3. A byte-level BPE tokenizer (the Qwen2 pre-tokenizer) trained on the prompts and the corpus.
4. The base model: a random Qwen2 with that vocabulary (transformers), pretrained (every weight,
   AdamW, PyTorch) on the (prompt, demonstration) pairs: a stand-in for the pretraining a real
   checkpoint comes with, enough to write the corpus' code.
5. The warm start: the learner's LoRA SFT on the same pairs (`launch sft`), folded into the
   weights (`launch merge`). Each task's bodies are equally likely in the corpus, so the policy
   writes a mix of fast, baseline, slow and wrong bodies, and some that are not code at all.

The result (config.json, model.safetensors, tokenizer.json) is written to --out (default
policies/local). Every step is seeded: the same command on the same LibTorch gives the same model.
"""
import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def fenced(body):
    return "```python\n%s\n```" % body.strip("\n")


def unfenced(text):
    """The code of the first ```python block of a replayed answer, or the whole text."""
    if "```python\n" in text:
        text = text.split("```python\n", 1)[1]
        text = text.split("```", 1)[0]
    return text.strip("\n")


def forward_body(path):
    """The source of Model.forward's body, dedented, and its final return's expression."""
    with open(path) as f:
        src = f.read()
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
                    lines = src.splitlines()
                    body = textwrap.dedent("\n".join(lines[fn.body[0].lineno - 1:fn.body[-1].end_lineno]))
                    last = fn.body[-1]
                    if not isinstance(last, ast.Return) or last.value is None:
                        raise SystemExit("%s: Model.forward does not end with `return EXPR`" % path)
                    head = textwrap.dedent("\n".join(lines[fn.body[0].lineno - 1:last.lineno - 1])) if len(fn.body) > 1 else ""
                    expr = ast.get_source_segment(src, last.value)
                    return body, head, expr
    raise SystemExit("%s: no Model.forward" % path)


def slow_body(head, expr):
    """The reference's computation with its result computed four times."""
    expr = expr.replace("\n", "\n    ")
    return (head + "\n" if head else "") + "out = None\nfor _ in range(4):\n    out = %s\nreturn out" % expr


def build_corpus(tasks_dir, replay_dir):
    demos = []
    for name in sorted(os.listdir(tasks_dir)):
        if not name.endswith(".py"):
            continue
        task = name[:-3]
        body, head, expr = forward_body(os.path.join(tasks_dir, name))
        replay = {}
        path = os.path.join(replay_dir, task + ".jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    replay.setdefault(r["label"], unfenced(r["completion"]))
        kinds = []
        if "faster" in replay:
            kinds.append(("fast", replay["faster"]))
        if "alternative" in replay:
            kinds.append(("alternative", replay["alternative"]))
        kinds.append(("baseline", body))
        kinds.append(("slow", replay.get("slower") or slow_body(head, expr)))
        if "wrong" in replay:
            kinds.append(("wrong", replay["wrong"]))
        for kind, text in kinds:
            demos.append({"task_id": task, "kind": kind, "completion": fenced(text)})
    return demos


def pretrain(model, tok, pairs, steps, lr, batch, seed):
    """Every weight of `model`, AdamW, cross-entropy on the completion tokens (and the end token)."""
    import random
    import torch
    eos = tok.token_to_id("<|im_end|>")
    data = [(tok.encode(p).ids, tok.encode(c).ids + [eos]) for p, c in pairs]
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        chosen = rng.sample(data, batch)
        width = max(len(p) + len(c) for p, c in chosen)
        ids = torch.zeros(batch, width, dtype=torch.long)
        labels = torch.full((batch, width), -100, dtype=torch.long)
        for i, (p, c) in enumerate(chosen):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 0 or step + 1 == steps:
            print("pretraining step %d/%d: loss %.3f" % (step + 1, steps, loss.item()), flush=True)
    model.eval()


def run(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("%s failed (%d):\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", default=os.path.join(ROOT, "build", "launch"))
    ap.add_argument("--out", default=os.path.join(ROOT, "policies", "local"))
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tasks", "demos.jsonl"))
    ap.add_argument("--corpus-only", action="store_true", help="write the corpus and stop")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=3000)
    ap.add_argument("--pretrain-steps", type=int, default=300, help="full-parameter steps of the base model")
    ap.add_argument("--pretrain-lr", type=float, default=2e-3)
    ap.add_argument("--rounds", type=int, default=1, help="SFT rounds, each merged into the weights")
    ap.add_argument("--steps", type=int, default=150, help="SFT steps per round")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    demos = build_corpus(os.path.join(ROOT, "tasks", "bundled"), os.path.join(ROOT, "tasks", "replay"))
    with open(a.corpus, "w") as f:
        for d in demos:
            f.write(json.dumps(d) + "\n")
    print("corpus: %d demonstrations over %d tasks -> %s" % (len(demos), len({d["task_id"] for d in demos}), a.corpus))
    if a.corpus_only:
        return

    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tmp = tempfile.mkdtemp(prefix="kernelrl-local-policy-")
    try:
        # The prompts exactly as the sampler renders them (configs/local.toml keeps the default
        # [policy] template and system message).
        cfg = os.path.join(tmp, "prompts.toml")
        with open(cfg, "w") as f:
            f.write('[tasks]\ndir = "%s"\n[sampler]\nreplay = "%s"\n' % (os.path.join(ROOT, "tasks", "bundled"),
                                                                        os.path.join(ROOT, "tasks", "replay")))
        prompts = {}
        for line in run([a.launch, "prompts", cfg]).splitlines():
            x = json.loads(line)
            prompts[x["task_id"]] = x["prompt"]
        data = os.path.join(tmp, "sft.jsonl")
        with open(data, "w") as f:
            for d in demos:
                f.write(json.dumps({"prompt": prompts[d["task_id"]], "completion": d["completion"]}) + "\n")

        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=SPECIAL,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(list(prompts.values()) + [d["completion"] for d in demos], trainer=trainer)

        torch.manual_seed(a.seed)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=tok.get_vocab_size(), hidden_size=a.hidden, intermediate_size=2 * a.hidden,
            num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
            max_position_embeddings=4096, rope_theta=10000.0, initializer_range=0.05,
            bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>")))
        lengths = [len(tok.encode(p).ids) for p in prompts.values()]
        print("tokenizer: %d tokens; prompts %d..%d tokens; model: %d parameters" %
              (tok.get_vocab_size(), min(lengths), max(lengths), sum(p.numel() for p in model.parameters())), flush=True)
        pretrain(model, tok, [(prompts[d["task_id"]], d["completion"]) for d in demos], a.pretrain_steps,
                 a.pretrain_lr, a.batch, a.seed)
        base = os.path.join(tmp, "round-0")
        model.save_pretrained(base)
        tok.save(os.path.join(base, "tokenizer.json"))

        targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
        for r in range(1, a.rounds + 1):
            adapter = os.path.join(tmp, "adapter-%d" % r)
            out = run([a.launch, "sft", "--model", base, "--data", data, "--out", adapter, "--steps", str(a.steps),
                       "--batch", str(a.batch), "--lr", str(a.lr), "--rank", str(a.rank), "--alpha", str(a.rank),
                       "--targets", targets, "--seed", str(a.seed + r), "--dtype", "f32", "--json"])
            losses = [json.loads(line)["loss"] for line in out.splitlines()]
            print("sft round %d: loss %.3f -> %.3f over %d steps" % (r, losses[0], losses[-1], len(losses)), flush=True)
            merged = os.path.join(tmp, "round-%d" % r)
            run([a.launch, "merge", "--model", base, "--adapter", adapter, "--out", merged])
            base = merged
        if os.path.exists(a.out):
            shutil.rmtree(a.out)
        os.makedirs(a.out)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            shutil.copy(os.path.join(base, name), os.path.join(a.out, name))
        size = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
        print("policy: %s (%.1f MB)" % (a.out, size / 1e6))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
