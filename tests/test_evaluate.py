"""lctx.harness.evaluate: ``lctx.evaluate`` is the evaluation and ``lctx run`` a thin wrapper over it (issue 13.1):
both give the same table for the same inputs."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from helpers import assert_one_line_error, run_cli

#: columns that differ between two runs of the same inputs (when and how long, which process)
RUN_SPECIFIC = ["run_id", "wall_s", "cpu_s", "peak_mem_bytes", "timestamp"]


def _comparable(table: pd.DataFrame) -> pd.DataFrame:
    t = table.drop(columns=[c for c in RUN_SPECIFIC if c in table.columns])
    return t.sort_values(["task", "metric", "length", "depth", "sample"]).reset_index(drop=True)


@pytest.mark.slow
def test_cli_run_and_evaluate_give_the_same_table(make_checkpoint, tmp_path):
    import lctx
    from lctx.cli import app

    ck = make_checkpoint("rope")
    args = dict(lengths=[160, 200], depths=[0.5], samples=1)
    res = lctx.evaluate([str(ck)], ["passkey", "ppl"], out=tmp_path / "api", key_digits=3, memory_check=False,
                        log=lambda m: None, **args)
    cli = CliRunner().invoke(app, ["run", "--model", str(ck), "--tasks", "passkey,ppl", "--lengths", "160,200",
                                   "--depths", "0.5", "--samples", "1", "--key-digits", "3", "--no-memory-check",
                                   "--no-progress", "--out", str(tmp_path / "cli")])
    assert cli.exit_code == 0, cli.output
    from_cli = pd.read_parquet(tmp_path / "cli" / "results.parquet")
    assert set(res.table["task"]) == {"passkey", "ppl"} and len(res.table) == len(from_cli)
    pd.testing.assert_frame_equal(_comparable(res.table), _comparable(from_cli), check_dtype=False)
    # the API's table is the one it wrote
    pd.testing.assert_frame_equal(_comparable(res.table), _comparable(pd.read_parquet(res.paths["results"])),
                                  check_dtype=False)
    assert res.ran == 4 and res.errors == 0 and res.ok == 4  # 2 tasks x 2 lengths x 1 depth x 1 sample
    # a rerun on the same directory resumes: nothing runs, the same table comes back
    again = lctx.evaluate([str(ck)], "passkey,ppl", out=tmp_path / "api", key_digits=3, memory_check=False,
                          log=lambda m: None, **args)
    assert again.ran == 0 and again.skipped == 4


def test_import_lctx_stays_light():
    import subprocess
    import sys

    code = "import sys, lctx; lctx.evaluate; print(sorted(m for m in ('torch', 'pandas', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("samples", [0, -1, 1.5, True])
def test_evaluate_rejects_bad_samples_before_making_a_folder(samples, tmp_path, monkeypatch):
    # the CLI checks --samples itself; the Python API must too, naming the argument, and leave no temp folder
    import tempfile

    import lctx

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(lctx.LctxError, match=r"samples=.* is not a whole number >= 1"):
        lctx.evaluate("bundled", "passkey", lengths=[256], samples=samples, log=lambda m: None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("chunk_size", [0, -4, 2.5])
def test_evaluate_rejects_a_bad_chunk_size_before_anything_runs(chunk_size, tmp_path):
    # issue 25 item 4: chunk_size=0 reached HFAdapter.prefill (range step 0): every sample failed, exit 3 from the CLI
    import lctx

    with pytest.raises(lctx.LctxError, match=r"chunk_size=.* is not a whole number >= 1; .*\(--chunk-size\)"):
        lctx.evaluate(None, "passkey", lengths=[256], chunk_size=chunk_size, out=tmp_path / "o", log=lambda m: None)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_repeated_lengths_depths_and_tasks_run_once(make_checkpoint, tmp_path):
    import lctx

    ck = make_checkpoint("rope")
    notes = []
    res = lctx.evaluate([str(ck)], ["passkey", "passkey"], lengths=[160, 160], depths=[0.5, 0.5], samples=1,
                        out=tmp_path / "r", key_digits=3, memory_check=False, log=notes.append)
    assert res.ran == 1  # one cell: passkey x 160 x 0.5 x 1 sample (it ran 4 before the fix)
    assert sum("repeat" in n for n in notes) == 3  # tasks, lengths, depths: each said once


def test_evaluate_refuses_a_cache_dir_that_is_a_file_before_the_tasks_are_built(tmp_path):
    # issue 25, F6: the Python API checks --cache-dir too (the CLI refuses it while parsing); before the fix the
    # NIAH task was built first, here refusing the empty data dir instead
    import lctx

    (tmp_path / "f").write_text("")
    (tmp_path / "data").mkdir()
    with pytest.raises(lctx.LctxError, match=r"cannot write to --cache-dir .* \(it is a file, not a directory\)"):
        lctx.evaluate(None, "niah_single_1", lengths=[256], out=tmp_path / "o", data_dir=tmp_path / "data",
                      cache_dir=tmp_path / "f", log=lambda m: None)
    assert not (tmp_path / "o").exists()


def test_relative_lengths_are_checked_once_the_training_lengths_are_known():
    # issue 25: --relative's lengths are known only after the models load; a whole-number stride longer than one
    # of them (cut to window - 1 before, silently) and a length past the bound (F5) are refused before the sweep
    from lctx.errors import LctxError
    from lctx.harness.evaluate import _check_before_run
    from lctx.tasks.ppl import Perplexity

    with pytest.raises(LctxError, match=r"bad --stride for task 'ppl': stride 300 is longer than the shortest window "
                                        r"\(128 tokens"):
        _check_before_run([([], [128, 512])], [Perplexity(stride=300)], None, False, False, relative=True)
    with pytest.raises(LctxError, match=r"length 4294967296 is above 2147483648 tokens"):
        _check_before_run([([], [256, 2**32])], [], None, False, False, relative=True)
    assert _check_before_run([([], [300, 512])], [Perplexity(stride=300)], None, False, False, relative=True) == {
        "skip_below": {}, "notes": []}  # a stride equal to or below every window runs


@pytest.mark.parametrize("args, needles", [
    (["--tasks", "passkey", "--task-option", "passkey.key_digits=abc"],
     ["--task-option passkey.key_digits", "'abc' is not a number", "whole number"]),
    (["--tasks", "ppl", "--stride", "0"], ["--stride", "e.g. --stride 0.5"]),
    (["--tasks", "ppl", "--ppl-max-tokens", "-1"], ["--ppl-max-tokens", "0 (all)"]),
    (["--tasks", "ppl", "--window", "abc"], ["--window 'abc'", "--window 256,1k"]),
])
@pytest.mark.usefixtures("isolated_digests")
def test_option_errors_name_the_flag_and_a_fix(capsys, tmp_path, args, needles):
    """Trial 21 item 2: a bad value of a run option is one line naming the flag and a good value."""
    code, _, err = run_cli(["run", *args, "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, *needles)
    assert "invalid literal" not in err and "length 'abc'" not in err


@pytest.mark.parametrize("models, tasks, said", [
    ([], ["passkey"], "models=[] names no model; pass a checkpoint path or a model adapter object, or leave models "
                      "out (None) for the bundled demo pair"),
    ((), ["passkey"], "models=() names no model"),
    ("toy", [], "tasks=[] names no task; pass task names or objects (e.g. ['passkey'] or [Passkey()]), or leave "
                "tasks out (None) for the default tasks"),
    ("toy", (), "tasks=() names no task"),
])
def test_an_empty_list_of_models_or_tasks_is_refused(tmp_path, models, tasks, said):
    """Issue 26 trial item 2: ``lctx.evaluate([], [Passkey()])`` evaluated the bundled model (an empty list taken as
    "the default") and ``lctx.evaluate(model, [])`` ran nothing, left a locked folder and returned table None.
    Only None means the default; an empty list is one line, and nothing is made."""
    import lctx
    import toy_adapter as toy

    models = toy.ToyAdapter() if models == "toy" else models
    with pytest.raises(lctx.LctxError) as e:
        lctx.evaluate(models, tasks, lengths=[256], out=tmp_path / "o", log=lambda m: None)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)
    assert not (tmp_path / "o").exists()


def test_none_is_the_default_models_and_tasks(tmp_path):
    """Control of the refusal above: tasks=None runs the default tasks (passkey and ppl) on the adapter given, and
    models=None gets past the model check (the refusal that follows is of the empty task list, not of the models)."""
    import lctx
    import toy_adapter as toy

    res = lctx.evaluate(toy.ToyAdapter(), None, lengths=[256], depths=[0.5], samples=1, ppl_max_tokens=300,
                        out=tmp_path / "o", log=lambda m: None)
    assert set(res.table["task"]) == {"passkey", "ppl"} and res.errors == 0
    with pytest.raises(lctx.LctxError, match=r"^tasks=\[\] names no task"):
        lctx.evaluate(None, [], out=tmp_path / "p", log=lambda m: None)


def test_task_file_without_tasks_says_which_tasks_it_adds_and_how_to_run_them(tmp_path):
    """Issue 26 trial item 8: a task file without ``tasks`` silently ran the default tasks; one note line names the
    file's tasks and how to run them. Control: with the file's task named there is no note (and it runs)."""
    import lctx
    import toy_adapter as toy
    from helpers import token_nll_task_source
    from lctx.tasks import TASKS

    f = tmp_path / "my_task.py"
    f.write_text(token_nll_task_source("LastNLL", "last_nll_test"))
    said: list[str] = []
    kw = dict(lengths=[256], depths=[0.5], samples=1, ppl_max_tokens=300, task_files=[f], log=said.append)
    try:
        res = lctx.evaluate(toy.ToyAdapter(), None, out=tmp_path / "o", **kw)
        notes = [m for m in said if "--task-file" in m]
        assert notes == [f"note: --task-file {f} adds last_nll_test, which does not run: without --tasks this run "
                         "runs the default tasks (passkey, ppl); to run it, pass --tasks last_nll_test"]
        assert set(res.table["task"]) == {"passkey", "ppl"}
        said.clear()
        res = lctx.evaluate(toy.ToyAdapter(), ["last_nll_test"], out=tmp_path / "p", **kw)
        assert not [m for m in said if "--task-file" in m] and set(res.table["task"]) == {"last_nll_test"}
    finally:
        TASKS.pop("last_nll_test", None)
