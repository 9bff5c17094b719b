"""Imports KernelBench's harness (src/kernelbench of a checkout given by path) for the benches that
set it beside ours.

KernelBench's package imports its LLM clients (openai, litellm) and python-dotenv at module level
(kernelbench/utils.py); its evaluation and timing never call them. Where one is not installed (the
GPU machine has no package registry), an empty stand-in module takes its place, so the harness
itself runs unmodified. Its evaluation needs pydantic, which scripts/gpu-bundle --kernelbench
carries as wheels.
"""

import importlib
import os
import sys
import types

# module -> attributes its importers take from it (never called by the evaluation)
_UNUSED_CLIENTS = {"openai": ["OpenAI"], "litellm": ["completion"], "dotenv": ["load_dotenv"]}


def import_kernelbench(kb_dir: str):
    """(kernelbench.eval, kernelbench.timing) of the checkout at kb_dir."""
    src = os.path.join(os.path.abspath(kb_dir), "src")
    if not os.path.isfile(os.path.join(src, "kernelbench", "eval.py")):
        raise SystemExit(f"{kb_dir}: not a KernelBench checkout (no src/kernelbench/eval.py)")
    for name, attrs in _UNUSED_CLIENTS.items():
        try:
            importlib.import_module(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.__doc__ = "stand-in: KernelBench imports it, its evaluation never calls it"
            for a in attrs:
                setattr(stub, a, lambda *args, **kwargs: None)
            sys.modules[name] = stub
    if src not in sys.path:
        sys.path.insert(0, src)
    return importlib.import_module("kernelbench.eval"), importlib.import_module("kernelbench.timing")


def problem_file(kb_dir: str, level: int, number: int) -> str:
    """The path of KernelBench problem LEVEL/NUMBER (its file name starts with "NUMBER_")."""
    folder = os.path.join(kb_dir, "KernelBench", f"level{level}")
    for f in sorted(os.listdir(folder)):
        if f.endswith(".py") and f.split("_")[0] == str(number):
            return os.path.join(folder, f)
    raise SystemExit(f"{folder}: no problem {number}")


def problems(kb_dir: str, level: int):
    """Every problem of a level as (number, path), by number."""
    folder = os.path.join(kb_dir, "KernelBench", f"level{level}")
    out = [(int(f.split("_")[0]), os.path.join(folder, f)) for f in os.listdir(folder)
           if f.endswith(".py") and f.split("_")[0].isdigit()]
    return sorted(out)
