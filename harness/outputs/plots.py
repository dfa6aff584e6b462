"""Every figure of lctx: those of a run (``lctx run``) and those of ``lctx report``, drawn from a results table.

Every function takes the runner's tidy results table (one row per run/model/task/metric/length/
depth/sample; see the column list in :func:`make_plots`) and writes PNG files under
``<out_dir>/plots/``. Only rows with ``status == "ok"`` contribute values; error rows are used only
to mark failed cells. Figures are drawn on the Agg canvas directly (``matplotlib.figure.Figure``,
no pyplot), so nothing needs a display and the global matplotlib backend is left alone.

No task is known here by name: a task declares the figures of its rows (:attr:`lctx.tasks.Task.plots`, its
:class:`lctx.tasks.Heatmap`), a derived step the figures it wants (:attr:`lctx.harness.steps.derived.DerivedStep.figures`),
and :data:`FIGURES` draws each kind by name.

Public API:

* :func:`depth_grid` / :func:`depth_counts` / :func:`depth_errors` / :func:`depth_off_cells`: the depth x length
  tables a heatmap shows (means, number of ok samples, failed cells, needles off their depth).
* :func:`task_heatmaps`: ``plots/<task>_heatmap_<model>.png`` per model; :func:`depth_heatmaps`: those of every task
  whose rows get one.
* :func:`ppl_vs_length`: ``plots/<task>_vs_length.png`` (``ppl_vs_length.png``), perplexity against length.
* :func:`ppl_ratio_plot`: ``plots/ppl_ratio_vs_relative.png``; :func:`ruler_grids`: ``plots/ruler_<model>.png``.
* :func:`make_plots`: every figure the tasks of a table declare; :func:`run_figures`: those and the derived steps';
  :func:`write_run_outputs`: a run's tables (:func:`lctx.harness.steps.derived.write_run_tables`), then its figures.
* the report's figures: :func:`perplexity_figure`, :func:`accuracy_figure`, :func:`bench_figure`,
  :func:`ruler_figure`, with :func:`palette` and :func:`task_meta_of`; per base model of several positional methods
 : :func:`method_heatmaps` (a row of heatmaps, one per method) and :func:`methods_retrieval_figure`
  (retrieval vs length, a line per method with its interval band and declared maximum).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.text import Text
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from lctx.errors import LctxError
from lctx.metrics import label as metric_label
from lctx.tasks import PLOT_KINDS, TASKS, task_meta

from lctx.harness.run.console import format_length
from lctx.harness.run.tables import DEPTH_TOLERANCE, UNAVAILABLE, label_names
from lctx.harness.steps.derived import write_run_tables
from lctx.harness.steps.ruler import ruler_table
from lctx.outside import quote, safe

__all__ = [
    "FIGURES",
    "format_length",
    "safe_filename",
    "series_label",
    "ok_values",
    "task_meta_of",
    "figure_kinds",
    "tasks_with_kind",
    "heatmap_panels",
    "depth_grid",
    "depth_counts",
    "depth_errors",
    "depth_off_cells",
    "depth_unavailable",
    "unavailable_reasons",
    "task_heatmaps",
    "depth_heatmaps",
    "draw_ppl",
    "ppl_vs_length",
    "ppl_ratio_plot",
    "ruler_figure",
    "ruler_grids",
    "mark_train_lengths",
    "palette",
    "series_style",
    "make_plots",
    "step_figures",
    "run_figures",
    "write_run_outputs",
    "perplexity_figure",
    "accuracy_figure",
    "bench_figure",
    "method_heatmaps",
    "methods_retrieval_figure",
]

#: The y axis of a depth x length heatmap unless the task's :class:`lctx.tasks.Heatmap` names another.
DEPTH_LABEL = "Needle depth (0% = start)"

_CMAP = "RdYlGn"
_MISSING_COLOR = "#d9d9d9"  # cells with no data at all
_ERROR_COLOR = "#bdbdbd"  # cells whose every row errored
_UNAVAILABLE_COLOR = "#eeeeee"  # cells whose metric the model could not give (status unavailable)
_DPI = 130


# ----------------------------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------------------------

def safe_filename(name: object) -> str:
    """Sanitise a model name (which may be a path or hub id) into a safe filename stem.

    Input: any name. Output: the name with every run of characters other than letters, digits,
    ``.``, ``_`` and ``-`` replaced by ``_`` (leading/trailing ``._`` stripped), or ``"model"``.
    """
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._")
    return stem[:120] or "model"


def clean_texts(fig) -> None:
    """Every text of ``fig`` (titles, labels, legend entries, tick labels, annotations) as :func:`lctx.outside.safe`
    writes it: a model id or reason from outside is redacted and its control characters are drawn as visible
    ``\\x1b``-style escapes, never as missing glyphs. Called by every save."""
    for t in fig.findobj(Text):
        s = t.get_text()
        if isinstance(s, str) and s:
            c = safe(s)
            if c != s:
                t.set_text(c)


def _savefig(fig, path) -> None:
    """``fig.savefig(path)`` at the figures' resolution, its texts cleaned first (:func:`clean_texts`)."""
    clean_texts(fig)
    fig.savefig(path, dpi=_DPI)


def _shorten(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters with an ellipsis in the middle (names differ at both ends)."""
    if len(text) <= n:
        return text
    k = (n - 1) // 2
    return text[:k] + "…" + text[-(n - 1 - k):]


def wrap_to_width(parts: list[str], width_in: float, fontsize: float, weight: str = "normal",
                  sep: str = "  ·  ") -> list[str]:
    """Lines of at most ``width_in`` inches of text at ``fontsize`` points (``weight``: matplotlib's): the
    ``parts`` joined by ``sep`` as long as a line holds them, a part too long for a line of its own broken at
    its spaces. Widths are measured with matplotlib's own font metrics (``text_to_path``), 10 % over for the
    renderer's hinting (at 80 dpi a line draws 8 % wider); a single word wider than a line is left whole. So a figure's subtitle stays inside it."""
    from matplotlib.font_manager import FontProperties  # lazy: loaded with matplotlib anyway
    from matplotlib.textpath import text_to_path  # lazy: as above

    prop = FontProperties(size=fontsize, weight=weight)
    limit = width_in * 72.0  # points

    def fits(text: str) -> bool:
        return text_to_path.get_text_width_height_descent(text, prop, ismath=False)[0] * 1.10 <= limit

    def join(pieces: list[str], glue: str) -> list[str]:
        lines: list[str] = []
        for piece in pieces:
            if lines and fits(lines[-1] + glue + piece):
                lines[-1] += glue + piece
            else:
                lines.append(piece)
        return lines

    parts = [safe(p, one_line=True) for p in parts]  # measured as drawn (clean_texts): no control glyph to miss
    atoms = [a for part in parts for a in ([part] if fits(part) else join(part.split(" "), " "))]
    return join(atoms, sep) or [""]


def _is_blank(v: object) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == ""


def series_label(model: object, variant: object) -> str:
    """How a (model, variant) is named in a legend or title: ``model``, or ``model (variant)`` when the variant is
    set and is not the model's own name."""
    if _is_blank(variant) or str(variant) == str(model):
        return str(model)
    return f"{model} ({variant})"


def _ok_mask(df: pd.DataFrame) -> pd.Series:
    if "status" not in df.columns:
        return pd.Series(True, index=df.index)
    return df["status"].astype("string").fillna("").str.lower().eq("ok")


def _unavailable_mask(df: pd.DataFrame) -> pd.Series:
    """Rows whose metric the model could not give (status ``unavailable``): neither a value nor a failure."""
    if "status" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["status"].astype("string").fillna("").str.lower().eq(UNAVAILABLE)


def unavailable_reasons(df: pd.DataFrame, task: str, metric: str | None = None, model: object = None,
                        variant: object = None) -> list[str]:
    """The reasons (distinct, in order) of ``task``'s rows that the model could not give (status ``unavailable``),
    of one metric and model when given; [] when every value was given."""
    rows = _select(df, str(task), model, variant)
    rows = rows[_unavailable_mask(rows)]
    if metric is not None:
        rows = rows[rows["metric"].astype("string") == str(metric)]
    if rows.empty or "reason" not in rows.columns:
        return [UNAVAILABLE] if not rows.empty else []
    return list(dict.fromkeys(str(r) for r in rows["reason"] if isinstance(r, str) and r)) or [UNAVAILABLE]


def _select(df: pd.DataFrame, task: str, model: object = None, variant: object = None) -> pd.DataFrame:
    sel = df[df["task"].astype("string") == task]
    if model is not None:
        sel = sel[sel["model"].astype("string") == str(model)]
    if variant is not None and "variant" in sel.columns:
        sel = sel[sel["variant"].astype("string") == str(variant)]
    return sel


def _train_length(rows: pd.DataFrame) -> int | None:
    """The (most common) known training context length among ``rows``, or None."""
    if "train_length" not in rows.columns:
        return None
    tl = pd.to_numeric(rows["train_length"], errors="coerce").dropna()
    tl = tl[tl > 0]
    if tl.empty:
        return None
    return int(tl.mode().iloc[0])


def _series_groups(df: pd.DataFrame) -> list[tuple[object, object]]:
    """(model, variant) pairs in order of first appearance; variant None when there is no column."""
    if "variant" not in df.columns:
        return [(m, None) for m in pd.unique(df["model"])]
    pairs = df[["model", "variant"]].drop_duplicates()
    return [(m, None if _is_blank(v) else v) for m, v in pairs.itertuples(index=False)]


def _new_figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


# ----------------------------------------------------------------------------------------------
# what the tasks declare
# ----------------------------------------------------------------------------------------------

def _task_class(task: object):
    """The registered :class:`lctx.tasks.Task` class of ``task``, or None (a ``--task-file`` task not loaded, a
    derived step, an lm-eval task)."""
    return TASKS.get(str(task))


def task_meta_of(task: str, table: pd.DataFrame | None = None):
    """The declared metadata of ``task`` (:func:`lctx.tasks.task_meta`): what its run directories recorded
    (``table.attrs["task_meta"]``, from run.json), else its class attributes when registered, else what ``table``
    shows: its first metric as headline, a depth axis when its rows have depths."""
    rows = table[table["task"] == task] if table is not None else None
    metrics = list(dict.fromkeys(rows["metric"].dropna().astype(str))) if rows is not None else []
    declared = (table.attrs.get("task_meta") or {}).get(str(task)) if table is not None else None
    has_depth = bool(rows is not None and "depth" in rows.columns and rows["depth"].notna().any())
    return task_meta(task, metrics, has_depth, declared)


def figure_kinds(df: pd.DataFrame, task: str) -> tuple[str, ...]:
    """The figure kinds ``lctx run`` draws of ``task``'s rows (:data:`lctx.tasks.PLOT_KINDS`): what its registered
    class declares (:attr:`lctx.tasks.Task.plots`), else a depth x length heatmap when its rows have depths."""
    cls = _task_class(task)
    if cls is not None and cls.plots is not None:
        return tuple(cls.plots)
    rows = df[df["task"].astype("string") == str(task)]
    has_depth = "depth" in rows.columns and pd.to_numeric(rows["depth"], errors="coerce").notna().any()
    return ("depth_heatmap",) if has_depth else ()


def tasks_with_kind(df: pd.DataFrame, kind: str) -> list[str]:
    """The tasks of ``df`` whose rows get a figure of ``kind`` (:func:`figure_kinds`): those whose class declares it
    first, then those that get it by default (a heatmap for rows with depths), each in table order."""
    if df is None or df.empty or "task" not in df.columns:
        return []
    names = [str(t) for t in pd.unique(df["task"].astype("string")) if not pd.isna(t)]
    declared = [t for t in names if kind in (getattr(_task_class(t), "plots", None) or ())]
    return declared + [t for t in names if t not in declared and kind in figure_kinds(df, t)]


def heatmap_panels(df: pd.DataFrame, task: str) -> dict[str, str]:
    """The panels of ``task``'s heatmap, {metric: panel title}: the fixed panels its :class:`lctx.tasks.Heatmap`
    declares (passkey: exact match and digit accuracy), drawn whatever their values; else the metrics it lists in
    ``heatmap_metrics`` (as its run recorded it, ``df.attrs["task_meta"]``, else the registered class; else all its
    metrics) whose ``status == "ok"`` values all lie in [0, 1] (accuracies, match rates, reciprocal ranks; a
    log-prob or a perplexity is left out), and those it lists that the model could not give (status
    ``unavailable``: a panel that says so)."""
    cls = _task_class(task)
    style = getattr(cls, "heatmap", None)
    if style is not None and style.panels:
        return dict(style.panels)
    rows = _select(df, str(task))
    ok = rows[_ok_mask(rows)].copy()
    ok["value"] = pd.to_numeric(ok["value"], errors="coerce")
    recorded = (df.attrs.get("task_meta") or {}).get(str(task)) or {}  # run.json's (report: no task file)
    declared = recorded.get("heatmap_metrics") or getattr(cls, "heatmap_metrics", None)
    na = rows[_unavailable_mask(rows)]
    metrics = {}
    for m in declared or pd.unique(rows["metric"].dropna().astype("string")):
        v = ok.loc[ok["metric"].astype("string") == m, "value"].dropna()
        if not v.empty and bool(((v >= 0) & (v <= 1)).all()):
            metrics[str(m)] = str(m)
        elif v.empty and declared and (na["metric"].astype("string") == m).any():
            metrics[str(m)] = str(m)  # declared, and unavailable: its panel says so
    return metrics


def _heatmap_text(task: str) -> tuple[str, str]:
    """(title, depth axis label) of ``task``'s heatmap: its :class:`lctx.tasks.Heatmap`'s, else the task's name and
    :data:`DEPTH_LABEL`."""
    style = getattr(_task_class(task), "heatmap", None)
    return ((style.title if style is not None and style.title else str(task)),
            (style.depth_label if style is not None and style.depth_label else DEPTH_LABEL))


# ----------------------------------------------------------------------------------------------
# depth x length tables
# ----------------------------------------------------------------------------------------------

def _depth_cells(df: pd.DataFrame, model: object, metric: str, variant: object, task: str, metric_names=None):
    """Means, ok-sample counts and error flags, each a depth x length DataFrame (rows of ``task``;
    ``metric_names``: the task's metrics drawn, default its heatmap's, :func:`heatmap_panels`)."""
    rows = _select(df, task, model, variant)
    ok = _ok_mask(rows)
    okrows = rows[ok & (rows["metric"].astype("string") == metric)].copy()
    okrows["value"] = pd.to_numeric(okrows["value"], errors="coerce")
    okrows = okrows.dropna(subset=["value", "depth", "length"])
    # An error row counts against this metric when it names this metric or no metric at all
    # (a runner that fails before scoring has no metric to report); a NaN depth fails every depth. A metric the
    # model could not give (status unavailable) is no error.
    err = rows[~ok & ~_unavailable_mask(rows)]
    if not err.empty:
        em = err["metric"].astype("string")
        names = list(metric_names) if metric_names is not None else list(heatmap_panels(df, task))
        err = err[em.isna() | (em.str.strip() == "") | (em == metric) | ~em.isin(names)]
    depths = sorted({float(d) for d in pd.to_numeric(rows["depth"], errors="coerce").dropna()})
    lengths = sorted({int(x) for x in pd.to_numeric(rows["length"], errors="coerce").dropna()})
    index = pd.Index(depths, name="depth", dtype="float64")
    columns = pd.Index(lengths, name="length", dtype="int64")

    if okrows.empty:
        means = pd.DataFrame(np.nan, index=index, columns=columns)
        counts = pd.DataFrame(0, index=index, columns=columns)
    else:
        okrows["depth"] = okrows["depth"].astype(float)
        okrows["length"] = okrows["length"].astype("int64")
        g = okrows.groupby(["depth", "length"])["value"]
        means = g.mean().unstack("length").reindex(index=index, columns=columns).astype(float)
        counts = g.count().unstack("length").reindex(index=index, columns=columns).fillna(0).astype(int)

    errors = pd.DataFrame(False, index=index, columns=columns)
    for _, r in err.iterrows():
        if pd.isna(r["length"]):
            continue
        L = int(r["length"])
        d = pd.to_numeric(pd.Series([r["depth"]]), errors="coerce").iloc[0]
        if pd.isna(d):
            errors.loc[:, L] = True
        else:
            errors.loc[float(d), L] = True
    # A cell is an error cell only when nothing in it succeeded; partial failures keep their mean.
    errors = errors & (counts == 0)
    return means, counts, errors


def depth_off_cells(df: pd.DataFrame, model: object, metric: str, variant: object = None, *,
                    task: str) -> pd.DataFrame:
    """Boolean depth x length table (the shape of :func:`depth_grid`): True where an ok sample of the cell
    has its needle more than :data:`lctx.harness.run.tables.DEPTH_TOLERANCE` from the requested depth (the
    table's ``depth_off`` column), i.e. the row's depth label is not what the sample measured."""
    means = _depth_cells(df, model, metric, variant, task)[0]
    off = pd.DataFrame(False, index=means.index, columns=means.columns)
    rows = _select(df, task, model, variant)
    if "depth_off" not in rows.columns or rows.empty:
        return off
    rows = rows[_ok_mask(rows) & rows["depth_off"].astype("string").isin(["True", "true", "1", "1.0"])]
    for _, r in rows.iterrows():
        d, L = pd.to_numeric(pd.Series([r["depth"], r["length"]]), errors="coerce")
        if pd.notna(d) and pd.notna(L) and float(d) in off.index and int(L) in off.columns:
            off.loc[float(d), int(L)] = True
    return off


def depth_grid(df: pd.DataFrame, model: object, metric: str, variant: object = None, *, task: str) -> pd.DataFrame:
    """Mean score per cell of ``task``: the table a heatmap panel shows.

    Inputs: the results table, a model name, one of the task's metrics (passkey: ``"exact"`` or ``"digit_acc"``)
    and optionally a variant (None: all rows of the model). Output: a float DataFrame with
    depths (ascending, index ``depth``) as rows and lengths (ascending ints, columns ``length``)
    as columns; each cell is the mean ``value`` over that model's ``status == "ok"`` rows of the
    metric, NaN where no sample succeeded (errored or missing). Rows and columns cover every depth
    and length the model has rows of the task for, failed ones included. Writes nothing.
    """
    return _depth_cells(df, model, metric, variant, task)[0]


def depth_counts(df: pd.DataFrame, model: object, metric: str, variant: object = None, *, task: str) -> pd.DataFrame:
    """Number of ``status == "ok"`` samples behind each :func:`depth_grid` cell (int, same shape)."""
    return _depth_cells(df, model, metric, variant, task)[1]


def depth_errors(df: pd.DataFrame, model: object, metric: str, variant: object = None, *, task: str) -> pd.DataFrame:
    """Boolean depth x length table (same shape as :func:`depth_grid`): True where the cell has
    error rows and no successful sample. Error rows with no metric apply to every metric, error
    rows with no depth to every depth of their length."""
    return _depth_cells(df, model, metric, variant, task)[2]


def depth_unavailable(df: pd.DataFrame, model: object, metric: str, variant: object = None, *,
                      task: str) -> pd.DataFrame:
    """Boolean depth x length table (same shape as :func:`depth_grid`): True where the cell's ``metric`` is
    unavailable (status ``unavailable``: the model could not give it) and no sample has a value or an error."""
    means, counts, errors = _depth_cells(df, model, metric, variant, task)
    out = pd.DataFrame(False, index=means.index, columns=means.columns)
    rows = _select(df, task, model, variant)
    rows = rows[_unavailable_mask(rows) & (rows["metric"].astype("string") == metric)]
    for _, r in rows.iterrows():
        d, L = pd.to_numeric(pd.Series([r["depth"], r["length"]]), errors="coerce")
        if pd.notna(d) and pd.notna(L) and float(d) in out.index and int(L) in out.columns:
            out.loc[float(d), int(L)] = True
    return out & (counts == 0) & ~errors


# ----------------------------------------------------------------------------------------------
# depth x length heatmaps
# ----------------------------------------------------------------------------------------------

def _text_color(rgba) -> str:
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def _draw_heatmap(ax, means, counts, errors, title, train_len, show_ylabels, fontsize,
                  ylabel=DEPTH_LABEL, off=None, unavailable=None):
    cmap = matplotlib.colormaps[_CMAP].with_extremes(bad=_MISSING_COLOR)
    data = np.ma.masked_invalid(means.to_numpy(dtype=float))
    im = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    n_d, n_l = means.shape
    for i in range(n_d):
        for j in range(n_l):
            v = means.iat[i, j]
            if errors.iat[i, j]:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=_ERROR_COLOR,
                                       edgecolor="#7f7f7f", hatch="////", linewidth=0))
                ax.text(j, i, "err", ha="center", va="center", fontsize=fontsize,
                        fontweight="bold", color="#8b0000",
                        bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
            elif unavailable is not None and bool(unavailable.iat[i, j]):  # no value to give, not a failure
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=_UNAVAILABLE_COLOR, linewidth=0))
                ax.text(j, i, "n/a", ha="center", va="center", fontsize=fontsize, color="#555555")
            elif np.isfinite(v):
                flag = off is not None and bool(off.iat[i, j])  # a sample's needle is off this row's depth
                ax.text(j, i, f"{v:.2f}" + ("\u2020" if flag else ""), ha="center", va="center", fontsize=fontsize,
                        color=_text_color(cmap(float(v))))
                if flag:
                    ax.add_patch(Rectangle((j - 0.46, i - 0.44), 0.92, 0.88, fill=False, edgecolor="#111111",
                                           linestyle=(0, (2, 2)), linewidth=1.6))
            else:
                ax.text(j, i, "–", ha="center", va="center", fontsize=fontsize, color="#555555")
    # white grid between cells
    ax.set_xticks(np.arange(-0.5, n_l, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, n_d, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    ax.tick_params(which="major", length=0)
    for s in ax.spines.values():
        s.set_visible(False)

    lengths = list(means.columns)
    ax.set_xticks(range(n_l))
    ax.set_xticklabels([format_length(L) for L in lengths])
    ax.set_yticks(range(n_d))
    if show_ylabels:
        ax.set_yticklabels([f"{d * 100:.0f}%" for d in means.index])
        ax.set_ylabel(ylabel)
    else:
        ax.set_yticklabels([])
    ax.set_xlabel("Context length (tokens)")
    ax.set_title(title, fontsize=11, pad=6)

    if train_len is not None and n_l:
        k = sum(1 for L in lengths if L <= train_len)  # columns within the training length
        if 0 < k < n_l:
            ax.axvline(k - 0.5, color="black", linestyle="--", linewidth=1.8)
        ax.set_xticklabels([format_length(L) + ("*" if L == train_len else "") for L in lengths])
        for j, L in enumerate(lengths):  # the training length's own column: "2K*", bold
            if L == train_len:
                ax.get_xticklabels()[j].set_fontweight("bold")
    return im


def _heatmap_figure(df: pd.DataFrame, model: object, variant: object, title_variant: object, task: str,
                    metrics: dict[str, str] | None = None, title_prefix: str | None = None,
                    ylabel: str | None = None) -> Figure:
    """One model's heatmap figure of ``task``: a panel per metric of ``metrics`` ({metric: title}; default
    :func:`heatmap_panels`), titled ``title_prefix`` (default the task's :class:`lctx.tasks.Heatmap` title, else its
    name), depth axis ``ylabel`` (default its declared label, else :data:`DEPTH_LABEL`)."""
    title0, ylabel0 = _heatmap_text(task)
    metrics = metrics or heatmap_panels(df, task)
    title_prefix, ylabel = title_prefix or title0, ylabel or ylabel0
    tables = {m: _depth_cells(df, model, m, variant, task, list(metrics)) for m in metrics}
    means0 = tables[next(iter(metrics))][0]
    n_d, n_l = means0.shape
    n_d, n_l = max(n_d, 1), max(n_l, 1)
    n_p = len(metrics)
    rows = _select(df, task, model, variant)
    train_len = _train_length(rows)

    offs = {m: depth_off_cells(df, model, m, variant, task=task) for m in metrics}
    nas = {m: depth_unavailable(df, model, m, variant, task=task) for m in metrics}

    # The subtitle: samples per cell, errors, off-depth cells, the training length.
    counts_all = pd.concat([t[1].stack() for t in tables.values()])
    errs = functools.reduce(lambda a, b: a | b, [t[2] for t in tables.values()])
    filled = counts_all[counts_all > 0]
    if filled.empty:
        ntxt = "no successful samples"
    elif filled.min() == filled.max():
        ntxt = f"n = {int(filled.min())} sample{'s' if filled.min() != 1 else ''} per cell"
    else:
        ntxt = f"n = {int(filled.min())}–{int(filled.max())} samples per cell"
    parts = [ntxt + " (status ok)"]
    n_err = int(errs.to_numpy().sum())
    if n_err:
        parts.append(f"{n_err} errored cell{'s' if n_err != 1 else ''} (err)")

    for m in metrics:  # a metric the model could not give: its reason, once (its cells read n/a)
        if nas[m].to_numpy().any():
            why = "; ".join(quote(r, 120) for r in unavailable_reasons(df, task, m, model, variant))
            parts.append(f"n/a: {m} unavailable ({why})")
    n_off = int(functools.reduce(lambda a, b: a | b, list(offs.values())).to_numpy().sum()) if offs else 0
    if n_off:
        parts.append(f"\u2020 dashed: {n_off} cell{'s' if n_off != 1 else ''} with a needle > {DEPTH_TOLERANCE:.0%} off its depth")
    if train_len is not None:
        lengths = list(means0.columns)
        if lengths and train_len < min(lengths):
            parts.append(f"training length {format_length(train_len)} (all lengths beyond it)")
        elif lengths and train_len >= max(lengths):
            parts.append(f"training length {format_length(train_len)}{'*' if train_len in lengths else ''}"
                         " (all lengths within it)")
        else:
            mark = "*" if train_len in lengths else ""
            parts.append(f"dashed line{' / ' + mark if mark else ''} = training length {format_length(train_len)}")

    # Layout in inches, so cells keep a readable size for 1..8 lengths and ~5 depths.
    cell_w, cell_h = 0.68, 0.46
    fontsize = 9 if n_l <= 10 else 7
    pw = max(2.6, cell_w * n_l)
    ph = max(1.6, cell_h * n_d)
    left, gap, cgap, cw, right = 0.95, 0.3, 0.25, 0.18, 0.75
    W = left + n_p * pw + (n_p - 1) * gap + cgap + cw + right
    # title, subtitle and panel titles wrapped to the figure's (the panel's) width, the top margin grown to hold
    # their lines: a subtitle wider than a narrow figure used to be clipped at both edges
    title_lines = wrap_to_width([f"{title_prefix}:", series_label(model, title_variant)], W - 0.4, 13, "bold", " ")
    sub_lines = wrap_to_width(parts, W - 0.4, 9.5)
    panel_titles = {m: "\n".join(wrap_to_width([metric_label(m, lbl)], pw, 11)) for m, lbl in metrics.items()}
    panel_lines = max(t.count("\n") + 1 for t in panel_titles.values())
    title_y = [0.28 + 0.24 * i for i in range(len(title_lines))]  # inches from the top, line centres
    sub_y = [title_y[-1] + 0.30 + 0.17 * i for i in range(len(sub_lines))]
    top = sub_y[-1] + 0.47 + 0.19 * (panel_lines - 1)
    bottom = 0.62
    H = top + ph + bottom
    fig = _new_figure(W, H)

    im = None
    for k, metric in enumerate(metrics):
        x0 = left + k * (pw + gap)
        ax = fig.add_axes((x0 / W, bottom / H, pw / W, ph / H))
        means, counts, errors = tables[metric]
        im = _draw_heatmap(ax, means, counts, errors, panel_titles[metric], train_len, k == 0, fontsize, ylabel,
                           offs[metric], nas[metric])
    cax = fig.add_axes(((left + n_p * pw + (n_p - 1) * gap + cgap) / W, bottom / H, cw / W, ph / H))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label("Mean score (0–1)")
    cb.outline.set_visible(False)

    for line, y in zip(title_lines, title_y):
        fig.text(0.5, 1 - y / H, line, ha="center", va="center", fontsize=13, fontweight="bold")
    for line, y in zip(sub_lines, sub_y):
        fig.text(0.5, 1 - y / H, line, ha="center", va="center", fontsize=9.5, color="#444444")
    return fig


def task_heatmaps(df: pd.DataFrame, out_dir: str | Path, task: str) -> list[Path]:
    """Draw one depth x length heatmap figure of ``task`` per model.

    Input: the results table and an output directory. Output: the list of written paths, one per model,
    ``<out_dir>/plots/<task>_heatmap_<model>.png`` (``passkey_heatmap_<model>.png``; model name passed through
    :func:`safe_filename`; a model with several variants gets one file per variant,
    ``<task>_heatmap_<model>_<variant>.png``; colliding names get a short hash suffix). Empty list (nothing written)
    when the task has no rows, or no panel (:func:`heatmap_panels`).

    Each figure shows the task's panels side by side (passkey: exact match, digit accuracy (teacher-forced); a
    panel's title says when its metric is teacher-forced): depth rows (0% at top) x length columns (256, 512,
    1K, ...), each cell the mean over ``status == "ok"`` samples (:func:`depth_grid`) printed in the cell, colours
    fixed to [0, 1] (RdYlGn) with a colour bar. Cells where every row errored are hatched grey with "err"; cells
    whose metric the model could not give (status ``unavailable``) show "n/a", with the reason in the subtitle; cells
    with no data show "–". A known ``train_length`` is drawn as a dashed line after the last column within it,
    and its own column label gets a ``*``. The subtitle gives samples per cell and error counts; title,
    subtitle and panel titles wrap to the figure's width (:func:`wrap_to_width`). Title and depth axis label: the
    task's :class:`lctx.tasks.Heatmap` (passkey: "Passkey retrieval"), else its name and :data:`DEPTH_LABEL`.
    """
    if df is None or df.empty or "task" not in df.columns:
        return []
    panels = heatmap_panels(df, task)
    if not panels:
        return []
    title, ylabel = _heatmap_text(task)
    return _write_heatmaps(df, out_dir, str(task), panels, title, f"{safe_filename(task)}_heatmap", ylabel)


def _write_heatmaps(df: pd.DataFrame, out_dir: str | Path, task: str, metrics: dict[str, str], title_prefix: str,
                    file_prefix: str, ylabel: str = DEPTH_LABEL) -> list[Path]:
    """One heatmap figure per (model, variant) of ``task``: ``plots/<file_prefix>_<model>.png``."""
    rows = _select(df, task)
    if rows.empty:
        return []
    plot_dir = Path(out_dir) / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    groups = _series_groups(rows)
    per_model: dict[str, int] = {}
    for m, _ in groups:
        per_model[str(m)] = per_model.get(str(m), 0) + 1
    written: list[Path] = []
    used: set[str] = set()
    for model, variant in groups:
        stem = safe_filename(model)
        if per_model[str(model)] > 1 and variant is not None:
            stem = f"{stem}_{safe_filename(variant)}"
        if stem in used:
            stem = f"{stem}_{hashlib.sha1(series_label(model, variant).encode()).hexdigest()[:6]}"
        used.add(stem)
        path = plot_dir / f"{file_prefix}_{stem}.png"
        # One variant per model: use all of its rows; several: one figure per variant.
        fig = _heatmap_figure(df, model, variant if per_model[str(model)] > 1 else None, variant, task, metrics,
                              title_prefix, ylabel)
        _savefig(fig, path)
        written.append(path)
    return written


def mark_train_lengths(ax, train_lines: dict[float, list], label: str = "train") -> None:
    """Mark training lengths on a length axis: for each x in ``train_lines`` a dashed vertical line in the
    colour of every model trained at that length (several models: the dashes offset so each colour
    shows), and its x tick label gets a second line ``label`` in that model's colour (dark grey when
    models share it). Labels sit under the axis, never near the title or on a data point.

    Call after the axis's ticks are set (the lengths must include the training lengths).
    ``train_lines``: {x in data units: [matplotlib colours of the models trained there]}.
    """
    for x, cols in train_lines.items():
        for k, c in enumerate(cols):
            ax.axvline(x, color=c, linestyle=(k * 3, (5, 3 * len(cols) + 2)) if len(cols) > 1 else "--",
                       linewidth=1.6, alpha=0.9, zorder=1.5)
    if not train_lines:
        return
    base = ax.xaxis.get_major_formatter()

    def which(v: float):
        return next((x for x in train_lines if math.isclose(v, x, rel_tol=1e-6)), None)

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, pos: base(v, pos) + (f"\n{label}" if which(v) is not None else "")))
    locs = ax.xaxis.get_majorticklocs()
    for loc, tick in zip(locs, ax.xaxis.get_major_ticks(len(locs))):  # tick objects persist: colour their labels
        x = which(loc)
        if x is not None:
            cols = train_lines[x]
            tick.label1.set_color(cols[0] if len(set(map(str, cols))) == 1 else "#333333")


def depth_heatmaps(df: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """The depth x length heatmaps of every task of the table whose rows get one (:func:`figure_kinds`: passkey
    declares one, RULER's ``niah_*`` and any task with depths get one): :func:`task_heatmaps` of each, in table
    order. Output: the written paths; none for a table without such tasks."""
    return [p for task in tasks_with_kind(df, "depth_heatmap") for p in task_heatmaps(df, out_dir, task)]


# ----------------------------------------------------------------------------------------------
# perplexity vs length
# ----------------------------------------------------------------------------------------------

def draw_ppl(ax, table: pd.DataFrame, pal: dict, task: str | None = None) -> bool:
    """Draw perplexity vs context length on ``ax``: the one ppl figure of ``lctx run``
    (:func:`ppl_vs_length`) and ``lctx report`` (its ``perplexity.png``).

    ``table``: results rows (``task``, ``metric``, ``model``, ``variant`` or ``label``, ``length``
    (tokens), ``value``, ``status``, ``train_length``); the ok rows of ``task`` (default: the first task of the table
    that declares the ``perplexity_vs_length`` figure, ppl) and its headline metric with a positive value
    are averaged per (label, length), one line per label in ``pal``'s (colour, marker, line style)
    (:func:`palette`); x: length on a log2 axis labelled 256, 512, 1K; y: log perplexity; each known
    training length is a dashed line in its models' colours. Returns False (nothing drawn) without rows.
    """
    task = task or next(iter(tasks_with_kind(table, "perplexity_vs_length")), None)
    if task is None:
        return False
    rows = table[(table["task"] == task) & (table["metric"] == task_meta_of(task, table).headline)]
    rows = ok_values(rows.assign(label=_labels(rows)))
    rows = rows[rows["value"] > 0]
    if rows.empty:
        return False
    lengths, trains = set(), {}
    for lbl, g in rows.groupby("label", sort=False):
        s = g.groupby(g["length"].astype("int64"))["value"].mean().sort_index()
        c, mk, ls = pal[lbl]
        ax.plot(s.index, s.values, marker=mk, color=c, linestyle=ls, linewidth=2, markersize=6, label=lbl)
        lengths |= set(int(x) for x in s.index)
        tl = g["train_length"].dropna()
        if len(tl):
            trains.setdefault(int(tl.mode().iloc[0]), []).append(c)
    _length_axis(ax, lengths | set(trains))
    mark_train_lengths(ax, trains)  # dashed lines in each model's colour, "train" under the tick
    _log_y(ax, rows["value"], [1, 2, 5, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1000, 2000, 5000, 1e4])
    ax.set_xlabel("Context length (tokens, log scale)")
    ax.set_ylabel("Perplexity (log scale, lower is better)")
    ax.set_title("Perplexity vs context length", fontsize=12, fontweight="bold", pad=8)
    ax.grid(True, alpha=0.35)
    return True


def ppl_vs_length(df: pd.DataFrame, out_dir: str | Path, task: str | None = None) -> Path | None:
    """Plot sliding-window perplexity against context length, one line per model.

    Input: the results table (rows of ``task``, default the first task of the table that declares the
    ``perplexity_vs_length`` figure (:attr:`lctx.tasks.Task.plots`: ppl), and its headline metric; only
    ``status == "ok"`` rows with a finite positive value are used, averaged per length) and an
    output directory. Output: the path ``<out_dir>/plots/<task>_vs_length.png`` it writes
    (``ppl_vs_length.png``), or None (nothing written) when there are no usable rows.

    The axes are drawn by :func:`draw_ppl`, the figure ``lctx report`` draws too: x is the length on a
    log2 axis labelled 256, 512, 1K, ...; y is log perplexity. Each (model, variant) is a line labelled
    ``"model (variant)"`` in its :func:`palette` style; its known training length is a dashed vertical
    line of the same colour (one "train length" legend entry explains the dashes).
    """
    task = task or next(iter(tasks_with_kind(df, "perplexity_vs_length")), None)
    if task is None:
        return None
    rows = _select(df, task)
    if rows.empty:
        return None
    rows = rows.assign(**{c: pd.to_numeric(rows[c], errors="coerce") if c in rows.columns else np.nan
                          for c in ("value", "length", "train_length")})
    rows = rows.assign(label=_labels(rows), status=_ok_mask(rows).map({True: "ok", False: "not ok"}))
    rows = rows[rows["length"].notna()]
    fig = _new_figure(9.5, 5.0)
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    if not draw_ppl(ax, rows, palette(list(dict.fromkeys(rows["label"])))):
        return None
    train_lines = _train_length(rows)

    handles, labels = ax.get_legend_handles_labels()
    if train_lines:
        handles.append(Line2D([], [], color="#555555", linestyle="--", linewidth=1.6))
        labels.append("train length")
    # Outside the axes (never covers a line): at the right for short names, below for long ones.
    labels = [_shorten(lbl, 60) for lbl in labels]
    longest = max(len(lbl) for lbl in labels)
    if longest <= 26:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  frameon=False, fontsize=9)
    else:
        ncol = max(1, min(len(labels), 95 // (longest + 6)))
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False, fontsize=9)

    plot_dir = Path(out_dir) / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    path = plot_dir / f"{safe_filename(task)}_vs_length.png"
    _savefig(fig, path)
    return path


# ----------------------------------------------------------------------------------------------
# RULER: task x length grid beside the average
# ----------------------------------------------------------------------------------------------

def ruler_figure(grid: pd.DataFrame, info: dict, name: str, path: str | Path) -> Path:
    """Draw one model's RULER figure to ``path``: left, the task x length grid (RULER's score of each task in
    percent, the ``average`` row below a rule; grey "–": no successful sample); right, the average against
    length (log2 axis) with the effective-length threshold dashed and the effective length marked.

    Input: one model's RULER table and its info (:func:`lctx.harness.steps.ruler.ruler_table`: tasks x lengths in
    percent with an ``average`` row; threshold, effective length, tasks) and a display name. Output: ``path``.
    """
    lengths = [int(c) for c in grid.columns]
    vals = grid.to_numpy(dtype=float)
    n_t, n_l = vals.shape
    fig = _new_figure(3.2 + 0.9 * max(n_l, 3) + 5.2, 1.6 + 0.42 * n_t)
    fig.set_layout_engine("constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[0.9 * max(n_l, 3) + 2.4, 5.0])
    cmap = matplotlib.colormaps[_CMAP].with_extremes(bad=_MISSING_COLOR)
    im = ax.imshow(np.ma.masked_invalid(vals), cmap=cmap, vmin=0, vmax=100, aspect="auto")
    for i in range(n_t):
        for j in range(n_l):
            v = vals[i, j]
            ax.text(j, i, "–" if not math.isfinite(v) else f"{v:.1f}", ha="center", va="center", fontsize=9,
                    fontweight="bold" if grid.index[i] == "average" else "normal",
                    color="black" if not math.isfinite(v) else _text_color(cmap(v / 100.0)))
    ax.axhline(n_t - 1.5, color="black", linewidth=2.0)
    ax.set_xticks(range(n_l), [format_length(L) for L in lengths])
    ax.set_yticks(range(n_t), list(grid.index))
    ax.set_xlabel("Context length (tokens)")
    ax.set_title("RULER score per task (%)", fontsize=11, fontweight="bold")
    fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    thr = info.get("threshold")
    avg = grid.loc["average"] if "average" in grid.index else pd.Series(dtype=float)
    ok = [(L, float(v)) for L, v in zip(lengths, avg) if math.isfinite(v)]
    if ok:
        ax2.plot([L for L, _ in ok], [v for _, v in ok], marker="o", color="#1f77b4", linewidth=2.2, label="average")
    if thr is not None:
        ax2.axhline(thr, color="#b22222", linestyle="--", linewidth=1.4, label=f"threshold {thr:g}")
    e = info.get("effective_length", float("nan"))
    if e is not None and math.isfinite(e) and e > 0:
        ax2.axvline(e, color="#333333", linestyle=":", linewidth=1.4, label=f"effective length {format_length(e)}")
    if lengths:
        ax2.set_xscale("log", base=2)
        ax2.xaxis.set_major_locator(FixedLocator(lengths))
        ax2.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_length(x)))
        ax2.xaxis.set_minor_locator(NullLocator())
        ax2.xaxis.set_minor_formatter(NullFormatter())
        if len(lengths) == 1:
            ax2.set_xlim(lengths[0] / 1.5, lengths[0] * 1.5)
    ax2.set_ylim(-3, 103)
    ax2.set_xlabel("Context length (tokens, log scale)")
    ax2.set_ylabel("average over tasks (%)")
    etxt = ("–" if e is None or not math.isfinite(e) else
            (f"< {format_length(min(lengths))}" if e == 0 and lengths else format_length(e)))
    n = len(info.get("tasks", [])) or (n_t - 1)
    ax2.set_title(f"average of {n} tasks; effective length {etxt}", fontsize=11, fontweight="bold")
    ax2.grid(True, alpha=0.35)
    ax2.legend(loc="best", fontsize=8.5)
    fig.suptitle(f"RULER: {_shorten(str(name), 80)}", fontsize=13, fontweight="bold")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _savefig(fig, path)
    return path


def ruler_grids(df: pd.DataFrame, out_dir: str | Path, task: str) -> list[Path]:
    """``plots/<task>_<model>.png`` (``ruler_<model>.png``, :func:`ruler_figure`) per (model, variant) with rows of the
    derived step ``task`` (the ruler group, :mod:`lctx.harness.steps.ruler`, which asks for the ``ruler_grid`` figure;
    its table: :func:`lctx.harness.steps.ruler.ruler_table`); none without them."""
    if df is None or df.empty or not (df["task"].astype("string") == task).any():
        return []
    written: list[Path] = []
    r = df[df["task"].astype("string") == task]
    groups = _series_groups(r)
    per_model: dict[str, int] = {}
    for m, _ in groups:
        per_model[str(m)] = per_model.get(str(m), 0) + 1
    for model, variant in groups:
        rows = df[df["model"].astype("string") == str(model)]
        if variant is not None and "variant" in rows.columns:
            rows = rows[rows["variant"].astype("string") == str(variant)]
        stem = safe_filename(model) + (f"_{safe_filename(variant)}" if per_model[str(model)] > 1 and variant else "")
        written.append(ruler_figure(*ruler_table(rows), series_label(model, variant),
                                    Path(out_dir) / "plots" / f"{safe_filename(task)}_{stem}.png"))
    return written


# ----------------------------------------------------------------------------------------------
# all plots
# ----------------------------------------------------------------------------------------------

def make_plots(df: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write every figure the tasks of a results table declare.

    Input: the runner's results table (columns run_id, model, variant, task, metric, length,
    n_tokens, depth, sample, value, seed, status, error, ..., train_length; only task, model,
    variant, metric, length, depth, value, status and train_length are read) and an output
    directory. Output: the written paths, kind by kind (:data:`lctx.tasks.PLOT_KINDS`), each task in table order
    (:func:`figure_kinds`): the depth x length heatmaps (:func:`task_heatmaps`: ``plots/passkey_heatmap_<model>.png``,
    ``plots/<task>_heatmap_<model>.png`` for the other tasks with a depth axis), then perplexity against length
    (:func:`ppl_vs_length`: ``plots/ppl_vs_length.png``). Tasks that are absent are skipped; an empty table writes
    nothing and returns ``[]``.
    """
    if df is None or df.empty or "task" not in df.columns:
        return []
    paths: list[Path] = []
    for kind in PLOT_KINDS:
        for task in tasks_with_kind(df, kind):
            paths += FIGURES[kind](df, out_dir, task, None)
    return paths


def _ppl_figure(df: pd.DataFrame, out_dir, task: str, spec=None) -> list[Path]:
    p = ppl_vs_length(df, out_dir, task)
    return [p] if p is not None else []


def _ratio_figure(table: pd.DataFrame, out_dir, task: str, spec=None) -> list[Path]:
    p = ppl_ratio_plot(table, out_dir, max_ratio=getattr(spec, "max_ratio", 1.1), task=task)
    return [p] if p is not None else []


#: The figures by name: {kind or name: draw(table, out_dir, task, spec) -> [paths]}: the kinds a task declares
#: (:attr:`lctx.tasks.Task.plots`, :data:`lctx.tasks.PLOT_KINDS`) and the figures a derived step asks for
#: (:attr:`lctx.harness.steps.derived.DerivedStep.figures`: flatness's ``ppl_ratio_vs_relative`` with its spec's
#: ``max_ratio``, the ruler group's ``ruler_grid``), each given the rows' task and the step's spec (None for a task).
FIGURES = {
    "depth_heatmap": lambda df, out_dir, task, spec=None: task_heatmaps(df, out_dir, task),
    "perplexity_vs_length": _ppl_figure,
    "ppl_ratio_vs_relative": _ratio_figure,
    "ruler_grid": lambda df, out_dir, task, spec=None: ruler_grids(df, out_dir, task),
}


def step_figures(table: pd.DataFrame, out_dir: str | Path, steps=()) -> list[Path]:
    """The figures each derived step of ``steps`` asks for (:attr:`lctx.harness.steps.derived.DerivedStep.figures`,
    drawn by :data:`FIGURES` with the step's name and spec), from the final table (its derived rows included).
    Returns the written paths."""
    return [p for st in steps for name in st.figures for p in FIGURES[name](table, Path(out_dir), st.name, st.spec)]


def run_figures(table: pd.DataFrame, out_dir: str | Path, steps=()) -> list[Path]:
    """A run's figures: :func:`make_plots` of its table (models named by :func:`lctx.harness.run.tables.label_names`,
    so two option sets of a model are two series), then the figures each derived step asks for
    (:func:`step_figures`). Returns the written paths.

    Raises:
        LctxError: a figure cannot be written (full disk, permissions); the tables are written already.
    """
    out_dir = Path(out_dir)
    try:
        paths = make_plots(table.assign(model=label_names(table)), out_dir)
        paths += step_figures(table, out_dir, steps)
    except OSError as e:
        raise LctxError(f"cannot write the plots in {out_dir / 'plots'} ({e.strerror or e}); the tables are "
                        "written: free space and rerun the same command to draw them") from None
    return paths


def write_run_outputs(out_dir: str | Path, steps=(), metrics_of: dict | None = None,
                      report=None) -> tuple[pd.DataFrame, pd.DataFrame, list[Path]]:
    """A run directory's tables and figures, once: :func:`lctx.harness.steps.derived.write_run_tables` (records ->
    results, summary, derived rows of ``steps``, run.json notes, the tasks' extra tables), then :func:`run_figures`.
    What :func:`lctx.evaluate` (so ``lctx run``) calls after its sweeps. Returns (table, summary, plot paths).

    Raises:
        LctxError: ``out_dir`` has no records; a table or figure cannot be written (the records are kept).
    """
    table, summary = write_run_tables(Path(out_dir), steps, metrics_of, report)
    return table, summary, run_figures(table, out_dir, steps)


# ----------------------------------------------------------------------------------------------
# figure helpers of the run's and the report's figures, and the flatness ratio figure
# ----------------------------------------------------------------------------------------------

_MARKERS = "os^Dv<>ph*P"  # 11 markers: coprime with the 10 colours


def series_style(i: int) -> tuple:
    """(colour, marker, line style) of the i-th line of a figure (i >= 0): tab10 colour i mod 10, marker
    (i mod 10 + i div 10) mod 11, so lines that share a colour (10 apart) never share a marker for the first
    110 lines; solid lines for the first 10, dashed for the next 10, dotted after that."""
    r, b = i % 10, i // 10
    return (matplotlib.colormaps["tab10"].colors[r], _MARKERS[(r + b) % len(_MARKERS)],
            ("-", (0, (5, 2)), (0, (1, 1.5)))[min(b, 2)])


def palette(labels: list[str]) -> dict[str, tuple]:
    """A (colour, marker, line style) per label (:func:`series_style` in label order), stable across every
    plot of a report or run; no two labels share a (colour, marker) pair."""
    return {lbl: series_style(i) for i, lbl in enumerate(labels)}


def ok_values(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a results table with status ok and a finite value (value read as a float)."""
    return df[(df["status"] == "ok") & np.isfinite(df["value"].astype(float))]


def _length_axis(ax, lengths, rel: bool = False) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(lengths))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×" if rel else format_length(v)))
    ax.xaxis.set_minor_locator(NullLocator())
    lo, hi = min(ticks), max(ticks)
    pad = 2 ** 0.3 if hi > lo else 2.0
    ax.set_xlim(lo / pad, hi * pad)


def _log_y(ax, values, candidates) -> None:
    """Log y axis with plain-number ticks chosen from ``candidates`` inside the data range."""
    v = np.asarray([x for x in values if np.isfinite(x) and x > 0], dtype=float)
    if not len(v):
        return
    lo, hi = v.min(), v.max()
    ax.set_yscale("log")
    span = max(hi / lo, 1.02)
    ax.set_ylim(lo / span ** 0.08, hi * span ** 0.08)
    lo2, hi2 = ax.get_ylim()
    inside = [c for c in candidates if lo2 <= c <= hi2]
    # keep ticks at least 6% of the axis apart (in log space), 1 first, so labels never overlap
    gap = 0.06 * math.log(hi2 / lo2)
    ticks: list[float] = []
    for c in sorted(inside, key=lambda c: (c != 1.0, inside.index(c))):
        if all(abs(math.log(c / t)) >= gap for t in ticks):
            ticks.append(c)
    ticks.sort()
    if len(ticks) < 3:
        ticks = list(np.round(np.geomspace(lo2, hi2, 5), 3 if hi2 < 10 else 1))
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())


def _legend(fig, ax, handles, labels) -> None:
    labels = [_shorten(lbl, 48) for lbl in labels]
    if max(len(x) for x in labels) <= 28 and len(labels) <= 14:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  frameon=False, fontsize=9)
    else:
        ncol = max(1, min(len(labels), 110 // (max(len(x) for x in labels) + 6)))
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False, fontsize=9)


def _save(fig, out_dir: Path, name: str) -> Path:
    plot_dir = Path(out_dir) / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    path = plot_dir / name
    _savefig(fig, path)
    return path


def _labels(df: pd.DataFrame) -> pd.Series:
    if "label" in df.columns:
        return df["label"]
    return pd.Series([series_label(m, v) for m, v in zip(df["model"], df.get("variant", [None] * len(df)))],
                     index=df.index)


def _draw_ratio(ax, table, pal, max_ratio: float, task: str | None = None) -> bool:
    rows = table[table["metric"] == "ppl_ratio"]
    rows = rows[rows["task"] == task] if task is not None else rows
    rows = ok_values(rows.assign(label=_labels(rows)))
    rows = rows[(rows["value"] > 0) & (rows["train_length"] > 0)]
    if rows.empty:
        return False
    rel = set()
    for lbl, g in rows.groupby("label", sort=False):
        x = (g["length"] / g["train_length"]).round(4)
        s = g.assign(x=x).groupby("x")["value"].mean().sort_index()
        c, mk, ls = pal[lbl]
        ax.plot(s.index, s.values, marker=mk, color=c, linestyle=ls, linewidth=2, markersize=6, label=lbl)
        rel |= set(float(v) for v in s.index)
    ax.axhline(max_ratio, color="#b22222", linestyle=":", linewidth=1.6)
    ax.axhline(1.0, color="#888888", linewidth=0.8)
    _length_axis(ax, rel | {1.0}, rel=True)
    mark_train_lengths(ax, {1.0: [pal[lbl][0] for lbl in dict.fromkeys(rows["label"])]})  # 1x: every model
    vals = list(rows["value"]) + [max_ratio, 1.0]
    _log_y(ax, vals, [0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.5, 2, 3, 5, 10, 20, 50, 100, 1000])
    ax.annotate(f"flat: ratio ≤ {max_ratio:g}", xy=(0.0, max_ratio), xycoords=("axes fraction", "data"),
                xytext=(4, 3), textcoords="offset points", ha="left", va="bottom", fontsize=8.5, color="#b22222")
    ax.set_xlabel("Context length / training length (log scale)")
    ax.set_ylabel("PPL(L) / PPL(train length) (log scale)")
    ax.set_title("Perplexity ratio vs relative length", fontsize=12, fontweight="bold", pad=8)
    ax.grid(True, alpha=0.35)
    return True


def ppl_ratio_plot(table: pd.DataFrame, out_dir: str | Path, max_ratio: float = 1.1,
                   task: str | None = None) -> Path | None:
    """``<out_dir>/plots/ppl_ratio_vs_relative.png``: PPL(L)/PPL(T) (rows of metric ``ppl_ratio``, status ok, of
    ``task``: the flatness step that asks for this figure; None: whichever task has them) against L/T on log axes,
    one line per (model, variant), the training length (1x) dashed and the flatness criterion ``max_ratio`` dotted.
    None (nothing written) without such rows."""
    t = table.copy()
    for c in ("value", "length", "train_length"):
        t[c] = pd.to_numeric(t[c], errors="coerce")
    t["status"] = t["status"].astype("string").fillna("")
    labels = list(dict.fromkeys(_labels(t)))
    fig = _new_figure(9.0, 4.8)
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    if not _draw_ratio(ax, t, palette(labels), max_ratio, task):
        return None
    _legend(fig, ax, *ax.get_legend_handles_labels())
    return _save(fig, out_dir, "ppl_ratio_vs_relative.png")


# ----------------------------------------------------------------------------------------------
# the figures of lctx report (lctx.harness.outputs.report lays them out)
# ----------------------------------------------------------------------------------------------

def perplexity_figure(table: pd.DataFrame, out_dir: str | Path, pal, max_ratio: float = 1.1,
                      ratio_task: str | None = None) -> Path | None:
    """``plots/perplexity.png``: perplexity vs length (:func:`draw_ppl`) and the ppl ratio vs relative length (the
    ``ppl_ratio`` rows of ``ratio_task``, the flatness step; None: any; see :func:`ppl_ratio_plot`) side by side, in
    ``pal``'s styles (:func:`palette`); None without perplexity rows."""
    fig = _new_figure(14.0, 5.2)
    fig.set_layout_engine("constrained")
    a1, a2 = fig.subplots(1, 2)
    if not draw_ppl(a1, table, pal):
        return None
    if not _draw_ratio(a2, table, pal, max_ratio, ratio_task):
        a2.set_axis_off()
    handles, labels = a1.get_legend_handles_labels()
    handles.append(Line2D([], [], color="#333333", linestyle="--", linewidth=1.4))
    labels.append("training length")
    _legend(fig, a2 if a2.axison else a1, handles, labels)
    return _save(fig, out_dir, "perplexity.png")


def accuracy_figure(table: pd.DataFrame, task: str, out_dir: str | Path, pal, threshold: float = 0.8) -> Path | None:
    """``plots/<task>_accuracy_vs_length.png``: mean score (over depths and samples, status ok) vs length,
    one line per ``label`` of ``table`` (in ``pal``'s styles); panels: the task's headline metric (with the
    effective-length ``threshold`` dotted) and its secondary one (:func:`task_meta_of`; a teacher-forced one's title
    says so, :func:`lctx.metrics.label`). A task that does not declare itself a retrieval task gets
    ``plots/<task>_vs_length.png``: its headline metric on a free y axis, no threshold. None without rows."""
    meta = task_meta_of(task, table)
    retrieval = meta.retrieval
    metrics = [m for m in (meta.headline, meta.secondary) if m]
    rows = ok_values(table[(table["task"] == task) & table["metric"].isin(metrics) & table["length"].notna()])
    metrics = [m for m in metrics if (rows["metric"] == m).any()]
    if not metrics:
        return None
    fig = _new_figure(6.8 * len(metrics) + 1.6, 4.8)
    fig.set_layout_engine("constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    trains: dict[int, list] = {}
    for ax, m in zip(axes, metrics):
        r = rows[rows["metric"] == m]
        lengths = set()
        trains = {}
        n_lines = r["label"].nunique()
        for k, (lbl, g) in enumerate(r.groupby("label", sort=False)):
            s = g.groupby(g["length"].astype("int64"))["value"].mean().sort_index()
            c, mk, ls = pal[lbl]
            # later lines are thinner with smaller markers, on top: coinciding lines (all at 0) stay visible
            ax.plot(s.index, s.values, marker=mk, color=c, linestyle=ls, linewidth=max(1.0, 3.2 - 0.4 * k),
                    markersize=4 + min(2.0, 10.0 / max(1, n_lines - 1)) * (n_lines - 1 - k), zorder=2 + k, label=lbl)
            lengths |= set(int(x) for x in s.index)
            tl = g["train_length"].dropna()
            if len(tl):  # the model's training length, in the model's colour (as the perplexity plot)
                trains.setdefault(int(tl.mode().iloc[0]), []).append(c)
        if m == metrics[0] and retrieval:
            ax.axhline(threshold, color="#b22222", linestyle=":", linewidth=1.6)
            ax.annotate(f"effective-length threshold {threshold:g}", xy=(0.0, threshold),
                        xycoords=("axes fraction", "data"), xytext=(4, 3), textcoords="offset points",
                        fontsize=8.5, color="#b22222")
        _length_axis(ax, lengths | set(trains))
        mark_train_lengths(ax, trains)
        if retrieval and r["value"].between(0, 1).all():  # a score in [0, 1]; a declared loss keeps its own axis
            ax.set_ylim(-0.04, 1.04)
        ax.set_xlabel("Context length (tokens, log scale)")
        ax.set_ylabel(f"{m} (mean over depths and samples)")
        ax.set_title(f"{task}: {metric_label(m)}", fontsize=12, fontweight="bold", pad=8)
        ax.grid(True, alpha=0.35)
    handles, labels = axes[0].get_legend_handles_labels()
    if trains:
        handles.append(Line2D([], [], color="#333333", linestyle="--", linewidth=1.4))
        labels.append("training length")
    _legend(fig, axes[-1], handles, labels)
    return _save(fig, out_dir, f"{safe_filename(task)}_{'accuracy_' if retrieval else ''}vs_length.png")


def bench_figure(table: pd.DataFrame, out_dir: str | Path, pal, tasks: list[str], file_name: str = "benchmarks.png",
                 title: str = "Benchmark accuracy", chance: float = 0.25) -> Path | None:
    """``plots/<file_name>``: accuracy bars (mean over questions, status ok; error bars one standard error) per task x
    metric (``acc``, ``acc_norm``) of ``tasks`` (in that order; ``lctx report``: the benchmarks its groups declare,
    :attr:`lctx.tasks.TaskGroup.benchmark`), one bar per ``label`` in ``pal``'s styles, ``chance`` dashed (0.25: four
    choices), titled ``title``. None when the table has no rows of them."""
    rows = ok_values(table[table["task"].isin(list(tasks)) & table["metric"].isin(["acc", "acc_norm"])])
    if rows.empty:
        return None
    g = rows.groupby(["task", "metric", "label"], sort=False)["value"].agg(["mean", "std", "count"]).reset_index()
    g["se"] = g["std"] / np.sqrt(g["count"])
    order = {t: i for i, t in enumerate(tasks)}
    groups = sorted(set(zip(g["task"], g["metric"])), key=lambda tm: (order[tm[0]], tm[0], tm[1]))
    labels = list(dict.fromkeys(g["label"]))
    width = 0.8 / len(labels)
    fig = _new_figure(max(8.5, 1.3 * len(groups) * max(1, len(labels) ** 0.5) + 3.0), 4.8)
    fig.set_layout_engine("constrained")
    ax = fig.add_subplot()
    for j, lbl in enumerate(labels):
        xs, ys, es = [], [], []
        for i, (t, m) in enumerate(groups):
            r = g[(g["task"] == t) & (g["metric"] == m) & (g["label"] == lbl)]
            if len(r):
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(float(r["mean"].iloc[0]))
                es.append(float(r["se"].iloc[0]) if r["count"].iloc[0] > 1 else 0.0)
        c, _, ls = pal[lbl]
        bars = ax.bar(xs, ys, width * 0.92, yerr=es, capsize=3, color=c, label=lbl,  # colours repeat past 10: hatch
                      hatch=None if ls == "-" else "//", edgecolor="white" if ls != "-" else None)
        ax.bar_label(bars, labels=[f"{y:.2f}" for y in ys], padding=2, fontsize=9)
    ns = g.groupby(["task"])["count"].max().to_dict()
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{t}\n{m} (n={int(ns[t])})" for t, m in groups])
    ax.axhline(chance, color="#555555", linestyle="--", linewidth=1.2, label=f"chance ({1 / chance:g} choices)")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("Accuracy (fraction of questions)")
    ax.set_title(f"{title} (error bars: ±1 standard error)", fontsize=12, fontweight="bold")
    ax.grid(True, axis="y", alpha=0.35)
    _legend(fig, ax, *ax.get_legend_handles_labels())
    return _save(fig, out_dir, file_name)



# ----------------------------------------------------------------------------------------------
# positional methods side by side (lctx.harness.outputs.report lays them out)
# ----------------------------------------------------------------------------------------------

def method_heatmaps(df: pd.DataFrame, out_dir: str | Path, task: str, members: list[str], titles: dict[str, str],
                    base: str, metric: str | None = None, train_len: int | None = None) -> Path | None:
    """``plots/<task>_methods_<base>.png``: one row of depth x length heatmaps of ``task``, a panel per positional
    method of one base model, so the methods read side by side on one colour scale.

    Input: the report's table (a ``label`` column names the series), the ``members`` (labels, in panel order: the
    shipped model first), ``titles`` ({label: the panel's title, the method, e.g. ``yarn:factor=4``}), the base
    model's name (the title and the file name), the metric drawn (default the task's headline,
    :func:`task_meta_of`) and the training length (a dashed line, as :func:`task_heatmaps` draws it). Every panel
    has the union of the members' depths and lengths, so columns line up; a cell a method did not run shows "–"
    (the subtitle says "–: not run"; a method that did not run the task at all keeps its panel, titled "(not run)"), a cell whose samples all failed "err", one whose metric the model could not
    give "n/a" (the cells of :func:`depth_grid`, :func:`depth_errors`, :func:`depth_unavailable`).
    Output: the path, or None (nothing written) when no member has rows of ``task`` with depths.
    """
    metric = metric or task_meta_of(task, df).headline
    t = df[df["label"].isin(members)].assign(model=lambda d: d["label"].astype(str))
    t = t.drop(columns=["variant"], errors="ignore")
    rows = t[(t["task"].astype("string") == str(task)) & pd.to_numeric(t["depth"], errors="coerce").notna()]
    if rows.empty:
        return None
    ran = {m for m in members if (rows["model"] == m).any()}
    depths = sorted({float(d) for d in pd.to_numeric(rows["depth"], errors="coerce").dropna()})
    lengths = sorted({int(x) for x in pd.to_numeric(rows["length"], errors="coerce").dropna()})
    index, columns = pd.Index(depths, name="depth", dtype="float64"), pd.Index(lengths, name="length", dtype="int64")
    panels = {}
    for m in members:
        means, counts, errors = _depth_cells(t, m, metric, None, task, [metric])
        na = depth_unavailable(t, m, metric, task=task)
        off = depth_off_cells(t, m, metric, task=task)
        panels[m] = (means.reindex(index=index, columns=columns), counts.reindex(index=index, columns=columns, fill_value=0),
                     *(x.reindex(index=index, columns=columns, fill_value=False).astype(bool) for x in (errors, na, off)))
    n_p, n_d, n_l = len(members), max(len(depths), 1), max(len(lengths), 1)
    filled = pd.concat([p[1].stack() for p in panels.values()])
    filled = filled[filled > 0]
    parts = [("no successful samples" if filled.empty else
              f"n = {int(filled.min())}" + (f"–{int(filled.max())}" if filled.max() != filled.min() else "")
              + " samples per cell (status ok)"), "–: not run", "err: every sample failed"]
    if train_len:
        parts.append(f"dashed line = training length {format_length(train_len)}")
    cell_w = 0.62 if n_p <= 4 else 0.5
    fontsize = 9 if n_l * n_p <= 24 else 7
    pw, ph = max(2.2, cell_w * n_l), max(1.6, 0.46 * n_d)
    left, gap, cgap, cw, right = 0.95, 0.25, 0.25, 0.18, 0.75
    W = left + n_p * pw + (n_p - 1) * gap + cgap + cw + right
    title_lines = wrap_to_width([f"{task} {metric_label(metric)} by method:", str(base)], W - 0.4, 13, "bold", " ")
    sub_lines = wrap_to_width(parts, W - 0.4, 9.5)
    ptitles = {m: "\n".join(wrap_to_width([str(titles.get(m, m)) + ("" if m in ran else " (not run)")], pw, 11))
               for m in members}
    plines = max(x.count("\n") + 1 for x in ptitles.values())
    title_y = [0.28 + 0.24 * i for i in range(len(title_lines))]
    sub_y = [title_y[-1] + 0.30 + 0.17 * i for i in range(len(sub_lines))]
    top, bottom = sub_y[-1] + 0.47 + 0.19 * (plines - 1), 0.62
    H = top + ph + bottom
    fig = _new_figure(W, H)
    im = None
    ylabel = _heatmap_text(task)[1]
    for k, m in enumerate(members):
        ax = fig.add_axes(((left + k * (pw + gap)) / W, bottom / H, pw / W, ph / H))
        means, counts, errors, na, off = panels[m]
        im = _draw_heatmap(ax, means, counts, errors, ptitles[m], train_len, k == 0, fontsize, ylabel, off, na)
        ax.set_gid(f"method:{m}")
    cb = fig.colorbar(im, cax=fig.add_axes(((left + n_p * pw + (n_p - 1) * gap + cgap) / W, bottom / H, cw / W, ph / H)))
    cb.set_label("Mean score (0–1)")
    cb.outline.set_visible(False)
    for line, y in zip(title_lines, title_y):
        fig.text(0.5, 1 - y / H, line, ha="center", va="center", fontsize=13, fontweight="bold")
    for line, y in zip(sub_lines, sub_y):
        fig.text(0.5, 1 - y / H, line, ha="center", va="center", fontsize=9.5, color="#444444")
    return _save(fig, out_dir, f"{safe_filename(task)}_methods_{safe_filename(base)}.png")


def methods_retrieval_figure(series: pd.DataFrame, out_dir: str | Path, base: str, pal: dict, titles: dict[str, str],
                             threshold: float = 0.8, train_len: int | None = None,
                             maxes: dict[str, int | None] | None = None) -> Path | None:
    """``plots/methods_<base>_retrieval.png``: retrieval against length with a line per positional method of one base
    model, a panel per retrieval task.

    Input: ``series``, one row per (label, task, length) with ``metric`` (the task's headline), ``mean`` (over depths
    and samples, status ok), ``ci_low``, ``ci_high`` (its 95 % interval: Wilson for 0/1 scores, t otherwise,
    :mod:`lctx.harness.run.intervals`) and ``n``; ``pal`` ({label: (colour, marker, line style)}, :func:`palette`);
    ``titles`` ({label: the method as the legend names it}); the effective-length ``threshold`` (dotted), the
    training length (dashed, grey) and ``maxes`` ({label: the method's declared maximum in tokens, None when it
    declares none}: a dotted line in the method's colour with a ▼ above the axis where it lies within twice the
    longest length drawn, else "method: max 32K →" at the right edge, so a far maximum never squeezes the curves). Each method's line carries its
    legend name as its label (``Line2D.get_label``) and its interval is a band in its colour. Output: the path, or
    None without rows.
    """
    if series is None or series.empty:
        return None
    maxes = maxes or {}
    tasks = list(dict.fromkeys(series["task"]))
    fig = _new_figure(6.2 * len(tasks) + 2.2, 4.8)
    fig.set_layout_engine("constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks):
        s = series[series["task"] == task]
        lengths = set()
        for lbl in dict.fromkeys(s["label"]):
            g = s[s["label"] == lbl].sort_values("length")
            c, mk, ls = pal[lbl]
            x = g["length"].astype(float).to_numpy()
            lo, hi = g["ci_low"].astype(float).to_numpy(), g["ci_high"].astype(float).to_numpy()
            band = np.isfinite(lo) & np.isfinite(hi)
            if band.any():
                ax.fill_between(x[band], lo[band], hi[band], color=c, alpha=0.14, linewidth=0, zorder=1)
            ax.plot(x, g["mean"].astype(float).to_numpy(), marker=mk, color=c, linestyle=ls, linewidth=2,
                    markersize=5, zorder=3, label=titles.get(lbl, lbl))
            lengths |= {int(v) for v in x}
        # each method's declared maximum, in its colour: a line where it lies within 2x of the longest length run
        # (farther out it would squeeze the curves into a corner), else named at the right edge with an arrow
        declared = [lbl for lbl in dict.fromkeys(s["label"]) if maxes.get(lbl)]
        shown = [lbl for lbl in declared if maxes[lbl] <= 2 * max(lengths)]
        for k, lbl in enumerate(shown):
            c = pal[lbl][0]
            ax.axvline(maxes[lbl], color=c, linestyle=(k * 2, (2, 2 * len(shown) + 1)), linewidth=1.5, zorder=2,
                       label="_max")
            ax.plot([maxes[lbl]], [1.0], marker="v", color=c, markersize=7, transform=ax.get_xaxis_transform(),
                    clip_on=False, zorder=4, label="_max")
        for k, lbl in enumerate(lbl for lbl in declared if lbl not in shown):
            ax.annotate(f"{titles.get(lbl, lbl)}: max {format_length(maxes[lbl])} →", xy=(0.99, 0.6 - 0.07 * k),
                        xycoords="axes fraction", ha="right", va="center", fontsize=8.5, color=pal[lbl][0],
                        bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
        if train_len:
            ax.axvline(train_len, color="#555555", linestyle="--", linewidth=1.4, zorder=2, label="_train")
        ax.axhline(threshold, color="#b22222", linestyle=":", linewidth=1.4, zorder=2, label="_threshold")
        ax.annotate(f"threshold {threshold:g}", xy=(0.0, threshold), xycoords=("axes fraction", "data"),
                    xytext=(4, 3), textcoords="offset points", fontsize=8.5, color="#b22222")
        _length_axis(ax, lengths | ({int(train_len)} if train_len else set())
                     | {int(maxes[lbl]) for lbl in shown})
        metric = s["metric"].iloc[0]
        if s[["mean"]].stack().between(0, 1).all():
            ax.set_ylim(-0.04, 1.04)
        ax.set_xlabel("Context length (tokens, log scale)")
        ax.set_ylabel(f"{metric} (mean over depths and samples)")
        ax.set_title(f"{task}: {metric_label(metric)}", fontsize=12, fontweight="bold", pad=14)
        ax.grid(True, alpha=0.35)
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(Line2D([], [], color="#555555", linestyle=":", marker="v", linewidth=1.5))
    labels.append("declared max (method's colour)")
    if train_len:
        handles.append(Line2D([], [], color="#555555", linestyle="--", linewidth=1.4))
        labels.append(f"training length {format_length(train_len)}")
    _legend(fig, axes[-1], handles, labels)
    fig.suptitle("\n".join(wrap_to_width(["Retrieval vs length by positional method:", _shorten(str(base), 80),
                                          "(bands: 95 % intervals)"], fig.get_figwidth() - 0.4, 12.5, "bold", " ")),
                 fontsize=12.5, fontweight="bold")
    return _save(fig, out_dir, f"methods_{safe_filename(base)}_retrieval.png")
