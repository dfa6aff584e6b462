"""Shared by tests/test_sinks.py and tests/test_self_extend.py: tiny Hugging Face models with random weights
(Llama-shaped with grouped KV heads; Gemma 3 with sliding and global layers and a RoPE per layer type), an adapter
around them, the logits at every position, and the tolerances the comparisons use (derived where they are used)."""

from __future__ import annotations

import torch

from lctx.models.adapters.hf import HFAdapter
from lctx.models.adapters.hf_attention import register as register_lctx_sdpa

#: fp32 unit roundoff
EPS32 = torch.finfo(torch.float32).eps
VOCAB = 96


def tiny_llama(impl: str = "lctx_sdpa", seed: int = 0):
    """A 2-layer Llama (hidden 64, 4 query heads over 2 KV heads, head dim 16, rope_theta 10000), random weights
    (seed), in eval mode, running ``impl`` (``lctx_sdpa``, lctx's default for HF checkpoints, ``sdpa`` or ``eager``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      initializer_range=0.2, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    if impl != "sdpa":
        model.set_attn_implementation(register_lctx_sdpa() if impl == "lctx_sdpa" else impl)
    return model


def tiny_gemma3(impl: str = "lctx_sdpa", seed: int = 0):
    """A 4-layer Gemma 3 text model (sliding, global, sliding, global; window 16; RoPE theta 10000 local, 1e6
    global), random weights, running ``impl`` (as :func:`tiny_llama`)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16,
                           max_position_embeddings=2048, attn_implementation="sdpa",
                           layer_types=["sliding_attention", "full_attention"] * 2)
    model = Gemma3ForCausalLM(cfg).eval()
    if impl != "sdpa":
        model.set_attn_implementation(register_lctx_sdpa() if impl == "lctx_sdpa" else impl)
    return model


def as_lm(model, chunk: int = 4096) -> HFAdapter:
    """An :class:`HFAdapter` around ``model`` (no tokenizer) prefilling in chunks of ``chunk`` tokens."""
    return HFAdapter(model=model, tokenizer=None, name="tiny", path="", variant=model.config.model_type,
                     train_length=None, max_length=model.config.max_position_embeddings, device=torch.device("cpu"),
                     dtype=torch.float32, chunk_size=chunk)


def token_ids(n: int, seed: int = 1) -> list[int]:
    """``n`` random token ids of the tiny vocabulary."""
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def all_logits(lm: HFAdapter, ids: list[int]) -> torch.Tensor:
    """[T, vocab] float32: the next-token logits at every position, from lctx's chunked prefill."""
    _, got = lm.prefill(ids, want=list(range(len(ids))))
    return torch.stack([got[p] for p in range(len(ids))])


def reorder_noise(make, ids: list[int]) -> float:
    """The largest logit difference between two exact fp32 implementations of the shipped model's attention
    (transformers' ``eager`` and ``sdpa``, one forward over ``ids``): what a change of summation order alone does to
    these logits. ``make(impl)`` builds the model."""
    x = torch.tensor([ids])
    with torch.no_grad():
        a = make("eager")(x).logits
        b = make("sdpa")(x).logits
    return float((a - b).abs().max())


def kernel_tol(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> float:
    """Tolerance for two fp32 computations of one softmax attention that differ in summation order and in the
    rounding of a few rotations: each logit is a D-term dot product (rounding <= D eps |q| |k| scale) and each
    rotation adds ~2 eps relative to q and k, so every logit moves by at most delta = (D + 8) eps max|q| max|k| scale;
    a softmax-weighted mean of v moves by at most (e^(2 delta) - 1) max|v| ~ 2 delta max|v|. Returns 4x that bound
    (a safety factor for the exp and the merge's own roundings)."""
    D = q.shape[-1]
    s = scale if scale is not None else D ** -0.5
    qn, kn = float(q.float().norm(dim=-1).max()), float(k.float().norm(dim=-1).max())
    delta = (D + 8) * EPS32 * qn * kn * s
    return 4 * 2 * delta * float(v.float().abs().max())


def raw_rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x`` [B, H, T, D] rotated to positions ``pos`` [T] (any numbers) the way transformers' Llama does it: its
    ``apply_rotary_pos_emb`` with cos/sin of ``pos x inv_freq`` (the independent side of the tests: no lctx code)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    freqs = pos.double()[:, None] * inv_freq.double()[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().float()[None], emb.sin().float()[None]
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def inv_freq_of(D: int, theta: float = 10000.0) -> torch.Tensor:
    """RoPE's frequencies theta^(-2i/D), i = 0..D/2-1 (Su et al. 2021, eq. 15), float32."""
    return (1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)).float()


def save_tiny_llama(folder) -> str:
    """A tiny Llama (as :func:`tiny_llama`, but with the bundled pydoc tokenizer's vocabulary) saved with that
    tokenizer into ``folder``, for :func:`lctx.models.adapters.hf.load_lm`; returns the folder as a str."""
    from pathlib import Path

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    tok = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[1] / "models" / "checkpoints" /
                                        "pydoc-tiny-rope")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=2048, initializer_range=0.2))
    hf_logging.disable_progress_bar()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)
