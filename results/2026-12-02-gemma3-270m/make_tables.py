"""At-a-glance tables of the Gemma 3 270M runs (markdown): passkey by length and depth (to 64K), RULER per task and
its average with the effective length, perplexity by window with the flatness summary, ARC / MMLU beside lm-eval
direct and the published numbers, the llama.cpp cross-check, and the cost per sample by length.

    python make_tables.py OUT > tables.md      # OUT: run.sh's output folder (passkey/, ruler/, crosscheck/, ...)

Reads each lctx run directory's ``summary.csv`` and ``records.jsonl``, ``crosscheck/crosscheck.csv``
(crosscheck.py), ``direct-compare/lmeval_crosscheck.csv`` (lmeval_direct.sh) and the jobs' ``/usr/bin/time -v``
logs. Every number printed comes from those files; the published numbers are quoted from the Gemma 3 model card
(https://ai.google.dev/gemma/docs/core/model_card_3, "Gemma 3 PT 270M").
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

_HERE = Path(__file__).resolve().parent


def _sibling(folder: str, name: str):
    """A module of another results folder, loaded by path (the folders are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}".replace("-", "_"), _HERE.parent / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


grid = _sibling("2026-12-01-smollm2-135m", "make_tables").grid  # depth x length cells "mean (n)"
slope = _sibling("2026-12-02-lean-prefill", "summarise").slope  # least-squares log-log slope (the time exponent)

# Gemma 3 model card, table "Gemma 3 270M" (pre-trained): benchmark -> (n-shot, score in percent)
PUBLISHED = {"arc_easy": (0, 57.7), "arc_challenge": (25, 29.0)}


def fmt_len(n: float) -> str:
    n = int(n)
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def summary(root: Path, run: str) -> pd.DataFrame:
    p = root / run / "summary.csv"
    return pd.read_csv(p) if p.exists() else pd.DataFrame(columns=["task", "metric", "length", "depth", "mean", "n"])


def records(root: Path, run: str) -> list[dict]:
    p = root / run / "records.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def over_depths(s: pd.DataFrame, task: str, metric: str) -> pd.Series:
    """Mean over every sample of a length (depths pooled, weighted by n): 'mean (n)'."""
    s = s[(s["task"] == task) & (s["metric"] == metric)].dropna(subset=["length", "depth"])
    s = s.assign(w=s["mean"] * s["n"])
    g = s.groupby("length").agg(w=("w", "sum"), n=("n", "sum"))
    return pd.Series({fmt_len(L): f"{r.w / r.n:.2f} ({int(r.n)})" for L, r in g.iterrows()})


def passkey_tables(root: Path) -> list[str]:
    s = summary(root, "passkey")
    out = []
    for metric in ("exact", "digit_acc"):
        g = grid(s, "passkey", metric)
        if len(g):
            g.loc["all depths"] = over_depths(s, "passkey", metric).reindex(g.columns).fillna("-")
            out.append(f"### passkey {metric}, mean (samples); rows: needle depth, columns: length "
                       "(48K and 64K: past the declared 32K, `--allow-beyond-max`)\n\n" + g.to_markdown() + "\n")
    fails = [r for r in records(root, "passkey") if r.get("task") == "passkey" and r.get("status") == "ok"
             and r["metrics"].get("exact") == 0]
    if fails:
        t = pd.DataFrame([{"length": fmt_len(r["length"]), "depth": r["depth"], "sample": r["sample"],
                           "key": r["extra"].get("key"), "digit_acc": r["metrics"].get("digit_acc"),
                           "greedy continuation": json.dumps(r["extra"].get("continuation"))} for r in fails])
        out.append("### every passkey sample with exact = 0 (records.jsonl)\n\n"
                   + t.sort_values(["length", "depth", "sample"], key=lambda c: c.map(
                       lambda v: int(v[:-1]) * 1024 if isinstance(v, str) and v.endswith("K") else v))
                   .to_markdown(index=False) + "\n")
    return out


def ruler_tables(root: Path) -> list[str]:
    s = summary(root, "ruler")
    if s.empty:
        return []
    out = []
    per = s[(s["task"] != "ruler") & s["task"].astype(str).str.match(r"(niah|vt|cwe|fwe|qa)")]
    rows = []
    from lctx.harness.steps.ruler import task_metric  # RULER's own metric per task (string_match_all / _part)

    for (task, metric), g in per.groupby(["task", "metric"]):
        if metric != task_metric(task):
            continue
        g = g.assign(w=g["mean"] * g["n"]).groupby("length").agg(w=("w", "sum"), n=("n", "sum"))
        rows.append(pd.Series({fmt_len(L): f"{100 * r.w / r.n:.1f} ({int(r.n)})" for L, r in g.iterrows()},
                              name=f"{task} ({metric})"))
    if rows:
        out.append("### RULER per task, percent (samples; depths pooled); columns: length\n\n"
                   + pd.DataFrame(rows).fillna("-").to_markdown() + "\n")
    agg = s[s["task"] == "ruler"]
    if len(agg):
        avg = agg[agg["metric"] == "average"].dropna(subset=["length"])
        eff = agg[agg["metric"] == "effective_length"]
        line = " | ".join(f"{fmt_len(L)}: {v:.1f}" for L, v in zip(avg["length"], avg["mean"]))
        e = eff["mean"].dropna()
        out.append("### RULER average over the tasks run (percent; 11 of RULER's 13: qa_1 / qa_2 need SQuAD / HotpotQA files "
                   "the shared data does not have) and effective length\n\n"
                   f"average by length: {line}\n\neffective length (the longest tested length up to which the "
                   "average stays above RULER's threshold 85.6, Llama-2-7B's at 4K): "
                   f"**{fmt_len(e.iloc[-1]) if len(e) and e.iloc[-1] > 0 else 'below the threshold at every length'}**\n")
    return out


def ppl_tables(root: Path) -> list[str]:
    s = summary(root, "passkey")
    s = s[s["task"] == "ppl"]
    if s.empty:
        return []
    t = s.pivot_table(index="metric", columns="length", values="mean", aggfunc="last")
    out = []
    T = 32768
    flat = ""
    if T in t.columns and "ppl" in t.index:
        from lctx.harness.steps.flatness import flat_until

        ratios = {int(L): float(t.loc["ppl", L] / t.loc["ppl", T]) for L in t.columns}
        t.loc["ppl / ppl(32K)"] = [ratios[int(L)] for L in t.columns]
        fu = flat_until(ratios, T, 1.1)
        flat = (f"\nflat until (lctx.harness.steps.flatness.flat_until, ppl / ppl(T) <= 1.1, T = 32K): "
                f"**{fmt_len(fu) if fu else 'none'}** (32K is the longest window tested)\n")
    t.columns = [fmt_len(c) for c in t.columns]
    out.append("### perplexity, pg98 (A Tale of Two Cities), its first 32,768 tokens, stride half the window; "
               "columns: window\n\n" + t.to_markdown(floatfmt=".4g") + "\n" + flat)
    return out


def accuracy_tables(root: Path) -> list[str]:
    rows = []
    for run in ("arc", "mmlu"):
        s = summary(root, run)
        for (task, metric), g in s.groupby(["task", "metric"]) if len(s) else ():
            if metric not in ("acc", "acc_norm"):
                continue
            n = int(g["n"].sum())
            base = "mmlu" if str(task).startswith("mmlu") else task
            rows.append({"task": base, "metric": metric, "n": n, "lctx": (g["mean"] * g["n"]).sum() / n})
    if not rows:
        return []
    t = pd.DataFrame(rows).groupby(["task", "metric"]).apply(
        lambda g: pd.Series({"questions": int(g["n"].sum()), "lctx": round(float((g["lctx"] * g["n"]).sum() / g["n"].sum()), 4)}),
        include_groups=False).reset_index()
    cmp = root / "direct-compare" / "lmeval_crosscheck.csv"
    if cmp.exists():
        c = pd.read_csv(cmp)
        c["task"] = c["task"].str.replace(r"^mmlu_.*", "mmlu", regex=True)
        c = c.groupby(["task", "metric"]).agg(lm_eval=("lm_eval", "mean"), differing=("questions_differing", "sum"),
                                              max_ll_diff=("max_ll_diff", "max")).reset_index()
        t = t.merge(c, on=["task", "metric"], how="left")
    from lctx.harness.run.intervals import wilson  # acc is 0/1 per question

    t["lctx 95 % interval"] = [f"[{lo:.2f}, {hi:.2f}]" for lo, hi in
                               (wilson(round(m * n), int(n)) for m, n in zip(t["lctx"], t["questions"]))]
    t["published (model card)"] = [f"{PUBLISHED[k][1]} ({PUBLISHED[k][0]}-shot)" if k in PUBLISHED else "-"
                                   for k in t["task"]]
    return ["### ARC (first 100 test questions of each, 0-shot) and MMLU (first question of each subject, 5-shot): "
            "lctx, lm-eval direct on the same weights, and the model card's numbers (its set-up: full test sets; "
            "ARC-c at 25 shots, so not comparable)\n\n" + t.to_markdown(index=False) + "\n"]


def crosscheck_table(root: Path) -> list[str]:
    out = []
    for sub, title in (("crosscheck", "lctx against llama.cpp (crosscheck.py): same GGUF, same prompt ids, greedy"),
                       ("crosscheck-explain", "the 32K cells again, with each side's log-probability of both "
                        "candidate tokens where the greedy continuations part (first_diff)")):
        p = root / sub / "crosscheck.csv"
        if not p.exists() or p.stat().st_size == 0:  # not run, or no cell finished yet
            continue
        t = pd.read_csv(p)
        t["length"] = t["length"].map(fmt_len)
        for c in ("lctx_answer", "llama_cpp_answer"):
            t[c] = t[c].map(json.dumps)
        if sub == "crosscheck":
            t = t.drop(columns=[c for c in t.columns if c.startswith(("lctx_lp", "cpp_lp"))])
        out.append(f"### {title}\n\n" + t.to_markdown(index=False) + "\n")
    return out


def cost_tables(root: Path) -> list[str]:
    rows = []
    for run, task in (("passkey", "passkey"), ("ruler", None)):
        recs = [r for r in records(root, run) if r.get("status") == "ok" and (task is None or r["task"] == task)]
        if not recs:
            continue
        df = pd.DataFrame([{"length": r["length"], "wall_s": r["wall_s"], "cpu_s": r.get("cpu_s", math.nan),
                            "peak": r.get("peak_mem_bytes") or 0,
                            "n_tokens": r.get("n_tokens"), "rev": str(r.get("git_rev"))[:7]} for r in recs])
        g = df.groupby("length").agg(samples=("wall_s", "size"), wall_med=("wall_s", "median"),
                                     cpu_n=("cpu_s", "count"), cpu_med=("cpu_s", "median"),
                                     peak=("peak", "max"), tokens=("n_tokens", "median"))
        label = "passkey" if task else "RULER (all tasks)"
        for L, r in g.iterrows():
            rows.append({"task": label, "length": fmt_len(L), "samples": int(r.samples),
                         "wall s per sample (median)": round(r.wall_med, 1),
                         "CPU s per sample (median (samples))": f"{r.cpu_med:.1f} ({int(r.cpu_n)})" if r.cpu_n else "-",
                         "peak RSS GiB (max)": round(r.peak / 2**30, 2)})
        sel = g.loc[[L for L in g.index if 4096 <= L <= 32768]]
        if len(sel) >= 2 and task:
            cpu = sel[sel.cpu_n > 0]
            rows.append({"task": label, "length": "exponent 4K-32K", "samples": int(sel.samples.sum()),
                         "wall s per sample (median)": round(slope(sel.index, sel.wall_med), 2),
                         "CPU s per sample (median (samples))": (f"{slope(cpu.index, cpu.cpu_med):.2f}"
                                                                 if len(cpu) >= 2 else "-"),
                         "peak RSS GiB (max)": ""})
    out = []
    if rows:
        out.append("### cost per sample (records' wall_s: the runner's time per sample, one thread, on a loaded machine; "
                   "cpu_s: the process's CPU seconds for the sample, in the records lctx wrote from a89e875 on (passkey-3, "
                   "ruler-16k); "
                   "peak_mem_bytes: the process's peak RSS so far); exponent: least-squares slope of log wall on log length\n\n"
                   + pd.DataFrame(rows).to_markdown(index=False) + "\n")
    jobs = []
    tim = root / "timings.tsv"
    seen: dict[str, int] = {}
    for line in tim.read_text().splitlines() if tim.exists() else []:
        name, t0, t1, rc = line.split("\t")
        # the job's k-th line that ended on its own owns the log's k-th /usr/bin/time block (a job stopped by
        # timeout, rc 124, prints none)
        k = seen[name] = seen.get(name, -1) + (rc != "124")
        log = (root / f"{name}.log").read_text(errors="replace") if (root / f"{name}.log").exists() else ""
        wall = re.findall(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log)
        user = re.findall(r"User time \(seconds\): (\S+)", log)
        syst = re.findall(r"System time \(seconds\): (\S+)", log)
        rss = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", log)
        has = rc != "124" and 0 <= k < min(len(wall), len(user), len(syst), len(rss))
        jobs.append({"job": name, "start (UTC)": t0[11:19], "end (UTC)": t1[11:19], "rc": rc,
                     "wall": wall[k] if has else "",
                     "CPU s": round(float(user[k]) + float(syst[k]), 1) if has else "",
                     "peak RSS GiB": round(int(rss[k]) / 2**20, 2) if has else ""})
    if jobs:
        out.append("### each job (/usr/bin/time -v; rc 124: stopped at STOP_AT, resumable, no time block; rc 137 at 13:19: the "
                   "job's `timeout` was killed by hand so that the job could run past STOP_AT: it did, and its wall / "
                   "CPU / RSS are its own, its end is later than the column says; rc 2: refused, the run directory "
                   "was in use by that job)\n\n"
                   + pd.DataFrame(jobs).to_markdown(index=False) + "\n")
    return out


def main(root: Path) -> None:
    parts = (passkey_tables(root) + ruler_tables(root) + ppl_tables(root) + accuracy_tables(root)
             + crosscheck_table(root) + cost_tables(root))
    print("\n".join(parts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
