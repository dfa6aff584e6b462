"""``ntk``: static NTK-aware scaling (bloc97, 2023, "NTK-Aware Scaled RoPE allows LLaMA models to have extended (8k+)
context size without any fine-tuning", r/LocalLLaMA; restated in YaRN, Peng et al. 2023, arXiv 2309.00071,
Section 3.1): instead of dividing every frequency (``linear``), the base is raised so that the lowest frequency is
interpolated by s and the highest nearly kept:

    b' = b · s^(d / (d - 2)),   θ_i' = b'^(-2i/d)

(the reference code: jquesnelle/yarn, scaled_rope/LlamaNTKScaledRotaryEmbedding.py, commit eac10bd, ``base = base *
alpha ** (dim / (dim-2))``). Applied as a plain RoPE (``rope_type`` ``"default"``) with ``rope_theta`` = b'; d is
the rotary dimension (``head_dim`` x ``partial_rotary_factor``). Options: ``factor`` (s > 1, required),
``original_max_position_embeddings`` (the L it extends to s·L; default the checkpoint's), ``layers`` (Gemma 3).
:func:`reference` is the formula in plain Python, for the tests.
"""

from __future__ import annotations

from ._rope import FACTOR, LAYERS_OPT, ORIGINAL, RopeMethod, rope_dim
from .base import register_position


def ntk_base(base: float, factor: float, dim: int) -> float:
    """b · s^(d / (d - 2)): the NTK-aware base for RoPE base ``base``, scale ``factor`` and rotary dimension ``dim``."""
    return base * factor ** (dim / (dim - 2))


def reference(dim: int, base: float, factor: float) -> tuple[list[float], float]:
    """Static NTK-aware frequencies and attention scaling from the formula: (b'^(-2i/d) for i < d/2, 1.0)."""
    b = ntk_base(base, factor, dim)
    return [b ** (-2 * i / dim) for i in range(dim // 2)], 1.0


@register_position
class NTK(RopeMethod):
    """Static NTK-aware scaling (:mod:`lctx.models.position.ntk`)."""

    name = "ntk"
    options = {"factor": FACTOR, "original_max_position_embeddings": ORIGINAL, "layers": LAYERS_OPT}
    source = ("bloc97 2023 (NTK-aware scaled RoPE, r/LocalLLaMA; YaRN arXiv 2309.00071 Section 3.1): "
              "rope_theta' = rope_theta * s ** (d / (d - 2))")
    summary = "static NTK-aware scaling: rope_theta * factor ** (d / (d - 2))"

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """``{"rope_type": "default", "rope_theta": b · s^(d/(d-2))}`` (d of this table: :func:`rope_dim`)."""
        d = rope_dim(cfg, params)
        return {"rope_type": "default", "rope_theta": ntk_base(float(params["rope_theta"]),
                                                               float(self.options["factor"]), d)}
