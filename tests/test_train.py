"""Tests of lctx.harness.train: a tiny end-to-end run (learns, saves a loadable checkpoint, deterministic)
and the user-facing errors."""

import json
import math

import pytest
import torch

from lctx.harness.errors import LctxError
from lctx.harness.textdata import pydoc_corpus
from lctx.harness.train import lr_at, sample_crops, split_streams, train

TINY = dict(context_length=64, hidden_size=32, num_layers=2, num_heads=4, vocab_size=300, steps=40,
            batch_size=8, lr=1e-2, warmup_steps=5, eval_every=20, eval_batches=2, progress=False, log=None)


@pytest.fixture(scope="module")
def docs():
    return pydoc_corpus()[:12]


@pytest.fixture(scope="module")
def run(docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    return out, train(docs, out, **TINY)


@pytest.mark.slow
def test_learns_and_logs(run):
    out, log = run
    assert [e["step"] for e in log["evals"]] == [0, 20, 40]
    assert abs(log["initial_val_loss"] - math.log(log["vocab_size"])) < 0.3
    assert log["final_val_loss"] < log["initial_val_loss"] - 0.5
    assert log["n_params"] > 0 and log["tokens_per_second"] > 0
    assert log["corpus"][0] == "assert" and log["args"]["steps"] == 40
    assert json.loads((out / "train_log.json").read_text()) == json.loads(json.dumps(log))


def test_checkpoint_loads_with_auto_classes(run):
    out, log = run
    import lctx.models  # noqa: F401  (registers model_type "lctx")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.train_length == 64 and model.config.variant == "rope"
    assert model.config.vocab_size == len(tok) == log["vocab_size"]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    # the reloaded model reproduces the logged final loss on the same validation crops
    from lctx.harness.train import evaluate

    token_docs = [tok(t, add_special_tokens=False)["input_ids"] for t in _doc_texts()]
    _, val = split_streams(token_docs, 0.05)
    crops = sample_crops(val, 2 * 8, 64, torch.Generator().manual_seed(1))
    assert evaluate(model, crops, 8, torch.device("cpu")) == pytest.approx(log["final_val_loss"], abs=1e-4)


def _doc_texts():
    return [t for _, t in pydoc_corpus()[:12]]


@pytest.mark.slow
def test_deterministic(run, docs, tmp_path):
    _, log = run
    log2 = train(docs, tmp_path / "again", **TINY)
    assert log2["final_val_loss"] == log["final_val_loss"]
    assert [e["val_loss"] for e in log2["evals"]] == [e["val_loss"] for e in log["evals"]]


def test_crops_and_split():
    train_s, val_s = split_streams([[10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [20, 21, 22, 23]], 0.2)
    assert train_s.tolist() == [10, 11, 12, 13, 14, 15, 16, 17, 2, 20, 21, 22]
    assert val_s.tolist() == [18, 19, 2, 23]
    c = sample_crops(train_s, 5, 4, torch.Generator().manual_seed(0))
    assert c.shape == (5, 4) and (c[:, 0] == 1).all()
    for row in c[:, 1:].tolist():  # each crop is a contiguous piece of the stream
        s = train_s.tolist()
        assert any(s[i:i + 3] == row for i in range(len(s) - 2))


def test_lr_schedule():
    kw = dict(lr=1.0, steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(99, **kw) == pytest.approx(0.1)
    vals = [lr_at(s, **kw) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))


def test_too_little_text(tmp_path):
    with pytest.raises(LctxError, match=r"not enough text: the corpus has \d+ tokens"):
        train([("tiny", "just a few words of text here. " * 3)], tmp_path / "x", **TINY)
    with pytest.raises(LctxError, match="no training text"):
        train([("empty", "   ")], tmp_path / "y", **TINY)


@pytest.mark.parametrize("bad, match", [
    (dict(hidden_size=30), "not divisible"),
    (dict(num_heads=0), "num_heads must be a positive integer"),
    (dict(steps=-1), "steps must be a positive integer"),
    (dict(context_length=0), "context_length must be a positive integer"),
    (dict(variant="no_such_variant"), "unknown attention variant"),
    (dict(val_fraction=0.0), "val_fraction"),
    (dict(vocab_size=100), "vocab_size 100 is too small"),
    (dict(lr=0.0), "lr must be a positive"),
])
def test_bad_args(tmp_path, docs, bad, match):
    with pytest.raises(LctxError, match=match):
        train(docs, tmp_path / "bad", **{**TINY, **bad})
    assert not (tmp_path / "bad").exists()
