"""Every default of :mod:`lctx.defaults` is defined once (issue 43, Architecture: ``chunk_size=2048`` was written six
times, and a default changed in one place kept its old value in the others).

The check reads the package's source with ``ast`` (no import of lctx, as ``tests/test_layers.py`` does) and finds
every place that *defines* a value of one of the defaults' concepts as a literal equal to the default:

* a function parameter's default (``chunk_size: int = 2048``, ``device="auto"``);
* a CLI option's default (``typer.Option(2048, "--chunk-size")``);
* an assignment in a module or class body, a dataclass field included (``chunk_size: int = 2048``,
  ``DEFAULT_RETRIES = 4``);
* a dict entry (``{"chunk_size": 2048}``).

A literal that differs from the default (``device="cpu"`` for a plan of the CPU) is another default, not a second
definition of this one, and is not reported. Run as a script to list the definitions of any tree:
``python tests/test_defaults.py ROOT``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from test_layers import package_files

ROOT = Path(__file__).resolve().parent.parent

#: each default's concept: (the parameter / field / key names that hold it, the CLI flags that set it). A name may be
#: written with a ``default_`` prefix (``DEFAULT_RETRIES``); names compare lower-cased.
CONCEPTS = {
    "DEVICE": ({"device"}, {"--device"}),
    "DTYPE": ({"dtype"}, {"--dtype"}),
    "CHUNK_SIZE": ({"chunk_size", "chunk"}, {"--chunk-size"}),
    "REQUEST_TIMEOUT_S": ({"request_timeout", "request_timeout_s", "timeout_s", "timeout"}, {"--request-timeout"}),
    "RETRIES": ({"retries"}, {"--retries"}),
    "CONCURRENCY": ({"concurrency"}, {"--concurrency"}),
    "LMEVAL_BATCH_SIZE": ({"batch_size", "lmeval_batch", "lmeval_batch_size"}, set()),
}


def defaults_of(root: Path) -> dict:
    """{NAME: value} of ``root/defaults.py``'s module-level constants (read with ``ast``)."""
    tree = ast.parse((root / "defaults.py").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value.value
    return out


def _same(node, value) -> bool:
    """``node`` is a literal equal to ``value`` (of the same kind: a str for a str, a number for a number)."""
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool) or node.value is None:
        return False
    v = node.value
    if isinstance(value, str):
        return isinstance(v, str) and v == value
    return isinstance(v, (int, float)) and not isinstance(v, str) and v == value


def _concepts(name: str) -> list[str]:
    """The concepts whose names hold ``name`` (``DEFAULT_RETRIES`` -> RETRIES)."""
    n = name.lower().removeprefix("default_")
    return [c for c, (names, _) in CONCEPTS.items() if n in names]


def definitions(root: Path) -> list[tuple[str, str, int, str]]:
    """(concept, file, line, what) of every literal definition of a default's value outside ``defaults.py``."""
    values = defaults_of(root)
    out = []

    def hit(concepts, node, value_node, what, path):
        for c in concepts:
            if c in values and _same(value_node, values[c]):
                out.append((c, str(path.relative_to(root)), value_node.lineno, what))

    for mod, path in package_files(root).items():
        if mod == "lctx.defaults":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                pos = a.posonlyargs + a.args
                pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults))
                pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                for arg, d in pairs:
                    hit(_concepts(arg.arg), node, d, f"parameter {arg.arg}", path)
            elif isinstance(node, ast.Call):
                flags = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and a.value.startswith("-")}
                concepts = [c for c, (_, fl) in CONCEPTS.items() if flags & fl]
                default = node.args[0] if node.args else None
                default = next((k.value for k in node.keywords if k.arg == "default"), default)
                if concepts and default is not None:
                    hit(concepts, node, default, f"option {'/'.join(sorted(flags))}", path)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and node.value is not None:
                        hit(_concepts(t.id), node, node.value, f"assignment {t.id}", path)
            elif isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        hit(_concepts(k.value), node, v, f"dict entry {k.value!r}", path)
    return out


def test_every_default_is_defined_once():
    found = definitions(ROOT)
    assert not found, "defaults defined again outside defaults.py (import lctx.defaults instead): " + "; ".join(
        f"{c} at {f}:{line} ({what})" for c, f, line, what in found)


def test_the_check_finds_each_kind_of_second_definition(tmp_path):
    """Control: a tree with one second definition of each kind is caught, each once, and a literal that is another
    value (a CPU plan's ``device="cpu"``) or a name imported from the defaults is not."""
    (tmp_path / "defaults.py").write_text((ROOT / "defaults.py").read_text())
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.py").write_text(
        "import typer\n"
        "from lctx.defaults import CHUNK_SIZE\n"
        "def load(path, chunk_size: int = 2048, device='cpu', dtype=None):\n"      # 1 hit: chunk_size
        "    pass\n"
        "def plan(chunk=CHUNK_SIZE, *, retries=4):\n"                             # 1 hit: retries
        "    pass\n"
        "opt = typer.Option(600.0, '--request-timeout')\n"                       # 1 hit: the option
        "other = typer.Option(8, '--concurrency')\n"                             # another value: none
        "DEFAULT_TIMEOUT_S = 600.0\n"                                            # 1 hit: assignment
        "class A:\n"
        "    dtype: str = 'float32'\n"                                           # 1 hit: a field
        "PATHS = {'device': 'auto', 'chunk_size': CHUNK_SIZE}\n"                 # 1 hit: dict entry
        "LMEVAL_BATCH = 32\n")                                                   # 1 hit
    found = sorted((c, line) for c, _, line, _ in definitions(tmp_path))
    assert found == [("CHUNK_SIZE", 3), ("DEVICE", 12), ("DTYPE", 11), ("LMEVAL_BATCH_SIZE", 13),
                     ("REQUEST_TIMEOUT_S", 7), ("REQUEST_TIMEOUT_S", 9), ("RETRIES", 5)]


def test_the_defaults_are_what_the_cli_shows():
    """The CLI's options take their defaults from the module (an end-to-end read of the parsed command, not the
    source): ``lctx run``'s ``--chunk-size`` and friends."""
    import typer.main

    from lctx import cli, defaults

    cmd = typer.main.get_command(cli.app).commands["run"]
    got = {p.opts[0]: p.default for p in cmd.params if p.opts and p.opts[0].startswith("--")}
    assert got["--chunk-size"] == defaults.CHUNK_SIZE and got["--dtype"] == defaults.DTYPE
    assert got["--device"] == defaults.DEVICE and got["--request-timeout"] == defaults.REQUEST_TIMEOUT_S
    assert got["--retries"] == defaults.RETRIES and got["--concurrency"] == defaults.CONCURRENCY


if __name__ == "__main__":
    for concept, file, line, what in definitions(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(f"{file}:{line}: {concept} ({what})")
