"""A small OpenAI-compatible test server (the parts of vLLM's API kernelrl uses), on loopback.

    python3 tests/openai_server.py LOG_FILE   -> prints its port on the first line of stdout

/v1/completions answers every prompt with n choices (index = prompt * n + sample); the served
model name picks a behaviour: "ok"; "fail-K" (the first K requests get HTTP 503); "slow-S" (waits S
seconds before answering); "nologprobs" (choices without logprobs); "badjson" (not JSON);
"kernel" (the text is a correct forward body: the reference Model.forward's own body, read from
the KernelBench program in the prompt).
/v1/load_lora_adapter and /v1/unload_lora_adapter check the adapter directory and record it; a
loaded adapter's name is then accepted as a model. Every request is appended to LOG_FILE as JSON.
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
lock = threading.Lock()
counts = {}
adapters = set()


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
