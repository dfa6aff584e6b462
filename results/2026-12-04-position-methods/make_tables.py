"""tables.md of the position-methods run, from its run directories alone: per method, passkey
and niah_single_2 by length (mean, 95 % Wilson interval, n; an errored sample counts as a miss), the same split into
the needles of the prompt's first half (depths below 0.5) and of its second half (0.5 and above), perplexity by length (windows pooled by
token-weighted NLL) with its ratio to 1x and to the shipped model at 1x, the effective length and verdict of
RULES.md, and the median seconds per sample.

Usage: python make_tables.py OUT > OUT/tables.md   (OUT: run.sh's output folder)
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from lctx.harness.run.intervals import wilson

THRESHOLD = 0.8  # RULES.md rule 1
HEADLINE = {"passkey": "exact", "niah_single_2": "string_match_all"}
TRAIN = {"SmolLM2-135M-Instruct.Q4_1": 8192, "gemma3-270m": 32768}


def records(out: Path) -> list[dict]:
    """Every record of every run directory under ``out`` (the job folders A-*, B-*, ...), with its base model and
    method label (from the run directory's run.json position record)."""
    rows = []
    for run in sorted(p for p in out.iterdir() if (p / "records.jsonl").is_file()):
        meta = json.loads((run / "run.json").read_text())
        pos = {name: m.get("position") or {} for name, m in meta.get("inputs", {}).get("models", {}).items()}
        for line in (run / "records.jsonl").read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            p = pos.get(r["model"], {})
            r["base"] = p.get("base", r["model"])
            r["method"] = label(p)
            rows.append(r)
    return rows


def label(pos: dict) -> str:
    """``NAME[:k=v,...]`` of a run.json position record (the options that differ from none; shipped as is)."""
    if not pos or pos.get("method") in (None, "shipped"):
        return "shipped"
    opts = {k: v for k, v in (pos.get("options") or {}).items() if v is not None and k != "layers"}
    keep = {"yarn": ("factor",), "linear": ("factor",), "dynamic": ("factor",), "ntk": ("factor",),
            "sinks": ("n_sink", "window"), "self_extend": ("window", "group")}.get(pos["method"], tuple(opts))
    parts = [f"{k}={int(v) if isinstance(v, float) and v.is_integer() else v}" for k, v in opts.items() if k in keep]
    return pos["method"] + (":" + ",".join(parts) if parts else "")


def fmt_len(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def cell(vals: list[float]) -> str:
    if not vals:
        return "not run"
    k, n = sum(vals), len(vals)
    lo, hi = wilson(k, n)
    return f"{k / n:.2f} [{lo:.2f}, {hi:.2f}] n={n}"


def retrieval(rows: list[dict], task: str, depths=None) -> dict:
    """{(base, method): {length: [0/1 per sample]}} of ``task``'s headline metric (an error is 0)."""
    out: dict = defaultdict(lambda: defaultdict(list))
    metric = HEADLINE[task]
    for r in rows:
        if r["task"] != task or (depths is not None and not depths(float(r.get("depth") or 0.0))):
            continue
        v = r.get("metrics", {}).get(metric) if r.get("status") == "ok" else None
        out[(r["base"], r["method"])][int(r["length"])].append(float(v) if v is not None else 0.0)
    return out


def effective(by_len: dict[int, list[float]]) -> int:
    """RULES.md rule 2: the longest tested length with every tested length up to it at mean >= THRESHOLD."""
    best = 0
    for L in sorted(by_len):
        if sum(by_len[L]) / len(by_len[L]) < THRESHOLD:
            break
        best = L
    return best


def table(title: str, data: dict, lengths: list[int], extra=None) -> list[str]:
    head = ["base", "method"] + [fmt_len(L) for L in lengths] + ([extra[0]] if extra else [])
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (base, method), by_len in sorted(data.items(), key=lambda kv: (kv[0][0], kv[0][1] != "shipped", kv[0][1])):
        row = [base, f"`{method}`"] + [cell(by_len.get(L, [])) for L in lengths]
        if extra:
            row.append(extra[1](by_len, base, method))
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def ppl_table(rows: list[dict]) -> list[str]:
    nll: dict = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0]))
    for r in rows:
        if r["task"] != "ppl" or r.get("status") != "ok":
            continue
        m = r["metrics"]
        acc = nll[(r["base"], r["method"])][int(r["length"])]
        acc[0] += m["nll"] * m["n_tokens"]
        acc[1] += m["n_tokens"]
        acc[2] += 1
    if not nll:
        return []
    lengths = sorted({L for v in nll.values() for L in v})
    head = ["base", "method"] + [f"ppl {fmt_len(L)}" for L in lengths] + ["ratio to 1x", "1x vs shipped"]
    lines = ["### Perplexity (PG book windows, two per length unless said, pooled by token-weighted NLL)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (base, method), by_len in sorted(nll.items(), key=lambda kv: (kv[0][0], kv[0][1] != "shipped", kv[0][1])):
        T = TRAIN.get(base)
        ppl = {L: math.exp(s / n) for L, (s, n, _) in by_len.items() if n}
        wins = {L: k for L, (_, _, k) in by_len.items()}
        ratios = ", ".join(f"{fmt_len(L)}: {ppl[L] / ppl[T]:.3f}" for L in sorted(ppl) if T in ppl and L != T)
        ship = nll.get((base, "shipped"), {}).get(T)
        vs = f"{ppl[T] / math.exp(ship[0] / ship[1]):.3f}" if ship and ship[1] and T in ppl else "not run"
        lines.append("| " + " | ".join([base, f"`{method}`"] + [f"{ppl[L]:.2f}" + ("" if wins[L] == 2 else f" ({wins[L]} window{'s' if wins[L] != 1 else ''})")
                                                                if L in ppl else "not run" for L in lengths] + [ratios or "not run", vs]) + " |")
    return lines + [""]


def seconds_table(rows: list[dict]) -> list[str]:
    secs: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["task"] in ("passkey", "niah_single_2") and r.get("status") == "ok" and r.get("wall_s") is not None:
            secs[(r["base"], r["method"])][int(r["length"])].append(float(r["wall_s"]))
    lengths = sorted({L for v in secs.values() for L in v})
    head = ["base", "method"] + [fmt_len(L) for L in lengths]
    lines = ["### Median wall seconds per retrieval sample (threads and the machine's load: the README)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (base, method), by_len in sorted(secs.items(), key=lambda kv: (kv[0][0], kv[0][1] != "shipped", kv[0][1])):
        lines.append("| " + " | ".join([base, f"`{method}`"] + [f"{statistics.median(by_len[L]):.0f}" if L in by_len
                                                                else "" for L in lengths]) + " |")
    return lines + [""]


def main(out: str) -> None:
    rows = records(Path(out))
    print("# Positional methods: tables from the run directories (make_tables.py)\n")
    for task in ("passkey", "niah_single_2"):
        data = retrieval(rows, task)
        if not data:
            continue
        lengths = sorted({L for v in data.values() for L in v})
        eff = ("effective length (rule 2)", lambda by_len, b, m: fmt_len(effective(by_len)) if effective(by_len)
               else "none")
        print("\n".join(table(f"{task}: {HEADLINE[task]}, every depth (mean [95 % Wilson], n)", data, lengths, eff)))
        far = retrieval(rows, task, depths=lambda d: d < 0.5)
        near = retrieval(rows, task, depths=lambda d: d >= 0.5)
        print("\n".join(table(f"{task}: needles in the prompt's first half (depths below 0.5: farthest from the "
                               "question)", far, lengths)))
        print("\n".join(table(f"{task}: needles in its second half (depths 0.5 and above)", near, lengths)))
    print("\n".join(ppl_table(rows)))
    print("\n".join(seconds_table(rows)))


if __name__ == "__main__":
    main(sys.argv[1])
