"""``ssmax``: Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399,
eq. 1; seed 000's ``+ssmax``): the logits of query i are multiplied by s·log(n_i), n_i = the keys query i may
attend to, so the attention does not flatten as the context grows. Here s is a fixed scalar (no training).

Hugging Face models: through transformers' attention interface, not copied modeling code: an attention function
``lctx_ssmax_<base>`` is registered (``AttentionInterface.register``, with ``<base>``'s mask function,
``AttentionMaskInterface``) and selected (``model.set_attn_implementation``); it scales q_i by s·log(n_i) and calls
transformers' own ``sdpa`` function (the logits are linear in q). n_i is counted from the attention mask the model
built (without one, causally: Tk - Tq + i + 1), so a chunked prefill and decode steps through a KV cache count the
cached keys. Every model whose attention layers call ``ALL_ATTENTION_FUNCTIONS`` (Llama, Mistral, Qwen2, Gemma,
... in transformers 5) takes it; others get a one-line :class:`LctxError`. Native lctx checkpoints: each layer's
variant becomes ``<variant>+ssmax`` with every head's scale fixed to s (the variant's own parameters kept).

``--attn-override ssmax:s=X`` is this method, applied to every model of the run
(:mod:`lctx.models.adapters.overrides`). Option: ``s`` (default 1). :func:`ssmax_factor` is the formula.
"""

from __future__ import annotations

import math

import torch

from lctx.errors import LctxError
from lctx.models.options import Opt
from lctx.models.variants import get_variant

from .base import PositionMethod, register_position


def ssmax_factor(n: torch.Tensor, s: float) -> torch.Tensor:
    """The SSMax logit multiplier s * log(n) (Nakanishi 2025, eq. 1). n: visible keys, any shape, float."""
    return s * torch.log(n)


def visible_keys(attention_mask: torch.Tensor | None, q_len: int, k_len: int, device) -> torch.Tensor:
    """n_i, the keys each query may attend to: [B|1, 1|H, Tq, 1] float32.

    attention_mask: the mask the model hands its attention function: bool (True = visible), additive
    float (0 = visible, a large negative value = masked), or ``None`` (plain causal: the Tq queries
    are the last Tq of Tk positions, so query i sees Tk - Tq + i + 1 keys).
    """
    if attention_mask is None:
        return (torch.arange(q_len, device=device, dtype=torch.float32) + (k_len - q_len + 1)).view(1, 1, q_len, 1)
    if attention_mask.dtype == torch.bool:
        ok = attention_mask
    else:
        ok = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return ok[..., -k_len:].sum(-1, keepdim=True).float().clamp_min(1.0)


def _make_ssmax(base: str):
    def ssmax_attention(module, query, key, value, attention_mask, **kwargs):
        """Scalable-Softmax around transformers' ``{base}`` attention. query: [B, H, Tq, D]; key/value:
        [B, Hkv, Tk, D]; attention_mask as the model built it for ``{base}``. Returns what ``{base}`` does."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # lazy: loads torch.nn.attention.flex_attention

        cfg = getattr(module, "config", None)
        s = getattr(cfg, "lctx_ssmax_s", None)
        if s is None:
            raise RuntimeError(f"{type(module).__name__} has no config.lctx_ssmax_s; apply the method with "
                               "--position ssmax (lctx.models.position.ssmax)")
        n = visible_keys(attention_mask, query.shape[2], key.shape[2], query.device)
        c = ssmax_factor(n, float(s)).to(query.dtype)
        return ALL_ATTENTION_FUNCTIONS[base](module, query * c, key, value, attention_mask, **kwargs)

    ssmax_attention.__doc__ = ssmax_attention.__doc__.format(base=base)
    return ssmax_attention


def register_ssmax(base: str = "sdpa") -> str:
    """Register the SSMax wrapper of transformers' ``base`` attention (a key of ALL_ATTENTION_FUNCTIONS) and the
    matching mask function; returns the implementation name (``lctx_ssmax_<base>``) for
    ``set_attn_implementation``."""
    # lazy: loads torch.nn.attention.flex_attention
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface  # lazy: loads torch.nn.attention.flex_attention

    name = f"lctx_ssmax_{base}"
    AttentionInterface.register(name, _make_ssmax(base))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


def apply_hf_ssmax(model, s: float, name: str) -> None:
    """Select the SSMax attention function (scale ``s``) on a transformers ``model`` named ``name``.

    Raises:
        LctxError: its attention does not go through transformers' AttentionInterface, it has SSMax already, or
            transformers refused the implementation."""
    cls = type(model)
    if not (getattr(cls, "_supports_attention_backend", False) and cls._can_set_attn_implementation()):
        raise LctxError(f"ssmax: {cls.__name__} ({name!r}) computes attention in its own code, not through "
                        "transformers' AttentionInterface, so it cannot be overridden; use a model whose attention "
                        "does (e.g. Llama, Mistral, Qwen2)")
    current = model.config._attn_implementation
    if current.startswith("lctx_ssmax_"):
        raise LctxError(f"model {name!r} already has the ssmax override; apply it once")
    if current.startswith("lctx_") and current != "lctx_sdpa":  # sinks / self_extend: ssmax would replace them
        raise LctxError(f"ssmax: model {name!r} runs the attention method {current!r}, which ssmax would replace, not "
                        "stack on; run ssmax as a model of its own (--position ssmax:s=X beside that --position)")
    impl = register_ssmax("sdpa")
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    for cfg in configs.values():
        cfg.lctx_ssmax_s = float(s)
    model.set_attn_implementation(impl)
    if model.config._attn_implementation != impl:
        raise LctxError(f"ssmax: transformers refused attention implementation {impl!r} for {cls.__name__}; this "
                        "architecture cannot be overridden")


def apply_native_ssmax(model, s: float) -> None:
    """An lctx checkpoint's layers as ``<variant>+ssmax`` with every head's scale fixed to ``s``.

    Raises:
        LctxError: the checkpoint has SSMax already, or its variant takes no ``+ssmax``."""
    cfg = model.config
    base = cfg.variant
    if "ssmax" in base.split("+"):
        raise LctxError(f"this lctx checkpoint is already {base!r}; ssmax applies to plain softmax")
    try:
        cls = get_variant(f"{base}+ssmax")
    except KeyError as e:
        raise LctxError(f"ssmax: {e.args[0]}") from None
    for i, block in enumerate(model.model.layers):
        old = block.attn.variant
        new = cls(cfg, i)
        new.load_state_dict(old.state_dict(), strict=False)
        with torch.no_grad():
            new.ssmax_scale.fill_(float(s))
        p = next(block.parameters())
        block.attn.variant = new.to(p.device).to(p.dtype).eval()


def held_scale(model) -> float | None:
    """The SSMax scale s the loaded ``model`` computes with: the one its configs hold (Hugging Face) or its layers'
    ``ssmax_scale`` (lctx checkpoints, when every head has the same); None without SSMax."""
    if getattr(model.config, "model_type", None) == "lctx":
        scales = {float(v) for b in model.model.layers for v in getattr(b.attn.variant, "ssmax_scale", torch.empty(0)).detach()}
        return scales.pop() if len(scales) == 1 else None
    s = getattr(model.config, "lctx_ssmax_s", None)
    return None if s is None else float(s)


@register_position
class SSMax(PositionMethod):
    """Scalable-Softmax with a fixed s (:mod:`lctx.models.position.ssmax`)."""

    name = "ssmax"
    kind = "attention"
    options = {"s": Opt(float, 1.0, "the scale s of s*log(n)")}
    source = "Nakanishi 2025, arXiv 2501.19399, eq. 1: logits of query i times s * log(n_i)"
    summary = "Scalable-Softmax: logits x s*log(n), n = visible keys (s fixed)"

    def scale(self, lm) -> float:
        """The s this instance applies to ``lm``."""
        return float(self.options["s"])

    def apply_model(self, lm) -> None:
        """Select SSMax on ``lm``'s model (:func:`apply_hf_ssmax`, :func:`apply_native_ssmax`); a Hugging Face
        adapter's ``attn_impl`` becomes ``hf:lctx_ssmax_sdpa``.

        Raises:
            LctxError: the model cannot take it."""
        s = self.scale(lm)
        if not math.isfinite(s):
            raise LctxError(f"--position {self.name}: s must be a finite number")
        if getattr(lm.model.config, "model_type", None) == "lctx":
            apply_native_ssmax(lm.model, s)
        else:
            apply_hf_ssmax(lm.model, s, lm.name)
            if hasattr(lm, "attn_impl"):
                lm.attn_impl = f"hf:{lm.model.config._attn_implementation}"

    def effective(self, lm) -> dict:
        """``{"s": the scale the model holds}`` (:func:`held_scale`)."""
        return {"s": held_scale(lm.model)}
