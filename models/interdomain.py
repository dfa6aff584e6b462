"""Seed 002 ("Interdomain Attention"): a query-conditioned fixed-state token mixer over an S4D core, and
the plain S4D mixer it is compared with.

Both variants replace softmax attention with a complex-diagonal state space model (S4D; Gu, Gupta,
Goel & Re 2022, "On the parameterization and initialization of diagonal state space models", arXiv
2206.11893; reference code github.com/state-spaces/s4, ``models/s4/s4d.py``, whose ``S4DKernel`` this
follows), discretised by zero-order hold. The recurrent state has a fixed size (independent of the
number of tokens) and lives in ``cache_states(ctx.cache)[layer_idx]``; the KV cache's ``update`` is
never called. Everything below is per head h; t indexes tokens, n = 0..N-1 the modes, d the head
channels (D = head dim); all arithmetic in float32 / complex64.

S4D core (shared by both variants)
    continuous:   x'(tau) = A x(tau) + B u(tau),      A_n = -exp(log_A_real_n) + i A_imag_n,
    S4D-Lin init: A_n = -1/2 + i pi n (the paper's S4D-Lin; ``log_A_real = log 0.5``, ``A_imag = pi n``
                  in s4d.py), B_n = 1,
    step size:    Delta = exp(log_dt) > 0, log_dt ~ U[log dt_min, log dt_max] (s4d.py's init),
    ZOH:          Abar_n = exp(Delta A_n),  Bbar_n = (exp(Delta A_n) - 1) / A_n * B_n  (s4d.py's
                  ``C * (exp(dtA) - 1) / A``).
N counts complex modes (s4d.py's ``d_state`` N keeps N/2 complex modes, each standing for a conjugate
pair).
Padding clock: m_t = 1 for a real token, 0 for (left) padding. The recurrence is
    x_t = Abar^{m_t} x_{t-1} + m_t Bbar u_t,
so a padding token neither adds input nor advances time (its step size is 0); the decay between a
key s and a query t >= s is Abar^{c_t - c_s} with c_t = sum_{r <= t} m_r (real tokens so far).
Without padding this is the plain S4D recurrence x_t = Abar x_{t-1} + Bbar u_t.

``interdomain`` (seed 002, "Implementation evolutive"):
    feature map  xi(z) = phi(SiLU(SC(z))), SC a causal depthwise conv of width K over the token axis
                 (one kernel per channel, separate kernels for q and k as in DeltaNet's short convs),
                 phi = L2 normalisation s / sqrt(|s|^2 + 1e-6) (default, DeltaNet) or the seed's
                 literal s / (|s|^2 + 1e-6) (``id_feature_norm="sq"``);
    SSM input    [kt_t ; vt_t] = RMSNorm([xi(k_t) ; v_t]) * g_h + [b_k,h ; b_v,h], then times m_t
                 (RMSNorm over the 2D-vector of the head, learned gain g_h [2D], learned per-head
                 biases b_k,h [D] and b_v,h [D] on the key and value halves);
    state        U_t[n]     = Abar_n^{m_t} U_{t-1}[n]     + m_t Bbar_n kt_t      (U_t     in C^{N x D}),
                 Gamma_t[n] = Abar_n^{m_t} Gamma_{t-1}[n] + m_t Bbar_n vt_t      (Gamma_t in C^{N x D}),
                 one S4D system per head (the same A, B, Delta for both halves: U and Gamma are
                 coefficients on one shared basis, seed "Projection de base");
    readout      a_t[n] = xi(q_t)^T U_t[n]                               (complex, [N]),
                 o_t    = Re( sum_n conj(a_t[n]) Gamma_t[n] )             ([D]; default, denominator-free)
                        = Re( xi(q_t)^T U_t^H Gamma_t ),
                 i.e. the seed's O = F_q U^T Gamma with the transpose taken as the conjugate transpose,
                 because U and Gamma are complex coefficients: expanding,
                 o_t = sum_{s,s' <= t} (xi(q_t).kt_s) vt_s' * Re sum_n conj(K_n(t-s)) K_n(t-s'),
                 K_n(j) = Abar_n^j Bbar_n, a Gram kernel over the modes whose diagonal s = s' is
                 sum_n |K_n(t-s)|^2 >= 0 (the basis-projection reading of the seed: the mode sum
                 approximates a delta, and o_t approximates the kernel-regression numerator
                 sum_s K(q_t, k_s) v_s). ``id_conj=False`` takes the plain transpose instead.
    normalised readout (``id_readout="normalized"``, the seed's theoretical form):
                 eta_t[n] = Abar_n^{m_t} eta_{t-1}[n] + m_t Bbar_n   (projection of the constant 1),
                 o_t = Re(sum_n conj(a_t[n]) Gamma_t[n]) / (|Re(sum_n conj(a_t[n]) eta_t[n])| + eps)
                 (eps = ``id_eta_eps``; the absolute value keeps the sign of the numerator: the
                 denominator is a real Gram sum that is not guaranteed positive).
    state kept between calls: U, Gamma (complex64 [B, H, N, D]), eta (complex64 [B, H, N], normalised
    readout only) and the last K-1 (masked) q and k inputs of the short convs, conv_q and conv_k
    (float32 [B, H, K-1, D]).

``s4d`` (seed 002's baseline mixer; the S4D layer of the S4D paper without its GELU/GLU output, which
the decoder's o_proj and SwiGLU replace): every value channel (h, d) is its own S4D system with
per-channel Delta, A [N], C [N] (B = 1 folded into C, as in S4D):
    x_t[n] = Abar_n^{m_t} x_{t-1}[n] + m_t Bbar_n u_t,    u_t = m_t v_t[d],
    y_t    = 2 Re( sum_n C_n x_t[n] ) + D_skip u_t        (s4d.py: kernel K = 2 Re(C Bbar Abar^l), plus
                                                            the D skip; 2 Re(.) counts each complex mode
                                                            with its conjugate pair),
with C ~ CN(0, 1) (``torch.randn(cfloat)``) and D_skip ~ N(0, 1) at init, as in s4d.py. No query or key
is used (q_proj and k_proj of the decoder layer are unused). State: x (complex64 [B, H, D, N]).

Two equal computations of each mixer: a chunked-parallel form (training and prefill; within a chunk of
L tokens the contributions are summed with closed-form decay powers Abar^{c_t - c_s}, the state is
carried across chunks; O(T L N D) work, O(L^2 N) memory per head and chunk) and an O(N D)-per-token
recurrent form (decode). Tests check they agree.

Fast path (``config.attn_impl`` ``"fast"``, :meth:`_FixedState.fast_impl`): unpadded prefill chunks run the
Triton chunked scans of :mod:`lctx.kernels.interdomain_scan` (CUDA, or the Triton interpreter; forward
only, so training keeps the chunked form below) and unpadded decode steps its O(N D) PyTorch step; both
read and write the same state on the cache as the forms below.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lctx import kernels
from lctx.kernels import record_impl

from .cache import cache_states
from .options import Opt
from .variants import AttentionVariant, AttnContext, register_variant

CDTYPE = torch.complex64
_FEATURE_EPS = 1e-6


# ------------------------------------------------------------------------------------------------
# S4D core pieces
# ------------------------------------------------------------------------------------------------

def s4d_lin_init(shape: tuple[int, ...], n_modes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """S4D-Lin initialisation A_n = -1/2 + i pi n (Gu et al. 2022; s4d.py's ``log_A_real``, ``A_imag``).

    Returns (log_A_real, A_imag), each float32 of shape ``shape + (n_modes,)``: log(1/2) and pi * n, so
    that A = -exp(log_A_real) + i A_imag (the real part stays negative, i.e. stable, for any value of the
    parameter).

    Raises:
        ValueError: ``n_modes`` < 1.
    """
    if n_modes < 1:
        raise ValueError(f"the S4D state needs at least one mode, got {n_modes}")
    log_a_real = torch.full((*shape, n_modes), math.log(0.5))
    a_imag = (math.pi * torch.arange(n_modes, dtype=torch.float32)).expand(*shape, n_modes).clone()
    return log_a_real, a_imag


def log_uniform_dt(shape: tuple[int, ...], dt_min: float, dt_max: float) -> torch.Tensor:
    """S4D's step-size init: log Delta ~ U[log dt_min, log dt_max], float32 ``shape`` (Delta: units of the
    continuous time axis per token; the memory of a mode decays as exp(-Delta t / 2) over t tokens).

    Raises:
        ValueError: not 0 < dt_min <= dt_max.
    """
    if not 0 < dt_min <= dt_max:
        raise ValueError(f"need 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
    return torch.rand(shape) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)


def zoh(log_dt: torch.Tensor, log_a_real: torch.Tensor, a_imag: torch.Tensor,
        b: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-order-hold discretisation (Gu et al. 2022; s4d.py): Delta A and Bbar = (exp(Delta A) - 1) / A * B.

    log_dt: broadcastable to ``log_a_real`` after a trailing unsqueeze (Delta = exp(log_dt) > 0);
    log_a_real, a_imag: [..., N]; b: complex, broadcastable to [..., N], or ``None`` for B = 1.
    Returns (dtA, Bbar), complex64 [..., N]; Abar = exp(dtA) has modulus < 1.
    """
    a = torch.complex(-torch.exp(log_a_real.float()), a_imag.float())
    dt_a = a * torch.exp(log_dt.float())[..., None]
    x, y = dt_a.real, dt_a.imag  # exp(x + iy) - 1 without cancellation for small Delta:
    em1 = torch.complex(torch.expm1(x) * torch.cos(y) - 2 * torch.sin(y / 2) ** 2, torch.exp(x) * torch.sin(y))
    bbar = em1 / a
    if b is not None:
        bbar = bbar * b
    return dt_a, bbar


def real_clock(m: torch.Tensor) -> torch.Tensor:
    """The padding clock c_t = sum_{r <= t} m_r of one chunk: m [B, L] bool -> [B, L] int64 (real tokens
    up to and including t; padding does not advance it)."""
    return torch.cumsum(m.long(), dim=-1)


def _chunk_tables(cache: dict, m: torch.Tensor, build: Callable[[torch.Tensor], tuple]) -> tuple:
    """``build(clock)`` for one chunk's mask m [B, L]; a chunk without padding uses the clock 1..L for the
    whole batch (B' = 1) and its tables are reused by every other such chunk of the same length."""
    if bool(m.all()):
        L = m.shape[1]
        if L not in cache:
            cache[L] = build(torch.arange(1, L + 1, device=m.device)[None])
        return cache[L]
    return build(real_clock(m))


def causal_depthwise_conv(x: torch.Tensor, weight: torch.Tensor,
                          prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Short causal depthwise convolution over tokens, y_t = sum_{j=0}^{K-1} w[..., j] x_{t-K+1+j}.

    x: [B, H, T, D] float32 new inputs; weight: [H, D, K] (w[..., K-1] multiplies the current token);
    prev: [B, H, K-1, D], the K-1 inputs before x (zeros at the start of a sequence).
    Returns (y [B, H, T, D], new prev [B, H, K-1, D]: the last K-1 inputs of cat(prev, x)).
    """
    K = weight.shape[-1]
    xp = torch.cat([prev, x], dim=2)  # [B, H, K-1+T, D]
    win = xp.unfold(2, K, 1)  # [B, H, T, D, K]
    y = (win * weight.float()[None, :, None]).sum(-1)
    return y, xp[:, :, xp.shape[2] - (K - 1):]


def feature_norm(s: torch.Tensor, kind: str) -> torch.Tensor:
    """Normalise features along the last axis: ``"l2"`` s / sqrt(|s|^2 + 1e-6) (unit norm, DeltaNet) or
    ``"sq"`` s / (|s|^2 + 1e-6) (the seed summary's literal xi(x) = SiLU(SC(x)) / |SiLU(SC(x))|^2).

    Raises:
        ValueError: unknown ``kind``.
    """
    sq = s.pow(2).sum(-1, keepdim=True)
    if kind == "l2":
        return s * torch.rsqrt(sq + _FEATURE_EPS)
    if kind == "sq":
        return s / (sq + _FEATURE_EPS)
    raise ValueError(f"id_feature_norm must be 'l2' or 'sq', got {kind!r}")


# ------------------------------------------------------------------------------------------------
# interdomain: chunked-parallel and recurrent forms
# ------------------------------------------------------------------------------------------------

def interdomain_state(B: int, H: int, N: int, D: int, normalized: bool, device) -> dict:
    """Zero state of the interdomain core: U, Gamma complex64 [B, H, N, D] (and eta [B, H, N] when
    ``normalized``)."""
    st = {"U": torch.zeros(B, H, N, D, dtype=CDTYPE, device=device),
          "Gamma": torch.zeros(B, H, N, D, dtype=CDTYPE, device=device)}
    if normalized:
        st["eta"] = torch.zeros(B, H, N, dtype=CDTYPE, device=device)
    return st


def _finish(num: torch.Tensor, ac: torch.Tensor, eta: torch.Tensor | None, eps: float) -> torch.Tensor:
    """o = num (denominator-free) or num / (|Re(sum_n ac eta)| + eps) (normalised readout)."""
    if eta is None:
        return num
    den = (ac * eta).sum(-1).real  # [..]
    return num / (den.abs()[..., None] + eps)


def interdomain_recurrent(fq: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, m: torch.Tensor,
                          dt_a: torch.Tensor, bbar: torch.Tensor, state: dict, conj: bool = True,
                          eta_eps: float = 1e-2) -> tuple[torch.Tensor, dict]:
    """Interdomain core, one token at a time (decode; the reference the chunked form is tested against).

    fq: [B, H, T, D] query features xi(q); kt, vt: [B, H, T, D] SSM inputs (key and value halves, already
    zero at padding); m: [B, T] bool real-token mask; dt_a, bbar: [H, N] complex64 (from :func:`zoh`);
    state: {"U", "Gamma"[, "eta"]} as :func:`interdomain_state` (not modified). Per token:
    U <- Abar^m U + m Bbar kt, Gamma <- Abar^m Gamma + m Bbar vt, a = U xi(q), o = Re(sum_n conj(a) Gamma)
    (module docstring). Returns (o [B, H, T, D] float32, new state). O(N D) per token and head.
    """
    U, G, eta = state["U"], state["Gamma"], state.get("eta")
    outs = []
    for t in range(fq.shape[2]):
        mt = m[:, t].float()[:, None, None]  # [B, 1, 1]
        lam = torch.exp(dt_a[None] * mt)  # [B, H, N]
        inp = mt[..., None] * bbar[None, :, :, None]  # [B, H, N, 1]
        U = lam[..., None] * U + inp * kt[:, :, t, None, :].to(CDTYPE)
        G = lam[..., None] * G + inp * vt[:, :, t, None, :].to(CDTYPE)
        a = (U * fq[:, :, t, None, :]).sum(-1)  # [B, H, N]
        ac = a.conj() if conj else a
        num = (ac[..., None] * G).sum(-2).real  # [B, H, D]
        if eta is not None:
            eta = lam * eta + mt * bbar[None]
        outs.append(_finish(num, ac, eta, eta_eps))
    new = {"U": U, "Gamma": G}
    if eta is not None:
        new["eta"] = eta
    return torch.stack(outs, dim=2), new


def _wsum(eq: str, w: torch.Tensor, *others: torch.Tensor) -> torch.Tensor:
    """``torch.einsum`` whose first operand ``w`` carries a leading batch axis ``z`` of size 1 (no padding
    in the chunk: one decay table for the whole batch) or B (padding: one per row)."""
    if w.shape[0] == 1:
        return torch.einsum(eq.replace("z", "", 1), w[0], *others)
    return torch.einsum(eq.replace("z", "b", 1), w, *others)


def _decay_table(pw: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Real form of W_n(t, s) = Abar_n^{c_t - c_s} (s <= t, else 0) for one chunk.

    pw: [H, N, L+1] complex64 from :func:`lctx.kernels.interdomain_scan.abar_powers`; c: [B', L] int64 clock. Returns
    [B', H, L(t), 2N, L(s)] float32: the real parts in the first N rows of the mode axis, the imaginary
    parts in the last N.
    """
    L = c.shape[-1]
    dc = (c[:, :, None] - c[:, None, :]).clamp_min(0)  # [B', L, L]
    table = torch.cat([pw.real, pw.imag], dim=1)  # [H, 2N, L+1]
    causal = torch.ones(L, L, dtype=torch.bool, device=c.device).tril()
    return (table[:, :, dc] * causal).permute(2, 0, 3, 1, 4)  # [H, 2N, B', L, L] -> [B', H, L, 2N, L]


def _cplx(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of the [real; imaginary] stacking of :func:`_decay_table` along ``dim`` (complex64)."""
    re, im = x.chunk(2, dim=dim)
    return torch.complex(re, im)


def interdomain_chunked(fq: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, m: torch.Tensor,
                        dt_a: torch.Tensor, bbar: torch.Tensor, state: dict, chunk: int = 64,
                        conj: bool = True, eta_eps: float = 1e-2) -> tuple[torch.Tensor, dict]:
    """Interdomain core, chunked-parallel form (training, prefill). Same arguments and result as
    :func:`interdomain_recurrent`, plus ``chunk`` L (tokens per chunk).

    Within a chunk with clock c (:func:`real_clock`), state (U0, Gamma0) and W_n(t, s) = Abar_n^{c_t-c_s}
    for s <= t (0 for s > t), P_n(t) = Abar_n^{c_t}:
        a_t[n]  = P_n(t) xi(q_t).U0[n] + Bbar_n sum_s W_n(t, s) (xi(q_t).kt_s),
        o_t     = Re(sum_n conj(a_t[n]) P_n(t) Gamma0[n]) + sum_s M_ts vt_s,
        M_ts    = Re sum_n conj(a_t[n]) Bbar_n W_n(t, s),
        U_L[n]  = P_n(L) U0[n] + Bbar_n sum_s W_n(L, s) kt_s   (Gamma likewise with vt; eta with m_s),
    which is the recurrence unrolled (no approximation). The sums over s and n run as real batched
    matmuls over (head, token); W is one table for the batch when the chunk has no padding. Memory
    O(L^2 N) per head per chunk.

    Raises:
        ValueError: ``chunk`` < 1.
    """
    if chunk < 1:
        raise ValueError(f"id_chunk must be >= 1, got {chunk}")
    T, D = fq.shape[2], fq.shape[3]
    U, G, eta = state["U"], state["Gamma"], state.get("eta")
    from lctx.kernels.interdomain_scan import abar_powers  # in the function: that module imports triton

    bb = bbar[None, :, None, :]  # [1, H, 1, N]
    outs, tables = [], {}

    def build(c):  # c: [B' (1 or B), L] clock -> (W [B', H, L, 2N, L], P [B', H, L, N])
        pw = abar_powers(dt_a, c.shape[1])
        return _decay_table(pw, c), pw[:, :, c].permute(2, 0, 3, 1)

    for a0 in range(0, T, chunk):
        e = min(a0 + chunk, T)
        mc = m[:, a0:e]
        W, P = _chunk_tables(tables, mc, build)
        q, k, v = fq[:, :, a0:e], kt[:, :, a0:e], vt[:, :, a0:e]
        S = torch.matmul(q, k.transpose(-1, -2))  # [B, H, L, L] xi(q_t).kt_s
        a = _cplx(_wsum("zhtms,bhts->bhtm", W, S), -1) * bb  # [B, H, L, N]
        a = a + P * torch.matmul(q.to(CDTYPE), U.transpose(-1, -2))
        ac = a.conj() if conj else a
        num = torch.matmul(ac * P, G).real  # [B, H, L, D]
        z = ac * bb
        M = _wsum("zhtms,bhtm->bhts", W, torch.cat([z.real, -z.imag], -1))  # Re(z W): [B, H, L, L]
        num = num + torch.matmul(M, v)
        Pl = P[:, :, -1]  # [B', H, N]
        if eta is not None:
            ein = _cplx(_wsum("zhtms,bs->bhtm", W, mc.float()), -1)  # sum_s W_n(t, s) m_s
            eta_t = P * eta[:, :, None, :] + ein * bb
            outs.append(_finish(num, ac, eta_t, eta_eps))
            eta = eta_t[:, :, -1]
        else:
            outs.append(num)
        kv = _cplx(_wsum("zhms,bhsd->bhmd", W[:, :, -1], torch.cat([k, v], -1)), 2)  # [B, H, N, 2D]
        kv = kv * bbar[None, :, :, None]
        U = Pl[..., None] * U + kv[..., :D]
        G = Pl[..., None] * G + kv[..., D:]
    new = {"U": U, "Gamma": G}
    if eta is not None:
        new["eta"] = eta
    return torch.cat(outs, dim=2), new


# ------------------------------------------------------------------------------------------------
# s4d: chunked-parallel and recurrent forms
# ------------------------------------------------------------------------------------------------

def s4d_recurrent(u: torch.Tensor, m: torch.Tensor, dt_a: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor,
                  d_skip: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel S4D, one token at a time: x <- Abar^m x + m Bbar u, y = 2 Re(sum_n C x) + D u.

    u: [B, H, T, D] float32 (zero at padding); m: [B, T] bool; dt_a, bbar, c: [H, D, N] complex64;
    d_skip: [H, D]; x: state [B, H, D, N] complex64 (not modified). Returns (y [B, H, T, D] float32,
    new state).
    """
    ys = []
    for t in range(u.shape[2]):
        mt = m[:, t].float()[:, None, None, None]  # [B, 1, 1, 1]
        x = torch.exp(dt_a[None] * mt) * x + (mt * bbar[None]) * u[:, :, t, :, None].to(CDTYPE)
        ys.append(2 * (c[None] * x).sum(-1).real + d_skip.float() * u[:, :, t])
    return torch.stack(ys, dim=2), x


def s4d_chunked(u: torch.Tensor, m: torch.Tensor, dt_a: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor,
                d_skip: torch.Tensor, x: torch.Tensor, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel S4D, chunked-parallel form; same arguments and result as :func:`s4d_recurrent` plus
    ``chunk`` L. Within a chunk (clock c_t, state x0):
        y_t = sum_{s<=t} Kbar(c_t - c_s) u_s + 2 Re(sum_n C_n Abar_n^{c_t} x0[n]) + D u_t,
        Kbar(j) = 2 Re(sum_n C_n Bbar_n Abar_n^j)     (the S4D convolution kernel, s4d.py's ``K``),
        x_L[n]  = Abar_n^{c_L} x0[n] + Bbar_n sum_s Abar_n^{c_L - c_s} u_s.
    Kbar is tabulated once per chunk for lags 0..L-1 and gathered by lag (memory O(L^2) per channel).

    Raises:
        ValueError: ``chunk`` < 1.
    """
    if chunk < 1:
        raise ValueError(f"s4d_chunk must be >= 1, got {chunk}")
    from lctx.kernels.interdomain_scan import abar_powers  # in the function: that module imports triton

    T = u.shape[2]
    ys, tables = [], {}
    cb = c * bbar  # [H, D, N]

    def build(clk):  # clk: [B', L] clock -> (Kt [B', H, D, L, L], C P [B', H, D, L, N], P_L, W_L)
        L = clk.shape[1]
        pw = abar_powers(dt_a, L)  # [H, D, N, L+1]
        kern = 2 * torch.einsum("hdn,hdnj->hdj", cb, pw[..., :L]).real  # Kbar(0..L-1): [H, D, L]
        dc = (clk[:, :, None] - clk[:, None, :]).clamp_min(0)  # [B', L, L]
        causal = torch.ones(L, L, dtype=torch.bool, device=clk.device).tril()
        Kt = (kern[:, :, dc] * causal).permute(2, 0, 1, 3, 4)  # [B', H, D, L(t), L(s)]
        P = pw[..., clk].permute(3, 0, 1, 4, 2)  # Abar^{c_t}: [B', H, D, L, N]
        Wl = pw[..., clk[:, -1:] - clk].permute(3, 0, 1, 2, 4)  # Abar^{c_L - c_s}: [B', H, D, N, L]
        return Kt, c[None, :, :, None, :] * P, P[:, :, :, -1], Wl

    for a0 in range(0, T, chunk):
        e = min(a0 + chunk, T)
        Kt, CP, Pl, Wl = _chunk_tables(tables, m[:, a0:e], build)
        uc = u[:, :, a0:e]  # [B, H, L, D]
        y = _wsum("zhdts,bhsd->bhtd", Kt, uc) + 2 * _wsum("zhdtn,bhdn->bhtd", CP, x).real
        ys.append(y + d_skip.float()[:, None, :] * uc)
        x = Pl * x + bbar[None] * _wsum("zhdns,bhsd->bhdn", Wl, uc.to(CDTYPE))
    return torch.cat(ys, dim=2), x


# ------------------------------------------------------------------------------------------------
# the variants
# ------------------------------------------------------------------------------------------------

class _FixedState(AttentionVariant):
    """Shared plumbing of the fixed-state mixers: the real-token mask of the new tokens and the recurrent
    state on the cache (``cache_states(ctx.cache)[layer_idx]``), and the S4D state options every such variant
    reads under its ``option_prefix`` (:func:`_state_options`: ``n_modes``, ``chunk``, ``dt_range``; declared
    in its ``option_schema``). ``self.opts``: every option value (:meth:`option_values`).

    Raises:
        ValueError: a bad state option.
    """

    composable = False
    option_prefix: str = ""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.opts = self.option_values(config)
        self.n_modes, self.chunk, *self.dt_range = _state_options(self.opts, self.option_prefix)

    @staticmethod
    def new_mask(ctx: AttnContext, B: int, T: int, device) -> torch.Tensor:
        """m [B, T] bool: which of the T new tokens are real (``ctx.key_valid``'s last T; all if absent)."""
        if ctx.key_valid is None:
            return torch.ones(B, T, dtype=torch.bool, device=device)
        return ctx.key_valid[:, -T:].to(device=device, dtype=torch.bool)

    def forward(self, q, k, v, ctx: AttnContext, x=None):
        """The variant's :meth:`_forward` (q, k, v: [B, H, Tq, D] -> [B, H, Tq, D]) under :func:`_scan_threads`
        (one intra-op thread on CPU by default).

        Raises:
            ValueError: see :meth:`load_state`.
        """
        with _scan_threads(v.device, v.shape[2]):
            return self._forward(q, k, v, ctx, x)

    def load_state(self, ctx: AttnContext, T: int, zero: Callable[[], dict], B: int) -> dict:
        """The state to continue from: zeros without a cache or at the first call (no past tokens), else
        the state the previous call stored.

        Raises:
            ValueError: the cache holds past tokens but no state for this layer, or a different batch size.
        """
        past = ctx.k_pos.shape[1] - T
        if ctx.cache is None or past == 0:
            return zero()
        st = cache_states(ctx.cache).get(self.layer_idx)
        if st is None:
            raise ValueError(f"{self.variant_name} layer {self.layer_idx}: the cache holds {past} past tokens "
                             "but no recurrent state; build the cache by running this model with use_cache=True")
        first = next(iter(st.values()))
        if first.shape[0] != B:
            raise ValueError(f"{self.variant_name} layer {self.layer_idx}: cached state has batch "
                             f"{first.shape[0]}, the input has {B}")
        return st

    def store_state(self, ctx: AttnContext, state: dict) -> None:
        """Keep ``state`` (a dict of fixed-size tensors) on the cache for the next call."""
        if ctx.cache is not None:
            cache_states(ctx.cache)[self.layer_idx] = state

    def fast_impl(self, ctx: AttnContext, T: int, device, *inputs: torch.Tensor) -> str | None:
        """Which core runs under ``config.attn_impl`` ``"fast"`` (``None`` for "reference"/"sdpa", which keep
        the chunked form for T > 1 and the recurrent form for T = 1):

        ``"decode"`` for T = 1 on unpadded rows (:mod:`lctx.kernels.interdomain_scan`'s O(N D) step);
        ``"triton"`` for T > 1 when Triton runs on ``device`` (:func:`lctx.kernels.triton_runs`), the rows
        are unpadded (``not ctx.padded``) and no gradient is needed through ``inputs`` (the kernels are
        forward-only); else ``"vectorized"`` for unpadded rows (the chunked form over all chunks at once,
        :func:`lctx.kernels.interdomain_scan.interdomain_scan_cpu` / ``s4d_scan_cpu``: a few dozen ops
        instead of ~15 per chunk, differentiable) and ``"chunked"`` (this module's chunked form) with padding.
        T > 1 paths are noted with :func:`lctx.kernels.record_impl` (decode steps are not, so a prefill's
        record stands), ``"chunked"`` under "sdpa" too; the "reference" setting records nothing.
        """
        attn = self.attention_impl()
        if not attn.kernels:
            if attn.records_module_form and T > 1:  # the chunked form runs; the reference records nothing
                record_impl(self.variant_name, "chunked")
            return None
        if T == 1:
            return None if ctx.padded else "decode"
        from lctx.kernels.interdomain_scan import wants_grad  # lazy: loads triton

        if ctx.padded:
            impl = "chunked"
        else:
            return kernels.choose_kernel(self.variant_name, device, needs_grad=wants_grad(*inputs), flex=False,
                                         cpu="vectorized")
        kernels.record_impl(self.variant_name, impl)
        return impl


def _scan_threads(device, T: int):
    """The intra-op thread count of a fixed-state mixer's forward over more than one token on CPU:
    :func:`lctx.kernels.scan_threads` (default 1; ``LCTX_SCAN_THREADS``), measured to keep these many-op
    forms (the feature maps and norms around the scan too) from waiting on thread barriers on a shared
    machine. Other devices and decode steps (T = 1, ops below torch's parallel grain) are left alone."""

    return kernels.intra_op_threads(kernels.scan_threads() if T > 1 else 0, device)


def _opt(opts: dict, key: str, cast):
    """``cast(opts[key])`` (``opts``: every option value, :meth:`AttentionVariant.option_values`).

    Raises:
        ValueError: the value does not convert (``variant option id_conv='x' is not a valid int``).
    """
    try:
        return cast(opts[key])
    except (TypeError, ValueError):
        raise ValueError(f"variant option {key}={opts[key]!r} is not a valid {cast.__name__}") from None


def _state_options(opts: dict, prefix: str) -> tuple[int, int, float, float]:
    """The S4D state options both fixed-state variants declare in their ``option_schema``, ``{prefix}_modes``
    N, ``{prefix}_chunk`` (tokens), ``{prefix}_dt_min`` / ``{prefix}_dt_max``, from ``opts`` (every option
    value): (N, chunk, dt_min, dt_max).

    Raises:
        ValueError: a value that is not a number, or N or chunk below 1.
    """
    n_modes, chunk = _opt(opts, f"{prefix}_modes", int), _opt(opts, f"{prefix}_chunk", int)
    dt_min, dt_max = _opt(opts, f"{prefix}_dt_min", float), _opt(opts, f"{prefix}_dt_max", float)
    if n_modes < 1 or chunk < 1:
        raise ValueError(f"{prefix}_modes and {prefix}_chunk must be >= 1, got {n_modes}, {chunk}")
    return n_modes, chunk, dt_min, dt_max


def _state_parameters(mod: nn.Module, shape: tuple[int, ...], n_modes: int, dt_min: float, dt_max: float) -> None:
    """Give ``mod`` the S4D-Lin state parameters over ``shape`` channels: ``log_dt`` [*shape] (log-uniform in
    [dt_min, dt_max]: the only random draw), ``log_A_real`` and ``A_imag`` [*shape, N] (:func:`s4d_lin_init`)."""
    log_a_real, a_imag = s4d_lin_init(shape, n_modes)
    mod.log_dt = nn.Parameter(log_uniform_dt(shape, dt_min, dt_max))
    mod.log_A_real = nn.Parameter(log_a_real)
    mod.A_imag = nn.Parameter(a_imag)


def _no_weight_decay(*params: nn.Parameter) -> None:
    """Mark parameters as s4d.py's ``register`` does (``p._optim = {"weight_decay": 0.0}``): ``lctx train``
    (:func:`lctx.harness.commands.train.train`) reads the flag and keeps weight decay off them. Marked: the SSM's
    A, Delta and B (the state-spaces/s4 convention) and the gains and biases that are stored as
    multi-dimensional tensors (input-norm gains, per-head key/value biases, S4D's skip gain D), which the
    trainer's dimension rule (decay tensors of 2 or more dims) would otherwise decay (GPT-3's rule, and
    the BAM reference's ``train.py`` lines 306-318: no decay on gains and biases)."""
    for p in params:
        p._optim = {"weight_decay": 0.0}


@register_variant("interdomain")
class Interdomain(_FixedState):
    """Interdomain attention (seed 002): query-conditioned readout o_t = Re(xi(q_t)^T U_t^H Gamma_t) of a
    complex-diagonal S4D state over [xi(k); v] (equations in the module docstring).

    q, k, v: [B, H, Tq, D] -> [B, H, Tq, D] (in q's dtype; computed in float32/complex64). ``x`` unused.

    Parameters (per layer): ``log_dt`` [H] (Delta = exp(log_dt)), ``log_A_real`` [H, N], ``A_imag`` [H, N],
    ``B`` [H, N, 2] (real, imaginary; init 1 + 0i), ``conv_q``/``conv_k`` [H, D, K] (init U(+-1/sqrt K),
    torch's Conv1d default), ``norm_weight`` [H, 2D] (init 1), ``bias_k``/``bias_v`` [H, D] (init 0).
    ``lctx train`` decays only the convolution weights among them (A, Delta, B, the gain and the biases
    are marked by :func:`_no_weight_decay`).
    With the conjugate readout only |B_n| matters (the phase cancels in conj(a) Gamma).

    ``config.variant_options``:
        ``id_modes`` N, complex modes per head (default 16). State per layer: 2 N D complex + 2 (K-1) D
        real numbers per head (+ N complex for eta), independent of the sequence length.
        ``id_chunk`` tokens per chunk of the parallel form (default 64; any value gives the same result).
        ``id_conv`` K, width of the short causal convs (default 4, as DeltaNet/Mamba).
        ``id_feature_norm`` ``"l2"`` (default) or ``"sq"``: see :func:`feature_norm`. L2 is the default
            because it is the DeltaNet feature map the seed names and it keeps |xi| = 1, so the kernel
            xi(q).xi(k) is a bounded cosine; the literal squared norm gives |xi| = 1 / |SiLU(SC(x))|, which
            grows without bound as activations shrink (about 10 at init with 0.02-std projections) and is
            the least stable choice for the query side, which no later norm rescales.
        ``id_input_norm`` ``"joint"`` (default: one RMSNorm over the head's 2D-vector [xi(k); v]) or
            ``"split"`` (separate RMS for the key and value halves).
        ``id_readout`` ``"linear"`` (default, denominator-free) or ``"normalized"`` (divides by the
            eta readout; ``id_eta_eps`` default 1e-2: the denominator is a sign-indefinite Gram sum whose
            scale follows |B|^2 and Delta, with a median of about 5e-3..0.4 at init in a tiny model and
            values near 0 at every length, so a small eps lets single tokens blow up by 1/eps).
        ``id_conj`` (default True) conjugate-transpose readout; False uses U^T (see module docstring).
        ``id_dt_min``, ``id_dt_max`` range of the log-uniform Delta init (default 1e-3, 1e-1: S4D's).
        ``id_query`` ``"xi"`` (default: the readout is xi(q_t), the query-conditioned projection) or
            ``"const"`` (the seed's readout ablation: xi(q_t) replaced by xi(c) of a learned constant
            ``q_const`` [H, D] (init N(0, 1)), the same for every token; ``conv_q`` is then not built and q
            is ignored).

    Raises:
        ValueError: a bad option value.
    """

    summary = "fixed-state mixer: xi(q)^T U^H Gamma over a complex S4D state of [xi(k); v] (interdomain)"

    option_prefix = "id"
    option_schema = {"id_modes": Opt(int, 16, "complex modes N per head"), "id_chunk": Opt(int, 64, "scan chunk"),
                     "id_conv": Opt(int, 4, "short conv width K"),
                     "id_feature_norm": Opt(str, "l2", "feature map norm", ("l2", "sq")),
                     "id_input_norm": Opt(str, "joint", "RMSNorm of [xi(k); v]", ("joint", "split")),
                     "id_readout": Opt(str, "linear", "readout", ("linear", "normalized")),
                     "id_eta_eps": Opt(float, 1e-2, "eps of the normalized readout"),
                     "id_conj": Opt(bool, True, "conjugate-transpose readout"),
                     "id_dt_min": Opt(float, 1e-3, "smallest initial Delta"),
                     "id_dt_max": Opt(float, 1e-1, "largest initial Delta"),
                     "id_query": Opt(str, "xi", "readout: xi(q_t), or xi of a learned constant (ablation)",
                                     ("xi", "const"))}

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        opts, H, D = self.opts, self.n_heads, self.head_dim
        self.kernel = _opt(opts, "id_conv", int)
        self.fnorm = str(opts["id_feature_norm"])
        self.input_norm = str(opts["id_input_norm"])
        self.readout = str(opts["id_readout"])
        self.eta_eps = _opt(opts, "id_eta_eps", float)
        self.conj = bool(opts["id_conj"])
        self.query = str(opts["id_query"])
        if self.query not in ("xi", "const"):
            raise ValueError(f"id_query must be 'xi' or 'const', got {self.query!r}")
        if self.kernel < 1:
            raise ValueError(f"id_conv must be >= 1, got {self.kernel}")
        if self.fnorm not in ("l2", "sq"):
            raise ValueError(f"id_feature_norm must be 'l2' or 'sq', got {self.fnorm!r}")
        if self.input_norm not in ("joint", "split"):
            raise ValueError(f"id_input_norm must be 'joint' or 'split', got {self.input_norm!r}")
        if self.readout not in ("linear", "normalized"):
            raise ValueError(f"id_readout must be 'linear' or 'normalized', got {self.readout!r}")
        if not self.eta_eps > 0:
            raise ValueError(f"id_eta_eps must be > 0, got {self.eta_eps}")
        self.eps = config.rms_norm_eps
        _state_parameters(self, (H,), self.n_modes, *self.dt_range)
        self.B = nn.Parameter(torch.stack([torch.ones(H, self.n_modes), torch.zeros(H, self.n_modes)], -1))
        bound = 1.0 / math.sqrt(self.kernel)
        if self.query == "xi":
            self.conv_q = nn.Parameter(torch.empty(H, D, self.kernel).uniform_(-bound, bound))
        else:  # the readout ablation: one learned query per head, no query conv
            self.q_const = nn.Parameter(torch.randn(H, D))
        self.conv_k = nn.Parameter(torch.empty(H, D, self.kernel).uniform_(-bound, bound))
        self.norm_weight = nn.Parameter(torch.ones(H, 2 * D))
        self.bias_k = nn.Parameter(torch.zeros(H, D))
        self.bias_v = nn.Parameter(torch.zeros(H, D))
        _no_weight_decay(self.log_dt, self.log_A_real, self.A_imag, self.B, self.norm_weight, self.bias_k,
                         self.bias_v, *([self.q_const] if self.query == "const" else []))

    def ssm(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Delta A, Bbar), complex64 [H, N], from the current parameters (:func:`zoh`)."""
        b = torch.complex(self.B[..., 0].float(), self.B[..., 1].float())
        return zoh(self.log_dt, self.log_A_real, self.A_imag, b)

    def ssm_inputs(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm([xi(k); v]) * g + [b_k; b_v], split into the key and value halves, each [B, H, T, D]
        float32 (not yet masked). k is the feature xi(k), v the raw value."""
        u = torch.cat([k, v], dim=-1)
        if self.input_norm == "joint":
            u = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + self.eps)
        else:
            D = k.shape[-1]
            a, b = u[..., :D], u[..., D:]
            u = torch.cat([a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + self.eps),
                           b * torch.rsqrt(b.pow(2).mean(-1, keepdim=True) + self.eps)], -1)
        bias = torch.cat([self.bias_k, self.bias_v], -1).float()[None, :, None]
        u = u * self.norm_weight.float()[None, :, None] + bias
        return u.chunk(2, dim=-1)

    def _forward(self, q, k, v, ctx: AttnContext, x=None):
        """Mix. q, k, v: [B, H, Tq, D] (new tokens); continues from and stores the state on ``ctx.cache``
        (no cache: starts from zeros, stores nothing). Tq = 1 runs the recurrent form, else the chunked one;
        with ``config.attn_impl`` ``"fast"`` see :meth:`fast_impl` (Triton scan / decode step).
        Returns [B, H, Tq, D] in q's dtype; rows of padding tokens are finite and meaningless.

        Raises:
            ValueError: see :meth:`load_state`.
        """
        B, H, T, D = q.shape
        m = self.new_mask(ctx, B, T, q.device)
        K, N = self.kernel, self.n_modes

        def zero() -> dict:
            st = interdomain_state(B, H, N, D, self.readout == "normalized", q.device)
            st["conv_q"] = torch.zeros(B, H, K - 1, D, device=q.device)
            st["conv_k"] = torch.zeros(B, H, K - 1, D, device=q.device)
            return st

        st = self.load_state(ctx, T, zero, B)
        mf = m.float()[:, None, :, None]  # [B, 1, T, 1]: padding tokens enter as zeros everywhere
        if self.query == "xi":
            cq, conv_q = causal_depthwise_conv(q.float() * mf, self.conv_q, st["conv_q"])
            fq = feature_norm(F.silu(cq), self.fnorm)
        else:  # xi(c) for every token: the readout no longer depends on the query
            conv_q = st["conv_q"]
            fq = feature_norm(F.silu(self.q_const.float()), self.fnorm)[None, :, None].expand(B, H, T, D).contiguous()
        ck, conv_k = causal_depthwise_conv(k.float() * mf, self.conv_k, st["conv_k"])
        fk = feature_norm(F.silu(ck), self.fnorm)
        kt, vt = self.ssm_inputs(fk, v.float())
        kt, vt = kt * mf, vt * mf
        dt_a, bbar = self.ssm()
        core = {n: t for n, t in st.items() if not n.startswith("conv")}
        impl = self.fast_impl(ctx, T, q.device, fq, kt, vt, dt_a, bbar)
        o, new = self._core(impl, fq, kt, vt, m, dt_a, bbar, core, T)
        new["conv_q"], new["conv_k"] = conv_q, conv_k
        self.store_state(ctx, new)
        return o.to(q.dtype)

    def _core(self, impl, fq, kt, vt, m, dt_a, bbar, core, T):
        if impl == "decode":
            from lctx.kernels.interdomain_scan import interdomain_decode_step  # lazy: loads triton
            o, new = interdomain_decode_step(fq, kt, vt, dt_a, bbar, core, self.conj, self.eta_eps)
        elif impl == "triton":
            from lctx.kernels.interdomain_scan import interdomain_scan_triton  # lazy: loads triton
            o, new = interdomain_scan_triton(fq, kt, vt, dt_a, bbar, core, self.conj, self.eta_eps)
        elif impl == "vectorized":
            from lctx.kernels.interdomain_scan import interdomain_scan_cpu  # lazy: loads triton
            o, new = interdomain_scan_cpu(fq, kt, vt, dt_a, bbar, core, self.chunk, self.conj, self.eta_eps)
        elif T == 1:
            o, new = interdomain_recurrent(fq, kt, vt, m, dt_a, bbar, core, self.conj, self.eta_eps)
        else:
            o, new = interdomain_chunked(fq, kt, vt, m, dt_a, bbar, core, self.chunk, self.conj, self.eta_eps)
        return o, new


@register_variant("s4d")
class S4D(_FixedState):
    """Plain S4D mixer over the values (seed 002's baseline; Gu et al. 2022): every channel of v its own
    complex-diagonal SSM, y_t = 2 Re(sum_n C_n x_t[n]) + D u_t (module docstring). No query conditioning;
    q and k are ignored.

    q, k, v: [B, H, Tq, D] -> [B, H, Tq, D] (in v's dtype; computed in float32/complex64).

    Parameters (per layer): ``log_dt`` [H, D], ``log_A_real`` [H, D, N], ``A_imag`` [H, D, N] (S4D-Lin),
    ``C`` [H, D, N, 2] (real, imaginary parts; init as S4D's ``torch.randn(cfloat)``: N(0, 1/2) each),
    ``D`` [H, D] (init N(0, 1)). ``lctx train`` decays only ``C`` (the others are marked by
    :func:`_no_weight_decay`).

    ``config.variant_options``: ``s4d_modes`` N (default 16), ``s4d_chunk`` (default 64), ``s4d_dt_min``,
    ``s4d_dt_max`` (default 1e-3, 1e-1). State per layer: N complex numbers per channel.

    Raises:
        ValueError: a bad option value.
    """

    summary = "plain S4D mixer over v: y = 2 Re(C x_t) + D v_t per channel (no query; baseline of seed 002)"

    option_prefix = "s4d"
    option_schema = {"s4d_modes": Opt(int, 16, "modes N per channel"), "s4d_chunk": Opt(int, 64, "scan chunk"),
                     "s4d_dt_min": Opt(float, 1e-3, "smallest initial Delta"),
                     "s4d_dt_max": Opt(float, 1e-1, "largest initial Delta")}

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        H, D = self.n_heads, self.head_dim
        _state_parameters(self, (H, D), self.n_modes, *self.dt_range)
        self.C = nn.Parameter(torch.randn(H, D, self.n_modes, 2) * math.sqrt(0.5))
        self.D = nn.Parameter(torch.randn(H, D))
        _no_weight_decay(self.log_dt, self.log_A_real, self.A_imag, self.D)

    def ssm(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Delta A, Bbar, C), complex64 [H, D, N]."""
        dt_a, bbar = zoh(self.log_dt, self.log_A_real, self.A_imag)
        return dt_a, bbar, torch.complex(self.C[..., 0].float(), self.C[..., 1].float())

    def _forward(self, q, k, v, ctx: AttnContext, x=None):
        """Mix the values. v: [B, H, Tq, D] (q, k ignored); state handling as :meth:`Interdomain._forward`.
        Returns [B, H, Tq, D] in v's dtype.

        Raises:
            ValueError: see :meth:`load_state`.
        """
        B, H, T, D = v.shape
        m = self.new_mask(ctx, B, T, v.device)
        st = self.load_state(ctx, T, lambda: {"x": torch.zeros(B, H, D, self.n_modes, dtype=CDTYPE,
                                                                device=v.device)}, B)
        u = v.float() * m.float()[:, None, :, None]
        dt_a, bbar, c = self.ssm()
        impl = self.fast_impl(ctx, T, v.device, u, dt_a, bbar, c, self.D)
        y, xs = self._core(impl, u, m, dt_a, bbar, c, st, T)
        self.store_state(ctx, {"x": xs})
        return y.to(v.dtype)

    def _core(self, impl, u, m, dt_a, bbar, c, st, T):
        if impl == "decode":
            from lctx.kernels.interdomain_scan import s4d_decode_step  # lazy: loads triton
            y, xs = s4d_decode_step(u, dt_a, bbar, c, self.D, st["x"])
        elif impl == "triton":
            from lctx.kernels.interdomain_scan import s4d_scan_triton  # lazy: loads triton
            y, xs = s4d_scan_triton(u, dt_a, bbar, c, self.D, st["x"])
        elif impl == "vectorized":
            from lctx.kernels.interdomain_scan import s4d_scan_cpu  # lazy: loads triton
            y, xs = s4d_scan_cpu(u, dt_a, bbar, c, self.D, st["x"], self.chunk)
        elif T == 1:
            y, xs = s4d_recurrent(u, m, dt_a, bbar, c, self.D, st["x"])
        else:
            y, xs = s4d_chunked(u, m, dt_a, bbar, c, self.D, st["x"], self.chunk)
        return y, xs
