"""Compact tables for the seed experiments: one Markdown file from an lctx run directory and
the diagnostics, used by each ``results/2026-12-01-seed*/run.sh``.

    python results/seeds_table.py RUN_DIR [RUN_DIR ...] --out TABLE.md [--far-mass DIAG/far_mass.csv]
        [--prior DIAG/prior_params.csv ...] [--metric passkey.exact --metric flatness.ppl_ratio ...]

For each ``task.metric`` it writes a model x length table of the run's ``summary.csv`` (mean over depths
and samples; the header gives each length as a multiple of the training length). ``--far-mass`` adds the
mean far mass over layers and heads (``lctx diagnose far-mass``), ``--prior`` each head's learned beta and
alpha per layer (``lctx diagnose prior``). Nothing here computes a score: it only reshapes lctx's tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def _train_lengths(runs: list[Path]) -> dict[str, int]:
    out = {}
    for run in runs:
        res = run / "results.parquet"
        df = pd.read_parquet(res, columns=["model", "train_length"]) if res.exists() else pd.read_csv(
            run / "results.csv", usecols=["model", "train_length"])
        out.update({m: int(t) for m, t in df.dropna().drop_duplicates("model").itertuples(index=False)})
    return out


def metric_table(runs: list[Path], task: str, metric: str) -> str:
    s = pd.concat([pd.read_csv(run / "summary.csv") for run in runs])
    s = s[(s.task == task) & (s.metric == metric) & s.length.notna()]
    if s.empty:
        return ""
    s = s.assign(w=s.n.clip(lower=1), wm=lambda d: d["mean"] * d.n.clip(lower=1))
    if "variant" in s:  # one model under several --attn-override values: one row per variant
        several = s.groupby("model").variant.transform("nunique") > 1
        s = s.assign(model=s.model.where(~several, s.model + " (" + s.variant.astype(str) + ")"))
    g = s.groupby(["model", "length"]).agg(wm=("wm", "sum"), w=("w", "sum"))
    pv = (g.wm / g.w).unstack("length")
    T = _train_lengths(runs)
    t0 = next(iter(T.values()), None)
    cols = [f"{int(L)} ({L / t0:g}×)" if t0 else str(int(L)) for L in pv.columns]
    lines = [f"**{task} {metric}** (mean over depths and samples)", "",
             "| model | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for m, row in pv.iterrows():
        lines.append(f"| {m} | " + " | ".join("–" if pd.isna(v) else f"{v:.3g}" for v in row) + " |")
    return "\n".join(lines) + "\n"


def far_mass_table(path: Path) -> str:
    f = pd.read_csv(path)
    pv = f.groupby(["model", "length"]).far_mass.mean().unstack("length")
    d = int(f.distance.iloc[0])
    lines = [f"**far mass** (attention share on keys farther than {d} tokens, mean over layers, heads and the "
             "last queries)", "", "| model | " + " | ".join(str(int(c)) for c in pv.columns) + " |",
             "|---|" + "---|" * len(pv.columns)]
    for m, row in pv.iterrows():
        lines.append(f"| {m} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    return "\n".join(lines) + "\n"


def prior_table(paths: list[Path]) -> str:
    """The learned priors per layer and head: beta / alpha / d1, d1 the distance (tokens) at which the bias has
    fallen 1 nat below its peak (``fall_1nat`` of ``lctx diagnose prior``, or :func:`lctx.models.bam.fall_distance_of`
    from alpha, beta, mu and form for a csv written before that column): a length for any beta, where alpha is one
    only at beta = 1."""
    from lctx.models.bam import fall_distance_of  # lazy: loads torch (only with --prior)

    p = pd.concat([pd.read_csv(x) for x in paths])
    if "fall_1nat" not in p.columns:
        p["fall_1nat"] = [fall_distance_of(a, b, m, f) for a, b, m, f in zip(p.alpha, p.beta, p.mu, p.form)]
    lines = ["**learned GGD priors** (beta / alpha / d1 in tokens per layer and head; d1: the distance at which the "
             "bias has fallen 1 nat below its peak)", "",
             "| model | layer | " + " | ".join(f"h{h}" for h in sorted(p["head"].unique())) + " | beta <= 0 |",
             "|---|---|" + "---|" * (p["head"].nunique() + 1)]
    for (m, layer), g in p.groupby(["model", "layer"], sort=False):
        g = g.sort_values("head")
        cells = [f"{b:.2f} / {a:.3g} / {d:.3g}" for b, a, d in zip(g.beta, g.alpha, g.fall_1nat)]
        lines.append(f"| {m} | {layer} | " + " | ".join(cells) + f" | {(g.beta <= 0).sum()} of {len(g)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--metric", action="append", default=[], help="task.metric, e.g. passkey.exact")
    ap.add_argument("--far-mass", type=Path)
    ap.add_argument("--prior", type=Path, action="append", default=[])
    a = ap.parse_args(argv)
    parts = [metric_table(a.run, *m.split(".", 1)) for m in a.metric]
    if a.far_mass:
        parts.append(far_mass_table(a.far_mass))
    if a.prior:
        parts.append(prior_table(a.prior))
    a.out.write_text("\n".join(p for p in parts if p), encoding="utf-8")
    print(a.out.read_text())


if __name__ == "__main__":
    main()
