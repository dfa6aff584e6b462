"""Derived post-processing steps and the one place a run's tables are written.

A derived step (flatness: :mod:`lctx.harness.steps.flatness`; the ruler group: :mod:`lctx.harness.steps.ruler`) turns the
tidy table of a run's records into extra rows (task = the step's name), never stored as records: they are
recomputed from ``records.jsonl`` each time the tables are written, so a resumed run's derived numbers follow
its finished samples. Each step declares the same things (:class:`DerivedStep`): how to derive its records,
what it notes in ``run.json``, which figures it wants (by name: :mod:`lctx.harness.outputs.plots` draws them), how it
reads as text, and whether its lengths are relative to the training length. A step registers its expander
(``--tasks`` name -> the tasks it derives from) with :func:`register_step`. :func:`write_run_tables` applies any list
of steps and writes ``results.parquet``/``results.csv``/``summary.csv``, ``run.json``'s notes and the tables the
run's tasks declare (:func:`lctx.tasks.extra_tables`: MMLU's ``mmlu_subjects.csv``), once; figures are the outputs'
(:func:`lctx.harness.outputs.plots.write_run_outputs` writes both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:  # pandas on first use: `lctx list tasks` imports this module for its
    import pandas as pd  # registered names only (tests/test_startup.py)

from lctx.errors import LctxError
from lctx.registry import Registry

from lctx.harness.run.rundir import atomic_write_json, read_json

#: The derived steps' expanders, {``--tasks`` name: expander}, in registration order (the order they apply in): an
#: expander takes (task names, ``--task-option`` items, data_dir=, samples=, depths=) and returns (task names with its
#: own replaced by the tasks it derives from, the option items not addressed to it, its :class:`DerivedStep` or None
#: when not asked for, lines to print). :mod:`lctx.harness.steps.flatness` and :mod:`lctx.harness.steps.ruler` register
#: theirs on import.
EXPANDERS: Registry[Callable] = Registry("derived step", replace=True)


def register_step(name: str, expand: Callable) -> Callable:
    """Register the expander of the derived step ``name`` (:data:`EXPANDERS`); returns ``expand``."""
    return EXPANDERS.add(name, expand)


def take_options(name: str, task_options: list[str], example: str) -> tuple[dict, list[str]]:
    """Split ``--task-option`` items into those addressed to the derived step ``name`` (``name.KEY=VALUE``,
    values read as JSON when they parse, else kept as strings) and the rest. Returns ({key: value}, rest).

    Raises:
        LctxError: an item for ``name`` that is not ``name.KEY=VALUE`` (the message shows ``example``).
    """
    opts, rest = {}, []
    for item in task_options:
        if item.split(".", 1)[0].strip() != name:
            rest.append(item)
            continue
        head, sep, val = item.partition("=")
        key = head.split(".", 1)[1].strip() if "." in head else ""
        if not sep or not key:
            raise LctxError(f"--task-option {item!r} is not {name}.KEY=VALUE; write e.g. --task-option {example}")
        try:
            opts[key] = json.loads(val)
        except json.JSONDecodeError:
            opts[key] = val
    return opts, rest


def replace_name(task_names: list[str], name: str, tasks: list[str]) -> list[str]:
    """``task_names`` with ``name`` replaced by ``tasks``, each task once, order kept."""
    out: list[str] = []
    for n in (t for x in task_names for t in (tasks if x == name else [x])):
        if n not in out:
            out.append(n)
    return out


def json_cell(s):
    """A ``task_options`` cell of a results table as an object: JSON text parsed (kept as the text when it is
    not JSON), None for an empty cell (None, NaN), anything else as it is."""
    if isinstance(s, str):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return s
    return None if s is None or (isinstance(s, float) and s != s) else s


@dataclass(frozen=True)
class DerivedStep:
    """One derived post-processing step, as the runner applies it.

    name: the ``task`` of its rows (and its key in ``run.json``); metrics: the metrics of its rows; spec: its
    criteria (a frozen dataclass); derive(table, spec): records (dicts with the runner's record fields) from
    the tidy table of the other tasks' rows; run_json(spec): what ``run.json`` records under ``name``;
    figures: the figures it wants drawn of the final table, by name (:data:`lctx.harness.outputs.plots.FIGURES`, each
    given the step's name and spec); report(table): its rows as text; relative: its lengths are multiples of each
    model's training length, these ones unless ``--lengths`` or ``--relative`` is given (flatness; () for none);
    report_after_plots: ``lctx run`` prints its text after the plot lines, not before the summary (the ruler grid).
    """

    name: str
    metrics: tuple[str, ...]
    spec: Any
    derive: Callable[[pd.DataFrame, Any], list[dict]]
    run_json: Callable[[Any], dict]
    figures: tuple[str, ...] = ()
    report: Optional[Callable[[pd.DataFrame], str]] = None
    relative: tuple[float, ...] = ()
    report_after_plots: bool = False


def base_record(model, variant, rows: pd.DataFrame, task: str, train_length) -> dict:
    """The fields of a derived record that come from its model's rows (seed, run, device, dtype, attention,
    versions; taken from the first row) and the constants of a derived row (no depth, sample 0, status ok)."""
    first = rows.iloc[0]
    return {"model": model, "variant": variant or None, "task": task, "depth": None, "sample": 0,
            "seed": _scalar(first.get("seed")), "run_id": first.get("run_id"), "device": first.get("device"),
            "dtype": first.get("dtype"), "attn_impl": first.get("attn_impl"),
            "lctx_version": first.get("lctx_version"), "git_rev": first.get("git_rev"),
            "train_length": train_length, "n_tokens": None, "depth_actual": None, "status": "ok", "error": ""}


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with status ok and a numeric value and length (value, length as numbers)."""
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    out = df[df["status"].astype("string").fillna("") == "ok"].copy()
    out["value"] = pd.to_numeric(out["value"], errors="coerce")
    out["length"] = pd.to_numeric(out["length"], errors="coerce")
    return out.dropna(subset=["value", "length"])


def _scalar(v):
    import pandas as pd  # lazy: loads pandas (`lctx list tasks` imports this module)

    try:
        return None if v is None or pd.isna(v) else int(v)
    except (TypeError, ValueError):
        return v


def metrics_of_tasks() -> dict[str, tuple[str, ...]]:
    """{task: metrics} of every registered task and group (lm-eval's: the columns a record may fill)."""
    from lctx.tasks import GROUPS, TASKS  # lazy: loads lctx.tasks and numpy (evaluate, so lctx.cli, imports this module)

    return {**{n: tuple(c.metrics) for n, c in TASKS.items()}, **{n: tuple(g.metrics) for n, g in GROUPS.items()}}


def write_run_tables(out_dir: Path, steps: list[DerivedStep] = (), metrics_of: dict | None = None,
                     report: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write a run's tables once: ``results.parquet``/``results.csv``/``summary.csv`` from ``records.jsonl`` (the
    records ``run.json`` vouches for, :func:`lctx.harness.run.tables.vet_records`, whose warnings go to ``report``:
    the runner has named them already; of those the current inputs' records,
    :func:`lctx.harness.run.tables.current_map`) plus every step's derived rows; each
    step's entry in ``run.json``; the tables the run's tasks declare (:func:`lctx.tasks.extra_tables`:
    ``mmlu_subjects.csv`` when MMLU ran). No figures: :func:`lctx.harness.outputs.plots.write_run_outputs` writes
    the tables with this and then draws them. Returns (table, summary).

    Raises:
        LctxError: ``out_dir`` has no records; a table cannot be written (the records are kept).
    """
    from lctx.harness.run.tables import current_map, read_records, to_table, vet_records, write_tables  # lazy: loads pandas
    from lctx.tasks import extra_tables  # lazy: loads lctx.tasks and numpy

    out_dir = Path(out_dir)
    records = vet_records(read_records(out_dir / "records.jsonl"), read_json(out_dir / "run.json"), report,
                          str(out_dir / "records.jsonl"))
    if not records:
        raise LctxError(f"{out_dir} has no records.jsonl records; run the sweep first")
    metrics_of = {**metrics_of_tasks(), **(metrics_of or {}), **{s.name: s.metrics for s in steps}}
    current = current_map(out_dir)  # only the current inputs' records are derived from
    base = to_table(records, metrics_of, current)
    derived = [r for s in steps for r in s.derive(base, s.spec)]
    table, summary = write_tables(records + derived, out_dir, metrics_of, current)
    if steps:
        meta_path = out_dir / "run.json"
        meta = read_json(meta_path) or {}
        meta.update({s.name: s.run_json(s.spec) for s in steps})
        atomic_write_json(meta_path, meta)
    for name, extra in extra_tables(table).items():
        extra.to_csv(out_dir / name, index=False)
    return table, summary
