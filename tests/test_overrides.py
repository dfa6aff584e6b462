"""--attn-override: Scalable-Softmax through transformers' attention interface on a tiny random Llama,
alibi_lsh refused for HF ALiBi models (no hook in transformers 5), and both on native lctx checkpoints."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch

from lctx.models.adapters import overrides
from lctx.models.position import ssmax as ssmax_method
from lctx.errors import LctxError
from lctx.models.adapters.hf import HFAdapter, load_lm
from lctx.models.adapters.overrides import apply_override, parse_override


def tiny_llama(layers: int = 2, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger q/k so the logit scale matters (random init is near-uniform attention)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    return model


def as_lm(model, chunk_size: int = 2048) -> HFAdapter:
    return HFAdapter(model=model, tokenizer=None, name="tiny", path="", variant=model.config.model_type, train_length=None,
              max_length=getattr(model.config, "max_position_embeddings", None), device=torch.device("cpu"), dtype=torch.float32,
              chunk_size=chunk_size)


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double()


IDS = [1, 5, 9, 33, 2, 17, 40, 41, 8, 3, 60, 22, 19, 7, 7, 12, 50]


def test_parse_override():
    assert parse_override("ssmax").options == {"s": 1.0}
    assert parse_override("ssmax").label == "ssmax"
    assert parse_override("ssmax:s=0.43").label == "ssmax:s=0.43"
    assert parse_override("alibi_lsh:s=16").options == {"s": 16, "seed": 0}
    assert parse_override("alibi_lsh:s=8,seed=3").label == "alibi_lsh:s=8,seed=3"
    for bad, needle in [("flash", "unknown --attn-override"), ("ssmax:t=1", "bad option"),
                        ("ssmax:s=abc", "not a number"), ("alibi_lsh:s=0", ">= 1"), ("alibi_lsh:s=2.5", "whole")]:
        with pytest.raises(LctxError, match=needle):
            parse_override(bad)


@pytest.mark.slow
def test_ssmax_with_unit_factor_is_the_original_model(monkeypatch):
    """With s log n forced to 1 the override must give the original outputs (SSMax with s log n = 1 is its base),
    and the registered function must actually have run."""
    model = tiny_llama()
    ref = logits(model, IDS)
    calls = []

    def unit(n, s):
        calls.append(n.shape)
        return torch.ones_like(n)

    monkeypatch.setattr(ssmax_method, "ssmax_factor", unit)  # the method's module computes it (overrides: an alias)
    lm = as_lm(model)
    apply_override(lm, "ssmax")
    assert model.config._attn_implementation == "lctx_ssmax_sdpa"
    out = logits(model, IDS)
    assert len(calls) == 2  # one call per layer
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_ssmax_one_layer_s_log_n_equals_one_at_a_position():
    """One layer: keys/values do not depend on attention, so at position p the logits with s = 1/log(p+1)
    (s log n_p = 1 by hand: n_p = p + 1 keys) equal the original ones, and differ elsewhere."""
    model = tiny_llama(layers=1)
    ref = logits(model, IDS)
    p = 9
    lm = as_lm(model)
    apply_override(lm, f"ssmax:s={1 / math.log(p + 1)!r}")
    out = logits(model, IDS)
    torch.testing.assert_close(out[p], ref[p], atol=1e-5, rtol=1e-5)
    assert (out[p + 3] - ref[p + 3]).abs().max() > 1e-3
    assert (out[2] - ref[2]).abs().max() > 1e-3


def test_ssmax_matches_the_hand_formula():
    """Logits of query i times s log(i + 1), written independently as a hook scaling row i of q_proj's output
    (RoPE is linear, so scaling q before it scales q.k): the override must give the same model outputs."""
    s = 0.43
    model = tiny_llama()
    ref_model = copy.deepcopy(model)
    T = len(IDS)
    scale = s * torch.log(torch.arange(1, T + 1, dtype=torch.float32))  # Nakanishi 2025 eq. 1, n_i = i + 1

    for layer in ref_model.model.layers:
        layer.self_attn.q_proj.register_forward_hook(lambda mod, inp, out: out * scale[None, :, None])
    expected = logits(ref_model, IDS)
    plain = logits(model, IDS)
    lm = as_lm(model)
    apply_override(lm, f"ssmax:s={s}")
    got = logits(model, IDS)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (got - plain).abs().max() > 1e-2
    assert lm.variant == "llama+ssmax:s=0.43" and lm.name == "tiny+ssmax_s0.43"


def test_ssmax_chunked_prefill_and_decode_count_cached_keys():
    """n_i must count cached keys: a chunked prefill (chunk 5, with a KV cache) and a decode step give the
    full-sequence logits of the overridden model."""
    model = tiny_llama()
    lm = as_lm(model, chunk_size=5)
    apply_override(lm, "ssmax:s=0.7")
    full = logits(model, IDS)
    prefix, got = lm.prefill(IDS[:-1], want=list(range(len(IDS) - 1)))
    for p in range(len(IDS) - 1):
        torch.testing.assert_close(got[p].double(), full[p], atol=1e-4, rtol=1e-4)
    lp = lm.score_continuation(prefix, [IDS[-1]]).logprobs
    assert abs(float(lp[0]) - float(torch.log_softmax(full[-2], -1)[IDS[-1]])) < 1e-4
    step, _ = lm._forward(torch.tensor([IDS[-1]]), prefix.cache, 1)  # one decode step through the cache
    torch.testing.assert_close(step[-1].double(), full[-1], atol=1e-4, rtol=1e-4)


def test_visible_keys_from_masks():
    """n_i from a bool mask, an additive float mask, and no mask (causal, Tq queries at the end of Tk keys)."""
    allowed = torch.tril(torch.ones(4, 6, dtype=torch.bool), diagonal=2)[None, None]  # query i sees i + 3 keys
    assert overrides.visible_keys(allowed, 4, 6, "cpu").flatten().tolist() == [3, 4, 5, 6]
    additive = torch.zeros(1, 1, 4, 6).masked_fill(~allowed, torch.finfo(torch.float32).min)
    assert overrides.visible_keys(additive, 4, 6, "cpu").flatten().tolist() == [3, 4, 5, 6]
    assert overrides.visible_keys(None, 4, 6, "cpu").flatten().tolist() == [3, 4, 5, 6]


def tiny_bloom():
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    return BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=4)).eval()


def test_alibi_lsh_on_hf_alibi_model_is_refused_with_the_reason():
    lm = as_lm(tiny_bloom())
    with pytest.raises(LctxError, match="no clean hook"):
        apply_override(lm, "alibi_lsh:s=16")
    with pytest.raises(LctxError, match="needs an ALiBi model"):
        apply_override(as_lm(tiny_llama()), "alibi_lsh")


def test_ssmax_on_model_without_attention_interface_is_refused():
    with pytest.raises(LctxError, match="AttentionInterface"):
        apply_override(as_lm(tiny_bloom()), "ssmax")


def test_native_alibi_lsh_and_ssmax(make_checkpoint):
    """Native checkpoints: alibi -> alibi_lsh with s samples; rope -> rope+ssmax with every head's scale = s."""
    from lctx.models.lsh import ALiBiLSH

    lm = load_lm(str(make_checkpoint("alibi")), device="cpu", attn_override="alibi_lsh:s=8")
    assert lm.variant == "alibi+alibi_lsh:s=8"
    assert all(isinstance(b.attn.variant, ALiBiLSH) and b.attn.variant.n_samples == 8 for b in lm.model.model.layers)
    nll, _ = lm.token_nll(list(range(3, 40)), list(range(1, 37)))
    assert torch.isfinite(nll).all()

    ck = make_checkpoint("rope")
    ids = list(range(3, 43))
    plain = load_lm(str(ck), device="cpu")
    base, _ = plain.token_nll(ids, list(range(1, 40)))
    lm = load_lm(str(ck), device="cpu", attn_override="ssmax:s=0.5")
    assert lm.variant == "rope+ssmax:s=0.5"
    assert all(torch.all(b.attn.variant.ssmax_scale == 0.5) for b in lm.model.model.layers)
    got, _ = lm.token_nll(ids, list(range(1, 40)))
    assert (got - base).abs().max() > 1e-4
    with pytest.raises(LctxError, match="needs an ALiBi model"):
        load_lm(str(ck), device="cpu", attn_override="alibi_lsh")


def test_cli_records_the_override(make_checkpoint, tmp_path, monkeypatch, capsys):
    from lctx.cli import main

    monkeypatch.delenv("LCTX_DATA_DIR", raising=False)
    ck = make_checkpoint("rope")
    out = tmp_path / "run"
    assert main(["run", "--model", str(ck), "--tasks", "ppl", "--lengths", "64", "--ppl-max-tokens", "256",
                 "--attn-override", "ssmax:s=0.5", "--out", str(out), "--no-progress"]) == 0
    table = pd.read_csv(out / "results.csv")
    assert set(table["variant"]) == {"rope+ssmax:s=0.5"}
    # the alias of the positional method (issue 43): one note pointing to --position, the same label either way
    said = capsys.readouterr()
    assert "note: --attn-override ssmax:s=0.5 is the positional method ssmax" in said.out + said.err
    assert load_lm(str(ck), device="cpu", position="ssmax:s=0.5").variant == "rope+ssmax:s=0.5"
    import json

    pos = json.loads((out / "run.json").read_text())["inputs"]["models"][table["model"][0]]["position"]
    assert pos["method"] == "ssmax" and pos["options"] == {"s": 0.5} and pos["via"] == "--attn-override"
    assert pos["effective"]["attention"]["s"] == 0.5
    plain = load_lm(str(ck), device="cpu")  # the flag's model keeps the checkpoint's fingerprint (old runs resume)
    assert load_lm(str(ck), device="cpu", attn_override="ssmax:s=0.5").model_inputs()["fingerprint"] == \
        plain.model_inputs()["fingerprint"]
    assert main(["run", "--model", str(ck), "--attn-override", "ssmax:q=1", "--out", str(out)]) == 2
