"""Checkpoints saved before ``options_version`` (config.json without it) load as version 1 and compute
exactly what they computed: made by tests/data/legacy_v1/make.py with lctx at commit e512621."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lctx.models import LctxConfig, LctxForCausalLM
from lctx.models.config import OPTIONS_VERSION

HERE = Path(__file__).resolve().parent / "data" / "legacy_v1"
CASES = ["ggd_bam_ssmax", "ggd_bam", "ggd_bam_layers", "acc_rot", "alibi_ssmax"]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("impl", ["reference", "sdpa", "fast"])
def test_legacy_checkpoint_computes_what_it_computed(name, impl):
    expected = load_file(HERE / "expected.safetensors")
    model = LctxForCausalLM.from_pretrained(HERE / name).eval()
    assert model.config.options_version == 1
    model.config.attn_impl = impl
    with torch.no_grad():
        got = model(expected["input_ids"]).logits[..., :16]
    want = expected[f"{name}.{'sdpa' if impl == 'fast' else impl}"]
    tol = 0 if impl != "fast" else 1e-5  # the fast path is another summation order
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


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
    import json

    saved = json.loads((tmp_path / "new" / "config.json").read_text())
    assert saved["options_version"] == OPTIONS_VERSION
    assert saved["variant_options"] == {"ggd_form": "reference", "ggd_shared": False, "ssmax_scale_bias": True}
