"""The sweep runner: models x tasks x lengths x depths x samples -> cells -> records -> tables -> plots.

Each finished sample is appended to ``OUT/records.jsonl`` as one JSON line and fsync'ed before the next
starts, so a killed run loses at most the sample in flight; rerunning the same command on the same
``--out`` skips every sample already recorded with status ok for the same inputs (errored ones are
retried): the resume key holds a fingerprint of the checkpoint's and the data's content, the options and
the versions (:func:`sample_base`). A sample that fails (an exception, out of memory, non-finite logits or
scores, a task calling ``sys.exit``) is recorded with status ``error`` and the message, and the sweep goes
on. The run directory is locked while a sweep writes it (:mod:`lctx.harness.rundir`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import subprocess
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

import lctx
from lctx.tasks import Task

from . import distributed as D
from lctx.errors import LctxError, NonFiniteLogitsError
from .lm import LM
from .tables import read_records, record_key, write_tables


def git_revision() -> str:
    """The git commit of the lctx source tree (with ``-dirty`` when modified), or ``"unknown"``."""
    src = Path(lctx.__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (rev + ("-dirty" if dirty else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fingerprint(path: str) -> str:
    """The content fingerprint of a checkpoint (:func:`lctx.models.fingerprint.checkpoint_fingerprint`):
    16 hex digits over the SHA-256 of its weights, config.json, tokenizer and other model files, so a rerun
    into the same ``--out`` after retraining (same size, restored mtime) never reuses stale records."""
    from lctx.models.fingerprint import checkpoint_fingerprint

    return checkpoint_fingerprint(path)


def model_inputs(lm: LM) -> dict:
    """{"fingerprint", "files": {name: sha256}, "path"} of ``lm``'s checkpoint, hashed once per LM object
    (and per process: the digest cache of :mod:`lctx.models.fingerprint` skips unchanged files)."""
    got = getattr(lm, "_lctx_inputs", None)
    if got is None:
        from lctx.models.fingerprint import checkpoint_digests, digest_json

        files = checkpoint_digests(lm.path)
        got = {"path": str(Path(lm.path).resolve()), "fingerprint": digest_json(files), "files": files}
        lm._lctx_inputs = got
    return got


def versions() -> dict:
    """Versions of the code that computes a number: lctx, torch, transformers."""
    import transformers

    return {"lctx": lctx.__version__, "torch": torch.__version__, "transformers": transformers.__version__}


def sample_base(lm: LM, task_name: str, task_version, task_options: dict, data_fp: str | None,
                seed: int, code_fp: str | None = None, chunked: bool = True) -> dict:
    """The identity fields of a sample's record: everything that can change its numbers, and their hash.

    ``fingerprint`` = 16 hex digits of SHA-256 over: the checkpoint's content fingerprint, the variant
    (an ``--attn-override`` included), the task's name, version, options, data fingerprint and, for a task
    from a ``--task-file``, its source file's hash; dtype, attention path (requested), prefill chunk size,
    device type; the seed; the lctx, torch and transformers versions. With model, task and the grid point
    it is the resume key (:data:`lctx.harness.tables.KEY`). ``chunked=False`` for tasks that do not run
    through ``LM.prefill`` (lm-eval's): the chunk size does not reach them and is left out.
    """
    from lctx.models.fingerprint import digest_json

    mi = model_inputs(lm)
    vs = versions()
    base = {"model": lm.name, "variant": lm.variant, "model_fingerprint": mi["fingerprint"],
            "data_fingerprint": data_fp, "dtype": str(lm.dtype).replace("torch.", ""), "attn_impl": lm.attn_impl,
            "chunk_size": int(lm.chunk_size) if chunked else None, "task": task_name, "seed": seed,
            "task_options": _jsonable(task_options), "versions": vs}
    ident = dict(base, device_type=lm.device.type, task_version=task_version, code=code_fp)
    ident.pop("model")
    base["fingerprint"] = digest_json(ident)
    return base


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory in bytes: CUDA max allocated since the last reset on a GPU; on CPU the process's
    peak resident set size (``ru_maxrss``, a process-wide high-water mark)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if platform.system() == "Darwin" else rss * 1024)


@dataclass
class RunSpec:
    """What to run. lengths/depths: grid values (tokens; fractions in [0, 1]); samples: per cell."""

    lengths: list[int]
    depths: list[float]
    samples: int
    seed: int = 0


def check_lengths(lm: LM, lengths: list[int], allow_beyond_max: bool = False) -> None:
    """Refuse lengths above what a checkpoint declares it can address.

    Raises:
        LctxError: a length exceeds ``lm.max_length`` (names the limit and the fix).
    """
    if lm.max_length is not None and (isinstance(lm.max_length, bool) or not isinstance(lm.max_length, int)
                                      or lm.max_length <= 0):
        raise LctxError(f"model {lm.name!r} declares max_position_embeddings = {lm.max_length!r} in its "
                        "config.json, which is not a positive number of tokens; fix or remove that key")
    if lm.max_length and not allow_beyond_max:
        over = [L for L in lengths if L > lm.max_length]
        if over:
            raise LctxError(f"length {max(over)} exceeds the {lm.max_length} tokens model {lm.name!r} declares "
                            f"it can address (max_position_embeddings); use lengths <= {lm.max_length}, or "
                            "--allow-beyond-max for an extrapolation study")


def sample_cost(task: Task, lm: LM, cell) -> float:
    """What one cell costs in prefill tokens (:meth:`lctx.tasks.Task.cost`, at least 1): the progress bar's
    weight. A cost hook that fails falls back to the cell's length; it never stops a run."""
    try:
        c = float(task.cost(lm, cell))
    except Exception:  # noqa: BLE001 - an estimate for the progress bar only
        c = float(cell.length)
    return c if math.isfinite(c) and c >= 1 else 1.0


def check_min_lengths(lms: list[LM], tasks: list[Task], lengths: list[int]) -> None:
    """Before the sweep: refuse every (model, task, length) whose length is shorter than the task's fixed
    template with that model's tokenizer (:meth:`lctx.tasks.Task.min_length`), so it fails now, once, instead
    of as error rows in the middle of the run. Each (model, task) is checked once.

    Raises:
        LctxError: one or more lengths are too short (names each model, task, its minimum and the fix).
    """
    problems = []
    for lm in lms:
        for task in tasks:
            need = int(task.min_length(lm))
            short = sorted({int(L) for L in lengths if L < need})
            if short:
                problems.append(f"{task.name} needs at least {need} tokens with model {lm.name!r} (its template) "
                                f"but length{'s' if len(short) > 1 else ''} {', '.join(map(str, short))} "
                                f"{'are' if len(short) > 1 else 'is'} shorter")
    if problems:
        raise LctxError("; ".join(problems) + "; drop those lengths (--lengths / --relative) or that task")


def run_sweep(lms: list[LM], tasks: list[Task], spec: RunSpec, out_dir: Path, progress: bool = True,
              log=print, tables: bool = True) -> dict:
    """Run every (model, task, cell) not yet recorded in ``out_dir`` and write the tables and plots.

    The run directory is locked for the duration (:func:`lctx.harness.rundir.run_dir_lock`: a second process
    on the same directory refuses). A sample is reused only when a record with the same key exists: same
    model name, task, grid point and fingerprint (:func:`sample_base`: checkpoint content, data content,
    options, versions). ``run.json`` maps each label this run ran (:data:`lctx.harness.tables.LABEL`) to its
    current fingerprint, so the tables show only the current inputs' records (:func:`lctx.harness.tables.to_table`).

    Under ``torchrun`` / ``accelerate launch`` every rank calls this with the same arguments; each runs a
    deterministic share of the cells and rank 0 merges the records and writes the tables and plots
    (:mod:`lctx.harness.distributed`); every rank gets the same return value (counts over all ranks).

    ``tables=False`` leaves the tables and plots to the caller (:func:`lctx.harness.evaluate.evaluate` writes
    them once, after all its sweeps, :func:`lctx.harness.derived.write_run_tables`): ``records``,
    ``superseded``, ``table``, ``summary`` are then None, ``plots`` [].

    Returns {"records": n, "ran": n run now, "skipped": n already done, "errors": n errored now,
    "ok": n samples of this sweep with status ok (resumed + run), "superseded": records of older inputs left
    out of the tables, "table": DataFrame, "summary": DataFrame, "plots": [paths]}.

    Raises:
        LctxError: another process holds the run directory; ``run.json`` or ``records.jsonl`` is damaged
            beyond skipping (not a regular file, not a JSON object); a file cannot be written (full disk,
            read-only): finished samples are kept and a rerun resumes.
    """
    out_dir = Path(out_dir)
    dinfo = D.init()
    from .rundir import run_dir_lock

    with run_dir_lock(out_dir, dinfo):
        return _sweep(lms, tasks, spec, out_dir, progress, log, dinfo, tables)


def _warn(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr)


def _sweep(lms, tasks, spec, out_dir: Path, progress, log, dinfo, tables: bool = True) -> dict:
    from .rundir import RecordWriter, atomic_write_json, read_json
    from .tables import label_of, label_names

    # [distributed] under torchrun / accelerate launch each rank runs a share and appends to its own
    # records.rank{r}.jsonl; rank 0 merges them into records.jsonl (harness/distributed.py)
    rec_path = D.rank_records_path(out_dir, dinfo)
    meta_path = out_dir / "run.json"
    old_meta = read_json(meta_path, f"{meta_path}") or {}
    run_id = old_meta.get("run_id") if isinstance(old_meta.get("run_id"), str) else None
    run_id = run_id or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    run_id = D.broadcast(run_id)  # [distributed] rank 0's id on every rank

    # every input that can change a number, hashed (rank 0 reads the files, every rank gets the digests)
    inputs = None
    if dinfo.is_main:
        inputs = {"models": {lm.name: model_inputs(lm) for lm in lms},
                  "data": {t.name: t.data_fingerprint() for t in tasks}}
    inputs = D.broadcast(inputs)
    for lm in lms:
        lm._lctx_inputs = inputs["models"][lm.name]
    bases = {}
    for lm in lms:
        for task in tasks:
            bases[(lm.name, task.name)] = sample_base(lm, task.name, getattr(task, "version", 1), task.options,
                                                      inputs["data"][task.name], spec.seed, task_code_fingerprint(task))

    meta = dict(old_meta)
    meta.update({"run_id": run_id, "lctx_version": lctx.__version__, "git_rev": git_revision(),
                 "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
                 "models": [lm.path for lm in lms], "tasks": [t.name for t in tasks],
                 "lengths": spec.lengths, "depths": spec.depths, "samples": spec.samples, "seed": spec.seed,
                 "versions": versions()})
    current = dict(old_meta.get("current") or {}) if isinstance(old_meta.get("current"), dict) else {}
    current.update({label_of(b): b["fingerprint"] for b in bases.values()})
    meta["current"] = current
    known = meta.get("inputs") if isinstance(meta.get("inputs"), dict) else {}
    meta["inputs"] = {"models": {**(known.get("models") or {}), **inputs["models"]},
                      "data": {**(known.get("data") or {}), **{k: v for k, v in inputs["data"].items() if v}}}
    if dinfo.distributed:
        meta["world_size"] = dinfo.world_size
    if dinfo.is_main:  # [distributed]
        atomic_write_json(meta_path, meta, str(meta_path))

    # [distributed] all record files (rank files of an interrupted sharded run too); the barrier keeps
    # every rank from writing before all have read, so all build the same work list
    done = {record_key(r) for r in D.read_all_records(out_dir, report=_warn if dinfo.is_main else None)
            if r.get("status") == "ok"}
    D.barrier()
    work = []
    for lm in lms:
        for task in tasks:
            for cell in task.cells(spec.lengths, spec.depths, spec.samples):
                base = dict(bases[(lm.name, task.name)], length=cell.length, depth=cell.depth, sample=cell.sample)
                if record_key(base) in done:
                    continue
                work.append((lm, task, cell, base))
    n_total = len(work)
    skipped = sum(len(t.cells(spec.lengths, spec.depths, spec.samples)) for t in tasks) * len(lms) - n_total
    if skipped and dinfo.is_main:
        log(f"resuming {out_dir}: {skipped} samples already recorded, {n_total} to run")
    if dinfo.distributed:  # [distributed] a deterministic share, balanced by length in tokens
        D.check_same_work([record_key(w[3]) for w in work])
        work = D.shard(work, dinfo, cost=lambda w: w[2].length)

    from .console import SweepProgress

    costs = [sample_cost(task, lm, cell) for lm, task, cell, _ in work]  # prefill tokens: the bar's weights
    errors = 0
    if work:
        with RecordWriter(rec_path, kept=skipped) as writer, \
                SweepProgress(costs, enabled=progress and dinfo.is_main,  # [distributed]
                              desc="lctx run" + (f" (rank 0 of {dinfo.world_size})" if dinfo.distributed else "")) as bar:
            for (lm, task, cell, base), cost in zip(work, costs):
                bar.start(f"{lm.name} {task.name} L={cell.length}" + (f" d={cell.depth:g}" if cell.depth is not None else ""))
                rec = _run_one(lm, task, cell, base, spec.seed)
                rec.update(run_id=run_id, lctx_version=lctx.__version__, git_rev=meta["git_rev"])
                errors += rec["status"] != "ok"
                writer.write(rec)
                bar.done(cost)

    # [distributed] rank 0 merges the rank files and writes tables and plots once; the other ranks wait for
    # that, then build the same tables in memory (nothing written); ran/errors are summed over ranks
    metrics_of = {t.name: t.metrics for t in tasks}
    errors = sum(D.gather(errors))
    D.barrier()
    if dinfo.is_main:
        records = D.merge_records(out_dir)
    if not tables:
        D.barrier()
        return {"records": None, "ran": n_total, "skipped": skipped, "errors": errors,
                "ok": skipped + n_total - errors, "superseded": None, "table": None, "summary": None, "plots": []}
    if dinfo.is_main:
        table, summary = write_tables(records, out_dir, metrics_of, current)
        from .plots import make_plots

        try:
            plots = make_plots(table.assign(model=label_names(table)), out_dir)
        except OSError as e:
            raise LctxError(f"cannot write the plots in {out_dir / 'plots'} ({e.strerror or e}); the tables are "
                            "written: free space and rerun the same command to draw them") from None
    D.barrier()
    if not dinfo.is_main:
        from .tables import summarize, to_table

        records = read_records(out_dir / D.RECORDS)
        table = to_table(records, metrics_of, current)
        summary, plots = summarize(table), []
    return {"records": len(records), "ran": n_total, "skipped": skipped, "errors": errors,
            "ok": skipped + n_total - errors, "superseded": int(table.attrs.get("superseded", 0)),
            "table": table, "summary": summary, "plots": plots}


def task_code_fingerprint(task: Task) -> str | None:
    """SHA-256 (16 hex digits) of the source file of the task registered under ``task.name`` when it is
    defined outside lctx (a ``--task-file`` or a plug-in), whose code changes its numbers; ``None`` for
    lctx's own tasks (covered by the lctx version and the task's ``version``)."""
    import inspect

    from lctx.tasks import TASKS

    cls = TASKS.get(task.name, type(task))
    if cls.__module__.startswith("lctx."):
        return None
    try:
        src = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        src = None
    if not src or not os.path.isfile(src):
        return None
    from lctx.models.fingerprint import digest_files

    return digest_files({Path(src).name: src})


def _run_one(lm: LM, task: Task, cell, base: dict, seed: int) -> dict:
    """Build and score one sample; never raises (failures become status='error' records)."""
    rec = dict(base, variant=lm.variant, device=str(lm.device), dtype=str(lm.dtype).replace("torch.", ""),
               train_length=lm.train_length, n_tokens=None, depth_actual=None, metrics={}, status="ok",
               error="")
    if lm.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(lm.device)
    from lctx.kernels import impls_used

    impls_used(reset=True)
    t0 = time.perf_counter()
    try:
        sample = task.build(lm, cell, seed)
        rec["n_tokens"], rec["depth_actual"] = sample.n_tokens, sample.depth
        if sample.n_tokens > cell.length:
            raise ValueError(f"task built {sample.n_tokens} tokens for a length of {cell.length}")
        metrics = {k: float(v) for k, v in task.score(lm, sample).items()}
        missing = [m for m in task.metrics if m not in metrics]
        if missing:
            raise ValueError(f"task {task.name!r} returned no value for {missing}")
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        rec["metrics"] = metrics
        rec["extra"] = {k: v for k, v in sample.meta.items() if isinstance(v, (str, int, float, bool))}
        if bad:
            rec["status"], rec["error"] = "error", f"non-finite {', '.join(bad)} (NaN/inf logits?)"
    except torch.OutOfMemoryError as e:
        rec["status"], rec["error"] = "error", f"out of memory: {str(e).splitlines()[0][:300]}"
    except NonFiniteLogitsError as e:
        rec["status"], rec["error"] = "error", f"non-finite logits: {e}"
    except SystemExit as e:  # a task's own code called sys.exit(): a broken sample, not the end of the run
        rec["status"], rec["error"] = "error", f"the task called sys.exit({e.code!r}) while building or scoring"
    except Exception as e:  # noqa: BLE001 - one bad sample must not end the sweep
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        rec["status"], rec["error"] = "error", f"{type(e).__name__}: {str(e)[:300]}{where}"
    used = sorted(set(impls_used().values()))
    if used:  # the fast path says which kernel ran (triton / flex / chunked ...)
        rec["attn_kernel"] = "+".join(used)
    rec["wall_s"] = time.perf_counter() - t0
    rec["peak_mem_bytes"] = peak_memory_bytes(lm.device)
    rec["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return rec


def _jsonable(x):
    return json.loads(json.dumps(x, default=str))
