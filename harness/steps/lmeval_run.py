"""The lm-eval tasks' run on its own (``mmlu``, ``arc_easy``, ``arc_challenge``; :mod:`lctx.tasks.lmeval` knows the
tasks): their :class:`lctx.tasks.lmeval.LmEvalTask` s through the one runner (:func:`lctx.harness.run.runner.run_sweep`:
same records, resume key and provenance as every task), then the run's tables once
(:func:`lctx.harness.steps.derived.write_run_tables`; no figures: they are the outputs'). :func:`lctx.evaluate` runs the
same task objects in its sweep (:data:`lctx.tasks.lmeval.LMEVAL` builds them) and prints :func:`format_summary`.
"""

from __future__ import annotations

from pathlib import Path

from lctx.defaults import LMEVAL_BATCH_SIZE
from lctx.harness.run.console import markdown_table
from lctx.harness.run.rundir import run_dir_lock
from lctx.tasks.lmeval import LmEvalSpec, is_lmeval_label, make_tasks


def run_lmeval(lms: list, specs: list[LmEvalSpec], source: str, out_dir: str | Path, data_dir=None,
               limit: int | None = None, num_fewshot: int | None = None, seed: int = 0, batch_size: int = LMEVAL_BATCH_SIZE,
               progress: bool = True, log=print, chat_template: bool = False,
               system_prompt: str | None = None, tables: bool = True) -> dict:
    """Run lm-eval tasks for every model, append one record per question to ``OUT/records.jsonl`` and
    rewrite ``results.parquet``/``results.csv``/``summary.csv`` (all records, other tasks included) and
    ``mmlu_subjects.csv`` (figures: :func:`lctx.harness.outputs.plots.run_figures`).

    lms: :class:`lctx.models.adapters.hf.HFAdapter` s; specs/source from :func:`lctx.tasks.lmeval.resolve_tasks`; limit: the first N
    test questions of each task (each MMLU subject), ``None`` for all; num_fewshot: ``None`` for the
    task defaults (:data:`lctx.tasks.lmeval.DEFAULT_FEWSHOT`); seed: lm-eval's few-shot sampler seed (MMLU takes
    the first k dev questions regardless); batch_size: lm-eval requests per forward; chat_template /
    system_prompt: lm-eval's own ``apply_chat_template`` / ``system_instruction`` (``--chat-template on``,
    ``--system-prompt``; recorded in the task options).

    Questions already recorded with status ok for the same model weights, dtype, task options and seed
    are skipped. A task whose evaluation fails records every question it was to run as status
    ``error`` with the message, and the run goes on.

    Returns {"records", "ran", "skipped", "errors", "ok", "superseded", "table", "summary", "plots"} like
    ``run_sweep`` ("plots" [] : a run draws none; ``tables=False``: nothing written after the records, table/summary
    None, as ``run_sweep``'s).

    Raises:
        LctxError: a bad limit or few-shot count, unreadable data or an unreachable hub (before any question
            runs); another process holds ``out_dir``.
    """
    from lctx.harness.steps.derived import write_run_tables  # lazy: loads pandas
    from lctx.harness.run.runner import RunSpec, run_sweep  # lazy: loads torch, transformers
    from lctx.harness.run.tables import read_records  # lazy: loads pandas

    tasks = make_tasks(specs, source, data_dir, limit, num_fewshot, seed, batch_size, chat_template, system_prompt,
                       log if progress else None)
    out = Path(out_dir)
    with run_dir_lock(out):
        res = run_sweep(lms, tasks, RunSpec(lengths=[], depths=[], samples=1, seed=seed), out, progress=progress,
                        log=log, tables=False)
        if not tables:
            return res
        table, summary = write_run_tables(out)
    log(format_summary(summary))
    return dict(res, records=len(read_records(out / "records.jsonl")), table=table, summary=summary, plots=[],
                superseded=int(table.attrs.get("superseded", 0)))


def format_summary(summary, owns=is_lmeval_label) -> str:
    """The rows of a summary table whose task ``owns`` accepts (default: lm-eval's tasks, :func:`is_lmeval_label`; a
    task family's :meth:`lctx.tasks.TaskFamily.owns_label`) as an aligned Markdown table (every cell whole, model
    names never cut): model, task (MMLU as run: ``mmlu_astronomy``, :func:`lctx.tasks.lmeval.pooled_label`), metric,
    mean, stderr, n."""

    rows = summary[summary["task"].map(owns)]  # mmlu_astronomy: MMLU pooled over its subjects
    body = [[str(r["model"]), r["task"], r["metric"], f"{r['mean']:.4f}", f"{r['stderr']:.4f}", int(r["n"])]
            for _, r in rows.iterrows()]
    return markdown_table(["model", "task", "metric", "value", "stderr", "n"], body, right=("value", "stderr", "n"))
