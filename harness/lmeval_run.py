"""The lm-eval tasks' run (``mmlu``, ``arc_easy``, ``arc_challenge``; :mod:`lctx.tasks.lmeval` knows the tasks):
lm-eval's evaluator per task and model, one record per question in ``OUT/records.jsonl`` with the same record
fields and resume key as :func:`lctx.harness.runner.run_sweep`'s (:func:`lctx.harness.runner.sample_base`).
It lives beside the runner, in the harness layer, because it writes the run directory.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from lctx.errors import LctxError
from lctx.tasks.lmeval import (DEFAULT_FEWSHOT, METRICS, LmEvalSpec, _options, lctx_hflm_class, load_tasks,
                               mmlu_subject_table, quiet_git_probe, sample_records, spec_files)


def run_lmeval(lms: list, specs: list[LmEvalSpec], source: str, out_dir: str | Path, data_dir=None,
               limit: int | None = None, num_fewshot: int | None = None, seed: int = 0, batch_size: int = 32,
               progress: bool = True, log=print, chat_template: bool = False,
               system_prompt: str | None = None, tables: bool = True) -> dict:
    """Run lm-eval tasks for every model, append one record per question to ``OUT/records.jsonl`` and
    rewrite ``results.parquet``/``results.csv``/``summary.csv`` (all records, other tasks included),
    ``mmlu_subjects.csv`` and the plots.

    lms: :class:`lctx.harness.lm.LM` s; specs/source from :func:`lctx.tasks.lmeval.resolve_tasks`; limit: the first N
    test questions of each task (each MMLU subject), ``None`` for all; num_fewshot: ``None`` for the
    task defaults (:data:`DEFAULT_FEWSHOT`); seed: lm-eval's few-shot sampler seed (MMLU takes the
    first k dev questions regardless); batch_size: lm-eval requests per forward; chat_template /
    system_prompt: lm-eval's own ``apply_chat_template`` / ``system_instruction`` (``--chat-template on``,
    ``--system-prompt``; recorded in the task options).

    Questions already recorded with status ok for the same model weights, dtype, task options and seed
    are skipped. A task whose evaluation fails records every question it was to run as status
    ``error`` with the message, and the run goes on.

    Returns {"records", "ran", "skipped", "errors", "table", "summary", "plots"} like ``run_sweep``
    (``tables=False``: nothing written after the records, table/summary None, as ``run_sweep``'s).

    Raises:
        LctxError: unreadable data or an unreachable hub (before any question runs).
    """
    if limit is not None and limit < 1:
        raise LctxError(f"--limit {limit} is not a positive number of questions; pass e.g. --limit 20")
    if num_fewshot is not None and num_fewshot < 0:
        raise LctxError(f"--num-fewshot {num_fewshot} is negative; pass 0 or more")
    out = Path(out_dir)
    from lctx.harness.rundir import run_dir_lock

    with run_dir_lock(out):
        return _run_lmeval(lms, specs, source, out, data_dir, limit, num_fewshot, seed, batch_size, progress, log,
                           chat_template, system_prompt, tables)


def _run_lmeval(lms, specs, source, out: Path, data_dir, limit, num_fewshot, seed, batch_size, progress, log,
                chat_template=False, system_prompt=None, tables=True):
    import sys

    import torch

    import lctx
    from lctx.models.fingerprint import digest_files
    from lctx.harness.rundir import RecordWriter, atomic_write_json, read_json
    from lctx.harness.runner import git_revision, peak_memory_bytes, sample_base
    from lctx.harness.tables import label_of, read_records, record_key, write_tables
    from lctx.tasks import TASKS

    rec_path, meta_path = out / "records.jsonl", out / "run.json"
    meta = read_json(meta_path) or {}
    run_id = meta.get("run_id") or (datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}")
    git_rev = git_revision()
    import lm_eval

    meta.update(run_id=run_id, lctx_version=lctx.__version__, git_rev=git_rev, torch=torch.__version__)
    meta.setdefault("models", [lm.path for lm in lms])
    meta["tasks"] = sorted(set(meta.get("tasks", [])) | {sp.task for sp in specs})
    meta["lmeval"] = {"lm_eval": getattr(lm_eval, "__version__", "?"), "source": source,
                      "data_dir": str(Path(data_dir).resolve()) if data_dir else None, "limit": limit,
                      "num_fewshot": num_fewshot, "seed": seed}
    root = Path(data_dir) if data_dir else None
    data_fp = {sp: (digest_files({str(p.relative_to(root)): p for p in spec_files(sp, root)}) if source == "local"
                    else f"hub:{sp.lmeval_name}") for sp in specs}
    lmeval_version = {"lm_eval": getattr(lm_eval, "__version__", "?")}
    bases = {(lm.name, sp): sample_base(lm, sp.task, lmeval_version,
                                        _options(sp, num_fewshot, source, chat_template, system_prompt),
                                        data_fp[sp], seed, chunked=False) for lm in lms for sp in specs}
    current = dict(meta.get("current") or {}) if isinstance(meta.get("current"), dict) else {}
    current.update({label_of(b): b["fingerprint"] for b in bases.values()})
    meta["current"] = current
    atomic_write_json(meta_path, meta, str(meta_path))

    done = {record_key(r) for r in read_records(rec_path, lambda m: print(m, file=sys.stderr))
            if r.get("status") == "ok"}
    ran = skipped = errors = 0
    with tempfile.TemporaryDirectory(prefix="lctx-lmeval-") as cfg_dir:
        tm, tasks = load_tasks(specs, source, data_dir, Path(cfg_dir))
        n_docs = {name: len(t.eval_docs) for name, t in tasks.items()}
        hflm_cls = lctx_hflm_class()
        for lm in lms:
            if chat_template and not getattr(lm.tokenizer, "chat_template", None):
                raise LctxError(f"--chat-template on: the tokenizer of model {lm.name!r} has no chat template; "
                                "use --chat-template off (the default) for this model")
            if hasattr(lm, "release_rope"):
                lm.release_rope()  # lm-eval calls the model directly: transformers' own RoPE behaviour
            hflm = hflm_cls(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=batch_size)
            for sp in specs:
                k = DEFAULT_FEWSHOT[sp.task] if num_fewshot is None else num_fewshot
                base = dict(bases[(lm.name, sp)], length=None, depth=None)
                wanted = range(min(limit, n_docs[sp.lmeval_name]) if limit else n_docs[sp.lmeval_name])
                todo = [i for i in wanted if record_key(dict(base, sample=i)) not in done]
                skipped += len(wanted) - len(todo)
                if not todo:
                    continue
                if progress:
                    log(f"{lm.name}: {sp.task}{'/' + sp.subject if sp.subject else ''} "
                        f"{len(todo)} questions, {k}-shot")
                t0 = time.perf_counter()
                try:
                    # set k on the task itself: simple_evaluate(num_fewshot=...) never overrides a task
                    # whose num_fewshot is already 0 (as an earlier call leaves it)
                    tasks[sp.lmeval_name].set_config(key="num_fewshot", value=k)
                    with quiet_git_probe():
                        res = lm_eval.simple_evaluate(
                            model=hflm, tasks=[tasks[sp.lmeval_name]], samples={sp.lmeval_name: todo},
                            task_manager=tm, log_samples=True, bootstrap_iters=0, fewshot_random_seed=seed,
                            apply_chat_template=bool(chat_template), system_instruction=system_prompt)
                    parts, err = sample_records(sp, res["samples"][sp.lmeval_name], hflm), ""
                except (KeyboardInterrupt, LctxError):
                    raise
                except Exception as e:  # noqa: BLE001 - one failing task must not end the run
                    first = (str(e).strip().splitlines() or [""])[0][:300]
                    parts, err = [{"sample": i, "metrics": {}, "n_tokens": None, "extra": {}} for i in todo], \
                        f"{type(e).__name__}: {first}"
                    log(f"failed: {lm.name} {sp.lmeval_name}: {err}")
                wall = (time.perf_counter() - t0) / max(1, len(parts))
                stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
                with RecordWriter(rec_path, kept=skipped + ran) as writer:
                    for p in parts:
                        rec = dict(base, sample=p["sample"], variant=lm.variant, device=str(lm.device),
                                   train_length=lm.train_length, n_tokens=p["n_tokens"], depth_actual=None,
                                   metrics=p["metrics"], status="error" if err else "ok", error=err,
                                   extra=dict(p["extra"], lmeval_task=sp.lmeval_name), wall_s=wall,
                                   peak_mem_bytes=peak_memory_bytes(lm.device), timestamp=stamp,
                                   run_id=run_id, lctx_version=lctx.__version__, git_rev=git_rev)
                        writer.write(rec)
                ran += len(parts)
                errors += len(parts) if err else 0

    if not tables:
        return {"records": None, "ran": ran, "skipped": skipped, "errors": errors, "ok": skipped + ran - errors,
                "superseded": None, "table": None, "summary": None, "plots": []}
    records = read_records(rec_path)
    metrics_of = {name: cls.metrics for name, cls in TASKS.items()} | METRICS
    table, summary = write_tables(records, out, metrics_of, current)
    subj = mmlu_subject_table(table)
    if len(subj):
        subj.to_csv(out / "mmlu_subjects.csv", index=False)
    from lctx.harness.plots import make_plots

    plots = make_plots(table, out)
    log(format_summary(summary))
    return {"records": len(records), "ran": ran, "skipped": skipped, "errors": errors,
            "ok": skipped + ran - errors, "superseded": int(table.attrs.get("superseded", 0)), "table": table,
            "summary": summary, "plots": plots}


def format_summary(summary) -> str:
    """The lm-eval tasks' rows of a summary table as an aligned Markdown table (every cell whole, model names
    never cut): model, task, metric, mean, stderr, n."""
    from lctx.harness.console import markdown_table

    rows = summary[summary["task"].isin(list(METRICS))]
    body = [[str(r["model"]), r["task"], r["metric"], f"{r['mean']:.4f}", f"{r['stderr']:.4f}", int(r["n"])]
            for _, r in rows.iterrows()]
    return markdown_table(["model", "task", "metric", "value", "stderr", "n"], body, right=("value", "stderr", "n"))
