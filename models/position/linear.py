"""``linear``: position interpolation (Chen, Wong, Chen, Tian 2023, "Extending Context Window of Large Language
Models via Positional Interpolation", arXiv 2306.15595, Section 2.2): a position m is read as m / s, so a model
trained on L tokens sees s·L tokens at the positions it was trained on. Since RoPE's angle is m·θ_i, dividing the
position by s is dividing every frequency by s:

    θ_i' = θ_i / s,   θ_i = b^(-2i/d),  i = 0 .. d/2 - 1          (RoPE: Su et al. 2021, eq. 15)

Applied through transformers' ``rope_parameters`` (``rope_type`` ``"linear"``, ``factor`` s); the attention
scaling stays 1. Options: ``factor`` (s > 1, required), ``original_max_position_embeddings`` (the L the model
addresses s·L of; default the checkpoint's), ``layers`` (Gemma 3). :func:`reference` is the formula above in plain
Python, for the tests.
"""

from __future__ import annotations

from ._rope import FACTOR, LAYERS_OPT, ORIGINAL, RopeMethod
from .base import register_position


def reference(dim: int, base: float, factor: float) -> tuple[list[float], float]:
    """Position interpolation's frequencies and attention scaling from the paper's formula: (θ_i / s for i < d/2,
    1.0). ``dim``: the rotary dimension d; ``base``: RoPE's b (``rope_theta``); ``factor``: s."""
    return [base ** (-2 * i / dim) / factor for i in range(dim // 2)], 1.0


@register_position
class Linear(RopeMethod):
    """Position interpolation (:mod:`lctx.models.position.linear`)."""

    name = "linear"
    options = {"factor": FACTOR, "original_max_position_embeddings": ORIGINAL, "layers": LAYERS_OPT}
    source = "Chen et al. 2023, arXiv 2306.15595, Section 2.2 (position interpolation): theta_i' = theta_i / s"
    summary = "position interpolation: every RoPE frequency divided by factor"

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """``{"rope_type": "linear", "factor": s, "rope_theta": the shipped base}``."""
        return {"rope_type": "linear", "factor": float(self.options["factor"]), "rope_theta": params["rope_theta"]}
