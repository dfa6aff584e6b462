"""lctx.kernels.chunk_attention (issue 28 items 1-2): a prefill chunk's attention over its KV cache with no
[Tq, Tk] mask, against the explicit fp32 reference; and the Hugging Face attention function ``lctx_sdpa`` that
uses it, on tiny random Llama and Gemma 3 configs (no download): chunked prefill + decode equal one plain
forward, sliding layers keep only their window.

Tolerances. Both sides compute in float32 the same softmax over the same keys; they differ only in summation
order (the flash kernel's blocks, the two-part log-sum-exp merge), so each output is within a few ulp of the
reference times the number of summed terms' growth: |o| <= max |v| (~4 for randn), relative error of a sum of n
fp32 terms <= n * 2^-24 in the worst case, n <= 256 keys here: 4 * 256 * 6e-8 = 6e-5 -> we assert 1e-4 on
attention outputs. Through a 2-6 layer model the logits differ by the same order (observed 4e-7); we assert
2e-4 on logits. Controls: the same comparison with the window moved by one token, or the chunk's causal
alignment shifted, differs by far more (> 1e-2), so the tolerance still catches a real change.
"""

from __future__ import annotations

import pytest
import torch

from lctx.kernels.chunk_attention import chunk_attention, chunk_attention_reference, chunk_mask, merge_two

ATOL_OUT = 1e-4  # attention outputs: fp32 summation-order bound, module docstring
ATOL_LOGITS = 2e-4  # tiny models' logits: the same bound carried through their layers


def _qkv(B, H, Tq, Tk, D, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, t, D, generator=g).to(dtype) for t in (Tq, Tk, Tk))


def test_chunk_mask_by_hand():
    # Tq=2 queries at key indices 2, 3 of Tk=4 keys, window 2: query 2 sees keys 1, 2; query 3 sees 2, 3
    assert chunk_mask(2, 4, 2).tolist() == [[False, True, True, False], [False, False, True, True]]
    assert chunk_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    with pytest.raises(ValueError, match="at least 3 keys"):
        chunk_mask(3, 2)


@pytest.mark.parametrize("Tq,Tk,window", [
    (16, 16, None), (16, 48, None), (1, 40, None), (7, 100, None),  # first chunk, later chunk, decode, odd sizes
    (32, 32, 8), (24, 56, 8), (20, 52, 16), (1, 40, 8), (5, 9, 16),  # sliding: dividing and not, decode, w > Tk
])
def test_equals_reference(Tq, Tk, window):
    q, k, v = _qkv(2, 3, Tq, Tk, 16)
    ref = chunk_attention_reference(q, k, v, window=window)
    out = chunk_attention(q, k, v, window=window)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert (out - ref).abs().max() <= ATOL_OUT
    if Tq > 1 and Tk > Tq:  # control: the chunk read as if its queries started one key earlier differs
        shifted = chunk_attention_reference(q, k[:, :, :-1], v[:, :, :-1], window=window)
        assert (out - shifted).abs().max() > 1e-2
    if window is not None and window < Tk:  # control: a window one token wider differs
        assert (out - chunk_attention_reference(q, k, v, window=window + 1)).abs().max() > 1e-2


def test_scale_and_bfloat16():
    q, k, v = _qkv(1, 2, 12, 40, 8, seed=1)
    ref = chunk_attention_reference(q, k, v, scale=0.05)
    assert (chunk_attention(q, k, v, scale=0.05) - ref).abs().max() <= ATOL_OUT
    assert (chunk_attention(q, k, v) - ref).abs().max() > 1e-2  # control: the default 1/sqrt(8) scale differs
    out16 = chunk_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale=0.05)
    # bfloat16 inputs and output (8-bit mantissa, 2^-8 = 4e-3 relative, |o| <= 4): 0.05 absolute
    assert out16.dtype == torch.bfloat16 and (out16.float() - ref).abs().max() <= 0.05


def test_merge_two_of_disjoint_key_sets():
    # softmax over keys {0, 1} u {2}: merging the two parts' results gives the whole (hand-checkable: 3 keys)
    s = torch.tensor([[0.5, -1.0, 2.0]])
    v = torch.tensor([[1.0], [2.0], [4.0]])
    whole = torch.softmax(s, -1) @ v
    o1 = torch.softmax(s[:, :2], -1) @ v[:2]
    merged = merge_two(o1, torch.logsumexp(s[:, :2], -1), v[2:3].expand(1, 1), s[:, 2])
    assert torch.allclose(merged, whole, atol=1e-6)
    empty = merge_two(o1, torch.logsumexp(s[:, :2], -1), torch.zeros(1, 1), torch.tensor([float("-inf")]))
    assert torch.allclose(empty, o1, atol=1e-6)  # a set with no key (lse -inf) contributes nothing


# -- lctx_sdpa on tiny Hugging Face models ------------------------------------------------------------------------
def _tiny(kind: str):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        return LlamaForCausalLM(cfg).eval()
    # Gemma 3's hybrid pattern (5 sliding layers, then a global one), window 16 tokens
    cfg = Gemma3TextConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                           max_position_embeddings=512)
    return Gemma3ForCausalLM(cfg).eval()


def _adapter(model, chunk):
    from lctx.models.adapters.hf import HFAdapter
    from lctx.models.adapters.hf_attention import register

    model.set_attn_implementation(register())
    return HFAdapter(model=model, tokenizer=None, name="tiny", path="", variant=model.config.model_type,
                     train_length=None, max_length=512, device=torch.device("cpu"), dtype=torch.float32,
                     chunk_size=chunk, attn_impl="hf:lctx_sdpa")


def _plain(model, ids, steps):
    """One eager forward of ``ids`` + ``steps`` greedy tokens, each re-run from scratch (no cache at all):
    logits [T + steps, V]."""
    model.set_attn_implementation("eager")
    x = torch.tensor([ids])
    for _ in range(steps):
        nxt = model(input_ids=x, use_cache=False).logits[0, -1].argmax()
        x = torch.cat([x, nxt.view(1, 1)], 1)
    return model(input_ids=x, use_cache=False).logits[0].float(), x[0, len(ids):].tolist()


@pytest.mark.parametrize("kind,chunks", [("llama", (64, 50, 200)), ("gemma3", (16, 12, 40, 200))])
def test_hf_chunked_prefill_and_decode_equal_one_plain_forward(kind, chunks):
    """Issue 28 item 2: chunked prefill + decode through lctx_sdpa and the config-built cache equal one plain
    eager forward without a cache, at chunk sizes that divide the window (16) and that do not (12, 40)."""
    model = _tiny(kind)
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref, ref_tokens = _plain(model, ids, 4)
    for chunk in chunks:
        lm = _adapter(model, chunk)
        prefix, got = lm.prefill(ids, want=[0, 15, 16, 17, 99, 150])
        for p, lg in got.items():
            assert (lg - ref[p]).abs().max() <= ATOL_LOGITS, (chunk, p)
        assert lm.greedy(prefix, 4, stop_ids=set()) == ref_tokens, chunk
        # rewind past the decoded tokens (a sliding layer must give back the keys they evicted), teacher-force
        scores = lm.continuation_logits(prefix, ref_tokens)
        assert (scores - ref[len(ids) - 1:len(ids) + 3]).abs().max() <= ATOL_LOGITS, chunk
        assert lm.greedy(prefix, 4, stop_ids=set()) == ref_tokens, chunk  # the rewound cache decodes the same
    if kind == "gemma3":  # control: the same prefill with the sliding window removed differs far beyond the tolerance
        model.config.sliding_window = 10_000
        for layer in model.model.layers:
            if layer.self_attn.sliding_window is not None:
                layer.self_attn.sliding_window = 10_000
        _, got = _adapter(model, 40).prefill(ids, want=[150])
        assert (got[150] - ref[150]).abs().max() > 1e-2


def test_hf_sliding_layers_keep_only_their_window_and_no_mask_is_built(monkeypatch):
    """The cache HFAdapter builds from the config keeps window - 1 keys in a sliding layer (O(window)), and
    chunk k > 1 of a causal prefill asks transformers for no mask tensor (lctx_sdpa_mask returns None)."""
    from lctx.models.adapters import hf_attention

    model = _tiny("gemma3")
    lm = _adapter(model, 32)
    built = []
    real = hf_attention.mu.sdpa_mask
    monkeypatch.setattr(hf_attention.mu, "sdpa_mask", lambda **kw: built.append(kw["q_length"]) or real(**kw))
    ids = list(range(1, 97)) + list(range(1, 5))  # 100 tokens: 4 chunks
    with torch.no_grad():
        prefix, _ = lm.prefill(ids)
    assert built == []  # no chunk asked transformers for a mask
    lens = [layer.keys.shape[-2] for layer in prefix.cache.layers]
    sliding = [i for i, t in enumerate(model.config.layer_types) if t == "sliding_attention"]
    assert all(lens[i] == 15 for i in sliding) and lens[5] == 100  # window - 1 kept; the global layer keeps all


def test_hf_padding_gets_transformers_mask():
    """A padded key is not implicit: the mask function hands it to transformers' sdpa_mask (a tensor)."""
    from transformers import masking_utils as mu

    from lctx.models.adapters.hf_attention import lctx_sdpa_mask

    kw = dict(batch_size=1, q_length=4, kv_length=8, q_offset=4, kv_offset=0, mask_function=mu.causal_mask_function,
              allow_is_causal_skip=True, device="cpu", config=None)
    assert lctx_sdpa_mask(**kw, attention_mask=torch.ones(1, 8, dtype=torch.bool)) is None
    pad = torch.tensor([[False] + [True] * 7])
    mask = lctx_sdpa_mask(**kw, attention_mask=pad)
    assert mask is not None and mask.shape == (1, 1, 4, 8) and not mask[..., 0].any()
    assert lctx_sdpa_mask(**{**kw, "kv_length": 12}) is not None  # keys past the last query (a static cache)
