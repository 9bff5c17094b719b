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
3. Second turns (multi-turn refinement, [experiment] turns = 2), rendered by the system itself: a
   2-turn eval run (`launch` on a config, configs/local.toml's evaluator settings) whose sampler
   is a scripted OpenAI-compatible server on loopback. It answers each task's first turns with
   eight first attempts: the wrong, slow and reference bodies, the fast or alternative one, and
   four meant as format errors (the reference's body cut mid-line with a ")" added, a
   ```python block cut off unclosed, a lone ```, a sentence without code). The real evaluator
   judges each; the sampler renders each second turn's prompt (the task, the attempt, the
   evaluator's feedback on it, the refine instruction) exactly as in every run. Each is paired
   with the task's best correct body (fast, else alternative, else the reference's): 280 turn-2
   demonstrations, one per task and kind. With --turn2 mixed (policies/local-turns, the policy
   of the multi-turn study, bench/multi_turn_tuning.py), each prompt after a first attempt that
   can be bettered (a format error, a wrong, slow or reference body) is paired a second time,
   with that attempt repeated unchanged: a second turn that answers the feedback only part of
   the time, which RL can raise.
4. A byte-level BPE tokenizer (the Qwen2 pre-tokenizer) trained on the prompts of both turns and
   the corpus.
5. The base model: a random Qwen2 with that vocabulary (transformers), pretrained (every weight,
   AdamW, PyTorch) on the (prompt, demonstration) pairs, --turn2-share of each batch turn-2 pairs:
   a stand-in for the pretraining a real checkpoint comes with, enough to write the corpus' code.
6. The warm start: the learner's LoRA SFT (`launch sft`) on every single-turn pair and a seeded
   draw of turn-2 pairs (--sft-turn2-share of the data), folded into the weights (`launch
   merge`). The single-turn pairs hold, beside the corpus' bodies, one prose answer per task (a
   sentence describing a kernel instead of code: a format error; --prose 0 leaves it out), so the
   policy writes at the first turn a mix of fast, baseline, slow and wrong bodies and prose; at
   the second turn it writes code again after the feedback (without step 3 it writes a lone ```
   there).
7. A last full-parameter pass (--polish-steps, AdamW at --polish-lr, --polish-turn2-share of each
   batch turn-2 pairs, the rest single-turn pairs) that makes the second turn's answer nearly
   certain while the first turn stays a mix: without it, stray tokens at temperature 1 broke the
   syntax of second turns as often as of first ones.

The result (config.json, model.safetensors, tokenizer.json) is written to --out (default
policies/local). Every step is seeded: the same command on the same LibTorch gives the same model,
except that the feedback on the correct first attempts quotes their measured times, which vary
from run to run and machine to machine (so do a few tokens of those turn-2 prompts).
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = time.monotonic()


def say(text):
    print("[%4.0f s] %s" % (time.monotonic() - T0, text), flush=True)
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


# Turn-2 demonstrations. Each task's first attempts, one per kind, each answered by the evaluator:
#   wrong     the corpus' wrong body                         -> incorrect
#   slow      the corpus' slow body                          -> correct, slower than the reference
#   baseline  the reference's own body                       -> correct, about as fast
#   other     the corpus' fast or alternative body (else the reference's) -> correct
#   garbled   the reference's body cut mid-line, a ")" added  -> format error (does not parse), the kind
#             of answer the policy itself writes when it fails
#   truncated a ```python block cut off mid-line, unclosed    -> format error (a max_tokens cut)
#   fence     a lone ```                                      -> format error
#   prose     a sentence, no code                             -> format error
FIRST_ATTEMPTS = ["wrong", "slow", "baseline", "other", "garbled", "truncated", "fence", "prose"]
PROSE = ["I would rather not write this kernel.", "Here is a faster version of the model.",
         "The reference is already fast; no change is needed.", "Use a fused CUDA kernel for this operation.",
         "Sure! The forward pass can be written with fewer operations."]


def first_attempts(task, kinds, rng):
    """(kind, answer) of each first attempt of `task`; kinds: the task's corpus bodies by kind."""
    base = kinds["baseline"]
    lines = base.split("\n")
    last = lines[-1]
    cut = last[:max(len("return ") + 1, rng.randrange(len(last) // 3, max(len(last) // 3 + 1, len(last) - 2)))]
    garbled = "\n".join(lines[:-1] + [cut + ")"])
    truncated = "```python\n" + "\n".join(lines[:-1] + [cut])
    other = kinds.get("fast") or kinds.get("alternative") or base
    out = [("wrong", fenced(kinds["wrong"])), ("slow", fenced(kinds["slow"])), ("baseline", fenced(base)),
           ("other", fenced(other)),
           ("garbled", fenced(garbled)), ("truncated", truncated), ("fence", "```"),
           ("prose", PROSE[rng.randrange(len(PROSE))])]
    assert [k for k, _ in out] == FIRST_ATTEMPTS
    return out


def prose_answer(task):
    """A first answer that is a sentence, not code (a format error): what a policy writes when it describes a kernel
    instead of writing one. One per task joins the single-turn demonstrations (--prose), so that the policy's first
    turns keep some answers for the feedback of a second turn to repair."""
    return "The forward pass computes %s; one fused kernel can do it in a single pass." % (
        task.split("_", 1)[-1].replace("_", " "))


def second_answer(kinds):
    """The demonstrated second turn, whatever the first attempt was: the task's best correct body (its fast body,
    else its alternative, else the reference's): one answer per task, which the small model learns to give."""
    return fenced(kinds.get("fast") or kinds.get("alternative") or kinds["baseline"])


def second_answers(kinds, first_kind, first_text, mode):
    """The demonstrated second turns after a first attempt of `first_kind` (its text `first_text`): with mode "best",
    the task's best correct body whatever came first; with mode "mixed", that answer and, after any first attempt
    that can be bettered (a format error, a wrong, slow or reference body), a second one that repeats the first
    attempt unchanged. The policy so learns to answer the feedback half the time and to ignore it the other half: a
    second turn with room for RL to learn which (policies/local-turns)."""
    best = second_answer(kinds)
    if mode == "best" or first_kind == "other" or first_text == best:
        return [best]
    return [best, first_text]


def turn2_demos(launch, tmp, prompts, demos, seed, mode="best"):
    """(turn-2 prompt, answer) pairs, the prompts rendered by the system itself: a 2-turn eval run (`launch` on a
    config, [experiment] turns = 2) whose sampler is a scripted OpenAI-compatible server on loopback. It answers each
    task's first turns with the task's first attempts (one per kind) and every later turn with a lone ``` (not
    learned from); the real evaluator judges the first attempts, and the sampler renders each second turn's prompt
    (the task, the attempt, the evaluator's feedback, the refine instruction) as it does in every run."""
    import random
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    by_task = {}
    for d in demos:
        by_task.setdefault(d["task_id"], {})[d["kind"]] = unfenced(d["completion"])
    attempts = {t: first_attempts(t, k, random.Random("%d|%s" % (seed, t))) for t, k in by_task.items()}
    task_of = {p: t for t, p in prompts.items()}
    served = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            ps = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            choices = []
            for i, p in enumerate(ps):
                for j in range(body.get("n", 1)):
                    text = "```"
                    if p in task_of:
                        t = task_of[p]
                        with lock:
                            n = served[t] = served.get(t, -1) + 1
                        text = attempts[t][n % len(FIRST_ATTEMPTS)][1]
                    ids = list(range(100, 100 + len(text) // 4 + 1))
                    choices.append({"index": i * body.get("n", 1) + j, "text": text, "finish_reason": "stop",
                                    "logprobs": {"tokens": ["token_id:%d" % x for x in ids],
                                                 "token_logprobs": [-1.0] * len(ids), "top_logprobs": None,
                                                 "text_offset": [0] * len(ids)}})
            data = json.dumps({"id": "cmpl", "object": "text_completion", "model": body.get("model"),
                               "choices": choices}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = os.path.join(tmp, "turns.toml")
        with open(cfg, "w") as f:
            f.write(TURNS_CONFIG % (os.path.join(ROOT, "tasks", "bundled"), server.server_address[1],
                                    len(FIRST_ATTEMPTS), seed, os.path.join(tmp, "runs")))
        run_dir = os.path.join(tmp, "turns")
        run([launch, cfg, "--run-dir", run_dir])
        samples = [json.loads(line) for line in run([launch, "export", run_dir, "--jsonl"]).splitlines()]
    finally:
        server.shutdown()
    by_id = {s["sample_id"]: s for s in samples}
    pairs, verdicts = [], {}
    for s in sorted((s for s in samples if s["turn"] == 2), key=lambda s: (s["task_id"], s["sample_index"])):
        parent = by_id[s["parent_id"]]
        t = parent["task_id"]
        if parent["prompt"] != prompts[t] or not s["prompt"].startswith(parent["prompt"] + parent["completion"]):
            raise SystemExit("%s: the 2-turn run's prompts are not the sampler's (launch prompts)" % s["sample_id"])
        kind = next(k for k, text in attempts[t] if text == parent["completion"])
        verdicts.setdefault(kind, {}).setdefault(parent["status"], 0)
        verdicts[kind][parent["status"]] += 1
        for answer in second_answers(by_task[t], kind, parent["completion"], mode):
            pairs.append({"task_id": t, "first": kind, "prompt": s["prompt"], "completion": answer})
    want = len(attempts) * len(FIRST_ATTEMPTS)
    got = len({x["prompt"] for x in pairs})  # second-turn prompts (mixed: some taught two answers)
    if got != want or any(sum(v.values()) != len(attempts) for v in verdicts.values()):
        raise SystemExit("the 2-turn run gave %d second turns (%s), expected %d, one per task and kind" %
                         (got, verdicts, want))
    return pairs, verdicts


TURNS_CONFIG = """
[cluster]
name = "local-policy-turns"
log_level = "warn"
[[node]]
name = "local"
host = "127.0.0.1"
roles = ["supervisor", "learner", "sampler", "evaluator", "monitor"]
cpu_slots = 2
gpus = []
[tasks]
dir = "%s"
[sampler]
backend = "openai"
url = "http://127.0.0.1:%d"
served_model = "scripted"
temperature = 1.0
max_tokens = 96
samples_per_task = %d
[evaluator]
action_space = "forward_body"
mode = "fast"
correctness_trials = 3
warmup = 1
fast_trials = 5
timeout_s = 20
torch_threads = 1
[experiment]
name = "local-policy-turns"
mode = "eval"
turns = 2
seed = %d
run_root = "%s"
[monitor]
progress = false
"""


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


def pretrain(model, tok, pairs, later, share, steps, lr, batch, seed):
    """Every weight of `model`, AdamW, cross-entropy on the completion tokens (and the end token). Each batch draws
    round(share x batch) of its pairs from `later` (the turn-2 pairs), the rest from `pairs`."""
    import random
    import torch
    eos = tok.token_to_id("<|im_end|>")
    data = [(tok.encode(p).ids, tok.encode(c).ids + [eos]) for p, c in pairs]
    data2 = [(tok.encode(p).ids, tok.encode(c).ids + [eos]) for p, c in later]
    n2 = round(share * batch) if data2 else 0
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        chosen = rng.sample(data, batch - n2) + rng.sample(data2, n2)
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
            say("pretraining step %d/%d: loss %.3f" % (step + 1, steps, loss.item()))
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
    ap.add_argument("--steps", type=int, default=450, help="SFT steps per round")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--turn2-share", type=float, default=0.375,
                    help="share of turn-2 demonstrations in each pretraining batch")
    ap.add_argument("--sft-turn2-share", type=float, default=0.5, help="share of turn-2 demonstrations in the SFT data")
    ap.add_argument("--prose", type=int, default=1, help="a prose first answer per task among the single-turn pairs")
    ap.add_argument("--polish-steps", type=int, default=800,
                    help="full-parameter steps after the SFT, --polish-turn2-share of each batch turn-2 pairs (0: none)")
    ap.add_argument("--polish-turn2-share", type=float, default=0.85)
    ap.add_argument("--polish-lr", type=float, default=5e-4)
    ap.add_argument("--turn2", choices=["best", "mixed"], default="best",
                    help="the second turns taught: the task's best body after every first attempt (best), or that "
                    "and a repeat of the first attempt, one each, after any attempt that can be bettered (mixed)")
    a = ap.parse_args()

    demos = build_corpus(os.path.join(ROOT, "tasks", "bundled"), os.path.join(ROOT, "tasks", "replay"))
    with open(a.corpus, "w") as f:
        for d in demos:
            f.write(json.dumps(d) + "\n")
    say("corpus: %d demonstrations over %d tasks -> %s" % (len(demos), len({d["task_id"] for d in demos}), a.corpus))
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
        # Second turns: each task's first attempts of every kind, the evaluator's feedback on each, rendered by the
        # sampler; a correct body after each.
        later, verdicts = turn2_demos(a.launch, tmp, prompts, demos, a.seed, a.turn2)
        say("turn-2 demonstrations: %d after first attempts judged %s" % (len(later), "; ".join(
            "%s %s" % (k, ", ".join("%s %d" % sv for sv in sorted(v.items()))) for k, v in verdicts.items())))
        first = [(prompts[d["task_id"]], d["completion"]) for d in demos]
        if a.prose:
            first += [(prompts[t], prose_answer(t)) for t in sorted(prompts)]
        second = [(x["prompt"], x["completion"]) for x in later]
        # The SFT data: every single-turn pair, and a seeded draw of turn-2 pairs making --sft-turn2-share of it.
        import random
        n2 = min(len(second), round(len(first) * a.sft_turn2_share / (1 - a.sft_turn2_share)))
        data = os.path.join(tmp, "sft.jsonl")
        with open(data, "w") as f:
            for p, c in first + random.Random(a.seed).sample(second, n2):
                f.write(json.dumps({"prompt": p, "completion": c}) + "\n")

        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=SPECIAL,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(list(prompts.values()) + [c for _, c in first] + [p for p, _ in second],
                                trainer=trainer)

        torch.manual_seed(a.seed)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=tok.get_vocab_size(), hidden_size=a.hidden, intermediate_size=2 * a.hidden,
            num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
            max_position_embeddings=4096, rope_theta=10000.0, initializer_range=0.05,
            bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>")))
        lengths = [len(tok.encode(p).ids) for p in prompts.values()]
        lengths2 = [len(tok.encode(p).ids) for p, _ in second]
        say("tokenizer: %d tokens; prompts %d..%d tokens (second turns %d..%d); model: %d parameters" %
            (tok.get_vocab_size(), min(lengths), max(lengths), min(lengths2), max(lengths2),
             sum(p.numel() for p in model.parameters())))
        pretrain(model, tok, first, second, a.turn2_share, a.pretrain_steps, a.pretrain_lr, a.batch, a.seed)
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
            say("sft round %d: loss %.3f -> %.3f over %d steps" % (r, losses[0], losses[-1], len(losses)))
            merged = os.path.join(tmp, "round-%d" % r)
            run([a.launch, "merge", "--model", base, "--adapter", adapter, "--out", merged])
            base = merged
        if a.polish_steps > 0:
            # A last full-parameter pass weighted to the second turns: after the SFT, stray tokens at temperature 1
            # broke the syntax of second turns about as often as of first turns.
            model = Qwen2ForCausalLM.from_pretrained(base, dtype=torch.float32)
            pretrain(model, tok, first, second, a.polish_turn2_share, a.polish_steps, a.polish_lr, a.batch, a.seed + 1)
            polished = os.path.join(tmp, "polished")
            model.save_pretrained(polished)
            tok.save(os.path.join(polished, "tokenizer.json"))
            base = polished
        if os.path.exists(a.out):
            shutil.rmtree(a.out)
        os.makedirs(a.out)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            shutil.copy(os.path.join(base, name), os.path.join(a.out, name))
        size = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
        say("policy: %s (%.1f MB)" % (a.out, size / 1e6))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
