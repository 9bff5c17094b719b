"""A small OpenAI-compatible test server (the parts of vLLM's API kernelrl uses), on loopback.

    python3 tests/openai_server.py LOG_FILE   -> prints its port on the first line of stdout

/v1/completions answers every prompt with n choices (index = prompt * n + sample); the served
model name picks a behaviour: "ok"; "fail-K" (the first K requests get HTTP 503); "slow-S" (waits S
seconds before answering); "nologprobs" (choices without logprobs); "badjson" (not JSON);
"kernel" (the text is a correct forward body: the reference Model.forward's own body, read from
the KernelBench program in the prompt).
/v1/load_lora_adapter and /v1/unload_lora_adapter check the adapter directory and record it; a
loaded adapter's name is then accepted as a model. Every request is appended to LOG_FILE as JSON.

    python3 tests/openai_server.py LOG_FILE --policy MODEL_DIR

adds a real policy restricted to a menu: model "menu" (the base model) and every loaded adapter
(PEFT, on that model) answer each prompt with one of three bodies (the reference body: correct;
"return None": wrong; prose: a format error), drawn with probability proportional to
exp(4 x the policy's mean token logprob of that text) (its tokens and an end-of-sequence token,
at the request's temperature), so that what the policy learns changes what it answers. token ids and logprobs are the policy's own, computed with transformers + PEFT, so
a learner that recomputes them must find the same numbers. The draw depends only on the
prompt, the sample index and the adapter, so a run resumed after a crash draws what the
uninterrupted run drew. --delay NAME:SECONDS holds completions for model NAME that long.
"""
import ast
import json
import os
import re
import textwrap
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = sys.argv[1]
POLICY = sys.argv[sys.argv.index("--policy") + 1] if "--policy" in sys.argv else None
# --delay NAME:SECONDS: completions for model NAME wait that long (a run to be killed mid-step).
DELAY = dict([sys.argv[sys.argv.index("--delay") + 1].rsplit(":", 1)]) if "--delay" in sys.argv else {}
lock = threading.Lock()
counts = {}
adapters = set()
policies = {}  # adapter name -> PEFT model ("menu": the base model)


def load_policy(name, path=None):
    import copy
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if "menu" not in policies:
        base = AutoModelForCausalLM.from_pretrained(POLICY, dtype=torch.float32).eval()
        policies["menu"] = base
        policies["tokenizer"] = AutoTokenizer.from_pretrained(POLICY)
    if path:
        from peft import PeftModel
        policies[name] = PeftModel.from_pretrained(copy.deepcopy(policies["menu"]), path).eval()


def menu_choice(model, prompt, index, temperature):
    """(text, token ids, logprobs) of one draw from the menu under policy `model`."""
    import random
    import torch
    tok, m = policies["tokenizer"], policies[model]
    eos = m.config.eos_token_id
    body = reference_body(prompt)
    menu = ["Here it is.\n```python\n%s\n```" % body, "Here it is.\n```python\nreturn None\n```",
            "I would rather not write this kernel."]
    t = temperature if temperature and temperature > 0 else 1.0
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    scored = []
    for text in menu:
        c_ids = tok(text, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        ids = torch.tensor([p_ids + c_ids])
        with torch.no_grad():
            logits = m(input_ids=ids).logits[0, :-1].float() / t
        lp = torch.log_softmax(logits, -1)[len(p_ids) - 1:].gather(-1, torch.tensor(c_ids)[:, None])[:, 0]
        scored.append((text, c_ids, lp.tolist()))
    # Length-normalised: a tiny random model would otherwise always pick the shortest text.
    weights = torch.softmax(4 * torch.tensor([sum(x[2]) / len(x[2]) for x in scored], dtype=torch.float64), 0).tolist()
    rng = random.Random("%s|%d|%s" % (prompt, index, model))
    return scored[rng.choices(range(len(menu)), weights=weights)[0]]


def reference_body(prompt):
    """Model.forward's body from the ```python block of a kernelrl prompt."""
    m = re.search(r"```python\n(.*?)\n```", prompt, re.DOTALL)
    if not m:
        return "return None"
    src = m.group(1)
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == "forward":
                    lines = src.splitlines()[f.body[0].lineno - 1: f.end_lineno]
                    return textwrap.dedent("\n".join(lines))
    return "return None"


def log(entry):
    with lock, open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body, chunked=False):
        try:
            self.send(status, body, chunked)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout tests)
            pass

    def send(self, status, body, chunked):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 7):
                part = data[i:i + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        log({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if self.path == "/v1/load_lora_adapter":
            path = body.get("lora_path", "")
            ok = os.path.isfile(os.path.join(path, "adapter_config.json")) and \
                os.path.isfile(os.path.join(path, "adapter_model.safetensors"))
            if not ok:
                return self.reply(400, {"error": {"message": "no adapter at " + path}})
            if POLICY:
                with lock:
                    load_policy(body["lora_name"], path)
            adapters.add(body["lora_name"])
            return self.reply(200, b"Success: LoRA adapter loaded")
        if self.path == "/v1/unload_lora_adapter":
            adapters.discard(body.get("lora_name"))
            return self.reply(200, b"Success")
        if self.path != "/v1/completions":
            return self.reply(404, {"error": {"message": "no route " + self.path}})
        model = body.get("model", "")
        with lock:
            counts[model] = counts.get(model, 0) + 1
            seen = counts[model]
        if model.startswith("fail-") and seen <= int(model[5:]):
            return self.reply(503, {"error": {"message": "overloaded, try again"}})
        if model.startswith("slow-"):
            time.sleep(float(model[5:]))
        if model == "badjson":
            return self.reply(200, b"<html>not json</html>")
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        n = body.get("n", 1)
        choices = []
        if model in DELAY:
            time.sleep(float(DELAY[model]))
        if POLICY and (model == "menu" or model in adapters):
            with lock:
                if model == "menu" and "menu" not in policies:
                    load_policy("menu")
                for i, p in enumerate(prompts):
                    for j in range(n):
                        text, ids, lps = menu_choice(model, p, j, body.get("temperature", 1.0))
                        choices.append({"index": i * n + j, "text": text, "finish_reason": "stop",
                                        "logprobs": {"tokens": ["token_id:%d" % x for x in ids], "token_logprobs": lps,
                                                     "top_logprobs": None, "text_offset": [0] * len(ids)}})
            return self.reply(200, {"id": "cmpl-test", "object": "text_completion", "model": model,
                                    "choices": choices})
        for i, p in enumerate(prompts):
            for j in range(n):
                if model == "kernel" or model in adapters:
                    text = "Here it is.\n```python\n%s\n```" % reference_body(p)
                else:
                    text = "echo %d/%d: %s" % (i, j, p[-12:])
                toks = ["token_id:%d" % (100 + k) for k in range(len(text) // 4 + 1)]
                c = {"index": i * n + j, "text": text, "finish_reason": "stop"}
                if model != "nologprobs":
                    c["logprobs"] = {"tokens": toks, "token_logprobs": [-0.25] * len(toks),
                                     "top_logprobs": None, "text_offset": [0] * len(toks)}
                else:
                    c["logprobs"] = None
                choices.append(c)
        self.reply(200, {"id": "cmpl-test", "object": "text_completion", "model": model, "choices": choices},
                   chunked=(seen % 2 == 0))


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
