"""Positional methods on real checkpoints: RoPE scaling through transformers' ``rope_parameters``, attention
sinks, Self-Extend, SSMax / log-n; one file per method, named as the method (:mod:`.base` holds the interface, the
registry and the parse). Importing this package registers every method of the folder."""

import importlib
from pathlib import Path

from .base import (POSITION_METHODS, SHIPPED, PositionMethod, PositionSpec, check_took_effect, effective_positions,
                   parse_position, register_position)

for _p in sorted(Path(__file__).parent.glob("*.py")):
    if _p.stem not in ("__init__", "base") and not _p.stem.startswith("_"):
        importlib.import_module(f"{__name__}.{_p.stem}")

__all__ = ["POSITION_METHODS", "SHIPPED", "PositionMethod", "PositionSpec", "check_took_effect", "effective_positions",
           "parse_position", "register_position"]
