"""The server backend against lctx's in-process run of the same GGUF.

Starts llama-cpp-python's server (0.3.36, portable CPU build, ``--n_ctx 4096 --logits_all true``) on 127.0.0.1 serving
SmolLM2-135M-Instruct Q4_1 and loads the same GGUF in process (dequantised to float32 by transformers). Then:

1. **Cross-check per cell** (passkey and niah_single_1 at 1K and 2K, depths 0 / 0.5 / 1, sample 0): the prompt ids
   each adapter builds (equal?), each adapter's greedy answer and the task's score of it, and the largest
   |log-probability| difference over the generated tokens (the server's own log-probabilities of the tokens it
   generated, which llama-cpp-python aligns correctly, against the in-process teacher-forced log-probabilities of the
   same tokens).
2. **Overhead at 2K**: passkey through ``lctx.evaluate`` (records' ``wall_s``, the runner's time per sample) against a
   bare ``openai`` client sending the same greedy request, interleaved sample by sample, and against the server's own
   timings (``llama_perf_context_print: total time`` lines of its log, one block per completion).
3. **Concurrency**: passkey at 1K, 6 samples, two servers of one thread each, ``--concurrency 1`` against 2, interleaved.

Usage: python results/2026-12-02-server-backend/crosscheck.py OUT [PARTS]   (PARTS: a comma list of crosscheck,
overhead,concurrency, default all; writes OUT/crosscheck.csv, OUT/overhead.csv,
OUT/concurrency.csv, OUT/summary.md; OMP_NUM_THREADS=1 for the in-process side)
"""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(os.environ.get("LCTX_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))
GGUF = DATA / "checkpoints" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(log: Path, threads: int = 2) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(GGUF), "--n_ctx", "4096",
                             "--logits_all", "true", "--n_threads", str(threads), "--n_threads_batch", str(threads),
                             "--host", "127.0.0.1", "--port",
                             str(port)], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    import urllib.request

    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(400):
        try:
            with urllib.request.urlopen(url + "/models", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("server did not start")


def perf_totals(log: Path) -> list[float]:
    """The server's ``total time`` (ms) of each completion, in order."""
    return [float(m.group(1)) for m in re.finditer(r"llama_perf_context_print:\s+total time =\s+([\d.]+) ms",
                                                    log.read_text(errors="replace"))]


def main(out: Path, parts: str = "crosscheck,overhead,concurrency") -> None:
    out.mkdir(parents=True, exist_ok=True)
    parts = set(parts.split(","))
    import lctx
    from lctx.models.adapters.hf import load_lm
    from lctx.models.adapters.server import load_server
    from lctx.tasks import Cell, get_task

    proc, url = start_server(out / "server.log")
    try:
        served = load_server(url, log=print)
        local = load_lm(str(GGUF), device="cpu", dtype="float32") if "crosscheck" in parts else None
        rows = []
        for name in ("passkey", "niah_single_1") if "crosscheck" in parts else ():
            task = get_task(name)(**({} if name == "passkey" else {"data_dir": str(DATA), "cache": False}))
            for length in (1024, 2048):
                for depth in (0.0, 0.5, 1.0):
                    cell = Cell(length, depth, 0)
                    a, b = task.build(served, cell, 0), task.build(local, cell, 0)
                    n = task.max_new_tokens_for(a)
                    ids_equal = a.input_ids == b.input_ids
                    # the server's greedy with its log-probabilities of the generated tokens
                    reply = served._request("greedy", a.input_ids, served.prefix(a.input_ids).text, max_tokens=n,
                                            temperature=0, seed=0, logprobs=1)
                    s_text = reply.choices[0].text
                    s_lps = reply.choices[0].logprobs.token_logprobs
                    pb = local.prefix(b.input_ids)
                    l_ids = local.greedy(pb, n)
                    l_text = local.decode(l_ids)
                    context = b.meta.get("prompt_text") or local.decode(b.input_ids)
                    gen_ids = local.continuation_ids(context, s_text)  # the generated text's tokens in context
                    l_lps = local.score_continuation(local.prefix(b.input_ids), gen_ids).logprobs
                    k = min(len(s_lps), len(l_lps))
                    same_tokens = len(s_lps) == len(l_lps)
                    dmax = max(abs(x - y) for x, y in zip(s_lps[:k], l_lps[:k])) if same_tokens and k else None
                    sa = task.score_generated(served, a, served.prefix(a.input_ids), served.encode(s_text))
                    sb = task.score_generated(local, b, pb, l_ids)
                    head = task.headline_metric
                    rows.append({"task": name, "length": length, "depth": depth, "n_tokens": len(a.input_ids),
                                 "ids_equal": ids_equal, "server_answer": s_text, "in_process_answer": l_text,
                                 "answers_equal": s_text == l_text, f"server_{head}": sa[head],
                                 f"in_process_{head}": sb[head], "metric": head, "server_score": sa[head],
                                 "in_process_score": sb[head], "max_abs_logprob_diff": dmax,
                                 "n_logprobs": k if same_tokens else None})
                    print(rows[-1], flush=True)
        keys = ["task", "length", "depth", "n_tokens", "ids_equal", "metric", "server_score", "in_process_score",
                "answers_equal", "max_abs_logprob_diff", "n_logprobs", "server_answer", "in_process_answer"]
        if rows:
            with open(out / "crosscheck.csv", "w", newline="") as f:
                w = csv.DictWriter(f, keys, extrasaction="ignore")
                w.writeheader()
                w.writerows(rows)
        del local
        if "overhead" not in parts:
            return _concurrency(out) if "concurrency" in parts else None

        # 2. overhead at 2K: lctx's runner time per sample vs a bare client's request, interleaved per sample
        import openai

        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        task = get_task("passkey")()
        over = []
        def flush() -> None:  # replace the server's cached prompt, so the next request starts cold
            client.completions.create(model=served.model_id, prompt="Hello there.", max_tokens=1, temperature=0)

        for i, depth in enumerate((0.0, 0.25, 0.5, 0.75, 1.0)):
            flush()
            mark = len(perf_totals(out / "server.log"))
            res = lctx.evaluate(served, ["passkey"], lengths=[2048], depths=[depth], samples=1, seed=i,
                                out=out / "overhead-run" / f"d{depth}", progress=False, log=lambda m: None,
                                warn=lambda m: None)
            rec = json.loads((res.out / "records.jsonl").read_text().splitlines()[-1])
            server_ms = sum(perf_totals(out / "server.log")[mark:])
            smp = task.build(served, Cell(2048, depth, 0), i)
            flush()
            t0 = time.perf_counter()
            client.completions.create(model=served.model_id, prompt=served.prefix(smp.input_ids).text,
                                      max_tokens=task.max_new_tokens, temperature=0, seed=0)
            bare = time.perf_counter() - t0
            over.append({"depth": depth, "n_tokens": rec["n_tokens"], "lctx_wall_s": rec["wall_s"], "bare_client_s": bare,
                         "server_total_s": server_ms / 1000.0})
            print(over[-1], flush=True)
        with open(out / "overhead.csv", "w", newline="") as f:
            w = csv.DictWriter(f, list(over[0]))
            w.writeheader()
            w.writerows(over)
    finally:
        proc.kill()
    if "concurrency" in parts:
        _concurrency(out)


def _concurrency(out: Path) -> None:
    """3. concurrency: two one-thread servers (prefill and decode threads both 1), --concurrency 1 vs 2,
    interleaved."""
    import lctx

    pa, ua = start_server(out / "a.log", threads=1)
    pb_, ub = start_server(out / "b.log", threads=1)
    conc = []
    try:
        for rep in range(2):
            for c in (1, 2):
                t0 = time.perf_counter()
                lctx.evaluate(f"{ua},{ub}", ["passkey"], lengths=[1024], depths=[0.0, 0.5, 1.0], samples=2, seed=rep,
                              concurrency=c, out=out / "concurrency-run" / f"c{c}-r{rep}", progress=False,
                              log=lambda m: None, warn=lambda m: None)
                conc.append({"rep": rep, "concurrency": c, "samples": 6, "wall_s": time.perf_counter() - t0})
                print(conc[-1], flush=True)
    finally:
        pa.kill()
        pb_.kill()
    with open(out / "concurrency.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(conc[0]))
        w.writeheader()
        w.writerows(conc)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
