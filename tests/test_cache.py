"""PreallocatedKVCache: in-place chunked prefill gives the same logits as DynamicCache, grows past its
capacity, crops like DynamicCache, and the LM adapter uses it for lctx models."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache

from lctx.models import LctxForCausalLM
from lctx.models.cache import PreallocatedKVCache

from helpers import tiny_config


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["rope", "alibi", "ggd_bam+ssmax", "path", "interdomain"])
def test_chunked_prefill_and_decode_match_dynamic_cache(variant):
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config(variant)).eval()
    ids = torch.randint(3, 200, (1, 40))
    with torch.no_grad():
        logits = {}
        for name, cache in (("dyn", DynamicCache()), ("pre", PreallocatedKVCache(capacity=24))):
            outs = [model(ids[:, a:b], cache=cache, use_cache=True).logits for a, b in ((0, 16), (16, 32))]
            outs += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(32, 40)]  # grows
            logits[name] = torch.cat(outs, 1)
    torch.testing.assert_close(logits["pre"], logits["dyn"], atol=1e-6, rtol=1e-6)


def test_grow_and_crop():
    c = PreallocatedKVCache(capacity=4)
    k = torch.arange(6.0).view(1, 1, 6, 1)
    kk, vv = c.update(k[:, :, :3], -k[:, :, :3], 0)
    assert kk.shape[2] == 3 and c.nbytes() == 2 * 4 * 4  # 2 buffers x 4 tokens x fp32
    kk, vv = c.update(k[:, :, 3:], -k[:, :, 3:], 0)
    assert c.get_seq_length() == 6 and torch.equal(kk, k) and torch.equal(vv, -k)
    c.crop(-2)  # DynamicCache convention: a negative count removes that many tokens
    assert c.get_seq_length() == 4
    kk, _ = c.update(torch.full((1, 1, 1, 1), 9.0), torch.zeros(1, 1, 1, 1), 0)
    assert kk[0, 0, :, 0].tolist() == [0, 1, 2, 3, 9]
    with pytest.raises(ValueError):
        c.crop(10)


def test_lm_prefill_uses_preallocated_cache(make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    ids = lm.with_bos(list(range(10, 60)))
    prefix, _ = lm.prefill(ids)
    assert isinstance(prefix.cache, PreallocatedKVCache)
    assert prefix.cache.keys[0].shape[2] == len(ids) + lm.decode_budget
    out = lm.greedy(prefix, 5)
    lm.rewind(prefix)
    assert prefix.cache.get_seq_length() == len(ids) and len(out) >= 1
