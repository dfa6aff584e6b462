"""Per-sample time of an lctx passkey sample against a plain transformers ``generate`` loop on the same
prompt (issue 11, item 6), measured side by side in one process, interleaved (the order alternates per
repeat), so a busy shared CPU slows both alike; the ratio is the result, not the seconds.

    python tests/tools/generate_speed.py --model ../shared/data/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
        --length 4k --repeats 3
    python tests/tools/generate_speed.py --model ... --length 16k --rss-only    # peak RSS of one 16K sample

The baseline loads, with transformers alone, the Hugging Face directory lctx itself runs: for a GGUF file
the dequantised cache directory (:func:`lctx.models.adapters.gguf.cached_gguf_dir`, the same weights), for a
Hugging Face checkpoint the directory; ``--hf-dir`` names another (e.g. ``lctx convert gguf ... --out DIR``). lctx's sample = build + chunked prefill + greedy decode + the teacher-forced
digit score (``Passkey.score``); the baseline = tokenise + ``generate`` (greedy, the same number of new
tokens) + parse. The peak RSS printed is the process's (both sides together); the peak RSS of one 16K
lctx sample is measured in a fresh process with ``--rss-only``.

Where lctx's time goes: each lctx sample is timed by phase (prefill, greedy decode, teacher-forced digit
score: the three steps of :meth:`lctx.tasks.base.Task.score`, run here one by one); ``--chunk-sizes
2048,4096`` runs one lctx side per prefill chunk size (4096 at 4K = one forward, as ``generate`` does);
``--profile FILE`` writes a cProfile of one more lctx sample and prints its top functions.

    python tests/tools/generate_speed.py --model ... --length 4k --repeats 2 --chunk-sizes 2048,4096 \
        --profile OUT/speed.prof
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import re
import resource
import statistics
import time

from lctx.harness.args import parse_lengths
from lctx.models.adapters.gguf import cached_gguf_dir
from lctx.model_files import find_gguf


def generate_loop(model_dir: str, max_new_tokens: int):
    """The baseline: what a user writes with transformers alone (about 20 lines): load the directory, greedy
    ``generate`` of ``max_new_tokens`` tokens, first run of digits in the decoded text.

    Returns (run_one, tokenizer); ``run_one(input_ids: list[int]) -> (text, digits)``: the decoded new tokens
    and their first run of digits (``None`` when there is none).
    """

    import torch  # lazy: loads torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: loads transformers

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def run_one(input_ids: list[int]) -> tuple[str, str | None]:
        ids = torch.tensor([input_ids])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=tok.eos_token_id)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        m = re.search(r"\d+", text)
        return text, (m.group(0) if m else None)

    return run_one, tok


def main() -> None:
    """``python tests/tools/generate_speed.py``: prints per-repeat times (seconds), the median per side,
    the per-repeat ratios lctx / generate and the process's peak RSS (GiB); ``--rss-only``: one lctx
    sample and its peak RSS."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--hf-dir", default=None, help="directory the generate baseline loads (default: lctx's own)")
    ap.add_argument("--cache-dir", default=None, help="GGUF cache root, as lctx run --cache-dir")
    ap.add_argument("--length", default="4k")
    ap.add_argument("--depth", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rss-only", action="store_true", help="one lctx sample, then its peak RSS (fresh process)")
    ap.add_argument("--chunk-sizes", default=None,
                    help="comma-separated prefill chunk sizes (tokens), one lctx side each (default: lctx's 2048)")
    ap.add_argument("--profile", default=None, help="write a cProfile of one more lctx sample to this file")
    a = ap.parse_args()

    import torch  # lazy: loads torch

    from lctx.models.adapters.hf import load_lm  # lazy: loads torch, transformers
    from lctx.tasks.base import Cell, Task  # lazy: loads torch
    from lctx.tasks.passkey import Passkey  # lazy: loads torch

    L = parse_lengths(a.length)[0]
    lm = load_lm(a.model, device="cpu", cache_dir=a.cache_dir)
    task = Passkey()
    sample = task.build(lm, Cell(L, a.depth, 0), 0)
    prompt = sample.meta["prompt_text"]
    if a.rss_only:  # one lctx sample in this fresh process: its peak RSS
        t0 = time.perf_counter()
        m = task.score(lm, sample)
        print(f"{L} tokens: {m}, {time.perf_counter() - t0:.1f} s, peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
        return
    hf_dir = a.hf_dir or (str(cached_gguf_dir(a.model, cache_dir=a.cache_dir)[0]) if find_gguf(a.model) else a.model)
    run_hf, tok = generate_loop(hf_dir, task.max_new_tokens)
    ids = tok(prompt)["input_ids"]
    if ids != sample.input_ids:  # e.g. lctx checkpoints put BOS first, their tokenizer does not add it
        print(f"tokenizer(prompt) gives {len(ids)} ids, lctx's prompt {len(sample.input_ids)}: the baseline "
              "gets lctx's ids (same tokens on both sides)")
        ids = list(sample.input_ids)
    print(f"threads {torch.get_num_threads()}; prompt {len(sample.input_ids)} tokens; key {sample.meta['key']}",
          flush=True)

    if type(task).score is not Task.score:  # run_lctx below replays Task.score step by step
        raise SystemExit(f"error: {type(task).__name__} overrides Task.score; the phase timings would not be its own")
    chunks = [int(c) for c in a.chunk_sizes.split(",")] if a.chunk_sizes else [lm.chunk_size]

    def run_lctx(chunk: int):
        """One lctx sample: Task.score's three steps (prefill, greedy, score_generated), each timed (s)."""
        s = copy.deepcopy(sample)
        lm.chunk_size = chunk
        t0 = time.perf_counter()
        prefix, _ = lm.prefill(s.input_ids)
        t1 = time.perf_counter()
        stops, n = task.stop_ids(lm), task.max_new_tokens_for(s)
        cont = lm.greedy(prefix, n) if stops is None else lm.greedy(prefix, n, stops)
        t2 = time.perf_counter()
        m = task.score_generated(lm, s, prefix, cont)
        t3 = time.perf_counter()
        return (m, s.meta["continuation"]), {"prefill": t1 - t0, "decode": t2 - t1, "digit score": t3 - t2}

    sides = [f"lctx/{c}" for c in chunks] + ["generate"]
    times = {k: [] for k in sides}
    for r in range(a.repeats):
        order = sides[r % len(sides):] + sides[:r % len(sides)]  # each side goes first in turn
        for side in order:
            t0 = time.perf_counter()
            if side == "generate":
                out, phases = run_hf(ids), None
            else:
                out, phases = run_lctx(int(side.split("/")[1]))
            times[side].append(time.perf_counter() - t0)
            detail = f" ({', '.join(f'{k} {v:.2f}' for k, v in phases.items())})" if phases else ""
            print(f"repeat {r} {side:10s} {times[side][-1]:7.2f} s{detail}  -> {out}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("median per sample: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    for side in sides[:-1]:
        ratios = [x / y for x, y in zip(times[side], times["generate"])]
        label = "lctx" if len(chunks) == 1 else side
        print(f"{label}/generate per repeat {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f})")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    if a.profile:  # one more lctx sample (first chunk size) under cProfile
        prof = cProfile.Profile()
        prof.runcall(run_lctx, chunks[0])
        prof.dump_stats(a.profile)
        print(f"cProfile of one lctx sample (chunk {chunks[0]}), top 15 by cumulative time ({a.profile}):")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(15)
        print("top 15 by own time:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
