"""Seconds of passkey samples with in-process prefix reuse (``-M prefix_reuse=true``) against fresh prefills,
measured side by side in one process, interleaved (the order alternates per round), so a busy CPU slows both
alike; the ratio is the result, not the seconds.

    OMP_NUM_THREADS=2 python tests/tools/prefix_reuse_speed.py --model FILE.gguf --length 8k --depths 5 --rounds 2

The samples are one length's depths 1.0 .. 0 (``--order cache``: the deepest needle first), sample 0; each is what
the runner does (prefill through ``lm.prefix``, greedy, teacher-forced digits). It checks that both give the same
metrics and greedy text and prints the largest difference of the answer tokens' log-probabilities. A model whose
cache cannot be reused (sliding-window layers, length-dependent RoPE: ``HFAdapter.reusable``) says so and stops.
"""

from __future__ import annotations

import argparse
import statistics
import time

from lctx.harness.args import parse_lengths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--length", default="4k")
    ap.add_argument("--depths", type=int, default=5, help="depths 1.0 .. 0 evenly, deepest first")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    from lctx.models.adapters.hf import load_lm  # lazy: loads torch, transformers
    from lctx.tasks.base import Cell  # lazy: loads torch
    from lctx.tasks.passkey import Passkey  # lazy: loads torch

    L = parse_lengths(a.length)[0]
    lm = load_lm(a.model, device="cpu")
    task = Passkey()
    cells = [Cell(L, 1 - i / max(a.depths - 1, 1), 0) for i in range(a.depths)]
    probe = lm.prefill(task.build(lm, cells[0], 0).input_ids[:64])[0]
    if not lm.reusable(probe.cache):
        print(f"{lm.name}: its cache cannot be reused (sliding-window layers or length-dependent RoPE); nothing to "
              "measure")
        return

    def run(reuse: bool):
        lm.prefix_reuse, lm._last_prefix = reuse, None
        samples = [task.build(lm, c, 0) for c in cells]
        t0 = time.perf_counter()
        got = [(task.score(lm, s), s.meta.get("continuation"), s.meta.get("answer_logprobs")) for s in samples]
        return time.perf_counter() - t0, got

    ratios = []
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        t = {}
        res = {}
        for reuse in order:
            t[reuse], res[reuse] = run(reuse)
        ratios.append(t[True] / t[False])
        same = all(x[0] == y[0] and x[1] == y[1] for x, y in zip(res[False], res[True]))
        diff = max(abs(p - q) for x, y in zip(res[False], res[True]) for p, q in zip(x[2] or [], y[2] or []))
        print(f"round {r + 1}: fresh {t[False]:.1f} s, reuse {t[True]:.1f} s, ratio {ratios[-1]:.3f}; metrics and "
              f"greedy text equal: {same}; largest answer log-prob difference {diff:.2e} nats")
    print(f"{lm.name} passkey {a.length}, {a.depths} depths: reuse / fresh median ratio "
          f"{statistics.median(ratios):.3f} over {a.rounds} rounds")


if __name__ == "__main__":
    main()
