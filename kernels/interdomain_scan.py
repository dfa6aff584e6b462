"""Triton chunked scans of the complex-diagonal S4D state: the fast path of ``interdomain`` and ``s4d``.

The maths is that of :mod:`lctx.models.interdomain` (seed 002; S4D of Gu, Gupta, Goel & Re 2022,
arXiv 2206.11893, reference code github.com/state-spaces/s4 ``models/s4/s4d.py``), whose module
docstring defines both mixers, their chunked-parallel form and their recurrent form. The kernels here
compute the chunked form for unpadded rows (every new token real, so the clock within a chunk is
c_t = t + 1 and every decay is Abar^(lag)), carry the state across chunks inside the kernel and return
the final state in the same layout the model keeps on its KV cache, so the reference forms and these
kernels can continue each other's state.

Complex numbers are held as separate real and imaginary float32 tensors inside Triton (the complex64
state tensors are read and written in place through ``torch.view_as_real``).

``interdomain`` (:func:`interdomain_scan_triton`), per head h, chunk of L tokens with state
(U0, Gamma0[, eta0]) and, for mode n, W_n(t, s) = Abar_n^(t-s) (s <= t), P_n(t) = Abar_n^(t+1):

    S_ts   = xi(q_t) . kt_s                                         (one L x L x D ``tl.dot``)
    a_t[n] = P_n(t) xi(q_t).U0[n] + Bbar_n sum_s W_n(t, s) S_ts
    o_t    = sum_n Re(conj(a_t[n]) P_n(t) Gamma0[n]) + sum_s M_ts vt_s,
    M_ts   = Re sum_n conj(a_t[n]) Bbar_n W_n(t, s)                 (one L x L x D ``tl.dot`` per chunk)
    U[n]  <- Abar_n^L U0[n] + Bbar_n sum_s Abar_n^(L-1-s) kt_s      (Gamma with vt; eta with 1)

    normalised readout: o_t = num_t / (|Re sum_n conj(a_t[n]) eta_t[n]| + eps),
    eta_t[n] = P_n(t) eta0[n] + Bbar_n sum_{s<=t} W_n(t, s).

One program runs one (batch row, head, block of modes) through all chunks, the modes of the block
vectorised ([modes, L, L] decay tables, [modes, D] state in registers across chunks; S and M @ v are
shared by the block). The decays are built once per program: exp(Re(Delta A) (t - s)) times cos / sin
of Im(Delta A) (t - s) by angle addition from O(L) cosines. Work per head: O(T L N (L + D)) elementwise
plus O(T L D) per mode block in ``tl.dot``; memory O(T D) (no L x L tensor leaves the chip). With more
than one mode block per head the outputs are summed with ``tl.atomic_add`` (float32; the summation order
then varies run to run, at the 1e-7 relative level).

``s4d`` (:func:`s4d_scan_triton`), per channel (h, d): within a chunk,

    y_t = sum_{s<=t} Kbar(t - s) u_s + 2 Re(sum_n C_n Abar_n^(t+1) x0[n]) + D u_t,
    x[n] <- Abar_n^L x0[n] + Bbar_n sum_s Abar_n^(L-1-s) u_s,

with Kbar(j) = 2 Re(sum_n C_n Bbar_n Abar_n^j) (s4d.py's convolution kernel). Kbar, C Abar^(t+1) and the
powers Abar^j are tabulated once per call in PyTorch for lags 0..L; the Toeplitz block of Kbar is the
same for every chunk (time invariance) and is loaded once per program. One program runs one (batch row,
head, block of channels) with the [channels, N] state in registers. Work per channel O(T (L + N)).

Launch defaults (chunk L, modes / channels per program, 8 warps) were chosen so that ptxas reports no
or few register spills for sm_90 at D = 64 and 128, N = 16 and 32; they are not tuned by timing (no GPU
was at hand when they were written).

Decode: one new token costs O(N D) per head in :func:`interdomain_decode_step` / :func:`s4d_decode_step`
(PyTorch; a kernel launch would cost more than the arithmetic).

Training: the kernels are forward-only (no backward). The model uses them only when no gradient is
needed and falls back to the PyTorch chunked form (which autograd differentiates) otherwise; see
:func:`wants_grad`.

Precision: float32 throughout. On CUDA, ``tl.dot`` runs with ``input_precision="tf32x3"`` by default
(about float32 accuracy on tensor cores); pass ``precision="tf32"`` for speed or ``"ieee"`` for exact
float32 products. The Triton interpreter (``TRITON_INTERPRET=1``, CPU) runs the same kernels in numpy.

The ``@triton.jit`` functions are built on first use for the current mode (compiled or interpreted,
read from ``TRITON_INTERPRET`` at that moment), so tests can switch the interpreter on with an
environment variable even when triton was imported earlier in the process.
"""

from __future__ import annotations

import os

import torch

try:  # triton is a Linux dependency; the module must import without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

CDTYPE = torch.complex64


# ------------------------------------------------------------------------------------------------
# Triton kernels (plain functions; jitted lazily by _kernel)
# ------------------------------------------------------------------------------------------------

def abar_powers(dt_a: torch.Tensor, L: int) -> torch.Tensor:
    """Abar^j = exp(j Delta A) for j = 0..L, complex64 [..., N, L+1] (dt_a: [..., N]).

    Built as polar(exp(j Re(Delta A)), j Im(Delta A)): a real exp and a cos/sin per entry (complex ``exp``
    is several times slower on CPU). Every decay of a chunk is a gather from this table by integer clock
    differences.
    """
    j = torch.arange(L + 1, device=dt_a.device, dtype=torch.float32)
    re, im = dt_a.real[..., None] * j, dt_a.imag[..., None] * j
    return torch.polar(torch.exp(re), im)


def _interdomain_fwd(Q, K, V, stride_b, stride_h, stride_t,
                     DTA_RE, DTA_IM, BB_RE, BB_IM,
                     U_RE, U_IM, G_RE, G_IM, su_b, su_h, su_n, su_d,
                     E_RE, E_IM, se_b, se_h, se_n,
                     NUM, DEN,
                     H, T, N, D,
                     BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CONJ: tl.constexpr,
                     NORMALIZED: tl.constexpr, ATOMIC: tl.constexpr, PREC: tl.constexpr):
    pid_bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B H T D may pass 2^31 at long lengths
    pid_g = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H

    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = pid_g * BLOCK_N + tl.arange(0, BLOCK_N)
    d_mask = offs_d < D
    n_mask = offs_n < N
    nd_mask = n_mask[:, None] & d_mask[None, :]
    tt = offs_t[:, None]
    ss = offs_t[None, :]
    causal = (tt >= ss)[None, :, :]  # [1, L, L]
    lag = tl.where(tt >= ss, tt - ss, 0).to(tl.float32)[None, :, :]  # t - s (0 above the diagonal)
    tpos = offs_t.to(tl.float32)[None, :]  # [1, L]
    clock = tpos + 1.0  # c_t within the chunk (no padding)

    # this program's modes: Delta A and Bbar [BN] (Bbar = 0 for padding modes, so they add nothing)
    ar = tl.load(DTA_RE + h * N + offs_n, mask=n_mask, other=0.0)[:, None]  # [BN, 1]
    ai = tl.load(DTA_IM + h * N + offs_n, mask=n_mask, other=0.0)[:, None]
    br = tl.load(BB_RE + h * N + offs_n, mask=n_mask, other=0.0)[:, None]
    bi = tl.load(BB_IM + h * N + offs_n, mask=n_mask, other=0.0)[:, None]
    # the tables of the chunk that do not depend on its length: W_n(t, s) = Abar_n^(t-s) and
    # P_n(t) = Abar_n^(t+1); W's phase by angle addition from O(L) cosines
    ct = tl.cos(ai * tpos)  # [BN, L]
    st = tl.sin(ai * tpos)
    ew = tl.where(causal, tl.exp(ar[:, :, None] * lag), 0.0)  # [BN, L, L]
    wr = ew * (ct[:, :, None] * ct[:, None, :] + st[:, :, None] * st[:, None, :])
    wi = ew * (st[:, :, None] * ct[:, None, :] - ct[:, :, None] * st[:, None, :])
    ep = tl.exp(ar * clock)
    pr = ep * tl.cos(ai * clock)  # [BN, L]
    pi = ep * tl.sin(ai * clock)

    # the state of this program's modes, carried in registers across chunks
    su = b * su_b + h * su_h + offs_n[:, None] * su_n + offs_d[None, :] * su_d  # [BN, BD]
    ur = tl.load(U_RE + su, mask=nd_mask, other=0.0)
    ui = tl.load(U_IM + su, mask=nd_mask, other=0.0)
    gr = tl.load(G_RE + su, mask=nd_mask, other=0.0)
    gi = tl.load(G_IM + su, mask=nd_mask, other=0.0)
    se = b * se_b + h * se_h + offs_n * se_n
    if NORMALIZED:
        etr0 = tl.load(E_RE + se, mask=n_mask, other=0.0)[:, None]  # [BN, 1]
        eti0 = tl.load(E_IM + se, mask=n_mask, other=0.0)[:, None]
        ewr = tl.sum(wr, axis=2)  # sum_{s<=t} W_n(t, s): [BN, L]
        ewi = tl.sum(wi, axis=2)
    else:
        etr0 = tl.zeros((BLOCK_N, 1), dtype=tl.float32)
        eti0 = tl.zeros((BLOCK_N, 1), dtype=tl.float32)

    qkv_base = b * stride_b + h * stride_h
    out_base = pid_bh * T * D  # NUM is a contiguous [B, H, T, D], DEN [B, H, T]
    for t0 in range(0, T, BLOCK_T):
        rows = t0 + offs_t
        r_mask = rows < T
        nvalid = tl.minimum(T - t0, BLOCK_T)
        last = nvalid - 1
        io = qkv_base + rows[:, None] * stride_t + offs_d[None, :]
        io_mask = r_mask[:, None] & d_mask[None, :]
        q = tl.load(Q + io, mask=io_mask, other=0.0)  # [L, BD]
        k = tl.load(K + io, mask=io_mask, other=0.0)
        v = tl.load(V + io, mask=io_mask, other=0.0)
        S = tl.dot(q, tl.trans(k), input_precision=PREC)  # [L, L] xi(q_t) . kt_s

        # a_t[n] = P_n(t) xi(q_t).U0[n] + Bbar_n sum_s W_n(t, s) S_ts      [BN, L]
        qur = tl.sum(q[None, :, :] * ur[:, None, :], axis=2)
        qui = tl.sum(q[None, :, :] * ui[:, None, :], axis=2)
        swr = tl.sum(wr * S[None, :, :], axis=2)
        swi = tl.sum(wi * S[None, :, :], axis=2)
        a_r = pr * qur - pi * qui + br * swr - bi * swi
        a_i = pr * qui + pi * qur + br * swi + bi * swr
        if CONJ:
            a_i = -a_i
        # o_t = sum_n Re(ac P Gamma0) + sum_s M_ts vt_s,  M = Re sum_n ac Bbar W
        cr = a_r * pr - a_i * pi
        ci = a_r * pi + a_i * pr
        num = tl.sum(cr[:, :, None] * gr[:, None, :] - ci[:, :, None] * gi[:, None, :], axis=0)  # [L, BD]
        zr = a_r * br - a_i * bi
        zi = a_r * bi + a_i * br
        M = tl.sum(zr[:, :, None] * wr - zi[:, :, None] * wi, axis=0)  # [L, L]
        num += tl.dot(M, v, input_precision=PREC)

        # state update: X <- Abar^nvalid X0 + Bbar sum_s Abar^(last - s) x_s
        l_mask = (offs_t <= last)[None, :]
        llag = tl.where(l_mask, last - offs_t[None, :], 0).to(tl.float32)  # [1, L]
        el = tl.where(l_mask, tl.exp(ar * llag), 0.0)  # [BN, L]
        wlr = el * tl.cos(ai * llag)
        wli = el * tl.sin(ai * llag)
        nv = nvalid.to(tl.float32)
        epl = tl.exp(ar * nv)  # [BN, 1]
        plr = epl * tl.cos(ai * nv)
        pli = epl * tl.sin(ai * nv)
        if NORMALIZED:
            etr = pr * etr0 - pi * eti0 + br * ewr - bi * ewi  # eta_t [BN, L]
            eti = pr * eti0 + pi * etr0 + br * ewi + bi * ewr
            den = tl.sum(a_r * etr - a_i * eti, axis=0)  # [L]
            sr = tl.sum(wlr, axis=1)[:, None]
            si = tl.sum(wli, axis=1)[:, None]
            etr0, eti0 = (plr * etr0 - pli * eti0 + br * sr - bi * si,
                          plr * eti0 + pli * etr0 + br * si + bi * sr)
        kr = tl.sum(wlr[:, :, None] * k[None, :, :], axis=1)  # [BN, BD]
        ki = tl.sum(wli[:, :, None] * k[None, :, :], axis=1)
        vr = tl.sum(wlr[:, :, None] * v[None, :, :], axis=1)
        vi = tl.sum(wli[:, :, None] * v[None, :, :], axis=1)
        ur, ui = plr * ur - pli * ui + br * kr - bi * ki, plr * ui + pli * ur + br * ki + bi * kr
        gr, gi = plr * gr - pli * gi + br * vr - bi * vi, plr * gi + pli * gr + br * vi + bi * vr

        oo = out_base + rows[:, None] * D + offs_d[None, :]
        if ATOMIC:
            tl.atomic_add(NUM + oo, num, mask=io_mask)
            if NORMALIZED:
                tl.atomic_add(DEN + pid_bh * T + rows, den, mask=r_mask)
        else:
            tl.store(NUM + oo, num, mask=io_mask)
            if NORMALIZED:
                tl.store(DEN + pid_bh * T + rows, den, mask=r_mask)

    tl.store(U_RE + su, ur, mask=nd_mask)
    tl.store(U_IM + su, ui, mask=nd_mask)
    tl.store(G_RE + su, gr, mask=nd_mask)
    tl.store(G_IM + su, gi, mask=nd_mask)
    if NORMALIZED:
        tl.store(E_RE + se, tl.sum(etr0, axis=1), mask=n_mask)
        tl.store(E_IM + se, tl.sum(eti0, axis=1), mask=n_mask)


def _s4d_fwd(U, Y, stride_b, stride_h, stride_t,
             KERN, CP_RE, CP_IM, PW_RE, PW_IM, BB_RE, BB_IM, DSK,
             X_RE, X_IM, sx_b, sx_h, sx_d, sx_n,
             H, T, D, N,
             BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_bh = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d < D
    n_mask = offs_n < N
    hd = h * D + offs_d  # [BD] channel index into the [H, D, ...] tables
    dn_mask = d_mask[:, None] & n_mask[None, :]

    # Toeplitz block Kbar(t - s), the same for every chunk: [L(t), L(s), BD]
    t3 = offs_t[:, None, None]
    s3 = offs_t[None, :, None]
    causal3 = (t3 >= s3) & d_mask[None, None, :]
    lag3 = tl.where(t3 >= s3, t3 - s3, 0)
    kt = tl.load(KERN + hd[None, None, :] * BLOCK_T + lag3, mask=causal3, other=0.0)
    dsk = tl.load(DSK + hd, mask=d_mask, other=0.0)
    tab_n = hd[:, None] * N + offs_n[None, :]  # [BD, BN] row of the [H, D, N, ...] tables
    bbr = tl.load(BB_RE + tab_n, mask=dn_mask, other=0.0)
    bbi = tl.load(BB_IM + tab_n, mask=dn_mask, other=0.0)
    sx = b * sx_b + h * sx_h + offs_d[:, None] * sx_d + offs_n[None, :] * sx_n
    xr = tl.load(X_RE + sx, mask=dn_mask, other=0.0)
    xi = tl.load(X_IM + sx, mask=dn_mask, other=0.0)
    cp_off = tab_n[None, :, :] * BLOCK_T + offs_t[:, None, None]  # [L, BD, BN]: C Abar^(t+1) table
    cp_mask = dn_mask[None, :, :]
    base = b * stride_b + h * stride_h

    for t0 in range(0, T, BLOCK_T):
        rows = t0 + offs_t
        r_mask = rows < T
        nvalid = tl.minimum(T - t0, BLOCK_T)
        last = nvalid - 1
        io = base + rows[:, None] * stride_t + offs_d[None, :]
        io_mask = r_mask[:, None] & d_mask[None, :]
        u = tl.load(U + io, mask=io_mask, other=0.0)  # [L, BD]
        y = tl.sum(kt * u[None, :, :], axis=1)  # intra-chunk convolution
        cpr = tl.load(CP_RE + cp_off, mask=cp_mask, other=0.0)
        cpi = tl.load(CP_IM + cp_off, mask=cp_mask, other=0.0)
        y += tl.sum(cpr * xr[None, :, :] - cpi * xi[None, :, :], axis=2)  # 2 Re(C Abar^(t+1) x0)
        y += dsk[None, :] * u
        tl.store(Y + io, y, mask=io_mask)
        # x <- Abar^nvalid x0 + Bbar sum_s Abar^(last - s) u_s
        llag = tl.where(offs_t <= last, last - offs_t, 0)
        w_off = tab_n[None, :, :] * (BLOCK_T + 1) + llag[:, None, None]  # [L, BD, BN]
        w_mask = (offs_t <= last)[:, None, None] & cp_mask
        wr = tl.load(PW_RE + w_off, mask=w_mask, other=0.0)
        wi = tl.load(PW_IM + w_off, mask=w_mask, other=0.0)
        acr = tl.sum(wr * u[:, :, None], axis=0)  # [BD, BN]
        aci = tl.sum(wi * u[:, :, None], axis=0)
        p_off = tab_n * (BLOCK_T + 1) + nvalid
        plr = tl.load(PW_RE + p_off, mask=dn_mask, other=0.0)
        pli = tl.load(PW_IM + p_off, mask=dn_mask, other=0.0)
        xr, xi = (plr * xr - pli * xi + bbr * acr - bbi * aci,
                  plr * xi + pli * xr + bbr * aci + bbi * acr)
    tl.store(X_RE + sx, xr, mask=dn_mask)
    tl.store(X_IM + sx, xi, mask=dn_mask)


_JIT: dict[tuple[str, bool], object] = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernel(fn):
    """``triton.jit(fn)`` for the current mode (interpreted or compiled), built once per mode."""
    key = (fn.__name__, _interpreting())
    if key not in _JIT:
        _JIT[key] = triton.jit(fn)
    return _JIT[key]


def _check_triton(device: torch.device) -> None:
    if triton is None:
        raise RuntimeError("triton is not installed; use the PyTorch chunked form (attn_impl='reference')")
    if device.type != "cuda" and not _interpreting():
        raise RuntimeError(f"the Triton scan needs a CUDA device or TRITON_INTERPRET=1, got tensors on {device}")


def _pow2(x: int, lo: int = 16) -> int:
    return max(lo, 1 << max(0, (int(x) - 1).bit_length()))


def wants_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd would need a backward through these tensors (the kernels are forward-only)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors if isinstance(t, torch.Tensor))


# ------------------------------------------------------------------------------------------------
# interdomain
# ------------------------------------------------------------------------------------------------

def interdomain_scan_triton(fq: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, dt_a: torch.Tensor,
                            bbar: torch.Tensor, state: dict, conj: bool = True, eta_eps: float = 1e-2,
                            chunk: int | None = None, block_n: int | None = None,
                            precision: str | None = None, num_warps: int = 8) -> tuple[torch.Tensor, dict]:
    """Interdomain core over unpadded tokens, Triton chunked scan (module docstring; the maths of
    :func:`lctx.models.interdomain.interdomain_chunked` with every token real).

    fq: [B, H, T, D] query features xi(q); kt, vt: [B, H, T, D] SSM inputs (key and value halves);
    dt_a, bbar: [H, N] complex64 (:func:`lctx.models.interdomain.zoh`); state: {"U", "Gamma"[, "eta"]}
    complex64 [B, H, N, D] (eta [B, H, N]: the normalised readout), not modified. ``chunk``: tokens per
    chunk L (a power of two >= 16; default 32 for D <= 64, else 16); ``block_n``: modes per program
    (rounded up to a power of two; default 1 on CUDA, all N interpreted; more than one program per head
    sums the outputs with atomics); ``num_warps`` (default 8; by ptxas for sm_90, one mode per program
    with 8 warps fits the registers without spilling at L = 32, D = 64, and with 8 bytes of spill at
    L = 16, D = 128); ``precision``: ``tl.dot`` input
    precision (default ``"tf32x3"`` on CUDA, ``"ieee"`` interpreted).
    Returns (o [B, H, T, D] float32, new state as ``state``). Forward only: no autograd graph.

    Raises:
        RuntimeError: triton missing, or tensors not on CUDA without ``TRITON_INTERPRET=1``.
        ValueError: shapes that do not match, or ``chunk`` not a power of two >= 16.
    """
    _check_triton(fq.device)
    B, H, T, D = fq.shape
    N = dt_a.shape[-1]
    if kt.shape != fq.shape or vt.shape != fq.shape or dt_a.shape != (H, N) or bbar.shape != (H, N):
        raise ValueError(f"shapes do not match: fq {tuple(fq.shape)}, kt {tuple(kt.shape)}, vt {tuple(vt.shape)}, "
                         f"dt_a {tuple(dt_a.shape)}, bbar {tuple(bbar.shape)}")
    if state["U"].shape != (B, H, N, D) or state["Gamma"].shape != (B, H, N, D):
        raise ValueError(f"state U/Gamma must be [B, H, N, D] = {(B, H, N, D)}, got {tuple(state['U'].shape)}")
    L = (32 if D <= 64 else 16) if chunk is None else int(chunk)
    if L < 16 or L & (L - 1):
        raise ValueError(f"chunk must be a power of two >= 16, got {chunk}")
    normalized = "eta" in state
    dev = fq.device
    q, k, v = (x.float().contiguous() for x in (fq, kt, vt))
    U = state["U"].to(CDTYPE).clone()
    G = state["Gamma"].to(CDTYPE).clone()
    ur, gr = torch.view_as_real(U), torch.view_as_real(G)  # [B, H, N, D, 2]
    if normalized:
        eta = state["eta"].to(CDTYPE).clone()
        er = torch.view_as_real(eta)  # [B, H, N, 2]
        e_re, e_im, se = er[..., 0], er[..., 1], er.stride()
    else:
        eta = None
        e_re = e_im = torch.zeros(1, device=dev)
        se = (0, 0, 0)
    dta = dt_a.to(CDTYPE)
    bb = bbar.to(CDTYPE)
    dta_re, dta_im = dta.real.float().contiguous(), dta.imag.float().contiguous()
    bb_re, bb_im = bb.real.float().contiguous(), bb.imag.float().contiguous()
    if block_n is None:
        block_n = 1 if dev.type == "cuda" else N
    BN = min(_pow2(block_n, 1), _pow2(N, 1))
    groups = triton.cdiv(N, BN)
    atomic = groups > 1
    num = (torch.zeros if atomic else torch.empty)(B, H, T, D, device=dev, dtype=torch.float32)
    den = (torch.zeros if atomic else torch.empty)(B, H, T, device=dev, dtype=torch.float32) if normalized \
        else torch.zeros(1, device=dev)
    if precision is None:
        precision = "tf32x3" if dev.type == "cuda" else "ieee"
    if T > 0:
        kern = _kernel(_interdomain_fwd)
        kern[(B * H, groups)](
            q, k, v, q.stride(0), q.stride(1), q.stride(2),
            dta_re, dta_im, bb_re, bb_im,
            ur[..., 0], ur[..., 1], gr[..., 0], gr[..., 1], ur.stride(0), ur.stride(1), ur.stride(2), ur.stride(3),
            e_re, e_im, se[0], se[1], se[2],
            num, den, H, T, N, D,
            BLOCK_T=L, BLOCK_D=_pow2(D), BLOCK_N=BN, CONJ=bool(conj), NORMALIZED=normalized, ATOMIC=atomic,
            PREC=precision, num_warps=num_warps)
    o = num / (den.abs()[..., None] + eta_eps) if normalized else num
    new = {"U": U, "Gamma": G}
    if normalized:
        new["eta"] = eta
    return o, new


def interdomain_decode_step(fq: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, dt_a: torch.Tensor,
                            bbar: torch.Tensor, state: dict, conj: bool = True,
                            eta_eps: float = 1e-2) -> tuple[torch.Tensor, dict]:
    """One decode step of the interdomain core for real (unpadded) tokens, O(N D) per head (PyTorch).

    fq, kt, vt: [B, H, 1, D]; dt_a, bbar: [H, N] complex64; state as :func:`interdomain_scan_triton`
    (not modified). U <- Abar U + Bbar kt, Gamma <- Abar Gamma + Bbar vt, a = U xi(q),
    o = Re(sum_n conj(a) Gamma) [/ (|Re(sum_n conj(a) eta)| + eps)] (the recurrent form of
    :func:`lctx.models.interdomain.interdomain_recurrent` with m = 1). Returns (o [B, H, 1, D] float32,
    new state).

    Raises:
        ValueError: more than one token.
    """
    if fq.shape[2] != 1:
        raise ValueError(f"the decode step takes one token, got {fq.shape[2]}")
    lam = torch.exp(dt_a.to(CDTYPE))[None, :, :, None]  # [1, H, N, 1]
    bb = bbar.to(CDTYPE)[None, :, :, None]
    U = lam * state["U"] + bb * kt[:, :, :, :].float().to(CDTYPE)  # kt [B, H, 1, D] broadcasts over N
    G = lam * state["Gamma"] + bb * vt.float().to(CDTYPE)
    a = torch.matmul(U, fq.float().to(CDTYPE).transpose(-1, -2))  # [B, H, N, 1]
    ac = a.conj() if conj else a
    num = torch.matmul(ac.transpose(-1, -2), G).real  # [B, H, 1, D]
    new = {"U": U, "Gamma": G}
    if "eta" in state:
        eta = lam[..., 0] * state["eta"] + bb[..., 0]
        den = (ac[..., 0] * eta).sum(-1).real  # [B, H]
        num = num / (den.abs()[..., None, None] + eta_eps)
        new["eta"] = eta
    return num, new


# ------------------------------------------------------------------------------------------------
# s4d
# ------------------------------------------------------------------------------------------------

def _s4d_tables(dt_a: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor, L: int):
    """Per-call tables of the s4d kernel for lags 0..L: Kbar(j) [H, D, L] (j < L), 2 C Abar^(t+1) [H, D, N, L]
    (real, imaginary) and Abar^j [H, D, N, L+1] (real, imaginary); all float32 contiguous."""
    j = torch.arange(L + 1, device=dt_a.device, dtype=torch.float32)
    pw = torch.polar(torch.exp(dt_a.real[..., None] * j), dt_a.imag[..., None] * j)  # [H, D, N, L+1]
    kern = 2 * torch.einsum("hdn,hdnj->hdj", c * bbar, pw[..., :L]).real
    cp = 2 * c[..., None] * pw[..., 1:]
    f = lambda x: x.float().contiguous()
    return f(kern), f(cp.real), f(cp.imag), f(pw.real), f(pw.imag)


def s4d_scan_triton(u: torch.Tensor, dt_a: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor,
                    d_skip: torch.Tensor, x: torch.Tensor, chunk: int | None = None,
                    block_d: int | None = None, num_warps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel S4D over unpadded tokens, Triton chunked scan (module docstring; the maths of
    :func:`lctx.models.interdomain.s4d_chunked` with every token real).

    u: [B, H, T, D] float32 inputs; dt_a, bbar, c: [H, D, N] complex64; d_skip: [H, D]; x: state
    [B, H, D, N] complex64 (not modified). ``chunk``: tokens per chunk (a power of two; default 32);
    ``block_d``: channels per program (a power of two; default on CUDA min(8, 128 / N rounded up to a
    power of two): with L = 32 the [L, L, block_d] Toeplitz block and the [L, block_d, N] tables then fit
    the registers of sm_90 with 8 warps without spilling (by ptxas: 238 registers at N = 16, 243 at
    N = 32); interpreted: all D); ``num_warps`` (default 8). Returns (y [B, H, T, D] float32, new state
    [B, H, D, N] complex64). Forward only.

    Raises:
        RuntimeError: triton missing, or tensors not on CUDA without ``TRITON_INTERPRET=1``.
        ValueError: shapes that do not match, or ``chunk`` / ``block_d`` not a power of two.
    """
    _check_triton(u.device)
    B, H, T, D = u.shape
    N = dt_a.shape[-1]
    if dt_a.shape != (H, D, N) or bbar.shape != (H, D, N) or c.shape != (H, D, N) or x.shape != (B, H, D, N):
        raise ValueError(f"shapes do not match: u {tuple(u.shape)}, dt_a {tuple(dt_a.shape)}, bbar "
                         f"{tuple(bbar.shape)}, c {tuple(c.shape)}, x {tuple(x.shape)}")
    L = 32 if chunk is None else int(chunk)
    if block_d is None:
        block_d = max(1, min(8, 128 // _pow2(N, 1))) if u.device.type == "cuda" else _pow2(D, 1)
    BD = int(block_d)
    for name, val in (("chunk", L), ("block_d", BD)):
        if val < 1 or val & (val - 1):
            raise ValueError(f"{name} must be a power of two, got {val}")
    BD = min(BD, _pow2(D, 1))
    uc = u.float().contiguous()
    y = torch.empty_like(uc)
    xs = x.to(CDTYPE).clone()
    xr = torch.view_as_real(xs)  # [B, H, D, N, 2]
    kern, cp_re, cp_im, pw_re, pw_im = _s4d_tables(dt_a.to(CDTYPE), bbar.to(CDTYPE), c.to(CDTYPE), L)
    bb = bbar.to(CDTYPE)
    if T > 0:
        k = _kernel(_s4d_fwd)
        k[(B * H, triton.cdiv(D, BD))](
            uc, y, uc.stride(0), uc.stride(1), uc.stride(2),
            kern, cp_re, cp_im, pw_re, pw_im, bb.real.float().contiguous(), bb.imag.float().contiguous(),
            d_skip.float().contiguous(),
            xr[..., 0], xr[..., 1], xr.stride(0), xr.stride(1), xr.stride(2), xr.stride(3),
            H, T, D, N, BLOCK_T=L, BLOCK_D=BD, BLOCK_N=_pow2(N, 1), num_warps=num_warps)
    return y, xs


def s4d_decode_step(u: torch.Tensor, dt_a: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor,
                    d_skip: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of the per-channel S4D for a real token, O(N D) per head (PyTorch):
    x <- Abar x + Bbar u, y = 2 Re(sum_n C x) + D u (s4d.py's recurrence; the recurrent form of
    :func:`lctx.models.interdomain.s4d_recurrent` with m = 1).

    u: [B, H, 1, D]; dt_a, bbar, c: [H, D, N] complex64; d_skip [H, D]; x [B, H, D, N] complex64 (not
    modified). Returns (y [B, H, 1, D] float32, new state).

    Raises:
        ValueError: more than one token.
    """
    if u.shape[2] != 1:
        raise ValueError(f"the decode step takes one token, got {u.shape[2]}")
    u0 = u[:, :, 0].float()  # [B, H, D]
    x = torch.exp(dt_a.to(CDTYPE))[None] * x + bbar.to(CDTYPE)[None] * u0[..., None].to(CDTYPE)
    y = 2 * (c.to(CDTYPE)[None] * x).sum(-1).real + d_skip.float() * u0
    return y[:, :, None], x


__all__ = ["interdomain_decode_step", "interdomain_scan_triton", "s4d_decode_step", "s4d_scan_triton",
           "wants_grad"]


# ------------------------------------------------------------------------------------------------
# CPU: the chunked form vectorised over chunks (a few dozen large ops instead of ~15 per chunk)
# ------------------------------------------------------------------------------------------------

def _chunk_pieces(T: int, chunk: int) -> list[tuple[int, int, int]]:
    """[(start, end, L)]: the full chunks of ``chunk`` tokens as one piece, the remainder as another."""
    full = T // chunk * chunk
    return [(a, e, L) for a, e, L in ((0, full, chunk), (full, T, T - full)) if e > a]


def _scan_chunks(start: torch.Tensor, X: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Chunk-start states of the linear recurrence S_{c+1} = step * S_c + X_c, S_0 = ``start``.

    start: [B, H, ...]; X: [B, H, nc, ...] (chunk-local contributions); step: broadcastable to start (the
    decay over one chunk, Abar^L). Returns [B, H, nc + 1, ...]: S_0 .. S_nc (the last is the state after
    every chunk). nc steps of two element-wise ops on the small state (below torch's parallel grain, so
    single-threaded: no thread synchronisation per step)."""
    out = [start]
    for c in range(X.shape[2]):
        out.append(step * out[-1] + X[:, :, c])
    return torch.stack(out, dim=2)


def interdomain_scan_cpu(fq: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, dt_a: torch.Tensor,
                         bbar: torch.Tensor, state: dict, chunk: int = 64, conj: bool = True,
                         eta_eps: float = 1e-2) -> tuple[torch.Tensor, dict]:
    """Interdomain core over unpadded tokens on CPU: the chunked form of
    :func:`lctx.models.interdomain.interdomain_chunked` (same arguments, no mask: every token real; same
    result) computed for all chunks at once. Per piece of nc chunks of L tokens (the full chunks, then
    the remainder), with W_n(t, s) = Abar_n^(t-s) (s <= t), P_n(t) = Abar_n^(t+1):

        S = xi(q) kt^T per chunk, a_t = Bbar sum_s W(t, s) S_ts + P(t) xi(q_t).U_c   (one einsum each)
        X_c = Bbar sum_s Abar^(L-1-s) [kt; vt]_s (all chunks), U_(c+1) = Abar^L U_c + X_c (a short loop
        over chunks on the [N, 2D] state only), o = Re(conj(a) P Gamma_c) + M v with M = Re(conj(a) Bbar W).

    About 40 tensor ops per piece plus 2 per chunk on the state, against ~15 per chunk of 64 tokens in
    the model's form (60K ops at 16K tokens, which a loaded 2-thread machine turns into
    thread-synchronisation waits). Memory O(T (L + N + D)) per head. Differentiable (plain autograd).

    Returns (o [B, H, T, D] float32, new state).
    """
    outs = []
    U, G, eta = state["U"], state["Gamma"], state.get("eta")
    for a0, e0, L in _chunk_pieces(fq.shape[2], chunk):
        o, U, G, eta = _interdomain_piece(fq[:, :, a0:e0], kt[:, :, a0:e0], vt[:, :, a0:e0], dt_a, bbar, U, G,
                                          eta, L, conj, eta_eps, abar_powers)
        outs.append(o)
    new = {"U": U, "Gamma": G}
    if eta is not None:
        new["eta"] = eta
    return torch.cat(outs, dim=2), new


def _interdomain_piece(fq, kt, vt, dt_a, bbar, U, G, eta, L, conj, eta_eps, abar_powers):
    B, H, T, D = fq.shape
    N = dt_a.shape[-1]
    nc = T // L
    dev = fq.device
    pw = abar_powers(dt_a, L)  # [H, N, L+1]: Abar^j
    t = torch.arange(L, device=dev)
    lag = (t[:, None] - t[None, :]).clamp_min(0)
    causal = (t[:, None] >= t[None, :]).float()
    W = torch.cat([pw.real, pw.imag], 1)[:, :, lag] * causal  # [H, 2N, L(t), L(s)]
    P = pw[:, :, 1:].transpose(1, 2)  # Abar^(t+1): [H, L, N]
    q, k, v = (x.reshape(B, H, nc, L, D) for x in (fq, kt, vt))
    bb = bbar[None, :, None, None, :]  # [1, H, 1, 1, N]
    # chunk-local state contributions and the chunk-start states (eta: the projection of the constant 1)
    wl = pw[:, :, :L].flip(-1)  # Abar^(L-1-s), s = 0..L-1: [H, N, L]
    inp = torch.cat([k, v] + ([torch.ones(B, H, nc, L, 1, device=dev)] if eta is not None else []), -1)
    X = torch.einsum("hns,bhcse->bhcne", wl, inp.to(CDTYPE)) * bbar[None, :, None, :, None]
    start = torch.cat([U, G] + ([eta[..., None]] if eta is not None else []), -1)  # [B, H, N, 2D(+1)]
    S0 = _scan_chunks(start, X, pw[:, :, L, None])  # [B, H, nc+1, N, 2D(+1)]
    U0, G0 = S0[:, :, :nc, :, :D], S0[:, :, :nc, :, D:2 * D]
    # a_t[n] = Bbar sum_s W(t, s) (xi(q_t).kt_s) + P(t) xi(q_t).U0
    Sqk = torch.matmul(q, k.transpose(-1, -2))  # [B, H, nc, L, L]
    aw = torch.einsum("hmts,bhcts->bhctm", W, Sqk)
    a = torch.complex(aw[..., :N], aw[..., N:]) * bb
    a = a + P[None, :, None] * torch.einsum("bhctd,bhcnd->bhctn", q.to(CDTYPE), U0)
    ac = a.conj() if conj else a
    num = torch.einsum("bhctn,bhcnd->bhctd", ac * P[None, :, None], G0).real
    z = ac * bb
    M = torch.einsum("bhctm,hmts->bhcts", torch.cat([z.real, -z.imag], -1), W)  # Re(z W)
    num = num + torch.matmul(M, v)
    if eta is not None:
        ws = W.sum(-1)  # sum_{s<=t} W(t, s): [H, 2N, L]
        ein = torch.complex(ws[:, :N], ws[:, N:]).transpose(1, 2)  # [H, L, N]
        eta_t = P[None, :, None] * S0[:, :, :nc, None, :, 2 * D] + ein[None, :, None] * bb
        num = num / ((ac * eta_t).sum(-1).real.abs()[..., None] + eta_eps)
    end = S0[:, :, nc]
    return (num.reshape(B, H, T, D), end[..., :D], end[..., D:2 * D],
            end[..., 2 * D] if eta is not None else None)


def s4d_scan_cpu(u: torch.Tensor, dt_a: torch.Tensor, bbar: torch.Tensor, c: torch.Tensor,
                 d_skip: torch.Tensor, x: torch.Tensor, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel S4D over unpadded tokens on CPU: :func:`lctx.models.interdomain.s4d_chunked` (same
    arguments, no mask) for all chunks at once. Per piece of nc chunks of L tokens:

        y = Kbar-Toeplitz(L x L) u (one einsum over every chunk) + 2 Re(C Abar^(t+1) x_c) + D u,
        X_c = Bbar sum_s Abar^(L-1-s) u_s, x_(c+1) = Abar^L x_c + X_c (a loop over chunks on [D, N] only),

    Kbar(j) = 2 Re(sum_n C_n Bbar_n Abar_n^j) (s4d.py's kernel). Returns (y [B, H, T, D] float32, new
    state [B, H, D, N] complex64). Differentiable (plain autograd).
    """
    ys = []
    for a0, e0, L in _chunk_pieces(u.shape[2], chunk):
        y, x = _s4d_piece(u[:, :, a0:e0], dt_a, bbar, c, d_skip, x, L, abar_powers)
        ys.append(y)
    return torch.cat(ys, dim=2), x


def _s4d_piece(u, dt_a, bbar, c, d_skip, x, L, abar_powers):
    B, H, T, D = u.shape
    nc = T // L
    dev = u.device
    pw = abar_powers(dt_a, L)  # [H, D, N, L+1]
    kern = 2 * torch.einsum("hdn,hdnj->hdj", c * bbar, pw[..., :L]).real  # Kbar(0..L-1): [H, D, L]
    t = torch.arange(L, device=dev)
    Kt = kern[:, :, (t[:, None] - t[None, :]).clamp_min(0)] * (t[:, None] >= t[None, :]).float()  # [H, D, L, L]
    uc = u.reshape(B, H, nc, L, D)
    y = torch.einsum("hdts,bhcsd->bhctd", Kt, uc)
    wl = pw[..., :L].flip(-1)  # Abar^(L-1-s): [H, D, N, L]
    X = torch.einsum("hdns,bhcsd->bhcdn", wl, uc.to(CDTYPE)) * bbar[None, :, None]
    S0 = _scan_chunks(x, X, pw[..., L])  # [B, H, nc+1, D, N]
    CP = c[..., None] * pw[..., 1:]  # C Abar^(t+1): [H, D, N, L]
    y = y + 2 * torch.einsum("hdnt,bhcdn->bhctd", CP, S0[:, :, :nc]).real
    y = y + d_skip.float()[None, :, None, None, :] * uc
    return y.reshape(B, H, T, D), S0[:, :, nc]
