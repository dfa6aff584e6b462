"""The ``--attn-override NAME[:KEY=VALUE,...]`` spec: names, default options and the parser, without torch
(``lctx run`` checks it before torch loads; :mod:`lctx.models.adapters.overrides` applies it to a model)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lctx.errors import LctxError
from lctx.registry import Registry

# name -> default options (all numeric)
OVERRIDES: Registry[dict[str, float]] = Registry("--attn-override", {"ssmax": {"s": 1.0},
                                                               "alibi_lsh": {"s": 16, "seed": 0}})


@dataclass
class AttnOverride:
    """A parsed ``--attn-override``: ``name`` (a key of :data:`OVERRIDES`) and its ``options``."""

    name: str
    options: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Canonical text: the name, then the options that differ from the defaults (``ssmax:s=0.43``)."""
        extra = [f"{k}={_fmt(v)}" for k, v in sorted(self.options.items()) if v != OVERRIDES[self.name][k]]
        return self.name + (":" + ",".join(extra) if extra else "")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def parse_override(text: str) -> AttnOverride:
    """Parse ``NAME[:KEY=VALUE[,KEY=VALUE...]]``, e.g. ``ssmax``, ``ssmax:s=0.43``, ``alibi_lsh:s=16``.

    Raises:
        LctxError: unknown name, unknown key, or a value that is not a number.
    """
    name, _, rest = text.strip().partition(":")
    name = name.strip()
    if name not in OVERRIDES:
        raise LctxError(f"unknown --attn-override {name!r}; use one of {', '.join(OVERRIDES)} "
                        "(e.g. --attn-override ssmax:s=0.43)")
    opts = dict(OVERRIDES[name])
    for item in [p.strip() for p in rest.replace(":", ",").split(",") if p.strip()]:
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in opts:
            raise LctxError(f"--attn-override {name}: bad option {item!r}; options are "
                            f"{', '.join(f'{k}=<number>' for k in opts)}")
        try:
            opts[key] = float(val)
        except ValueError:
            raise LctxError(f"--attn-override {name}: {key}={val!r} is not a number") from None
    if name == "alibi_lsh":
        if opts["s"] < 1 or not float(opts["s"]).is_integer():
            raise LctxError(f"--attn-override alibi_lsh: s={_fmt(opts['s'])} must be a whole number of samples >= 1")
        opts = {k: int(v) for k, v in opts.items()}
    if name == "ssmax" and not math.isfinite(opts["s"]):
        raise LctxError("--attn-override ssmax: s must be a finite number")
    return AttnOverride(name, opts)
