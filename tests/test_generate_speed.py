"""tests/tools/generate_speed.py (issue 11 item 6): the transformers generate baseline and lctx's passkey
sample decode the same tokens, so the timing compares like with like."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from tools.generate_speed import generate_loop
from lctx.models.adapters.hf import load_lm
from lctx.tasks.base import Cell
from lctx.tasks.passkey import Passkey

BUNDLED = Path(__file__).resolve().parents[1] / "models" / "checkpoints" / "pydoc-tiny-rope"


@pytest.mark.slow
def test_generate_baseline_decodes_what_lctx_decodes():
    # both greedy on the same ids: transformers' generate and lctx's chunked prefill + KV-cache decode must
    # produce the same text (greedy decoding is deterministic; a difference means different logits)
    lm = load_lm(str(BUNDLED), device="cpu")
    task = Passkey()
    sample = task.build(lm, Cell(256, 0.5, 0), 0)
    run_hf, _ = generate_loop(str(BUNDLED), task.max_new_tokens)
    s = copy.deepcopy(sample)
    task.score(lm, s)
    text, _ = run_hf(list(sample.input_ids))
    assert text == s.meta["continuation"]


@pytest.mark.slow
def test_module_entry_prints_the_ratio(tmp_path):
    prof = tmp_path / "one.prof"
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "tools" / "generate_speed.py"), "--model", str(BUNDLED),
                        "--length", "256", "--repeats", "2", "--chunk-sizes", "64", "--profile", str(prof)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "lctx/generate per repeat" in r.stdout and "peak RSS" in r.stdout
    # each lctx sample is split into Task.score's three phases; the order alternates between repeats
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("repeat ")]
    assert [ln.split()[2] for ln in lines] == ["lctx/64", "generate", "generate", "lctx/64"]
    assert all("prefill" in ln and "decode" in ln and "digit score" in ln for ln in lines if "lctx/" in ln)
    assert prof.stat().st_size > 0 and "cProfile of one lctx sample (chunk 64)" in r.stdout
