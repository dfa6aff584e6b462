"""Positional methods applied to a loaded checkpoint (issue 43): the interface every method implements, the registry,
and the parse of a ``--position NAME[:KEY=VALUE,...]`` spec against a method's option schema.

A method is one file of this package whose name is the method's name (``yarn.py`` registers ``yarn``), so the CLI's
early check (:mod:`lctx.position_spec`) can list the names without importing torch. Two kinds:

* ``"rope"``: the method edits the checkpoint's ``config.rope_parameters`` before the weights load (transformers'
  ``ROPE_INIT_FUNCTIONS`` then builds the rotary tables: linear, dynamic NTK, YaRN, LongRoPE, Llama 3, and lctx's
  static NTK-aware and ``rope_theta`` overrides);
* ``"attention"``: the method registers an attention function (transformers' ``AttentionInterface`` /
  ``AttentionMaskInterface``) and selects it after the load (attention sinks, Self-Extend, SSMax / log-n).

What a method did is read back from the built modules (:func:`lctx.models.position.effective_positions`), recorded in
run.json and compared with the unscaled model's: a method that changed nothing is refused before the sweep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lctx.errors import LctxError
from lctx.models.options import Opt
from lctx.registry import Registry

#: name -> PositionMethod subclass (each file of this package registers its own with :func:`register_position`)
POSITION_METHODS: Registry[type] = Registry("positional method")
#: the name that means "the checkpoint as shipped" (no method)
SHIPPED = "shipped"


@dataclass
class PositionSpec:
    """A parsed ``--position``: the method's ``name`` and its ``options`` (every option of its schema, defaults
    filled in). ``label``: the name and the options that differ from the defaults (``yarn:factor=4``)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``NAME[:k=v,...]`` with the options that differ from the method's defaults, sorted by key."""
        if self.name == SHIPPED:
            return SHIPPED
        schema = POSITION_METHODS[self.name].options
        extra = [f"{k}={_fmt(v)}" for k, v in sorted(self.options.items()) if v != schema[k].default]
        return self.name + (":" + ",".join(extra) if extra else "")

    @property
    def name_suffix(self) -> str:
        """What the model's name gets: ``+`` and the label with ``:`` ``=`` ``,`` folded (``+yarn_factor4``); "" as
        shipped."""
        if self.name == SHIPPED:
            return ""
        return "+" + self.label.replace(":", "_").replace("=", "").replace(",", "_")


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


class PositionMethod:
    """One positional method (subclass per file, registered with :func:`register_position`).

    Class attributes: ``name`` (the registry key, the file's name), ``kind`` (``"rope"`` or ``"attention"``),
    ``options`` ({key: :class:`lctx.models.options.Opt`}: the schema a spec is checked against), ``source`` (paper and
    equation, reference repository), ``summary`` (one line for ``lctx list positions``).

    An instance holds the parsed options (``self.options``, every key of the schema).
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "rope"
    options: ClassVar[dict] = {}
    source: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def __init__(self, **options: Any):
        self.options = dict(options)

    @property
    def spec(self) -> PositionSpec:
        """The :class:`PositionSpec` of this instance."""
        return PositionSpec(self.name, dict(self.options))

    def check(self, config, lm_kind: str = "hf") -> None:
        """Refuse a model this method does not apply to (``lm_kind``: ``"hf"``, ``"native"`` (an lctx checkpoint),
        ``"served"``).

        Raises:
            LctxError: one line naming the model's kind and the fix (e.g. "an ALiBi model has no RoPE to scale")."""
        if lm_kind == "served":
            raise LctxError(f"--position {self.spec.label}: a served model's positional code runs in the server; start "
                            "the server with the method (docs/serving.md#positional-methods) and evaluate it as shipped")

    def apply_config(self, config, layer_type: str | None = None) -> None:
        """Kind ``"rope"``: edit ``config`` (a transformers ``PreTrainedConfig``) in place, before the weights load."""
        raise NotImplementedError

    def apply_model(self, lm) -> None:
        """Kind ``"attention"``: change the loaded adapter ``lm`` (an :class:`lctx.models.adapters.hf.HFAdapter`) in place,
        through transformers' attention interface."""
        raise NotImplementedError

    def max_length(self, original: int | None) -> int | None:
        """The longest context the model addresses under this method, from the checkpoint's ``original`` maximum
        (None: unknown or unbounded). Default: unchanged."""
        return original

    def record(self) -> dict:
        """What run.json records of the method: ``{"method", "options"}`` (every option, defaults included)."""
        return {"method": self.name, "options": dict(self.options)}


def register_position(cls: type) -> type:
    """Class decorator: register a :class:`PositionMethod` subclass under ``cls.name``.

    Raises:
        ValueError: no name, a kind other than "rope"/"attention", or the name is registered already."""
    if not cls.name or cls.kind not in ("rope", "attention"):
        raise ValueError(f"{cls.__name__}: a positional method needs a name and kind 'rope' or 'attention'")
    return POSITION_METHODS.add(cls.name, cls)


def parse_position(spec: str | PositionSpec | None) -> PositionMethod | None:
    """The method instance of ``--position`` ``spec`` (``NAME[:KEY=VALUE,...]``; None or ``shipped``: None), its
    options checked against the method's schema (types, choices) and filled with defaults.

    Raises:
        LctxError: an unknown method (the known ones listed), an option the method does not take (its options
            listed), a value of the wrong type; one line each.
    """
    if spec is None:
        return None
    if isinstance(spec, PositionSpec):
        name, items = spec.name, dict(spec.options)
    else:
        from lctx.position_spec import split_position  # light: no torch

        name, items = split_position(str(spec))
    if name == SHIPPED:
        if items:
            raise LctxError(f"--position {SHIPPED} takes no options (got {', '.join(items)})")
        return None
    if name not in POSITION_METHODS:
        raise LctxError(f"unknown --position method {name!r}; use one of {SHIPPED}, {POSITION_METHODS.known()} "
                        "(`lctx list positions`)")
    cls = POSITION_METHODS[name]
    schema: dict = cls.options
    values = {k: o.default for k, o in schema.items()}
    for k, v in items.items():
        if k not in schema:
            valid = ", ".join(f"{k2} ({o.describe()})" for k2, o in schema.items()) or "none"
            raise LctxError(f"--position {name}: no option {k!r}; its options are {valid}")
        values[k] = _coerce(name, k, v, schema[k])
    return cls(**values)


def _coerce(method: str, key: str, value: Any, opt: Opt) -> Any:
    """``value`` (a str from the command line, or a Python value) as ``opt``'s type.

    Raises:
        LctxError: it is not one (a float must be finite; a str among ``opt.choices`` when it has them)."""
    v = value
    try:
        if opt.type is bool:
            if isinstance(v, str):
                if v.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                v = v.lower() in ("true", "1")
            elif not isinstance(v, bool):
                raise ValueError
        elif opt.type is int:
            f = float(v)
            if isinstance(v, bool) or not f.is_integer():
                raise ValueError
            v = int(f)
        elif opt.type is float:
            if isinstance(v, bool):
                raise ValueError
            v = float(v)
            if not math.isfinite(v):
                raise ValueError
        else:
            v = str(v)
            if opt.choices and v not in opt.choices:
                raise ValueError
    except (TypeError, ValueError):
        want = (f"one of {', '.join(map(str, opt.choices))}" if opt.choices else
                {"bool": "true or false", "int": "a whole number", "float": "a finite number"}.get(opt.type.__name__,
                                                                                                  opt.type.__name__))
        raise LctxError(f"--position {method}: {key}={value!r} is not {want}") from None
    return v
