"""``dynamic``: dynamic NTK scaling (emozilla, 2023, "Dynamically Scaled RoPE further increases performance of long
context LLaMA with zero fine-tuning", r/LocalLLaMA; reference code jquesnelle/yarn,
scaled_rope/LlamaDynamicScaledRotaryEmbedding.py, commit 2ed02c7, the ``ntk`` branch; YaRN, Peng et al. 2023,
arXiv 2309.00071, Section 3.3 "Dynamic Scaling"): the NTK-aware base is recomputed from the length T of the
sequence, so a sequence within the training length L runs the model as shipped:

    b'(T) = b · (s·T/L - (s - 1))^(d / (d - 2))  for T > L,   b'(T) = b  for T <= L,   θ_i = b'(T)^(-2i/d)

Applied through transformers' ``rope_parameters`` (``rope_type`` ``"dynamic"``, ``factor`` s; transformers reads L
from ``max_position_embeddings``, which lctx sets to the original length). Transformers recomputes the table only
when a forward is longer than any before, so lctx holds it per sample at the sample's length
(:meth:`lctx.models.adapters.hf.HFAdapter.fix_rope_length`): a cell gives the same number whatever ran before it
and whatever ``--chunk-size``. Options: ``factor`` (s > 1, required), ``original_max_position_embeddings`` (L;
default the checkpoint's), ``layers`` (Gemma 3). :func:`reference` is the formula in plain Python, for the tests.
"""

from __future__ import annotations

from ._rope import FACTOR, LAYERS_OPT, ORIGINAL, RopeMethod, text_config
from .base import register_position


def reference(dim: int, base: float, factor: float, original: int, length: int) -> tuple[list[float], float]:
    """Dynamic NTK's frequencies for a sequence of ``length`` tokens and its attention scaling (1.0), from the
    formula above (``original``: L)."""
    b = base * (factor * length / original - (factor - 1)) ** (dim / (dim - 2)) if length > original else base
    return [b ** (-2 * i / dim) for i in range(dim // 2)], 1.0


@register_position
class Dynamic(RopeMethod):
    """Dynamic NTK scaling (:mod:`lctx.models.position.dynamic`)."""

    name = "dynamic"
    options = {"factor": FACTOR, "original_max_position_embeddings": ORIGINAL, "layers": LAYERS_OPT}
    source = ("emozilla 2023 (dynamic NTK, r/LocalLLaMA; jquesnelle/yarn LlamaDynamicScaledRotaryEmbedding): "
              "b' = b * (s*T/L - (s-1)) ** (d/(d-2)) for a sequence of T > L tokens")
    summary = "dynamic NTK: the NTK-aware base recomputed from each sample's length (held per sample)"
    length_dependent = True

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """``{"rope_type": "dynamic", "factor": s, "rope_theta": b}``."""
        return {"rope_type": "dynamic", "factor": float(self.options["factor"]), "rope_theta": params["rope_theta"]}

    def apply_config(self, config, layer_type: str | None = None) -> None:
        """As :meth:`RopeMethod.apply_config`, and ``max_position_embeddings`` = L: transformers' dynamic NTK reads
        the original length there."""
        super().apply_config(config, layer_type)
        text_config(config).max_position_embeddings = int(self.original)
