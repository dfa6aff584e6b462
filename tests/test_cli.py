"""lctx.cli: one test per bad input (exit code 2, one line naming the problem and the fix), a happy path, the exit
statuses (3: every sample failed; 130 and 143: interrupted), output whole off a terminal, a closed stdout or
stderr pipe, and every --out checked while the arguments are parsed, before torch loads."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import typer
from helpers import assert_one_line_error, nan_checkpoint, run_cli, token_nll_task_source
from lctx.cli import DEFAULT_MODEL
from lctx.errors import EXIT_ALL_FAILED, EXIT_SOME_FAILED


@pytest.fixture(autouse=True)
def no_user_data_dir(monkeypatch):
    """CLI tests pass paths explicitly; a LCTX_DATA_DIR from the environment must not change them."""
    monkeypatch.delenv("LCTX_DATA_DIR", raising=False)


def test_cache_dir_from_the_environment_that_is_a_file_is_named_so(capsys, tmp_path, monkeypatch):
    # issue 25, F6: checked while the arguments are parsed; the line names where the value came from
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("LCTX_CACHE_DIR", str(tmp_path / "f"))
    code, _, err = run_cli(["run", "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, f"cannot write to LCTX_CACHE_DIR {str(tmp_path / 'f')!r} (it is a file")
    assert not (tmp_path / "o").exists()


def test_missing_checkpoint(capsys, tmp_path):  # answered before any model loads (issue 15.4): fast now
    code, _, err = run_cli(["run", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "does not exist")
    assert "lctx data" not in err  # a path that is no data file gets no data hint
    gguf = tmp_path / "data" / "checkpoints" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    code, _, err = run_cli(["run", "--model", str(gguf), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "does not exist")
    assert "`lctx data --out DIR --only smollm2`" in err  # the data file names the command that fetches it


def test_checkpoint_without_config(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(["run", "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "no config.json")


def test_corrupt_config(capsys, make_checkpoint, tmp_path):
    ck = make_checkpoint("rope")
    (ck / "config.json").write_text("{not json")
    code, _, err = run_cli(["run", "--model", str(ck), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "unreadable config.json")


def test_corrupt_weights(capsys, make_checkpoint, tmp_path):
    ck = make_checkpoint("rope")
    (ck / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    code, _, err = run_cli(["run", "--model", str(ck), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "could not be loaded")


def test_unknown_task(capsys, make_checkpoint, tmp_path):
    code, _, err = run_cli(["run", "--model", str(make_checkpoint()), "--tasks", "pasky",
                            "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "unknown task 'pasky'", "passkey")


def test_unknown_variant(capsys, tmp_path):
    code, _, err = run_cli(["train", "--variant", "ropey", "--steps", "1", "--out", str(tmp_path / "m")], capsys)
    assert_one_line_error(code, err, "ropey")


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "1.5k", "256,x"])  # empty entries: test_errors.py
def test_bad_length(capsys, tmp_path, bad):
    code, _, err = run_cli(["run", "--lengths", bad, "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "not a positive integer")


@pytest.mark.parametrize("args,needles", [
    (["run", "--samples", "0"], ["--samples 0 is below the minimum 1", "pass --samples 1 or more"]),
    (["run", "-n", "-2"], ["--samples -2 is below the minimum 1", "pass --samples 1 or more"]),
    (["run", "--samples", "two"], ["--samples 'two' is not a whole number", "e.g. --samples 2"]),
    (["run", "--stride", "half"], ["--stride 'half' is not a number", "e.g. --stride 0.5"]),
    (["plan", "--batch", "0"], ["--batch 0 is below the minimum 1", "pass --batch 1 or more"])])
def test_out_of_range_option_names_the_value_and_the_fix(capsys, tmp_path, args, needles):
    # the trial's `--samples 0` printed typer's "Invalid value ...: Input should be greater than or equal to 1"
    code, _, err = run_cli(args + ["--out", tmp_path / "o"] if args[0] == "run" else args, capsys)
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "o").exists()


def test_bad_depth(capsys, tmp_path):
    code, _, err = run_cli(["run", "--depths", "0,1.5", "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "[0, 1]")


def test_length_above_declared_max(capsys, make_checkpoint, tmp_path):
    ck = make_checkpoint("rope", max_position_embeddings=256)
    code, _, err = run_cli(["run", "--model", str(ck), "--lengths", "128,1k", "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "1024", "256")


def test_unreadable_data_file(capsys, make_checkpoint, tmp_path):
    code, _, err = run_cli(["run", "--model", str(make_checkpoint()), "--tasks", "ppl", "--ppl-data",
                            str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "missing.txt")


def test_bad_task_file(capsys, tmp_path):
    f = tmp_path / "broken_task.py"
    f.write_text("raise RuntimeError('oops')\n")
    code, _, err = run_cli(["run", "--task-file", str(f), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "broken_task.py", "oops")


def test_unknown_option_is_one_line(capsys):
    code, _, err = run_cli(["run", "--no-such-flag"], capsys)
    assert_one_line_error(code, err, "--no-such-flag")


@pytest.mark.parametrize("argv, helps", [(["run", "--num_fewshot", "3"], "`lctx run --help`"),
                                         (["diagnose", "far-mass", "--foo"], "`lctx diagnose far-mass --help`"),
                                         (["diagnose", "nope"], "`lctx diagnose --help`"),
                                         (["runn"], "`lctx --help`")])
def test_usage_error_points_at_the_help_of_the_command_called(capsys, argv, helps):
    # issue 24.6: "No such option: --num_fewshot (Possible options: --num-fewshot); see lctx --help" sent the
    # user to the command list; the options are in the help of the command that was called
    code, _, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, f"see {helps}")


def _fake_hub_cache(root: Path, repo_id: str, src: Path) -> Path:
    """A Hugging Face hub cache at ``root`` holding ``repo_id`` (huggingface_hub's layout:
    models--OWNER--NAME/snapshots/<commit>/ with a copy of ``src``, refs/main naming the commit)."""
    import shutil

    repo = root / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(src, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_hub_id_runs_from_the_local_cache_and_is_named_by_it(capsys, tmp_path, monkeypatch):
    # issue 24.6: `--model HuggingFaceTB/SmolLM2-135M-Instruct` (as lm-eval users type it) was told the checkpoint
    # "does not exist". A hub id in the local cache runs offline, named as the repository (not the snapshot hash).
    import huggingface_hub.constants

    from lctx.model_files import resolve_model_path
    from lctx.models.adapters.hf import load_lm

    snap = _fake_hub_cache(tmp_path / "hub", "lctx-test/pydoc-tiny", DEFAULT_MODEL)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # read at import
    assert resolve_model_path("lctx-test/pydoc-tiny") == (str(snap), "pydoc-tiny")
    assert resolve_model_path(str(DEFAULT_MODEL)) == (str(DEFAULT_MODEL), None)  # a path stays a path
    lm = load_lm("lctx-test/pydoc-tiny", device="cpu")
    assert lm.name == "pydoc-tiny" and lm.path == str(snap)
    code, out, err = run_cli(["plan", "--model", "lctx-test/pydoc-tiny", "--length", "256"], capsys)
    assert code == 0 and "memory plan: pydoc-tiny" in out, err
    code, _, err = run_cli(["run", "--model", "lctx-test/not-cached", "--out", tmp_path / "o2"], capsys)
    assert_one_line_error(code, err, "'lctx-test/not-cached' is not a local path", str(tmp_path / "hub"),
                          "lctx does not download at run time", "`hf download lctx-test/not-cached`")
    # a missing checkpoint under a local folder (the README's ckpt/my-model) is a missing path, not a hub id
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    code, _, err = run_cli(["run", "--model", "ckpt/my-model", "--out", tmp_path / "o3"], capsys)
    assert_one_line_error(code, err, "ckpt/my-model")
    assert "hf download" not in err and "Hugging Face model id" not in err, err


@pytest.mark.slow
def test_run_with_a_cached_hub_id(capsys, tmp_path, monkeypatch):
    import huggingface_hub.constants

    _fake_hub_cache(tmp_path / "hub", "lctx-test/pydoc-tiny", DEFAULT_MODEL)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "o"
    code, _, err = run_cli(["run", "--model", "lctx-test/pydoc-tiny", "--tasks", "passkey", "--lengths", "128",
                            "--depths", "0.5", "--samples", "1", "--no-progress", "--out", out], capsys)
    assert code == 0, err
    df = pd.read_csv(out / "results.csv")
    assert set(df["model"]) == {"pydoc-tiny"} and (df["status"] == "ok").all()


def test_cuda_is_refused_early_only_where_there_surely_is_none(tmp_path, monkeypatch):
    # issue 24.6: --device cuda without a GPU is answered before torch loads, from the device nodes a driver makes;
    # a machine with one (any node, a visible device) must never be refused by this guess
    from lctx.harness.args import cuda_absent

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert cuda_absent(tmp_path)
    for node in ("nvidia0", "kfd", "nvhost-ctrl-gpu", "dxg"):
        (tmp_path / node).write_text("")
        assert not cuda_absent(tmp_path), node
        (tmp_path / node).unlink()
    (tmp_path / "nvidia0").write_text("")
    for visible, absent in (("", True), ("-1", True), ("0", False), ("GPU-5b3c", False)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert cuda_absent(tmp_path) is absent, visible


def test_checkpoint_without_tokenizer_files_names_them(capsys, tmp_path):
    # issue 24.6: a folder without tokenizer files failed after the imports as "(Couldn't instantiate the backend
    # tokenizer from one of: )"; the check names the files, for `lctx run` and for load_lm (the Python API)
    import shutil

    from lctx.errors import LctxError
    from lctx.models.adapters.hf import load_lm

    ck = tmp_path / "no-tok"
    shutil.copytree(DEFAULT_MODEL, ck)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (ck / f).unlink()
    code, _, err = run_cli(["run", "--model", ck, "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "has no tokenizer", "no tokenizer.json and tokenizer_config.json",
                          "copy the tokenizer files")
    with pytest.raises(LctxError, match="has no tokenizer"):
        load_lm(str(ck), device="cpu")


def test_custom_task_file_end_to_end(capsys, make_checkpoint, tmp_path):
    f = tmp_path / "my_task.py"
    f.write_text(token_nll_task_source("FirstTokenNLL", "first_token_nll"))
    out = tmp_path / "o"
    code, stdout, err = run_cli(["run", "--model", str(make_checkpoint()), "--task-file", str(f), "--tasks",
                                 "first_token_nll", "--lengths", "32,64", "--samples", "2", "--out", str(out),
                                 "--no-progress"], capsys)
    assert code == 0, err
    df = pd.read_csv(out / "results.csv")
    assert set(df["task"]) == {"first_token_nll"} and len(df) == 4 and (df["status"] == "ok").all()


def preset_args(preset: Path) -> list[str]:
    """The `lctx run` options of a baseline's preset.sh (its `exec lctx run ... --out "$out" "$@"` line), so
    the test runs exactly what the committed baseline was made with."""
    import shlex

    line = " ".join(ln.strip().rstrip("\\") for ln in preset.read_text().splitlines()
                    if not ln.startswith("#"))
    words = shlex.split(line[line.index("exec lctx run"):])[3:]
    i = words.index("--out")
    return [w for w in words[:i] + words[i + 2:] if w != "$@"]  # drop --out "$out" and "$@"


@pytest.mark.slow
@pytest.mark.golden  # compares with the committed baseline, made on another machine
def test_bundled_default_run(capsys, tmp_path):
    """`lctx run` with no --model, tasks or lengths evaluates the bundled demo pair (the CI preset: flatness at 1x-8x,
    CPU float32), prints the flatness answer last, and reproduces the committed baseline within its rules (lctx
    compare)."""
    import platform

    from lctx.harness.outputs.compare import compare_dirs, load_rules

    from lctx.harness.evaluate import DEMO_MODELS

    baseline = Path(__file__).resolve().parents[1] / "results" / "baselines" / "demo-pair"
    assert all((m / "config.json").exists() for m in DEMO_MODELS), "bundled demo checkpoints missing"
    args = preset_args(baseline / "preset.sh")
    assert not {"--model", "-m", "--tasks", "--lengths", "--relative"} & set(args)  # the preset is `lctx run` as is
    out = tmp_path / "o"
    code, stdout, err = run_cli(["run", *args, "--out", str(out)], capsys)
    assert code == 0, err
    df = pd.read_parquet(out / "results.parquet")
    assert set(df["task"]) == {"passkey", "ppl", "flatness"}
    assert set(df["model"]) == {m.name for m in DEMO_MODELS} and set(df["length"].dropna()) == {128, 256, 512, 1024}
    assert stdout.rstrip().splitlines()[-1].startswith("pydoc-passkey-ggd_bam: train_length 128")  # the answer, last
    assert (df["status"] == "ok").all(), df[df["status"] != "ok"]["error"].tolist()
    assert (out / "plots" / "ppl_vs_length.png").exists()
    assert "results.parquet" in stdout
    made_with = json.loads((baseline / "run.json").read_text())["python"]
    if platform.python_version() != made_with:
        # the held-out ppl text is the stdlib's pydoc_data, which changes between Python versions (baseline README)
        pytest.skip(f"baseline made with Python {made_with}, this is {platform.python_version()}: "
                    "refresh it with its preset.sh to compare")
    cmp = compare_dirs(out, baseline, load_rules(baseline / "rules.toml"))
    # every baseline cell is present and within rules.toml's tolerances (rel 1e-4 on ppl/nll, exact on passkey
    # scores and token counts); a change of the numbers must refresh the baseline (its README says how)
    assert not cmp.failed, cmp.table[cmp.table["status"] != "same"].to_string()
    assert cmp.counts["same"] == len(pd.read_csv(baseline / "summary.csv"))


def test_console_script_help_runs():
    exe = Path(sys.executable).parent / "lctx"
    if not exe.exists():
        pytest.skip("lctx console script not installed in this environment (pip install -e .)")
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "run" in r.stdout and "train" in r.stdout


def test_unwritable_out(capsys, tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    code, _, err = run_cli(["run", "--out", str(f / "sub")], capsys)
    assert_one_line_error(code, err, "cannot write to --out")
    code, _, err = run_cli(["train", "--steps", "1", "--out", str(f)], capsys)
    assert_one_line_error(code, err, "cannot write to --out")


def test_task_file_cannot_replace_builtin(capsys, tmp_path):
    from lctx.tasks import TASKS
    from lctx.tasks.passkey import Passkey

    f = tmp_path / "dup.py"
    f.write_text("from lctx.tasks import Task, register_task\n@register_task\nclass P(Task):\n"
                 "    name = 'passkey'\n    metrics = ('x',)\n")
    code, _, err = run_cli(["run", "--task-file", str(f), "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "built-in task")
    assert TASKS["passkey"] is Passkey


@pytest.mark.parametrize("argv", [["train", "--steps", "1"], ["convert", "llama2c", "x.bin", "--tokenizer", "t.bin"],
                                  ["convert", "gguf", "x.gguf"]])
def test_out_holding_a_checkpoint_is_refused_without_overwrite(capsys, tmp_path, argv):
    # trial21 item 1: `lctx train --out DIR` over a trained checkpoint replaced its weights and config, exit 0.
    # Refused before any work (the files keep their bytes), and the line names --overwrite.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"variant": "rope"}')
    (ckpt / "model.safetensors").write_bytes(b"weights")
    code, _, err = run_cli(argv + ["--out", str(ckpt)], capsys)
    assert_one_line_error(code, err, "already holds a checkpoint (config.json, model.safetensors)")
    assert "--overwrite" in err
    assert (ckpt / "config.json").read_text() == '{"variant": "rope"}'
    assert (ckpt / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize("argv", [["train", "--steps", "1"], ["train", "--steps", "1", "--overwrite"],
                                  ["convert", "llama2c", "x.bin", "--tokenizer", "t.bin", "--overwrite"]])
def test_out_that_is_a_run_directory_is_refused(capsys, tmp_path, argv):
    # last stop's finding: `lctx train --out RUNS/passkey` (an lctx run directory) started training into it, so a
    # checkpoint and its config landed among run.json and records.jsonl. Refused before any work, even with
    # --overwrite (that flag replaces a checkpoint, not a run's results).
    run = tmp_path / "runs"
    run.mkdir()
    (run / "run.json").write_text('{"tasks": ["passkey"]}')
    (run / "records.jsonl").write_text("{}\n")
    code, _, err = run_cli(argv + ["--out", str(run)], capsys)
    assert_one_line_error(code, err, "is an lctx run directory (run.json, records.jsonl)")
    assert sorted(p.name for p in run.iterdir()) == ["records.jsonl", "run.json"]


@pytest.mark.parametrize("marker", ["records.rank0.jsonl", ".lctx.lock", "partial/"])
def test_out_that_is_a_partial_run_directory_is_refused(capsys, tmp_path, marker):
    # trial22 finding 11: a sharded run stopped before its records merged (records.rank0.jsonl only), a folder with
    # only the run lock, or only lm-eval's request caches (partial/) took a checkpoint without a word
    run = tmp_path / "runs"
    (run / marker.rstrip("/")).mkdir(parents=True) if marker.endswith("/") else (run.mkdir(), (run / marker).write_text(""))
    code, _, err = run_cli(["train", "--steps", "1", "--out", str(run)], capsys)
    assert_one_line_error(code, err, "is an lctx run directory")


@pytest.mark.parametrize("argv", [["run", "--tasks", "passkey"], ["report", "RUNDIR"], ["bench", "--variants", "rope"],
                                  ["diagnose", "far-mass", "-m", "CKPT"], ["compare", "RUNDIR"]])
def test_results_out_that_is_a_checkpoint_is_refused(capsys, tmp_path, argv):
    # trial22 finding 2: `lctx report RUN --out CKPT` (and run, bench, ...) wrote results among the weights; every
    # top-level file of a checkpoint is in its content fingerprint, so the bundled model's changed (4501e8a8... ->
    # 7dd0c10b...) and the next run redid all 44 samples. Refused while the arguments parse; nothing written.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"variant": "rope"}')
    (ckpt / "model.safetensors").write_bytes(b"weights")
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    argv = [str(run) if a == "RUNDIR" else str(ckpt) if a == "CKPT" else a for a in argv]
    code, _, err = run_cli(argv + ["--out", str(ckpt)], capsys)
    assert_one_line_error(code, err, "is a checkpoint folder (config.json, model.safetensors)")
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]


def test_report_into_a_run_directory_is_refused(capsys, tmp_path):
    # trial22 finding 1: `lctx report RUN --out RUN` replaced the run's per-cell summary.csv with the report's
    # one-row one, and `lctx compare RUN` then failed. Refused, naming a folder that works.
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / "summary.csv").write_text("model,task\n")
    code, _, err = run_cli(["report", str(run), "--out", str(run)], capsys)
    assert_one_line_error(code, err, "is an lctx run directory (run.json)", "report")
    assert (run / "summary.csv").read_text() == "model,task\n"
    from lctx.harness.outputs.report import build_report

    with pytest.raises(Exception, match="is an lctx run directory"):  # the Python API too
        build_report([run], run)


@pytest.mark.parametrize("value", ["", "rope,", ",rope"])
def test_bench_empty_variant_entry_is_refused(capsys, value):
    # trial22 finding 6: `--variants ""` ran the full benchmark of every variant (minutes); "rope," was accepted
    code, _, err = run_cli(["bench", "--variants", value, "--out", "unused"], capsys)
    assert_one_line_error(code, err, "--variants")


@pytest.mark.parametrize("opt", ["passkey.key_digits=0", "passkey.key_digits=-2", "passkey.key_digits=2.5",
                                 "passkey.max_new_tokens=0"])
def test_passkey_option_out_of_range_is_one_line(capsys, tmp_path, opt):
    # trial22 finding 4: key_digits=0 ended in a traceback (ValueError from randrange, exit 1); 2.5 made 2-digit keys
    code, _, err = run_cli(["run", "--tasks", "passkey", "--task-option", opt, "--lengths", "256",
                            "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, opt.split(".")[1].split("=")[0])
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_unusable_thread_count_is_one_line(capsys, tmp_path, monkeypatch, value):
    # trial22 finding 14: LCTX_NUM_THREADS=abc (0, -1) was ignored without a word, though the busy-machine note
    # recommends the variable
    monkeypatch.setenv("LCTX_NUM_THREADS", value)
    code, _, err = run_cli(["run", "--tasks", "passkey", "--lengths", "256", "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, f"LCTX_NUM_THREADS={value!r} is not a positive whole number")


@pytest.mark.parametrize("name", ["mmlu", "ppl", "arc_easy"])
def test_train_retrieval_task_that_cannot_make_documents(capsys, tmp_path, name):
    # trial22 finding 9: `--retrieval mmlu` said "unknown task 'mmlu'; known tasks: ... mmlu ...": the line now
    # says what is wrong with it
    (tmp_path / "d.txt").write_text("some text " * 50)
    code, _, err = run_cli(["train", "--data", str(tmp_path / "d.txt"), "--retrieval-fraction", "0.5", "--retrieval",
                            name, "--steps", "1", "--device", "cpu", "--out", str(tmp_path / "ck")], capsys)
    assert_one_line_error(code, err, f"retrieval task {name!r} cannot make training documents")


def test_ppl_data_given_twice_or_comma_joined_is_one_line(capsys, tmp_path):
    # trial22 findings 5 and 10: a file given twice was scored twice (weighing double); `--ppl-data a,b` said only
    # that the path does not exist
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("some text " * 50)
    b.write_text("other text " * 50)
    code, _, err = run_cli(["run", "--tasks", "ppl", "--ppl-data", str(a), "--ppl-data", str(a), "--window", "64",
                            "--out", str(tmp_path / "o")], capsys)
    assert_one_line_error(code, err, "twice")
    code, _, err = run_cli(["run", "--tasks", "ppl", "--ppl-data", f"{a},{b}", "--window", "64",
                            "--out", str(tmp_path / "o2")], capsys)
    assert_one_line_error(code, err, "repeat the flag")


def test_convert_gguf_refuses_a_folder_of_other_files(capsys, tmp_path):
    # convert gguf replaces --out whole (written aside, then renamed over it): a folder of other files would be
    # deleted, so it is refused even with --overwrite
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = run_cli(["convert", "gguf", "x.gguf", "--overwrite", "--out", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "is a folder of other files")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_interrupted_train_says_nothing_was_saved(capsys, tmp_path, monkeypatch):
    # trial21 item 3: a stopped `lctx train` printed run's "finished samples are kept: rerun the same command to
    # resume", but train keeps nothing and restarts from step 0. Each command now says what it kept.
    import lctx.harness.commands.train as T

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(T, "train", stopped)
    (tmp_path / "d.txt").write_text("some text " * 50)
    code, _, err = run_cli(["train", "--data", str(tmp_path / "d.txt"), "--device", "cpu", "--steps", "1",
                            "--out", str(tmp_path / "ck")], capsys)
    assert code == 130
    assert "nothing was saved" in err and "resume" in err and "rerun the same command to resume" not in err
    assert not (tmp_path / "ck").exists()


def test_cache_dir_that_reaches_nothing_is_named_as_ignored(capsys, tmp_path):
    # last stop's finding: --cache-dir with a non-GGUF model and no NIAH/RULER task was accepted without a word.
    # (--lengths 64 stops the run at passkey's length check, after the warning.)
    from lctx.harness.evaluate import _unused_cache_dir
    from lctx.tasks import get_task

    code, _, err = run_cli(["run", "--tasks", "passkey", "--cache-dir", str(tmp_path / "c"), "--lengths", "64",
                            "--out", str(tmp_path / "o")], capsys)
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: --cache-dir is ignored: it holds GGUF models' dequantised weights and the "
                        "NIAH/RULER tasks' samples, and this run has neither (tasks: passkey)"], err
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert _unused_cache_dir(str(gguf), [], ["passkey"]) is None  # a GGUF model's weights are cached there
    niah = get_task("niah_single_1")
    assert _unused_cache_dir("ckpt", [niah.__new__(niah)], ["niah_single_1"]) is None  # keeps its samples there


def test_cache_dir_from_the_environment_is_not_warned_about(capsys, tmp_path, monkeypatch):
    # issue 25 (minor): with LCTX_CACHE_DIR set, every passkey/ppl run warned that --cache-dir is ignored though
    # none was passed; the warning is for a --cache-dir the user gave (test above)
    monkeypatch.setenv("LCTX_CACHE_DIR", str(tmp_path / "c"))
    code, _, err = run_cli(["run", "--tasks", "passkey", "--lengths", "64", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "cache-dir" not in err, err  # stopped at passkey's length check, after the warnings
    code, _, err = run_cli(["run", "--tasks", "passkey", "--cache-dir", str(tmp_path / "c"), "--lengths", "64",
                            "--out", str(tmp_path / "o")], capsys)
    assert "warning: --cache-dir is ignored" in err


@pytest.mark.parametrize("value", ["", " "])
def test_empty_model_is_named_empty(capsys, tmp_path, value):
    # issue 25 (minor): --model "" named the current directory's missing config.json
    for cmd in (["run", "--tasks", "passkey", "--out", str(tmp_path / "o")], ["plan"]):
        code, _, err = run_cli(cmd + ["--model", value], capsys)
        assert_one_line_error(code, err, f"--model {value!r} is empty")
    assert not (tmp_path / "o").exists()


def test_options_of_tasks_not_in_the_run_are_named_as_ignored(capsys, tmp_path):
    # trial21 item 6: `lctx run --tasks passkey --limit 2 --num-fewshot 3` ran with exit 0 and no word that
    # both options (lm-eval's mmlu/arc_*) changed nothing. One warning line names them. (--lengths 64 is below
    # passkey's template, so the run stops at the length check, after the warning, without sampling.)
    from lctx.harness.evaluate import _ignored_options

    code, _, err = run_cli(["run", "--tasks", "passkey", "--limit", "2", "--num-fewshot", "3", "--lengths", "64",
                            "--out", str(tmp_path / "o")], capsys)
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: --limit (mmlu/arc_*), --num-fewshot (mmlu/arc_*) are ignored: no task of this "
                        "run uses them (tasks: passkey)"], err
    assert _ignored_options(["passkey", "ppl"], ["mmlu"], limit=2, num_fewshot=3, stride=0.25, key_digits=6) is None
    assert "--stride (ppl) is ignored" in _ignored_options(["passkey"], [], stride=1.0)
    assert "--key-digits (passkey)" in _ignored_options(["ppl"], [], key_digits=6)


# ------------------------------------------------------------------ issue 24 item 3: the run's printed table

def _depth_varying_summary():
    """A run's summary where depth 1.0 always fails passkey exact (SmolLM2's), one sample more at depth 0 than
    at the others (unequal n), digit_acc teacher-forced at 1.0 everywhere, and ppl without depths. Returns
    (summary, results table)."""
    import numpy as np

    from lctx.harness.run.tables import summarize

    rows = []
    for L in (256, 512):
        for d, k in ((0.0, 3), (0.5, 2), (1.0, 2)):
            for s in range(k):
                rows.append(dict(model="smol", variant="llama", task="passkey", metric="exact", length=L, depth=d,
                                 sample=s, value=float(d < 1.0 and (s + L // 256) % 3 != 0), status="ok"))
                rows.append(dict(model="smol", variant="llama", task="passkey", metric="digit_acc", length=L,
                                 depth=d, sample=s, value=1.0, status="ok"))
        rows.append(dict(model="smol", variant="llama", task="ppl", metric="ppl", length=L, depth=np.nan, sample=0,
                         value=30.0 + L / 100, status="ok"))
    table = pd.DataFrame(rows)
    return summarize(table), table


@pytest.mark.parametrize("fmt", ["markdown", "rich"])
def test_run_summary_shows_the_worst_depth_and_interval_and_n(capsys, monkeypatch, fmt):
    """`lctx run`'s closing table printed passkey exact 0.667 at every length, "mean over depths and samples",
    when depth 1.0 always failed: it now prints each mean's 95 % interval and n, and the worst depth under it, on a
    terminal (rich) and off one (Markdown) alike."""
    from lctx.harness.run.tables import print_summary as _print_summary
    from lctx.harness.run.intervals import wilson

    monkeypatch.setenv("LCTX_TABLE_FORMAT", fmt)
    monkeypatch.setenv("COLUMNS", "100")
    summary, table = _depth_varying_summary()
    _print_summary(summary)
    out = capsys.readouterr().out
    lines = out.splitlines()
    exact = table[table["metric"] == "exact"]
    for L in (256, 512):
        v = exact[exact["length"] == L]["value"]
        # every sample of every depth: exact is 0/1, so its 95 % interval is Wilson's (intervals.wilson; the
        # hand-checked values are in tests/test_intervals.py)
        lo, hi = wilson(int(v.sum()), len(v))
        cell = f"{v.mean():.3f} [{lo:.3f}, {hi:.3f}]"
        assert any(cell in ln and "exact" in ln and f" {len(v)} " in ln for ln in lines), (cell, out)
    worst = next(ln for ln in lines if "worst" in ln and "depth" in ln and "0.000 @ d=1" in ln)
    assert worst.count("0.000 @ d=1") == 2 and " 2 " in worst  # both lengths; n: depth 1.0's two samples
    assert "digit_acc" in out and "teacher-forced" in out
    assert not any("digit_acc" in ln and "worst" in ln for ln in lines)  # every depth at 1.0: nothing to add
    ppl = next(ln for ln in lines if " ppl " in ln)
    assert f"{30 + 256 / 100:.3f}" in ppl and "[" not in ppl  # one sample of a continuous metric: no interval
    assert "…" not in out


def test_over_depths_pools_samples_exactly():
    """tables.over_depths rebuilds the pooled mean, sample stderr and n of all samples from the per-depth
    summary (depths of unequal n), and finds the worst depth by the metric's direction."""
    import math

    import numpy as np

    from lctx.harness.run.tables import over_depths

    summary, table = _depth_varying_summary()
    pooled = over_depths(summary)
    for r in pooled.itertuples():
        v = table[(table["metric"] == r.metric) & (table["length"] == r.length)]["value"]
        assert r.n == len(v) and math.isclose(r.mean, v.mean(), abs_tol=1e-12)
        assert (np.isnan(r.stderr) if len(v) == 1 else math.isclose(r.stderr, v.std(ddof=1) / math.sqrt(len(v)),
                                                                     abs_tol=1e-12))
    ex = pooled[pooled["metric"] == "exact"]
    assert (ex["worst"] == 0.0).all() and ex["worst_depths"].map(lambda d: d == [1.0]).all() and (ex["worst_n"] == 2).all()
    lower = over_depths(summary, directions={"exact": "lower"})  # better lower: the worst is the highest mean
    assert (lower[lower["metric"] == "exact"]["worst_depths"].map(lambda d: 1.0 not in d)).all()
    assert pooled[pooled["metric"] == "ppl"]["worst_depths"].map(len).eq(0).all()  # no depth axis


def test_run_summary_worst_depth_follows_a_custom_tasks_declared_direction(capsys, monkeypatch, tmp_path):
    """Fresh-user trial of issue 24: a --task-file task's metric is in no registry, so the closing table
    printed no worst depth for it; the direction the task declared (run.json's task_meta) now gives one."""
    import json

    from lctx.harness.run.tables import declared_directions as _declared_directions, print_summary as _print_summary

    monkeypatch.setenv("LCTX_TABLE_FORMAT", "markdown")
    summary, _ = _depth_varying_summary()
    summary = summary[summary["metric"] == "exact"].assign(metric="copy_top1", task="digit_copy")
    (tmp_path / "run.json").write_text(json.dumps({"task_meta": {"digit_copy": {
        "headline_metric": "copy_top1", "higher_is_better": {"copy_top1": True, "copy_nll": False}}}}))
    dirs = _declared_directions(tmp_path)
    assert dirs == {"copy_top1": "higher", "copy_nll": "lower"}
    _print_summary(summary)  # control: without the declaration the metric has no direction, so no worst row
    assert not any("copy_top1" in ln and "worst" in ln for ln in capsys.readouterr().out.splitlines())
    _print_summary(summary, dirs)
    out = capsys.readouterr().out
    assert any("copy_top1" in ln and "worst" in ln and "0.000 @ d=1" in ln for ln in out.splitlines()), out
    assert _declared_directions(tmp_path / "missing") == {}


@pytest.mark.usefixtures("isolated_digests")
def test_every_sample_failed_exits_3(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 8: a run where every sample failed exits 3 (EXIT_ALL_FAILED); a good run exits 0."""
    ck = nan_checkpoint(make_checkpoint, "layer0")
    code, out, err = run_cli(["run", "-m", ck, "--tasks", "passkey", "--lengths", "160", "--depths", "0.5",
                              "--samples", "2", "--out", tmp_path / "o", "--no-progress"], capsys)
    assert code == EXIT_ALL_FAILED == 3
    assert "every sample of this run failed" in err and "Traceback" not in err
    good = tmp_path / "good"
    code, _, _ = run_cli(["run", "-m", make_checkpoint("rope"), "--tasks", "passkey", "--lengths", "160",
                          "--depths", "0.5", "--samples", "1", "--out", good, "--no-progress"], capsys)
    assert code == 0


@pytest.mark.parametrize("dist", ["-5", "0"])
@pytest.mark.usefixtures("isolated_digests")
def test_negative_distance(tmp_path, capsys, dist):
    """Issue 10 item 15: lctx diagnose far-mass refuses a --distance below 1."""
    code, _, err = run_cli(["diagnose", "far-mass", "-m", "x", f"--distance={dist}", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "--distance")


@pytest.mark.usefixtures("isolated_digests")
def test_distance_beyond_every_length(tmp_path, capsys):
    """Issue 10 item 15: lctx diagnose far-mass refuses a --distance not below the longest length."""
    code, _, err = run_cli(["diagnose", "far-mass", "-m", "x", "--distance", "4096", "--lengths", "256,512",
                            "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "--distance 4096", "longest length 512")


@pytest.mark.usefixtures("isolated_digests")
def test_ctrl_c_prints_the_resume_hint(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 16: Ctrl-C during a run exits 130 and says that rerunning resumes."""
    f = tmp_path / "interrupt.py"
    f.write_text(textwrap.dedent('''
        from lctx.tasks import Sample, Task, register_task
        @register_task
        class Interrupt(Task):
            name = "interrupt_trust_test"
            metrics = ("v",)
            def build(self, lm, cell, seed):
                return Sample(cell=cell, input_ids=[1, 2], n_tokens=2)
            def score(self, lm, sample):
                raise KeyboardInterrupt
        '''))
    code, _, err = run_cli(["run", "-m", make_checkpoint("rope"), "--task-file", f, "--tasks",
                            "interrupt_trust_test", "--lengths", "64", "--out", tmp_path / "o", "--no-progress"],
                           capsys)
    assert code == 130 and "rerun the same command to resume" in err


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_digests")
def test_sigint_and_sigterm_in_a_real_process(make_checkpoint, tmp_path):
    """Issue 10 item 16: SIGINT and SIGTERM in a real process exit 130 and 143 with the resume hint, no traceback."""
    ck = make_checkpoint("rope")
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        out = tmp_path / f"o{code}"
        p = subprocess.Popen([sys.executable, "-m", "lctx.cli", "run", "-m", str(ck), "--tasks", "passkey",
                              "--lengths", "160,200,240", "--depths", "0,0.5,1", "--samples", "40", "--out",
                              str(out), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             # as from a terminal: a shell without job control starts `cmd &` with SIGINT ignored
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 240
        while time.time() < deadline and not ((out / "records.jsonl").exists()
                                               and (out / "records.jsonl").stat().st_size):
            time.sleep(0.2)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        assert p.returncode == code and "rerun the same command to resume" in err, err[-500:]
        assert "Traceback" not in err


@pytest.mark.usefixtures("isolated_digests")
def test_failure_summary_counts_what_it_leaves_out(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 16: the failure summary counts the distinct error messages it does not show."""
    f = tmp_path / "fails.py"
    f.write_text(textwrap.dedent('''
        from lctx.tasks import Sample, Task, register_task
        @register_task
        class Fails(Task):
            name = "fails_trust_test"
            metrics = ("v",)
            def build(self, lm, cell, seed):
                return Sample(cell=cell, input_ids=[1, 2], n_tokens=2)
            def score(self, lm, sample):
                if sample.cell.sample == 0:
                    return {"v": 1.0}
                raise RuntimeError(f"distinct failure {sample.cell.sample}")
        '''))
    code, _, err = run_cli(["run", "-m", make_checkpoint("rope"), "--task-file", f, "--tasks", "fails_trust_test",
                            "--lengths", "64", "--samples", "8", "--out", tmp_path / "o", "--no-progress"], capsys)
    assert code == EXIT_SOME_FAILED == 4  # one sample succeeded, seven failed: a run with errors never exits 0
    assert err.count("failed (1 sample)") == 5
    assert "and 2 more distinct error messages (2 samples) not shown" in err


@pytest.mark.usefixtures("isolated_digests")
def test_rejected_command_creates_no_out_dir(tmp_path, capsys, monkeypatch):
    """Issue 10 item 16: a refused command makes no --out directory."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["run", "--tasks", "passkay"], capsys)
    assert_one_line_error(code, err, "unknown task 'passkay'")
    assert not (tmp_path / "lctx-out").exists()
    code, _, err = run_cli(["train", "--variant", "ropey", "--steps", "1", "--out", tmp_path / "m"], capsys)
    assert code == 2 and not (tmp_path / "m").exists()


@pytest.mark.usefixtures("plain_console")
def test_run_summary_whole_off_a_terminal(capsys):
    """Issue 16 item 1: lctx run's summary prints every cell whole off a terminal."""
    from lctx.harness.run.tables import print_summary as _print_summary

    model = "stories260K+ssmax_s0.43-with-a-long-suffix"
    summary = pd.DataFrame([(model, "llama", "niah_single_1", "string_match_part", 131072, 0.5, 0.123456, 0.1, 2, 0),
                            (model, "llama", "ppl", "ppl", 131072, math.nan, 179.123456, math.nan, 1, 0)],
                           columns=["model", "variant", "task", "metric", "length", "depth", "mean", "stderr", "n",
                                    "n_error"])
    _print_summary(summary)
    out = capsys.readouterr().out
    assert "…" not in out
    assert any(model in ln and "string_match_part" in ln and "0.123" in ln for ln in out.splitlines()), out
    assert any("ppl" in ln and "179.123" in ln for ln in out.splitlines()), out


@pytest.mark.usefixtures("plain_console")
def test_help_off_a_terminal_is_whole(capsys):
    """Issue 16: --help off a terminal prints options and command descriptions whole."""
    code, out, _ = run_cli(["run", "--help"], capsys)
    assert code == 0
    assert "…" not in out
    assert "--allow-beyond-max" in out and "0,0.25,0.5,0.75,1" in out  # used to print as `--allow-beyond-…`
    code, out, _ = run_cli(["--help"], capsys)
    flat = " ".join(out.split())
    assert "write records.jsonl, results.parquet/csv, summary.csv and plots." in flat  # click cut it to `write...`
    assert "Convert checkpoints from other formats into Hugging Face directories." in flat


@pytest.mark.usefixtures("plain_console")
def test_usage_lines_read_like_the_arguments(capsys):
    """Issue 16: usage lines name the arguments as users type them; a missing argument is one line."""
    for args, usage in ((["convert", "llama2c"], "lctx convert llama2c [OPTIONS] SRC"),
                        (["compare"], "lctx compare [OPTIONS] RUN_DIR [RUN_B]"),
                        (["report"], "lctx report [OPTIONS] RUN_DIR..."),
                        (["list"], "lctx list [OPTIONS] WHAT")):
        code, out, _ = run_cli(args + ["--help"], capsys)
        assert code == 0 and f"Usage: {usage}\n" in out, out[:200]
        assert "{" not in out.splitlines()[0]
    code, _, err = run_cli(["convert", "llama2c"], capsys)
    assert_one_line_error(code, err, "Missing argument 'SRC'")


@pytest.mark.usefixtures("plain_console")
def test_list_tasks_is_aligned_and_uses_a_task_docstring(capsys, tmp_path, request):
    """Issue 16 item 4: lctx list tasks is aligned, lists every task, and shows a custom task's docstring line."""
    from lctx.tasks import TASKS

    saved = dict(TASKS)
    request.addfinalizer(lambda: (TASKS.clear(), TASKS.update(saved)))  # unregister the task file's task
    f = tmp_path / "my_task.py"
    f.write_text('''
from lctx.tasks import Sample, Task, register_task

@register_task
class AVeryLongCustomTaskNameForListing(Task):
    """Mean NLL of the last token of a repeated phrase.

    More text that is not part of the one-line description.
    """
    name = "a_very_long_custom_task_name_for_listing"
    metrics = ("nll",)
''')
    code, out, err = run_cli(["list", "tasks", "--task-file", f], capsys)
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert len({len(ln) for ln in lines}) == 1, out  # every row as wide: columns line up
    mine = next(ln for ln in lines if "a_very_long_custom_task_name_for_listing" in ln)
    assert "Mean NLL of the last token of a repeated phrase." in mine and "More text" not in mine
    assert mine.rstrip("| ").endswith("none declared"), mine  # no `requires`: said, not a blank data column
    assert "none declared" not in next(ln for ln in lines if "| passkey" in ln)  # control: passkey declares it
    for name in ("passkey", "ppl", "niah_single_1", "niah_multikey_3", "mmlu", "arc_easy", "arc_challenge", "flatness"):
        assert any(ln.startswith(f"| {name} ") for ln in lines), name
    niah = next(ln for ln in lines if ln.startswith("| niah_single_2 "))
    assert "ruler/PaulGrahamEssays.json" in niah  # the data it needs


@pytest.mark.usefixtures("isolated_digests")
def test_task_file_directory_and_report_on_a_file(capsys, tmp_path):
    """Trial 21 item 2: a --task-file that is a directory, and lctx report on a file, are one line naming the fix."""
    code, _, err = run_cli(["run", "--task-file", tmp_path, "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "is a directory", ".py file")
    f = tmp_path / "afile"
    f.write_text("x")
    code, _, err = run_cli(["report", f, "--out", tmp_path / "r"], capsys)
    assert_one_line_error(code, err, "is a file, not a directory")
    assert "does not exist" not in err


REPO = Path(__file__).resolve().parent.parent


#: ``lctx`` as its console script runs it (lctx.cli.main), in a fresh interpreter
LCTX = [sys.executable, "-c", "import sys; from lctx.cli import main; sys.argv[0] = 'lctx'; main()"]


def _closed_reader(args: list[str]) -> subprocess.CompletedProcess:
    """Run ``lctx ARGS`` with its stdout a pipe whose reader is gone before lctx writes (``| head -0``, a
    deterministic ``| head -1``): every write meets a closed pipe. Returns the exit status and stderr."""
    env = dict(os.environ, LCTX_TABLE_FORMAT="markdown")
    r, w = os.pipe()
    os.close(r)  # the reader exits first
    try:
        p = subprocess.run(LCTX + [str(a) for a in args], stdout=w, stderr=subprocess.PIPE, text=True, env=env,
                           timeout=300)
    finally:
        os.close(w)
    return p


def test_closed_stdout_is_quiet_and_keeps_the_exit_status():
    """A user trial: lctx ... | head -1 (a reader that goes away) is no traceback, and keeps the exit status."""
    # Python's default: BrokenPipeError -> a traceback and exit 1 (or "Exception ignored" and 120 at exit)
    p = _closed_reader(["list", "tasks"])
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr and "Exception ignored" not in p.stderr


def _summary(ppl: float) -> pd.DataFrame:
    return pd.DataFrame([("tiny", "rope", "ppl", "ppl", 256, math.nan, ppl, math.nan, 1, 0)],
                        columns=["model", "variant", "task", "metric", "length", "depth", "mean", "stderr", "n",
                                 "n_error"])


def test_closed_stdout_still_writes_files_and_the_gate_verdict(tmp_path):
    """A user trial: with stdout closed, a command still writes its files and lctx compare keeps its verdict."""
    # lctx compare prints its table before it writes compare.csv: a closed stdout must cost neither the files
    # nor the verdict (exit 1 = a regression, here ppl 20 -> 30; not the pipe's status)
    for name, ppl in (("base", 20.0), ("run", 30.0)):
        (tmp_path / name).mkdir()
        _summary(ppl).to_csv(tmp_path / name / "summary.csv", index=False)
    p = _closed_reader(["compare", tmp_path / "run", "--baseline", tmp_path / "base", "--out", tmp_path / "cmp"])
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr
    assert pd.read_csv(tmp_path / "cmp" / "compare.csv")["status"].tolist() == ["regression"]


def test_closed_stderr_too(tmp_path):
    """A user trial: a closed stderr is no traceback either."""
    # `2>&1 | head -1`: the error line itself meets the closed pipe; the status is still the user error's
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(LCTX + ["list", "nothing"], stdout=w, stderr=w, timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 2


def _commands_with_out() -> list[list[str]]:
    """Every ``lctx`` command (sub-commands included) that takes ``--out``, as its argv with a made-up value for
    each other required parameter: the registry of commands, so a command added later is checked too."""
    import lctx.cli as C

    found = []

    def walk(cmd, path):
        if getattr(cmd, "commands", None):  # a group (typer vendors its own click: no isinstance)
            for name, sub in cmd.commands.items():
                walk(sub, path + [name])
            return
        if not any("--out" in getattr(p, "opts", []) for p in cmd.params):
            return
        argv = list(path)
        for p in cmd.params:
            if p.required and "--out" not in getattr(p, "opts", []):
                argv += ([p.opts[0]] if p.param_type_name == "option" else []) + ["x"]
        found.append(argv)

    walk(typer.main.get_command(C.app), [])
    return found


def _run_each_with_out(cmds: list[list[str]], out: str, cwd: Path):
    """Run each command line with ``--out OUT`` through ``lctx.cli.main`` in one fresh interpreter (this one
    has torch already), in ``cwd``. Returns ([(argv, exit status, torch imported by then)], stderr lines)."""
    code = ("import json, sys\nfrom lctx.cli import main\nres = []\n"
            f"for argv in {cmds!r}:\n"
            f"    res.append((argv, main(argv + ['--out', {out!r}]), 'torch' in sys.modules))\n"
            "print(json.dumps(res))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), [ln for ln in p.stderr.splitlines() if ln.strip()]


def test_every_out_is_checked_before_torch_loads(tmp_path):
    """A user trial: every command refuses an unwritable --out while its arguments are parsed, before torch."""
    # an unwritable --out (under a file) is one `error:` line and exit 2, found while the arguments are parsed:
    # no command has imported torch (so no model or data has loaded) by then. The commands run in one fresh
    # interpreter (this one has torch already).
    cmds = _commands_with_out()
    names = {" ".join(c[:2]) if c[0] in ("convert", "diagnose") else c[0] for c in cmds}
    assert {"run", "train", "report", "bench", "compare", "convert gguf", "convert llama2c", "diagnose prior",
            "diagnose far-mass"} <= names, names
    (tmp_path / "afile").write_text("x")
    bad = str(tmp_path / "afile" / "out")
    res, errors = _run_each_with_out(cmds, bad, tmp_path)
    assert len(errors) == len(cmds) and all(ln.startswith("error: cannot write to --out") for ln in errors), errors
    for argv, status, torch_loaded in res:
        assert status == 2 and not torch_loaded, (argv, status, torch_loaded)


def test_evaluate_checks_out_before_torch_loads(tmp_path):
    """A user trial: lctx.evaluate refuses an unwritable out before torch, as the CLI does."""
    # the Python API as the CLI: lctx.evaluate(out=...) refuses an unwritable directory before importing torch
    (tmp_path / "afile").write_text("x")
    code = ("import sys, lctx\n"
            f"try:\n    lctx.evaluate(out={str(tmp_path / 'afile' / 'out')!r})\n"
            "except lctx.LctxError as e:\n    print('refused:', e, 'torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("refused: cannot write to --out") and p.stdout.strip().endswith("False"), p.stdout


def test_empty_out_is_refused_by_every_command(tmp_path):
    """Trial 21 item 2: --out "" is refused by every command, nothing written in the current directory."""
    # `--out ""` (a script's `--out "$OUT"` with OUT unset) was Path("") == Path("."): run, train, report and
    # compare wrote into (train: over) the current directory (trial21 item 2). Every command that takes --out
    # refuses it while the arguments are parsed: one `error:` line, exit 2, nothing written in the cwd.
    cmds = _commands_with_out()
    res, errors = _run_each_with_out(cmds, "", tmp_path)
    assert len(errors) == len(cmds) and all(ln.startswith("error: --out is empty") for ln in errors), errors
    for argv, status, torch_loaded in res:
        assert status == 2 and not torch_loaded, (argv, status, torch_loaded)
    assert list(tmp_path.iterdir()) == []


def test_busy_out_is_refused_before_torch_loads(tmp_path):
    """Trial 21 item 8: an --out another run holds is refused before torch or a model loads."""
    # trial21 item 8: a second `lctx run` on an --out another run holds refused only after loading the models
    # and data (24 s with the bundled model; minutes with a big one). It is refused before torch loads now.
    out = tmp_path / "o"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import time; from pathlib import Path; from lctx.harness.run.rundir import run_dir_lock\n"
                               f"with run_dir_lock(Path({str(out)!r})):\n    print('locked', flush=True); time.sleep(60)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code = ("import sys\nfrom lctx.cli import main\n"
                f"print(main(['run', '--out', {str(out)!r}]), 'torch' in sys.modules)")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert p.stdout.split() == ["2", "False"], (p.stdout, p.stderr)
    errors = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "in use by another lctx run" in errors[0] and f"PID {holder.pid}" in errors[0], errors


def test_out_that_cannot_be_created_is_refused_at_parse_time(tmp_path):
    """Trial 21 item 8: an --out that cannot be created (as root too) is refused while the arguments are parsed."""
    # trial21 item 8: as root os.access says yes everywhere, so `--out /proc/x` passed the parse-time check and
    # was refused only after torch and the model loaded (14 s). The check now creates the folder for real (and
    # removes it again: a writable new --out is left absent).
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    code = ("import sys\nfrom lctx.cli import main\n"
            "print(main(['run', '--out', '/proc/lctx-no-such-dir']), 'torch' in sys.modules)\n"
            "from lctx.harness.args import check_writable_dir; from pathlib import Path\n"
            f"check_writable_dir(Path({str(tmp_path / 'new' / 'deeper')!r}))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "2 False", (p.stdout, p.stderr)
    assert "error: cannot write to --out '/proc/lctx-no-such-dir'" in p.stderr
    assert list(tmp_path.iterdir()) == []  # the probe's folders are gone again


def test_run_task_file_without_tasks_notes_the_files_tasks(capsys, make_checkpoint, tmp_path):
    """Issue 26 trial item 8: `lctx run --task-file FILE` without --tasks silently ran the default tasks; a note line
    names the file's task and the flag that runs it, and the default tasks run. Control: with --tasks naming it,
    no note and the file's task runs."""
    f = tmp_path / "my_task.py"
    f.write_text(token_nll_task_source("NoteNLL", "note_nll_test"))
    ck = make_checkpoint()
    common = ["run", "--model", ck, "--task-file", f, "--lengths", "160", "--depths", "0.5", "--samples", "1",
              "--ppl-max-tokens", "256", "--no-progress", "--no-memory-check"]
    code, _, err = run_cli([*common, "--out", tmp_path / "o"], capsys)
    assert code == 0, err
    assert (f"note: --task-file {f} adds note_nll_test, which does not run: without --tasks this run runs the "
            "default tasks (passkey, ppl); to run it, pass --tasks note_nll_test") in err.splitlines()
    assert set(pd.read_csv(tmp_path / "o" / "results.csv")["task"]) == {"passkey", "ppl"}
    code, _, err = run_cli([*common, "--tasks", "note_nll_test", "--out", tmp_path / "p"], capsys)
    assert code == 0, err
    assert "--task-file" not in err and set(pd.read_csv(tmp_path / "p" / "results.csv")["task"]) == {"note_nll_test"}
