"""Positional-LSH ALiBi (seed 003): mask mean -> Laplacian kernel at rate ~1/sqrt(s), output -> ALiBi."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import LctxForCausalLM, alibi_slopes
from lctx.models.lsh import bin_ids, bin_mask_mean, lsh_attention, sample_bins
from lctx.models.variants import reference_attention

from helpers import tiny_config


def kernel(n, slopes):
    d = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    return torch.exp(-d[None] * slopes.double()[:, None, None])  # [H, n, n], sigma = 1/m


def test_random_binning_is_contiguous():
    w, u = sample_bins(alibi_slopes(4), 8, torch.Generator().manual_seed(0))
    b = bin_ids(torch.arange(500)[None], w, u)[0]
    assert (b.diff(dim=-1) >= 0).all() and (b.diff(dim=-1) <= 1).all()  # bins are contiguous runs


def test_mask_mean_converges_like_inverse_sqrt_s():
    # Seed 003, Theorem 2.1: E[M(h)] = L*; max-norm error of the s-sample mean falls as O(1/sqrt(s)).
    # Averaged over 20 seeds so the check is about the rate, not one draw.
    slopes = torch.tensor([0.25, 0.0625])
    n, L = 64, kernel(64, torch.tensor([0.25, 0.0625]))
    errs = {}
    for s in (4, 16, 64):
        e = []
        for seed in range(20):
            w, u = sample_bins(slopes, s, torch.Generator().manual_seed(seed))
            e.append((bin_mask_mean(n, w, u) - L).abs().amax().item())
        errs[s] = sum(e) / len(e)
    assert errs[4] > errs[16] > errs[64]
    # ratio per 4x samples ~ 2 (1/sqrt(4)); allow a wide band
    ratios = (errs[4] / errs[16], errs[16] / errs[64])
    assert all(1.4 < r < 2.9 for r in ratios), errs


def test_mask_mean_spectral_error_converges_like_inverse_sqrt_s():
    """Seed 003 bounds the error in spectral norm too (largest singular value of M~ - L*): the mean over 20 seeds
    falls by ~2 per 4x samples. Control: the same rate measured on a mean whose draws are all one binning
    repeated (no averaging) does not fall, so the band catches an estimator that stops converging."""
    slopes = torch.tensor([0.25, 0.0625])
    n, L = 64, kernel(64, slopes)

    def err(s, repeat=False):
        e = []
        for seed in range(20):
            w, u = sample_bins(slopes, 1 if repeat else s, torch.Generator().manual_seed(seed))
            if repeat:
                w, u = w.expand(s, -1), u.expand(s, -1)
            e.append(torch.linalg.matrix_norm(bin_mask_mean(n, w, u) - L, ord=2).mean().item())
        return sum(e) / len(e)

    errs = {s: err(s) for s in (4, 16, 64)}
    ratios = (errs[4] / errs[16], errs[16] / errs[64])
    assert all(1.4 < r < 2.9 for r in ratios), errs  # 1/sqrt(4) = 2 per step, a wide band for 20 draws
    flat = err(4, True) / err(64, True)
    assert not 1.4 < flat < 2.9, flat


def test_mean_of_many_masks_is_the_alibi_kernel():
    slopes = torch.tensor([0.5])
    w, u = sample_bins(slopes, 20000, torch.Generator().manual_seed(1))
    assert (bin_mask_mean(12, w, u) - kernel(12, slopes)).abs().amax() < 0.02


def test_lsh_output_approaches_exact_alibi_attention():
    # exact multiplicative-kernel attention = softmax(q.k/sqrt(D) - m|i-j|): plain ALiBi.
    torch.manual_seed(0)
    H, T, D = 4, 96, 16
    q, k, v = torch.randn(3, 1, H, T, D).unbind(0)
    slopes = alibi_slopes(H) * 8  # short-range heads so T covers several bin widths
    pos = torch.arange(T)[None]
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]
    bias = -slopes.float()[None, :, None, None] * (pos[0][:, None] - pos[0][None, :]).float()
    exact = reference_attention(q, k, v, allowed, bias)
    errs = {}
    for s in (2, 16, 128):
        e = []
        for seed in range(5):
            w, u = sample_bins(slopes, s, torch.Generator().manual_seed(seed))
            e.append((lsh_attention(q, k, v, pos, pos, allowed, w, u, block=32) - exact).abs().mean().item())
        errs[s] = sum(e) / len(e)
    assert errs[2] > errs[16] > errs[128], errs


def test_lsh_block_size_does_not_change_result():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 70, 8).unbind(0)
    pos = torch.arange(70)[None].expand(2, -1)
    allowed = torch.tril(torch.ones(70, 70, dtype=torch.bool))[None, None].expand(2, 1, -1, -1)
    w, u = sample_bins(alibi_slopes(4), 8, torch.Generator().manual_seed(3))
    a = lsh_attention(q, k, v, pos, pos, allowed, w, u, block=7)
    b = lsh_attention(q, k, v, pos, pos, allowed, w, u, block=128)
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_lsh_window_stays_local():
    """No block looks further back than the widest bin: near-linear work (no T x T)."""
    w, u = sample_bins(alibi_slopes(4), 16, torch.Generator().manual_seed(0))
    assert w.max() < 4000  # sigma <= 1/m_min = 16 for 4 heads; Gamma(2, 16) tails stay far below 4000
    torch.manual_seed(0)
    T = 4096
    q = k = v = torch.randn(1, 4, T, 8)
    pos = torch.arange(T)[None]
    allowed = torch.ones(1, 1, T, T, dtype=torch.bool).tril()
    seen = []
    orig = torch.matmul

    def spy(a, b):
        seen.append(b.shape[-1] if b.shape[-2] == 8 else 0)
        return orig(a, b)

    torch.matmul = spy
    try:
        lsh_attention(q, k, v, pos, pos, allowed, w, u, block=128)
    finally:
        torch.matmul = orig
    widest = max(seen)
    assert widest <= 128 + math.ceil(w.max().item()) + 1 < T


def test_training_resamples_eval_is_fixed():
    torch.manual_seed(0)
    m = LctxForCausalLM(tiny_config("alibi_lsh", variant_options={"lsh_samples": 4}))
    var = m.model.layers[0].attn.variant
    m.eval()
    assert torch.equal(var.bins()[0], var.bins()[0])
    m.train()
    assert not torch.equal(var.bins()[0], var.bins()[0])
    other_layer = m.model.layers[1].attn.variant
    m.eval()
    assert not torch.equal(var.bins()[0], other_layer.bins()[0])  # seed + layer index


def test_max_bin_width_grows_like_sigma_log_s():
    # Seed 003 (Theorem 2.1, "Contrôle de la Taille des Blocs"): "l'analyse borne la taille maximale des
    # blocs contigus (b_max) avec une haute probabilité, montrant b_max ≈ σ log log n", with s growing
    # logarithmically in n (Theorem 2.2: "à condition que le nombre d'échantillons s évolue
    # logarithmiquement avec la longueur du contexte n"), i.e. b_max ≈ σ log s. The width of each sampled
    # binning is Gamma(2, sigma), P(W > x) = (1 + x/sigma) e^(-x/sigma), so the largest of s widths is
    # sigma (log s + log log s + O(1)): E[b_max] / sigma is computed here by integrating 1 - F(x)^s (hand
    # computation of the exact expectation) and compared with the mean over 400 draws of s binnings.
    def exact(s):
        x = torch.linspace(0, 80, 80001, dtype=torch.float64)
        return torch.trapezoid(1 - (1 - (1 + x) * torch.exp(-x)) ** s, x).item()

    ss = (4, 16, 64, 256, 1024)
    means = {}
    for sigma in (4.0, 64.0):
        for s in ss:
            w, _ = sample_bins(torch.tensor([1 / sigma]), 400 * s, torch.Generator().manual_seed(s))
            means[sigma, s] = w.view(400, s).amax(1).mean().item()  # 400 independent sets of s binnings
            assert means[sigma, s] / sigma == pytest.approx(exact(s), rel=0.05), (sigma, s)
        # linear in sigma: b_max / sigma does not depend on sigma (widths are sigma x a Gamma(2, 1) draw)
    for s in ss:
        assert means[4.0, s] / 4.0 == pytest.approx(means[64.0, s] / 64.0, rel=1e-9)
    # growth like sigma log s: each 4x more samples adds about sigma log 4 (1 + 1/log s from log log s)
    for a, b in zip(ss, ss[1:]):
        step = (means[64.0, b] - means[64.0, a]) / (64.0 * math.log(4))
        assert 0.95 < step < 1.35, (a, b, step)
    # and b_max / (sigma log s) falls toward 1 as s grows
    r = [means[64.0, s] / (64.0 * math.log(s)) for s in ss]
    assert all(x > y for x, y in zip(r, r[1:])) and 1.0 < r[-1] < 1.5


def test_largest_block_of_positions_follows_the_largest_width():
    # b_max as the seed counts it: the longest run of integer positions sharing a bin (the blocks the
    # reduction of Theorem 2.2 attends within). A bin [b delta + u, (b+1) delta + u) holds floor(delta) or
    # ceil(delta) integers, so over positions 0..n-1 (n >> widths) the longest run over s binnings is
    # within 1 token of the largest width, and it grows with s like sigma log s (seed 003, as above).
    sigma, n = 8.0, 1024
    longest = {}
    for s in (4, 64, 1024):
        per_draw = []
        for seed in range(6):
            w, u = sample_bins(torch.tensor([1 / sigma]), s, torch.Generator().manual_seed(seed))
            b = bin_ids(torch.arange(n)[None], w, u)[0, :, 0]  # [s, n], non-decreasing along n
            rel = b - b[:, :1]
            nb = int(rel.max()) + 1
            sizes = torch.bincount((rel + nb * torch.arange(s)[:, None]).flatten(), minlength=s * nb).view(s, nb)
            last = rel[:, -1]
            interior = sizes.clone()
            interior[:, 0] = 0  # the first and last runs are cut by the ends of 0..n-1
            interior[torch.arange(s), last] = 0
            per_draw.append(interior.max().item())
            assert abs(per_draw[-1] - w.max().item()) <= 1.0, (s, seed, per_draw[-1], w.max().item())
        longest[s] = sum(per_draw) / len(per_draw)
    assert longest[4] < longest[64] < longest[1024], longest
    # Hand computation for the widths lctx samples (Gamma(2, sigma), models/lsh.py sample_bins): P(W > x sigma) =
    # (1 + x) e^-x, so the largest of s widths sits near sigma y with s (1 + y) e^-y = 1, i.e. y = log s +
    # log(1 + y) (log s + log log s to first order, the seed's b_max), and its mean is sigma (y + Euler's gamma)
    # (Gumbel limit; 9.84 sigma at s = 1024). The mean of 6 draws has a standard error of about
    # (pi / sqrt 6) / sqrt 6 = 0.52 sigma; +-1.6 sigma is three of them plus the 1-token rounding of a run.
    y = 8.0
    for _ in range(100):
        y = math.log(1024) + math.log(1 + y)
    assert abs(longest[1024] / sigma - (y + 0.5772)) < 1.6, (longest, y)
