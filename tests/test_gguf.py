"""lctx.models.adapters.gguf, GGUF checkpoints (issue 11, item 1): dequantised through transformers' GGUF support,
cached by content hash, converted by `lctx convert gguf`, named by the file stem; one-line errors for damaged
input."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from gguf_tiny import write_tiny_gguf
from helpers import TEXT, assert_one_line_error, ppl_task, run_cli, sweep, value
from lctx.models import fingerprint as F


@pytest.fixture
def tiny_gguf(tmp_path):
    d = tmp_path / "g"
    d.mkdir()
    return write_tiny_gguf(d / "tiny-llama.Q0.gguf")


def test_gguf_loads_as_transformers_does_and_is_named_by_stem(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM

    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(tiny_gguf), device="cpu", cache_dir=str(tmp_path / "cache"))
    assert lm.name == "tiny-llama.Q0"  # the file stem, not the hash-named cache directory
    assert lm.path == str(tiny_gguf) and lm.variant == "llama" and lm.max_length == 128
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).eval()
    ids = torch.tensor([[1, 5, 70, 80, 90, 259]])
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids).logits, ref(ids).logits)  # the cache holds what transformers reads
    assert lm.tokenizer.chat_template  # the template inside the GGUF came along


def test_cache_keyed_by_content_hash(tiny_gguf, tmp_path, monkeypatch):
    from lctx.models.adapters import gguf as G

    cache = tmp_path / "cache"
    d1, h1 = G.cached_gguf_dir(tiny_gguf, cache_dir=cache)
    assert d1 == cache / "gguf" / f"{h1}-float32" and json.loads((d1 / G.META_FILE).read_text())["sha256"] == h1
    calls = []
    real = G.convert_gguf
    monkeypatch.setattr(G, "convert_gguf", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert G.cached_gguf_dir(tiny_gguf, cache_dir=cache) == (d1, h1) and calls == []  # second load: no conversion
    st = tiny_gguf.stat()
    size = st.st_size
    write_tiny_gguf(tiny_gguf, seed=1)  # other weights, same size, same mtime: a cp -p / rsync -a replacement
    os.utime(tiny_gguf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert tiny_gguf.stat().st_size == size
    d2, h2 = G.cached_gguf_dir(tiny_gguf, cache_dir=cache)
    assert h2 != h1 and d2 != d1 and len(calls) == 1  # never the stale entry
    assert G.cached_gguf_dir(tiny_gguf, cache_dir=cache, dtype="bfloat16")[0].name == f"{h2}-bfloat16"


def test_half_written_cache_entry_is_rebuilt(tiny_gguf, tmp_path):
    from lctx.models.adapters import gguf as G

    cache = tmp_path / "cache"
    h = G.sha256_file(tiny_gguf)
    broken = cache / "gguf" / f"{h}-float32"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")  # no weights, no lctx_gguf.json: a killed conversion
    d, _ = G.cached_gguf_dir(tiny_gguf, cache_dir=cache)
    assert (d / "model.safetensors").is_file()


def test_directory_with_one_gguf_and_convert_command(tiny_gguf, tmp_path, capsys):
    code, out, err = run_cli(["convert", "gguf", tiny_gguf, "--out", tmp_path / "hf"], capsys)
    assert code == 0, err
    assert (tmp_path / "hf" / "model.safetensors").is_file() and (tmp_path / "hf" / "tokenizer.json").is_file()
    from lctx.models.adapters.hf import load_lm

    a = load_lm(str(tmp_path / "hf"), device="cpu")
    b = load_lm(str(tiny_gguf.parent), device="cpu", cache_dir=str(tmp_path / "c"))  # a folder holding one .gguf
    assert b.name == "tiny-llama.Q0"
    ids = torch.tensor([[1, 100, 101, 102]])
    with torch.no_grad():
        # bit-exact by construction: the same fp32 weights (stored unquantised) through the same kernels in one process
        assert torch.equal(a.model(ids).logits, b.model(ids).logits)


def test_one_line_errors(tiny_gguf, tmp_path, capsys):
    # a truncated file (the tensors cut off)
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "t.gguf").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(["run", "-m", cut / "t.gguf", "--tasks", "passkey", "--lengths", "64", "--cache-dir",
                            tmp_path / "c", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "truncated", "t.gguf")
    # an architecture transformers cannot read from GGUF
    (tmp_path / "rw").mkdir()
    write_tiny_gguf(tmp_path / "rw" / "r.gguf", arch="rwkv6")
    code, _, err = run_cli(["run", "-m", tmp_path / "rw" / "r.gguf", "--tasks", "passkey", "--lengths", "64",
                            "--cache-dir", tmp_path / "c", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "rwkv6", "cannot load from GGUF")
    # several .gguf files in one directory
    write_tiny_gguf(tiny_gguf.parent / "other.gguf", seed=2)
    code, _, err = run_cli(["run", "-m", tiny_gguf.parent, "--tasks", "passkey", "--lengths", "64", "--out",
                            tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "2 .gguf files", "other.gguf")
    # not a GGUF at all
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    code, _, err = run_cli(["convert", "gguf", tmp_path / "x.gguf", "--out", tmp_path / "hf"], capsys)
    assert_one_line_error(code, err, "not a GGUF file")


@pytest.mark.slow
def test_smollm2_gguf_passkey_1k(data_dir, tmp_path, capsys):
    """The issue's done-when: SmolLM2-135M-Instruct Q4_1 retrieves the passkey at 1K, depth 0.5."""
    gguf_file = data_dir / "checkpoints" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf_file.is_file():
        pytest.skip("SmolLM2 GGUF not in the data dir")
    code, out, err = run_cli(["run", "-m", gguf_file, "--tasks", "passkey", "--lengths", "1k", "--depths", "0.5",
                              "--samples", "1", "--out", tmp_path / "o", "--no-progress"], capsys)
    assert code == 0, err
    import pandas as pd

    s = pd.read_csv(tmp_path / "o" / "summary.csv")
    row = s[(s["metric"] == "exact")].iloc[0]
    assert row["model"] == "SmolLM2-135M-Instruct.Q4_1" and row["mean"] == 1.0


def test_no_progress_silences_the_dequantising_bar(tiny_gguf, tmp_path, capfd):
    # transformers draws "Converting and de-quantizing GGUF tensors..." with its own tqdm, which
    # hf_logging.disable_progress_bar() does not reach; --no-progress (progress=False) must hide it
    from lctx.models.adapters.gguf import convert_gguf

    capfd.readouterr()
    convert_gguf(tiny_gguf, tmp_path / "shown")
    assert "de-quantizing" in capfd.readouterr().err  # the bar exists (else the check below proves nothing)
    convert_gguf(tiny_gguf, tmp_path / "quiet", progress=False)
    assert "de-quantizing" not in capfd.readouterr().err
    import transformers.modeling_gguf_pytorch_utils as M
    from tqdm.auto import tqdm

    assert M.tqdm is tqdm  # restored afterwards


@pytest.mark.slow
def test_report_of_a_gguf_run_says_how_to_give_its_train_length(tiny_gguf, tmp_path, capsys):
    # a GGUF records no training length; run.json keeps its declared maximum (llama.context_length = 128 in
    # the tiny file), and lctx report labels it as that, with the hint to pass --train-length
    from helpers import run_cli

    code, _, err = run_cli(["run", "--model", tiny_gguf, "--tasks", "ppl", "--lengths", "64", "--ppl-max-tokens",
                            "128", "--no-progress", "--device", "cpu", "--cache-dir", tmp_path / "cache",
                            "--out", tmp_path / "o"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "run.json").read_text())["max_positions"] == {"tiny-llama.Q0": 128}
    code, out, err = run_cli(["report", tmp_path / "o", "--out", tmp_path / "rep"], capsys)
    assert code == 0, err
    assert "note: Train length unknown for tiny-llama.Q0" in out and "declares max positions 128" in out


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_digests")
def test_gguf_content_is_the_model_fingerprint(tmp_path, monkeypatch):
    """Issue 10 item 1: a GGUF's own bytes are its model fingerprint; other weights of the same size and mtime rerun."""
    from gguf_tiny import write_tiny_gguf

    monkeypatch.setenv("LCTX_CACHE_DIR", str(tmp_path / "cache"))
    g = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = tmp_path / "doc.txt"
    data.write_text(TEXT)
    out = tmp_path / "o"
    first = sweep(g, [ppl_task(data)], out, cache_dir=str(tmp_path / "cache"))
    assert first["ran"] == 1
    meta = json.loads((out / "run.json").read_text())
    assert meta["inputs"]["models"]["tiny"]["files"] == {"tiny.gguf": F.file_digest(g)}  # the GGUF's own bytes
    st = os.stat(g)
    write_tiny_gguf(g, seed=1)  # other weights, same size; mtime put back as cp -p leaves it
    os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(g).st_size == st.st_size
    second = sweep(g, [ppl_task(data)], out, cache_dir=str(tmp_path / "cache"))
    assert second["ran"] == 1 and second["superseded"] == 1
    assert value(second, "ppl", "ppl") != value(first, "ppl", "ppl")
    # byte-identical copy elsewhere, same stem: the same fingerprint, so a run there would resume
    (tmp_path / "copy").mkdir()
    shutil.copy2(g, tmp_path / "copy" / "tiny.gguf")
    again = sweep(tmp_path / "copy" / "tiny.gguf", [ppl_task(data)], out, cache_dir=str(tmp_path / "cache"))
    assert again["ran"] == 0


@pytest.mark.usefixtures("isolated_digests")
def test_convert_gguf_missing_file_says_it_does_not_exist(capsys, tmp_path):
    """Trial 21 item 2: lctx convert gguf on a missing file says that it does not exist."""
    code, _, err = run_cli(["convert", "gguf", tmp_path / "nonexistent.gguf", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "does not exist")


def write_gemma3_header(path, vocab: int = 300):
    """A Gemma 3 GGUF that holds only the metadata a config needs and one tensor: a vocabulary longer than
    read_gguf_header reads (GGUF_STRING_ARRAY_LIMIT), a sliding window, tied embeddings (no output.weight)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_context_length(32768)
    w.add_block_count(3)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(512)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_tensor("token_embd.weight", np.zeros((vocab, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_config_from_the_header_equals_transformers(tiny_gguf, tmp_path):
    """Issue 28 item 3: the config comes from the header alone, equal to the one transformers' GGUF reader builds
    (which parses every vocabulary entry through gguf.GGUFReader: 5 s for SmolLM2, minutes for Gemma 3)."""
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from lctx.models.adapters.gguf import (GGUF_STRING_ARRAY_LIMIT, SkippedArray, gguf_config, gguf_config_dict,
                                           read_gguf_header)

    gemma = write_gemma3_header(tmp_path / "gemma.gguf")
    for f in (tiny_gguf, gemma):
        meta, names = read_gguf_header(f)
        assert gguf_config_dict(meta, names) == load_gguf_checkpoint(str(f), return_tensors=False)["config"]
        ours = gguf_config(f).to_dict()
        assert ours == AutoConfig.from_pretrained(str(f.parent), gguf_file=f.name).to_dict()
    meta, _ = read_gguf_header(gemma)
    tokens = meta["tokenizer.ggml.tokens"]  # walked over, not read: its length only
    assert isinstance(tokens, SkippedArray) and tokens == 300 > GGUF_STRING_ARRAY_LIMIT
    cfg = gguf_config(gemma)
    # control: the values are the file's, not a class's defaults
    assert (cfg.model_type, cfg.vocab_size, cfg.sliding_window, cfg.head_dim, cfg.tie_word_embeddings) == (
        "gemma3_text", 300, 512, 16, True)


def test_plan_of_a_gguf_reads_its_header_only(tiny_gguf, tmp_path, monkeypatch, capsys):
    """Issue 28 item 3: `lctx plan --model X.gguf` neither dequantises (no cache directory is made) nor parses the
    header with gguf.GGUFReader, and answers in under 5 s of CPU."""
    import time

    import gguf

    def refuse(*a, **kw):
        raise AssertionError("lctx plan parsed the file with gguf.GGUFReader")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("LCTX_CACHE_DIR", str(tmp_path / "cache"))
    t0 = time.process_time()  # CPU time: a busy machine stretches wall time, not the work done (issue 42)
    code, out, err = run_cli(["plan", "--model", tiny_gguf, "--length", "4k", "--device", "cpu"], capsys)
    took = time.process_time() - t0
    assert code == 0, err
    assert "memory plan: tiny-llama.Q0" in out and "fits:" in out
    assert took < 5, took
    assert not (tmp_path / "cache").exists()
    # control: a damaged header is one line, from the header reader
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:200])
    code, _, err = run_cli(["plan", "--model", cut, "--length", "4k", "--device", "cpu"], capsys)
    assert_one_line_error(code, err, "cut.gguf", "header")
