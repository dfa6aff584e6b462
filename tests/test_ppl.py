"""lctx.tasks.ppl: token-weighted perplexity, the sliding-window plan, the ppl task's options (stride, BOS,
the data path as recorded) and its cost."""

from __future__ import annotations

import json
import os

import pytest

from helpers import TEXT, sweep
from lctx.tasks.ppl import Perplexity


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
