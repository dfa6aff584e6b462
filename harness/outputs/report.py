"""``lctx report``: one extrapolation report (HTML + Markdown + PNGs) from one or more run directories.

Inputs are run directories written by ``lctx run`` (``results.parquet`` or ``results.csv``, ``run.json``).
Their tables are concatenated (a model evaluated on other tasks in another run stays one model; the
same model and task in two runs is told apart as ``model@run``). Runs without flatness rows get them
derived with the default criteria of :class:`lctx.harness.steps.flatness.FlatnessSpec` (ppl ratio <= 1.1,
retrieval >= 0.8) when they have ppl or passkey rows.

The report (``--out``) holds:

* ``report.html``: one self-contained page (the PNGs embedded as base64 data URIs);
* ``report.md``: the same content in Markdown, linking the PNGs under ``plots/``;
* ``plots/*.png``: perplexity vs length and PPL(L)/PPL(T) vs relative length (log axes, training length
  marked), accuracy vs length per retrieval task, depth x length heatmaps per task and model, MMLU/ARC accuracy
  bars: every figure is drawn by :mod:`lctx.harness.outputs.plots` (public functions), this module lays them out;
* ``summary.csv``: one row per model (training length, flat-until, effective length, retrieval scores at
  the chosen lengths, MMLU/ARC accuracy), ``failures.csv``: the errored cells;
* positional methods, for each base model evaluated under two methods or more (run.json's
  ``inputs.models[name]["position"]``, in one run directory or one per method): a one-line answer (which method
  keeps retrieval above the threshold farthest), a table with a row per method (effective lengths, ppl ratio at 2x,
  4x, 8x with intervals, ppl at 1x against the shipped model, seconds per sample; :func:`method_table`), retrieval vs
  length with a line per method and a row of heatmaps per task; ``positional_methods.csv`` and
  ``positional_retrieval.csv`` hold their numbers.

A metric a model could not give (rows with status ``unavailable``: a server without prompt log-probabilities,
:class:`lctx.errors.MetricUnavailable`) is shown as unavailable with its reason wherever it would appear: a note in the
summary and in its task's section, "unavailable" in the summary's cells, "n/a" cells in its heatmap panel, and a
section that lists every such metric. It is never drawn as 0 and never counted as a failure.

Outside text (a served model id, a server's error, a reason): the tables and ``run.json`` read are redacted
as they are loaded (:func:`lctx.harness.run.tables.clean_frame`, :func:`lctx.outside.clean`: a run written before
lctx redacted keys is no exception), and every file written passes through :func:`lctx.outside.safe` once more:
``report.md``, ``report.html`` (whose ``html.escape`` leaves control characters: they are written as visible
``\\x1b``-style escapes), ``summary.csv`` and ``failures.csv``. A reason is quoted capped (:func:`lctx.outside.quote`).

Which task goes where comes from the declarations (:func:`lctx.tasks.task_meta`, :attr:`lctx.tasks.Task.plots`,
:attr:`lctx.tasks.TaskGroup.benchmark`), not from task names; the derived steps' rows are found by their steps'
names (:data:`lctx.harness.steps.flatness.TASK`, :data:`lctx.harness.steps.ruler.GROUP`).
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from lctx.errors import LctxError
from lctx.metrics import TEACHER_FORCED, bounds_of, is_teacher_forced, may_be_proportion
from lctx.tasks import TASKS, group_of_label
from lctx.tasks import GROUPS  # flatness, ruler (imported above: registered)

from lctx.harness.run.intervals import Z, interval, is_binary, t_interval
from lctx.harness.steps.flatness import (TASK as FLATNESS, FlatnessSpec, derive_table, effective_length, ppl_by_length,
                                         ratio_interval)
from lctx.harness.outputs.compare import SHIPPED, method_label, run_positions
from lctx.harness.outputs.plots import (accuracy_figure, bench_figure, format_length, method_heatmaps,
                                       methods_retrieval_figure, ok_values, palette, perplexity_figure, ruler_figure,
                                       safe_filename, series_label, task_heatmaps, task_meta_of, tasks_with_kind)
from lctx.harness.steps.ruler import GROUP as RULER, ruler_table
from lctx.harness.run.console import say
from lctx.harness.run.rundir import declared_tasks, read_json
from lctx.harness.run.tables import UNAVAILABLE, clean_frame, label_names, name_foreign_records, pooled_task_names
from lctx.outside import clean, quote, safe

#: The chance accuracy drawn on the benchmarks' bars (4 answer choices; a few ARC questions have 3 or 5, so 0.25
#: is the usual reference line).
CHANCE = 0.25


def is_bench_task(task: str) -> bool:
    """True for the multiple-choice knowledge tasks of the report's bar chart: a task whose group declares itself a
    benchmark (:attr:`lctx.tasks.TaskGroup.benchmark`: ``mmlu`` and its pooled labels such as ``mmlu_astronomy``,
    ARC)."""
    group = group_of_label(str(task))
    return group is not None and group.benchmark is not None


def bench_tasks(table: pd.DataFrame) -> list[str]:
    """The benchmark tasks of the table (:func:`is_bench_task`) in the order their groups declare (MMLU, then ARC),
    by name within a group."""
    names = {t for t in table["task"].astype(str) if is_bench_task(t)}
    return sorted(names, key=lambda t: (group_of_label(t).benchmark, t))


def perplexity_tasks(table: pd.DataFrame) -> list[str]:
    """The tasks of the table drawn in the perplexity section: those that declare the ``perplexity_vs_length``
    figure (:attr:`lctx.tasks.Task.plots`: ppl)."""
    return tasks_with_kind(table, "perplexity_vs_length")


# ----------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------

def load_run(run_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """The results table (``results.parquet``, else ``results.csv``) and ``run.json`` of a run directory.

    Raises:
        LctxError: the directory does not exist, has no results table, the table is unreadable/empty, or its
            run.json is damaged (:func:`lctx.harness.run.rundir.read_json`: line and column named).
    """
    d = Path(run_dir)
    if d.exists() and not d.is_dir():
        raise LctxError(f"run directory {str(d)!r} is a file, not a directory; pass the directory `lctx run` "
                        "wrote (the one holding results.csv), not a file in it")
    if not d.is_dir():
        raise LctxError(f"run directory {str(d)!r} does not exist; pass directories written by `lctx run`")
    pq, csv = d / "results.parquet", d / "results.csv"
    try:
        if pq.exists():
            table = pd.read_parquet(pq)
        elif csv.exists():
            table = pd.read_csv(csv)
        else:
            raise LctxError(f"{str(d)!r} has no results.parquet or results.csv; pass a directory written by `lctx run`")
    except LctxError:
        raise
    except Exception as e:  # noqa: BLE001 - a corrupt file is a user problem, not a crash
        raise LctxError(f"cannot read the results of {str(d)!r} ({type(e).__name__}: {quote(e)}); rerun `lctx run` "
                        "with the same --out to rewrite them") from None
    if table.empty or not {"model", "task", "metric", "value", "status"} <= set(table.columns):
        raise LctxError(f"the results table of {str(d)!r} is empty or lacks model/task/metric/value/status columns")

    table = clean_frame(table)  # redacted as read: a run written before lctx redacted keys too
    table = table.assign(model=label_names(table))  # one model run with two option sets: two series, not a mean
    # run.json gives the page its provenance (weights' hashes, git_rev, options) and max_positions: a damaged one
    # is refused as `lctx run` refuses it, never left out of the report without a word
    meta = clean(read_json(d / "run.json") or {})
    name_foreign_records(d, lambda m: say(m, err=True))  # lines run.json does not vouch for
    return table, meta


def _run_labels(dirs: list[Path]) -> list[str]:
    """Short unique labels of run directories: the last path parts needed to tell them apart."""
    parts = [d.resolve().parts for d in dirs]
    for k in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in dirs]


def parse_train_lengths(items: list[str]) -> dict:
    """``lctx report --train-length`` values: ``4096`` (every model whose runs record no training length) or
    ``MODEL=4096`` (that model) -> {None or model: tokens}.

    Raises:
        LctxError: a value that is not N or MODEL=N with N a positive whole number.
    """
    out: dict = {}
    for item in items:
        model, sep, n = str(item).rpartition("=")
        if not n.strip().isdigit() or int(n) < 1 or (sep and not model.strip()):
            raise LctxError(f"--train-length {item!r} is not N or MODEL=N (tokens); write e.g. --train-length 2048 "
                            "or --train-length SmolLM2-135M-Instruct.Q4_1=2048")
        out[model.strip() if sep else None] = int(n)
    return out


def _fill_train_lengths(t: pd.DataFrame, train_lengths: dict) -> pd.DataFrame:
    """Rows of a model whose run recorded no training length get the one ``train_lengths`` gives it (by model
    name, the name before any `` [options]`` label, or None for every model)."""
    if not train_lengths:
        return t
    t = t.copy()
    tl = pd.to_numeric(t["train_length"], errors="coerce")
    base = t["model"].astype(str).str.split(" [", n=1, regex=False).str[0]
    for model, n in train_lengths.items():
        sel = tl.isna() if model is None else tl.isna() & ((base == model) | (t["model"].astype(str) == model))
        t.loc[sel, "train_length"] = n
        tl = pd.to_numeric(t["train_length"], errors="coerce")
    return t


def load_runs(run_dirs: list[str | Path], train_lengths: dict | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """Concatenate the tables of several runs with a ``run`` column (a short label of the directory) and
    derived flatness rows for runs that have none; returns (table, metas), each meta with ``run`` and
    ``dir`` added, and the tasks' declared metadata the runs recorded in ``table.attrs["task_meta"]``
    (:func:`lctx.harness.run.rundir.declared_tasks`; :func:`meta_of` reads it). A (model, variant, task, length)
    present in two runs gets the model renamed ``model@run`` in the later one, so their samples never mix; a model
    whose lengths (or tasks) ran as separate runs is one model. ``train_lengths`` (:func:`parse_train_lengths`) gives models
    whose runs record no training length one (before the flatness rows are derived).

    Raises:
        LctxError: no directory given, one given twice, one that :func:`load_run` refuses, or a ``train_lengths``
            model no run has.
    """

    if not run_dirs:
        raise LctxError("no run directory given; pass one or more directories written by `lctx run`")
    dirs = [Path(d) for d in run_dirs]
    seen_dirs: dict = {}
    for d in dirs:  # the same run twice would show every model twice, as model and model@run
        if d.is_dir() and d.resolve() in seen_dirs:
            raise LctxError(f"run directory {str(d)!r} is given twice (as {str(seen_dirs[d.resolve()])!r} too); "
                            "pass each run once")
        seen_dirs[d.resolve()] = d
    labels = _run_labels(dirs)
    tables, metas, seen = [], [], set()
    for d, label in zip(dirs, labels):
        t, meta = load_run(d)
        t = t.copy()
        for c in ("variant", "train_length", "length", "depth", "device", "dtype", "seed", "error", "task_options"):
            if c not in t.columns:
                t[c] = None
        t = _fill_train_lengths(t, train_lengths or {})
        own_flat = (t["task"].astype("string") == FLATNESS).any()
        flat_note = meta.get(FLATNESS, "from the run") if own_flat else ""
        def cells(t):  # (model, variant, task, length): runs that share one are told apart; other lengths merge
            return set(zip(t["model"].astype(str), t["variant"].astype("string").fillna("").astype(str),
                           t["task"].astype(str), t["length"].astype("string").fillna("").astype(str)))

        combos = cells(t)
        clash = {m for m, v, k, L in combos if (m, v, k, L) in seen}
        if clash:
            models = t["model"].astype(str)
            t["model"] = models.where(~models.isin(clash), models + f"@{label}")
            combos = cells(t)
        seen |= combos
        t["run"] = label
        tables.append(t)
        metas.append(dict(meta, run=label, dir=str(d.resolve()), flatness=flat_note, _own_flat=own_flat))
    # flatness rows for the runs that recorded none, derived over those runs together: a model whose ppl and
    # passkey ran as two runs (one task each) gets one set of rows from both (a model told apart as model@run
    # above keeps its own)
    bare = [t for t, m in zip(tables, metas) if not m["_own_flat"]]
    if bare:
        pool = pd.concat(bare, ignore_index=True)
        derived = derive_table(pool.drop(columns=["run"]))
        if len(derived):
            first_run = dict(zip(pool["model"].astype(str)[::-1], pool["run"][::-1]))  # a model's first run
            derived["run"] = derived["model"].astype(str).map(first_run)
            tables.append(derived.astype({c: pool[c].dtype for c in derived.columns if c in pool.columns},
                                         errors="ignore"))
            with_rows = set(derived["model"].astype(str))
            for t, m in zip(tables, metas):
                if not m["_own_flat"] and with_rows & set(t["model"].astype(str)):
                    m["flatness"] = "derived by the report: ppl_ratio <= 1.1, passkey.exact >= 0.8"
    for m in metas:
        m.pop("_own_flat")
    table = pd.concat(tables, ignore_index=True)
    names = set(table["model"].astype(str)) | set(table["model"].astype(str).str.split(" [", n=1, regex=False).str[0])
    unknown = [m for m in (train_lengths or {}) if m is not None and m not in names]
    if unknown:  # a misspelled MODEL=N would apply to nothing, and the report would still call it unknown
        import difflib  # lazy: +1 ms

        close = difflib.get_close_matches(unknown[0], sorted(names), n=2, cutoff=0.6)
        raise LctxError(f"--train-length {unknown[0]}={train_lengths[unknown[0]]}: no run has a model "
                        f"{unknown[0]!r}{'; did you mean ' + ' or '.join(close) + '?' if close else ''} "
                        f"(models: {', '.join(sorted(names))}); write --train-length MODEL=N with one of them")
    table["value"] = pd.to_numeric(table["value"], errors="coerce")
    table["length"] = pd.to_numeric(table["length"], errors="coerce")
    table["depth"] = pd.to_numeric(table["depth"], errors="coerce")
    table["train_length"] = pd.to_numeric(table["train_length"], errors="coerce")
    table["status"] = table["status"].astype("string").fillna("")
    table["task"] = pooled_task_names(table, ("run",))  # an MMLU run of one subject is mmlu_astronomy, as its summary
    table["label"] = [series_label(m, v) for m, v in zip(table["model"], table["variant"])]
    table["label"] = kernel_labels(table)
    declared: dict = {}
    for meta in metas:  # a later run's declaration of a task replaces an earlier one's
        declared.update(declared_tasks(meta))
    table.attrs["task_meta"] = declared  # read by meta_of: no task file needed to report a --task-file task
    return table, metas


#: attn_kernel values that mean a computation other than the variant's own ran, as the label names it:
#: alibi_lsh's exact-ALiBi dispatch on the CPU fast path (``lsh_exact_dispatch``, models/lsh.py)
KERNEL_NOTES = {"lsh-exact-alibi": "exact ALiBi"}


def kernel_labels(table: pd.DataFrame) -> pd.Series:
    """The ``label`` column with each model whose rows record a :data:`KERNEL_NOTES` kernel in ``attn_kernel``
    (alone or in a ``+``-joined list) marked with what ran and at which lengths, e.g.
    ``m (alibi_lsh; exact ALiBi at 128, 256)``: the summary, the plots' legends and the heatmaps then never
    show exact ALiBi's numbers under the LSH variant's name alone. Other labels are returned unchanged."""
    labels = table["label"].copy()
    if "attn_kernel" not in table.columns:
        return labels
    kernels = table["attn_kernel"].astype("string").fillna("").str.split("+")
    for (model, variant), g in table.groupby(["model", table["variant"].astype("string").fillna("")], sort=False):
        notes = []
        for kernel, what in KERNEL_NOTES.items():
            hit = kernels[g.index].map(lambda ks, kernel=kernel: kernel in ks)
            if hit.any():
                lengths = sorted(set(pd.to_numeric(g.loc[hit, "length"], errors="coerce").dropna().astype(int)))
                notes.append(f"{what} at {', '.join(format_length(x) for x in lengths)}" if lengths else f"{what} ran")
        if notes:
            inner = "; ".join(([variant] if variant and variant != str(model) else []) + notes)
            labels[g.index] = f"{model} ({inner})"
    return labels


def meta_of(task: str, table: pd.DataFrame | None = None):
    """The declared metadata of ``task`` (:func:`lctx.harness.outputs.plots.task_meta_of`): what its run directories
    recorded (``table.attrs["task_meta"]``, set by :func:`load_runs` from run.json), else its class attributes when
    registered, else what ``table`` shows: its first metric as headline, a depth axis when its rows have depths."""
    return task_meta_of(task, table)


def _length_tasks(table: pd.DataFrame) -> list[str]:
    """The tasks of the table with a length axis, in table order, without the derived groups
    (:data:`lctx.tasks.GROUPS`, :mod:`lctx.harness.steps.derived`) and the knowledge benchmarks."""

    t = table[table["length"].notna() & ~table["task"].isin(list(GROUPS))]
    return [k for k in dict.fromkeys(t["task"].astype(str)) if not is_bench_task(k)]


def retrieval_tasks(table: pd.DataFrame) -> list[str]:
    """Tasks of the table that declare themselves retrieval tasks (:attr:`lctx.tasks.Task.retrieval`: passkey,
    niah_*, RULER's), sorted by name."""
    return sorted(k for k in _length_tasks(table) if meta_of(k, table).retrieval)


def other_tasks(table: pd.DataFrame) -> list[str]:
    """Tasks of the table with a length axis that are neither retrieval tasks nor perplexity (drawn in the
    perplexity section): custom tasks such as docs/custom-tasks.md's ``last_token_nll``, with or without a depth axis."""
    perplexity = perplexity_tasks(table)
    return sorted(k for k in _length_tasks(table) if not meta_of(k, table).retrieval and k not in perplexity)


def primary_metric(task: str, table: pd.DataFrame | None = None) -> str:
    """The headline metric of a task (:meth:`lctx.tasks.Task.headline`; for a task not registered here, the
    table's first metric of that task)."""
    return meta_of(task, table).headline


def secondary_metric(task: str, table: pd.DataFrame | None = None) -> str | None:
    """The metric shown beside the headline one (:attr:`lctx.tasks.Task.secondary_metric`: passkey digit_acc,
    NIAH tf_top1), or None."""
    return meta_of(task, table).secondary


def ruler_blocks(table: pd.DataFrame, out_dir: Path) -> tuple[list, list[Path]]:
    """The report's RULER section (:mod:`lctx.harness.steps.ruler`): per model label with ``ruler`` rows, its table
    (RULER's score of each task per length in percent, the average, the effective length at the threshold)
    and ``plots/ruler_<label>.png`` (the grid beside the average, :func:`lctx.harness.outputs.plots.ruler_figure`).
    Returns (blocks, plot paths); no blocks without ``ruler`` rows."""

    labels = list(dict.fromkeys(table.loc[table["task"] == RULER, "label"]))
    blocks: list = []
    paths: list[Path] = []
    for lbl in labels:
        rows = table[table["label"] == lbl]
        grid, info = ruler_table(rows)
        disp = grid.copy()
        disp.columns = [format_length(c) for c in grid.columns]
        disp = disp.map(lambda v: f"{v:.1f}" if np.isfinite(v) else "–").reset_index().rename(columns={"index": "task"})
        e = info.get("effective_length", float("nan"))
        thr = info.get("threshold")
        etxt = ("–" if not np.isfinite(e) else f"< {format_length(min(grid.columns))}" if e == 0 else format_length(e))
        left = info.get("left_out") or []
        blocks.append(("p", f"{lbl}: RULER score per task and length in percent (mean over samples and depths; "
                            f"NIAH, vt, cwe, fwe: string_match_all; QA: string_match_part); average = mean of the "
                            f"{len(info.get('tasks', []))} tasks" + (f" ({', '.join(left)} left out)" if left else "")
                       + f". Effective length (average ≥ {thr:g} at every length up to it): {etxt}."))
        blocks.append(("table", disp, ""))
        p = ruler_figure(grid, info, lbl, out_dir / "plots" / f"ruler_{safe_filename(lbl)}.png")
        blocks.append(("figs", [(p, "Left: RULER score per task and length (%); the last row is the average. "
                                    "Right: the average by length with the threshold (dashed) and the effective "
                                    "length (dotted).", True)]))
        paths.append(p)
    return blocks, paths


def category_table(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """One model's length x category table from its rows of a results table: per length, each
    category's score in percent, the mean over the category's tasks of each task's headline metric (mean over ok
    samples and depths, x100), as RULER averages its tasks; a task counts where it has a score at that length; and
    ``RULER average`` beside them when the rows hold the ``ruler`` group's. Categories come from the tasks'
    declarations (:attr:`lctx.tasks.Task.category`, :data:`lctx.tasks.CATEGORIES` order); tasks without one (ppl,
    MMLU) are left out. Returns (the table: index the lengths, columns the categories present, ``attrs["counts"]``
    {(length, category): the tasks scored there}; {category: its tasks})."""
    from lctx.tasks import CATEGORIES  # the column order

    ok = ok_values(rows)
    ok = ok[ok["length"].notna() & ~ok["task"].isin(list(GROUPS))]
    cats: dict[str, list[str]] = {}
    for task in dict.fromkeys(ok["task"].astype(str)):
        cat = meta_of(task, rows).category
        if cat is not None and not is_bench_task(task):
            cats.setdefault(cat, []).append(task)
    cats = {c: sorted(cats[c]) for c in CATEGORIES if c in cats}
    lengths = sorted({int(x) for x in pd.to_numeric(ok.loc[ok["task"].isin([t for ts in cats.values() for t in ts]),
                                                           "length"], errors="coerce").dropna()})
    grid = pd.DataFrame(float("nan"), index=lengths, columns=list(cats))
    counts: dict = {}
    for cat, tasks in cats.items():
        for L in lengths:
            scores = []
            for t in tasks:
                r = ok[(ok["task"] == t) & (ok["metric"] == meta_of(t, rows).headline)
                       & (ok["length"].astype("int64") == L)]
                if len(r):
                    scores.append(100.0 * float(r["value"].astype(float).mean()))
            if scores:
                grid.loc[L, cat] = float(np.mean(scores))
                counts[(L, cat)] = len(scores)
    avg = rows[(rows["task"] == RULER) & (rows["metric"] == "average")]
    if len(avg) and len(cats):
        av = dict(zip(pd.to_numeric(avg["length"]).astype("int64"), pd.to_numeric(avg["value"], errors="coerce")))
        grid["RULER average"] = [float(av.get(L, float("nan"))) for L in grid.index]
    grid.attrs["counts"] = counts
    return grid, cats


def category_blocks(table: pd.DataFrame) -> list:
    """The report's "By category" section: per model label whose tasks fall in two categories or more, or that ran
    RULER's group, its :func:`category_table` (scores in percent, the tasks each category averages named)."""
    blocks: list = []
    for lbl in dict.fromkeys(table["label"]):
        rows = table[table["label"] == lbl]
        grid, cats = category_table(rows)
        if not cats or (len(cats) < 2 and "RULER average" not in grid.columns):
            continue
        counts = grid.attrs.get("counts", {})

        def cell(L, c, v):
            if not np.isfinite(v):
                return "–"
            k = counts.get((L, c))
            return f"{v:.1f}" + (f" ({k}/{len(cats[c])})" if k is not None and k < len(cats[c]) else "")

        disp = pd.DataFrame({c: [cell(L, c, v) for L, v in grid[c].items()] for c in grid.columns})
        disp.insert(0, "length", [format_length(L) for L in grid.index])
        named = "; ".join(f"{c}: {', '.join(ts)}" for c, ts in cats.items())
        blocks.append(("p", f"{lbl}: score by category and length in percent (each task's headline metric, mean "
                            f"over samples and depths, then the mean over the category's tasks that ran at that "
                            f"length; (k/n): only k of its n tasks ran there; {named})."))
        blocks.append(("table", disp.reset_index(drop=True), ""))
    return blocks


def teacher_forced_note(table: pd.DataFrame, task: str) -> str | None:
    """The line a task's section carries when a metric it shows (its secondary metric, its heatmap panels) is
    teacher-forced (:attr:`lctx.metrics.Metric.teacher_forced`: passkey digit_acc, NIAH tf_*), or None: such a
    score is 1.00 in cells where greedy decoding fails, and must not be read as what the model generates."""
    rows = table[table["task"] == task]
    shown = [secondary_metric(task, table)] + list(getattr(TASKS.get(task), "heatmap_metrics", None) or ())
    tf = [m for m in dict.fromkeys(shown) if m and is_teacher_forced(m) and (rows["metric"] == m).any()]
    if not tf:
        return None
    names = ", ".join(tf)
    one = len(tf) == 1
    return (f"{names} {'is' if one else 'are'} {TEACHER_FORCED}: the expected answer's tokens are fed after the prompt "
            f"and each is scored after the true ones before it, not on what the model generates; "
            f"{'it' if one else 'they'} can be 1.00 where greedy decoding fails ({primary_metric(task, table)} 0), "
            f"e.g. a continuation that starts with words instead of the answer.")


def heatmaps(table: pd.DataFrame, out_dir: Path) -> dict[str, list[Path]]:
    """Depth x length heatmaps per task and model, of every task whose rows get one
    (:func:`lctx.harness.outputs.plots.tasks_with_kind`; drawn by :func:`lctx.harness.outputs.plots.task_heatmaps`):
    {task: [paths]}."""

    t = table[~table["task"].isin(list(GROUPS))].copy()
    t["model"] = t["model"].astype(str)
    out: dict[str, list[Path]] = {}
    for task in tasks_with_kind(t, "depth_heatmap"):
        paths = task_heatmaps(t, out_dir, task)
        if paths:
            out[task] = paths
    return out


def narrow_heatmap(task: str) -> bool:
    """Whether the report sets two of ``task``'s heatmaps side by side (:attr:`lctx.tasks.Heatmap.narrow`: passkey's
    two panels); else one per row."""
    return bool(getattr(getattr(TASKS.get(str(task)), "heatmap", None), "narrow", False))


# ----------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------

def parse_at(text: str) -> list[tuple[str, float]]:
    """Parse ``--at`` "1x,4x,2k": lengths at which the summary shows retrieval scores, each either a
    multiple of the model's training length (``Nx``) or tokens (k = 1024). Returns [("rel"|"abs", value)].

    Raises:
        LctxError: an entry that is neither.
    """
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)[xX]", part)
        a = re.fullmatch(r"(\d+)([kKmM]?)", part)
        if m and float(m.group(1)) > 0:
            out.append(("rel", float(m.group(1))))
        elif a and int(a.group(1)) > 0:
            out.append(("abs", float(int(a.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2}[a.group(2).lower()])))
        else:
            raise LctxError(f"--at {part!r} is neither a multiple of the training length (1x, 4x) nor a length "
                            "in tokens (512, 2k); write e.g. --at 1x,4x,8x")
    if not out:
        raise LctxError("--at is empty; write e.g. --at 1x,4x,8x")
    return out


#: ``--at`` when none is given and a model of the report has a training length (:func:`default_at`).
DEFAULT_AT = "1x,2x,8x"


def default_at(table: pd.DataFrame) -> tuple[list[tuple[str, float]], str | None]:
    """The summary's lengths when ``--at`` is not given: :data:`DEFAULT_AT` (multiples of the training length)
    when a model of ``table`` has a training length; when none has one (a GGUF or Hugging Face checkpoint run
    without ``--train-length``), every column at a multiple of it would be "–", so the tested lengths of the
    summary's tasks (:func:`retrieval_tasks`, :func:`other_tasks`), in tokens. Returns (the lengths as
    :func:`parse_at` gives them, the sentence the page shows about it or None)."""
    if table["train_length"].notna().any():
        return parse_at(DEFAULT_AT), None
    tasks = retrieval_tasks(table) + other_tasks(table)
    lengths = sorted({int(x) for x in table.loc[table["task"].isin(tasks), "length"].dropna()})
    if not lengths:
        return parse_at(DEFAULT_AT), None
    return [("abs", float(L)) for L in lengths], (
        f"No model has a training length, so the summary's score columns are at the tested lengths "
        f"({', '.join(format_length(L) for L in lengths)}) instead of {DEFAULT_AT}; pass --at to choose others.")


def _fmt_len(v, T=None, max_tested=None, zero="–") -> str:
    if v is None or not np.isfinite(v):
        return "–"
    if v == 0:
        return zero
    s = format_length(v) + (f" ({v / T:g}×)" if T else "")
    return ("≥ " + s) if max_tested is not None and v >= max_tested else s


def _mean_ci(values: pd.Series, metric: str | None = None) -> tuple[float, float, float, int]:
    """(mean, 95 % interval low, high, n) of a cell's sample values: Wilson when every value is 0 or 1, else t
    (:mod:`lctx.harness.run.intervals`), clipped to ``metric``'s registered range; NaNs for no values (and the
    interval for one continuous value)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    n = len(v)
    if not n:
        return math.nan, math.nan, math.nan, 0
    mean = float(v.mean())
    se = float(v.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    kind = "wilson" if is_binary(v) and (metric is None or may_be_proportion(metric)) else "t"
    lo, hi = interval(mean, se, n, kind, bounds_of(metric) if metric else None)
    return mean, lo, hi, n


def _with_ci(text: str, lo: float, hi: float, n: int) -> str:
    """``0.80 [0.38, 0.96] n=5``: a summary cell with its 95 % interval and n (the interval left out where there
    is none)."""
    if not n:
        return text
    ci = f" [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    return f"{text}{ci} n={n}"


def summary_table(table: pd.DataFrame, at: list[tuple[str, float]] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per model label: (display table of strings, numeric table for ``summary.csv``).

    Columns: model, runs, train length (tokens), PPL at the training length, flat-until (tokens; "≥" when
    it is the longest length tested, i.e. flat as far as the sweep looked), effective length (tokens;
    "<L" when the shortest tested length L already falls below the threshold), the headline metric of each
    retrieval task and each other task with a length axis (:func:`other_tasks`) at each ``at`` length, and
    MMLU/ARC ``acc`` (mean over questions). Every mean carries its 95 % interval and n (:func:`_mean_ci`; the
    numeric table: ``<column> ci_low`` / ``ci_high`` / ``n``).
    """
    at = at or [("rel", 1.0), ("rel", 2.0), ("rel", 8.0)]
    labels = list(dict.fromkeys(table["label"]))
    rtasks = retrieval_tasks(table) + other_tasks(table)
    btasks = bench_tasks(table)
    ok = ok_values(table)
    ptask = next(iter(perplexity_tasks(table)), None)
    na = table[table["status"] == UNAVAILABLE]
    disp, num = [], []

    def shown(v: float, fmt: str, task: str, metric: str, lbl: str, length=None) -> str:
        """``v`` formatted; "unavailable" where it has no value because the model could not give it."""
        if np.isfinite(v):
            return fmt.format(v)
        g = na[(na["label"] == lbl) & (na["task"] == task) & (na["metric"] == metric)]
        if length is not None:
            g = g[np.isclose(g["length"], length)]
        return UNAVAILABLE if len(g) else "–"

    for lbl in labels:
        rows = table[table["label"] == lbl]
        okr = ok[ok["label"] == lbl]
        tl = rows["train_length"].dropna()
        T = int(tl.mode().iloc[0]) if len(tl) else None
        d = {"model": lbl, "runs": ", ".join(dict.fromkeys(rows["run"].astype(str))),
             "train length": format_length(T) if T else "–"}
        n = {"model": lbl, "runs": d["runs"], "train_length": T}
        ppl = (okr[(okr["task"] == ptask) & (okr["metric"] == meta_of(ptask, table).headline)] if ptask
               else okr.iloc[:0])
        pT = ppl[ppl["length"] == T]["value"].mean() if T else float("nan")
        d["PPL at train length"] = (shown(pT, "{:.2f}", ptask, meta_of(ptask, table).headline, lbl, T)
                                    if ptask and T else "–")
        n["ppl_at_train_length"] = pT
        ppl_max = ppl["length"].max() if len(ppl) else None
        fl = rows[(rows["task"] == FLATNESS) & (rows["metric"] == "flat_until")]
        fv = float(fl["value"].iloc[0]) if len(fl) else float("nan")
        d["flat until"] = _fmt_len(fv, T, ppl_max)
        n["flat_until"] = fv
        ef = rows[(rows["task"] == FLATNESS) & (rows["metric"] == "effective_length")]
        ev = float(ef["value"].iloc[0]) if len(ef) else float("nan")
        ret_task = (json.loads(ef["task_options"].iloc[0]) or {}).get("retrieval") if len(ef) and isinstance(ef["task_options"].iloc[0], str) else None
        rl = okr[(okr["task"] == ret_task)]["length"] if ret_task else pd.Series(dtype=float)
        d["effective length"] = _fmt_len(
            ev, T, rl.max() if len(rl) else None, zero=f"< {format_length(rl.min())}" if len(rl) else "0")
        n["effective_length"] = ev
        rr = rows[rows["task"] == RULER]  # RULER's group (harness/steps/ruler.py): average per length, effective length
        if len(rr):
            re_ = rr[rr["metric"] == "effective_length"]
            rv = float(re_["value"].iloc[0]) if len(re_) else float("nan")
            ra = rr[(rr["metric"] == "average") & (rr["status"] == "ok")]
            d["RULER effective length"] = _fmt_len(rv, T, ra["length"].max() if len(ra) else None,
                                                   zero=f"< {format_length(rr['length'].min())}" if rr["length"].notna().any() else "0")
            n["ruler_effective_length"] = rv
        for task in rtasks:
            m = primary_metric(task, table)
            r = okr[(okr["task"] == task) & (okr["metric"] == m)]
            for kind, x in at:
                L = x * T if kind == "rel" and T else (x if kind == "abs" else None)
                # "mrcr @ 1K", not "mrcr mrcr @ 1K": a metric named as its task is said once
                name = f"{task}{'' if m == task else ' ' + m} @ {f'{x:g}×' if kind == 'rel' else format_length(x)}"
                v, lo, hi, k = _mean_ci(r[np.isclose(r["length"], L)]["value"], m) if L and len(r) else (math.nan,) * 3 + (0,)
                d[name] = _with_ci(shown(v, "{:.2f}", task, m, lbl, L), lo, hi, k) if L else "–"
                n[name], n[f"{name} ci_low"], n[f"{name} ci_high"], n[f"{name} n"] = v, lo, hi, k
        for task in btasks:
            r = okr[(okr["task"] == task) & (okr["metric"] == "acc")]
            v, lo, hi, k = _mean_ci(r["value"], "acc")
            d[f"acc (mean over questions) @ {task}"] = _with_ci(f"{v:.3f}", lo, hi, k) if len(r) else "–"
            n[f"{task}_acc"], n[f"{task}_acc ci_low"], n[f"{task}_acc ci_high"], n[f"{task}_acc n"] = v, lo, hi, k
        disp.append(d)
        num.append(n)
    return pd.DataFrame(disp).fillna("–"), pd.DataFrame(num)


def train_length_notes(table: pd.DataFrame, metas: list[dict]) -> list[str]:
    """One line naming every model the summary has no training length for (its columns at multiples of it and its PPL at
    it stay "–"): how to give one, and the maximum the checkpoint declares (``max_positions`` in run.json:
    ``max_position_embeddings``, a GGUF's ``llama.context_length``), labelled as such: a model may declare
    far more positions than it was trained on, so it is shown, never used as the training length."""
    declared = {}
    for m in metas:
        for name, n in (m.get("max_positions") or {}).items() if isinstance(m.get("max_positions"), dict) else ():
            declared.setdefault(m.get("run"), {})[name] = n
    unknown = []  # (label, its model name, the maxima its checkpoint declares)
    for lbl in dict.fromkeys(table["label"]):
        rows = table[table["label"] == lbl]
        if rows["train_length"].notna().any():
            continue
        names = {str(x).split(" [", 1)[0].split("@", 1)[0] for x in rows["model"]}
        maxes = sorted({int(n) for r in dict.fromkeys(rows["run"].astype(str)) for k, n in declared.get(r, {}).items()
                        if k in names and n})
        unknown.append((lbl, sorted(names)[0], maxes))
    if not unknown:
        return []
    # one note for every such model: the fix said once, each model's declared maximum beside its name
    who = "; ".join(f"{lbl}" + (f" (declares max positions {', '.join(format_length(n) for n in maxes)})" if maxes
                                else "") for lbl, _, maxes in unknown)
    decl = (" A declared maximum (max_position_embeddings / GGUF context_length) is how far a model may address, "
            "not the length it was trained on." if any(m for _, _, m in unknown) else "")
    return [f"Train length unknown for {who}: the columns at multiples of it stay “–”; pass --train-length N to lctx "
            f"run, or --train-length {unknown[0][1]}=N to lctx report.{decl}"]


def _criterion(rows: pd.DataFrame) -> str:
    if not len(rows):
        return ""
    try:
        return str((json.loads(rows["task_options"].iloc[0]) or {}).get("criterion", ""))
    except (TypeError, json.JSONDecodeError):
        return ""


def failures_table(table: pd.DataFrame) -> pd.DataFrame:
    """The errored cells: one row per (run, model, task, length, depth) with status error: samples failed
    and the first error message (with how many distinct messages there were)."""
    err = table[table["status"] == "error"]
    cols = ["run", "model", "task", "length", "depth", "samples failed", "error"]
    if err.empty:
        return pd.DataFrame(columns=cols)
    err = err.drop_duplicates(["run", "label", "task", "length", "depth", "sample", "task_options"])
    rows = []
    for (run, lbl, task, L, dp), g in err.groupby(["run", "label", "task", "length", "depth"], dropna=False, sort=True):
        msgs = list(dict.fromkeys(g["error"].astype(str)))
        msg = msgs[0] + (f" (+{len(msgs) - 1} similar messages)" if len(msgs) > 1 else "")
        rows.append({"run": run, "model": lbl, "task": task, "length": "" if pd.isna(L) else format_length(L),
                     "depth": "" if pd.isna(dp) else f"{dp * 100:.0f}%", "samples failed": len(g), "error": msg})
    return pd.DataFrame(rows, columns=cols)


def unavailable_table(table: pd.DataFrame) -> pd.DataFrame:
    """The metrics the models could not give (rows with status ``unavailable``): one row per (run, model, task,
    reason) with the metrics, the samples and the reason; empty when every metric was given."""
    na = table[table["status"] == UNAVAILABLE]
    cols = ["run", "model", "task", "metrics", "samples", "reason"]
    if na.empty:
        return pd.DataFrame(columns=cols)
    reason = na["reason"].astype("string").fillna("") if "reason" in na.columns else pd.Series("", index=na.index)
    na = na.assign(reason=reason.where(reason != "", UNAVAILABLE))
    rows = []
    for (run, lbl, task, why), g in na.groupby(["run", "label", "task", "reason"], sort=False):
        rows.append({"run": run, "model": lbl, "task": task,
                     "metrics": ", ".join(dict.fromkeys(g["metric"].astype(str))),
                     "samples": int(g.drop_duplicates(["length", "depth", "sample"]).shape[0]), "reason": why})
    return pd.DataFrame(rows, columns=cols)


def unavailable_notes(table: pd.DataFrame, task: str | None = None) -> list[str]:
    """One line per (model, reason) of the metrics the models could not give (of ``task`` only when given), e.g.
    ``Unavailable for toy (no value, never 0): passkey digit_acc: no prompt log-probs``."""
    t = unavailable_table(table if task is None else table[table["task"] == task])
    notes = []
    for (lbl, why), g in t.groupby(["model", "reason"], sort=False):
        what = "; ".join(f"{r.task} {r.metrics}" for r in g.itertuples(index=False))
        notes.append(f"Unavailable for {lbl} (no value, never 0; left out of every mean and figure): {what}: "
                     f"{quote(why)}.")
    return notes


def shown_dir(d, page_dir=None) -> str:
    """A run directory as a report page shows it: relative to the page's folder ``page_dir`` (``../runs/x``), never a
    machine's absolute path (a page is shared); its last two parts when it lies on another drive or no page is given."""
    import os  # light

    d = Path(d)
    if page_dir is not None:
        try:
            return Path(os.path.relpath(d.resolve(), Path(page_dir).resolve())).as_posix()
        except ValueError:  # another drive (Windows)
            pass
    return "/".join(d.resolve().parts[-2:])


def metadata_table(metas: list[dict], table: pd.DataFrame, page_dir=None) -> pd.DataFrame:
    """One row per run (``page_dir``: the report's folder, the directory shown relative to it): directory, run id, lctx version, git revision, torch, python, host, devices,
    dtypes, attention path, seeds, models, tasks, lengths, depths, samples, rows, errors and time span."""
    out = []
    for meta in metas:
        t = table[table["run"] == meta["run"]]
        t = t[t["task"] != FLATNESS]

        def uniq(col, t=t):
            return ", ".join(str(x) for x in dict.fromkeys(t[col].dropna().astype(str))) if col in t.columns else ""

        seeds = sorted({int(s) for s in pd.to_numeric(t["seed"], errors="coerce").dropna()})
        lm = meta.get("lmeval") or {}
        ts = pd.to_datetime(t["timestamp"], errors="coerce", utc=True).dropna() if "timestamp" in t.columns else []
        out.append({
            "run": meta["run"], "directory": shown_dir(meta["dir"], page_dir), "run id": meta.get("run_id", ""),
            "lctx": meta.get("lctx_version", uniq("lctx_version")), "git revision": meta.get("git_rev", uniq("git_rev")),
            "torch": meta.get("torch", ""), "python": meta.get("python", ""), "host": meta.get("host", ""),
            "devices": uniq("device"), "dtypes": uniq("dtype"), "attention": uniq("attn_impl"),
            "seeds": ", ".join(map(str, seeds)), "models": uniq("model"), "tasks": uniq("task"),
            "lengths": ", ".join(format_length(x) for x in meta.get("lengths", []) or []),
            "depths": ", ".join(f"{d:g}" for d in meta.get("depths", []) or []),
            "samples per cell": meta.get("samples", ""),
            "lm-eval": (f"{lm.get('lm_eval')} ({lm.get('source')} data, "
                        f"{'all questions' if lm.get('limit') is None else 'first %s questions' % lm.get('limit')}, "
                        f"{'default' if lm.get('num_fewshot') is None else lm.get('num_fewshot')} few-shot)") if lm else "",
            "flatness": (", ".join(f"{k}={v}" for k, v in meta[FLATNESS].items()) if isinstance(meta.get(FLATNESS), dict)
                         else str(meta.get(FLATNESS, ""))),
            "rows": len(t), "error rows": int((t["status"] == "error").sum()),
            "time span (UTC)": (f"{ts.min():%Y-%m-%d %H:%M} – {ts.max():%H:%M}" if len(ts) else ""),
        })
    return pd.DataFrame(out)


# ----------------------------------------------------------------------------------------------
# positional methods: which method extends a model, and how far
# ----------------------------------------------------------------------------------------------

#: the multiples of the reference length at which the positional-methods table shows the ppl ratio
METHOD_RATIOS = (2.0, 4.0, 8.0)
#: what a cell of the positional-methods table says where the runs did not measure it (never 0)
NOT_RUN = "not run"


def _run_model_name(model: object, run: object) -> str:
    """A table model's name as its run directory recorded it: without :func:`load_runs`' ``@run`` suffix and
    :func:`lctx.harness.run.tables.label_names`' `` [options]``."""
    name = str(model).split(" [", 1)[0]
    tail = f"@{run}"
    return name[: -len(tail)] if name.endswith(tail) else name


def model_positions(table: pd.DataFrame, metas: list[dict]) -> dict[str, dict]:
    """The positional method of each model label of the report: {label: {"base", "method", "label" (the method as
    shown, :func:`lctx.harness.outputs.compare.method_label`), "options", "layer_type", "effective", "name" (the
    model's name in its run), "run", "max_positions" (the declared maximum the run recorded for it, run.json ``max_positions``; None when it declares
    none, e.g. attention sinks)}}, read from each run's ``run.json`` ``inputs.models[name]["position"]``.

    A model whose run records no method (a run from before positional methods were recorded, or of a model without one) counts as the shipped
    model of the base of that name when another model of the report names it as its base (``inferred``: True), so a
    run directory per method reports together with an older run of the checkpoint as shipped; other such models are
    left out (no method to compare)."""
    by_run = {m.get("run"): m for m in metas}
    out: dict[str, dict] = {}
    pending = []
    firsts = table.drop_duplicates("label")
    for lbl, run, model, variant in zip(firsts["label"], firsts["run"], firsts["model"], firsts["variant"]):
        name = _run_model_name(model, run)
        meta = by_run.get(run) or {}
        pos = run_positions(meta).get(name)
        maxes = meta.get("max_positions") if isinstance(meta.get("max_positions"), dict) else {}
        mx = maxes.get(name)
        rec = {"name": name, "run": run, "max_positions": int(mx) if isinstance(mx, (int, float)) and not
               isinstance(mx, bool) and mx > 0 else None}
        if pos is not None and pos.get("method"):
            rec.update(base=str(pos.get("base") or name), method=str(pos["method"]),
                       options=pos.get("options") if isinstance(pos.get("options"), dict) else {},
                       layer_type=pos.get("layer_type"), effective=pos.get("effective") or {},
                       label=method_label(pos, name, variant), inferred=False)
            out[lbl] = rec
        else:
            pending.append((lbl, rec))
    bases = {r["base"] for r in out.values()}
    for lbl, rec in pending:
        if rec["name"] in bases:
            rec.update(base=rec["name"], method=SHIPPED, options={}, layer_type=None, effective={}, label=SHIPPED,
                       inferred=True)
            out[lbl] = rec
    return out


def method_groups(positions: dict[str, dict]) -> dict[str, list[str]]:
    """{base model: its labels} for each base with two methods or more in ``positions`` (:func:`model_positions`),
    the shipped model first, then in table order."""
    groups: dict[str, list[str]] = {}
    for lbl, rec in positions.items():
        groups.setdefault(rec["base"], []).append(lbl)
    return {base: sorted(members, key=lambda m: positions[m]["method"] != SHIPPED)
            for base, members in groups.items() if len(members) > 1}


def _member_titles(members: list[str], positions: dict[str, dict]) -> dict[str, str]:
    """{label: the method as the table, legends and panels name it}; a method shown twice (the shipped model in two
    run directories) gets its run in brackets."""
    titles = {m: positions[m]["label"] for m in members}
    counts = pd.Series(list(titles.values())).value_counts()
    return {m: (f"{t} ({positions[m]['run']})" if counts[t] > 1 else t) for m, t in titles.items()}


def _reference_length(table: pd.DataFrame, members: list[str], positions: dict[str, dict]) -> tuple[int | None, str]:
    """(1×: the length the table's multiples refer to, what it is): the training length the runs record (the shipped
    model's first), else the shipped model's declared maximum (run.json ``max_positions``; a Hugging Face checkpoint
    run without ``--train-length``), else (None, "")."""
    for m in members:
        tl = table.loc[table["label"] == m, "train_length"].dropna()
        tl = tl[tl > 0]
        if len(tl):
            return int(tl.mode().iloc[0]), "training length"
    for m in members:
        if positions[m]["method"] == SHIPPED and positions[m]["max_positions"]:
            return int(positions[m]["max_positions"]), "the shipped model's declared maximum"
    return None, ""


def _most_common_options(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of the most common ``task_options`` only (two ppl configurations of a model never pool)."""
    if rows.empty or "task_options" not in rows.columns:
        return rows
    opts = rows["task_options"].astype("string").fillna("")
    return rows[opts == opts.value_counts().index[0]]


def _retrieval_scores(rows: pd.DataFrame, task: str, metric: str) -> dict[int, float] | None:
    """{length: mean of ``metric`` over the ok samples and depths} of one model's ``task`` rows, NaN at a length whose
    samples all failed (it ends an effective length); None when the model did not run the task."""
    r = rows[(rows["task"] == task) & rows["length"].notna()]
    if r.empty:
        return None
    ok = ok_values(_most_common_options(r[r["metric"] == metric]))
    scores = {int(L): float(v) for L, v in ok.groupby(ok["length"].astype("int64"))["value"].mean().items()}
    for L in r["length"].astype("int64"):
        scores.setdefault(int(L), float("nan"))
    return dict(sorted(scores.items()))


def _ppl_windows(rows: pd.DataFrame, ptask: str, L: int) -> pd.Series:
    """One model's nll per window at length ``L`` (its ok ``nll`` rows, else log of its ``ppl`` rows; the most common
    ppl options), indexed by sample: what :func:`_ppl_cost` pairs across two models."""
    r = _most_common_options(rows[(rows["task"] == ptask) & (rows["metric"] == "ppl")])
    opts = r["task_options"].astype("string").iloc[0] if len(r) and "task_options" in r.columns else None
    nll = rows[(rows["task"] == ptask) & (rows["metric"] == "nll")]
    if opts is not None:
        nll = nll[nll["task_options"].astype("string") == opts]
    nll = ok_values(nll[np.isclose(nll["length"], L)])
    if len(nll):
        return pd.Series(nll["value"].astype(float).to_numpy(), index=nll["sample"].to_numpy())
    r = ok_values(r[np.isclose(r["length"], L)])
    return pd.Series(np.log(r["value"].astype(float).to_numpy()), index=r["sample"].to_numpy())


def _ppl_cost(rows: pd.DataFrame, ref: pd.DataFrame, ptask: str, L: int, mine: tuple, theirs: tuple) -> tuple:
    """(PPL(L) of one model / PPL(L) of the shipped model, 95 % low, high, how the interval was made) at length ``L``.

    The ratio is of :func:`lctx.harness.steps.flatness.ppl_by_length`'s pooled perplexities (``mine``, ``theirs``:
    its (means, spread) of each model). Its interval, on the log ratio: paired where both models scored the same
    windows (the same samples, two or more: Student's t over the per-window nll differences,
    :func:`lctx.harness.run.intervals.t_interval`: both read the same text, so their windows' difficulty cancels),
    else from each length's spread as independent draws (:func:`lctx.harness.steps.flatness.ratio_interval`'s normal
    approximation), else none (one window each). NaNs where either model has no ppl at ``L``."""
    (mm, ms), (tm, ts) = mine, theirs
    if L not in mm or L not in tm or not tm[L] > 0:
        return math.nan, math.nan, math.nan, ""
    r = mm[L] / tm[L]
    a, b = _ppl_windows(rows, ptask, L), _ppl_windows(ref, ptask, L)
    if len(a) >= 2 and a.index.is_unique and b.index.is_unique and set(a.index) == set(b.index):
        d = a - b.reindex(a.index)
        se = float(d.std(ddof=1)) / math.sqrt(len(d))
        lo, hi = t_interval(math.log(r), se, len(d))
        if math.isfinite(lo):
            return r, math.exp(lo), math.exp(hi), "paired"
    if L in ms and L in ts:
        se = math.sqrt(ms[L][1] ** 2 + ts[L][1] ** 2)
        return r, math.exp(math.log(r) - Z * se), math.exp(math.log(r) + Z * se), "independent"
    return r, math.nan, math.nan, ""


def _seconds_per_sample(rows: pd.DataFrame, task: str) -> tuple[dict[int, float], set[int]]:
    """({length: median wall seconds per sample} of one model's ok ``task`` samples (each record's ``wall_s``, once
    per sample, not per metric row), {lengths with samples}): a length with samples but no ``wall_s`` (a run from
    before it was recorded) is in the second set only."""
    r = ok_values(rows[(rows["task"] == task) & rows["length"].notna()])
    ran = {int(x) for x in r["length"]}
    if "wall_s" not in r.columns:
        return {}, ran
    keys = [c for c in ("run", "length", "depth", "sample", "task_options") if c in r.columns]
    r = r.assign(w=pd.to_numeric(r["wall_s"], errors="coerce")).dropna(subset=["w"]).drop_duplicates(keys)
    return {int(L): float(v) for L, v in r.groupby(r["length"].astype("int64"))["w"].median().items()}, ran


def _headline_task(tasks: list[str], table: pd.DataFrame) -> str | None:
    """The retrieval task the one-line answer and the cost column are about: the flatness sweep's retrieval task (the
    runs' ``effective_length`` rows name it; by default :class:`lctx.harness.steps.flatness.FlatnessSpec`'s) when the
    table has it, else the first of ``tasks``."""
    named = []
    ef = table[(table["task"] == FLATNESS) & (table["metric"] == "effective_length")]
    for opts in ef["task_options"].dropna():
        try:
            named.append((json.loads(opts) or {}).get("retrieval"))
        except (TypeError, ValueError):
            pass
    for t in named + [FlatnessSpec().retrieval]:
        if t in tasks:
            return t
    return tasks[0] if tasks else None


def method_table(table: pd.DataFrame, members: list[str], positions: dict[str, dict], threshold: float = 0.8,
                 ratios: tuple[float, ...] = METHOD_RATIOS) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """One base model's positional-methods table: a row per method of ``members`` (labels, the
    shipped model first; :func:`method_groups`), from the report's table and :func:`model_positions`.

    Columns (display): the method; its declared maximum (tokens, × the reference length); per retrieval task of the
    members (passkey, RULER's NIAH, any task declaring ``retrieval``) the effective length: the largest length L
    with the task's headline metric (mean over depths and samples, status ok) >= ``threshold`` at every length the
    method ran up to L (:func:`lctx.harness.steps.flatness.effective_length`, RULER's rule; "≥ L" where it holds at
    the longest length the method ran, "< L" where it fails at its shortest); the ppl ratio PPL(k×)/PPL(1×) of the
    model itself at each multiple of ``ratios`` (:func:`lctx.harness.steps.flatness.ppl_by_length` and
    :func:`~lctx.harness.steps.flatness.ratio_interval`: pooled over windows, the 95 % interval where both lengths
    have two windows or more); PPL(1×) over the shipped model's (:func:`_ppl_cost`); the median seconds per sample
    of the headline task at each length (:func:`_seconds_per_sample`). 1× is :func:`_reference_length`. A cell the
    runs did not measure reads :data:`NOT_RUN` (empty in the numeric table), never 0.

    Returns (display table of strings, numeric table: one row per method with ``base``, ``method``, ``model``,
    ``<task> effective_length`` (0: below the threshold at the shortest length), ``ppl_ratio@kx`` and its
    ``ci_low``/``ci_high``, ``ppl@1x/shipped`` with its interval, ``s_per_sample@L``; info: {"reference",
    "reference_source", "tasks" {task: metric}, "headline", "titles", "effective" {label: {task: (L, longest run,
    shortest run)}}, "cost_ratio" {label: (ratio, low, high)}, "ppl_task", "cost_lengths"})."""
    titles = _member_titles(members, positions)
    T, T_src = _reference_length(table, members, positions)
    rows_of = {m: table[table["label"] == m] for m in members}
    present = set().union(*(set(r["task"].astype(str)) for r in rows_of.values()))
    rtasks = [t for t in retrieval_tasks(table) if t in present]
    head = _headline_task(rtasks, table)
    rtasks = ([head] if head else []) + [t for t in rtasks if t != head]
    tasks = {t: primary_metric(t, table) for t in rtasks}
    ptask = next((t for t in perplexity_tasks(table) if t in present), None)
    pmetric = meta_of(ptask, table).headline if ptask else None
    cost_task = head or ptask
    stats = {}
    for m in members:
        rows = rows_of[m]
        ppl = _most_common_options(rows[(rows["task"] == ptask) & (rows["metric"] == pmetric)]) if ptask else rows.iloc[:0]
        stats[m] = ppl_by_length(rows, ppl) if len(ok_values(ppl)) else ({}, {})
    shipped = next((m for m in members if positions[m]["method"] == SHIPPED), None)
    costs = {m: _seconds_per_sample(rows_of[m], cost_task) if cost_task else ({}, set()) for m in members}
    cost_lengths = sorted(set().union(*(ran for _, ran in costs.values())))
    rel = (lambda L: f" ({L / T:g}×)" if T else "")
    disp, num = [], []
    info = {"reference": T, "reference_source": T_src, "tasks": tasks, "headline": head, "titles": titles,
            "effective": {}, "cost_ratio": {}, "ppl_task": ptask, "cost_lengths": cost_lengths}
    for m in members:
        pos, rows = positions[m], rows_of[m]
        d = {"method": titles[m]}
        n = {"base": pos["base"], "method": titles[m], "model": m, "runs": ", ".join(dict.fromkeys(rows["run"].astype(str))),
             "reference_length": T, "reference": T_src, "max_positions": pos["max_positions"]}
        mx = pos["max_positions"]
        d["declared max"] = format_length(mx) + rel(mx) if mx else "none declared"
        info["effective"][m] = {}
        for t, metric in tasks.items():
            scores = _retrieval_scores(rows, t, metric)
            col = f"effective length @ {t}"
            if scores is None:
                d[col], n[f"{t} effective_length"] = NOT_RUN, math.nan
                continue
            e = effective_length(scores, threshold)
            lo, hi = min(scores), max(scores)
            info["effective"][m][t] = (e, hi, lo)
            d[col] = f"< {format_length(lo)}" if e == 0 else ("≥ " if e >= hi else "") + format_length(e) + rel(e)
            n[f"{t} effective_length"] = e
        means, spread = stats[m]
        for k in ratios:
            col, key = f"ppl ratio @ {k:g}×", f"ppl_ratio@{k:g}x"
            n[key] = n[f"{key} ci_low"] = n[f"{key} ci_high"] = math.nan
            if not means:
                d[col] = NOT_RUN
                continue
            if not T:
                d[col] = "no 1× length"
                continue
            L = int(round(k * T))
            if L not in means or T not in means:
                d[col] = NOT_RUN if L not in means else f"{NOT_RUN} at 1×"
                continue
            v = means[L] / means[T]
            ci = ratio_interval(spread, L, T)
            lo, hi = ci.get("ppl_ratio_low", math.nan), ci.get("ppl_ratio_high", math.nan)
            d[col] = f"{v:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if ci else "")
            n[key], n[f"{key} ci_low"], n[f"{key} ci_high"] = v, lo, hi
        col = "ppl @ 1× / shipped"
        n["ppl@1x"] = means.get(T, math.nan) if T and means else math.nan
        n["ppl@1x/shipped"] = n["ppl@1x/shipped ci_low"] = n["ppl@1x/shipped ci_high"] = math.nan
        if means and not T:
            d[col] = "no 1× length"
        elif not means or T not in means:
            d[col] = NOT_RUN
        elif m == shipped:
            d[col] = f"1 (reference: ppl {means[T]:.3g})"
            n["ppl@1x/shipped"] = 1.0
        elif shipped is None or T not in stats[shipped][0]:
            d[col] = "shipped not run"
        else:
            r, lo, hi, how = _ppl_cost(rows, rows_of[shipped], ptask, T, stats[m], stats[shipped])
            d[col] = f"{r:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if math.isfinite(lo) else "")
            n["ppl@1x/shipped"], n["ppl@1x/shipped ci_low"], n["ppl@1x/shipped ci_high"] = r, lo, hi
            n["ppl@1x/shipped interval"] = how
            info["cost_ratio"][m] = (r, lo, hi)
        secs, ran = costs[m]
        for L in cost_lengths:
            col = f"s/sample @ {format_length(L)}"
            v = secs.get(L, math.nan)
            d[col] = f"{v:.3g}" if math.isfinite(v) else ("not recorded" if L in ran else NOT_RUN)
            n[f"s_per_sample@{L}"] = v
        disp.append(d)
        num.append(n)
    return pd.DataFrame(disp).fillna(NOT_RUN), pd.DataFrame(num), info


def method_answer(base: str, members: list[str], positions: dict[str, dict], info: dict, threshold: float) -> str:
    """The one-line answer above a base model's table: which method keeps the headline retrieval task's score >=
    ``threshold`` farthest, and how far each other method does (shipped first), e.g. ``SmolLM2: yarn:factor=4 keeps
    passkey exact ≥ 0.8 to 32K (4×); shipped to 8K (1×); linear:factor=2 below 2K``, with the farthest method's ppl
    at 1× relative to the shipped model's when measured. From :func:`method_table`'s info."""
    task, T, titles = info["headline"], info["reference"], info["titles"]
    if task is None:
        return f"{base}: no retrieval task ran, so no effective length to compare; run passkey or a NIAH task."
    eff = {m: info["effective"][m][task] for m in members if task in info["effective"][m]}
    if not eff:
        return f"{base}: no method ran {task}."

    def reach(m):
        e, hi, lo = eff[m]
        if e == 0:
            return f"below {format_length(lo)}"
        return f"to {'≥ ' if e >= hi else ''}{format_length(e)}" + (f" ({e / T:g}×)" if T else "")

    crit = f"{task}{'' if info['tasks'][task] == task else ' ' + info['tasks'][task]} ≥ {threshold:g}"
    best_e = max(e for e, _, _ in eff.values())
    if best_e == 0:
        return f"{base}: no method keeps {crit} at its shortest length ({'; '.join(f'{titles[m]} {reach(m)}' for m in eff)})."
    best = [m for m in eff if eff[m][0] == best_e]
    cost = ""
    if len(best) == 1 and best[0] in info["cost_ratio"]:
        r, lo, hi = info["cost_ratio"][best[0]]
        cost = f" (ppl at 1×: {r:.3g}× the shipped model's" + (f", [{lo:.3g}, {hi:.3g}])" if math.isfinite(lo) else ")")
    others = [m for m in eff if m not in best]
    names = " and ".join(titles[m] for m in best)
    line = f"{base}: {names} keep{'s' if len(best) == 1 else ''} {crit} {reach(best[0])}{cost}"
    return line + "".join(f"; {titles[m]} {reach(m)}" for m in others) + "."


def method_series(table: pd.DataFrame, members: list[str], titles: dict[str, str], tasks: dict[str, str]) -> pd.DataFrame:
    """Retrieval by length per method (the data of :func:`lctx.harness.outputs.plots.methods_retrieval_figure`, and
    ``positional_retrieval.csv``): one row per (member, task, length) with the task's headline ``metric``, ``mean``
    over depths and samples (status ok), its 95 % interval ``ci_low``/``ci_high`` (:func:`_mean_ci`: Wilson for 0/1
    scores, t otherwise) and ``n``."""
    rows = []
    for m in members:
        r = table[table["label"] == m]
        for t, metric in tasks.items():
            ok = ok_values(_most_common_options(r[(r["task"] == t) & (r["metric"] == metric) & r["length"].notna()]))
            for L, g in ok.groupby(ok["length"].astype("int64")):
                mean, lo, hi, k = _mean_ci(g["value"], metric)
                rows.append({"label": m, "method": titles[m], "task": t, "metric": metric, "length": int(L),
                             "mean": mean, "ci_low": lo, "ci_high": hi, "n": k})
    return pd.DataFrame(rows, columns=["label", "method", "task", "metric", "length", "mean", "ci_low", "ci_high", "n"])


def method_note(info: dict, threshold: float) -> str:
    """The paragraph under a base model's one-line answer: what 1× is, the effective-length rule and threshold, how the
    ppl intervals and the cost column are made, and what "not run" means."""
    T, src = info["reference"], info["reference_source"]
    ref = (f"1× = {format_length(T)} tokens ({src}" + ("; pass --train-length to lctx run or lctx report for the "
           "training length" if src != "training length" else "") + ")") if T else \
        "No training length or declared maximum is recorded, so the columns at multiples of 1× are empty; pass --train-length"
    heads = ", ".join(f"{t} {m}" if m != t else t for t, m in info["tasks"].items()) or "none ran"
    cost = (f"s/sample: the median wall seconds per {info['headline'] or info['ppl_task']} sample at each length "
            "(the records' wall_s, the machine's load included)") if info["cost_lengths"] else "s/sample: no samples"
    return (f"One row per positional method, the shipped model first. {ref}. Effective length ({heads}): the largest "
            f"length with the mean score (over depths and samples) ≥ {threshold:g} at every length the method ran up to "
            f"it (RULER's rule, as the flatness rows); “≥”: it held at the longest length the method ran; “< L”: below "
            f"the threshold at its shortest. ppl ratio @ k×: PPL(k×) / PPL(1×) of the same model, with its 95 % interval "
            f"where both lengths have two ppl windows or more. ppl @ 1× / shipped: the method's perplexity at 1× over the "
            f"shipped model's (its cost at short length), 95 % interval paired over the same windows (Student's t) when "
            f"both scored the same ones. {cost}. “{NOT_RUN}”: the runs did not measure that cell (never read as 0).")


def method_blocks(table: pd.DataFrame, metas: list[dict], out: Path, pal: dict,
                  threshold: float = 0.8) -> tuple[list, list[Path], dict]:
    """The report's "Positional methods" section: for each base model with two methods or more
    (:func:`model_positions`, :func:`method_groups`): a heading, the one-line answer (:func:`method_answer`), the
    note (:func:`method_note`), the table (:func:`method_table`), retrieval vs length with a line per method
    (:func:`lctx.harness.outputs.plots.methods_retrieval_figure`) and a row of heatmaps per task, one per method
    (:func:`lctx.harness.outputs.plots.method_heatmaps`). Returns (blocks, plot paths, {"answers": [lines],
    "tables": {base: display table}, "numeric": the numeric rows of every base, "series": the retrieval series});
    no blocks when no base has two methods."""
    positions = model_positions(table, metas)
    groups = method_groups(positions)
    blocks: list = []
    paths: list[Path] = []
    extra = {"answers": [], "tables": {}, "numeric": pd.DataFrame(), "series": pd.DataFrame()}
    nums, series_all = [], []
    for base, members in groups.items():
        disp, num, info = method_table(table, members, positions, threshold)
        answer = method_answer(base, members, positions, info, threshold)
        extra["answers"].append(answer)
        extra["tables"][base] = disp
        nums.append(num)
        blocks += [("h", base), ("lead", answer), ("p", method_note(info, threshold)), ("table", disp, "methods")]
        series = method_series(table, members, info["titles"], info["tasks"])
        series_all.append(series.assign(base=base))
        fig = methods_retrieval_figure(series, out, base, pal, info["titles"], threshold,
                                       info["reference"] if info["reference_source"] == "training length" else None,
                                       {m: positions[m]["max_positions"] for m in members})
        figs = []
        if fig:
            figs.append((fig, f"{base}: each task's headline metric by length, a line per method with its 95 % "
                              "interval as a band; dotted red: the threshold; dotted in a method's colour with ▼: "
                              "its declared maximum; dashed grey: the training length.", True))
            paths.append(fig)
        for t in info["tasks"]:
            hm = method_heatmaps(table, out, t, members, info["titles"], base,
                                 train_len=info["reference"] if info["reference_source"] == "training length" else None)
            if hm:
                figs.append((hm, f"{t}: depth × length heatmaps of {meta_of(t, table).headline}, one per method.", True))
                paths.append(hm)
        if figs:
            blocks.append(("figs", figs))
    if nums:
        extra["numeric"] = pd.concat(nums, ignore_index=True)
        extra["series"] = pd.concat(series_all, ignore_index=True)
    return blocks, paths, extra


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------

def _html_table(df: pd.DataFrame, cls: str = "") -> str:
    def cell(v, tag):
        s = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
        num = bool(re.fullmatch(r"[≥<]? ?[\d.,]+[KM]?( \([\d.]+×\))?( \(n=\d+\))?|–", s))
        return f'<{tag} class="{"num" if num else "txt"}">{html.escape(s)}</{tag}>'

    cols = [str(c) for c in df.columns]
    groups = [c.split(" @ ", 1) if " @ " in c else [c] for c in cols]
    if any(len(g) == 2 for g in groups):  # "passkey exact @ 1×" -> a "passkey exact" header over "1×"
        top, sub, i = [], [], 0
        while i < len(groups):
            g = groups[i]
            if len(g) == 1:
                top.append(f'<th rowspan="2">{html.escape(g[0])}</th>')
                i += 1
                continue
            j = i
            while j < len(groups) and len(groups[j]) == 2 and groups[j][0] == g[0]:
                sub.append(f"<th>{html.escape(groups[j][1])}</th>")
                j += 1
            top.append(f'<th colspan="{j - i}">{html.escape(g[0])}</th>')
            i = j
        head = "".join(top) + "</tr><tr>" + "".join(sub)
    else:
        head = "".join(cell(c, "th") for c in df.columns)
    body = "\n".join("<tr>" + "".join(cell(v, "td") for v in row) + "</tr>" for row in df.itertuples(index=False))
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _md_table(df: pd.DataFrame) -> str:
    def esc(v):
        s = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
        return s.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(c) for c in df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(esc(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


_CSS = """
body{font-family:"DejaVu Sans",system-ui,sans-serif;color:#222;margin:0 auto;max-width:1560px;padding:8px 28px 40px;line-height:1.4}
h1{font-size:26px;margin:18px 0 4px} h2{font-size:21px;border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:34px}
h3{font-size:17px;margin:22px 0 6px} p.note{color:#555;font-size:14px;margin:4px 0 10px}
p.lead{font-size:16px;font-weight:bold;margin:6px 0 8px}
nav a{margin-right:14px;font-size:15px}
.scroll{overflow-x:auto} table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #ccc;padding:4px 8px;vertical-align:top} th{background:#eef1f5;text-align:center}
td.num{text-align:right;white-space:nowrap} td.txt{text-align:left} tbody tr:nth-child(even){background:#fafafa}
table.summary td,table.summary th{padding:3px 5px} table.summary td:first-child{font-weight:bold;min-width:120px}
table.meta td{text-align:left;max-width:260px;overflow-wrap:anywhere} table.meta td:first-child{font-weight:bold;white-space:nowrap}
figure{margin:6px 0 14px} figcaption{font-size:13px;color:#555}
img{max-width:100%;height:auto;border:1px solid #e4e4e4}
.grid{display:flex;flex-wrap:wrap;gap:10px 14px} .grid figure{flex:0 1 calc(50% - 8px);margin:0} .grid figure.wide{flex-basis:100%}
"""


def build_report(run_dirs: list[str | Path], out_dir: str | Path, at: str | None = None, title: str | None = None,
                 max_ratio: float = 1.1, threshold: float = 0.8, train_lengths: dict | None = None) -> dict:
    """Write the report of ``run_dirs`` into ``out_dir`` (see the module docstring).

    at: summary lengths (:func:`parse_at`; None: :func:`default_at`, the tested lengths when no model has a
    training length); max_ratio/threshold: the criteria drawn on the plots (the
    flatness numbers themselves come from each run's flatness rows, or the defaults when it has none).
    train_lengths: for models whose runs record none (:func:`parse_train_lengths`).
    Returns {"html", "markdown", "summary", "failures": paths, "plots": [paths], "table": the merged table,
    "summary_table": the summary as shown, "notes": lines below it (:func:`train_length_notes`), "positions": the path
    of ``positional_methods.csv`` (None when no base model has two positional methods; ``positional_retrieval.csv``
    beside it), "position_tables": {base model: its positional-methods table as shown}, "answers": the one-line
    answer per base model (:func:`method_blocks`)}.

    Raises:
        LctxError: a run directory :func:`load_runs` refuses, a bad ``at``, an unwritable ``out_dir``, or one that
            is a checkpoint folder or an ``lctx run`` directory (:func:`lctx.harness.args.check_results_out`).
    """
    from lctx.harness.args import check_results_out  # lazy: torch-free, light; the CLI checked it already

    at_list = parse_at(at) if at is not None else None  # a bad --at is refused before any run is read
    out = Path(out_dir)
    check_results_out(out, "report", run_dir_ok=False)  # its summary.csv would replace the run's own
    table, metas = load_runs(run_dirs, train_lengths)
    try:
        (out / "plots").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LctxError(f"cannot write to --out {str(out)!r} ({e.strerror or e}); pass a writable directory") from None
    labels = list(dict.fromkeys(table["label"]))
    pal = palette(labels)
    at_note = None
    if at_list is None:
        at_list, at_note = default_at(table)

    # sections: (id, heading, blocks); a block: ("p", text) | ("table", df, cls) | ("figs", [(path, caption, wide)])
    # | ("h", a sub-heading) | ("lead", a line in bold: a base model's answer in the positional methods' section)
    disp, num = summary_table(table, at_list)
    notes = _summary_notes(table, metas, at_note)
    sections: list[tuple[str, str, list]] = [
        ("summary", "Summary", [("table", disp, "summary"), ("p", _criteria_note(table))] + [("p", n) for n in notes])]
    plots: list[Path] = []
    cblocks = category_blocks(table)
    if cblocks:
        sections.append(("categories", "By category", cblocks))
    mblocks, mplots, methods = method_blocks(table, metas, out, pal, threshold)  # which method, how far
    if mblocks:
        sections.append(("positions", "Positional methods", mblocks))
        plots += mplots
    for secs, paths in (_ruler_sections(table, out), _perplexity_sections(table, out, pal, max_ratio),
                        _task_sections(table, out, pal, threshold), _bench_sections(table, out, pal)):  # drawn in order
        sections += secs
        plots += paths
    fails = failures_table(table)
    unav = unavailable_table(table)
    if len(unav):
        sections.append(("unavailable", f"Unavailable metrics ({len(unav)})",
                         [("p", "Metrics the models could not give (e.g. a server without prompt log-probabilities "
                                "for teacher-forced scores): no value, never 0, and no failure."),
                          ("table", unav, "")]))
    sections.append(_failures_section(fails))
    sections.append(_metadata_section(metas, table, out))

    title = title or "lctx extrapolation report"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sub = f"{len(metas)} run{'s' if len(metas) != 1 else ''}, {len(labels)} model{'s' if len(labels) != 1 else ''}; generated {stamp}"
    html_path, md_path = out / "report.html", out / "report.md"
    # every file once more through lctx.outside (redacted, control characters escaped)
    html_path.write_text(safe(_html_page(sections, title, sub)))
    md_path.write_text(safe(_markdown_page(sections, title, sub, out)))
    clean_frame(num, escape=True).to_csv(out / "summary.csv", index=False)
    clean_frame(fails, escape=True).to_csv(out / "failures.csv", index=False)
    positions = None
    if len(methods["numeric"]):
        positions = out / "positional_methods.csv"
        clean_frame(methods["numeric"], escape=True).to_csv(positions, index=False)
        clean_frame(methods["series"], escape=True).to_csv(out / "positional_retrieval.csv", index=False)
    return {"html": html_path, "markdown": md_path, "summary": out / "summary.csv", "failures": out / "failures.csv",
            "plots": plots, "table": table, "summary_table": disp, "notes": notes, "positions": positions,
            "position_tables": methods["tables"], "answers": methods["answers"]}


# ---------------------------------------------------------------------------------------------------------------
# the sections of build_report, in page order; a section is (id, heading, blocks)
# ---------------------------------------------------------------------------------------------------------------

def _criteria_note(table: pd.DataFrame) -> str:
    """The paragraph under the summary that says what flat-until, the effective length and the retrieval columns
    mean, with the criteria the runs' flatness rows record ("no flatness rows" when none) and the headline metric
    of each task that has a column (``primary_metric``; passkey and NIAH when the runs have none)."""
    fl = table[table["task"] == FLATNESS]
    crits = {m: ", ".join(sorted({c for c in (_criterion(g.iloc[[i]]) for i in range(len(g))) if c}))
             or "no flatness rows in these runs"
             for m, g in ((m, fl[fl["metric"] == m]) for m in ("flat_until", "effective_length"))}
    tasks = retrieval_tasks(table) + other_tasks(table)
    heads = ", ".join(t if (m := primary_metric(t, table)) == t else f"{t} {m}" for t in tasks[:6]) + (", ..." if len(tasks) > 6 else "") \
        if tasks else "passkey exact match, NIAH string_match_all"
    return (f"Flat until ({crits['flat_until']}): the largest length L ≥ the training length with PPL(L)/PPL(train length) within the "
            f"criterion at every tested length up to L (“≥” = flat at every length tested). Effective length: the "
            f"largest length with the retrieval score ({crits['effective_length']}) at or above the threshold at every tested length up to it "
            f"(RULER's effective length; “< L” = below it already at the shortest length L). Retrieval columns: the "
            f"headline metric ({heads}) averaged over depths and samples, with its "
            f"95 % interval in brackets (Wilson when every value is 0 or 1, Student's t otherwise) and n, the samples.")


def _summary_notes(table: pd.DataFrame, metas: list[dict], at_note: str | None) -> list[str]:
    """The lines below the summary's criteria: ``at_note`` (:func:`default_at`), one per model without a training
    length (:func:`train_length_notes`), and what "exact ALiBi at ..." in a model's name means when a row records
    that kernel."""
    notes = ([at_note] if at_note else []) + train_length_notes(table, metas) + unavailable_notes(table)
    if "attn_kernel" in table.columns and table["attn_kernel"].astype("string").str.contains("lsh-exact-alibi").any():
        notes.append("“exact ALiBi at …” in a model's name: alibi_lsh rows where the CPU fast path ran exact ALiBi, "
                     "not the LSH approximation (attn_kernel lsh-exact-alibi; lsh_exact_dispatch, default true, "
                     "does so where exact ALiBi is estimated cheaper, i.e. short inputs); "
                     "lsh_exact_dispatch=false in the checkpoint's variant_options (`lctx train --option`), or "
                     "--attn-impl sdpa, runs LSH at every length.")
    return notes


def _ruler_sections(table: pd.DataFrame, out: Path) -> tuple[list, list[Path]]:
    """The RULER section (:func:`ruler_blocks`), when the table has ``ruler`` rows. Returns (sections, plot paths)."""
    rblocks, rplots = ruler_blocks(table, out)
    return ([(RULER, "RULER", rblocks)], rplots) if rblocks else ([], [])


def _perplexity_sections(table: pd.DataFrame, out: Path, pal, max_ratio: float) -> tuple[list, list[Path]]:
    """The perplexity section (:func:`lctx.harness.outputs.plots.perplexity_figure`, the flatness criterion
    ``max_ratio`` drawn), when a task of the table draws one. Returns (sections, plot paths)."""
    p = perplexity_figure(table, out, pal, max_ratio, FLATNESS)
    notes = [("p", n) for task in perplexity_tasks(table) for n in unavailable_notes(table, task)]
    if not p:
        return ([("perplexity", "Perplexity and length flatness", notes)], []) if notes else ([], [])
    figs = [(p, "Left: sliding-window perplexity by context length. Right: PPL(L)/PPL(train length) by "
                "L / train length; the dotted red line is the flatness criterion.", True)]
    return [("perplexity", "Perplexity and length flatness", [("figs", figs)] + notes)], [p]


def _task_sections(table: pd.DataFrame, out: Path, pal, threshold: float) -> tuple[list, list[Path]]:
    """One section per retrieval task, then per other task with a length axis (:func:`retrieval_tasks`,
    :func:`other_tasks`) that has a figure: its accuracy by length (``threshold`` drawn), a teacher-forcing note,
    its depth x length heatmaps (:func:`heatmaps`, all drawn first). Returns (sections, plot paths)."""
    sections, plots = [], []
    maps = heatmaps(table, out)
    for task in retrieval_tasks(table) + other_tasks(table):
        retrieval = meta_of(task, table).retrieval
        blocks = []
        a = accuracy_figure(table, task, out, pal, threshold)
        if a:
            blocks.append(("figs", [(a, f"{task}: mean {primary_metric(task, table)} by context length, one line per "
                                        "model (markers shrink "
                                        "from the first model to the last, so lines that coincide stay visible).", True)]))
            plots.append(a)
        tf_note = teacher_forced_note(table, task)
        if tf_note:
            blocks.append(("p", tf_note))
        blocks += [("p", n) for n in unavailable_notes(table, task)]
        hm = maps.get(task, [])
        if hm:
            wide = not narrow_heatmap(task)
            blocks.append(("p", "Depth × length heatmaps (cells: mean over samples; grey “err”: every sample of the "
                                "cell failed; “n/a”: the model could not give the metric; dashed line: training "
                                "length)."))
            blocks.append(("figs", [(h, "", wide) for h in hm]))
            plots += hm
        if blocks:
            sections.append((f"task-{safe_filename(task)}", f"{'Retrieval' if retrieval else 'Task'}: {task}", blocks))
    return sections, plots


def _bench_sections(table: pd.DataFrame, out: Path, pal) -> tuple[list, list[Path]]:
    """The knowledge benchmarks' section (MMLU / ARC, :func:`bench_tasks`): their accuracy bars with chance
    (:data:`CHANCE`) and a table of mean, stderr and questions per model, task and metric, when the table has them.
    Returns (sections, plot paths)."""
    b = bench_figure(table, out, pal, bench_tasks(table), "mmlu_arc.png", "MMLU / ARC accuracy", CHANCE)
    if not b:
        return [], []
    bt = ok_values(table[table["task"].map(is_bench_task) & table["metric"].isin(["acc", "acc_norm"])])
    agg = bt.groupby(["label", "task", "metric"])["value"].agg(["mean", "std", "count"]).reset_index()
    agg["stderr"] = agg["std"] / np.sqrt(agg["count"])
    agg = agg.rename(columns={"label": "model", "count": "questions"})
    agg["mean"], agg["stderr"] = agg["mean"].map("{:.3f}".format), agg["stderr"].map(lambda v: f"{v:.3f}" if np.isfinite(v) else "–")
    return [("bench", "Knowledge benchmarks: MMLU / ARC",
             [("figs", [(b, "Accuracy per task and metric (acc: raw log-likelihood; acc_norm: length-"
                            "normalised); dashed: chance with 4 choices.", True)]),
              ("table", agg[["model", "task", "metric", "mean", "stderr", "questions"]], "")])], [b]


def _failures_section(fails: pd.DataFrame) -> tuple[str, str, list]:
    """The failures section: the first 300 failed cells of ``fails`` (:func:`failures_table`), or "No cell failed."."""
    n_fail = int(fails["samples failed"].sum()) if len(fails) else 0
    blocks = [("table", fails.head(300), "")] if len(fails) else [("p", "No cell failed.")]
    if len(fails) > 300:
        blocks.append(("p", f"First 300 of {len(fails)} failed cells shown; all are in failures.csv."))
    return ("failures", f"Failures ({len(fails)} cells, {n_fail} samples)", blocks)


def _metadata_section(metas: list[dict], table: pd.DataFrame, page_dir=None) -> tuple[str, str, list]:
    """The run metadata section (:func:`metadata_table`) as one field-by-run table per 5 runs, so a page of many runs
    never scrolls sideways."""
    meta = metadata_table(metas, table, page_dir)
    meta_t = meta.set_index("run").T.reset_index().rename(columns={"index": "field"})
    per = 5  # runs per table, so a page of many runs never scrolls sideways
    return ("metadata", "Run metadata", [("table", meta_t[["field"] + list(meta_t.columns[1 + i:1 + i + per])], "meta")
                                         for i in range(0, len(meta_t.columns) - 1, per)])


def _html_page(sections: list, title: str, sub: str) -> str:
    """The report as one self-contained HTML page: title, subtitle ``sub``, a navigation bar, then the sections (the
    PNGs embedded as base64 data URIs)."""
    parts = [f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1><p class='note'>{html.escape(sub)}</p>",
             "<nav>" + "".join(f"<a href='#{sid}'>{html.escape(h)}</a>" for sid, h, _ in sections) + "</nav>"]
    for sid, heading, blocks in sections:
        parts.append(f"<h2 id='{sid}'>{html.escape(heading)}</h2>")
        for blk in blocks:
            if blk[0] == "p":
                parts.append(f"<p class='note'>{html.escape(blk[1])}</p>")
            elif blk[0] == "h":
                parts.append(f"<h3>{html.escape(blk[1])}</h3>")
            elif blk[0] == "lead":
                parts.append(f"<p class='lead'>{html.escape(blk[1])}</p>")
            elif blk[0] == "table":
                parts.append(_html_table(blk[1], blk[2]))
            else:
                parts.append("<div class='grid'>")
                for path, cap, wide in blk[1]:
                    data = base64.b64encode(Path(path).read_bytes()).decode()
                    parts.append(f"<figure class='{'wide' if wide else ''}'><img alt='{html.escape(path.stem)}' "
                                 f"src='data:image/png;base64,{data}'>"
                                 + (f"<figcaption>{html.escape(cap)}</figcaption>" if cap else "") + "</figure>")
                parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _markdown_page(sections: list, title: str, sub: str, out: Path) -> str:
    """The report in Markdown: title, subtitle ``sub``, then the sections, each figure linked by its path relative to
    ``out`` (``plots/...``)."""
    md = [f"# {title}", "", sub, ""]
    for _, heading, blocks in sections:
        md += [f"## {heading}", ""]
        for blk in blocks:
            if blk[0] == "p":
                md += [blk[1], ""]
            elif blk[0] == "h":
                md += [f"### {blk[1]}", ""]
            elif blk[0] == "lead":
                md += [f"**{blk[1]}**", ""]
            elif blk[0] == "table":
                md += [_md_table(blk[1]), ""]
            else:
                for path, cap, _ in blk[1]:
                    rel = Path(path).relative_to(out).as_posix()
                    md += [f"![{path.stem}]({rel})", ""] + ([f"*{cap}*", ""] if cap else [])
    return "\n".join(md) + "\n"
