"""lctx.harness.run.console: tables whole on a terminal and off one (issue 16), numbers never wrapped (issue 24)."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len

from lctx.harness.run.console import MIN_TEXT_WIDTH, print_table, rich_fits


@pytest.fixture(autouse=True)
def terminal(monkeypatch):
    monkeypatch.setenv("LCTX_TABLE_FORMAT", "rich")  # as on a terminal


def _print(monkeypatch, columns: int, header, rows, **kw) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    buf = io.StringIO()
    print_table(header, rows, file=buf, **kw)
    return buf.getvalue()


def test_numbers_stay_whole_while_text_folds(monkeypatch):
    header = ["model", "metric", "baseline", "run"]
    rows = [["a-checkpoint-with-a-rather-long-name-v2", "string_match_part", "61.7 ± 2", "60.12 ± 1.9"]]
    out = _print(monkeypatch, 60, header, rows, right=("baseline", "run"))
    assert "┃" in out  # still the rich layout: it fits once the text folds
    lines = out.splitlines()
    assert all(cell_len(ln) <= 60 for ln in lines)
    assert any("61.7 ± 2" in ln and "60.12 ± 1.9" in ln for ln in lines), out
    assert "".join(ln.split("│")[1].strip() for ln in lines if ln.count("│") == 5) == rows[0][0]  # folded, whole


def test_empty_columns_are_dropped_before_giving_up_on_rich(monkeypatch):
    header = ["metric", "note", "depth", "baseline", "run", "diff"]
    rows = [["ppl", "", "", "61.7123 ± 2.345", "64.9876 ± 2.111", "+3.2753"]]
    assert not rich_fits(header, rows, ("depth", "baseline", "run", "diff"), 64)  # as is: no room
    out = _print(monkeypatch, 64, header, rows, right=("depth", "baseline", "run", "diff"))
    assert "┃" in out and "note" not in out and "depth" not in out  # the empty columns went
    assert all(cell_len(ln) <= 64 for ln in out.splitlines())
    assert any("61.7123 ± 2.345" in ln and "64.9876 ± 2.111" in ln for ln in out.splitlines()), out


def test_too_wide_for_its_numbers_prints_markdown(monkeypatch):
    header = ["metric"] + [f"L{k}" for k in range(8)]
    rows = [["exact"] + ["0.667 ± 0.211"] * 8]
    assert not rich_fits(header, rows, header[1:], 80)
    out = _print(monkeypatch, 80, header, rows, right=header[1:], title="a title")
    assert "┃" not in out and out.startswith("a title\n\n| metric")  # the Markdown layout, every cell whole
    assert out.count("0.667 ± 0.211") == 8


def test_rich_fits_counts_padding_and_borders():
    # one text column at its floor, one number column: 2 + 3 borders + 2 paddings each
    rows = [["x" * 30, "12.345"]]
    need = 3 + 2 * 2 + MIN_TEXT_WIDTH + len("12.345")
    assert rich_fits(["name", "value"], rows, ["value"], need)
    assert not rich_fits(["name", "value"], rows, ["value"], need - 1)
    # a header word wider than the numbers widens the column (the header wraps at spaces, never mid-word)
    assert not rich_fits(["name", "tolerance"], rows, ["tolerance"], need)
