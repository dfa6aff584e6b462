"""The metrics registry (issue 13.4): every metric lctx's tasks and derived steps report is registered with a
direction and a source; the tasks score with the registered functions; ``lctx compare`` and ``lctx list metrics``
read it."""

from __future__ import annotations

import math

import pytest

from lctx.metrics import METRICS, register_metric


def test_every_builtin_task_metric_is_registered_with_a_source():
    from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived names)
    from lctx.tasks import GROUPS, TASKS

    builtin = [(n, c.metrics) for n, c in TASKS.items() if c.__module__.startswith("lctx.")]  # not test tasks
    builtin += [(g.name, g.metrics) for g in GROUPS.values()]  # mmlu/arc, flatness, ruler
    assert len(builtin) >= 20
    for name, metrics in builtin:
        for m in metrics:
            assert m in METRICS, f"{name} reports {m!r}, which lctx.metrics does not register"
    for m in METRICS.values():
        assert m.direction in ("higher", "lower", "equal") and len(m.summary) > 20, m.name


def test_registered_functions_by_hand():
    # RULER's string_match_all / _part (scripts/eval/synthetic/constants.py), worked by hand: 2 of 3 refs found
    fn_all, fn_part = METRICS["string_match_all"].fn, METRICS["string_match_part"].fn
    assert fn_all("the values are 123 and 456", ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert fn_part("the values are 123", ["789", "123"]) == 1.0 and fn_part("none", ["789"]) == 0.0
    # ranks 1, 2, 4: top-1 = 1/3, MRR = (1 + 1/2 + 1/4) / 3
    assert METRICS["tf_top1"].fn([1, 2, 4]) == pytest.approx(1 / 3)
    assert METRICS["tf_mrr"].fn([1, 2, 4]) == pytest.approx(1.75 / 3)
    assert METRICS["tf_gain"].fn([-1.0, -3.0], -5.0) == pytest.approx(3.0)
    assert math.isnan(METRICS["digit_acc"].fn([])) and METRICS["digit_acc"].fn([True, False]) == 0.5
    assert METRICS["ppl"].fn(math.log(7.0)) == pytest.approx(7.0)
    assert METRICS["exact"].fn("12345", "12345") == 1.0 and METRICS["exact"].fn(None, "12345") == 0.0
    assert METRICS["acc"].fn is None  # lm-eval computes it


def test_tasks_score_with_the_registered_functions():
    from lctx.tasks import niah, passkey, ppl  # noqa: F401

    assert niah.string_match_all is METRICS["string_match_all"].fn
    assert niah.tf_mrr is METRICS["tf_mrr"].fn and ppl.ppl is METRICS["ppl"].fn


def test_registration_rules():
    with pytest.raises(ValueError, match="already registered"):
        register_metric("exact", "higher", "again")
    with pytest.raises(ValueError, match="direction"):
        register_metric("my_metric_x", "up", "x")
    assert "my_metric_x" not in METRICS


def test_compare_takes_directions_from_the_registry():
    from lctx.harness.outputs.compare import DIRECTIONS, Rules

    assert all(DIRECTIONS[m.name] == m.direction for m in METRICS.values())
    assert Rules().direction_for("some_task", "acc,none") == "higher"  # lm-eval's ",filter" suffix dropped
    assert Rules().direction_for("some_task", "bits_per_byte") == "lower"  # another engine's metric
    register_metric("test_only_score", "lower", "a metric registered after compare was imported")
    try:
        assert Rules().direction_for("some_task", "test_only_score") == "lower"
    finally:
        METRICS.pop("test_only_score")


def test_list_metrics(capsys):
    from helpers import run_cli

    code, out, err = run_cli(["list", "metrics"], capsys)
    assert code == 0, err
    for name in ("exact", "digit_acc", "string_match_all", "string_match_part", "nll", "ppl", "acc", "average"):
        assert f"| {name} " in out
    assert "RULER" in out and "Landmark Attention" in out


def test_teacher_forced_metrics_are_labelled(capsys):
    """Issue 24 item 4: digit_acc is 1.00 where greedy output fails; `lctx list metrics` (and every table and
    title that shows a metric, through metrics.label) names the teacher-forced ones as such."""
    from helpers import run_cli

    from lctx.metrics import is_teacher_forced, label

    tf = {m.name for m in METRICS.values() if m.teacher_forced}
    assert {"digit_acc", "tf_top1", "tf_mrr", "tf_logprob", "tf_gain"} <= tf
    assert not {"exact", "string_match_all", "ppl", "acc"} & tf
    assert label("digit_acc") == "digit_acc (teacher-forced)" and label("exact") == "exact"
    assert label("digit_acc", "Digit accuracy") == label("digit_acc", "Digit accuracy (teacher-forced)") \
        == "Digit accuracy (teacher-forced)"  # said once
    assert is_teacher_forced("tf_top1,none")  # an lm-eval ",filter" suffix dropped
    code, out, err = run_cli(["list", "metrics"], capsys)
    assert code == 0, err
    rows = {ln.split("|")[1].strip(): ln for ln in out.splitlines() if ln.startswith("| ") and "---" not in ln}
    for name in tf:
        assert f"{name} (teacher-forced)" in rows, sorted(rows)
    assert "exact" in rows and "greedy continuation" in rows["exact"]
    assert "greedy continuation fails" in rows["digit_acc (teacher-forced)"]  # when it disagrees with exact
