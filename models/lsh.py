"""Seed 003 (positional LSH, arXiv 2605.09472): ALiBi approximated by random contiguous block masks.

The ALiBi kernel L*_ij = exp(-|i - j| / sigma) (sigma = 1 / m_h, the head's slope) is the expectation
of binary masks M(h)_ij = [i and j fall in the same bin] under random binning of the integer positions
(Rahimi & Recht 2007, random binning features for the Laplacian kernel): a bin width
delta ~ Gamma(shape 2, scale sigma) and an offset u ~ U[0, delta) split the positions into contiguous
bins [b delta + u, (b + 1) delta + u). With s sampled partitions, ALiBi attention
softmax(q k^T - m |i - j|) v = sum_j e^{q.k} L*_ij v_j / sum_j e^{q.k} L*_ij is approximated by replacing
L* with the sample mean M~ = (1/s) sum_r M_r, i.e. by s unbiased block-local (bias-free) attentions whose
numerators and denominators are summed. Summing them equals one softmax with the additive bias
log(count_ij) (count_ij = samples in which i and j share a bin; -inf where 0), which is how the
reference below computes it, log-sum-exp safe.

Cost: the reference walks the queries in blocks; each block attends only to keys from the earliest bin
start any sample puts its first query in, so work and memory are O(T * (block + max bin width)), never
T x T.
"""

from __future__ import annotations

import math

import torch

from lctx.kernels import choose_kernel, record_impl
from lctx.models.variants import alibi_bias

from .options import Opt
from .variants import AttentionVariant, AttnContext, alibi_slopes, register_variant


def sample_bins(slopes: torch.Tensor, n_samples: int, generator: torch.Generator | None = None):
    """Draw s random binnings per head.

    slopes: [H] ALiBi slopes m_h (sigma_h = 1 / m_h). Returns (widths, offsets), each [s, H] float64 in
    tokens: width ~ Gamma(2, sigma_h) (sum of two Exp(sigma_h) draws), offset ~ U[0, width).
    """
    sigma = (1.0 / slopes.double())[None, :].expand(n_samples, -1)
    e = torch.empty(2, n_samples, slopes.shape[0], dtype=torch.float64).exponential_(1.0, generator=generator)
    widths = sigma * e.sum(0)
    offsets = widths * torch.rand(n_samples, slopes.shape[0], dtype=torch.float64, generator=generator)
    return widths, offsets


def bin_ids(pos: torch.Tensor, widths: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Bin index floor((p - u) / delta) of each position under each sampled binning.

    pos: [B, T] integer positions; widths, offsets: [s, H]. Returns [B, s, H, T] int64.
    """
    p = pos.double()[:, None, None, :]
    return torch.floor((p - offsets[None, :, :, None]) / widths[None, :, :, None]).long()


def bin_mask_mean(n: int, widths: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The sample-mean mask M~ = (1/s) sum_r M_r over positions 0..n-1, [H, n, n] float64 (for tests
    and the approximation-error diagnostic; O(n^2))."""
    b = bin_ids(torch.arange(n)[None], widths, offsets)[0]  # [s, H, n]
    return (b[..., :, None] == b[..., None, :]).double().mean(0)


def lsh_attention(q, k, v, q_pos, k_pos, allowed, widths, offsets, block: int = 128) -> torch.Tensor:
    """Positional-LSH ALiBi attention (seed 003, Theorem 2.2's reduction), plain PyTorch reference.

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D]; q_pos: [B, Tq]; k_pos: [B, Tk] (non-decreasing over real
    keys); allowed: [B, 1, Tq, Tk] causal & padding mask; widths, offsets: [s, H] from :func:`sample_bins`.
    Returns [B, H, Tq, D] in q's dtype. Per query block the key window starts at the earliest bin start
    of the block's first query over all samples and heads, so no T x T tensor is formed.
    """
    B, H, Tq, D = q.shape
    out = torch.empty_like(q)
    # rows with the same positions and mask (no padding: every training batch) share their counts, so
    # the O(s) bin comparison runs once, not once per row
    shared = B > 1 and bool((q_pos == q_pos[:1]).all() and (k_pos == k_pos[:1]).all()
                            and (allowed == allowed[:1]).all())
    pq, pk = (q_pos[:1], k_pos[:1]) if shared else (q_pos, k_pos)
    qb_all = bin_ids(pq, widths, offsets)  # [B or 1, s, H, Tq]
    kb_all = bin_ids(pk, widths, offsets)  # [B or 1, s, H, Tk]
    scale = 1.0 / math.sqrt(D)
    for a in range(0, Tq, block):
        e = min(a + block, Tq)
        # keys: up to the last key any query of the block may see; from the earliest bin start
        hi = int(allowed[:, 0, a:e].any(1).nonzero()[:, -1].max()) + 1
        first = q_pos[:, a]  # earliest query position of the block, per row
        start = torch.ceil(torch.floor((first.double()[:, None, None] - offsets) / widths) * widths + offsets)
        lo_pos = start.amin(dim=(1, 2)).clamp_min(0)  # [B]
        lo = min(int(torch.searchsorted(k_pos[r, :hi].contiguous(), lo_pos[r].long().view(1))[0]) for r in range(B))
        # with left padding the padded keys have position 0 and sort first; they are masked anyway
        kk, vv = k[:, :, lo:hi].float(), v[:, :, lo:hi].float()
        same = qb_all[..., a:e, None] == kb_all[..., None, lo:hi]  # [B, s, H, tq, w]
        count = same.sum(1).double()  # [B, H, tq, w]
        ok = allowed[:, :, a:e, lo:hi] & (count > 0)
        scores = torch.matmul(q[:, :, a:e].float(), kk.transpose(-1, -2)) * scale + torch.log(count).float()
        scores = scores.masked_fill(~ok, float("-inf"))
        out[:, :, a:e] = torch.matmul(torch.softmax(scores, -1), vv).to(q.dtype)
    return out


@register_variant("alibi_lsh")
class ALiBiLSH(AttentionVariant):
    """ALiBi approximated by s random positional-LSH binnings (seed 003). ``variant_options``:
    ``lsh_samples`` s (default 16), ``lsh_seed`` (default 0; layer l uses seed + l), ``lsh_block`` query
    block of the reference (default 128), ``lsh_resample_eval`` (default False: evaluation uses the fixed,
    seeded bins so prefill and decode agree; training resamples every forward from torch's RNG),
    ``lsh_exact_dispatch`` (default True: with ``attn_impl="fast"`` on CPU, calls where exact ALiBi is
    estimated cheaper than the LSH kernel (:func:`lctx.kernels.lsh_blocks.prefer_exact`: short inputs) run exact
    ALiBi, recorded as kernel ``lsh-exact-alibi``; False always runs LSH, on CPU as ``lsh-blocks``)."""

    summary = "ALiBi approximated by s random contiguous bin masks (positional LSH)"
    composable = False
    option_schema = {
        "lsh_samples": Opt(int, 16, "random binnings s"), "lsh_seed": Opt(int, 0, "seed of layer 0"),
        "lsh_block": Opt(int, 128, "query block of the reference"),
        "lsh_resample_eval": Opt(bool, False, "resample the bins at evaluation"),
        "lsh_exact_dispatch": Opt(bool, True, "fast path on CPU: run exact ALiBi where it is estimated cheaper "
                                  "than the LSH kernel (kernels.lsh_blocks.prefer_exact)",
                                  default_means="with --attn-impl fast on CPU, exact ALiBi runs where it is "
                                  "estimated cheaper than LSH (short inputs), attn_kernel lsh-exact-alibi; "
                                  "false: always LSH (lsh-blocks)")}

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        o = self.option_values(config)
        self.n_samples = int(o["lsh_samples"])
        self.seed = int(o["lsh_seed"]) + layer_idx
        self.block = int(o["lsh_block"])
        self.resample_eval = bool(o["lsh_resample_eval"])
        self.exact_dispatch = bool(o["lsh_exact_dispatch"])
        if self.n_samples < 1:
            raise ValueError(f"lsh_samples must be >= 1, got {self.n_samples}")
        self._fixed = None

    def bins(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(widths, offsets) [s, H] float64: fresh draws in training (or with lsh_resample_eval), else
        the fixed draws of ``lsh_seed + layer``."""
        slopes = alibi_slopes(self.n_heads)
        if self.training or self.resample_eval:
            return sample_bins(slopes, self.n_samples)
        if self._fixed is None:
            self._fixed = sample_bins(slopes, self.n_samples, torch.Generator().manual_seed(self.seed))
        return self._fixed

    def _fast(self, q, k, v, widths, offsets, ctx: AttnContext):
        """The kernel path (lctx.kernels.lsh_blocks): Triton where it runs without autograd, else compiled
        FlexAttention on CUDA, else the blockwise PyTorch form (CPU), or, on CPU with ``lsh_exact_dispatch``
        where :func:`lctx.kernels.lsh_blocks.prefer_exact` estimates it cheaper (short inputs), exact ALiBi
        through the blocked prior path (recorded as ``lsh-exact-alibi``; the LSH kernel itself: ``lsh-blocks``)."""
        # lazy: loads triton
        from lctx.kernels.lsh_blocks import (bin_starts, lsh_attention_blocked, lsh_attention_flex,
                                             lsh_attention_triton, prefer_exact)

        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        impl = choose_kernel(self.variant_name, q.device, needs_grad=needs_grad, dtype=q.dtype, record=False)
        if impl == "triton":
            record_impl(self.variant_name, impl)
            return lsh_attention_triton(q, k, v, widths, offsets, past=ctx.past).to(q.dtype)
        if impl == "flex":
            record_impl(self.variant_name, impl)
            return lsh_attention_flex(q, k, v, widths, offsets, past=ctx.past).to(q.dtype)
        pos = torch.arange(ctx.past, k.shape[2], device=q.device)
        ks = bin_starts(pos, widths, offsets)
        if self.exact_dispatch and prefer_exact(ks, ctx.past):
            # exact ALiBi is cheaper here (short inputs): it is what LSH estimates, so run it, and say so
            from lctx.kernels.flash_prior import PriorSpec, flash_prior_blocked

            slopes = alibi_slopes(self.n_heads)
            record_impl(self.variant_name, "lsh-exact-alibi")
            spec = PriorSpec("alibi", bias=lambda d: alibi_bias(slopes, d))
            return flash_prior_blocked(q, k, v, spec, past=ctx.past).to(q.dtype)
        record_impl(self.variant_name, "lsh-blocks")
        return lsh_attention_blocked(q, k, v, widths, offsets, past=ctx.past, ks=ks).to(q.dtype)

    def forward(self, q, k, v, ctx: AttnContext, x=None):
        if ctx.cache is not None:
            k, v = ctx.cache.update(k, v, self.layer_idx)
        widths, offsets = self.bins()
        impl = self.attention_impl()
        if impl.kernels and not ctx.padded and ctx.probe is None:
            out = self._fast(q, k, v, widths, offsets, ctx)
            if out is not None:
                return out
        if impl.records_module_form:  # no SDPA form: this module's blockwise form ran (reference: unrecorded)
            record_impl(self.variant_name, "reference")
        return lsh_attention(q, k, v, ctx.q_pos, ctx.k_pos, ctx.mask(), widths.to(q.device),
                             offsets.to(q.device), block=self.block)
