"""The policy runtime (learner/) against references no one here wrote:

- transformers: tiny randomly initialised Qwen2 and Llama models saved with save_pretrained
  (single file, shards, bf16); kernelrl's float32 CPU logits equal transformers' within 1e-4;
- tokenizers: byte-level BPE tokenizers trained with HF tokenizers in the GPT-2, Qwen2 (NFC, Split
  regex) and Llama 3 (ignore_merges) styles; kernelrl's encodings equal theirs on code, prose and
  Unicode, and decode(encode(s)) == s;
- PEFT: an adapter saved by kernelrl loads in PEFT with the same logits, and one saved by PEFT
  loads in kernelrl with the same logits; a merged export loads in plain transformers;
- the CLI: generate (greedy equals transformers' greedy, left-padded batches, seeds, stop strings,
  logprobs equal scoring), score, tokenize, merge, and clear errors for broken checkpoints.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch
from safetensors.torch import load_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
PROBE = os.environ.get("KERNELRL_POLICY_PROBE", os.path.join(ROOT, "build", "tests", "policy_probe"))

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

UNICODE_LINES = [
    "naïve café, façade, Øresund, smörgåsbord",
    "日本語のテキストと漢字、カタカナ。",
    "Ελληνικά και русский текст, עברית, العربية",
    "emoji 🚀🔥👩‍💻 and flags 🇫🇷",
    "combining e\u0301 and A\u030a and \u1100\u1161\u11a8 jamo",
    "math ∑ x² ≤ ∞, arrows → ⇒, quotes “like” ‘this’",
    "tabs\tand\u00a0nbsp\u2003em space",
]
EXTRA_TESTS = [
    "",
    " ",
    "   leading and trailing   ",
    "line one\nline two\r\nline three\n\n\n",
    "I'LL do it, you're right, she'd've DON'T",
    "12345678901234 3.14159 0x1F 1e-5",
    "def forward(self, x):\n    return torch.relu(x) + 1\n",
    "<|im_start|>user\nwrite a kernel<|im_end|>\n<|im_start|>assistant\n",
    "never seen words: zyxwvut qqqq ÆØÅ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "\u212b angstrom sign and \u0041\u030a and \u00c5",
]


def corpus(files=("README.md", "docs/ARCHITECTURE.md", "gpu/harness.py", "gpu/scaffold.py")):
    lines = []
    for rel in files:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            lines.extend(f.read().splitlines(keepends=True))
    return lines + UNICODE_LINES * 20


def train_tokenizer(style, path, files=None):
    if style == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok = Tokenizer(models.BPE(ignore_merges=(style == "llama3")))
        if style == "qwen2":
            tok.normalizer = normalizers.NFC()
        pattern = QWEN2_PATTERN if style == "qwen2" else LLAMA3_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(files) if files else corpus(), trainer=trainer)
    tok.save(path)
    return tok


def run(args, check=True):
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p


class PolicyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-policy-")
        cls.toks = {}
        for style in ["gpt2", "qwen2", "llama3"]:
            d = os.path.join(cls.tmp, "tok-" + style)
            os.makedirs(d)
            cls.toks[style] = train_tokenizer(style, os.path.join(d, "tokenizer.json"))
        vocab = cls.toks["qwen2"].get_vocab_size()
        cls.models = {}
        q = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=True, rope_theta=10000.0, initializer_range=0.25,
                                         eos_token_id=cls.toks["qwen2"].token_to_id("<|im_end|>")))
        cls.save(q, "qwen2", "qwen2")
        # Qwen3: per-head q/k RMSNorms, no q/k/v bias, a head size of its own (not hidden / heads).
        q3 = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=32, tie_word_embeddings=False, rope_theta=1000000.0,
                                          initializer_range=0.25, eos_token_id=cls.toks["qwen2"].token_to_id("<|im_end|>")))
        with torch.no_grad():  # norms that are not all ones, so that a missing one shows
            for layer in q3.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
        cls.save(q3, "qwen3", "qwen2")
        llama = LlamaForCausalLM(LlamaConfig(
            vocab_size=cls.toks["llama3"].get_vocab_size(), hidden_size=64, intermediate_size=96,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, attention_bias=True,
            mlp_bias=True, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, initializer_range=0.25,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 16}, rope_theta=500000.0))
        cls.save(llama, "llama", "llama3", max_shard_size="40KB")
        cls.save(llama.to(torch.bfloat16), "llama-bf16", "llama3")
        llama.float()

    @classmethod
    def save(cls, model, name, tok_style, **kw):
        d = os.path.join(cls.tmp, name)
        model.eval()
        model.save_pretrained(d, **kw)
        shutil.copy(os.path.join(cls.tmp, "tok-" + tok_style, "tokenizer.json"), d)
        cls.models[name] = d

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def ours_logits(self, model, ids, adapter=None, extra=()):
        out = os.path.join(self.tmp, "logits.safetensors")
        args = [PROBE, "logits", "--model", self.models.get(model, model), "--ids", ",".join(map(str, ids)), "--out", out]
        if adapter:
            args += ["--adapter", adapter]
        run(args + list(extra))
        return load_file(out)["logits"]

    def hf_logits(self, model, ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].float()

    def assert_close(self, a, b, tol=1e-4, what=""):
        self.assertEqual(tuple(a.shape), tuple(b.shape), what)
        diff = (a - b).abs().max().item()
        self.assertLess(diff, tol, "%s: max |difference| %.3g" % (what, diff))

    # ------------------------------------------------------------ tokenizer

    def test_tokenizer_matches_hf_tokenizers(self):
        texts = corpus()[:400:3] + UNICODE_LINES + EXTRA_TESTS
        for style, tok in self.toks.items():
            src = os.path.join(self.tmp, "texts.jsonl")
            with open(src, "w", encoding="utf-8") as f:
                for t in texts:
                    f.write(json.dumps(t) + "\n")
            out = os.path.join(self.tmp, "ours.jsonl")
            run([PROBE, "encode", "--model", os.path.join(self.tmp, "tok-" + style), "--in", src, "--out", out])
            with open(out, encoding="utf-8") as f:
                ours = [json.loads(line) for line in f]
            self.assertEqual(len(ours), len(texts))
            mismatches = 0
            for t, o in zip(texts, ours):
                ref = tok.encode(t, add_special_tokens=False).ids
                if o["ids"] != ref:
                    mismatches += 1
                    self.assertEqual(o["ids"], ref, "%s tokenizer, text %r" % (style, t))
                expect = t if style != "qwen2" else __import__("unicodedata").normalize("NFC", t)
                self.assertEqual(o["decoded"], expect, "%s: decode(encode(s)) != s for %r" % (style, t))
                self.assertEqual(o["decoded"], tok.decode(ref, skip_special_tokens=False), style)
            self.assertEqual(mismatches, 0)

    def test_tokenize_cli_and_bad_tokenizer(self):
        p = run([LAUNCH, "tokenize", "--model", self.models["qwen2"], "--prompt", "def f(x): return x", "--json"])
        j = json.loads(p.stdout)
        self.assertEqual(j["token_ids"], self.toks["qwen2"].encode("def f(x): return x", add_special_tokens=False).ids)
        self.assertEqual(j["decoded"], "def f(x): return x")
        bad = os.path.join(self.tmp, "badtok")
        os.makedirs(bad, exist_ok=True)
        with open(os.path.join(self.models["qwen2"], "tokenizer.json")) as f:
            j = json.load(f)
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "_"}
        with open(os.path.join(bad, "tokenizer.json"), "w") as f:
            json.dump(j, f)
        p = run([LAUNCH, "tokenize", "--model", bad, "--prompt", "x"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("pre_tokenizer: type Metaspace is not supported", p.stderr)

    # ------------------------------------------------------------ model

    def test_logits_match_transformers(self):
        ids = [5, 17, 250, 3, 99, 400, 12, 7, 301, 42, 8, 150, 2, 77]
        for name in ["qwen2", "qwen3", "llama", "llama-bf16"]:
            ref_model = AutoModelForCausalLM.from_pretrained(self.models[name], dtype=torch.float32).eval()
            self.assert_close(self.ours_logits(name, ids), self.hf_logits(ref_model, ids), what=name)

    def test_an_unknown_model_type_is_refused_with_its_name(self):
        bad = os.path.join(self.tmp, "mistral")
        shutil.copytree(self.models["qwen2"], bad)
        with open(os.path.join(bad, "config.json")) as f:
            c = json.load(f)
        c["model_type"] = "mistral"
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(c, f)
        p = run([LAUNCH, "generate", "--model", bad, "--prompt", "x", "--max-tokens", "2"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('model_type: "mistral" is not supported (qwen2, qwen3 or llama)', p.stderr)

    def test_lora_kernelrl_to_peft_and_back(self):
        from peft import LoraConfig, PeftModel, get_peft_model

        ids = [9, 40, 200, 31, 5, 88, 123, 64, 1, 19]
        base = AutoModelForCausalLM.from_pretrained(self.models["qwen2"], dtype=torch.float32).eval()
        base_logits = self.hf_logits(base, ids)
        # Ours -> PEFT.
        ours_dir = os.path.join(self.tmp, "lora-ours")
        run([PROBE, "lora-init", "--model", self.models["qwen2"], "--rank", "4", "--alpha", "8",
             "--targets", "q_proj,v_proj,o_proj,up_proj,down_proj", "--seed", "3", "--b-std", "0.2", "--out", ours_dir])
        with open(os.path.join(ours_dir, "adapter_config.json")) as f:
            self.assertEqual(json.load(f)["peft_type"], "LORA")
        peft_model = PeftModel.from_pretrained(base, ours_dir).eval()
        ref = self.hf_logits(peft_model, ids)
        self.assertGreater((ref - base_logits).abs().max().item(), 1e-2, "the adapter must change the logits")
        self.assert_close(self.ours_logits("qwen2", ids, adapter=ours_dir), ref, what="kernelrl adapter in PEFT")
        # The same adapter arriving as a WeightsUpdate on a policy with a fresh adapter.
        out = os.path.join(self.tmp, "upd.safetensors")
        run([PROBE, "update", "--model", self.models["qwen2"], "--rank", "4", "--alpha", "8",
             "--targets", "q_proj,v_proj,o_proj,up_proj,down_proj", "--from", ours_dir,
             "--ids", ",".join(map(str, ids)), "--out", out])
        self.assert_close(load_file(out)["logits"], ref, what="weights update")
        # PEFT -> ours (random B, rslora, a per-module rank).
        llama = AutoModelForCausalLM.from_pretrained(self.models["llama"], dtype=torch.float32).eval()
        cfg = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"],
                         init_lora_weights=False, use_rslora=True, rank_pattern={"down_proj": 2})
        pm = get_peft_model(llama, cfg).eval()
        peft_dir = os.path.join(self.tmp, "lora-peft")
        pm.save_pretrained(peft_dir)
        ref = self.hf_logits(pm, ids)
        self.assert_close(self.ours_logits("llama", ids, adapter=peft_dir), ref, what="PEFT adapter in kernelrl")
        # Merged export loads in plain transformers.
        merged = os.path.join(self.tmp, "merged")
        run([LAUNCH, "merge", "--model", self.models["llama"], "--adapter", peft_dir, "--out", merged])
        plain = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
        self.assert_close(self.hf_logits(plain, ids), ref, what="merged export")
        # A folder that holds files is not overwritten without --force; the model's own never.
        for out, why in ((merged, "already holds files"), (self.models["llama"], "is the --model folder"),
                         (peft_dir, "is the --adapter folder")):
            p = run([LAUNCH, "merge", "--model", self.models["llama"], "--adapter", peft_dir, "--out", out], check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(why, p.stderr)
        run([LAUNCH, "merge", "--model", self.models["llama"], "--adapter", peft_dir, "--out", merged, "--force"])

    def test_bad_adapter_is_a_clear_error(self):
        d = os.path.join(self.tmp, "lora-bad")
        run([PROBE, "lora-init", "--model", self.models["qwen2"], "--rank", "4", "--alpha", "8",
             "--targets", "q_proj", "--seed", "1", "--out", d])
        with open(os.path.join(d, "adapter_config.json")) as f:
            c = json.load(f)
        c["use_dora"] = True
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump(c, f)
        p = run([LAUNCH, "score", "--model", self.models["qwen2"], "--adapter", d, "--prompt", "a", "--completion", "b"],
                check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("use_dora: DoRA adapters are not supported", p.stderr)

    def test_broken_safetensors_are_clear_errors(self):
        src = self.models["qwen2"]
        cases = {}
        with open(os.path.join(src, "model.safetensors"), "rb") as f:
            data = f.read()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        cases["truncated"] = (data[: len(data) // 2], "past the end of the data")
        lying = dict(header)
        name = next(k for k in header if k != "__metadata__")
        lying[name] = dict(header[name], shape=[header[name]["shape"][0] * 2] + header[name]["shape"][1:])
        h = json.dumps(lying).encode()
        cases["lying"] = (len(h).to_bytes(8, "little") + h + data[8 + n:], "its dtype and shape need")
        cases["tiny"] = (b"\x05\x00", "not even the 8-byte header length")
        cases["garbage header"] = ((1 << 40).to_bytes(8, "little") + b"{}", "over the 100 MiB limit")
        for what, (content, message) in cases.items():
            d = os.path.join(self.tmp, "broken")
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(src, d)
            with open(os.path.join(d, "model.safetensors"), "wb") as f:
                f.write(content)
            p = run([LAUNCH, "score", "--model", d, "--prompt", "a", "--completion", "b"], check=False)
            self.assertEqual(p.returncode, 2, what)
            self.assertIn("model.safetensors: ", p.stderr, what)
            self.assertIn(message, p.stderr, what)

    # ------------------------------------------------------------ sampling and scoring

    def generate(self, prompts, *extra, model="qwen2"):
        args = [LAUNCH, "generate", "--model", self.models[model], "--json"]
        for p in prompts:
            args += ["--prompt", p]
        return json.loads(run(args + list(extra)).stdout)["completions"]

    def test_greedy_generation_matches_transformers(self):
        tok = self.toks["qwen2"]
        prompts = ["def relu(x):", "Write a CUDA kernel that adds two vectors of floats and", "x"]
        # Qwen3 (q/k norms) through the KV cache too: its greedy tokens are transformers'.
        q3 = AutoModelForCausalLM.from_pretrained(self.models["qwen3"], dtype=torch.float32).eval()
        for prompt, c in zip(prompts, self.generate(prompts, "--temperature", "0", "--max-tokens", "12",
                                                    model="qwen3")):
            ids = tok.encode(prompt, add_special_tokens=False).ids
            with torch.no_grad():
                out = q3.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12,
                                  attention_mask=torch.ones(1, len(ids), dtype=torch.long))
            self.assertEqual(c["token_ids"], out[0, len(ids):].tolist()[: len(c["token_ids"])], "qwen3: " + prompt)
        ref_model = AutoModelForCausalLM.from_pretrained(self.models["qwen2"], dtype=torch.float32).eval()
        # --json names the decode step that ran: on the CPU, LibTorch ops without graphs.
        full = json.loads(run([LAUNCH, "generate", "--model", self.models["qwen2"], "--json", "--prompt", "x",
                               "--max-tokens", "2"]).stdout)
        self.assertEqual(full["decode_path"], "eager")
        ours = self.generate(prompts, "--temperature", "0", "--max-tokens", "12")
        self.assertEqual(len(ours), 3)
        for prompt, c in zip(prompts, ours):
            ids = tok.encode(prompt, add_special_tokens=False).ids
            with torch.no_grad():
                out = ref_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12,
                                         attention_mask=torch.ones(1, len(ids), dtype=torch.long))
            ref = out[0, len(ids):].tolist()
            self.assertEqual(c["token_ids"], ref[: len(c["token_ids"])], prompt)
            self.assertEqual(c["finish_reason"], "stop" if len(c["token_ids"]) < 12 else "length")
            # Logprobs from sampling equal scoring the same tokens.
            # Through a file: a random model's text may hold bytes (NUL) no argv can carry.
            comp = os.path.join(self.tmp, "completion.txt")
            with open(comp, "w", encoding="utf-8") as f:
                f.write(tok.decode(c["token_ids"], skip_special_tokens=False))
            s = json.loads(run([LAUNCH, "score", "--model", self.models["qwen2"], "--prompt", prompt,
                                "--completion-file", comp, "--json"]).stdout)
            if s["token_ids"] == c["token_ids"]:
                for a, b in zip(s["logprobs"], c["logprobs"]):
                    self.assertAlmostEqual(a, b, delta=1e-4)

    def test_fixed_shape_decode_step_equals_eager(self):
        # The CUDA-graph decode step (attention over a length bucket of the cache under a mask,
        # index_copy into the cache, the token drawn inside the step), run op by op here on the
        # CPU, gives the same tokens and logprobs as the eager step: greedy, and sampled from the
        # same seed (both draw the same random numbers in the same order). 150 tokens cross the
        # first 128-key bucket; the models have grouped-query attention (2 and 4 heads per kv head).
        prompts = ["def relu(x):", "Write a CUDA kernel that adds two vectors of floats and", "x"]
        for model, sampling in (("llama", ["--temperature", "0"]), ("qwen2", ["--temperature", "1", "--seed", "5"])):
            args = [LAUNCH, "generate", "--model", self.models[model], "--json", "--max-tokens", "150", *sampling]
            for p in prompts:
                args += ["--prompt", p]
            eager = json.loads(run(args).stdout)["completions"]
            env = dict(os.environ, KERNELRL_CUDA_GRAPHS="static")
            p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            static = json.loads(p.stdout)["completions"]
            self.assertGreater(max(len(a["token_ids"]) for a in eager), 120, model)
            for a, b in zip(eager, static):
                self.assertEqual(a["token_ids"], b["token_ids"], model)
                for x, y in zip(a["logprobs"], b["logprobs"]):
                    self.assertAlmostEqual(x, y, delta=1e-4)

    def test_rows_of_the_cache_change_no_greedy_token(self):
        # Greedy completions do not depend on how sequences share the key-value cache: all at once,
        # one, two or three rows at a time (a stop string ends some sequences early, so a finished
        # sequence's row takes the next waiting one mid-generation), or n samples of each prompt
        # sharing its prefill. Prompts of different lengths: each row has its own positions.
        prompts = ["def relu(x):", "Write a CUDA kernel that adds two vectors of floats and", "x", "__global__ void"]
        greedy = ["--temperature", "0", "--max-tokens", "40"]
        free = self.generate(prompts, *greedy)
        text = free[0]["text"]
        starts = [i for i in range(4, len(text) - 2) if all(" " < ch < "\x7f" for ch in text[i:i + 2])]
        self.assertTrue(starts, "no ASCII run in the greedy text %r" % text)
        stop = ["--stop", text[starts[0]:starts[0] + 2]]
        base = self.generate(prompts, *greedy, *stop)
        self.assertEqual(base[0]["finish_reason"], "stop")
        self.assertLess(len(base[0]["token_ids"]), 40)
        for rows in ("1", "2", "3"):
            got = self.generate(prompts, *greedy, *stop, "--max-rows", rows)
            for a, b in zip(base, got):
                self.assertEqual(a["token_ids"], b["token_ids"], rows)
                self.assertEqual(a["finish_reason"], b["finish_reason"], rows)
                for x, y in zip(a["logprobs"], b["logprobs"]):
                    self.assertAlmostEqual(x, y, delta=1e-4)
        shared = self.generate(prompts, *greedy, *stop, "--n", "3", "--max-rows", "5")
        self.assertEqual(len(shared), 12)
        for i, c in enumerate(shared):
            self.assertEqual(c["prompt_index"], i // 3)
            self.assertEqual(c["token_ids"], base[i // 3]["token_ids"])

    def test_sampled_logprobs_equal_transformers_when_rows_are_reused(self):
        # Sampling with fewer rows than sequences (rows taken over mid-generation) and shared
        # prefills: every reported logprob equals transformers' full forward pass over the same
        # prefix at the same temperature; the same seed gives the same tokens.
        tok = self.toks["llama3"]
        ref_model = AutoModelForCausalLM.from_pretrained(self.models["llama"], dtype=torch.float32).eval()
        prompts = ["__global__ void add(float* a)", "def f(x):", "x = torch.relu("]
        args = ["--temperature", "0.8", "--seed", "3", "--n", "2", "--max-tokens", "24", "--max-rows", "4"]
        a = self.generate(prompts, *args, model="llama")
        b = self.generate(prompts, *args, model="llama")
        self.assertEqual([c["token_ids"] for c in a], [c["token_ids"] for c in b])
        self.assertEqual(len(a), 6)
        for c in a:
            p_ids = tok.encode(prompts[c["prompt_index"]], add_special_tokens=False).ids
            ids = p_ids + c["token_ids"]
            logits = self.hf_logits(ref_model, ids)[len(p_ids) - 1: -1] / 0.8
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c["token_ids"])[:, None])[:, 0]
            self.assert_close(torch.tensor(c["logprobs"]), ref, what="sampled logprobs")

    def test_score_matches_transformers(self):
        tok = self.toks["llama3"]
        prompt, completion = "__global__ void add(float* a)", " { a[threadIdx.x] += 1.0f; }"
        s = json.loads(run([LAUNCH, "score", "--model", self.models["llama"], "--prompt", prompt,
                            "--completion", completion, "--temperature", "0.7", "--json"]).stdout)
        p_ids = tok.encode(prompt, add_special_tokens=False).ids
        c_ids = tok.encode(completion, add_special_tokens=False).ids
        self.assertEqual(s["prompt_ids"], p_ids)
        self.assertEqual(s["token_ids"], c_ids)
        model = AutoModelForCausalLM.from_pretrained(self.models["llama"], dtype=torch.float32).eval()
        logits = self.hf_logits(model, p_ids + c_ids)[len(p_ids) - 1: -1] / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c_ids)[:, None])[:, 0]
        self.assert_close(torch.tensor(s["logprobs"]), ref, what="score")

    def test_sampling_seed_top_p_and_stop(self):
        prompts = ["def f(x):", "hello"]
        a = self.generate(prompts, "--temperature", "1.0", "--top-p", "0.9", "--seed", "11", "--n", "3", "--max-tokens", "16")
        b = self.generate(prompts, "--temperature", "1.0", "--top-p", "0.9", "--seed", "11", "--n", "3", "--max-tokens", "16")
        c = self.generate(prompts, "--temperature", "1.0", "--top-p", "0.9", "--seed", "12", "--n", "3", "--max-tokens", "16")
        self.assertEqual(len(a), 6)
        self.assertEqual([x["token_ids"] for x in a], [x["token_ids"] for x in b])
        self.assertNotEqual([x["token_ids"] for x in a], [x["token_ids"] for x in c])
        self.assertEqual([x["prompt_index"] for x in a], [0, 0, 0, 1, 1, 1])
        for x in a:
            self.assertEqual(len(x["logprobs"]), len(x["token_ids"]))
            self.assertTrue(all(lp <= 0 for lp in x["logprobs"]))
        # A stop string taken from greedy output cuts the text before it. It is taken from plain
        # ASCII: U+FFFD in the text stands for bytes of a partial character, which no stop matches.
        g = self.generate(["def f(x):"], "--temperature", "0", "--max-tokens", "20")[0]
        text = g["text"]
        starts = [i for i in range(1, len(text) - 2) if all(" " < ch < "\x7f" for ch in text[i:i + 3])]
        self.assertTrue(starts, "no ASCII run in the greedy text %r" % text)
        stop = text[starts[0]:starts[0] + 3]
        s = self.generate(["def f(x):"], "--temperature", "0", "--max-tokens", "20", "--stop", stop)[0]
        self.assertEqual(s["finish_reason"], "stop")
        self.assertEqual(s["text"], text[: text.find(stop)])
        self.assertLess(len(s["token_ids"]), len(g["token_ids"]) + 1)

    def test_bad_arguments(self):
        p = run([LAUNCH, "generate", "--model", os.path.join(self.tmp, "nope"), "--prompt", "x"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a directory", p.stderr)
        p = run([LAUNCH, "generate", "--model", self.models["qwen2"], "--prompt", "x", "--top-p", "0"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--top-p", p.stderr)
        p = run([LAUNCH, "score", "--model", self.models["qwen2"], "--prompt", "x"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--completion", p.stderr)


if __name__ == "__main__":
    unittest.main()


def start_openai_server(log, *extra):
    """tests/fixtures/openai_server.py on loopback, logging requests to `log`: (its process, its port)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "fixtures", "openai_server.py"), log, *extra],
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


class ServerTestCase(unittest.TestCase):
    """A class of tests sharing one tests/fixtures/openai_server.py on loopback: cls.url, its request log
    cls.log, and a scratch folder cls.tmp."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-%s-" % cls.__name__)
        cls.log = os.path.join(cls.tmp, "requests.jsonl")
        cls.server, port = start_openai_server(cls.log)
        cls.url = "http://127.0.0.1:%s" % port

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.server.wait()
        cls.server.stdout.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)


class OpenAIBackendTest(ServerTestCase):
    """`launch generate --server` against tests/fixtures/openai_server.py on loopback."""

    def gen(self, model, *extra, check=True):
        return run([LAUNCH, "generate", "--server", self.url, "--served-model", model, "--json",
                    "--prompt", "first prompt", "--prompt", "second prompt"] + list(extra), check=check)

    def requests(self):
        with open(self.log) as f:
            return [json.loads(line) for line in f]

    def test_completions_with_logprobs_and_token_ids(self):
        p = self.gen("ok", "--n", "2", "--temperature", "0.7", "--top-p", "0.9", "--seed", "5", "--max-tokens", "33",
                     "--stop", "###")
        c = json.loads(p.stdout)["completions"]
        self.assertNotIn("decode_path", json.loads(p.stdout))  # a server's step is not ours to name
        self.assertEqual(len(c), 4)
        self.assertEqual([x["prompt_index"] for x in c], [0, 0, 1, 1])
        self.assertTrue(c[2]["text"].startswith("echo 1/0"))
        self.assertEqual(len(c[0]["token_ids"]), len(c[0]["logprobs"]))
        self.assertEqual(c[0]["token_ids"][0], 100)
        req = [r for r in self.requests() if r["body"].get("model") == "ok"][-1]["body"]
        self.assertEqual((req["n"], req["temperature"], req["top_p"], req["seed"], req["max_tokens"], req["stop"]),
                         (2, 0.7, 0.9, 5, 33, ["###"]))
        self.assertEqual(req["prompt"], ["first prompt", "second prompt"])

    def test_weights_updates_hot_load_lora_adapters(self):
        from peft import PeftConfig

        d = tempfile.mkdtemp(prefix="model-", dir=self.tmp)
        tok = train_tokenizer("gpt2", os.path.join(d, "tokenizer.json"))
        Qwen2ForCausalLM(Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).save_pretrained(d)
        adapter = os.path.join(self.tmp, "adapter")
        run([PROBE, "lora-init", "--model", d, "--rank", "2", "--alpha", "8", "--targets", "q_proj,v_proj",
             "--seed", "1", "--b-std", "0.1", "--out", adapter])
        root = os.path.join(self.tmp, "served-adapters")
        p = run([PROBE, "hotload", "--server", self.url, "--served-model", "base", "--model", d, "--adapter", adapter,
                 "--versions", "3,4", "--adapter-root", root])
        lines = [json.loads(x) for x in p.stdout.splitlines()]
        self.assertEqual([(x["version"], x["sample_version"]) for x in lines], [(3, 3), (4, 4)])
        self.assertIn("return x", lines[0]["text"])  # the server answered as the loaded adapter
        reqs = self.requests()
        loads = [r["body"] for r in reqs if r["path"] == "/v1/load_lora_adapter"]
        self.assertEqual([x["lora_name"] for x in loads][-2:], ["kernelrl-v3", "kernelrl-v4"])
        self.assertEqual([r["body"]["lora_name"] for r in reqs if r["path"] == "/v1/unload_lora_adapter"][-1:],
                         ["kernelrl-v3"])
        models = [r["body"]["model"] for r in reqs if r["path"] == "/v1/completions"][-2:]
        self.assertEqual(models, ["kernelrl-v3", "kernelrl-v4"])
        c = PeftConfig.from_pretrained(os.path.join(root, "kernelrl-v4"))  # PEFT reads what the server got
        self.assertEqual((c.r, c.lora_alpha, sorted(c.target_modules)), (2, 8, ["q_proj", "v_proj"]))

    def test_5xx_answers_are_retried(self):
        p = self.gen("fail-2", "--retries", "3")
        self.assertEqual(len(json.loads(p.stdout)["completions"]), 2)
        self.assertIn("HTTP 503", p.stderr)
        p = self.gen("fail-9", "--retries", "1", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("gave up after 2 attempts", p.stderr)

    def test_timeouts_and_broken_answers_are_clear_errors(self):
        p = self.gen("slow-3", "--timeout", "0.5", "--retries", "0", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("timed out", p.stderr)
        p = self.gen("nologprobs", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("returned no logprobs", p.stderr)
        p = self.gen("badjson", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("the answer is not JSON", p.stderr)
        p = run([LAUNCH, "generate", "--server", "http://127.0.0.1:1", "--served-model", "x", "--prompt", "a",
                 "--retries", "0"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("cannot connect", p.stderr)
        # https is spoken (libcurl); a host that does not exist is said to be one.
        p = run([LAUNCH, "generate", "--server", "https://no-such-host.invalid", "--served-model", "x", "--prompt", "a",
                 "--retries", "0", "--timeout", "10"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("cannot resolve the host", p.stderr)
        p = run([LAUNCH, "generate", "--server", "ftp://127.0.0.1:1", "--served-model", "x", "--prompt", "a"],
                check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("expected http://HOST[:PORT][/PATH] or https://", p.stderr)


class HttpsTest(unittest.TestCase):
    """The OpenAI-compatible backend over https (libcurl): a server with a self-signed certificate is
    refused until that certificate is trusted (CURL_CA_BUNDLE), then answers as over http."""

    def test_https_with_a_trusted_certificate_and_refused_without(self):
        with tempfile.TemporaryDirectory() as d:
            cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                           check=True, capture_output=True)
            server, port = start_openai_server(os.path.join(d, "log.jsonl"), "--tls", cert, key)
            try:
                url = "https://127.0.0.1:%s" % port
                args = [LAUNCH, "generate", "--server", url, "--served-model", "ok", "--json", "--prompt", "a",
                        "--retries", "0"]
                env = {k: v for k, v in os.environ.items() if k != "CURL_CA_BUNDLE"}
                p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
                self.assertEqual(p.returncode, 2)
                self.assertIn("TLS failed", p.stderr)
                p = subprocess.run(args, capture_output=True, text=True, env=dict(env, CURL_CA_BUNDLE=cert), timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(len(json.loads(p.stdout)["completions"]), 1)
            finally:
                server.kill()
                server.wait()
                server.stdout.close()


def write_config(tmp, sampler, policy="", tasks='ids = ["06_swish", "07_hardtanh_scale"]', experiment=""):
    path = os.path.join(tmp, "run-%d.toml" % len(os.listdir(tmp)))
    with open(path, "w") as f:
        f.write("""
[cluster]
name = "policy-test"
[[node]]
name = "local"
roles = ["supervisor", "learner", "sampler", "evaluator", "monitor"]
cpu_slots = 1
[tasks]
dir = "%s"
%s
[policy]
%s
[sampler]
%s
[evaluator]
timeout_s = 60
[experiment]
name = "policy-test"
run_root = "%s"
%s
[monitor]
progress = false
""" % (os.path.join(ROOT, "tasks", "bundled"), tasks, policy, sampler, os.path.join(tmp, "runs"), experiment))
    return path


def run_and_export(config):
    run_dir = tempfile.mkdtemp(prefix="run-", dir=os.path.dirname(config))
    p = run([LAUNCH, config, "--run-dir", run_dir], check=False)
    if p.returncode != 0:
        raise AssertionError("launch %s failed (%d):\n%s" % (config, p.returncode, p.stderr[-3000:]))
    out = run([LAUNCH, "export", run_dir, "--jsonl"]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()], p


class SamplerRunTest(ServerTestCase):
    """`launch CONFIG` with the openai and libtorch sampler backends: prompts from tasks through the
    chat template, samples through the evaluator into the store with their tokens and logprobs."""

    def test_openai_backend_samples_are_evaluated_and_stored(self):
        cfg = write_config(self.tmp, 'backend = "openai"\nurl = "%s"\nserved_model = "kernel"\nsamples_per_task = 2\n'
                                     'batch_prompts = 1\ntemperature = 0.8\nmax_tokens = 300' % self.url,
                           policy='template = "chatml"\nsystem = "Be fast."')
        samples, _ = run_and_export(cfg)
        self.assertEqual(len(samples), 4)
        self.assertEqual(sorted(s["task_id"] for s in samples), ["06_swish"] * 2 + ["07_hardtanh_scale"] * 2)
        for s in samples:
            self.assertEqual(s["status"], "ok", s.get("error"))
            self.assertTrue(s["prompt"].startswith("<|im_start|>system\nBe fast.<|im_end|>\n<|im_start|>user\n"))
            self.assertTrue(s["prompt"].endswith("<|im_start|>assistant\n"))
            self.assertIn("class Model", s["prompt"])
            self.assertEqual(len(s["logprobs"]), len(s["token_ids"]))
        with open(self.log) as f:
            reqs = [json.loads(line)["body"] for line in f if '"kernel"' in line]
        self.assertEqual([len(r["prompt"]) for r in reqs], [1, 1])  # batch_prompts = 1: one prompt a request
        self.assertEqual(reqs[0]["n"], 2)

    def test_libtorch_backend_runs_a_step_with_a_tiny_model(self):
        d = os.path.join(self.tmp, "tiny")
        t = train_tokenizer("qwen2", os.path.join(self.tmp, "tokenizer.json"))
        torch.manual_seed(1)
        m = Qwen2ForCausalLM(Qwen2Config(vocab_size=t.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         initializer_range=0.3))
        m.save_pretrained(d)
        shutil.copy(os.path.join(self.tmp, "tokenizer.json"), d)
        cfg = write_config(self.tmp, 'backend = "libtorch"\nsamples_per_task = 3\nmax_tokens = 24\nseed = 4',
                           policy='model = "%s"\ndtype = "f32"\ndevice = "cpu"\ntemplate = "plain"' % d,
                           tasks='ids = ["06_swish"]')
        samples, p = run_and_export(cfg)
        self.assertEqual(len(samples), 3)
        for s in samples:
            self.assertEqual(s["policy_version"], 0)
            self.assertGreater(len(s["token_ids"]), 0)
            self.assertEqual(len(s["logprobs"]), len(s["token_ids"]))
            self.assertEqual(s["completion"], t.decode(s["token_ids"], skip_special_tokens=True)[: len(s["completion"])])
            self.assertIn(s["status"], ["format_error", "compile_error", "runtime_error", "incorrect"])
        self.assertEqual(len({tuple(s["token_ids"]) for s in samples}), 3, "three different samples")

    def test_backend_config_errors(self):
        cfg = write_config(self.tmp, 'backend = "libtorch"')
        p = run([LAUNCH, "check", cfg], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("sampler.backend: the libtorch backend needs [policy] model", p.stderr + p.stdout)
        cfg = write_config(self.tmp, 'backend = "openai"\nurl = "ftp://x:1"')
        p = run([LAUNCH, "check", cfg], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn('sampler.url: expected "http://HOST:PORT[/PATH]" or "https://', p.stderr + p.stdout)
        self.assertIn("served_model", p.stderr + p.stdout)
        cfg = write_config(self.tmp, 'backend = "openai"\nurl = "https://x:1"\nserved_model = "m"')
        p = run([LAUNCH, "check", cfg], check=False)
        self.assertNotIn("sampler.url", p.stderr + p.stdout)
