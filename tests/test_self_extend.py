"""--position self_extend (issue 43 items 2, 3, 7): Self-Extend (Jin et al. 2024) through transformers' attention
interface. The kernel's fast path equals its plain reference; the reference equals LongLM's own position arithmetic
transcribed independently (datamllab/LongLM self_extend_patch/Llama.py @ 18950b5, its eager prefill and its decoding
step); on a tiny Llama-shaped model the fast path equals the reference through lctx's chunked prefill, decode and
padded batches; the method took effect exactly beyond the neighbour window; what the layers hold is read back; bad
input is one line."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.errors import LctxError
from lctx.kernels import position_attention as pa
from lctx.models.position import parse_position
from lctx.models.position import _attention
from position_helpers import (all_logits, as_lm, inv_freq_of, kernel_tol, raw_rope, reorder_noise, tiny_gemma3,
                              tiny_llama, token_ids)

D = 16
INV = inv_freq_of(D)


def _raw(B, H, Hkv, Tq, Tk, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Tq, D, generator=g), torch.randn(B, Hkv, Tk, D, generator=g),
            torch.randn(B, Hkv, Tk, D, generator=g))


def _rotated(q_raw, k_raw):
    """q, k as the model hands them to its attention function: rotated at their true positions (the queries the
    last Tq of Tk)."""
    Tq, Tk = q_raw.shape[2], k_raw.shape[2]
    return raw_rope(q_raw, torch.arange(Tk - Tq, Tk), INV), raw_rope(k_raw, torch.arange(Tk), INV)


def _rep(x, n):
    return x.repeat_interleave(n, dim=1)


def longlm_eager(q_raw, k_raw, v, g1, g2):
    """LongLM's ``self_extend_forward`` (datamllab/LongLM self_extend_patch/Llama.py @ 18950b5a), transcribed for the
    two cases it supports (q_len == kv_seq_len: a whole prompt; q_len == 1: a decode step): explicit positions,
    transformers' rotation, ``torch.where(neighbor_attention_mask, neighbor, group)``, one fp32 softmax. Its
    ``_re_group_size_2 / group_size_1`` is written ``//`` here (the same when g1 divides g2, as in these tests)."""
    q_len, kv = q_raw.shape[2], k_raw.shape[2]
    query_position = torch.arange(kv - q_len, kv)
    key_position = query_position if q_len != 1 else torch.arange(kv)
    re = 0 if query_position.max() < g2 else g2
    group_query_position = query_position // g1 + re - re // g1
    group_key_position = key_position // g1
    n = q_raw.shape[1] // k_raw.shape[1]
    nq, gq = raw_rope(q_raw, query_position, INV), raw_rope(q_raw, group_query_position, INV)
    nk, gk = _rep(raw_rope(k_raw, key_position, INV), n), _rep(raw_rope(k_raw, group_key_position, INV), n)
    nw = nq @ nk.transpose(2, 3) / math.sqrt(D)
    gw = gq @ gk.transpose(2, 3) / math.sqrt(D)
    if q_len == 1:
        mask = torch.zeros(q_len, kv)
        mask[:, -g2:] = 1
        causal = torch.zeros(q_len, kv)
    else:
        mask = torch.tril(torch.ones(q_len, kv))
        if q_len - g2 > 0:
            mask[g2:, :-g2] -= torch.tril(torch.ones(q_len - g2, kv - g2))
        causal = torch.zeros(q_len, kv).masked_fill(torch.ones(q_len, kv).triu(1).bool(), float("-inf"))
    w = torch.where(mask.bool(), nw + causal, gw + causal)
    return torch.softmax(w, -1, dtype=torch.float32) @ _rep(v, n)


def longlm_decode_relative(q_raw, k_raw, v, g1, g2):
    """LongLM's decoding step of its flash path (same file, ``flash_self_extend_forward``, q_len == 1): relative
    key positions (grouped ``q//g1 - k//g1 + (re - re//g1)`` before the last g2 keys, ``q - k`` inside), the keys
    rotated by minus them, the query left at position 0."""
    kv = k_raw.shape[2]
    qp = torch.tensor(kv - 1)
    key_position = torch.arange(kv)
    neighbor = qp - key_position
    re = 0 if qp < g2 else g2
    group = qp // g1 - key_position // g1 + (re - re // g1)
    decode = torch.cat([group[:-g2], neighbor[-g2:]]) if kv > g2 else neighbor
    n = q_raw.shape[1] // k_raw.shape[1]
    k = _rep(raw_rope(k_raw, -decode, INV), n)
    w = q_raw @ k.transpose(2, 3) / math.sqrt(D)
    return torch.softmax(w, -1, dtype=torch.float32) @ _rep(v, n)


# -- the kernel ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Tq,Tk,w,g", [(200, 200, 32, 4), (64, 300, 32, 4), (1, 300, 32, 4), (5, 300, 40, 8),
                                       (37, 37, 64, 8), (100, 130, 120, 3), (300, 300, 30, 4)])
def test_fast_path_equals_reference(Tq, Tk, w, g):
    """Prefills (Tq == Tk), later chunks (Tq < Tk), decode steps (Tq == 1), a window longer than the keys, a window
    the chunk starts inside, and a group that does not divide the window; 4 query heads over 2 KV heads."""
    q, k, v = _raw(2, 4, 2, Tq, Tk)
    fast = pa.self_extend_attention(q, k, v, INV, w, g)
    ref = pa.self_extend_reference(q, k, v, INV, w, g)
    tol = kernel_tol(q, k, v)  # derived in position_helpers.kernel_tol
    assert (fast - ref).abs().max() <= tol
    control = pa.self_extend_reference(q, k, v, INV, w, g + 1)  # group off by one
    if Tk > w + g:
        assert (control - ref).abs().max() > 100 * tol


@pytest.mark.parametrize("T,w,g", [(120, 32, 4), (97, 16, 8), (40, 64, 8)])
def test_reference_equals_longlm_prefill(T, w, g):
    """A whole prompt: lctx's reference (given the states rotated at their true positions, as transformers hands
    them over) equals LongLM's eager Self-Extend computed from the raw states; the fast path too. Control: the
    group or the window off by one is caught."""
    q_raw, k_raw, v = _raw(1, 4, 2, T, T, seed=3)
    want = longlm_eager(q_raw, k_raw, v, g, w)
    q, k = _rotated(q_raw, k_raw)
    tol = kernel_tol(q, k, v)  # derived in position_helpers.kernel_tol
    assert (pa.self_extend_reference(q, k, v, INV, w, g) - want).abs().max() <= tol
    assert (pa.self_extend_attention(q, k, v, INV, w, g) - want).abs().max() <= tol
    if T > w + g:
        assert (pa.self_extend_reference(q, k, v, INV, w, g + 1) - want).abs().max() > 100 * tol
        assert (pa.self_extend_reference(q, k, v, INV, w - 1, g) - want).abs().max() > 100 * tol


@pytest.mark.parametrize("Tk,w,g", [(200, 32, 4), (150, 30, 4), (20, 32, 4)])
def test_decode_step_equals_longlm(Tk, w, g):
    """One decode step over a cache of Tk keys: LongLM's eager form and its relative-position decoding form (which
    floor-divides w by g even when g does not divide w, as lctx does) give lctx's numbers."""
    q_raw, k_raw, v = _raw(1, 4, 2, 1, Tk, seed=5)
    q, k = _rotated(q_raw, k_raw)
    tol = kernel_tol(q, k, v)  # derived in position_helpers.kernel_tol
    fast = pa.self_extend_attention(q, k, v, INV, w, g)
    assert (fast - longlm_decode_relative(q_raw, k_raw, v, g, w)).abs().max() <= tol
    if w % g == 0:
        assert (fast - longlm_eager(q_raw, k_raw, v, g, w)).abs().max() <= tol
    if Tk > w + g:
        assert (pa.self_extend_attention(q, k, v, INV, w, g + 1) - fast).abs().max() > 100 * tol


def test_positions_are_the_papers():
    """Jin et al. 2024 eq. 4 with w = 1024, g = 8 (the defaults): key 5000 -> 625; query 5000 -> 625 + 1024 - 128."""
    gq, gk = pa.self_extend_positions(torch.tensor([0, 7, 8, 5000]), 1024, 8)
    assert gk.tolist() == [0, 0, 1, 625]
    assert gq.tolist() == [896, 896, 897, 1521]


# -- on a tiny Llama-shaped model ------------------------------------------------------------------------------------

SPEC = "self_extend:window=32,group=4"


def _applied(spec=SPEC, chunk=4096, reference=False, make=tiny_llama):
    lm = as_lm(make(), chunk)
    method = parse_position(spec)
    method.check(lm.model.config)
    method.apply_model(lm, reference=reference)
    return lm, method


def test_model_fast_path_equals_reference_and_chunked_prefill_equals_one_forward():
    """300 tokens, w = 32, g = 4 (both parts exercised from position 33 on): lctx's chunked prefill with the fast path
    (chunks of 300, 64, 7 tokens; the cache carries the keys between chunks) equals one forward of the plain
    reference. Tolerance: 4x what a change of summation order alone does to these logits (eager vs sdpa on the
    shipped model; the fast path adds a few rotations' rounding of the same size). Control: group off by one."""
    ids = token_ids(300)
    ref = all_logits(_applied(reference=True)[0], ids)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), ids)
    for chunk in (300, 64, 7):
        assert (all_logits(_applied(chunk=chunk)[0], ids) - ref).abs().max() <= tol, chunk
    control = all_logits(_applied("self_extend:window=32,group=5")[0], ids)
    assert (control - ref).abs().max() > 100 * tol


def test_took_effect_beyond_the_window_only():
    """The logits equal the shipped model's while every key lies inside the neighbour window (positions < w) and
    differ beyond it. Position w sees key 0 at grouped distance floor(w/g) + w - floor(w/g) = w, its true one, so the
    first differing position is w + 1."""
    ids = token_ids(200)
    shipped = all_logits(as_lm(tiny_llama()), ids)
    got = all_logits(_applied()[0], ids)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), ids)  # as in the test above
    diff = (got - shipped).abs().amax(-1)
    assert diff[:33].max() <= tol
    assert diff[33] > 100 * tol
    assert (diff[33:] > 100 * tol).float().mean() > 0.9


def test_decode_and_continuation_through_the_cache_equal_one_forward():
    """A prompt prefilled in chunks, then greedy decode steps and teacher-forced continuations through the cache:
    the same logits as one reference forward over prompt + continuation."""
    ids = token_ids(150, seed=2)
    cont = [5, 9, 11, 40, 2]
    lm, _ = _applied(chunk=40)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), ids)  # as above
    prefix = lm.prefix(ids)
    got = lm.continuation_logits(prefix, cont)
    ref_lm, _ = _applied(reference=True)
    want = all_logits(ref_lm, ids + cont[:-1])[len(ids) - 1:]
    assert (got - want).abs().max() <= tol
    out = lm.greedy(prefix, 6, stop_ids=set())
    full = ids + out[:-1]
    assert out == all_logits(ref_lm, full)[len(ids) - 1:].argmax(-1).tolist()


def test_padded_batch_equals_each_row_alone_on_the_fast_path(monkeypatch):
    """Rows of 150, 97 and 120 tokens left-padded into one batch (chunks of 50): each row's logits and greedy tokens
    equal its own run, and the padded rows take the fast path per row (the reference never runs)."""
    lm, _ = _applied(chunk=50)
    rows = [token_ids(n, seed=n) for n in (150, 97, 120)]
    alone = [lm.prefix(r).last_logits for r in rows]
    greedy_alone = [lm.greedy(lm.prefix(r), 5, stop_ids=set()) for r in rows]

    def no_reference(*a, **k):
        raise AssertionError("the padded batch ran the reference")

    monkeypatch.setattr(_attention, "_reference", no_reference)
    batch = lm.prefill_batch(rows)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), rows[0])  # as above
    for i in range(3):
        assert (batch.last_logits[i] - alone[i]).abs().max() <= tol
    assert lm.greedy_batch(batch, 5, stop_ids=set()) == greedy_alone


def test_gemma3_global_layers_only():
    """Gemma 3 (sliding, global, sliding, global): the method runs on the 2 global layers with their own table
    (theta 1e6) and the sliding layers keep their window; fast path equals reference through a chunked prefill."""
    ids = token_ids(200)
    lm, method = _applied(chunk=64, make=tiny_gemma3)
    eff = method.effective(lm)
    assert eff["layers"] == "2/4" and eff["layer_types"] == ["full_attention"]
    assert eff["rope"]["last"] == pytest.approx(float(inv_freq_of(D, 1e6)[-1]), rel=1e-6)
    ref = all_logits(_applied(reference=True, make=tiny_gemma3)[0], ids)
    shipped = all_logits(as_lm(tiny_gemma3()), ids)
    got = all_logits(lm, ids)
    tol = 4 * reorder_noise(tiny_gemma3, ids)  # as in the Llama tests above
    assert (got - ref).abs().max() <= tol
    assert (got - shipped).abs().max() > 100 * tol


def test_effective_settings_are_read_from_the_layers():
    """What run.json records: the options the layers hold, how many layers run the method, and the RoPE table the
    re-rotation uses, equal to theta^(-2i/d) computed here (control: a table from another theta differs)."""
    lm, method = _applied("self_extend:window=64,group=2")
    eff = method.effective(lm)
    assert (eff["method"], eff["window"], eff["group"], eff["layers"], eff["fast"]) == ("self_extend", 64, 2, "2/2",
                                                                                        True)
    want, other = inv_freq_of(D).double(), inv_freq_of(D, 5e5).double()
    got = (eff["rope"]["n"], eff["rope"]["first"], eff["rope"]["last"], eff["rope"]["geomean"])
    rel = 4 * 1.2e-7  # transformers computes theta ** (2i / d) in fp32: a few ulps from the float64 formula
    assert got == pytest.approx((8, float(want[0]), float(want[-1]), float(want.log().mean().exp())), rel=rel)
    assert eff["rope"]["last"] != pytest.approx(float(other[-1]), rel=rel)  # control: another theta is told apart
    assert eff["rope"]["attention_scaling"] == 1.0
    assert lm.attn_impl == "hf:lctx_self_extend"
    assert method.effective(as_lm(tiny_llama())) == {}  # nothing applied: nothing held


def test_max_length_is_the_papers_bound():
    """(L - w) g + w (Jin et al. 2024): SmolLM2's 8192 with the defaults -> 58,368; unknown stays unknown."""
    m = parse_position("self_extend")
    assert m.max_length(8192) == (8192 - 1024) * 8 + 1024
    assert m.max_length(None) is None


# -- bad input -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,needle", [("self_extend:group=1", "group=1"), ("self_extend:window=0", "window=0"),
                                         ("self_extend:n_sink=4", "no option 'n_sink'"),
                                         ("self_extend:group=2.5", "not a whole number")])
def test_bad_options_are_one_line(spec, needle):
    with pytest.raises(LctxError) as e:
        parse_position(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def _configs():
    from transformers import BloomConfig, Gemma2Config, GPT2Config, LlamaConfig, MistralConfig

    return {"alibi": (BloomConfig(), "ALiBi"), "learned": (GPT2Config(), "declares no RoPE"),
            "partial": (LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                     "partial_rotary_factor": 0.5}), "part of each head"),
            "softcap": (Gemma2Config(), "soft-caps"),
            "sliding": (MistralConfig(sliding_window=4096), "sliding window")}


@pytest.mark.parametrize("kind", ["alibi", "learned", "partial", "softcap", "sliding"])
def test_models_it_does_not_apply_to_are_refused(kind):
    config, needle = _configs()[kind]
    with pytest.raises(LctxError) as e:
        parse_position(SPEC).check(config)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_native_and_served_models_are_refused():
    from transformers import LlamaConfig

    for kind, needle in (("native", "lctx checkpoint"), ("served", "served model")):
        with pytest.raises(LctxError) as e:
            parse_position(SPEC).check(LlamaConfig(), kind)
        assert needle in str(e.value)
    parse_position(SPEC).check(LlamaConfig())  # control: a plain Llama passes


def test_a_second_method_on_one_model_is_refused():
    lm, _ = _applied()
    with pytest.raises(LctxError, match="one method per model"):
        parse_position("sinks").apply_model(lm)


def test_load_lm_records_the_method_and_what_the_layers_hold(tmp_path):
    """Through ``load_lm(position=...)`` (what ``lctx run --position`` calls): the name and variant carry the label,
    the maximum is the paper's bound, run.json's record holds the options and the effective settings read from the
    layers, and the implementation differs from the shipped one (so the accepted-but-not-applied check passes)."""
    from lctx.models.adapters.hf import load_lm
    from position_helpers import save_tiny_llama

    path = save_tiny_llama(tmp_path / "tl")
    lm = load_lm(path, position="self_extend:window=32,group=4")
    assert (lm.name, lm.variant) == ("tl+self_extend_group4_window32", "llama+self_extend:group=4,window=32")
    assert lm.max_length == (2048 - 32) * 4 + 32
    rec = lm.position
    assert rec["method"] == "self_extend" and rec["options"] == {"window": 32, "group": 4}
    att = rec["effective"]["attention"]
    assert (att["implementation"], att["window"], att["group"], att["layers"]) == ("lctx_self_extend", 32, 4, "2/2")
    assert rec["shipped"]["attention"]["implementation"] == "lctx_sdpa"
