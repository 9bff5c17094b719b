"""The `launch` program, started as a user starts it: `check`, an `eval` run of every bundled
replayed candidate through sampler -> dispatcher -> evaluator -> reward -> store, `export`, and
bad inputs (broken replay lines, an unknown task, evaluators that cannot start)."""

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))
TASKS = os.path.join(ROOT, "tasks", "bundled")
REPLAY = os.path.join(ROOT, "tasks", "replay")


def run(*args, timeout=600):
    return subprocess.run([LAUNCH, *args], capture_output=True, text=True, timeout=timeout)


def write_config(dirname, replay, extra_eval="", extra="", timeout_s=8):
    path = os.path.join(dirname, "test.toml")
    with open(path, "w") as f:
        f.write(f"""
[cluster]
log_level = "info"
[[node]]
name = "test"
roles = ["supervisor", "sampler", "evaluator", "monitor"]
cpu_slots = 2
[tasks]
dir = "{TASKS}"
[sampler]
replay = "{replay}"
[evaluator]
timeout_s = {timeout_s}
{extra_eval}
[monitor]
interval_s = 0.2
{extra}
""")
    return path


def small_replay(dirname):
    """A replay folder of three tasks' lines (10 candidates: ok, incorrect, runtime and format
    errors), for tests that need a run but not every bundled candidate."""
    path = os.path.join(dirname, "replay")
    os.makedirs(path, exist_ok=True)
    for name in ("01_diag_matmul.jsonl", "06_swish.jsonl", "09_row_sum.jsonl"):
        shutil.copy(os.path.join(REPLAY, name), path)
    return path


def export(run_dir):
    out = run("export", run_dir, "--jsonl")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def replay_expectations():
    """(task_id, sample_index) -> replay record, in the sampler's order (file order per task)."""
    exp = {}
    for name in sorted(os.listdir(REPLAY)):
        with open(os.path.join(REPLAY, name)) as f:
            for i, line in enumerate(l for l in f if l.strip()):
                rec = json.loads(line)
                exp[(rec["task_id"], i)] = rec
    return exp


class CheckTest(unittest.TestCase):
    def test_valid_config_prints_resolved_config_and_exits_0(self):
        out = run("check", os.path.join(ROOT, "configs", "replay.toml"))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("valid", out.stdout)
        self.assertIn("correctness_trials = 5", out.stdout)
        self.assertIn(f"dir = '{TASKS}'", out.stdout)

    def test_per_gpu_evaluators_share_the_machine_as_their_own_evaluators(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "gpus.toml")
            with open(path, "w") as f:
                f.write('[[node]]\nname = "g"\nroles = ["supervisor", "sampler", "evaluator"]\ngpus = [0, 1]\n'
                        'per_gpu = 3\n[tasks]\ndir = "%s"\n[sampler]\nreplay = "%s"\n' % (TASKS, REPLAY))
            out = run("check", path)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("per_gpu = 3", out.stdout)
            three = int(re.search(r"# node g on this machine: .* x (\d+) at once", out.stdout).group(1))
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace("per_gpu = 3\n", ""))
            out = run("check", path)
            self.assertEqual(out.returncode, 0, out.stderr)
            one = int(re.search(r"# node g on this machine: .* x (\d+) at once", out.stdout).group(1))
            self.assertEqual(three, 3 * one, "each of a GPU's evaluators runs its candidates (and builds)")
            with open(path, "a") as f:
                f.write('[[node]]\nname = "c"\nroles = ["evaluator"]\ncpu_slots = 1\nper_gpu = 2\n')
            out = run("check", path)
            self.assertEqual(out.returncode, 2)
            self.assertIn("node[1].per_gpu: per_gpu is the evaluators on each of the node's gpus, and it lists none",
                          out.stderr)

    def test_invalid_config_names_file_line_column_key_and_exits_2(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, REPLAY, extra_eval='fast_trials = "many"')
            out = run("check", cfg)
            self.assertEqual(out.returncode, 2)
            self.assertIn(f"{cfg}:14:15: evaluator.fast_trials: expected an integer, got a string",
                          out.stderr)
            # The same config is refused by a run, before anything starts.
            out = run(cfg, "--run-dir", os.path.join(d, "run"))
            self.assertEqual(out.returncode, 2)
            self.assertFalse(os.path.exists(os.path.join(d, "run")))

    def test_set_overrides_keys_and_names_a_bad_one(self):
        import tomllib
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, small_replay(d))
            # Read back by the config's own reader (the resolved config check prints) and by tomllib.
            out = run("check", cfg, "--set", "evaluator.fast_trials=7", "--set", "reward.max_speedup=2.5",
                      "--set", "experiment.name=overridden", "--set", "sampler.stop=[\"```\", \"END\"]")
            self.assertEqual(out.returncode, 0, out.stderr)
            resolved = tomllib.loads(out.stdout.split("\n", 1)[1])
            self.assertEqual(resolved["evaluator"]["fast_trials"], 7)
            self.assertEqual(resolved["reward"]["max_speedup"], 2.5)
            self.assertEqual(resolved["experiment"]["name"], "overridden")  # a bare word: a string
            self.assertEqual(resolved["sampler"]["stop"], ["```", "END"])
            for sets, message in [
                (["evaluator.fast_trials=many"], "--set evaluator.fast_trials=many: evaluator.fast_trials: expected an "
                                                 "integer, got a string"),
                (["learner.lr=2e-5"], "--set learner.lr=2e-5: learner.lr: unknown key"),
                (["sampler.temperature=-1"], "--set sampler.temperature=-1: sampler.temperature:"),
                (["temperature"], "--set temperature: (override): expected KEY=VALUE"),
                (["temperature=0.5"], "expected SECTION.KEY"),
                (["node.name=x"], "node is an array of tables"),
            ]:
                args = [x for s in sets for x in ("--set", s)]
                out = run("check", cfg, *args)
                self.assertEqual(out.returncode, 2, (sets, out.stdout))
                self.assertIn(message, out.stderr)
            # A run keeps the effective config.
            run_dir = os.path.join(d, "run")
            out = run(cfg, "--run-dir", run_dir, "--set", "evaluator.fast_trials=3", "--set", "monitor.progress=false")
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            with open(os.path.join(run_dir, "config.resolved.toml"), "rb") as f:
                self.assertEqual(tomllib.load(f)["evaluator"]["fast_trials"], 3)

    def test_unknown_arguments_are_refused(self):
        self.assertEqual(run("export", "somewhere").returncode, 2)
        self.assertEqual(run(os.path.join(ROOT, "configs", "replay.toml"), "--bogus").returncode, 2)
        with tempfile.TemporaryDirectory() as d:
            out = run(write_config(d, REPLAY), "--log-level", "loud", "--run-dir", d + "/r")
            self.assertEqual(out.returncode, 2)
            self.assertIn("--log-level", out.stderr)


class ProgressLineTest(unittest.TestCase):
    """The live progress line: on a terminal, rewritten in place and never wider than the terminal; into a file or a
    pipe, plain lines."""

    def test_clipped_to_the_terminal_and_plain_elsewhere(self):
        import fcntl
        import pty
        import struct
        import termios
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, small_replay(d))
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
            # (info: the evaluators' log lines come while the progress line is up; each clears its row first)
            p = subprocess.Popen([LAUNCH, cfg, "--run-dir", os.path.join(d, "tty"), "--log-level", "info"],
                                 stdout=subprocess.DEVNULL,
                                 stderr=slave, stdin=subprocess.DEVNULL)
            os.close(slave)
            out = b""
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed its end
                    break
                if not chunk:
                    break
                out += chunk
            p.wait(timeout=300)
            os.close(master)
            self.assertEqual(p.returncode, 0, out[-3000:])
            text = out.decode(errors="replace").replace("\r\n", "\n")
            # A log line never continues a progress row: it follows a carriage return and the erase-line code.
            self.assertNotRegex(text, r"\[eval\] [^\r\n]*\d{4}-\d\d-\d\d \d\d:")
            text = text.replace("\r\x1b[K", "\n")
            lines = [x for part in text.split("\n") for x in part.split("\r")]
            progress = [x for x in lines if x.startswith("[") and "samples" in x]
            self.assertTrue(progress, text[-2000:])
            self.assertIn("\r", text)  # rewritten in place
            for x in progress:
                self.assertLessEqual(len(x.rstrip()), 59, x)
            # Into a pipe: whole lines, no carriage returns, nothing clipped.
            plain = run(cfg, "--run-dir", os.path.join(d, "pipe"))
            self.assertEqual(plain.returncode, 0, plain.stderr[-3000:])
            self.assertNotIn("\r", plain.stderr)
            ends = [x for x in plain.stderr.splitlines() if x.startswith("[") and " samples | " in x]
            self.assertTrue(ends, plain.stderr[-2000:])
            self.assertGreater(max(len(x) for x in ends), 60)


class EvalPipelineTest(unittest.TestCase):
    """Every bundled candidate gets exactly one record with the status its replay line expects."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.run_dir = os.path.join(cls.tmp.name, "run")
        cls.out = run(write_config(cls.tmp.name, REPLAY), "--run-dir", cls.run_dir)
        cls.samples = export(cls.run_dir) if cls.out.returncode == 0 else []

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_run_succeeds_and_prints_the_summary(self):
        self.assertEqual(self.out.returncode, 0, self.out.stderr[-3000:])
        self.assertIn("overall", self.out.stdout)
        self.assertIn(f"run directory: {self.run_dir}", self.out.stdout)
        for task in sorted(os.listdir(TASKS)):
            self.assertIn(task[:-3], self.out.stdout)

    def test_every_candidate_has_its_expected_status(self):
        exp = replay_expectations()
        got = {(s["task_id"], s["sample_index"]): s for s in self.samples}
        self.assertEqual(set(got), set(exp), "every replayed action recorded, nothing extra")
        self.assertEqual(len(self.samples), len(exp), "no sample recorded twice")
        for key, rec in exp.items():
            s = got[key]
            with self.subTest(task=key[0], label=rec["label"]):
                self.assertEqual(s["status"], rec["expect_status"], s["error"])
                self.assertEqual(s["completion"], rec["completion"])
                if s["status"] == "ok":
                    self.assertGreater(s["reward"], 0)
                    self.assertEqual(s["correctness"]["passed"], s["correctness"]["trials"])
                    # 5 + one per input distribution inside the reference's domain + the re-check
                    # after timing + the re-check on refilled input tensors (+ 20 more when a speedup
                    # above 10x was re-verified)
                    dists = s["correctness"]["distributions"].count(": passed")
                    self.assertEqual(dists + s["correctness"]["distributions"].count(": outside"), 3)
                    self.assertEqual(s["correctness"]["trials"], 7 + dists + (20 if s["reverified"] else 0))
                    self.assertGreater(s["runtime_ms"], 0)
                    self.assertAlmostEqual(s["speedup"], s["ref_runtime_ms"] / s["runtime_ms"], places=6)
                    self.assertIn("class ModelNew(nn.Module):", s["assembled_code"])
                else:
                    self.assertEqual(s["reward"], 0)
                    self.assertEqual(s["speedup"], 0)
                    self.assertTrue(s["error"], "a failure carries its reason")
                if rec.get("expect_speed") == "faster":
                    self.assertGreater(s["speedup"], 1.0)
                if rec.get("expect_speed") == "slower":
                    self.assertLess(s["speedup"], 1.0)

    def test_failure_reasons_name_what_went_wrong(self):
        by_label = {}
        exp = replay_expectations()
        for s in self.samples:
            by_label[(s["task_id"], exp[(s["task_id"], s["sample_index"])]["label"])] = s
        self.assertIn("killed by SIGKILL", by_label[("01_diag_matmul", "kills_worker")]["error"])
        self.assertIn("exceeded the 8 s limit", by_label[("02_gelu_tanh", "hangs")]["error"])
        self.assertIn("shape [1, 256] != reference [256, 1]",
                      by_label[("03_matmul_rowsum", "wrong")]["error"])
        self.assertIn("does not parse", by_label[("03_matmul_rowsum", "syntax")]["error"])
        self.assertIn("AttributeError", by_label[("05_layernorm_manual", "raises")]["error"])

    def test_store_and_run_directory_keep_the_run(self):
        db = sqlite3.connect(os.path.join(self.run_dir, "store.sqlite"))
        status, summary = db.execute("SELECT status, summary_json FROM runs").fetchone()
        self.assertEqual(status, "completed")
        self.assertEqual(json.loads(summary)["samples"], len(self.samples))
        stats = json.loads(db.execute("SELECT stats_json FROM steps WHERE step = 0").fetchone()[0])
        self.assertEqual(stats["samples"], len(self.samples))
        self.assertEqual(sum(stats["status_counts"].values()), len(self.samples))
        self.assertGreater(db.execute("SELECT count(*) FROM telemetry").fetchone()[0], 0)
        for f in ("launch.log", "metrics.jsonl", "config.resolved.toml"):
            self.assertGreater(os.path.getsize(os.path.join(self.run_dir, f)), 0, f)
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            last = json.loads(f.readlines()[-1])
        self.assertEqual(last["values"]["supervisor.samples_done"], len(self.samples))

    def test_an_earlier_run_replays_through_the_pipeline_again(self):
        d = os.path.join(self.tmp.name, "again")
        os.makedirs(d)
        cfg = write_config(d, self.run_dir)  # replay = the earlier run directory (its store)
        text = open(cfg).read().replace(f'dir = "{TASKS}"', f'dir = "{TASKS}"\nids = ["04_trace_matmul"]')
        open(cfg, "w").write(text)
        out = run(cfg, "--run-dir", os.path.join(d, "run"))
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        again = export(os.path.join(d, "run"))
        before = {s["completion"]: s["status"] for s in self.samples if s["task_id"] == "04_trace_matmul"}
        self.assertEqual({s["completion"]: s["status"] for s in again}, before)


class ConfirmTest(unittest.TestCase):
    """Unconfirmed verdicts (a speedup above [evaluator] review_speedup, here 0.01x so that every
    correct one is) through a run: counted correct and not faster, rewarded at unconfirmed_speedup, listed
    by `launch confirm RUN_DIR`, then confirmed (ok, the speedup counts) or rejected (hacked)."""

    def test_a_run_s_unconfirmed_speedups_are_listed_and_decided(self):
        with tempfile.TemporaryDirectory() as d:
            replay = os.path.join(d, "replay.jsonl")
            with open(replay, "w") as f:
                for body in ("return x * torch.sigmoid(x)", "return torch.nn.functional.silu(x)", "return x"):
                    f.write(json.dumps({"task_id": "06_swish", "completion": body}) + "\n")
            cfg = write_config(d, replay, extra_eval="review_speedup = 0.01",
                               extra="[reward]\nunconfirmed_speedup = 0.5\n")
            with open(cfg) as f:
                text = f.read().replace(f'dir = "{TASKS}"', f'dir = "{TASKS}"\nids = ["06_swish"]')
            with open(cfg, "w") as f:
                f.write(text)
            run_dir = os.path.join(d, "run")
            out = run(cfg, "--run-dir", run_dir)
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            rows = {r["completion"]: r for r in export(run_dir) if r["task_id"] == "06_swish"}
            a, b = rows["return x * torch.sigmoid(x)"], rows["return torch.nn.functional.silu(x)"]
            for r in (a, b):
                self.assertEqual(r["status"], "unconfirmed", r["error"])
                self.assertIn("above the review threshold, 0.01x", r["review"])
                self.assertTrue(r["reverified"])
                self.assertEqual(r["reward"], min(r["speedup"], 0.5))
            self.assertEqual(rows["return x"]["status"], "incorrect")
            analyzed = run("analyze", run_dir)
            self.assertEqual(analyzed.returncode, 0, analyzed.stderr)
            self.assertIn("2 unconfirmed: correct, counted as not faster", analyzed.stdout)
            listed = run("confirm", run_dir)
            self.assertEqual(listed.returncode, 0, listed.stderr)
            self.assertIn(a["sample_id"], listed.stdout)
            self.assertIn("2 unconfirmed samples", listed.stdout)
            done = run("confirm", run_dir, a["sample_id"], "--note", "checked by hand")
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn(f"{a['sample_id']}: confirmed (now ok)", done.stdout)
            done = run("confirm", run_dir, b["sample_id"], "--reject", "--note", "not a kernel")
            self.assertEqual(done.returncode, 0, done.stderr)
            again = run("confirm", run_dir, a["sample_id"])  # decided already
            self.assertEqual(again.returncode, 1)
            self.assertIn("is ok, not unconfirmed", again.stderr)
            self.assertEqual(run("confirm", run_dir, "no-such-sample").returncode, 2)
            self.assertEqual(run("confirm", run_dir, "--reject").returncode, 2)
            rows = {r["sample_id"]: r for r in export(run_dir)}
            self.assertEqual(rows[a["sample_id"]]["status"], "ok")
            self.assertEqual(rows[a["sample_id"]]["speedup"], a["speedup"])
            self.assertIn("confirmed by review", rows[a["sample_id"]]["review"])
            self.assertIn("checked by hand", rows[a["sample_id"]]["review"])
            self.assertEqual(rows[b["sample_id"]]["status"], "hacked")
            self.assertIn("rejected by review: not a kernel", rows[b["sample_id"]]["error"])
            self.assertEqual(rows[b["sample_id"]]["reward"], b["reward"])  # what was paid stays
            self.assertNotIn("unconfirmed", run("analyze", run_dir).stdout)
            with sqlite3.connect(os.path.join(run_dir, "store.sqlite")) as db:
                decisions = sorted(r[0] for r in db.execute("SELECT decision FROM reviews"))
            self.assertEqual(decisions, ["confirmed", "rejected"])


class HelpTest(unittest.TestCase):
    """Every subcommand answers --help with its own arguments and exit 0; --version prints the
    versions; an unknown option is exit 2 with the usage."""

    SUBCOMMANDS = ["check", "prompts", "export", "confirm", "analyze", "report", "probe", "compare", "evaluate",
                   "generate", "score", "tokenize", "merge", "sft", "monitor", "keygen", "version"]

    def test_each_subcommand_has_its_help_and_the_program_its_version(self):
        for sub in self.SUBCOMMANDS:
            out = run(sub, "--help")
            self.assertEqual(out.returncode, 0, (sub, out.stderr))
            self.assertTrue(out.stdout.startswith(f"launch {sub} "), (sub, out.stdout))
        for args in ([os.path.join(ROOT, "configs", "local.toml"), "--help"], ["--help"], ["-h"]):
            out = run(*args)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("--resume RUN_DIR", out.stdout)
            self.assertEqual(out.stdout.count("launch CONFIG --resume RUN_DIR"), 1, "the usage, once")
            self.assertNotIn("OPTIONS:", out.stdout)  # not CLI11's listing of the same again
            self.assertLess(len(out.stdout.splitlines()), 45)
            for sub in self.SUBCOMMANDS + ["serve"]:
                self.assertRegex(out.stdout, rf"\n  launch {sub}\b", sub)
        # A run's options before CONFIG (the config's own errors show it was taken as the config).
        out = run("--log-level", "warn", os.path.join(ROOT, "configs", "no-such.toml"))
        self.assertEqual(out.returncode, 2)
        self.assertNotIn("unknown option", out.stderr)
        self.assertIn("no-such.toml", out.stderr)
        for flag in ("--version", "version"):
            out = run(flag)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertRegex(out.stdout, r"^kernelrl \d+\.\d+\.\d+ \(protocol \d+\)\nLibTorch 2\.11\.0")
        out = run("--bogus")
        self.assertEqual(out.returncode, 2)
        self.assertIn('unknown option "--bogus"', out.stderr)
        self.assertIn("usage:", out.stderr)


class ResolvedFloatsTest(unittest.TestCase):
    """Issue 57, point 5: resolved configs write each float as the shortest decimal that reads back
    as the same number (not clip_high = 0.20000000000000001), and read back to the same config."""

    def test_floats_are_shortest_and_read_back_the_same(self):
        out = run("check", os.path.join(ROOT, "configs", "local.toml"), "--set", "learner.learning_rate=2e-5")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIsNone(re.search(r"\d\.\d{15,}", out.stdout), re.findall(r".*\d\.\d{15,}.*", out.stdout)[:5])
        self.assertIn("clip_high = 0.2\n", out.stdout)
        self.assertIn("learning_rate = 2e-05\n", out.stdout)
        first = run("check", os.path.join(ROOT, "configs", "replay.toml"))
        self.assertEqual(first.returncode, 0, first.stderr)
        with tempfile.TemporaryDirectory() as d:
            again = os.path.join(d, "resolved.toml")
            with open(again, "w") as f:
                f.write(first.stdout)
            second = run("check", again)
            self.assertEqual(second.returncode, 0, second.stderr)
            body = lambda text: "\n".join(line for line in text.splitlines() if not line.startswith("#"))  # noqa: E731
            self.assertEqual(body(second.stdout), body(first.stdout))


class BadPathsTest(unittest.TestCase):
    """Names that would leave the run's folders, and paths that are not what a subcommand expects,
    are refused with a clear error and exit 2 (or 1); nothing ends in an uncaught exception."""

    def assertRefused(self, out, *fragments, codes=(2,)):
        self.assertIn(out.returncode, codes, (out.returncode, out.stderr[-2000:]))
        self.assertNotIn("terminate called", out.stderr)
        self.assertNotIn("fatal", out.stderr)
        for f in fragments:
            self.assertIn(f, out.stderr)

    def test_names_that_leave_the_run_folder_are_refused_at_their_line(self):
        for section, key, value in (("experiment", "name", "../escape"), ("experiment", "name", "a/b"),
                                    ("store", "file", "../../x.sqlite"), ("monitor", "metrics_file", "../m.jsonl"),
                                    ("experiment", "name", ".hidden")):
            with tempfile.TemporaryDirectory() as d:
                cfg = write_config(d, REPLAY, extra=f"[{section}]\n{key} = \"{value}\"\n"
                                   if section != "monitor" else "")
                if section == "monitor":
                    with open(cfg, "a") as f:
                        f.write(f'metrics_file = "{value}"\n')
                out = run("check", cfg)
                self.assertRefused(out, f"{section}.{key}: expected a plain name", f'got "{value}"')
                self.assertRegex(out.stderr, r"test\.toml:\d+:\d+: ")
                out = run(cfg, "--run-dir", os.path.join(d, "run"))
                self.assertRefused(out)
                self.assertEqual(sorted(os.listdir(d)), ["test.toml"])  # nothing was made anywhere

    def test_the_telemetry_socket_binds_loopback_only(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, REPLAY)
            with open(cfg, "a") as f:
                f.write('publish = "tcp://0.0.0.0:47999"\n')
            out = run("check", cfg)
            self.assertRefused(out, "monitor.publish: binds 0.0.0.0", "loopback address only")

    def test_every_subcommand_given_paths_of_the_wrong_kind_says_so(self):
        with tempfile.TemporaryDirectory() as d:
            a_file = os.path.join(d, "file.txt")
            with open(a_file, "w") as f:
                f.write("not what anyone expects\n")
            missing = os.path.join(d, "missing")
            cfg = write_config(d, REPLAY)
            self.assertRefused(run("check", d), "is a directory, not a config file")
            self.assertRefused(run(d), "is a directory, not a config file")
            self.assertRefused(run("prompts", missing), "cannot open config file")
            self.assertRefused(run(cfg, "--run-dir", a_file), "--run-dir", "cannot create directory")
            self.assertRefused(run(cfg, "--run-dir", "/proc/kernelrl-cannot-be-here"), "--run-dir")
            self.assertRefused(run(cfg, "--resume", a_file), "--resume")
            for sub in ("export", "analyze", "report", "probe"):
                args = [sub, a_file] + (["--jsonl"] if sub == "export" else [])
                self.assertRefused(run(*args), codes=(1, 2))
                args = [sub, missing] + (["--jsonl"] if sub == "export" else [])
                self.assertRefused(run(*args), codes=(1, 2))
            self.assertRefused(run("compare", a_file, missing), codes=(1, 2))
            self.assertRefused(run("report", missing, "--out", "/proc/nope/report.html"), codes=(1, 2))
            self.assertRefused(run("evaluate", "--task", missing, "--candidate", a_file), codes=(1, 2))
            self.assertRefused(run("evaluate", "--task", d, "--candidate", d), codes=(1, 2))
            for sub in ("generate", "score", "tokenize"):
                self.assertRefused(run(sub, "--model", a_file, "--prompt", "x", "--completion", "y")
                                   if sub == "score" else run(sub, "--model", a_file, "--prompt", "x"), codes=(1, 2))
            self.assertRefused(run("merge", "--model", missing, "--adapter", a_file, "--out", a_file), codes=(1, 2))
            self.assertRefused(run("sft", "--model", missing, "--data", d, "--out", a_file), codes=(1, 2))
            self.assertRefused(run("generate", "--model", missing, "--prompt-file", d), codes=(1, 2))


class MemoryLimitTest(unittest.TestCase):
    """The candidates' memory limit comes from the machine: shared out over every candidate that
    can run at once (memory_limit_mb = "auto"), said by `launch check` and at start-up; limits
    that add up to more than the machine are warned of; two memory hogs at once are stopped."""

    def test_two_memory_hogs_at_once_are_stopped_at_the_machines_share(self):
        hog = "chunks = []\nwhile True:\n    chunks.append(torch.ones(1 << 27))\nreturn x"
        with tempfile.TemporaryDirectory() as d:
            replay = os.path.join(d, "hogs.jsonl")
            with open(replay, "w") as f:
                for task in ("06_swish", "09_row_sum"):
                    f.write(json.dumps({"task_id": task, "completion": hog}) + "\n")
            # (A hog never returns: only the memory limit stops it. The time limit is generous so
            # that a slow machine cannot pass its allocations off as a timeout.)
            cfg = write_config(d, replay, timeout_s=60)
            out = run("check", cfg)
            self.assertEqual(out.returncode, 0, out.stderr)
            m = re.search(r"# node test on this machine: memory_limit_mb (\d+) \(auto\) per candidate x (\d+) at once",
                          out.stdout)
            self.assertIsNotNone(m, out.stdout[:500])
            per, at_once = int(m.group(1)), int(m.group(2))
            self.assertEqual(at_once, 2 * 3)  # two slots, each its timing stage and 2 compile workers
            with open("/proc/meminfo") as f:
                total_mb = int(f.readline().split()[1]) // 1024
            self.assertLessEqual(per * at_once, total_mb)
            out = run(cfg, "--run-dir", os.path.join(d, "run"))
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            self.assertIn(f"memory_limit_mb {per} (auto)", out.stderr)
            samples = export(os.path.join(d, "run"))
            self.assertEqual(len(samples), 2)
            for s in samples:
                self.assertEqual(s["status"], "runtime_error", s["error"])
                self.assertIn("memory limit", s["error"])

    def test_nodes_on_one_host_share_its_memory(self):
        # configs/cluster-local.toml: two evaluator nodes at 127.0.0.1, one machine.
        out = run("check", os.path.join(ROOT, "configs", "cluster-local.toml"))
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = re.findall(r"# node (eval-\w+) on this machine: memory_limit_mb (\d+) \(auto\) per candidate x (\d+) "
                           r"at once = (\d+) MB of this machine's (\d+) MB.*\(shared with node (eval-\w+), also at "
                           r"127.0.0.1\)", out.stdout)
        self.assertEqual(sorted((a, b) for a, _, _, _, _, b in lines), [("eval-a", "eval-b"), ("eval-b", "eval-a")])
        for _, per, at_once, total, machine, _ in lines:
            self.assertEqual(int(at_once), 6)  # both nodes' slots, each with its 2 compile workers
            self.assertLessEqual(int(total), int(machine))
        self.assertNotIn("add up to more than", out.stderr)

    def test_limits_larger_than_the_machine_are_warned_of(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, REPLAY, extra_eval="memory_limit_mb = 100000000")
            out = run("check", cfg)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("memory_limit_mb 100000000 per candidate x 6 at once", out.stdout)
            self.assertIn("add up to more than this machine has", out.stderr)
            cfg = write_config(d, REPLAY, extra_eval='memory_limit_mb = "lots"')
            out = run("check", cfg)
            self.assertEqual(out.returncode, 2)
            self.assertIn('evaluator.memory_limit_mb: expected an integer or "auto", got "lots"', out.stderr)

    def test_a_listed_gpu_this_machine_lacks_is_refused_before_anything_starts(self):
        import torch
        have = torch.cuda.device_count()
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, REPLAY)
            with open(cfg) as f:
                text = f.read()
            with open(cfg, "w") as f:
                f.write(text.replace("cpu_slots = 2", "gpus = [%d]" % have))
            out = run(cfg, "--run-dir", os.path.join(d, "run"))
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn("node test: gpus lists device %d, but this machine has %d GPU(s)" % (have, have), out.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "run")))


class TempFilesTest(unittest.TestCase):
    """A run keeps its temporary files (workers' sockets, locks, candidates' folders) in one folder
    of its own, removed when it ends; a killed run's folder is removed by the next start."""

    def test_a_run_leaves_nothing_in_the_temp_folder_and_a_killed_runs_folder_is_swept(self):
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "TMPDIR": tmp}
            cfg = write_config(d, os.path.join(REPLAY, sorted(os.listdir(REPLAY))[0]))
            out = subprocess.run([LAUNCH, cfg, "--run-dir", os.path.join(d, "run")], env=env,
                                 capture_output=True, text=True, timeout=600)
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            self.assertEqual(os.listdir(tmp), [])
            # The run to kill replays every task (one task's replay can end within the wait below).
            os.mkdir(os.path.join(d, "long"))
            long_cfg = write_config(os.path.join(d, "long"), REPLAY)
            p = subprocess.Popen([LAUNCH, long_cfg, "--run-dir", os.path.join(d, "killed")], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 60
            while time.time() < deadline and not any(n.startswith("kernelrl-") for n in os.listdir(tmp)):
                time.sleep(0.2)
            time.sleep(3)  # its workers have made their locks and candidates' folders
            self.assertIsNone(p.poll(), "the run to kill ended on its own")
            p.kill()
            p.wait()
            left = [n for n in os.listdir(tmp) if n.startswith(f"kernelrl-{p.pid}-")]
            self.assertEqual(len(left), 1, os.listdir(tmp))
            time.sleep(2)  # its workers notice their parent is gone
            task = os.path.join(TASKS, "06_swish.py")
            with open(os.path.join(d, "good.txt"), "w") as f:
                f.write("return torch.nn.functional.silu(x)")
            with open(os.path.join(d, "prose.txt"), "w") as f:
                f.write("This computes swish.")
            out = subprocess.run([LAUNCH, "evaluate", "--task", task, "--candidate", os.path.join(d, "good.txt"),
                                  "--candidate", os.path.join(d, "prose.txt")],
                                 env=env, capture_output=True, text=True, timeout=600)
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            self.assertEqual(os.listdir(tmp), [])
            good, prose = out.stdout.splitlines()
            self.assertRegex(good, r"ok +speedup +\d+\.\d{3}  \d+\.\d{4} ms \(ref \d+\.\d{4} ms\)")
            self.assertRegex(prose, r"format_error +not timed  the forward body does not parse")  # no "0.0000 ms"


class ImpossibleSizesTest(unittest.TestCase):
    """Issue 54, point 4: a step whose samples cannot be held on the machine is refused by
    `launch check` and by `launch` before anything starts (it grew to 17.6 GB in 52 s); a
    generation of which not one sequence fits the device stops its sampler at once instead of
    retrying the allocation every 30 s without end."""

    CONFIG = os.path.join(ROOT, "configs", "local.toml")

    def test_a_step_that_cannot_be_held_is_refused_naming_the_keys(self):
        for sets in (["learner.group_size=1048576", "learner.batch_size=1048576"], ["learner.group_size=1048576"]):
            args = [a for kv in sets for a in ("--set", kv)]
            p = run("check", self.CONFIG, *args, timeout=60)
            self.assertEqual(p.returncode, 2, p.stdout[-500:] + p.stderr[-2000:])
            self.assertIn("[learner] batch_size x group_size", p.stderr)
            self.assertIn("lower [learner] batch_size or group_size", p.stderr)
            with tempfile.TemporaryDirectory() as d:
                t0 = time.time()
                p = run(self.CONFIG, "--run-dir", os.path.join(d, "run"), *args, timeout=60)
                self.assertEqual(p.returncode, 2, p.stderr[-2000:])
                self.assertIn("cannot be held on this machine", p.stderr)
                self.assertLess(time.time() - t0, 30)
                self.assertFalse(os.path.exists(os.path.join(d, "run")), "nothing is created")
        ok = run("check", self.CONFIG, "--set", "learner.group_size=64", timeout=60)
        self.assertEqual(ok.returncode, 0, ok.stderr[-2000:])

    def test_a_generation_that_never_fits_stops_the_sampler_instead_of_retrying(self):
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        if avail_kb * 1024 // 2 >= 60 << 30:
            self.skipTest("this machine holds the test model's one-sequence cache (64 GB)")
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from test_policy import train_tokenizer
        with tempfile.TemporaryDirectory() as d:
            # 32 layers of 256: a small model whose keys and values take 64 KB a token, 64 GB for
            # one sequence of [sampler] max_tokens = 1,048,576.
            tok = train_tokenizer("qwen2", os.path.join(d, "tokenizer.json"),
                                  files=[os.path.join("tasks", "bundled", "06_swish.py")])
            torch.manual_seed(0)
            model = os.path.join(d, "model")
            Qwen2ForCausalLM(Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=512,
                                         num_hidden_layers=32, num_attention_heads=2, num_key_value_heads=2,
                                         eos_token_id=tok.token_to_id("<|im_end|>"))).save_pretrained(model)
            shutil.copy(os.path.join(d, "tokenizer.json"), model)
            p = run(self.CONFIG, "--run-dir", os.path.join(d, "run"), "--set", f'policy.model="{model}"',
                    "--set", 'policy.dtype="f32"', "--set", "sampler.max_tokens=1048576",
                    "--set", 'sampler.backend="libtorch"', "--set", "learner.steps=1", timeout=300)
            self.assertNotEqual(p.returncode, 0, p.stderr[-3000:])
            self.assertIn("a generation that cannot fit however often it is tried", p.stderr)
            self.assertIn("for its keys, values and logits", p.stderr)
            self.assertNotIn("retrying in", p.stderr)


class StopAndRunDirTest(unittest.TestCase):
    """Issue 54: SIGTERM (and SIGINT) end a run as an interruption, its store saying so; one launch
    a run directory (a second is refused, naming the first's pid); a run directory whose store holds
    a run is not started again."""

    def slow_replay(self, d):
        # Candidates that each take a few seconds (a sleep in their first call only: one in every call
        # made each a 30 s timeout, and the test waited 40 s for the first verdict): the run is surely
        # mid-way when the signal comes.
        path = os.path.join(d, "slow.jsonl")
        with open(path, "w") as f:
            for i in range(12):
                body = (f"import time\nglobal _slept\nif '_slept' not in globals():\n    _slept = True\n"
                        f"    time.sleep(3)  # {i}\nreturn torch.nn.functional.silu(x)")
                f.write(json.dumps({"task_id": "06_swish", "completion": body}) + "\n")
        cfg = write_config(d, path, timeout_s=30)
        with open(cfg) as f:
            text = f.read().replace(f'dir = "{TASKS}"', f'dir = "{TASKS}"\nids = ["06_swish"]')
        with open(cfg, "w") as f:
            f.write(text)
        return cfg

    def test_sigterm_interrupts_the_run_cleanly_and_one_launch_holds_a_run_directory(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = self.slow_replay(d)
            run_dir = os.path.join(d, "run")
            p = subprocess.Popen([LAUNCH, cfg, "--run-dir", run_dir], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            store = os.path.join(run_dir, "store.sqlite")
            deadline = time.time() + 120
            while time.time() < deadline and p.poll() is None:
                try:
                    with sqlite3.connect(store) as db:
                        if db.execute("SELECT COUNT(*) FROM samples").fetchone()[0] >= 1:
                            break
                except sqlite3.Error:
                    pass
                time.sleep(0.2)
            self.assertIsNone(p.poll(), "the run ended before the signal")
            # A second launch on the same directory is refused while the first holds it.
            second = run(cfg, "--run-dir", run_dir)
            self.assertEqual(second.returncode, 2, second.stderr[-2000:])
            self.assertIn(f"another launch is using this run directory (pid {p.pid})", second.stderr)
            t0 = time.time()
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 128 + signal.SIGTERM, err[-3000:])
            self.assertLess(time.time() - t0, 30)
            self.assertIn("SIGTERM received: the run stops; the samples recorded so far are kept in " + run_dir, err)
            with sqlite3.connect(store) as db:
                status, = db.execute("SELECT status FROM runs").fetchone()
                recorded = db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
            self.assertEqual(status, "interrupted")
            self.assertGreaterEqual(recorded, 1)
            self.assertLess(recorded, 12)
            with open(os.path.join(run_dir, "launch.log")) as f:
                self.assertIn("interrupted: SIGTERM received", f.read())
            # Its directory holds that run: a new run there is refused, not mixed into it.
            again = run(cfg, "--run-dir", run_dir)
            self.assertEqual(again.returncode, 2, again.stderr[-2000:])
            self.assertIn(f"--run-dir {run_dir}: already holds run run (interrupted); give another --run-dir",
                          again.stderr)


class EvaluateCommandTest(unittest.TestCase):
    """`launch evaluate`: one evaluator, candidates in order, one JSON line each, exit 0."""

    def test_a_crash_then_a_correct_candidate_in_one_evaluator(self):
        task = os.path.join(TASKS, "06_swish.py")
        with tempfile.TemporaryDirectory() as d:
            files = []
            for name, body in (("crash", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\nreturn x"),
                               ("good", "```python\nreturn torch.nn.functional.silu(x)\n```"),
                               ("wrong", "return torch.relu(x)"),
                               ("hack", "import time\ntime.perf_counter_ns = lambda: 0\nreturn x")):
                path = os.path.join(d, name + ".txt")
                with open(path, "w") as f:
                    f.write(body)
                files += ["--candidate", path]
            out = run("evaluate", "--task", task, *files, "--timeout", "20", "--json")
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            rows = [json.loads(line) for line in out.stdout.splitlines()]
            self.assertEqual([os.path.basename(r["sample_id"]) for r in rows],
                             ["crash.txt", "good.txt", "wrong.txt", "hack.txt"])
            self.assertEqual([r["status"] for r in rows], ["runtime_error", "ok", "incorrect", "hacked"])
            self.assertIn("SIGSEGV", rows[0]["error"])
            good = rows[1]
            self.assertGreater(good["runtime_ms"], 0)
            self.assertGreater(good["ref_runtime_ms"], 0)
            self.assertAlmostEqual(good["speedup"], good["ref_runtime_ms"] / good["runtime_ms"], places=6)
            for key in ("error", "speedup", "runtime_ms", "ref_runtime_ms", "correctness", "kernel_coverage"):
                self.assertIn(key, rows[2])

    def test_two_evaluators_sharing_the_device_give_the_same_verdicts_in_order(self):
        task = os.path.join(TASKS, "06_swish.py")
        with tempfile.TemporaryDirectory() as d:
            files = []
            for name, body in (("good", "return torch.nn.functional.silu(x)"), ("wrong", "return torch.relu(x)"),
                               ("good2", "return x * torch.sigmoid(x)"), ("raises", "if x.numel():\n    raise ValueError('no')\nreturn x")):
                path = os.path.join(d, name + ".txt")
                with open(path, "w") as f:
                    f.write(body)
                files += ["--candidate", path]
            log = os.path.join(d, "worker.log")
            out = run("evaluate", "--task", task, *files, "--per-device", "2", "--worker-log", log, "--json")
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            rows = [json.loads(line) for line in out.stdout.splitlines()]
            self.assertEqual([os.path.basename(r["sample_id"]) for r in rows],
                             ["good.txt", "wrong.txt", "good2.txt", "raises.txt"])
            self.assertEqual([r["status"] for r in rows], ["ok", "incorrect", "ok", "runtime_error"])
            self.assertTrue(os.path.exists(log) and os.path.exists(log + ".2"), "a worker process each")
            out = run("evaluate", "--task", task, *files, "--per-device", "0")
            self.assertEqual(out.returncode, 2)
            self.assertIn("--per-device", out.stderr)

    def test_candidates_of_several_tasks_in_one_evaluator(self):
        with tempfile.TemporaryDirectory() as d:
            paths = {}
            for name, body in (("swish", "return x * torch.sigmoid(x)"), ("rowsum", "return x.sum(dim=1)"),
                               ("rowsum_wrong", "return x.sum(dim=0)")):
                paths[name] = os.path.join(d, name + ".txt")
                with open(paths[name], "w") as f:
                    f.write(body)
            # A --candidate before any --task belongs to the first --task.
            out = run("evaluate", "--candidate", paths["swish"], "--task", os.path.join(TASKS, "06_swish.py"),
                      "--task", os.path.join(TASKS, "09_row_sum.py"), "--candidate", paths["rowsum"],
                      "--candidate", paths["rowsum_wrong"], "--json")
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            rows = [json.loads(line) for line in out.stdout.splitlines()]
            self.assertEqual([(r["task_id"], r["status"]) for r in rows],
                             [("06_swish", "ok"), ("09_row_sum", "ok"), ("09_row_sum", "incorrect")])
            for r in rows:  # stamps of the device stage, in order
                self.assertLessEqual(r["ready_at"], r["device_start"])
                self.assertLess(r["device_start"], r["device_end"])
            self.assertLessEqual(rows[0]["device_end"], rows[1]["device_start"])

    def test_the_compile_stage_builds_once_and_the_timing_stage_uses_that_build(self):
        with open(os.path.join(ROOT, "tests", "fixtures", "cpu_candidates", "swish_cpp.txt")) as f:
            good = f.read()
        with tempfile.TemporaryDirectory() as d:
            files = []
            for name, body in (("a", good), ("b", good),
                               ("bad", good.replace("torch::sigmoid(x)", "undefined_symbol(x)"))):
                path = os.path.join(d, name + ".txt")
                with open(path, "w") as f:
                    f.write(body)
                files += ["--candidate", path]
            out = subprocess.run([LAUNCH, "evaluate", "--task", os.path.join(TASKS, "06_swish.py"), *files,
                                  "--compile-workers", "2", "--timeout", "60", "--json"],
                                 capture_output=True, text=True, timeout=900, env=dict(os.environ, XDG_CACHE_HOME=d))
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            rows = [json.loads(line) for line in out.stdout.splitlines()]
            self.assertEqual([r["status"] for r in rows], ["ok", "ok", "compile_error"], rows)
            self.assertTrue(rows[2]["error"])
            self.assertEqual(rows[2]["device_start"], 0, "a failed build never reaches the device stage")
            # Two compile workers got the same candidate: one built it, the other found it built.
            self.assertEqual(sorted(r["compile_cached"] for r in rows[:2]), [False, True])
            for r in rows[:2]:  # no stage fell back to building it itself
                self.assertNotIn("built again", r["compile_log"])
                self.assertNotIn("the timing stage builds it", r["compile_log"])
            cache = os.path.join(d, "kernelrl", "build-cache")
            built = [e for e in os.listdir(cache)
                     if any(n == "manifest.json" for n in os.listdir(os.path.join(cache, e)))]
            self.assertEqual(len(built), 1)
            # The device stage imported that build: nothing was built twice (ninja logs one entry
            # for the object and one for the library).
            with open(os.path.join(cache, built[0], ".ninja_log")) as f:
                entries = [l for l in f if not l.startswith("#")]
            self.assertEqual(len(entries), 2, entries)

    def test_only_the_worker_process_is_answered_on_its_socket(self):
        """Issue 19, finding 4: a process of the same user that reaches the worker's socket and
        answers in the worker's place (every reply a forged `ok`) is never connected: the
        evaluator binds the socket for the worker's pid only."""
        import glob
        import threading
        import msgpack
        import zmq
        with tempfile.TemporaryDirectory() as d:
            files = []
            for i in range(4):
                path = os.path.join(d, f"wrong{i}.txt")
                with open(path, "w") as f:
                    f.write(f"return torch.relu(x) + {i}")
                files += ["--candidate", path]
            proc = subprocess.Popen([LAUNCH, "evaluate", "--task", os.path.join(TASKS, "06_swish.py"), *files,
                                     "--timeout", "20", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=dict(os.environ, TMPDIR=d))
            answered, connected, stop = [], [], threading.Event()
            where = os.path.join(d, "kernelrl-*", "worker-*", "socket", "worker.sock")

            def impostor():
                while not stop.is_set() and not glob.glob(where):
                    time.sleep(0.005)
                if stop.is_set():
                    return
                sock = zmq.Context.instance().socket(zmq.REP)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect("ipc://" + glob.glob(where)[0])
                connected.append(True)
                forged = msgpack.packb({"ok": True, "status": "ok", "speedup": 9.5, "pid": 1, "torch_version": "x",
                                        "device": "cpu", "capability": "", "network": "netns"})
                while not stop.is_set():
                    if sock.poll(20):
                        answered.append(sock.recv())
                        sock.send(forged)
                sock.close()

            t = threading.Thread(target=impostor)
            t.start()
            try:
                out, err = proc.communicate(timeout=600)
            finally:
                stop.set()
                t.join()
            self.assertEqual(proc.returncode, 0, err[-3000:])
            rows = [json.loads(line) for line in out.splitlines()]
            self.assertEqual([r["status"] for r in rows], ["incorrect"] * 4, rows)
            self.assertEqual(connected, [True], "the impostor never found the worker's socket")
            self.assertEqual(answered, [], "a request reached a process other than the worker")

    def test_bad_arguments_exit_2(self):
        out = run("evaluate", "--task", os.path.join(TASKS, "06_swish.py"))
        self.assertEqual(out.returncode, 2)
        self.assertIn("--candidate", out.stderr)
        out = run("evaluate", "--task", "/no/such/task.py", "--candidate", "/etc/hostname")
        self.assertEqual(out.returncode, 2)
        self.assertIn("/no/such/task.py", out.stderr)


class BadInputTest(unittest.TestCase):
    def test_bad_replay_lines_are_reported_and_unknown_tasks_recorded(self):
        with tempfile.TemporaryDirectory() as d:
            replay = os.path.join(d, "replay.jsonl")
            with open(replay, "w") as f:
                f.write('{"task_id": "01_diag_matmul", "completion": \n')
                f.write('{"task_id": "01_diag_matmul"}\n')
                f.write('{"task_id": "99_missing", "completion": "return A"}\n')
                f.write('{"task_id": "01_diag_matmul", "completion": "return A.unsqueeze(1) * B"}\n')
            out = run(write_config(d, replay), "--run-dir", os.path.join(d, "run"))
            self.assertEqual(out.returncode, 0, out.stderr[-3000:])
            self.assertIn(f"{replay}:1: not valid JSON", out.stderr)
            self.assertIn(f"{replay}:2: completion: expected a string", out.stderr)
            samples = {s["task_id"]: s for s in export(os.path.join(d, "run"))}
            self.assertEqual(set(samples), {"99_missing", "01_diag_matmul"})
            self.assertEqual(samples["99_missing"]["status"], "runtime_error")
            self.assertIn("no such task", samples["99_missing"]["error"])
            self.assertEqual(samples["01_diag_matmul"]["status"], "ok")

    def test_evaluators_that_cannot_start_end_the_run_with_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = write_config(d, REPLAY, extra_eval='python = "/bin/false"')
            out = run(cfg, "--run-dir", os.path.join(d, "run"), timeout=120)
            self.assertEqual(out.returncode, 1)
            self.assertIn("did not start", out.stderr)
            self.assertIn("no evaluator is running", out.stderr)
            db = sqlite3.connect(os.path.join(d, "run", "store.sqlite"))
            self.assertEqual(db.execute("SELECT status FROM runs").fetchone()[0], "failed")


if __name__ == "__main__":
    unittest.main()
