"""``llama3``: Llama 3.1's frequency-dependent scaling (Meta 2024; reference code meta-llama/llama-models,
models/llama3/reference_impl/model.py, ``apply_scaling``, commit 1bb5486; Llama 3.1 ships factor 8, low 1, high 4,
L 8192): wavelengths λ_i = 2π/θ_i shorter than L / high_freq_factor are kept, those longer than L /
low_freq_factor divided by s, and the band between blended by how many turns they make over L:

    λ < L/h:  θ' = θ;      λ > L/l:  θ' = θ / s;
    else:     σ = (L/λ - l) / (h - l),   θ' = (1 - σ)·θ/s + σ·θ

Applied through transformers' ``rope_parameters`` (``rope_type`` ``"llama3"``); the attention scaling stays 1.
Options: ``factor`` (s > 1, required), ``low_freq_factor`` (l, default 1), ``high_freq_factor`` (h, default 4;
h > l), ``original_max_position_embeddings`` (L; default the checkpoint's), ``layers`` (Gemma 3).
:func:`reference` is the formula above in plain Python, for the tests.
"""

from __future__ import annotations

import math

from lctx.errors import LctxError
from lctx.models.options import Opt

from ._rope import FACTOR, LAYERS_OPT, ORIGINAL, RopeMethod, text_config
from .base import _fmt, register_position


def reference(dim: int, base: float, factor: float, original: int, low_freq_factor: float = 1.0,
              high_freq_factor: float = 4.0) -> tuple[list[float], float]:
    """Llama 3.1's frequencies and attention scaling (1.0) from the formula above."""
    out = []
    for i in range(dim // 2):
        theta = base ** (-2 * i / dim)
        wavelen = 2 * math.pi / theta
        if wavelen < original / high_freq_factor:
            out.append(theta)
        elif wavelen > original / low_freq_factor:
            out.append(theta / factor)
        else:
            smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * theta / factor + smooth * theta)
    return out, 1.0


@register_position
class Llama3(RopeMethod):
    """Llama 3.1's RoPE scaling (:mod:`lctx.models.position.llama3`)."""

    name = "llama3"
    options = {"factor": FACTOR,
               "low_freq_factor": Opt(float, 1.0, "wavelengths above L / low_freq_factor are divided by factor"),
               "high_freq_factor": Opt(float, 4.0, "wavelengths below L / high_freq_factor are kept"),
               "original_max_position_embeddings": ORIGINAL, "layers": LAYERS_OPT}
    source = "Meta 2024, Llama 3.1 (meta-llama/llama-models reference_impl/model.py apply_scaling)"
    summary = "Llama 3.1's scaling: low frequencies / factor, high kept, a smooth band between"

    def validate(self) -> None:
        """As :meth:`RopeMethod.validate`; 0 < low_freq_factor < high_freq_factor.

        Raises:
            LctxError: one line naming the fix."""
        super().validate()
        lo, hi = self.options["low_freq_factor"], self.options["high_freq_factor"]
        if not 0 < lo < hi:
            raise LctxError(f"--position llama3: low_freq_factor={_fmt(lo)}, high_freq_factor={_fmt(hi)}; it needs "
                            "0 < low_freq_factor < high_freq_factor (Llama 3.1: 1 and 4)")

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """transformers' ``"llama3"`` table."""
        o = self.options
        return {"rope_type": "llama3", "factor": float(o["factor"]), "low_freq_factor": float(o["low_freq_factor"]),
                "high_freq_factor": float(o["high_freq_factor"]), "original_max_position_embeddings": int(original),
                "rope_theta": params["rope_theta"]}

    def apply_config(self, config, layer_type: str | None = None) -> None:
        """As :meth:`RopeMethod.apply_config`, and ``max_position_embeddings`` = factor x L, as Llama 3.1 declares
        it (transformers checks L is below it)."""
        super().apply_config(config, layer_type)
        if self.applied_layer_type != "sliding_attention":
            text_config(config).max_position_embeddings = self.max_length(None)
