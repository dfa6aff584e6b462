"""lctx.models.model, the native decoder (LctxForCausalLM): KV-cache correctness, chunked prefill, padding,
sdpa against the reference path, save/load, the loss."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import VARIANTS, LctxForCausalLM

from helpers import tiny_config

# every registered variant, plus the Scalable-Softmax compositions the seeds use
ALL_VARIANTS = sorted(VARIANTS) + ["ggd_bam+ssmax", "rope+ssmax", "alibi+ssmax"]


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
