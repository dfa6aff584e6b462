"""lctx.models.bam: the GGD-BAM prior and Scalable-Softmax. Identities with ALiBi/NoPE, the inverted prior,
SSMax's n_i (seed 000); and GGD-BAM and SSMax against ports of the BAM reference code (the form, per-layer priors and
SSMax placement of the reference; the ports and their provenance are below, "Ports of the BAM reference code")."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import LctxConfig, LctxForCausalLM, alibi_slopes, get_variant
from lctx.models.bam import GGDPrior, SSMax, ggd_bias
from lctx.models.variants import AttnContext

from helpers import tiny_config


def copy_weights(dst, src):
    """Load src's weights into dst where names match (the positional parameters differ)."""
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    assert all("variant" in n or "prior" in n or "ssmax" in n for n in missing + unexpected)
    return dst


def test_ggd_beta_one_equals_alibi_with_slope_inverse_alpha():
    # Seed 000 / SPEC: beta = 1 is ALiBi with slope 1/alpha (the eps shift is removed by the softmax).
    torch.manual_seed(0)
    alibi = LctxForCausalLM(tiny_config("alibi", attn_impl="reference")).eval()
    ids = torch.randint(0, 400, (2, 30))
    for form in ("reference", "paper", "legacy"):  # mu = 0: the three forms agree at beta = 1
        for shared in (False, True):
            opts = {"ggd_form": form, "ggd_shared": shared}
            ggd = copy_weights(LctxForCausalLM(tiny_config("ggd_bam", attn_impl="reference", variant_options=opts)),
                               alibi).eval()
            prior = ggd.model.variant_shared if shared else ggd.model.layers[1].attn.variant.prior
            assert torch.allclose(prior.beta, torch.ones(4))  # initialised as ALiBi
            assert torch.allclose(1 / prior.alpha, alibi_slopes(4).float())
            assert torch.allclose(ggd(ids).logits, alibi(ids).logits, atol=1e-5)
            with torch.no_grad():  # a different alpha is no longer this ALiBi
                prior.theta_alpha.add_(1.0)
            assert not torch.allclose(ggd(ids).logits, alibi(ids).logits, atol=1e-3)


def test_ggd_beta_zero_equals_nope():
    torch.manual_seed(0)
    nope = LctxForCausalLM(tiny_config("nope")).eval()
    ggd = copy_weights(LctxForCausalLM(tiny_config("ggd_bam")), nope).eval()
    with torch.no_grad():  # b_ij = -e^theta (...)^0 = -e^theta_h everywhere: a constant per head
        for blk in ggd.model.layers:
            blk.attn.variant.prior.beta.zero_()
    ids = torch.randint(0, 400, (2, 30))
    assert torch.allclose(ggd(ids).logits, nope(ids).logits, atol=1e-5)


@pytest.mark.parametrize("form", ["reference", "paper"])
def test_ggd_negative_beta_puts_prior_mass_far(form):
    prior = GGDPrior(1, form=form)
    with torch.no_grad():
        prior.beta.fill_(-0.5)
        prior.theta_alpha.zero_()  # alpha = 1
    i = 100
    b = prior(torch.tensor([[i]]), torch.arange(i + 1)[None])[0, 0, 0]  # over keys j = 0..i
    assert torch.isfinite(b).all()  # j = i is finite: -(eps)^beta
    assert b[i].item() == pytest.approx(-(1e-5) ** -0.5, rel=1e-4)
    w = torch.softmax(b.double(), -1)
    d = i - torch.arange(i + 1)
    near, far = w[d <= i // 2].sum(), w[d > i // 2].sum()
    assert far > near
    assert w[i] < 1e-100  # the query's own token is suppressed
    # beta in (0, 1): a heavier tail than ALiBi (beta = 1) at the same alpha
    with torch.no_grad():
        prior.beta.fill_(0.5)
    heavy = torch.softmax(prior(torch.tensor([[i]]), torch.arange(i + 1)[None])[0, 0, 0].double(), -1)
    with torch.no_grad():
        prior.beta.fill_(1.0)
    laplace = torch.softmax(prior(torch.tensor([[i]]), torch.arange(i + 1)[None])[0, 0, 0].double(), -1)
    assert heavy[d > 10].sum() > laplace[d > 10].sum()


def test_ggd_prior_param_count_shared_and_per_layer():
    shared = LctxForCausalLM(tiny_config("ggd_bam", num_hidden_layers=3, variant_options={"ggd_shared": True}))
    per_layer = LctxForCausalLM(tiny_config("ggd_bam", num_hidden_layers=3))  # the default (paper: 2 L H)

    def n_prior(m):
        return sum(p.numel() for n, p in m.named_parameters() if p.requires_grad and ("prior" in n or "variant_shared" in n))

    assert n_prior(shared) == shared.variant_parameter_count() == 2 * 4  # 2 per head (alpha, beta), mu frozen
    assert n_prior(per_layer) == per_layer.variant_parameter_count() == 2 * 4 * 3


def capture_scales(model, ids, cache=None):
    """Run the model and return the SSMax multipliers c [B, H, Tq] of layer 0."""
    got = []
    variant = model.model.layers[0].attn.variant
    orig = variant.logit_scale

    def spy(q_pos, ctx):
        c = orig(q_pos, ctx)
        got.append(c[..., 0])
        return c

    variant.logit_scale = spy
    try:
        out = model(ids, cache=cache, use_cache=True)
    finally:
        variant.logit_scale = orig
    return got[0], out


def test_ssmax_scales_by_log_visible_keys_per_query():
    # a prefill of 6 tokens scales by log 1..log 6; a decode step at cache length 4 by log 4.
    torch.manual_seed(0)
    m = LctxForCausalLM(tiny_config("rope+ssmax")).eval()
    with torch.no_grad():
        m.model.layers[0].attn.variant.ssmax_scale.copy_(torch.tensor([1.0, 2.0, 0.5, 1.0]))
    c, _ = capture_scales(m, torch.randint(0, 400, (1, 6)))
    expect = torch.tensor([1.0, 2.0, 0.5, 1.0])[:, None] * torch.log(torch.arange(1, 7).float())[None]
    assert torch.allclose(c[0], expect, atol=1e-6)
    _, out = capture_scales(m, torch.randint(0, 400, (1, 3)))
    c, _ = capture_scales(m, torch.randint(0, 400, (1, 1)), cache=out.cache)
    assert torch.allclose(c[0, :, 0], torch.tensor([1.0, 2.0, 0.5, 1.0]) * math.log(4), atol=1e-6)


@pytest.mark.parametrize("base", ["rope", "alibi", "ggd_bam"])
def test_ssmax_with_unit_multiplier_is_the_base_variant(base, monkeypatch):
    # s_h log n_i = 1 everywhere: make n_i = e and s_h = 1.
    torch.manual_seed(0)
    plain = LctxForCausalLM(tiny_config(base)).eval()
    ss = copy_weights(LctxForCausalLM(tiny_config(base + "+ssmax")), plain).eval()
    monkeypatch.setattr(SSMax, "visible_keys", lambda self, q_pos: torch.full(q_pos.shape, math.e))
    ids = torch.randint(0, 400, (2, 20))
    assert torch.allclose(ss(ids).logits, plain(ids).logits, atol=1e-5)
    monkeypatch.undo()
    assert not torch.allclose(ss(ids).logits, plain(ids).logits, atol=1e-3)


def test_ssmax_scale_bias_option_matches_hand_formula():
    # with ssmax_scale_bias the logits are c * (q.k/sqrt(D) + b); alibi's default is c * q.k/sqrt(D) + b
    # (reference alibi_ssmax.py)
    cfg = tiny_config("alibi+ssmax", attn_impl="reference")
    cfg_b = tiny_config("alibi+ssmax", attn_impl="reference", variant_options={"ssmax_scale_bias": True})
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 4, 5, 8).unbind(0)
    pos = torch.arange(5)[None]
    from lctx.models.variants import AttnContext

    allowed = torch.tril(torch.ones(5, 5, dtype=torch.bool))[None, None]
    ctx = AttnContext(q_pos=pos, k_pos=pos, allowed=allowed)
    slopes = alibi_slopes(4).float()[None, :, None, None]
    bias = -slopes * (pos[0][:, None] - pos[0][None, :]).float()
    c = torch.log(torch.arange(1, 6).float())[None, None, :, None]
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    for config, logits in ((cfg, c * s + bias), (cfg_b, c * (s + bias))):
        var = get_variant("alibi+ssmax")(config, 0)
        want = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1) @ v
        assert torch.allclose(var(q, k, v, ctx), want, atol=1e-5)


@pytest.mark.parametrize("variant", ["ggd_bam", "ggd_bam+ssmax", "rope+ssmax"])
def test_gradients_reach_prior_parameters(variant):
    torch.manual_seed(0)
    # rope+ssmax takes no ggd_* option (the typed option schema refuses it)
    m = LctxForCausalLM(tiny_config(variant, variant_options={"ggd_learn_mu": True} if "ggd" in variant else {}))
    ids = torch.randint(0, 400, (2, 16))
    m(ids, labels=ids).loss.backward()
    names = [n for n, p in m.named_parameters() if "prior" in n or "variant_shared" in n or "ssmax" in n]
    assert names
    for n, p in m.named_parameters():
        if n in names:
            assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_unknown_modifier_and_noncomposable():
    with pytest.raises(KeyError, match="modifier"):
        get_variant("rope+sssmax")
    with pytest.raises(KeyError, match="unknown attention variant"):
        get_variant("ropey+ssmax")


# --- Ports of the BAM reference code (prior form, per-layer priors, SSMax placement) -------------------------------------------------
#
# The ports below copy the reference's formulas line for line from github.com/ArthurSBianchessi/BAM at
# commit 5a6579d ("sinusoidal ssmax fix (inference)"):
#
# - ``models/bam_ssmax.py`` lines 87-106 (``AttentionPrior.forward``): b = positions[None, :] - positions[:, None]
#   (so b[i, j] = j - i), b = b - (loc.exp() - (-loc).exp()), return -((b.abs() + eps) ** shape) * scale.exp();
# - ``models/bam_ssmax.py`` lines 173-184 (``BayesianAttention.forward`` with ``ssmax_prior=True``): scores =
#   q k^T / sqrt(D); scores = scores + prior; scores = scores * (section_log_len * seq_scale);
# - ``models/alibi_ssmax.py`` lines 90-94 and 193: scores = q k^T / sqrt(D) * (log_len * seq_scale), then + the
#   ALiBi mask -(|j - i|) * slopes (content only);
# - ``train.py`` lines 306-318: weight decay only on parameters with ``p.squeeze().dim() >= 2`` that are not the
#   prior (tested in test_train.py).

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


def test_default_form_is_the_reference_attention_prior():
    """GGDPrior's default form is the reference's AttentionPrior."""
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
    """The paper's and lctx's former forms stay available, by hand."""
    # paper (seed 000's equation for B, eps inside): -(|(j - i - mu) / alpha| + eps)^beta;
    # legacy (lctx's form before it followed the reference): -(|(i - j - mu) / alpha| + eps)^beta
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
    """The sign of db/dbeta of each form, as worked out by hand below."""
    # by hand at 1/alpha = 1/256, beta = 1: db/dbeta = -(1/256) d ln d (reference) against
    # -(d/256) ln(d/256) (paper's scale inside the power): opposite signs (hand computation)
    for form, want in (("reference", ref_grad), ("paper", paper_grad)):
        p = GGDPrior(1, form=form)
        with torch.no_grad():
            p.theta_alpha.fill_(math.log(1 / 256))
        p.bias(torch.tensor([float(d)])).sum().backward()
        assert p.beta.grad.item() == pytest.approx(want, abs=1e-3), form


def test_self_token_bias_at_negative_beta():
    """The self-token bias at a negative beta of each form."""
    # j = i, beta = -0.5: reference -e^theta eps^beta = -(1/256) * 316.2; paper/legacy -(eps)^beta = -316.2
    for form, scale in (("reference", 1 / 256), ("paper", 1.0), ("legacy", 1.0)):
        p = GGDPrior(1, form=form)
        with torch.no_grad():
            p.theta_alpha.fill_(math.log(1 / 256))
            p.beta.fill_(-0.5)
        assert p.bias(torch.zeros(1)).item() == pytest.approx(-scale * (1e-5) ** -0.5, rel=1e-5)


def test_one_function_makes_the_distance_table():
    """One function (ggd_bias) makes the Toeplitz distance table and the T x T bias."""
    # a Toeplitz table b_h[d] is one call, and the T x T bias is that table indexed by i - j
    p = random_prior(seed=5)
    T = 40
    table = ggd_bias(torch.arange(T).float()[None], *(t[:, None] for t in p.kernel_params()), p.eps)  # [H, T]
    torch.testing.assert_close(table, p.bias(torch.arange(T)))
    full = p(torch.arange(T)[None], torch.arange(T)[None])[0]
    d = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp_min(0)
    torch.testing.assert_close(full[:, causal(T)], table[:, d][:, causal(T)])


def test_mu_sign_follows_the_paper():
    """mu's sign follows the paper (|j - i - mu|)."""
    # paper: |j - i - mu|; mu = -5 puts the prior's peak 5 tokens back (j = i - 5). legacy had i - j - mu.
    for form, mu, peak in (("reference", -5.0, 5), ("paper", -5.0, 5), ("legacy", 5.0, 5), ("reference", 5.0, 0)):
        p = GGDPrior(1, learn_mu=True, form=form)
        with torch.no_grad():
            p.theta_mu.fill_(math.asinh(mu / 2))
        b = p.bias(torch.arange(20).float())[0]
        assert int(b.argmax()) == peak, (form, mu)


def test_prior_is_per_layer_by_default_as_the_paper_counts():
    """The prior is per layer by default, as the paper counts its parameters."""
    # seed 000: 384 prior parameters for the 120M model = 2 (alpha, beta) x 12 layers x 16 heads
    cfg = LctxConfig(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, variant="ggd_bam")
    assert cfg.variant_options["ggd_shared"] is False and cfg.variant_options["ggd_form"] == "reference"
    m = LctxForCausalLM(cfg)
    assert m.model.variant_shared is None
    assert m.variant_parameter_count() == 2 * 3 * 4
    shared = LctxForCausalLM(tiny_config("ggd_bam", num_hidden_layers=3, variant_options={"ggd_shared": True}))
    assert shared.variant_parameter_count() == 2 * 4


def _variant_out(variant_name, cfg, q, k, v):
    T = q.shape[2]
    pos = torch.arange(T)[None]
    var = get_variant(variant_name)(cfg, 0)
    return var, AttnContext(q_pos=pos, k_pos=pos, allowed=causal(T)[None, None])


def test_ggd_bam_ssmax_scales_the_whole_logit_as_the_reference():
    """ggd_bam+ssmax scales the whole logit (content and prior), as the reference."""
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
    """alibi+ssmax scales the content only, as the reference."""
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
    """The ssmax_scale_bias option still switches where the scale goes."""
    cfg = tiny_config("ggd_bam+ssmax", variant_options={"ssmax_scale_bias": False})
    assert get_variant("ggd_bam+ssmax")(cfg, 0).scale_bias is False
    cfg = tiny_config("alibi+ssmax", variant_options={"ssmax_scale_bias": True})
    assert get_variant("alibi+ssmax")(cfg, 0).scale_bias is True


@pytest.mark.parametrize("n,want_ref,want_content_only", [(256, 5.7e-2, 0.37), (2048, 2.1e-2, 0.60),
                                                          (16384, 7.5e-3, 0.60)])
def test_prior_only_far_mass_sharpens_with_length(n, want_ref, want_content_only):
    """Prior-only attention's far mass at 256-2048 tokens, against values computed by hand."""
    # prior-only attention (q.k = 0) of the last query, slowest ALiBi-initialised head
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
    """A whole ggd_bam+ssmax model matches the ported BayesianAttention."""
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


@pytest.mark.parametrize("form,alpha,beta,mu", [("reference", 450.0, 0.51, 0.0), ("reference", 8.0, 1.0, 0.0),
                                                  ("paper", 30.0, 2.0, 0.0), ("paper", 16.0, 0.7, 5.0),
                                                  ("legacy", 4.0, 1.5, -3.0)])
def test_fall_distance_is_where_the_bias_table_drops_delta(form, alpha, beta, mu):
    """fall_distance is the smallest causal distance whose bias is delta nats below the peak
    over d >= 0, checked against GGDPrior.bias on a table of distances (float64 comparisons; the table's step is
    1 token, so the closed form lies between the last distance above and the first at or below peak - delta).
    Hand value: reference form, alpha 450, beta 0.5, mu 0 falls 1 nat at 450^2 = 202,500 tokens."""
    import math

    import torch

    from lctx.models.bam import GGDPrior, fall_distance

    p = GGDPrior(1, learn_mu=True, form=form)
    with torch.no_grad():
        p.theta_alpha.fill_(-math.log(alpha))
        p.beta.fill_(beta)
        p.theta_mu.fill_(math.asinh(mu / 2))
    amp, ainv, b, m = (float(t.detach().double()[0]) for t in p.kernel_params())
    for delta in (0.5, 1.0, 3.0):
        d = fall_distance(amp, ainv, b, m, p.eps, delta)
        with torch.no_grad():
            table = p.bias(torch.arange(int(d) + 3, dtype=torch.float64))[0].double()
        peak = float(table.max())
        first = int(torch.nonzero(table <= peak - delta + 1e-9)[0])
        assert first - 1 <= d <= first + 1e-6, (form, delta, d, first)
    assert fall_distance(1 / 450, 1.0, 0.5, 0.0, 1e-5) == pytest.approx(202500.0, rel=1e-4)
    assert fall_distance(1 / 450, 1.0, 0.0, 0.0, 1e-5) == math.inf == fall_distance(1.0, 1.0, -0.4, 0.0, 1e-5)
    with pytest.raises(ValueError, match="delta must be > 0"):
        fall_distance(1.0, 1.0, 1.0, 0.0, 1e-5, 0.0)


def test_beta_init_linear_is_the_reference_shape_init():
    """``ggd_beta_init=linear`` starts beta at linspace(0, 1, H) in every layer, as the BAM reference's
    ``shape_init='linear'`` (models/bam_ssmax.py AttentionPrior: ``torch.linspace(0, 1, n_heads)``); head 0 then starts
    flat (beta 0: a constant bias, NoPE within that head), the last as ALiBi (beta 1). ``ones`` (the default) is the
    control: every beta 1. Unknown names are refused."""
    lin = LctxForCausalLM(tiny_config("ggd_bam+ssmax", variant_options={"ggd_beta_init": "linear"}))
    ones = LctxForCausalLM(tiny_config("ggd_bam+ssmax"))
    want = torch.tensor([0.0, 1 / 3, 2 / 3, 1.0])
    tol = 4 * torch.finfo(torch.float32).eps  # linspace's float32 rounding of k/3
    for blk_l, blk_o in zip(lin.model.layers, ones.model.layers):
        assert (blk_l.attn.variant.prior.beta - want).abs().max() <= tol
        assert torch.equal(blk_o.attn.variant.prior.beta, torch.ones(4))
    # head 0's bias is constant over distance (beta 0), the last head's grows with it (beta 1)
    bias = lin.model.layers[0].attn.variant.prior.bias(torch.arange(8))
    assert bias[0].max() - bias[0].min() <= tol and bias[3, 7] < bias[3, 0] - 1e-3
    with pytest.raises(ValueError, match="ggd_beta_init must be one of ones, linear"):
        GGDPrior(4, beta_init="random")
