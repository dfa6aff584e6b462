"""lctx.models.model, the native decoder (LctxForCausalLM): KV-cache correctness, chunked prefill, padding,
sdpa against the reference path, save/load, the loss."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import VARIANTS, LctxForCausalLM, alibi_slopes, get_variant
from lctx.models.variants import reference_attention

from helpers import tiny_config

# every registered variant, plus the Scalable-Softmax compositions the seeds use
ALL_VARIANTS = sorted(VARIANTS) + ["ggd_bam+ssmax", "rope+ssmax", "alibi+ssmax"]


def test_alibi_slopes_8_heads():
    # Press et al. 2022: for 8 heads the slopes are 1/2, 1/4, ..., 1/256.
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)], dtype=torch.float64))


def test_alibi_slopes_12_heads_reference_interleave():
    # ofirpress/attention_with_linear_biases get_slopes(12): the 8-head slopes, then every other
    # 16-head slope: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 = 0.7071, 0.3536, 0.1768, 0.0884 (issue 2).
    s = alibi_slopes(12)
    assert torch.allclose(s[:8], alibi_slopes(8))
    assert torch.allclose(s[8:], torch.tensor([0.7071, 0.3536, 0.1768, 0.0884], dtype=torch.float64), atol=1e-4)


def test_alibi_bias_sign_row_weights():
    # Hand computation: row 3 of a 4-token causal softmax, uniform scores, slope 0.5:
    # softmax(-1.5, -1, -0.5, 0) = 0.1015, 0.1674, 0.2760, 0.4551.
    cfg = tiny_config("alibi", hidden_size=64, num_attention_heads=8)  # head 0 slope = 0.5
    alibi = get_variant("alibi")(cfg, 0)
    pos = torch.arange(4)[None]
    bias = alibi.score_bias(pos, pos, None)
    q = torch.zeros(1, 8, 4, 4)
    v = torch.eye(4).expand(1, 8, 4, 4)  # one-hot values: the output row is the attention row
    allowed = torch.tril(torch.ones(4, 4, dtype=torch.bool))[None, None]
    w = reference_attention(q, q.clone(), v, allowed, bias)[0, 0, 3]
    assert torch.allclose(w, torch.tensor([0.1015, 0.1674, 0.2760, 0.4551]), atol=1e-4)


def test_rope_scores_depend_only_on_relative_position():
    cfg = tiny_config("rope")
    rope = get_variant("rope")(cfg, 0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        return (rope.rotate(q, torch.tensor([[i]])) * rope.rotate(k, torch.tensor([[j]]))).sum()

    assert torch.allclose(score(7, 3), score(1004, 1000), atol=1e-5)
    assert not torch.allclose(score(7, 3), score(7, 5), atol=1e-3)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("impl", ["reference", "sdpa"])
def test_prefill_equals_prefill_plus_decode(variant, impl):
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config(variant, attn_impl=impl)).eval()
    ids = torch.randint(0, 400, (2, 23))
    n, k = 23, 6
    full = model(ids).logits
    out = model(ids[:, : n - k], use_cache=True)
    cache, steps = out.cache, [out.logits]
    for t in range(n - k, n):
        out = model(ids[:, t : t + 1], cache=cache)
        steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5), variant


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_chunked_prefill_equals_one_pass(variant):
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config(variant)).eval()
    ids = torch.randint(0, 400, (1, 40))
    full = model(ids).logits
    out = model(ids[:, :16], use_cache=True)
    cache, parts = out.cache, [out.logits]
    for s in (16, 32):
        out = model(ids[:, s : s + 16], cache=cache)
        parts.append(out.logits)
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_padded_batch_equals_unpadded(variant):
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config(variant)).eval()
    a, b = torch.randint(3, 400, (1, 12)), torch.randint(3, 400, (1, 7))
    batch = torch.zeros(2, 12, dtype=torch.long)
    mask = torch.zeros(2, 12, dtype=torch.long)
    batch[0], mask[0] = a[0], 1
    batch[1, 5:], mask[1, 5:] = b[0], 1  # left padding
    out = model(batch, attention_mask=mask).logits
    assert torch.allclose(out[0], model(a).logits[0], atol=1e-5)
    assert torch.allclose(out[1, 5:], model(b).logits[0], atol=1e-5)
    assert torch.isfinite(out).all()  # padding rows stay finite (no all-masked softmax)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_sdpa_path_matches_reference(variant):
    torch.manual_seed(0)
    ref = LctxForCausalLM(tiny_config(variant, attn_impl="reference")).eval()
    fast = LctxForCausalLM(tiny_config(variant, attn_impl="sdpa")).eval()
    fast.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 400, (2, 33))
    assert torch.allclose(ref(ids).logits, fast(ids).logits, atol=1e-5)


def test_logits_to_keep_selects_positions():
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config("alibi")).eval()
    ids = torch.randint(0, 400, (1, 20))
    full = model(ids).logits[0]
    assert torch.allclose(model(ids, logits_to_keep=torch.tensor([3, 11])).logits[0], full[[3, 11]], atol=1e-6)
    assert torch.allclose(model(ids, logits_to_keep=1).logits[0], full[-1:], atol=1e-6)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_save_load_round_trip_auto_model(tmp_path, variant):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config(variant)).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is LctxForCausalLM
    assert AutoConfig.from_pretrained(tmp_path).variant == variant
    ids = torch.randint(0, 400, (2, 17))
    assert torch.equal(model(ids).logits, loaded(ids).logits)  # bit-exact: same weights, same kernels, one process


def test_loss_is_mean_shifted_nll():
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config("nope")).eval()
    ids = torch.randint(0, 400, (1, 10))
    out = model(ids, labels=ids)
    lp = torch.log_softmax(out.logits[0, :-1], -1)
    manual = -lp[torch.arange(9), ids[0, 1:]].mean()
    assert math.isclose(out.loss.item(), manual.item(), rel_tol=1e-5)


def test_unknown_variant_raises():
    # the config refuses it (ValueError), so a checkpoint naming it fails at config.json, not at the weights
    with pytest.raises(ValueError, match="unknown attention variant"):
        LctxForCausalLM(tiny_config("nonesuch"))
