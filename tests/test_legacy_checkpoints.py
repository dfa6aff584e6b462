"""Checkpoints saved before ``options_version`` (config.json without it) load as version 1 and compute
what they computed (to fp32 rounding: GOLDEN_ATOL, GOLDEN_RTOL): made by tests/data/legacy_v1/make.py with lctx at commit e512621."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lctx.models import LctxConfig, LctxForCausalLM
from lctx.models.config import OPTIONS_VERSION

HERE = Path(__file__).resolve().parent / "data" / "legacy_v1"
CASES = ["ggd_bam_ssmax", "ggd_bam", "ggd_bam_layers", "acc_rot", "alibi_ssmax"]


#: Tolerance of the golden logits, derived: the logits are fp32 and |logit| <= 0.4 here (hidden 16, 2 layers,
#: 40 tokens); each is a short chain of sums of 16-64 products of O(1) values, so a kernel that sums in another
#: order (another CPU's MKL or ATen vector code, another thread count, SDPA's fused path) moves it by a few units
#: of fp32 rounding of O(1) values (eps 1.2e-7). Measured: up to 4.5e-8 between the machine that made them and
#: an AMD EPYC or an Intel Xeon with AVX-512 (issue 24: they were made with ATen's AVX2 code, and match it
#: bit for bit under ATEN_CPU_CAPABILITY=avx2); on one machine, 4.5e-8 (reference) and 8.9e-8 (SDPA) between
#: ATen's AVX-512 and AVX2 code and up to 8.9e-8 to its scalar code (ATEN_CPU_CAPABILITY=default, which .ci/run
#: uses for its second pass); 3e-8 between reference and SDPA. 1e-6 abs + 1e-5 rel is >= 10x that noise. The controls below show that each real change tried lies
#: outside 10x the tolerance: a permuted head moves the logits by 3.7e-4 to 1.9e-3, today's option defaults by
#: 2.9e-4 to 9.5e-3 or to NaN.
GOLDEN_ATOL, GOLDEN_RTOL = 1e-6, 1e-5


def _permute_query_heads(model: LctxForCausalLM) -> None:
    """A real change for every variant: roll the query heads of layer 0 by one (the rows of q_proj in
    blocks of head_dim), so each head's queries meet another head's keys and positional prior."""
    q = model.model.layers[0].attn.q_proj.weight
    n_heads = model.config.num_attention_heads
    with torch.no_grad():
        q.copy_(q.view(n_heads, -1, q.shape[1]).roll(1, dims=0).reshape_as(q))


@pytest.mark.golden
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("impl", ["reference", "sdpa", "fast"])
def test_legacy_checkpoint_computes_what_it_computed(name, impl):
    expected = load_file(HERE / "expected.safetensors")
    model = LctxForCausalLM.from_pretrained(HERE / name).eval()
    assert model.config.options_version == 1
    model.config.attn_impl = impl
    ids = expected["input_ids"]
    want = expected[f"{name}.{'sdpa' if impl == 'fast' else impl}"]
    with torch.no_grad():
        got = model(ids).logits[..., :16]
    # golden logits were made on another machine (tests/data/legacy_v1/make.py): never bit-exact across CPUs
    torch.testing.assert_close(got, want, atol=GOLDEN_ATOL, rtol=GOLDEN_RTOL)

    # control 1: the tolerance still catches a real change (a permuted head)
    _permute_query_heads(model)
    with torch.no_grad():
        permuted = model(ids).logits[..., :16]
    assert not torch.allclose(permuted, want, atol=10 * GOLDEN_ATOL, rtol=10 * GOLDEN_RTOL)


@pytest.mark.golden
@pytest.mark.parametrize("name", [c for c in CASES if c != "alibi_ssmax"])
def test_legacy_golden_tolerance_catches_the_new_defaults(name):
    """Control 2: the same checkpoint computed with today's option defaults (what a loader that ignored
    ``options_version`` would do) is outside the golden tolerance. alibi+ssmax has no legacy option whose
    default changed, so it has no such control (its permuted-head control above stands)."""
    expected = load_file(HERE / "expected.safetensors")
    saved = json.loads((HERE / name / "config.json").read_text())
    assert "options_version" not in saved  # a legacy file: the options it was trained with are implicit
    cfg = LctxConfig.from_dict({**saved, "options_version": OPTIONS_VERSION})
    torch.manual_seed(0)  # ggd_shared changes the prior's shape: its new parameters are initialised, seeded
    model = LctxForCausalLM.from_pretrained(HERE / name, config=cfg).eval()
    model.config.attn_impl = "reference"
    with torch.no_grad():
        got = model(expected["input_ids"]).logits[..., :16]
    want = expected[f"{name}.reference"]
    assert not torch.allclose(got, want, atol=10 * GOLDEN_ATOL, rtol=10 * GOLDEN_RTOL)  # NaN counts as far


def test_legacy_options_are_filled_in_and_survive_a_resave(tmp_path):
    m = LctxForCausalLM.from_pretrained(HERE / "ggd_bam_ssmax")
    opts = m.config.variant_options
    assert opts["ggd_form"] == "legacy" and opts["ggd_shared"] is True and opts["ssmax_scale_bias"] is False
    m.save_pretrained(tmp_path / "again")
    again = LctxConfig.from_pretrained(tmp_path / "again")
    assert again.options_version == 1 and again.variant_options["ggd_form"] == "legacy"


def test_new_config_records_its_version_and_defaults(tmp_path):
    cfg = LctxConfig(variant="ggd_bam+ssmax")
    assert cfg.options_version == OPTIONS_VERSION
    LctxForCausalLM(cfg).save_pretrained(tmp_path / "new")
    saved = json.loads((tmp_path / "new" / "config.json").read_text())
    assert saved["options_version"] == OPTIONS_VERSION
    assert saved["variant_options"] == {"ggd_form": "reference", "ggd_shared": False, "ssmax_scale_bias": True}
