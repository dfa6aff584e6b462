"""The tables and RULES.md's verdicts of results/2026-12-06-seed000-ssmax from a run.sh output folder:
python tables.py OUT > tables.md. Reads OUT/run/<model>/results.csv (model = <variant>_s<seed>) and
OUT/ckpt/<model>/train_log.json."""

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
df = df.assign(x=[int(length // train[m]) if length == length else 0 for m, length in zip(df.model, df.length)])
pk = df[(df.task == "passkey") & (df.metric == "exact")]
FAR, NEAR = pk[pk.depth < 1.0], pk[pk.depth == 1.0]


def wide(part: pd.DataFrame, fmt: str = "{:.2f}") -> str:
    """Model x multiple of the training length; markdown."""
    t = part.pivot_table(index="model", columns="x", values="value", aggfunc="mean")
    t.columns = [f"{c}x" for c in t.columns]
    return t.map(lambda v: fmt.format(v)).to_markdown()


print("## passkey exact, far needles (depths 0-0.75, 32 prompts per length)\n")
print(wide(FAR), "\n")
print("## passkey exact, near needle (depth 1.0, 8 prompts per length)\n")
print(wide(NEAR), "\n")
print("## passkey exact, all depths at 1x (the learned rule: >= 0.8)\n")
one = pk[pk.x == 1].groupby("model").value.mean()
print(one.map("{:.2f}".format).to_frame("1x exact").to_markdown(), "\n")
ppl = df[(df.task == "ppl") & (df.metric == "ppl")]
base = {m: ppl[(ppl.model == m) & (ppl.x == 1)].value.mean() for m in train}
print("## held-out ppl / ppl at 1x\n")
print(wide(ppl.assign(value=[v / base[m] for m, v in zip(ppl.model, ppl.value)])), "\n")
print("## training probe (20 fixed passkey prompts at the training length, teacher-forced)\n")
print("| model | first step with exact >= 0.8 | exact at the last step |\n|---|---|---|")
for p in sorted((OUT / "ckpt").iterdir()):
    ev = [e for e in json.loads((p / "train_log.json").read_text())["evals"] if "passkey_tf_exact" in e]
    first = next((e["step"] for e in ev if e["passkey_tf_exact"] >= 0.8), "never")
    print(f"| {p.name} | {first} | {ev[-1]['passkey_tf_exact']:.2f} |")


def far_at(m: str, x: int) -> float:
    return FAR[(FAR.model == m) & (FAR.x == x)].value.mean()


variants = sorted({m.rsplit("_s", 1)[0] for m in train})
seeds = {v: sorted(m for m in train if m.rsplit("_s", 1)[0] == v) for v in variants}
xs = sorted(x for x in pk.x.unique() if x >= 1)
print("\n## verdicts (RULES.md)\n")
alibi = seeds.get("alibi", [])
for v in [v for v in variants if v.startswith("ggd_bam")]:
    ms = seeds[v]
    learned = [m for m in ms if one.get(m, 0) >= 0.8]
    if not learned:
        verdict = "did not learn"
    elif len(learned) < len(ms) or not alibi:
        verdict = "inconclusive at this scale"
    elif all(any(far_at(m, x) >= 0.8 for x in xs if x >= 8) for m in ms) and all(
            max(far_at(a, x) for x in xs if x >= 8) < 0.5 for a in alibi):
        verdict = "direction reproduced"
    elif all(far_at(m, x) <= min(far_at(a, x) for a in alibi) for m in ms for x in xs if x >= 4):
        verdict = "refuted at this scale"
    else:
        verdict = "inconclusive at this scale"
    detail = "; ".join(f"{m}: 1x {one.get(m, float('nan')):.2f}, far " +
                       ", ".join(f"{x}x {far_at(m, x):.2f}" for x in xs if x >= 4) for m in ms)
    print(f"- **{v}** vs alibi: {verdict} ({len(learned)} of {len(ms)} seeds learned; {detail})")
for a in alibi:
    print(f"- alibi {a}: 1x {one.get(a, float('nan')):.2f}, far " + ", ".join(f"{x}x {far_at(a, x):.2f}" for x in xs
                                                                            if x >= 4))
