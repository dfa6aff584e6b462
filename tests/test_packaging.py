"""lctx installs its folders under the `lctx` namespace: generic names stay free for other libraries."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_py(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_generic_top_level_names_not_shadowed(tmp_path):
    # transformers probes for an installed package called `kernels` (HF kernels hub); lctx must not be it.
    r = run_py("""
        import importlib.util, json
        import lctx, lctx.kernels, lctx.models, lctx.tasks, lctx.harness
        names = ["kernels", "models", "tasks", "harness", "cli"]
        print(json.dumps({n: importlib.util.find_spec(n) is not None for n in names}))
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == '{"kernels": false, "models": false, "tasks": false, "harness": false, "cli": false}'


@pytest.mark.slow
def test_transformers_and_lm_eval_unaffected(tmp_path):
    r = run_py("""
        import lctx.models
        from transformers.utils import import_utils
        assert not import_utils.is_kernels_available(), "transformers thinks lctx is the kernels package"
        from lm_eval.api.registry import get_model
        assert get_model("hf").__name__ == "HFLM"
        import lm_eval.tasks
        print("ok")
    """, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")
