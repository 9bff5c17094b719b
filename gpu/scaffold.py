"""Scaffolding: turns a policy action into a complete KernelBench program defining ModelNew.

Two action spaces:

forward_body
    The policy writes only the body of ``ModelNew.forward``. Kernel definitions the body uses
    (helper functions, ``load_inline`` sources, constants, imports) may come first, separated from
    the body by a line that is exactly ``# --- forward ---``. The scaffold emits the task's own
    source (so Model, get_inputs and get_init_inputs are there), then the kernel definitions,
    then ``class ModelNew(nn.Module)`` whose ``__init__`` is Model's own ``__init__`` (so both
    build identical weights from the same seed) and whose ``forward`` has Model.forward's
    signature and the policy's body.

full_program
    The policy writes a whole KernelBench ModelNew file; it is used as it is.

In both, when the action holds a fenced code block (```python ... ```), the last such block is
the code. Scaffolding is deterministic: the same action and task give the same bytes.
"""

import ast
import re
import textwrap

FORWARD_MARKER = "# --- forward ---"
HEADER = "# Assembled by kernelrl from a {space} action. Task: {task}\n"

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


class FormatError(Exception):
    """The action is not usable code: empty, prose, or does not parse."""


def extract_code(action: str) -> str:
    """The code of an action: its last fenced block when it has one, else the whole text."""
    blocks = _FENCE.findall(action)
    if blocks:
        return blocks[-1][1]
    return action


def _parse(code: str, what: str) -> ast.Module:
    try:
        return ast.parse(code)
    except SyntaxError as e:
        raise FormatError(f"{what} does not parse: {e.msg} (line {e.lineno}, column {e.offset})")


def _model_class(task_source: str, task_id: str) -> ast.ClassDef:
    tree = ast.parse(task_source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            return node
    raise ValueError(f"task {task_id} defines no class Model")


def _method(cls: ast.ClassDef, name: str):
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _contains_return(body_tree: ast.Module) -> bool:
    for node in ast.walk(body_tree):
        if isinstance(node, ast.Return) and node.value is not None:
            return True
    return False


def assemble_forward_body(action: str, task_source: str, task_id: str) -> str:
    code = extract_code(action).replace("\r\n", "\n").expandtabs(4)
    if not code.strip():
        raise FormatError("empty action: no code to use as the body of ModelNew.forward")
    lines = code.split("\n")
    kernels, body_lines = "", lines
    marker_at = [i for i, line in enumerate(lines) if line.strip() == FORWARD_MARKER]
    if marker_at:
        kernels = textwrap.dedent("\n".join(lines[: marker_at[0]])).strip("\n")
        body_lines = lines[marker_at[0] + 1:]
        _parse(kernels, "the kernel definitions (before '# --- forward ---')")
    body = textwrap.dedent("\n".join(body_lines)).strip("\n")
    if not body.strip():
        raise FormatError("empty forward body after '# --- forward ---'")
    # The body must parse as the inside of a function (so `return` is legal there).
    wrapped = "def forward(self, *args):\n" + textwrap.indent(body, "    ") + "\n"
    tree = _parse(wrapped, "the forward body")
    if not _contains_return(tree):
        raise FormatError("the forward body never returns a value (expected a `return` statement)")

    cls = _model_class(task_source, task_id)
    fwd = _method(cls, "forward")
    if fwd is None:
        raise ValueError(f"task {task_id}: class Model has no forward method")
    signature = ast.unparse(fwd.args)
    init = _method(cls, "__init__")
    if init is not None:
        init_src = textwrap.dedent(ast.get_source_segment(task_source, init, padded=True))
        init_src = re.sub(r"super\(\s*Model\s*,", "super(ModelNew,", init_src)
        # Model's docstring and comments stay; decorators are not expected on __init__.
    else:
        init_src = "def __init__(self, *args, **kwargs):\n    super().__init__()\n"

    out = [HEADER.format(space="forward_body", task=task_id)]
    out.append("# ---- task (reference Model, get_inputs, get_init_inputs) ----\n")
    out.append(task_source.rstrip("\n") + "\n\n")
    out.append("# ---- kernel definitions ----\n")
    out.append((kernels + "\n") if kernels else "# (none)\n")
    out.append("\n# ---- candidate ----\n")
    out.append("class ModelNew(nn.Module):\n")
    out.append(textwrap.indent(init_src.rstrip("\n"), "    ") + "\n\n")
    out.append(f"    def forward({signature}):\n")
    out.append(textwrap.indent(body, "        ") + "\n")
    program = "".join(out)
    # The task source may not import nn under that name; make the scaffold self-sufficient.
    if not re.search(r"^import torch\.nn as nn$", task_source, re.MULTILINE):
        program = program.replace("# ---- candidate ----\n",
                                  "# ---- candidate ----\nimport torch.nn as nn\n", 1)
    return program


def embedded_task_lines(task_source: str):
    """The first and last line numbers of the task's own source inside a forward_body program
    (after the header line and the task banner), where its reference Model is compiled."""
    return 3, 2 + task_source.rstrip("\n").count("\n") + 1


def assemble_full_program(action: str, task_id: str) -> str:
    code = extract_code(action).replace("\r\n", "\n")
    if not code.strip():
        raise FormatError("empty action: no program")
    tree = _parse(code, "the program")
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body):
        raise FormatError("the program defines no top-level class ModelNew")
    return code if code.endswith("\n") else code + "\n"


def declares_build(code: str) -> bool:
    """Whether a program compiles native code when it is loaded (or Triton kernels when run).
    (Kept in sync with declares_build in gpu/worker_client.cpp.)"""
    return any(s in code for s in ("load_inline", "cpp_extension", "triton"))


def assemble(action: str, action_space: str, task_source: str, task_id: str) -> str:
    if action_space == "forward_body":
        return assemble_forward_body(action, task_source, task_id)
    if action_space == "full_program":
        return assemble_full_program(action, task_id)
    raise ValueError(f"unknown action space {action_space!r} (expected forward_body or full_program)")
