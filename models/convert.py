"""Convert llama2.c checkpoints (karpathy/llama2.c) and their tokenizers into Hugging Face Llama directories.

Source formats (reference: karpathy/llama2.c ``export.py``, ``run.c``, ``runq.c``, ``tokenizer.py``):

- **v0 / legacy** (``legacy_export``; what ``run.c`` reads): a 28-byte header of 7 int32
  ``dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len`` (a negative ``vocab_size``
  means the classifier is not shared with the embedding), then float32 tensors in this order:
  tok_embeddings [V, dim]; per layer (all layers of one kind together) attention_norm [dim],
  wq [dim, dim], wk [kv_dim, dim], wv [kv_dim, dim], wo [dim, dim], ffn_norm [dim], w1 [hidden, dim],
  w2 [dim, hidden], w3 [hidden, dim]; norm [dim]; freq_cis_real and freq_cis_imag [seq_len, head_dim/2]
  (unused: RoPE is recomputed); output [V, dim] only when not shared.
- **v1** (``version1_export``): a 256-byte header: uint32 magic ``0x616b3432`` ("ak42"), int32 version 1,
  the 7 int32 above, uint8 shared_classifier, zero padding; then float32 attention_norm (all layers),
  ffn_norm, norm, tok_embeddings, wq, wk, wv, wo, w1, w2, w3, [output].
- **v2** (``version2_export``, Q8_0): header as v1 with version 2 and an int32 group_size after the flag
  byte; then float32 attention_norm, ffn_norm, norm; then for tok_embeddings, each layer's wq, wk, wv, wo,
  w1, w2, w3 and [output]: int8 values followed by float32 scales, one per ``group_size`` values
  (w = q * scale). Dequantised to float32 here.

Tokenizer (``tokenizer.py`` ``export``): uint32 max_token_length, then per token float32 score, int32
byte length, the bytes. SentencePiece's "▁" is stored as " "; BOS/EOS as "\\n<s>\\n" / "\\n</s>\\n"; the
256 byte tokens after <unk>, <s>, </s> as "<0xXX>" (older exports) or as ``chr(XX)`` in UTF-8 (newer).

RoPE layout: ``run.c`` rotates interleaved pairs (2i, 2i+1) of each head; HF Llama's ``rotate_half``
pairs (i, i + head_dim/2). The rows of wq and wk are permuted per head (evens first, then odds), as
HF's ``convert_llama_weights_to_hf.py`` ``permute`` and llama2.c's ``hf_export`` do, so q.k is unchanged.

Tokenizer: llama2.c's ``encode`` adds a dummy-prefix space, splits the text into UTF-8 code points
(unknown ones become byte tokens, id = byte + 3), then repeatedly merges the adjacent pair whose
concatenation is the highest-scoring vocabulary piece. That is BPE whose merge ranks are the scores of
the merged pieces: here a ``tokenizers`` BPE with ``byte_fallback``, merges derived from the vocabulary
(every split of a piece into two pieces, ranked by the piece's score, as transformers'
``SentencePieceExtractor`` does), normaliser ``Prepend("▁")`` + ``Replace(" ", "▁")`` (the dummy prefix is
added even when the text starts with a space, as in ``run.c``), and the Llama decoder (strip one leading
space). The one difference from ``run.c``: when two different splits of one piece compete at
overlapping positions (e.g. "a"+"aa" and "aa"+"a"), run.c merges the leftmost and BPE the lower rank.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
from tokenizers.models import BPE

from lctx.errors import LctxError

MAGIC = 0x616B3432  # "ak42", llama2.c export.py version 1/2 headers
HEADER_V = 256  # bytes of the v1/v2 header


@dataclass
class Llama2cConfig:
    """The header of a llama2.c checkpoint.

    dim: model width; hidden_dim: SwiGLU width; n_layers, n_heads, n_kv_heads; vocab_size: tokens;
    seq_len: the training context (tokens); shared_classifier: the output layer is the embedding;
    version: 0 (legacy), 1 (fp32) or 2 (Q8_0); group_size: Q8_0 group (v2 only).
    """

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool
    version: int
    group_size: int = 0

    @property
    def head_dim(self) -> int:
        """Channels per head."""
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of k and v: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim


def _shapes(c: Llama2cConfig) -> dict[str, tuple[int, ...]]:
    L = c.n_layers
    return {"tok_embeddings": (c.vocab_size, c.dim), "attention_norm": (L, c.dim), "ffn_norm": (L, c.dim),
            "norm": (c.dim,), "wq": (L, c.dim, c.dim), "wk": (L, c.kv_dim, c.dim), "wv": (L, c.kv_dim, c.dim),
            "wo": (L, c.dim, c.dim), "w1": (L, c.hidden_dim, c.dim), "w2": (L, c.dim, c.hidden_dim),
            "w3": (L, c.hidden_dim, c.dim), "output": (c.vocab_size, c.dim)}


def _check_header(c: Llama2cConfig, path: str) -> None:
    vals = [c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len]
    if min(vals) <= 0 or max(vals) > 1 << 24 or c.dim % c.n_heads or c.n_heads % c.n_kv_heads \
            or c.head_dim % 2:
        raise LctxError(f"{path!r} is not a llama2.c checkpoint (header dim, hidden_dim, n_layers, n_heads, "
                        f"n_kv_heads, vocab_size, seq_len = {vals}); pass a .bin written by llama2.c export.py")


def read_llama2c_checkpoint(path: str | Path) -> tuple[Llama2cConfig, dict[str, np.ndarray]]:
    """Read a llama2.c checkpoint (v0 legacy, v1 fp32 or v2 Q8_0) into float32 arrays in llama2.c layout.

    Returns (config, tensors): tok_embeddings [V, dim], attention_norm/ffn_norm [L, dim], norm [dim],
    wq/wo [L, dim, dim], wk/wv [L, kv_dim, dim], w1/w3 [L, hidden, dim], w2 [L, dim, hidden] and
    output [V, dim] (the embedding when shared). Weights are (out, in) as in ``nn.Linear``.
    Source: karpathy/llama2.c ``export.py`` (legacy_export, version1_export, version2_export).

    Raises:
        LctxError: missing/unreadable file, unknown version, or a size that does not match the header.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise LctxError(f"cannot read llama2.c checkpoint {str(path)!r} ({e.strerror or e}); pass the model .bin") from None
    if len(raw) < 28:
        raise LctxError(f"{str(path)!r} is too short ({len(raw)} bytes) for a llama2.c checkpoint; pass the model .bin")
    magic = struct.unpack_from("<I", raw, 0)[0]
    if magic == MAGIC:
        version = struct.unpack_from("<i", raw, 4)[0]
        if version not in (1, 2):
            raise LctxError(f"{str(path)!r} is llama2.c export version {version}; lctx converts versions 0 (legacy), "
                            "1 (fp32) and 2 (Q8_0): re-export with `python export.py --version 1`")
        hdr = struct.unpack_from("<7i", raw, 8)
        shared = bool(raw[36])
        group = struct.unpack_from("<i", raw, 37)[0] if version == 2 else 0
        cfg = Llama2cConfig(*hdr, shared_classifier=shared, version=version, group_size=group)
        offset = HEADER_V
    else:
        hdr = list(struct.unpack_from("<7i", raw, 0))
        shared = hdr[5] > 0
        hdr[5] = abs(hdr[5])
        cfg = Llama2cConfig(*hdr, shared_classifier=shared, version=0)
        offset = 28
    _check_header(cfg, str(path))
    shapes = _shapes(cfg)
    numel = {k: int(np.prod(s)) for k, s in shapes.items()}
    out_names = [] if cfg.shared_classifier else ["output"]
    freq = cfg.seq_len * cfg.head_dim // 2

    if cfg.version == 0:
        order = ["tok_embeddings", "attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3", "norm",
                 "freq_cis_real", "freq_cis_imag"] + out_names
        numel.update(freq_cis_real=freq, freq_cis_imag=freq)
        expected = offset + 4 * sum(numel[k] for k in order)
    elif cfg.version == 1:
        order = ["attention_norm", "ffn_norm", "norm", "tok_embeddings", "wq", "wk", "wv", "wo", "w1", "w2", "w3"] \
            + out_names
        expected = offset + 4 * sum(numel[k] for k in order)
    else:
        g = cfg.group_size
        quant = ["tok_embeddings", "wq", "wk", "wv", "wo", "w1", "w2", "w3"] + out_names
        per_layer = {k: numel[k] // (cfg.n_layers if k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3") else 1)
                     for k in quant}
        if g <= 0 or any(n % g for n in per_layer.values()):
            raise LctxError(f"{str(path)!r}: Q8_0 group size {g} does not divide the tensors; the file is corrupt, "
                            "re-export it")
        expected = offset + 4 * (2 * numel["attention_norm"] + cfg.dim) \
            + sum(numel[k] + 4 * numel[k] // g for k in quant)
    if len(raw) != expected:
        raise LctxError(f"{str(path)!r} has {len(raw)} bytes but its v{cfg.version} header ({cfg.dim=}, "
                        f"{cfg.n_layers=}, {cfg.vocab_size=}) implies {expected}; the file is truncated or not a "
                        "llama2.c checkpoint")

    tensors: dict[str, np.ndarray] = {}
    if cfg.version in (0, 1):
        for k in order:
            arr = np.frombuffer(raw, dtype="<f4", count=numel[k], offset=offset)
            offset += 4 * numel[k]
            if k in shapes:
                tensors[k] = arr.reshape(shapes[k]).astype(np.float32)
    else:
        for k in ("attention_norm", "ffn_norm", "norm"):
            tensors[k] = np.frombuffer(raw, dtype="<f4", count=numel[k], offset=offset).reshape(shapes[k]).copy()
            offset += 4 * numel[k]
        g = cfg.group_size
        for k in quant:
            layered = k in ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
            parts = []
            for _ in range(cfg.n_layers if layered else 1):
                n = per_layer[k]
                q = np.frombuffer(raw, dtype=np.int8, count=n, offset=offset).astype(np.float32)
                offset += n
                s = np.frombuffer(raw, dtype="<f4", count=n // g, offset=offset)
                offset += 4 * (n // g)
                parts.append((q.reshape(-1, g) * s[:, None]).reshape(-1))
            tensors[k] = np.concatenate(parts).reshape(shapes[k])
    if cfg.shared_classifier:
        tensors["output"] = tensors["tok_embeddings"]
    return cfg, tensors


def read_llama2c_tokenizer(path: str | Path) -> tuple[int, list[bytes], list[float]]:
    """Read a llama2.c ``tokenizer.bin`` / ``tok*.bin``: (max_token_length, pieces [V] bytes, scores [V]).

    Raises:
        LctxError: unreadable or truncated file.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise LctxError(f"cannot read llama2.c tokenizer {str(path)!r} ({e.strerror or e}); pass the tok*.bin "
                        "written by llama2.c tokenizer.py") from None
    if len(raw) < 4:
        raise LctxError(f"{str(path)!r} is not a llama2.c tokenizer (too short); pass the tok*.bin")
    max_len = struct.unpack_from("<I", raw, 0)[0]
    o, pieces, scores = 4, [], []
    while o < len(raw):
        if o + 8 > len(raw):
            raise LctxError(f"{str(path)!r} ends inside a token record; the tokenizer file is truncated")
        score, n = struct.unpack_from("<fi", raw, o)
        o += 8
        if n < 0 or o + n > len(raw):
            raise LctxError(f"{str(path)!r} has a token of {n} bytes past the end; the tokenizer file is corrupt")
        pieces.append(raw[o:o + n])
        scores.append(float(score))
        o += n
    return max_len, pieces, scores


def permute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a q or k projection [n_heads * head_dim, in] from llama2.c's interleaved RoPE
    pairs (2i, 2i+1) to HF Llama's half-split pairs (i, i + head_dim/2): per head, even rows then odd rows.

    Source: transformers ``models/llama/convert_llama_weights_to_hf.py`` ``permute``.
    """
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_state_dict(cfg: Llama2cConfig, t: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The ``LlamaForCausalLM`` state dict (float32) of llama2.c tensors (from :func:`read_llama2c_checkpoint`),
    with wq/wk rows permuted by :func:`permute_rope`. Source: llama2.c ``export.py`` ``hf_export``."""
    f = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    sd = {"model.embed_tokens.weight": f(t["tok_embeddings"]), "model.norm.weight": f(t["norm"]),
          "lm_head.weight": f(t["output"])}
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}."
        sd[pre + "input_layernorm.weight"] = f(t["attention_norm"][i])
        sd[pre + "post_attention_layernorm.weight"] = f(t["ffn_norm"][i])
        sd[pre + "self_attn.q_proj.weight"] = permute_rope(f(t["wq"][i]), cfg.n_heads)
        sd[pre + "self_attn.k_proj.weight"] = permute_rope(f(t["wk"][i]), cfg.n_kv_heads)
        sd[pre + "self_attn.v_proj.weight"] = f(t["wv"][i])
        sd[pre + "self_attn.o_proj.weight"] = f(t["wo"][i])
        sd[pre + "mlp.gate_proj.weight"] = f(t["w1"][i])
        sd[pre + "mlp.down_proj.weight"] = f(t["w2"][i])
        sd[pre + "mlp.up_proj.weight"] = f(t["w3"][i])
    return sd


SPECIALS = {b"<unk>": "<unk>", b"\n<s>\n": "<s>", b"\n</s>\n": "</s>", b"<s>": "<s>", b"</s>": "</s>"}


def build_tokenizer(pieces: list[bytes], scores: list[float]):
    """A Hugging Face fast tokenizer equivalent to llama2.c's ``encode``/``decode`` for this vocabulary.

    pieces/scores: from :func:`read_llama2c_tokenizer` (ids are list positions). Byte tokens are
    recognised at ids 3..258 in either export form and become ``<0xXX>`` (byte fallback). BOS is the
    piece "\\n<s>\\n" (or "<s>"), EOS "\\n</s>\\n", UNK "<unk>". Returns a ``PreTrainedTokenizerFast``.

    Raises:
        LctxError: a piece is not UTF-8, or two pieces have the same text.
    """
    from transformers import PreTrainedTokenizerFast  # lazy: loads transformers

    n = len(pieces)
    byte_ids = {}
    if n >= 259 and all(pieces[3 + b] in (f"<0x{b:02X}>".encode(), chr(b).encode("utf-8")) for b in range(256)):
        byte_ids = {3 + b: b for b in range(256)}
    vocab: dict[str, int] = {}
    special: dict[int, str] = {}
    normal: dict[str, int] = {}
    for i, (pc, sc) in enumerate(zip(pieces, scores)):
        if i in byte_ids:
            text = f"<0x{byte_ids[i]:02X}>"
        elif pc in SPECIALS and i < 3:
            text = SPECIALS[pc]
            special[i] = text
        else:
            try:
                text = pc.decode("utf-8").replace(" ", "▁")
            except UnicodeDecodeError:
                raise LctxError(f"tokenizer piece {i} ({pc!r}) is not UTF-8; this is not a llama2.c tokenizer.bin") from None
            normal[text] = i
        if text in vocab:
            raise LctxError(f"tokenizer pieces {vocab[text]} and {i} are both {text!r}; a llama2.c tokenizer has "
                            "unique pieces, so this file is not one")
        vocab[text] = i
    # merges: every split of a piece into two pieces, highest-scoring merged piece first (run.c's order)
    merges = []
    for text, i in normal.items():
        for k in range(1, len(text)):
            a, b = text[:k], text[k:]
            if a in normal and b in normal:
                merges.append((-scores[i], normal[a], normal[b], a, b))
    merges.sort()
    tk = Tokenizer(BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], unk_token="<unk>" if 0 in special else None,
                       byte_fallback=bool(byte_ids), fuse_unk=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(special.items())])
    bos = next((t for t in special.values() if t == "<s>"), None)
    eos = next((t for t in special.values() if t == "</s>"), None)
    if bos is not None:
        tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                          special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token=eos,
                                   unk_token="<unk>" if 0 in special else None, clean_up_tokenization_spaces=False,
                                   model_max_length=int(1e30))


def convert_llama2c(src: str | Path, tokenizer: str | Path, out: str | Path) -> Path:
    """Convert a llama2.c checkpoint + tokenizer into a Hugging Face ``LlamaForCausalLM`` directory.

    Writes ``config.json`` (max_position_embeddings and ``train_length`` = the header's seq_len, rope_theta
    10000, rms_norm_eps 1e-5 as in run.c), ``model.safetensors`` (float32), ``generation_config.json`` and
    the tokenizer (``tokenizer.json``). Returns the output directory.

    Raises:
        LctxError: unreadable/invalid inputs, a tokenizer whose size differs from the model's vocabulary,
            or an output path that is a file.
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # lazy: loads transformers

    cfg, tensors = read_llama2c_checkpoint(src)
    _, pieces, scores = read_llama2c_tokenizer(tokenizer)
    if len(pieces) != cfg.vocab_size:
        raise LctxError(f"tokenizer {str(tokenizer)!r} has {len(pieces)} tokens but the checkpoint's vocabulary is "
                        f"{cfg.vocab_size}; pass the tokenizer the model was trained with")
    tok = build_tokenizer(pieces, scores)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LctxError(f"--out {str(out)!r} is a file; pass a directory to write the Hugging Face model into")
    bos, eos = tok.bos_token_id, tok.eos_token_id
    config = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.hidden_dim,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                         max_position_embeddings=cfg.seq_len, rms_norm_eps=1e-5, rope_theta=10000.0,
                         hidden_act="silu", attention_bias=False, mlp_bias=False,
                         tie_word_embeddings=cfg.shared_classifier, bos_token_id=bos, eos_token_id=eos,
                         architectures=["LlamaForCausalLM"])
    config.train_length = cfg.seq_len  # llama2.c's header seq_len is the training max_seq_len
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(hf_state_dict(cfg, tensors), strict=False)
    missing = [k for k in missing if not (cfg.shared_classifier and k == "lm_head.weight")]
    if missing or unexpected:  # a bug, not a user error
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if cfg.shared_classifier:
        model.tie_weights()
    # llama2.c ends a sample when the model emits BOS (run.c: `if (next == 1) break;`)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=[i for i in (eos, bos) if i is not None])
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "llama2c_source.json").write_text(json.dumps(
        {"checkpoint": str(Path(src).resolve()), "tokenizer": str(Path(tokenizer).resolve()),
         "format_version": cfg.version, "group_size": cfg.group_size, "shared_classifier": cfg.shared_classifier},
        indent=2))
    return out
