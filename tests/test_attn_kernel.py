"""One kernel-choice rule (lctx.kernels.choose_kernel) for every variant's fast path, and a recorded
``attn_kernel`` on every path a model's attention can take (sdpa, fast, PaTH's)."""

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
