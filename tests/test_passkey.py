"""lctx.tasks.passkey: budgeting, needle placement, answer parsing, scoring."""

from __future__ import annotations


import pytest
import torch
from torch import nn

from helpers import _forward_work
from lctx.models.adapters.hf import HFAdapter
from lctx.tasks import Cell
from lctx.tasks.passkey import FILLER_SENTENCES, NEEDLE, Passkey, parse_answer


def test_parse_answer():
    # Issue 2: " 48213." matches key 48213; "482137" does not; the first number is the answer.
    assert parse_answer(" 48213.") == "48213"
    assert parse_answer("482137") != "48213"
    assert parse_answer(" 12345 and 48213") == "12345"
    assert parse_answer(" no digits") is None


@pytest.fixture
def lm(make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    return load_lm(str(make_checkpoint("rope")), device="cpu")


@pytest.mark.parametrize("length", [200, 257, 512, 1000])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_passkey_budget_and_needle_intact(lm, length, depth):
    task = Passkey()
    s = task.build(lm, Cell(length, depth, 0), seed=3)
    key = s.meta["key"]
    assert len(key) == 5 and key.isdigit()
    assert s.n_tokens == len(s.input_ids) <= length
    # within one filler sentence of the target: one more sentence would not fit
    longest = max(len(lm.encode(x)) for x in FILLER_SENTENCES)
    assert length - s.n_tokens <= longest
    text = lm.decode(s.input_ids)
    assert NEEDLE.format(key=key) in text
    assert text.rstrip().endswith("What is the pass key? The pass key is")
    # needle tokens appear contiguously and the measured depth is where they start
    needle = lm.encode(NEEDLE.format(key=key))
    starts = [i for i in range(len(s.input_ids)) if s.input_ids[i : i + len(needle)] == needle]
    assert len(starts) == 1
    assert s.depth == pytest.approx(starts[0] / s.n_tokens, abs=1e-9)
    if depth == 0.0:
        assert s.depth < 0.5
    if depth == 1.0:
        assert s.depth > 0.5


def test_passkey_is_deterministic_and_keys_vary(lm):
    task = Passkey()
    a = task.build(lm, Cell(300, 0.5, 0), seed=1)
    assert a.input_ids == task.build(lm, Cell(300, 0.5, 0), seed=1).input_ids
    keys = {task.build(lm, Cell(300, 0.5, s), seed=1).meta["key"] for s in range(8)}
    assert len(keys) > 1


def test_passkey_too_short_raises(lm):
    with pytest.raises(ValueError, match="shorter than the passkey template"):
        Passkey().build(lm, Cell(20, 0.5, 0), seed=0)


def test_passkey_score_oracle_model(lm):
    """A model forced to emit the key scores exact = 1 and digit_acc = 1; a wrong key scores 0."""
    task = Passkey()
    s = task.build(lm, Cell(300, 0.5, 0), seed=0)
    answer = lm.encode(" " + s.meta["key"] + ".")

    class Oracle(nn.Module):
        """Predicts the answer tokens in order after the prompt, whatever it sees."""

        def __init__(self, n_prompt):
            super().__init__()
            self.n_prompt, self.seen = n_prompt, 0

        def forward(self, input_ids, cache=None, use_cache=None, logits_to_keep=0, **kw):
            T = input_ids.shape[1]
            start = cache.n
            cache.n += T
            pos = torch.arange(start, start + T)
            if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
                pos = pos[-1:] if isinstance(logits_to_keep, int) else pos[logits_to_keep]
            logits = torch.zeros(1, len(pos), len(lm.tokenizer))
            for i, p in enumerate(pos.tolist()):
                k = p - (self.n_prompt - 1)
                if 0 <= k < len(answer):
                    logits[0, i, answer[k]] = 10.0
            return type("Out", (), {"logits": logits, "cache": cache})()

    class Cache:
        def __init__(self):
            self.n = 0

        def get_seq_length(self):
            return self.n

        def crop(self, neg):
            self.n += neg

    import lctx.models.adapters.hf as lm_mod

    orig = lm_mod.DynamicCache
    lm_mod.DynamicCache = Cache
    try:
        oracle_lm = HFAdapter(model=Oracle(s.n_tokens), tokenizer=lm.tokenizer, name="oracle", path="-", variant="x",
                       train_length=None, max_length=None, device=torch.device("cpu"), dtype=torch.float32,
                       chunk_size=64)
        assert task.score(oracle_lm, s) == {"exact": 1.0, "digit_acc": 1.0}
        s.meta["key"] = "99999" if s.meta["key"] != "99999" else "11111"
        assert task.score(oracle_lm, s)["exact"] == 0.0
    finally:
        lm_mod.DynamicCache = orig


@pytest.mark.usefixtures("plain_console")
def test_passkey_cost_is_its_prompt_and_decode_steps(lm, monkeypatch):
    """Issue 16 item 2: a passkey cell's cost (the progress bar's weight) is its prompt and decode steps."""
    from lctx.tasks import Cell
    from lctx.tasks.passkey import Passkey

    task = Passkey()
    work = _forward_work(monkeypatch, lm)
    for L in (160, 400):
        work.clear()
        s = task.build(lm, Cell(L, 0.5, 0), 0)
        task.score(lm, s)
        # prompt (within one filler sentence of L) + greedy steps + the teacher-forced key, in prefill tokens
        assert 0.9 < sum(work) / task.cost(lm, s.cell) <= 1.0, (L, sum(work), task.cost(lm, s.cell))


@pytest.mark.usefixtures("plain_console")
def test_passkey_min_length_is_its_template(lm):
    """Issue 16 item 3: passkey's minimum length is its template: that length fits, one less is refused."""
    from lctx.tasks import Cell
    from lctx.tasks.passkey import Passkey

    task = Passkey()
    m = task.min_length(lm)
    assert task.build(lm, Cell(m, 0.5, 0), 0).n_tokens <= m
    with pytest.raises(ValueError, match="shorter than the passkey template"):
        task.build(lm, Cell(m - 1, 0.5, 0), 0)
