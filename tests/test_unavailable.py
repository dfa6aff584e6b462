"""Metrics a model cannot give (issue 27, item 1): an adapter without prompt log-probabilities raises
:class:`lctx.errors.MetricUnavailable` from ``score_continuation`` / ``token_nll``; passkey keeps its greedy ``exact``
and records ``digit_acc`` as unavailable with the reason, ppl records every metric unavailable, in the records, the
tables, the warnings, the printed table, the report and ``lctx compare``; never 0, never a failure, resumed as any
finished sample. Controls: the toy that gives log-probabilities has no unavailable row, and any other exception of
``score_continuation`` is still the sample's error.
"""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

import toy_adapter as toy
from lctx.errors import MetricUnavailable

REASON = "no prompt log-probs (test)"
PPL_METRICS = ("ppl", "nll", "n_tokens", "n_docs")
#: the grid of every run here: the toy's training length, so the derived flatness rows have their reference
GRID = dict(lengths=[512], depths=[0.0, 1.0], samples=1)


class NoLogprobs(toy.ToyAdapter):
    """The toy behind a server that gives no prompt log-probabilities: generation works, scoring does not."""

    def score_continuation(self, prefix, cont):
        """Refused: no echoed log-probabilities."""
        self.calls["score"] += 1
        raise MetricUnavailable(REASON)

    def token_nll(self, ids, targets):
        """Refused: no echoed log-probabilities."""
        self.calls["token_nll"] += 1
        raise MetricUnavailable(REASON)


class BrokenScores(toy.ToyAdapter):
    """Control: a scoring call that fails for another reason (a bug, a dropped connection)."""

    def score_continuation(self, prefix, cont):
        """A genuine failure, not a missing capability."""
        raise RuntimeError("connection reset while scoring")


class BatchingNoLogprobs(NoLogprobs):
    """:class:`NoLogprobs` that batches when made with ``can_batch=True`` (row handles are the rows' own), so
    ``lctx run --batch-size`` takes the batched path (:meth:`lctx.tasks.Task.score_batch`)."""

    def prefix_batch(self, rows):
        """One handle per row."""
        return [self.prefix(r) for r in rows]

    def greedy_batch(self, batch, max_new_tokens, stop_ids=None):
        """Each row's greedy continuation."""
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(batch)
        return [self.greedy(h, n, stop_ids) for h, n in zip(batch, budgets)]

    def batch_row(self, batch, i):
        """Row ``i``'s handle."""
        return batch[i]


def _evaluate(lm, out, warned=None, **kw):
    import lctx
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    return lctx.evaluate([lm], [Passkey(), Perplexity(max_tokens=3000)], out=out, log=lambda m: None,
                         warn=(warned.append if warned is not None else lambda m: None), **{**GRID, **kw})


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two run directories of one model name: ``na`` by :class:`NoLogprobs`, ``ok`` by the toy that gives
    log-probabilities (the baseline and the control); {"na": (result, out, warnings, adapter), "ok": ...}."""
    root = tmp_path_factory.mktemp("unavailable")
    got = {}
    for key, lm in (("na", NoLogprobs("reader")), ("ok", toy.ToyAdapter("reader"))):
        warned: list = []
        res = _evaluate(lm, root / key, warned)
        got[key] = (res, root / key, warned, lm)
    return got


def test_passkey_keeps_exact_and_records_digit_acc_unavailable(runs):
    res, out, warned, lm = runs["na"]
    assert res.errors == 0 and res.ran == 3 and lm.calls["greedy"] == 2 and lm.calls["score"] == 2
    pk = [r for r in _records(out) if r["task"] == "passkey"]
    assert len(pk) == 2
    for r in pk:  # a finished sample: exact scored from the greedy answer, digit_acc no value at all (never 0)
        assert r["status"] == "ok" and r["error"] == ""
        assert r["metrics"] == {"exact": 1.0} and r["unavailable"] == {"digit_acc": REASON}
        assert r["extra"]["continuation"] == f" {r['extra']['key']}." and "prompt_text" not in r["extra"]
    t = pd.read_csv(out / "results.csv", keep_default_na=False)  # as a user reads it: empty value, a status, a reason
    d = t[(t.task == "passkey") & (t.metric == "digit_acc")]
    assert len(d) == 2 and set(d["status"]) == {"unavailable"} and set(d["value"]) == {""}
    assert set(d["reason"]) == {REASON} and set(d["error"]) == {""}
    e = t[(t.task == "passkey") & (t.metric == "exact")]
    assert set(e["status"]) == {"ok"} and set(e["value"].astype(float)) == {1.0} and set(e["reason"]) == {""}
    s = pd.read_csv(out / "summary.csv", keep_default_na=False)
    sd = s[(s.task == "passkey") & (s.metric == "digit_acc")]
    assert len(sd) == 2 and set(sd["mean"]) == {""} and set(sd["n"].astype(int)) == {0}
    assert set(sd["n_error"].astype(int)) == {0} and set(sd["n_unavailable"].astype(int)) == {1}
    assert set(sd["unavailable"]) == {REASON}
    se = s[(s.task == "passkey") & (s.metric == "exact")]
    assert set(se["mean"].astype(float)) == {1.0} and set(se["n"].astype(int)) == {1}
    assert set(se["n_unavailable"].astype(int)) == {0} and set(se["unavailable"]) == {""}
    assert res.failed.empty and set(res.unavailable["metric"]) == {"digit_acc", *PPL_METRICS}


def test_ppl_records_every_metric_unavailable(runs):
    res, out, warned, lm = runs["na"]
    (r,) = [r for r in _records(out) if r["task"] == "ppl"]
    assert r["status"] == "ok" and r["metrics"] == {} and r["unavailable"] == {m: REASON for m in PPL_METRICS}
    assert lm.calls["token_nll"] == 1  # the first window's call refused: the sample stops there
    s = pd.read_csv(out / "summary.csv", keep_default_na=False)
    sp = s[s.task == "ppl"].set_index("metric")
    assert set(sp.index) == set(PPL_METRICS) and (sp["mean"] == "").all() and (sp["n"].astype(int) == 0).all()
    assert (sp["n_unavailable"].astype(int) == 1).all() and (sp["unavailable"] == REASON).all()
    # derived flatness (lctx report, --tasks flatness): a ratio of a ppl the model could not give is unavailable
    # too, not an error
    from lctx.harness.steps.flatness import derive_table

    f = derive_table(res.table).set_index("metric")
    assert f.loc["ppl_ratio", "status"] == "unavailable" and REASON in f.loc["ppl_ratio", "reason"]
    assert f.loc["flat_until", "status"] == "unavailable"
    assert f.loc["effective_length", "status"] == "ok"  # passkey's exact was given


def test_one_warning_per_model_and_reason_naming_each_metric(runs):
    """One line per (model, reason), naming each metric with its tasks and samples (a served model whose
    log-probabilities fail the trust probe gave one line per metric, each repeating a 300-character reason: the
    fresh-user trial of issue 27)."""
    *_, warned, _ = runs["na"]
    assert len(warned) == 1
    metrics = ", ".join(f"{m} (ppl, 1 sample)" if m != "digit_acc" else "digit_acc (passkey, 2 samples)"
                        for m in sorted(("digit_acc",) + PPL_METRICS))
    assert warned[0] == (f"warning: {metrics} of model 'toy-reader' are unavailable: {REASON}; recorded as "
                         "unavailable, never 0")


def test_two_reasons_give_two_lines():
    """Control: rows of one model with two reasons are two lines, each naming its own metrics."""
    from lctx.harness.run.tables import unavailable_lines

    t = pd.DataFrame({"model": ["m", "m", "m"], "task": ["passkey", "ppl", "ppl"], "metric": ["digit_acc", "ppl", "nll"],
                      "status": ["unavailable"] * 3, "reason": ["no echo", "no windows", "no windows"]})
    assert unavailable_lines(t) == [
        "warning: digit_acc (passkey, 1 sample) of model 'm' is unavailable: no echo; recorded as unavailable, never 0",
        "warning: nll (ppl, 1 sample), ppl (ppl, 1 sample) of model 'm' are unavailable: no windows; recorded as "
        "unavailable, never 0"]


def test_the_normal_toy_has_no_unavailable_row(runs):
    # control: the same run with log-probabilities gives every metric, warns nothing, writes no unavailable field
    res, out, warned, _ = runs["ok"]
    assert warned == [] and res.errors == 0 and res.unavailable.empty
    assert set(res.table["status"]) == {"ok"} and (res.table["reason"] == "").all()
    assert all("unavailable" not in r for r in _records(out))
    s = pd.read_csv(out / "summary.csv", keep_default_na=False)
    assert (s["n_unavailable"].astype(int) == 0).all() and (s["unavailable"] == "").all()
    d = s[(s.task == "passkey") & (s.metric == "digit_acc")]
    assert set(d["mean"].astype(float)) == {1.0}


def test_a_rerun_resumes_every_sample_and_warns_again_once(runs, tmp_path):
    _, out, _, _ = runs["na"]
    copy = tmp_path / "na"
    shutil.copytree(out, copy)
    lm, warned = NoLogprobs("reader"), []
    again = _evaluate(lm, copy, warned)
    assert again.ran == 0 and again.skipped == 3 and lm.calls == {"prefix": 0, "greedy": 0, "score": 0, "token_nll": 0}
    assert sorted(warned) == sorted(runs["na"][2])  # the run's table still holds them: said again, once each
    # control: another adapter version is another input, so the samples run again
    newer = NoLogprobs("reader", version="2")
    assert _evaluate(newer, copy).ran == 3 and newer.calls["greedy"] == 2


def test_the_reason_is_part_of_the_records_digest(runs, tmp_path):
    from lctx.harness.run.rundir import read_json
    from lctx.harness.run.tables import read_records, vet_records

    _, out, _, _ = runs["na"]
    lines = (out / "records.jsonl").read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if json.loads(line)["task"] == "passkey")
    meta = read_json(out / "run.json")
    path = tmp_path / "records.jsonl"
    edits = ((None, len(lines)), (lambda u: {"digit_acc": "edited"}, len(lines) - 1), (lambda u: {}, len(lines) - 1))
    for edit, kept in edits:
        rec = json.loads(lines[i])
        if edit is not None:
            rec["unavailable"] = edit(rec["unavailable"])
        path.write_text("\n".join(lines[:i] + [json.dumps(rec)] + lines[i + 1:]) + "\n")
        warned: list = []
        assert len(vet_records(read_records(path), meta, warned.append)) == kept
        assert bool(warned) == (edit is not None) and all("digest does not match" in w for w in warned)


def test_batched_samples_record_the_same_as_alone(runs, tmp_path):
    _, out, _, _ = runs["na"]
    lm = BatchingNoLogprobs("reader", can_batch=True)
    res = _evaluate(lm, tmp_path / "b", batch_size=2)
    assert res.errors == 0 and lm.calls["greedy"] == 2  # through greedy_batch: one batch of the two passkey samples
    got = {(r["task"], r["depth"]): (r["metrics"], r["unavailable"], r["batch_size"]) for r in _records(tmp_path / "b")}
    alone = {(r["task"], r["depth"]): (r["metrics"], r["unavailable"]) for r in _records(out)}
    assert {k: v[:2] for k, v in got.items()} == alone and got[("passkey", 0.0)][2] == 2


def test_a_genuine_scoring_failure_is_still_the_samples_error(tmp_path):
    # control: only MetricUnavailable means "cannot give"; any other exception of score_continuation fails the sample
    res = _evaluate(BrokenScores("reader"), tmp_path / "o")
    pk = [r for r in _records(tmp_path / "o") if r["task"] == "passkey"]
    assert res.errors == 2 and all(r["status"] == "error" and "unavailable" not in r for r in pk)
    assert all(r["error"].startswith("RuntimeError: connection reset while scoring") for r in pk)
    assert res.unavailable.empty and set(res.failed["task"]) == {"passkey"}
    assert set(res.table[res.table.task == "ppl"]["status"]) == {"ok"}  # token_nll is the toy's own


def test_printed_table_says_unavailable_with_the_reason_once(runs, capsys):
    from lctx.harness.run.tables import print_summary as _print_summary

    res, *_ = runs["na"]
    capsys.readouterr()
    _print_summary(res.summary)
    out = capsys.readouterr().out
    rows = {line.split("|")[3].strip(): line for line in out.splitlines() if line.startswith("| toy-reader")}
    assert "unavailable" in rows["digit_acc (teacher-forced)"] and "1.000" in rows["exact"]
    assert all("unavailable" in rows[m] for m in ("ppl", "nll", "n_tokens"))
    assert "0.000" not in rows["digit_acc (teacher-forced)"] and "nan" not in out.lower()
    assert out.count(REASON) == 1  # the reason once, in the note under the table
    (note,) = [line for line in out.splitlines() if REASON in line]
    assert note == f"unavailable (no value, never 0): toy-reader: passkey digit_acc; ppl n_tokens, nll, ppl: {REASON}"
    # control: the normal toy's table says no such thing
    _print_summary(runs["ok"][0].summary)
    assert "unavailable" not in capsys.readouterr().out


def test_report_shows_the_metric_unavailable_with_the_reason(runs, tmp_path):
    from lctx.harness.outputs.plots import depth_errors, depth_unavailable
    from lctx.harness.outputs.report import build_report

    _, out, _, _ = runs["na"]
    rep = build_report([out], tmp_path / "rep")
    md = rep["markdown"].read_text()
    assert "## Unavailable metrics (3)" in md and "No cell failed." in md  # not a failure
    for row in ("| passkey | digit_acc | 2 | " + REASON, "| ppl | n_docs, n_tokens, nll, ppl | 1 | " + REASON):
        assert row in md, row
    assert any(n.startswith("Unavailable for toy-reader") and REASON in n for n in rep["notes"])
    assert rep["summary_table"]["PPL at train length"].iloc[0] == "unavailable"
    task = md[md.index("## Retrieval: passkey"):md.index("## Unavailable metrics")]
    assert f"passkey digit_acc: {REASON}" in task and "plots/passkey_heatmap_toy-reader.png" in task
    # its heatmap panel: n/a cells, not err cells nor an empty panel
    t = rep["table"]
    na = depth_unavailable(t, "toy-reader", "digit_acc", task="passkey")
    assert na.shape == (2, 1) and na.to_numpy().all()
    assert not depth_errors(t, "toy-reader", "digit_acc", task="passkey").to_numpy().any()
    assert not depth_unavailable(t, "toy-reader", "exact", task="passkey").to_numpy().any()
    # control: the normal toy's report has no such section or note
    ok = build_report([runs["ok"][1]], tmp_path / "rep_ok")
    assert "Unavailable" not in ok["markdown"].read_text()
    assert ok["summary_table"]["PPL at train length"].iloc[0] != "unavailable"


def test_compare_calls_unavailable_cells_not_comparable(runs, tmp_path):
    from lctx.harness.outputs.compare import compare_dirs, print_report

    na, ok = runs["na"][1], runs["ok"][1]
    for run, base, side in ((na, ok, "run"), (ok, na, "baseline")):
        cmp = compare_dirs(run, base)
        t = cmp.table.set_index(["task", "metric"])
        un = t[t["status"] == "unavailable"]
        assert sorted(set(un.index)) == sorted({("passkey", "digit_acc"), *(("ppl", m) for m in PPL_METRICS)})
        assert (un["unavailable"] == f"{side}: {REASON}").all() and len(un) == 2 + len(PPL_METRICS)
        assert set(t.loc[("passkey", "exact"), "status"]) == {"same"}  # what both gave is still judged
        assert cmp.counts["regression"] == cmp.counts["improvement"] == cmp.counts["error"] == 0
        assert cmp.counts["missing"] == cmp.counts["new"] == 0 and cmp.exit_code == 0
        print_report(cmp, file=(tmp_path / f"{side}.txt").open("w"))
        text = (tmp_path / f"{side}.txt").read_text()
        assert f"not comparable (unavailable: {side}: {REASON})" in text
        assert "not comparable (unavailable), " in text.splitlines()[-1]
    # control: two runs that gave every value have no unavailable cell
    cmp = compare_dirs(ok, ok)
    assert cmp.counts["unavailable"] == 0 and (cmp.table["unavailable"] == "").all()


def test_optional_metrics_keeps_other_exceptions():
    from lctx.tasks import Unavailable, optional_metrics

    assert optional_metrics(("a",), lambda: {"a": 0.5}) == {"a": 0.5}
    got = optional_metrics(("a", "b"), lambda: (_ for _ in ()).throw(MetricUnavailable("no log-probs\nsecond line")))
    assert got == {"a": Unavailable("no log-probs"), "b": Unavailable("no log-probs")}  # one line
    with pytest.raises(ZeroDivisionError):
        optional_metrics(("a",), lambda: {"a": 1 / 0})


def test_a_whole_task_that_cannot_be_scored_is_unavailable_not_the_end_of_the_run():
    from lctx.harness.run.runner import _run_whole, sample_base
    from lctx.tasks import Cell, Task

    class Whole(Task):
        name, metrics, whole = "whole_probe", ("acc",), True

        def score_all(self, lm, cells):
            raise MetricUnavailable(REASON)

    lm, task = toy.ToyAdapter(), Whole()
    base = sample_base(lm, task.name, 1, {}, None, 0)
    recs = _run_whole(lm, task, [(Cell(None, None, s), dict(base, length=None, depth=None, sample=s)) for s in (0, 1)],
                      log=lambda m: None)
    assert [(r["status"], r["metrics"], r["unavailable"]) for r in recs] == [("ok", {}, {"acc": REASON})] * 2
