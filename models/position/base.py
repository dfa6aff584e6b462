"""Positional methods applied to a loaded checkpoint: the interface every method implements, the registry,
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

import hashlib
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
                            "the server with the method (docs/positions.md#served-and-gguf-models) and evaluate it as shipped")

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

    def validate(self) -> None:
        """Checks across this instance's options once they are parsed (:func:`parse_position` calls it, before any
        model loads): e.g. a scaling ``factor`` that is missing or <= 1. Default: none.

        Raises:
            LctxError: one line naming the option and the fix."""

    def layer_types(self, config) -> list:
        """Kind ``"rope"``: the keys of ``config``'s ``rope_parameters`` this method edits (``[None]`` for a model with
        one RoPE for every layer; Gemma 3: ``"full_attention"`` and/or ``"sliding_attention"``); :func:`load_lm`
        calls :meth:`apply_config` once per key. Default: ``[None]``."""
        return [None]

    def effective(self, lm) -> dict:
        """Kind ``"attention"``: the settings the loaded model's attention function holds once :meth:`apply_model`
        ran (window, sink, group sizes, the scale...), read back from the model (``lm.model``'s configs or modules),
        not from ``self.options``; :func:`effective_positions` records them under ``"attention"``. Default: {}."""
        return {}

    def record(self) -> dict:
        """What run.json records of the method: ``{"method", "options", "layer_type"}`` (every option, defaults
        included; ``layer_type``: the layer types it applies to, ``"all"`` for a model with one RoPE, or the value
        :meth:`apply_config` recorded in ``self.applied_layer_type``)."""
        return {"method": self.name, "options": dict(self.options),
                "layer_type": getattr(self, "applied_layer_type", None) or "all"}


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
            valid = ", ".join(f"{k2} ({_describe(o)})" for k2, o in schema.items()) or "none"
            owners = sorted(n for n, c in POSITION_METHODS.items() if n != name and k in c.options)
            whose = f" ({k} is an option of {', '.join(owners)}: one method per --position)" if owners else ""
            raise LctxError(f"--position {name}: no option {k!r}{whose}; its options are {valid}")
        values[k] = _coerce(name, k, v, schema[k])
    method = cls(**values)
    method.validate()
    return method


def _describe(opt: Opt) -> str:
    """An option's type and default for messages and ``lctx list positions``: ``float, default 32`` or, for an
    option without a default, ``float, required`` / ``float, optional`` (its help says which)."""
    if opt.default is not None:
        return opt.describe()
    kind = "|".join(opt.choices) if opt.choices else opt.type.__name__
    return f"{kind}, {'required' if 'required' in opt.doc else 'optional'}"


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


# ---------------------------------------------------------------------------------------------------------------
# what the loaded model computes with: read back from the built modules
# ---------------------------------------------------------------------------------------------------------------

#: rope_type values whose frequencies depend on the forward's length (transformers' ``dynamic_rope_update``)
LENGTH_DEPENDENT = ("dynamic", "longrope")


def freq_summary(inv_freq, attention_scaling) -> dict:
    """A summary of one RoPE table: ``n`` (frequencies), ``first`` / ``last`` (rad per token), ``geomean`` (the
    geometric mean of the positive ones; a zero marks a dimension left unrotated), ``sha`` (16 hex digits of SHA-256
    over the float32 values: equal tables have equal digests) and ``attention_scaling`` (the factor transformers
    multiplies cos and sin by; the logits scale by its square). ``inv_freq``: a 1-D tensor."""
    v = inv_freq.detach().float().cpu().contiguous()
    pos = v[v > 0].double()
    return {"n": int(v.numel()), "first": float(v[0]) if v.numel() else None,
            "last": float(v[-1]) if v.numel() else None,
            "geomean": float(pos.log().mean().exp()) if pos.numel() else None,
            "sha": hashlib.sha256(v.numpy().tobytes()).hexdigest()[:16],
            "attention_scaling": float(attention_scaling)}


def rotary_tables(model) -> list[tuple[str, object, str | None]]:
    """The RoPE tables of a transformers ``model``, as built: [(key, rotary module, layer type or None)]. A module
    with one ``inv_freq`` buffer (Llama, Mistral, Qwen2, ...) gives key ``"all"``; one with a buffer per layer type
    (Gemma 3's ``full_attention_inv_freq`` / ``sliding_attention_inv_freq``) one key per layer type. With several
    rotary modules the key is prefixed by the module's name (``"model.rotary_emb:all"``)."""
    found = []
    for mname, mod in model.named_modules():
        bufs = dict(mod.named_buffers(recurse=False))
        if "inv_freq" in bufs:
            found.append((mname, mod, None))
        for b in sorted(bufs):
            if b.endswith("_inv_freq") and not b.endswith("original_inv_freq") and b != "inv_freq":
                found.append((mname, mod, b[: -len("_inv_freq")]))
    several = len({m for m, _, _ in found}) > 1
    return [((f"{m}:" if several else "") + (lt or "all"), mod, lt) for m, mod, lt in found]


def _rope_type(mod, layer_type):
    rt = getattr(mod, "rope_type", None)
    return rt.get(layer_type) if isinstance(rt, dict) and layer_type is not None else rt


def _table(mod, layer_type):
    """(inv_freq, attention_scaling) a rotary module holds now for ``layer_type`` (None: its one table)."""
    if layer_type is None:
        return mod.inv_freq, getattr(mod, "attention_scaling", 1.0)
    return getattr(mod, f"{layer_type}_inv_freq"), getattr(mod, f"{layer_type}_attention_scaling",
                                                          getattr(mod, "attention_scaling", 1.0))


def rope_effective(model, probe_length: int | None = None, fix=None, release=None,
                   length_types: dict | None = None) -> dict:
    """{key: summary} of every RoPE table of ``model`` (:func:`rotary_tables`, :func:`table_summaries`)."""
    return table_summaries(rotary_tables(model), probe_length, fix=fix, release=release, length_types=length_types)


def table_summaries(tables: list, probe_length: int | None = None, fix=None, release=None,
                    length_types: dict | None = None) -> dict:
    """{key: {"rope_type", **:func:`freq_summary`}} of RoPE ``tables`` ([(key, rotary module, layer type or None)],
    :func:`rotary_tables`). A length-dependent table (dynamic NTK, LongRoPE) is also read at ``probe_length`` tokens
    under ``"at_length"``: ``fix(probe_length)`` sets the model's tables to what a forward of that length computes
    with (:meth:`lctx.models.adapters.hf.HFAdapter.fix_rope_length`), ``release()`` gives them back; without ``fix``
    the table is computed from the module's config as transformers' update does (``ROPE_INIT_FUNCTIONS``).
    ``length_types``: {key: rope_type} of the tables known to be length-dependent (an adapter's fixed tables say
    ``lctx_fixed`` while they are held)."""
    out: dict = {}
    for key, mod, lt in tables:
        inv, scaling = _table(mod, lt)
        rt = (length_types or {}).get(key) or _rope_type(mod, lt)
        out[key] = {"rope_type": rt, **freq_summary(inv, scaling)}
    dyn = [(key, mod, lt) for key, mod, lt in tables if out[key]["rope_type"] in LENGTH_DEPENDENT]
    if probe_length and dyn:
        if fix is not None:
            fix(probe_length)
            try:
                for key, mod, lt in dyn:
                    out[key]["at_length"] = {"length": int(probe_length), **freq_summary(*_table(mod, lt))}
            finally:
                if release is not None:
                    release()
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # lazy: loads transformers' RoPE table

            for key, mod, lt in dyn:
                kw = {"layer_type": lt} if lt is not None else {}
                if out[key]["rope_type"] == "longrope":  # transformers keeps the load-time scaling for LongRoPE
                    params = mod.config.rope_parameters[lt] if lt is not None else mod.config.rope_parameters
                    long = probe_length > params["original_max_position_embeddings"]
                    inv = (ROPE_INIT_FUNCTIONS["longrope"](mod.config, None, seq_len=probe_length, **kw)[0]
                           if long else _table(mod, lt)[0])
                    scaling = _table(mod, lt)[1]
                elif probe_length > mod.original_max_seq_len:
                    inv, scaling = ROPE_INIT_FUNCTIONS[out[key]["rope_type"]](mod.config, None, seq_len=probe_length,
                                                                              **kw)
                else:
                    inv, scaling = _table(mod, lt)
                out[key]["at_length"] = {"length": int(probe_length), **freq_summary(inv, scaling)}
    return out


def shipped_tables(model, config) -> list:
    """The RoPE tables ``model`` would hold as shipped: each of its rotary modules (:func:`rotary_tables`) built
    again, by its own class, from the checkpoint's unmodified ``config`` (its text part where the module holds
    that); same keys. What :func:`check_took_effect` compares a method's tables with."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    own_text = model.config.get_text_config() if callable(getattr(model.config, "get_text_config", None)) else None
    built: dict = {}
    out = []
    for key, mod, lt in rotary_tables(model):
        if id(mod) not in built:
            cfg = text if own_text is not None and mod.config is own_text and mod.config is not model.config else config
            built[id(mod)] = type(mod)(cfg)
        out.append((key, built[id(mod)], lt))
    return out


def attention_state(model) -> dict:
    """What the loaded ``model`` computes attention with: ``implementation`` (transformers'
    ``config._attn_implementation``, e.g. ``lctx_sdpa``; an lctx checkpoint: None) and, for an lctx checkpoint, its
    layers' ``variant_modules`` (the attention variant classes, e.g. ``RopeSSMax``)."""
    cfg = getattr(model, "config", None)
    state = {"implementation": getattr(cfg, "_attn_implementation", None)}
    if getattr(cfg, "model_type", None) == "lctx":
        state["implementation"] = None
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        state["variant_modules"] = sorted({type(b.attn.variant).__name__ for b in layers if hasattr(b, "attn")})
    return state


def effective_positions(lm, method: PositionMethod | None = None, probe_length: int | None = None) -> dict:
    """What the loaded model ``lm`` (an :class:`lctx.models.adapters.hf.HFAdapter`, or a bare transformers model)
    computes with, read from its built modules, not from its config: ``{"rope": {key: {"rope_type", "n", "first",
    "last", "geomean", "sha", "attention_scaling"[, "at_length"]}}, "attention": {"implementation", ...}}``
    (:func:`rope_effective`, :func:`attention_state`; ``method.effective(lm)`` adds an attention method's held
    settings). Length-dependent tables are read at ``probe_length`` tokens too (through the adapter's
    ``fix_rope_length``, as a sample of that length runs). lctx records it in run.json (``inputs.models[name]
    ["position"]["effective"]``) and compares it with the unscaled model's (:func:`check_took_effect`)."""
    model = getattr(lm, "model", lm)
    fix = getattr(lm, "fix_rope_length", None) if model is not lm else None
    release = getattr(lm, "release_rope", None) if model is not lm else None
    held = getattr(lm, "length_rope_types", None)
    rope = rope_effective(model, probe_length, fix=fix, release=release,
                          length_types=held() if callable(held) else None)
    attention = attention_state(model)
    if method is not None and method.kind == "attention":
        attention.update(method.effective(lm))
    return {"rope": rope, "attention": attention}


def unchanged_tables(effective: dict, baseline: dict, keys: list[str]) -> list[str]:
    """The keys of ``keys`` whose RoPE table in ``effective`` equals ``baseline``'s: same frequencies (digest), same
    attention scaling, and for a length-dependent table the same at the probed length; a key missing on either
    side counts as unchanged (nothing there took the method)."""
    same = []
    for k in keys:
        a, b = effective.get("rope", {}).get(k), baseline.get("rope", {}).get(k)
        if a is None or b is None:
            same.append(k)
            continue
        al, bl = a.get("at_length") or a, b.get("at_length") or b
        if (a["sha"], a["attention_scaling"], al["sha"], al["attention_scaling"]) == \
                (b["sha"], b["attention_scaling"], bl["sha"], bl["attention_scaling"]):
            same.append(k)
    return same


def check_took_effect(method: PositionMethod, effective: dict, baseline: dict, name: str,
                      keys: list[str] | None = None) -> None:
    """Refuse a method that was accepted but not applied: for kind ``"rope"``, a table of ``keys`` (default: every
    table of the model) whose frequencies and scaling equal the unscaled model's (``baseline``, the same summaries of
    the checkpoint as shipped); for kind ``"attention"``, an attention state equal to the shipped one (transformers
    kept its own attention function).

    Raises:
        LctxError: one line naming the method, the model and the layer types that did not change."""
    label = method.spec.label
    if method.kind == "rope":
        keys = list(keys) if keys is not None else sorted(effective.get("rope", {}))
        if not keys:
            raise LctxError(f"--position {label}: model {name!r} has no RoPE table (no rotary module with inv_freq) "
                            "to scale; use a RoPE model, or --position shipped")
        same = unchanged_tables(effective, baseline, keys)
        if same:
            raise LctxError(f"--position {label} was accepted but not applied: model {name!r}'s RoPE "
                            f"({', '.join(same)}) has the frequencies and attention scaling it has as shipped; the "
                            "method changes nothing there (check its options against the checkpoint's "
                            "rope_parameters), so lctx refuses it rather than report the shipped model under its name")
        return
    keep = {k: v for k, v in effective.get("attention", {}).items() if k in ("implementation", "variant_modules")}
    if keep == {k: v for k, v in baseline.get("attention", {}).items() if k in keep}:
        raise LctxError(f"--position {label} was accepted but not applied: model {name!r} still runs its shipped "
                        f"attention ({keep.get('implementation') or keep.get('variant_modules')}); lctx refuses it "
                        "rather than report the shipped model under the method's name")
