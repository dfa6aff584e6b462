"""Length-flatness sweeps: perplexity ratio, flat-until and effective length, derived from a run's records.

A flatness sweep (``lctx run --task flatness --relative 0.5,1,2,4,8``) runs ``ppl`` and a retrieval task
(``passkey`` by default; any registered task with ``--task-option flatness.retrieval=niah_single_1``) at
lengths relative to each model's training length ``T`` (the checkpoint config's ``train_length``, or
``--train-length`` for outside checkpoints). From the sweep's records it derives, per (model, variant):

* ``ppl_ratio`` at each length L: PPL(L) / PPL(T) (seed 004 reports RoPE 16.2x at 16T and ALiBi 0.96x at
  128T; seed 002 calls a model "flat" to 3.5T);
* ``flat_until``: the largest length L >= T (tokens) such that every tested length in [T, L] has
  ``ppl_ratio <= max_ratio`` (default 1.1). Lengths below T do not count (less context, higher PPL is
  expected there). A length whose ppl failed ends the flat range. When it equals the largest tested
  length the model is flat as far as the sweep looked (a lower bound);
* ``effective_length``: the largest length L (tokens) such that every tested length <= L has a mean
  retrieval score (over depths and samples, status ok) ``>= threshold`` (default 0.8), the "effective
  length" of RULER (Hsieh et al. 2024, section 4: the longest length whose score stays above a
  threshold). 0 when the shortest tested length already falls below it.

These are *derived* rows of the tidy table (``task == "flatness"``, metrics ``ppl_ratio``,
``flat_until``, ``effective_length``; ``length`` is L for ``ppl_ratio`` and empty for the other two;
``task_options`` records the criterion). They are never written to ``records.jsonl``: :func:`write_tables_with_flatness`
recomputes them from the records every time the tables are written, so a killed sweep resumes as any
run does and its derived numbers follow the finished samples.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas on first use: `lctx list tasks` imports this module for its
    import pandas as pd  # registered name only (tests/test_startup.py)

from lctx.harness.steps.derived import (DerivedStep, base_record, json_cell, ok_rows, register_step, replace_name,
                                       take_options, write_run_tables)
from lctx.errors import LctxError, split_list
from lctx.tasks import TaskInfo, get_task, register_group

from lctx.harness.run.rundir import atomic_write_json, declared_tasks, read_json

TASK = "flatness"
METRICS = ("ppl_ratio", "flat_until", "effective_length", "ppl_ratio_low", "ppl_ratio_high")
DESCRIPTION = ("ppl + a retrieval task at lengths relative to the training length (--relative), "
               "derived per model")
DEFAULT_RELATIVE = (0.5, 1.0, 2.0, 4.0, 8.0)
register_group(TaskInfo(TASK, DESCRIPTION, METRICS, "as ppl and the retrieval task"))
def default_retrieval_metric(task: str, declared: dict | None = None) -> str:
    """The metric thresholded for ``effective_length`` when none is named: the task's declared headline
    metric (:meth:`lctx.tasks.Task.headline`: passkey's exact match, RULER's string_match_all for NIAH), as its
    run directory recorded it (``declared``: run.json's ``task_meta[task]``, so a ``--task-file`` task needs no
    task file afterwards), else as its registered class declares it.

    Raises:
        LctxError: ``task`` is neither recorded in ``declared`` nor a registered task.
    """
    if isinstance(declared, dict) and declared.get("headline_metric"):
        return str(declared["headline_metric"])
    return get_task(task).headline()


@dataclass(frozen=True)
class FlatnessSpec:
    """The criteria of a flatness sweep.

    retrieval: retrieval task name (default ``passkey``), or ``"none"`` for a ppl-only sweep.
    retrieval_metric: the metric of ``retrieval`` thresholded (default :func:`default_retrieval_metric`).
    max_ratio: a length is flat when PPL(L)/PPL(T) <= max_ratio (default 1.1; dimensionless).
    threshold: retrieval works at L when its mean score >= threshold (default 0.8, RULER's idea of 80%).
    """

    retrieval: str = "passkey"
    retrieval_metric: str | None = None
    max_ratio: float = 1.1
    threshold: float = 0.8

    @classmethod
    def from_options(cls, opts: dict) -> FlatnessSpec:
        """Build from ``--task-option flatness.KEY=VALUE`` options and check them.

        Raises:
            LctxError: an unknown key, an unknown retrieval task or metric, max_ratio < 1, or a
                non-finite threshold.
        """
        valid = [f for f in cls.__dataclass_fields__]
        for k in opts:
            if k not in valid:
                raise LctxError(f"--task-option flatness.{k}: flatness has no option {k!r}; valid options: "
                                f"{', '.join(valid)}")
        try:
            spec = cls(retrieval=str(opts.get("retrieval", "passkey")),
                       retrieval_metric=None if opts.get("retrieval_metric") is None else str(opts["retrieval_metric"]),
                       max_ratio=float(opts.get("max_ratio", 1.1)), threshold=float(opts.get("threshold", 0.8)))
        except (TypeError, ValueError) as e:
            raise LctxError(f"bad flatness option ({e}); write e.g. --task-option flatness.max_ratio=1.1") from None
        if not (math.isfinite(spec.max_ratio) and spec.max_ratio >= 1.0):
            raise LctxError(f"flatness.max_ratio={spec.max_ratio} must be a number >= 1 (PPL(L)/PPL(T) of the "
                            "training length itself is 1); write e.g. --task-option flatness.max_ratio=1.1")
        if not math.isfinite(spec.threshold):
            raise LctxError("flatness.threshold must be a finite number; write e.g. --task-option flatness.threshold=0.8")
        if spec.retrieval == "none":
            return spec
        if spec.retrieval == "ppl":
            raise LctxError("flatness.retrieval=ppl: ppl already runs in a flatness sweep; name a retrieval task "
                            "(passkey, niah_single_1, ...) or none")

        metrics = get_task(spec.retrieval).metrics  # raises for an unknown task
        metric = spec.retrieval_metric or default_retrieval_metric(spec.retrieval)
        if metric not in metrics:
            raise LctxError(f"flatness.retrieval_metric={metric!r}: task {spec.retrieval!r} reports "
                            f"{', '.join(metrics)}; pick one of them")
        return cls(spec.retrieval, metric, spec.max_ratio, spec.threshold)

    def resolved(self, declared: dict | None = None) -> FlatnessSpec:
        """This spec with its retrieval metric named: the given one, else the retrieval task's headline as a run
        directory recorded it (``declared``: {task: metadata}, :func:`lctx.harness.run.rundir.declared_tasks`), else
        as its registered class declares it (:func:`default_retrieval_metric`).

        Raises:
            LctxError: no metric is named and the task is neither recorded nor registered.
        """
        if self.retrieval == "none" or self.retrieval_metric:
            return self
        metric = default_retrieval_metric(self.retrieval, (declared or {}).get(self.retrieval))
        return replace(self, retrieval_metric=metric)

    @property
    def metric(self) -> str | None:
        """The retrieval metric thresholded (None for ``retrieval="none"``)."""
        if self.retrieval == "none":
            return None
        return self.retrieval_metric or default_retrieval_metric(self.retrieval)


# ----------------------------------------------------------------------------------------------
# planning a sweep: task names, relative lengths, training lengths
# ----------------------------------------------------------------------------------------------

def split_flatness(task_names: list[str], task_options: list[str]) -> tuple[list[str], list[str], FlatnessSpec | None]:
    """Expand ``flatness`` in ``--tasks`` into the tasks it runs and take its ``--task-option`` items.

    Input: the task names of ``--tasks`` and the raw ``--task-option`` items. Output: (task names with
    ``flatness`` replaced by ``ppl`` and the retrieval task, each once, order kept; the items not addressed
    to ``flatness``; the :class:`FlatnessSpec`, or None when ``flatness`` is not among the tasks, in which
    case everything is returned unchanged).

    Raises:
        LctxError: a ``flatness.*`` item that is not ``flatness.KEY=VALUE``, or a bad option (see
            :meth:`FlatnessSpec.from_options`).
    """
    if TASK not in task_names:
        return list(task_names), list(task_options), None
    opts, rest = take_options(TASK, task_options, "flatness.retrieval=niah_single_1")
    spec = FlatnessSpec.from_options(opts)
    return replace_name(task_names, TASK, ["ppl"] + ([spec.retrieval] if spec.retrieval != "none" else [])), rest, spec


def parse_relative(text: str) -> list[float]:
    """Parse ``--relative`` "0.5,1,2,4,8" (multiples of the training length; an optional trailing ``x``)
    into sorted unique positive floats; 1 is added when absent (the ratio needs PPL at the training length).

    Raises:
        LctxError: an entry is not a positive number, or the list is empty.
    """
    out = set()
    for part in split_list(text, "--relative", "--relative 0.5,1,2,4,8"):
        try:
            r = float(re.sub(r"[xX]$", "", part))
        except ValueError:
            r = -1.0
        if not (math.isfinite(r) and r > 0):
            raise LctxError(f"--relative {part!r} is not a positive multiple of the training length; "
                            "write e.g. --relative 0.5,1,2,4,8")
        out.add(r)
    if not out:
        raise LctxError("--relative is empty; write e.g. --relative 0.5,1,2,4,8")
    return sorted(out | {1.0})


def relative_lengths(train_length: int, relative: list[float]) -> list[int]:
    """Token lengths round(r * train_length) for each factor r (at least 2 tokens), sorted, unique."""
    return sorted({max(2, int(round(r * train_length))) for r in relative})


def resolve_train_lengths(lms: list, train_length: int | None) -> None:
    """Give every model a training length: ``train_length`` (``--train-length``) when given, which then
    overrides the checkpoint's, else the one its config records. Sets ``lm.train_length`` in place, so the
    records' ``train_length`` column and the plots' training-length marks carry it.

    Raises:
        LctxError: a non-positive ``train_length``, or a model with no training length and none given.
    """
    if train_length is not None and train_length < 1:
        raise LctxError(f"--train-length {train_length} is not a positive number of tokens; pass e.g. --train-length 4096")
    for lm in lms:
        if train_length is not None:
            lm.train_length = int(train_length)
        elif not lm.train_length:
            raise LctxError(f"model {lm.name!r} records no training length (train_length in config.json); "
                            "pass --train-length N (tokens) for lengths relative to it")


def groups_by_train_length(lms: list, relative: list[float]) -> list[tuple[list, list[int]]]:
    """Models that share a training length, with the token lengths of ``relative`` for it:
    [(models, lengths)], in order of first appearance (each group runs as one sweep)."""
    groups: dict[int, list] = {}
    for lm in lms:
        groups.setdefault(int(lm.train_length), []).append(lm)
    return [(g, relative_lengths(T, relative)) for T, g in groups.items()]


# ----------------------------------------------------------------------------------------------
# deriving the numbers
# ----------------------------------------------------------------------------------------------

def flat_until(ratios: dict[int, float], train_length: int, max_ratio: float) -> int | None:
    """The largest length L >= T with ``ratios[L'] <= max_ratio`` for every tested L' in [T, L].

    ratios: {length (tokens): PPL(L)/PPL(T)}, NaN for a failed length. Returns None when T was not
    tested (or failed). A failed length ends the flat range.
    """
    if not math.isfinite(ratios.get(train_length, float("nan"))):
        return None
    best = train_length
    for L in sorted(x for x in ratios if x >= train_length):
        r = ratios[L]
        if not (math.isfinite(r) and r <= max_ratio):
            break
        best = L
    return int(best)


def effective_length(scores: dict[int, float], threshold: float) -> int:
    """The largest length L with ``scores[L'] >= threshold`` for every tested L' <= L (RULER's effective
    length), 0 when the shortest tested length is already below it. scores: {length (tokens): mean
    score}, NaN for a failed length (which ends the range)."""
    best = 0
    for L in sorted(scores):
        s = scores[L]
        if not (math.isfinite(s) and s >= threshold):
            break
        best = L
    return int(best)


def _train_length(rows: pd.DataFrame) -> int | None:
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    tl = pd.to_numeric(rows["train_length"], errors="coerce").dropna()
    tl = tl[tl > 0]
    return int(tl.mode().iloc[0]) if len(tl) else None


def _most_common_options(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of the most common ``task_options`` only (two ppl configurations of a model never mix)."""
    if rows.empty or "task_options" not in rows.columns:
        return rows
    opts = rows["task_options"].astype("string").fillna("")
    return rows[opts == opts.value_counts().index[0]]


def ppl_by_length(rows: pd.DataFrame, ppl: pd.DataFrame) -> tuple[dict, dict]:
    """({length: PPL}, {length: (mean nll, its standard error, n windows)}) of one model's ok ppl records:
    PPL = exp(token-weighted mean nll) over the length's records (``nll`` and ``n_tokens`` rows of the same
    records), so several windows per length (ppl's ``windows`` option) pool as one sweep would, not as a mean of
    per-window perplexities; a record without its nll row counts by its ppl (exp of the mean of log ppl). The
    second map has an entry where a length has two windows or more (the nll's standard error over windows)."""
    import pandas as pd  # lazy: loads pandas

    ok = ok_rows(ppl)
    key = [c for c in ("run_id", "length", "depth", "sample", "fingerprint") if c in ok.columns]
    opts = ppl["task_options"].astype("string").iloc[0] if "task_options" in ppl.columns and len(ppl) else None

    def metric_rows(name):
        r = rows[(rows["task"] == "ppl") & (rows["metric"] == name)]
        if opts is not None and "task_options" in r.columns:
            r = r[r["task_options"].astype("string") == opts]
        r = ok_rows(r)
        return r.set_index(key)["value"].astype(float) if len(r) else pd.Series(dtype=float)

    logp = ok.set_index(key)["value"].astype(float).map(math.log)
    nll, ntok = metric_rows("nll"), metric_rows("n_tokens")
    nll = nll.reindex(logp.index).fillna(logp)
    w = ntok.reindex(logp.index).fillna(1.0)
    L = pd.Series([int(i[key.index("length")]) for i in logp.index], index=logp.index)
    means, spread = {}, {}
    for length in sorted(set(L)):
        sel = L == length
        m = float((nll[sel] * w[sel]).sum() / w[sel].sum())
        means[length] = math.exp(m)
        n = int(sel.sum())
        if n >= 2:
            spread[length] = (m, float(nll[sel].std(ddof=1)) / math.sqrt(n), n)
    return means, spread


def ratio_interval(spread: dict, L: int, T: int | None) -> dict:
    """{"ppl_ratio_low", "ppl_ratio_high"}: the 95 % interval of PPL(L) / PPL(T) where length L (and T, if it
    has them) was scored on several windows (:func:`ppl_by_length`'s spread): log ratio = nll(L) - nll(T), its
    standard error sqrt(se_L^2 + se_T^2) (the two lengths' windows drawn independently), exp(log ratio -+ 1.96 se)
    (the normal approximation); [1, 1] at L = T (the same windows). {} where T is unknown or either length has
    fewer than two windows (a length scored once has no error to combine)."""
    if T is None or L not in spread or T not in spread:
        return {}
    if L == T:
        return {"ppl_ratio_low": 1.0, "ppl_ratio_high": 1.0}
    from lctx.harness.run.intervals import Z  # light

    mL, seL, _ = spread[L]
    mT, seT, _ = spread[T]
    se = math.sqrt(seL ** 2 + seT ** 2)
    d = mL - mT
    return {"ppl_ratio_low": math.exp(d - Z * se), "ppl_ratio_high": math.exp(d + Z * se)}


def _unavailable_lengths(ppl: pd.DataFrame, means: dict) -> dict:
    """{length: reason} of the ppl rows the model could not give (status ``unavailable``) at lengths with no value."""
    if "status" not in ppl.columns:
        return {}
    na = ppl[ppl["status"].astype("string").fillna("") == "unavailable"]
    out: dict = {}
    for L, why in zip(na["length"], na["reason"] if "reason" in na.columns else [""] * len(na)):
        if L == L and int(L) not in means:
            out.setdefault(int(L), str(why) if isinstance(why, str) and why else "unavailable")
    return out


def derive_records(table: pd.DataFrame, spec: FlatnessSpec | None = None) -> list[dict]:
    """The derived flatness records of a results table (rows of other tasks, as :func:`lctx.harness.run.tables.to_table`
    makes them; existing ``flatness`` rows are ignored).

    Per (model, variant) with ppl rows: one ``ppl_ratio`` record per tested length (status error where PPL(L)
    or PPL(T) is missing) and one ``flat_until`` record; per (model, variant) with rows of
    ``spec.retrieval``: one ``effective_length`` record. Each is a dict with the runner's record fields
    (``metrics`` = {metric: value}, ``task`` = ``"flatness"``, ``sample`` 0, ``depth`` None, the criterion in
    ``task_options``), ready for :func:`lctx.harness.run.tables.to_table`. Models with no training length get
    error records saying so. A ratio whose ppl the model could not give (rows with status ``unavailable``, no value
    at that length) is unavailable too, with the reason (``unavailable`` {metric: reason}; no error, never 0).
    ``spec`` None: the defaults of :class:`FlatnessSpec`.
    """
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    spec = spec or FlatnessSpec()
    if table is None or table.empty:
        return []
    table = table[table["task"].astype("string") != TASK]
    out: list[dict] = []
    keys = ["model", "variant"]
    tab = table.assign(variant=table["variant"].astype("string").fillna(""))
    for (model, variant), rows in tab.groupby(keys, sort=False, dropna=False):
        T = _train_length(rows)
        ppl = _most_common_options(rows[(rows["task"] == "ppl") & (rows["metric"] == "ppl")])
        base = base_record(model, variant, ppl if len(ppl) else rows, TASK, T)
        no_t = ("no training length recorded for this model; rerun with --train-length N")
        if len(ppl):
            crit = {"criterion": f"ppl_ratio <= {spec.max_ratio:g}", "max_ratio": spec.max_ratio,
                    "ppl_options": json_cell(ppl["task_options"].iloc[0])}
            means, spread = ppl_by_length(rows, ppl)
            every = rows[rows["task"] == "ppl"]  # a failed sample may carry no metric name: all its lengths
            lengths = sorted({int(x) for x in pd.to_numeric(every["length"], errors="coerce").dropna()})
            ref = means.get(T, float("nan")) if T else float("nan")
            why = no_t if not T else (f"no successful ppl at the training length {T} tokens; include relative 1 "
                                      f"(length {T}) in the sweep")
            unav = _unavailable_lengths(ppl, means)  # {length: reason}: ppl the model could not give
            ratios = {}
            for L in lengths:
                r = means.get(L, float("nan")) / ref if math.isfinite(ref) and ref > 0 else float("nan")
                ratios[L] = r
                rec = dict(base, length=L, task_options={"criterion": "ppl(L) / ppl(train_length)",
                                                         "ppl_options": crit["ppl_options"]},
                           metrics={"ppl_ratio": r, **ratio_interval(spread, L, T)})
                na = unav.get(T) or unav.get(L)
                if not math.isfinite(r) and na:
                    rec.update(metrics={}, unavailable={"ppl_ratio": f"ppl unavailable: {na}"})
                elif not math.isfinite(r):
                    rec.update(status="error", error=why if not math.isfinite(ref)
                               else f"no successful ppl at length {L}")
                out.append(rec)
            fu = flat_until(ratios, T, spec.max_ratio) if T else None
            rec = dict(base, length=None, task_options=crit, metrics={"flat_until": float(fu) if fu else float("nan")})
            if fu is None and unav.get(T):
                rec.update(metrics={}, unavailable={"flat_until": f"ppl unavailable: {unav[T]}"})
            elif fu is None:
                rec.update(status="error", error=why)
            out.append(rec)
        metric = spec.metric
        ret = rows[(rows["task"] == spec.retrieval) & (rows["metric"] == metric)] if metric else rows.iloc[:0]
        ret = _most_common_options(ret)
        if len(ret):
            ok = ok_rows(ret)
            scores = ok.groupby(ok["length"].astype("int64"))["value"].mean().to_dict()
            every = rows[rows["task"] == spec.retrieval]
            for L in {int(x) for x in pd.to_numeric(every["length"], errors="coerce").dropna()}:
                scores.setdefault(L, float("nan"))
            crit = {"criterion": f"{spec.retrieval}.{metric} >= {spec.threshold:g}", "retrieval": spec.retrieval,
                    "metric": metric, "threshold": spec.threshold, "retrieval_options": json_cell(ret["task_options"].iloc[0])}
            out.append(dict(base, length=None, task_options=crit,
                            metrics={"effective_length": effective_length(scores, spec.threshold)}))
    return out


def derive_table(table: pd.DataFrame, spec: FlatnessSpec | None = None) -> pd.DataFrame:
    """:func:`derive_records` as tidy rows (the columns of :data:`lctx.harness.run.tables.COLUMNS`)."""
    from lctx.harness.run.tables import to_table  # lazy: loads pandas

    return to_table(derive_records(table, spec), {TASK: METRICS})


def step(spec: FlatnessSpec | None = None) -> DerivedStep:
    """The flatness rows as a derived post-processing step (:class:`lctx.harness.steps.derived.DerivedStep`): rows
    from :func:`derive_records`, the criteria in ``run.json`` (key ``flatness``), the figure
    ``ppl_ratio_vs_relative`` (``plots/ppl_ratio_vs_relative.png``, drawn by :mod:`lctx.harness.outputs.plots` with the
    spec's ``max_ratio``), :func:`format_flatness` as its text, lengths relative to the training length
    (:data:`DEFAULT_RELATIVE` unless ``--lengths`` or ``--relative`` is given)."""
    return DerivedStep(TASK, METRICS, spec or FlatnessSpec(), derive_records,
                       lambda sp: asdict(sp) | {"retrieval_metric": sp.metric}, ("ppl_ratio_vs_relative",),
                       format_flatness, DEFAULT_RELATIVE, report_after_plots=True)  # the answer, last


def expand(task_names: list[str], task_options: list[str], **run) -> tuple[list[str], list[str], DerivedStep | None,
                                                                           list[str]]:
    """:func:`split_flatness` in the common form of the derived steps' expanders (see
    :data:`lctx.harness.steps.derived.EXPANDERS`): (task names, option items left, the step or None, lines to print)."""
    names, rest, spec = split_flatness(task_names, task_options)
    return names, rest, (step(spec) if spec else None), []


register_step(TASK, expand)


def write_tables_with_flatness(out_dir: Path, spec: FlatnessSpec | None = None,
                               metrics_of=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rewrite a run's tables from its ``records.jsonl`` plus the derived flatness rows and note the criteria in
    ``run.json`` (:func:`lctx.harness.steps.derived.write_run_tables` with this one step; the figure
    ``plots/ppl_ratio_vs_relative.png`` is the outputs': :func:`lctx.harness.outputs.plots.step_figures` with
    :func:`step`). Returns (table, summary). A spec naming no retrieval metric thresholds the retrieval task's
    headline metric as ``run.json`` records it (``task_meta``; no task file needed).

    Raises:
        LctxError: ``out_dir`` has no records; the retrieval task is neither recorded nor registered.
    """
    spec = (spec or FlatnessSpec()).resolved(declared_tasks(read_json(Path(out_dir) / "run.json")))
    return write_run_tables(out_dir, [step(spec)], metrics_of)


def format_flatness(table: pd.DataFrame) -> str:
    """The flatness rows of a table as text lines: per model, the ratios by length, flat-until and
    effective length (tokens and multiples of the training length)."""
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    rows = table[table["task"] == TASK]
    lines = []
    for (model, variant), g in rows.groupby(["model", "variant"], sort=False, dropna=False):
        T = _train_length(g)
        r = g[(g["metric"] == "ppl_ratio") & (g["status"] == "ok")].sort_values("length")
        ratios = ", ".join(f"{int(L)}: {v:.3f}" for L, v in zip(r["length"], r["value"]))
        parts = [f"{model}: train_length {T}", f"ppl_ratio {{{ratios}}}"]
        for m in ("flat_until", "effective_length"):
            x = g[g["metric"] == m]
            if len(x):
                v = x["value"].iloc[0]
                crit = json_cell(x["task_options"].iloc[0]) or {}
                if pd.isna(v):
                    txt = f"error ({x['error'].iloc[0]})"
                elif v == 0:
                    txt = "0 (below the threshold already at the shortest length)"
                else:
                    txt = f"{int(v)}" + (f" ({v / T:g}x)" if T else "")
                parts.append(f"{m} {txt} [{crit.get('criterion', '')}]")
        lines.append("; ".join(parts))
    return "\n".join(lines)


def note_run(out_dir: Path, **fields) -> None:
    """Merge ``fields`` into ``OUT/run.json`` (a sweep run per training length leaves only its own models
    and lengths there; the CLI records all of them, the ``relative`` factors and each model's training
    length)."""
    meta_path = Path(out_dir) / "run.json"
    meta = read_json(meta_path) or {}
    meta.update(fields)
    if "relative" in fields and "train_lengths" in fields:
        meta["lengths"] = sorted({L for T in set(fields["train_lengths"].values()) if T
                                  for L in relative_lengths(int(T), fields["relative"])})
    atomic_write_json(meta_path, meta)
