"""lctx.kernels (kernels/__init__.py): one kernel-choice rule (choose_kernel) for every variant's fast path,
and a recorded ``attn_kernel`` on every path a model's attention can take (sdpa, fast, PaTH's)."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_config
from lctx.kernels import choose_kernel, impls_used, triton_runs
from lctx.models import LctxForCausalLM


def test_choose_kernel_rule(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    impls_used(reset=True)
    # CPU without the interpreter: the variant's PyTorch form, whatever is asked
    assert choose_kernel("v", "cpu", needs_grad=False, dtype=torch.float32) == "blocked"
    assert choose_kernel("w", "cpu", needs_grad=False, cpu="vectorized") == "vectorized"
    assert choose_kernel("x", "cpu", needs_grad=False, record=False) == "blocked"
    assert impls_used(reset=True) == {"v": "blocked", "w": "vectorized"}  # record=False notes nothing
    if not triton_runs("cuda"):
        pytest.skip("triton not importable: the Triton / Flex branches cannot be chosen")
    # CUDA (a device name only: nothing runs): Triton without gradients, else Flex where the variant has one
    assert choose_kernel("v", "cuda", needs_grad=False, dtype=torch.bfloat16) == "triton"
    assert choose_kernel("v", "cuda", needs_grad=True) == "flex"
    assert choose_kernel("v", "cuda", needs_grad=True, flex=False, cpu="vectorized") == "vectorized"
    # the interpreter on CPU: Triton in fp32 only (bf16 tl.dot is broken there), never with gradients
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_kernel("v", "cpu", needs_grad=False, dtype=torch.float32) == "triton"
    assert choose_kernel("v", "cpu", needs_grad=False, dtype=torch.bfloat16) == "blocked"
    assert choose_kernel("v", "cpu", needs_grad=True, dtype=torch.float32) == "blocked"
    impls_used(reset=True)


@pytest.mark.parametrize("variant,attn_impl,want", [
    ("alibi", "sdpa", "sdpa"),          # the softmax variants' sdpa path
    ("alibi", "fast", "blocked"),       # attend_fast on CPU
    ("rope", "sdpa", "sdpa"),
    ("alibi", "reference", None),       # the reference setting records nothing (runner: no attn_kernel)
    ("alibi_lsh", "sdpa", "reference"),  # no SDPA form: its blockwise reference ran, and says so
    ("interdomain", "sdpa", "chunked"),
    ("path", "sdpa", "reference"),      # fla's kernel needs CUDA: the PyTorch form ran, and says so
    ("path", "fast", "reference"),
    ("interdomain", "fast", "vectorized"),
])
def test_attn_kernel_recorded(monkeypatch, variant, attn_impl, want):
    """A forward of a tiny model notes which kernel ran (the runner writes it as the record's attn_kernel)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config(variant, attn_impl=attn_impl)).eval()
    impls_used(reset=True)
    with torch.no_grad():
        model(torch.randint(3, 200, (1, 40)))
    used = impls_used(reset=True)
    assert used == ({variant: want} if want else {})


@pytest.mark.parametrize("dispatch,want", [(True, "lsh-exact-alibi"), (False, "lsh-blocks")])
def test_alibi_lsh_rows_name_the_kernel_that_ran(monkeypatch, make_checkpoint, tmp_path, dispatch, want):
    """alibi_lsh with --attn-impl fast on CPU: on a short input the exact-ALiBi dispatch (lsh_exact_dispatch,
    the default) runs exact ALiBi, and every row of the results table says so in attn_kernel; with the option
    off the LSH kernel runs and the rows say that (issue 24, item 9)."""
    from lctx.models.adapters.hf import load_lm
    from lctx.harness.run.runner import RunSpec, run_sweep
    from lctx.tasks.passkey import Passkey

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the CPU branch (tests run Triton's interpreter otherwise)
    if torch.cuda.is_available():
        pytest.skip("the exact-ALiBi dispatch is the CPU fast path's")
    opts = {"lsh_samples": 4} if dispatch else {"lsh_samples": 4, "lsh_exact_dispatch": False}
    lm = load_lm(str(make_checkpoint("alibi_lsh", variant_options=opts)), device="cpu", attn_impl="fast")
    table = run_sweep([lm], [Passkey()], RunSpec([160], [0.5], samples=1), tmp_path, progress=False)["table"]
    assert set(table["variant"]) == {"alibi_lsh"} and set(table["attn_kernel"]) == {want}
