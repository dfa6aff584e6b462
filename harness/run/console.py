"""Tables and status lines for lctx's console output, whole in a terminal and in a log file alike.

Every table the CLI prints (``lctx run``, ``compare``, ``bench``, ``report``, ``list``, ``plan``) goes
through :func:`print_table`:

* on a terminal (the stream is a TTY) it is a rich table whose text columns *fold* a cell that does not
  fit onto the next line, so nothing is ever cut to ``…``; number columns never wrap (a reader of the
  first line of ``61.7`` / ``2`` reads a wrong number): when they do not fit the terminal's width, the
  columns empty in every row are dropped, and when they still do not fit the table is printed in the
  Markdown layout below (:func:`rich_fits`);
* off a terminal (a log file, a CI job, a pipe) it is a GitHub-flavoured Markdown pipe table (tabulate's
  ``pipe`` format) with aligned columns and no width limit: every cell is whole, and the log pastes
  straight into a Markdown page (e.g. ``$GITHUB_STEP_SUMMARY``).

``LCTX_TABLE_FORMAT=rich`` or ``=markdown`` overrides the choice (e.g. Markdown in a terminal to copy from).

Nothing from outside reaches the terminal raw: every cell, header and title of a table, every
status line (:func:`print_line`, :func:`say`) and the progress bar's label pass through :mod:`lctx.outside` (a
registered API key or a ``Bearer``/``sk-`` token redacted, control characters such as ESC, BEL, C1 and the
bidirectional overrides written as visible ``\\x1b``-style escapes), and a table's cells are plain text to rich,
never markup (a model id ``[/x]`` is shown as typed, not parsed as a closing tag).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from typing import IO

from lctx.outside import LINE_LIMIT, cap, printable, redact, safe

#: Environment variable that forces the table format: ``rich`` or ``markdown``.
FORMAT_ENV = "LCTX_TABLE_FORMAT"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in the number it needs: ``count(1, "sample")`` is "1 sample", ``count(0, "sample")``
    and ``count(2, "sample")`` are "0 samples" and "2 samples" (``plural`` for an irregular noun)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def format_length(n: float) -> str:
    """Format a token count for a table or an axis: 256, 512, 1K, 2K, 1.5K, 128K, 1M.

    Input: a number of tokens. Output: a short label (powers of 1024 as K/M, others with one
    decimal when that is exact enough, plain digits below 1024; "?" for a non-finite number).
    """
    n = float(n)
    if not math.isfinite(n):
        return "?"
    for unit, size in (("M", 1024 ** 2), ("K", 1024)):
        if abs(n) >= size:
            v = n / size
            if abs(v - round(v)) < 1e-9:
                return f"{int(round(v))}{unit}"
            return f"{v:.1f}{unit}".replace(".0" + unit, unit)
    return f"{int(n)}" if n == int(n) else f"{n:g}"


def is_terminal(stream: IO | None = None) -> bool:
    """Whether ``stream`` (default: ``sys.stdout``) is an interactive terminal (a TTY)."""
    stream = sys.stdout if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        return False


def table_format(stream: IO | None = None) -> str:
    """``"rich"`` on a terminal, ``"markdown"`` otherwise; :data:`FORMAT_ENV` overrides both."""
    forced = os.environ.get(FORMAT_ENV, "").strip().lower()
    if forced in ("rich", "markdown"):
        return forced
    return "rich" if is_terminal(stream) else "markdown"


def cell_text(v: object) -> str:
    """What a table shows of one cell: ``""`` for None, else ``str(v)`` redacted (:func:`lctx.outside.redact`), its
    line breaks and tabs as spaces and every other control character escaped (:func:`lctx.outside.printable`): a
    cell is one line, and outside text in it (a served model id, a server's error, a generated answer) cannot
    drive the terminal or break the table."""
    if v is None:
        return ""
    s = redact(str(v))
    return printable(s.replace("\r\n", " ").replace("\n", " ").replace("\t", " "), one_line=True)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()) -> str:
    """A GitHub-flavoured pipe table: columns padded to their widest cell, ``right``-named columns
    right-aligned (``---:``), cells printed as given (``str()``; never re-parsed as numbers; :func:`cell_text`:
    redacted, one line, control characters escaped), ``|`` in a cell escaped. No width limit: every cell is whole."""
    from tabulate import tabulate  # lazy: loads tabulate (-X importtime: ~75 ms after lctx.cli)

    def cell(v: object) -> str:
        return cell_text(v).replace("|", "\\|")

    body = [[cell(v) for v in r] for r in rows]
    align = ["right" if h in right else "left" for h in header]
    return tabulate(body, headers=[cell(h) for h in header], tablefmt="pipe", disable_numparse=True,
                    colalign=align)


#: The narrowest a folding text column is made on a terminal (characters): narrower, a name reads one or two
#: letters a line; a table whose number columns leave less than this to each text column is printed as Markdown.
MIN_TEXT_WIDTH = 8


def rich_fits(header: Sequence[str], rows: Sequence[Sequence[str]], no_wrap: Sequence[str], width: int) -> bool:
    """Whether :func:`print_table`'s rich table fits ``width`` terminal columns with every ``no_wrap`` column
    whole on one line: those columns as wide as their widest cell, every other column (text, folding; its
    header folds too) at least :data:`MIN_TEXT_WIDTH` (or its widest cell, when narrower), plus rich's
    padding (one space each side of a cell) and the box's vertical lines (one more than the columns)."""
    need = len(header) + 1
    for j, h in enumerate(header):
        need += 2 + (_no_wrap_width(h, rows, j) if h in no_wrap
                     else min(max(_widest(rows, j), 1), MIN_TEXT_WIDTH))
    return need <= width


def _widest(rows: Sequence[Sequence[str]], j: int) -> int:
    from rich.cells import cell_len  # lazy: loads rich

    return max((cell_len(r[j]) for r in rows), default=0)


def _no_wrap_width(h: str, rows: Sequence[Sequence[str]], j: int) -> int:
    """A ``no_wrap`` column's width: its widest cell, or its header's longest word when wider (the header
    wraps at its spaces, ``PPL at train length`` over ``12.34``; a word is never cut)."""
    from rich.cells import cell_len  # lazy: loads rich

    return max([_widest(rows, j)] + [cell_len(w) for w in h.split()])


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None,
                right: Sequence[str] = (), row_styles: Sequence[str | None] | None = None,
                file: IO | None = None, no_wrap: Sequence[str] | None = None) -> None:
    """Print a table whole: rich on a terminal (text folds, numbers never wrap), Markdown off one.

    Args:
        header: column names.
        rows: one sequence of cells per row (printed with ``str()``; ``None`` prints empty).
        title: printed above the table (a line of its own off a terminal).
        right: names of the columns to right-align (numbers).
        row_styles: a rich style per row (e.g. ``"bold red"``), used on a terminal only.
        file: the stream (default ``sys.stdout``).
        no_wrap: names of the columns whose cells are never wrapped on a terminal (default: ``right``, the
            numbers; add a left-aligned one that holds a number, e.g. ``6e-05 (abs)``). A table whose
            ``no_wrap`` columns do not fit the terminal first loses its columns that are empty in every row,
            then falls back to the Markdown layout (:func:`rich_fits`).
    """
    file = sys.stdout if file is None else file
    header = [cell_text(h) for h in header]
    cells = [[cell_text(v) for v in r] for r in rows]
    title = cell_text(title) if title else title
    no_wrap = list(right if no_wrap is None else no_wrap)
    markdown = table_format(file) == "markdown"
    if not markdown:
        from rich.console import Console  # lazy: loads rich (~30 ms after lctx.cli)

        from rich.cells import cell_len  # lazy: loads rich

        console = Console(file=file, highlight=False)
        natural = len(header) + 1 + sum(2 + max(cell_len(h), _widest(cells, j)) for j, h in enumerate(header))
        if natural > console.width:  # it would fold: first drop the columns that say nothing
            keep = [j for j in range(len(header)) if any(r[j].strip() for r in cells)] or list(range(len(header)))
            header, cells = [header[j] for j in keep], [[r[j] for j in keep] for r in cells]
        markdown = not rich_fits(header, cells, no_wrap, console.width)
    if markdown:
        if title:
            file.write(f"{title}\n\n")
        file.write(markdown_table(header, cells, right) + "\n\n")
        file.flush()
        return
    from rich.table import Table  # lazy: loads rich.table (~80 ms after lctx.cli)
    from rich.text import Text  # lazy: loads rich

    table = Table(title=Text(title) if title else None)  # Text: plain, never parsed as rich markup
    for h in header:
        # a header wraps at its spaces, over a no_wrap column too (at most as wide as its cells or longest word)
        table.add_column(Text(h, no_wrap=False, overflow="fold"), justify="right" if h in right else "left",
                         overflow="fold", no_wrap=h in no_wrap,
                         max_width=_no_wrap_width(h, cells, len(table.columns)) if h in no_wrap else None)
    for i, r in enumerate(cells):
        table.add_row(*(Text(c) for c in r), style=row_styles[i] if row_styles is not None else None)
    console.print(table)


def print_frame(df, title: str | None = None, float_format: str = ".3f", right: Sequence[str] | None = None,
                file: IO | None = None) -> None:
    """:func:`print_table` of a pandas DataFrame (index dropped): floats with ``float_format``, NaN empty;
    numeric columns right-aligned unless ``right`` names them."""
    import pandas as pd  # lazy: loads pandas

    def fmt(v: object) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            return ""
        if isinstance(v, float):
            return format(v, float_format)
        return str(v)

    header = [str(c) for c in df.columns]
    if right is None:
        right = [str(c) for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
    rows = [[fmt(v) for v in r] for r in df.itertuples(index=False, name=None)]
    print_table(header, rows, title=title, right=right, file=file)


def print_line(text: str, style: str | None = None, file: IO | None = None) -> None:
    """Print one line whole: styled through rich on a terminal, plain (never wrapped) off one; redacted, control
    characters escaped and at most :data:`lctx.outside.LINE_LIMIT` characters (:func:`lctx.outside.cap`)."""
    file = sys.stdout if file is None else file
    text = cap(text)
    if not is_terminal(file):
        file.write(text + "\n")
        file.flush()
        return
    from rich.console import Console  # lazy: loads rich (~30 ms after lctx.cli)

    Console(file=file, highlight=False, soft_wrap=True).print(text, style=style, markup=False)


def say(text: object, err: bool = False, file: IO | None = None, limit: int | None = LINE_LIMIT) -> None:
    """Print one message of lctx's (a status line, a ``warning:``, ``note:`` or ``error:`` line) on stdout (``err``:
    stderr; or ``file``) as :func:`lctx.outside.cap` makes it: a registered secret and credential patterns redacted,
    control characters escaped (newlines kept), at most ``limit`` characters with the count of what was left out
    (``None``: no cap, for a whole table of lctx's own, e.g. a report's text). The console sink of every message
    that may quote outside text."""
    file = file if file is not None else (sys.stderr if err else sys.stdout)
    file.write((cap(text, limit) if limit else safe(str(text))) + "\n")
    file.flush()


class SweepProgress:
    """The progress bar of a sweep, weighted by each sample's cost in prefill tokens
    (:meth:`lctx.tasks.Task.cost`), not by samples: a ppl cell feeds every window of every document and a
    2K passkey prompt costs several 256-token ones, so a bar in samples claimed 16 s left when 97 s
    remained. The line says what each number counts: ``lctx run [sample 5/24] tiny ppl L=512: 37% of tokens
    |###| 12.3k/33.2k tokens [00:05<00:09 left]``: the sample count and the cell being run (model, task,
    length, depth) in samples, the percentage, bar and time left in tokens (cost left / cost per second
    averaged over the run so far).

    Use as a context manager: ``start(label)`` before a sample, ``done(tokens)`` after it. Written to stderr.
    """

    def __init__(self, costs: Sequence[float], enabled: bool = True, desc: str = "lctx run", file: IO | None = None):
        from tqdm.auto import tqdm  # lazy: loads tqdm (~130 ms after lctx.cli)

        self.n_samples, self.i, self.desc = len(costs), 0, desc
        file = sys.stderr if file is None else file
        self.bar = tqdm(total=float(sum(costs)), disable=not enabled, desc=desc, dynamic_ncols=True, file=file,
                        smoothing=0.0,  # the average rate: a sample's cost, not its neighbours', sets its weight
                        mininterval=0.1 if is_terminal(file) else 10.0,  # a log file: an update every 10 s
                        unit_scale=True,  # 12.3k tokens
                        bar_format="{desc}: {percentage:3.0f}% of tokens|{bar}| {n_fmt}/{total_fmt} tokens "
                                   "[{elapsed}<{remaining} left]")

    def start(self, label: str, n: int = 1) -> None:
        """Show the cell about to run (``label``: model, task, length, depth) and its sample numbers (shown at
        the bar's next refresh): ``[sample i/N]`` for one sample, ``[sample i-j/N]`` for a batch of ``n`` samples,
        so the count is in samples against the total of samples also under ``--batch-size``."""
        first, self.i = self.i + 1, self.i + n
        where = f"{first}" if n == 1 else f"{first}-{self.i}"
        label = safe(label, one_line=True)  # a served model's id is outside text
        self.bar.set_description_str(f"{self.desc} [sample {where}/{self.n_samples}] {label}", refresh=False)

    def done(self, cost: float) -> None:
        """Count a finished sample's ``cost`` (prefill tokens)."""
        self.bar.update(float(cost))

    def __enter__(self) -> "SweepProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
