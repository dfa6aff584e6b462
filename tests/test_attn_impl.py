"""The one attention-implementation registry (lctx.attn_impl, issue 26): lookups, the one-line error for an
unknown name, every registered implementation reachable from a layer, and the entry's attributes (not its
name) deciding which path runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import tiny_config

import lctx
from lctx.attn_impl import ATTN_IMPL_REGISTRY, AttnImpl, AttnImplRegistry, get_attn_impl
from lctx.errors import LctxError
from lctx.kernels import impls_used
from lctx.models import LctxForCausalLM


def test_lookup_and_names():
    assert lctx.ATTN_IMPLS == ATTN_IMPL_REGISTRY.names() == ("reference", "sdpa", "fast")
    ref, sdpa, fast = (get_attn_impl(n) for n in lctx.ATTN_IMPLS)
    assert (ref.explicit, ref.kernels, ref.fallback, ref.hf) == (True, False, "reference", "eager")
    assert (sdpa.explicit, sdpa.kernels, sdpa.fallback, sdpa.hf) == (False, False, "sdpa", "sdpa")
    assert (fast.explicit, fast.kernels, fast.fallback, fast.hf) == (False, True, "sdpa", "lctx_sdpa")
    assert [i.records_module_form for i in (ref, sdpa, fast)] == [False, True, False]
    assert all(i.doc and "\n" not in i.doc for i in (ref, sdpa, fast))
    assert ATTN_IMPL_REGISTRY.get_interface("fast") is fast
    assert ATTN_IMPL_REGISTRY.get_interface("flash", sdpa) is sdpa  # transformers' (name, default)
    assert ATTN_IMPL_REGISTRY.get_interface("flash") is None


@pytest.mark.parametrize("name", ["flash", "", None, "Fast"])
def test_unknown_name_is_one_line(name):
    with pytest.raises(LctxError) as e:
        get_attn_impl(name)
    assert str(e.value) == f"unknown attention implementation {name!r}; use reference, sdpa, fast"


def test_register_checks_the_fallback_and_duplicates():
    reg = AttnImplRegistry("attention implementation")
    with pytest.raises(ValueError, match="falls back to unregistered 'sdpa'"):
        reg.register(AttnImpl("fast", "kernels", kernels=True, fallback="sdpa"))
    reg.register(AttnImpl("sdpa", "sdpa"))
    assert reg.register(AttnImpl("fast", "kernels", kernels=True, fallback="sdpa")).fallback == "sdpa"
    with pytest.raises(ValueError, match="already registered"):
        reg.register(AttnImpl("sdpa", "again"))


def test_registry_imports_without_torch():
    code = ("import sys, json\nfrom lctx.attn_impl import get_attn_impl\nget_attn_impl('fast')\n"
            "print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": ":".join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("name", ATTN_IMPL_REGISTRY.names())
def test_every_impl_is_reachable_and_agrees(monkeypatch, name):
    """A tiny ALiBi model runs on every registered implementation: each takes its own path (the kernel it
    records) and gives the reference's logits (fp32; tolerance 1e-4 absolute: blocked / SDPA summation order)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch.manual_seed(0)
    model = LctxForCausalLM(tiny_config("alibi", attn_impl="reference")).eval()
    ids = torch.randint(3, 200, (1, 40))
    with torch.no_grad():
        want = model(ids).logits
        model.config.attn_impl = name  # as lctx run --attn-impl does on a loaded model
        impls_used(reset=True)
        got = model(ids).logits
    ran = impls_used(reset=True)
    assert ran == {"reference": {}, "sdpa": {"alibi": "sdpa"}, "fast": {"alibi": "blocked"}}[name]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_the_entry_not_the_name_decides(monkeypatch):
    """An implementation registered under another name with ``kernels=True`` runs the kernels: layers read
    the looked-up entry's attributes, they do not compare ``config.attn_impl`` with "fast"."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(ATTN_IMPL_REGISTRY, "kernels2", AttnImpl("kernels2", "test", kernels=True, fallback="sdpa"))
    monkeypatch.setitem(ATTN_IMPL_REGISTRY, "explicit2", AttnImpl("explicit2", "test", explicit=True))
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (1, 24))
    for name, want in (("kernels2", {"alibi": "blocked", "path": "reference"}), ("explicit2", {})):
        for variant in ("alibi", "path"):
            model = LctxForCausalLM(tiny_config(variant, attn_impl=name)).eval()
            impls_used(reset=True)
            with torch.no_grad():
                model(ids)
            assert impls_used(reset=True) == ({variant: want[variant]} if want else {}), (name, variant)
