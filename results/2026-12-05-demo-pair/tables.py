"""The tables of results/2026-12-05-demo-pair from a run.sh output folder: python tables.py OUT > tables.md.

Reads OUT/run/<model>/results.csv (one lctx run per checkpoint) and OUT/ckpt/<model>/train_log.json; prints passkey
exact per length (all depths, then depth 1.0 = the needle next to the question, and depths 0-0.75), ppl per length
with its ratio to 1x, the training probe's first step at exact >= 0.8, and RULES.md's verdicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

OUT = Path(sys.argv[1])
runs = sorted(p for p in (OUT / "run").iterdir() if (p / "results.csv").is_file())
df = pd.concat([pd.read_csv(p / "results.csv") for p in runs], ignore_index=True)
df = df[df.status == "ok"]
train = {m: int(g.train_length.iloc[0]) for m, g in df.groupby("model")}


def table(frame: pd.DataFrame, value: str, fmt: str = "{:.2f}") -> str:
    """Model x length (as a multiple of the training length) of ``value``; markdown."""
    frame = frame.assign(x=[f"{length // train[m]}x" for m, length in zip(frame.model, frame.length)])
    wide = frame.pivot_table(index="model", columns="x", values=value, aggfunc="mean")
    wide = wide[sorted(wide.columns, key=lambda c: int(c[:-1]))]
    return wide.map(lambda v: fmt.format(v)).to_markdown()


pk = df[(df.task == "passkey") & (df.metric == "exact")]
print("## passkey exact (mean over samples)\n")
for title, part in [("all depths", pk), ("depth 1.0 (the needle next to the question)", pk[pk.depth == 1.0]),
                    ("depths 0-0.75", pk[pk.depth < 1.0])]:
    print(f"### {title}\n\n{table(part, 'value')}\n")
ppl = df[(df.task == "ppl") & (df.metric == "ppl")]
print(f"## held-out pydoc ppl\n\n{table(ppl, 'value', '{:.1f}')}\n")
ratio = ppl.assign(ratio=[v / ppl[(ppl.model == m) & (ppl.length == train[m])].value.mean()
                          for m, v in zip(ppl.model, ppl.value)])
print(f"## ppl / ppl at 1x\n\n{table(ratio, 'ratio')}\n")

print("## training probe (20 fixed passkey prompts at 128 tokens, teacher-forced)\n")
print("| model | first step with exact >= 0.8 | exact at the last step | wall s |\n|---|---|---|---|")
for p in sorted((OUT / "ckpt").iterdir()):
    log = json.loads((p / "train_log.json").read_text())
    ev = [e for e in log["evals"] if "passkey_tf_exact" in e]
    first = next((e["step"] for e in ev if e["passkey_tf_exact"] >= 0.8), "never")
    print(f"| {p.name} | {first} | {ev[-1]['passkey_tf_exact']:.2f} | {log['wall_seconds']:.0f} |")

# RULES.md, decided before the run
print("\n## verdicts (RULES.md)\n")
at = lambda m, x, part=pk: part[(part.model == m) & (part.length == x * train[m])].value.mean()  # noqa: E731
variants = sorted({m[len("pydoc-passkey-"):].rsplit("-s", 1)[0] for m in train})
for seed in sorted({m.rsplit("-s", 1)[1] for m in train}):
    pair = [f"pydoc-passkey-{v}-s{seed}" for v in variants]
    if len(pair) != 2 or any(m not in train for m in pair):
        continue
    a, b = pair
    learned = {m: at(m, 1) >= 0.8 for m in pair}
    r = ratio[ratio.length == 8 * train[a]]
    ratio8 = {m: r[r.model == m].ratio.mean() for m in pair}
    contrast = (abs(at(a, 4) - at(b, 4)) >= 0.3 or abs(at(a, 8) - at(b, 8)) >= 0.3
                or max(ratio8.values()) >= 1.5 * min(ratio8.values()))
    ship = all(learned.values()) and contrast
    v1, v2 = variants
    print(f"- seed {seed}: 1x exact {v1} {at(a, 1):.2f}, {v2} {at(b, 1):.2f} "
          f"({'both learned' if all(learned.values()) else 'did not learn: ' + ', '.join(m for m, v in learned.items() if not v)}); "
          f"4x/8x exact {v1} {at(a, 4):.2f}/{at(a, 8):.2f}, {v2} {at(b, 4):.2f}/{at(b, 8):.2f}; "
          f"ppl ratio at 8x {v1} {ratio8[a]:.2f}, {v2} {ratio8[b]:.2f}; "
          f"contrast {'visible' if contrast else 'not visible'} -> {'shippable' if ship else 'not shippable'}")
