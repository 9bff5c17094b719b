"""`launch serve CONFIG`: the evaluator as an HTTP/JSON service, started as a user starts it.

- Each answer is the record the service's store keeps: equal, field for field, to `launch export`'s line
  for that sample, and the verdicts are the ones the bundled candidates are labelled with (tasks/replay's
  expect_status), across CPU evaluators, in parallel, on kept-alive and pipelined connections.
- Bad requests (not HTTP, not JSON, wrong fields or types, unknown tasks, a body over the limit, wrong
  methods and paths, chunked bodies) are answered 4xx with their reason and never reach an evaluator; a
  candidate that kills its own process is a verdict (200), not a failure of the service; a client that
  hangs up before its verdict loses nothing (the verdict is stored). The server answers after all of it.
- The Python package (`pip install ./python`): the client, the TRL reward function called as GRPOTrainer
  calls it (plain and conversational completions, the dataset's task column), verl's compute_score and
  its batch form, and the TRL example's dataset rows.
- In a cluster, the evaluators of a node that joins the service (`launch CONFIG --node NAME`) answer.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cluster import cluster_head, free_port  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
REPLAY = os.path.join(ROOT, "tasks", "replay")
CONFIG = os.path.join(ROOT, "configs", "replay.toml")


def replay_records(n_tasks=6):
    out = []
    for name in sorted(os.listdir(REPLAY))[:n_tasks]:
        with open(os.path.join(REPLAY, name)) as f:
            out += [json.loads(line) for line in f]
    return out


def start_serve(args, env=None, timeout=90):
    """`launch serve ARGS --port 0`; (process, port) once it prints its address."""
    p = subprocess.Popen([LAUNCH, "serve"] + args + ["--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, errors="replace", env=env)
    lines = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=p.stdout.read, daemon=True).start()  # keep draining
            threading.Thread(target=p.stderr.read, daemon=True).start()
            return p, int(m.group(1))
    p.kill()
    raise AssertionError("launch serve did not start: %s%s" % ("".join(lines), p.stderr.read()))


def call(port, method, path, body=None, raw=None, headers=None, timeout=120):
    """(status, parsed JSON answer)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method,
                                 headers=dict({"Content-Type": "application/json"}, **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def raw_exchange(port, data, timeout=30):
    """Bytes sent on one connection; everything the server sent back until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def export(run_dir):
    p = subprocess.run([LAUNCH, "export", run_dir, "--jsonl"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return {r["sample_id"]: r for r in map(json.loads, p.stdout.splitlines())}


class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kernelrl-serve-")
        cls.run_dir = os.path.join(cls.tmp, "run")
        cls.proc, cls.port = start_serve([CONFIG, "--run-dir", cls.run_dir, "--max-body-mb", "0.05"])

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        cls.rc = cls.proc.wait(timeout=60)

    def test_answers_are_the_stored_records_with_the_labelled_verdicts(self):
        status, health = call(self.port, "GET", "/v1/health")
        self.assertEqual(status, 200)
        self.assertEqual((health["action_space"], health["evaluators"]), ("forward_body", 2))
        status, tasks = call(self.port, "GET", "/v1/tasks")
        ids = {t["id"] for t in tasks["tasks"]}
        self.assertEqual(ids, {n[:-3] for n in os.listdir(os.path.join(ROOT, "tasks", "bundled")) if n.endswith(".py")})
        self.assertTrue(all("class Model" in t["prompt"] for t in tasks["tasks"]))

        records = replay_records()
        answers = [None] * len(records)

        def one(i):  # every request at once, each on its own connection
            answers[i] = call(self.port, "POST", "/v1/evaluate",
                              {"task": records[i]["task_id"], "action": records[i]["completion"], "id": "r%d" % i})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(records))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stored = export(self.run_dir)
        for i, (rec, (status, ans)) in enumerate(zip(records, answers)):
            with self.subTest(task=rec["task_id"], label=rec["label"]):
                self.assertEqual(status, 200, ans)
                self.assertEqual(ans.pop("request_id"), "r%d" % i)
                self.assertEqual(ans["status"], rec["expect_status"], ans["error"])
                self.assertEqual(ans, stored[ans["sample_id"]])  # the store's record, field for field
                self.assertEqual(ans["completion"], rec["completion"])
                if ans["status"] == "ok":
                    self.assertGreater(ans["speedup"], 0)
                    self.assertIn("ModelNew", ans["assembled_code"])
        self.assertGreater(sum(a["status"] == "ok" for _, a in answers), 3)
        self.assertGreater(sum(a["status"] != "ok" for _, a in answers), 3)

    def test_keep_alive_and_pipelined_requests_are_answered_in_order(self):
        rec = [r for r in replay_records(2) if r["expect_status"] == "ok"][0]

        def req(i, last=False):
            body = json.dumps({"task": rec["task_id"], "code": rec["completion"], "id": "p%d" % i}).encode()
            return (b"POST /v1/evaluate HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n%s\r\n" %
                    (len(body), b"Connection: close\r\n" if last else b"")) + body

        out = raw_exchange(self.port, req(0) + b"GET /v1/health HTTP/1.1\r\nHost: t\r\n\r\n" + req(1, last=True),
                           timeout=120)
        heads = re.findall(rb"HTTP/1\.1 (\d+) ", out)
        self.assertEqual(heads, [b"200", b"200", b"200"])
        ids = re.findall(rb'"request_id":"(p\d)"', out)
        self.assertEqual(ids, [b"p0", b"p1"])
        self.assertLess(out.index(b'"p0"'), out.index(b'"ok":true'))  # the health answer waits its turn

    def test_bad_requests_get_4xx_with_a_reason_and_the_server_lives(self):
        rec = replay_records(1)[0]
        good = {"task": rec["task_id"], "action": rec["completion"]}
        cases = [
            ("POST", "/v1/evaluate", b"{not json", 400, "not JSON"),
            ("POST", "/v1/evaluate", b"[1, 2]", 400, "JSON object"),
            ("POST", "/v1/evaluate", json.dumps(dict(good, temperature=1)).encode(), 400, 'unknown field "temperature"'),
            ("POST", "/v1/evaluate", json.dumps({"action": "x"}).encode(), 400, 'missing field "task"'),
            ("POST", "/v1/evaluate", json.dumps({"task": rec["task_id"]}).encode(), 400, 'missing field "action"'),
            ("POST", "/v1/evaluate", json.dumps(dict(good, code="x")).encode(), 400, "not both"),
            ("POST", "/v1/evaluate", json.dumps({"task": 7, "action": "x"}).encode(), 400, 'field "task" must be a string'),
            ("POST", "/v1/evaluate", json.dumps({"task": "no_such_task", "action": "x"}).encode(), 404,
             'no task "no_such_task"'),
            ("POST", "/v1/evaluate", json.dumps(dict(good, action_space="full_program")).encode(), 422,
             'evaluates "forward_body"'),
            ("POST", "/v1/evaluate", json.dumps(dict(good, action="x" * 60000)).encode(), 413, "at most"),
            ("GET", "/v1/evaluate", None, 405, "use POST"),
            ("POST", "/v1/tasks", b"{}", 405, "use GET"),
            ("GET", "/v2/anything", None, 404, "no endpoint /v2/anything"),
            # Reasons quoting the client's bytes, cut mid-character or not UTF-8 at all, are still answered.
            ("POST", "/v1/evaluate", json.dumps({"task": "\u00e9" * 150, "action": "x"}).encode(), 404, 'no task "'),
        ]
        for method, path, raw, code, reason in cases:
            with self.subTest(method=method, path=path, reason=reason):
                status, ans = call(self.port, method, path, raw=raw)
                self.assertEqual(status, code, ans)
                self.assertEqual(ans["status"], code)
                self.assertIn(reason, ans["error"])
        # Not HTTP at all, HTTP/2, a chunked body: answered with the reason, then the connection closes.
        for data, code, reason in [(b"hello there\r\n\r\n", 400, b"malformed request line"),
                                   (b"GET /v1/health HTTP/2.0\r\nHost: t\r\n\r\n", 505, b"HTTP/2.0"),
                                   (b"POST /v1/evaluate HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n"
                                    b"hello\r\n0\r\n\r\n", 411, b"Content-Length"),
                                   (b"GET /\xff\xfe HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 404,
                                    b"no endpoint /\xef\xbf\xbd"),
                                   (b"GET / HTTP/1.1\r\nHost: t\r\n\xff: 1\r\n\r\n", 400, b"malformed header name")]:
            out = raw_exchange(self.port, data)
            self.assertTrue(out.startswith(b"HTTP/1.1 %d " % code), out[:200])
            self.assertIn(reason, out)
            self.assertIn(b"Connection: close", out)
        # A candidate that kills its own process is a verdict, not a failure of the service.
        status, ans = call(self.port, "POST", "/v1/evaluate",
                           {"task": rec["task_id"], "code": "import os\nos._exit(3)\nreturn None"})
        self.assertEqual(status, 200, ans)
        self.assertEqual(ans["status"], "runtime_error")
        # A client that hangs up before its verdict: the verdict is stored all the same.
        before = len(export(self.run_dir))
        body = json.dumps(dict(good, id="gone")).encode()
        with socket.create_connection(("127.0.0.1", self.port)) as s:
            s.sendall(b"POST /v1/evaluate HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.time() + 60
        while len(export(self.run_dir)) == before and time.time() < deadline:
            time.sleep(0.5)
        self.assertEqual(len(export(self.run_dir)), before + 1)
        # ... and the service still answers, counting what it refused.
        status, ans = call(self.port, "POST", "/v1/evaluate", good)
        self.assertEqual((status, ans["status"]), (200, rec["expect_status"]))
        status, stats = call(self.port, "GET", "/v1/stats")
        for code in ("400", "404", "405", "413", "422"):
            self.assertGreaterEqual(stats["responses_by_status"].get(code, 0), 1, code)
        self.assertIsNone(self.proc.poll())

    def test_the_python_readmes_example_runs_as_written(self):
        # Issue 57, point 2: it asked the README's own service for a task it does not have (404).
        with open(os.path.join(ROOT, "python", "README.md")) as f:
            example = re.search(r"```python\n(.*?)\n```\n", f.read(), re.S).group(1)
        example = example.replace("http://127.0.0.1:8470", "http://127.0.0.1:%d" % self.port)
        p = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); exec(sys.argv[2])",
                            os.path.join(ROOT, "python"), example], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        status, speedup, reward = p.stdout.split()
        self.assertEqual(status, "ok", p.stdout)
        self.assertGreater(float(speedup), 0.0)

    def test_the_python_package_as_trl_and_verl_call_it(self):
        site = os.path.join(self.tmp, "site")
        src = os.path.join(ROOT, "python")

        def tree():
            return sorted(os.path.relpath(os.path.join(d, f), src) for d, dirs, files in os.walk(src)
                          for f in files if "__pycache__" not in d)

        before = tree()
        # As the README says, from the tree itself, offline: the package's own backend
        # (python/_build) needs nothing installed and writes nothing beside the sources.
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--no-index", "--target", site, src],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(tree(), before, "pip install ./python left files in the tree")
        records = [r for r in replay_records(4)]
        script = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[3])
import kernelrl
assert kernelrl.__file__.startswith(sys.argv[1]), kernelrl.__file__
from kernelrl import Client, make_trl_reward, compute_score, compute_score_batch, RequestError
import trl_grpo
records = json.loads(sys.argv[2])
url = "http://127.0.0.1:%s" % sys.argv[4]
client = Client(url)
out = {"health": client.health(), "rows": trl_grpo.build_rows(client, 3)}
tasks = [r["task_id"] for r in records]
texts = [r["completion"] for r in records]
# TRL: plain completions, then conversational ones, the dataset's columns as keyword arguments.
reward = make_trl_reward(url)
out["trl_plain"] = reward(prompts=["p"] * len(texts), completions=texts, task_id=tasks, completion_ids=None)
out["trl_chat"] = reward(prompts=[[{"role": "user", "content": "chat-prompt"}]] * len(texts),
                         completions=[[{"role": "assistant", "content": t}] for t in texts], task_id=tasks)
out["trl_correct"] = make_trl_reward(url, value="correct")(prompts=None, completions=texts, task_id=tasks)
out["trl_name"] = reward.__name__
# verl: the naive manager's call per sample, the batch manager's call at once.
import os
os.environ["KERNELRL_URL"] = url
out["verl"] = [compute_score(data_source="kernelbench", solution_str=t, ground_truth="", extra_info={"task_id": k})
               for t, k in zip(texts, tasks)]
out["verl_batch"] = compute_score_batch(data_sources=["kb"] * len(texts), solution_strs=texts,
                                        ground_truths=tasks, extra_infos=None)
try:
    client.evaluate("no_such_task", action="x")
    out["refused"] = None
except RequestError as e:
    out["refused"] = [e.status, e.reason]
out["missing"] = make_trl_reward(url)(prompts=None, completions=["x"], task_id=["no_such_task"])
# verl loads the reward file by its path, as a module of no package.
import importlib.util
spec = importlib.util.spec_from_file_location("custom_module", os.path.join(sys.argv[1], "kernelrl", "rewards.py"))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
out["verl_by_path"] = module.compute_score(data_source="kb", solution_str=texts[0], ground_truth=tasks[0])
print(json.dumps(out))
"""
        p = subprocess.run([sys.executable, "-c", script, site, json.dumps(records),
                            os.path.join(ROOT, "python", "examples"), str(self.port)],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stderr)
        out = json.loads(p.stdout)
        self.assertTrue(out["health"]["ok"])
        self.assertEqual(len(out["rows"]), 3)
        self.assertEqual(out["rows"][0]["prompt"][0]["role"], "user")
        self.assertIn(out["rows"][0]["task_id"], out["rows"][0]["prompt"][0]["content"])
        # Each reward is the stored record's reward; correctness follows the labels.
        stored = export(self.run_dir)
        by_action = {}
        for r in stored.values():
            by_action.setdefault((r["task_id"], r["completion"]), set()).add(round(r["reward"], 9))
        for i, rec in enumerate(records):
            with self.subTest(task=rec["task_id"], label=rec["label"]):
                key = (rec["task_id"], rec["completion"])
                for got in (out["trl_plain"][i], out["trl_chat"][i], out["verl"][i]["score"],
                            out["verl_batch"][i]["score"]):
                    self.assertIn(round(got, 9), by_action[key])
                ok = rec["expect_status"] == "ok"
                self.assertEqual(out["trl_correct"][i], 1.0 if ok else 0.0)
                self.assertEqual(out["verl"][i]["correct"], 1.0 if ok else 0.0)
                if not ok:
                    self.assertEqual(out["verl"][i]["speedup"], 0.0)
        self.assertEqual(out["trl_name"], "kernelrl_reward")
        # A conversation's prompt is kept as its last user message.
        self.assertEqual(sum(r["prompt"] == "chat-prompt" for r in stored.values()), len(records))
        self.assertEqual(out["refused"][0], 404)
        self.assertEqual(out["missing"], [None])  # TRL leaves a None out of its mean
        self.assertIn(round(out["verl_by_path"]["score"], 9), by_action[(records[0]["task_id"], records[0]["completion"])])


class ServeRestartTest(unittest.TestCase):
    def test_sigterm_answers_what_is_in_flight_and_a_restart_goes_on_in_the_same_run(self):
        run_dir = os.path.join(tempfile.mkdtemp(prefix="kernelrl-serve-restart-"), "run")
        recs = replay_records(1)
        proc, port = start_serve([CONFIG, "--run-dir", run_dir])
        answer = {}
        t = threading.Thread(target=lambda: answer.update(
            r=call(port, "POST", "/v1/evaluate", {"task": recs[0]["task_id"], "action": recs[0]["completion"]})))
        t.start()
        deadline = time.time() + 30
        while call(port, "GET", "/v1/health")[1]["pending"] == 0 and time.time() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # while the request is being evaluated
        t.join(timeout=120)
        self.assertEqual(proc.wait(timeout=120), 0)
        status, first = answer["r"]
        self.assertEqual((status, first["status"]), (200, recs[0]["expect_status"]))
        # The same run directory again: new sample ids, each answer its own candidate's record.
        proc, port = start_serve([CONFIG, "--run-dir", run_dir])
        try:
            status, second = call(port, "POST", "/v1/evaluate", {"task": recs[1]["task_id"], "action": recs[1]["completion"]})
            self.assertEqual((status, second["status"]), (200, recs[1]["expect_status"]))
            self.assertEqual(second["completion"], recs[1]["completion"])
            self.assertNotEqual(second["sample_id"], first["sample_id"])
        finally:
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=60), 0)
        self.assertEqual(len(export(run_dir)), 2)


class ServeClusterTest(unittest.TestCase):
    def test_a_joined_node_evaluates_for_the_service(self):
        tmp = tempfile.mkdtemp(prefix="kernelrl-serve-cluster-")
        cfg = os.path.join(tmp, "cluster.toml")
        with open(cfg, "w") as f:
            f.write(cluster_head(tmp, free_port(), peer_timeout_s=5.0) + f"""
[[node]]
name = "eval-a"
host = "127.0.0.1"
roles = ["evaluator"]
cpu_slots = 1
[tasks]
dir = "{os.path.join(ROOT, "tasks", "bundled")}"
[sampler]
replay = "{REPLAY}"
[evaluator]
action_space = "forward_body"
correctness_trials = 3
fast_trials = 3
timeout_s = 20
""")
        serve, http_port = start_serve([cfg, "--run-dir", os.path.join(tmp, "run")])
        node = subprocess.Popen([LAUNCH, cfg, "--node", "eval-a"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            self.assertEqual(call(http_port, "GET", "/v1/health")[1]["evaluators"], 0)
            deadline = time.time() + 60
            while call(http_port, "GET", "/v1/health")[1]["evaluators"] < 1 and time.time() < deadline:
                time.sleep(0.5)
            self.assertEqual(call(http_port, "GET", "/v1/health")[1]["evaluators"], 1)
            rec = [r for r in replay_records(1) if r["expect_status"] == "ok"][0]
            status, ans = call(http_port, "POST", "/v1/evaluate", {"task": rec["task_id"], "action": rec["completion"]})
            self.assertEqual((status, ans["status"]), (200, "ok"), ans)
            self.assertTrue(ans["evaluator_id"].startswith("eval-a/"), ans["evaluator_id"])
        finally:
            serve.send_signal(signal.SIGTERM)
            self.assertEqual(serve.wait(timeout=60), 0)
            node.wait(timeout=60)  # the head's end closes the link; the node stops


if __name__ == "__main__":
    unittest.main()
