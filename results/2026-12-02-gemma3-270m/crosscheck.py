"""Gemma 3 270M through lctx against llama.cpp on the same GGUF and the same prompt ids.

The independent runtime is llama.cpp through its Python bindings (llama-cpp-python 0.3.36, the portable CPU
build of ``.ci/run``): ``Llama(n_ctx=max(LENGTHS) + 256, n_batch=512, flash_attn=True, logits_all=False,
1 thread)``. Flash
attention on (llama.cpp's own default is "auto"; the bindings' is off): without it one 8K prompt took 171 s against
lctx's 35 s on this machine, and 32K would take over 20 minutes per cell. ``logits_all`` stays off:
at 32K it would hold 32K x 262,144 float32 logits (34 GB); the last position's logits are read with
``llama_get_logits_ith(ctx, -1)`` after each decode step instead, which is all a greedy continuation and its
log-probabilities need. lctx's side is ``lctx run``'s in-process adapter (``--model gemma3-270m``: the GGUF
dequantised to float32 by transformers, lctx's chunked prefill and sliding-window KV cache).

Per cell (passkey at 1K, 8K and 32K, depths 0 / 0.5 / 1, sample 0 of seed 0: built here by lctx's passkey task
from the seed, so the same prompts as sample 0 of run.sh's passkey run, whose records hold the same keys):

* ``ids_equal``: llama.cpp's tokenisation of the prompt text (``tokenize(text, add_bos=True, special=True)``)
  against lctx's prompt ids; either way llama.cpp is then fed lctx's ids, so both runtimes see one prompt.
* each side's greedy continuation (up to the task's ``max_new_tokens``, stopping at EOS), the task's score of it
  (``exact``; the same scorer, fed each side's token ids), ``tokens_equal`` (the generated ids, token for token);
* ``max_abs_logprob_diff``: the largest |log p_llama.cpp - log p_lctx| over llama.cpp's generated tokens, lctx's
  teacher-forced on those same ids after the same prompt (float64 log-softmax on both sides), and where in the
  continuation it falls; ``first_diff``: the first generated position where the two greedy tokens differ.
* where the greedy tokens differ, why: at ``first_diff`` each runtime's log-probability of both candidates
  (``lctx_lp_lctx_tok`` / ``lctx_lp_cpp_tok``: lctx's of its own token and of llama.cpp's; ``cpp_lp_cpp_tok`` /
  ``cpp_lp_lctx_tok``: llama.cpp's), so the margin by which each side prefers its token is in the table: a
  near-tie that the two runtimes' rounding (float32 dequantised weights against Q4_K_M weights with quantised
  activations) breaks differently, or not.

Rows are appended to OUT/crosscheck.csv as each cell finishes (a stopped run resumes, skipping the cells done).

Usage: python results/2026-12-02-gemma3-270m/crosscheck.py OUT [LENGTHS [DEPTHS]]   (comma lists, default
1024,8192,32768 and 0,0.5,1; OMP_NUM_THREADS=1 LCTX_NUM_THREADS=1 for one thread on the lctx side)
"""

from __future__ import annotations

import csv
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

KEYS = ["task", "length", "depth", "sample", "n_tokens", "ids_equal", "lctx_exact", "llama_cpp_exact",
        "tokens_equal", "first_diff", "max_abs_logprob_diff", "at_token", "n_logprobs", "lctx_answer",
        "llama_cpp_answer", "lctx_s", "llama_cpp_s", "lctx_lp_lctx_tok", "lctx_lp_cpp_tok", "cpp_lp_cpp_tok",
        "cpp_lp_lctx_tok"]


def llama_greedy(llm, ids: list[int], n: int, stop: set[int], other: list[int] | None = None
                 ) -> tuple[list[int], list[float], list[float]]:
    """llama.cpp's greedy continuation of ``ids`` (a fresh KV cache), the float64 log-softmax of each generated
    token at its step (the logits of the last position, ``llama_get_logits_ith(ctx, -1)``) and, at each step, that
    of ``other``'s token at the same step (lctx's greedy ids: meaningful up to the first step where they differ)."""
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


def main(out: Path, lengths: list[int], depths: tuple[float, ...] = (0.0, 0.5, 1.0)) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "crosscheck.csv"
    done = set()
    if path.exists():
        with open(path) as f:
            done = {(r["task"], int(r["length"]), float(r["depth"])) for r in csv.DictReader(f)}
    from llama_cpp import Llama

    from lctx.model_files import resolve_model_path
    from lctx.models.adapters.hf import load_lm
    from lctx.tasks import Cell, get_task

    gguf, _ = resolve_model_path("gemma3-270m")
    local = load_lm(gguf, device="cpu", dtype="float32", progress=False)
    threads = int(os.environ.get("LCTX_NUM_THREADS", "1"))
    llm = Llama(model_path=gguf, n_ctx=max(lengths) + 256, n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, flash_attn=True, logits_all=False, verbose=False)
    bos = llm.token_bos()
    task = get_task("passkey")()
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, KEYS)
        if new:
            w.writeheader()
        for length in lengths:
            for depth in depths:
                if ("passkey", length, depth) in done:
                    continue
                cell = Cell(length, depth, 0)
                b = task.build(local, cell, 0)
                text = b.meta["prompt_text"]
                theirs = llm.tokenize(text.encode(), add_bos=not text.startswith("<bos>"), special=True)
                if len(theirs) > 1 and theirs[0] == theirs[1] == bos:
                    theirs = theirs[1:]
                n = task.max_new_tokens_for(b)
                stop = {local.tokenizer.eos_token_id}
                t0 = time.perf_counter()
                pb = local.prefix(b.input_ids)
                l_ids = local.greedy(pb, n, stop)
                local.rewind(pb)
                t1 = time.perf_counter()
                c_ids, c_lps, c_lps_of_l = llama_greedy(llm, b.input_ids, n, stop | {llm.token_eos()}, l_ids)
                t2 = time.perf_counter()
                l_lps = local.score_continuation(pb, c_ids).logprobs  # lctx teacher-forced on llama.cpp's ids
                l_own = local.score_continuation(pb, l_ids).logprobs  # and on its own greedy ids
                diffs = [abs(x - y) for x, y in zip(c_lps, l_lps)]
                k = int(np.argmax(diffs))
                first = next((i for i, (x, y) in enumerate(zip(l_ids, c_ids)) if x != y),
                             None if len(l_ids) == len(c_ids) else min(len(l_ids), len(c_ids)))
                sb = dict(b.meta)
                s_lctx = task.score_generated(local, b, pb, l_ids)["exact"]
                b.meta = sb
                local.rewind(pb)
                s_cpp = task.score_generated(local, b, pb, c_ids)["exact"]
                row = {"task": "passkey", "length": length, "depth": depth, "sample": 0, "n_tokens": len(b.input_ids),
                       "ids_equal": theirs == b.input_ids, "lctx_exact": s_lctx, "llama_cpp_exact": s_cpp,
                       "tokens_equal": l_ids == c_ids, "first_diff": first,
                       "max_abs_logprob_diff": round(diffs[k], 6), "at_token": k, "n_logprobs": len(diffs),
                       "lctx_answer": local.decode(l_ids), "llama_cpp_answer": local.decode(c_ids),
                       "lctx_s": round(t1 - t0, 1), "llama_cpp_s": round(t2 - t1, 1)}
                if first is not None and first < min(len(l_ids), len(c_ids)):  # both sides' view of the two tokens
                    row.update(lctx_lp_lctx_tok=round(l_own[first], 4), lctx_lp_cpp_tok=round(l_lps[first], 4),
                               cpp_lp_cpp_tok=round(c_lps[first], 4), cpp_lp_lctx_tok=round(c_lps_of_l[first], 4))
                w.writerow(row)
                f.flush()
                print(row, f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: crosscheck.py OUT [LENGTHS [DEPTHS]]   (comma lists; default 1024,8192,32768 and 0,0.5,1)")
    main(Path(sys.argv[1]), [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1024,8192,32768").split(",")],
         tuple(float(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "0,0.5,1").split(",")))
