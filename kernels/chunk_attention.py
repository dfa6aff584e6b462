"""Causal attention of one prefill chunk over its KV cache without a materialised mask.

A chunked prefill (``--chunk-size``) runs chunk k > 1 as Tq new queries against Tk = past + Tq keys: the past
keys (already in the KV cache) and the chunk's own. The causal mask of that rectangle is lower-right aligned,
which ``scaled_dot_product_attention(is_causal=True)`` (upper-left) cannot express, so the usual path builds a
[Tq, Tk] mask and runs SDPA's masked kernel: measured 1.45x one causal call over the whole prompt on this
project's CPU. Split instead into the two parts that need no mask:

    (o_p, L_p) = attention(q, K[:past], V[:past])               every past key is visible to every query
    (o_c, L_c) = attention(q, K[past:], V[past:], causal)       the chunk's own keys, upper-left = lower-right

    o = (exp(L_p - M) o_p + exp(L_c - M) o_c) / (exp(L_p - M) + exp(L_c - M)),   M = max(L_p, L_c)

with L the log-sum-exp of each part's logits (torch's CPU flash kernel returns it): the softmax over the union
of two disjoint key sets, as FlashAttention merges key blocks (Dao et al. 2022, Algorithm 1, the online
softmax; the same merge as :func:`lctx.kernels.flash_prior.merge_lse`).

Sliding windows (``window`` w: query at key index p sees keys j with p - w < j <= p, transformers'
``sliding_window_causal_mask_function``): queries are taken in blocks of ``w`` rows; a block's keys are the
``w - 1`` before its first query plus its own rows, so each block computes a [w, 2w - 1] tile (a small band mask)
instead of a [Tq, Tk] one: O(Tq * w) work, whatever the chunk.

:func:`chunk_attention_reference` is the source of truth (explicit fp32 softmax with the full mask);
:func:`chunk_attention` the fast path, compared with it in ``tests/test_chunk_attention.py``. Used by the
Hugging Face attention function ``lctx_sdpa`` (:mod:`lctx.models.adapters.hf_attention`) and by lctx's own
variants without a bias (:meth:`lctx.models.variants.AttentionVariant.attend`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def chunk_mask(Tq: int, Tk: int, window: int | None = None, device=None) -> torch.Tensor:
    """The allowed (query, key) pairs of a chunk: [Tq, Tk] bool, query i at key index Tk - Tq + i sees key j iff
    j <= Tk - Tq + i and (no ``window``, or Tk - Tq + i - j < window). Positions are key indices (tokens).

    Raises:
        ValueError: Tk < Tq, or window < 1.
    """
    if Tk < Tq:
        raise ValueError(f"a chunk of {Tq} queries needs at least {Tq} keys, got {Tk}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    qi = torch.arange(Tk - Tq, Tk, device=device)[:, None]
    kj = torch.arange(Tk, device=device)[None, :]
    allowed = kj <= qi
    if window is not None:
        allowed &= (qi - kj) < window
    return allowed


def chunk_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                              window: int | None = None) -> torch.Tensor:
    """Explicit fp32 softmax attention of a chunk over its keys (the source of truth).

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D] with Tk >= Tq, the last Tq keys the queries' own (same head count:
    repeat grouped KV heads first); scale: logit multiplier (default 1 / sqrt(D)); window: sliding window in
    tokens (:func:`chunk_mask`) or ``None``. Returns [B, H, Tq, D] in q's dtype. Memory O(Tq * Tk) per head.

    Raises:
        ValueError: Tk < Tq, window < 1.
    """
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * s
    allowed = chunk_mask(q.shape[2], k.shape[2], window, q.device)
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.matmul(probs, v.float()).to(q.dtype)


def _attend_lse(q, k, v, causal: bool, scale: float, mask: torch.Tensor | None = None):
    """(out [B, H, Tq, D] in q's dtype, lse [B, H, Tq] float32) of one softmax attention on CPU: torch's flash
    kernel (``aten._scaled_dot_product_flash_attention_for_cpu``), which returns the log-sum-exp of the logits
    (natural log; -inf for a row with no allowed key)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
    return out, lse


def merge_two(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Softmax attention over the union of two disjoint key sets from each set's result.

    o1, o2: [..., Tq, D] (any float dtype); l1, l2: [..., Tq] float32 log-sum-exps. Returns [..., Tq, D] in o1's
    dtype: (e^(l1-M) o1 + e^(l2-M) o2) / (e^(l1-M) + e^(l2-M)), M = max(l1, l2), computed in float32 (FlashAttention's
    online softmax, Dao et al. 2022, Algorithm 1). A set with l = -inf contributes nothing.
    """
    m = torch.maximum(l1, l2)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w1, w2 = torch.exp(l1 - m)[..., None], torch.exp(l2 - m)[..., None]
    out = (o1.float() * w1 + o2.float() * w2) / (w1 + w2)
    return out.to(o1.dtype)


def can_split(q: torch.Tensor) -> bool:
    """Whether :func:`chunk_attention` has its unmasked form for tensors like ``q`` (CPU, a floating dtype the
    flash kernel takes); elsewhere it runs one SDPA call with the [Tq, Tk] bool mask (on CUDA, the LSE form needs
    a kernel that returns it: lctx's Triton kernel or FlexAttention; not wired here yet)."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16)


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                    window: int | None = None) -> torch.Tensor:
    """Causal (optionally sliding-window) attention of a prefill chunk over its keys with no [Tq, Tk] mask.

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D], Tk >= Tq, the last Tq keys the queries' own (repeat grouped KV heads
    first); scale: logit multiplier (default 1 / sqrt(D)); window: transformers' sliding window in tokens, or
    ``None``. Returns [B, H, Tq, D] in q's dtype, equal to :func:`chunk_attention_reference` to fp32 rounding.

    - Tq == Tk (the first chunk): one ``scaled_dot_product_attention(is_causal=True)``.
    - Tq == 1 (a decode step): one unmasked SDPA call over the visible keys.
    - otherwise, on CPU: past keys unmasked + own keys causal, merged by log-sum-exp (module docstring); with a
      window smaller than Tk, per block of ``window`` queries over the block's band of keys.
    - otherwise (CUDA, other dtypes): one SDPA call with :func:`chunk_mask` (the masked path, as transformers').

    Raises:
        ValueError: Tk < Tq, window < 1.
    """
    Tq, Tk, D = q.shape[2], k.shape[2], q.shape[-1]
    if Tk < Tq:
        raise ValueError(f"a chunk of {Tq} queries needs at least {Tq} keys, got {Tk}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    s = scale if scale is not None else 1.0 / math.sqrt(D)
    past = Tk - Tq
    if window is not None and window >= Tk:
        window = None  # every allowed key is inside the window
    if Tq == 1:
        lo = 0 if window is None else Tk - window
        return F.scaled_dot_product_attention(q, k[:, :, lo:], v[:, :, lo:], scale=s)
    if window is None and past == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s)
    if not can_split(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=chunk_mask(Tq, Tk, window, q.device), scale=s)
    if window is None:
        o_p, l_p = _attend_lse(q, k[:, :, :past], v[:, :, :past], False, s)
        o_c, l_c = _attend_lse(q, k[:, :, past:], v[:, :, past:], True, s)
        return merge_two(o_p, l_p, o_c, l_c)
    outs = []
    for a in range(0, Tq, window):  # query block [a, e) at key indices past + a .. past + e - 1
        e = min(a + window, Tq)
        lo = max(0, past + a - window + 1)
        hi = past + e
        band = chunk_mask(e - a, hi - lo, window, q.device)  # [e - a, hi - lo]: a block's keys end with its own
        outs.append(F.scaled_dot_product_attention(q[:, :, a:e], k[:, :, lo:hi], v[:, :, lo:hi], attn_mask=band,
                                                   scale=s))
    return torch.cat(outs, 2)
