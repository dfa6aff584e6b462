"""Tests of lctx.harness.commands.train: a tiny end-to-end run (learns, saves a loadable checkpoint, deterministic)
and the user-facing errors."""

import json
import math

import pytest
import torch

from helpers import assert_one_line_error, run_cli
from lctx.errors import LctxError
from lctx.tasks.textdata import pydoc_corpus
from lctx.harness.commands.train import lr_at, sample_crops, split_streams, train

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


def test_train_log_names_the_code_that_trained(run):
    """train_log.json records the lctx revision that trained (as run.json does for an evaluation), so a results
    README can quote the code each model ran with: the checkout's own revision, -dirty when it is modified."""
    import lctx
    from lctx.harness.run.runner import git_revision

    _, log = run
    assert log["lctx_version"] == lctx.__version__
    assert log["git_rev"] == git_revision() and log["git_rev"]


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
    from lctx.harness.commands.train import evaluate

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
    (dict(variant_options="lsh_samples=4"), "variant_options must be a dict"),  # was a bare ValueError (dict(str))
])
def test_bad_args(tmp_path, docs, bad, match):
    with pytest.raises(LctxError, match=match):
        train(docs, tmp_path / "bad", **{**TINY, **bad})
    assert not (tmp_path / "bad").exists()


# -- issue 12: weight decay on matrices only; retrieval documents in training -------------------------

def test_weight_decay_exempts_gains_and_biases():
    # interdomain's input-norm gain and per-head biases are 2-D but are gains/biases: no decay (issue 12 item 5)
    import sys

    from lctx.harness.commands.train import param_groups
    from lctx.models import LctxForCausalLM

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from helpers import tiny_config

    m = LctxForCausalLM(tiny_config("interdomain"))
    decay, rest = (set(g["names"]) for g in param_groups(m, 0.1))
    for layer in range(2):
        v = f"model.layers.{layer}.attn.variant."
        assert {v + "norm_weight", v + "bias_k", v + "bias_v", v + "log_A_real", v + "B"} <= rest
        assert {v + "conv_q", v + "conv_k", f"model.layers.{layer}.attn.q_proj.weight"} <= decay
        assert f"model.layers.{layer}.attn_norm.weight" in rest
    s4d = LctxForCausalLM(tiny_config("s4d"))
    decay, rest = (set(g["names"]) for g in param_groups(s4d, 0.1))
    assert "model.layers.0.attn.variant.D" in rest and "model.layers.0.attn.variant.C" in decay


def test_weight_decay_groups_match_the_bam_reference_rule():
    # port of BAM train.py lines 306-318: decayed iff p.squeeze().dim() >= 2 and 'prior' not in name
    import sys

    from lctx.harness.commands.train import param_groups
    from lctx.models import LctxForCausalLM

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from helpers import tiny_config

    m = LctxForCausalLM(tiny_config("ggd_bam+ssmax"))
    param_dict = {pn: p for pn, p in m.named_parameters() if p.requires_grad}
    ref_decay = {n for n, p in param_dict.items() if p.squeeze().dim() >= 2 and "prior" not in n}
    decay, rest = (set(g["names"]) for g in param_groups(m, 0.1))
    assert decay == ref_decay and rest == set(param_dict) - ref_decay
    assert any("prior.beta" in n for n in rest) and any("ssmax_scale" in n for n in rest)


@pytest.fixture(scope="module")
def doc_lm(docs):
    from lctx.harness.commands.train import TokenizerLM
    from lctx.models.tokenizer import train_tokenizer

    return TokenizerLM(train_tokenizer([t for _, t in docs], 400))


def test_retrieval_documents_are_the_passkey_task_prompts(docs, doc_lm):
    from lctx.harness.commands.train import RetrievalMix, sample_batch
    from lctx.tasks import Cell
    from lctx.tasks.passkey import Passkey

    stream = torch.tensor(doc_lm.encode(" ".join(t for _, t in docs)))
    mix = RetrievalMix(fraction=0.5)
    counter = [0]
    b = sample_batch(stream, 8, 200, torch.Generator().manual_seed(0), mix, doc_lm, counter)
    assert b.shape == (8, 200) and (b[:, 0] == 1).all()
    assert counter[0] == 4  # half of 8 windows
    texts = [doc_lm.decode(r.tolist()) for r in b]
    assert all(t.startswith("There is an important info hidden") for t in texts[:4])
    assert not any("The pass key is" in t for t in texts[4:])
    for r, t in enumerate(texts[:4]):
        ids = b[r].tolist()
        eos = ids.index(2)
        key = t.split("The pass key is ")[1][:5]
        assert t.count(key) == 3  # needle (twice) and the answer
        answer = doc_lm.encode(" " + key + ".")
        assert ids[eos - len(answer): eos] == answer
        assert doc_lm.decode(ids[: eos - len(answer)]).endswith("What is the pass key? The pass key is")
    # a document is the very prompt the passkey task builds (same code) for a length that leaves room for
    # " key." and EOS, then the answer and EOS
    doc = mix.document(doc_lm, "passkey", 180, 0.37, 11)
    n_answer = len(doc_lm.encode(" 11111."))
    s = Passkey().build(doc_lm, Cell(180 - n_answer - 1, 0.37, 11), mix.seed)
    assert doc == s.input_ids + doc_lm.encode(" " + s.meta["key"] + ".") + [2]
    assert len(doc) <= 180
    again = sample_batch(stream, 8, 200, torch.Generator().manual_seed(0), mix, doc_lm, [0])
    assert torch.equal(b, again)  # deterministic in the generator


def test_retrieval_niah_documents(docs, doc_lm, data_dir):
    from lctx.harness.commands.train import RetrievalMix

    mix = RetrievalMix(fraction=1.0, tasks=("niah_single_1",), data_dir=str(data_dir))
    doc = mix.document(doc_lm, "niah_single_1", 400, 0.3, 7)
    text = doc_lm.decode(doc)
    assert len(doc) <= 400 and doc[0] == 1 and doc[-1] == 2
    import re

    value = re.search(r"special magic numbers for [\w-]+ is: (\d{7})\.", text).group(1)  # the needle
    assert text.rstrip().endswith(f"mentioned in the provided text is {value}.")


def test_train_with_retrieval_mix_logs_it(docs, tmp_path):
    from lctx.harness.commands.train import RetrievalMix

    with pytest.raises(LctxError, match="cannot hold a passkey retrieval document"):
        train(docs, tmp_path / "short", **{**TINY, "steps": 1}, retrieval=RetrievalMix(fraction=0.25))
    log = train(docs, tmp_path / "mix", **{**TINY, "steps": 4, "eval_every": 4, "context_length": 256},
                retrieval=RetrievalMix(fraction=0.25))
    assert log["retrieval"]["fraction"] == 0.25 and log["retrieval"]["tasks"] == ["passkey"]
    assert all(0 <= e["passkey_tf_exact"] <= 1 for e in log["evals"])  # the learning curve of retrieval
    assert 4 <= log["retrieval_docs"] <= 12  # 8 windows x 4 steps x 0.25 = 8 in expectation, at most 2 per step
    with pytest.raises(LctxError, match="retrieval fraction"):
        train(docs, tmp_path / "bad", **TINY, retrieval=RetrievalMix(fraction=1.5))
    with pytest.raises(LctxError, match="unknown task"):
        train(docs, tmp_path / "bad", **TINY, retrieval=RetrievalMix(fraction=0.5, tasks=("passkeys",)))


def test_retrieval_template_too_long_for_any_tokenizer_is_refused_before_tokenizer_training(docs, tmp_path,
                                                                                           monkeypatch):
    # issue 24 item 10: a window no tokenizer can fit a passkey document in is refused before the tokenizer
    # trains (it took 100 s on books); one that only the trained tokenizer can judge is checked after it
    import lctx.harness.commands.train as tr
    from lctx.harness.commands.train import RetrievalMix

    real = tr.train_tokenizer
    calls = []

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    def refuse(*a, **kw):
        raise AssertionError("the tokenizer was trained before the template check")

    monkeypatch.setattr(tr, "train_tokenizer", refuse)
    with pytest.raises(LctxError, match="cannot hold a passkey retrieval document even at one token per word"):
        train(docs, tmp_path / "short", **{**TINY, "steps": 1}, retrieval=RetrievalMix(fraction=1.0))
    # ctx 100, vocab 300: the floor (about 65 tokens) fits, the trained tokenizer's template (~180) does not
    monkeypatch.setattr(tr, "train_tokenizer", counting)
    with pytest.raises(LctxError, match=r"cannot hold a passkey retrieval document \(.*--vocab-size"):
        train(docs, tmp_path / "short2", **{**TINY, "steps": 1, "context_length": 100},
              retrieval=RetrievalMix(fraction=1.0))
    assert calls == [1]


def test_passkey_probe_matches_the_passkey_tasks_digit_accuracy(run, doc_lm):
    # the training-time probe is the passkey task's teacher-forced digit_acc on the same prompts
    from lctx.models.adapters.hf import load_lm
    from lctx.harness.commands.train import passkey_probe
    from lctx.tasks import Cell
    from lctx.tasks.passkey import Passkey

    out, _ = run
    lm = load_lm(str(out), device="cpu")
    task = Passkey()
    prompts, want = [], []
    for i in range(3):
        s = task.build(lm, Cell(220, i / 2, i), 3)
        answer = lm.encode(" " + s.meta["key"])
        prompts.append((s.input_ids, answer, [j for j, t in enumerate(answer) if lm.decode([t]).strip().isdigit()]))
        want.append(task.score(lm, s)["digit_acc"])
    got = passkey_probe(lm.model, prompts, torch.device("cpu"))
    assert got["passkey_tf_digit_acc"] == pytest.approx(sum(want) / 3, abs=1e-6)


@pytest.mark.usefixtures("plain_console")
def test_train_warns_when_warmup_covers_every_step(tmp_path):
    """Issue 16 and trial 21 item 9: a refused training run prints its error alone, no warm-up warning first."""
    from lctx.errors import LctxError
    from lctx.harness.commands.train import train

    got: list[str] = []
    with pytest.raises(LctxError, match="no training text"):  # a refused run: its error line alone (trial21 9)
        train([("empty", "")], tmp_path / "m", steps=30, warmup_steps=50, progress=False, log=None, warn=got.append)
    assert got == []


@pytest.mark.slow
@pytest.mark.usefixtures("plain_console")
def test_train_warns_when_warmup_covers_every_step_once_it_can_run(tmp_path):
    """Issue 16: a warm-up as long as the run is warned about, once the run can start."""
    from lctx.harness.commands.train import train

    got: list[str] = []
    text = "The module documents every function it exports. A function takes arguments and returns a value. " * 40
    tiny = dict(context_length=16, hidden_size=16, num_layers=1, num_heads=2, vocab_size=300, batch_size=2,
                eval_every=100, eval_batches=1, progress=False, log=None, warn=got.append)
    train([("doc", text)], tmp_path / "m", steps=2, warmup_steps=5, **tiny)  # the warning, once the run can start
    assert len(got) == 1 and "warm-up of 5 steps >= 2 steps" in got[0] and "never decays" in got[0]
    got.clear()
    train([("doc", text)], tmp_path / "m2", steps=2, warmup_steps=1, **tiny)
    assert got == []


@pytest.mark.slow
@pytest.mark.usefixtures("plain_console")
def test_cli_train_prints_the_warmup_warning_on_stderr(capsys, tmp_path):
    """Issue 16: lctx train prints the warm-up warning on stderr, never on stdout."""
    code, out, err = run_cli(["train", "--steps", "2", "--context-length", "32", "--hidden-size", "16", "--layers", "1",
                              "--heads", "2", "--vocab-size", "300", "--batch-size", "2", "--no-progress",
                              "--out", tmp_path / "m"], capsys)
    assert code == 0, err
    assert err.startswith("warning: warm-up of 50 steps >= 2 steps (--warmup, --steps)"), err
    assert "warning" not in out


@pytest.mark.usefixtures("isolated_digests")
def test_short_train_data_prints_the_error_alone(capsys, tmp_path):
    """Trial 21 item 2: too little training text is one error line, with no warm-up warning before it."""
    f = tmp_path / "tiny.txt"
    f.write_text("a few words only\n")
    code, _, err = run_cli(["train", "--data", f, "--steps", "1", "--out", tmp_path / "ck"], capsys)
    assert_one_line_error(code, err, "not enough text")  # one line: no warm-up warning before it
