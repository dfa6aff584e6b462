"""At-a-glance tables of the SmolLM2 runs (markdown): where retrieval breaks by length and by depth.

    python make_tables.py RUNS_DIR > tables.md      # RUNS_DIR holds passkey/, passkey-chat/, niah/, ppl/
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def fmt_len(n: float) -> str:
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def grid(summary: pd.DataFrame, task: str, metric: str, index: str = "depth") -> pd.DataFrame:
    s = summary[(summary["task"] == task) & (summary["metric"] == metric)]
    if s.empty:
        return pd.DataFrame()
    s = s.assign(cell=s["mean"].map(lambda v: f"{v:.2f}") + " (" + s["n"].astype(int).astype(str) + ")")
    g = s.pivot_table(index=index, columns="length", values="cell", aggfunc="first")
    g.columns = [fmt_len(c) for c in g.columns]
    return g


def by_length(summary: pd.DataFrame, tasks: list[str], metric: str) -> pd.DataFrame:
    s = summary[summary["task"].isin(tasks) & (summary["metric"] == metric)]
    s = s.assign(w=s["mean"] * s["n"])
    g = s.groupby(["task", "length"]).agg(w=("w", "sum"), n=("n", "sum")).reset_index()
    g["v"] = (g["w"] / g["n"]).map(lambda v: f"{v:.2f}")
    t = g.pivot(index="task", columns="length", values="v")
    t.columns = [fmt_len(c) for c in t.columns]
    return t.reindex(tasks)


def by_depth(summary: pd.DataFrame, tasks: list[str], metric: str) -> pd.DataFrame:
    s = summary[summary["task"].isin(tasks) & (summary["metric"] == metric)]
    s = s.assign(w=s["mean"] * s["n"])
    g = s.groupby(["task", "depth"]).agg(w=("w", "sum"), n=("n", "sum")).reset_index()
    g["v"] = (g["w"] / g["n"]).map(lambda v: f"{v:.2f}")
    t = g.pivot(index="task", columns="depth", values="v")
    t.columns = [f"depth {c:g}" for c in t.columns]
    return t.reindex(tasks)


def main(root: Path) -> None:
    out = []
    for run, title in (("passkey", "passkey, chat template off (exact; mean (n samples))"),
                       ("passkey-chat", "passkey, chat template on (exact; mean (n samples))")):
        p = root / run / "summary.csv"
        if p.exists():
            s = pd.read_csv(p)
            for metric in ("exact", "digit_acc"):
                g = grid(s, "passkey", metric)
                out.append(f"### {title.replace('exact', metric)}\n\nrows: needle depth, columns: length\n\n"
                           + g.to_markdown() + "\n")
    p = root / "niah" / "summary.csv"
    if p.exists():
        s = pd.read_csv(p)
        tasks = [t for t in ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue",
                             "niah_multiquery") if t in set(s["task"])]
        for metric in ("string_match_all", "tf_top1"):
            out.append(f"### RULER NIAH {metric} by length (mean over depths)\n\n" + by_length(s, tasks, metric).to_markdown() + "\n")
            out.append(f"### RULER NIAH {metric} by depth (mean over lengths)\n\n" + by_depth(s, tasks, metric).to_markdown() + "\n")
    p = root / "ppl" / "summary.csv"
    if p.exists():
        s = pd.read_csv(p)
        s = s[s["task"] == "ppl"].pivot_table(index="metric", columns="length", values="mean")
        s.columns = [fmt_len(c) for c in s.columns]
        out.append("### sliding-window perplexity, pg98 (A Tale of Two Cities)\n\n" + s.to_markdown(floatfmt=".3f") + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
