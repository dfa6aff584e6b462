"""One script for a short GPU lease: kernel tests, bf16 accuracy at realistic sizes, benchmarks, 512K prefill.

Run from the repository root on a CUDA machine (about 10 minutes on an H200)::

    python -m lctx.harness.commands.gpu_check --out "$OUT/gpu-check" [--quick]

Each step writes its table under ``--out`` as soon as it finishes and a failing step is recorded and
skipped, so a lease that ends early still returns what was measured:

1. ``pytest.txt``: the kernel test files on CUDA (compiled Triton, not the interpreter).
2. ``accuracy.csv``: the fused prior kernel (Triton and FlexAttention) vs the dense float32 reference
   in bf16 at B=1, H=12, D=64, T=4K (every prior kind, +ssmax), max abs error of the outputs.
3. ``flash_vs_flex.csv``: forward time of the Triton kernel vs compiled FlexAttention, bf16, H=12,
   D=64, T=4K..128K (CUDA events, median of 5 after warm-up): the issue's "within 1.2x of Flex" target.
4. ``bench/``: ``lctx bench`` over every variant at 4K..512K (one head of dim 64, bf16, fast + sdpa).
5. ``prefill.csv``: passkey-style chunked prefill of a 125M-class model (d 768, 12 layers, 12 heads,
   vocab 32000, random weights) of each softmax variant at 512K tokens with ``attn_impl="fast"``: wall
   seconds, tokens per second and peak memory (bytes).

Raises:
    SystemExit: no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from lctx.models import LctxConfig, LctxForCausalLM
from lctx.models.bam import GGDPrior
from lctx.models.cache import PreallocatedKVCache
from lctx.models.variants import alibi_bias, alibi_slopes


def _median_ms(fn, reps: int = 5) -> float:
    """Median of ``reps`` timed calls of ``fn()`` in milliseconds (CUDA events, after one warm-up)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def step_pytest(out: Path) -> dict:
    """Run the kernel test files on CUDA; returns {"rc", "tail"}."""
    files = ["tests/test_flash_prior.py", "tests/test_interdomain_scan.py", "tests/test_path.py",
             "tests/test_cache.py"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files],
                       capture_output=True, text=True, timeout=240)
    (out / "pytest.txt").write_text(r.stdout + r.stderr)
    return {"rc": r.returncode, "tail": (r.stdout + r.stderr).strip().splitlines()[-1:]}


def _spec(kind: str, H: int, ssmax: bool, dev):
    """A PriorSpec as the variants build it: ALiBi slopes, or a GGD prior (reference form) with beta in
    [0.5, 1.5); each read by the kernels as a Toeplitz table."""
    from lctx.kernels.flash_prior import PriorSpec  # lazy: loads triton

    g = torch.Generator().manual_seed(0)
    sl = alibi_slopes(H).float()
    prior = GGDPrior(H)
    with torch.no_grad():
        prior.beta.copy_(0.5 + torch.rand(H, generator=g))
    bias = {"none": None, "alibi": lambda d: alibi_bias(sl, d), "ggd": prior.to(dev).bias}[kind]
    return PriorSpec(kind=kind, bias=bias, ssmax=(torch.ones(H, device=dev) if ssmax else None))


def step_accuracy(out: Path, T: int = 4096) -> list[dict]:
    """bf16 Triton / Flex vs dense fp32 reference at T tokens, 12 heads of dim 64."""
    import pandas as pd  # lazy: loads pandas

    # lazy: loads triton
    from lctx.kernels.flash_prior import dense_prior_attention, flash_prior_flex, flash_prior_triton

    dev, H, D = torch.device("cuda"), 12, 64
    rows = []
    for kind in ("none", "alibi", "ggd"):
        for ssmax in (False, True):
            q, k, v = (torch.randn(1, H, T, D, device=dev) for _ in range(3))
            spec = _spec(kind, H, ssmax, dev)
            ref, lse_ref = dense_prior_attention(q, k, v, spec)
            qb, kb, vb = (t.bfloat16() for t in (q, k, v))
            for name, fn in (("triton", flash_prior_triton), ("flex", flash_prior_flex)):
                o, lse = fn(qb, kb, vb, spec)
                rows.append({"kind": kind, "ssmax": ssmax, "impl": name, "T": T,
                             "max_abs_err": float((o - ref).abs().max()),
                             "lse_max_abs_err": float((lse - lse_ref).abs().max())})
            del ref, lse_ref
    pd.DataFrame(rows).to_csv(out / "accuracy.csv", index=False)
    return rows


def step_flash_vs_flex(out: Path, lengths: list[int]) -> list[dict]:
    """Forward ms of the Triton kernel vs compiled FlexAttention vs SDPA causal (no bias), bf16."""
    import pandas as pd  # lazy: loads pandas

    from lctx.kernels.flash_prior import flash_prior_flex, flash_prior_triton  # lazy: loads triton

    dev, H, D = torch.device("cuda"), 12, 64
    rows = []
    for T in lengths:
        q, k, v = (torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        sdpa = _median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        for kind in ("none", "alibi", "ggd"):
            spec = _spec(kind, H, False, dev)
            tri = _median_ms(lambda: flash_prior_triton(q, k, v, spec))
            flex = _median_ms(lambda: flash_prior_flex(q, k, v, spec, need_lse=False))
            rows.append({"T": T, "kind": kind, "triton_ms": tri, "flex_ms": flex, "sdpa_causal_ms": sdpa,
                         "triton_over_flex": tri / flex, "triton_over_sdpa": tri / sdpa})
        pd.DataFrame(rows).to_csv(out / "flash_vs_flex.csv", index=False)
    return rows


def step_bench(out: Path, lengths: str) -> dict:
    """``lctx bench`` on CUDA over every variant (one head of dim 64, bf16)."""
    r = subprocess.run([sys.executable, "-m", "lctx.cli", "bench", "--device", "cuda", "--dtype", "bfloat16",
                        "--lengths", lengths, "--impl", "fast,sdpa", "--repeats", "3", "--time-budget", "20",
                        "--out", str(out / "bench")], capture_output=True, text=True, timeout=300)
    (out / "bench.txt").write_text(r.stdout + r.stderr)
    return {"rc": r.returncode}


def step_prefill(out: Path, length: int, variants: list[str], chunk: int = 16384) -> list[dict]:
    """Chunked prefill of ``length`` tokens through a 125M-class random model per variant (bf16, fast)."""
    import pandas as pd  # lazy: loads pandas

    rows = []
    for variant in variants:
        row = {"variant": variant, "length": length, "chunk": chunk}
        try:
            cfg = LctxConfig(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                             variant=variant, attn_impl="fast", train_length=2048)
            model = LctxForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
            ids = torch.randint(3, 32000, (1, length), device="cuda")
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            with torch.inference_mode():
                cache = PreallocatedKVCache(length + 64)
                for s in range(0, length, chunk):
                    logits = model(ids[:, s:s + chunk], cache=cache, use_cache=True, logits_to_keep=1).logits
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            row.update(seconds=dt, tokens_per_s=length / dt, peak_bytes=int(torch.cuda.max_memory_allocated()),
                       finite=bool(torch.isfinite(logits).all()))
            del model, cache, logits, ids
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - record and go on
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        pd.DataFrame(rows).to_csv(out / "prefill.csv", index=False)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the steps; returns 0 (each step's failure is written to ``steps.json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="smaller lengths (a first smoke run)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA device")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    L = 64 * 1024 if args.quick else 512 * 1024
    steps = {
        "pytest": lambda: step_pytest(out),
        "accuracy": lambda: step_accuracy(out),
        "flash_vs_flex": lambda: step_flash_vs_flex(out, [4096, 16384] if args.quick else [4096, 16384, 65536, 131072]),
        "prefill": lambda: step_prefill(out, L, ["rope", "alibi", "ggd_bam", "ggd_bam+ssmax", "nope", "alibi_lsh"]),
        "bench": lambda: step_bench(out, "4k,16k" if args.quick else "4k,16k,64k,256k,512k"),
    }
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, fn in steps.items():
        t0 = time.perf_counter()
        try:
            res = fn()
            report[name] = {"ok": True, "seconds": time.perf_counter() - t0,
                            "result": res if isinstance(res, dict) else f"{len(res)} rows"}
        except Exception as e:  # noqa: BLE001
            report[name] = {"ok": False, "seconds": time.perf_counter() - t0,
                            "error": traceback.format_exc()[-2000:]}
        (out / "steps.json").write_text(json.dumps(report, indent=2, default=str))
        print(f"{name}: {'ok' if report[name]['ok'] else 'FAILED'} in {report[name]['seconds']:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
