"""lctx.harness.run.tables: records to the tidy table and the summary. Only the current inputs' records are
tabulated, other option sets are separate labelled cells, the depth_off flag, the task version and code
columns, and records forged or edited by hand are left out of the tables and named (vet_records)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from helpers import _left_out, base_run, ppl_task, run_cli, sweep, token_nll_task_source, value
from lctx.harness.run.tables import COLUMNS, DEPTH_TOLERANCE, label_names
from lctx.tasks.passkey import Passkey

#: every test here runs with no data dir from the environment and its own digest cache (conftest.py)
pytestmark = pytest.mark.usefixtures("isolated_digests")


def test_other_task_options_are_separate_labelled_cells(make_checkpoint, data, tmp_path):
    """Issue 10 item 5: other task options are separate cells, each labelled with its options."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    a = sweep(ck, [ppl_task(data)], out)
    b = sweep(ck, [ppl_task(data, bos="none", stride=1)], out)
    assert b["ran"] == 1
    summary = pd.read_csv(out / "summary.csv")
    ppl = summary[summary["metric"] == "ppl"]
    assert len(ppl) == 2 and (ppl["n"] == 1).all()  # two cells of n = 1, never one cell of n = 2
    assert sorted(ppl["mean"]) == sorted(value(b, "ppl", "ppl")) and value(a, "ppl", "ppl")[0] in list(ppl["mean"])
    opts = [json.loads(o) for o in ppl["task_options"]]
    assert {o["bos"] for o in opts} == {"prepend", "none"}
    names = label_names(b["table"][b["table"]["metric"] == "ppl"])
    assert names.nunique() == 2 and any("bos=none" in n and "stride=1" in n for n in names)


def test_display_names_split_options_but_not_derived_metrics():
    """Issue 10 item 5: display names split by option set, but not by a derived metric's own options."""
    rows = [dict(model="m", task="ppl", metric="ppl", task_options=json.dumps({"stride": s, "bos": "prepend"}),
                 variant="rope", dtype="float32", attn_impl="sdpa", seed=0) for s in (0.5, 1)]
    rows += [dict(model="m", task="flatness", metric=m, task_options=json.dumps({"criterion": m}), variant="rope",
                  dtype="float32", attn_impl="sdpa", seed=0) for m in ("flat_until", "effective_length")]
    names = list(label_names(pd.DataFrame(rows)))
    assert names == ["m [stride=0.5]", "m [stride=1]", "m", "m"]


def test_depth_off_flag_column_and_heatmap(make_checkpoint, tmp_path):
    """Issue 10 item 17: a sample more than 0.05 from its depth is flagged in the table, the summary and the heatmap."""
    from lctx.harness.outputs.plots import depth_off_cells

    res = sweep(make_checkpoint("rope"), [Passkey()], tmp_path / "o", lengths=(160,), depths=(0.0, 0.5))
    t = res["table"]
    assert "depth_off" in COLUMNS
    off = t.set_index("depth")["depth_off"]
    actual = t.set_index("depth")["depth_actual"]
    for d in (0.0, 0.5):  # the flag is exactly |depth_actual - depth| > 0.05
        assert bool(off.loc[d].iloc[0]) == (abs(actual.loc[d].iloc[0] - d) > DEPTH_TOLERANCE)
    assert bool(off.loc[0.0].iloc[0])  # at 160 tokens the instruction alone is > 5% of the prompt
    cells = depth_off_cells(t, t["model"].iloc[0], "exact", task="passkey")
    assert bool(cells.loc[0.0, 160]) and bool(cells.loc[0.5, 160]) == bool(off.loc[0.5].iloc[0])
    summary = pd.read_csv(tmp_path / "o" / "summary.csv")
    assert summary.set_index(["depth", "metric"]).loc[(0.0, "exact"), "n_depth_off"] == 1
    from lctx.harness.outputs.plots import run_figures

    run_figures(t, tmp_path / "o")  # a run writes tables; its figures are the outputs'
    assert (tmp_path / "o" / "plots").is_dir()


SUMMARY_VALUES = ["model", "task", "metric", "length", "depth", "mean", "n", "n_error"]


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x.strip()]


def _append(out: Path, *recs: dict) -> None:
    with open(out / "records.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs))


def _resigned(out: Path, rec: dict) -> dict:
    """``rec`` with the digest of its invocation's salt recomputed, as a forger who read run.json could."""
    from lctx.harness.run.rundir import SALT, sign_record

    invs = json.loads((out / "run.json").read_text())["invocations"]
    return sign_record(rec, next(i[SALT] for i in invs if i["id"] == rec["invocation"]))


def _resume_after(make_checkpoint, tmp_path, capsys, forge) -> tuple[pd.DataFrame, pd.DataFrame, str, int]:
    """A finished run, ``forge(out, first record)`` appending lines, the same command again: (summary before,
    summary after, the rerun's stderr, records run again)."""
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    before = pd.read_csv(out / "summary.csv")
    forge(out, _lines(out)[0])
    n_forged = len(_lines(out))
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    return before, pd.read_csv(out / "summary.csv"), err, len(_lines(out)) - n_forged


@pytest.mark.parametrize("how,kind", [("unknown invocation", "of an invocation run.json does not name"),
                                      ("re-signed under the run's invocation", "repeating a finished sample")])
def test_forged_duplicate_leaves_the_mean_and_is_named(make_checkpoint, tmp_path, capsys, how, kind):
    """Issue 25 F2: a forged second record of a finished sample leaves the mean as it was and is named."""
    # F2: a second record for a finished sample, exact flipped, appended to records.jsonl was adopted (the cell's
    # mean 0.0 -> 0.5, n 2); now the cell keeps its one real record and the forgery is named in one line
    def forge(out, rec):
        rec = dict(rec, metrics={**rec["metrics"], "exact": 1.0 - rec["metrics"]["exact"]})
        if how == "unknown invocation":
            rec["invocation"] = "20260101T000000.000000Z-1"
        else:
            rec = _resigned(out, rec)
        other = dict(rec, metrics={**rec["metrics"], "digit_acc": 1.0 - rec["metrics"]["digit_acc"]})
        _append(out, rec, other if how == "unknown invocation" else _resigned(out, other))

    before, after, err, reran = _resume_after(make_checkpoint, tmp_path, capsys, forge)
    pd.testing.assert_frame_equal(before[SUMMARY_VALUES], after[SUMMARY_VALUES])
    assert (after["n"] == 1).all() and reran == 0
    lines = _left_out(err)
    assert len(lines) == 1 and kind in lines[0] and "2 records" in lines[0], err
    assert f"{before['model'][0]} passkey length 160 depth 0.5 sample 0" in lines[0]


@pytest.mark.parametrize("resign", [False, True])
def test_record_of_a_model_the_run_never_ran(make_checkpoint, tmp_path, capsys, resign):
    """Issue 25 F3: an appended record of a model the run never ran is left out of the tables and named."""
    # F3: an appended record of another model appeared as an extra model in summary.csv
    def forge(out, rec):
        rec = dict(rec, model="intruder", metrics={k: 1.0 for k in rec["metrics"]})
        _append(out, _resigned(out, rec) if resign else dict(rec, invocation="forged"))

    before, after, err, reran = _resume_after(make_checkpoint, tmp_path, capsys, forge)
    assert set(after["model"]) == set(before["model"]) and "intruder" not in set(after["model"])
    pd.testing.assert_frame_equal(before[SUMMARY_VALUES], after[SUMMARY_VALUES])
    lines = _left_out(err)
    assert len(lines) == 1 and "intruder" in lines[0], err
    assert ("of a model run.json does not hold" if resign else "invocation run.json does not name") in lines[0]


@pytest.mark.parametrize("edit", ["value", "digest removed", "other field"])
def test_tampered_record_of_a_known_invocation_is_left_out(make_checkpoint, tmp_path, capsys, edit):
    """Issue 25 item 2: a record edited in place fails its digest: left out, and its sample reruns."""
    # the one real record edited in place (its invocation id is run.json's): its digest no longer matches, so it
    # is left out of the tables and its sample runs again, giving the real value back
    def forge(out, rec):
        if edit == "value":
            rec["metrics"]["exact"] = 1.0 - rec["metrics"]["exact"]
        elif edit == "digest removed":
            rec["metrics"]["exact"] = 1.0 - rec["metrics"]["exact"]
            del rec["digest"]
        else:
            rec["n_tokens"] += 1
        (out / "records.jsonl").write_text(json.dumps(rec) + "\n")

    before, after, err, reran = _resume_after(make_checkpoint, tmp_path, capsys, forge)
    pd.testing.assert_frame_equal(before[SUMMARY_VALUES], after[SUMMARY_VALUES])
    assert reran == 1  # the sample ran again: the edited record did not count as done
    lines = _left_out(err)
    assert len(lines) == 1 and "digest does not match" in lines[0] and "1 record " in lines[0], err


def test_legitimate_resumed_run_keeps_all_its_records(make_checkpoint, tmp_path, capsys):
    """Issue 25 item 2 (the control): a resumed run's records, each signed by its own invocation, all count."""
    # control: two invocations into one directory (the second runs one more sample) keep every record, each with
    # the digest of its own invocation's salt, and nothing is named
    from lctx.harness.run.rundir import SALT, record_digest

    out, args = base_run(make_checkpoint, tmp_path, capsys)
    args[args.index("--samples") + 1] = 2
    code, _, err = run_cli(args, capsys)
    assert code == 0 and not _left_out(err), err
    recs, invs = _lines(out), json.loads((out / "run.json").read_text())["invocations"]
    assert len(invs) == 2 and [r["invocation"] for r in recs] == [i["id"] for i in invs]
    salts = {i["id"]: i[SALT] for i in invs}
    assert len(set(salts.values())) == 2
    assert all(r["digest"] == record_digest(r, salts[r["invocation"]]) for r in recs)
    s = pd.read_csv(out / "summary.csv")
    assert (s["n"] == 2).all()
    code, _, err = run_cli(args, capsys)  # a third invocation: all done, nothing left out
    assert code == 0 and not _left_out(err) and len(_lines(out)) == 2, err


def test_legacy_records_without_digest_still_load(make_checkpoint, tmp_path, capsys):
    """Issue 25 item 2: records written before digests and invocations load as they are, with no warning."""
    # a run directory written before records carried digests (no salt in run.json) and before invocations were
    # recorded (records name the run_id only): its records are taken as they are, with no warning
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    meta = json.loads((out / "run.json").read_text())
    rec = _lines(out)[0]
    for k in ("digest", "invocation"):
        rec.pop(k)
    (out / "records.jsonl").write_text(json.dumps(rec) + "\n")
    for k in ("invocations",):
        meta.pop(k)
    (out / "run.json").write_text(json.dumps(meta))
    code, stdout, err = run_cli(args, capsys)
    assert code == 0 and not _left_out(err), err
    assert "1 resumed" in stdout and len(_lines(out)) == 1
    invs = json.loads((out / "run.json").read_text())["invocations"]
    assert invs[0]["id"] == meta["run_id"] and "record_salt" not in invs[0]  # the legacy entry: no salt


def test_depth_spelled_as_an_int_is_the_same_sample():
    """Issue 25 F2: a depth written 0 instead of 0.0 is the same sample, not a second one pooled into the mean."""
    # the F2 numbers (mean 0.0 -> 0.5, n = 2): a copy of a finished record with its depth written 0 instead of 0.0
    # was another key, so the tidy table held two rows of one sample and the summary pooled them
    from lctx.harness.run.tables import summarize, to_table

    real = {"model": "m", "variant": "rope", "task": "passkey", "length": 256, "depth": 0.0, "sample": 0, "seed": 0,
            "task_options": {}, "status": "ok", "error": "", "fingerprint": "fp", "metrics": {"exact": 0.0}}
    forged = dict(real, depth=0, metrics={"exact": 1.0})
    s = summarize(to_table([real, forged]))
    assert list(s["n"]) == [1] and list(s["mean"]) == [0.0]
    from lctx.harness.run.tables import vet_records

    warned = []
    assert vet_records([real, forged], None, warned.append) == [real]
    assert len(warned) == 1 and "1 record repeating a finished sample with other values" in warned[0]


def test_report_and_compare_name_records_appended_after_the_run(make_checkpoint, tmp_path, capsys):
    """Issue 25 item 2: lctx report and compare name a record appended after the run, once per directory and kind."""
    # lctx report and lctx compare read the tables; a line appended to records.jsonl since is named (once per
    # directory and kind), and the verdict still reads the vetted tables
    out, _ = base_run(make_checkpoint, tmp_path, capsys)
    base = tmp_path / "base"
    shutil.copytree(out, base)
    rec = _lines(out)[0]
    _append(out, dict(rec, invocation="forged", metrics={k: 1.0 - v for k, v in rec["metrics"].items()}))
    code, _, err = run_cli(["compare", out, "--baseline", base], capsys)
    assert code == 0, err  # the summaries are the vetted ones: no regression
    lines = _left_out(err)
    assert len(lines) == 1 and str(out / "records.jsonl") in lines[0] and "'forged'" in lines[0], err
    code, _, err = run_cli(["report", out, "--out", tmp_path / "rep"], capsys)
    assert code == 0, err
    lines = _left_out(err)
    assert len(lines) == 1 and "invocation run.json does not name" in lines[0], err


def test_one_warning_per_kind_when_one_run_has_two_sweeps(make_checkpoint, tmp_path, capsys):
    """Issue 25 item 2: a run of two sweeps (--window) names a forged record once."""
    # --window gives ppl its own sweep beside passkey's: both read records.jsonl, the forgery is named once
    text = tmp_path / "doc.txt"
    text.write_text("The module documents every function it exports. " * 60)
    out = tmp_path / "o"
    args = ["run", "--model", make_checkpoint(), "--tasks", "passkey,ppl", "--lengths", "160", "--window", "64",
            "--ppl-data", text, "--depths", "0.5", "--samples", "1", "--out", out, "--no-progress"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    rec = _lines(out)[0]
    _append(out, dict(rec, invocation="forged", metrics={k: v + 1.0 for k, v in rec["metrics"].items()}))
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    assert len(_left_out(err)) == 1, err


#: a --task-file task scoring one token (trial 21's tests)
TASK_SRC = token_nll_task_source("LastTokenNLL21", "last_token_nll21")


def test_results_table_names_the_task_version_and_code(capsys, make_checkpoint, tmp_path):
    """Trial 21 item 1: results.csv and results.parquet name each row's task version and code fingerprint."""
    import pandas as pd

    f = tmp_path / "my_task21.py"
    f.write_text(TASK_SRC)
    out = tmp_path / "o"
    code, _, err = run_cli(["run", "--model", make_checkpoint(), "--task-file", f, "--tasks", "last_token_nll21",
                            "--lengths", "64", "--samples", "1", "--out", out, "--no-progress"], capsys)
    assert code == 0, err
    meta = json.loads((out / "run.json").read_text())
    for t in (pd.read_csv(out / "results.csv"), pd.read_parquet(out / "results.parquet")):
        assert list(t["code_fingerprint"]) == [meta["inputs"]["tasks"]["last_token_nll21"]["code"]["fingerprint"]]
        assert [str(v) for v in t["task_version"]] == ["1"]


def test_unavailable_metric_is_left_out_of_the_mean_and_counted_apart():
    """Issue 27: a metric the model could not give is a row with no value, status unavailable and the reason; the
    summary's mean, stderr and n are over the values there are, n_unavailable counts the others, and a cell of only
    such samples has no mean, n 0, no error and its reason (never 0, never a failure)."""
    from lctx.harness.run.tables import summarize, to_table

    def rec(sample, depth, metrics, unavailable=None):
        r = {"model": "m", "variant": "v", "task": "passkey", "length": 256, "depth": depth, "sample": sample,
             "seed": 0, "task_options": {}, "status": "ok", "error": "", "fingerprint": "fp", "metrics": metrics}
        return dict(r, unavailable=unavailable) if unavailable else r

    recs = [rec(0, 0.0, {"exact": 1.0, "digit_acc": 1.0}), rec(1, 0.0, {"exact": 0.0, "digit_acc": 0.5}),
            rec(2, 0.0, {"exact": 1.0}, {"digit_acc": "no log-probs"}),
            rec(0, 1.0, {"exact": 1.0}, {"digit_acc": "no log-probs"}),
            rec(1, 1.0, {"exact": 1.0}, {"digit_acc": "probe"})]
    t = to_table(recs, {"passkey": ("exact", "digit_acc")})
    na = t[t["status"] == "unavailable"]
    assert len(t) == 10 and len(na) == 3 and set(na["metric"]) == {"digit_acc"} and na["value"].isna().all()
    assert list(na["reason"]) == ["no log-probs", "no log-probs", "probe"]
    assert (t[t.status == "ok"]["reason"] == "").all()
    s = summarize(t).set_index(["metric", "depth"])
    mixed, only = s.loc[("digit_acc", 0.0)], s.loc[("digit_acc", 1.0)]
    assert (mixed["mean"], mixed["n"], mixed["n_unavailable"], mixed["n_error"]) == (0.75, 2, 1, 0)  # not 0.5 (a 0)
    assert mixed["unavailable"] == "no log-probs"
    assert pd.isna(only["mean"]) and (only["n"], only["n_unavailable"], only["n_error"]) == (0, 2, 0)
    assert only["unavailable"] == "no log-probs (+1 other reason)"
    assert (s.loc[("exact", 1.0), "n"], s.loc[("exact", 1.0), "n_unavailable"]) == (2, 0)
    # control: the same cell with an error instead counts as a failure
    err = dict(recs[3], status="error", error="boom", metrics={}, unavailable=None)
    s2 = summarize(to_table(recs[:3] + [err, recs[4]], {"passkey": ("exact", "digit_acc")}))
    s2 = s2.set_index(["metric", "depth"])
    assert s2.loc[("digit_acc", 1.0), "n_error"] == 1 and s2.loc[("digit_acc", 1.0), "n_unavailable"] == 1


@pytest.mark.parametrize("unavailable, problem", [
    ({"digit_acc": "no log-probs"}, None), ("no log-probs", "not an object of reasons"),
    ({"digit_acc": 0}, "not an object of reasons"), ({"exact": "why"}, "'exact' is both a value and unavailable")])
def test_record_unavailable_field_is_checked(unavailable, problem):
    from lctx.harness.run.rundir import record_problem

    r = {"model": "m", "task": "passkey", "status": "ok", "metrics": {"exact": 1.0}, "sample": 0, "length": 256,
         "depth": 0.0, "unavailable": unavailable}
    got = record_problem(r)
    assert got is None if problem is None else problem in got


# ---------------------------------------------------------------------------------------------- outside text (issue 42)

PLANTED = "planted-key-1a2b3c4d5e6f"
#: a served model id's controls: OSC 0 ended by BEL, CSI, a C1 CSI, a bidi override
CONTROLS = "\x1b]0;PWNED\x07\x1b[31m\x9b2J\u202e"
RAW_CONTROL = __import__("re").compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: a trust probe's reason as long as the ones that were printed three times (issue 45)
LONG_REASON = ("the server's echoed prompt log-probabilities fail lctx's trust probe (echoed vs generated up to 6.77 "
               "nats, tolerance 0.05; a certain continuation beat its first statement by 0.01 nats per token, margin "
               "0.5) (docs/serving.md#teacher-forced-metrics-and-the-trust-probe)")


@pytest.fixture
def planted():
    from lctx import outside

    outside.forget_secrets()
    outside.register_secret(PLANTED)
    yield PLANTED
    outside.forget_secrets()


def _outside_records() -> list[dict]:
    """Two samples of a served model whose id holds terminal controls and the planted key: one ok (its digit_acc
    unavailable for a long reason that quotes the key), one failed with an error quoting it."""
    base = dict(model=f"toy{CONTROLS}-{PLANTED}", task="passkey", length=256, depth=0.5, task_options={}, seed=0,
                fingerprint="f", variant="served", dtype="float32", attn_impl="server")
    return [dict(base, sample=0, status="ok", error="", metrics={"exact": 1.0},
                 unavailable={"digit_acc": f"{LONG_REASON} ({PLANTED})"}),
            dict(base, sample=1, status="error", metrics={}, error=f"HTTP 401 (Incorrect API key provided: {PLANTED}"
                                                                    f"\x1b[2J)")]


def test_written_tables_are_redacted_and_the_csvs_escaped(tmp_path, planted):
    """Issue 42 items 1 and 5: the tables of records holding the key (model id, error, reason) and terminal
    controls: the returned tables hold no key but keep the raw text (the run's own view of the id as served);
    results.parquet, results.csv and summary.csv hold no key and no raw control, the controls escaped visibly (a
    trial printed the parquet's model column: raw ESC/OSC on the terminal)."""
    from lctx.harness.run.tables import write_tables

    table, summary = write_tables(_outside_records(), tmp_path, {"passkey": ("exact", "digit_acc")})
    pq = pd.read_parquet(tmp_path / "results.parquet")
    for df in (table, summary, pq):
        text = df.astype(str).to_string()
        assert PLANTED not in text and "[redacted]" in text
    assert table["model"].iloc[0] == f"toy{CONTROLS}-[redacted]"  # raw, redacted
    assert RAW_CONTROL.search(pq.astype(str).to_string()) is None
    assert pq["model"].iloc[0] == "toy\\x1b]0;PWNED\\x07\\x1b[31m\\x9b2J\\u202e-[redacted]"
    for name in ("results.csv", "summary.csv"):
        raw = (tmp_path / name).read_text()
        assert PLANTED not in raw and RAW_CONTROL.search(raw) is None, name
        assert "toy\\x1b]0;PWNED\\x07\\x1b[31m\\x9b2J\\u202e-[redacted]" in raw, name


def test_clean_frame_keeps_numbers_lists_and_attrs(planted):
    """clean_frame touches str cells only: numbers, NaN, lists and the frame's attrs are as they were."""
    from lctx.harness.run.tables import clean_frame

    df = pd.DataFrame({"a": [PLANTED, "x\x1b", None], "n": [1.0, float("nan"), 3.0], "l": [[1], [PLANTED], []]})
    df.attrs["superseded"] = 2
    out = clean_frame(df, escape=True)
    assert list(out["a"][:2]) == ["[redacted]", "x\\x1b"] and pd.isna(out["a"][2])
    assert out["n"].equals(df["n"]) and out.attrs == {"superseded": 2}
    assert list(out["l"]) == [[1], ["[redacted]"], []]


def test_a_long_reason_said_before_is_not_repeated():
    """Issue 42 item 4 (issue 45): a long reason a warning gave already (the trust probe's at load) is referred to in
    the unavailable line and the table's note, not printed again; not said before, it is quoted capped; a short one
    is always inline (control)."""
    from lctx.harness.run.tables import REASON_ABOVE, summarize, unavailable_cells, unavailable_lines

    t = pd.DataFrame({"model": ["m", "m"], "task": ["passkey", "ppl"], "metric": ["digit_acc", "ppl"],
                      "status": ["unavailable"] * 2, "reason": [LONG_REASON, "no echo"]})
    load = [f"warning: m: teacher-forced metrics will be unavailable through http://h/v1: {LONG_REASON[:240]}"]
    said = sorted(unavailable_lines(t, said=load))  # digit_acc's line first
    assert said[0].endswith(f"is unavailable ({REASON_ABOVE}); recorded as unavailable, never 0")
    assert said[1].endswith("is unavailable: no echo; recorded as unavailable, never 0")
    fresh = sorted(unavailable_lines(t))
    assert LONG_REASON[:200] in fresh[0]  # quoted (capped at 240)
    huge = sorted(unavailable_lines(t.assign(reason=[LONG_REASON * 20, "no echo"])))
    assert len(huge[0]) < 400 and "more characters left out" in huge[0]
    rows = t.assign(variant="v", length=256, depth=0.5, sample=0, value=float("nan"), task_options="{}", dtype="f",
                    attn_impl="s", seed=0, fingerprint="f", depth_off=None)
    _, notes = unavailable_cells(summarize(rows), said=load + said)  # every warning lctx run printed
    assert [n for n in notes if "passkey digit_acc" in n][0].endswith(f"({REASON_ABOVE})")
    _, notes = unavailable_cells(summarize(rows))
    assert any(LONG_REASON[:200] in n for n in notes)


def test_a_forged_record_is_named_capped(tmp_path):
    """A record appended by hand is outside text: the warning that leaves it out quotes its fields capped and
    escaped (a 100,000-character model name, terminal controls)."""
    from lctx.harness.run.tables import vet_records

    forged = {"model": "m\x1b[2J" + "x" * 100_000, "task": "passkey", "status": "ok", "metrics": {"exact": 1.0},
              "sample": 0, "invocation": "nobody\x07"}
    said = []
    assert vet_records([forged], {"invocations": [{"id": "inv"}]}, said.append) == []
    assert len(said) == 1 and len(said[0]) < 600 and RAW_CONTROL.search(said[0]) is None, said[0][:300]
