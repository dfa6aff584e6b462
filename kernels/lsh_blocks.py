"""Fast path of ``alibi_lsh`` (seed 003): block-local attention over the sampled positional-LSH bins.

The reference (:func:`lctx.models.lsh.lsh_attention`) sums the s per-bin attentions' numerators and
denominators, which equals one softmax with the bias log(count_ij), count_ij = number of samples in
which query i and key j share a bin (-inf where none). Bins are contiguous, so in sample r query i sees
exactly the keys kstart_r(i) <= j <= i, kstart_r(i) the first position of its bin. Two fast forms:

- :func:`lsh_attention_triton`: the s windowed attentions in one launch of the fused kernel
  (:func:`lctx.kernels.flash_prior.flash_prior_triton` with ``kstart`` [s, H, Tq]), each returning its
  log-sum-exp, merged with :func:`lctx.kernels.flash_prior.merge_lse`. A query block only visits key
  blocks from its earliest bin start, so the cost is O(s * T * (block + bin width)): near-linear in T.
- :func:`lsh_attention_blocked`: the CPU form: per block of queries, the mask log(count_ij) over the
  keys from the block's earliest bin start, built as a running sum along the keys (one ``cumsum``) of log-count increments at each query's sorted bin
  starts (a large negative value before the first start and past the query stands for -inf), then
  ``scaled_dot_product_attention``. Work O(T * (block + max bin age) * (D + a few)): linear in T.
  :func:`lsh_cost` / :func:`exact_cost` estimate its work against exact ALiBi's
  (:func:`lctx.kernels.flash_prior.flash_prior_blocked`), which ``alibi_lsh`` runs instead where that is
  cheaper (short inputs: exact where LSH approximates; the kernel that ran is recorded).
- :func:`lsh_attention_flex`: one FlexAttention call whose ``score_mod`` adds log(count_ij) (count
  computed from the s window starts) and whose block mask keeps keys from min_r kstart_r(i): the same
  block-sparse cost without needing the log-sum-exp (which compiled FlexAttention on CPU cannot return).

Bin membership is decided exactly as in the reference (float64 floor((p - u) / delta)), so the fast
paths see the same bins.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .flash_prior import PriorSpec, _flex, default_block, flash_prior_triton, merge_lse


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
    # lazy: loads torch.nn.attention.flex_attention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

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


_BIG = 1e4  # the mask's "minus infinity": exp(-1e4) is 0 in float32. It enters each row's running sum once,
# at its first bin start (-BIG + BIG): the rounding there (<= ulp(1e4) / 2 = 5e-4) shifts every allowed
# logit of that row by the same amount, which the softmax removes.


def lsh_block(ks: torch.Tensor) -> int:
    """Queries per block of :func:`lsh_attention_blocked`, from the bins: a block's tile is
    rows x (rows + age), age = how far back the block's earliest bin start lies, so rows of about the
    typical age keep the tile near 2 x rows x age: half the mean age as a power of two, clamped to
    [64, 256] (measured on 2 CPU cores: 128-256 fastest for one head at 1K-16K, 64 pays the per-call
    overhead, 512 wastes the upper half of the diagonal square). ks: [s, H, Tq] bin starts as query
    indices (key index minus past)."""
    age = (torch.arange(ks.shape[-1], device=ks.device) - ks.amin((0, 1))).float()
    return int(min(256, max(64, 2 ** round(math.log2(max(float(age.mean()) / 2, 1.0))))))


def lsh_cost(ks: torch.Tensor, past: int, block: int | None = None) -> int:
    """Scores (query-key pairs) :func:`lsh_attention_blocked` computes for bin starts ks [s, H, Tq] (key
    indices) after ``past`` keys: sum over query blocks of rows x (past + block end - earliest start)."""
    Tq = ks.shape[-1]
    step = block or lsh_block(ks - past if past else ks)
    lo = ks.amin((0, 1))  # [Tq]
    n = 0
    for a in range(0, Tq, step):
        e = min(a + step, Tq)
        n += (e - a) * (past + e - int(lo[a:e].min()))
    return n


def exact_cost(Tq: int, past: int) -> int:
    """Scores exact ALiBi's blocked path (:func:`lctx.kernels.flash_prior.flash_prior_blocked`) computes:
    sum over its query blocks of rows x (past + block end)."""

    step = default_block(Tq)
    return sum((min(a + step, Tq) - a) * (past + min(a + step, Tq)) for a in range(0, Tq, step))


LSH_SCORE_COST = 2.5  # time per score of lsh_attention_blocked over exact ALiBi's blocked path (measured
# 2.0-3.0 on 2 CPU cores, one head of dim 64, 1K-16K: the mask is built, not a view)


def prefer_exact(ks: torch.Tensor, past: int) -> bool:
    """Whether exact ALiBi (blocked) is estimated cheaper than :func:`lsh_attention_blocked` for these bin
    starts (ks [s, H, Tq], key indices): LSH_SCORE_COST x :func:`lsh_cost` >= :func:`exact_cost`."""
    return LSH_SCORE_COST * lsh_cost(ks, past) >= exact_cost(ks.shape[-1], past)


def lsh_attention_blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, widths: torch.Tensor,
                          offsets: torch.Tensor, past: int = 0, block: int | None = None,
                          ks: torch.Tensor | None = None) -> torch.Tensor:
    """Positional-LSH ALiBi attention in blockwise PyTorch (the CPU fast path; module docstring): per block
    of ``block`` queries (default :func:`lsh_block`), keys from the block's earliest bin start, the
    additive mask log(count_ij) (about -1e4 where no sample puts i and j in one bin or j > i), softmax in
    ``scaled_dot_product_attention``. Shapes as :func:`lsh_attention_triton`; ``ks``: the bin starts
    [s, H, Tq] when already computed. Returns [B, H, Tq, D] float32. Differentiable w.r.t. q, k, v."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk != past + Tq:
        raise ValueError(f"keys ({Tk}) must be past ({past}) + queries ({Tq})")
    dev = q.device
    if ks is None:
        ks = bin_starts(torch.arange(past, Tk, device=dev), widths, offsets)  # [s, H, Tq]
    s = ks.shape[0]
    step = block or lsh_block(ks - past if past else ks)
    kf, vf = k.float(), v.float()
    qf = q.float()
    # per row: its sorted bin starts, then the key one past the query, then key index 0 (the -BIG start);
    # the increments added there: +BIG at the first start, log((m+1)/m) at the (m+1)-th, -(BIG + log s)
    # one past the query, -BIG at the window's first key. Built once; each block shifts the indices.
    m = torch.arange(1, s, device=dev, dtype=torch.float32)
    steps = torch.cat([torch.full((1,), _BIG, device=dev), torch.log1p(1.0 / m),
                       torch.tensor([-_BIG - math.log(s), -_BIG], device=dev)])  # [s + 2]
    idx = torch.cat([ks.permute(1, 2, 0).sort(-1).values,
                     torch.arange(past + 1, Tk + 1, device=dev).expand(H, Tq)[..., None],
                     torch.zeros(H, Tq, 1, device=dev, dtype=ks.dtype)], -1)  # [H, Tq, s + 2]
    los = [int(ks[:, :, a:a + step].min()) for a in range(0, Tq, step)]
    outs = []
    for a, lo in zip(range(0, Tq, step), los):
        e = min(a + step, Tq)
        rows, hi = e - a, past + e
        w = hi - lo
        shift = torch.tensor([lo] * (s + 1) + [0], device=dev)  # the window's first key stays at 0
        hist = torch.zeros(H, rows, w + 1, device=dev)
        hist.scatter_add_(-1, idx[:, a:e] - shift, steps.expand(H, rows, s + 2))
        mask = torch.cumsum(hist, -1)[..., :w]  # log count_ij up to a per-row constant; about -BIG elsewhere
        outs.append(F.scaled_dot_product_attention(qf[:, :, a:e], kf[:, :, lo:hi], vf[:, :, lo:hi], attn_mask=mask[None]))
    return torch.cat(outs, 2)
