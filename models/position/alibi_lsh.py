"""``alibi_lsh``: ALiBi replaced by its positional-LSH approximation (seed 003, arXiv 2605.09472; the variant is
:mod:`lctx.models.lsh`): native lctx checkpoints of variant ``alibi`` get their per-layer variant module swapped
for ``alibi_lsh`` with ``s`` sampled binnings (``seed``). Hugging Face's ALiBi models (BLOOM, MPT, Falcon with
``alibi=True``) add the bias inside their own attention classes and never call transformers' attention interface,
so in transformers 5 there is no clean hook: lctx refuses them in one line. ``--attn-override alibi_lsh`` is this
method, applied to every model of the run. Options: ``s`` (samples, default 16), ``seed`` (default 0).
"""

from __future__ import annotations

import copy

from lctx.errors import LctxError
from lctx.models.options import Opt
from lctx.models.variants import get_variant

from .base import PositionMethod, _fmt, register_position


@register_position
class ALiBiLSH(PositionMethod):
    """ALiBi -> positional LSH on native lctx ALiBi checkpoints (:mod:`lctx.models.position.alibi_lsh`)."""

    name = "alibi_lsh"
    kind = "attention"
    options = {"s": Opt(int, 16, "random binnings sampled per head"), "seed": Opt(int, 0, "the binnings' seed")}
    source = "seed 003 (positional LSH, arXiv 2605.09472): ALiBi's kernel as the mean of s random block masks"
    summary = "native ALiBi checkpoints: ALiBi replaced by its positional-LSH approximation"

    def validate(self) -> None:
        """``s`` >= 1.

        Raises:
            LctxError: one line naming the fix."""
        if self.options["s"] < 1:
            raise LctxError(f"alibi_lsh: s={_fmt(self.options['s'])} must be a whole number of samples >= 1")

    def check(self, config, lm_kind: str = "hf") -> None:
        """Refuse a served model, a Hugging Face model (no hook in transformers 5: said for its ALiBi models) and an
        lctx checkpoint whose variant is not ``alibi``.

        Raises:
            LctxError: one line naming the fix."""
        super().check(config, lm_kind)
        mt = getattr(config, "model_type", "?")
        if mt == "lctx":
            if config.variant != "alibi":
                raise LctxError(f"alibi_lsh needs an ALiBi model; this lctx checkpoint is {config.variant!r}")
            return
        uses_alibi = mt in ("bloom", "mpt") or (mt == "falcon" and getattr(config, "alibi", False))
        if uses_alibi:
            import transformers  # lazy: loads transformers

            raise LctxError(f"alibi_lsh: {mt} models in transformers {transformers.__version__} add ALiBi inside their "
                            "own attention code, not through the attention interface, so there is no clean hook; use "
                            "a native lctx alibi checkpoint (lctx train --variant alibi)")
        raise LctxError(f"alibi_lsh needs an ALiBi model; this checkpoint ({mt}) does not use ALiBi")

    def apply_model(self, lm) -> None:
        """Swap each layer's ALiBi variant module for ``alibi_lsh`` with this instance's ``s`` and ``seed``.

        Raises:
            LctxError: the model is not a native ALiBi checkpoint (:meth:`check`)."""
        model = lm.model
        self.check(model.config, "native" if getattr(model.config, "model_type", None) == "lctx" else "hf")
        cfg = model.config
        new_cfg = copy.deepcopy(cfg)
        new_cfg.variant = "alibi_lsh"
        new_cfg.variant_options = dict(cfg.variant_options or {}, lsh_samples=int(self.options["s"]),
                                       lsh_seed=int(self.options["seed"]))
        cls = get_variant("alibi_lsh")
        for i, block in enumerate(model.model.layers):
            old = block.attn.variant
            new = cls(new_cfg, i)
            new.load_state_dict(old.state_dict(), strict=False)
            p = next(block.parameters())
            block.attn.variant = new.to(p.device).to(p.dtype).eval()

    def effective(self, lm) -> dict:
        """``{"samples", "seed"}`` the layers' LSH modules hold (the seed of layer 0; layer l uses seed + l)."""
        layers = list(lm.model.model.layers)
        return {"samples": sorted({int(getattr(b.attn.variant, "n_samples", 0)) for b in layers}),
                "seed": int(getattr(layers[0].attn.variant, "seed", -1)) if layers else None}
