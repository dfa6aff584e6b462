"""Write tiny GGUF files for the tests (``gguf.GGUFWriter``): a 2-layer Llama with a 263-token byte-level
BPE tokenizer and a ChatML chat template, float32 tensors named as llama.cpp names them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_tiny_gguf(path: str | Path, arch: str = "llama", seed: int = 0, d: int = 32, layers: int = 2,
                    heads: int = 4, kv: int = 2, ff: int = 64, ctx: int = 128, chat_template: bool | str = True) -> Path:
    """A random tiny Llama as GGUF at ``path`` (about 50 KB); ``seed`` changes the weights, not the size;
    ``chat_template``: True for :data:`CHAT_TEMPLATE`, a string for that template, False for none."""
    import gguf

    rng = np.random.default_rng(seed)
    b2u = _bytes_to_unicode()
    merges = ["Ġ t", "Ġ a", "h e", "i n"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u[b] for b in range(256)]
    tokens += [m.replace(" ", "") for m in merges]
    V = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(ctx)
    w.add_block_count(layers)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(d // heads)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (V - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(CHAT_TEMPLATE if chat_template is True else chat_template)

    def f(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w.add_tensor("token_embd.weight", f(V, d))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", f(d, d))
        w.add_tensor(f"blk.{i}.attn_k.weight", f(kv * d // heads, d))
        w.add_tensor(f"blk.{i}.attn_v.weight", f(kv * d // heads, d))
        w.add_tensor(f"blk.{i}.attn_output.weight", f(d, d))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", f(ff, d))
        w.add_tensor(f"blk.{i}.ffn_up.weight", f(ff, d))
        w.add_tensor(f"blk.{i}.ffn_down.weight", f(d, ff))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
