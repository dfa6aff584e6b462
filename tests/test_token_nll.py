"""HFAdapter.token_nll reduces each prefill chunk's logits as they come (prefill's ``on_logits``), so a 16K-token ppl
window never holds 16K x vocab logits (3.2 GB float32 for SmolLM2, 13 GB with the float64 copies of the
earlier stack-then-log-softmax), and its numbers are those of one plain forward."""

from __future__ import annotations

import torch

from lctx.models.adapters.hf import HFAdapter


def tiny_llama(max_pos: int = 2048):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos,
                      initializer_range=0.2, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def as_lm(model, chunk_size: int) -> HFAdapter:
    return HFAdapter(model=model, tokenizer=None, name="tiny", path="", variant="llama", train_length=None,
              max_length=model.config.max_position_embeddings, device=torch.device("cpu"), dtype=torch.float32,
              chunk_size=chunk_size)


def test_token_nll_equals_one_plain_forward_across_chunks_and_blocks():
    """1300 tokens, chunks of 600 (3 chunks) and 512-row blocks: each target's NLL equals -log_softmax of one
    uncached forward's logits (the definition), and top-1 its argmax."""
    model = tiny_llama()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (1300,), generator=g).tolist()
    targets = sorted(set(range(1, 1300, 3)) | {1299, 700, 1})
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double()
    ls = torch.log_softmax(full, -1)
    want = torch.tensor([-float(ls[p - 1, ids[p]]) for p in targets], dtype=torch.float64)
    top = torch.tensor([int(full[p - 1].argmax()) == ids[p] for p in targets])
    for chunk in (600, 4096):  # chunked (cached keys) and one forward
        nll, top1 = as_lm(model, chunk).token_nll(ids, targets)
        assert nll.dtype == torch.float64 and nll.shape == (len(targets),)
        torch.testing.assert_close(nll, want, atol=2e-5, rtol=0)  # fp32 logits; chunking changes rounding only
        agree = (top1 == top).float().mean()
        assert agree > 0.99  # argmax ties can flip under rounding; nearly all agree


def test_prefill_on_logits_receives_each_chunk_and_returns_only_the_last():
    """With ``on_logits`` the returned dict holds position T-1 only, and the callback gets at most one chunk of
    rows per call, covering exactly the wanted positions (this is what bounds token_nll's memory)."""
    model = tiny_llama()
    lm = as_lm(model, 256)
    ids = list(range(1, 90)) * 10  # 890 tokens, 4 chunks
    want = list(range(0, 889, 2))
    calls = []
    prefix, got = lm.prefill(ids, want=want, on_logits=lambda pos, lg: calls.append((list(pos), lg.shape)))
    assert list(got) == [len(ids) - 1]
    assert all(shape[0] == len(pos) <= 256 and shape[1] == 96 for pos, shape in calls)
    assert sorted(p for pos, _ in calls for p in pos) == sorted(set(want) | {len(ids) - 1})
    _, plain = as_lm(model, 256).prefill(ids, want=want)
    torch.testing.assert_close(got[len(ids) - 1], plain[len(ids) - 1])
    assert prefix.n_tokens == len(ids)
