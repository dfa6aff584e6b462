"""Tables and RULES.md's verdicts of results/2026-12-06-logn-at-eval: python tables.py RUN_DIR > tables.md.
Reads RUN_DIR/results.csv (models <name> as shipped and <name>+logn)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

df = pd.read_csv(Path(sys.argv[1]) / "results.csv")
df = df[(df.status == "ok") & (df.task == "passkey") & (df.metric == "exact")]
df = df.assign(x=[int(length // t) for length, t in zip(df.length, df.train_length)],
               base=[m.split("+")[0] for m in df.model], how=[m.split("+")[1] if "+" in m else "shipped"
                                                               for m in df.model])
far, near = df[df.depth < 1.0], df[df.depth == 1.0]
for title, part in [("far needles (depths 0-0.75, 32 prompts per length)", far),
                    ("near needle (depth 1.0, 8 prompts per length)", near)]:
    t = part.pivot_table(index=["base", "how"], columns="x", values="value", aggfunc="mean")
    t.columns = [f"{c}x" for c in t.columns]
    print(f"## passkey exact, {title}\n\n{t.map('{:.2f}'.format).to_markdown()}\n")
print("## verdicts (RULES.md)\n")
for base in sorted(df.base.unique()):
    diffs = {}
    for name, part in (("far", far), ("near", near)):
        p = part[part.base == base].pivot_table(index="x", columns="how", values="value", aggfunc="mean")
        diffs[name] = (p["logn"] - p["shipped"]) if {"logn", "shipped"} <= set(p.columns) else pd.Series(dtype=float)
    past = {k: v[v.index >= 2] for k, v in diffs.items()}
    tags = []
    if (past["far"] >= 0.3).any():
        tags.append("unlocks far retrieval")
    if (past["near"] >= 0.3).any():
        tags.append("recovers the near needle")
    if (past["far"] <= -0.3).any() or (past["near"] <= -0.3).any():
        tags.append("hurts")
    if not tags:
        tags.append("no effect at this scale" if all((v.abs() <= 0.1).all() for v in past.values()) else "mixed")
    nums = "; ".join(f"{k} logn - shipped: " + ", ".join(f"{x}x {d:+.2f}" for x, d in v.items())
                     for k, v in diffs.items())
    print(f"- **{base}**: {', '.join(tags)} ({nums})")
