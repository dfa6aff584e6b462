"""The ``ruler`` task group: RULER's 13 tasks in one run, their average per length and the effective length.

``lctx run --tasks ruler`` runs the 13 tasks of RULER's benchmark (:data:`lctx.tasks.ruler.RULER_TASKS`: the
eight ``niah_*``, ``vt``, ``cwe``, ``fwe``, ``qa_1``, ``qa_2``), or those whose data is present, and says which
it left out and why (:func:`split_ruler`). From the records it derives, per (model, variant), rows with task
``ruler`` (Hsieh et al. 2024, section 4 and Table 3; NVIDIA/RULER's README table):

* ``average`` at each length L: the mean over the tasks of each task's score at L, in **percent** (0-100, as
  RULER reports it). A task's score is the mean of RULER's metric for it (``string_match_all`` for NIAH, vt,
  cwe, fwe; ``string_match_part`` for QA: :func:`task_metric`) over its samples and depths with status ok;
  every task weighs the same, as in RULER. When a task of the group has no successful sample at L the
  average there is an error row (a partial average is not RULER's);
* ``effective_length``: the largest tested length L such that the average is ``>= threshold`` at every
  tested length up to L (RULER's "effective length"; the threshold defaults to 85.6, Llama-2-7B's RULER
  score at 4K, and is set with ``--task-option ruler.threshold=X``, in percent); 0 when the shortest tested
  length already falls below it.

The derived rows are recomputed from ``records.jsonl`` whenever the tables are written (never stored as
records), like the flatness rows, so a resumed run's numbers follow its finished samples. The criterion and
the tasks averaged are in each row's ``task_options``; ``run.json`` gains a ``ruler`` entry (threshold, tasks,
left-out tasks with the reason). The step asks for the figure ``ruler_grid``: ``plots/ruler_<model>.png``, the task x
length grid beside the average (:func:`lctx.harness.outputs.plots.ruler_grids`, from :func:`ruler_table`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas on first use: `lctx list tasks` imports this module for its
    import pandas as pd  # registered name only (tests/test_startup.py)

from lctx.harness.steps.derived import (DerivedStep, base_record, json_cell, ok_rows, register_step, replace_name,
                                       take_options, write_run_tables)
from lctx.errors import LctxError
from lctx.tasks import TaskInfo, get_task, niah, register_group
from lctx.tasks.ruler import RULER_TASKS, VERB_FILE
from lctx.tasks.ruler_qa import RulerQA, find_qa_file

from lctx.harness.run.console import format_length
from lctx.harness.steps import flatness
from lctx.harness.steps.flatness import effective_length

GROUP = "ruler"
METRICS = ("average", "effective_length")
DESCRIPTION = ("RULER's 13 tasks (niah_*, vt, cwe, fwe, qa_1, qa_2; those whose data is present), derived per model "
               "and length: average (percent), effective_length (--task-option ruler.threshold=85.6)")
REQUIRES = "as its tasks (the QA JSON files are left out when absent)"
DEFAULT_THRESHOLD = 85.6
register_group(TaskInfo(GROUP, DESCRIPTION, METRICS, REQUIRES))


def ruler_tasks() -> tuple[str, ...]:
    """RULER's 13 task names in RULER's order (``scripts/config_tasks.sh``)."""
    return RULER_TASKS


def niah_tokens_to_generate() -> int:
    """RULER's generation budget of its NIAH tasks in tokens (``scripts/data/synthetic/constants.py``,
    ``TASKS["niah"]["tokens_to_generate"]`` = 128): what the ``ruler`` group gives each ``niah_*`` task as
    ``max_new_tokens`` unless the user sets one (lctx's own NIAH default outside the group is the answer's
    tokens + 8). The prompt is then fitted to ``length - 128`` tokens, as RULER's ``niah.py`` subtracts
    ``tokens_to_generate`` from ``max_seq_length``; greedy decoding still stops at EOS / the end of turn."""
    from lctx.tasks.niah import RULER_TOKENS_TO_GENERATE  # lazy: loads lctx.tasks and numpy

    return int(RULER_TOKENS_TO_GENERATE)


def task_metric(task: str) -> str:
    """RULER's metric of a task (``scripts/eval/synthetic/constants.py``): ``string_match_part`` for ``qa_*``,
    ``string_match_all`` for the others."""
    return "string_match_part" if str(task).startswith("qa_") else "string_match_all"


@dataclass(frozen=True)
class RulerSpec:
    """What the group runs and how it is scored.

    threshold: effective-length threshold on the average, percent (default 85.6); tasks: the tasks averaged
    (those run); left_out: (task, reason) of the tasks left out for missing data.
    """

    threshold: float = DEFAULT_THRESHOLD
    tasks: tuple[str, ...] = field(default_factory=ruler_tasks)
    left_out: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_options(cls, opts: dict) -> "RulerSpec":
        """Build from ``--task-option ruler.KEY=VALUE`` options (only ``threshold``).

        Raises:
            LctxError: an unknown key, or a threshold that is not a number in (1, 100] (it is in percent, as
                RULER's tables; 0.856 is a fraction and is refused).
        """
        for k in opts:
            if k != "threshold":
                raise LctxError(f"--task-option ruler.{k}: the ruler group has no option {k!r}; valid options: "
                                "threshold (options of one task go to it: --task-option cwe.max_new_tokens=120)")
        raw = opts.get("threshold", DEFAULT_THRESHOLD)
        try:
            t = float(raw)
        except (TypeError, ValueError):
            t = float("nan")
        if isinstance(raw, bool) or not (math.isfinite(t) and 1.0 < t <= 100.0):
            raise LctxError(f"ruler.threshold={raw!r} must be a score in percent in (1, 100], as RULER's tables "
                            "(Llama-2-7B at 4K: 85.6); write e.g. --task-option ruler.threshold=85.6")
        return cls(threshold=t)


def data_missing(task: str, data_dir, opts: dict) -> str | None:
    """Why ``task`` cannot run for lack of data (None when its data is present): NIAH needs the essay and the
    word lists, ``cwe`` the word lists, ``qa_*`` its JSON (``path`` option or found under the data dir); ``vt`` and
    ``fwe`` need nothing."""
    root = data_dir if data_dir not in (None, "") else os.environ.get("LCTX_DATA_DIR")
    if task.startswith("qa_"):
        cls: type[RulerQA] = get_task(task)
        if opts.get("path") not in (None, ""):
            return None  # given explicitly: the task itself reports a bad path
        return None if find_qa_file(cls.dataset, root) else cls.missing_data_message(root)
    need: list[str] = []
    if task.startswith("niah_"):
        need = niah.data_files(niah.RULER_CONFIGS[task])
    elif task == "cwe":
        need = [niah.NOUN_FILE, niah.ADJ_FILE, VERB_FILE]
    if task.startswith("niah_") and not root:  # every niah task takes its data from the data dir (multikey_3: none)
        return "no --data-dir / LCTX_DATA_DIR given (RULER's essay and word lists: `lctx data --only ruler`)"
    if not need:
        return None
    if not root:
        return f"needs {', '.join(need)}: no --data-dir / LCTX_DATA_DIR given"
    missing = [r for r in need if not (Path(root) / r).is_file()]
    return (f"{', '.join(missing)} not found under {str(root)!r} (`lctx data --out DIR --only ruler` fetches them)"
            if missing else None)


def split_ruler(task_names: list[str], task_options: list[str], data_dir=None, samples: int = 1,
                depths: list[float] | None = None) -> tuple[list[str], list[str], RulerSpec | None, list[str]]:
    """Expand ``ruler`` in ``--tasks`` into RULER's tasks whose data is present and take its ``--task-option``s.

    Input: the task names of ``--tasks``, the raw ``--task-option`` items, the data dir, ``--samples`` and the
    depths. Output: (task names with ``ruler`` replaced, each once, order kept; the option items not addressed
    to ``ruler``, plus ``niah_*.max_new_tokens=128`` (RULER's NIAH generation budget,
    :func:`niah_tokens_to_generate`) and ``cwe.samples=`` / ``fwe.samples=`` = samples x number of depths, each
    unless given, so that the tasks without a depth axis get as many samples per length as the others; the :class:`RulerSpec`; lines
    to print: which tasks run and which are left out, and why). Without ``ruler`` in the names, everything is
    returned unchanged with spec None.

    Raises:
        LctxError: a ``ruler.*`` item that is not ``ruler.KEY=VALUE`` or a bad option
            (:meth:`RulerSpec.from_options`), or no RULER task has its data.
    """
    if GROUP not in task_names:
        return list(task_names), list(task_options), None, []
    opts, rest = take_options(GROUP, task_options, "ruler.threshold=85.6")
    spec = RulerSpec.from_options(opts)
    per_task: dict[str, dict] = {}
    for item in rest:
        head, _, val = item.partition("=")
        if "." in head:
            t, k = head.split(".", 1)
            per_task.setdefault(t.strip(), {})[k.strip()] = val
    run, left = [], []
    for t in ruler_tasks():
        why = data_missing(t, data_dir, per_task.get(t, {}))
        (left.append((t, why)) if why else run.append(t))
    if not run:
        raise LctxError("ruler: no RULER task can run: " + "; ".join(f"{t}: {w}" for t, w in left[:3])
                        + "; pass --data-dir ../shared/data (RULER's essay and word lists)")
    out = replace_name(task_names, GROUP, run)
    n_depths = len(depths) if depths else 1
    for t in run:  # RULER's generation budget for its NIAH tasks (constants.py: niah tokens_to_generate 128)
        if t.startswith("niah_") and "max_new_tokens" not in per_task.get(t, {}):
            rest.append(f"{t}.max_new_tokens={niah_tokens_to_generate()}")
    for t in ("cwe", "fwe"):
        if t in run and "samples" not in per_task.get(t, {}) and n_depths > 1:
            rest.append(f"{t}.samples={samples * n_depths}")
    spec = RulerSpec(threshold=spec.threshold, tasks=tuple(run), left_out=tuple(left))
    notes = [f"ruler: running {len(run)} of RULER's {len(ruler_tasks())} tasks ({', '.join(run)}); "
             f"average and effective length at {spec.threshold:g}%"]
    notes += [f"ruler: left out {t}: {w}" for t, w in left]
    if n_depths > 1 and any(t in run for t in ("cwe", "fwe")):
        notes.append(f"ruler: cwe and fwe have no depth axis: {samples * n_depths} samples per length each "
                     f"(--samples {samples} x {n_depths} depths), as many as a depth task")
    return out, rest, spec, notes


# ----------------------------------------------------------------------------------------------
# deriving the numbers
# ----------------------------------------------------------------------------------------------

def latest_options(rows: pd.DataFrame) -> pd.DataFrame:
    """One model's task rows with, per task, only the rows of one option set: the set of its newest record
    (largest ``timestamp``). A run directory keeps every option set it ran as a series of its own (run.json's
    ``current`` map, :func:`lctx.harness.run.tables.select_current`), so a resumed run whose NIAH budget changed
    (before and after the group gave ``niah_*`` RULER's 128 tokens) holds both; RULER scores a task under one
    setting, so its score (and the average) must not pool them. A length that only the older set reached
    then has no score for the task (the average there is an error row, not a mix)."""
    if rows.empty or "task_options" not in rows.columns:
        return rows
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    opts = rows["task_options"].map(lambda o: json.dumps(json_cell(o), sort_keys=True, default=str))
    keep = pd.Series(True, index=rows.index)
    stamp = rows["timestamp"].astype("string").fillna("") if "timestamp" in rows.columns else None
    for task in rows["task"].unique():
        m = rows["task"] == task
        if opts[m].nunique() < 2:
            continue
        order = list(stamp[m]) if stamp is not None else list(range(int(m.sum())))
        newest = opts[m].iloc[max(range(len(order)), key=lambda i: (order[i], i))]
        keep &= ~m | (opts == newest)
    return rows[keep]


def task_scores(rows: pd.DataFrame, tasks: list[str] | tuple[str, ...]) -> pd.DataFrame:
    """Per task x length: RULER's score of each task (percent: mean of its metric over ok samples and depths,
    x100) for one model's rows, one option set per task (:func:`latest_options`); NaN where a task ran at a
    length but no sample succeeded. Index: the tasks present (in ``tasks`` order), columns: the lengths (int)
    at which any of them ran."""
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    rows = latest_options(rows[rows["task"].isin(list(tasks))])
    present = [t for t in tasks if (rows["task"] == t).any()]
    lengths = sorted({int(x) for x in pd.to_numeric(rows.loc[rows["task"].isin(present), "length"],
                                                    errors="coerce").dropna()})
    grid = pd.DataFrame(float("nan"), index=present, columns=lengths)
    ok = ok_rows(rows)
    for t in present:
        r = ok[(ok["task"] == t) & (ok["metric"] == task_metric(t))]
        for L, v in r.groupby(r["length"].astype("int64"))["value"].mean().items():
            grid.loc[t, int(L)] = 100.0 * float(v)
    return grid


def average_by_length(grid: pd.DataFrame, tasks: list[str] | tuple[str, ...]) -> dict[int, tuple[float, str]]:
    """{length: (average over ``tasks`` in percent, error)}: NaN and a reason where a task lacks a score."""
    out = {}
    for L in grid.columns:
        missing = [t for t in tasks if t not in grid.index or not math.isfinite(grid.loc[t, L])]
        if missing:
            out[int(L)] = (float("nan"), f"no successful sample of {', '.join(missing)} at length {int(L)}")
        else:
            out[int(L)] = (float(grid.loc[list(tasks), L].mean()), "")
    return out


def derive_records(table: pd.DataFrame, spec: RulerSpec | None = None) -> list[dict]:
    """The derived ``ruler`` records of a results table (rows of the tasks, as :func:`lctx.harness.run.tables.to_table`
    makes them; existing ``ruler`` rows are ignored): per (model, variant) that ran any of ``spec.tasks``, one
    ``average`` record per length and one ``effective_length`` record (see the module docstring), each a dict
    with the runner's record fields, ready for :func:`lctx.harness.run.tables.to_table`."""
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    spec = spec or RulerSpec()
    if table is None or table.empty:
        return []
    table = table[table["task"].astype("string") != GROUP]
    tab = table.assign(variant=table["variant"].astype("string").fillna(""))
    out: list[dict] = []
    tasks = list(spec.tasks)
    for (model, variant), rows in tab.groupby(["model", "variant"], sort=False, dropna=False):
        rows = rows[rows["task"].isin(tasks)]
        if rows.empty:
            continue
        tl = pd.to_numeric(rows["train_length"], errors="coerce").dropna()
        base = base_record(model, variant, rows, GROUP, int(tl.mode().iloc[0]) if len(tl) else None)
        grid = task_scores(rows, tasks)
        crit = {"tasks": tasks, "metrics": {t: task_metric(t) for t in tasks}, "unit": "percent",
                "left_out": [t for t, _ in spec.left_out]}
        avgs = average_by_length(grid, tasks)
        for L, (v, err) in sorted(avgs.items()):
            rec = dict(base, length=L, task_options=dict(crit, criterion=f"mean of {len(tasks)} RULER task scores"),
                       metrics={"average": v})
            if err:
                rec.update(status="error", error=err)
            out.append(rec)
        scores = {L: v for L, (v, _) in avgs.items()}
        out.append(dict(base, length=None, metrics={"effective_length": effective_length(scores, spec.threshold)},
                        task_options=dict(crit, criterion=f"RULER average >= {spec.threshold:g}",
                                          threshold=spec.threshold)))
    return out


def step(spec: RulerSpec) -> DerivedStep:
    """The ruler group as a derived post-processing step (:class:`lctx.harness.steps.derived.DerivedStep`): rows from
    :func:`derive_records`, the group in ``run.json`` (key ``ruler``: threshold, tasks, left-out tasks and why),
    the figure ``ruler_grid`` (``plots/ruler_<model>.png``, drawn by :mod:`lctx.harness.outputs.plots` from
    :func:`ruler_table`), :func:`format_ruler` as its text (printed after the plot lines)."""
    return DerivedStep(GROUP, METRICS, spec, derive_records,
                       lambda sp: {"threshold": sp.threshold, "tasks": list(sp.tasks),
                                   "left_out": {t: w for t, w in sp.left_out}},
                       ("ruler_grid",), format_ruler, report_after_plots=True)


def expand(task_names: list[str], task_options: list[str], data_dir=None, samples: int = 1,
           depths: list[float] | None = None) -> tuple[list[str], list[str], DerivedStep | None, list[str]]:
    """:func:`split_ruler` in the common form of the derived steps' expanders (see
    :data:`lctx.harness.steps.derived.EXPANDERS`): (task names, option items left, the step or None, lines to print)."""
    names, rest, spec, notes = split_ruler(task_names, task_options, data_dir, samples, depths)
    return names, rest, (step(spec) if spec else None), notes


register_step(GROUP, expand)


def write_tables_with_ruler(out_dir: Path, spec: RulerSpec, flat_spec=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rewrite a run's tables from its ``records.jsonl`` plus the derived ``ruler`` rows (and the flatness rows
    when ``flat_spec`` is given) and note them in ``run.json`` (:func:`lctx.harness.steps.derived.write_run_tables`
    with these steps; their figures are the outputs': :func:`lctx.harness.outputs.plots.step_figures`). Returns
    (table, summary).

    Raises:
        LctxError: ``out_dir`` has no records.
    """
    steps = [step(spec)] + ([flatness.step(flat_spec)] if flat_spec is not None else [])
    return write_run_tables(out_dir, steps)


# ----------------------------------------------------------------------------------------------
# presenting
# ----------------------------------------------------------------------------------------------

def ruler_table(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """One model's RULER table from its rows of a results table (task rows and its ``ruler`` rows): tasks x
    lengths (percent, RULER's order) and a last row ``average``; plus {"threshold", "effective_length",
    "tasks", "left_out"} from the ``ruler`` rows (empty dict without them). With the rows of several runs (more
    than one ``effective_length`` row), the effective length is recomputed over all their lengths' averages."""
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    r = rows[rows["task"] == GROUP]
    info: dict = {}
    tasks = list(ruler_tasks())
    if len(r):
        eff = r[r["metric"] == "effective_length"]
        opts = json_cell((eff if len(eff) else r)["task_options"].iloc[0])
        opts = opts if isinstance(opts, dict) else {}
        tasks = list(opts.get("tasks", tasks))
        info = {"threshold": opts.get("threshold"), "tasks": tasks, "left_out": opts.get("left_out", []),
                "effective_length": float(eff["value"].iloc[0]) if len(eff) else float("nan")}
    grid = task_scores(rows[rows["task"] != GROUP], tasks)
    avg = r[r["metric"] == "average"]
    av = {int(L): float(v) for L, v in zip(pd.to_numeric(avg["length"]), pd.to_numeric(avg["value"]))}
    grid.loc["average"] = [av.get(int(L), float("nan")) for L in grid.columns]
    if len(r[r["metric"] == "effective_length"]) > 1 and info.get("threshold") is not None:
        # rows of several runs (a report over run directories that each swept some lengths): each run's row
        # saw only its lengths, so the effective length is recomputed over the averages of all of them

        info["effective_length"] = float(effective_length(av, float(info["threshold"])))
    return grid, info


def format_ruler(table: pd.DataFrame) -> str:
    """The RULER rows of a table as text, per model: tasks x lengths (percent), the average and the effective
    length at the threshold."""
    lines = []
    models = table[table["task"] == GROUP]
    for (model, variant), _ in models.groupby(["model", "variant"], sort=False, dropna=False):
        rows = table[(table["model"] == model) & (table["variant"].astype("string").fillna("") == (variant or ""))]
        grid, info = ruler_table(rows)
        cols = [format_length(L) for L in grid.columns]
        w = max(len(str(i)) for i in grid.index)
        lines.append(f"RULER, {model}: score in percent (mean over samples and depths; niah/vt/cwe/fwe "
                     f"string_match_all, qa string_match_part)")
        lines.append(" " * (w + 2) + "".join(f"{c:>8}" for c in cols))
        for task, row in grid.iterrows():
            lines.append(f"{task:<{w}}  " + "".join(f"{v:8.1f}" if math.isfinite(v) else f"{'-':>8}" for v in row))
        e = info.get("effective_length", float("nan"))
        thr = info.get("threshold")
        etxt = ("-" if not math.isfinite(e) else (f"< {format_length(grid.columns.min())} (below the threshold at "
                                                  "the shortest length)" if e == 0 else format_length(e)))
        n = len(info.get("tasks", []))
        left = info.get("left_out") or []
        lines.append(f"effective length (average >= {thr:g}): {etxt}; average of {n} tasks"
                     + (f" ({', '.join(left)} left out)" if left else ""))
    return "\n".join(lines)
