"""Fused causal flash attention with a positional prior read from a Toeplitz table: the fast path of every
softmax variant.

One kernel serves ``nope``, ``rope`` / ``acc_rot`` (after rotation: no bias), ``alibi``, ``ggd_bam`` and
any of them ``+ssmax``, and, with a per-query key window, ``alibi_lsh``. For query i (at key index
past + i) and key j <= past + i it computes, per head h,

    logit_ij = c_i * (q_i . k_j) / sqrt(D) + b_h(past + i - j) * (c_i if scale_bias else 1)

    c_i = s_h * log(past + i + 1) with Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399, eq. 1), else 1

and returns softmax_j(logit_ij) v_j with its log-sum-exp, by the online softmax of FlashAttention (Dao et
al. 2022, Algorithm 1; the structure follows Triton's fused-attention tutorial).

Toeplitz priors. Every prior lctx has (ALiBi b(d) = -m_h d, Press et al. 2022; the GGD-BAM prior of
:mod:`lctx.models.bam`) depends on the distance d = i - j and the head only. The variant hands over the
prior as a function ``bias(d) -> [H, *d.shape]`` (:class:`PriorSpec`; the same function its reference
path evaluates on the Tq x Tk distance matrix), and every fast path evaluates it once per forward on
d = 0 .. Tk - 1: a table b_h[d] of H x Tk floats (O(H T) work), which the kernels read:

- :func:`flash_prior_triton`: gathers b_h[qpos - kpos] from the table per tile (no abs / pow in-kernel).
- :func:`flash_prior_flex`: the ``score_mod`` indexes the table.
- :func:`flash_prior_blocked` (CPU): the logit mask of a query block is a strided *view* of the table,
  never a materialised tile. A Toeplitz matrix M[r, c] = b(d0 + r - c) has strides of opposite signs in
  d; with the block's queries taken in reverse order (a copy of tq x D numbers) and the table reversed
  (rt[y] = b(Tk - 1 - y), -inf for d < 0, which is the causal mask), the block's [tq, keys] mask is
  ``rt.as_strided(..., strides (1, 1))``, which ``scaled_dot_product_attention``'s CPU flash kernel
  reads in place. The softmax runs there; the block's output rows are reversed back.

No Tq x Tk tensor exists at any point, so memory is O((Tq + Tk) * D + H * Tk) per head.

Windows (``kstart``, Triton and Flex): an optional [W, H, Tq] lower bound on the keys of each query, for W
independent windowed attentions in one launch; key blocks wholly below a query block's smallest bound
are skipped, so a windowed attention costs O(Tq * window). ``alibi_lsh`` passes each sampled binning's
bin starts and merges the W results through their log-sum-exps (:func:`merge_lse`).

Implementations, each checked against the dense reference (:func:`dense_prior_attention`, which
evaluates the prior function on the full distance matrix) in ``tests/test_flash_prior.py``:

- :func:`flash_prior_triton`: the Triton kernel, forward only (evaluation; autograd falls back).
- :func:`flash_prior_flex`: the same maths through PyTorch FlexAttention (``score_mod`` + a block mask),
  compiled; differentiable on CUDA (the training path there), forward-only on CPU.
- :func:`flash_prior_blocked`: the CPU path, differentiable (plain autograd through the table).

Positions are key indices (query i at past + i): the fast paths require unpadded rows with the
model's default positions (``AttnContext.padded`` False); the model falls back to the reference
otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from . import choose_kernel
from .chunk_attention import band_block_mask, chunk_attention

try:  # triton is a Linux dependency; the module must import without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None


@dataclass
class PriorSpec:
    """What the fast paths need to know about a variant's positional prior and logit scale.

    kind: a name for the prior (``"none"``, ``"alibi"``, ``"ggd"``, ...), recorded, not interpreted.
    bias: ``bias(d) -> [H, *d.shape]`` float32, the prior b_h(d) (logit units) at distances d (tokens, a
        float32 tensor of any shape), or ``None`` for no prior. It must depend on the distance and the
        head only (a Toeplitz prior); it is the same function the variant's reference path evaluates.
    ssmax: [H] Scalable-Softmax s_h, or ``None`` for no per-query scale.
    scale_bias: whether the SSMax factor also multiplies the bias.
    """

    kind: str = "none"
    bias: Callable[[torch.Tensor], torch.Tensor] | None = None
    ssmax: torch.Tensor | None = None
    scale_bias: bool = False

    def bias_at(self, d: torch.Tensor, H: int) -> torch.Tensor:
        """b_h(d) for every head: d any-shaped float32 distances (tokens) -> [H, *d.shape] float32 (zeros
        without a prior).

        Raises:
            ValueError: the prior function returns a shape other than [H, *d.shape].
        """
        if self.bias is None:
            return torch.zeros((H,) + tuple(d.shape), device=d.device)
        b = self.bias(d)
        if tuple(b.shape) != (H,) + tuple(d.shape):
            raise ValueError(f"prior {self.kind!r} returned shape {tuple(b.shape)} for distances of shape "
                             f"{tuple(d.shape)} with {H} heads; it must return [H, *d.shape]")
        return b.float()

    def table(self, n: int, H: int, device) -> torch.Tensor:
        """The Toeplitz table b_h[d] for d = 0 .. n-1: [H, n] float32 on ``device`` (O(H n) work)."""
        return self.bias_at(torch.arange(n, device=device, dtype=torch.float32), H)

    def ssmax_scale(self, H: int, device) -> torch.Tensor | None:
        """s_h as [H] float32 on ``device`` (keeps gradients), or ``None`` without SSMax."""
        return None if self.ssmax is None else self.ssmax.float().to(device).reshape(H)


def dense_prior_attention(q, k, v, spec: PriorSpec, past: int = 0, kstart: torch.Tensor | None = None):
    """Dense float32 reference of the fused kernel (O(Tq * Tk) memory; tests only). The prior is the
    spec's function evaluated on the whole [Tq, Tk] distance matrix (no table).

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D] with Tk = past + Tq; kstart: [W, H, Tq] int or ``None``.
    Returns (out [W, B, H, Tq, D] float32, lse [W, B, H, Tq] float32) with W = 1 without windows.
    """
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    i = torch.arange(Tq, device=q.device)[:, None] + past
    j = torch.arange(Tk, device=q.device)[None, :]
    bias = spec.bias_at((i - j).float(), H)  # [H, Tq, Tk]
    s = spec.ssmax_scale(H, q.device)
    c = s[:, None] * torch.log((i[:, 0] + 1).float())[None, :] if s is not None else torch.ones(H, Tq, device=q.device)
    logits = c[None, :, :, None] * (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(D)
    logits = logits + (bias * c[:, :, None] if spec.scale_bias else bias)[None]
    starts = kstart if kstart is not None else torch.zeros(1, H, Tq, dtype=torch.long, device=q.device)
    outs, lses = [], []
    for w in range(starts.shape[0]):
        ok = (j <= i)[None] & (j[None] >= starts[w][:, :, None])  # [H, Tq, Tk]
        lg = logits.masked_fill(~ok[None], float("-inf"))
        lse = torch.logsumexp(lg, -1)
        outs.append(torch.softmax(lg, -1) @ v.float())
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def merge_lse(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Merge W attentions over key subsets by summing their numerators and denominators.

    out: [W, ..., D], lse: [W, ...] (natural-log sum of exp logits of each). Returns [..., D] =
    sum_w exp(lse_w - L) out_w with L = logsumexp_w lse_w (log-sum-exp safe; a subset with lse = -inf
    contributes nothing).
    """
    L = torch.logsumexp(lse, dim=0)
    w = torch.exp(lse - L.clamp_min(-1e30)[None]).nan_to_num(0.0)
    return (w[..., None] * out).sum(0)


if triton is not None:

    @triton.jit
    def _flash_prior_fwd(
        Q, K, V, O, LSE, TBL, SS, KSTART,
        sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
        sow, sob, soh, sot, slw, slb, slh,
        skw, skh2, stbl,
        H, Tq, Tk, past, D, sm_scale,
        PRIOR: tl.constexpr, SSMAX: tl.constexpr, SCALE_BIAS: tl.constexpr, WINDOW: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        pid_w = tl.program_id(2)
        b = pid_bh // H
        h = pid_bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n0 = tl.arange(0, BLOCK_N)
        m_ok = offs_m < Tq
        d_ok = offs_d < D
        qpos = offs_m + past  # key index of each query
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                    mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        c = tl.full([BLOCK_M], 1.0, tl.float32)
        if SSMAX:
            c = tl.load(SS + h) * tl.log((qpos + 1).to(tl.float32))
        qk_scale = c * sm_scale
        lo = 0
        if WINDOW:
            ks = tl.load(KSTART + pid_w * skw + h * skh2 + offs_m, mask=m_ok, other=2147483647)
            lo = (tl.min(ks, axis=0) // BLOCK_N) * BLOCK_N
        else:
            ks = tl.zeros([BLOCK_M], tl.int32)
        hi = tl.minimum(Tk, past + (pid_m + 1) * BLOCK_M)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + offs_n0
            n_ok = offs_n < Tk
            k = tl.load(K + b * skb + h * skh + offs_n[:, None] * skt + offs_d[None, :],
                        mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * qk_scale[:, None]
            if PRIOR:  # one gather from the Toeplitz table b_h[d], d = qpos - kpos
                dist = qpos[:, None] - offs_n[None, :]
                in_tbl = (dist >= 0) & n_ok[None, :] & m_ok[:, None]
                bias = tl.load(TBL + h * stbl + dist, mask=in_tbl, other=0.0)
                if SCALE_BIAS:
                    bias = bias * c[:, None]
                s = s + bias
            ok = (offs_n[None, :] <= qpos[:, None]) & n_ok[None, :] & m_ok[:, None]
            if WINDOW:
                ok = ok & (offs_n[None, :] >= ks[:, None])
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(V + b * svb + h * svh + offs_n[:, None] * svt + offs_d[None, :],
                        mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
            m_i = m_new
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        out = acc / l_safe[:, None]
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe))
        tl.store(O + pid_w * sow + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :],
                 out, mask=m_ok[:, None] & d_ok[None, :])
        tl.store(LSE + pid_w * slw + b * slb + h * slh + offs_m, lse, mask=m_ok)


def flash_prior_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: PriorSpec, past: int = 0,
                       kstart: torch.Tensor | None = None, block_m: int | None = None,
                       block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused causal prior attention, Triton forward (see the module docstring for the logits); the prior
    is gathered per tile from the table ``spec.table(Tk)`` ([H, Tk] float32, built here once per call).

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D] (any float dtype; accumulation in float32), Tk = past + Tq
    (query i sits at key index past + i); kstart: [W, H, Tq] integer lower bounds of each query's keys,
    or ``None``. Returns (out [W, B, H, Tq, D] float32, lse [W, B, H, Tq] float32), W = 1 without
    windows. A query with no allowed key gets out 0 and lse -inf.

    Raises:
        RuntimeError: triton is not installed.
        ValueError: Tk != past + Tq, or head dim above 256.
    """
    if triton is None:
        raise RuntimeError("triton is not installed; use flash_prior_flex or the reference")
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk != past + Tq:
        raise ValueError(f"keys ({Tk}) must be past ({past}) + queries ({Tq})")
    if D > 256:
        raise ValueError(f"head dim {D} above the kernel's 256")
    q, k, v = (t.contiguous() if t.stride(-1) != 1 else t for t in (q, k, v))
    W = 1 if kstart is None else kstart.shape[0]
    out = torch.empty(W, B, H, Tq, D, device=q.device, dtype=torch.float32)
    lse = torch.empty(W, B, H, Tq, device=q.device, dtype=torch.float32)
    tbl = (spec.table(Tk, H, q.device).detach().contiguous() if spec.bias is not None
           else torch.zeros(1, 1, device=q.device))
    s = spec.ssmax_scale(H, q.device)
    s = s.detach().contiguous() if s is not None else torch.ones(H, device=q.device)
    ks = (kstart.to(device=q.device, dtype=torch.int32).contiguous() if kstart is not None
          else torch.zeros(1, 1, 1, device=q.device, dtype=torch.int32))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BM = block_m or (16 if Tq <= 16 else (64 if D <= 64 else 32))
    BN = block_n or (64 if D <= 64 else 32)
    grid = (triton.cdiv(Tq, BM), B * H, W)
    _flash_prior_fwd[grid](
        q, k, v, out, lse, tbl, s, ks,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3), lse.stride(0), lse.stride(1), lse.stride(2),
        ks.stride(0), ks.stride(1), tbl.stride(0),
        H, Tq, Tk, past, D, 1.0 / math.sqrt(D),
        PRIOR=spec.bias is not None, SSMAX=spec.ssmax is not None, SCALE_BIAS=bool(spec.scale_bias),
        WINDOW=kstart is not None, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BLOCK_D,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 stays fp32 (no TF32 rounding)
    )
    return out, lse


def reversed_table(spec: PriorSpec, Tk: int, H: int, rows: int, device) -> torch.Tensor:
    """The table the blocked path takes its masks from: rt[h, y] = b_h(Tk - 1 - y) for y = 0 .. Tk - 1 (the
    prior, distance Tk - 1 down to 0), then ``rows - 1`` entries of -inf (distances -1 .. -(rows - 1): the
    causal mask). [H, Tk + rows - 1] float32, contiguous; keeps gradients of the prior's parameters."""
    tb = spec.table(Tk, H, device) if spec.bias is not None else torch.zeros(H, Tk, device=device)
    return torch.cat([tb.flip(-1), torch.full((H, max(rows - 1, 0)), float("-inf"), device=device)], -1).contiguous()


def hankel_mask(rt: torch.Tensor, Tk: int, q_end: int, rows: int, keys: int) -> torch.Tensor:
    """The [1, H, rows, keys] logit mask of the queries at key indices q_end - 1, q_end - 2, ..., q_end - rows
    (reversed order) against keys 0 .. keys - 1: M[r, j] = b(q_end - 1 - r - j) (-inf for j past the query),
    as a view of ``rt`` (:func:`reversed_table`) with strides (1, 1) over (row, key): no copy.
    y = Tk - 1 - d = Tk - q_end + r + j."""
    H, n = rt.shape
    return rt.as_strided((1, H, rows, keys), (0, n, 1, 1), rt.storage_offset() + Tk - q_end)


def default_block(Tq: int) -> int:
    """Queries per block of :func:`flash_prior_blocked`: 128 below 2K queries, 256 below 8K, else 512.
    A block computes its whole [rows, keys] score tile, so the upper half of its diagonal square (rows^2/2
    scores) is wasted work: about rows / (2 T) of the total, traded against the per-call overhead."""
    return 128 if Tq < 2048 else (256 if Tq < 8192 else 512)


def flash_prior_blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: PriorSpec, past: int = 0,
                        block: int | None = None) -> torch.Tensor:
    """The fused kernel's maths in PyTorch on CPU: ``scaled_dot_product_attention`` per block of queries
    with the block's prior + causal mask as a strided view of the Toeplitz table (module docstring).

    - No prior, no scaled bias: :func:`lctx.kernels.chunk_attention.chunk_attention` (with SSMax, on the
      pre-scaled queries c_i q_i): past = 0 one ``scaled_dot_product_attention(is_causal=True)`` call, else the
      cached keys unmasked and the chunk's own keys causal, merged by log-sum-exp (no mask at all).
    - Otherwise, per block of ``block`` queries (default :func:`default_block`): the queries reversed,
      keys 0 .. past + e, the mask :func:`hankel_mask` (a view, nothing materialised); with
      ``spec.scale_bias`` the block's mask is materialised once as c_i b + causal (one [rows, keys] tile).

    Work O(Tq * Tk * D) like SDPA (plus the wasted half of each block's diagonal square), memory O(H Tk)
    beyond q, k, v. Differentiable (plain autograd, the prior's parameters included).

    q: [B, H, Tq, D]; k, v: [B, H, past + Tq, D]. Returns [B, H, Tq, D] float32.

    Raises:
        ValueError: keys != past + queries.
    """
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk != past + Tq:
        raise ValueError(f"keys ({Tk}) must be past ({past}) + queries ({Tq})")
    dev = q.device
    qf, kf, vf = q.float(), k.float(), v.float()
    s = spec.ssmax_scale(H, dev)
    c = None
    if s is not None:  # c_i = s_h log(past + i + 1): [H, Tq, 1]
        c = s[:, None, None] * torch.log(torch.arange(past + 1, Tk + 1, device=dev, dtype=torch.float32))[None, :, None]
        qf = qf * c
    if spec.bias is None and not (spec.scale_bias and c is not None):  # causal only (queries pre-scaled by c)
        return chunk_attention(qf, kf, vf)  # past 0: one causal SDPA call; else cached keys + own keys, LSE-merged
    step = block or default_block(Tq)
    rows = min(step, Tq)
    rt = reversed_table(spec, Tk, H, rows, dev)
    scaled = spec.scale_bias and c is not None and spec.bias is not None
    if scaled:  # c_i b(d) is not Toeplitz: the bias part finite, causality in a second (unscaled) table
        causal = reversed_table(PriorSpec("none"), Tk, H, rows, dev)
        rt = torch.cat([rt[:, :Tk], torch.zeros(H, max(rows - 1, 0), device=dev)], -1).contiguous()
    q_rev = qf.flip(2)  # query Tq - 1 - r at row r: a block's rows are the reversed order its mask needs
    outs = []
    for a in range(0, Tq, step):
        e = min(a + step, Tq)
        hi = past + e
        mask = hankel_mask(rt, Tk, hi, e - a, hi)
        if scaled:  # one pass: causal + c_i * b
            mask = torch.addcmul(hankel_mask(causal, Tk, hi, e - a, hi), mask, c[:, a:e].flip(1)[None])
        outs.append(F.scaled_dot_product_attention(q_rev[:, :, Tq - e:Tq - a], kf[:, :, :hi], vf[:, :, :hi],
                                                   attn_mask=mask))
    return torch.cat(outs[::-1], 2).flip(2)


_FLEX_COMPILED = None


def _flex():
    """torch.compile'd flex_attention (static shapes: one graph per shape, as in training; on CPU the
    dynamic-shape build failed to compile the GGD ``score_mod`` in torch 2.13)."""
    global _FLEX_COMPILED
    if _FLEX_COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention  # lazy: loads torch.nn.attention.flex_attention

        _FLEX_COMPILED = torch.compile(flex_attention, dynamic=False)
    return _FLEX_COMPILED


def flash_prior_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: PriorSpec, past: int = 0,
                     kstart: torch.Tensor | None = None, compile: bool = True,
                     need_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same attention as :func:`flash_prior_triton` through PyTorch FlexAttention: the prior is a
    ``score_mod`` that indexes the Toeplitz table b_h[qpos - kpos] (built once per call, [H, Tk]),
    causality and windows a block-sparse ``mask_mod`` (so fully masked key blocks are skipped; the causal block
    mask is built from the block grid, :func:`lctx.kernels.chunk_attention.band_block_mask`, windows through
    ``create_block_mask``).
    Differentiable w.r.t. q, k, v and, through the table, the prior's parameters where FlexAttention's
    backward runs (CUDA); forward only on CPU.

    Shapes and returns as :func:`flash_prior_triton` (out and lse float32); lse is ``None`` with
    ``need_lse=False`` (compiled FlexAttention on CPU cannot return it: torch 2.13 raises, so CPU
    callers ask for the output only). ``compile=False`` runs the eager FlexAttention (a dense math path;
    for tests).
    """
    from torch.nn.attention import flex_attention as flex_module  # lazy: loads torch.nn.attention.flex_attention
    # lazy: loads torch.nn.attention.flex_attention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    aux_request = getattr(flex_module, "AuxRequest", None)
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk != past + Tq:
        raise ValueError(f"keys ({Tk}) must be past ({past}) + queries ({Tq})")
    dev = q.device
    has_bias = spec.bias is not None
    tbl = spec.table(Tk, H, dev) if has_bias else None  # [H, Tk], keeps grads
    s = spec.ssmax_scale(H, dev)
    scale_bias, use_ss = bool(spec.scale_bias), s is not None
    sm = 1.0 / math.sqrt(D)
    past_t = torch.tensor(past, device=dev)  # a tensor, not a constant: no recompile per prefill chunk

    def score_mod(score, b, h, qi, kj):
        qp = qi + past_t
        c = s[h] * torch.log((qp + 1).to(torch.float32)) if use_ss else 1.0
        out = score * c  # flex has already multiplied by the scale passed below
        if has_bias:
            bias = tbl[h, torch.clamp(qp - kj, 0, Tk - 1)]  # masked (kj > qp) entries read d = 0
            out = out + (bias * c if scale_bias else bias)
        return out

    fn = _flex() if compile else flex_attention
    outs, lses = [], []
    W = 1 if kstart is None else kstart.shape[0]
    for w in range(W):
        if kstart is None:
            def mask_mod(b, h, qi, kj):
                return kj <= qi + past_t
        else:
            ksw = kstart[w].to(device=dev, dtype=torch.int64)

            def mask_mod(b, h, qi, kj, ksw=ksw):
                return (kj <= qi + past_t) & (kj >= ksw[h, qi])
        if kstart is None:  # the causal band from the block grid: no Tq x Tk mask is evaluated to find the blocks
            bm = band_block_mask(Tq, Tk, past, None, dev, mask_mod=mask_mod)
        else:
            bm = create_block_mask(mask_mod, B=None, H=H, Q_LEN=Tq, KV_LEN=Tk, device=dev)
        if need_lse and aux_request is not None:  # torch >= 2.9: return_lse is deprecated for return_aux
            o, aux = fn(q, k, v, score_mod=score_mod, block_mask=bm, scale=sm, return_aux=aux_request(lse=True))
            lses.append(aux.lse.float())
        elif need_lse:
            o, lse = fn(q, k, v, score_mod=score_mod, block_mask=bm, scale=sm, return_lse=True)
            lses.append(lse.float())
        else:
            o = fn(q, k, v, score_mod=score_mod, block_mask=bm, scale=sm)
        outs.append(o.float())
    return torch.stack(outs), (torch.stack(lses) if need_lse else None)


def attend_fast(variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx) -> torch.Tensor | None:
    """The fast path of a softmax variant's :meth:`attend`, or ``None`` when it has none here.

    ``variant.prior_spec(ctx)`` describes the prior (``None``: not expressible, use the reference). q:
    [B, H, Tq, D] positioned queries; k, v: [B, H, past + Tq, D] (cache included). Picks the Triton
    kernel where Triton runs and no gradient is needed, else compiled FlexAttention on CUDA, else the
    blockwise PyTorch form (:func:`flash_prior_blocked`, CPU, differentiable), by
    :func:`lctx.kernels.choose_kernel` (which records the choice). Returns [B, H, Tq, D] in q's dtype.
    """

    spec = variant.prior_spec(ctx)
    if spec is None or ctx.padded:
        return None
    mods = [variant] + ([ctx.shared] if isinstance(ctx.shared, torch.nn.Module) else [])  # the prior's owners
    needs_grad = torch.is_grad_enabled() and (any(t.requires_grad for t in (q, k, v))
                                              or any(p.requires_grad for m in mods for p in m.parameters()))
    impl = choose_kernel(getattr(variant, "variant_name", "?"), q.device, needs_grad=needs_grad, dtype=q.dtype)
    if impl == "triton":
        out, _ = flash_prior_triton(q, k, v, spec, past=ctx.past)
    elif impl == "flex":
        out, _ = flash_prior_flex(q, k, v, spec, past=ctx.past, need_lse=False)
    else:  # CPU: blockwise PyTorch (compiled Flex on CPU is slower and keeps a T x T buffer)
        return flash_prior_blocked(q, k, v, spec, past=ctx.past).to(q.dtype)
    return out[0].to(q.dtype)
