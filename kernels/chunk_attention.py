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

On CUDA the same split runs through FlexAttention (:func:`flex_split_attention`, torch.nn.attention.flex_attention,
compiled; its ``AuxRequest(lse=True)`` gives the log-sum-exp that torch's CUDA SDPA entry points do not return):
the past keys with no mask at all, the chunk's own keys with a causal block mask. A sliding window there is a
block mask on each part instead of the CPU path's per-block loop: the past part reads only the last ``w - 1``
cached keys, the own part the band of its window. Each :class:`~torch.nn.attention.flex_attention.BlockMask` is
built from the block grid by arithmetic (:func:`band_block_mask`: O(Tq/128 * Tk/128) integers), never from a
[Tq, Tk] tensor, and key blocks outside a band are skipped, so the window costs O(Tq * w) as on CPU.

:func:`chunk_attention_reference` is the source of truth (explicit fp32 softmax with the full mask);
:func:`chunk_attention` the fast path, compared with it in ``tests/test_chunk_attention.py`` (the FlexAttention
split eagerly on CPU, its compiled form on CUDA in the GPU check, :mod:`lctx.harness.commands.gpu_check`). Used by the
Hugging Face attention function ``lctx_sdpa`` (:mod:`lctx.models.adapters.hf_attention`) and by lctx's own
variants without a bias (:meth:`lctx.models.variants.AttentionVariant.attend`).
"""

from __future__ import annotations

import functools
import importlib.util
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


#: dtypes the unmasked split takes (the CPU flash kernel's and FlexAttention's)
SPLIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: FlexAttention's sparse block: the rows and keys one entry of a :class:`BlockMask` stands for (its default)
FLEX_BLOCK = 128


@functools.lru_cache(maxsize=None)
def flex_available(device_type: str = "cuda") -> bool:
    """Whether FlexAttention can return the log-sum-exp on ``device_type``: torch has
    ``torch.nn.attention.flex_attention`` (``AuxRequest``, torch >= 2.9; ``return_lse`` before that) and, on CUDA,
    triton, which its compiled form generates kernels with. Cached (asked once per attention call on CUDA)."""
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return False
    return device_type != "cuda" or importlib.util.find_spec("triton") is not None


def can_split(q: torch.Tensor) -> bool:
    """Whether :func:`chunk_attention` has its unmasked form for tensors like ``q`` ([B, H, Tq, D]): a floating
    dtype of :data:`SPLIT_DTYPES`, on CPU (torch's flash kernel returns the log-sum-exp) or on CUDA with
    FlexAttention (:func:`flex_split_attention`); elsewhere it runs one SDPA call with the [Tq, Tk] bool mask."""
    if q.dtype not in SPLIT_DTYPES:
        return False
    if q.device.type == "cpu":
        return True
    return q.device.type == "cuda" and flex_available("cuda")


def band_block_mask(Tq: int, Tk: int, offset: int, window: int | None = None, device=None,
                    block: int = FLEX_BLOCK, mask_mod=None):
    """A FlexAttention :class:`~torch.nn.attention.flex_attention.BlockMask` for "query i, at key index
    ``offset + i``, sees key j iff j <= offset + i and (no ``window``, or offset + i - j < window)", built from the
    block grid by arithmetic (no [Tq, Tk] tensor: O(ceil(Tq/block) * ceil(Tk/block)) integers).

    Tq, Tk: query rows and keys (tokens); offset: key index of query 0 (0 for a chunk's own keys, the past part's
    key count for the past part); window: transformers' sliding window in tokens, or ``None``; block: the sparse
    block (rows = keys, FlexAttention's default 128). A block whose every (row, key) pair is allowed is "full"
    (FlexAttention skips its mask_mod), one with some allowed pairs "partial", one with none is skipped; a ragged
    last block is never full (as ``create_block_mask`` marks it). Rows with no allowed key get out 0, lse -inf.
    mask_mod: FlexAttention's elementwise form of the same pattern for the partial blocks (default: one built from
    ``offset`` and ``window`` as Python numbers; a caller whose offset changes per call under a static compile
    passes one that reads it from a tensor, so the graph is reused).

    Source: PyTorch's FlexAttention (``torch.nn.attention.flex_attention.BlockMask.from_kv_blocks``; the layout
    ``create_block_mask`` produces: per query block, the partial blocks' count and indices, then the full ones').

    Raises:
        ValueError: Tq < 1, Tk < 1, offset < 0, window < 1, block < 1.
    """
    from torch.nn.attention.flex_attention import BlockMask  # lazy: loads torch.nn.attention.flex_attention

    if Tq < 1 or Tk < 1 or offset < 0 or block < 1 or (window is not None and window < 1):
        raise ValueError(f"band_block_mask needs Tq, Tk, block >= 1, offset >= 0, window >= 1; got Tq={Tq}, "
                         f"Tk={Tk}, offset={offset}, window={window}, block={block}")
    nq, nk = -(-Tq // block), -(-Tk // block)
    r0 = torch.arange(nq, device=device)[:, None] * block  # first row of each query block
    r1 = torch.clamp(r0 + block, max=Tq) - 1  # last row
    k0 = torch.arange(nk, device=device)[None, :] * block
    k1 = torch.clamp(k0 + block, max=Tk) - 1
    p0, p1 = offset + r0, offset + r1  # key indices of the block's first and last query
    some = k0 <= p1  # some key of the block at or before the last query
    every = k1 <= p0  # every key at or before the first query
    if window is not None:
        some &= k1 > p0 - window  # some key inside the first query's window
        every &= k0 > p1 - window  # every key inside the last query's window
    ragged = ((r1 - r0 + 1) < block) | ((k1 - k0 + 1) < block)
    full = every & ~ragged
    partial = some & ~full

    def ordered(m: torch.Tensor):
        num = m.sum(-1, dtype=torch.int32)[None, None]  # [1, 1, nq]
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None, None]  # allowed first
        return num, idx

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block,
                                    mask_mod=mask_mod or _band_mask_mod(offset, window), seq_lengths=(Tq, Tk))


@functools.lru_cache(maxsize=64)
def _band_mask_mod(offset: int, window: int | None):
    """The mask_mod of :func:`band_block_mask` (one function object per (offset, window), so a compiled
    FlexAttention sees the same function again and does not recompile)."""
    if window is None:
        def mask_mod(b, h, qi, kj):
            return kj <= qi + offset
    else:
        def mask_mod(b, h, qi, kj):
            return (kj <= qi + offset) & (qi + offset - kj < window)
    return mask_mod


_FLEX = None  # torch.nn.attention.flex_attention, imported on first use
_COMPILED: dict = {}


def _flex_with_lse(q, k, v, block_mask, scale: float):
    """(out [B, H, Tq, D] in q's dtype, lse [B, H, Tq], natural log, -inf for a row with no key) of one
    FlexAttention call: ``return_aux=AuxRequest(lse=True)`` (torch >= 2.9), else ``return_lse=True``."""
    fm = _FLEX
    if hasattr(fm, "AuxRequest"):
        out, aux = fm.flex_attention(q, k, v, block_mask=block_mask, scale=scale, return_aux=fm.AuxRequest(lse=True))
        return out, aux.lse
    return fm.flex_attention(q, k, v, block_mask=block_mask, scale=scale, return_lse=True)


def _past_part(q, k, v, scale: float):
    """The past keys, no mask: :func:`_flex_with_lse` with no block mask."""
    return _flex_with_lse(q, k, v, None, scale)


def _band_part(q, k, v, block_mask, scale: float):
    """A chunk's own keys (causal, or a window's band), or a window's past keys: :func:`_flex_with_lse`."""
    return _flex_with_lse(q, k, v, block_mask, scale)


def _flex_part(name: str, compile: bool):
    """:func:`_past_part` or :func:`_band_part`, eager (CPU tests) or ``torch.compile(..., dynamic=True)``.

    Dynamic shapes: the past part's key count grows with every chunk, and a static graph per length would pass
    dynamo's recompile limit (8 graphs per code object) within one 512K prefill, after which dynamo runs the eager
    form, which materialises the scores. Two functions, so each has its own code object and graph budget: the
    past part's graphs differ by dtype and head dim only, the band's also by (offset, window), a few per model;
    and neither shares the budget of a direct ``torch.compile(flex_attention)`` elsewhere (the fused prior's)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention import flex_attention as fm  # lazy: loads torch.nn.attention.flex_attention

        _FLEX = fm
    fn = {"past": _past_part, "band": _band_part}[name]
    if not compile:
        return fn
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _COMPILED[name]


def _checked(q: torch.Tensor, k: torch.Tensor, scale: float | None, window: int | None) -> tuple[int, int, float]:
    """(Tq, Tk, scale) of a chunk's q [B, H, Tq, D] and k [B, H, Tk, D]; scale defaults to 1 / sqrt(D).

    Raises:
        ValueError: Tk < Tq, window < 1.
    """
    Tq, Tk, D = q.shape[2], k.shape[2], q.shape[-1]
    if Tk < Tq:
        raise ValueError(f"a chunk of {Tq} queries needs at least {Tq} keys, got {Tk}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    return Tq, Tk, (scale if scale is not None else 1.0 / math.sqrt(D))


def flex_split_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                         window: int | None = None, compile: bool = True) -> torch.Tensor:
    """The split of :func:`chunk_attention` through FlexAttention (the CUDA form; runs eagerly on CPU for tests).

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D], Tk >= Tq, the last Tq keys the queries' own (same head count);
    scale: logit multiplier (default 1 / sqrt(D)); window: sliding window in tokens (:func:`chunk_mask`) or
    ``None``; compile: the compiled FlexAttention (CUDA; torch 2.13 cannot return the log-sum-exp from compiled
    FlexAttention on CPU) or the eager one. Returns [B, H, Tq, D] in q's dtype.

    Two calls, merged by :func:`merge_two`: the past keys (all of them with no mask, or with a window only the
    last ``window - 1``, under :func:`band_block_mask` with offset = their count) and the chunk's own keys
    (causal, and the window's band, :func:`band_block_mask` offset 0). Work O(Tq * Tk * D), or O(Tq * window * D)
    with a window; no [Tq, Tk] tensor on the compiled path.

    Raises:
        ValueError: Tk < Tq, window < 1.
    """
    Tq, Tk, s = _checked(q, k, scale, window)
    band = _flex_part("band", compile)
    past = Tk - Tq
    own = band_block_mask(Tq, Tq, 0, window, q.device)
    o_c, l_c = band(q, k[:, :, past:], v[:, :, past:], own, s)
    lo = 0 if window is None else max(0, past - window + 1)  # the first past key any query can see
    if past - lo == 0:  # no past key in reach (the first chunk, or window 1)
        return o_c
    if window is None:
        o_p, l_p = _flex_part("past", compile)(q, k[:, :, :past], v[:, :, :past], s)
    else:
        o_p, l_p = band(q, k[:, :, lo:past], v[:, :, lo:past], band_block_mask(Tq, past - lo, past - lo, window,
                                                                                q.device), s)
    return merge_two(o_p, l_p.float(), o_c, l_c.float())


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
    - otherwise, on CUDA with FlexAttention: the same split, compiled (:func:`flex_split_attention`), the window
      as block masks.
    - otherwise (other devices and dtypes): one SDPA call with :func:`chunk_mask` (the masked path, as
      transformers').

    Raises:
        ValueError: Tk < Tq, window < 1.
    """
    Tq, Tk, s = _checked(q, k, scale, window)
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
    if q.device.type != "cpu":
        return flex_split_attention(q, k, v, scale=s, window=window)
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
