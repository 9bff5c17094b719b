"""The C++ product's layers: a folder includes only its own headers and those of the layers below
it (docs/ARCHITECTURE.md, "Layers"). An include against the order fails this test, naming the file,
the line and the layers. An include let through against it would be listed in KNOWN with why (none
is), and the test fails when a listed one is gone (so the list cannot go stale). The evaluation
worker's Python modules (gpu/) import each other in one direction: a cycle, even through an import
inside a function, fails GpuImportsTest, naming it."""

import ast
import os
import re
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Lowest first; folders of one layer do not include each other.
LAYERS = [("core",), ("messages",), ("store", "tasks", "gpu"), ("policy",), ("learner",), ("experiment",),
          ("analysis",), ("actors",), ("wiring",), ("launch",)]

# (file, included folder): why it is still there (none now; an entry must say why).
KNOWN = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_]+)/')


def level_of(folder):
    for i, layer in enumerate(LAYERS):
        if folder in layer:
            return i
    return None


def violations(root):
    """[(file, line number, included folder, why)] for every include of the product's folders against
    the order, KNOWN ones included."""
    out = []
    for layer in LAYERS:
        for folder in layer:
            base = os.path.join(root, folder)
            if not os.path.isdir(base):
                continue
            for dirpath, _, names in os.walk(base):
                for name in sorted(names):
                    if not name.endswith((".cpp", ".hpp", ".cu", ".cuh", ".inc")):
                        continue
                    path = os.path.join(dirpath, name)
                    rel = os.path.relpath(path, root)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        for n, line in enumerate(f, 1):
                            m = INCLUDE.match(line)
                            if not m or m.group(1) == folder or level_of(m.group(1)) is None:
                                continue
                            target = m.group(1)
                            if level_of(target) > level_of(folder):
                                out.append((rel, n, target, f"{folder} (layer {level_of(folder)}) includes {target}, "
                                                            f"a layer above it ({level_of(target)})"))
                            elif level_of(target) == level_of(folder):
                                out.append((rel, n, target, f"{folder} and {target} are one layer; neither "
                                                            f"includes the other"))
    return out


class LayersTest(unittest.TestCase):
    def test_every_include_follows_the_layers(self):
        found = violations(ROOT)
        new = [v for v in found if (v[0], v[2]) not in KNOWN]
        self.assertEqual(new, [], "includes against the layers:\n" +
                         "\n".join(f"  {f}:{n}: {why}" for f, n, _, why in new))
        gone = set(KNOWN) - {(f, t) for f, _, t, _ in found}
        self.assertEqual(gone, set(), "KNOWN lists includes that are gone: remove them from tests/unit/test_layers.py")

    def test_the_check_finds_upward_and_sideways_includes(self):
        with tempfile.TemporaryDirectory() as d:
            files = {
                "core/a.cpp": '#include "core/b.hpp"\n#include "actors/x.hpp"\n',
                "messages/m.cpp": '#include "core/a.hpp"\n',
                "store/s.cpp": '  #  include "tasks/t.hpp"\n#include <caf/all.hpp>\n',
                "launch/l.cpp": '#include "actors/x.hpp"\n#include "core/a.hpp"\n#include "nlohmann/json.hpp"\n',
            }
            for rel, text in files.items():
                os.makedirs(os.path.join(d, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(d, rel), "w") as f:
                    f.write(text)
            found = sorted((f, n, t) for f, n, t, _ in violations(d))
        self.assertEqual(found, [("core/a.cpp", 2, "actors"), ("store/s.cpp", 1, "tasks")])


def gpu_imports(folder):
    """{module: {sibling modules it imports, at the top or inside a function}} for folder/*.py, the
    package's own relative imports (`from . import m`, `from .m import x`) and top-level ones alike."""
    mods = {n[:-3] for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py"}
    graph = {}
    for m in sorted(mods):
        with open(os.path.join(folder, m + ".py")) as f:
            tree = ast.parse(f.read())
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                deps.add(node.module.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[m] = sorted((deps & mods) - {m})
    return graph


def import_cycles(graph):
    """Each cycle of `graph` once, as [a, b, ..., a], starting at its smallest module."""
    out = set()

    def walk(path):
        for nxt in graph.get(path[-1], ()):
            if nxt == path[0]:
                out.add(tuple(path + [nxt]))
            elif nxt not in path and nxt > path[0]:
                walk(path + [nxt])

    for m in sorted(graph):
        walk([m])
    return sorted(list(c) for c in out)


class GpuImportsTest(unittest.TestCase):
    def test_the_gpu_modules_import_in_one_direction(self):
        cycles = import_cycles(gpu_imports(os.path.join(ROOT, "gpu")))
        self.assertEqual(cycles, [], "gpu/ modules that import each other: " +
                         "; ".join(" -> ".join(c) for c in cycles))

    def test_the_check_finds_a_cycle_through_a_function_level_import(self):
        with tempfile.TemporaryDirectory() as d:
            for name, text in {"a.py": "import b\n", "b.py": "def f():\n    from .c import x\n",
                               "c.py": "import os\n\ndef g():\n    from . import a as A\n", "d.py": "import a\n"}.items():
                with open(os.path.join(d, name), "w") as f:
                    f.write(text)
            self.assertEqual(import_cycles(gpu_imports(d)), [["a", "b", "c", "a"]])


if __name__ == "__main__":
    unittest.main()
