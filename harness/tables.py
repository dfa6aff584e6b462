"""Records -> tidy results table -> summary. Pandas does the work; Parquet via pyarrow, CSV via pandas.

A *record* is one finished sample (one JSON line of ``records.jsonl``) carrying a ``metrics`` dict.
The *results table* is long and tidy: one row per (run, model, variant, task, metric, length, depth,
sample) with the value and the run metadata. The *summary* aggregates it to mean, standard error and
n per (model, variant, task, metric, length, depth).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

COLUMNS = ["run_id", "model", "variant", "task", "metric", "length", "n_tokens", "depth", "depth_actual",
           "sample", "value", "seed", "status", "error", "wall_s", "peak_mem_bytes", "device", "dtype", "attn_impl", "attn_kernel",
           "lctx_version", "git_rev", "timestamp", "train_length", "task_options"]
# a sample's identity: which weights (path + file fingerprint), dtype, attention path (reference | sdpa |
# fast), task, grid point, seed and options. attn_kernel records the kernel the fast path actually ran.
KEY = ["model", "model_fingerprint", "dtype", "attn_impl", "task", "length", "depth", "sample", "seed", "task_options"]


def read_records(path: Path) -> list[dict]:
    """All records of a ``records.jsonl`` (a torn last line from a killed run is ignored)."""
    out = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def record_key(rec: dict) -> tuple:
    """The identity of a sample across reruns (:data:`KEY`): the same model name with other weights, another
    dtype, seed or task options is a different sample and is run again."""
    return tuple(json.dumps(rec.get(k), sort_keys=True) for k in KEY)


def latest_records(records: list[dict]) -> list[dict]:
    """One record per key: the last one written (a retried error is replaced by its rerun)."""
    by_key: dict[tuple, dict] = {}
    for r in records:
        by_key[record_key(r)] = r
    return list(by_key.values())


def to_table(records: list[dict], metrics_of: dict[str, tuple[str, ...]] | None = None) -> pd.DataFrame:
    """Explode records into the tidy long table (columns :data:`COLUMNS`).

    An errored record becomes one row per expected metric (``metrics_of[task]``) with value NaN,
    status ``"error"`` and its error message, so failures stay visible in every view.
    """
    rows = []
    for r in latest_records(records):
        metrics = r.get("metrics") or {}
        names = list(metrics) or list((metrics_of or {}).get(r["task"], ())) or ["_"]
        for m in names:
            row = {c: r.get(c) for c in COLUMNS if c not in ("metric", "value")}
            row["metric"] = m
            v = metrics.get(m)
            row["value"] = float("nan") if v is None else float(v)
            row["task_options"] = json.dumps(r.get("task_options"), sort_keys=True)
            rows.append(row)
    df = pd.DataFrame(rows, columns=COLUMNS)
    df = df.sort_values(["model", "task", "metric", "length", "depth", "sample"], na_position="first")
    return df.reset_index(drop=True)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard error (sample std / sqrt(n); NaN for n = 1) and n of ``value`` over samples with
    status ok, per (model, variant, task, metric, length, depth); plus n_error, the failed samples."""
    keys = ["model", "variant", "task", "metric", "length", "depth"]
    ok = df[df["status"] == "ok"]
    g = ok.groupby(keys, dropna=False)["value"]
    out = g.agg(mean="mean", std="std", n="count").reset_index()
    out["stderr"] = out["std"] / out["n"].map(lambda n: math.sqrt(n) if n > 0 else float("nan"))
    err = (df[df["status"] != "ok"].groupby(keys, dropna=False).size().rename("n_error").reset_index())
    out = out.merge(err, on=keys, how="outer") if len(err) else out.assign(n_error=0)
    out["n_error"] = out["n_error"].fillna(0).astype(int)
    out["n"] = out["n"].fillna(0).astype(int)
    return out[keys + ["mean", "stderr", "n", "n_error"]].sort_values(keys, na_position="first").reset_index(drop=True)


def write_tables(records: list[dict], out_dir: Path, metrics_of=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write ``results.parquet``, ``results.csv`` and ``summary.csv`` into ``out_dir``; return (table, summary)."""
    df = to_table(records, metrics_of)
    df.to_parquet(out_dir / "results.parquet", index=False)
    df.to_csv(out_dir / "results.csv", index=False)
    summ = summarize(df)
    summ.to_csv(out_dir / "summary.csv", index=False)
    return df, summ
