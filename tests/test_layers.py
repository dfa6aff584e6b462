"""The import graph runs one way (issue 13.3): cli -> harness -> tasks -> models -> kernels -> the package root
(``lctx/__init__.py``, ``lctx/errors.py``), with nothing running upward and no cycle between modules.

Inside a layer, its rooms (issue 26) run one way too (:data:`ROOMS`, lowest first): in harness, args -> run ->
steps -> outputs -> commands -> evaluate (a step derives numbers from the run's tables, an output draws or
compares them, a command or ``lctx.evaluate`` puts them together); in models, the model core (variants,
config, decoder, cache) -> the adapters that load and run a checkpoint for the tasks (``models/adapters``).

Read with ``ast`` from the source (imports inside functions count too: they are edges all the same), so the
test needs no import of lctx. Run as a script on any tree to count: ``python tests/test_layers.py ROOT``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: The layers, lowest first: a module may import its own layer and the layers below it.
LAYERS = ("", "kernels", "models", "tasks", "harness", "cli")
#: Upward edges that are the design, with the reason: the package root's lazy public API.
ALLOWED = {("lctx", "lctx.harness.evaluate"): "lctx.evaluate / lctx.Result: the public API, loaded on first use"}
#: The rooms of a layer, lowest first: {layer: (room, ...)}. A module's room is its subpackage
#: (``lctx.harness.run.runner``: ``run``) or, for a module directly in the layer's folder, its own name
#: (``lctx.harness.args``: ``args``); a name not listed is the lowest room (the models' core).
ROOMS = {"harness": ("args", "backends", "run", "steps", "outputs", "commands", "evaluate"),
         "models": ("", "adapters")}
ROOT = Path(__file__).resolve().parent.parent


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["lctx", *parts])


def package_files(root: Path) -> dict[str, Path]:
    """{module: path} of the package's source: the root files and the five layers' folders (tests, benchmarks
    and checkpoints are not part of the package graph)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if rel.parts[0] in LAYERS[1:-1] or (len(rel.parts) == 1 and p.name != "conftest.py"):
            if "checkpoints" not in rel.parts:
                out[module_name(root, p)] = p
    return out


def layer(module: str) -> tuple[int, int]:
    """(layer, room) of ``module``, compared in that order: the layer of :data:`LAYERS` and the room of
    :data:`ROOMS` inside it (0 for a layer without rooms, and for its package's ``__init__``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0, 0  # the package root (lctx/__init__.py)
    top = parts[1]
    if top not in LAYERS:
        return 0, 0  # lctx.errors etc.: the root layer
    rooms = ROOMS.get(top, ())
    room = parts[2] if len(parts) > 2 else None
    return LAYERS.index(top), (rooms.index(room) if room in rooms else 0)


def import_edges(root: Path) -> list[tuple[str, str, int]]:
    """(importing module, imported lctx module, line) for every import of an lctx module in the package,
    module level or inside a function. ``from lctx.x import name`` names module ``lctx.x.name`` when that is a
    module, else ``lctx.x``."""
    files = package_files(root)
    edges = []
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    targets.append(sub if sub in files else src)
            for t in targets:
                if t == "lctx" or t.startswith("lctx."):
                    while t not in files and "." in t:
                        t = t.rsplit(".", 1)[0]
                    if t != mod:
                        edges.append((mod, t, node.lineno))
    return sorted(set(edges))


def upward_imports(edges) -> list[tuple[str, str, int]]:
    """The edges from a lower layer to a higher one (not in :data:`ALLOWED`)."""
    return [(a, b, n) for a, b, n in edges if layer(b) > layer(a) and (a, b) not in ALLOWED]


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges:
        if (a, b) in ALLOWED:
            continue
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_checker_sees_an_upward_import_and_a_cycle(tmp_path):
    # a tree made by hand: models -> harness is upward; a <-> b is a cycle
    for rel, text in {"__init__.py": "", "models/__init__.py": "", "harness/__init__.py": "",
                      "models/m.py": "def f():\n    from lctx.harness import h\n",
                      "harness/h.py": "", "harness/a.py": "from . import b\n", "harness/b.py": "from .a import x\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    edges = import_edges(tmp_path)
    assert upward_imports(edges) == [("lctx.models.m", "lctx.harness.h", 2)]
    assert cycles(edges) == [["lctx.harness.a", "lctx.harness.b"]]


def test_checker_sees_an_upward_import_between_rooms(tmp_path):
    # a run module that draws a figure reaches up into outputs; an output reading the run's tables does not
    for rel, text in {"__init__.py": "", "harness/__init__.py": "", "harness/run/__init__.py": "",
                      "harness/outputs/__init__.py": "", "harness/run/tables.py": "",
                      "harness/run/console.py": "def f():\n    from lctx.harness.outputs import report\n",
                      "harness/outputs/report.py": "from lctx.harness.run.tables import x\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert upward_imports(import_edges(tmp_path)) == [("lctx.harness.run.console", "lctx.harness.outputs.report", 2)]


def test_no_upward_import():
    up = upward_imports(import_edges(ROOT))
    assert not up, "upward imports (module -> module:line):\n" + "\n".join(f"{a} -> {b}:{n}" for a, b, n in up)


def test_no_import_cycle():
    cyc = cycles(import_edges(ROOT))
    assert not cyc, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cyc)


#: Files whose function-level imports are not audited yet (issue 13.4), each with the reason: none left (the 13
#: files issue 15's start-up work was changing were audited after it landed). Add one only while another branch
#: rewrites its imports, and remove it again once its imports carry their reasons.
NOT_AUDITED: dict[str, str] = {}


def function_imports(root: Path) -> list[tuple[str, int, str, bool]]:
    """(file, line, import, marked) for every import inside a function of the package (every file, the
    :data:`NOT_AUDITED` ones included); marked: a comment on its line or the line above says why."""
    out = set()
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if not (rel.parts[0] in LAYERS[1:-1] or len(rel.parts) == 1 and p.name != "conftest.py") \
                or "checkpoints" in rel.parts:
            continue
        lines = p.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        here = "\n".join(lines[node.lineno - 1: node.end_lineno])
                        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                        out.add((rel.as_posix(), node.lineno, ast.unparse(node),
                                 "#" in here or above.startswith("#")))
    return sorted(out)


def unmarked_lazy_imports(root: Path) -> list[str]:
    """Imports inside functions without a comment on their line (or the line above) saying why they are there:
    ``# lazy: loads X`` (importing X at the top would slow this module's import: ``python -X importtime``),
    an optional dependency, or another reason. An import that costs nothing at the top belongs there."""
    return [f"{f}:{n}: {imp}" for f, n, imp, marked in function_imports(root) if not marked and f not in NOT_AUDITED]


def test_checker_sees_an_unmarked_lazy_import(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "m.py").write_text(
        "def f():\n    import json\n\n\ndef g():\n    import torch  # lazy: loads torch\n")
    assert unmarked_lazy_imports(tmp_path) == ["harness/m.py:2: import json"]


def test_every_lazy_import_says_why():
    bad = unmarked_lazy_imports(ROOT)
    assert not bad, "imports inside functions without a reason (hoist them, or say why):\n" + "\n".join(bad)


if __name__ == "__main__":
    tree = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    e = import_edges(tree)
    up, cyc = upward_imports(e), cycles(e)
    print(f"{len(e)} internal imports, {len(up)} upward, {len(cyc)} cycles")
    for a, b, n in up:
        print(f"  up: {a} -> {b} (line {n})")
    for c in cyc:
        print("  cycle: " + " <-> ".join(c))
    fi = function_imports(tree)
    print(f"{len(fi)} imports inside functions, {sum(m for *_, m in fi)} with a reason; "
          f"{len(unmarked_lazy_imports(tree))} without one outside NOT_AUDITED")
