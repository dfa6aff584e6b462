"""Samples per second of ``lctx run --batch-size N`` against batch 1 (issue 15 item 3), measured side by side
in one process, interleaved (the order alternates per round), so a busy shared CPU slows both alike; the
ratio is the result, not the seconds.

    OMP_NUM_THREADS=1 python tests/tools/batch_speed.py --model models/checkpoints/pydoc-tiny-rope \
        --task passkey --length 1k --samples 8 --batch 4 --rounds 3

A sample is what the runner does for it: build the prompt (once, outside the timing), then
``Task.score`` (batch 1: prefill + greedy + teacher-forced digits) or ``Task.score_batch`` (batch N: one
left-padded prefill, one batched greedy decode, the rows' teacher-forced scores). It also checks that both
give the same metrics and prints the largest difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

from lctx.harness.args import parse_lengths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--task", default="passkey")
    ap.add_argument("--length", default="1k")
    ap.add_argument("--samples", type=int, default=8, help="samples per timing (depths 0..1 evenly, sample 0)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args()

    import torch  # lazy: loads torch

    from lctx.models.adapters.hf import load_lm  # lazy: loads torch, transformers
    from lctx.tasks import get_task  # lazy: loads torch
    from lctx.tasks.base import Cell  # lazy: loads torch

    L = parse_lengths(a.length)[0]
    lm = load_lm(a.model, device=a.device)
    opts = {"data_dir": a.data_dir} if a.data_dir and a.task != "passkey" else {}
    task = get_task(a.task)(**opts)
    cells = [Cell(L, i / max(a.samples - 1, 1), 0) for i in range(a.samples)]
    build = lambda: [task.build(lm, c, 0) for c in cells]  # noqa: E731 - scoring may pop meta entries

    def one():
        return [task.score(lm, s) for s in build()]

    def batched():
        ss, out = build(), []
        for i in range(0, len(ss), a.batch):
            out += task.score_batch(lm, ss[i:i + a.batch])
        return out

    def timed(fn):
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        got = fn()
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, got

    build()  # tokenizer warm-up
    timed(one), timed(batched)  # warm-up
    t1, tb, ratios = [], [], []
    m1 = mb = None
    for r in range(a.rounds):
        order = [("1", one), ("b", batched)] if r % 2 == 0 else [("b", batched), ("1", one)]
        got = {}
        for k, fn in order:
            got[k] = timed(fn)
        t1.append(got["1"][0])
        tb.append(got["b"][0])
        ratios.append(got["1"][0] / got["b"][0])
        m1, mb = got["1"][1], got["b"][1]
    diff = max(abs(x[k] - y[k]) for x, y in zip(m1, mb) for k in x)
    same = all(x == y for x, y in zip(m1, mb))
    n = len(cells)
    lens = sorted({s.n_tokens for s in build()})
    print(f"{lm.name} {a.task} L={L} ({lens[0]}..{lens[-1]} tokens) {n} samples, threads {torch.get_num_threads()}, "
          f"device {a.device}")
    print(f"batch 1: {n / statistics.median(t1):.3f} samples/s median, {n / min(t1):.3f} best "
          f"({a.rounds} rounds: {[round(t, 2) for t in t1]} s)")
    print(f"batch {a.batch}: {n / statistics.median(tb):.3f} samples/s median, {n / min(tb):.3f} best "
          f"({a.rounds} rounds: {[round(t, 2) for t in tb]} s)")
    print(f"speed-up batch {a.batch} / batch 1: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, "
          f"max {max(ratios):.2f} (per-round ratios, interleaved)")
    print(f"metrics identical: {same}; largest difference {diff:.3g}")


if __name__ == "__main__":
    main()
