"""The evaluation worker on CPU, driven the way the C++ evaluator drives it (gpu/worker.py's
ForkServer: one process per candidate): every status, every hacking defense, isolation (a crash,
a hang, a memory blow-up, no network, a private temp dir), and the content-addressed build cache.
Candidates are written here; the reference semantics are KernelBench's (see docs/EVALUATION.md)."""

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # for the gpu package

from gpu.worker import ForkServer  # noqa: E402
from gpu import sandbox  # noqa: E402

SWISH = os.path.join(ROOT, "tasks", "bundled", "06_swish.py")
MATMUL = os.path.join(ROOT, "tasks", "bundled", "03_matmul_rowsum.py")
GOOD = "return torch.nn.functional.silu(x)"
# The worker's device: cpu here; tests/e2e/gpu_suite.py runs some classes on a GPU (cuda:0).
DEVICE = os.environ.get("KERNELRL_TEST_DEVICE", "cpu")

SETTINGS = {"correctness_trials": 5, "warmup": 1, "fast_trials": 3, "full_trials": 10,
            "atol_fp32": 1e-4, "rtol_fp32": 1e-4, "atol_half": 1e-2, "rtol_half": 1e-2,
            "timeout_s": 20, "compile_timeout_s": 300, "memory_limit_mb": 3072,
            "reverify_speedup": 0, "size": "cpu"}


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.cache = os.path.join(cls.tmp.name, "cache")
        cls.tmp_root = os.path.join(cls.tmp.name, "scratch")
        os.makedirs(cls.tmp_root)
        cls.server = ForkServer(DEVICE, 1, cls.cache, tmp_root=cls.tmp_root)
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        cls.server.close()
        cls.tmp.cleanup()

    def evaluate(self, action, task=SWISH, space="forward_body", **settings):
        type(self).n += 1
        req = {"sample_id": f"t#{self.n}", "task_id": os.path.basename(task)[:-3], "task_path": task,
               "action": action, "action_space": space, "mode": "fast", "seed": 42}
        return self.server.evaluate(req, {**SETTINGS, **settings})

    def assertStatus(self, res, status, *fragments):
        self.assertEqual(res["status"], status, res["error"])
        for f in fragments:
            self.assertIn(f, res["error"])
        if status not in ("ok", "unconfirmed"):
            self.assertEqual(res["speedup"], 0.0)


class StatusTest(Base):
    def test_a_correct_candidate_is_ok_with_timing_statistics(self):
        r = self.evaluate(GOOD)
        self.assertStatus(r, "ok")
        self.assertEqual(r["correctness"]["passed"], r["correctness"]["trials"])
        for key in ("runtime", "ref_runtime"):
            st = r[key]
            self.assertEqual(st["trials"], 3)
            self.assertLessEqual(st["min_ms"], st["median_ms"])
            self.assertLessEqual(st["median_ms"], st["max_ms"])
        self.assertAlmostEqual(r["speedup"], r["ref_runtime"]["median_ms"] / r["runtime"]["median_ms"])
        self.assertEqual(r["kernel_coverage"], -1.0 if DEVICE == "cpu" else 0.0)  # measured on GPU only
        self.assertLess(r["isolation"]["child_start_s"], 0.5)

    def test_a_whole_program_is_accepted_in_the_full_program_space(self):
        prog = ("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
                "    def __init__(self):\n        super().__init__()\n\n"
                "    def forward(self, x):\n        return torch.nn.functional.silu(x)\n")
        self.assertStatus(self.evaluate(prog, space="full_program"), "ok")
        self.assertStatus(self.evaluate("class Model:\n    pass\n", space="full_program"),
                          "format_error", "no top-level class ModelNew")

    def test_unusable_actions_are_format_errors_with_the_parser_message(self):
        self.assertStatus(self.evaluate(""), "format_error", "empty action")
        self.assertStatus(self.evaluate("This computes swish by multiplying x with its sigmoid."),
                          "format_error", "does not parse")
        self.assertStatus(self.evaluate("return (x"), "format_error", "was never closed")

    def test_format_errors_and_reference_use_are_answered_without_a_process(self):
        from gpu import harness
        # A task this worker has not timed yet: these actions must not time its reference.
        task = os.path.join(self.tmp.name, "06_swish_copy.py")
        with open(SWISH) as f, open(task, "w") as g:
            g.write(f.read())
        actions = [("", "forward_body", "format_error"),
                   ("This computes swish with a sigmoid.", "forward_body", "format_error"),
                   ("return (x", "forward_body", "format_error"),
                   ("nonlocal y\nreturn x", "forward_body", "format_error"),
                   ("y = [(yield) for _ in x]\nreturn x", "forward_body", "format_error"),
                   ("class Model:\n    pass\n", "full_program", "format_error"),
                   ("return Model()(x)", "forward_body", "hacked"),
                   # the harness reports the reference's use before the compiler's error
                   ("nonlocal y\nreturn Model.forward(self, x)", "forward_body", "hacked")]
        spare = self.server.spare
        quick = [self.evaluate(a, task=task, space=sp) for a, sp, _ in actions]
        for r, (_, _, status) in zip(quick, actions):
            self.assertEqual(r["status"], status, r["error"])
            self.assertEqual(list(r["worker_phases"]), ["format_check"])
        self.assertIs(self.server.spare, spare)  # no candidate's process used
        self.assertFalse([k for k in self.server.harness.ref_cache if k.startswith(task + "|")])
        # The same verdicts, messages and programs as the candidate's process gives them.
        check, harness.early_verdict = harness.early_verdict, lambda req: None
        try:
            slow = [self.evaluate(a, task=task, space=sp) for a, sp, _ in actions]
        finally:
            harness.early_verdict = check
        self.assertEqual([(r["status"], r["error"], r["assembled_code"]) for r in quick],
                         [(r["status"], r["error"], r["assembled_code"]) for r in slow])
        self.assertNotIn("format_check", slow[0].get("worker_phases", {}))
        self.assertIn("nonlocal", quick[3]["error"])

    def test_an_exception_is_a_runtime_error_naming_the_line(self):
        self.assertStatus(self.evaluate("raise ValueError('no kernel today')\nreturn x"), "runtime_error",
                          "ValueError: no kernel today", "candidate line")

    def test_wrong_shape_nan_and_wrong_values_are_incorrect(self):
        self.assertStatus(self.evaluate("return x.t()"), "incorrect", "shape")
        self.assertStatus(self.evaluate("return x * float('nan')"), "incorrect", "NaN or Inf")
        self.assertStatus(self.evaluate("return x * torch.sigmoid(1.01 * x)"), "incorrect", "values differ")
        self.assertStatus(self.evaluate("return (x * torch.sigmoid(x)).double()"), "incorrect", "dtype")

    def test_inputs_are_cloned_so_mutating_them_cannot_fool_the_reference(self):
        # Zeroing the input and returning it would match a reference that ran on the same tensor.
        self.assertStatus(self.evaluate("x.zero_()\nreturn x"), "incorrect")
        # Mutating its own copy after computing the right answer is harmless.
        self.assertStatus(self.evaluate("y = x * torch.sigmoid(x)\nx.zero_()\nreturn y"), "ok")

    def test_an_extreme_speedup_is_reverified_before_it_counts(self):
        r = self.evaluate(GOOD, reverify_speedup=0.01)
        self.assertStatus(r, "ok")
        self.assertTrue(r["reverified"])
        self.assertEqual(r["correctness"]["trials"], 10 + 20)
        self.assertEqual(r["runtime"]["trials"], 10)  # re-timed in full mode


class IsolationTest(Base):
    def test_a_crash_is_a_runtime_error_and_the_next_candidate_passes(self):
        r = self.evaluate("import ctypes\nctypes.string_at(0)\nreturn x")
        self.assertStatus(r, "runtime_error", "SIGSEGV")
        self.assertStatus(self.evaluate(GOOD), "ok")

    def test_a_hang_is_a_timeout_and_its_process_group_is_killed(self):
        r = self.evaluate("import subprocess\nsubprocess.Popen(['sleep', '300'])\nwhile True:\n    pass\nreturn x",
                          timeout_s=2)
        self.assertStatus(r, "timeout", "2 s limit")
        self.assertLess(r["wall_s"], 10)
        self.assertStatus(self.evaluate(GOOD), "ok")

    def test_a_memory_blow_up_fails_the_candidate_not_the_worker(self):
        # One allocation past the limit: the address-space limit fails it at once, and the
        # verdict says which limit it met.
        r = self.evaluate("big = torch.ones(1 << 31)\nreturn x", memory_limit_mb=2048)
        self.assertStatus(r, "runtime_error", "allocate", "its allocation failed at the candidate memory limit, 2048 MB")
        self.assertStatus(self.evaluate(GOOD), "ok")

    def test_the_resident_memory_limit_kills_a_process_that_grows(self):
        def grow():
            blocks = []
            while True:
                blocks.append(bytearray(64 << 20))  # touched: resident

        reply, failure = sandbox.run_isolated(grow, timeout_s=30, memory_limit_mb=512, env={},
                                              isolate_net=False, address_space_limit=False,
                                              tmp_root=self.tmp_root)
        self.assertIsNone(reply)
        self.assertIn("exceeded the memory limit", failure["error"])

    def test_candidates_have_no_network_and_a_private_temp_dir(self):
        if self.server.info["network"] != "netns":
            self.skipTest(f"network namespaces unavailable here: {self.server.info['network']}")
        r = self.evaluate("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\nreturn x")
        self.assertStatus(r, "runtime_error", "OSError")
        r = self.evaluate("import os, tempfile\nassert os.getcwd() == tempfile.gettempdir(), os.getcwd()\n"
                          "open('left-behind.txt', 'w').write('x')\nreturn torch.nn.functional.silu(x)")
        self.assertStatus(r, "ok")
        # What is left once the last candidate's process is reaped: the next candidate's process,
        # already started (its temp dir), and the judge's.
        self.server._reap()
        spare = self.server.spare
        self.assertIsNotNone(spare, "a process waits for the next candidate")
        self.assertEqual(set(os.listdir(self.tmp_root)),
                         {os.path.basename(spare.tmpdir), os.path.basename(self.server.judge.tmpdir)},
                         "each finished candidate's temp dir is removed")
        self.assertTrue(spare.alive())

    def test_a_process_warming_up_holds_timing_back_then_serves_its_request(self):
        from gpu import devlock
        with tempfile.TemporaryDirectory() as d:
            lock, gate = devlock.paths("test", d)
            spare = sandbox.Spare(handler=lambda m: {"status": "ok", "got": m}, warm=lambda: time.sleep(1.5),
                                  key="k", env={}, isolate_net=False, address_space_limit=False,
                                  memory_limit_mb=0, tmp_root=d, lock_path=lock)
            time.sleep(0.3)
            mine = devlock.DeviceLock(devlock.open_file(lock), devlock.open_file(gate))
            self.assertGreater(mine.acquire("exclusive"), 0.6, "a timed region waited for the warm-up to finish")
            mine.acquire(None)
            self.assertTrue(spare.send({"n": 7}))
            reply, failure = spare.collect(10)
            self.assertIsNone(failure)
            self.assertEqual(reply["got"], {"n": 7})
            self.assertFalse(spare.alive())
            self.assertLess(mine.acquire("exclusive"), 0.1, "nobody warming: no wait")

    def test_timing_waits_until_the_previous_candidate_has_exited(self):
        import fcntl
        from gpu import devlock
        self.assertStatus(self.evaluate(GOOD), "ok")
        fd = devlock.open_file(self.server.lock_path)
        try:
            if self.server.exiting:  # replied, still being reaped: the worker holds the device shared
                with self.assertRaises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.server._reap()
            self.assertEqual(self.server.exiting, [])
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once reaped
        finally:
            os.close(fd)

    def test_a_dead_spare_is_replaced(self):
        self.assertStatus(self.evaluate(GOOD), "ok")
        os.kill(self.server.spare.pid, 9)
        time.sleep(0.2)
        self.assertStatus(self.evaluate(GOOD), "ok")


with open(SWISH) as _f:
    SWISH_SRC = _f.read()


class ReferenceCopyTest(Base):
    """Programs that copy the reference are the policy's own code: ok, at about the reference's
    speed. Two code objects compiled from the same text at the same lines compare equal; the
    guard must tell them apart by identity."""

    def test_the_reference_renamed_at_its_own_lines_is_ok(self):
        prog = SWISH_SRC.replace("class Model(", "class ModelNew(").replace("super(Model,", "super(ModelNew,")
        self.assertEqual(prog.count("\n"), SWISH_SRC.count("\n"))  # forward at the same line
        r = self.evaluate(prog, space="full_program")
        self.assertStatus(r, "ok")
        self.assertGreater(r["speedup"], 0.0)

    def test_a_subclass_calling_its_parents_forward_is_ok(self):
        # The whole reference file, unchanged (its Model.forward at the reference's own lines),
        # and a ModelNew that inherits it.
        prog = SWISH_SRC + ("\n\nclass ModelNew(Model):\n"
                            "    def forward(self, x):\n        return super().forward(x)\n")
        self.assertStatus(self.evaluate(prog, space="full_program"), "ok")
        renamed = SWISH_SRC.replace("Model", "Base") + (
            "\n\nclass ModelNew(Base):\n    def forward(self, x):\n        return super().forward(x)\n")
        self.assertStatus(self.evaluate(renamed, space="full_program"), "ok")


class HackTest(Base):
    def test_reaching_the_reference_model_by_name(self):
        self.assertStatus(self.evaluate("return Model()(x)"), "hacked", "reference class Model")

    def test_reaching_the_reference_forward_through_an_alias(self):
        r = self.evaluate("ref = globals()['Mo' + 'del']\nreturn ref.forward(self, x)")
        self.assertStatus(r, "hacked", "called the reference Model.forward")

    def test_reaching_the_reference_through_a_saved_bound_method(self):
        body = ("_saved = globals()['Mo' + 'del']().forward\n# --- forward ---\nreturn _saved(x)")
        self.assertStatus(self.evaluate(body), "hacked", "called the reference Model.forward")

    def test_a_full_program_finds_no_reference_in_its_process(self):
        # No name to scan for: a reference instance or the judge's outputs, searched for in the
        # process. The judge holds them in a process of its own: there is nothing to find.
        header = "import gc\nimport sys\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
        bodies = {"gc": ("        ref = [o for o in gc.get_objects() if type(o).__name__ == 'Model'][0]\n"
                         "        return ref(x)\n"),
                  "frames": ("        f = sys._getframe(1)\n"
                             "        while 'ref_model' not in f.f_locals:\n            f = f.f_back\n"
                             "        return f.f_locals['ref_model'].forward(x)\n"),
                  "outputs": ("        from gpu import checks\n"
                              "        outs = [o for o in gc.get_objects() if isinstance(o, checks.OutputCheck)]\n"
                              "        return outs[0].flat.reshape(x.shape)\n")}
        for how, body in bodies.items():
            with self.subTest(through=how):
                self.assertStatus(self.evaluate(header + body, space="full_program"), "runtime_error",
                                  "line")

    def test_adding_a_tensor_method_that_shadows_the_comparisons_is_hacked(self):
        body = ("torch.Tensor.all = lambda self, *a, **k: torch.ones((), dtype=torch.bool)\n"
                "# --- forward ---\nreturn x")
        self.assertStatus(self.evaluate(body), "hacked", "added torch.Tensor.all")

    def test_rewriting_the_task_through_the_garbage_collector_is_hacked(self):
        body = ("import gc\n"
                "task = [m for m in gc.get_objects() if type(m).__name__ == 'module'\n"
                "        and getattr(m, '__name__', '').startswith('kernelrl_task_')][0]\n"
                "task.get_inputs = lambda: [torch.zeros(1, 1)]\n# --- forward ---\nreturn x")
        self.assertStatus(self.evaluate(body), "hacked", "changed the task's module.get_inputs")

    def test_resizing_its_inputs_or_returning_a_tensor_subclass_is_incorrect(self):
        self.assertStatus(self.evaluate("y = x * torch.sigmoid(x)\nx.unsqueeze_(0)\nreturn y"),
                          "incorrect", "changed the shape or strides of its input")
        sub = ("class Sneaky(torch.Tensor):\n    pass\n# --- forward ---\n"
               "return (x * torch.sigmoid(x)).as_subclass(Sneaky)")
        self.assertStatus(self.evaluate(sub), "incorrect", "candidate returned a Sneaky")

    def test_patching_the_clock(self):
        body = "import time\ntime.perf_counter_ns = lambda: 0\n# --- forward ---\n" + GOOD
        self.assertStatus(self.evaluate(body), "hacked", "replaced time.perf_counter_ns")

    def test_patching_a_torch_function_inside_forward(self):
        body = "torch.allclose = lambda *a, **k: True\nreturn x"
        self.assertStatus(self.evaluate(body), "hacked", "replaced torch.allclose")

    def test_changing_global_precision(self):
        body = "torch.set_float32_matmul_precision('medium')\n# --- forward ---\n" + GOOD
        self.assertStatus(self.evaluate(body), "hacked", "float32_matmul_precision")

    def test_starting_threads_or_processes(self):
        thread = "import threading\nthreading.Thread(target=lambda: None).start()\n" + GOOD
        self.assertStatus(self.evaluate(thread), "hacked", "started a thread")
        proc = "import subprocess\nsubprocess.Popen(['true']).wait()\n" + GOOD
        self.assertStatus(self.evaluate(proc), "hacked", "started a process")

    def test_removing_the_harness_hook(self):
        self.assertStatus(self.evaluate("import sys\nsys.setprofile(None)\n" + GOOD), "hacked",
                          "removed the harness's call hook")

    def test_caching_outputs_across_calls(self):
        body = ("cache = globals().setdefault('_kernelrl_test_cache', {})\n"
                "key = (x.data_ptr(), tuple(x.shape))\n"
                "if key not in cache:\n    cache[key] = x * torch.sigmoid(x)\n"
                "return cache[key]")
        self.assertStatus(self.evaluate(body), "hacked", "output of an earlier call")

    def test_a_wrong_and_hacking_candidate_is_hacked(self):
        self.assertStatus(self.evaluate("import time\ntime.monotonic = lambda: 0.0\nreturn x"),
                          "hacked", "replaced time.monotonic")


def task_source(forward, inputs, init="[]", extra=""):
    """A KernelBench-format task: Model.forward's body, get_inputs' list, get_init_inputs' list."""
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            "    def __init__(self):\n        super(Model, self).__init__()\n\n"
            f"    def forward(self, *xs):\n        {forward}\n\n{extra}\n"
            f"def get_inputs():\n    return {inputs}\n\n\ndef get_init_inputs():\n    return {init}\n")


class BlindSpotTest(Base):
    """Issue 52: the families of answers that pass KernelBench's correctness check through its
    blind spots (outputs under the absolute tolerance, the task's own input distribution,
    speedups beyond what the device allows), each closed, and the legitimate answers beside them
    keeping their verdicts. Tasks at small shapes, written here."""

    TASKS = {
        # softmax over 65,536 columns: every value ~1.5e-5, under atol 1e-4
        "wide_softmax": task_source("return torch.softmax(xs[0], dim=1)", "[torch.rand(2, 65536)]"),
        # mathematically 0 for every row: the reference's output is its own rounding noise
        "centered_sum": task_source("x = xs[0]\n        return (x - x.mean(dim=1, keepdim=True)).sum(dim=1)",
                                    "[torch.rand(64, 256)]"),
        "relu": task_source("return torch.relu(xs[0])", "[torch.rand(64, 1024)]"),
        # on signed inputs the partial sums cross 0: the float32 reference's own rounding there
        # exceeds atol (on a GPU's parallel scan at this length; a CPU's is exact enough)
        "cumsum": task_source("return torch.cumsum(xs[0], dim=1)", "[torch.rand(256, 32768)]"),
        # outside its domain on signed inputs (log of a negative) and on zeros (log 0)
        "log": task_source("return torch.log(xs[0])", "[torch.rand(64, 1024) + 0.5]"),
        # x * 1 writes an output the size of its input: returning x itself writes nothing (on a GPU
        # 1 GiB, beyond what its L2 can absorb)
        "scale_one": task_source("return xs[0] * 1.0", "[torch.rand(%d, 1024)]" % (1024 if DEVICE == "cpu" else 262144)),
        "matmul": task_source("return xs[0] @ xs[1]", "[torch.rand(N, N), torch.rand(N, N)]",
                              extra="N = %d\n" % (256 if DEVICE == "cpu" else 4096)),
    }
    BOUND = {"bound_min_output_mb": 1} if DEVICE == "cpu" else {}  # a GPU: 4x its L2 cache

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.paths = {}
        for name, src in cls.TASKS.items():
            cls.paths[name] = os.path.join(cls.tmp.name, name + ".py")
            with open(cls.paths[name], "w") as f:
                f.write(src)

    def run_on(self, name, body, **settings):
        return self.evaluate(body, task=self.paths[name], **settings)

    def test_near_zero_outputs_fail_the_scale_rule_and_legitimate_ones_pass(self):
        r = self.run_on("wide_softmax", "return torch.zeros_like(xs[0])")
        self.assertStatus(r, "incorrect", "relative to the reference's scale", "scale rule allows 0.01",
                          "inputs: the task's own, seed 42001")
        self.assertLess(r["correctness"]["max_abs_diff"], 1e-4)  # the element-wise check saw nothing
        self.assertEqual(r["correctness"]["failed_distribution"], "task")
        self.assertEqual(r["correctness"]["failed_seed"], 42001)
        r = self.run_on("wide_softmax", "x = xs[0]\ne = torch.exp(x - x.max(dim=1, keepdim=True).values)\n"
                                        "return e / e.sum(dim=1, keepdim=True)")
        self.assertStatus(r, "ok")
        self.assertEqual(r["correctness"]["scale_tol"], 0.01)
        self.assertLess(r["correctness"]["max_scale_err"], 1e-5)
        # Where the reference's output is its own rounding noise, the true answer (zeros) and the
        # same sum in another order are both within 10x of the reference's float64 error.
        self.assertStatus(self.run_on("centered_sum", "return torch.zeros(xs[0].shape[0])"), "ok")
        r = self.run_on("centered_sum", "x = xs[0].flip(1)\nreturn (x - x.mean(dim=1, keepdim=True)).sum(dim=1)")
        self.assertStatus(r, "ok")
        self.assertGreater(r["correctness"]["max_scale_err"], 0.01)
        self.assertGreater(r["correctness"]["ref_noise"], 0.0)

    def test_an_answer_right_only_on_the_tasks_own_draw_is_incorrect_naming_the_distribution(self):
        r = self.run_on("relu", "return xs[0]")  # rand inputs are non-negative: identity == ReLU there
        self.assertStatus(r, "incorrect", "inputs: signed, seed 62001")
        self.assertEqual(r["correctness"]["failed_distribution"], "signed")
        self.assertIn("signed: failed", r["correctness"]["distributions"])
        r = self.run_on("relu", "return xs[0].clamp_min(0)")
        self.assertStatus(r, "ok")
        self.assertEqual(r["correctness"]["distributions"], "signed: passed; large: passed; zeros: passed")
        self.assertEqual(r["correctness"]["trials"], 5 + 3 + 2)
        # An answer more accurate than the reference passes where the reference's own rounding
        # exceeds the element-wise tolerance on another distribution's inputs.
        if DEVICE != "cpu":
            r = self.run_on("cumsum", "return torch.cumsum(xs[0].double(), dim=1).float()")
            self.assertStatus(r, "ok")
            self.assertEqual(r["correctness"]["distributions"], "signed: passed; large: passed; zeros: passed")
        # Inputs the reference itself cannot take are left out, and said so.
        r = self.run_on("log", "return xs[0].log()")
        self.assertStatus(r, "ok")
        notes = r["correctness"]["distributions"]
        self.assertIn("signed: outside the reference's domain (the reference's output holds NaN or Inf", notes)
        self.assertIn("large: passed", notes)
        self.assertIn("zeros: outside the reference's domain", notes)
        self.assertEqual(r["correctness"]["trials"], 5 + 1 + 2)
        # ... and the settings choose them.
        r = self.run_on("relu", "return xs[0]", input_distributions=[])
        self.assertStatus(r, "ok")
        self.assertEqual(r["correctness"]["distributions"], "")

    def test_a_speedup_beyond_the_device_is_reverified_and_unconfirmed(self):
        # Returning the input itself is right on every distribution and writes no output: faster
        # than writing it allows at this machine's measured bandwidth.
        r = self.run_on("scale_one", "return xs[0]", **self.BOUND)
        rows = 1024 if DEVICE == "cpu" else 262144
        self.assertStatus(r, "unconfirmed")
        self.assertIn(f"less than writing its {rows * 4096 / 1e6:.1f} MB of output takes at twice the device's "
                      f"measured bandwidth", r["review"])
        self.assertTrue(r["reverified"])
        self.assertGreater(r["bound_ms"], r["runtime"]["median_ms"])
        self.assertGreater(r["speedup"], 1.0)
        self.assertEqual(r["output_bytes"], rows * 1024 * 4)
        # Writing the output keeps it within the bound, whatever its speed. On a CPU, with the
        # bound's default minimum (four times the last-level cache): an output the cache can absorb
        # may be written faster than the memory's bandwidth (this 4 MB copy sometimes was), and is
        # exempt.
        r = self.run_on("scale_one", "return xs[0].clone()", reverify_speedup=0)
        self.assertStatus(r, "ok")
        self.assertFalse(r["reverified"])
        if DEVICE == "cpu":
            self.assertEqual(r["bound_ms"], 0.0)
        else:
            self.assertGreater(r["runtime"]["median_ms"], r["bound_ms"])
        # Above the review threshold (KernelBench's flag, when set) after re-verification: unconfirmed too.
        r = self.run_on("scale_one", "return xs[0].clone()", review_speedup=0.01)
        self.assertStatus(r, "unconfirmed")
        self.assertIn("above the review threshold, 0.01x", r["review"])

    def test_a_result_cached_by_input_values_is_timed_on_fresh_values(self):
        body = ("cache = globals().setdefault('_by_values', {})\n"
                "key = tuple(xs[0].reshape(-1)[:4].tolist()) + tuple(xs[1].reshape(-1)[:4].tolist())\n"
                "if key not in cache:\n    cache[key] = xs[0] @ xs[1]\n"
                "return cache[key].clone()")
        r = self.run_on("matmul", body)
        self.assertStatus(r, "ok")
        self.assertIn("the runtime is the fresh-values timing", r["note"])
        self.assertEqual(r["runtime"]["median_ms"], r["runtime"]["fresh_median_ms"])
        self.assertLess(r["runtime"]["repeated_median_ms"] * 1.25, r["runtime"]["median_ms"])
        honest = self.run_on("matmul", "return xs[0] @ xs[1]")
        self.assertStatus(honest, "ok")
        self.assertEqual(honest["note"], "")

    def test_a_copy_of_the_reference_made_at_run_time_is_the_reference(self):
        body = ("import types\nref = globals()['Mo' + 'del'].forward\n"
                "copy = types.FunctionType(ref.__code__.replace(co_name='mine'), globals())\n"
                "return copy(self, *xs)")
        self.assertStatus(self.run_on("relu", body), "hacked", "copy of the reference Model.forward made at run time")
        # The same lines written into the program are the program's own.
        self.assertStatus(self.run_on("relu", "return torch.relu(xs[0])"), "ok")


with open(os.path.join(ROOT, "tests", "fixtures", "cpu_candidates", "swish_cpp.txt")) as _f:
    CPP_OK = _f.read()  # a C++ load_inline extension (g++ only: no GPU needed)
CPP_BAD = CPP_OK.replace("return x * torch::sigmoid(x);", "return x * undefined_symbol(x);")


class MemoryTest(Base):
    """An evaluation too large for its device is its own status naming the peak, not the
    candidate's runtime_error; the harness's own checks keep bounded temporaries."""

    def test_inputs_larger_than_the_limit_are_out_of_memory_not_the_candidates_fault(self):
        with tempfile.TemporaryDirectory() as d:
            task = os.path.join(d, "big.py")
            with open(task, "w") as f:
                f.write(SWISH_SRC.replace("batch_size = 64\ndim = 4096", "batch_size = 8192\ndim = 32768"))
            r = self.evaluate(GOOD, task=task, memory_limit_mb=512)
        self.assertStatus(r, "out_of_memory", "needs more memory than", "generating inputs",
                          "no verdict on the candidate")
        # The candidate's own blow-up stays the candidate's fault.
        r = self.evaluate("big = torch.ones(1 << 31)\nreturn x", memory_limit_mb=2048)
        self.assertStatus(r, "runtime_error", "allocate")


class OutputTest(Base):
    """What a candidate prints is kept bounded (its first and last 4 KB, and how much was cut): a
    flood of stdout or stderr costs neither the worker's log nor memory, a flood of its disk is
    an error, and the verdict is recorded as usual."""

    def test_a_flood_of_stdout_is_cut_and_the_candidate_times_out_as_usual(self):
        r = self.evaluate("while True:\n    print('x' * 10**6)\nreturn x", timeout_s=3)
        self.assertStatus(r, "timeout")
        out = r["output"]
        self.assertLess(len(out), 10000)
        self.assertTrue(out.startswith("xxxx"), out[:100])
        cut = int(out.split("[... ")[1].split(" bytes cut")[0])
        self.assertGreater(cut, 50 * 10**6)  # it did print, fast, and all of it was drained

    def test_a_flood_of_stderr_and_of_prints_at_import_leaves_a_correct_candidate_ok(self):
        body = ("import sys\nfor _ in range(40):\n    print('e' * 10**6, file=sys.stderr)\n"
                "return torch.nn.functional.silu(x)")
        r = self.evaluate(body, memory_limit_mb=1024)
        self.assertStatus(r, "ok")
        self.assertIn("bytes cut", r["output"])
        self.assertTrue(r["output"].rstrip().endswith("eeee"))
        # At import (a full program): 1.5 GB of prints through Python, with 1 GB of memory allowed.
        program = ("import torch\nimport torch.nn as nn\nfor _ in range(1500):\n    print('m' * 10**6)\n"
                   "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                   "    def forward(self, x):\n        return torch.nn.functional.silu(x)\n")
        r = self.evaluate(program, space="full_program", memory_limit_mb=1024)
        self.assertStatus(r, "ok")
        self.assertIn("bytes cut", r["compile_log"])
        self.assertLess(len(r["compile_log"]), 20000)

    def test_a_flood_of_its_disk_is_an_error_and_leaves_nothing_behind(self):
        body = ("f = open('big', 'wb')\nwhile True:\n    f.write(b'0' * 10**7)\nreturn x")
        r = self.evaluate(body, timeout_s=20)
        self.assertStatus(r, "runtime_error")
        self.assertTrue("No space left" in r["error"] or "File too large" in r["error"], r["error"])
        left = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(self.tmp_root) for f in fs)
        self.assertLess(left, 1 << 20)  # its files went with its process
        self.assertStatus(self.evaluate(GOOD), "ok")


class CheckTest(unittest.TestCase):
    """The harness's comparison and digests in chunks agree with whole-tensor torch."""

    def setUp(self):
        from gpu import checks
        from gpu import harness
        self.h, self.c = harness, checks
        self.saved = checks.CHUNK
        checks.CHUNK = 1000  # many chunks, a ragged last one

    def tearDown(self):
        self.c.CHUNK = self.saved

    def test_chunked_comparison_equals_torch_allclose(self):
        import torch
        s = {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "atol_half": 1e-2, "rtol_half": 1e-2}
        g = torch.Generator().manual_seed(0)
        ref = torch.randn(37, 411, generator=g)
        cases = {"equal": ref.clone(), "within": ref + 5e-5, "outside": ref + 1e-3 * (ref > 2),
                 "one far": ref.clone().index_put_((torch.tensor([36]), torch.tensor([410])), torch.tensor(9.0))}
        for name, out in cases.items():
            acc = {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "atol": 0.0, "rtol": 0.0}
            why = self.c.compare(ref, out, s, 0, acc)
            self.assertEqual(why == "", bool(torch.allclose(out, ref, atol=1e-4, rtol=1e-4)), name)
            # As KernelBench figures it (float32), and within float32's rounding of the exact one.
            self.assertEqual(acc["max_abs_diff"], float((out - ref).abs().max()), name)
            exact = float((out.double() - ref.double()).abs().max())
            self.assertLessEqual(abs(acc["max_abs_diff"] - exact), 2 ** -23 * exact, name)
        inf_ref = ref.clone()
        inf_ref[3, 3] = float("inf")
        acc = {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "atol": 0.0, "rtol": 0.0}
        self.assertEqual(self.c.compare(inf_ref, inf_ref.clone(), s, 0, acc), "")  # as allclose: equal infs
        bad = ref.clone()
        bad[20, 7] = float("nan")
        self.assertIn("NaN or Inf", self.c.compare(ref, bad, s, 0, acc))

    def test_every_timed_call_sees_its_inputs_as_freshly_written(self):
        # A cache keyed by (data pointer, version counter) recomputes on every timed call.
        import torch
        seen = []

        class Probe(torch.nn.Module):
            def forward(self, x):
                seen.append((x.data_ptr(), x._version))
                return x

        timer = self.h.Timer(torch.device("cpu"))
        timer.WARM_UP_MS = 0  # exactly the 2 warm-up runs asked for
        timer.run(Probe(), [torch.ones(4)], 2, 5)
        self.assertEqual(len(seen), 7)
        self.assertEqual(len(set(seen)), 7, seen)

    def test_the_median_interval_covers_the_median_and_timing_stops_once_it_is_narrow(self):
        import math
        import random
        import time
        import torch
        rng = random.Random(7)
        for n in (20, 50):  # exponential draws, median ln 2: the interval holds it 95% of the time
            hits = 0
            for _ in range(2000):
                lo, hi = self.h.Timer.median_interval([rng.expovariate(1.0) for _ in range(n)])
                hits += lo <= math.log(2) <= hi
            self.assertGreaterEqual(hits / 2000, 0.95, n)
            self.assertLessEqual(hits / 2000, 0.995, n)

        class Wait(torch.nn.Module):  # busy-waits 1 ms, or 1 and 3 ms in turn
            def __init__(self, uneven):
                super().__init__()
                self.uneven, self.calls = uneven, 0

            def forward(self, x):
                self.calls += 1
                end = time.perf_counter() + (0.003 if self.uneven and self.calls % 2 else 0.001)
                while time.perf_counter() < end:
                    pass
                return x

        timer = self.h.Timer(torch.device("cpu"))
        steady = timer.run(Wait(False), [torch.ones(4)], 1, 50, warm_ms=0, precision=0.05)
        self.assertEqual(steady["trials"], timer.MIN_TRIALS)  # stable: stops at the least
        self.assertEqual(timer.run(Wait(True), [torch.ones(4)], 1, 50, warm_ms=0, precision=0.05)["trials"], 50)
        self.assertEqual(timer.run(Wait(False), [torch.ones(4)], 1, 50, warm_ms=0)["trials"], 50)  # no precision
        self.assertEqual(timer.run(Wait(False), [torch.ones(4)], 1, 12, warm_ms=0, precision=0.05)["trials"], 12)

    def test_digest_sees_one_changed_bit_and_fingerprints_match_only_their_output(self):
        import torch
        x = torch.randn(5000, 3)
        d = self.c.digest(x)
        y = x.clone()
        y.view(-1).view(torch.int32)[4321] ^= 1  # one bit of one float
        self.assertNotEqual(self.c.digest(y), d)
        self.assertEqual(self.c.digest(x.clone()), d)
        s = {"atol_fp32": 1e-4, "rtol_fp32": 1e-4, "atol_half": 1e-2, "rtol_half": 1e-2}
        fp = self.c.fingerprint(x)
        self.assertTrue(self.c.matches_fingerprint(x.clone(), fp, s))
        self.assertFalse(self.c.matches_fingerprint(torch.randn(5000, 3), fp, s))
        self.assertFalse(self.c.matches_fingerprint(x.t(), fp, s))
        # The judge's comparison keeps the same fingerprint of an output fed to it in pieces.
        out = torch.randn(100_000)
        check = self.c.OutputCheck(out, s)
        for a, b in ((0, 1), (1, 33_333), (33_333, 33_333), (33_333, 100_000)):
            check.feed(out[a:b])
        self.assertTrue(torch.equal(check.fingerprint()[2], self.c.fingerprint(out)[0][2]))

    def test_the_fused_programs_compile_without_a_gpu_and_the_digest_for_the_chunks_of_the_torch_one(self):
        # The worker's device probe compiles the judge's comparison and the side-stream check's
        # digest (NVRTC alone: no GPU is needed to compile); the judge and candidates' processes
        # load the copies. The GPU suite's compare cases check their figures against PyTorch's
        # operations, bit for bit.
        from gpu import fused_check
        self.assertEqual(fused_check.DIGEST_CHUNK, self.saved)  # the weights restart where digest()'s do
        self.assertEqual(fused_check.DIGEST_PIECE % fused_check.DIGEST_CHUNK, 0)
        self.assertEqual(sorted(fused_check.programs()), ["check", "digest"])
        self.assertIn("--fmad=false", fused_check.programs()["check"][1])  # torch.isclose's rounding
        for program in fused_check.programs():
            for arch in ("9.0", "100"):
                cubin, why = fused_check.cubin(program, arch)
                self.assertEqual(why, "")
                self.assertTrue(cubin.startswith(b"\x7fELF"), cubin[:8])
            self.assertIsNone(fused_check.cubin(program, "1")[0])  # an architecture NVRTC refuses: a reason, no raise
            self.assertIn(f"the fused {program} did not compile", fused_check.cubin(program, "1")[1])
        self.assertEqual(fused_check.load_digest("cpu"), (None, "not on a GPU"))
        self.assertEqual(fused_check.load("cpu"), (None, "not on a GPU"))


class SandboxTest(Base):
    """Issue 19's findings, one adversarial candidate each (and more of the same families): each
    is hacked, fails, or keeps its honest verdict, and honest candidates after it keep theirs."""

    SECRET = "kernelrl-test-secret-8f2c"

    @classmethod
    def setUpClass(cls):
        os.environ["KERNELRL_CLUSTER_SECRET"] = cls.SECRET  # as launch has it
        cls.private = tempfile.TemporaryDirectory()  # stands for the run folder and its store
        with open(os.path.join(cls.private.name, "store.sqlite"), "w") as f:
            f.write(cls.SECRET)
        # A cluster secret kept where candidates can see the folder (not /tmp: theirs is private),
        # readable by all: hidden as a file (issue 54). The folder is one on the worker's sys.path
        # (as a PYTHONPATH entry would be), which candidates see read-only.
        os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)  # (a GPU machine given launch by path has none)
        cls.keys = tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "build"))
        sys.path.append(cls.keys.name)
        cls.addClassCleanup(sys.path.remove, cls.keys.name)  # (also when the set-up below fails)
        cls.secret_file = os.path.join(cls.keys.name, "cluster.secret")
        with open(cls.secret_file, "w") as f:
            f.write(cls.SECRET + "-file")
        os.chmod(cls.keys.name, 0o755)
        os.chmod(cls.secret_file, 0o644)
        # Another run's folder that this run's config does not name, readable by all, where
        # users keep data (issue 54, point 3).
        cls.other_run = None
        for top in ("/srv", "/mnt", "/media"):
            if os.path.isdir(top) and os.access(top, os.W_OK):
                cls.other_run = tempfile.TemporaryDirectory(dir=top, prefix="kernelrl-other-run-")
                os.chmod(cls.other_run.name, 0o755)
                with open(os.path.join(cls.other_run.name, "store.sqlite"), "w") as f:
                    f.write(cls.SECRET + "-other-run")
                os.chmod(os.path.join(cls.other_run.name, "store.sqlite"), 0o644)
                break
        super().setUpClass()
        cls.server.close()
        cls.server = ForkServer(DEVICE, 1, cls.cache, tmp_root=cls.tmp_root, hide=[cls.private.name, cls.secret_file])
        if not cls.server.info["sandbox"].startswith("namespaces: pid"):
            raise unittest.SkipTest(f"no sandbox on this kernel: {cls.server.info['sandbox']}")

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.private.cleanup()
        cls.keys.cleanup()
        if cls.other_run is not None:
            cls.other_run.cleanup()
        os.environ.pop("KERNELRL_CLUSTER_SECRET", None)

    def honest(self):
        r = self.evaluate(GOOD)
        self.assertStatus(r, "ok")
        return r

    def test_a_candidate_sees_its_own_gpu_alone(self):
        # Another evaluator may be timing on the machine's other GPUs (issue 53, target 5).
        if not DEVICE.startswith("cuda"):
            self.skipTest("a GPU's test")
        r = self.evaluate("n = torch.cuda.device_count()\nassert n == 1, f'sees {n} GPUs'\n" + GOOD)
        self.assertStatus(r, "ok")
        self.assertEqual(r["device"], self.server.info["device"])

    def test_patching_the_judge_from_inside_is_hacked(self):
        # The judge's live modules, as a candidate finds them.
        find = ("import sys\nharness, checks, timing, defenses = sys.modules['gpu.harness'], sys.modules['gpu.checks'], "
                "sys.modules['gpu.timing'], sys.modules['gpu.defenses']\n")
        for patch in ("checks.compare = lambda *a, **k: None",
                      "checks._tolerance = lambda *a, **k: (1e9, 1e9)",
                      "harness._clock_ns = lambda: 0",
                      "timing._clock_ns = lambda: 0",
                      "timing.stats = lambda times: {'median_ms': 1e-6}",
                      "harness.Timer.run = lambda *a, **k: {'median_ms': 1e-6}",
                      "defenses.Watch.check = lambda *a, **k: None",
                      # A phase replaced before it runs (its own checks with it).
                      "harness.Harness._time_and_recheck = lambda *a, **k: 100.0"):
            r = self.evaluate(find + patch + "\nreturn torch.zeros_like(x)")
            self.assertStatus(r, "hacked", "changed the harness")
        # Both at once: the check runs through the function captured before any candidate.
        r = self.evaluate(find + "defenses.Watch.check = lambda *a, **k: None\n"
                                 "checks.compare = lambda *a, **k: None\nreturn torch.zeros_like(x)")
        self.assertStatus(r, "hacked", "changed the harness")
        self.honest()

    def test_a_forged_reply_is_not_a_verdict(self):
        # The whole process is the candidate's: it writes the reply a passing, re-verified, fast
        # candidate would get, into every pipe it may write to, and ends before any check.
        body = ("import os, stat, fcntl, msgpack\n"
                "fake = msgpack.packb({'status': 'ok', 'error': '', 'speedup': 50.0, 'reverified': True,\n"
                "    'runtime': {'median_ms': 1e-4, 'mean_ms': 1e-4, 'std_ms': 0.0, 'min_ms': 1e-4,\n"
                "                'max_ms': 1e-4, 'trials': 3},\n"
                "    'correctness': {'trials': 25, 'passed': 25}})\n"
                "for fd in range(3, 256):\n"
                "    try:\n"
                "        if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:\n"
                "            os.write(fd, fake)\n"
                "    except OSError:\n        pass\n"
                "os._exit(0)\nreturn x")
        r = self.evaluate(body, reverify_speedup=10)
        self.assertStatus(r, "hacked", "reported success, but not to the judge")
        self.honest()

    def test_a_candidate_speaking_to_the_judge_out_of_protocol_is_hacked(self):
        # It finds its link to the judge and asks for a check the protocol has no place for.
        body = ("import socket\nfrom gpu import sandbox, judge\n"
                "s = socket.socket(fileno=sandbox.JUDGE_LINK)\n"
                "judge.send_frame(s, {'op': 'check', 'label': 'trial', 'index': 99, 'tensors': []})\n"
                "judge.recv_frame(s)\ns.detach()\n"
                "return torch.nn.functional.silu(x)")
        self.assertStatus(self.evaluate(body), "hacked", "outside the protocol")
        self.honest()

    def test_preparing_a_check_outside_the_protocol_is_hacked(self):
        # It asks the judge to compute the reference ahead of the ordering check, which runs in
        # a timed region, where the judge must not work beside it.
        body = ("import socket\nfrom gpu import sandbox, judge\n"
                "s = socket.socket(fileno=sandbox.JUDGE_LINK)\n"
                "judge.send_frame(s, {'op': 'prepare', 'label': 'ordering', 'index': 0})\n"
                "s.detach()\n"
                "return torch.nn.functional.silu(x)")
        self.assertStatus(self.evaluate(body), "hacked", "prepare a check outside the protocol")
        self.honest()

    def test_a_device_check_without_the_judges_buffer_is_hacked(self):
        # It claims its outputs are in a device buffer the judge never gave it.
        body = ("import socket\nfrom gpu import sandbox, judge\n"
                "s = socket.socket(fileno=sandbox.JUDGE_LINK)\n"
                "judge.send_frame(s, {'op': 'check', 'label': 'trial', 'index': 0, 'via': 'device',\n"
                "                     'tensors': [{'dtype': 'torch.float32', 'shape': list(x.shape)}]})\n"
                "judge.recv_frame(s)\ns.detach()\n"
                "return torch.nn.functional.silu(x)")
        self.assertStatus(self.evaluate(body), "hacked", "malformed check")
        self.honest()

    @unittest.skipUnless(DEVICE == "cpu", "on a GPU the judge gives a device buffer (tests/e2e/gpu_suite.py)")
    def test_outputs_go_as_bytes_where_the_judge_has_no_device_buffer(self):
        # On a CPU the judge answers a request for a device buffer with why not; the candidate's
        # outputs then cross as bytes and are judged as ever.
        body = ("import socket\nfrom gpu import sandbox, judge\n"
                "s = socket.socket(fileno=sandbox.JUDGE_LINK)\n"
                "judge.send_frame(s, {'op': 'share'})\n"
                "a = judge.recv_frame(s)\ns.detach()\n"
                "assert a == {'share': 0, 'why': 'the judge is not on a GPU'}, a\n"
                "return torch.nn.functional.silu(x)")
        r = self.evaluate(body)
        self.assertStatus(r, "ok")
        self.assertEqual(r["correctness"]["link"], "bytes (the judge is not on a GPU)")
        self.assertEqual(r["correctness"]["comparison"], "torch (not on a GPU)")
        self.assertEqual(self.honest()["correctness"]["link"], "bytes (the candidate's process sent bytes)")

    def test_reference_timings_from_a_candidate_reach_no_one(self):
        before = self.honest()["ref_runtime"]
        # Scales every timing figure it can find in its process, the reference's included.
        body = ("import gc\nfor o in gc.get_objects():\n"
                "    if isinstance(o, dict) and 'median_ms' in o:\n        o['median_ms'] = o['median_ms'] * 8\n"
                "return torch.nn.functional.silu(x)")
        r = self.evaluate(body)
        self.assertEqual(r["ref_runtime"]["median_ms"], before["median_ms"], "the worker's own reference timing")
        for _ in range(2):
            self.assertEqual(self.honest()["ref_runtime"], before)

    def test_the_build_cache_is_read_only_to_candidates_and_verified_on_read(self):
        body = ("import os\nfrom gpu import harness\nroot = harness.Harness.__init__.__defaults__ or ()\n"
                f"for d in [{self.cache!r}, os.path.join({self.cache!r}, 'poison')]:\n"
                "    try:\n        os.makedirs(d, exist_ok=True)\n"
                "        open(os.path.join(d, 'x.built'), 'w').write('hostile')\n"
                "    except OSError:\n        pass\n"
                "return torch.nn.functional.silu(x)")
        self.assertStatus(self.evaluate(body), "ok")
        for dirpath, _, files in os.walk(self.cache):
            self.assertNotIn("x.built", files, f"a candidate wrote into the build cache ({dirpath})")
        first = self.evaluate(CPP_OK)
        self.assertStatus(first, "ok")
        # An entry altered after its build (here by the test, standing in for any writer) is
        # rejected on read and built again.
        from gpu import compile_cache
        entries = [os.path.join(self.cache, e) for e in os.listdir(self.cache) if len(e) == 32]
        libs = [compile_cache.verified_library(e) for e in entries]
        self.assertTrue(all(libs), "every entry matches its manifest")
        for _, lib in libs:
            with open(lib, "ab") as f:
                f.write(b"tampered")
        again = self.evaluate(CPP_OK)
        self.assertStatus(again, "ok")
        self.assertFalse(again["compile_cached"], "the altered entry was built again, not imported")
        self.assertTrue(all(compile_cache.verified_library(e) for e in entries))

    def test_no_process_outlives_its_candidate(self):
        body = ("import subprocess\nsubprocess.Popen(['setsid', 'sleep', '4242.5'], start_new_session=True)\n"
                "subprocess.Popen(['sh', '-c', 'sleep 4242.5 & exit 0'])\n"
                "return torch.nn.functional.silu(x)")
        r = self.evaluate(body)
        self.assertIn(r["status"], ("hacked", "ok"))
        self.server._reap()
        time.sleep(0.5)
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"4242.5" in f.read():
                        left.append(pid)
            except OSError:
                pass
        self.assertEqual(left, [], "a process the candidate started is still running")
        self.honest()

    def test_secrets_files_and_other_processes_are_out_of_reach(self):
        other = [os.path.join(self.other_run.name, "store.sqlite")] if self.other_run else []
        probe = ("import os\nfound = []\n"
                 "for path in ['/proc/self/environ', '/proc/1/environ', "
                 f"{os.path.join(self.private.name, 'store.sqlite')!r}, {self.secret_file!r}, *{other!r}, "
                 "os.path.expanduser('~/.bashrc'), '/etc/shadow']:\n"
                 "    try:\n        found.append(path + ': ' + open(path, 'rb').read()[:4000].decode('latin-1'))\n"
                 "    except OSError as e:\n        found.append(path + ': ' + type(e).__name__)\n"
                 "found.append(repr(dict(os.environ)))\n"
                 "found.append('procs ' + ' '.join(p for p in os.listdir('/proc') if p.isdigit()))\n"
                 f"found.append('scratch ' + str(os.path.exists({self.tmp_root!r})))\n"
                 "raise RuntimeError(' | '.join(found))\nreturn x")
        r = self.evaluate(probe)
        self.assertStatus(r, "runtime_error")
        text = r["error"] + r.get("compile_log", "")
        self.assertNotIn(self.SECRET, text)
        self.assertIn("store.sqlite: FileNotFoundError", text)
        self.assertIn(f"{self.secret_file}:  | ", text)  # there, and empty (/dev/null in its place)
        for path in other:
            self.assertIn(f"{path}: FileNotFoundError", text)
        self.assertIn("procs 1 ", text + " ", "the candidate sees only its own processes")
        self.assertIn("scratch False", text)
        if os.geteuid() == 0:
            self.assertIn("/etc/shadow: PermissionError", text)
        # Signals reach nothing outside: not this process (the worker's parent), not the worker.
        kill = (f"import os, signal\nfor pid in ({os.getpid()}, {os.getppid()}, -1):\n"
                "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
                "return torch.nn.functional.silu(x)")
        self.evaluate(kill)
        self.honest()


    def test_the_kernel_refuses_new_namespaces_ptrace_mounts_and_keyrings(self):
        if "seccomp: filter" not in self.server.info["sandbox"]:
            self.skipTest(f"no seccomp filter here: {self.server.info['sandbox']}")
        probe = ("import ctypes, errno, os, subprocess, threading\nlib = ctypes.CDLL(None, use_errno=True)\n"
                 "got = []\n"
                 "for name, call in (('unshare', lambda: lib.unshare(0x10000000)), "
                 "('ptrace', lambda: lib.ptrace(0, 0, 0, 0)), "
                 "('mount', lambda: lib.mount(b'none', b'/tmp', b'tmpfs', 0, None)), "
                 "('keyctl', lambda: lib.syscall(250, 0, 0, 0, 0, 0))):\n"
                 "    got.append(f'{name}={call()}/{errno.errorcode.get(ctypes.get_errno())}')\n"
                 "got.append('sub=' + subprocess.run(['echo', 'yes'], capture_output=True, text=True).stdout.strip())\n"
                 "t = threading.Thread(target=lambda: got.append('thread=yes'))\nt.start()\nt.join()\n"
                 "raise RuntimeError(' '.join(got))\nreturn x")
        r = self.evaluate(probe)
        self.assertStatus(r, "runtime_error", "unshare=-1/EPERM", "ptrace=-1/EPERM", "mount=-1/EPERM",
                          "keyctl=-1/EPERM", "sub=yes", "thread=yes")
        self.honest()

    def test_files_in_its_private_temp_folder_count_against_its_memory(self):
        if not sandbox.cgroups.limits_memory():
            self.skipTest(f"no memory control group here: {sandbox.cgroups.status}")
        # 1.8 GB into the private /tmp (memory, resident in no process): the group's limit, which
        # counts what no process's resident size shows, ends it.
        body = ("with open('/tmp/fill', 'wb') as f:\n    for _ in range(30):\n        f.write(b'x' * (60 << 20))\n"
                "return torch.nn.functional.silu(x)")
        r = self.evaluate(body, memory_limit_mb=1536)
        self.assertStatus(r, "runtime_error", "memory limit", "the kernel killed them")
        self.honest()

    def test_each_processs_control_group_is_removed_with_it(self):
        if sandbox.cgroups.status.startswith("none"):
            self.skipTest(f"no control groups here: {sandbox.cgroups.status}")
        for _ in range(3):
            self.honest()
        self.server._reap()
        live = {f"p{self.server.spare.pid}", f"p{self.server.judge.pid}"}
        for base in sandbox.cgroups._base.values():
            self.assertEqual({n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n))}, live, base)


class NeighbourTest(Base):
    """Issue 54, point 2: a candidate's processes and memory are its own control group's (or its
    own uid's) to count. A fork bomb in another worker on the machine leaves a neighbour's verdict
    alone, and a tree of forks that shares its pages is not charged once per process."""

    BOMB = ("import os, time\nkids = 0\ntry:\n    while kids < 4000:\n        if os.fork() == 0:\n"
            "            os.execv('/bin/sleep', ['sleep', '120'])\n        kids += 1\nexcept OSError:\n    pass\n"
            "time.sleep(100)\nreturn torch.nn.functional.silu(x)")

    @staticmethod
    def tasks_on_machine():
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[1])

    def test_a_fork_bomb_beside_it_leaves_a_candidates_verdict_alone(self):
        if os.geteuid() != 0 and not sandbox.cgroups.limits_tasks():
            self.skipTest("candidates share the user's uid and no control group counts their processes")
        self.assertStatus(self.evaluate(GOOD), "ok")  # this worker's next process is started now
        before = self.tasks_on_machine()
        # The bomb's worker takes its device lock in a folder of its own: the neighbours' timed
        # regions need not wait the 100 s it sleeps holding the CPU shared (what is tested is
        # processes, not the lock).
        locks = tempfile.mkdtemp(prefix="kernelrl-bomb-locks-")
        self.addCleanup(shutil.rmtree, locks, True)
        script = ("import json, os, sys\nsys.path.insert(0, %r)\nfrom gpu.worker import ForkServer\n"
                  "s = ForkServer('cpu', 1, %r, tmp_root=%r, lock_dir=%r)\n"
                  "r = s.evaluate({'sample_id': 'bomb', 'task_id': '06_swish', 'task_path': %r, 'action': %r,"
                  " 'action_space': 'forward_body', 'mode': 'fast', 'seed': 1}, json.loads(sys.argv[1]))\n"
                  "print(r['status'])\ns.close()\n") % (
                      ROOT, self.cache, self.tmp_root, locks, SWISH, self.BOMB)
        bomb = subprocess.Popen([sys.executable, "-c", script, json.dumps({**SETTINGS, "timeout_s": 120})],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # Its processes up to its limit (PROCESS_LIMIT, less its own process's threads, which
            # count too): 500 more tasks is far beyond any legitimate candidate, and well inside
            # what the bomb gets (900 exactly in one CI run, where the old bound of "more than 900"
            # failed).
            deadline = time.monotonic() + 60
            while self.tasks_on_machine() < before + 500 and time.monotonic() < deadline and bomb.poll() is None:
                time.sleep(0.2)
            self.assertGreaterEqual(self.tasks_on_machine(), before + 500, "the bomb's processes did not appear")
            # The neighbours, while the bomb holds all it could get: a C++ extension, built by the
            # worker's builder (compilers: processes), and a plain candidate.
            self.assertStatus(self.evaluate(CPP_OK), "ok")
            self.assertStatus(self.evaluate(GOOD), "ok")
        finally:
            bomb.kill()
            bomb.communicate()

    def shared_tree(self, memory_limit_mb):
        def fork_tree():
            block = bytearray(200 << 20)  # touched below: resident, then shared by 12 forks
            for i in range(0, len(block), 4096):
                block[i] = 1
            kids = []
            for _ in range(12):
                pid = os.fork()
                if pid == 0:
                    time.sleep(1.5)
                    os._exit(0)
                kids.append(pid)
            for pid in kids:
                os.waitpid(pid, 0)
            return {"status": "ok"}

        return sandbox.run_isolated(fork_tree, timeout_s=30, memory_limit_mb=memory_limit_mb, env={},
                                    isolate_net=False, address_space_limit=False, tmp_root=self.tmp_root)

    def test_forks_sharing_their_pages_are_counted_once(self):
        # 13 processes resident 200 MB each, 200 MB in all: under a 1 GB limit, with the kernel
        # counting (a memory control group) and with the worker measuring (none).
        saved = dict(sandbox.cgroups._base)
        try:
            for mode in ("kernel", "worker") if sandbox.cgroups.limits_memory() else ("worker",):
                if mode == "worker":
                    sandbox.cgroups._base.clear()
                reply, failure = self.shared_tree(1024)
                self.assertIsNone(failure, f"{mode}: {failure}")
                self.assertEqual(reply["status"], "ok")
                # A tree that does hold more than its limit is still ended.
                def grow():
                    blocks = []
                    while True:
                        blocks.append(bytearray(64 << 20))
                reply, failure = sandbox.run_isolated(grow, timeout_s=30, memory_limit_mb=512, env={},
                                                      isolate_net=False, address_space_limit=False,
                                                      tmp_root=self.tmp_root)
                self.assertIsNone(reply, mode)
                self.assertIn("exceeded the memory limit", failure["error"], mode)
        finally:
            sandbox.cgroups._base.update(saved)


class JudgeLinkTest(Base):
    """Outputs cross the link to the judge in many ragged pieces (a link chunk of 1000 bytes:
    250 float32 values), as KernelBench's largest outputs do in 64 MB ones."""

    @classmethod
    def setUpClass(cls):
        from gpu import protocol
        cls.saved = protocol.LINK_CHUNK_BYTES
        protocol.LINK_CHUNK_BYTES = 1000  # inherited by the judge's and the candidates' processes
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        from gpu import protocol
        super().tearDownClass()
        protocol.LINK_CHUNK_BYTES = cls.saved

    def test_every_piece_is_compared(self):
        self.assertStatus(self.evaluate(GOOD), "ok")
        last = "y = torch.nn.functional.silu(x)\ny.view(-1)[-1] += 1\nreturn y"
        self.assertStatus(self.evaluate(last), "incorrect", "values differ")
        r = self.evaluate("return torch.nn.functional.silu(x), x")
        self.assertStatus(r, "incorrect", "2 output tensors, reference has 1")
        self.assertStatus(self.evaluate(GOOD), "ok")


class ReferenceCacheTest(Base):
    """The judge keeps the reference's outputs for a task's later candidates (a training step's
    group): only the first candidate of a task waits for the reference, and every verdict and
    figure is the one a judge computing the reference again gives."""

    def test_a_tasks_later_candidates_reuse_its_reference_outputs_with_the_same_verdicts(self):
        first = self.evaluate(GOOD)
        self.assertStatus(first, "ok")
        self.assertGreaterEqual(first["judge_reference"]["runs"], SETTINGS["correctness_trials"])
        again = self.evaluate("return x * torch.sigmoid(x)")
        self.assertStatus(again, "ok")
        self.assertEqual(again["judge_reference"]["runs"], 0)
        self.assertGreaterEqual(again["judge_reference"]["reused"], SETTINGS["correctness_trials"])
        wrong = self.evaluate("return torch.nn.functional.silu(x) * 1.01")
        self.assertStatus(wrong, "incorrect", "trial 0")
        self.assertEqual(wrong["judge_reference"]["runs"], 0)
        other = self.evaluate("return torch.matmul(A, B).sum(dim=1, keepdim=True)", task=MATMUL)  # another task: computed
        self.assertStatus(other, "ok")
        self.assertGreater(other["judge_reference"]["runs"], 0)
        cached = self.evaluate(GOOD)
        fresh = self.evaluate(GOOD, reference_cache_mb=0)
        self.assertEqual(cached["judge_reference"]["runs"], 0)
        self.assertGreaterEqual(fresh["judge_reference"]["runs"], SETTINGS["correctness_trials"])
        self.assertEqual(fresh["judge_reference"]["reused"], 0)
        # Without the cache, the reference runs once per check's inputs (the domain questions'
        # answers remembered from the task's earlier sessions), and once on the timing inputs
        # (for the post-check's comparison with an earlier output).
        self.assertEqual(fresh["judge_reference"]["runs"], len(fresh["judge_checked"]) + 1, fresh["judge_checked"])
        # Each check's reference output was computed while the candidate's process made its
        # inputs and ran the candidate (all but the ordering check, which runs in a timed region).
        ahead = [c for c in fresh["judge_checked"] if not c.startswith("ordering:")]
        self.assertEqual(fresh["judge_reference"]["ahead"], len(ahead), fresh["judge_checked"])
        self.assertGreater(fresh["judge_phases"].get("ahead", 0.0), 0.0)
        for r in (cached, fresh):
            self.assertStatus(r, "ok")
        for key in ("trials", "passed", "max_abs_diff", "max_rel_diff", "max_scale_err", "distributions"):
            self.assertEqual(cached["correctness"][key], fresh["correctness"][key], key)
        self.assertEqual(cached["judge_checked"], fresh["judge_checked"])


class BuildCacheTest(Base):
    def test_an_identical_candidate_builds_once_and_a_bad_build_is_a_compile_error(self):
        first = self.evaluate(CPP_OK)
        self.assertStatus(first, "ok")
        self.assertFalse(first["compile_cached"])
        self.assertGreater(first["compile_s"], 1.0)
        # The compile stage (no GPU, its own process) finds it built; so does a second evaluation.
        req = {"sample_id": "c", "task_id": "06_swish", "task_path": SWISH, "action": CPP_OK,
               "action_space": "forward_body", "mode": "fast", "seed": 42}
        pre = self.server.compile(req, SETTINGS)
        self.assertEqual(pre["status"], "ok", pre["error"])
        self.assertTrue(pre["compile_cached"])
        second = self.evaluate(CPP_OK, precompiled=True)
        self.assertStatus(second, "ok")
        self.assertTrue(second["compile_cached"])
        self.assertLess(second["compile_s"], first["compile_s"] / 3)
        # The same sources under another extension name are another library (the name is
        # compiled in): built on their own, and the first stays cached beside them.
        renamed = self.evaluate(CPP_OK.replace('name="kernelrl_test_swish"', 'name="kernelrl_test_swish_b"'))
        self.assertStatus(renamed, "ok")
        self.assertFalse(renamed["compile_cached"])
        third = self.evaluate(CPP_OK, precompiled=True)
        self.assertStatus(third, "ok")
        self.assertTrue(third["compile_cached"], "the renamed build replaced the first one's entry")

        bad = self.server.compile(dict(req, action=CPP_BAD), SETTINGS)
        self.assertEqual(bad["status"], "compile_error")
        self.assertIn("undefined_symbol", bad["compile_log"])
        self.assertStatus(self.evaluate(CPP_BAD), "compile_error")



class DeviceLockTest(unittest.TestCase):
    """gpu/devlock.py between processes: a timed region waits for every shared hold, and a process
    that comes to share after a timed region began waiting waits behind it (the turnstile)."""

    def setUp(self):
        from gpu import devlock
        self.devlock = devlock
        self.tmp = tempfile.TemporaryDirectory()
        self.paths = devlock.paths("test", self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def lock(self):
        return self.devlock.DeviceLock(*(self.devlock.open_file(p) for p in self.paths))

    HOLD = ("import sys, time\nsys.path.insert(0, sys.argv[1])\nfrom gpu import devlock\n"
            "how, at, for_s, lock, gate = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]\n"
            "time.sleep(max(0.0, at - time.monotonic()))\n"
            "devlock.DeviceLock(devlock.open_file(lock), devlock.open_file(gate)).acquire(how)\n"
            "time.sleep(for_s)\n")

    def hold(self, how, at, for_s):
        """A process that holds the device as `how` from monotonic time `at` for for_s seconds."""
        return subprocess.Popen([sys.executable, "-c", self.HOLD, ROOT, how, str(at), str(for_s),
                                 *self.paths])

    def test_a_timed_region_waits_for_shared_holds_and_new_sharers_wait_behind_it(self):
        t0 = time.monotonic() + 0.5  # (the processes start)
        kids = [self.hold("shared", t0, 1.5),           # a candidate checking
                self.hold("exclusive", t0 + 0.3, 0.6)]  # a timed region: waits until 1.5, runs to 2.1
        time.sleep(max(0.0, t0 + 0.6 - time.monotonic()))
        mine = self.lock()
        mine.acquire("shared")  # arrives while the timed region waits: behind it, not beside the first
        got = time.monotonic() - t0
        for p in kids:
            p.wait()
        self.assertGreater(got, 1.9, "a new shared hold does not overtake a waiting timed region")
        self.assertLess(got, 4.0)
        self.assertEqual(mine.record()["windows"][0][0], "shared")
        self.assertGreater(mine.waited_s, 1.2)

    def test_work_beside_a_candidate_never_waits_for_or_overlaps_a_timed_region(self):
        # The judge computing a reference ahead (gpu/judge.py _prepare) takes the lock shared
        # only where no timed region holds it, at once, and holds a timed region back meanwhile.
        t0 = time.monotonic() + 0.5
        kid = self.hold("exclusive", t0, 1.0)
        time.sleep(max(0.0, t0 + 0.3 - time.monotonic()))
        mine = self.lock()
        start = time.monotonic()
        with mine.beside() as free:
            self.assertFalse(free, "a timed region holds the device")
        self.assertLess(time.monotonic() - start, 0.2, "it does not wait for the timed region")
        kid.wait()
        with mine.beside() as free:
            self.assertTrue(free)
            timed = self.hold("exclusive", time.monotonic(), 0.0)
            time.sleep(0.8)
            self.assertIsNone(timed.poll(), "a timed region waits while the work beside runs")
        self.assertEqual(timed.wait(timeout=10), 0)

    def test_shared_holds_run_at_once(self):
        t0 = time.monotonic() + 0.5
        kid = self.hold("shared", t0, 1.0)
        time.sleep(max(0.0, t0 + 0.2 - time.monotonic()))
        mine = self.lock()
        mine.acquire("shared")
        self.assertLess(time.monotonic() - t0, 0.6)
        with mine.alone():  # converts: waits for the other sharer
            self.assertGreater(time.monotonic() - t0, 0.9)
            self.assertEqual(mine.state, "exclusive")
        self.assertEqual(mine.state, "shared")
        kid.wait()
        self.assertEqual([w[0] for w in mine.record()["windows"]], ["shared", "exclusive", "shared"])


SHARE_DRIVER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from gpu.worker import ForkServer
task, cache, tmp, lock_dir, ready, n_workers, n, settings, shared = sys.argv[2:11]
server = ForkServer("cpu", 1, cache, tmp_root=tmp, lock_dir=lock_dir, shared_dir=shared)
open(os.path.join(ready, str(os.getpid())), "w").close()
while len(os.listdir(ready)) < int(n_workers):  # every worker started: their candidates overlap
    time.sleep(0.02)
out = []
for i in range(int(n)):
    req = {"sample_id": f"{os.getpid()}#{i}", "task_id": "06_swish", "task_path": task, "mode": "fast",
           "seed": 42 + i, "action_space": "forward_body",
           "action": "import time\ntime.sleep(0.03)\nreturn torch.nn.functional.silu(x)"}
    r = server.evaluate(req, json.loads(settings))
    out.append({k: r.get(k) for k in ("status", "error", "device_lock", "phases", "ref_runtime")})
server.close()
print(json.dumps(out))
"""


class DeviceShareTest(unittest.TestCase):
    """Issue 53, target 3: several workers on one device, as `per_gpu` (or cpu_slots) starts them.
    Their candidates' processes check at once; no timed region of one overlaps any hold of another
    (the windows each candidate's process records, on the system's monotonic clock). The task's
    reference is timed once for all of them (gpu/shared_timings.py), though all three ask at once."""

    WORKERS, EACH = 3, 3

    def test_candidates_check_at_once_and_each_timed_region_runs_alone(self):
        with tempfile.TemporaryDirectory() as d:
            ready, shared = os.path.join(d, "ready"), os.path.join(d, "launch")
            os.makedirs(ready)
            os.makedirs(shared)
            procs = []
            for w in range(self.WORKERS):
                tmp = os.path.join(d, f"scratch{w}")
                os.makedirs(tmp)
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", SHARE_DRIVER, ROOT, SWISH, os.path.join(d, "cache"),
                     tmp, d, ready, str(self.WORKERS), str(self.EACH), json.dumps(SETTINGS), shared],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            results = []
            for p in procs:
                out, err = p.communicate(timeout=300)
                self.assertEqual(p.returncode, 0, err[-3000:])
                results.append(json.loads(out.strip().splitlines()[-1]))
        holds = []  # (worker, candidate, how, start, end)
        for w, rs in enumerate(results):
            for i, r in enumerate(rs):
                self.assertEqual(r["status"], "ok", r["error"])
                self.assertIn("device_wait", r["phases"])
                for how, a, b in r["device_lock"]["windows"]:
                    holds.append((w, i, how, a, b))
        timed = [h for h in holds if h[2] == "exclusive"]
        self.assertEqual(len(timed), self.WORKERS * self.EACH, "one timed region a candidate")
        for e in timed:
            for o in holds:
                if o[:2] != e[:2]:
                    self.assertFalse(e[3] < o[4] and o[3] < e[4], f"timed region {e} overlaps {o}")
        shared = [h for h in holds if h[2] == "shared"]
        beside = [(x, y) for x in shared for y in shared if x[0] < y[0] and x[3] < y[4] and y[3] < x[4]]
        self.assertTrue(beside, "candidates of different workers checked at once")
        refs = {json.dumps(r["ref_runtime"], sort_keys=True) for rs in results for r in rs}
        self.assertEqual(len(refs), 1, f"the reference timed once for the three workers, not {len(refs)} times")
        self.assertGreater(json.loads(refs.pop())["median_ms"], 0)


class DeviceLinkSizeTest(unittest.TestCase):
    """The halves of a session's device buffer are sized to the candidate's outputs, within bounds
    its word cannot move (gpu/protocol.py device_half_bytes)."""

    def test_a_half_holds_the_outputs_within_bounds(self):
        from gpu import protocol as P
        h200, small_card = 150_000 << 20, 16 << 30
        lo, hi = P.DEVICE_HALF_MIN_BYTES, P.DEVICE_HALF_MAX_BYTES
        self.assertEqual(P.device_half_bytes(100 << 20, h200), 100 << 20, "an output that fits: one piece")
        self.assertEqual(P.device_half_bytes(6_400_000_000, h200), hi, "a 6.4 GB output: capped")
        self.assertEqual(P.device_half_bytes(6_400_000_000, small_card), (16 << 30) // 128, "a 128th of the card")
        self.assertEqual(P.device_half_bytes(4096, h200), lo)
        for lie in (-1, 0, None, "many", 10 ** 18, float("inf")):
            self.assertTrue(lo <= P.device_half_bytes(lie, h200) <= hi, lie)
        self.assertEqual(P.device_half_bytes(10 ** 18, 1 << 30), lo, "a tiny device still gets the minimum")
        # Pieces of a 6.4 GB float32 output (L1/19's) at that size: 6 a check, where 256 MB halves took 24.
        self.assertEqual(P.device_pieces([(1_600_000_000, 4)], hi), 6)
        self.assertEqual(P.device_pieces([(1_600_000_000, 4)], 256 << 20), 24)


class DeviceWaitTest(unittest.TestCase):
    """Waiting for another candidate's timed region is not a candidate's own time: a device held
    alone by another process for longer than the time limit leaves a correct candidate ok."""

    def test_a_candidate_waiting_for_the_device_longer_than_its_limit_is_not_timed_out(self):
        from gpu import devlock
        with tempfile.TemporaryDirectory() as d:
            scratch = os.path.join(d, "scratch")
            os.makedirs(scratch)
            server = ForkServer("cpu", 1, os.path.join(d, "cache"), tmp_root=scratch, lock_dir=d)
            try:
                req = {"sample_id": "w#0", "task_id": "06_swish", "task_path": SWISH, "action": GOOD,
                       "action_space": "forward_body", "mode": "fast", "seed": 42}
                self.assertEqual(server.evaluate(req, SETTINGS)["status"], "ok")  # the reference timed
                hold = subprocess.Popen([sys.executable, "-c", DeviceLockTest.HOLD, ROOT,
                                         "exclusive", "0", "4.0", *devlock.paths("cpu", d)])
                time.sleep(0.5)  # (it holds the device now)
                r = server.evaluate(dict(req, sample_id="w#1"), {**SETTINGS, "timeout_s": 2.5})
                hold.wait()
                self.assertEqual(r["status"], "ok", r["error"])
                self.assertGreater(r["phases"]["device_wait"], 2.5)
            finally:
                server.close()


class NoNamespacesTest(unittest.TestCase):
    """Where the kernel refuses new namespaces (a container under Docker's default seccomp
    profile), a worker running as root runs each candidate as a uid of its own (its builder as
    65534) on the machine's own files: the candidate gets a temp dir it can enter and write, cannot
    write the worker's files,
    and a worker whose Python environment that user cannot read (under a 0700 /root) refuses to
    start, naming the paths, instead of failing every candidate. Driven through
    tests/e2e/no_namespaces_worker.py (a process that installs the filter, then starts the worker)."""

    SCRIPT = os.path.join(ROOT, "tests", "e2e", "no_namespaces_worker.py")

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("the fallback drops root to an unprivileged uid: run as root")
        if platform.machine() != "x86_64":
            raise unittest.SkipTest("gpu/seccomp.py's filter is written for x86_64")

    def run_worker(self, candidates, *flags):
        job = {"settings": SETTINGS, "candidates": candidates}
        p = subprocess.run([sys.executable, self.SCRIPT, *flags], input=json.dumps(job), capture_output=True,
                           text=True, timeout=900)
        if "no mount namespace for the test's file view" in p.stderr:
            self.skipTest("this machine gives the test no mount namespace to arrange its file view")
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        return json.loads(p.stdout.strip().splitlines()[-1])

    def test_candidates_run_as_their_own_uid_in_a_temp_dir_of_their_own(self):
        # Tries to write into the worker's scratch folder and build cache (found from its temp
        # dir and the cache's place beside it), then into its own temp dir.
        probe = ("import os\nwrote = []\nscratch = os.path.dirname(os.getcwd())\n"
                 "for d in (scratch, os.path.join(os.path.dirname(scratch), 'cache')):\n"
                 "    try:\n        open(os.path.join(d, 'mine'), 'w').write('x')\n        wrote.append(d)\n"
                 "    except OSError:\n        pass\n"
                 "open('here', 'w').write('x')\n"
                 "raise RuntimeError(f'uid={os.getuid()} cwd={os.getcwd()} wrote={wrote}')\nreturn x")
        out = self.run_worker([{"action": GOOD, "task_path": SWISH}, {"action": probe, "task_path": SWISH},
                               {"action": CPP_OK, "task_path": SWISH}, {"action": CPP_BAD, "task_path": SWISH}],
                              "--readable-env")
        self.assertNotIn("start_error", out, out.get("start_error"))
        self.assertIn("namespaces: none: unshare refused", out["sandbox"])
        self.assertGreaterEqual(int(re.search(r"user: uid (\d+)", out["sandbox"]).group(1)), sandbox.CANDIDATE_UID_BASE)
        v = out["verdicts"]
        self.assertEqual(v[0]["status"], "ok", v[0]["error"])
        self.assertEqual(v[1]["status"], "runtime_error")
        uid = re.search(r"uid=(\d+) cwd=\S+/scratch/cand-\w+ wrote=\[\]", v[1]["error"])
        self.assertIsNotNone(uid, v[1]["error"])
        self.assertGreaterEqual(int(uid.group(1)), sandbox.CANDIDATE_UID_BASE)
        self.assertEqual(v[2]["status"], "ok", v[2]["error"])  # built by the builder, as uid 65534
        self.assertEqual(v[3]["status"], "compile_error", v[3]["error"])

    def test_a_worker_whose_environment_nobody_can_read_refuses_to_start(self):
        hidden = [p for p in (sys.prefix, sys.base_prefix) if not self._reachable_by_all(p)]
        if not hidden:
            self.skipTest(f"the Python environment here ({sys.prefix}) is readable by all")
        why = self.run_worker([]).get("start_error", "")
        self.assertIn("the sandbox cannot run candidates here", why)
        self.assertRegex(why, r"running as uid \d+")
        self.assertIn(hidden[0], why)
        self.assertIn("--privileged", why)

    @staticmethod
    def _reachable_by_all(path):
        path = os.path.abspath(path)
        while True:
            if not os.stat(path).st_mode & 0o001:
                return False
            if path == "/":
                return True
            path = os.path.dirname(path)

if __name__ == "__main__":
    unittest.main()
