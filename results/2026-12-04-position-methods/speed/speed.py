"""Self-Extend and attention sinks against the model as shipped: paired, interleaved timings of
one long sample on SmolLM2-135M-Instruct's GGUF, in one process, so a busy shared CPU slows every method alike; the
ratio is the result, not the seconds.

    nice python results/2026-12-04-position-methods/speed/speed.py \
        --model ../shared/data/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
        > results/2026-12-04-position-methods/speed/speed.txt

A sample is what a passkey cell costs: lctx's chunked prefill of L tokens of a book (``HFAdapter.prefill``, chunks
of 2048) and 8 greedy decode steps through its cache. Three adapters of the same GGUF are loaded: as shipped
(``lctx_sdpa``), ``self_extend`` (w 1024, g 8) and ``sinks`` (4 + a window of 2048), each through
``PositionMethod.apply_model``. Each round runs every method once at every length, the order rotating per round;
the ratio of a method to the shipped sample of the same round is reported (median over rounds). Past the main
lengths, sinks and shipped are paired once at ``--long`` lengths, and sinks alone at ``--sinks-only`` lengths: its
cost per token stays flat (O(window) keys per query) where the shipped model's grows with the length.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default=None, help="a text file (default: Pride and Prejudice in the shared data)")
    ap.add_argument("--lengths", default="4096,8192")
    ap.add_argument("--long", default="16384", help="lengths where sinks and shipped are paired once")
    ap.add_argument("--sinks-only", default="32768", help="lengths where sinks runs alone")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--decode", type=int, default=8)
    a = ap.parse_args()

    import torch  # lazy: loads torch

    from lctx.models.adapters.hf import load_lm  # lazy: loads torch, transformers
    from lctx.models.position import parse_position  # lazy: loads torch, transformers

    torch.set_num_threads(a.threads)
    text_path = a.text or str(Path(a.model).resolve().parents[2] / "books" / "pg1342_pride_and_prejudice.txt")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# commit {rev}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    lms = {}
    for spec in ("shipped", "self_extend", "sinks"):
        lm = load_lm(a.model)
        if spec != "shipped":
            parse_position(spec).apply_model(lm)
        lms[spec] = lm
        print(f"# {spec}: {lm.attn_impl}, chunk {lm.chunk_size}")
    words = open(text_path, encoding="utf-8").read()
    ids_all = lms["shipped"].encode(words)
    while len(ids_all) < 32768 * 2:
        ids_all = ids_all + ids_all

    def sample(lm, n):
        t0 = time.perf_counter()
        prefix = lm.prefill(ids_all[:n])[0]
        out = lm.greedy(prefix, a.decode, stop_ids=set())
        return time.perf_counter() - t0, out

    sample(lms["shipped"], 512), sample(lms["self_extend"], 1536), sample(lms["sinks"], 2560)  # warm-up
    lengths = [int(x) for x in a.lengths.split(",") if x]
    names = list(lms)
    times = {(m, n): [] for m in names for n in lengths}
    for r in range(a.rounds):
        order = names[r % 3:] + names[:r % 3]
        for n in lengths:
            for m in order:
                t, out = sample(lms[m], n)
                times[(m, n)].append(t)
                print(f"round {r} L={n} {m}: {t:.2f} s, tokens {out[:4]}...", flush=True)
    print(f"\n# load average after the main rounds: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n| length | method | s per sample (median) | ratio to shipped (median of paired rounds) | per round |")
    print("|---|---|---|---|---|")
    for n in lengths:
        base = times[("shipped", n)]
        for m in names:
            t = times[(m, n)]
            ratios = [x / b for x, b in zip(t, base)]
            print(f"| {n} | {m} | {statistics.median(t):.2f} | {statistics.median(ratios):.2f}x | "
                  f"{', '.join(f'{x:.2f}' for x in ratios)} |")
    longs = [int(x) for x in a.long.split(",") if x]
    only = [int(x) for x in a.sinks_only.split(",") if x]
    if longs or only:
        print("\n| length | method | s per sample | ms per prompt token | ratio to shipped |")
        print("|---|---|---|---|---|")
    for n in longs:
        ts, _ = sample(lms["sinks"], n)
        tb, _ = sample(lms["shipped"], n)
        print(f"| {n} | shipped | {tb:.1f} | {1000 * tb / n:.2f} | 1 |")
        print(f"| {n} | sinks | {ts:.1f} | {1000 * ts / n:.2f} | {ts / tb:.2f}x |", flush=True)
    for n in only:
        ts, _ = sample(lms["sinks"], n)
        print(f"| {n} | sinks | {ts:.1f} | {1000 * ts / n:.2f} | (shipped not run) |", flush=True)
    print(f"\n# load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
