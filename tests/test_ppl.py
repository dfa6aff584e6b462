"""lctx.tasks.ppl: token-weighted perplexity, the sliding-window plan, the ppl task's options (stride, BOS,
the data path as recorded) and its cost."""

from __future__ import annotations

import json
import math
import os
import random

import pytest
import torch
from torch import nn

from helpers import TEXT, sweep
from lctx.models.adapters.hf import HFAdapter
from lctx.tasks.ppl import Perplexity, sliding_nll, window_plan


@pytest.mark.usefixtures("isolated_digests")
def test_same_data_file_spelled_two_ways_is_one_cell(make_checkpoint, tmp_path):
    """Issue 11's SmolLM2 run (issue 10 item 3): one data file spelled two ways is one cell, and resumes."""
    # last stop's finding (issue 11's SmolLM2 run): --ppl-data ../shared/data/books/x.txt in one session and
    # /work/shared/data/books/x.txt (from LCTX_DATA_DIR) in the next made two cells, and the window reran (175 s).
    # The recorded option is now the path relative to the data root, so every spelling resumes the first.
    ck = make_checkpoint("rope")
    root = tmp_path / "data"
    (root / "books").mkdir(parents=True)
    (root / "books" / "x.txt").write_text(TEXT)
    alias = tmp_path / "link"
    alias.symlink_to(root)  # as ../shared -> /work/shared
    out = tmp_path / "o"
    first = sweep(ck, [Perplexity(data=["books/x.txt"], data_dir=str(root))], out)
    assert first["ran"] == 1
    for data, data_dir in ((str(root / "books" / "x.txt"), root), (str(alias / "books" / "x.txt"), alias),
                           (os.path.relpath(root / "books" / "x.txt"), str(alias))):
        again = sweep(ck, [Perplexity(data=[data], data_dir=data_dir)], out)
        assert again["ran"] == 0 and again["skipped"] == 1, data
    rec = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    assert rec["task_options"]["data"] == ["books/x.txt"]
    # a file outside the data root is named by its absolute real path (not as typed, not relative to the cwd)
    assert Perplexity(data=[str(alias / "books" / "x.txt")]).options["data"] == [str((root / "books" / "x.txt").resolve())]


@pytest.fixture
def lm(make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    return load_lm(str(make_checkpoint("rope")), device="cpu")


def _count_tokens(monkeypatch, lm, method: str) -> list[int]:
    fed: list[int] = []
    orig = getattr(lm, method)

    def counting(ids, *a, **kw):
        fed.append(len(ids))
        return orig(ids, *a, **kw)

    monkeypatch.setattr(lm, method, counting)
    return fed


@pytest.mark.slow
@pytest.mark.usefixtures("plain_console")
def test_ppl_cost_is_the_tokens_it_feeds(lm, monkeypatch):
    """Issue 16 item 2: the progress bar weighs a ppl cell by exactly what the model is fed: every window of every
    document."""
    from lctx.tasks import Cell
    from lctx.tasks.ppl import Perplexity

    task = Perplexity(max_tokens=600)
    fed = _count_tokens(monkeypatch, lm, "token_nll")
    for L in (32, 64, 200):
        fed.clear()
        cell = Cell(L, None, 0)
        task.score(lm, task.build(lm, cell, 0))
        assert task.cost(lm, cell) == sum(fed), L


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
    """Issue 2: perplexity weighs tokens, each scored once, not a mean of window means."""
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
    """The window plan scores every token exactly once; no window exceeds its size."""
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
    """A stride that would leave tokens unscored is refused."""
    with pytest.raises(ValueError, match="stride"):
        window_plan(100, 10, 10, bos=False)


def test_ppl_task_stride_fraction_and_bos():
    """--stride as a fraction of the window or a token count; an unknown BOS policy is refused."""
    t = Perplexity(stride=0.5, bos="prepend")
    assert t.window_stride(256) == (256, 128)  # (256 - 1) * 0.5 rounds to 128
    assert Perplexity(stride=64).window_stride(256) == (256, 64)
    with pytest.raises(ValueError):
        Perplexity(bos="sometimes")


@pytest.mark.slow
def test_ppl_bos_policy_scores_first_token(tokenizer, make_checkpoint):
    """With a BOS prepended the first token is scored too; without, it is not."""
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("alibi")), device="cpu")
    doc = lm.encode("The quick brown fox jumps over the lazy dog. " * 8)
    t_bos, c_bos = sliding_nll(lambda i, t: lm.token_nll(i, t)[0], doc, 32, 16, lm.bos_id)
    t_no, c_no = sliding_nll(lambda i, t: lm.token_nll(i, t)[0], doc, 32, 16, None)
    assert c_bos == len(doc) and c_no == len(doc) - 1


def test_ppl_windows_draw_seeded_windows_and_score_their_last_stride(lm, tmp_path):
    """Issue 31 item 3: windows=N gives N records per length, each one window at a seeded place scoring its last
    ``stride`` tokens; the score equals token_nll of those tokens fed directly (the same context); the same seed
    draws the same windows and another seed others; a corpus with fewer places than N is refused with the fix."""
    from lctx.tasks import Cell

    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT * 4)
    t = Perplexity(data=[str(doc)], windows=4, stride=0.5, max_tokens=0)
    assert t.axes == ("sample",) and t.uses_seed and t.options["windows"] == 4
    cells = t.cells([64, 128], [0.5], 2)
    assert [(c.length, c.sample) for c in cells] == [(64, s) for s in range(4)] + [(128, s) for s in range(4)]
    ss = [t.build(lm, c, seed=0) for c in cells[:4]]
    assert len({s.meta["begin"] for s in ss}) > 1
    assert [s.meta["begin"] for s in ss] == [t.build(lm, c, seed=0).meta["begin"] for c in cells[:4]]
    assert [s.meta["begin"] for s in ss] != [t.build(lm, c, seed=1).meta["begin"] for c in cells[:4]]
    s = ss[0]
    toks = t._doc_tokens(lm)[s.meta["_doc"]]
    ids = [lm.bos_id] + toks[s.meta["begin"]:s.meta["begin"] + 63]
    direct = lm.token_nll(ids, list(range(64 - 32, 64)))[0]
    got = t.score(lm, s)
    assert got["n_tokens"] == 32 == s.meta["stride"] and got["n_docs"] == 1.0
    assert got["nll"] == pytest.approx(float(sum(direct)) / 32, rel=1e-6)  # the same forward, summed in float64
    assert got["ppl"] == pytest.approx(math.exp(got["nll"]))
    short = Perplexity(data=[str(doc)], windows=10_000, max_tokens=0)
    with pytest.raises(ValueError, match=r"places for a 128-token window and windows=10000 were asked; use "
                                         r"--ppl-max-tokens 0"):
        short.build(lm, Cell(128, None, 0), seed=0)
    with pytest.raises(ValueError, match="windows must be a whole number from 2 to 10000"):
        Perplexity(windows=1)
    assert "windows" not in Perplexity().options  # the sweep's records keep their options


def test_ppl_windows_on_a_model_without_bos_score_without_one(lm, tmp_path, monkeypatch):
    """A tokenizer without a BOS (SmolLM2's GGUF) under bos=prepend: every windows=N sample failed with "'NoneType'
    object cannot be interpreted as an integer" (a None id first). Its windows now run without a BOS, as the sweep's
    sliding_nll does with bos_id None: the score equals token_nll of the window fed without one; control: the same
    window with the BOS scores otherwise."""
    from lctx.tasks import Cell

    doc = tmp_path / "doc.txt"
    doc.write_text(TEXT * 4)
    t = Perplexity(data=[str(doc)], windows=2, stride=0.5, max_tokens=0)
    with_bos = t.build(lm, Cell(64, None, 0), seed=0)
    toks = t._doc_tokens(lm)[with_bos.meta["_doc"]]
    b = with_bos.meta["begin"]
    bos_nll = float(sum(lm.token_nll([lm.bos_id] + toks[b:b + 63], list(range(32, 64)))[0])) / 32
    monkeypatch.setattr(type(lm), "bos_id", property(lambda self: None))
    s = t.build(lm, Cell(64, None, 0), seed=0)
    b = s.meta["begin"]
    got = t.score(lm, s)
    direct = float(sum(lm.token_nll(toks[b:b + 64], list(range(32, 64)))[0])) / 32
    assert got["nll"] == pytest.approx(direct, rel=1e-6) and got["n_tokens"] == 32
    assert abs(bos_nll - direct) > 1e-4


def test_flatness_pools_windows_by_nll_and_gives_the_ratio_an_interval():
    """PPL per length is exp(token-weighted mean nll), not the mean of per-window ppl (the control: windows of
    nll 1 and 3 give exp(2) = 7.39, the mean of e and e^3 is 11.4); the ratio's interval is exp(d -+ 1.96 se)
    with se = sqrt(se_L^2 + se_T^2), hand-computed here."""
    import pandas as pd

    from lctx.harness.steps.flatness import ppl_by_length, ratio_interval

    rows = []
    for L, nlls in ((256, [1.0, 3.0]), (512, [2.0, 2.5, 3.0])):
        for s, v in enumerate(nlls):
            for metric, value in (("ppl", math.exp(v)), ("nll", v), ("n_tokens", 128.0)):
                rows.append({"task": "ppl", "metric": metric, "length": L, "sample": s, "depth": None,
                             "value": value, "status": "ok", "task_options": "{}", "run_id": "r"})
    df = pd.DataFrame(rows)
    means, spread = ppl_by_length(df, df[df["metric"] == "ppl"])
    assert means[256] == pytest.approx(math.exp(2.0)) and means[256] != pytest.approx((math.e + math.e ** 3) / 2)
    assert spread[256] == pytest.approx((2.0, math.sqrt(2.0) / math.sqrt(2), 2))  # std of (1, 3) = sqrt 2
    assert spread[512] == pytest.approx((2.5, 0.5 / math.sqrt(3), 3))
    iv = ratio_interval(spread, 512, 256)
    se = math.sqrt(1.0 + 0.25 / 3)
    assert iv["ppl_ratio_low"] == pytest.approx(math.exp(0.5 - 1.959964 * se), rel=1e-5)
    assert iv["ppl_ratio_high"] == pytest.approx(math.exp(0.5 + 1.959964 * se), rel=1e-5)
    assert ratio_interval(spread, 256, 256) == {"ppl_ratio_low": 1.0, "ppl_ratio_high": 1.0}
    assert ratio_interval({}, 512, 256) == {}


def test_a_fractional_stride_under_one_token_is_refused():
    """Issue 42 (trial): --stride 1e-9 ran as a 1-token stride (12,288 windows at 256, 62 s) while the records named
    1e-09. A fraction below one token of a window is refused, naming the smallest that fits; control: a fraction that
    rounds to one token runs as one token."""
    from lctx.tasks import get_task

    task = get_task("ppl")(stride=1e-9)
    with pytest.raises(ValueError, match=r"stride 1e-09 of a 256-token window is less than one token; use a fraction "
                                         r"of at least 0.00392"):
        task.check_windows([256])
    ok = get_task("ppl")(stride=0.003)
    ok.check_windows([256])
    assert ok.window_stride(256) == (256, 1)
