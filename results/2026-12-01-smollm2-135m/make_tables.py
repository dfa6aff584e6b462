"""At-a-glance tables of the SmolLM2 runs (markdown): where retrieval breaks by length and by depth, ppl
and the cost of each job (wall time and peak RSS from ``/usr/bin/time -v`` in each job's log).

    python make_tables.py OUT > tables.md      # OUT is run.sh's output folder (passkey/, ppl/, ...)

Reads ``summary.csv``, ``results.csv`` and ``records.jsonl`` of lctx's run directories, ``timings.tsv`` and the
job logs. The ppl ratio and flat-until use lctx's own :func:`lctx.harness.steps.flatness.flat_until` (criterion
PPL(L) / PPL(T) <= 1.1, T = the runs' ``train_length``).
"""

from __future__ import annotations

import json
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


def train_length(root: Path, *runs: str) -> float | None:
    """The ``train_length`` recorded in the runs' results.csv (``--train-length``), or None."""
    for r in runs:
        p = root / r / "results.csv"
        if p.exists():
            tl = pd.read_csv(p)["train_length"].dropna()
            if len(tl):
                return float(tl.mode().iloc[0])
    return None


def per_sample_seconds(root: Path) -> pd.DataFrame:
    """Median wall seconds per sample by length, one row per run directory, task and git revision (a run resumed
    from an earlier session's records keeps their times, measured under that session's load)."""
    rows = []
    for run in ("passkey", "passkey-chat"):
        p = root / run / "results.csv"
        if not p.exists():
            continue
        r = pd.read_csv(p)
        r = r[(r["status"] == "ok")].drop_duplicates(["task", "length", "depth", "sample"])
        for (task, rev), g in r.groupby(["task", "git_rev"], sort=False):  # a resumed run: one row per code
            med = g.groupby("length")["wall_s"].agg(["median", "count"])
            rows.append(pd.Series({fmt_len(L): f"{m:.1f} ({int(c)})" for L, (m, c) in med.iterrows()},
                                  name=f"{run}: {task} @ {str(rev)[:7]}"))
    return pd.DataFrame(rows).fillna("-") if rows else pd.DataFrame()


def failures(root: Path) -> pd.DataFrame:
    """Passkey samples with exact 0: run, length, depth, sample, key, digit_acc, greedy continuation."""
    rows = []
    for run in ("passkey", "passkey-chat"):
        p = root / run / "records.jsonl"
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            r = json.loads(line)
            if r.get("task") == "passkey" and r.get("status") == "ok" and r["metrics"].get("exact") == 0:
                rows.append({"run": run, "length": fmt_len(r["length"]), "depth": r["depth"], "sample": r["sample"],
                             "key": r["extra"].get("key"), "digit_acc": r["metrics"].get("digit_acc"),
                             "continuation": json.dumps(r["extra"].get("continuation"))})
    return pd.DataFrame(rows)


def costs(root: Path) -> pd.DataFrame:
    rows = []
    lines = []  # each session's timings and the folder of its job logs (earlier sessions' copied into OUT)
    for f, session, logs in (("timings.real2.tsv", "first", "logs-real2"), ("timings.real3.tsv", "second", "logs-real3"),
                             ("timings.tsv", "third", ".")):
        if (root / f).exists():
            lines += [(session, root / logs, ln) for ln in (root / f).read_text().splitlines() if ln.strip()]
    for session, logs, line in lines:
        name, t0, t1, rc = line.split("\t")
        log = (logs / f"{name}.log").read_text(errors="replace") if (logs / f"{name}.log").exists() else ""
        # the last /usr/bin/time -v block of the log is this job's (a resumed job appends to its log)
        wall = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log)
        cpu_u = re.findall(r"User time \(seconds\): (\S+)", log)
        rss = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", log)
        rows.append({"session": session, "job": name, "start (UTC)": t0[11:19], "end (UTC)": t1[11:19], "rc": rc,
                     "wall": wall[-1] if wall else "", "user CPU s": cpu_u[-1] if cpu_u else "",
                     "peak RSS GiB": f"{int(rss[-1]) / 2**20:.2f}" if rss else ""})
    return pd.DataFrame(rows)


def main(root: Path) -> None:
    out = []
    pk = summaries(root, "passkey", "passkey-16k")  # 16K ran into passkey/ (run.sh DIR=passkey)
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
    s = summaries(root, "passkey", "ppl")
    s = s[s["task"] == "ppl"]
    if len(s):
        t = s.pivot_table(index="metric", columns="length", values="mean", aggfunc="last")
        T = int(train_length(root, "passkey", "ppl") or 0)
        if T and T in t.columns:
            from lctx.harness.steps.flatness import flat_until

            ratios = {int(L): float(t.loc["ppl", L] / t.loc["ppl", T]) for L in t.columns}
            t.loc["ppl / ppl(T)"] = [ratios[int(L)] for L in t.columns]
            fu = flat_until(ratios, T, 1.1)
            flat = (f"\nflat until (largest L >= T = {T} with every tested length in [T, L] at ppl / ppl(T) <= 1.1; "
                    f"lctx.harness.steps.flatness.flat_until): **{fmt_len(fu) if fu else 'none'}**"
                    + (" (the longest window tested: flat as far as it looked)" if fu and fu >= max(ratios) else "") + "\n")
        else:
            flat = f"\nflat until: needs ppl at the training length T = {T or '?'} (not in these runs)\n"
        t.columns = [fmt_len(c) for c in t.columns]
        out.append("### perplexity, pg98 (A Tale of Two Cities), disjoint windows (stride = window - 1) over its first "
                   "tokens (n_tokens: scored tokens); columns: window\n\n" + t.to_markdown(floatfmt=".4g") + "\n" + flat)
    acc = summaries(root, "arc", "mmlu")
    acc = acc[acc["task"].isin(["arc_easy", "arc_challenge", "mmlu"])] if len(acc) else acc
    if len(acc):
        rows = []
        for (task, metric), g in acc.groupby(["task", "metric"]):
            n = int(g["n"].sum())  # MMLU: one summary row per subject; pooled over questions
            rows.append({"task": task, "metric": metric, "questions": n, "subjects": len(g),
                         "mean": round(float((g["mean"] * g["n"]).sum() / n), 4)})
        out.append("### ARC / MMLU through lctx (0-shot ARC, 5-shot MMLU; mean over questions, MMLU pooled over "
                   "subjects; the lm-eval cross-check is lmeval_crosscheck.md)\n\n"
                   + pd.DataFrame(rows).to_markdown(index=False) + "\n")
    secs = per_sample_seconds(root)
    if len(secs):
        out.append("### seconds per sample (wall, median (samples)), from results.csv `wall_s`; rows: run: task @ git_rev "
                   "(655b79b: the previous session, load 8-11); columns: length\n\n"
                   + secs.to_markdown() + "\n")
    fails = failures(root)
    if len(fails):
        out.append("### every passkey sample with exact = 0: the greedy continuation (records.jsonl)\n\n"
                   + fails.to_markdown(index=False) + "\n")
    c = costs(root)
    if len(c):
        out.append("### cost of each job (one thread, nice 5, shared 2-core machine)\n\nsession: first (load 8-11), second (load 4-6), third (load 2-5); start/end: when the job was queued and ended (a wait for the heavy lock included); wall, CPU, peak RSS: /usr/bin/time -v around the command itself; rc 124/137: stopped at STOP_AT or by hand (see README)\n\n" + c.to_markdown(index=False) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
