"""The sweep runner: models x tasks x lengths x depths x samples -> cells -> records -> tables (figures are the
outputs': :func:`lctx.harness.outputs.plots.run_figures`).

Each finished sample is appended to ``OUT/records.jsonl`` as one JSON line and fsync'ed before the next
starts, so a killed run loses at most the sample in flight; rerunning the same command on the same
``--out`` skips every sample already recorded with status ok for the same inputs (errored ones are
retried): the resume key holds a fingerprint of the checkpoint's and the data's content, the options and
the versions (:func:`sample_base`). The runner sees models only through the
:class:`~lctx.models.adapters.protocol.ModelAdapter` protocol (identity, scoring, memory hooks), so it runs an
in-process checkpoint and any other adapter alike. A sample that fails (an exception, out of memory, non-finite logits or
scores, a task calling ``sys.exit``) is recorded with status ``error`` and the message, and the sweep goes
on. A metric the model cannot give (:class:`lctx.errors.MetricUnavailable`, :class:`lctx.tasks.Unavailable`) is
no failure: the sample is finished (status ok, resumed as any other) and its record names the metric and the reason
under ``unavailable`` instead of a value (:func:`_take_metrics`, :func:`_all_unavailable`). The run directory is
locked while a sweep writes it (:mod:`lctx.harness.run.rundir`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

import lctx
from lctx.defaults import ORDER, ORDERS
from lctx.kernels import impls_used, thread_settings
from lctx.tasks import TASKS, Task
from lctx.tasks.base import REASON_CHARS, Unavailable, unavailable_reason

from lctx.harness.run import distributed as D
from lctx.models.adapters import memory as P  # P.device_memory looked up when called (tests patch lctx.models.adapters.memory.device_memory)
from lctx.models.adapters.protocol import ModelAdapter, capabilities, checked, optional
from lctx.harness.run.console import SweepProgress, count
from lctx.errors import (ContractError, LctxError, MetricUnavailable, NonFiniteLogitsError, ServerReplyError,
                         ServerUnreachable)
from lctx.model_files import check_declared_max
from lctx.harness.run.rundir import (SALT, TASK_META, RecordWriter, atomic_write_json, declared_tasks, new_salt,
                                     read_json, run_dir_lock, sign_record)
from lctx.harness.run.tables import label_of, read_records, record_key, summarize, to_table, vet_records, write_tables


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


def model_inputs(lm: ModelAdapter) -> dict:
    """{"path", "fingerprint", "files": {name: sha256}} of ``lm``'s model by content: the adapter's own
    :meth:`~lctx.models.adapters.protocol.ModelAdapter.model_inputs` (hashed once per adapter), as run.json records
    it under ``inputs.models[name]``; with the adapter's ``"server"`` and ``"position"`` (its positional method:
    ``{"base", "method", "options", "layer_type", "effective"}``, docs/positions.md) when it gives them."""
    got = lm.model_inputs()
    out = {"path": got["path"], "fingerprint": got["fingerprint"], "files": dict(got.get("files") or {})}
    if isinstance(got.get("server"), dict):  # a served model: what the server says it is, the trust probe's findings
        out["server"] = got["server"]
    if isinstance(got.get("position"), dict):  # its positional method and what the model computes with
        out["position"] = got["position"]
    return out


def versions(lms: list | None = None) -> dict:
    """Versions of the code that computes a number: lctx's, then those each adapter of ``lms`` names in its
    :meth:`~lctx.models.adapters.protocol.ModelAdapter.settings` (the in-process adapter: torch, transformers)."""
    out = {"lctx": lctx.__version__}
    for lm in lms or []:
        out.update(lm.settings().get("versions") or {})
    return out


def sample_base(lm: ModelAdapter, task_name: str, task_version, task_options: dict, data_fp: str | None,
                seed: int, code_fp: str | None = None, chunked: bool = True, inputs: dict | None = None) -> dict:
    """The identity fields of a sample's record: everything that can change its numbers, and their hash.

    ``fingerprint`` = 16 hex digits of SHA-256 over: the model's content fingerprint
    (:meth:`~lctx.models.adapters.protocol.ModelAdapter.model_inputs`), the variant (an ``--attn-override``
    included), the task's name, version, options, data fingerprint and, for a task from a ``--task-file``, its
    source file's hash; the adapter's :meth:`~lctx.models.adapters.protocol.ModelAdapter.settings`: dtype,
    attention path (requested), prefill chunk size, device type; the seed; the versions (lctx's and the
    adapter's: torch and transformers for the in-process one). With model, task and the grid point it is the
    resume key (:data:`lctx.harness.run.tables.KEY`). The hashed fields are all in the returned dict (``code`` =
    the task file's 16-hex fingerprint, see :func:`task_inputs`), so
    ``digest_json({k: rec[k] for k in base if k not in ("model", "fingerprint")})`` recomputes it. ``chunked=False``
    for tasks that do not run through the adapter's chunked prefill (lm-eval's): the chunk size does not reach
    them and is left out. ``inputs``: the model's :func:`model_inputs` when the caller has them (a distributed
    run's rank 0 hashes, every rank gets its digests); default: asked of ``lm``.
    """
    from lctx.models.fingerprint import digest_json  # lazy: loads lctx.models (its kernels load triton)

    mi = inputs if inputs is not None else model_inputs(lm)
    st = lm.settings()
    vs = versions([lm])
    chunk = st.get("chunk_size")
    base = {"model": lm.name, "variant": lm.variant, "model_fingerprint": mi["fingerprint"],
            "data_fingerprint": data_fp, "dtype": st.get("dtype"), "attn_impl": st.get("attn_impl"),
            "chunk_size": int(chunk) if chunked and chunk is not None else None, "task": task_name, "seed": seed,
            "task_options": _jsonable(task_options), "versions": vs,
            "device_type": st.get("device_type"), "task_version": task_version, "code": code_fp}
    ident = dict(base)  # every field above but the model's name: a record holds them all, so its fingerprint
    ident.pop("model")  # can be recomputed from the record alone (docs/trust-and-resume.md#the-run-directory)
    base["fingerprint"] = digest_json(ident)
    return base


def _device_type(lm: ModelAdapter) -> str:
    """The adapter's ``device_type`` setting ("cpu", "cuda", ...; "" when it names none)."""
    return str(lm.settings().get("device_type") or "")


@dataclass
class RunSpec:
    """What to run. lengths/depths: grid values (tokens; fractions in [0, 1]); samples: per cell.
    skip_below: {(model name, task name): tokens}: that model's cells of that task shorter than this are not
    run (a relative sweep's lengths below the task's template, :func:`check_min_lengths` with ``drop=True``).
    order: the order samples are run in (:func:`order_cells`: ``cache``, ``grid`` or ``shuffle``)."""

    lengths: list[int]
    depths: list[float]
    samples: int
    seed: int = 0
    skip_below: dict = field(default_factory=dict)
    order: str = ORDER


def check_lengths(lm: ModelAdapter, lengths: list[int], allow_beyond_max: bool = False) -> None:
    """Refuse lengths above what a checkpoint declares it can address
    (:func:`lctx.harness.args.check_declared_max` with ``lm.max_length``).

    Raises:
        LctxError: a length exceeds ``lm.max_length`` (names the limit and the fix).
    """
    check_declared_max(lm.name, lm.max_length, lengths, allow_beyond_max,
                       source=capabilities(lm).max_length_source)  # where the adapter read it


def sample_cost(task: Task, lm: ModelAdapter, cell) -> float:
    """What one cell costs in prefill tokens (:meth:`lctx.tasks.Task.cost`, at least 1): the progress bar's
    weight. A cost hook that fails falls back to the cell's length; it never stops a run."""
    try:
        c = float(task.cost(lm, cell))
    except Exception:  # noqa: BLE001 - an estimate for the progress bar only
        c = float(cell.length)
    return c if math.isfinite(c) and c >= 1 else 1.0


def check_min_lengths(lms: list[ModelAdapter], tasks: list[Task], lengths: list[int],
                      drop: bool = False) -> tuple[dict, list[str]]:
    """Before the sweep: find every (model, task, length) whose length is shorter than the task's fixed
    template with that model's tokenizer (:meth:`lctx.tasks.Task.min_length`), so it fails now, once, instead
    of as error rows in the middle of the run. Each (model, task) is checked once.

    ``drop=False`` (lengths the user typed, ``--lengths``): any such length is refused. ``drop=True`` (a
    relative sweep, ``--relative``: lengths derived from each model's training length): the task is left out at
    those lengths only and runs at the rest; refused only where it fits at none. Returns (``skip_below``
    {(model name, task name): minimum} for :class:`RunSpec`, one note line per dropped (model, task)).

    Raises:
        LctxError: one or more lengths are too short (names each model, task, its minimum and the fix).
    """
    problems, skip, notes = [], {}, []
    for lm in lms:
        for task in tasks:
            need = int(task.min_length(lm))
            short = sorted({int(L) for L in lengths if L < need})
            if not short:
                continue
            rest = sorted({int(L) for L in lengths if L >= need})
            if drop and rest:
                skip[(lm.name, task.name)] = need
                notes.append(f"note: {task.name} needs at least {need} tokens with model {lm.name!r} (its template): "
                             f"not run at {', '.join(map(str, short))}; it runs at {', '.join(map(str, rest))}")
                continue
            problems.append(f"{task.name} needs at least {need} tokens with model {lm.name!r} (its template) "
                            f"but length{'s' if len(short) > 1 else ''} {', '.join(map(str, short))} "
                            f"{'are' if len(short) > 1 else 'is'} shorter")
    if problems:
        raise LctxError("; ".join(problems) + "; drop those lengths (--lengths / --relative) or that task")
    return skip, notes


#: ``--batch-size auto``: the most rows a batch may have on each device type (CPU: measured,
#: docs/kernels-and-bench.md#batches---batch-size)
AUTO_BATCH_CAP = {"cpu": 4, "cuda": 32}
#: ``--batch-size auto``: the share of the device's memory (``lctx plan``'s :func:`~lctx.models.adapters.memory.device_memory`)
#: a batch's prefill may plan to use beside the loaded weights
AUTO_BATCH_MEMORY_SHARE = 0.5


def auto_batch_size(lm: ModelAdapter, length: int) -> int:
    """The batch ``--batch-size auto`` uses for prompts of ``length`` tokens on ``lm``: the largest B up to
    :data:`AUTO_BATCH_CAP` of the device type whose planned prefill (the adapter's
    :meth:`~lctx.models.adapters.protocol.ModelAdapter.memory_plan` with ``batch=B``; the in-process adapter plans
    padded rows on the masked SDPA path that lctx models take for them; weights counted once) fits in
    :data:`AUTO_BATCH_MEMORY_SHARE` of its device's memory; at least 1. An adapter that cannot batch
    (``can_batch`` False, e.g. a model whose RoPE depends on the length) gets 1; one that plans no memory
    (``None``, a server) gets the cap."""
    cap = AUTO_BATCH_CAP.get(_device_type(lm), 1)
    if cap <= 1 or not lm.can_batch:
        return 1
    best, room = 1, None
    for b in range(2, cap + 1):
        try:
            plan = lm.memory_plan(length, batch=b)
        except LctxError:
            break
        if plan is None:
            return cap
        if room is None:
            room = P.device_memory(plan.device)[0] * AUTO_BATCH_MEMORY_SHARE
        if plan.total - plan.get("weights") > room:
            break
        best = b
    return best


def batches(work: list, batch_size: int | str, log=None) -> list[list]:
    """Group the work items ``(lm, task, cell, base)`` into batches: consecutive items of one model, one
    :attr:`~lctx.tasks.Task.batched` task and one length, at most ``batch_size`` each (``"auto"``:
    :func:`auto_batch_size` per model and length, told to ``log`` once per model and length, a line such as
    ``batch size (auto): 4 for pydoc-tiny-rope at 1024 tokens``); the consecutive items of one model and one
    :attr:`~lctx.tasks.Task.whole` task form one group whatever the batch size; everything else runs alone
    (batches of one). A model that runs requests at once (its ``concurrency`` capability, a served model's
    ``--concurrency``: :func:`lctx.models.adapters.protocol.capabilities`) batches that many whatever ``batch_size``.

    Raises:
        LctxError: ``batch_size`` is neither a positive integer nor ``"auto"``.
    """
    if batch_size != "auto" and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise LctxError(f"batch size {batch_size!r} is not a positive integer nor 'auto'; use e.g. 4")
    out: list[list] = []
    sizes: dict = {}
    caps: dict = {}  # id(lm) -> its Capabilities, read once
    for item in work:
        lm, task, cell, _ = item
        prev = out[-1] if out else None
        if task.whole:
            if prev is not None and prev[0][0] is lm and prev[0][1] is task:
                prev.append(item)
            else:
                out.append([item])
            continue
        if id(lm) not in caps:
            caps[id(lm)] = capabilities(lm)
        if not (task.batched and lm.can_batch):
            n = 1
        elif caps[id(lm)].concurrency is not None:  # a served model: its requests in flight (--concurrency)
            n = caps[id(lm)].concurrency
        elif batch_size == "auto":
            key = (id(lm), cell.length)
            if key not in sizes:
                sizes[key] = auto_batch_size(lm, cell.length)
                if log is not None:
                    log(f"batch size (auto): {sizes[key]} for {lm.name} at {cell.length} tokens (the most whose "
                        f"planned prefill fits half the {_device_type(lm)} memory, at most "
                        f"{AUTO_BATCH_CAP.get(_device_type(lm), 1)})")
            n = sizes[key]
        else:
            n = int(batch_size)
        if (n > 1 and prev is not None and len(prev) < n
                and prev[0][0] is lm and prev[0][1] is task and prev[0][2].length == cell.length):
            prev.append(item)
        else:
            out.append([item])
    return out


def run_sweep(lms: list[ModelAdapter], tasks: list[Task], spec: RunSpec, out_dir: Path, progress: bool = True,
              log=print, batch_size: int | str = 1, tables: bool = True, invocation: str | None = None) -> dict:
    """Run every (model, task, cell) not yet recorded in ``out_dir`` and write the tables (no figures: a caller that
    wants them draws them from the returned table, :func:`lctx.harness.outputs.plots.run_figures`).

    The run directory is locked for the duration (:func:`lctx.harness.run.rundir.run_dir_lock`: a second process
    on the same directory refuses). A sample is reused only when a record with the same key exists: same
    model name, task, grid point and fingerprint (:func:`sample_base`: checkpoint content, data content,
    options, versions). ``run.json`` maps each label this run ran (:data:`lctx.harness.run.tables.LABEL`) to its
    current fingerprint, so the tables show only the current inputs' records (:func:`lctx.harness.run.tables.to_table`),
    and each task's declared metadata (``task_meta``: :meth:`lctx.tasks.Task.declaration`), merged with what
    earlier runs into ``out_dir`` recorded, so the report and ``lctx compare`` need no task file.

    ``batch_size`` (``--batch-size``, an int or ``"auto"``): samples of one length of a
    :attr:`~lctx.tasks.Task.batched` task are prefilled and decoded together, that many at a time
    (:func:`batches`); their records are those of samples run alone (to floating-point rounding), each
    with ``batch_size`` = the rows it ran with and ``wall_s`` = the batch's time over its rows.

    Under ``torchrun`` / ``accelerate launch`` every rank calls this with the same arguments; each runs a
    deterministic share of the cells and rank 0 merges the records and writes the tables
    (:mod:`lctx.harness.run.distributed`); every rank gets the same return value (counts over all ranks).

    ``invocation``: the id of the entry of ``run.json``'s ``invocations`` this sweep adds to (one
    :func:`lctx.harness.evaluate.evaluate` call passes one id to all its sweeps); default a new one.

    An adapter that is not lctx's own runs in a :class:`~lctx.models.adapters.protocol.CheckedAdapter`: an output
    that breaks the protocol's contract (a greedy answer longer than asked for, a negative NLL, scores of the wrong
    shape) is that sample's error, naming the member and the contract; records and resume keys are the adapter's.

    ``tables=False`` leaves the tables to the caller (:func:`lctx.harness.evaluate.evaluate` writes them and the
    figures once, after all its sweeps, :func:`lctx.harness.outputs.plots.write_run_outputs`): ``records``,
    ``superseded``, ``table``, ``summary`` are then None.

    Returns {"records": n, "ran": n run now, "skipped": n already done, "errors": n errored now,
    "ok": n samples of this sweep with status ok (resumed + run), "superseded": records of older inputs left
    out of the tables, "table": DataFrame, "summary": DataFrame, "plots": [] (a run draws none)}.

    Raises:
        LctxError: another process holds the run directory; ``run.json`` or ``records.jsonl`` is damaged
            beyond skipping (not a regular file, not a JSON object); a file cannot be written (full disk,
            read-only): finished samples are kept and a rerun resumes.
    """
    out_dir = Path(out_dir)
    dinfo = D.init()
    lms = [checked(lm) for lm in lms]  # a user's adapter: its outputs checked against the contract as it runs

    with run_dir_lock(out_dir, dinfo):
        return _sweep(lms, tasks, spec, out_dir, progress, log, dinfo, batch_size, tables,
                      invocation or new_invocation())


def new_invocation() -> str:
    """A new invocation id: the UTC time to the microsecond and the process id (one ``lctx run`` = one id,
    shared by its sweeps: :func:`lctx.harness.evaluate.evaluate` passes it to each :func:`run_sweep`)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + f"-{os.getpid()}"



def _invocation(meta: dict, lms, tasks, spec: RunSpec, batch_size, dinfo, inv_id: str) -> str:
    """Add invocation ``inv_id`` (one ``lctx run`` may call several sweeps) to ``meta["invocations"]`` and
    return its id: ``{"id", "started", "argv", "git_rev", "models", "tasks", "lengths", "depths",
    "samples", "seed", "batch_size", "record_salt"}``, merged over the sweeps that share the id; the entries of
    earlier invocations into the same run directory are kept, so run.json describes every invocation (the
    top-level ``models``/``tasks``/``lengths`` are those of the last one). Each record's ``invocation`` names
    its entry and its ``digest`` is salted with the entry's ``record_salt`` (:func:`lctx.harness.run.rundir.sign_record`)."""
    inv_id = D.broadcast(inv_id)  # [distributed] rank 0's id on every rank
    salt = D.broadcast(new_salt())  # [distributed] rank 0's salt on every rank (a collective: every rank calls it)
    invs = [i for i in meta.get("invocations") or [] if isinstance(i, dict)] \
        if isinstance(meta.get("invocations"), list) else []
    if not invs and meta.get("run_id"):  # a directory written before invocations were recorded: keep what it said
        invs = [{"id": meta["run_id"], "models": meta.get("models"), "tasks": meta.get("tasks"),
                 "lengths": meta.get("lengths"), "depths": meta.get("depths"), "samples": meta.get("samples"),
                 "seed": meta.get("seed"), "git_rev": meta.get("git_rev"), "note": "recorded before invocations were"}]
    cur = next((i for i in invs if i.get("id") == inv_id), None)
    if cur is None:
        cur = {"id": inv_id, "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "argv": list(sys.argv), "git_rev": git_revision(), "models": [], "tasks": [], "lengths": [],
               "depths": [], "samples": spec.samples, "seed": spec.seed, "batch_size": batch_size, SALT: salt}
        invs.append(cur)
    cur.setdefault(SALT, salt)

    def union(key, new):
        cur[key] = list(dict.fromkeys(list(cur.get(key) or []) + list(new)))

    union("models", [lm.path for lm in lms])
    union("tasks", [t.name for t in tasks])
    union("lengths", spec.lengths or [])
    union("depths", spec.depths or [])
    if dinfo.distributed:
        cur["world_size"] = dinfo.world_size
    meta["invocations"] = invs
    return inv_id


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr)


_NAMED: dict[str, set[str]] = {}  # invocation id -> the warnings about its run directory's records already printed


def _warn_once(invocation: str):
    """A ``report`` for the run directory's records that prints each warning once per invocation: one
    ``lctx run`` may call several sweeps (``--window``, ``--relative``), each reading the same records."""
    seen = _NAMED.setdefault(invocation, set())

    def report(msg: str) -> None:
        if msg not in seen:
            seen.add(msg)
            _warn(msg)
    return report


def _check_model_names(lms, models: dict, old_meta: dict, out_dir: Path) -> None:
    """Refuse two different checkpoints under one model name in a run directory: the tables keep one model per
    name (its current inputs; older ones are "earlier inputs"), so a second folder called ``tiny`` would hide the
    first one's results. The same name is fine for the same path (retrained: its new weights replace the old) and
    for the same content at another path (a copy).

    Raises:
        LctxError: two ``--model`` of this call, or one of them and one already in ``run.json``, share a name but
            neither path nor content.
    """
    seen: dict = {}
    known = ((old_meta.get("inputs") or {}).get("models") or {}) if isinstance(old_meta.get("inputs"), dict) else {}
    for lm in lms:
        mine = models[lm.name]
        other = seen.get(lm.name)
        if other is not None and other.get("path") != _where(lm):
            raise LctxError(f"--model {lm.path!r} and --model {other['given']!r} are both named {lm.name!r}; the tables "
                            "keep one model per name: give the folders different names (e.g. a symlink) or run them "
                            "into different --out directories")
        seen[lm.name] = {"path": _where(lm), "given": lm.path}
        old = known.get(lm.name) if isinstance(known.get(lm.name), dict) else None
        if old and old.get("path") not in (None, mine.get("path")) and old.get("fingerprint") != mine.get("fingerprint"):
            raise LctxError(f"run directory {str(out_dir)!r} already holds a model named {lm.name!r} from "
                            f"{old['path']!r}, other weights than --model {lm.path!r}; the tables keep one model per "
                            "name: pass another --out, or give the folder another name (e.g. a symlink)")


def _where(lm: ModelAdapter) -> str:
    """Where ``lm`` comes from, to tell two models apart: its ``path`` resolved when it is a local file or folder
    (a checkpoint), else as given (a URL)."""
    p = Path(str(lm.path))
    return str(p.resolve()) if p.exists() else str(lm.path)


def _sweep(lms, tasks, spec, out_dir: Path, progress, log, dinfo, batch_size=1, tables: bool = True,
           invocation: str | None = None) -> dict:
    """:func:`run_sweep` with the run directory locked: record this sweep in ``run.json`` (:func:`_run_meta`), list
    the samples not yet recorded (:func:`_work`), run them (:func:`_run_work`) and count and tabulate the records
    (:func:`_sweep_result`). Returns :func:`run_sweep`'s dict."""
    # [distributed] under torchrun / accelerate launch each rank runs a share and appends to its own
    # records.rank{r}.jsonl; rank 0 merges them into records.jsonl (harness/run/distributed.py)
    meta_path = out_dir / "run.json"
    old_meta = read_json(meta_path, f"{meta_path}") or {}
    run_id = _run_id(old_meta)
    inputs = _hashed_inputs(lms, tasks, dinfo)
    _check_model_names(lms, inputs["models"], old_meta, out_dir)
    bases = _sample_bases(lms, tasks, inputs, spec.seed)
    meta, invocation = _run_meta(old_meta, run_id, lms, tasks, spec, batch_size, dinfo, inputs, bases,
                                 invocation or new_invocation())
    if dinfo.is_main:  # [distributed]
        atomic_write_json(meta_path, meta, str(meta_path))

    done = _done_keys(out_dir, meta, invocation, dinfo)
    work, n_cells = _work(lms, tasks, spec, bases, done)
    n_total = len(work)
    skipped = n_cells - n_total
    if skipped and dinfo.is_main:
        log(f"resuming {out_dir}: {count(skipped, 'sample')} already recorded, {n_total} to run")
    if dinfo.distributed:  # [distributed] a deterministic share, balanced by length in tokens
        D.check_same_work([record_key(w[3]) for w in work])
        work = D.shard(work, dinfo, cost=lambda w: w[2].length)

    stamp = dict(run_id=run_id, invocation=invocation, lctx_version=lctx.__version__, git_rev=meta["git_rev"])
    salt = next(i[SALT] for i in meta["invocations"] if i.get("id") == invocation)
    errors = _run_work(work, spec, out_dir, dinfo, batch_size, progress=progress, log=log, kept=skipped, stamp=stamp,
                       salt=salt)
    return _sweep_result(out_dir, meta, tasks, dinfo, tables, errors=errors, n_total=n_total, skipped=skipped)


def _run_id(old_meta: dict) -> str:
    """The run directory's id: the one ``run.json`` holds, else a new one (UTC time and process id); rank 0's on
    every rank."""
    run_id = old_meta.get("run_id") if isinstance(old_meta.get("run_id"), str) else None
    run_id = run_id or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    return D.broadcast(run_id)  # [distributed] rank 0's id on every rank


def _hashed_inputs(lms, tasks, dinfo) -> dict:
    """Every input that can change a number, hashed: {"models": {name: :func:`model_inputs`}, "data": {task key:
    data fingerprint}, "tasks": {task key: :func:`task_inputs`}} (rank 0 reads the files, every rank gets the
    digests)."""
    inputs = None
    if dinfo.is_main:
        inputs = {"models": {lm.name: model_inputs(lm) for lm in lms},
                  "data": {t.key: t.data_fingerprint() for t in tasks},
                  "tasks": {t.key: task_inputs(t) for t in tasks}}
    return D.broadcast(inputs)


def _sample_bases(lms, tasks, inputs: dict, seed: int) -> dict:
    """{(model name, task key): :func:`sample_base`}: the identity fields every sample of that pair shares."""
    bases = {}
    for lm in lms:
        for task in tasks:
            code = (inputs["tasks"][task.key]["code"] or {}).get("fingerprint")
            bases[(lm.name, task.key)] = sample_base(lm, task.name, getattr(task, "version", 1), task.options,
                                                     inputs["data"][task.key], seed, code,
                                                     chunked=task.chunked, inputs=inputs["models"][lm.name])
    return bases


def _setting(lm: ModelAdapter, key: str):
    """``lm.settings()[key]`` as the records write it (None when the adapter does not say)."""
    st = lm.settings() if callable(getattr(lm, "settings", None)) else {}
    return (st or {}).get(key)


def _run_meta(old_meta: dict, run_id: str, lms, tasks, spec: RunSpec, batch_size, dinfo, inputs: dict, bases: dict,
              invocation: str) -> tuple[dict, str]:
    """The new ``run.json`` of this sweep: ``old_meta`` with this invocation added (:func:`_invocation`), this
    sweep's settings and versions, each task's own fields (:meth:`lctx.tasks.Task.run_json`), and merged with what
    earlier runs recorded: the current fingerprint of each label, the models' declared maximum lengths and the dtype
    each ran in (``dtype``: {model: "float32"}), the tasks'
    declarations and the inputs. Returns (meta, the invocation id)."""
    meta = dict(old_meta)
    invocation = _invocation(meta, lms, tasks, spec, batch_size, dinfo, invocation)
    meta.update({"run_id": run_id, "lctx_version": lctx.__version__, "git_rev": git_revision(),
                 "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
                 "models": [lm.path for lm in lms], "tasks": list(dict.fromkeys(t.name for t in tasks)),
                 "lengths": spec.lengths, "depths": spec.depths, "samples": spec.samples, "seed": spec.seed,
                 "versions": versions(lms), **thread_settings(), "batch_size": batch_size})
    for t in tasks:
        meta.update(t.run_json())  # e.g. lm-eval's version and data source
    current = dict(old_meta.get("current") or {}) if isinstance(old_meta.get("current"), dict) else {}
    current.update({label_of(b): b["fingerprint"] for b in bases.values()})
    meta["current"] = current
    old_max = meta.get("max_positions") if isinstance(meta.get("max_positions"), dict) else {}
    meta["max_positions"] = {**old_max, **{lm.name: lm.max_length for lm in lms if lm.max_length}}  # the declared limit
    old_dtype = meta.get("dtype") if isinstance(meta.get("dtype"), dict) else {}
    meta["dtype"] = {**old_dtype, **{lm.name: _setting(lm, "dtype") for lm in lms}}  # the weights' dtype that ran
    # what each task declares about its numbers (headline, directions, retrieval): report, compare and flatness
    # read it from here, so a --task-file task needs no task file afterwards
    meta[TASK_META] = {**declared_tasks(old_meta), **{t.name: t.declaration() for t in tasks}}
    known = meta.get("inputs") if isinstance(meta.get("inputs"), dict) else {}
    meta["inputs"] = {"models": {**(known.get("models") or {}), **inputs["models"]},
                      "data": {**(known.get("data") or {}), **{k: v for k, v in inputs["data"].items() if v}},
                      "tasks": {**(known.get("tasks") if isinstance(known.get("tasks"), dict) else {}),
                                **inputs["tasks"]}}
    if dinfo.distributed:
        meta["world_size"] = dinfo.world_size
    return meta, invocation


def _done_keys(out_dir: Path, meta: dict, invocation: str, dinfo) -> set:
    """The record keys (:func:`lctx.harness.run.tables.record_key`) of the samples already recorded with status ok.

    [distributed] all record files are read (rank files of an interrupted sharded run too); the barrier keeps every
    rank from writing before all have read, so all build the same work list. Records that run.json does not vouch
    for (an unknown invocation, a digest that does not match, a model the run does not hold, a second finished record
    of a key) are named once here (the main rank, once per invocation) and never count as done."""
    report = _warn_once(invocation) if dinfo.is_main else None
    done = {record_key(r) for r in vet_records(D.read_all_records(out_dir, report=report), meta, report,
                                               str(out_dir / D.RECORDS))
            if r.get("status") == "ok"}
    D.barrier()
    return done


def order_cells(cells: list, order: str = ORDER, seed: int = 0) -> list:
    """``cells`` (one task's grid, :meth:`lctx.tasks.Task.cells`) in the order they run.

    ``cache`` (the default): per length, the deepest needle first, the sample seeds of one depth together. The
    samples of one length share their haystack up to the first needle (passkey's filler; every RULER essay sample
    at one length starts at the same essay), so each prompt after the first repeats the one before up to its own
    needle (same depth) or its own shallower needle: a server's prefix cache (vLLM, llama-server) reuses all of it. ``grid``: lengths x depths x samples (:meth:`~lctx.tasks.Task.cells`).
    ``shuffle``: a permutation seeded by ``seed`` (the control for a measurement of the saving). The scores do not
    depend on the order (tests/test_server_vllm.py); only the time does.

    Raises:
        LctxError: an order not in :data:`lctx.defaults.ORDERS`."""
    if order not in ORDERS:
        raise LctxError(f"--order {order!r} is not one of {', '.join(ORDERS)}; use --order cache (the default)")
    cells = list(cells)
    if order == "grid":
        return cells
    if order == "shuffle":
        import random  # the standard library's seeded permutation

        random.Random(seed).shuffle(cells)
        return cells
    return sorted(cells, key=lambda c: (c.length if c.length is not None else -1,
                                        -(c.depth if c.depth is not None else 0.0), c.sample))


def _work(lms, tasks, spec: RunSpec, bases: dict, done: set) -> tuple[list, int]:
    """The samples to run, in order: [(model, task, cell, its record's identity fields)] for every cell of every
    (model, task) not in ``done`` and not below the task's shortest length (``spec.skip_below``: a relative sweep).
    Returns (that list, the number of cells counted, done ones included)."""
    work, n_cells = [], 0
    for lm in lms:
        for task in tasks:
            below = spec.skip_below.get((lm.name, task.name), 0)
            for cell in order_cells(task.cells(spec.lengths, spec.depths, spec.samples), spec.order, spec.seed):
                if cell.length is not None and cell.length < below:
                    continue  # shorter than the task's template: left out of this (relative) sweep
                n_cells += 1
                base = dict(bases[(lm.name, task.key)], length=cell.length, depth=cell.depth, sample=cell.sample)
                if record_key(base) in done:
                    continue
                work.append((lm, task, cell, base))
    return work, n_cells


def _run_work(work: list, spec: RunSpec, out_dir: Path, dinfo, batch_size, *, progress: bool, log, kept: int,
              stamp: dict, salt: str) -> int:
    """Run ``work`` (this rank's samples) in groups (:func:`batches`) under a progress bar weighted by prefill tokens
    (:func:`sample_cost`), each record stamped with ``stamp`` (run id, invocation, versions), signed with ``salt``
    and appended to this rank's records file (``kept``: records already there). Returns the records that errored."""
    rec_path = D.rank_records_path(out_dir, dinfo)
    costs = [sample_cost(task, lm, cell) for lm, task, cell, _ in work]  # prefill tokens: the bar's weights
    groups = batches(work, batch_size, log=log if dinfo.is_main else None)  # before the bar: its lines stay whole
    errors = 0
    if not work:
        return errors
    with RecordWriter(rec_path, kept=kept) as writer, \
            SweepProgress(costs, enabled=progress and dinfo.is_main,  # [distributed]
                          desc="lctx run" + (f" (rank 0 of {dinfo.world_size})" if dinfo.distributed else "")) as bar:
        cost_of = {id(w): c for w, c in zip(work, costs)}
        for group in groups:
            for rec in _run_group(group, bar, spec.seed, out_dir, dinfo, log):
                rec.update(**stamp)
                errors += rec["status"] != "ok"
                writer.write(sign_record(rec, salt))
            bar.done(sum(cost_of[id(w)] for w in group))
    return errors


def _run_group(group: list, bar, seed: int, out_dir: Path, dinfo, log) -> list[dict]:
    """The records of one group of :func:`batches` (its bar step started here): a whole-run task's samples together
    (:func:`_run_whole`), a batch of one length (:func:`_run_batch`) or one sample (:func:`_run_one`)."""
    lm, task, cell, base = group[0]
    if task.whole:
        bar.start(f"{lm.name} {task.key} ({count(len(group), 'sample')})", n=len(group))
        return _run_whole(lm, task, [(c, b) for _, _, c, b in group], log,
                          state_root=out_dir / PARTIAL_DIR, rank=dinfo.rank if dinfo.distributed else None)
    bar.start(f"{lm.name} {task.name} L={cell.length}"
              + (f" d={cell.depth:g}" if cell.depth is not None else "")
              + (f" (batch of {len(group)})" if len(group) > 1 else ""), n=len(group))
    return (_run_batch(lm, task, [(c, b) for _, _, c, b in group], seed) if len(group) > 1
            else [_run_one(lm, task, cell, base, seed)])


def _sweep_result(out_dir: Path, meta: dict, tasks, dinfo, tables: bool, *, errors: int, n_total: int,
                  skipped: int) -> dict:
    """:func:`run_sweep`'s dict once this rank's samples ran (``errors`` of ``n_total`` run; ``skipped`` resumed).

    [distributed] rank 0 merges the rank files and writes the tables once (unless ``tables`` is False); the other
    ranks wait for that, then build the same tables in memory (nothing written); ran/errors are summed over ranks."""
    metrics_of = {t.name: t.metrics for t in tasks}
    current = meta["current"]
    errors = sum(D.gather(errors))
    D.barrier()
    if dinfo.is_main:
        records = vet_records(D.merge_records(out_dir), meta)  # named above, when the sweep started
    if not tables:
        D.barrier()
        return {"records": None, "ran": n_total, "skipped": skipped, "errors": errors,
                "ok": skipped + n_total - errors, "superseded": None, "table": None, "summary": None, "plots": []}
    if dinfo.is_main:
        table, summary = write_tables(records, out_dir, metrics_of, current)
    D.barrier()
    if not dinfo.is_main:
        records = vet_records(read_records(out_dir / D.RECORDS), meta)
        table = to_table(records, metrics_of, current)
        summary = summarize(table)
    return {"records": len(records), "ran": n_total, "skipped": skipped, "errors": errors,
            "ok": skipped + n_total - errors, "superseded": int(table.attrs.get("superseded", 0)),
            "table": table, "summary": summary, "plots": []}


def task_code_file(task: Task) -> str | None:
    """The source file of the task registered under ``task.name`` when it is defined outside lctx (a
    ``--task-file`` or a plug-in), whose code changes its numbers; ``None`` for lctx's own tasks (covered by
    the lctx version and the task's ``version``) and for a class whose file cannot be found."""
    cls = TASKS.get(task.name, type(task))
    if cls.__module__.startswith("lctx."):
        return None
    try:
        src = inspect.getsourcefile(cls)
    except (TypeError, OSError):
        src = None
    return os.path.abspath(src) if src and os.path.isfile(src) else None


def task_code_fingerprint(task: Task) -> str | None:
    """SHA-256 (16 hex digits) of :func:`task_code_file` as ``digest_files({file name: path})``, i.e. the
    canonical JSON ``{name: sha256}`` hashed (``run.json``'s ``inputs.tasks`` records the path and SHA-256);
    ``None`` for lctx's own tasks."""
    src = task_code_file(task)
    if src is None:
        return None
    from lctx.models.fingerprint import digest_files  # lazy: loads lctx.models (its kernels load triton)

    return digest_files({Path(src).name: src})


def task_inputs(task: Task) -> dict:
    """What ``run.json`` records of a task under ``inputs.tasks[key]``: ``version`` (hashed into every
    record's fingerprint), ``data_fingerprint``, and for a task defined outside lctx its code as ``{"path",
    "sha256" (of the file), "fingerprint" (the 16 hex digits hashed into the records)}``; with the record's
    own fields and the model's ``files`` this is enough to recompute a record's ``fingerprint``."""
    src = task_code_file(task)
    code = None
    if src is not None:
        from lctx.models.fingerprint import digest_json, file_digest  # lazy: loads lctx.models

        sha = file_digest(src)
        code = {"path": src, "sha256": sha, "fingerprint": digest_json({Path(src).name: sha})}
    return {"name": task.name, "version": getattr(task, "version", 1), "code": code}


def _new_record(lm: ModelAdapter, base: dict) -> dict:
    """A sample's record before it runs: ``base`` (:func:`sample_base`) with the adapter's variant, ``device`` and
    ``dtype`` (:meth:`~lctx.models.adapters.protocol.ModelAdapter.settings`), training length, and this
    process's torch threads."""
    st = lm.settings()
    return dict(base, variant=lm.variant, device=st.get("device"), dtype=st.get("dtype"),
                train_length=lm.train_length, n_tokens=None, depth_actual=None, prompt_sha256=None, metrics={},
                status="ok", error="", batch_size=1, threads=torch.get_num_threads())


def _record_error(rec: dict, e: BaseException) -> None:
    """Put the one-line message of ``e`` (a failed build or score) on ``rec`` as status ``error``."""
    if isinstance(e, torch.OutOfMemoryError):
        rec["status"], rec["error"] = "error", f"out of memory: {str(e).splitlines()[0][:300]}"
    elif isinstance(e, NonFiniteLogitsError):
        rec["status"], rec["error"] = "error", f"non-finite logits: {e}"
    elif isinstance(e, SystemExit):  # a task's own code called sys.exit(): a broken sample, not the end of the run
        rec["status"], rec["error"] = "error", f"the task called sys.exit({e.code!r}) while building or scoring"
    elif isinstance(e, (ContractError, ServerReplyError)):  # it names the member, task or server: no location
        rec["status"], rec["error"] = "error", str(e)[:400]
    else:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
        rec["status"], rec["error"] = "error", f"{type(e).__name__}: {str(e)[:300]}{where}"


def prompt_digest(ids) -> str:
    """The first 16 hex digits of the SHA-256 of a prompt's token ids (each as a little-endian int64): recorded
    per sample (``prompt_sha256``) so that two samples that share a prompt, which prefix caching or memorisation
    would reward, can be seen in the records. None for a prompt without ids."""
    if ids is None:
        return None
    return hashlib.sha256(b"".join(int(t).to_bytes(8, "little", signed=True) for t in ids)).hexdigest()[:16]


def _build(task: Task, lm: ModelAdapter, cell, seed: int, rec: dict):
    """Build the sample of ``cell`` and note its size (``n_tokens``, ``depth_actual``) and its prompt's digest
    (:func:`prompt_digest`) on ``rec``. Raises what the task raises, or ValueError for a sample longer than the
    cell."""
    sample = task.build(lm, cell, seed)
    rec["n_tokens"], rec["depth_actual"] = sample.n_tokens, sample.depth
    rec["prompt_sha256"] = prompt_digest(sample.input_ids)
    if sample.n_tokens > cell.length:
        raise ValueError(f"task built {sample.n_tokens} tokens for a length of {cell.length}")
    return sample


def _take_metrics(rec: dict, task: Task, sample, got: dict) -> None:
    """Check and store a sample's metrics on ``rec`` (:class:`lctx.errors.ContractError` for a value that is not a
    dict of numbers, naming the task and the contract; ValueError for a missing metric; non-finite values make the
    record an error). A value the model cannot give (:class:`lctx.tasks.Unavailable`) goes to the record's
    ``unavailable`` {metric: reason}, not to ``metrics``: it is no number, never 0."""
    contract = f"{{metric: number}} for each of its metrics {list(task.metrics)} (docs/custom-tasks.md)"
    if not isinstance(got, dict):
        what = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
        raise ContractError(f"task {task.name!r} scored a sample as {what} ({type(got).__name__}), not {contract}")
    metrics, unavailable = {}, {}
    for k, v in got.items():
        if isinstance(v, Unavailable):
            unavailable[str(k)] = " ".join(str(v.reason).split())[:REASON_CHARS] or "unavailable"
            continue
        try:
            metrics[k] = float(v)
        except (TypeError, ValueError):
            raise ContractError(f"task {task.name!r} scored metric {k!r} as {v!r:.60} ({type(v).__name__}), not a "
                             f"number: it must return {contract}") from None
    missing = [m for m in task.metrics if m not in metrics and m not in unavailable]
    if missing:
        raise ValueError(f"task {task.name!r} returned no value for {missing}")
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    rec["metrics"] = metrics
    if unavailable:
        rec["unavailable"] = unavailable
    rec["extra"] = task.record_extra(sample)
    if bad:
        rec["status"], rec["error"] = "error", f"non-finite {', '.join(bad)} (NaN/inf logits?)"


def _adapter_notes(rec: dict, lm: ModelAdapter, sample) -> None:
    """Add to ``rec["extra"]`` what the adapter noted of the sample (an optional member, ``lm.sample_notes(ids)``:
    a served model's thinking that never closed, scored as an empty answer: ``{"think_unclosed": why}``)."""
    take = optional(lm, "sample_notes")
    notes = take(sample.input_ids) if take is not None and getattr(sample, "input_ids", None) is not None else None
    if notes:
        rec.setdefault("extra", {}).update(notes)


def _all_unavailable(rec: dict, task: Task, e: MetricUnavailable) -> None:
    """Every metric of the sample unavailable, with ``e``'s reason: what a :class:`lctx.errors.MetricUnavailable`
    that a task's build or score lets out means (ppl, whose every metric needs the model's log-probabilities; a task
    that does not use :func:`lctx.tasks.optional_metrics`). The sample is finished (status ok, resumed as any
    other); its record keeps no value and no ``extra`` (the scorer did not finish)."""
    reason = unavailable_reason(e)
    rec.update(metrics={}, unavailable={str(m): reason for m in task.metrics}, extra={}, status="ok", error="")


def _start(lm: ModelAdapter) -> tuple[float, float]:
    """Before a sample (or a batch, a whole task): reset the adapter's peak-memory counter and the kernel log;
    returns the start times (``time.perf_counter``, and ``time.process_time``: this process's CPU seconds, every
    thread's)."""
    lm.reset_peak_memory()
    impls_used(reset=True)
    return time.perf_counter(), time.process_time()


def _finish(recs: list[dict], lm: ModelAdapter, t0: tuple[float, float]) -> None:
    """Kernels that ran, time (the group's, shared equally by its rows: ``wall_s``, and ``cpu_s``, this process's
    CPU seconds over all its threads, so a sample's cost can be read apart from the machine's load), peak memory
    (the adapter's :meth:`~lctx.models.adapters.protocol.ModelAdapter.peak_memory_bytes`; None where it cannot
    tell) and timestamp."""
    used = sorted(set(impls_used().values()))
    wall = (time.perf_counter() - t0[0]) / max(len(recs), 1)
    cpu = (time.process_time() - t0[1]) / max(len(recs), 1)
    peak = lm.peak_memory_bytes()
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for rec in recs:
        if used:  # the fast path says which kernel ran (triton / flex / chunked ...)
            rec["attn_kernel"] = "+".join(used)
        rec["wall_s"], rec["cpu_s"], rec["peak_mem_bytes"], rec["timestamp"] = wall, cpu, peak, stamp


def _run_one(lm: ModelAdapter, task: Task, cell, base: dict, seed: int) -> dict:
    """Build and score one sample; never raises (failures become status='error' records)."""
    rec = _new_record(lm, base)
    t0 = _start(lm)
    try:
        sample = _build(task, lm, cell, seed, rec)
        _take_metrics(rec, task, sample, task.score(lm, sample))
        _adapter_notes(rec, lm, sample)
    except MetricUnavailable as e:  # the model cannot give this task's metrics: finished, not failed
        _all_unavailable(rec, task, e)
    except ServerUnreachable:  # the server stopped answering: end the run (what finished is recorded; rerun resumes)
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - one bad sample must not end the sweep
        _record_error(rec, e)
    _finish([rec], lm, t0)
    return rec


def _run_batch(lm: ModelAdapter, task: Task, items: list[tuple], seed: int) -> list[dict]:
    """Build the samples of ``items`` ([(cell, base)], one length, a batched task) and score them together
    (:meth:`lctx.tasks.Task.score_batch`: one padded prefill, one batched greedy decode). A sample that fails
    to build or score is that sample's error record; when the batched prefill or decode itself fails (out of
    memory, non-finite logits, ...) every sample is run again alone, so a batch never turns a sample that
    runs alone into an error. Never raises."""
    recs = [_new_record(lm, base) for _, base in items]
    t0 = _start(lm)
    built = []
    for (cell, _), rec in zip(items, recs):
        try:
            built.append((rec, _build(task, lm, cell, seed, rec)))
        except MetricUnavailable as e:
            _all_unavailable(rec, task, e)
        except ServerUnreachable:  # the server stopped answering: end the run
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001
            _record_error(rec, e)
    if len(built) > 1:
        try:
            results = task.score_batch(lm, [smp for _, smp in built])
        except ServerUnreachable:  # the server stopped answering: end the run
            raise
        except (Exception, SystemExit):  # noqa: BLE001 - the batch failed as a whole: run its samples alone
            lm.free_memory()
            return [_run_one(lm, task, cell, base, seed) for cell, base in items]
    else:
        results = [None] * len(built)
    for (rec, smp), got in zip(built, results):
        try:
            rec["batch_size"] = len(built)
            if got is None:  # a lone survivor of the build
                got = task.score(lm, smp)
            if isinstance(got, BaseException):
                raise got
            _take_metrics(rec, task, smp, got)
            _adapter_notes(rec, lm, smp)
        except MetricUnavailable as e:
            _all_unavailable(rec, task, e)
        except ServerUnreachable:  # the server stopped answering: end the run
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001
            _record_error(rec, e)
    _finish(recs, lm, t0)
    return recs


#: the run directory's folder of partial work of :attr:`~lctx.tasks.Task.whole` tasks (lm-eval's request cache):
#: ``partial/<fingerprint>[-rank<r>]/``, one folder per model and inputs (:attr:`~lctx.tasks.Task.state_dir`)
PARTIAL_DIR = "partial"


def _run_whole(lm: ModelAdapter, task: Task, items: list[tuple], log=print, state_root: Path | None = None,
               rank: int | None = None) -> list[dict]:
    """Score the cells of ``items`` ([(cell, base)], one model, a :attr:`~lctx.tasks.Task.whole` task) in one
    :meth:`~lctx.tasks.Task.score_all` call and build their records as :func:`_run_one` does (time shared
    equally). A failure of the call makes every cell an error record (the message logged once); a
    :class:`lctx.errors.MetricUnavailable` makes every metric of every cell unavailable.

    ``state_root`` (the run directory's ``partial/``): during the call the task's
    :attr:`~lctx.tasks.Task.state_dir` is ``state_root/<fingerprint>`` (``-rank<r>`` under a distributed
    launch, so that ranks never share a file), the fingerprint of the items' records: partial work kept
    there is never reused for another checkpoint, option, data file or version. None: no state folder.

    Raises:
        LctxError: what ``score_all`` raises for a user mistake (e.g. a chat template the tokenizer lacks).
    """
    recs = [dict(_new_record(lm, base), batch_size=None) for _, base in items]  # the task groups its own requests
    t0 = _start(lm)
    if state_root is not None:
        task.state_dir = Path(state_root) / (items[0][1]["fingerprint"] + (f"-rank{rank}" if rank is not None else ""))
    try:
        got = task.score_all(lm, [cell for cell, _ in items])
        if len(got) != len(items):
            raise ValueError(f"task {task.name!r} scored {len(got)} of {len(items)} cells")
        for rec, (sample, metrics) in zip(recs, got):
            rec["n_tokens"], rec["depth_actual"] = sample.n_tokens, sample.depth
            _take_metrics(rec, task, sample, metrics)
    except MetricUnavailable as e:  # before LctxError (its base): the model cannot give these metrics, no user mistake
        for rec in recs:
            rec.update(n_tokens=None)
            _all_unavailable(rec, task, e)
    except (KeyboardInterrupt, LctxError):
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001 - one failing task must not end the run
        for rec in recs:
            rec.update(n_tokens=None, metrics={}, extra={})
            _record_error(rec, e)
        log(f"failed: {lm.name} {task.key}: {recs[0]['error']}")
    finally:
        task.state_dir = None
    _finish(recs, lm, t0)
    return recs


def _jsonable(x):
    return json.loads(json.dumps(x, default=str))
