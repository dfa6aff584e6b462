"""Start-up cost (issues 14.5 and 15.4): the CLI's help, listings and one-line errors import neither the
transformers modeling stack nor lm-eval nor triton (nor pandas / matplotlib); ``import lctx.models`` still
registers the model with transformers' Auto classes. Each check runs in a fresh interpreter, so modules
other tests imported cannot hide an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("transformers", "lm_eval", "triton", "pandas", "matplotlib")


def _fresh(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _imported_after(stmt: str) -> list[str]:
    code = (f"import sys, json\n{stmt}\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    return _fresh(code)


def test_import_cli_pulls_in_nothing_heavy():
    assert _imported_after("import lctx.cli") == []


@pytest.mark.parametrize("args", [["--help"], ["list", "variants"], ["run", "--lengths", "1.5k"],
                                  ["bench", "--lengths", "1.5k"], ["list", "nothing"]])
@pytest.mark.slow
def test_cli_help_listing_and_one_line_errors_stay_light(args):
    stmt = (f"from lctx.cli import main\nimport contextlib, io\n"
            f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    main({args!r})")
    assert _imported_after(stmt) == []


@pytest.mark.slow
def test_import_lctx_models_still_registers_with_transformers():
    code = ("import json, lctx.models\nfrom transformers import AutoConfig, AutoModelForCausalLM\n"
            "cfg = AutoConfig.for_model('lctx', variant='alibi', hidden_size=32, num_attention_heads=4, "
            "num_hidden_layers=1, vocab_size=50)\n"
            "m = AutoModelForCausalLM.from_config(cfg)\n"
            "print(json.dumps([type(cfg).__name__, type(m).__name__]))")
    assert _fresh(code) == ["LctxConfig", "LctxForCausalLM"]
