"""Diagnostics: far attention mass (seed 004) and GGD prior shapes (seed 000)."""

from __future__ import annotations

import pytest
import torch

from lctx.harness.commands.diagnostics import far_mass, plot_far_mass, plot_priors, prior_table
from lctx.errors import LctxError
from lctx.models.adapters.hf import load_lm


def zero_queries(lm):
    """q = 0: every content score is 0, so attention is the positional prior alone."""
    with torch.no_grad():
        for blk in lm.model.model.layers:
            blk.attn.q_proj.weight.zero_()
    return lm


@pytest.mark.slow
def test_far_mass_uniform_attention_matches_hand_count(make_checkpoint):
    # NoPE with q = 0 attends uniformly: query i puts mass (i - D) / (i + 1) on keys with i - j > D.
    lm = zero_queries(load_lm(str(make_checkpoint("nope")), device="cpu"))
    L, D, nq = 64, 10, 4
    df = far_mass(lm, list(range(3, 3 + L)), [L], D, n_queries=nq)
    want = sum((i - D) / (i + 1) for i in range(L - nq, L)) / nq
    assert len(df) == 2 * 4  # 2 layers x 4 heads
    assert df["far_mass"].tolist() == pytest.approx([want] * 8, abs=1e-5)


def test_far_mass_alibi_is_bounded_and_nope_grows(make_checkpoint, tmp_path):
    lm_a = zero_queries(load_lm(str(make_checkpoint("alibi")), device="cpu"))
    lm_n = zero_queries(load_lm(str(make_checkpoint("nope")), device="cpu"))
    ids = list(range(3, 3 + 256))
    a = far_mass(lm_a, ids, [64, 256], 16).groupby("length")["far_mass"].mean()
    n = far_mass(lm_n, ids, [64, 256], 16).groupby("length")["far_mass"].mean()
    assert n[256] > n[64] > a[64] and n[256] > 0.9
    # the distance bias keeps far mass in check (seed 004): it grows far less than NoPE's
    assert a[256] < n[256] - 0.3 and a[256] - a[64] < (n[256] - n[64]) / 2
    assert plot_far_mass(far_mass(lm_a, ids, [64, 128], 16), tmp_path).exists()


def test_far_mass_refuses_non_softmax_and_short_text(make_checkpoint):
    lm = load_lm(str(make_checkpoint("alibi_lsh")), device="cpu")
    with pytest.raises(LctxError, match="no softmax attention"):
        far_mass(lm, list(range(3, 100)), [64], 8)
    with pytest.raises(LctxError, match="needs 512 tokens"):
        far_mass(lm, list(range(3, 100)), [512], 8)


def test_prior_table_and_plot(make_checkpoint, tmp_path):
    lm = load_lm(str(make_checkpoint("ggd_bam", variant_options={"ggd_shared": False})), device="cpu")
    t = prior_table(lm)
    assert len(t) == 2 * 4 and set(t["layer"]) == {0, 1}
    assert t["beta"].tolist() == pytest.approx([1.0] * 8)  # ALiBi initialisation
    # beta = 1: the bias falls 1 nat after alpha tokens (its ALiBi slope 1/alpha), to within eps
    assert t["fall_1nat"].tolist() == pytest.approx(t["alpha"].tolist(), rel=1e-4)
    assert plot_priors(lm, tmp_path, max_distance=128).stat().st_size > 5000
    with pytest.raises(LctxError, match="no GGD-BAM prior"):
        prior_table(load_lm(str(make_checkpoint("rope")), device="cpu"))
