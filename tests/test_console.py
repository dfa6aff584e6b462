"""lctx.harness.run.console: tables whole on a terminal and off one (issue 16), numbers never wrapped (issue 24)."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys

import pandas as pd
import pytest
from rich.cells import cell_len

from lctx.harness.run.console import MIN_TEXT_WIDTH, markdown_table, print_table, rich_fits


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


def _summary(model: str, ppl: float, match: float) -> pd.DataFrame:
    rows = [(model, "rope", "ppl", "ppl", 256, math.nan, ppl, math.nan, 1, 0)]
    for metric in ("string_match_all", "string_match_part"):
        rows.append((model, "rope", "niah_single_1", metric, 256, 0.5, match, 0.1, 4, 0))
    return pd.DataFrame(rows, columns=["model", "variant", "task", "metric", "length", "depth", "mean", "stderr",
                                       "n", "n_error"])


@pytest.mark.usefixtures("plain_console")
def test_compare_with_stdout_piped_prints_every_cell_whole(tmp_path):
    """Issue 16 item 1: what a CI job sees, `lctx compare` with stdout going to a pipe (not a terminal), 80 columns
    assumed, prints every cell whole."""
    model = "a-checkpoint-with-a-rather-long-name-v2"
    for name, ppl, match in (("base", 179.123456, 0.75), ("run", 190.987654, 0.25)):
        (tmp_path / name).mkdir()
        _summary(model, ppl, match).to_csv(tmp_path / name / "summary.csv", index=False)
    env = dict(os.environ, COLUMNS="80")
    r = subprocess.run([sys.executable, "-m", "lctx.cli", "compare", str(tmp_path / "run"), "--baseline",
                        str(tmp_path / "base")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=300)
    assert r.returncode == 1, r.stderr  # three regressions
    out = r.stdout
    assert "…" not in out
    for metric in ("string_match_part", "string_match_all"):  # both used to print as `string_…`
        line = next(ln for ln in out.splitlines() if f" {metric} " in ln)
        # the whole row on one line: status, model, task, metric, length, baseline and run values
        for cell in ("regression", model, "niah_single_1", "256", "0.75", "0.25"):
            assert cell in line, (cell, line)
    ppl_line = next(ln for ln in out.splitlines() if " ppl " in ln)
    assert "179.1" in ppl_line and "191" in ppl_line, ppl_line  # numbers used to print as `179.…`
    assert "FAIL: 3 regressed" in out


@pytest.mark.usefixtures("plain_console")
def test_rich_tables_fold_instead_of_cutting(monkeypatch):
    """Issue 16 item 1: on a terminal (forced here) a text cell that does not fit wraps onto the next line; no
    character is lost; a number never wraps (issue 24 item 7: it used to fold too)."""
    monkeypatch.setenv("LCTX_TABLE_FORMAT", "rich")
    monkeypatch.setenv("COLUMNS", "32")
    buf = io.StringIO()
    long = "string_match_part_of_a_long_metric_name"
    print_table(["metric", "value"], [[long, "179.123456789"]], right=["value"], file=buf)
    cells = [ln.split("│") for ln in buf.getvalue().splitlines() if ln.count("│") == 3]
    assert len(cells) > 2  # folded over several lines
    assert "".join(c[1].strip() for c in cells) == long
    assert cells[0][2].strip() == "179.123456789"  # whole on the first line
    assert "…" not in buf.getvalue()


@pytest.mark.usefixtures("plain_console")
def test_markdown_table_is_aligned_and_escapes_pipes():
    """Issue 16 item 1: a Markdown table's rows are equally wide, numbers right-aligned, pipes escaped."""
    text = markdown_table(["name", "value"], [["a|b", "1.5"], ["much-longer-name", "22"]], right=["value"])
    lines = text.splitlines()
    assert len({len(ln) for ln in lines}) == 1  # every row as wide: columns line up in a log
    assert lines[1].endswith("-:|")  # right-aligned numbers
    assert "a\\|b" in text


@pytest.fixture
def lm(make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    return load_lm(str(make_checkpoint("rope")), device="cpu")


@pytest.mark.usefixtures("plain_console")
def test_progress_bar_names_the_cell(lm, tmp_path, capsys):
    """Issue 16 item 2: the progress bar names the cell it runs, and counts tokens."""
    from lctx.harness.run.runner import RunSpec, run_sweep
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    run_sweep([lm], [Passkey(), Perplexity(max_tokens=300)], RunSpec([160, 200], [0.5], 1), tmp_path / "o",
              progress=True)
    err = capsys.readouterr().err
    assert f"[sample 4/4] {lm.name} ppl L=200" in err and "100% of tokens" in err  # off a terminal: every 10 s


@pytest.mark.usefixtures("plain_console")
def test_progress_bar_says_what_each_number_counts():
    """Issue 16 item 2: the bar counts samples, and its percentage is the tokens' share."""
    # the count is in samples, the percentage in tokens (a sample weighs its tokens): the line must name both,
    # and the percentage must be the tokens' share (here 1 cheap sample of 4 done = 10 % of the tokens, not 25 %)
    import io

    from lctx.harness.run.console import SweepProgress

    with SweepProgress([100.0, 300.0, 300.0, 300.0], file=io.StringIO()) as bar:
        bar.start("tiny ppl L=256")
        bar.done(100.0)
        line = str(bar.bar)
    assert "[sample 1/4] tiny ppl L=256" in line, line
    assert " 10% of tokens" in line and "100/1.00k tokens" in line, line


def test_progress_counts_samples_not_batches():
    """A user trial of --batch-size (issue 15 item 3): a batch advances the progress bar by its samples."""
    # a batch of 4 advances the sample count by 4, against the total in samples: [1-4/6], then [5/6], [6/6]
    import io

    from lctx.harness.run.console import SweepProgress

    with SweepProgress([1.0] * 6, file=io.StringIO()) as bar:
        seen = []
        for n in (4, 1, 1):
            bar.start("cell", n=n)
            seen.append(bar.bar.desc)
            bar.done(n)
    assert [s.split("]")[0].split("[")[1] for s in seen] == ["sample 1-4/6", "sample 5/6", "sample 6/6"]


def test_counts_in_messages_agree_with_their_number():
    """A user trial of --batch-size (issue 15 item 3): a count in a message agrees with its number."""
    from lctx.harness.run.console import count

    assert [count(0, "sample"), count(1, "sample"), count(2, "error"), count(1, "row")] == \
        ["0 samples", "1 sample", "2 errors", "1 row"]


# ---------------------------------------------------------------------------------------------- outside text (issue 42)

#: a hostile cell: OSC 0 (set the title) ended by BEL, CSI (recolour), a C1 CSI, a bidi override, rich markup
HOSTILE = "id\x1b]0;PWNED\x07\x1b[31m\x9b2J\u202e [bold]b[/bold] [/x]"
#: any control character a terminal acts on (tab and newline aside)
RAW_CONTROL = __import__("re").compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def secret():
    from lctx import outside

    outside.forget_secrets()
    outside.register_secret("planted-key-0123456789")
    yield "planted-key-0123456789"
    outside.forget_secrets()


@pytest.mark.parametrize("fmt", ["rich", "markdown"])
def test_outside_text_in_a_table_is_escaped_redacted_and_never_markup(monkeypatch, secret, fmt):
    """Issue 42 items 1 and 5: a cell, a header and a title holding terminal controls, rich markup and a registered
    key: both layouts print no raw control character and no key; the controls show as ``\\x1b``-style escapes, the
    markup as typed (``[/x]`` no longer raises rich's MarkupError), a line break in a cell as a space. Control: the
    cell's plain text is there."""
    monkeypatch.setenv("LCTX_TABLE_FORMAT", fmt)
    out = _print(monkeypatch, 200, ["model", f"n{HOSTILE}"], [[HOSTILE + f"\nkey {secret}", "1"]],
                 title=f"t {HOSTILE}", right=("n",))
    assert RAW_CONTROL.search(out) is None, repr(out)
    assert secret not in out and "[redacted]" in out
    assert "id\\x1b]0;PWNED\\x07\\x1b[31m\\x9b2J\\u202e [bold]b[/bold] [/x] key [redacted]" in out, out


def test_print_line_and_say_are_escaped_redacted_and_capped(secret):
    """A status line and a warning quoting outside text: escaped, redacted, and a huge one cut with the count of
    what was left out (lctx.outside.LINE_LIMIT); newlines a message has of its own are kept (control)."""
    import io

    from lctx.harness.run.console import print_line, say
    from lctx.outside import LINE_LIMIT

    buf = io.StringIO()
    print_line(f"verdict {HOSTILE} {secret}", file=buf)
    say(f"warning: {HOSTILE}\nsecond line {secret}", file=buf)
    say("x" * (LINE_LIMIT + 500), file=buf)
    say("a whole table\n" * 300, file=buf, limit=None)  # lctx's own long text: not cut
    out = buf.getvalue()
    assert RAW_CONTROL.search(out) is None and secret not in out
    assert "warning: id\\x1b]0;PWNED" in out and "\nsecond line [redacted]\n" in out
    assert f"{'x' * LINE_LIMIT}... (500 more characters left out)\n" in out
    assert out.count("a whole table\n") == 300


def test_the_progress_label_escapes_a_served_model_id():
    """The progress bar's label names the model: a served id's controls are escaped there too (it is on stderr
    all through a sweep)."""
    import io

    from lctx.harness.run.console import SweepProgress

    with SweepProgress([1.0], file=io.StringIO()) as bar:
        bar.start(f"{HOSTILE} passkey L=256")
        desc = bar.bar.desc
    assert RAW_CONTROL.search(desc) is None and "id\\x1b]0;PWNED\\x07" in desc, repr(desc)
