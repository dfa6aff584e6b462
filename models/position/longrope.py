"""``longrope``: LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens",
arXiv 2402.13753, Section 3): every RoPE dimension gets its own rescale factor λ_i, found by search, one set for
sequences within the training length L (``short_factor``) and one beyond it (``long_factor``), and cos and sin are
scaled as Phi-3 does (Phi-3's ``Phi3LongRoPEScaledRotaryEmbedding``; transformers' ``rope_type`` ``"longrope"``):

    θ_i' = θ_i / λ_i   (λ = short_factor for T <= L, long_factor for T > L)
    attention scaling = sqrt(1 + ln(s) / ln(L))   (1 for s <= 1; or attention_factor)

The factors come from the user (``factors=FILE.json`` holding ``{"short_factor": [d/2 numbers], "long_factor":
[d/2 numbers]}``, optionally ``"factor"`` and ``"attention_factor"``) or from a checkpoint that ships LongRoPE
(Phi-3/3.5: its own lists, e.g. to change ``factor``). The table depends on the sample's length: lctx holds it per
sample (:meth:`lctx.models.adapters.hf.HFAdapter.fix_rope_length`). Options: ``factors``, ``factor`` (s > 1;
default the file's, the checkpoint's, or max_position_embeddings / L), ``attention_factor``,
``original_max_position_embeddings`` (L), ``layers`` (Gemma 3). :func:`reference` is the formula in plain Python.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from lctx.errors import LctxError
from lctx.models.options import Opt
from lctx.outside import quote

from ._rope import LAYERS_OPT, ORIGINAL, RopeMethod, rope_dim, text_config
from .base import _fmt, register_position


def reference(dim: int, base: float, short_factor: list[float], long_factor: list[float], factor: float,
              original: int, length: int, attention_factor: float | None = None) -> tuple[list[float], float]:
    """LongRoPE's frequencies for a sequence of ``length`` tokens and its attention scaling, from the formula above."""
    lam = long_factor if length > original else short_factor
    scaling = (attention_factor if attention_factor is not None else
               1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original)))
    return [base ** (-2 * i / dim) / lam[i] for i in range(dim // 2)], scaling


def _factor_list(value, key: str, where: str) -> list[float]:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in value):
        raise LctxError(f"--position longrope: {where}'s {key} is not a list of positive numbers; write "
                        f'{{"{key}": [1.0, 1.1, ...]}} with one factor per rotary frequency (d/2 of them)')
    return [float(v) for v in value]


@register_position
class LongRoPE(RopeMethod):
    """LongRoPE (:mod:`lctx.models.position.longrope`)."""

    name = "longrope"
    options = {"factors": Opt(str, None, "a JSON file with short_factor and long_factor (d/2 numbers each); "
                                       "default: the checkpoint's own LongRoPE factors"),
               "factor": Opt(float, None, "the context extension s (> 1); default the file's or the checkpoint's"),
               "attention_factor": Opt(float, None, "the cos/sin scaling; default sqrt(1 + ln s / ln L)"),
               "original_max_position_embeddings": ORIGINAL, "layers": LAYERS_OPT}
    source = ("Ding et al. 2024, arXiv 2402.13753, Section 3 (per-dimension rescale factors, short and long); "
              "attention scaling sqrt(1 + ln s / ln L) as Phi-3's Phi3LongRoPEScaledRotaryEmbedding")
    summary = "LongRoPE: per-dimension searched factors (short <= L, long beyond), from a file or the checkpoint"
    length_dependent = True
    requires_factor = False

    def __init__(self, **options):
        super().__init__(**options)
        self._file: dict = {}
        self._factor: float | None = None

    def validate(self) -> None:
        """As :meth:`RopeMethod.validate`; ``factors`` a readable JSON object with both lists, ``attention_factor``
        > 0.

        Raises:
            LctxError: one line naming the file or option and the fix."""
        super().validate()
        path = self.options["factors"]
        if path:
            p = Path(path).expanduser()
            try:
                data = json.loads(p.read_text())
            except (OSError, ValueError) as e:
                raise LctxError(f"--position longrope: factors={quote(path)} is not a readable JSON file "
                                f"({type(e).__name__}); write {{\"short_factor\": [...], \"long_factor\": [...]}}") from None
            if not isinstance(data, dict):
                raise LctxError(f"--position longrope: factors={quote(path)} holds no JSON object; write "
                                '{"short_factor": [...], "long_factor": [...]}')
            for k in ("short_factor", "long_factor"):
                _factor_list(data.get(k), k, f"factors={quote(path)}")
            self._file = data
        a = self.options["attention_factor"]
        if a is not None and a <= 0:
            raise LctxError(f"--position longrope: attention_factor={_fmt(a)} must be > 0")

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """transformers' ``"longrope"`` table: the factor lists (the file's, else the shipped table's), ``factor``,
        ``original_max_position_embeddings`` and ``attention_factor`` when given.

        Raises:
            LctxError: no factors (neither a file nor a LongRoPE checkpoint), lists of the wrong length, no factor."""
        d = rope_dim(cfg, params)
        if self._file:
            src, where = self._file, f"factors={quote(self.options['factors'])}"
        elif params.get("rope_type") == "longrope":
            src, where = params, "the checkpoint"
        else:
            raise LctxError("--position longrope needs its per-dimension factors: factors=FILE.json holding "
                            '{"short_factor": [...], "long_factor": [...]} (LongRoPE\'s searched factors, '
                            f"{d // 2} each for this model), or a checkpoint shipped with LongRoPE (Phi-3)")
        lists = {k: _factor_list(src.get(k), k, where) for k in ("short_factor", "long_factor")}
        for k, v in lists.items():
            if len(v) != d // 2:
                raise LctxError(f"--position longrope: {where}'s {k} has {len(v)} factors; this model's RoPE has "
                                f"{d // 2} frequencies (rotary dimension {d}): give {d // 2}")
        factor = self.options["factor"] or src.get("factor")
        if factor is None:
            top = getattr(cfg, "max_position_embeddings", None)
            factor = top / original if top and top > original else None
        if factor is None or factor <= 1:
            raise LctxError(f"--position longrope needs factor=S > 1 (the context extension); {where} gives "
                            f"{'none' if factor is None else _fmt(float(factor))}: pass e.g. longrope:factor=4")
        self._factor = float(factor)
        out = {"rope_type": "longrope", **lists, "factor": self._factor,
               "original_max_position_embeddings": int(original), "rope_theta": params["rope_theta"]}
        att = self.options["attention_factor"] if self.options["attention_factor"] is not None else (
            src.get("attention_factor") if self._file else None)
        if att is not None:
            out["attention_factor"] = float(att)
        return out

    def apply_config(self, config, layer_type: str | None = None) -> None:
        """As :meth:`RopeMethod.apply_config`, and ``max_position_embeddings`` = factor x L, as LongRoPE checkpoints
        declare it."""
        super().apply_config(config, layer_type)
        if self.applied_layer_type != "sliding_attention":
            text_config(config).max_position_embeddings = self.max_length(None)

    def factor(self) -> float | None:
        """The factor resolved from the option, the file or the checkpoint (:meth:`rope_parameters`)."""
        return self._factor or self.options.get("factor")
