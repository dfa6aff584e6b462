"""What the RoPE-table methods share (not a method: files starting with ``_`` are not listed): :class:`RopeMethod`
edits a checkpoint's ``rope_parameters`` before the weights load, so transformers' own rotary module
(``ROPE_INIT_FUNCTIONS``) builds the scaled table, and the options every such method takes (``factor``,
``original_max_position_embeddings``, ``layers``); :func:`rope_dim` and :func:`text_config` read a config as
transformers' RoPE code does."""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

from lctx.errors import LctxError
from lctx.models.options import Opt

from .base import PositionMethod, _fmt

#: Hugging Face model types that add ALiBi inside their attention (no RoPE to scale)
ALIBI_MODEL_TYPES = ("bloom", "mpt")
#: the values of the ``layers`` option; ``full_attention`` is Gemma 3's global layers, ``sliding_attention`` its local
LAYERS = ("full_attention", "sliding_attention", "all")

FACTOR = Opt(float, None, "the context extension s (> 1): the method's scale; required")
ORIGINAL = Opt(int, None, "the training context the scale is relative to; default: the checkpoint's "
                          "(rope_parameters' original_max_position_embeddings, else max_position_embeddings)")
LAYERS_OPT = Opt(str, "full_attention", "models with a RoPE per layer type (Gemma 3): the layer types to scale",
                 choices=LAYERS)


def text_config(config):
    """The config that holds the decoder's RoPE settings (a multimodal config's text part, else ``config``)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def nested_keys(cfg) -> list[str]:
    """The layer types ``cfg.rope_parameters`` is nested under (Gemma 3: ``full_attention``, ``sliding_attention``),
    or [] for one RoPE for every layer (transformers' ``nested_rope_parameter_keys``)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    nested = getattr(cfg, "nested_rope_parameter_keys", None)
    if callable(nested):
        return list(nested(params))
    labels = getattr(cfg, "layer_types", None) or ()
    return [k for k in params if k in labels]


def rope_dim(cfg, params: dict) -> int:
    """The rotary dimension d of a RoPE table: ``head_dim`` (else hidden / heads) times its partial rotary factor,
    as transformers' ``ROPE_INIT_FUNCTIONS`` compute it (d / 2 frequencies)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return int(head_dim * float(params.get("partial_rotary_factor", 1.0) or 1.0))


class RopeMethod(PositionMethod):
    """A RoPE-table method: :meth:`apply_config` replaces the ``rope_parameters`` of the layer types it applies to
    with :meth:`rope_parameters`'s before the weights load (kind ``"rope"``). Subclasses set ``name``, ``options``,
    ``source``, ``summary``, ``extends`` (the method raises the addressable length to ``factor`` x the original)
    and implement :meth:`rope_parameters`."""

    kind: ClassVar[str] = "rope"
    #: the method extends the context by ``factor`` (its max_length is factor x the original length)
    extends: ClassVar[bool] = True
    #: transformers recomputes its table per forward length (dynamic NTK, LongRoPE)
    length_dependent: ClassVar[bool] = False

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.original: int | None = None  # the original length resolved from the checkpoint (apply_config)
        self.applied_layer_type: str | None = None

    # -- checks ---------------------------------------------------------------------------------------
    def validate(self) -> None:
        """``factor`` given and > 1 (for methods that take one), ``original_max_position_embeddings`` >= 1.

        Raises:
            LctxError: one line naming the option and the fix."""
        if "factor" in self.options and self.requires_factor:
            f = self.options["factor"]
            if f is None:
                raise LctxError(f"--position {self.name} needs factor=S, the context extension (> 1): e.g. "
                                f"--position {self.name}:factor=4")
        f = self.options.get("factor")
        if f is not None and f <= 1:
            raise LctxError(f"--position {self.name}: factor={_fmt(f)} does not extend the context (it must be > 1); "
                            f"pass e.g. {self.name}:factor=4, or --position shipped for the model as it is")
        orig = self.options.get("original_max_position_embeddings")
        if orig is not None and orig < 1:
            raise LctxError(f"--position {self.name}: original_max_position_embeddings={orig} is not a length; pass "
                            "the training context in tokens (e.g. 8192), or leave it out for the checkpoint's")

    requires_factor: ClassVar[bool] = True

    def check(self, config, lm_kind: str = "hf") -> None:
        """Refuse a served model, an lctx checkpoint (its rotations are lctx's own code, not transformers'
        ``rope_parameters``), an ALiBi model (BLOOM, MPT, Falcon with ``alibi``), a model without RoPE parameters
        (learned or no positions), and a ``layers`` the model has no table for.

        Raises:
            LctxError: one line naming the model's kind and the fix."""
        super().check(config, lm_kind)
        cfg = text_config(config)
        mt = getattr(cfg, "model_type", "?")
        label = self.spec.label
        if lm_kind == "native" or mt == "lctx":
            variant = getattr(cfg, "variant", "?")
            why = ("computes its rotations in lctx's own code, not through transformers' rope_parameters"
                   if "rope" in str(variant).split("+")[0] else "has no RoPE to scale")
            raise LctxError(f"--position {label}: this lctx checkpoint (variant {variant!r}) {why}; RoPE-table methods "
                            "apply to Hugging Face and GGUF checkpoints (lctx models: --position ssmax or logn)")
        if mt in ALIBI_MODEL_TYPES or (mt == "falcon" and getattr(cfg, "alibi", False)):
            raise LctxError(f"--position {label}: model type {mt!r} uses ALiBi, which has no RoPE table to scale; "
                            "use a RoPE model (Llama, Qwen, Gemma, SmolLM2, ...)")
        params = getattr(cfg, "rope_parameters", None)
        if not params:
            raise LctxError(f"--position {label}: model type {mt!r} declares no RoPE (no rope_parameters: learned or "
                            "no positions, NoPE), so there is nothing to scale; use a RoPE model")
        nested = nested_keys(cfg)
        layers = self.options.get("layers", "full_attention")
        if not nested and layers == "sliding_attention":
            raise LctxError(f"--position {label}: model type {mt!r} has one RoPE for every layer, no "
                            "sliding_attention table of its own; drop layers= (or pass layers=all)")
        if nested:
            want = [k for k in self.layer_types(config)]
            present = set(getattr(cfg, "layer_types", None) or nested)
            missing = [k for k in want if not params.get(k) or k not in present]
            if missing:
                has = ", ".join(k for k in nested if params.get(k) and k in present)
                raise LctxError(f"--position {label}: model type {mt!r} has no RoPE for layer type(s) "
                                f"{', '.join(missing)} (its RoPE layer types: {has}); pass layers= one of them")

    # -- applying ---------------------------------------------------------------------------------------
    def layer_types(self, config) -> list:
        """``[None]`` for a model with one RoPE; else the layer types the ``layers`` option names (default
        ``full_attention``, Gemma 3's global layers; ``all``: every type its ``rope_parameters`` holds)."""
        cfg = text_config(config)
        nested = nested_keys(cfg)
        if not nested:
            return [None]
        layers = self.options.get("layers", "full_attention")
        return list(nested) if layers == "all" else [layers]

    def resolve_original(self, cfg, params: dict) -> int:
        """The training length the scale is relative to: the option, else the shipped table's
        ``original_max_position_embeddings`` (a checkpoint scaled already, e.g. Llama 3.1's 8192), else the
        config's top-level one (Phi-3), else ``max_position_embeddings``.

        Raises:
            LctxError: none of them is known."""
        for v in (self.options.get("original_max_position_embeddings"), params.get("original_max_position_embeddings"),
                  getattr(cfg, "original_max_position_embeddings", None), getattr(cfg, "max_position_embeddings", None)):
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        raise LctxError(f"--position {self.spec.label}: the checkpoint declares no training length "
                        "(max_position_embeddings); pass original_max_position_embeddings=N")

    def apply_config(self, config, layer_type: str | None = None) -> None:
        """Replace ``config``'s ``rope_parameters`` (for ``layer_type``, or the one table) with
        :meth:`rope_parameters`'s, in place, before the weights load; ``self.original`` and
        ``self.applied_layer_type`` record what it resolved."""
        cfg = text_config(config)
        params = cfg.rope_parameters[layer_type] if layer_type is not None else cfg.rope_parameters
        params = copy.deepcopy(dict(params))
        self.original = self.resolve_original(cfg, params)
        new = self.rope_parameters(params, cfg, self.original)
        if "partial_rotary_factor" in params:
            new.setdefault("partial_rotary_factor", params["partial_rotary_factor"])
        if layer_type is None:
            cfg.rope_parameters = new
        else:
            cfg.rope_parameters = {**cfg.rope_parameters, layer_type: new}
        layers = self.options.get("layers", "full_attention")
        self.applied_layer_type = "all" if layer_type is None or layers == "all" else layer_type

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """The new ``rope_parameters`` dict of one table, from the shipped one (``params``, with ``rope_theta``),
        the config and the original length. Subclasses implement it."""
        raise NotImplementedError

    def max_length(self, original: int | None) -> int | None:
        """``factor`` x the original length for a method that extends (linear, dynamic, yarn, ntk, llama3, longrope)
        applied to the global layers (or the one table); ``original`` otherwise (theta; Gemma 3's sliding layers
        alone, which see their window only)."""
        base = self.original or original
        f = self.factor()
        if not self.extends or base is None or f is None or self.applied_layer_type == "sliding_attention":
            return original
        return int(math.floor(f * base))

    def factor(self) -> float | None:
        """The scale s this instance applies (None: none)."""
        return self.options.get("factor")

    def record(self) -> dict:
        """As :meth:`PositionMethod.record`, with what was resolved from the checkpoint (``resolved``: the original
        length L and the factor s)."""
        return {**super().record(), "resolved": {"original_max_position_embeddings": self.original,
                                                 "factor": self.factor()}}
