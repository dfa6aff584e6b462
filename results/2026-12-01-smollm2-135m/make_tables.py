"""At-a-glance tables of the SmolLM2 runs (markdown): where retrieval breaks by length and by depth, ppl
and the cost of each job (wall time and peak RSS from ``/usr/bin/time -v`` in each job's log).

    python make_tables.py OUT > tables.md      # OUT is run.sh's output folder (passkey/, ppl/, ...)

Reads only ``summary.csv`` of lctx's run directories, ``timings.tsv`` and the job logs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

NIAH = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery")


def fmt_len(n: float) -> str:
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def summaries(root: Path, *runs: str) -> pd.DataFrame:
    parts = [pd.read_csv(root / r / "summary.csv") for r in runs if (root / r / "summary.csv").exists()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["task", "metric", "length", "depth", "mean", "n"])


def grid(s: pd.DataFrame, task: str, metric: str) -> pd.DataFrame:
    """Rows: depth, columns: length; cells 'mean (n)'; '-' where not run."""
    s = s[(s["task"] == task) & (s["metric"] == metric)].dropna(subset=["length"])
    if s.empty:
        return pd.DataFrame()
    s = s.assign(cell=s["mean"].map(lambda v: f"{v:.2f}") + " (" + s["n"].astype(int).astype(str) + ")")
    g = s.pivot_table(index="depth", columns="length", values="cell", aggfunc="last").fillna("-")
    g.columns = [fmt_len(c) for c in g.columns]
    g.index = [f"depth {d:g}" for d in g.index]
    return g


def by(s: pd.DataFrame, tasks, metric: str, axis: str) -> pd.DataFrame:
    s = s[s["task"].isin(tasks) & (s["metric"] == metric)]
    if s.empty:
        return pd.DataFrame()
    s = s.assign(w=s["mean"] * s["n"])
    g = s.groupby(["task", axis]).agg(w=("w", "sum"), n=("n", "sum")).reset_index()
    g["v"] = (g["w"] / g["n"]).map(lambda v: f"{v:.2f}") + " (" + g["n"].astype(int).astype(str) + ")"
    t = g.pivot(index="task", columns=axis, values="v").fillna("-")
    t.columns = [fmt_len(c) if axis == "length" else f"depth {c:g}" for c in t.columns]
    return t.reindex([x for x in tasks if x in set(t.index)])


def costs(root: Path) -> pd.DataFrame:
    rows = []
    p = root / "timings.tsv"
    if not p.exists():
        return pd.DataFrame()
    for line in p.read_text().splitlines():
        name, t0, t1, rc = line.split("\t")
        log = (root / f"{name}.log").read_text(errors="replace") if (root / f"{name}.log").exists() else ""
        # the last /usr/bin/time -v block of the log is this job's (a resumed job appends to its log)
        wall = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log)
        cpu_u = re.findall(r"User time \(seconds\): (\S+)", log)
        rss = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", log)
        rows.append({"job": name, "start (UTC)": t0[11:19], "end (UTC)": t1[11:19], "rc": rc,
                     "wall": wall[-1] if wall else "", "user CPU s": cpu_u[-1] if cpu_u else "",
                     "peak RSS GiB": f"{int(rss[-1]) / 2**20:.2f}" if rss else ""})
    return pd.DataFrame(rows)


def main(root: Path) -> None:
    out = []
    pk = summaries(root, "passkey", "passkey-16k")
    for runs, title in ((pk, "passkey, chat template off"),
                        (summaries(root, "passkey-chat"), "passkey, chat template on")):
        for metric in ("exact", "digit_acc"):
            g = grid(runs, "passkey", metric)
            if len(g):
                out.append(f"### {title}: {metric} (mean (samples)); rows: needle depth, columns: length\n\n"
                           + g.to_markdown() + "\n")
    s = summaries(root, "niah")
    for metric in ("string_match_all", "tf_top1"):
        for axis in ("length", "depth"):
            t = by(s, NIAH, metric, axis)
            if len(t):
                out.append(f"### RULER NIAH {metric} by {axis} (mean (samples))\n\n" + t.to_markdown() + "\n")
    s = summaries(root, "ppl")
    s = s[s["task"] == "ppl"]
    if len(s):
        t = s.pivot_table(index="metric", columns="length", values="mean", aggfunc="last")
        t.columns = [fmt_len(c) for c in t.columns]
        out.append("### perplexity, pg98 (A Tale of Two Cities), first 8192 tokens, disjoint windows; "
                   "columns: window\n\n" + t.to_markdown(floatfmt=".3f") + "\n")
    c = costs(root)
    if len(c):
        out.append("### cost of each job (one thread, nice 5, shared 2-core machine)\n\nstart/end: when the job was queued and ended (a wait for the heavy lock included); wall, CPU, peak RSS: /usr/bin/time -v around the command itself; rc 137: stopped (see README)\n\n" + c.to_markdown(index=False) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
