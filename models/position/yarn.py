"""``yarn``: YaRN (Peng, Quesnelle, Fan, Shippole 2023, "YaRN: Efficient Context Window Extension of Large Language
Models", arXiv 2309.00071, Sections 3.2 "NTK-by-parts" and 3.4): each RoPE dimension is interpolated by s, kept, or
blended, by how many full turns r = L / λ_d its wavelength λ_d = 2π/θ_d makes over the training length L: r < α
(``beta_slow``, default 1) interpolated (θ/s), r > β (``beta_fast``, default 32) kept (θ), a linear ramp between;
and the attention logits are scaled by a temperature, cos and sin multiplied by sqrt(1/t) = 0.1·ln(s) + 1.

The paper's reference code (jquesnelle/yarn, scaled_rope/LlamaYaRNScaledRotaryEmbedding.py, commit a18e549), which
transformers' ``rope_type`` ``"yarn"`` follows, sets the ramp over the dimension index i (0 .. d/2 - 1) between the
dimensions where r = β and r = α, rounded outwards:

    dim(r) = d · ln(L / (2π r)) / (2 ln b),  low = max(floor(dim(β)), 0),  high = min(ceil(dim(α)), d - 1)
    γ_i = clamp((i - low) / (high - low), 0, 1),   θ_i' = (θ_i / s) · γ_i + θ_i · (1 - γ_i)
    attention scaling = 0.1 ln(s) + 1   (or attention_factor; or mscale(s, mscale) / mscale(s, mscale_all_dim))

Options: ``factor`` (s > 1, required), ``beta_fast``, ``beta_slow`` (0 < α < β), ``attention_factor`` (replaces the
computed scaling), ``mscale`` / ``mscale_all_dim`` (DeepSeek's form, both or neither), ``original_max_position_
embeddings`` (L; default the checkpoint's), ``layers`` (Gemma 3). :func:`reference` is the formula above in plain
Python, for the tests.
"""

from __future__ import annotations

import math

from lctx.errors import LctxError
from lctx.models.options import Opt

from ._rope import FACTOR, LAYERS_OPT, ORIGINAL, RopeMethod, text_config
from .base import _fmt, register_position


def mscale(s: float, m: float = 1.0) -> float:
    """YaRN's magnitude scale: 0.1·m·ln(s) + 1 for s > 1, else 1 (sqrt(1/t) of the paper's Section 3.4)."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def reference(dim: int, base: float, factor: float, original: int, beta_fast: float = 32.0,
              beta_slow: float = 1.0, attention_factor: float | None = None) -> tuple[list[float], float]:
    """YaRN's frequencies and attention scaling from the formula above (the paper's reference code's ramp)."""

    def corr_dim(r: float) -> float:
        return dim * math.log(original / (r * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if high == low:
        high += 0.001
    out = []
    for i in range(dim // 2):
        theta = base ** (-2 * i / dim)
        gamma = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(theta / factor * gamma + theta * (1 - gamma))
    return out, (mscale(factor) if attention_factor is None else attention_factor)


@register_position
class YaRN(RopeMethod):
    """YaRN (:mod:`lctx.models.position.yarn`)."""

    name = "yarn"
    options = {"factor": FACTOR,
               "beta_fast": Opt(float, 32.0, "turns over L above which a dimension is kept (beta)"),
               "beta_slow": Opt(float, 1.0, "turns over L below which a dimension is interpolated (alpha)"),
               "attention_factor": Opt(float, None, "the cos/sin scaling; default 0.1 ln(factor) + 1"),
               "mscale": Opt(float, None, "with mscale_all_dim: scaling mscale(s, mscale) / mscale(s, mscale_all_dim)"),
               "mscale_all_dim": Opt(float, None, "see mscale"),
               "original_max_position_embeddings": ORIGINAL, "layers": LAYERS_OPT}
    source = ("Peng et al. 2023, arXiv 2309.00071, Sections 3.2 and 3.4 (NTK-by-parts ramp, sqrt(1/t) = "
              "0.1 ln s + 1); reference code jquesnelle/yarn scaled_rope/LlamaYaRNScaledRotaryEmbedding.py")
    summary = "YaRN: per-dimension interpolation ramp (beta_fast, beta_slow) and attention temperature"

    def validate(self) -> None:
        """As :meth:`RopeMethod.validate`; 0 < beta_slow < beta_fast (transformers would put 32 / 1 in place of a 0
        silently), ``attention_factor`` > 0, ``mscale`` and ``mscale_all_dim`` both or neither (transformers uses
        them only together: one alone would be accepted and ignored).

        Raises:
            LctxError: one line naming the option and the fix."""
        super().validate()
        o = self.options
        if not 0 < o["beta_slow"] < o["beta_fast"]:
            raise LctxError(f"--position yarn: beta_slow={_fmt(o['beta_slow'])}, beta_fast={_fmt(o['beta_fast'])}; "
                            "YaRN needs 0 < beta_slow < beta_fast (the paper's 1 and 32)")
        if o["attention_factor"] is not None and o["attention_factor"] <= 0:
            raise LctxError(f"--position yarn: attention_factor={_fmt(o['attention_factor'])} must be > 0 (leave it "
                            "out for 0.1 ln(factor) + 1)")
        if (o["mscale"] is None) != (o["mscale_all_dim"] is None):
            raise LctxError("--position yarn: give mscale and mscale_all_dim together (transformers uses them only as "
                            "a pair; one alone would be ignored), or attention_factor=X")
        if o["attention_factor"] is not None and o["mscale"] is not None:
            raise LctxError("--position yarn: attention_factor replaces mscale/mscale_all_dim; give one or the other")

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """transformers' ``"yarn"`` table: factor, original_max_position_embeddings, beta_fast, beta_slow and the
        scaling options given."""
        o = self.options
        out = {"rope_type": "yarn", "factor": float(o["factor"]), "original_max_position_embeddings": int(original),
               "beta_fast": float(o["beta_fast"]), "beta_slow": float(o["beta_slow"]),
               "rope_theta": params["rope_theta"]}
        for k in ("attention_factor", "mscale", "mscale_all_dim"):
            if o[k] is not None:
                out[k] = float(o[k])
        return out

    def apply_config(self, config, layer_type: str | None = None) -> None:
        """As :meth:`RopeMethod.apply_config`, and ``max_position_embeddings`` = factor x L, as YaRN checkpoints
        declare it (transformers checks the two agree)."""
        super().apply_config(config, layer_type)
        if self.applied_layer_type != "sliding_attention":
            text_config(config).max_position_embeddings = self.max_length(None)
