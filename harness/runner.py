"""The sweep runner: models x tasks x lengths x depths x samples -> cells -> records -> tables -> plots.

Each finished sample is appended to ``OUT/records.jsonl`` as one JSON line and fsync'ed before the next
starts, so a killed run loses at most the sample in flight; rerunning the same command on the same
``--out`` skips every sample already recorded with status ok (errored ones are retried). A sample that
fails (an exception, out of memory, non-finite scores) is recorded with status ``error`` and the
message, and the sweep goes on.
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
from .errors import LctxError
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
    """A cheap identity of a checkpoint's weights: resolved path plus size and mtime of its weight files,
    so rerunning into the same ``--out`` after retraining a checkpoint does not reuse stale records."""
    p = Path(path)
    parts = [str(p.resolve())]
    for w in sorted(p.glob("*.safetensors")) + sorted(p.glob("*.bin")):
        st = w.stat()
        parts.append(f"{w.name}:{st.st_size}:{int(st.st_mtime)}")
    import hashlib

    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]


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
              log=print) -> dict:
    """Run every (model, task, cell) not yet recorded in ``out_dir`` and write the tables and plots.

    Under ``torchrun`` / ``accelerate launch`` every rank calls this with the same arguments; each runs a
    deterministic share of the cells and rank 0 merges the records and writes the tables and plots
    (:mod:`lctx.harness.distributed`); every rank gets the same return value (counts over all ranks).

    Returns {"records": n, "ran": n run now, "skipped": n already done, "errors": n errored,
    "table": DataFrame, "summary": DataFrame, "plots": [paths]}.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    # [distributed] under torchrun / accelerate launch each rank runs a share and appends to its own
    # records.rank{r}.jsonl; rank 0 merges them into records.jsonl (harness/distributed.py)
    dinfo = D.init()
    rec_path = D.rank_records_path(out_dir, dinfo)
    meta_path = out_dir / "run.json"
    if meta_path.exists():
        run_id = json.loads(meta_path.read_text())["run_id"]
    else:
        run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    run_id = D.broadcast(run_id)  # [distributed] rank 0's id on every rank
    meta = {"run_id": run_id, "lctx_version": lctx.__version__, "git_rev": git_revision(),
            "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
            "models": [lm.path for lm in lms], "tasks": [t.name for t in tasks],
            "lengths": spec.lengths, "depths": spec.depths, "samples": spec.samples, "seed": spec.seed}
    if dinfo.is_main:  # [distributed]
        meta_path.write_text(json.dumps(dict(meta, world_size=dinfo.world_size) if dinfo.distributed else meta,
                                        indent=2))

    # [distributed] all record files (rank files of an interrupted sharded run too); the barrier keeps
    # every rank from writing before all have read, so all build the same work list
    done = {record_key(r) for r in D.read_all_records(out_dir) if r.get("status") == "ok"}
    D.barrier()
    work = []
    for lm in lms:
        for task in tasks:
            for cell in task.cells(spec.lengths, spec.depths, spec.samples):
                base = {"model": lm.name, "model_fingerprint": fingerprint(lm.path),
                        "dtype": str(lm.dtype).replace("torch.", ""), "attn_impl": lm.attn_impl,
                        "task": task.name, "length": cell.length,
                        "depth": cell.depth, "sample": cell.sample, "seed": spec.seed,
                        "task_options": _jsonable(task.options)}
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
    if rec_path.exists() and rec_path.stat().st_size:
        with open(rec_path, "rb+") as f:  # a run killed mid-write leaves a torn last line: end it
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
    with open(rec_path, "a") as f, SweepProgress(costs, enabled=progress and dinfo.is_main,  # [distributed]
                                                 desc="lctx run" + (f" (rank 0 of {dinfo.world_size})"
                                                                    if dinfo.distributed else "")) as bar:
        for (lm, task, cell, base), cost in zip(work, costs):
            bar.start(f"{lm.name} {task.name} L={cell.length}" + (f" d={cell.depth:g}" if cell.depth is not None else ""))
            rec = _run_one(lm, task, cell, base, spec.seed)
            rec.update(run_id=run_id, lctx_version=lctx.__version__, git_rev=meta["git_rev"])
            errors += rec["status"] != "ok"
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.done(cost)

    # [distributed] rank 0 merges the rank files and writes tables and plots once; the other ranks wait for
    # that, then build the same tables in memory (nothing written); ran/errors are summed over ranks
    metrics_of = {t.name: t.metrics for t in tasks}
    errors = sum(D.gather(errors))
    D.barrier()
    if dinfo.is_main:
        records = D.merge_records(out_dir)
        table, summary = write_tables(records, out_dir, metrics_of)
        from .plots import make_plots

        plots = make_plots(table, out_dir)
    D.barrier()
    if not dinfo.is_main:
        from .tables import summarize, to_table

        records = read_records(out_dir / D.RECORDS)
        table = to_table(records, metrics_of)
        summary, plots = summarize(table), []
    return {"records": len(records), "ran": n_total, "skipped": skipped, "errors": errors, "table": table,
            "summary": summary, "plots": plots}


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
