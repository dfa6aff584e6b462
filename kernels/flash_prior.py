"""Fused causal flash attention with an in-kernel positional prior: the fast path of every softmax variant.

One kernel serves ``nope``, ``rope`` / ``acc_rot`` (after rotation: no bias), ``alibi``, ``ggd_bam`` and
any of them ``+ssmax``, and, with a per-query key window, ``alibi_lsh``. For query i (at key index
past + i) and key j <= past + i it computes, per head h,

    logit_ij = c_i * (q_i . k_j) / sqrt(D) + b_h(past + i - j) * (c_i if scale_bias else 1)

    prior "none":  b = 0
    prior "alibi": b(d) = -m_h d                                   (Press et al. 2022)
    prior "ggd":   b(d) = -(|d - mu_h| * ainv_h + eps)^beta_h       (BAM, arXiv 2505.22842; reference
                   github.com/ArthurSBianchessi/BAM models/bam_ssmax.py: ainv = 1/alpha, eps = 1e-5)
    c_i = s_h * log(past + i + 1) with Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399, eq. 1), else 1

and returns softmax_j(logit_ij) v_j with its log-sum-exp, by the online softmax of FlashAttention (Dao et
al. 2022, Algorithm 1; the structure follows Triton's fused-attention tutorial). The bias is computed
from the H per-head parameters inside the kernel: no Tq x Tk tensor exists at any point, so memory is
O((Tq + Tk) * D) per head.

Windows (``kstart``): an optional [W, H, Tq] lower bound on the keys of each query, for W independent
windowed attentions in one launch; key blocks wholly below a query block's smallest bound are skipped,
so a windowed attention costs O(Tq * window). ``alibi_lsh`` passes each sampled binning's bin starts
and merges the W results through their log-sum-exps (:func:`merge_lse`).

Implementations, each checked against the dense reference (:func:`dense_prior_attention`) in
``tests/test_kernels_flash.py``:

- :func:`flash_prior_triton`: the Triton kernel, forward only (evaluation; autograd falls back).
- :func:`flash_prior_flex`: the same maths through PyTorch FlexAttention (``score_mod`` + a block mask),
  compiled; differentiable on CUDA (the training path there), forward-only on CPU.
- :func:`flash_prior_blocked`: the same maths in PyTorch one query block at a time (the CPU path: the
  working set is one score tile; compiled FlexAttention on CPU measured slower and O(T^2) in memory).

Positions are key indices (query i at past + i): the fast paths require unpadded rows with the
model's default positions (``AttnContext.padded`` False); the model falls back to the reference
otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # triton is a Linux dependency; the module must import without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

PRIORS = {"none": 0, "alibi": 1, "ggd": 2}


@dataclass
class PriorSpec:
    """What the fused kernel needs to know about a variant's positional prior and logit scale.

    kind: ``"none"``, ``"alibi"`` or ``"ggd"`` (see the module docstring for b(d)).
    slope: [H] ALiBi slopes m_h (kind ``"alibi"``).
    ainv, beta, mu: [H] GGD 1/alpha_h (per token), beta_h, mu_h (tokens) (kind ``"ggd"``); eps its
        distance epsilon.
    ssmax: [H] Scalable-Softmax s_h, or ``None`` for no per-query scale.
    scale_bias: whether the SSMax factor also multiplies the bias.
    """

    kind: str = "none"
    slope: torch.Tensor | None = None
    ainv: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    mu: torch.Tensor | None = None
    eps: float = 1e-5
    ssmax: torch.Tensor | None = None
    scale_bias: bool = False

    def params(self, H: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(p0, beta, mu, s), each [H] float32 on ``device``: p0 is the slope (alibi) or 1/alpha (ggd).

        Raises:
            ValueError: unknown kind, or a parameter the kind needs is missing.
        """
        if self.kind not in PRIORS:
            raise ValueError(f"unknown prior kind {self.kind!r}; use one of {', '.join(PRIORS)}")
        ones, zeros = torch.ones(H, device=device), torch.zeros(H, device=device)
        f = lambda t, d: d if t is None else t.detach().float().to(device).reshape(H)  # noqa: E731
        if self.kind == "alibi" and self.slope is None:
            raise ValueError("prior 'alibi' needs slope")
        if self.kind == "ggd" and (self.ainv is None or self.beta is None):
            raise ValueError("prior 'ggd' needs ainv and beta")
        p0 = f(self.slope, zeros) if self.kind == "alibi" else f(self.ainv, ones)
        return p0, f(self.beta, ones), f(self.mu, zeros), f(self.ssmax, ones)


def prior_bias(spec: PriorSpec, dist: torch.Tensor, h_index: int | None = None) -> torch.Tensor:
    """The prior b_h(d) of ``spec`` at distances ``dist`` (tokens, float), per head.

    dist: [Tq, Tk] -> returns [H, Tq, Tk] float32 (or [Tq, Tk] for one head ``h_index``). Used by the
    dense reference and by the FlexAttention ``score_mod``.
    """
    H = next(t for t in (spec.slope, spec.ainv, spec.ssmax, torch.zeros(1)) if t is not None).numel()
    p0, beta, mu, _ = spec.params(H, dist.device)
    sl = (lambda t: t[:, None, None]) if h_index is None else (lambda t: t[h_index])
    if spec.kind == "none":
        return torch.zeros_like(dist) if h_index is not None else torch.zeros((H,) + dist.shape, device=dist.device)
    if spec.kind == "alibi":
        return -sl(p0) * dist
    return -torch.pow((dist - sl(mu)).abs() * sl(p0) + spec.eps, sl(beta))


def dense_prior_attention(q, k, v, spec: PriorSpec, past: int = 0, kstart: torch.Tensor | None = None):
    """Dense float32 reference of the fused kernel (O(Tq * Tk) memory; tests only).

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D] with Tk = past + Tq; kstart: [W, H, Tq] int or ``None``.
    Returns (out [W, B, H, Tq, D] float32, lse [W, B, H, Tq] float32) with W = 1 without windows.
    """
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    i = torch.arange(Tq, device=q.device)[:, None] + past
    j = torch.arange(Tk, device=q.device)[None, :]
    dist = (i - j).float()
    bias = prior_bias(spec, dist)  # [H, Tq, Tk]
    _, _, _, s = spec.params(H, q.device)
    c = s[:, None] * torch.log((i[:, 0] + 1).float())[None, :] if spec.ssmax is not None else torch.ones(H, Tq, device=q.device)
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
        Q, K, V, O, LSE, P0, BETA, MU, SS, KSTART,
        sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
        sow, sob, soh, sot, slw, slb, slh,
        skw, skh2,
        H, Tq, Tk, past, D, sm_scale, eps,
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
        p0 = tl.load(P0 + h)
        beta = tl.load(BETA + h)
        mu = tl.load(MU + h)
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
            if PRIOR != 0:
                dist = (qpos[:, None] - offs_n[None, :]).to(tl.float32)
                if PRIOR == 1:
                    bias = -p0 * dist
                else:
                    z = tl.abs(dist - mu) * p0 + eps
                    bias = -tl.exp(beta * tl.log(z))
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
    """Fused causal prior attention, Triton forward (see the module docstring for the logits).

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
    p0, beta, mu, s = spec.params(H, q.device)
    ks = (kstart.to(device=q.device, dtype=torch.int32).contiguous() if kstart is not None
          else torch.zeros(1, 1, 1, device=q.device, dtype=torch.int32))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BM = block_m or (16 if Tq <= 16 else (64 if D <= 64 else 32))
    BN = block_n or (64 if D <= 64 else 32)
    grid = (triton.cdiv(Tq, BM), B * H, W)
    _flash_prior_fwd[grid](
        q, k, v, out, lse, p0, beta, mu, s, ks,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2), out.stride(3), lse.stride(0), lse.stride(1), lse.stride(2),
        ks.stride(0), ks.stride(1),
        H, Tq, Tk, past, D, 1.0 / math.sqrt(D), float(spec.eps),
        PRIOR=PRIORS[spec.kind], SSMAX=spec.ssmax is not None, SCALE_BIAS=bool(spec.scale_bias),
        WINDOW=kstart is not None, BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BLOCK_D,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 stays fp32 (no TF32 rounding)
    )
    return out, lse


def flash_prior_blocked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: PriorSpec, past: int = 0,
                        kstart: torch.Tensor | None = None, block_bytes: int = 64 << 20) -> torch.Tensor:
    """The fused kernel's maths in plain PyTorch, one block of queries at a time: the CPU fast path.

    Each query block attends only to its causal (and, with ``kstart``, windowed) key range, with the
    prior computed for that block from the per-head parameters, so the working set is one
    [B, H, block, keys] logit tile (at most about ``block_bytes``), never Tq x Tk, and the softmax
    runs in ``scaled_dot_product_attention`` with the tile as its float mask. Differentiable (plain autograd). Windows are combined as in the LSH reference: the
    bias log(count_ij), count_ij = windows of query i containing key j (the sum of the windowed
    attentions' numerators over the sum of their denominators, :func:`merge_lse`'s result).

    q: [B, H, Tq, D]; k, v: [B, H, past + Tq, D]; kstart: [W, H, Tq] or ``None``. Returns [B, H, Tq, D]
    float32.
    """
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk != past + Tq:
        raise ValueError(f"keys ({Tk}) must be past ({past}) + queries ({Tq})")
    dev = q.device
    live = lambda t, d: d if t is None else t.float().to(dev).reshape(H)[:, None, None]  # noqa: E731
    one, zero = torch.ones(H, 1, 1, device=dev), torch.zeros(H, 1, 1, device=dev)
    p0 = live(spec.slope if spec.kind == "alibi" else spec.ainv, one)
    beta, mu, ss = live(spec.beta, one), live(spec.mu, zero), live(spec.ssmax, one)
    ks = kstart.to(dev) if kstart is not None else None
    step = max(16, min(Tq, block_bytes // max(1, 4 * B * H * Tk)))
    out = torch.empty(B, H, Tq, D, device=dev, dtype=torch.float32)
    kf, vf = k.float(), v.float()
    for a in range(0, Tq, step):
        e = min(a + step, Tq)
        lo = int(ks[:, :, a:e].min()) if ks is not None else 0
        hi = past + e
        i = torch.arange(past + a, past + e, device=dev)[:, None]
        j = torch.arange(lo, hi, device=dev)[None, :]
        c = ss * torch.log((i + 1).float())[None] if spec.ssmax is not None else None  # [H, tq, 1]
        tile = torch.zeros(1, e - a, hi - lo, device=dev)  # the block's additive logit tile [H|1, tq, w]
        if spec.kind != "none":
            dist = (i - j).float()[None]
            tile = -p0 * dist if spec.kind == "alibi" else -torch.pow((dist - mu).abs() * p0 + spec.eps, beta)
            if spec.scale_bias and c is not None:
                tile = tile * c
        ok = (j <= i)[None]
        if ks is not None:
            count = (j[None, None] >= ks[:, :, a:e, None]).sum(0).float()  # [H, tq, w]
            tile = tile + torch.log(count)
            ok = ok & (count > 0)
        tile = tile.masked_fill(~ok, float("-inf"))
        qb = q[:, :, a:e].float() * c if c is not None else q[:, :, a:e].float()
        # SDPA's fused softmax over the tile (scale 1/sqrt(D), the tile as a float mask)
        out[:, :, a:e] = F.scaled_dot_product_attention(qb, kf[:, :, lo:hi], vf[:, :, lo:hi], attn_mask=tile[None])
    return out


_FLEX_COMPILED = None


def _flex():
    """torch.compile'd flex_attention (static shapes: one graph per shape, as in training; on CPU the
    dynamic-shape build failed to compile the GGD ``score_mod`` in torch 2.13)."""
    global _FLEX_COMPILED
    if _FLEX_COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX_COMPILED = torch.compile(flex_attention, dynamic=False)
    return _FLEX_COMPILED


def flash_prior_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: PriorSpec, past: int = 0,
                     kstart: torch.Tensor | None = None, compile: bool = True,
                     need_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same attention as :func:`flash_prior_triton` through PyTorch FlexAttention: the prior is a
    ``score_mod`` over per-head parameter vectors, causality and windows a block-sparse ``mask_mod``
    (so fully masked key blocks are skipped). Differentiable w.r.t. q, k, v and the prior parameters
    where FlexAttention's backward runs (CUDA); forward only on CPU.

    Shapes and returns as :func:`flash_prior_triton` (out and lse float32); lse is ``None`` with
    ``need_lse=False`` (compiled FlexAttention on CPU cannot return it: torch 2.13 raises, so CPU
    callers ask for the output only). ``compile=False`` runs the eager FlexAttention (a dense math path;
    for tests).
    """
    from torch.nn.attention import flex_attention as flex_module
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    aux_request = getattr(flex_module, "AuxRequest", None)
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    if Tk != past + Tq:
        raise ValueError(f"keys ({Tk}) must be past ({past}) + queries ({Tq})")
    dev = q.device
    if spec.kind not in PRIORS:
        raise ValueError(f"unknown prior kind {spec.kind!r}")
    live = lambda t, d: d if t is None else t.float().to(dev).reshape(H)  # noqa: E731  (keeps grads)
    p0 = live(spec.slope if spec.kind == "alibi" else spec.ainv, torch.ones(H, device=dev))
    beta = live(spec.beta, torch.ones(H, device=dev))
    mu = live(spec.mu, torch.zeros(H, device=dev))
    s = live(spec.ssmax, torch.ones(H, device=dev))
    kind, eps, scale_bias, use_ss = spec.kind, float(spec.eps), bool(spec.scale_bias), spec.ssmax is not None
    sm = 1.0 / math.sqrt(D)
    past_t = torch.tensor(past, device=dev)  # a tensor, not a constant: no recompile per prefill chunk

    def score_mod(score, b, h, qi, kj):
        qp = qi + past_t
        c = s[h] * torch.log((qp + 1).to(torch.float32)) if use_ss else 1.0
        out = score * c  # flex has already multiplied by the scale passed below
        if kind != "none":
            dist = (qp - kj).to(torch.float32)
            bias = -p0[h] * dist if kind == "alibi" else -torch.pow(torch.abs(dist - mu[h]) * p0[h] + eps, beta[h])
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
        bm = create_block_mask(mask_mod, B=None, H=None if kstart is None else H, Q_LEN=Tq, KV_LEN=Tk, device=dev)
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
    blockwise PyTorch form (:func:`flash_prior_blocked`, CPU, differentiable), and notes the choice with :func:`lctx.kernels.record_impl`. Returns [B, H, Tq, D] in
    q's dtype.
    """
    from . import record_impl, triton_runs

    spec = variant.prior_spec(ctx)
    if spec is None or ctx.padded:
        return None
    needs_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (q, k, v))
        or any(t is not None and t.requires_grad for t in (spec.slope, spec.ainv, spec.beta, spec.mu, spec.ssmax)))
    name = getattr(variant, "variant_name", "?")
    if not needs_grad and triton_runs(q.device) and (q.is_cuda or q.dtype == torch.float32):
        out, _ = flash_prior_triton(q, k, v, spec, past=ctx.past)
        record_impl(name, "triton")
    elif q.is_cuda:
        out, _ = flash_prior_flex(q, k, v, spec, past=ctx.past, need_lse=False)
        record_impl(name, "flex")
    else:  # CPU: blockwise PyTorch (compiled Flex on CPU is slower and keeps a T x T buffer)
        record_impl(name, "blocked")
        return flash_prior_blocked(q, k, v, spec, past=ctx.past).to(q.dtype)
    return out[0].to(q.dtype)
