"""Fast path of ``alibi_lsh`` (seed 003): block-local attention over the sampled positional-LSH bins.

The reference (:func:`lctx.models.lsh.lsh_attention`) sums the s per-bin attentions' numerators and
denominators, which equals one softmax with the bias log(count_ij), count_ij = number of samples in
which query i and key j share a bin (-inf where none). Bins are contiguous, so in sample r query i sees
exactly the keys kstart_r(i) <= j <= i, kstart_r(i) the first position of its bin. Two fast forms:

- :func:`lsh_attention_triton`: the s windowed attentions in one launch of the fused kernel
  (:func:`lctx.kernels.flash_prior.flash_prior_triton` with ``kstart`` [s, H, Tq]), each returning its
  log-sum-exp, merged with :func:`lctx.kernels.flash_prior.merge_lse`. A query block only visits key
  blocks from its earliest bin start, so the cost is O(s * T * (block + bin width)): near-linear in T.
- :func:`lsh_attention_blocked`: the same in blockwise PyTorch (CPU).
- :func:`lsh_attention_flex`: one FlexAttention call whose ``score_mod`` adds log(count_ij) (count
  computed from the s window starts) and whose block mask keeps keys from min_r kstart_r(i): the same
  block-sparse cost without needing the log-sum-exp (which compiled FlexAttention on CPU cannot return).

Bin membership is decided exactly as in the reference (float64 floor((p - u) / delta)), so the fast
paths see the same bins.
"""

from __future__ import annotations

import math

import torch

from .flash_prior import PriorSpec, flash_prior_blocked, flash_prior_triton, merge_lse


def bin_starts(q_pos: torch.Tensor, widths: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """First position of each query's bin under each sampled binning.

    q_pos: [Tq] integer positions (key indices); widths, offsets: [s, H] float64 (tokens) from
    :func:`lctx.models.lsh.sample_bins`. Returns kstart [s, H, Tq] int64, clamped at 0: the smallest
    integer j with floor((j - u) / delta) == floor((p - u) / delta), computed with the reference's own
    float64 formula (a candidate from the closed form, corrected by one step either way).
    """
    p = q_pos.double()[None, None, :]
    w, u = widths.double()[:, :, None].to(p.device), offsets.double()[:, :, None].to(p.device)
    bid = torch.floor((p - u) / w)
    cand = torch.ceil(bid * w + u)
    same = lambda j: torch.floor((j - u) / w) == bid  # noqa: E731
    cand = torch.where(same(cand), cand, cand + 1)  # rounding put the candidate in the previous bin
    cand = torch.where(same(cand - 1), cand - 1, cand)  # ... or one past the true start
    return cand.clamp_min(0).long()


def lsh_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, widths: torch.Tensor,
                         offsets: torch.Tensor, past: int = 0) -> torch.Tensor:
    """Positional-LSH ALiBi attention through the fused Triton kernel (forward only).

    q: [B, H, Tq, D]; k, v: [B, H, past + Tq, D]; widths, offsets: [s, H] float64. Returns [B, H, Tq, D]
    float32 (the reference's value, up to float rounding).
    """
    pos = torch.arange(past, past + q.shape[2], device=q.device)
    ks = bin_starts(pos, widths, offsets)
    out, lse = flash_prior_triton(q, k, v, PriorSpec("none"), past=past, kstart=ks)
    return merge_lse(out, lse)


def lsh_attention_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, widths: torch.Tensor,
                       offsets: torch.Tensor, past: int = 0, compile: bool = True) -> torch.Tensor:
    """Positional-LSH ALiBi attention as one FlexAttention call (bias log(count), block-sparse mask).

    Shapes as :func:`lsh_attention_triton`; returns [B, H, Tq, D] float32. Forward only on CPU.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from .flash_prior import _flex

    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    dev = q.device
    pos = torch.arange(past, past + Tq, device=dev)
    ks = bin_starts(pos, widths, offsets)  # [s, H, Tq]
    kmin = ks.amin(0)  # [H, Tq]
    s = ks.shape[0]
    past_t = torch.tensor(past, device=dev)

    def score_mod(score, b, h, qi, kj):
        count = (kj >= ks[0, h, qi]).to(torch.float32)
        for r in range(1, s):
            count = count + (kj >= ks[r, h, qi]).to(torch.float32)
        return score + torch.log(count)

    def mask_mod(b, h, qi, kj):
        return (kj <= qi + past_t) & (kj >= kmin[h, qi])

    bm = create_block_mask(mask_mod, B=None, H=H, Q_LEN=Tq, KV_LEN=Tk, device=dev)
    fn = _flex() if compile else flex_attention
    return fn(q, k, v, score_mod=score_mod, block_mask=bm, scale=1.0 / math.sqrt(D)).float()


def lsh_attention_blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, widths: torch.Tensor,
                          offsets: torch.Tensor, past: int = 0) -> torch.Tensor:
    """Positional-LSH ALiBi attention in blockwise PyTorch (the CPU fast path): each query block attends
    from its earliest bin start with the bias log(count_ij). Shapes as :func:`lsh_attention_triton`."""
    pos = torch.arange(past, past + q.shape[2], device=q.device)
    return flash_prior_blocked(q, k, v, PriorSpec("none"), past=past, kstart=bin_starts(pos, widths, offsets))
