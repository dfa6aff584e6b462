"""The ``--position NAME[:KEY=VALUE,...]`` spec without torch: its syntax, and the method names, read as the
file names of ``models/position/`` (one file per method, named as the method), so that ``lctx run`` refuses a
misspelt method or a malformed spec before torch loads. The options themselves are checked against the method's
schema by :func:`lctx.models.position.base.parse_position` before any model loads.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from lctx.errors import LctxError

#: the name that means "as shipped" (:data:`lctx.models.position.base.SHIPPED`)
SHIPPED = "shipped"
#: files of models/position/ that are not methods
_NOT_METHODS = {"__init__", "base"}


def method_names() -> list[str]:
    """The positional methods lctx ships: the ``*.py`` files of ``models/position/`` but ``__init__`` and ``base``,
    sorted (no import)."""
    folder = Path(__file__).resolve().parent / "models" / "position"
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in _NOT_METHODS and not p.stem.startswith("_"))


def split_position(spec: str) -> tuple[str, dict[str, str]]:
    """(the method name, {key: value as written}) of ``NAME[:KEY=VALUE[,KEY=VALUE...]]``; the name checked against
    :func:`method_names` (and ``shipped``).

    Raises:
        LctxError: an empty spec, an item that is not KEY=VALUE, a key given twice, an unknown method name (with
            the closest known one), two methods stacked with ``+`` (one method per model: two ``--position`` are a
            sweep), a ``factor`` <= 1 (every method's factor is a context extension); one line each."""
    text = str(spec).strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise LctxError(f"--position {spec!r} names no method; write e.g. --position yarn:factor=4 (or shipped)")
    known = [SHIPPED] + method_names()
    parts = [x.strip() for x in name.split("+")]
    if len(parts) > 1 and all(x in known for x in parts):
        raise LctxError(f"--position {name} stacks {len(parts)} methods on one model; lctx runs one method per model: "
                        f"give each its own --position ({' '.join('--position ' + x for x in parts)}), which sweeps "
                        "them side by side, each a model of the run")
    if name not in known:
        near = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise LctxError(f"unknown --position method {name!r}; {hint}use one of {', '.join(known)} "
                        "(`lctx list positions`)")
    items: dict[str, str] = {}
    for item in (p.strip() for p in rest.split(",")) if rest.strip() else ():
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise LctxError(f"--position {name}: {item!r} is not KEY=VALUE; write e.g. --position {name}:factor=4")
        if key in items:
            raise LctxError(f"--position {name}: {key} is given twice")
        items[key] = value
    factor = _number(items.get("factor"))
    if factor is not None and not factor > 1:  # every method's factor is a context extension (NaN fails too)
        raise LctxError(f"--position {name}: factor={items['factor']} does not extend the context (it must be > 1); "
                        f"pass e.g. {name}:factor=4, or --position shipped for the model as it is")
    return name, items


def _number(text) -> float | None:
    """``text`` as a float, or None when it is not a number (the full parse names that)."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
