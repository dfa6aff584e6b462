"""``lctx_sdpa``: transformers' SDPA attention for Hugging Face checkpoints without the masked rectangles of a
chunked prefill.

Registered through transformers' two interfaces (no module is patched): an attention function
(``AttentionInterface.register``) and its mask function (``AttentionMaskInterface.register``), selected per model
by ``model.set_attn_implementation("lctx_sdpa")`` (``--attn-impl fast``, the default for Hugging Face
checkpoints, :mod:`lctx.attn_impl`).

The mask function returns ``None`` (no mask) exactly when the mask would be the plain causal pattern, or the
plain sliding-window pattern of a layer whose window is the config's ``sliding_window``, over keys that end at the
last query (a DynamicCache, full or sliding: ``kv_offset + kv_length == q_offset + q_length``) with no padded
key; everything else (padding, packed sequences, bidirectional or chunked patterns, static caches with unfilled
slots) gets transformers' own ``sdpa_mask``. The attention function then runs
:func:`lctx.kernels.chunk_attention.chunk_attention` where the mask is ``None`` (the cached keys unmasked plus the
chunk's own keys causal, merged by log-sum-exp; a sliding layer per block of its window), and transformers'
``sdpa_attention_forward`` wherever a mask was built or the call asks for what the split does not do (softcap,
position bias, non-causal modules, attention weights).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers import masking_utils as mu
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from lctx.kernels.chunk_attention import chunk_attention

#: The name under which both functions are registered in transformers.
LCTX_SDPA = "lctx_sdpa"

_REGISTERED = False


def lctx_sdpa_mask(**kwargs) -> torch.Tensor | None:
    """The mask function of ``lctx_sdpa`` (transformers ``AttentionMaskInterface``; keyword arguments as
    ``masking_utils.sdpa_mask``: batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
    attention_mask ([B, kv] bool or ``None``), local_size, allow_is_causal_skip, config, ...).

    Returns ``None`` where :func:`lctx_sdpa_attention` computes the pattern itself (module docstring), else
    transformers' ``sdpa_mask(**kwargs)`` ([B, 1, q, kv] bool or ``None``)."""
    if _implicit(kwargs, mu):
        return None
    return mu.sdpa_mask(**kwargs)


def _implicit(kw: dict, mu) -> bool:
    """Whether the mask asked for is causal (or the config's sliding window) over keys ending at the last query,
    with no padded key, so the attention function can compute it without a tensor."""
    if not kw.get("allow_is_causal_skip", True):  # transformers clears it for or/and/packed/blockwise patterns
        return False
    q_len, kv_len = int(kw["q_length"]), int(kw["kv_length"])
    q_off, kv_off = kw.get("q_offset", 0), kw.get("kv_offset", 0)
    if isinstance(q_off, torch.Tensor) or isinstance(kv_off, torch.Tensor):  # static caches under compile
        return False
    if kv_off + kv_len != q_off + q_len:  # keys do not end at the last query (a static cache's empty slots)
        return False
    local = kw.get("local_size")
    fn = kw.get("mask_function")
    config = kw.get("config")
    if local is None:
        if fn is not mu.causal_mask_function:
            return False
    else:  # only the config's sliding window (not Llama 4's chunked attention, which also passes local_size)
        if getattr(config, "attention_chunk_size", None) is not None or getattr(config, "sliding_window", None) != local:
            return False
    pad = kw.get("attention_mask")
    if pad is not None:
        pad = pad[:, -kv_len:] if pad.shape[-1] >= kv_len else pad
        if not bool(pad.all()):
            return False
    return True


def lctx_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """The attention function of ``lctx_sdpa`` (transformers ``AttentionInterface`` signature).

    query: [B, H, Tq, D]; key, value: [B, H_kv, Tk, D] (cache included; H_kv divides H); attention_mask: from
    :func:`lctx_sdpa_mask` (``None``: causal, or the module's ``sliding_window``, over keys ending at the last
    query). Returns ([B, Tq, H, D], None) as transformers' ``sdpa_attention_forward``, which runs wherever a mask
    is given or the call needs softcap, a position bias, attention weights, dropout or a non-causal module.

    Raises:
        ValueError: transformers' own, for what its SDPA does not support (``softcap``).
    """
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if (attention_mask is not None or not causal or dropout or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    out = chunk_attention(query, key, value, scale=scaling, window=window)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``lctx_sdpa`` with transformers (idempotent); returns the name to pass to
    ``model.set_attn_implementation``. Source: transformers' attention interface docs
    (``AttentionInterface.register``, ``AttentionMaskInterface.register``)."""
    global _REGISTERED
    if not _REGISTERED:
        AttentionInterface.register(LCTX_SDPA, lctx_sdpa_attention)
        AttentionMaskInterface.register(LCTX_SDPA, lctx_sdpa_mask)
        _REGISTERED = True
    return LCTX_SDPA
