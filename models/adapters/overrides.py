"""Attention overrides on a loaded checkpoint (``lctx run --attn-override NAME[:KEY=VALUE,...]``): the older name of
two positional methods, kept working.

- ``ssmax`` (option ``s``, default 1): Scalable-Softmax with a fixed s, :mod:`lctx.models.position.ssmax` (through
  transformers' attention interface on Hugging Face models; ``<variant>+ssmax`` on native lctx checkpoints);
- ``alibi_lsh`` (options ``s`` samples, default 16, and ``seed``): ALiBi replaced by its positional-LSH
  approximation, :mod:`lctx.models.position.alibi_lsh` (native lctx ALiBi checkpoints only; Hugging Face's ALiBi
  models have no clean hook in transformers 5, refused in one line).

``--attn-override X`` applies the method to every model of the run, on top of its ``--position``;
``--position X`` runs it as a model of its own beside the shipped one (docs/positions.md). Either way the model's
variant and name get the same label: ``llama+ssmax:s=0.43``, ``stories260K+ssmax_s0.43``, so runs with and without
it into one ``--out`` are separate samples (a sample's identity is keyed by model name) and separate plot lines.
"""

from __future__ import annotations

from lctx.models.position import PositionSpec, parse_position
from lctx.models.position.ssmax import register_ssmax, ssmax_factor, visible_keys  # noqa: F401  (kept as lctx.models.adapters.overrides.*)

from lctx.override_spec import OVERRIDES, AttnOverride, _fmt, parse_override  # noqa: F401  (light: no torch)

ALIBI_MODEL_TYPES = ("bloom", "mpt", "falcon")


def apply_override(lm, override: AttnOverride | str) -> None:
    """Apply ``override`` to ``lm`` (an :class:`lctx.models.adapters.hf.HFAdapter`) in place: the positional method
    of the same name and options (:meth:`lctx.models.position.base.PositionMethod.apply_model`); append its label
    to ``lm.variant`` (``llama+ssmax:s=0.43``) and to ``lm.name`` (``name+ssmax_s0.43``).

    Raises:
        LctxError: the model cannot take the override (not softmax attention, not an ALiBi model, or an HF
            architecture whose attention does not go through transformers' attention interface).
    """
    ov = parse_override(override) if isinstance(override, str) else override
    method = parse_position(PositionSpec(ov.name, dict(ov.options)))
    method.apply_model(lm)
    lm.variant = f"{lm.variant}+{ov.label}"
    lm.name = f"{lm.name}+{ov.label.replace(':', '_').replace('=', '').replace(',', '_')}"
