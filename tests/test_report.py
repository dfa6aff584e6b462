"""`lctx report`: HTML/Markdown/PNG report of run directories (lctx.harness.outputs.report), on synthetic runs."""

from __future__ import annotations

import base64
import html
import json
import math
import re

import pandas as pd
import pytest
from helpers import run_cli
from lctx.errors import LctxError
from lctx.harness.steps.flatness import FlatnessSpec, write_tables_with_flatness
from lctx.harness.outputs.report import build_report, load_runs, parse_at
from lctx.harness.run.tables import write_tables

T = 256
PPL = {"rope": {256: 20.0, 512: 21.0, 1024: 30.0}, "alibi": {256: 22.0, 512: 22.1, 1024: 22.2}}
EXACT = {"rope": {256: [1.0, 0.5], 512: [0.0, 0.0], 1024: [0.0, 0.0]},  # means .75, 0, 0
         "alibi": {256: [1.0, 1.0], 512: [1.0, 0.5], 1024: [0.5, 0.5]}}  # means 1, .75, .5
MMLU = [1, 0, 0, 1, 1]  # acc 0.6
ARC = [1, 0, 0, 0]  # acc 0.25


def _base(model, train_length=T, **kw):
    return {**dict(model=model, model_fingerprint=model, variant=model, dtype="float32", attn_impl="sdpa", seed=0,
                   run_id="r", device="cpu", train_length=train_length, lctx_version="0.1.0", git_rev="abc123def456",
                   timestamp="2026-01-01T00:00:00+00:00", status="ok", error=""), **kw}


def _run(path, models, flat=False, lmeval=False, error=False, train_length=T, meta=None, tasks=("ppl", "passkey")):
    recs = []
    for m in models:
        for L, v in PPL[m].items() if "ppl" in tasks else ():
            recs.append(_base(m, train_length, task="ppl", length=L, depth=None, sample=0, task_options={"stride": 0.5},
                              metrics={"ppl": v}))
        for L, vals in EXACT[m].items() if "passkey" in tasks else ():
            for d, v in zip((0.0, 1.0), vals):
                recs.append(_base(m, train_length, task="passkey", length=L, depth=d, sample=0, task_options={},
                                  metrics={"exact": v, "digit_acc": v}))
        if lmeval:
            for task, vals in (("mmlu", MMLU), ("arc_easy", ARC)):
                for i, v in enumerate(vals):
                    recs.append(_base(m, task=task, length=None, depth=None, sample=i, task_options={"num_fewshot": 0},
                                      metrics={"acc": float(v), "acc_norm": float(v)}))
    if error:
        recs.append(_base(models[0], task="niah_single_1", length=512, depth=0.5, sample=0, task_options={},
                          metrics={}, status="error", error="ValueError: too short <at> niah.py"))
        recs.append(_base(models[0], task="niah_single_1", length=1024, depth=0.5, sample=0, task_options={},
                          metrics={"string_match_all": 1.0, "tf_top1": 0.5}))
    path.mkdir(parents=True)
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (path / "run.json").write_text(json.dumps({"run_id": f"id-{path.name}", "git_rev": "abc123def456",
                                               "lctx_version": "0.1.0", "torch": "2.x", "python": "3.11",
                                               "lengths": [256, 512, 1024], "depths": [0.0, 1.0], "samples": 1,
                                               "seed": 0, **(meta or {})}))
    if flat:
        write_tables_with_flatness(path, FlatnessSpec())
    else:
        write_tables(recs, path)
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    r1 = _run(root / "a" / "run1", ["rope"], flat=True, error=True)
    r2 = _run(root / "b" / "run2", ["alibi"], lmeval=True)
    return build_report([r1, r2], root / "report", at="1x,4x,512"), root


@pytest.mark.slow
def test_report_files_and_self_contained_html(report):
    res, root = report
    out = root / "report"
    names = {p.name for p in res["plots"]}
    assert {"perplexity.png", "passkey_accuracy_vs_length.png", "passkey_heatmap_rope.png",
            "passkey_heatmap_alibi.png", "mmlu_arc.png", "niah_single_1_accuracy_vs_length.png"} <= names
    page = res["html"].read_text()
    imgs = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(imgs) == len(res["plots"])  # every plot embedded, nothing linked
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in imgs)
    assert "src='plots/" not in page
    assert "too short &lt;at&gt; niah.py" in page and "<at>" not in page  # escaped error text
    md = res["markdown"].read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(links) == len(res["plots"]) and all((out / link).is_file() for link in links)


def test_summary_numbers(report):
    res, root = report
    s = pd.read_csv(root / "report" / "summary.csv").set_index("model")
    # rope: ratios 1, 1.05, 1.5 -> flat to 512; exact means .75, 0, 0 -> effective length 0 (< 0.8 at 256)
    assert s.loc["rope", "flat_until"] == 512 and s.loc["rope", "effective_length"] == 0
    # alibi (flatness derived by the report): ratios 1, 1.0045, 1.009 -> flat to 1024; exact 1, .75 -> 256
    assert s.loc["alibi", "flat_until"] == 1024 and s.loc["alibi", "effective_length"] == 256
    assert s.loc["rope", "passkey exact @ 1×"] == pytest.approx(0.75)  # mean of 1 and 0.5 at 256
    assert s.loc["alibi", "passkey exact @ 512"] == pytest.approx(0.75)
    assert s.loc["rope", "passkey exact @ 4×"] == 0.0  # 4x of 256 = 1024 tokens
    assert s.loc["alibi", "mmlu_acc"] == pytest.approx(0.6) and s.loc["alibi", "arc_easy_acc"] == pytest.approx(0.25)
    disp = res["summary_table"].set_index("model")
    assert disp.loc["alibi", "flat until"] == "≥ 1K (4×)"  # flat at the longest length tested
    assert disp.loc["rope", "effective length"] == "< 256"


def test_failures_and_metadata(report):
    res, root = report
    f = pd.read_csv(root / "report" / "failures.csv")
    assert len(f) == 1 and f.iloc[0]["task"] == "niah_single_1" and f.iloc[0]["samples failed"] == 1
    page = res["html"].read_text()
    assert "abc123def456" in page and "id-run1" in page and "Failures (1 cells, 1 samples)" in page


def test_same_model_and_task_in_two_runs_is_kept_apart(tmp_path):
    r1 = _run(tmp_path / "x" / "r", ["rope"])
    r2 = _run(tmp_path / "y" / "r", ["rope"])
    table, metas = load_runs([r1, r2])
    assert set(table["model"]) == {"rope", "rope@y/r"} and [m["run"] for m in metas] == ["x/r", "y/r"]


def test_a_model_whose_tasks_ran_as_two_runs_is_one_model_with_one_flatness(tmp_path):
    """ppl in one run and passkey in another (a sweep split by task, as results/2026-12-04-position-methods runs
    it): one model, not ``model@run``, and its flatness rows derived from both runs equal those of one run holding
    both tasks. Control: the same task in two runs is still kept apart (the test above)."""
    ppl = _run(tmp_path / "ppl", ["rope", "alibi"], tasks=("ppl",))
    pk = _run(tmp_path / "pk", ["rope", "alibi"], tasks=("passkey",))
    both = _run(tmp_path / "both", ["rope", "alibi"])
    split, metas = load_runs([pk, ppl])
    one, _ = load_runs([both])
    assert set(split["model"]) == {"rope", "alibi"}
    assert all(m["flatness"].startswith("derived by the report") for m in metas)

    def flat(t):
        f = t[t["task"] == "flatness"]
        return f.sort_values(["model", "metric", "length"])[["model", "metric", "length", "value"]].reset_index(drop=True)

    got, want = flat(split), flat(one)
    assert len(want) and got["value"].notna().any()
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_a_model_whose_lengths_ran_as_two_runs_is_one_model(tmp_path):
    """4K/8K in one run and 16K in another (the position-methods run's P1 and P2): one model whose passkey rows hold
    every length; control: a run sharing a length with another is still told apart (model@run)."""
    short = _run(tmp_path / "short", ["rope"], tasks=("passkey",))
    table = pd.read_parquet(short / "results.parquet")
    recs = [json.loads(x) for x in (short / "records.jsonl").read_text().splitlines()]
    long_dir = tmp_path / "long"
    long_dir.mkdir()
    moved = [dict(r, length=r["length"] * 8) for r in recs]  # 2048, 4096, 8192: lengths the first run has not
    (long_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in moved))
    (long_dir / "run.json").write_text((short / "run.json").read_text())
    write_tables(moved, long_dir)
    merged, _ = load_runs([short, long_dir])
    pk = merged[merged["task"] == "passkey"]
    assert set(pk["model"]) == {"rope"}
    assert sorted(pk["length"].dropna().unique()) == sorted({L for L in table["length"].dropna()} |
                                                            {L * 8 for L in table["length"].dropna()})
    again, _ = load_runs([short, _run(tmp_path / "again", ["rope"], tasks=("passkey",))])
    assert set(again[again["task"] == "passkey"]["model"]) == {"rope", "rope@again"}


def test_bad_inputs(tmp_path, capsys):
    from lctx.cli import main

    with pytest.raises(LctxError, match="does not exist"):
        load_runs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(LctxError, match="no results.parquet or results.csv"):
        load_runs([tmp_path / "empty"])
    assert parse_at("1x, 2.5x,2k") == [("rel", 1.0), ("rel", 2.5), ("abs", 2048.0)]
    with pytest.raises(LctxError, match="--at"):
        parse_at("x2")
    code = main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ")


def test_cli_report(tmp_path, capsys):
    from lctx.cli import main

    run = _run(tmp_path / "run", ["alibi"])
    assert main(["report", str(run), "--out", str(tmp_path / "rep"), "--title", "My <report>"]) == 0
    assert "<title>My &lt;report&gt;</title>" in (tmp_path / "rep" / "report.html").read_text()
    assert "wrote" in capsys.readouterr().out


def test_custom_task_without_depth_axis_is_reported(tmp_path):
    """The README's ``last_token_nll`` (axes ("sample",), metric nll; from a --task-file, so not registered in
    the process that reports): a figure, a section and a summary column, not filed under Retrieval."""
    nll = {256: [2.0, 1.0], 512: [3.0, 2.0]}  # means 1.5 at 256 (1x), 2.5 at 512 (2x)
    recs = [_base("rope", task="last_token_nll", length=L, depth=None, sample=i, task_options={},
                  metrics={"nll": v}) for L, vals in nll.items() for i, v in enumerate(vals)]
    run = tmp_path / "custom"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    write_tables(recs, run)
    res = build_report([run], tmp_path / "rep", at="1x,2x")
    assert "last_token_nll_vs_length.png" in {p.name for p in res["plots"]}
    page = res["html"].read_text()
    assert "Task: last_token_nll" in page and "Retrieval: last_token_nll" not in page
    s = pd.read_csv(tmp_path / "rep" / "summary.csv").set_index("model")
    assert s.loc["rope", "last_token_nll nll @ 1×"] == pytest.approx(1.5)  # mean of 2 and 1 at 256
    assert s.loc["rope", "last_token_nll nll @ 2×"] == pytest.approx(2.5)  # mean of 3 and 2 at 512


def test_criteria_note_names_the_runs_own_metrics_and_a_metric_named_as_its_task_once(tmp_path):
    """The summary's paragraph names the headline metric of each task the report has (not a fixed "passkey, NIAH")
    and says when no flatness rows give a criterion (it showed "(–)"); a task whose metric has the task's name
    (mrcr's mrcr) heads its column once ("mrcr @ 1×", not "mrcr mrcr @ 1×")."""
    recs = [_base("rope", task="mrcr", length=L, depth=0.5, sample=i, task_options={}, metrics={"mrcr": v})
            for L, vals in {256: [1.0, 0.0], 512: [0.0, 0.0]}.items() for i, v in enumerate(vals)]
    run = tmp_path / "mrcr"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    # a run of mrcr version 1, whose metric was "mrcr" (issue 42 renamed it): its run.json declares it, as lctx run did
    (run / "run.json").write_text(json.dumps({"run_id": "id", "task_meta": {"mrcr": {
        "name": "mrcr", "version": 1, "metrics": ["mrcr", "sequence_ratio"], "headline_metric": "mrcr",
        "axes": ["depth", "sample"], "category": "multi-round"}}}))
    write_tables(recs, run)
    res = build_report([run], tmp_path / "rep", at="1x,2x")
    md = res["markdown"].read_text()
    assert "Flat until (no flatness rows in these runs)" in md and "(–)" not in md
    assert "headline metric (mrcr) averaged" in md and "passkey exact match" not in md
    s = pd.read_csv(tmp_path / "rep" / "summary.csv").set_index("model")
    assert s.loc["rope", "mrcr @ 1×"] == pytest.approx(0.5) and "mrcr mrcr @ 1×" not in s.columns


@pytest.mark.slow  # five reports drawn (figures included): 2.6-4.4 s at load 3-5 on 2 cores
def test_unknown_train_length_has_a_hint_and_the_declared_maximum(tmp_path, capsys):
    # a GGUF model records no training length: the summary's "–" gets a note saying how to give one, and the
    # checkpoint's declared maximum (run.json max_positions) labelled as such, never as the training length
    from lctx.cli import main

    run = _run(tmp_path / "gguf", ["alibi"], train_length=None, meta={"max_positions": {"alibi": 8192}})
    res = build_report([run], tmp_path / "rep")
    disp = res["summary_table"].set_index("model")
    assert disp.loc["alibi", "train length"] == "–"  # 8192 is not shown as the training length
    notes = [n for n in res["notes"] if n.startswith("Train length unknown")]
    assert len(notes) == 1
    note = notes[0]
    assert "Train length unknown for alibi" in note and "--train-length N to lctx run" in note
    assert "--train-length alibi=N to lctx report" in note and "declares max positions 8K" in note
    assert note in res["markdown"].read_text()
    assert main(["report", str(run), "--out", str(tmp_path / "rep2")]) == 0
    assert f"note: {note}" in capsys.readouterr().out
    # given on the report's command line, the training length fills the summary (and its flatness rows)
    assert main(["report", str(run), "--out", str(tmp_path / "rep3"), "--train-length", "alibi=256"]) == 0
    capsys.readouterr()
    rep3 = pd.read_csv(tmp_path / "rep3" / "summary.csv").set_index("model")
    assert rep3.loc["alibi", "train_length"] == 256 and rep3.loc["alibi", "ppl_at_train_length"] == pytest.approx(22.0)
    assert "Train length unknown" not in (tmp_path / "rep3" / "report.md").read_text()
    code = main(["report", str(run), "--out", str(tmp_path / "rep4"), "--train-length", "alibi=0"])
    assert code == 2 and "--train-length 'alibi=0' is not N or MODEL=N" in capsys.readouterr().err


@pytest.mark.slow  # four reports drawn (figures included): 3.5-3.8 s at load 3-5 on 2 cores
def test_no_training_length_puts_the_summary_at_the_tested_lengths(tmp_path, capsys):
    """issue 24 item 5: with no model's training length known (a GGUF or HF checkpoint), every column at 1x/2x/8x
    was "–": without --at the summary's columns are the tested lengths, and the page says so."""
    from lctx.cli import main

    run = _run(tmp_path / "gguf", ["alibi"], train_length=None)
    res = build_report([run], tmp_path / "rep")
    disp = res["summary_table"].set_index("model")
    cols = [c for c in disp.columns if c.startswith("passkey exact @ ")]
    assert cols == ["passkey exact @ 256", "passkey exact @ 512", "passkey exact @ 1K"]
    # EXACT["alibi"]'s means, not "–", each with its 95 % interval and n ("1.00 [0.34, 1.00] n=2")
    assert [disp.loc["alibi", c].split(" [")[0] for c in cols] == ["1.00", "0.75", "0.50"]
    assert all(" n=" in disp.loc["alibi", c] for c in cols)
    said = "the summary's score columns are at the tested lengths (256, 512, 1K)"
    assert said in res["markdown"].read_text() and html.escape(said) in res["html"].read_text()
    # --at given: the user's lengths, no such sentence; a training length known: multiples of it, as before
    given = build_report([run], tmp_path / "rep2", at="512")
    assert [c for c in given["summary_table"].columns if c.startswith("passkey exact @ ")] == ["passkey exact @ 512"]
    assert said not in given["markdown"].read_text()
    known = build_report([_run(tmp_path / "lctx", ["alibi"])], tmp_path / "rep3")
    assert [c for c in known["summary_table"].columns if c.startswith("passkey exact @ ")] == \
        ["passkey exact @ 1×", "passkey exact @ 2×", "passkey exact @ 8×"]
    assert main(["report", str(run), "--out", str(tmp_path / "rep4")]) == 0
    assert said in capsys.readouterr().out


def test_train_length_of_a_model_no_run_has_is_refused(tmp_path, capsys):
    # trial21 item 6: `lctx report --train-length nosuch=5` was accepted (exit 0) and applied to nothing
    from lctx.cli import main

    run = _run(tmp_path / "gguf", ["alibi"], train_length=None)
    code = main(["report", str(run), "--out", str(tmp_path / "rep"), "--train-length", "alibl=256"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "no run has a model 'alibl'; did you mean alibi?" in err and "(models: alibi)" in err
    assert not (tmp_path / "rep" / "report.html").exists()


def test_damaged_run_json_is_refused_with_line_and_column(tmp_path, capsys):
    # trial21 item 7: `lctx run` refused a damaged run.json, `lctx report` read it as {} (exit 0): the page then
    # lacked the run's provenance without a word. It is refused as `lctx run` refuses it.
    from lctx.cli import main

    run = _run(tmp_path / "r", ["alibi"])
    (run / "run.json").write_text('{"run_id": "x",\n  "git_rev": }\n')
    code = main(["report", str(run), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "run.json is damaged (invalid JSON at line 2, column 14" in err


def test_the_same_run_twice_is_refused(tmp_path, capsys):
    # trial21 (mistakes accepted silently): `lctx report lctx-out lctx-out` showed every model twice (model@run)
    from lctx.cli import main

    run = _run(tmp_path / "r", ["alibi"])
    code = main(["report", str(run), str(tmp_path / "." / "r"), "--out", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "is given twice" in err, err


def _digit_copy_run(path, declared=True):
    """A run directory of the custom retrieval task ``digit_copy`` (not registered in this process: its task file is
    gone), with run.json's ``task_meta`` as ``lctx run`` records it when ``declared``."""
    from helpers import DIGIT_COPY_META

    top1 = {256: [1.0, 0.0], 512: [0.0, 0.0]}  # means .5 at 1x, 0 at 2x
    recs = [_base("rope", task="digit_copy", length=L, depth=d, sample=0, task_options={},
                  metrics={"copy_top1": v, "copy_nll": 2.0 + L / 256})
            for L, vals in top1.items() for d, v in zip((0.0, 1.0), vals)]
    path.mkdir(parents=True)
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    meta = {"run_id": "id", "task_meta": {"digit_copy": DIGIT_COPY_META}} if declared else {"run_id": "id"}
    (path / "run.json").write_text(json.dumps(meta))
    write_tables(recs, path)
    return path


def test_a_custom_tasks_declared_metadata_comes_from_run_json(tmp_path):
    """issue 24 item 2: a --task-file task declaring headline copy_top1 and retrieval = True is filed under
    Retrieval with copy_top1 in the summary, from run.json's task_meta, with no task file at report time (it was
    filed under "Task:" with copy_nll, the first metric of the table, in the summary)."""
    from lctx.tasks import TASKS

    assert "digit_copy" not in TASKS
    res = build_report([_digit_copy_run(tmp_path / "run")], tmp_path / "rep", at="1x,2x")
    page = res["html"].read_text()
    assert "Retrieval: digit_copy" in page and "Task: digit_copy" not in page
    s = pd.read_csv(tmp_path / "rep" / "summary.csv").set_index("model")
    assert s.loc["rope", "digit_copy copy_top1 @ 1×"] == pytest.approx(0.5)
    assert not [c for c in s.columns if "copy_nll" in c]
    assert "digit_copy_accuracy_vs_length.png" in {p.name for p in res["plots"]}  # a retrieval task's figure
    # a run directory written before task_meta was recorded: as before, the table's first metric, not retrieval
    old = build_report([_digit_copy_run(tmp_path / "old", declared=False)], tmp_path / "rep_old", at="1x")
    assert "Task: digit_copy" in old["html"].read_text()


@pytest.mark.slow
def test_custom_task_reported_and_compared_without_its_task_file(tmp_path):
    """issue 24 item 2 ("Done when"): `lctx run --task-file` records the task's declared metadata; with the task
    file deleted, `lctx report` and `lctx compare` in a fresh process file it under Retrieval, summarise its
    headline metric and know its directions (compare exited 2: "no known direction")."""
    import subprocess
    import sys
    from pathlib import Path

    from helpers import digit_copy_task_source

    model = Path(__file__).resolve().parent.parent / "models" / "checkpoints" / "pydoc-tiny-rope"
    task_file = tmp_path / "digit_copy.py"
    task_file.write_text(digit_copy_task_source())

    def lctx(*args):
        return subprocess.run([sys.executable, "-m", "lctx.cli", *map(str, args)], capture_output=True, text=True,
                              timeout=600, env={**__import__("os").environ, "LCTX_NUM_THREADS": "1"})

    for name in ("run", "base"):
        p = lctx("run", "--model", model, "--task-file", task_file, "--tasks", "digit_copy", "--lengths", "32,64",
                 "--depths", "0,1", "--samples", "1", "--out", tmp_path / name, "--no-progress")
        assert p.returncode == 0, p.stderr
    task_file.unlink()
    p = lctx("report", tmp_path / "run", "--out", tmp_path / "rep", "--at", "32,64")
    assert p.returncode == 0, p.stderr
    page = (tmp_path / "rep" / "report.md").read_text()
    assert "## Retrieval: digit_copy" in page and "Task: digit_copy" not in page
    cols = list(pd.read_csv(tmp_path / "rep" / "summary.csv").columns)
    assert [c for c in cols if c.startswith("digit_copy") and not c.endswith((" ci_low", " ci_high", " n"))] == \
        ["digit_copy copy_top1 @ 32", "digit_copy copy_top1 @ 64"]
    p = lctx("compare", tmp_path / "run", "--baseline", tmp_path / "base", "--out", tmp_path / "cmp")
    assert p.returncode == 0, p.stdout + p.stderr
    cmp = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    directions = dict(zip(cmp["metric"], cmp["direction"]))
    assert directions["copy_top1"] == "higher" and directions["copy_nll"] == "lower"


def test_teacher_forced_scores_say_so(report, monkeypatch):
    """Issue 24 item 4: passkey digit_acc (NIAH tf_top1) is teacher-forced and reads 1.00 where greedy output
    fails: the report's task section says so beside exact, and the accuracy panel's title carries the label."""
    import lctx.harness.outputs.report as rep
    from lctx.harness.outputs import plots

    res, root = report
    md = res["markdown"].read_text()
    section = md.split("## Retrieval: passkey", 1)[1].split("\n## ", 1)[0]
    note = next(ln for ln in section.splitlines() if "teacher-forced" in ln)
    assert "digit_acc is teacher-forced" in note and "greedy decoding fails (exact 0)" in note, note
    niah = md.split("## Retrieval: niah_single_1", 1)[1].split("\n## ", 1)[0]
    assert "tf_top1" in niah and "teacher-forced" in niah
    assert "teacher-forced" in res["html"].read_text()

    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, name: figs.append(fig) or out / name)  # draws the report's
    table, _ = load_runs([root / "a" / "run1"])
    rep.accuracy_figure(table, "passkey", root, rep.palette(list(dict.fromkeys(table["label"]))))
    titles = [ax.get_title() for ax in figs[0].axes if ax.get_title()]
    assert "passkey: digit_acc (teacher-forced)" in titles and "passkey: exact" in titles, titles


def test_exact_alibi_dispatch_is_named_in_the_legend_and_notes(tmp_path):
    # alibi_lsh rows whose attn_kernel says exact ALiBi ran (the CPU fast path's lsh_exact_dispatch, issue 24
    # item 9) are shown as such: the model's label (summary, plot legends) names it and the lengths
    recs = []
    for L, kernel in ((256, "lsh-exact-alibi"), (512, "lsh-exact-alibi+lsh-blocks"), (1024, "lsh-blocks")):
        recs.append(_base("lsh", variant="alibi_lsh", attn_impl="fast", attn_kernel=kernel, task="ppl", length=L,
                          depth=None, sample=0, task_options={}, metrics={"ppl": 20.0}))
        recs.append(_base("rope", attn_kernel="blocked", task="ppl", length=L, depth=None, sample=0,
                          task_options={}, metrics={"ppl": 20.0}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "run.json").write_text(json.dumps({"run_id": "r", "lengths": [256, 512, 1024]}))
    write_tables(recs, run)
    res = build_report([run], tmp_path / "report", at="1x")
    labels = set(res["table"]["label"])
    assert labels == {"rope", "lsh (alibi_lsh; exact ALiBi at 256, 512)"}
    assert set(pd.read_csv(tmp_path / "report" / "summary.csv")["model"]) == labels
    assert any("lsh-exact-alibi" in n and "lsh_exact_dispatch" in n for n in res["notes"])
    assert "lsh (alibi_lsh; exact ALiBi at 256, 512)" in (tmp_path / "report" / "report.md").read_text()


def test_a_retrieval_panel_outside_0_1_keeps_its_own_axis(report, monkeypatch):
    """Fresh-user trial of issue 24: a retrieval task's declared secondary metric that is a loss (2.5-5 nats)
    was drawn on the 0-1 axis of a score, so its panel was empty; a panel whose values leave [0, 1] now keeps a
    free y axis, and the score panel (control) still gets 0-1."""
    import lctx.harness.outputs.report as rep
    from lctx.harness.outputs import plots

    _, root = report
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, name: figs.append(fig) or out / name)  # draws the report's
    table, _ = load_runs([root / "a" / "run1"])
    loss = table["metric"] == "digit_acc"
    table.loc[loss, "value"] = 2.5 + table.loc[loss, "length"].rank(pct=True) * 2.5  # 2.5-5, like an NLL
    rep.accuracy_figure(table, "passkey", root, rep.palette(list(dict.fromkeys(table["label"]))))
    axes = {ax.get_title(): ax for ax in figs[0].axes if ax.get_title()}
    lo, hi = axes["passkey: digit_acc (teacher-forced)"].get_ylim()
    vals = table.loc[loss & (table["status"] == "ok"), "value"]
    assert lo <= vals.min() and hi >= vals.max(), (lo, hi)
    assert axes["passkey: exact"].get_ylim() == pytest.approx((-0.04, 1.04))


def test_report_names_an_mmlu_run_by_its_subject(tmp_path):
    """Fresh-user trial of issue 24 (item 6): `lctx run --tasks mmlu_astronomy` printed and summarised
    mmlu_astronomy, but its report still said mmlu (column, MMLU/ARC table, bars): the report names it too."""
    recs = [_base("m", task="mmlu", length=None, depth=None, sample=i,
                  task_options={"num_fewshot": 5, "subject": "astronomy"}, metrics={"acc": float(v)})
            for i, v in enumerate(MMLU)]
    run = tmp_path / "astro"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "run.json").write_text(json.dumps({"run_id": "r", "lengths": [], "depths": [], "samples": 1, "seed": 0}))
    write_tables(recs, run)
    table, _ = load_runs([run])
    assert set(table["task"]) == {"mmlu_astronomy"}
    res = build_report([run], tmp_path / "rep")
    md = res["markdown"].read_text()
    assert "mmlu_astronomy" in md and "@ mmlu " not in md and "| mmlu |" not in md, md


@pytest.mark.slow
@pytest.mark.usefixtures("plain_console")
def test_report_prints_its_summary_whole(tmp_path, capsys):
    """Issue 16 item 1: lctx report prints its summary table whole."""
    run = _run(tmp_path / "runs" / "run-with-a-long-directory-name", ["rope", "alibi"], flat=True)
    code, out, err = run_cli(["report", run, "--out", tmp_path / "rep"], capsys)
    assert code == 0, err
    header = next(ln for ln in out.splitlines() if ln.startswith("| model"))
    for col in ("train length", "PPL at train length", "flat until", "effective length", "passkey exact @ 1×"):
        assert col in header, header
    assert "…" not in out


def _cat_rows(spec):
    """A results table of (task, length, values) rows for one model (status ok, depth 0.5)."""
    rows = [{"label": "m", "model": "m", "task": t, "metric": metric, "length": L, "depth": 0.5, "sample": i,
             "value": float(v), "status": "ok"}
            for t, metric, L, vals in spec for i, v in enumerate(vals)]
    return pd.DataFrame(rows)


def test_category_table_averages_tasks_not_samples():
    """Issue 30 item 7: a category's score is the mean of its tasks' means (RULER's average), not of the pooled
    samples: passkey 1/4 and niah_single_1 2/2 give single retrieval (25 + 100) / 2 = 62.5 (pooled: 3/6 = 50, the
    control that the test tells them apart); vt alone 0; ppl (no category) left out; RULER's average beside them;
    a length where one of the two ran says (1/2)."""
    from lctx.harness.outputs.report import category_blocks, category_table

    t = _cat_rows([("passkey", "exact", 1024, [1, 0, 0, 0]), ("niah_single_1", "string_match_all", 1024, [1, 1]),
                   ("vt", "string_match_all", 1024, [0]), ("ppl", "ppl", 1024, [12.5]),
                   ("ruler", "average", 1024, [40.0]), ("passkey", "exact", 2048, [1, 1])])
    grid, cats = category_table(t)
    assert cats == {"single retrieval": ["niah_single_1", "passkey"], "multi-hop tracing": ["vt"]}
    assert grid.loc[1024, "single retrieval"] == pytest.approx(62.5) != 50.0  # hand computation, above
    assert grid.loc[1024, "multi-hop tracing"] == 0.0 and grid.loc[1024, "RULER average"] == 40.0
    assert grid.loc[2048, "single retrieval"] == 100.0 and grid.attrs["counts"][(2048, "single retrieval")] == 1
    (_, text), (_, disp, _) = category_blocks(t)
    assert "100.0 (1/2)" in list(disp["single retrieval"]) and "62.5" in list(disp["single retrieval"])
    assert "single retrieval: niah_single_1, passkey" in text
    assert category_blocks(_cat_rows([("passkey", "exact", 1024, [1])])) == []  # one category: the summary says it


# ---------------------------------------------------------------------------------------------- outside text (issue 42)

PLANTED = "planted-key-5e6f7a8b9c0d"
CONTROLS = "\x1b]0;PWNED\x07\x1b[31m\x9b2J\u202e"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_report_of_outside_text_holds_no_key_and_no_raw_control(tmp_path):
    """Issue 42 items 1 and 5: a run directory written before lctx redacted anything (its results.parquet and
    run.json hold the planted key in a model id, an error and a trust-probe reason, and terminal controls): the
    report redacts as it reads, and report.md, report.html, summary.csv and failures.csv hold neither the key nor a
    raw control character (html.escape leaves those: they are escaped visibly), and its figures draw the escapes (no
    missing-glyph warning quoting a raw byte on stderr). Control: the escaped id is there."""
    from lctx import outside
    from lctx.harness.run.tables import to_table

    outside.forget_secrets()
    outside.register_secret(PLANTED)
    try:
        model = f"toy{CONTROLS}-{PLANTED}"
        recs = [_base(model, task="passkey", length=L, depth=0.5, sample=s, task_options={},
                      metrics={"exact": 1.0}, unavailable={"digit_acc": f"probe failed: HTTP 401 ({PLANTED})"})
                for L in (256, 512) for s in (0, 1)]
        recs.append(_base(model, task="passkey", length=1024, depth=0.5, sample=0, task_options={}, metrics={},
                          status="error", error=f"HTTP 401 (Incorrect API key provided: {PLANTED}\x1b[2J)"))
        run = tmp_path / "legacy"
        run.mkdir()
        to_table(recs, {"passkey": ("exact", "digit_acc")}).to_parquet(run / "results.parquet", index=False)
        (run / "run.json").write_text(json.dumps({"run_id": "r", "host": f"h{CONTROLS}", "lengths": [256, 512, 1024],
                                                  "models": [f"http://x/v1?k={PLANTED}"]}))
        assert PLANTED.encode() in (run / "results.parquet").read_bytes()  # control: the input holds it
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = build_report([run], tmp_path / "report")
        # the figures' titles and legends drew the escapes, not missing glyphs (whose warning quoted the raw byte)
        assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]
    finally:
        outside.forget_secrets()
    for name in ("report.md", "report.html", "summary.csv", "failures.csv"):
        text = (tmp_path / "report" / name).read_text()
        assert PLANTED not in text and RAW_CONTROL.search(text.replace("\n", "").replace("\t", "")) is None, name
    assert "toy\\x1b]0;PWNED\\x07" in res["markdown"].read_text()


# ---------------------------------------------------------------------------------------------- positional methods
# (issue 43 item 5): a run directory holds a checkpoint as shipped and under methods, each a model of its own
# (`{base}+{label}`), run.json recording inputs.models[name]["position"] = {"base", "method", "options", ...}

MT = 256  # the training length of the method fixtures (1x)
LENGTHS = (256, 512, 1024, 2048)
#: model name -> (variant, method, options, declared max positions)
METHODS = {"smol": ("llama", "shipped", {}, 512),
           "smol+yarn_factor4": ("llama+yarn:factor=4", "yarn", {"factor": 4.0, "beta_fast": 32.0}, 2048),
           "smol+linear_factor2": ("llama+linear:factor=2", "linear", {"factor": 2.0}, 1024)}
#: passkey exact per length: 6 samples (depths 0, 0.5, 1 x samples 0, 1)
M_EXACT = {"smol": {256: [1, 1, 1, 1, 1, 0], 512: [1, 1, 0, 1, 0, 0], 1024: [0] * 6, 2048: [0] * 6},
           "smol+yarn_factor4": {256: [1] * 6, 512: [1] * 6, 1024: [1, 1, 1, 1, 1, 0], 2048: [1, 1, 0, 1, 0, 1]},
           "smol+linear_factor2": {256: [1] * 6, 512: [1, 1, 1, 1, 1, 0], 1024: [1, 0, 0, 1, 0, 0],
                                   2048: [0] * 6}}
#: niah_single_2 string_match_all (3 depths x 1 sample): the linear method did not run it
M_NIAH = {"smol": {256: [1, 1, 1], 512: [0, 1, 0]}, "smol+yarn_factor4": {256: [1, 1, 1], 512: [1, 1, 1]}}
#: nll of the 3 ppl windows (samples 0, 1, 2) per length; the linear method has no ppl at 2048 (8x)
M_NLL = {"smol": {256: [2.00, 2.10, 1.95], 512: [2.20, 2.25, 2.10], 1024: [2.9, 3.1, 3.0], 2048: [4.0, 4.4, 4.1]},
         "smol+yarn_factor4": {256: [2.03, 2.15, 1.99], 512: [2.01, 2.12, 1.96], 1024: [2.05, 2.2, 2.0],
                               2048: [2.2, 2.3, 2.1]},
         "smol+linear_factor2": {256: [2.10, 2.12, 2.00], 512: [2.11, 2.2, 2.05], 1024: [2.4, 2.6, 2.5]}}


def _wall(model: str, L: int, i: int) -> float:
    """A passkey sample's wall seconds: grows with the length, varies by sample, the yarn model 1.5x slower."""
    return (L / 256) * (0.2 + 0.03 * i) * (1.5 if "yarn" in model else 1.0)


def _method_records(models, train_length=MT):
    recs = []
    for m in models:
        variant = METHODS[m][0]
        for L, vals in M_NLL[m].items():
            for s, nll in enumerate(vals):
                recs.append(_base(m, train_length, variant=variant, task="ppl", length=L, depth=None, sample=s,
                                  task_options={"windows": 3}, wall_s=0.01 * L,
                                  metrics={"ppl": math.exp(nll), "nll": nll, "n_tokens": L}))
        for L, vals in M_EXACT[m].items():
            for i, v in enumerate(vals):
                recs.append(_base(m, train_length, variant=variant, task="passkey", length=L, depth=(0.0, 0.5, 1.0)[i // 2],
                                  sample=i % 2, task_options={}, wall_s=_wall(m, L, i),
                                  metrics={"exact": float(v), "digit_acc": float(v)}))
        for L, vals in M_NIAH.get(m, {}).items():
            for i, v in enumerate(vals):
                recs.append(_base(m, train_length, variant=variant, task="niah_single_2", length=L,
                                  depth=(0.0, 0.5, 1.0)[i], sample=0, task_options={}, wall_s=1.0,
                                  metrics={"string_match_all": float(v)}))
    return recs


def _method_run(path, models, train_length=MT, positions=True):
    """A run directory of ``models`` (names of :data:`METHODS`) with run.json's position records (``positions``)."""
    recs = _method_records(models, train_length)
    path.mkdir(parents=True)
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    inputs = {"models": {m: ({"position": {"base": "smol", "method": METHODS[m][1], "options": METHODS[m][2],
                                           "layer_type": None, "effective": {}}} if positions else {})
                         for m in models}}
    (path / "run.json").write_text(json.dumps({"run_id": f"id-{path.name}", "inputs": inputs,
                                               "max_positions": {m: METHODS[m][3] for m in models}}))
    write_tables(recs, path)
    return path


def _effective(scores: dict, thr: float = 0.8) -> int:
    """RULER's effective length by hand: the largest L with every tested length up to it >= thr, 0 if none."""
    best = 0
    for L in sorted(scores):
        if scores[L] < thr:
            break
        best = L
    return best


def _means(d: dict) -> dict:
    return {L: sum(v) / len(v) for L, v in d.items()}


def _method_tables(run_dirs):
    from lctx.harness.outputs.report import method_groups, method_table, model_positions

    table, metas = load_runs(run_dirs)
    positions = model_positions(table, metas)
    groups = method_groups(positions)
    assert list(groups) == ["smol"]
    return method_table(table, groups["smol"], positions), positions, groups["smol"]


def test_positional_methods_table_against_the_records(tmp_path):
    """Issue 43 item 5: one row per method (shipped first), each number recomputed here from the records: effective
    length on passkey and niah_single_2 (threshold 0.8), ppl ratio at 2x/4x/8x with its interval (3 windows a length:
    exp(mean nll(L) - mean nll(T)) -+ 1.96 sqrt(se_L^2 + se_T^2)), ppl at 1x over the shipped model's (paired over
    the same 3 windows: t with 2 degrees of freedom), the median seconds per passkey sample; what the run did not
    measure reads "not run", never 0."""
    import statistics

    from scipy.stats import t as student

    run = _method_run(tmp_path / "run", list(METHODS))
    (disp, num, info), positions, members = _method_tables([run])
    assert list(disp["method"]) == ["shipped", "linear:factor=2", "yarn:factor=4"]  # shipped first, then table order
    d, n = disp.set_index("method"), num.set_index("method")
    label = dict(zip(disp["method"], members))
    assert info["reference"] == MT and info["reference_source"] == "training length"
    for model, (variant, method, _, mx) in METHODS.items():
        row = "shipped" if method == "shipped" else variant.split("+", 1)[1]
        assert positions[label[row]]["name"] == model
        # effective length by hand; the display says "≥" where it held at the longest length the method ran
        e = _effective(_means(M_EXACT[model]))
        assert n.loc[row, "passkey effective_length"] == e
        shown = f"{e // 1024}K" if e >= 1024 else str(e)
        assert d.loc[row, "effective length @ passkey"] == \
            ("≥ " if e == max(M_EXACT[model]) else "") + f"{shown} ({e / MT:g}×)"
        assert n.loc[row, "max_positions"] == mx
        # the ppl ratio at 2x, 4x, 8x of the model itself
        nll = M_NLL[model]
        for k in (2, 4, 8):
            L = k * MT
            if L not in nll:
                assert d.loc[row, f"ppl ratio @ {k}×"] == "not run" and math.isnan(n.loc[row, f"ppl_ratio@{k}x"])
                continue
            mL, mT = statistics.mean(nll[L]), statistics.mean(nll[MT])
            se = math.sqrt(statistics.variance(nll[L]) / 3 + statistics.variance(nll[MT]) / 3)
            tol = 1e-9 * math.exp(mL - mT)  # float rounding of exp/log of values near 1 (ppl stored as exp(nll))
            assert n.loc[row, f"ppl_ratio@{k}x"] == pytest.approx(math.exp(mL - mT), rel=1e-9, abs=tol)
            assert n.loc[row, f"ppl_ratio@{k}x ci_low"] == pytest.approx(math.exp(mL - mT - 1.959964 * se), rel=1e-6)
            assert n.loc[row, f"ppl_ratio@{k}x ci_high"] == pytest.approx(math.exp(mL - mT + 1.959964 * se), rel=1e-6)
        # the cost at 1x: the method's ppl over the shipped model's, paired over the same windows
        if method == "shipped":
            assert n.loc[row, "ppl@1x/shipped"] == 1.0 and d.loc[row, "ppl @ 1× / shipped"].startswith("1 (reference")
        else:
            diffs = [a - b for a, b in zip(nll[MT], M_NLL["smol"][MT])]
            lr = statistics.mean(diffs)  # equal n_tokens: the token-weighted mean is the plain one
            h = student.ppf(0.975, 2) * statistics.stdev(diffs) / math.sqrt(3)
            assert n.loc[row, "ppl@1x/shipped"] == pytest.approx(math.exp(lr), rel=1e-9)
            assert n.loc[row, "ppl@1x/shipped ci_low"] == pytest.approx(math.exp(lr - h), rel=1e-6)
            assert n.loc[row, "ppl@1x/shipped ci_high"] == pytest.approx(math.exp(lr + h), rel=1e-6)
            assert n.loc[row, "ppl@1x/shipped interval"] == "paired"
        # seconds per passkey sample: the median of the 6 samples' wall_s at each length
        for L in LENGTHS:
            assert n.loc[row, f"s_per_sample@{L}"] == pytest.approx(statistics.median(_wall(model, L, i)
                                                                                      for i in range(6)), rel=1e-12)
    # niah_single_2: by hand for the two that ran it; the linear method did not: "not run", NaN, never 0
    for row, model in (("shipped", "smol"), ("yarn:factor=4", "smol+yarn_factor4")):
        assert n.loc[row, "niah_single_2 effective_length"] == _effective(_means(M_NIAH[model]))
    assert d.loc["shipped", "effective length @ niah_single_2"] == "256 (1×)"  # 0.33 at 512: below 0.8
    assert d.loc["yarn:factor=4", "effective length @ niah_single_2"] == "≥ 512 (2×)"  # held as far as it ran
    assert d.loc["linear:factor=2", "effective length @ niah_single_2"] == "not run"
    assert math.isnan(n.loc["linear:factor=2", "niah_single_2 effective_length"])
    assert d.loc["linear:factor=2", "ppl ratio @ 8×"] == "not run"  # control: the other ratios are numbers
    assert d.loc["linear:factor=2", "ppl ratio @ 4×"].split(" [")[0] == f"{n.loc['linear:factor=2', 'ppl_ratio@4x']:.3g}"
    assert d.loc["yarn:factor=4", "declared max"] == "2K (8×)" and d.loc["shipped", "declared max"] == "512 (2×)"


def test_positional_methods_answer_line_and_a_method_that_never_reaches(tmp_path):
    """The one-line answer above a base model's table names the method that keeps the headline retrieval task above
    the threshold farthest, and how far each other one does (from the same hand-checked effective lengths)."""
    from lctx.harness.outputs.report import method_answer

    run = _method_run(tmp_path / "run", list(METHODS))
    (disp, num, info), positions, members = _method_tables([run])
    line = method_answer("smol", members, positions, info, 0.8)
    # yarn: exact means 1, 1, 5/6, 4/6 -> 1K (4x); shipped: 5/6, 3/6 -> 256; linear: 1, 5/6, 2/6 -> 512
    assert line.startswith("smol: yarn:factor=4 keeps passkey exact ≥ 0.8 to 1K (4×) (ppl at 1×: "), line
    assert line.endswith("; shipped to 256 (1×); linear:factor=2 to 512 (2×)."), line
    info["effective"][members[0]]["passkey"] = (0, 2048, 256)  # control: a method below the threshold everywhere
    assert "; shipped below 256;" in method_answer("smol", members, positions, info, 0.8)


def test_positional_methods_from_one_run_directory_per_method(tmp_path):
    """Issue 43 item 5.4: the same table from one run directory per method given together, the shipped one an older
    run without position records (it is the base the others name) and no training length recorded: 1x is then the
    shipped model's declared maximum (512), and the page says so. Control: the numbers equal those of one run
    directory holding all three, with the same 1x."""
    runs = [_method_run(tmp_path / "shipped", ["smol"], train_length=None, positions=False),
            _method_run(tmp_path / "yarn", ["smol+yarn_factor4"], train_length=None),
            _method_run(tmp_path / "linear", ["smol+linear_factor2"], train_length=None)]
    (disp, num, info), positions, members = _method_tables(runs)
    assert list(disp["method"]) == ["shipped", "yarn:factor=4", "linear:factor=2"]
    assert positions[members[0]]["inferred"] and info["reference"] == 512
    assert "declared maximum" in info["reference_source"]
    one = _method_run(tmp_path / "one", list(METHODS), train_length=512)
    (_, num1, _), _, _ = _method_tables([one])
    cols = [c for c in num.columns if c not in ("runs", "reference", "model", "method")]
    a = num.set_index("method")[cols].sort_index()
    b = num1.set_index("method")[cols].sort_index()
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-12)
    assert num.set_index("method").loc["yarn:factor=4", "passkey effective_length"] == 1024  # 2x of 512
    assert disp.set_index("method").loc["yarn:factor=4", "ppl ratio @ 8×"] == "not run"  # 8 x 512 was not run


def test_a_run_without_methods_has_no_positional_section(tmp_path):
    """Control: models that record no method and name no base (every run before issue 43) make no group."""
    from lctx.harness.outputs.report import method_groups, model_positions

    table, metas = load_runs([_run(tmp_path / "r", ["rope", "alibi"])])
    assert model_positions(table, metas) == {} and method_groups({}) == {}
    one = _method_run(tmp_path / "m", ["smol+yarn_factor4"])  # one method alone: nothing to set beside it
    table, metas = load_runs([one])
    assert len(model_positions(table, metas)) == 1 and method_groups(model_positions(table, metas)) == {}


def test_method_label_reads_the_record_the_variant_or_the_name():
    from lctx.harness.outputs.compare import method_label

    pos = {"base": "smol", "method": "yarn", "options": {"factor": 4.0}}
    assert method_label(pos, "smol+yarn_factor4", "llama+yarn:factor=4") == "yarn:factor=4"
    assert method_label(pos, "smol+yarn_factor4", "llama") == "yarn_factor4"  # no method in the variant: the name
    assert method_label(pos, "other", None) == "yarn:factor=4.0"  # neither: every option recorded
    assert method_label({**pos, "label": "yarn:factor=4"}, "x") == "yarn:factor=4"
    assert method_label({"base": "smol", "method": "shipped"}, "smol", "llama") == "shipped"
    # "+ssmaxx" is not the method "ssmax" (no prefix match): every option recorded
    assert method_label({"method": "ssmax", "options": {"s": 0.5}}, "m", "rope+ssmaxx:s=1") == "ssmax:s=0.5"


@pytest.mark.slow  # the whole report drawn (every figure): ~4 s of CPU
def test_report_has_the_positional_methods_section(tmp_path, capsys):
    """The page holds, per base model: its heading, the one-line answer in bold, the table, the retrieval plot and
    a heatmap row per task; positional_methods.csv and positional_retrieval.csv hold the numbers; `lctx report` prints
    the answer."""
    run = _method_run(tmp_path / "run", list(METHODS))
    res = build_report([run], tmp_path / "rep")
    md = res["markdown"].read_text()
    section = md.split("## Positional methods", 1)[1].split("\n## ", 1)[0]
    assert "### smol" in section and f"**{res['answers'][0]}**" in section
    assert "| method | declared max | effective length @ passkey |" in section
    names = {p.name for p in res["plots"]}
    assert {"methods_smol_retrieval.png", "passkey_methods_smol.png", "niah_single_2_methods_smol.png"} <= names
    assert all((tmp_path / "rep" / "plots" / n).is_file() for n in names)
    csv = pd.read_csv(res["positions"])
    assert list(csv["method"]) == ["shipped", "linear:factor=2", "yarn:factor=4"]
    series = pd.read_csv(tmp_path / "rep" / "positional_retrieval.csv")
    got = series[(series["method"] == "yarn:factor=4") & (series["task"] == "passkey")].set_index("length")["mean"]
    assert got.to_dict() == pytest.approx(_means(M_EXACT["smol+yarn_factor4"]))
    assert "<p class='lead'>smol: yarn:factor=4 keeps passkey exact" in res["html"].read_text()
    code, out, err = run_cli(["report", run, "--out", tmp_path / "rep2"], capsys)
    assert code == 0, err
    assert res["answers"][0] in out
    plain = build_report([_run(tmp_path / "plain", ["rope"])], tmp_path / "rep3")  # control: no methods, no section
    assert plain["positions"] is None and "Positional methods" not in plain["markdown"].read_text()
