"""Records -> tidy results table -> summary. Pandas does the work; Parquet via pyarrow, CSV via pandas.

A *record* is one finished sample (one JSON line of ``records.jsonl``) carrying a ``metrics`` dict, and an
``unavailable`` dict {metric: reason} of the metrics the model could not give (a server without prompt
log-probabilities: :class:`lctx.errors.MetricUnavailable`). The *results table* is long and tidy: one row per
(run, model, variant, task, metric, length, depth, sample) with the value and the run metadata; an unavailable
metric's row has no value, status ``unavailable`` and the reason. The *summary* aggregates it to mean, standard
error and n per cell, over the values there are (an unavailable one counts in ``n_unavailable``, never as 0).

Which records are tabulated (never a mean over different inputs):

- A record's ``fingerprint`` (:func:`lctx.harness.run.runner.sample_fingerprint`) hashes *every* input that can
  change its numbers: the checkpoint's content, the task's data content, the task's name, version and
  options, dtype, attention path, chunk size, device type, seed and the lctx/torch/transformers versions.
  The resume key (:data:`KEY`) is (model, task, fingerprint, task options, length, depth, sample).
- Its *label* (:data:`LABEL`) is what the user chose: model name, variant, task, task options, dtype,
  attention path and seed. Records of different labels are different experiments and get separate cells,
  each carrying its options (e.g. ``ppl`` with ``--stride 1`` beside the default stride).
- Within one label only one fingerprint is tabulated: the current inputs (``run.json``'s ``current`` map,
  written by each run for the labels it ran; for a label no run has mapped, the fingerprint of its last
  record). Records of older inputs (weights retrained, data edited, another chunk size or library
  version) stay in ``records.jsonl`` but are left out of ``results.parquet``/``summary.csv``.

What the tables hold of outside text (a served model id, a server's error, a reason): every string is
redacted (:func:`clean_frame`: the API key and credential patterns) in ``results.parquet`` and in the tables returned;
``results.csv`` and ``summary.csv`` also have their control characters escaped (``\\x1b``), so a spreadsheet or a
``cat`` of them drives no terminal. A warning line quotes outside text capped (:func:`lctx.outside.quote`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from lctx.errors import LctxError
from lctx.harness.run.console import count, print_table, say
from lctx.harness.run.intervals import interval, is_binary
from lctx.metrics import bounds_of, may_be_proportion
from lctx.outside import clean, printable, quote, redact, safe

from lctx.harness.run.rundir import DIGEST, SALT, atomic_write, check_regular, read_json, read_records as _read, record_digest

COLUMNS = ["run_id", "model", "variant", "task", "metric", "length", "n_tokens", "depth", "depth_actual",
           "depth_off", "sample", "value", "seed", "status", "error", "reason", "wall_s", "cpu_s", "peak_mem_bytes", "prompt_sha256", "device",
           "dtype", "attn_impl", "attn_kernel", "chunk_size", "batch_size", "threads", "lctx_version", "git_rev",
           "torch_version", "transformers_version", "timestamp", "train_length", "task_options", "fingerprint",
           "model_fingerprint", "data_fingerprint", "task_version", "code_fingerprint"]
# a sample's identity across reruns: the fingerprint covers every input besides the grid point (task_options
# too; it is repeated so that records without a fingerprint, derived flatness rows, stay apart)
KEY = ["model", "task", "fingerprint", "task_options", "length", "depth", "sample"]
# what the user chose; records of different labels are separate cells of the tables
LABEL = ["model", "variant", "task", "task_options", "dtype", "attn_impl", "seed"]
SUMMARY_KEYS = ["model", "variant", "task", "metric", "length", "depth", "task_options", "dtype", "attn_impl",
                "seed"]
SUMMARY_COLUMNS = SUMMARY_KEYS + ["mean", "stderr", "n", "ci_low", "ci_high", "interval", "n_error", "n_unavailable",
                                  "n_depth_off", "fingerprint", "unavailable"]
#: a row's ``status`` for a metric the model could not give (the record's ``unavailable``; its ``reason`` column
#: says why): no value, no failure, left out of every mean
UNAVAILABLE = "unavailable"
#: option keys that name a sub-task pooled into its task's cell: an MMLU question's ``subject`` (the summary
#: pools the subjects into MMLU's accuracy, as lm-eval reports it; mmlu_subjects.csv has them apart); the cell is
#: named as the task declares (:func:`lctx.tasks.pooled_label`)
POOLED_OPTIONS = ("subject",)
#: a sample whose needle sits farther than this from the requested depth (fraction of the prompt) is
#: flagged in the ``depth_off`` column and on the heatmaps
DEPTH_TOLERANCE = 0.05


def read_records(path: Path, report=None) -> list[dict]:
    """The valid records of a ``records.jsonl`` (see :func:`lctx.harness.run.rundir.read_records`: damaged
    lines are skipped, counted through ``report``; a non-regular file is refused with an LctxError)."""

    return _read(Path(path), report)


def _key_value(k: str, v):
    # a depth is a number: 0 and 0.0 are one grid point (the summary groups them into one cell)
    return float(v) if k == "depth" and isinstance(v, (int, float)) and not isinstance(v, bool) else v


def record_key(rec: dict) -> tuple:
    """The identity of a sample across reruns (:data:`KEY`): a record is reused only when its
    fingerprint (every input: weights, config, tokenizer, data, options, versions) and grid point match
    (a depth compared as a number: ``0`` and ``0.0`` are one key)."""
    return tuple(json.dumps(_key_value(k, rec.get(k)), sort_keys=True) for k in KEY)


def label_of(rec: dict) -> str:
    """The label of a record (:data:`LABEL`) as a canonical JSON string (the key of ``run.json``'s
    ``current`` map)."""
    return json.dumps([rec.get(k) for k in LABEL], sort_keys=True, default=str)


def _fp(rec: dict):
    # records written before fingerprints existed are told apart by their old weight fingerprint
    return rec.get("fingerprint") or ("legacy:" + str(rec.get("model_fingerprint")))


def select_current(records: list[dict], current: dict | None = None) -> tuple[list[dict], int]:
    """(records of the current inputs, number left out): per label, only the records whose fingerprint is
    ``current[label]``, or, for a label ``current`` does not name, that of the label's last record."""
    last: dict[str, object] = {}
    for r in records:
        last[label_of(r)] = _fp(r)
    for k, fp in (current or {}).items():
        if k in last:
            last[k] = fp
    keep = [r for r in records if _fp(r) == last[label_of(r)]]
    return keep, len(records) - len(keep)


def latest_records(records: list[dict]) -> list[dict]:
    """One record per key (:func:`record_key`), so the tidy table never pools two records of one sample: the
    first ok record wins (a finished sample is never rerun, so a later ok record of its key is not the
    runner's; :func:`vet_records` names those with other values), an ok record beats an error (an errored
    sample is rerun), and of a key's errors alone the last one written wins."""
    by_key: dict[tuple, dict] = {}
    for r in records:
        k = record_key(r)
        old = by_key.get(k)
        if old is None or old.get("status") != "ok":
            by_key.pop(k, None)
            by_key[k] = r
    return list(by_key.values())


#: Why :func:`vet_records` leaves a record out, as its warning names it ({kind: "N record(s) ..."}).
FOREIGN = {"invocation": "of an invocation run.json does not name",
           "digest": "whose digest does not match (edited or copied after it was written)",
           "model": "of a model run.json does not hold",
           "duplicate": "repeating a finished sample with other values"}


def _invocations(meta: dict) -> dict[str, dict] | None:
    """{invocation id: entry} of a ``run.json``, or None when it names none (written before invocations were
    recorded, or by hand: nothing to check records against). The first run into such a directory since adds
    an entry named by its ``run_id`` (:func:`lctx.harness.run.runner._invocation`), which its old records carry."""
    invs = meta.get("invocations")
    out = {i["id"]: i for i in invs if isinstance(i, dict) and isinstance(i.get("id"), str)} \
        if isinstance(invs, list) else {}
    return out or None


def _which(rec: dict) -> str:
    # a record left out is outside text (appended or edited by hand): each field quoted, capped
    where = " ".join(f"{k} {quote(rec[k], 40)}" for k in ("length", "depth") if rec.get(k) is not None)
    return (f"{quote(rec.get('model'), 80)} {quote(rec.get('task'), 80)} {where + ' ' if where else ''}sample "
            f"{quote(rec.get('sample'), 40)}, invocation {quote(repr(rec.get('invocation') or rec.get('run_id')), 80)}")


def vet_records(records: list[dict], meta: dict | None, report=None, where: str = "records.jsonl") -> list[dict]:
    """The records of a run directory that its ``run.json`` (``meta``) vouches for, in their order; the others
    are left out of every table and aggregate, and ``report`` (if given) gets one warning line per kind
    (:data:`FOREIGN`) with the count and the first one:

    - ``invocation``: its ``invocation`` (a record written before invocations were recorded: its ``run_id``)
      is no entry of ``run.json``'s ``invocations``;
    - ``digest``: its invocation's entry has a salt and the record's ``digest`` is missing or is not
      :func:`lctx.harness.run.rundir.record_digest` of it (an entry without a salt was written before records
      carried digests: its records are taken as they are);
    - ``model``: its ``model`` is not among ``run.json``'s models (``inputs.models``);
    - ``duplicate``: a second ok record of a key (:func:`record_key`) that already has one, with other
      metrics: the first one is kept (a finished sample is never rerun). Copies with the same metrics (a
      sharded run's rank file read again after its merge) and errors after an ok are no conflict and are
      left to :func:`latest_records`.

    ``meta`` None (no ``run.json``), or one that names no invocation (written before they were recorded),
    checks only the models and duplicates. The
    checks detect lines appended or edited by hand; they are no defence against someone who edits
    ``run.json`` too (:func:`lctx.harness.run.rundir.record_digest`).
    """
    meta = meta if isinstance(meta, dict) else {}
    invs = _invocations(meta)
    inputs = meta.get("inputs") if isinstance(meta.get("inputs"), dict) else {}
    held = set(inputs["models"]) if isinstance(inputs.get("models"), dict) and inputs["models"] else None
    out, bad, first_ok = [], {k: [] for k in FOREIGN}, {}
    for r in records:
        kind = None
        if invs is not None:
            inv = r.get("invocation") if "invocation" in r else r.get("run_id")
            entry = invs.get(inv) if isinstance(inv, str) else None
            if entry is None:
                kind = "invocation"
            elif entry.get(SALT) and r.get(DIGEST) != record_digest(r, entry[SALT]):
                kind = "digest"
        if kind is None and held is not None and r.get("model") not in held:
            kind = "model"
        if kind is None and r.get("status") == "ok":
            k = record_key(r)
            prev = first_ok.setdefault(k, r)
            if prev is not r and ((prev.get("metrics"), prev.get("unavailable"))
                                  != (r.get("metrics"), r.get("unavailable"))):
                kind = "duplicate"
        if kind is None:
            out.append(r)
        else:
            bad[kind].append(r)
    for kind, recs in bad.items():
        if recs and report is not None:
            n = len(recs)
            report(f"warning: {where}: {n} record{'s' if n != 1 else ''} {FOREIGN[kind]} "
                   f"{'are' if n != 1 else 'is'} left out of the tables (first: {_which(recs[0])})")
    return out


def name_foreign_records(run_dir: Path, report) -> int:
    """Read a run directory's ``records.jsonl`` against its ``run.json`` (:func:`vet_records`) only to name, through
    ``report``, the records its tables leave out (``lctx report`` and ``lctx compare`` read the tables, which
    ``lctx run`` wrote from the vetted records; a line appended since is named here too). Returns how many;
    0 without ``run.json`` or ``records.jsonl``, or with a damaged ``run.json`` (the callers name that)."""
    run_dir = Path(run_dir)
    try:
        meta = read_json(run_dir / "run.json")
        if not meta or not check_regular(run_dir / "records.jsonl"):
            return 0
        records = _read(run_dir / "records.jsonl")
    except LctxError:
        return 0
    return len(records) - len(vet_records(records, meta, report, str(run_dir / "records.jsonl")))


def _depth_off(depth, actual) -> bool | None:
    try:
        d, a = float(depth), float(actual)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(d) and math.isfinite(a)):
        return None
    return abs(a - d) > DEPTH_TOLERANCE


def to_table(records: list[dict], metrics_of: dict[str, tuple[str, ...]] | None = None,
             current: dict | None = None) -> pd.DataFrame:
    """Explode the current inputs' records (:func:`select_current`) into the tidy long table (columns
    :data:`COLUMNS`).

    An errored record becomes one row per expected metric (``metrics_of[task]``) with value NaN,
    status ``"error"`` and its error message, so failures stay visible in every view. A metric the record names
    ``unavailable`` becomes a row with value NaN, status :data:`UNAVAILABLE` and the reason in ``reason``.
    ``depth_off`` is True where ``|depth_actual - depth| > DEPTH_TOLERANCE``. ``df.attrs["superseded"]`` counts the
    records left out because newer inputs replaced them.
    """
    kept, superseded = select_current(records, current)
    rows = []
    for r in latest_records(kept):
        metrics = r.get("metrics") or {}
        unavailable = r.get("unavailable") if isinstance(r.get("unavailable"), dict) else {}
        names = list(metrics) + [m for m in unavailable if m not in metrics]
        names = names or list((metrics_of or {}).get(r["task"], ())) or ["_"]
        versions = r.get("versions") if isinstance(r.get("versions"), dict) else {}
        for m in names:
            row = {c: r.get(c) for c in COLUMNS if c not in ("metric", "value", "reason")}
            row["metric"] = m
            v = metrics.get(m)
            row["value"] = float("nan") if v is None else float(v)
            row["reason"] = ""
            if m in unavailable and r.get("status") == "ok":
                row["status"], row["reason"] = UNAVAILABLE, str(unavailable[m])
            row["task_options"] = json.dumps(r.get("task_options"), sort_keys=True)
            row["depth_off"] = _depth_off(r.get("depth"), r.get("depth_actual"))
            row["torch_version"] = versions.get("torch")
            row["transformers_version"] = versions.get("transformers")
            tv = r.get("task_version")  # an int for lctx's tasks, lm-eval's version string for its tasks
            row["task_version"] = None if tv is None else str(tv)
            row["code_fingerprint"] = r.get("code")  # a --task-file's code (run.json inputs.tasks: path, sha256)
            rows.append(row)
    df = pd.DataFrame(rows, columns=COLUMNS)
    df = df.sort_values(["model", "task", "metric", "length", "depth", "sample"], na_position="first")
    df = df.reset_index(drop=True)
    df.attrs["superseded"] = superseded
    return df


def cell_options(task_options) -> str:
    """A row's ``task_options`` (JSON) without the :data:`POOLED_OPTIONS` keys, as canonical JSON."""
    if isinstance(task_options, str):
        try:
            opts = json.loads(task_options)
        except ValueError:
            return task_options
    else:
        opts = task_options
    if isinstance(opts, dict):
        opts = {k: v for k, v in opts.items() if k not in POOLED_OPTIONS}
    return json.dumps(opts, sort_keys=True)


def _pooled_value(task_options):
    """The :data:`POOLED_OPTIONS` value of a row's ``task_options`` (an MMLU question's subject), or None."""
    try:
        opts = json.loads(task_options) if isinstance(task_options, str) else task_options
    except ValueError:
        return None
    return next((opts[k] for k in POOLED_OPTIONS if k in opts), None) if isinstance(opts, dict) else None


def _pooled_tasks(df: pd.DataFrame, keys: list[str], subs: pd.Series) -> pd.Series:
    """The ``task`` of every row of ``df`` as its summary row names it: a task pooled over sub-tasks (``subs``,
    the rows' :func:`_pooled_value`) by the sub-tasks its cell holds, as the task declares it
    (:func:`lctx.tasks.pooled_label`: one MMLU subject is ``mmlu_astronomy``, not ``mmlu``); other rows keep theirs."""
    from lctx.tasks import pooled_label  # lazy: only runs with pooled sub-tasks (MMLU)

    cell = [k for k in keys if k != "metric"]  # one label for all metrics of a cell
    tmp = df[cell].astype(str).assign(_sub=subs)
    pooled = tmp.groupby(cell, dropna=False, sort=False)["_sub"].transform(lambda s: json.dumps(sorted(
        {str(v) for v in s if v is not None and v == v})))
    pairs = list(zip(df["task"], pooled))
    label = {pair: pooled_label(pair[0], json.loads(pair[1])) for pair in set(pairs)}  # once per cell, not per row
    return pd.Series([label[pair] for pair in pairs], index=df.index)


def pooled_task_names(df: pd.DataFrame, extra_keys: tuple[str, ...] = ()) -> pd.Series:
    """The ``task`` of every row of a results table ``df`` as :func:`summarize` names its cell (an MMLU run of one
    subject is ``mmlu_astronomy``, not the records' ``mmlu``; :func:`_pooled_tasks`), cells told apart by
    :data:`SUMMARY_KEYS` present in ``df`` plus ``extra_keys`` (``lctx report``: the run). Rows without pooled
    sub-tasks keep their task."""
    subs = df["task_options"].map(_pooled_value) if "task_options" in df.columns else None
    if subs is None or not subs.notna().any():
        return df["task"]
    keys = [k for k in SUMMARY_KEYS if k in df.columns] + list(extra_keys)
    return _pooled_tasks(df.assign(task_options=df["task_options"].map(cell_options)), keys, subs)


def _cell_fingerprint(fps) -> str:
    u = sorted({str(f) for f in fps if isinstance(f, str) and f})
    if len(u) <= 1:
        return u[0] if u else ""
    from lctx.models.fingerprint import digest_json  # lazy: loads torch

    return digest_json(u)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard error (sample std / sqrt(n); NaN for n = 1) and n of ``value`` over samples with
    status ok, per cell (:data:`SUMMARY_KEYS`: model, variant, task, metric, length, depth and the label
    columns, so cells of different options are never pooled; only :data:`POOLED_OPTIONS` sub-tasks are, and
    such a cell's task names the sub-tasks it holds: ``mmlu_astronomy``, ``mmlu`` for all 57 subjects);
    plus n_error (failed samples), n_unavailable (samples whose metric the model could not give, status
    :data:`UNAVAILABLE`: not in the mean, not failures) and ``unavailable`` (their reason, the first one with
    ``(+N other reasons)`` when they differ; empty when none: a cell of only such samples has no mean, n 0 and
    its reason here), n_depth_off (ok samples whose needle is off its depth,
    :data:`DEPTH_TOLERANCE`), the 95 % interval of the mean (``ci_low``, ``ci_high``; ``interval`` names its kind:
    ``wilson`` when every value is 0 or 1, else ``t``, NaN for n < 2: :mod:`lctx.harness.run.intervals`) and the cell's fingerprint (its samples' fingerprint, or a hash of their
    sorted fingerprints when pooled sub-tasks bring several). Tables written before a column existed get it
    empty."""
    df = df.copy()
    for c in SUMMARY_KEYS + ["depth_off", "fingerprint"]:
        if c not in df.columns:
            df[c] = None
    keys = SUMMARY_KEYS
    subs = df["task_options"].map(_pooled_value)
    df["task_options"] = df["task_options"].map(cell_options)
    if subs.notna().any():  # MMLU's subjects: the cell named as it was run (mmlu_astronomy), not "mmlu"
        df["task"] = _pooled_tasks(df, keys, subs)
    df["_off"] = df["depth_off"].astype("string").isin(["True", "true", "1", "1.0"]).astype(int)
    ok = df[df["status"] == "ok"]
    out = ok.groupby(keys, dropna=False).agg(mean=("value", "mean"), std=("value", "std"), n=("value", "count"),
                                              n_depth_off=("_off", "sum"),
                                              interval=("value", lambda v: "wilson" if is_binary(v) else "t")
                                              ).reset_index()
    out["stderr"] = out["std"] / out["n"].map(lambda n: math.sqrt(n) if n > 0 else float("nan"))
    # a 0/1 cell is a proportion only for a metric that can be one (a ppl_ratio of 1.0 or one n_docs is not)
    out["interval"] = [("t" if k == "wilson" and not may_be_proportion(m) else k)
                       for k, m in zip(out["interval"], out["metric"])]
    ci = [interval(m, se, n, k, bounds_of(met))
          for m, se, n, k, met in zip(out["mean"], out["stderr"], out["n"], out["interval"], out["metric"])]
    out["ci_low"] = [lo for lo, _ in ci]
    out["ci_high"] = [hi for _, hi in ci]
    err = (df[~df["status"].isin(["ok", UNAVAILABLE])].groupby(keys, dropna=False).size().rename("n_error")
           .reset_index())
    out = out.merge(err, on=keys, how="outer") if len(err) else out.assign(n_error=0)
    if "reason" not in df.columns:  # a table written before unavailable metrics were recorded
        df["reason"] = ""
    na = df[df["status"] == UNAVAILABLE].groupby(keys, dropna=False).agg(
        n_unavailable=("reason", "size"), unavailable=("reason", _reasons)).reset_index()
    out = out.merge(na, on=keys, how="outer") if len(na) else out.assign(n_unavailable=0, unavailable="")
    out["n_unavailable"] = out["n_unavailable"].fillna(0).astype(int)
    out["unavailable"] = out["unavailable"].fillna("")
    out["n_error"] = out["n_error"].fillna(0).astype(int)
    out["n"] = out["n"].fillna(0).astype(int)
    out["n_depth_off"] = out["n_depth_off"].fillna(0).astype(int)
    out["interval"] = out["interval"].astype(object).where(out["interval"].notna(), "")  # a cell with no ok sample
    fps = df.groupby(keys, dropna=False)["fingerprint"].agg(_cell_fingerprint).rename("fingerprint").reset_index()
    out = out.merge(fps, on=keys, how="left") if len(out) else out.assign(fingerprint="")
    return out[SUMMARY_COLUMNS].sort_values(keys, na_position="first").reset_index(drop=True)


def _reasons(reasons) -> str:
    """The reasons of a cell's unavailable rows as one line: the first, and ``(+N other reasons)`` when they
    differ."""
    u = list(dict.fromkeys(str(x) for x in reasons if isinstance(x, str) and x))
    if not u:
        return UNAVAILABLE
    return u[0] + (f" (+{len(u) - 1} other reason{'s' if len(u) > 2 else ''})" if len(u) > 1 else "")


#: a reason longer than this (characters) is printed once: a later line that would repeat it refers to it instead
#: (:func:`said_before`)
SHORT_REASON = 80
#: a reason shorter than this many characters ("unavailable") is repeated where it applies: a reference costs more
SAID_MIN = 24
#: what a line says in place of a long reason printed before it
REASON_ABOVE = "the reason is in the warning above"


def said_before(reason: str, said=()) -> bool:
    """Whether ``reason`` is more than a few words (over :data:`SAID_MIN` characters) and one of the lines ``said``
    (printed before) holds it: its first 60 characters, whitespace collapsed, as they are or as
    :func:`lctx.outside.quote` writes them (a warning that quoted it capped). A reason is said once: a served model's
    trust-probe reason at load, then "the reason is in the warning above"."""
    text = " ".join(str(reason).split())
    if len(text) <= SAID_MIN:
        return False
    heads = {text[:60], printable(redact(text), one_line=True)[:60]}
    return any(h in " ".join(str(line).split()) for line in said for h in heads)


def unavailable_lines(table: pd.DataFrame, said=()) -> list[str]:
    """One warning line per (model, reason) of a results table with rows the model could not give (status
    :data:`UNAVAILABLE`): its metrics, each with its tasks and how many samples, and the reason once, e.g. ``warning:
    digit_acc (passkey, 4 samples), ppl (ppl, 1 sample) of model 'm' are unavailable: no prompt log-probs; recorded as
    unavailable, never 0``. What ``lctx run`` (:func:`lctx.harness.evaluate.evaluate`) warns once per run (a served
    model whose log-probabilities fail the trust probe: one line, not one per metric); [] when every metric was
    given. The reason is quoted capped (:func:`lctx.outside.quote`), and a long one that a line of ``said`` (the
    warnings printed before, e.g. the trust probe's at load) gave already is referred to, not repeated
    (:func:`said_before`)."""
    if table is None or "status" not in table.columns or not (table["status"] == UNAVAILABLE).any():
        return []
    na = table[table["status"] == UNAVAILABLE]
    reason = na["reason"] if "reason" in na.columns else pd.Series("", index=na.index)
    na = na.assign(reason=[r if isinstance(r, str) and r else UNAVAILABLE for r in reason])
    lines = []
    for (model, why), g in na.groupby(["model", "reason"], sort=True):
        parts = [f"{metric} ({', '.join(dict.fromkeys(gm['task'].astype(str)))}, {count(len(gm), 'sample')})"
                 for metric, gm in g.groupby("metric", sort=True)]
        because = f" ({REASON_ABOVE})" if said_before(why, said) else f": {quote(why)}"
        lines.append(f"warning: {', '.join(parts)} of model {quote(model, 80)!r} {'is' if len(parts) == 1 else 'are'} "
                     f"unavailable{because}; recorded as unavailable, never 0")
    return lines


def unavailable_cells(summary: pd.DataFrame, said=()) -> tuple[dict, list[str]]:
    """The cells of a summary (:func:`summarize`'s, ``model`` as shown) whose metric the model
    could not give at a length (no value at any depth, ``n_unavailable`` > 0): ({(model, task, metric): {length:
    reason}}, one note line per reason naming the model's metrics, e.g. ``unavailable (no value, never 0):
    toy: passkey digit_acc; ppl nll, ppl: no prompt log-probs``). ({}, []) for a summary written before
    unavailable metrics were recorded. A note quotes its reason capped, or refers to it when it is long and one of
    the lines ``said`` (printed before) gave it (:func:`said_before`)."""
    if "n_unavailable" not in summary.columns:
        return {}, []
    n = pd.to_numeric(summary["n"], errors="coerce").fillna(0)
    na = pd.to_numeric(summary["n_unavailable"], errors="coerce").fillna(0)
    s = summary.assign(_n=n, _na=na)
    cells: dict = {}
    for (model, task, metric, length), g in s.groupby(["model", "task", "metric", "length"], sort=False):
        if g["_n"].sum() == 0 and g["_na"].sum() > 0:
            reason = next((str(x) for x in g["unavailable"] if isinstance(x, str) and x), "unavailable")
            cells.setdefault((model, task, metric), {})[int(length)] = reason
    by_reason: dict = {}
    for (model, task, metric), lens in cells.items():
        for reason in dict.fromkeys(lens.values()):
            by_reason.setdefault(reason, {}).setdefault(model, {}).setdefault(task, []).append(metric)
    notes = [f"unavailable (no value, never 0): "
             + "; ".join(f"{model}: " + "; ".join(f"{task} {', '.join(ms)}" for task, ms in tasks.items())
                         for model, tasks in models.items())
             + (f" ({REASON_ABOVE})" if said_before(reason, said) else f": {quote(reason)}")
             for reason, models in by_reason.items()]
    return cells, notes


def current_map(out_dir: Path) -> dict:
    """``run.json``'s ``current`` map ({label: fingerprint}) of a run directory, or {}.

    Raises:
        LctxError: ``run.json`` is damaged (:func:`lctx.harness.run.rundir.read_json`).
    """

    meta = read_json(Path(out_dir) / "run.json") or {}
    cur = meta.get("current")
    return cur if isinstance(cur, dict) else {}


def clean_frame(df: pd.DataFrame, escape: bool = False) -> pd.DataFrame:
    """A copy of ``df`` (``attrs`` kept) whose str cells and column names are redacted (:func:`lctx.outside.redact`)
    and, with ``escape``, their control characters escaped too (:func:`lctx.outside.safe`; tabs and newlines kept,
    which CSV quotes): what a table written to disk holds of outside text. Other cells (numbers, lists, None) are kept;
    each distinct string is cleaned once (a table repeats its model and task names on every row)."""
    fix = safe if escape else redact
    out = df.copy()
    for c in out.columns:
        col = out[c]
        if not (col.dtype == object or pd.api.types.is_string_dtype(col)):
            continue
        try:
            uniq = pd.unique(col.dropna())
        except TypeError:  # unhashable cells (lists, dicts): each one walked
            out[c] = col.map(lambda v: clean(v, escape))
            continue
        change = {v: fix(v) for v in uniq if isinstance(v, str)}
        change = {k: v for k, v in change.items() if k != v}
        if change:  # only the cells that change: None stays None, not NaN
            hit = col.isin(list(change))
            out[c] = col.mask(hit, col[hit].map(change))
    out.columns = [fix(c) if isinstance(c, str) else c for c in out.columns]
    return out


def write_tables(records: list[dict], out_dir: Path, metrics_of=None,
                 current: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write ``results.parquet``, ``results.csv`` and ``summary.csv`` into ``out_dir`` (each atomically:
    a failed write leaves the previous file) from the current inputs' records; return (table, summary), both
    redacted (:func:`clean_frame`); the files escape control characters too (a model id with ESC/OSC bytes is
    ``\\x1b...`` in the parquet file as in the CSVs: a tool that prints a column prints no terminal sequence).

    ``current``: {label: fingerprint}; default ``run.json``'s ``current`` map.

    Raises:
        LctxError: a table cannot be written (full disk, permissions), or ``run.json`` is damaged.
    """

    out_dir = Path(out_dir)
    df = clean_frame(to_table(records, metrics_of, current if current is not None else current_map(out_dir)))
    shown = clean_frame(df, escape=True)  # what the files hold: no raw control byte from outside, parquet included
    atomic_write(out_dir / "results.parquet", lambda p: shown.to_parquet(p, index=False))
    atomic_write(out_dir / "results.csv", lambda p: shown.to_csv(p, index=False))
    summ = summarize(df)
    atomic_write(out_dir / "summary.csv", lambda p: clean_frame(summ, escape=True).to_csv(p, index=False))
    return df, summ


def label_names(df: pd.DataFrame) -> pd.Series:
    """Model names for display: ``model`` where a (model, task, metric) has one label, else ``model [k=v, ...]``
    naming the label fields that differ (e.g. ``m [bos=none, stride=1]``), so plots and printed tables
    draw separate options as separate series instead of averaging them."""
    if df.empty:
        return df.get("model", pd.Series(dtype=object))
    fields = [c for c in ("variant", "task_options", "dtype", "attn_impl", "seed") if c in df.columns]
    names = df["model"].astype(str).copy()
    df = df.assign(task_options=df["task_options"].map(cell_options)) if "task_options" in df.columns else df
    by = ["model", "task"] + (["metric"] if "metric" in df.columns else [])  # derived rows: options per metric
    for _, g in df.groupby(by, dropna=False, sort=False):
        labels = g[fields].astype(str).drop_duplicates()
        if len(labels) <= 1:
            continue
        varying = [c for c in fields if g[c].astype(str).nunique() > 1]
        for idx, row in g.iterrows():
            parts = []
            for c in varying:
                if c == "task_options":
                    try:
                        opts = json.loads(row[c]) if isinstance(row[c], str) else (row[c] or {})
                    except ValueError:
                        opts = {}
                    others = [json.loads(x) if isinstance(x, str) and x.startswith("{") else {}
                              for x in g[c].drop_duplicates()]
                    for k in sorted(opts if isinstance(opts, dict) else {}):
                        if any(not isinstance(o, dict) or o.get(k) != opts.get(k) for o in others):
                            parts.append(f"{k}={opts[k]}")
                else:
                    parts.append(f"{c}={row[c]}")
            names.at[idx] = f"{row['model']} [{', '.join(parts)}]"
    return names


def over_depths(summary: pd.DataFrame, directions: dict[str, str] | None = None) -> pd.DataFrame:
    """The summary pooled over depths: one row per (model, task, metric, length) of ``summary``
    (:func:`summarize`'s columns; ``model`` as it is to be shown, e.g. :func:`label_names`), cells with no ok
    sample left out, with

    - ``mean``, ``stderr``, ``n``: of every ok sample of the cell's depths, as one sample: the mean weighted
      by each depth's n, the sample standard error (std over all n samples, ddof 1, / sqrt(n); NaN for n = 1)
      rebuilt exactly from each depth's mean, stderr and n;
    - ``ci_low``, ``ci_high``, ``interval``: the pooled mean's 95 % interval (Wilson when every depth's cell is a
      proportion, k = mean · n; else t on the pooled stderr; :mod:`lctx.harness.run.intervals`);
    - ``worst``, ``worst_depths``, ``worst_n``: the worst depth's mean (lowest for a metric better higher,
      highest for one better lower), the depths that share it (a list; all of them when every depth ties)
      and their samples, NaN / [] / 0 where the cell has fewer than two depths or the metric no direction
      (``equal`` bookkeeping, an unknown name);
    - ``n_depths``: the depths pooled.

    ``directions``: {metric: "higher" | "lower"} over the registry's (:func:`lctx.metrics.direction_of`).
    The run's printed table shows these (``lctx run``): a mean over depths hides a depth that always fails.
    """
    from lctx.metrics import direction_of  # lazy: a leaf module

    keys = ["model", "task", "metric", "length"]
    cols = keys + ["mean", "stderr", "n", "ci_low", "ci_high", "interval", "worst", "worst_depths", "worst_n",
                   "n_depths"]
    s = summary[pd.to_numeric(summary["n"], errors="coerce").fillna(0) > 0]
    out = []
    for key, d in s.groupby(keys, dropna=False, sort=True):
        n = d["n"].astype(float)
        N = n.sum()
        mean = float((d["mean"] * n).sum() / N)
        # sum of squares about the pooled mean = within-depth (n_i - 1) s_i^2 + between-depth n_i (m_i - mean)^2
        s2 = (pd.to_numeric(d["stderr"], errors="coerce") ** 2 * n).fillna(0.0)  # s_i^2 (0 where n_i = 1)
        ss = float(((n - 1) * s2).sum() + (n * (d["mean"] - mean) ** 2).sum())
        se = math.sqrt(ss / (N - 1) / N) if N > 1 else math.nan
        # the pooled cell is a proportion when each depth's was (a summary from before intervals: by its mean)
        kinds = d["interval"] if "interval" in d.columns else pd.Series([""] * len(d), index=d.index)
        kind = "wilson" if all(k == "wilson" or (not k and m in (0.0, 1.0)) for k, m in zip(kinds.fillna(""), d["mean"])) \
            and may_be_proportion(key[keys.index("metric")]) else "t"
        lo, hi = interval(mean, se, int(N), kind, bounds_of(key[keys.index("metric")]))
        row = dict(zip(keys, key), mean=mean, stderr=se, n=int(N), ci_low=lo, ci_high=hi, interval=kind,
                   worst=math.nan, worst_depths=[], worst_n=0)
        depths = d[pd.to_numeric(d["depth"], errors="coerce").notna()]
        row["n_depths"] = int(depths["depth"].nunique())
        direction = (directions or {}).get(str(key[2])) or direction_of(str(key[2]))
        if row["n_depths"] >= 2 and direction in ("higher", "lower"):
            worst = depths["mean"].min() if direction == "higher" else depths["mean"].max()
            w = depths[np.isclose(depths["mean"], worst, rtol=0, atol=1e-12)]
            row.update(worst=float(worst), worst_depths=sorted(float(x) for x in w["depth"]),
                       worst_n=int(w["n"].sum()))
        out.append(row)
    return pd.DataFrame(out, columns=cols)



# ---------------------------------------------------------------------------------------------------------------
# the table `lctx run` prints when a run ends (moved from cli.py: it holds commands only)
# ---------------------------------------------------------------------------------------------------------------

def declared_directions(out) -> dict[str, str]:
    """{metric: "higher" | "lower"} that the run's tasks declared (``higher_is_better`` as run.json's task_meta
    records it: a --task-file task's metrics are in no registry), for the closing table's worst depth; {} for a
    run directory without it."""
    from lctx.harness.run.rundir import declared_tasks, read_json  # lazy: the run has loaded it already

    try:
        meta = read_json(Path(out) / "run.json")
    except Exception:  # noqa: BLE001 - the table is printed without declared directions, as before
        return {}
    dirs: dict[str, str] = {}
    for decl in declared_tasks(meta if isinstance(meta, dict) else None).values():
        hib = decl.get("higher_is_better")
        if isinstance(hib, dict):
            dirs.update({str(m): "higher" if v else "lower" for m, v in hib.items() if isinstance(v, bool)})
    return dirs


def print_summary(summary, directions: dict[str, str] | None = None, said=()) -> None:
    """Print per (model, task, metric) and length the mean over depths and samples with its 95 % interval
    (:func:`lctx.harness.run.tables.over_depths`) and n, and, under a metric scored at several depths, its worst depth (SmolLM2's passkey exact read
    0.667 at every length, when depth 1.0 always failed): a rich table on a terminal, a Markdown table off one
    (every cell whole; see :mod:`lctx.harness.run.console`). Cells of different options (a model run with two
    ``--stride`` values) are separate rows, named by the options; a teacher-forced metric says so
    (:func:`lctx.metrics.label`). ``directions``: {metric: "higher" | "lower"} the tasks declared
    (:func:`declared_directions`), over the metric registry's, for the worst depth. ``said``: the warnings printed
    before it: a long reason one of them gave is not repeated in the notes under the table
    (:func:`lctx.harness.run.tables.unavailable_cells`)."""
    from lctx.metrics import direction_of, label  # lazy: a leaf module

    summary = summary[summary["length"].notna()]  # lm-eval tasks (no length) print their own table
    if summary.empty:
        return
    summary = summary.assign(model=label_names(summary))
    cells = over_depths(summary[summary["metric"] != "n_docs"], directions)
    unav, notes = unavailable_cells(summary[summary["metric"] != "n_docs"], said=said)
    if cells.empty and not unav:
        return
    cells["length"] = cells["length"].astype(int)  # 256, not 256.0, when rows without a length made it float
    lengths = sorted(set(cells["length"].unique()) | {L for cell in unav.values() for L in cell})

    def num(v: float, metric: str) -> str:
        return f"{v:.0f}" if metric == "n_tokens" else f"{v:.3f}"

    def mean_cell(r) -> str:
        if direction_of(r.metric) == "equal" or not (math.isfinite(r.ci_low) and math.isfinite(r.ci_high)):
            return num(r.mean, r.metric)  # bookkeeping; one sample of a continuous metric
        return f"{num(r.mean, r.metric)} [{num(r.ci_low, r.metric)}, {num(r.ci_high, r.metric)}]"

    def worst_cell(r) -> str:
        if not r.worst_depths:
            return ""
        where = ("all depths" if len(r.worst_depths) == r.n_depths else
                 "d=" + ", ".join(f"{d:g}" for d in r.worst_depths) if len(r.worst_depths) <= 3 else
                 f"{len(r.worst_depths)} depths")
        return f"{num(r.worst, r.metric)} @ {where}"

    def row_of(name: str, g, cell, n_of, missing=None) -> list[str]:
        by_len = {r.length: r for r in g.itertuples(index=False)}
        ns = {n_of(r) for r in by_len.values()}
        same_n = len(ns) == 1  # n in its column; else in each cell
        out = [*name, str(ns.pop()) if same_n else ""]
        for L in lengths:
            r = by_len.get(L)
            text = cell(r) if r is not None else ""
            out.append(text + (f" (n={n_of(r)})" if text and not same_n else "")
                       or ("unavailable" if L in (missing or {}) else ""))
        return out

    rows = []
    keys = list(dict.fromkeys([tuple(k) for k in cells[["model", "task", "metric"]].itertuples(index=False)]
                              + list(unav)))
    for model, task, metric in keys:
        g = cells[(cells["model"] == model) & (cells["task"] == task) & (cells["metric"] == metric)]
        rows.append(row_of((model, task, label(metric)), g, mean_cell, lambda r: r.n, unav.get((model, task, metric))))
        w = g[g["worst_depths"].map(len) > 0]
        if (w["worst_depths"].map(len) < w["n_depths"]).any():  # a depth worse than another somewhere
            rows.append(row_of((model, task, f"{metric}: worst depth"), w, worst_cell, lambda r: r.worst_n))
    cols = [str(L) for L in lengths]
    print_table(["model", "task", "metric", "n"] + cols, rows, right=["n"] + cols,
                title="mean [95 % interval: Wilson for 0/1 scores, t otherwise] over depths and samples (n: samples); "
                      "worst depth: the depth d (0 = start of the prompt) with the worst mean, n: its samples")
    for line in notes:
        say(line)
