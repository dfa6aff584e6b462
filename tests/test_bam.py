"""GGD-BAM prior and Scalable-Softmax (seed 000): identities with ALiBi/NoPE, inverted prior, SSMax n_i."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import LctxForCausalLM, alibi_slopes, get_variant
from lctx.models.bam import GGDPrior, SSMax

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
    # Issue 3: prefill of 6 tokens scales by log 1..log 6; a decode step at cache length 4 by log 4.
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
    m = LctxForCausalLM(tiny_config(variant, variant_options={"ggd_learn_mu": True}))
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
