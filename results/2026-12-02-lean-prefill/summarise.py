"""Tables of bench.py's timings.csv: per (length, config) the median wall and CPU seconds over the rounds, and the
median over rounds of each round's ratio to an anchor config (the two ran back to back in that round).

Usage: python summarise.py DIR/timings.csv --anchor generate [--exponent CONFIG ...]
--exponent: also fit t ~ a T^b (least squares of log median wall and of log median CPU on log tokens) per config.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd


def slope(x, y) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("timings", type=Path)
    ap.add_argument("--anchor", required=True)
    ap.add_argument("--exponent", nargs="*", default=[])
    a = ap.parse_args()
    t = pd.read_csv(a.timings)
    rows = []
    for (L, cfg), g in t.groupby(["length", "config"], sort=False):
        anc = t[(t["length"] == L) & (t["config"] == a.anchor)].set_index("round")
        r = g.set_index("round")
        rows.append({"length": L, "config": cfg, "rounds": len(g), "wall_s (median)": round(g["wall_s"].median(), 2),
                     "cpu_s (median)": round(g["cpu_s"].median(), 2),
                     f"wall / {a.anchor} (median of rounds)": round((r["wall_s"] / anc["wall_s"]).median(), 3),
                     f"cpu / {a.anchor} (median of rounds)": round((r["cpu_s"] / anc["cpu_s"]).median(), 3)})
    out = pd.DataFrame(rows)
    print(out.to_markdown(index=False))
    for cfg in a.exponent:
        g = t[t["config"] == cfg].groupby("tokens")[["wall_s", "cpu_s"]].median().reset_index()
        if len(g) >= 2:
            print(f"\n- {cfg}: time exponent over {g['tokens'].min():,}-{g['tokens'].max():,} tokens: "
                  f"wall {slope(g['tokens'], g['wall_s']):.2f}, CPU {slope(g['tokens'], g['cpu_s']):.2f}")


if __name__ == "__main__":
    main()
