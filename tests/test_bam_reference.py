"""GGD-BAM and SSMax against ports of the BAM reference code (issue 12, fidelity fixes 1-3).

The ports below copy the reference's formulas line for line from github.com/ArthurSBianchessi/BAM at
commit 5a6579d ("sinusoidal ssmax fix (inference)"):

- ``models/bam_ssmax.py`` lines 87-106 (``AttentionPrior.forward``): b = positions[None, :] - positions[:, None]
  (so b[i, j] = j - i), b = b - (loc.exp() - (-loc).exp()), return -((b.abs() + eps) ** shape) * scale.exp();
- ``models/bam_ssmax.py`` lines 173-184 (``BayesianAttention.forward`` with ``ssmax_prior=True``): scores =
  q k^T / sqrt(D); scores = scores + prior; scores = scores * (section_log_len * seq_scale);
- ``models/alibi_ssmax.py`` lines 90-94 and 193: scores = q k^T / sqrt(D) * (log_len * seq_scale), then + the
  ALiBi mask -(|j - i|) * slopes (content only);
- ``train.py`` lines 306-318: weight decay only on parameters with ``p.squeeze().dim() >= 2`` that are not the
  prior (tested in test_train.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import LctxConfig, LctxForCausalLM, alibi_slopes, get_variant
from lctx.models.bam import GGDPrior, ggd_bias
from lctx.models.variants import AttnContext

from helpers import tiny_config


def ref_attention_prior(seq_len, scale, shape, loc, eps=1e-5):
    """Port of BAM models/bam_ssmax.py AttentionPrior.forward (lines 87-106); scale/shape/loc [1, H, 1, 1]."""
    positions = torch.arange(seq_len).float()
    b = (positions[None, :] - positions[:, None]).reshape(1, 1, seq_len, seq_len)
    b = b - (loc.exp() - (-loc).exp())
    return -((b.abs() + eps) ** shape) * scale.exp()


def ref_bam_ssmax_probs(q, k, prior, seq_scale):
    """Port of BAM models/bam_ssmax.py BayesianAttention.forward, ssmax_prior=True (lines 173-189)."""
    T = q.shape[2]
    section_log_len = torch.tril(torch.ones((1, 1, T, T)), diagonal=0).sum(-1, keepdim=True).log()
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
    scores = scores + prior
    scores = scores * (section_log_len * seq_scale)
    return torch.softmax((scores + mask).float(), dim=-1)


def ref_alibi_ssmax_probs(q, k, slopes, seq_scale):
    """Port of BAM models/alibi_ssmax.py (attention lines 90-94, mask line 193): content-only SSMax."""
    T = q.shape[2]
    section_log_len = torch.tril(torch.ones((1, 1, T, T)), diagonal=0).sum(-1, keepdim=True).log()
    positions = torch.arange(T).float()
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    mask = mask + (-(positions[None, :] - positions[:, None]).abs() * slopes)
    scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
    scores = scores * (section_log_len * seq_scale)
    return torch.softmax((scores + mask).float(), dim=-1)


def random_prior(H=4, form="reference", seed=0):
    g = torch.Generator().manual_seed(seed)
    p = GGDPrior(H, learn_mu=True, form=form)
    with torch.no_grad():
        p.theta_alpha.add_(0.5 * torch.randn(H, generator=g))
        p.beta.copy_(torch.randn(H, generator=g))
        p.theta_mu.copy_(0.7 * torch.randn(H, generator=g))
    return p


def causal(T):
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


# -- fix 2: the reference's parameterisation is the default ------------------------------------------

def test_default_form_is_the_reference_attention_prior():
    # GGDPrior (default form) == the ported AttentionPrior with scale = theta_alpha, shape = beta, loc = theta_mu
    p = random_prior()
    assert p.form == "reference"
    T = 50
    pos = torch.arange(T)[None]
    got = p(pos, pos)[0]
    r = lambda t: t.detach().reshape(1, -1, 1, 1)  # noqa: E731
    want = ref_attention_prior(T, r(p.theta_alpha), r(p.beta), r(p.theta_mu))[0]
    m = causal(T)
    torch.testing.assert_close(got[:, m], want[:, m], rtol=1e-5, atol=1e-5)


def test_paper_and_legacy_forms_by_hand():
    # paper (seed 000's equation for B, eps inside): -(|(j - i - mu) / alpha| + eps)^beta;
    # legacy (lctx before issue 12): -(|(i - j - mu) / alpha| + eps)^beta
    T = 30
    i, j = torch.arange(T)[:, None].float(), torch.arange(T)[None, :].float()
    for form, sign in (("paper", 1.0), ("legacy", -1.0)):
        p = random_prior(form=form, seed=3)
        a = p.alpha.detach()[:, None, None]
        mu, beta = p.mu.detach()[:, None, None], p.beta.detach()[:, None, None]
        want = -(((sign * (j - i) - mu) / a).abs() + 1e-5) ** beta
        got = p(torch.arange(T)[None], torch.arange(T)[None])[0]
        torch.testing.assert_close(got[:, causal(T)], want[:, causal(T)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d,ref_grad,paper_grad", [(10, -0.0899, 0.1267), (100, -1.7989, 0.3672)])
def test_beta_gradient_sign_of_each_form(d, ref_grad, paper_grad):
    # issue 12's table at 1/alpha = 1/256, beta = 1: db/dbeta = -(1/256) d ln d (reference) against
    # -(d/256) ln(d/256) (paper's scale inside the power): opposite signs (hand computation)
    for form, want in (("reference", ref_grad), ("paper", paper_grad)):
        p = GGDPrior(1, form=form)
        with torch.no_grad():
            p.theta_alpha.fill_(math.log(1 / 256))
        p.bias(torch.tensor([float(d)])).sum().backward()
        assert p.beta.grad.item() == pytest.approx(want, abs=1e-3), form


def test_self_token_bias_at_negative_beta():
    # j = i, beta = -0.5: reference -e^theta eps^beta = -(1/256) * 316.2; paper/legacy -(eps)^beta = -316.2
    for form, scale in (("reference", 1 / 256), ("paper", 1.0), ("legacy", 1.0)):
        p = GGDPrior(1, form=form)
        with torch.no_grad():
            p.theta_alpha.fill_(math.log(1 / 256))
            p.beta.fill_(-0.5)
        assert p.bias(torch.zeros(1)).item() == pytest.approx(-scale * (1e-5) ** -0.5, rel=1e-5)


def test_one_function_makes_the_distance_table():
    # a Toeplitz table b_h[d] is one call, and the T x T bias is that table indexed by i - j
    p = random_prior(seed=5)
    T = 40
    table = ggd_bias(torch.arange(T).float()[None], *(t[:, None] for t in p.kernel_params()), p.eps)  # [H, T]
    torch.testing.assert_close(table, p.bias(torch.arange(T)))
    full = p(torch.arange(T)[None], torch.arange(T)[None])[0]
    d = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp_min(0)
    torch.testing.assert_close(full[:, causal(T)], table[:, d][:, causal(T)])


# -- fix 3: mu's sign and per-layer priors -----------------------------------------------------------

def test_mu_sign_follows_the_paper():
    # paper: |j - i - mu|; mu = -5 puts the prior's peak 5 tokens back (j = i - 5). legacy had i - j - mu.
    for form, mu, peak in (("reference", -5.0, 5), ("paper", -5.0, 5), ("legacy", 5.0, 5), ("reference", 5.0, 0)):
        p = GGDPrior(1, learn_mu=True, form=form)
        with torch.no_grad():
            p.theta_mu.fill_(math.asinh(mu / 2))
        b = p.bias(torch.arange(20).float())[0]
        assert int(b.argmax()) == peak, (form, mu)


def test_prior_is_per_layer_by_default_as_the_paper_counts():
    # seed 000: 384 prior parameters for the 120M model = 2 (alpha, beta) x 12 layers x 16 heads
    cfg = LctxConfig(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, variant="ggd_bam")
    assert cfg.variant_options["ggd_shared"] is False and cfg.variant_options["ggd_form"] == "reference"
    m = LctxForCausalLM(cfg)
    assert m.model.variant_shared is None
    assert m.variant_parameter_count() == 2 * 3 * 4
    shared = LctxForCausalLM(tiny_config("ggd_bam", num_hidden_layers=3, variant_options={"ggd_shared": True}))
    assert shared.variant_parameter_count() == 2 * 4


# -- fix 1: SSMax placement -------------------------------------------------------------------------

def _variant_out(variant_name, cfg, q, k, v):
    T = q.shape[2]
    pos = torch.arange(T)[None]
    var = get_variant(variant_name)(cfg, 0)
    return var, AttnContext(q_pos=pos, k_pos=pos, allowed=causal(T)[None, None])


def test_ggd_bam_ssmax_scales_the_whole_logit_as_the_reference():
    torch.manual_seed(0)
    T, H, D = 24, 4, 8
    q, k, v = torch.randn(3, 1, H, T, D).unbind(0)
    cfg = tiny_config("ggd_bam+ssmax", attn_impl="reference")
    assert cfg.variant_options["ssmax_scale_bias"] is True
    var, ctx = _variant_out("ggd_bam+ssmax", cfg, q, k, v)
    with torch.no_grad():
        var.prior.theta_alpha.add_(0.4 * torch.randn(H))
        var.prior.beta.copy_(torch.randn(H))
        var.ssmax_scale.copy_(torch.rand(H) + 0.5)
    r = lambda t: t.detach().reshape(1, -1, 1, 1)  # noqa: E731
    prior = ref_attention_prior(T, r(var.prior.theta_alpha), r(var.prior.beta), r(var.prior.theta_mu))
    want = ref_bam_ssmax_probs(q, k, prior, r(var.ssmax_scale)) @ v
    torch.testing.assert_close(var(q, k, v, ctx), want, rtol=1e-5, atol=1e-5)


def test_alibi_ssmax_stays_content_only_as_the_reference():
    torch.manual_seed(1)
    T, H, D = 24, 4, 8
    q, k, v = torch.randn(3, 1, H, T, D).unbind(0)
    cfg = tiny_config("alibi+ssmax", attn_impl="reference")
    assert cfg.variant_options["ssmax_scale_bias"] is False
    var, ctx = _variant_out("alibi+ssmax", cfg, q, k, v)
    with torch.no_grad():
        var.ssmax_scale.copy_(torch.rand(H) + 0.5)
    want = ref_alibi_ssmax_probs(q, k, alibi_slopes(H).float().reshape(1, H, 1, 1),
                                 var.ssmax_scale.detach().reshape(1, H, 1, 1)) @ v
    torch.testing.assert_close(var(q, k, v, ctx), want, rtol=1e-5, atol=1e-5)


def test_scale_bias_option_still_switches_placement():
    cfg = tiny_config("ggd_bam+ssmax", variant_options={"ssmax_scale_bias": False})
    assert get_variant("ggd_bam+ssmax")(cfg, 0).scale_bias is False
    cfg = tiny_config("alibi+ssmax", variant_options={"ssmax_scale_bias": True})
    assert get_variant("alibi+ssmax")(cfg, 0).scale_bias is True


@pytest.mark.parametrize("n,want_ref,want_content_only", [(256, 5.7e-2, 0.37), (2048, 2.1e-2, 0.60),
                                                          (16384, 7.5e-3, 0.60)])
def test_prior_only_far_mass_sharpens_with_length(n, want_ref, want_content_only):
    # issue 12's table: prior-only attention (q.k = 0) of the last query, slowest ALiBi-initialised head
    # (1/alpha = 1/256), mass on keys farther than 128 tokens, with s = 1
    cfg = tiny_config("ggd_bam+ssmax", num_attention_heads=1, hidden_size=8, attn_impl="reference")
    mass = {}
    for scale_bias in (True, False):
        var = get_variant("ggd_bam+ssmax")(LctxConfig(**{**cfg.to_dict(), "variant_options": {
            **cfg.variant_options, "ssmax_scale_bias": scale_bias}}), 0)
        with torch.no_grad():
            var.prior.theta_alpha.fill_(math.log(1 / 256))
        q_pos, k_pos = torch.tensor([[n - 1]]), torch.arange(n)[None]
        torch.set_grad_enabled(False)
        c = var.logit_scale(q_pos, None)[0, 0, 0, 0]
        b = var.prior(q_pos, k_pos)[0, 0, 0].double()
        w = torch.softmax(c * b if scale_bias else b, -1)
        mass[scale_bias] = float(w[(n - 1 - torch.arange(n)) > 128].sum())
        torch.set_grad_enabled(True)
    assert mass[True] == pytest.approx(want_ref, rel=0.03)
    assert mass[False] == pytest.approx(want_content_only, abs=0.01)


def test_whole_model_reference_form_matches_the_port_layer_by_layer():
    # a 1-layer ggd_bam+ssmax model: its attention output equals the ported BayesianAttention
    torch.manual_seed(2)
    cfg = tiny_config("ggd_bam+ssmax", num_hidden_layers=1, attn_impl="reference")
    m = LctxForCausalLM(cfg).eval()
    blk = m.model.layers[0]
    var = blk.attn.variant
    with torch.no_grad():
        var.prior.beta.copy_(torch.tensor([-0.5, 0.2, 0.7, 1.3]))
    x = blk.attn_norm(m.model.embed_tokens(torch.randint(3, 300, (1, 30))))
    heads = lambda t: t.view(1, 30, 4, 8).transpose(1, 2)  # noqa: E731
    q, k, v = heads(blk.attn.q_proj(x)), heads(blk.attn.k_proj(x)), heads(blk.attn.v_proj(x))
    r = lambda t: t.detach().reshape(1, -1, 1, 1)  # noqa: E731
    prior = ref_attention_prior(30, r(var.prior.theta_alpha), r(var.prior.beta), r(var.prior.theta_mu))
    want = blk.attn.o_proj((ref_bam_ssmax_probs(q, k, prior, r(var.ssmax_scale)) @ v).transpose(1, 2).reshape(1, 30, 32))
    pos = torch.arange(30)[None]
    got = blk.attn(x, AttnContext(q_pos=pos, k_pos=pos, allowed=causal(30)[None, None]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
