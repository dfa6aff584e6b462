"""Tables of results/2026-12-03-new-tasks from its run directories alone (no score is computed here: the means,
intervals and n are lctx's own, pooled over depths by lctx.harness.run.tables.over_depths, as `lctx run` prints
them).

    python results/2026-12-03-new-tasks/make_tables.py RUNS_DIR > results/2026-12-03-new-tasks/tables.md

RUNS_DIR holds smollm2/, gemma3/, bundled/, smollm2-seed1/ (each an lctx run directory) and compare-*.log.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from lctx.harness.run.tables import over_depths

TASKS = ("json_kv", "babi_qa1", "babi_qa2", "babi_qa3", "mrcr", "passkey")


def fmt_len(n: float) -> str:
    return f"{int(n) // 1024}K" if int(n) % 1024 == 0 else str(int(n))


def table(run: Path, title: str) -> str:
    """Per task and headline metric (and mrcr's sequence_ratio): mean [95 % interval] (n) by length."""
    s = pd.read_csv(run / "summary.csv")
    heads = {"json_kv": "string_match_all", "babi_qa1": "exact", "babi_qa2": "exact", "babi_qa3": "exact",
             "mrcr": "mrcr", "passkey": "exact"}
    keep = s[s["task"].isin(TASKS) & (s["metric"].isin(list(heads.values()) + ["sequence_ratio"]))]
    cells = over_depths(keep)
    lengths = sorted({int(x) for x in cells["length"].dropna()})
    lines = [f"### {title}", "", "| task | metric | " + " | ".join(fmt_len(L) for L in lengths) + " |",
             "|---|---|" + "--:|" * len(lengths)]
    for task in TASKS:
        for metric in (heads[task], "sequence_ratio") if task == "mrcr" else (heads[task],):
            r = cells[(cells["task"] == task) & (cells["metric"] == metric)]
            if not len(r):
                continue
            row = []
            for L in lengths:
                c = r[r["length"] == L]
                if not len(c):
                    row.append("–")
                    continue
                c = c.iloc[0]
                ci = (f" [{c.ci_low:.2f}, {c.ci_high:.2f}]" if pd.notna(c.ci_low) and pd.notna(c.ci_high) else "")
                row.append(f"{c['mean']:.2f}{ci} ({int(c.n)})")
            lines.append(f"| {task} | {metric} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(root: Path) -> None:
    print("<!-- made by make_tables.py from the run directories in runs/; do not edit -->\n")
    print("mean [95 % interval: Wilson for 0/1 scores, t otherwise, clipped to [0, 1]] (n samples: 3 depths x 4)\n")
    for name, title in (("smollm2", "SmolLM2-135M-Instruct (Q4_1 GGUF), seed 0"),
                        ("smollm2-seed1", "SmolLM2-135M-Instruct, seed 1 (json_kv, babi_qa1, passkey)"),
                        ("gemma3", "Gemma 3 270M (base, Q4_K_M GGUF, 32K; no chat template: no mrcr)"),
                        ("bundled", "bundled pydoc-tiny-rope (trained at 256 tokens; no chat template: no mrcr)")):
        if (root / name / "summary.csv").is_file():
            print(table(root / name, title))
    for name in ("bundled-mrcr", "gemma3-mrcr", "compare-seeds", "compare-planted"):
        p = root / f"{name}.log"
        if p.is_file():
            text = [ln for ln in p.read_text().splitlines() if ln.strip()]
            keep = [ln for ln in text if ln.startswith(("PASS", "FAIL", "error", "exit", "regression", "  "))]
            print(f"### {name}.log\n\n```\n" + "\n".join(keep[-12:]) + "\n```\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
