"""YaRN and linear scaling through lctx (``--position``) against llama.cpp's own on the same GGUF and the same prompt
ids, at 2x the checkpoint's context.

The checkpoint: SmolLM2-135M-Instruct Q4_1 (8K context). lctx's side is ``lctx run``'s in-process adapter with the
method (``load_lm(gguf, position=SPEC)``: the GGUF dequantised to float32 by transformers, the method applied to the
config's ``rope_parameters`` before the weights load, lctx's chunked prefill). The independent runtime is llama.cpp
through its Python bindings (llama-cpp-python 0.3.36, the CPU build of ``.ci/run``) with its own RoPE scaling:
``Llama(rope_scaling_type=YARN|LINEAR, rope_freq_scale=1/factor, yarn_orig_ctx=8192, yarn_beta_fast=32,
yarn_beta_slow=1, yarn_ext_factor=-1 (llama.cpp's default: 1 for YaRN), yarn_attn_factor=1, n_ctx=L+256,
flash_attn=True, logits_all=False)``: the command-line equivalent is ``llama-server --rope-scaling yarn
--rope-scale 2 --yarn-orig-ctx 8192``. ``shipped`` at 4K (within the context, no scaling on either side) is the
control of the comparison itself.

Per cell (passkey, sample 0 of seed 0, built by lctx's passkey task; both runtimes are fed lctx's prompt ids):
each side's greedy continuation (up to the task's ``max_new_tokens``, stopping at EOS), the task's ``exact`` of it,
``tokens_equal``; ``max_abs_logprob_diff``: the largest |log p_llama.cpp - log p_lctx| over llama.cpp's greedy
tokens (lctx teacher-forced on those ids after the same prompt; float64 log-softmax on both sides) and where it
falls; where the greedy tokens differ, both sides' log-probabilities of both candidates at the first difference.
Also the effective table lctx recorded (run.json's ``position.effective``): its first and last frequency and the
attention scaling, against the same numbers computed from llama.cpp's formula (ggml's ``rope_yarn``: the ramp
between ``floor``/``ceil`` of the correction dims, ``mscale = 1 + 0.1 ln(1/freq_scale)``).

Rows are appended to OUT/crosscheck.csv as each cell finishes (a stopped run resumes, skipping the cells done).

Usage: python results/2026-12-04-position-methods/crosscheck/crosscheck.py OUT [LENGTH]   (default 16384; threads:
LCTX_NUM_THREADS, default 1, for both sides)
"""

from __future__ import annotations

import csv
import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

GGUF = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "checkpoints" / "smollm2-135m-instruct" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"
ORIG = 8192
KEYS = ["method", "length", "depth", "n_tokens", "lctx_exact", "llama_cpp_exact", "tokens_equal", "first_diff",
        "max_abs_logprob_diff", "at_token", "n_logprobs", "lctx_answer", "llama_cpp_answer", "lctx_s", "llama_cpp_s",
        "lctx_lp_lctx_tok", "lctx_lp_cpp_tok", "cpp_lp_cpp_tok", "cpp_lp_lctx_tok", "lctx_first", "lctx_last",
        "lctx_scaling", "ggml_first", "ggml_last", "ggml_scaling"]


def ggml_table(method: str, factor: float, dim: int, base: float) -> tuple[float, float, float]:
    """(first, last frequency, cos/sin scaling) llama.cpp computes with, from ggml's rope_yarn (ggml-cpu ops.cpp:
    theta_interp = freq_scale * theta_extrap; ramp over i0/2 between floor(corr_dim(beta_fast)) and
    ceil(corr_dim(beta_slow)); mscale *= 1 + 0.1 ln(1/freq_scale) when ext_factor != 0)."""
    theta = [base ** (-2 * i / dim) for i in range(dim // 2)]
    if method == "shipped":
        return theta[0], theta[-1], 1.0
    fs = 1.0 / factor
    if method == "linear":
        return theta[0] * fs, theta[-1] * fs, 1.0

    def corr(r):
        return dim * math.log(ORIG / (r * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(0.0, math.floor(corr(32))), min(dim - 1.0, math.ceil(corr(1)))
    out = []
    for i, t in enumerate(theta):
        ramp = 1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))  # ext_factor 1
        out.append(fs * t * (1 - ramp) + t * ramp)
    return out[0], out[-1], 1 + 0.1 * math.log(1 / fs)


def llama_greedy(llm, ids: list[int], n: int, stop: set[int], other: list[int] | None = None):
    """llama.cpp's greedy continuation of ``ids`` (a fresh KV cache), the float64 log-softmax of each generated token
    (the last position's logits, ``llama_get_logits_ith(ctx, -1)``) and of ``other``'s token at the same step."""
    import llama_cpp

    llm.reset()
    llm.eval(ids)
    out, lps, olps = [], [], []
    for step in range(n):
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        row = row.astype(np.float64)
        tok = int(np.argmax(row))
        m = row.max()
        lse = m + np.log(np.exp(row - m).sum())
        lps.append(float(row[tok] - lse))
        if other is not None and step < len(other):
            olps.append(float(row[other[step]] - lse))
        out.append(tok)
        if tok in stop or len(out) == n:
            break
        llm.eval([tok])
    return out, lps, olps


def main(out: Path, length: int) -> None:
    import llama_cpp
    from llama_cpp import Llama

    from lctx.models.adapters.hf import load_lm
    from lctx.tasks import Cell, get_task

    out.mkdir(parents=True, exist_ok=True)
    path = out / "crosscheck.csv"
    done = set()
    if path.exists():
        with open(path) as f:
            done = {r["method"] for r in csv.DictReader(f)}
    threads = int(os.environ.get("LCTX_NUM_THREADS", "1"))
    cells = [("shipped", 4096, {}),
             ("yarn:factor=2", length, dict(rope_scaling_type=llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN,
                                            rope_freq_scale=0.5, yarn_orig_ctx=ORIG, yarn_beta_fast=32.0,
                                            yarn_beta_slow=1.0, yarn_ext_factor=-1.0, yarn_attn_factor=1.0)),
             ("linear:factor=2", length, dict(rope_scaling_type=llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
                                              rope_freq_scale=0.5))]
    task = get_task("passkey")()
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, KEYS)
        if new:
            w.writeheader()
        for spec, L, rope in cells:
            if spec in done:
                continue
            local = load_lm(str(GGUF), device="cpu", dtype="float32", progress=False,
                            position=None if spec == "shipped" else spec)
            rec = local.position["effective"]["rope"]["all"]
            cfg = local.model.config
            factor = float(spec.split("=")[1]) if "=" in spec else 1.0
            g = ggml_table(spec.split(":")[0], factor, cfg.head_dim, float(cfg.rope_parameters["rope_theta"]))
            llm = Llama(model_path=str(GGUF), n_ctx=L + 256, n_batch=512, n_ubatch=512, n_threads=threads,
                        n_threads_batch=threads, flash_attn=True, logits_all=False, verbose=False, **rope)
            b = task.build(local, Cell(L, 0.5, 0), 0)
            n = task.max_new_tokens_for(b)
            stop = {local.tokenizer.eos_token_id}
            t0 = time.perf_counter()
            pb = local.prefix(b.input_ids)
            l_ids = local.greedy(pb, n, stop)
            local.rewind(pb)
            t1 = time.perf_counter()
            c_ids, c_lps, c_lps_of_l = llama_greedy(llm, b.input_ids, n, stop | {llm.token_eos()}, l_ids)
            t2 = time.perf_counter()
            l_lps = local.score_continuation(pb, c_ids).logprobs
            l_own = local.score_continuation(pb, l_ids).logprobs
            diffs = [abs(x - y) for x, y in zip(c_lps, l_lps)]
            k = int(np.argmax(diffs))
            first = next((i for i, (x, y) in enumerate(zip(l_ids, c_ids)) if x != y),
                         None if len(l_ids) == len(c_ids) else min(len(l_ids), len(c_ids)))
            sb = dict(b.meta)
            s_lctx = task.score_generated(local, b, pb, l_ids)["exact"]
            b.meta = sb
            local.rewind(pb)
            s_cpp = task.score_generated(local, b, pb, c_ids)["exact"]
            row = {"method": spec, "length": L, "depth": 0.5, "n_tokens": len(b.input_ids), "lctx_exact": s_lctx,
                   "llama_cpp_exact": s_cpp, "tokens_equal": l_ids == c_ids, "first_diff": first,
                   "max_abs_logprob_diff": round(diffs[k], 6), "at_token": k, "n_logprobs": len(diffs),
                   "lctx_answer": local.decode(l_ids), "llama_cpp_answer": local.decode(c_ids),
                   "lctx_s": round(t1 - t0, 1), "llama_cpp_s": round(t2 - t1, 1),
                   "lctx_first": rec["first"], "lctx_last": rec["last"], "lctx_scaling": rec["attention_scaling"],
                   "ggml_first": g[0], "ggml_last": g[1], "ggml_scaling": g[2]}
            if first is not None and first < min(len(l_ids), len(c_ids)):
                row.update(lctx_lp_lctx_tok=round(l_own[first], 4), lctx_lp_cpp_tok=round(l_lps[first], 4),
                           cpp_lp_cpp_tok=round(c_lps[first], 4), cpp_lp_lctx_tok=round(c_lps_of_l[first], 4))
            w.writerow(row)
            f.flush()
            print(row, f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB", flush=True)
            del llm, local


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: crosscheck.py OUT [LENGTH]   (default 16384)")
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 16384)
