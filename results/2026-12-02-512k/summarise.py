"""Summarise results/2026-12-02-512k/run.sh's output: one row per (model, length) with the sample's wall time
(the run table's wall_s), the whole command's wall, user + system CPU and peak RSS (/usr/bin/time -v), the
passkey score, and per model the time exponent b of wall_s ~ a T^b (least squares on log-log over the lengths
given, 16K and up).

Usage: python summarise.py OUT_DIR --out TABLE.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "2026-12-02-lean-prefill"))
from summarise import slope as exponent  # noqa: E402  (one least-squares log-log slope for both folders)


def _time_v(path: Path) -> dict:
    """{wall_s, cpu_s, rss_mib} from a /usr/bin/time -v report."""
    t = path.read_text()
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", t).group(1))
    sys_ = float(re.search(r"System time \(seconds\): ([\d.]+)", t).group(1))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1))
    w = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", t).group(1).split(":")
    wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(w)))
    return {"cmd_wall_s": round(wall, 1), "cmd_cpu_s": round(user + sys_, 1), "peak_rss_mib": round(rss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rows = []
    for run in sorted((a.out_dir / "run").iterdir()):
        name, L = run.name.rsplit("-", 1)
        tab = pd.read_csv(run / "results.csv")
        ex = tab[(tab["task"] == "passkey") & (tab["metric"] == "exact")].iloc[0]
        row = {"model": name, "length": L, "tokens": int(ex["n_tokens"]), "exact": ex["value"],
               "sample_wall_s": round(float(ex["wall_s"]), 1), "attn_kernel": ex.get("attn_kernel", "")}
        tv = a.out_dir / "time" / f"{run.name}.txt"
        if tv.exists():
            row.update(_time_v(tv))
        rows.append(row)
    df = pd.DataFrame(rows).sort_values(["model", "tokens"])
    lines = [df.to_markdown(index=False), ""]
    for m, g in df.groupby("model"):
        g = g[g["tokens"] >= 16000]
        if len(g) >= 2:
            b = exponent(list(g["tokens"]), list(g["sample_wall_s"]))
            lines.append(f"- {m}: time exponent {b:.2f} over {g['tokens'].min():,}-{g['tokens'].max():,} tokens "
                         f"(wall_s ~ T^b, least squares on log-log, {len(g)} lengths)")
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
