"""lctx convert llama2c, and loading Hugging Face checkpoint directories.

The real test is stories260K (../shared/data/checkpoints/stories260K, SOURCES.md section 5): after
conversion, greedy decoding from BOS must print llama2.c's own greedy sample (doc/stories260K.md of
karpathy/llama2.c, `./run stories260K.bin -z tok512.bin -t 0.0`, 256 steps) character for character.
It pins the RoPE layout (interleaved -> half-split permutation) and the tokenizer. The file formats
(legacy v0 shared/unshared, v1, v2 Q8_0) are checked on tiny random weights against a NumPy port of
run.c's forward pass.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from lctx.models import convert as conv
from lctx.errors import LctxError

# llama2.c doc/stories260K.md, greedy (-t 0.0) output of run.c, verbatim (256 tokens after BOS)
STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    "a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want to "
    "play with your ball, but I can't find it.\"\n"
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\n"
    "Lily didn't want to help her mom, so she said, \"I'm sorry, mom. I didn't know what to do.\" Her mom said, "
    "\"Don't worry, Lily. We can help you."
)


# -- references: run.c's encode and forward, written from karpathy/llama2.c run.c ---------------------

def runc_encode(text: str, pieces: list[bytes], scores: list[float]) -> list[int]:
    """Port of run.c ``encode`` (no BOS/EOS): dummy-prefix " ", code points (byte fallback id = byte + 3),
    then merge the adjacent pair whose concatenation is the highest-scoring piece (leftmost on ties)."""
    lookup = {p: i for i, p in enumerate(pieces)}
    toks = [lookup[b" "]] if text else []
    for ch in text:
        b = ch.encode("utf-8")
        toks += [lookup[b]] if b in lookup else [x + 3 for x in b]
    while True:
        best, best_i, best_id = -1e10, -1, -1
        for i in range(len(toks) - 1):
            j = lookup.get(pieces[toks[i]] + pieces[toks[i + 1]])
            if j is not None and scores[j] > best:
                best, best_i, best_id = scores[j], i, j
        if best_i < 0:
            return toks
        toks[best_i: best_i + 2] = [best_id]


def rmsnorm(x, w):
    return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)


def runc_forward(t: dict, c: dict, tokens: list[int]) -> np.ndarray:
    """Port of run.c ``forward`` for all positions at once (float64): interleaved RoPE pairs (2i, 2i+1) with
    freq 1/10000^(i_head/head_size), GQA by h // kv_mul, SwiGLU, tied or separate classifier. Returns [T, V]."""
    dim, nh, nkv = c["dim"], c["n_heads"], c["n_kv_heads"]
    hs, T = dim // nh, len(tokens)
    kv_dim, kv_mul = nkv * hs, nh // nkv
    pos = np.arange(T)[:, None]
    x = t["tok_embeddings"][tokens].astype(np.float64)
    for l in range(c["n_layers"]):
        xb = rmsnorm(x, t["attention_norm"][l])
        q, k, v = xb @ t["wq"][l].T, xb @ t["wk"][l].T, xb @ t["wv"][l].T
        for vec, width in ((q, dim), (k, kv_dim)):
            i = np.arange(0, width, 2)
            val = pos * (1.0 / 10000.0 ** ((i % hs) / hs))[None]
            v0, v1 = vec[:, i].copy(), vec[:, i + 1].copy()
            vec[:, i], vec[:, i + 1] = v0 * np.cos(val) - v1 * np.sin(val), v0 * np.sin(val) + v1 * np.cos(val)
        out = np.zeros_like(q)
        causal = np.tril(np.ones((T, T), dtype=bool))
        for h in range(nh):
            g = h // kv_mul
            att = q[:, h * hs:(h + 1) * hs] @ k[:, g * hs:(g + 1) * hs].T / math.sqrt(hs)
            att = np.where(causal, att, -np.inf)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            out[:, h * hs:(h + 1) * hs] = att @ v[:, g * hs:(g + 1) * hs]
        x = x + out @ t["wo"][l].T
        xb = rmsnorm(x, t["ffn_norm"][l])
        h1 = xb @ t["w1"][l].T
        x = x + ((h1 / (1 + np.exp(-h1))) * (xb @ t["w3"][l].T)) @ t["w2"][l].T
    return rmsnorm(x, t["norm"]) @ t["output"].T


# -- writers of the three export formats (karpathy/llama2.c export.py) ------------------------------

CFG = dict(dim=16, hidden_dim=24, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=270, seq_len=32)


def random_weights(shared: bool, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    c = CFG
    kv = c["dim"] // c["n_heads"] * c["n_kv_heads"]
    L, d, hd, V = c["n_layers"], c["dim"], c["hidden_dim"], c["vocab_size"]
    r = lambda *s: (rng.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    t = dict(tok_embeddings=r(V, d), attention_norm=1 + r(L, d) * 0.1, ffn_norm=1 + r(L, d) * 0.1, norm=1 + r(d) * 0.1,
             wq=r(L, d, d), wk=r(L, kv, d), wv=r(L, kv, d), wo=r(L, d, d), w1=r(L, hd, d), w2=r(L, d, hd),
             w3=r(L, hd, d))
    t["output"] = t["tok_embeddings"] if shared else r(V, d)
    return t


def write_v0(path: Path, t: dict, shared: bool) -> None:
    c = CFG
    with open(path, "wb") as f:
        f.write(struct.pack("7i", c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"],
                            c["vocab_size"] if shared else -c["vocab_size"], c["seq_len"]))
        for k in ["tok_embeddings", "attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3", "norm"]:
            f.write(t[k].astype("<f4").tobytes())
        f.write(np.full(c["seq_len"] * c["dim"] // c["n_heads"], 7.0, dtype="<f4").tobytes())  # freq_cis (unused)
        if not shared:
            f.write(t["output"].astype("<f4").tobytes())


def header(f, version: int, shared: bool) -> None:
    c = CFG
    f.write(struct.pack("I", 0x616B3432) + struct.pack("i", version))
    f.write(struct.pack("7i", *[c[k] for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                                               "vocab_size", "seq_len")]))
    f.write(struct.pack("B", int(shared)))


def write_v1(path: Path, t: dict, shared: bool) -> None:
    with open(path, "wb") as f:
        header(f, 1, shared)
        f.write(b"\0" * (256 - f.tell()))
        for k in ["attention_norm", "ffn_norm", "norm", "tok_embeddings", "wq", "wk", "wv", "wo", "w1", "w2", "w3"]:
            f.write(t[k].astype("<f4").tobytes())
        if not shared:
            f.write(t["output"].astype("<f4").tobytes())


def write_v2(path: Path, t: dict, shared: bool, group: int = 8) -> dict:
    """Q8_0 export; returns the dequantised weights (what the checkpoint really holds)."""
    deq = dict(t)
    with open(path, "wb") as f:
        header(f, 2, shared)
        f.write(struct.pack("i", group))
        f.write(b"\0" * (256 - f.tell()))
        for k in ["attention_norm", "ffn_norm", "norm"]:
            f.write(t[k].astype("<f4").tobytes())
        keys = ["tok_embeddings", "wq", "wk", "wv", "wo", "w1", "w2", "w3"] + ([] if shared else ["output"])
        for k in keys:
            per = [t[k]] if k in ("tok_embeddings", "output") else list(t[k])
            outs = []
            for w in per:
                g = w.reshape(-1, group)
                scale = (np.abs(g).max(1) / 127.0).astype(np.float32)
                q = np.round(g / scale[:, None]).astype(np.int8)
                f.write(q.tobytes())
                f.write(scale.astype("<f4").tobytes())
                outs.append((q.astype(np.float32) * scale[:, None]).reshape(w.shape))
            deq[k] = outs[0] if k in ("tok_embeddings", "output") else np.stack(outs)
    if shared:
        deq["output"] = deq["tok_embeddings"]
    return deq


def write_tokenizer(path: Path, pieces: list[bytes], scores: list[float], byte_form: str = "hex") -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("I", max(len(p) for p in pieces)))
        for i, (p, s) in enumerate(zip(pieces, scores)):
            if 3 <= i < 259 and byte_form == "chr":
                p = chr(i - 3).encode("utf-8")
            f.write(struct.pack("fI", s, len(p)) + p)


def small_vocab() -> tuple[list[bytes], list[float]]:
    """<unk>, <s>, </s>, 256 byte tokens, then 11 pieces with SentencePiece BPE scores (-rank)."""
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    extra = [b" t", b"he", b" the", b" a", b"e", b"h", b"t", b"a", b" ", b"n", b"\xc3\xa9"]
    return pieces + extra, [0.0] * 259 + [-float(i) for i in range(len(extra))]


@pytest.mark.parametrize("fmt,shared", [("v0", True), ("v0", False), ("v1", True), ("v1", False), ("v2", True),
                                        ("v2", False)])
@pytest.mark.slow
def test_formats_match_runc_forward(tmp_path, fmt, shared):
    """Each export format converts to an HF Llama whose logits equal run.c's forward on the same weights."""
    from transformers import AutoModelForCausalLM

    t = random_weights(shared)
    src = tmp_path / "m.bin"
    if fmt == "v0":
        write_v0(src, t, shared)
    elif fmt == "v1":
        write_v1(src, t, shared)
    else:
        t = write_v2(src, t, shared)
    pieces, scores = small_vocab()
    write_tokenizer(tmp_path / "tok.bin", pieces, scores)
    out = conv.convert_llama2c(src, tmp_path / "tok.bin", tmp_path / "hf")
    cfg, _ = conv.read_llama2c_checkpoint(src)
    assert (cfg.version, cfg.shared_classifier) == (int(fmt[1]), shared)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = [1, 5, 200, 261, 9, 268, 33, 100, 7, 7, 3, 150]
    with torch.no_grad():
        got = model(torch.tensor([tokens])).logits[0].double().numpy()
    ref = runc_forward(t, CFG, tokens)
    np.testing.assert_allclose(got, ref, atol=2e-4, rtol=1e-4)
    assert model.config.max_position_embeddings == CFG["seq_len"] and model.config.train_length == CFG["seq_len"]


def test_without_the_rope_permutation_the_logits_differ(tmp_path, monkeypatch):
    """The forward comparison above is sensitive to the RoPE layout (so it pins the permutation)."""
    from transformers import AutoModelForCausalLM

    t = random_weights(True)
    write_v1(tmp_path / "m.bin", t, True)
    pieces, scores = small_vocab()
    write_tokenizer(tmp_path / "tok.bin", pieces, scores)
    monkeypatch.setattr(conv, "permute_rope", lambda w, n: w)
    model = AutoModelForCausalLM.from_pretrained(conv.convert_llama2c(tmp_path / "m.bin", tmp_path / "tok.bin",
                                                                      tmp_path / "hf"))
    tokens = [1, 5, 200, 261, 9, 268, 33, 100]
    with torch.no_grad():
        got = model(torch.tensor([tokens])).logits[0].double().numpy()
    assert np.abs(got - runc_forward(t, CFG, tokens)).max() > 1e-2


def test_bad_inputs_are_one_line_errors(tmp_path):
    t = random_weights(True)
    write_v1(tmp_path / "m.bin", t, True)
    (tmp_path / "short.bin").write_bytes((tmp_path / "m.bin").read_bytes()[:-4])
    pieces, scores = small_vocab()
    write_tokenizer(tmp_path / "tok.bin", pieces, scores)
    write_tokenizer(tmp_path / "tok_small.bin", pieces[:-1], scores[:-1])
    with pytest.raises(LctxError, match="truncated"):
        conv.convert_llama2c(tmp_path / "short.bin", tmp_path / "tok.bin", tmp_path / "o1")
    with pytest.raises(LctxError, match="269 tokens but the checkpoint's vocabulary is 270"):
        conv.convert_llama2c(tmp_path / "m.bin", tmp_path / "tok_small.bin", tmp_path / "o2")
    with pytest.raises(LctxError, match="cannot read"):
        conv.convert_llama2c(tmp_path / "nope.bin", tmp_path / "tok.bin", tmp_path / "o3")
    (tmp_path / "junk.bin").write_bytes(b"\xff" * 64)
    with pytest.raises(LctxError, match="not a llama2.c checkpoint"):
        conv.convert_llama2c(tmp_path / "junk.bin", tmp_path / "tok.bin", tmp_path / "o4")


@pytest.mark.parametrize("byte_form", ["hex", "chr"])
def test_small_tokenizer_matches_runc_encode(tmp_path, byte_form):
    """Both byte-token forms of tokenizer.py exports; run.c's encode is the reference."""
    pieces, scores = small_vocab()
    write_tokenizer(tmp_path / "tok.bin", pieces, scores, byte_form)
    _, p2, s2 = conv.read_llama2c_tokenizer(tmp_path / "tok.bin")
    tok = conv.build_tokenizer(p2, s2)
    for text in ["the theta", " tea", "heathen\n", "é ü", "", "  a  the"]:
        assert tok.encode(text, add_special_tokens=False) == runc_encode(text, pieces, scores), text
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # by hand: " the" (dummy prefix) = [' the'] = id 261; "é" piece 269; "ü" = bytes c3 bc -> 0xC3+3, 0xBC+3
    assert tok.encode("the é ü", add_special_tokens=False) == [261, 267, 269, 267, 0xC3 + 3, 0xBC + 3]


# -- the real checkpoint -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    root = Path(os.environ.get("LCTX_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
    src = root / "checkpoints" / "stories260K"
    if not (src / "stories260K.bin").is_file():
        pytest.skip(f"stories260K not found under {root}; set LCTX_DATA_DIR")
    out = tmp_path_factory.mktemp("stories") / "hf"
    conv.convert_llama2c(src / "stories260K.bin", src / "tok512.bin", out)
    return src, out


@pytest.mark.slow
def test_stories260k_greedy_story_is_llama2c_s(stories):
    from lctx.models.adapters.hf import load_lm

    _, out = stories
    lm = load_lm(str(out), device="cpu")
    assert (lm.max_length, lm.train_length, lm.bos_id) == (512, 512, 1)
    prefix, _ = lm.prefill([lm.bos_id])
    ids = lm.greedy(prefix, 256, stop_ids={1})  # run.c: 256 steps, stops on BOS
    assert lm.decode(ids) == STORY  # llama2.c doc/stories260K.md, verbatim


def test_stories260k_encode_matches_runc(stories):
    """HF encode == run.c encode on the story and on text with byte fallback, digits, spacing; round trips."""
    from transformers import AutoTokenizer

    src, out = stories
    tok = AutoTokenizer.from_pretrained(out)
    _, pieces, scores = conv.read_llama2c_tokenizer(src / "tok512.bin")
    texts = [STORY, "Lily", " Lily and Tom\n\nsaw 42 cats.", "naïve café — “quoted” 😀", "a  b   c ", "\tTab"]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == runc_encode(text, pieces, scores), text
        assert tok.decode(ids) == text
    # by hand from tok512.bin: " Lily" = ' '+'L'+'i'+'l'+'y' -> 'il' (score -31) -> ' L' (-48) -> 'ily' (-51)
    # -> ' Lily' (id 317, -58); then ' ' is id 410, 'ü' is not a piece -> bytes 0xC3, 0xBC at id byte + 3,
    # '\n' -> byte 0x0A -> id 13
    assert tok.encode("Lily ü\n", add_special_tokens=False) == [317, 410, 0xC3 + 3, 0xBC + 3, 13]
    assert tok("Lily").input_ids == [1, 317]  # add_special_tokens: BOS first, as llama2.c's encode(bos=1)


def test_cli_convert_and_length_limit(stories, tmp_path, capsys, monkeypatch):
    """`lctx convert llama2c` writes the directory; `lctx run` refuses lengths past max_position_embeddings
    (512) unless --allow-beyond-max."""
    from lctx.cli import main

    monkeypatch.delenv("LCTX_DATA_DIR", raising=False)
    src, _ = stories
    out = tmp_path / "hf"
    assert main(["convert", "llama2c", str(src / "stories260K.bin"), "--tokenizer", str(src / "tok512.bin"),
                 "--out", str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 512
    capsys.readouterr()
    assert main(["run", "--model", str(out), "--tasks", "ppl", "--lengths", "1k", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "exceeds the 512 tokens" in err and "--allow-beyond-max" in err
    assert main(["convert", "llama2c", str(src / "tok512.bin"), "--tokenizer", str(src / "tok512.bin"),
                 "--out", str(tmp_path / "x")]) == 2


def test_chunked_prefill_at_2048_equals_one_pass(stories):
    """The converted model at 2048 tokens (4x its 512 training length): a chunked prefill (chunk 512, KV cache,
    logits only where asked) gives the one-pass logits."""
    from lctx.models.adapters.hf import load_lm

    _, out = stories
    lm = load_lm(str(out), device="cpu", chunk_size=512)
    ids = lm.with_bos(lm.encode(STORY * 8))[:2048]
    assert len(ids) == 2048
    want = [0, 511, 512, 1023, 1500, 2046]
    _, got = lm.prefill(ids, want=want)
    with torch.no_grad():
        full = lm.model(input_ids=torch.tensor([ids])).logits[0]
    for p in want + [2047]:
        torch.testing.assert_close(got[p], full[p].float(), atol=1e-4, rtol=1e-4)


# -- loading Hugging Face checkpoint directories (models/adapters/hf.py load_lm) -------------------------------

@pytest.fixture
def tiny_hf(tmp_path, stories):
    """A tiny random Llama saved with the stories tokenizer (vocab 512)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    d = tmp_path / "tiny"
    model.save_pretrained(d)
    AutoTokenizer.from_pretrained(stories[1]).save_pretrained(d)
    return d, model


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


def test_bin_weights_load_only_with_weights_only(tiny_hf, tmp_path):
    """A plain .bin loads (torch.load weights_only=True); one that pickles code is refused and never runs."""
    from lctx.models.adapters.hf import load_lm

    d, model = tiny_hf
    (d / "model.safetensors").unlink()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(sd, d / "pytorch_model.bin")
    lm = load_lm(str(d), device="cpu")
    torch.testing.assert_close(lm.model.model.embed_tokens.weight, model.model.embed_tokens.weight)
    _Evil.marker = tmp_path / "pwned"
    sd["evil"] = _Evil()
    torch.save(sd, d / "pytorch_model.bin")
    with pytest.raises(LctxError, match="weights_only"):
        load_lm(str(d), device="cpu")
    assert not _Evil.marker.exists()


def test_safetensors_preferred_over_bin(tiny_hf):
    from lctx.models.adapters.hf import load_lm

    d, model = tiny_hf
    sd = {k: v.clone() + 1.0 for k, v in model.state_dict().items()}
    torch.save(sd, d / "pytorch_model.bin")  # different weights beside the safetensors
    lm = load_lm(str(d), device="cpu")
    torch.testing.assert_close(lm.model.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_remote_code_needs_the_flag(tiny_hf, tmp_path):
    """A checkpoint with auto_map code: refused with a one-line error naming --trust-remote-code; its code
    never runs."""
    from lctx.models.adapters.hf import load_lm

    d, _ = tiny_hf
    marker = tmp_path / "ran"
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="lctx_test_remote", auto_map={"AutoConfig": "configuration_x.XConfig",
                                                        "AutoModelForCausalLM": "modeling_x.XModel"})
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "configuration_x.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                          "from transformers import LlamaConfig\n"
                                          "class XConfig(LlamaConfig):\n    model_type = 'lctx_test_remote'\n")
    with pytest.raises(LctxError, match="--trust-remote-code"):
        load_lm(str(d), device="cpu")
    assert not marker.exists()
