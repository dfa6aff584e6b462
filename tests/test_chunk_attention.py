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

The FlexAttention form of the split (the CUDA path) runs eagerly here against the same reference, each tolerance
derived beside its assertion, with controls (the past part dropped from the merge, the window one token wider);
its block masks, which the eager form does not read, are checked against the elementwise mask. The compiled form
is the ``gpu``-marked test, run on CUDA by the GPU check.
"""

from __future__ import annotations

import math

import pytest
import torch

from lctx.kernels.chunk_attention import (band_block_mask, can_split, chunk_attention, chunk_attention_reference,
                                          chunk_mask, flex_split_attention, merge_two)

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


# -- the split through FlexAttention (the CUDA form), eagerly on CPU -----------------------------------------------
# eager FlexAttention on purpose: compiled FlexAttention on CPU cannot return the log-sum-exp in torch 2.13, and the
# eager form's dense math path is what checks the split's maths here; the compiled form runs on CUDA (test below)
flex_eager = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")

SPLIT_CASES = [(16, 48, None), (130, 300, None), (7, 100, None), (24, 56, 8), (20, 52, 16), (130, 300, 70),
               (32, 32, 8), (5, 9, 16), (40, 200, 1)]  # later chunks, > 1 block of 128, windows dividing and not, w=1


def _fp32_tol(Tk: int, v: torch.Tensor) -> float:
    """Summation-order bound of two float32 softmax attentions over the same <= Tk keys: |o| <= max |v| and a sum
    of Tk float32 terms is within Tk * eps relative (eps = 2^-23), so Tk * eps * max |v| (observed ~ 1e-2 of it)."""
    return Tk * torch.finfo(torch.float32).eps * float(v.abs().max())


@flex_eager
@pytest.mark.parametrize("Tq,Tk,window", SPLIT_CASES)
def test_flex_split_equals_reference(Tq, Tk, window):
    q, k, v = _qkv(2, 3, Tq, Tk, 16, seed=Tq + Tk)
    ref = chunk_attention_reference(q, k, v, window=window)
    out = flex_split_attention(q, k, v, window=window, compile=False)
    tol = _fp32_tol(Tk, v)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert (out - ref).abs().max() <= tol
    past = Tk - Tq
    if past > 0 and (window is None or window > 1):  # control: a merge that loses the past part is far off
        own_only = flex_split_attention(q, k[:, :, past:], v[:, :, past:], window=window, compile=False)
        assert (own_only - ref).abs().max() > 100 * tol
    if window is not None and window < Tk:  # control: the window one token wider is far off
        wider = flex_split_attention(q, k, v, window=window + 1, compile=False)
        assert (wider - ref).abs().max() > 100 * tol


@flex_eager
def test_flex_split_bfloat16():
    q, k, v = _qkv(1, 2, 40, 104, 16, seed=3, dtype=torch.bfloat16)
    for window in (None, 8):
        ref = chunk_attention_reference(q.float(), k.float(), v.float(), window=window)  # the rounded inputs, fp32
        out = flex_split_attention(q, k, v, window=window, compile=False)
        # bf16 rounds each part's output (|o| <= max |v|) and the merged one (|o| = |ref|) to 8 bits: half an ulp is
        # 2^-9 relative each, so 2^-9 (max|v| + |ref|) bounds the sum; twice that for the eager kernel's own rounding
        tol = 2 ** -8 * float(v.float().abs().max() + ref.abs().max())
        assert out.dtype == torch.bfloat16 and (out.float() - ref).abs().max() <= tol
        # control: the chunk read as if its queries started one key earlier (each loses its own key) is far off
        shifted = chunk_attention_reference(q.float(), k[:, :, :-1].float(), v[:, :, :-1].float(), window=window)
        assert (out.float() - shifted).abs().max() > 2 * tol


@pytest.mark.parametrize("Tq,Tk,offset,window", [(200, 300, 100, None), (300, 300, 0, 64), (256, 511, 511, 200),
                                                 (129, 127, 127, 128), (1000, 1000, 0, 300), (5, 9, 4, 16)])
def test_band_block_mask_matches_the_elementwise_mask(Tq, Tk, offset, window):
    """The block mask built by arithmetic skips no allowed pair and marks full only all-allowed blocks (checked
    against the elementwise mask), and equals the one ``create_block_mask`` derives from that mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    bm = band_block_mask(Tq, Tk, offset, window)
    B = 128
    qi = torch.arange(Tq)[:, None] + offset
    kj = torch.arange(Tk)[None, :]
    allowed = (kj <= qi) & ((qi - kj < window) if window is not None else True)
    nq, nk = -(-Tq // B), -(-Tk // B)
    pad = torch.zeros(nq * B, nk * B, dtype=torch.bool)
    pad[:Tq, :Tk] = allowed
    blocks = pad.view(nq, B, nk, B)
    some, every = blocks.any(3).any(1), blocks.all(3).all(1)
    dense = bm.to_dense()[0, 0].bool()  # partial or full
    assert torch.equal(dense, some)
    full = torch.zeros(nq, nk, dtype=torch.bool)
    for r in range(nq):
        full[r, bm.full_kv_indices[0, 0, r, :bm.full_kv_num_blocks[0, 0, r]].long()] = True
    assert not (full & ~every).any()  # a full block has every pair allowed (its mask_mod is skipped)

    def mask_mod(b, h, q, k):
        m = k <= q + offset
        return m & (q + offset - k < window) if window is not None else m

    ref = create_block_mask(mask_mod, None, None, Tq, Tk, device="cpu")
    assert torch.equal(bm.kv_num_blocks, ref.kv_num_blocks) and torch.equal(bm.full_kv_num_blocks,
                                                                            ref.full_kv_num_blocks)
    # control: the same band one token off marks other blocks
    assert not torch.equal(band_block_mask(Tq, Tk, offset + 128, window).to_dense(), bm.to_dense())


def test_can_split_routes_cuda_to_the_flex_split():
    """CPU and CUDA take the unmasked split for the float dtypes (CUDA through FlexAttention), other dtypes and
    devices the masked SDPA call (a stand-in object: only the device type and dtype are read)."""
    from types import SimpleNamespace

    def like(dev, dtype):
        return SimpleNamespace(device=torch.device(dev), dtype=dtype)

    assert can_split(like("cpu", torch.float32)) and can_split(like("cuda", torch.bfloat16))
    assert not can_split(like("cuda", torch.float64)) and not can_split(like("meta", torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled FlexAttention split runs on CUDA")
@pytest.mark.parametrize("Tq,Tk,window", [(256, 1024, None), (300, 1500, None), (256, 1024, 100), (512, 512, 64),
                                          (5, 700, None), (5, 700, 64)])  # + a few queries (FlexAttention's decode form)
def test_cuda_chunk_attention_runs_the_compiled_split(Tq, Tk, window):
    q, k, v = (t.cuda() for t in _qkv(1, 4, Tq, Tk, 64, seed=Tk))
    ref = chunk_attention_reference(q, k, v, window=window)
    out = chunk_attention(q, k, v, window=window)  # CUDA: the compiled flex split
    # FlexAttention's float32 dot products may run in tf32 (10-bit mantissa) on a GPU: each logit q.k/sqrt(D) is then
    # off by up to 2^-10 |q||k|/sqrt(D) ~ 2^-10 sqrt(D) for randn rows, and the output by that times 2 max|v|
    tf32_tol = 2 ** -10 * math.sqrt(64) * 2 * float(v.abs().max())
    assert (out - ref).abs().max() <= max(_fp32_tol(Tk, v), tf32_tol)
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    refb = chunk_attention_reference(qb.float(), kb.float(), vb.float(), window=window)
    outb = chunk_attention(qb, kb, vb, window=window)
    tol = 2 ** -8 * float(vb.float().abs().max() + refb.abs().max())  # as test_flex_split_bfloat16
    assert (outb.float() - refb).abs().max() <= tol
    if window is not None:  # control
        assert (chunk_attention(qb, kb, vb, window=window + 1).float() - refb).abs().max() > tol
