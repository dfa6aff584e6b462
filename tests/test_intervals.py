"""The 95 % intervals of lctx's tables (harness/run/intervals.py, issue 30 item 4)."""

import math

import pandas as pd
import pytest

from lctx.harness.run.intervals import fmt_interval, interval, is_binary, t_interval, wilson


def test_wilson_matches_hand_computed_values():
    """Wilson score interval, Brown-Cai-DasGupta 2001 eq. 4, z = 1.95996. Hand computation for k = 4, n = 5:
    centre (4 + 1.9207) / 8.8415 = 0.66965, half 1.96 / 8.8415 * sqrt(0.8 + 0.9604) = 0.29413, so
    [0.3755, 0.9638]; k = n = 1: centre 0.60327, half 0.39673, so [0.2065, 1]. Tolerance 5e-4: the hand values
    carry 4 decimals."""
    lo, hi = wilson(4, 5)
    assert lo == pytest.approx(0.3755, abs=5e-4) and hi == pytest.approx(0.9638, abs=5e-4)
    lo, hi = wilson(1, 1)
    assert lo == pytest.approx(0.2065, abs=5e-4) and hi == 1.0
    assert wilson(0, 1) == pytest.approx((0.0, 1 - 0.2065), abs=5e-4)  # symmetric: k -> n - k mirrors it
    for n in (3, 6, 9, 12, 17, 19, 20):  # the ends are exact at 0 / n and n / n (no 5.55e-17 of rounding)
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0
    # control: one more success moves both ends by more than the tolerance, so the check can fail
    lo5, hi5 = wilson(5, 5)
    assert lo5 - 0.3755 > 0.1 and hi5 - 0.9638 > 5e-4


def test_wilson_refuses_impossible_counts():
    with pytest.raises(ValueError, match="n = 0"):
        wilson(0, 0)
    with pytest.raises(ValueError, match="outside"):
        wilson(3, 2)


def test_t_interval_hand_value_and_undefined_for_one_sample():
    """mean 10, stderr 1, n 5: t(0.975, 4) = 2.7764 (Student's table), so [7.2236, 12.7764]; tolerance 1e-4
    (the table's 4 decimals). n = 1: no spread, so no interval (NaN), not a zero-width one."""
    lo, hi = t_interval(10.0, 1.0, 5)
    assert lo == pytest.approx(7.2236, abs=1e-4) and hi == pytest.approx(12.7764, abs=1e-4)
    assert all(math.isnan(v) for v in t_interval(10.0, float("nan"), 1))
    assert fmt_interval(*t_interval(10.0, float("nan"), 1)) == ""


def test_interval_kind_by_values():
    assert is_binary([0, 1, 1.0]) and not is_binary([0.8, 1.0]) and not is_binary([])
    assert interval(0.8, 0.2, 5, "wilson") == wilson(4, 5)
    assert interval(float("nan"), 0.0, 0, "wilson") != interval(0.8, 0.2, 5, "wilson")


def test_summary_carries_n_and_interval_per_cell():
    """summary.csv: a 0/1 metric's cell gets Wilson's interval of its k / n, a continuous one Student's t on its
    stderr, and the pooled-over-depths cell of the printed table pools k and n."""
    from lctx.harness.run.tables import over_depths, summarize

    rows = []
    for depth, vals in ((0.0, [1, 1, 1]), (1.0, [0, 1, 0])):
        for s, v in enumerate(vals):
            for metric, value in (("exact", float(v)), ("digit_acc", 0.2 + 0.2 * v + 0.1 * s)):
                rows.append({"model": "m", "variant": "v", "task": "passkey", "metric": metric, "length": 256,
                             "depth": depth, "sample": s, "value": value, "status": "ok", "task_options": "{}",
                             "dtype": "float32", "attn_impl": "sdpa", "seed": 0})
    summ = summarize(pd.DataFrame(rows))
    ex = summ[(summ["metric"] == "exact") & (summ["depth"] == 1.0)].iloc[0]
    assert ex["interval"] == "wilson" and ex["n"] == 3
    assert (ex["ci_low"], ex["ci_high"]) == pytest.approx(wilson(1, 3))
    da = summ[(summ["metric"] == "digit_acc") & (summ["depth"] == 0.0)].iloc[0]
    assert da["interval"] == "t"
    assert (da["ci_low"], da["ci_high"]) == pytest.approx(t_interval(da["mean"], da["stderr"], 3))
    pooled = over_depths(summ)
    pe = pooled[pooled["metric"] == "exact"].iloc[0]
    assert pe["interval"] == "wilson" and pe["n"] == 6
    assert (pe["ci_low"], pe["ci_high"]) == pytest.approx(wilson(4, 6))


def test_t_interval_is_clipped_to_a_registered_range():
    """A [0, 1] score (registered bounds) with mean 0.017, stderr 0.0068, n = 3 (SmolLM2's mrcr sequence_ratio at
    1K): the t interval 0.017 -+ 4.303 * 0.0068 = [-0.0123, 0.0463] (hand computation, t(0.975, 2) = 4.303) is
    clipped to [0, 0.0463]; ppl has no bounds and keeps its t interval (the control)."""
    from lctx.harness.run.intervals import interval, t_interval
    from lctx.metrics import bounds_of

    raw = t_interval(0.017, 0.0068, 3)
    assert raw[0] == pytest.approx(-0.01226, abs=1e-4) and raw[1] == pytest.approx(0.04626, abs=1e-4)
    lo, hi = interval(0.017, 0.0068, 3, "t", bounds_of("sequence_ratio"))
    assert lo == 0.0 and hi == pytest.approx(raw[1])
    assert bounds_of("ppl") is None and interval(-0.5, 1.0, 3, "t", bounds_of("ppl"))[0] < -0.5
    assert bounds_of("exact") == bounds_of("acc") == (0.0, 1.0)


def test_a_ratio_of_one_is_not_a_proportion(tmp_path):
    """A cell whose values are all 1.0 gets Wilson's interval only for a metric that can be a proportion: exact
    (bounds [0, 1]) and an unregistered custom metric do; ppl_ratio (1.0 at the training length) and n_docs do
    not (t: no interval from one value). Found on a flatness run whose ppl_ratio read 1.000 [0.207, 1.000]."""
    import pandas as pd

    from lctx.harness.run.tables import summarize
    from lctx.metrics import may_be_proportion

    assert may_be_proportion("exact") and may_be_proportion("my_custom_score")
    assert not may_be_proportion("ppl_ratio") and not may_be_proportion("n_docs")
    rows = [{"model": "m", "variant": "v", "task": t, "metric": m, "length": 256, "depth": None, "sample": 0,
             "value": 1.0, "status": "ok", "task_options": "{}", "dtype": "float32", "attn_impl": "fast", "seed": 0,
             "fingerprint": "f", "depth_off": False}
            for t, m in (("passkey", "exact"), ("flatness", "ppl_ratio"), ("ppl", "n_docs"), ("mine", "my_custom_score"))]
    s = summarize(pd.DataFrame(rows)).set_index("metric")
    assert s.loc["exact", "interval"] == "wilson" and s.loc["my_custom_score", "interval"] == "wilson"
    assert s.loc["ppl_ratio", "interval"] == "t" and math.isnan(s.loc["ppl_ratio", "ci_low"])
    assert s.loc["n_docs", "interval"] == "t"
