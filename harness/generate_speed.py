"""Per-sample time of an lctx passkey sample against a plain transformers ``generate`` loop on the same
prompt (issue 11, item 6), measured side by side in one process, interleaved (the order alternates per
repeat), so a busy shared CPU slows both alike; the ratio is the result, not the seconds.

    python -m lctx.harness.generate_speed --model ../shared/data/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \
        --length 4k --repeats 3
    python -m lctx.harness.generate_speed --model ... --length 16k --rss-only    # peak RSS of one 16K sample

The baseline loads, with transformers alone, the Hugging Face directory lctx itself runs: for a GGUF file
the dequantised cache directory (:func:`lctx.harness.gguf.cached_gguf_dir`, the same weights), for a
Hugging Face checkpoint the directory; ``--hf-dir`` names another (e.g. ``lctx convert gguf ... --out DIR``). lctx's sample = build + chunked prefill + greedy decode + the teacher-forced
digit score (``Passkey.score``); the baseline = tokenise + ``generate`` (greedy, the same number of new
tokens) + parse. The peak RSS printed is the process's (both sides together); the peak RSS of one 16K
lctx sample is measured in a fresh process with ``--rss-only``.
"""

from __future__ import annotations

import argparse
import copy
import re
import resource
import statistics
import time

from lctx.harness.args import parse_lengths
from lctx.harness.gguf import cached_gguf_dir, find_gguf


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
    """``python -m lctx.harness.generate_speed``: prints per-repeat times (seconds), the median per side,
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
    a = ap.parse_args()

    import torch  # lazy: loads torch

    from lctx.harness.lm import load_lm  # lazy: loads torch, transformers
    from lctx.tasks.base import Cell  # lazy: loads torch
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

    def run_lctx():
        s = copy.deepcopy(sample)
        return task.score(lm, s), s.meta["continuation"]

    times = {"lctx": [], "generate": []}
    for r in range(a.repeats):
        order = ["lctx", "generate"] if r % 2 == 0 else ["generate", "lctx"]
        for side in order:
            t0 = time.perf_counter()
            out = run_lctx() if side == "lctx" else run_hf(ids)
            times[side].append(time.perf_counter() - t0)
            print(f"repeat {r} {side:8s} {times[side][-1]:7.2f} s  -> {out}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = [x / y for x, y in zip(times["lctx"], times["generate"])]
    print(f"median per sample: lctx {med['lctx']:.2f} s, generate {med['generate']:.2f} s; "
          f"lctx/generate per repeat {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
