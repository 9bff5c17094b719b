"""Scaffolding: actions become complete KernelBench programs, deterministically; unusable actions
are format errors carrying the parser's message."""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # for the gpu package

from gpu.scaffold import FORWARD_MARKER, FormatError, assemble, extract_code  # noqa: E402

TASK = open(os.path.join(ROOT, "tasks", "bundled", "05_layernorm_manual.py")).read()
TASK_ID = "05_layernorm_manual"


def build(action, space="forward_body"):
    return assemble(action, space, TASK, TASK_ID)


def load(program):
    ns = {}
    exec(compile(program, "<test>", "exec"), ns)
    return ns


class ScaffoldTest(unittest.TestCase):
    def test_same_action_same_bytes(self):
        a = "return x * 2"
        self.assertEqual(build(a).encode(), build(a).encode())

    def test_forward_body_builds_a_model_with_models_init_and_signature(self):
        import torch
        ns = load(build("return x + 1"))
        torch.manual_seed(0)
        ref = ns["Model"](16)
        torch.manual_seed(0)
        new = ns["ModelNew"](16)
        # Same __init__ and seed: identical parameters, by name.
        self.assertEqual([n for n, _ in ref.named_parameters()], [n for n, _ in new.named_parameters()])
        for (_, p), (_, q) in zip(ref.named_parameters(), new.named_parameters()):
            self.assertTrue(torch.equal(p, q))
        x = torch.randn(2, 16)
        self.assertTrue(torch.equal(new(x), x + 1))
        self.assertIn("def forward(self, x: torch.Tensor) -> torch.Tensor:", build("return x"))

    def test_kernel_definitions_go_before_the_class(self):
        prog = build(f"def helper(t):\n    return t * 3\n{FORWARD_MARKER}\nreturn helper(x)")
        self.assertLess(prog.index("def helper"), prog.index("class ModelNew"))
        import torch
        ns = load(prog)
        x = torch.randn(2, 8)
        self.assertTrue(torch.equal(ns["ModelNew"](8)(x), x * 3))

    def test_code_is_taken_from_the_last_fenced_block(self):
        action = "First try:\n```python\nreturn x\n```\nBetter:\n```python\nreturn x * 2\n```\nDone."
        self.assertEqual(extract_code(action), "return x * 2\n")
        self.assertIn("        return x * 2\n", build(action))

    def test_empty_prose_and_syntax_errors_are_format_errors(self):
        cases = {
            "": "empty action",
            "   \n\t\n": "empty action",
            "I would fuse the normalization into one pass.": "does not parse",
            "return torch.relu(x": "'(' was never closed",
            "y = x * 2": "never returns a value",
            "x": "never returns a value",
            f"def k(:\n    pass\n{FORWARD_MARKER}\nreturn x": "kernel definitions",
        }
        for action, expected in cases.items():
            with self.subTest(action=action):
                with self.assertRaises(FormatError) as cm:
                    build(action)
                self.assertIn(expected, str(cm.exception))

    def test_full_program_is_used_as_is_and_must_define_modelnew(self):
        prog = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
        self.assertEqual(build(prog, "full_program"), prog)
        with self.assertRaises(FormatError) as cm:
            build("import torch\nclass Model2: pass\n", "full_program")
        self.assertIn("no top-level class ModelNew", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
