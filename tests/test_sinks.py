"""--position sinks (issue 43 items 2, 3, 7, 8): StreamingLLM's attention sinks (Xiao et al. 2023) through
transformers' attention interface. The kernel's fast path equals its plain reference, and both equal the paper's
rolling cache simulated query by query (mit-han-lab/streaming-llm kv_cache.py and pos_shift/modify_llama.py @
d729b3f), with and without its position shift; the fast path never reads a key outside the sinks and each query
block's window band (O(window) per query); on a tiny Llama-shaped model the fast path equals the reference through
lctx's chunked prefill, decode and padded batches; the method took effect exactly beyond n_sink + window tokens; what
the layers hold is read back; bad input is one line."""

from __future__ import annotations

import pytest
import torch

from lctx.errors import LctxError
from lctx.kernels import position_attention as pa
from lctx.models.position import _attention, parse_position
from position_helpers import (all_logits, as_lm, inv_freq_of, kernel_tol, raw_rope, reorder_noise, tiny_gemma3,
                              tiny_llama, token_ids)

D = 16
INV = inv_freq_of(D)


def _raw(B, H, Hkv, Tq, Tk, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Tq, D, generator=g), torch.randn(B, Hkv, Tk, D, generator=g),
            torch.randn(B, Hkv, Tk, D, generator=g))


def _rotated(q_raw, k_raw):
    Tq, Tk = q_raw.shape[2], k_raw.shape[2]
    return raw_rope(q_raw, torch.arange(Tk - Tq, Tk), INV), raw_rope(k_raw, torch.arange(Tk), INV)


def streaming_llm(q_raw, k_raw, v, n_sink, window, reassign):
    """The paper's rolling cache, query by query (Tq queries, the last of Tk positions): the query at p sees the
    cache ``StartRecentKVCache(start_size=n_sink, recent_size=window)`` holds after its token came in, keys 0..n_sink-1
    and p-window+1..p; ``reassign``: positions are indices in that cache (``pos_shift/modify_llama.py``: keys at
    ``arange(kv_seq_len)``, the query the last), else the true positions. Transformers' rotation, one fp32 softmax."""
    Tq, Tk = q_raw.shape[2], k_raw.shape[2]
    n = q_raw.shape[1] // k_raw.shape[1]
    outs = []
    for i in range(Tq):
        p = Tk - Tq + i
        idx = sorted(set(range(min(n_sink, p + 1))) | set(range(max(0, p - window + 1), p + 1)))
        kpos = torch.arange(len(idx)) if reassign else torch.tensor(idx)
        qpos = torch.tensor([len(idx) - 1 if reassign else p])
        k = raw_rope(k_raw[:, :, idx], kpos, INV).repeat_interleave(n, 1)
        q = raw_rope(q_raw[:, :, i:i + 1], qpos, INV)
        w = q @ k.transpose(2, 3) / D ** 0.5
        outs.append(torch.softmax(w, -1) @ v[:, :, idx].repeat_interleave(n, 1))
    return torch.cat(outs, 2)


# -- the kernel ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reassign", [False, True])
@pytest.mark.parametrize("Tq,Tk,ns,w", [(200, 200, 4, 32), (64, 300, 4, 40), (1, 300, 4, 40), (5, 300, 1, 3),
                                        (37, 37, 4, 64), (100, 130, 4, 120), (300, 300, 0, 30), (50, 300, 8, 2)])
def test_fast_path_equals_reference(Tq, Tk, ns, w, reassign):
    """Prefills, later chunks, decode steps, a window longer than the keys, a chunk starting inside the window, no
    sinks, more sinks than window; 4 query heads over 2 KV heads. Control: the window one shorter is caught."""
    q, k, v = _raw(2, 4, 2, Tq, Tk)
    fast = pa.sinks_attention(q, k, v, ns, w, reassign, INV)
    ref = pa.sinks_reference(q, k, v, ns, w, reassign, INV)
    tol = kernel_tol(q, k, v)  # derived in position_helpers.kernel_tol
    assert (fast - ref).abs().max() <= tol
    if Tk > w - 1 + ns:
        assert (pa.sinks_reference(q, k, v, ns, max(1, w - 1), reassign, INV) - ref).abs().max() > 10 * tol


@pytest.mark.parametrize("reassign", [False, True])
@pytest.mark.parametrize("Tq,Tk,ns,w", [(90, 90, 4, 20), (1, 150, 4, 20), (30, 150, 2, 25)])
def test_reference_equals_the_papers_rolling_cache(Tq, Tk, ns, w, reassign):
    """lctx's reference and fast path (given states rotated at their true positions, as transformers hands them over)
    equal the paper's cache simulated query by query from the raw states. Controls: one sink more, and the other
    ``reassign``, are caught."""
    q_raw, k_raw, v = _raw(1, 4, 2, Tq, Tk, seed=3)
    want = streaming_llm(q_raw, k_raw, v, ns, w, reassign)
    q, k = _rotated(q_raw, k_raw)
    tol = kernel_tol(q, k, v)  # derived in position_helpers.kernel_tol
    assert (pa.sinks_reference(q, k, v, ns, w, reassign, INV) - want).abs().max() <= tol
    assert (pa.sinks_attention(q, k, v, ns, w, reassign, INV) - want).abs().max() <= tol
    assert (pa.sinks_reference(q, k, v, ns + 1, w, reassign, INV) - want).abs().max() > 100 * tol
    assert (pa.sinks_reference(q, k, v, ns, w, not reassign, INV) - want).abs().max() > 100 * tol


@pytest.mark.parametrize("Tq,Tk", [(64, 1000), (1, 1000), (300, 1000)])
def test_fast_path_reads_only_the_sinks_and_the_window_band(Tq, Tk):
    """O(window) per query, shown structurally: keys and values a query block never needs (past the sinks and before
    its band: the first query's window start minus one block of 64) are NaN, and the fast path's output is still
    finite and equal to the reference over the clean tensors. A path reading all Tk keys would return NaN."""
    ns, w, block = 4, 40, 64
    q, k, v = _raw(1, 4, 2, Tq, Tk, seed=7)
    ref = pa.sinks_reference(q, k, v, ns, w, True, INV)
    far = slice(ns, Tk - Tq - w + 1 - block)
    kn, vn = k.clone(), v.clone()
    kn[:, :, far], vn[:, :, far] = float("nan"), float("nan")
    fast = pa.sinks_attention(q, kn, vn, ns, w, True, INV)
    assert torch.isfinite(fast).all()
    assert (fast - ref).abs().max() <= kernel_tol(q, k, v)  # derived in position_helpers.kernel_tol
    with torch.no_grad():  # control: a full causal pass over the same keys does read them
        assert not torch.isfinite(pa.causal_lse(q, kn, vn, D ** -0.5)[0]).all()


# -- on a tiny Llama-shaped model ------------------------------------------------------------------------------------

SPEC = "sinks:n_sink=4,window=40,reassign=true"


def _applied(spec=SPEC, chunk=4096, reference=False, make=tiny_llama):
    lm = as_lm(make(), chunk)
    method = parse_position(spec)
    method.check(lm.model.config)
    method.apply_model(lm, reference=reference)
    return lm, method


@pytest.mark.parametrize("spec", [SPEC, "sinks:n_sink=4,window=40"])
def test_model_fast_path_equals_reference_and_chunked_prefill_equals_one_forward(spec):
    """300 tokens, 4 sinks + a window of 40: lctx's chunked prefill with the fast path (chunks of 300, 64, 7 tokens)
    equals one forward of the plain reference. Tolerance: 4x what a change of summation order alone does to these
    logits (eager vs sdpa on the shipped model). Control: the window off by one."""
    ids = token_ids(300)
    ref = all_logits(_applied(spec, reference=True)[0], ids)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), ids)
    for chunk in (300, 64, 7):
        assert (all_logits(_applied(spec, chunk=chunk)[0], ids) - ref).abs().max() <= tol, chunk
    control = all_logits(_applied(spec.replace("window=40", "window=41"))[0], ids)
    assert (control - ref).abs().max() > 100 * tol


@pytest.mark.parametrize("reassign", ["false", "true"])
def test_took_effect_beyond_sinks_plus_window_only(reassign):
    """The logits equal the shipped model's while every key lies in the sinks or the window (positions < n_sink +
    window = 44) and differ from position 44 on (key 4 has left the window and is no sink)."""
    ids = token_ids(200)
    shipped = all_logits(as_lm(tiny_llama()), ids)
    got = all_logits(_applied(f"sinks:n_sink=4,window=40,reassign={reassign}")[0], ids)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), ids)  # as in the test above
    diff = (got - shipped).abs().amax(-1)
    assert diff[:44].max() <= tol
    assert diff[44] > 100 * tol
    assert (diff[44:] > 100 * tol).float().mean() > 0.9


def test_decode_and_continuation_through_the_cache_equal_one_forward():
    """A prompt prefilled in chunks, then teacher-forced continuations and greedy decode steps through the cache:
    the logits of one reference forward over prompt + continuation."""
    ids = token_ids(150, seed=2)
    cont = [5, 9, 11, 40, 2]
    lm, _ = _applied(chunk=40)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), ids)  # as above
    prefix = lm.prefix(ids)
    got = lm.continuation_logits(prefix, cont)
    ref_lm, _ = _applied(reference=True)
    assert (got - all_logits(ref_lm, ids + cont[:-1])[len(ids) - 1:]).abs().max() <= tol
    out = lm.greedy(prefix, 6, stop_ids=set())
    assert out == all_logits(ref_lm, ids + out[:-1])[len(ids) - 1:].argmax(-1).tolist()


def test_padded_batch_equals_each_row_alone_on_the_fast_path(monkeypatch):
    """Rows of 150, 97 and 120 tokens left-padded into one batch (chunks of 50): the sinks are each row's own first
    tokens (not the padding), each row's logits and greedy tokens equal its own run, and the fast path runs per row
    (the reference never does)."""
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


def test_any_other_mask_runs_the_reference_with_explicit_positions():
    """A mask that is not causal over a left-padded row (a hole punched in, as a packed or custom mask would have)
    runs the reference with that mask, not the fast path; the plain causal mask is recognised and runs the fast
    path, equal to the reference."""
    q_raw, k_raw, v = _raw(1, 4, 2, 20, 120, seed=9)
    q, k = _rotated(q_raw, k_raw)
    allowed = (torch.arange(120)[None, :] <= torch.arange(100, 120)[:, None])[None, None]
    holed = allowed.clone()
    holed[..., 90] = False  # inside every query's window
    assert _attention.left_padded_rows(allowed, None, 20, 120) == [(0, 0)]
    assert _attention.left_padded_rows(holed, None, 20, 120) is None

    class Rotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", INV)
            self.attention_scaling = 1.0

    module = torch.nn.Module()
    module.lctx_position = _attention.LayerState("sinks", {"n_sink": 4, "window": 40, "reassign": True}, True, "sdpa",
                                                 Rotary())
    run = lambda mask: _attention.position_attention(module, q, k, v, mask)[0].transpose(1, 2)  # noqa: E731
    tol = kernel_tol(q, k, v)  # derived in position_helpers.kernel_tol
    want = pa.sinks_reference(q, k, v, 4, 40, True, INV, mask=holed)
    assert (run(holed) - want).abs().max() <= tol
    assert (run(allowed) - pa.sinks_reference(q, k, v, 4, 40, True, INV)).abs().max() <= tol
    assert (run(allowed) - want).abs().max() > 100 * tol  # control: the hole matters


def test_gemma3_global_layers_only():
    """Gemma 3: the sinks run on the 2 global layers (their table: theta 1e6); the sliding layers keep their window;
    fast path equals reference through a chunked prefill; the method changes the logits."""
    ids = token_ids(200)
    lm, method = _applied(chunk=64, make=tiny_gemma3)
    eff = method.effective(lm)
    assert eff["layers"] == "2/4" and eff["layer_types"] == ["full_attention"]
    ref = all_logits(_applied(reference=True, make=tiny_gemma3)[0], ids)
    got = all_logits(lm, ids)
    tol = 4 * reorder_noise(tiny_gemma3, ids)  # as in the Llama tests above
    assert (got - ref).abs().max() <= tol
    assert (got - all_logits(as_lm(tiny_gemma3()), ids)).abs().max() > 100 * tol


def test_effective_settings_are_read_from_the_layers():
    """What run.json records: the options the layers hold (not the parsed spec's), the layers that run it."""
    lm, method = _applied("sinks:n_sink=2,window=100")
    eff = method.effective(lm)
    assert {k: eff[k] for k in ("method", "n_sink", "window", "reassign", "layers", "fast")} == \
        {"method": "sinks", "n_sink": 2, "window": 100, "reassign": False, "layers": "2/2", "fast": True}
    for m in lm.model.modules():  # the held state is what is read: change it, and the record follows
        if getattr(m, "lctx_position", None) is not None:
            m.lctx_position.options["window"] = 64
    assert method.effective(lm)["window"] == 64
    assert lm.attn_impl == "hf:lctx_sinks"


def test_sdpa_and_eager_models_keep_their_masks():
    """A model running transformers' sdpa or eager (``--attn-impl sdpa|reference``): the method's implementation
    takes that implementation's mask function (a materialised mask for chunks) and still equals the reference."""
    ids = token_ids(120)
    ref = all_logits(_applied(reference=True)[0], ids)
    tol = 4 * reorder_noise(lambda impl: tiny_llama(impl), ids)
    for impl in ("sdpa", "eager"):
        lm, _ = _applied(chunk=32, make=lambda impl=impl: tiny_llama(impl))
        assert lm.attn_impl == f"hf:lctx_sinks_over_{impl}"
        assert (all_logits(lm, ids) - ref).abs().max() <= tol


def test_max_length_is_unbounded():
    assert parse_position("sinks").max_length(8192) is None


@pytest.mark.parametrize("spec,needle", [("sinks:window=0", "window=0"), ("sinks:n_sink=-1", "n_sink=-1"),
                                         ("sinks:group=8", "no option 'group'"),
                                         ("sinks:reassign=maybe", "true or false")])
def test_bad_options_are_one_line(spec, needle):
    with pytest.raises(LctxError) as e:
        parse_position(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_models_without_rope_are_refused():
    """The checks are shared with self_extend (tests/test_self_extend.py covers each kind); here: ALiBi and learned
    positions, and a plain Llama passes (control)."""
    from transformers import BloomConfig, GPT2Config, LlamaConfig

    for config, needle in ((BloomConfig(), "ALiBi"), (GPT2Config(), "declares no RoPE")):
        with pytest.raises(LctxError, match=needle):
            parse_position("sinks").check(config)
    parse_position("sinks").check(LlamaConfig())


def test_load_lm_records_the_method_and_refuses_ssmax_on_top(tmp_path):
    """Through ``load_lm(position=...)``: the name carries the label, no maximum (sinks address any length), the
    effective record holds the sizes the layers hold. ``--attn-override ssmax`` on top would replace the sinks'
    attention function while the name said both: refused in one line (it was silently replaced)."""
    from lctx.models.adapters.hf import load_lm
    from position_helpers import save_tiny_llama

    path = save_tiny_llama(tmp_path / "tl")
    lm = load_lm(path, position="sinks:window=64")
    assert lm.name == "tl+sinks_window64" and lm.max_length is None
    att = lm.position["effective"]["attention"]
    assert (att["implementation"], att["n_sink"], att["window"], att["reassign"]) == ("lctx_sinks", 4, 64, False)
    with pytest.raises(LctxError) as e:
        load_lm(path, position="sinks:window=64", attn_override="ssmax:s=0.5")
    assert "would replace" in str(e.value) and "\n" not in str(e.value)
    assert load_lm(path, attn_override="ssmax:s=0.5").attn_impl == "hf:lctx_ssmax_sdpa"  # control: alone it applies
