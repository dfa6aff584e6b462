"""lctx.tasks.passkey: budgeting, needle placement, answer parsing, scoring."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from helpers import _forward_work
from lctx.models.adapters.hf import HFAdapter
from lctx.tasks import Cell
from lctx.tasks.passkey import FILLER_SENTENCES, NEEDLE, Passkey, parse_answer
from lctx.tasks.ppl import Perplexity, sliding_nll, window_plan


class PositionNLLModel(nn.Module):
    """Mock causal LM over ids 0..N-1 = positions: log p(token v) = -v exactly for v >= 1, so the NLL of
    token t (whose id is t) is t, whatever the context. Id 99 absorbs the remaining mass
    (sum_{v=1..19} e^-v < 1). Takes the same cache / logits_to_keep arguments as lctx models."""

    def __init__(self, vocab: int = 100):
        super().__init__()
        logp = torch.full((vocab,), -1e9, dtype=torch.float64)
        logp[1:20] = -torch.arange(1, 20, dtype=torch.float64)
        logp[99] = math.log(1 - torch.exp(logp[1:20]).sum().item())
        self.register_buffer("logp", logp)

    def forward(self, input_ids, cache=None, use_cache=None, logits_to_keep=0, **kw):
        T = input_ids.shape[1]
        idx = torch.arange(T) if isinstance(logits_to_keep, int) and logits_to_keep == 0 else logits_to_keep
        logits = self.logp.float()[None, None].expand(1, len(torch.atleast_1d(idx)), -1)
        return type("Out", (), {"logits": logits, "cache": cache})()


class NullCache:
    def get_seq_length(self):
        return 0


def mock_lm() -> HFAdapter:
    tok = type("Tok", (), {"bos_token_id": None, "eos_token_id": None})()
    return HFAdapter(model=PositionNLLModel(), tokenizer=tok, name="mock", path="-", variant="mock", train_length=None,
              max_length=None, device=torch.device("cpu"), dtype=torch.float32, chunk_size=4)


def test_ppl_token_weighted_each_token_once():
    # Issue 2: N = 20 tokens (ids = positions), NLL(token t) = t, window 10, stride 5, no BOS.
    # Tokens 1..19 are each scored once -> mean NLL = (1+...+19)/19 = 10 exactly. A per-window
    # average would give mean(mean(1..9), mean(10..14), mean(15..19)) = (5 + 12 + 17)/3 = 11.33.
    lm = mock_lm()
    doc = list(range(20))
    total, count = sliding_nll(lambda ids, tg: lm.token_nll(ids, tg)[0], doc, window=10, stride=5, bos_id=None)
    assert count == 19
    assert total / count == pytest.approx(10.0, abs=1e-6)  # logits are float32


@pytest.mark.parametrize("bos", [False, True])
def test_window_plan_scores_every_token_exactly_once(bos):
    rng = random.Random(0)
    for _ in range(200):
        n, window = rng.randint(1, 300), rng.randint(3, 64)
        stride = rng.randint(1, window - 1)
        scored = []
        for begin, end, first in window_plan(n, window, stride, bos):
            assert end - begin + (1 if bos else 0) <= window  # a window never exceeds its size
            assert begin + (0 if bos else 1) <= first
            scored.extend(range(first, end))
        assert scored == list(range(0 if bos else 1, n))


def test_window_plan_rejects_gapping_stride():
    with pytest.raises(ValueError, match="stride"):
        window_plan(100, 10, 10, bos=False)


def test_ppl_task_stride_fraction_and_bos():
    t = Perplexity(stride=0.5, bos="prepend")
    assert t.window_stride(256) == (256, 128)  # (256 - 1) * 0.5 rounds to 128
    assert Perplexity(stride=64).window_stride(256) == (256, 64)
    with pytest.raises(ValueError):
        Perplexity(bos="sometimes")


@pytest.mark.slow
def test_ppl_bos_policy_scores_first_token(tokenizer, make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("alibi")), device="cpu")
    doc = lm.encode("The quick brown fox jumps over the lazy dog. " * 8)
    t_bos, c_bos = sliding_nll(lambda i, t: lm.token_nll(i, t)[0], doc, 32, 16, lm.bos_id)
    t_no, c_no = sliding_nll(lambda i, t: lm.token_nll(i, t)[0], doc, 32, 16, None)
    assert c_bos == len(doc) and c_no == len(doc) - 1


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
