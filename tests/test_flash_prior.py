"""lctx.kernels.flash_prior: the fused prior-attention kernel against the dense reference, op by op and
through the whole model. On CPU the Triton kernel runs under TRITON_INTERPRET=1 (set by conftest) in
fp32; FlexAttention runs eagerly (its math path) except in one compiled forward check."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.kernels import impls_used, triton_runs
from lctx.kernels.flash_prior import (PriorSpec, dense_prior_attention, flash_prior_blocked, flash_prior_flex,
                                      flash_prior_triton, merge_lse)
from lctx.kernels.lsh_blocks import bin_starts, lsh_attention_blocked, lsh_attention_flex, lsh_attention_triton
from lctx.models import LctxForCausalLM

from helpers import tiny_config

CPU_TRITON = triton_runs("cpu")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # compiled Triton on a GPU, else interpreted
needs_triton = pytest.mark.skipif(not CPU_TRITON and not torch.cuda.is_available(),
                                  reason="triton cannot run here (no GPU and TRITON_INTERPRET unset)")
# every test here runs its kernels on DEV: compiled on a GPU, so the GPU check runs the whole module (-m gpu)
pytestmark = pytest.mark.gpu


def ggd_prior(H: int, g=None):
    """A GGD-BAM prior (models/bam.py, the variant's own module) moved off its ALiBi initialisation, so that
    1/alpha, beta (negative too) and mu all matter."""
    from lctx.models.bam import GGDPrior

    g = g or torch.Generator().manual_seed(0)
    prior = GGDPrior(H, learn_mu=True)
    with torch.no_grad():
        prior.theta_alpha.copy_(torch.log(torch.rand(H, generator=g) + 0.1))
        prior.beta.copy_(torch.randn(H, generator=g))
        prior.theta_mu.copy_(torch.randn(H, generator=g))
    return prior.to(DEV)


def make_spec(kind: str, H: int, ssmax: bool = False, scale_bias: bool = False, g=None) -> PriorSpec:
    """A spec as the variants build it: ALiBi with random slopes, or a GGD prior (the models' functions)."""
    from lctx.models.variants import alibi_bias

    g = g or torch.Generator().manual_seed(0)
    slopes = (torch.rand(H, generator=g) + 0.05).to(DEV)
    bias = {"none": None, "alibi": lambda d: alibi_bias(slopes, d), "ggd": ggd_prior(H, g).bias}[kind]
    return PriorSpec(kind=kind, bias=bias, ssmax=(torch.rand(H, generator=g) + 0.5).to(DEV) if ssmax else None,
                     scale_bias=scale_bias)


def qkv(B, H, Tq, past, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Tq, D, generator=g).to(DEV), torch.randn(B, H, past + Tq, D, generator=g).to(DEV),
            torch.randn(B, H, past + Tq, D, generator=g).to(DEV))


@needs_triton
@pytest.mark.parametrize("T", [1, 17, 64, 127, 128, 129, 257])
@pytest.mark.parametrize("kind", ["none", "alibi", "ggd"])
def test_triton_matches_dense_reference(T, kind):
    # lengths around the block sizes (16/64) are where masking bugs hide; 3 heads, head dim 12 (not 2^k)
    q, k, v = qkv(1, 3, T, 0, 12, seed=T)
    spec = make_spec(kind, 3, ssmax=(T % 2 == 1))
    o_ref, lse_ref = dense_prior_attention(q, k, v, spec)
    o, lse = flash_prior_triton(q, k, v, spec)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=1e-4)


@needs_triton
@pytest.mark.parametrize("past,Tq", [(40, 1), (63, 2), (100, 29)])
def test_triton_with_past_keys_and_ssmax_scaled_bias(past, Tq):
    # decode (Tq = 1) and chunked prefill: query i sits at key index past + i
    q, k, v = qkv(2, 2, Tq, past, 16, seed=past)
    spec = make_spec("ggd", 2, ssmax=True, scale_bias=True)
    o_ref, lse_ref = dense_prior_attention(q, k, v, spec, past=past)
    o, lse = flash_prior_triton(q, k, v, spec, past=past)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=1e-4)


@needs_triton
def test_triton_windows_and_merge():
    # W = 3 windowed attentions in one launch; merging them by log-sum-exp equals one softmax over the
    # union of keys with multiplicity (sum of numerators / sum of denominators), computed here by hand
    T, H = 90, 2
    q, k, v = qkv(1, H, T, 0, 16, seed=3)
    g = torch.Generator().manual_seed(1)
    ks = torch.minimum(torch.randint(0, T, (3, H, T), generator=g), torch.arange(T)).to(DEV)
    spec = PriorSpec("none")
    o_ref, lse_ref = dense_prior_attention(q, k, v, spec, kstart=ks)
    o, lse = flash_prior_triton(q, k, v, spec, kstart=ks)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=1e-4)
    merged = merge_lse(o, lse)
    i, j = torch.arange(T, device=DEV)[:, None], torch.arange(T, device=DEV)[None, :]
    count = sum(((j <= i) & (j >= ks[w][:, :, None])).double() for w in range(3))  # [H, T, T]
    e = torch.exp(q.double() @ k.double().transpose(-1, -2) / 4.0) * count
    by_hand = (e @ v.double()) / e.sum(-1, keepdim=True)
    torch.testing.assert_close(merged.double(), by_hand, atol=1e-5, rtol=1e-4)


# eager FlexAttention on purpose (its dense math path is what this test checks), so torch's advice to compile it
# does not apply here
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
@pytest.mark.parametrize("kind", ["none", "alibi", "ggd"])
def test_flex_eager_matches_dense_reference(kind):
    # the score_mod / mask_mod definitions, checked through FlexAttention's eager math path
    q, k, v = qkv(1, 3, 33, 7, 16, seed=5)
    spec = make_spec(kind, 3, ssmax=True)
    ks = torch.minimum(torch.randint(0, 30, (2, 3, 33)), torch.arange(33) + 7).to(DEV)
    o_ref, lse_ref = dense_prior_attention(q, k, v, spec, past=7, kstart=ks)
    o, lse = flash_prior_flex(q, k, v, spec, past=7, kstart=ks, compile=False)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(lse, lse_ref, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU path; on a GPU the Triton kernel is the fast path")
def test_flex_compiled_forward_on_cpu():
    # the FlexAttention alternative compiled on CPU (the fast path on CUDA for training)
    q, k, v = qkv(1, 2, 160, 0, 16, seed=9)
    spec = make_spec("ggd", 2, ssmax=True)  # the GGD score_mod (pow of a per-head exponent) compiles
    o_ref, _ = dense_prior_attention(q, k, v, spec)
    with torch.inference_mode():  # compiled flex on CPU: inference only, no log-sum-exp
        o, lse = flash_prior_flex(q, k, v, spec, need_lse=False)
    assert lse is None
    torch.testing.assert_close(o, o_ref, atol=1e-4, rtol=1e-4)


def test_ggd_with_beta_one_is_alibi_in_kernel_terms():
    # BAM eq.: beta = 1, mu = 0, 1/alpha = m gives ALiBi's -m d for d >= 0 up to a constant: the paper's
    # form -(m |d| + eps) is -m d - eps, the reference code's -m (|d| + eps) is -m d - m eps (hand)
    from lctx.models.bam import GGDPrior
    from lctx.models.variants import alibi_bias

    m = torch.tensor([0.5, 0.25])
    d = torch.arange(10.0)
    for form, const in (("paper", torch.full((2, 1), 1e-5)), ("reference", 1e-5 * m[:, None])):
        prior = GGDPrior(2, form=form)
        with torch.no_grad():
            prior.theta_alpha.copy_(torch.log(m))
        torch.testing.assert_close(PriorSpec("ggd", bias=prior.bias).table(10, 2, "cpu"),
                                   alibi_bias(m, d) - const, atol=1e-6, rtol=1e-6)


def test_toeplitz_table_is_the_reference_bias_on_the_diagonals():
    # the table b_h[d] the fast paths read equals the reference's Tq x Tk bias at every (i, j) with
    # i - j = d: for ALiBi (variants.py) and GGD (bam.py, through the variant's own prior_spec)
    from lctx.models.variants import get_variant

    for variant in ("alibi", "ggd_bam"):
        cfg = tiny_config(variant, variant_options={"ggd_shared": False} if variant == "ggd_bam" else {})
        mod = get_variant(variant)(cfg, 0)
        if variant == "ggd_bam":
            mod.prior = ggd_prior(cfg.num_attention_heads).cpu()
        pos = torch.arange(50)[None]
        ref = mod.score_bias(pos[:, 30:], pos, None)[0]  # [H, 20, 50]: queries 30..49 against keys 0..49
        tbl = mod.prior_spec(None).table(50, cfg.num_attention_heads, "cpu")
        i, j = torch.arange(30, 50)[:, None], torch.arange(50)[None, :]
        ok = j <= i
        # the same function on the same distances: equal up to float32 rounding (pow's vector vs scalar lanes)
        torch.testing.assert_close(tbl[:, (i - j).clamp_min(0)][:, ok], ref[:, ok], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("form", ["reference", "paper", "legacy"])
def test_every_fast_path_computes_the_ggd_prior_module_of_each_form(form):
    # the GGD-BAM prior as the model's reference computes it (GGDPrior.forward, issue 12's forms) against
    # the dense kernel reference, the blocked CPU path, eager FlexAttention and (where it runs) Triton
    from lctx.models.bam import GGDPrior

    H, T, past = 3, 45, 20
    g = torch.Generator().manual_seed(4)
    prior = GGDPrior(H, learn_mu=True, form=form)
    with torch.no_grad():
        prior.theta_alpha.add_(0.5 * torch.randn(H, generator=g))
        prior.beta.copy_(torch.randn(H, generator=g))
        prior.theta_mu.copy_(torch.randn(H, generator=g))
    ss = torch.rand(H, generator=g) + 0.5
    q, k, v = qkv(1, H, T, past, 8, seed=11)
    for scale_bias in (True, False):
        spec = PriorSpec("ggd", bias=prior.to(DEV).bias, ssmax=ss.to(DEV), scale_bias=scale_bias)
        i = torch.arange(past, past + T)
        bias = prior(i[None], torch.arange(past + T)[None])[0].detach().to(DEV)  # [H, T, Tk]
        c = (ss[:, None] * torch.log((i + 1).float())[None]).to(DEV)[:, :, None]  # [H, T, 1]
        logits = c * (q @ k.transpose(-1, -2)) / math.sqrt(8) + (c * bias if scale_bias else bias)
        ok = (torch.arange(past + T)[None, :] <= i[:, None]).to(DEV)
        want = torch.softmax(logits.masked_fill(~ok, float("-inf")), -1) @ v
        torch.testing.assert_close(dense_prior_attention(q, k, v, spec, past=past)[0][0], want, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(flash_prior_blocked(q, k, v, spec, past=past, block=16), want,
                                   atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(flash_prior_flex(q, k, v, spec, past=past, compile=False)[0][0], want,
                                   atol=2e-5, rtol=1e-4)
        if CPU_TRITON or torch.cuda.is_available():
            torch.testing.assert_close(flash_prior_triton(q, k, v, spec, past=past)[0][0], want, atol=2e-5, rtol=1e-4)


FAST_VARIANTS = ["nope", "rope", "alibi", "sinusoidal", "ggd_bam", "ggd_bam+ssmax", "rope+ssmax", "alibi+ssmax",
                 "acc_rot"]


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("variant", FAST_VARIANTS)
def test_model_fast_equals_reference_prefill_and_decode(variant):
    # whole model: attn_impl="fast" (Triton under the interpreter) vs the dense reference, for one prefill
    # and for chunked prefill + decode through the KV cache
    opts = {"ggd_shared": False} if variant == "ggd_bam" else {}
    torch.manual_seed(0)
    ref = LctxForCausalLM(tiny_config(variant, attn_impl="reference", variant_options=opts)).eval()
    if "ggd" in variant:  # move the prior off its ALiBi initialisation so beta and mu matter
        with torch.no_grad():
            for n, p in ref.named_parameters():
                if n.endswith(("beta", "theta_alpha")):
                    p.add_(0.3 * torch.randn_like(p))
    fast = LctxForCausalLM(tiny_config(variant, attn_impl="fast", variant_options=opts)).eval()
    fast.load_state_dict(ref.state_dict())
    ref, fast = ref.to(DEV), fast.to(DEV)
    ids = torch.randint(3, 200, (1, 37)).to(DEV)
    impls_used(reset=True)
    with torch.no_grad():
        want = ref(ids).logits
        got = fast(ids).logits
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert impls_used().get(variant) == "triton"
        out = fast(ids[:, :20], use_cache=True)
        cache, steps = out.cache, [out.logits]
        steps.append(fast(ids[:, 20:36], cache=cache, use_cache=True).logits)
        steps.append(fast(ids[:, 36:37], cache=cache, use_cache=True).logits)
        torch.testing.assert_close(torch.cat(steps, 1), want, atol=1e-4, rtol=1e-4)


def test_fast_falls_back_for_padding_and_gradients():
    # left padding (positions != key index) and training on CPU use the reference maths, same numbers
    torch.manual_seed(0)
    ref = LctxForCausalLM(tiny_config("alibi", attn_impl="reference")).eval()
    fast = LctxForCausalLM(tiny_config("alibi", attn_impl="fast")).eval()
    fast.load_state_dict(ref.state_dict())
    ids = torch.randint(3, 200, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        torch.testing.assert_close(fast(ids, attention_mask=mask).logits, ref(ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)
    loss = fast(ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None for p in fast.parameters() if p.requires_grad)
    assert math.isfinite(loss.item())


# -- alibi_lsh fast paths ----------------------------------------------------------------------------

def _lsh_case(T, past, H=3, s=4, seed=0):
    from lctx.models.lsh import sample_bins
    from lctx.models.variants import alibi_slopes

    widths, offsets = sample_bins(alibi_slopes(H) * 4, s, torch.Generator().manual_seed(seed))  # ~bins of 2-60
    q, k, v = qkv(1, H, T, past, 16, seed=seed)
    return q, k, v, widths.to(DEV), offsets.to(DEV)


def _lsh_reference(q, k, v, widths, offsets, past):
    from lctx.models.lsh import lsh_attention

    Tq, Tk = q.shape[2], k.shape[2]
    pos = torch.arange(Tk, device=q.device)[None]
    allowed = (pos[0][None, :] <= pos[0][past:, None])[None, None]
    return lsh_attention(q, k, v, pos[:, past:], pos, allowed, widths, offsets, block=32)


def test_bin_starts_match_reference_bins():
    # kstart_r(i) is the first position sharing i's bin: every j in [kstart, i] shares it, kstart-1 not
    from lctx.models.lsh import bin_ids

    q, k, v, widths, offsets = _lsh_case(300, 0, s=8)
    pos = torch.arange(300, device=DEV)
    ks = bin_starts(pos, widths, offsets)
    b = bin_ids(pos[None], widths, offsets)[0]  # [s, H, T]
    for r in range(8):
        for h in range(3):
            for i in range(0, 300, 7):
                st = int(ks[r, h, i])
                assert (b[r, h, st:i + 1] == b[r, h, i]).all()
                assert st == 0 or b[r, h, st - 1] != b[r, h, i]


@needs_triton
@pytest.mark.parametrize("T,past", [(1, 0), (77, 0), (129, 0), (1, 90), (30, 100)])
def test_lsh_triton_matches_reference(T, past):
    q, k, v, widths, offsets = _lsh_case(T, past)
    want = _lsh_reference(q, k, v, widths, offsets, past)
    got = lsh_attention_triton(q, k, v, widths, offsets, past=past)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_lsh_flex_eager_matches_reference():
    q, k, v, widths, offsets = _lsh_case(70, 20)
    want = _lsh_reference(q, k, v, widths, offsets, 20)
    got = lsh_attention_flex(q, k, v, widths, offsets, past=20, compile=False)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
@needs_triton
def test_lsh_model_fast_equals_reference_with_cache():
    torch.manual_seed(0)
    opts = {"lsh_samples": 4}
    ref = LctxForCausalLM(tiny_config("alibi_lsh", attn_impl="reference", variant_options=opts)).eval()
    fast = LctxForCausalLM(tiny_config("alibi_lsh", attn_impl="fast", variant_options=opts)).eval()
    fast.load_state_dict(ref.state_dict())
    ref, fast = ref.to(DEV), fast.to(DEV)
    ids = torch.randint(3, 200, (1, 45)).to(DEV)
    impls_used(reset=True)
    with torch.no_grad():
        want = ref(ids).logits
        out = fast(ids[:, :30], use_cache=True)
        rest = fast(ids[:, 30:], cache=out.cache, use_cache=True).logits
        torch.testing.assert_close(torch.cat([out.logits, rest], 1), want, atol=1e-4, rtol=1e-4)
    assert impls_used()["alibi_lsh"] == "triton"


@pytest.mark.parametrize("kind", ["none", "alibi", "ggd"])
@pytest.mark.parametrize("T,past", [(1, 40), (100, 0), (37, 63)])
def test_blocked_matches_dense_reference(kind, T, past):
    # the CPU fast path; block_bytes small so several query blocks (and a ragged last one) are used
    q, k, v = qkv(2, 3, T, past, 12, seed=T + past)
    spec = make_spec(kind, 3, ssmax=True, scale_bias=(kind == "ggd"))
    o_ref, _ = dense_prior_attention(q, k, v, spec, past=past)
    o = flash_prior_blocked(q, k, v, spec, past=past, block=16)
    torch.testing.assert_close(o, o_ref[0], atol=2e-5, rtol=1e-4)
    if T > 1:  # one block of all queries takes the same route
        torch.testing.assert_close(flash_prior_blocked(q, k, v, spec, past=past, block=T), o_ref[0], atol=2e-5, rtol=1e-4)


def test_blocked_is_differentiable_like_the_reference():
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 40, 0, 8, seed=2))
    from lctx.models.bam import GGDPrior

    prior = GGDPrior(2, form="paper")  # the by-hand dense form below: -(|d| / alpha + eps)^beta
    with torch.no_grad():
        prior.theta_alpha.copy_(torch.log(torch.tensor([0.5, 0.2])))
        prior.beta.copy_(torch.tensor([0.7, 1.3]))
    beta = prior.beta
    spec = PriorSpec("ggd", bias=prior.bias, ssmax=torch.ones(2))
    g1 = torch.autograd.grad(flash_prior_blocked(q, k, v, spec, block=16).sum(), (q, beta))
    # dense by hand with a live beta (BAM's prior with mu = 0, eps = 1e-5; SSMax s = 1)
    i, j = torch.arange(40)[:, None], torch.arange(40)[None, :]
    bias = -torch.pow((i - j).abs().float()[None] * torch.tensor([0.5, 0.2])[:, None, None] + 1e-5, beta[:, None, None])
    logits = torch.log((i + 1).float()) * (q @ k.transpose(-1, -2)) / math.sqrt(8) + bias
    dense = torch.softmax(logits.masked_fill(j > i, float("-inf")), -1) @ v
    g2 = torch.autograd.grad(dense.sum(), (q, beta))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_lsh_blocked_matches_reference():
    q, k, v, widths, offsets = _lsh_case(150, 30, s=6)
    want = _lsh_reference(q, k, v, widths, offsets, 30)
    torch.testing.assert_close(lsh_attention_blocked(q, k, v, widths, offsets, past=30), want, atol=2e-5, rtol=1e-4)


def _cpu_blocked(monkeypatch):
    """Make the model's fast path take its CPU (non-Triton) branch even under the test interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if torch.cuda.is_available():
        pytest.skip("the blocked CPU branch runs on CPU only")


def test_lsh_blocked_default_block_follows_the_bins():
    # the block size is half the mean bin age (clamped to [64, 256]); at one head of slope 2^-8 (sigma
    # 256, bin widths ~ Gamma(2, 256)) that is the cap, and the work is linear in T
    from lctx.kernels.lsh_blocks import lsh_block, lsh_cost
    from lctx.models.lsh import sample_bins
    from lctx.models.variants import alibi_slopes

    w, o = sample_bins(alibi_slopes(1), 16, torch.Generator().manual_seed(0))
    cost = {}
    for T in (8192, 32768):
        ks = bin_starts(torch.arange(T), w, o)
        assert lsh_block(ks) == 256
        cost[T] = lsh_cost(ks, 0)
    assert 3.0 < cost[32768] / cost[8192] < 5.0  # ~4x for 4x the tokens (quadratic would be 16x)


@pytest.mark.parametrize("T,expect", [(256, "lsh-exact-alibi"), (16384, "lsh-blocks")])
def test_lsh_dispatch_estimate(T, expect):
    # exact ALiBi costs T^2/2 scores, LSH about T x (block + bin age) at 2.5x the cost per score: at one
    # head (bins ~512 tokens) exact wins at 256 tokens and LSH at 16K
    from lctx.kernels.lsh_blocks import prefer_exact
    from lctx.models.lsh import sample_bins
    from lctx.models.variants import alibi_slopes

    w, o = sample_bins(alibi_slopes(1), 16, torch.Generator().manual_seed(0))
    assert prefer_exact(bin_starts(torch.arange(T), w, o), 0) == (expect == "lsh-exact-alibi")


def test_lsh_cpu_fast_path_dispatches_to_exact_alibi_and_records_it(monkeypatch):
    # short input on the CPU path: exact ALiBi (the function LSH estimates) runs and is recorded; with
    # lsh_exact_dispatch=false the LSH kernel runs and equals the LSH reference
    _cpu_blocked(monkeypatch)
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (1, 45))
    exact = LctxForCausalLM(tiny_config("alibi", attn_impl="reference")).eval()
    for dispatch, ran in ((True, "lsh-exact-alibi"), (False, "lsh-blocks")):
        opts = {"lsh_samples": 4, "lsh_exact_dispatch": dispatch}
        ref = LctxForCausalLM(tiny_config("alibi_lsh", attn_impl="reference", variant_options=opts)).eval()
        ref.load_state_dict(exact.state_dict())
        fast = LctxForCausalLM(tiny_config("alibi_lsh", attn_impl="fast", variant_options=opts)).eval()
        fast.load_state_dict(exact.state_dict())
        impls_used(reset=True)
        with torch.no_grad():
            want = (exact if dispatch else ref)(ids).logits
            out = fast(ids[:, :30], use_cache=True)
            rest = fast(ids[:, 30:], cache=out.cache, use_cache=True).logits
            torch.testing.assert_close(torch.cat([out.logits, rest], 1), want, atol=1e-4, rtol=1e-4)
        assert impls_used()["alibi_lsh"] == ran


def test_blocked_prior_model_path_records_blocked(monkeypatch):
    # the CPU branch of attend_fast for a Toeplitz prior (GGD + SSMax) through the model and its cache
    _cpu_blocked(monkeypatch)
    torch.manual_seed(0)
    opts = {"ggd_shared": False}
    ref = LctxForCausalLM(tiny_config("ggd_bam+ssmax", attn_impl="reference", variant_options=opts)).eval()
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if n.endswith(("beta", "theta_alpha")):
                p.add_(0.3 * torch.randn_like(p))
    fast = LctxForCausalLM(tiny_config("ggd_bam+ssmax", attn_impl="fast", variant_options=opts)).eval()
    fast.load_state_dict(ref.state_dict())
    ids = torch.randint(3, 200, (1, 300))
    impls_used(reset=True)
    with torch.no_grad():
        want = ref(ids).logits
        out = fast(ids[:, :200], use_cache=True)
        rest = fast(ids[:, 200:], cache=out.cache, use_cache=True).logits
        torch.testing.assert_close(torch.cat([out.logits, rest], 1), want, atol=1e-4, rtol=1e-4)
    assert impls_used()["ggd_bam+ssmax"] == "blocked"
