"""Long-context inference on CPU: a chunked prefill of a tiny model at 4K-32K tokens, peak memory vs length.

Each length runs in a fresh Python process (so no memory freed by an earlier length hides new
allocations) that loads the model, builds a random prompt (BOS + uniform token ids, seeded), then runs
``LM.prefill`` (chunked prefill into the KV cache, logits at the last position only) and a few greedy
decode steps. Peak memory is the process's resident high-water mark during prefill + decode minus its
resident size just before (Linux ``/proc/self/clear_refs`` resets ``VmHWM``; see
``lctx.harness.bench.PeakMemory``). With ``--warmup-tokens N`` a prefill of the first N tokens (and the
decode steps) runs before the measurement, so kernel compilation (``--attn-impl fast``: torch.compile /
Triton) is neither timed nor counted. The script prints, per length: wall time, measured peak, the
memory model's prediction (``lctx.harness.plan.plan_memory`` minus the weights, which are already
resident), the KV cache actually held, and the least-squares exponents of time and peak memory vs length
(1 = linear, 2 = quadratic).

    python benchmarks/long_cpu.py                                   # bundled pydoc-tiny-rope, 4k..32k
    python benchmarks/long_cpu.py --lengths 4k,8k,16k,32k --chunk-size 2048 --attn-impl sdpa --out long_cpu.csv
    python benchmarks/long_cpu.py --attn-impl fast --warmup-tokens 5000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "models" / "checkpoints" / "pydoc-tiny-rope"


def worker(model: str, length: int, chunk: int, impl: str | None, decode: int, seed: int, warmup: int = 0) -> dict:
    """Load, optionally warm up on the first ``warmup`` tokens, then prefill ``length`` tokens and decode
    ``decode`` tokens; return measurements (bytes, seconds)."""
    import torch

    from lctx.harness.bench import PeakMemory
    from lctx.harness.lm import load_lm
    from lctx.harness.plan import cache_bytes, plan_memory

    torch.manual_seed(seed)
    lm = load_lm(model, device="cpu", chunk_size=chunk)
    if impl:
        lm.model.config.attn_impl = impl  # the variants read their (shared) config at call time
    cfg = lm.model.config
    g = torch.Generator().manual_seed(seed)
    ids = lm.with_bos(torch.randint(3, cfg.vocab_size, (length - 1,), generator=g).tolist())
    plan = plan_memory(cfg, length, chunk_size=chunk, dtype=lm.dtype, impl=cfg.attn_impl)
    if warmup:  # compile kernels (torch.compile / Triton) before measuring: a short prefill + decode
        w, _ = lm.prefill(ids[: min(length, warmup)])
        lm.greedy(w, decode, stop_ids=set())
        del w
    with PeakMemory("cpu") as pm:
        t0 = time.perf_counter()
        prefix, _ = lm.prefill(ids)
        t_prefill = time.perf_counter() - t0
        out = lm.greedy(prefix, decode, stop_ids=set())
        t_total = time.perf_counter() - t0
    kv = sum(cache_bytes(prefix.cache, i) for i in range(cfg.num_hidden_layers))
    return {"length": length, "chunk": chunk, "attn_impl": cfg.attn_impl, "prefill_s": t_prefill,
            "total_s": t_total, "decoded": len(out), "logits_finite": bool(torch.isfinite(prefix.last_logits).all()),
            "peak_bytes": pm.peak, "mem_method": pm.method, "kv_cache_bytes": kv,
            "plan_bytes": plan.total - plan.get("weights"), "plan_path": plan.attn_path,
            "plan_largest": plan.largest().name}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--lengths", default="4k,8k,16k,32k")
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--attn-impl", default=None, help="override the checkpoint's attn_impl (fast, sdpa, reference)")
    p.add_argument("--decode", type=int, default=4, help="greedy decode steps after the prefill")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-tokens", type=int, default=0,
                   help="prefill this many tokens (+ decode) before measuring, so compilation is not measured "
                        "(use e.g. 5000 with --attn-impl fast)")
    p.add_argument("--out", default=None, help="write the table as CSV here")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is not None:
        print(json.dumps(worker(a.model, a.worker, a.chunk_size, a.attn_impl, a.decode, a.seed, a.warmup_tokens)), flush=True)
        return 0

    import pandas as pd

    from lctx.cli import parse_lengths
    from lctx.harness.bench import fit_exponent

    rows = []
    for T in parse_lengths(a.lengths):
        cmd = [sys.executable, __file__, "--worker", str(T), "--model", a.model, "--chunk-size", str(a.chunk_size),
               "--decode", str(a.decode), "--seed", str(a.seed), "--warmup-tokens", str(a.warmup_tokens)] + (["--attn-impl", a.attn_impl] if a.attn_impl else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
        if line is None:
            print(f"length {T}: worker failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
            return 1
        r = json.loads(line)
        rows.append(r)
        print(f"T={T:>6d}  prefill {r['prefill_s']:7.2f} s  peak {r['peak_bytes'] / 2**20:8.1f} MiB  "
              f"plan {r['plan_bytes'] / 2**20:8.1f} MiB  KV cache {r['kv_cache_bytes'] / 2**20:6.1f} MiB  "
              f"finite={r['logits_finite']}", flush=True)
    df = pd.DataFrame(rows)
    print(df.drop(columns=["mem_method"]).to_string(index=False))
    print(f"memory: {df['mem_method'].iloc[0]}")
    print(f"fitted exponent, peak memory vs length: {fit_exponent(df['length'], df['peak_bytes']):.3f}")
    print(f"fitted exponent, memory model vs length: {fit_exponent(df['length'], df['plan_bytes']):.3f}")
    print(f"fitted exponent, prefill time vs length: {fit_exponent(df['length'], df['prefill_s']):.3f}")
    if a.out:
        df.to_csv(a.out, index=False)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
