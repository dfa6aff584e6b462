"""Markdown tables of the server backend's measurements (crosscheck.csv, overhead.csv, concurrency.csv in DIR).

Usage: python results/2026-12-02-server-backend/make_tables.py DIR > DIR/tables.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd


def main(d: Path) -> None:
    x = pd.read_csv(d / "crosscheck.csv")
    cols = ["task", "length", "depth", "n_tokens", "ids_equal", "metric", "server_score", "in_process_score",
            "answers_equal", "max_abs_logprob_diff", "server_answer", "in_process_answer"]
    print("## In-process vs server, per cell (sample 0)\n")
    print(x[cols].to_markdown(index=False, floatfmt=".3g"))
    same = (x["server_score"] == x["in_process_score"]).sum()
    print(f"\nprompt ids equal in {int(x['ids_equal'].sum())} of {len(x)} cells; scores equal in {same} of {len(x)}; "
          f"greedy texts equal in {int(x['answers_equal'].sum())} of {len(x)}; largest |log-prob difference| over the "
          f"generated tokens: {x['max_abs_logprob_diff'].max():.3g} nats\n")
    o = pd.read_csv(d / "overhead.csv")
    o["lctx_over_server"] = o["lctx_wall_s"] / o["server_total_s"]
    o["lctx_over_bare_client"] = o["lctx_wall_s"] / o["bare_client_s"]
    print("## Overhead per passkey sample at 2K (interleaved: lctx, then a bare client, per depth)\n")
    print(o.to_markdown(index=False, floatfmt=".3g"))
    print(f"\nmedian lctx / server-reported time: {o['lctx_over_server'].median():.3f}; median lctx / bare client: "
          f"{o['lctx_over_bare_client'].median():.3f}\n")
    c = pd.read_csv(d / "concurrency.csv")
    print("## --concurrency over two one-thread servers (passkey at 1K, 6 samples per sweep; interleaved)\n")
    print(c.to_markdown(index=False, floatfmt=".3g"))
    m = c.groupby("concurrency")["wall_s"].median()
    print(f"\nmedian sweep wall: concurrency 1 {m.get(1, float('nan')):.1f} s, concurrency 2 {m.get(2, float('nan')):.1f} s "
          f"(throughput x{m.get(1) / m.get(2):.2f})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
