"""Interleaved timings of one passkey sample (and of prefill alone) on a real checkpoint: the lean prefill against the masked one.

Every configuration runs the identical prompt ids, in the same process, on the same weights, one after the other
within each round (so a change in machine load hits all of them alike); the table reports per-configuration
medians and the per-round ratio to a named anchor. Configurations (--configs, comma-separated):

  lctx            lctx's passkey sample: HFAdapter.prefill (chunk --chunk-size) + greedy decode + the teacher-forced
                  digit_acc pass, on the default path (lctx_sdpa, the cache built from the config)
  lctx-c1024      the same at --chunk-size 1024       lctx-c4096   the same at 4096
  lctx-before     the masked prefill this replaced: transformers' sdpa (a [chunk, T] mask per chunk) and
                  DynamicCache() without the config (sliding layers keep every key)
  generate        a plain transformers script: model.generate(ids, max_new_tokens=N, do_sample=False) with sdpa
  prefill         HFAdapter.prefill only (lctx_sdpa)      llama.cpp   llama-cpp-python's Llama.eval of the same ids
                  (prompt processing only; n_threads = torch's threads)

Usage: python bench.py --model FILE.gguf --lengths 4096 --rounds 3 --configs lctx,generate --out DIR
Writes DIR/timings.csv (one row per round x config x length: wall_s, cpu_s, tokens, answer) and prints a summary.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import platform
import resource
import statistics
import subprocess
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

from lctx.models.adapters.hf import load_lm
from lctx.tasks.base import Cell
from lctx.tasks.passkey import Passkey


def sample_once(lm, task, sample) -> str:
    """One passkey sample as the runner scores it: prefill, greedy, rewind, teacher-forced digit_acc."""
    prefix = lm.prefix(sample.input_ids)
    cont = lm.greedy(prefix, task.max_new_tokens_for(sample))
    lm.rewind(prefix)
    scores = task.score_generated(lm, sample, prefix, cont)
    return f"exact={scores['exact']}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default="lctx,lctx-c1024,lctx-c4096,generate")
    ap.add_argument("--chunk-size", type=int, default=2048)
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--n-ctx", type=int, default=0, help="llama.cpp context (default: longest length + 64)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in a.lengths.split(",")]
    configs = a.configs.split(",")
    threads = torch.get_num_threads()
    lm = load_lm(a.model, device="cpu", dtype="float32", chunk_size=a.chunk_size)
    model = lm.model
    task = Passkey()
    samples = {T: task.build(lm, Cell(T, a.depth, 0), seed=0) for T in lengths}
    llm = None
    if "llama.cpp" in configs:
        from llama_cpp import Llama  # lazy: only for the llama.cpp anchor

        llm = Llama(model_path=str(a.model), n_ctx=a.n_ctx or max(lengths) + 64, n_threads=threads,
                    n_threads_batch=threads, n_batch=512, n_ubatch=512, verbose=False, logits_all=False)
    own_new_cache = lm.new_cache

    def run(cfg: str, T: int) -> str:
        s = dataclasses.replace(samples[T], meta=dict(samples[T].meta))  # score_generated pops prompt_text
        fresh = task
        if cfg.startswith("lctx") or cfg == "prefill":
            if cfg == "lctx-before":
                model.set_attn_implementation("sdpa")
                lm.new_cache = lambda capacity: DynamicCache()  # noqa: E731  (the pre-issue-28 cache)
            else:
                model.set_attn_implementation("lctx_sdpa")
                lm.new_cache = own_new_cache
            lm.chunk_size = int(cfg[6:]) if cfg.startswith("lctx-c") else a.chunk_size
            if cfg == "prefill":
                lm.prefill(s.input_ids)
                return ""
            return sample_once(lm, fresh, s)
        if cfg == "generate":
            model.set_attn_implementation("sdpa")
            with torch.inference_mode():
                g = model.generate(torch.tensor([s.input_ids]), max_new_tokens=fresh.max_new_tokens_for(s),
                                   do_sample=False, pad_token_id=lm.tokenizer.eos_token_id)
            return lm.decode(g[0, len(s.input_ids):].tolist()).strip()[:12]
        if cfg == "llama.cpp":
            llm.reset()
            llm.eval(s.input_ids)
            return ""
        raise SystemExit(f"unknown config {cfg!r}")

    rows = []
    for cfg in configs:  # warm-up: one untimed call per config at the shortest length (first-call allocations)
        run(cfg, lengths[0])
    for r in range(a.rounds):
        for T in lengths:
            for cfg in configs:
                w0, c0 = time.perf_counter(), time.process_time()
                ans = run(cfg, T)
                w, c = time.perf_counter() - w0, time.process_time() - c0
                rows.append({"round": r, "config": cfg, "length": T, "tokens": samples[T].n_tokens,
                             "wall_s": round(w, 4), "cpu_s": round(c, 4), "answer": ans})
                print(rows[-1], flush=True)
    with open(out / "timings.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    load = os.getloadavg()
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(out / "machine.txt", "w") as f:
        f.write(f"model {a.model}\nthreads {threads}\nplatform {platform.processor() or platform.machine()}\n"
                f"load average at end {load}\ngit {rev}\nmax RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB\n")
    print("\nmedian wall s (per config, length):")
    for T in lengths:
        med = {cfg: statistics.median(x["wall_s"] for x in rows if x["config"] == cfg and x["length"] == T)
               for cfg in configs}
        print(T, {k: round(v, 3) for k, v in med.items()})


if __name__ == "__main__":
    main()
