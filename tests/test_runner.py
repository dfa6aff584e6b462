"""lctx.harness.run.runner: resume after an interruption, failures recorded without ending the sweep, tidy table
shape; the resume key, which names every input of a sample (weights, config, data, settings, task version and
code: issue 10); batches of one length (--batch-size, issue 15 item 3); lengths too short for a task's template
refused before the sweep."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers import TEXT, _records, assert_one_line_error, ppl_task, run_cli, sweep, token_nll_task_source, value
from lctx.errors import LctxError
from lctx.models.adapters.hf import load_lm
from lctx.harness.run.runner import RunSpec, run_sweep
from lctx.harness.run.tables import COLUMNS
from lctx.models.fingerprint import digest_json
from lctx.tasks import TASKS, Task, register_task
from lctx.tasks.passkey import Passkey
from lctx.tasks.ppl import Perplexity

VOLATILE = ["run_id", "wall_s", "cpu_s", "peak_mem_bytes", "timestamp", "git_rev"]


class Interrupting(Passkey):
    """Passkey that raises KeyboardInterrupt (as Ctrl-C would) when asked for its n-th sample."""

    def __init__(self, stop_at: int, **kw):
        super().__init__(**kw)
        self.options = Passkey(**kw).options  # same options -> same record keys as plain passkey
        self.calls, self.stop_at = 0, stop_at

    def score(self, lm, sample):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return super().score(lm, sample)


def stable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=VOLATILE).sort_values(["metric", "length", "depth", "sample"]).reset_index(drop=True)


@pytest.fixture
def lm(make_checkpoint):
    return load_lm(str(make_checkpoint("alibi")), device="cpu")


@pytest.mark.slow
def test_resume_after_interrupt_gives_same_table(lm, tmp_path):
    spec = RunSpec(lengths=[160, 200], depths=[0.0, 1.0], samples=2, seed=0)
    full = run_sweep([lm], [Passkey()], spec, tmp_path / "full", progress=False)["table"]

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        run_sweep([lm], [Interrupting(stop_at=4)], spec, out, progress=False)
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 3  # three samples finished and were kept before the interrupt
    res = run_sweep([lm], [Passkey()], spec, out, progress=False)
    assert res["skipped"] == 3 and res["ran"] == 5
    table = res["table"]
    assert not table.duplicated(["model", "task", "metric", "length", "depth", "sample"]).any()
    pd.testing.assert_frame_equal(stable(table), stable(full))
    # a third run does nothing and changes nothing
    again = run_sweep([lm], [Passkey()], spec, out, progress=False)
    assert again["ran"] == 0
    pd.testing.assert_frame_equal(stable(again["table"]), stable(full))


def test_failed_sample_is_recorded_and_sweep_goes_on(lm, tmp_path):
    @register_task
    class Flaky(Task):
        name = "flaky_test"
        metrics = ("score",)

        def build(self, lm, cell, seed):
            from lctx.tasks import Sample

            return Sample(cell=cell, input_ids=[1, 2, 3], n_tokens=3)

        def score(self, lm, sample):
            if sample.cell.sample == 1:
                raise RuntimeError("boom")
            if sample.cell.sample == 2:
                return {"score": float("nan")}
            return {"score": 0.5}

    res = run_sweep([lm], [Flaky()], RunSpec([64], [0.5], samples=3), tmp_path, progress=False)
    t = res["table"]
    assert list(t.columns) == COLUMNS
    assert res["errors"] == 2
    by_sample = t.set_index("sample")
    assert by_sample.loc[0, "status"] == "ok" and by_sample.loc[0, "value"] == 0.5
    assert by_sample.loc[1, "status"] == "error" and "boom" in by_sample.loc[1, "error"]
    assert by_sample.loc[2, "status"] == "error" and "non-finite" in by_sample.loc[2, "error"]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary.loc[0, "n"] == 1 and summary.loc[0, "n_error"] == 2
    # errored samples are retried on a rerun, finished ones are not
    assert run_sweep([lm], [Flaky()], RunSpec([64], [0.5], samples=3), tmp_path, progress=False)["ran"] == 2


def test_tables_files_and_metadata(lm, tmp_path):
    run_sweep([lm], [Passkey()], RunSpec([160], [0.5], samples=1, seed=7), tmp_path, progress=False)
    pq = pd.read_parquet(tmp_path / "results.parquet")
    csv = pd.read_csv(tmp_path / "results.csv")
    assert len(pq) == len(csv) == 2  # exact + digit_acc
    row = pq.iloc[0]
    assert row["seed"] == 7 and row["device"] == "cpu" and row["dtype"] == "float32"
    assert row["variant"] == "alibi" and row["train_length"] == 64 and row["n_tokens"] <= 160
    assert 0 <= row["depth_actual"] <= 1 and row["lctx_version"]
    rec = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert rec["extra"]["key"] and "continuation" in rec["extra"]
    from lctx.harness.outputs.plots import run_figures

    run_figures(pq, tmp_path)  # a run writes tables; its figures are the outputs'
    assert (tmp_path / "plots" / f"passkey_heatmap_{lm.name}.png").exists()


@pytest.mark.slow
def test_same_name_other_weights_or_dtype_is_not_resumed(lm, tmp_path, make_checkpoint):
    spec = RunSpec([160], [0.5], samples=1)
    run_sweep([lm], [Passkey()], spec, tmp_path, progress=False)
    other = load_lm(str(make_checkpoint("rope", name="ck_alibi_other")), device="cpu")
    other.name = lm.name  # same display name, different weights, another folder: never resumed; since trial22
    with pytest.raises(LctxError, match="already holds a model named"):  # refused (it hid the first one's results)
        run_sweep([other], [Passkey()], spec, tmp_path, progress=False)
    retrained = load_lm(str(make_checkpoint("rope", name="ck_alibi")), device="cpu")  # other weights, same folder
    assert retrained.name == lm.name and run_sweep([retrained], [Passkey()], spec, tmp_path, progress=False)["ran"] == 1
    bf16 = load_lm(lm.path, device="cpu", dtype="bfloat16")
    assert run_sweep([bf16], [Passkey()], spec, tmp_path, progress=False)["ran"] == 1


def test_torn_last_record_does_not_swallow_the_next(lm, tmp_path):
    spec = RunSpec([160], [0.5], samples=1)
    run_sweep([lm], [Passkey()], spec, tmp_path, progress=False)
    with open(tmp_path / "records.jsonl", "a") as f:
        f.write('{"model": "half-writ')  # a kill -9 mid-write
    res = run_sweep([lm], [Passkey()], RunSpec([160, 200], [0.5], samples=1), tmp_path, progress=False)
    assert res["ran"] == 1 and len(res["table"]) == 4  # both lengths, 2 metrics each


def test_task_metadata_is_recorded_and_merged_over_runs(lm, tmp_path):
    """issue 24 item 2: run.json's task_meta holds each task's declared metadata (what report/compare/flatness read
    without the task's code), and a later run of another task into the same directory keeps the earlier entry."""

    @register_task
    class Declared(Task):
        name = "declared_test"
        axes = ("depth", "sample")
        metrics = ("b_score", "a_loss")
        headline_metric = "b_score"
        higher_is_better = {"b_score": True, "a_loss": False}
        retrieval = True
        uses_seed = False

        def build(self, lm, cell, seed):
            from lctx.tasks import Sample

            return Sample(cell=cell, input_ids=[1, 2, 3], n_tokens=3, depth=cell.depth)

        def score(self, lm, sample):
            return {"b_score": 1.0, "a_loss": 0.5}

    @register_task
    class Other(Declared):
        name = "declared_other"
        retrieval = False

    try:
        run_sweep([lm], [Declared()], RunSpec([64], [0.5], samples=1), tmp_path, progress=False, tables=False)
        run_sweep([lm], [Other()], RunSpec([64], [0.5], samples=1), tmp_path, progress=False, tables=False)
    finally:
        TASKS.pop("declared_test", None)
        TASKS.pop("declared_other", None)
    tm = json.loads((tmp_path / "run.json").read_text())["task_meta"]
    assert set(tm) == {"declared_test", "declared_other"}  # the first run's entry kept
    assert tm["declared_test"] == {"name": "declared_test", "version": 1, "metrics": ["b_score", "a_loss"],
                                   "headline_metric": "b_score", "higher_is_better": {"b_score": True, "a_loss": False},
                                   "retrieval": True, "secondary_metric": None, "axes": ["depth", "sample"],
                                   "uses_seed": False, "heatmap_metrics": None, "category": None}
    assert tm["declared_other"]["retrieval"] is False


def test_check_min_lengths_refuses_typed_lengths_and_drops_relative_ones():
    # issue 24 item 10: typed lengths below a task's template are refused; in a relative sweep (drop=True) the
    # task is left out at those lengths only, with one note line, and refused only where it fits nowhere
    from types import SimpleNamespace

    from lctx.harness.run.runner import check_min_lengths

    lm = SimpleNamespace(name="m")
    pk, ppl = (SimpleNamespace(name=n, min_length=lambda lm, n=n: 150 if n == "passkey" else 2)
               for n in ("passkey", "ppl"))
    with pytest.raises(LctxError, match="passkey needs at least 150 tokens with model 'm'.*lengths 64, 128 are shorter"):
        check_min_lengths([lm], [pk, ppl], [64, 128, 256])
    skip, notes = check_min_lengths([lm], [pk, ppl], [64, 128, 256], drop=True)
    assert skip == {("m", "passkey"): 150}
    assert notes == ["note: passkey needs at least 150 tokens with model 'm' (its template): not run at 64, 128; "
                     "it runs at 256"]
    assert check_min_lengths([lm], [pk, ppl], [256, 512], drop=True) == ({}, [])
    with pytest.raises(LctxError, match="passkey needs at least 150"):  # fits at no length: nothing to drop to
        check_min_lengths([lm], [pk], [64, 128], drop=True)


def rewrite_weights_same_size(ck: Path, scale: float = 3.0) -> None:
    """New weights of the same byte size, and the old mtime (to the nanosecond) put back, as `cp -p` and
    `rsync -a` leave a file."""
    from safetensors.torch import load_file, save_file

    path = ck / "model.safetensors"
    st = os.stat(path)
    tensors = load_file(path)
    for k in tensors:
        if "q_proj" in k or "embed" in k:
            tensors[k] = tensors[k] * scale
    save_file(tensors, path, metadata={"format": "pt"})
    assert os.stat(path).st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns


@pytest.mark.usefixtures("isolated_digests")
def test_same_size_same_mtime_new_weights_rerun(make_checkpoint, data, tmp_path):
    """Issue 10 item 1: new weights of the same size and mtime are a new resume key: the sample reruns."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    first = sweep(ck, [ppl_task(data)], out)
    assert first["ran"] == 1
    rewrite_weights_same_size(ck)
    second = sweep(ck, [ppl_task(data)], out)
    assert second["ran"] == 1 and second["skipped"] == 0  # the issue saw "0 run, 1 resumed"
    assert value(second, "ppl", "ppl") != value(first, "ppl", "ppl")
    fresh = sweep(ck, [ppl_task(data)], tmp_path / "fresh")
    assert value(second, "ppl", "ppl") == value(fresh, "ppl", "ppl")  # what a fresh run of the new weights gives


@pytest.mark.usefixtures("isolated_digests")
def test_config_change_reruns(make_checkpoint, data, tmp_path):
    """Issue 10 item 2: an edited config.json reruns the sample."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    first = sweep(ck, [ppl_task(data)], out)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["rope_theta"] = 37.0
    (ck / "config.json").write_text(json.dumps(cfg))
    second = sweep(ck, [ppl_task(data)], out)
    assert second["ran"] == 1 and value(second, "ppl", "ppl") != value(first, "ppl", "ppl")


@pytest.mark.usefixtures("isolated_digests")
def test_data_change_reruns(make_checkpoint, data, tmp_path):
    """Issue 10 item 3: new data of the same size and mtime reruns; run.json records its fingerprint and the threads."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    first = sweep(ck, [ppl_task(data)], out)
    st = os.stat(data)
    data.write_text(TEXT.upper()[: len(TEXT)])  # new contents, same size, same mtime
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = sweep(ck, [ppl_task(data)], out)
    assert second["ran"] == 1 and value(second, "ppl", "ppl") != value(first, "ppl", "ppl")
    meta = json.loads((out / "run.json").read_text())
    assert meta["inputs"]["data"]["ppl"] == second["table"]["data_fingerprint"].iloc[0]
    # the CPU thread settings, which change timings and the last bits of parallel sums (README "Threads")
    assert meta["threads"] >= 1 and meta["threads_source"] and "omp_wait_policy" in meta


@pytest.mark.usefixtures("isolated_digests")
def test_two_checkpoints_of_one_name_are_refused_not_hidden(make_checkpoint, data, tmp_path):
    """Trial 22 finding 3 (issue 10 item 3): two checkpoints of one folder name in one --out are refused."""
    # trial22 finding 3: ../t/b/tiny then ../t/a/tiny into one --out: both are model "tiny", and the tables kept
    # only a's, calling b's "earlier inputs". Refused now; the same folder retrained, or a copy of it, still resumes.
    import shutil

    from lctx.errors import LctxError

    a = make_checkpoint("rope", name="a/tiny")
    b = make_checkpoint("alibi", name="b/tiny")  # other weights, same folder name
    out = tmp_path / "o"
    assert sweep(a, [ppl_task(data)], out)["ran"] == 1
    with pytest.raises(LctxError, match="already holds a model named 'tiny'"):
        sweep(b, [ppl_task(data)], out)
    copy = tmp_path / "c" / "tiny"
    shutil.copytree(a, copy)  # the same content elsewhere: the same model
    assert sweep(copy, [ppl_task(data)], out)["ran"] == 0
    lm_a, lm_b = load_lm(str(a), device="cpu"), load_lm(str(b), device="cpu")
    with pytest.raises(LctxError, match="are both named 'tiny'"):  # two of one call
        run_sweep([lm_a, lm_b], [ppl_task(data)], RunSpec([64], [0.5], 1), tmp_path / "o2", progress=False)


@pytest.mark.usefixtures("isolated_digests")
def test_retrain_tabulates_only_current_inputs(make_checkpoint, data, tmp_path):
    """Issue 10 item 4: retrained into the same --out, the tables hold only the new weights' records."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    sweep(ck, [ppl_task(data), Passkey()], out, lengths=(160,))
    rewrite_weights_same_size(ck)
    res = sweep(ck, [ppl_task(data), Passkey()], out, lengths=(160,))
    assert res["ran"] == 2 and res["superseded"] == 2
    summary = pd.read_csv(out / "summary.csv")
    assert (summary["n"] == 1).all()  # --samples 1: n is 1, not 2 (the mean of old and new weights)
    table = pd.read_parquet(out / "results.parquet")
    assert "fingerprint" in table.columns and "model_fingerprint" in table.columns
    assert not table.duplicated(["model", "task", "metric", "length", "depth", "sample"]).any()
    assert table["model_fingerprint"].nunique() == 1
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 4  # the old records are kept, only left out of the tables


@pytest.mark.usefixtures("isolated_digests")
def test_reverted_weights_tabulate_their_own_records(make_checkpoint, data, tmp_path):
    """Issue 10 item 4: weights put back resume, and the tables show their own records."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    backup = tmp_path / "w.safetensors"
    shutil.copy2(ck / "model.safetensors", backup)
    a = sweep(ck, [ppl_task(data)], out)
    rewrite_weights_same_size(ck)
    sweep(ck, [ppl_task(data)], out)
    shutil.copy2(backup, ck / "model.safetensors")  # back to the first weights: nothing to run ...
    again = sweep(ck, [ppl_task(data)], out)
    assert again["ran"] == 0
    assert value(again, "ppl", "ppl") == value(a, "ppl", "ppl")  # ... and the table shows their records


@pytest.mark.parametrize("change", ["tokenizer", "dtype", "attn_impl", "chunk_size", "task_version", "seed",
                                    "task_file_code"])
@pytest.mark.usefixtures("isolated_digests")
def test_every_other_input_changes_the_key(make_checkpoint, data, tmp_path, change, monkeypatch):
    """Issue 10 item 6: tokenizer, dtype, attn_impl, chunk size, task version, seed and task-file code each change the key."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    kw, spec_seed = {}, 0
    sweep(ck, [ppl_task(data)], out)
    task = ppl_task(data)
    if change == "tokenizer":
        tok = json.loads((ck / "tokenizer.json").read_text())
        tok["normalizer"] = {"type": "Lowercase"}
        (ck / "tokenizer.json").write_text(json.dumps(tok))
    elif change == "dtype":
        kw["dtype"] = "bfloat16"
    elif change == "attn_impl":
        kw["attn_impl"] = "reference"
    elif change == "chunk_size":
        kw["chunk_size"] = 16
    elif change == "task_version":
        monkeypatch.setattr(Perplexity, "version", 2)
    elif change == "seed":
        spec_seed = 1
    lm = load_lm(str(ck), device="cpu", **kw)
    if change == "task_file_code":
        f = tmp_path / "my_task.py"
        src = textwrap.dedent('''
            from lctx.tasks import Sample, Task, register_task
            @register_task
            class Const(Task):
                name = "const_trust_test"
                metrics = ("v",)
                def build(self, lm, cell, seed):
                    return Sample(cell=cell, input_ids=[1, 2, 3], n_tokens=3)
                def score(self, lm, sample):
                    return {"v": VALUE}
            ''')
        from lctx.tasks import load_task_file, get_task

        f.write_text(src.replace("VALUE", "1.0"))
        load_task_file(str(f))
        r1 = run_sweep([lm], [get_task("const_trust_test")()], RunSpec([64], [0.5], 1), out, progress=False)
        f.write_text(src.replace("VALUE", "2.0"))
        load_task_file(str(f))
        r2 = run_sweep([lm], [get_task("const_trust_test")()], RunSpec([64], [0.5], 1), out, progress=False)
        assert r1["ran"] == 1 and r2["ran"] == 1 and value(r2, "const_trust_test", "v") == [2.0]
        return
    res = run_sweep([lm], [task], RunSpec([64], [0.5], 1, seed=spec_seed), out, progress=False)
    assert res["ran"] == 1, change
    table = res["table"]
    assert table["fingerprint"].nunique() == (2 if change in ("dtype", "attn_impl", "seed") else 1)
    if change in ("tokenizer", "chunk_size", "task_version"):
        assert res["superseded"] == 1  # same label, newer inputs: the old record leaves the tables


@pytest.mark.usefixtures("isolated_digests")
def test_resume_key_is_stable_for_an_unchanged_rerun(make_checkpoint, data, tmp_path):
    """Issue 10 item 6: an unchanged rerun, or a byte-identical copy elsewhere, has the same key."""
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    sweep(ck, [ppl_task(data), Passkey()], out, lengths=(160,))
    shutil.copytree(ck, tmp_path / "copy", copy_function=shutil.copy2)  # cp -rp: another path, same bytes
    res = sweep(tmp_path / "copy", [ppl_task(data), Passkey()], tmp_path / "o2", lengths=(160,))
    again = sweep(ck, [ppl_task(data), Passkey()], out, lengths=(160,))
    assert again["ran"] == 0 and again["skipped"] == 2
    assert set(res["table"]["model_fingerprint"]) == set(again["table"]["model_fingerprint"])


@pytest.mark.usefixtures("isolated_digests")
def test_task_calling_sys_exit_while_scoring_is_an_error_sample(make_checkpoint, tmp_path):
    """Issue 10 item 15: sys.exit() in a task's score is an error sample, not the end of the run."""
    @register_task
    class Quitter(Task):
        name = "quitter_trust_test"
        metrics = ("v",)

        def build(self, lm, cell, seed):
            from lctx.tasks import Sample

            return Sample(cell=cell, input_ids=[1, 2], n_tokens=2)

        def score(self, lm, sample):
            sys.exit(0)

    res = sweep(make_checkpoint("rope"), [Quitter()], tmp_path / "o")
    assert res["errors"] == 1 and "sys.exit(0)" in res["table"]["error"].iloc[0]


@pytest.mark.usefixtures("plain_console")
def test_run_refuses_lengths_shorter_than_a_template_before_the_sweep(capsys, make_checkpoint, tmp_path):
    """Issue 16 item 3: lengths shorter than a task's template are refused before the sweep, naming the need."""
    from lctx.models.adapters.hf import load_lm
    from lctx.tasks.passkey import Passkey

    ck = make_checkpoint("rope")
    need = Passkey().min_length(load_lm(str(ck), device="cpu"))
    out = tmp_path / "o"
    code, _, err = run_cli(["run", "--model", ck, "--tasks", "ppl,passkey", "--lengths", f"32,{need - 1},{need}",
                            "--out", out, "--no-progress"], capsys)
    assert_one_line_error(code, err, f"passkey needs at least {need} tokens", f"lengths 32, {need - 1} are shorter",
                          "drop those lengths")
    assert not (out / "records.jsonl").exists()  # refused before anything ran (ppl first in --tasks)


#: a --task-file task scoring one token (trial 21's tests)
TASK_SRC = token_nll_task_source("LastTokenNLL21", "last_token_nll21")


@pytest.mark.usefixtures("isolated_digests")
def test_task_file_and_task_version_are_in_the_run_dir_and_fingerprints_recompute(capsys, make_checkpoint,
                                                                                     tmp_path):
    """Trial 21 item 1: run.json names a --task-file's path and SHA-256 and each task's version; the fingerprints recompute."""
    f = tmp_path / "my_task21.py"
    f.write_text(TASK_SRC)
    out = tmp_path / "o"
    ck = make_checkpoint()
    code, _, err = run_cli(["run", "--model", ck, "--task-file", f, "--tasks", "last_token_nll21,passkey",
                            "--lengths", "256", "--depths", "0.5", "--samples", "1", "--out", out, "--no-progress"],
                           capsys)
    assert code == 0, err
    meta = json.loads((out / "run.json").read_text())
    tasks = meta["inputs"]["tasks"]
    sha = hashlib.sha256(f.read_bytes()).hexdigest()  # the file's SHA-256, computed here independently
    assert tasks["last_token_nll21"]["code"]["path"] == str(f.resolve())
    assert tasks["last_token_nll21"]["code"]["sha256"] == sha
    assert tasks["passkey"]["code"] is None and isinstance(tasks["passkey"]["version"], int)
    recs = _records(out)
    assert {r["task"] for r in recs} == {"last_token_nll21", "passkey"}
    for r in recs:
        assert r["task_version"] == tasks[r["task"]]["version"]
        # the record's fingerprint from the record alone (the identity fields of runner.sample_base)
        ident = {k: r[k] for k in ("variant", "model_fingerprint", "data_fingerprint", "dtype", "attn_impl",
                                   "chunk_size", "task", "seed", "task_options", "versions", "device_type",
                                   "task_version", "code")}
        assert digest_json(ident) == r["fingerprint"]
        # and the model fingerprint from run.json's file hashes, the code's from the file's SHA-256
        assert digest_json(meta["inputs"]["models"][r["model"]]["files"]) == r["model_fingerprint"]
    code_fp = [r["code"] for r in recs if r["task"] == "last_token_nll21"][0]
    assert code_fp == digest_json({f.name: sha}) == tasks["last_token_nll21"]["code"]["fingerprint"]


BUNDLED = Path(__file__).resolve().parents[1] / "models" / "checkpoints" / "pydoc-tiny-rope"


@pytest.fixture(scope="module")
def fake_data(tmp_path_factory) -> Path:
    """A RULER-shaped data folder (as tests/test_niah.py): an essay of 150 sentences and word lists."""
    from helpers import write_niah_data

    return write_niah_data(tmp_path_factory.mktemp("ruler_data"))


def _metrics(out: Path) -> dict:
    recs = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines()]
    return {(r["task"], r["length"], r["depth"], r["sample"]): (r["metrics"], r["batch_size"], r["status"])
            for r in recs}


@pytest.mark.slow
def test_cli_batch_4_records_equal_batch_1(tmp_path, fake_data, capsys):
    """Issue 15 item 3: a passkey and NIAH run at --batch-size 4 gives the records of --batch-size 1."""
    # issue 15 item 3: a passkey + NIAH run at --batch-size 4 gives the records of --batch-size 1. The bundled
    # model; niah_single_2's essay haystack makes prompts of unequal lengths (padded batches). Discrete metrics
    # (exact, string_match_*, tf_top1, tf_mrr) must be equal; the log-probabilities agree to float32 rounding
    # of a padded forward (measured differences ~1e-6 nats)
    args = ["run", "--tasks", "passkey,niah_single_2", "--lengths", "200,300", "--depths", "0,0.5,1",
            "--samples", "2", "--data-dir", fake_data, "--no-progress", "--no-memory-check"]
    code, _, err = run_cli(args + ["--out", tmp_path / "b1"], capsys)
    assert code == 0, err
    code, _, err = run_cli(args + ["--out", tmp_path / "b4", "--batch-size", "4"], capsys)
    assert code == 0, err
    one, four = _metrics(tmp_path / "b1"), _metrics(tmp_path / "b4")
    assert one.keys() == four.keys() and len(one) == 2 * 2 * 3 * 2
    assert {v[1] for v in one.values()} == {1} and max(v[1] for v in four.values()) == 4
    assert all(v[2] == "ok" for v in list(one.values()) + list(four.values()))
    for k, (m1, _, _) in one.items():
        m4 = four[k][0]
        assert m1.keys() == m4.keys()
        for name, v in m1.items():
            if name in ("tf_logprob", "tf_gain"):
                assert m4[name] == pytest.approx(v, rel=1e-4, abs=1e-4), (k, name)
            else:
                assert m4[name] == v, (k, name)


def test_batches_group_one_length_of_a_batched_task():
    """Issue 15 item 3: a batch holds one length of one batched task; ppl runs alone."""
    from lctx.harness.run.runner import batches
    from lctx.tasks import get_task
    from lctx.tasks.base import Cell

    class FakeLM:
        can_batch = True

    lm = FakeLM()
    pk, ppl = get_task("passkey")(), get_task("ppl")()
    work = [(lm, pk, Cell(L, d, s), {}) for L in (100, 200) for d in (0.0, 0.5) for s in (0, 1, 2)]
    work += [(lm, ppl, Cell(100, None, 0), {}), (lm, ppl, Cell(100, None, 1), {})]
    sizes = [[(it[2].length, it[1].name) for it in b] for b in batches(work, 4)]
    assert [len(b) for b in sizes] == [4, 2, 4, 2, 1, 1]  # 6 passkey cells per length; ppl does not batch
    assert all(len({x for x in b}) == 1 for b in sizes)  # one length, one task per batch
    assert [len(b) for b in batches(work, 1)] == [1] * len(work)
    with pytest.raises(Exception, match="batch size"):
        batches(work, 0)


def test_a_model_that_runs_requests_at_once_batches_by_its_concurrency_capability():
    """Issue 43 (Architecture): the runner reads a model's requests in flight from its ``concurrency`` capability
    (lctx.models.adapters.protocol.capabilities), not by knowing a served backend: an adapter of any class that
    declares 3 runs batches of 3 whatever --batch-size; control: the same adapter without it follows --batch-size; a
    concurrency of the wrong shape is one line naming the member."""
    from lctx.harness.run.runner import batches
    from lctx.tasks import get_task
    from lctx.tasks.base import Cell

    class Concurrent:  # no server anywhere: only the capability
        can_batch, concurrency = True, 3

    class Plain:
        can_batch = True

    pk = get_task("passkey")()
    for lm, size, want in ((Concurrent(), 1, [3, 3]), (Concurrent(), "auto", [3, 3]), (Plain(), 2, [2, 2, 2])):
        work = [(lm, pk, Cell(100, d, s), {}) for d in (0.0, 0.5) for s in (0, 1, 2)]
        assert [len(b) for b in batches(work, size)] == want
    bad = Concurrent()
    bad.concurrency = 0
    with pytest.raises(LctxError, match=r"^model adapter Concurrent: concurrency is 0 \(int\), which breaks its "
                                        r"contract .*fix Concurrent.concurrency$"):
        batches([(bad, pk, Cell(100, 0.0, 0), {})], 1)


def test_auto_batch_size_is_capped_and_fits_memory(monkeypatch):
    """Issue 15 item 3: --batch-size auto is capped per device type and fits the memory plan."""
    from lctx.harness.run import runner

    lm = load_lm(str(BUNDLED), device="cpu")
    assert runner.auto_batch_size(lm, 1024) == runner.AUTO_BATCH_CAP["cpu"]  # a tiny model fits 4 easily
    monkeypatch.setattr("lctx.models.adapters.memory.device_memory", lambda dev, override=None: (1, "test"))
    assert runner.auto_batch_size(lm, 1024) == 1  # nothing fits: one at a time


def test_failed_batch_runs_its_samples_alone(tmp_path, capsys, monkeypatch):
    """Issue 15 item 3: the samples of a batch that fails (out of memory) run again alone."""
    # a batch whose prefill fails (here: out of memory) must not turn samples that run alone into errors
    from lctx.models.adapters.hf import HFAdapter

    def boom(self, ids):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(HFAdapter, "prefill_batch", boom)
    code, _, err = run_cli(["run", "--tasks", "passkey", "--lengths", "200", "--depths", "0,1", "--samples", "1",
                            "--out", tmp_path / "o", "--batch-size", "2", "--no-progress"], capsys)
    assert code == 0, err
    got = _metrics(tmp_path / "o")
    assert len(got) == 2 and all(v[2] == "ok" and v[1] == 1 for v in got.values())


def test_auto_batch_size_is_told_once_per_model_and_length(monkeypatch):
    """A user trial of --batch-size (issue 15 item 3): auto says the size it chose, once per model and length."""
    # `--batch-size auto` says the N it chose, once per (model, length), and only for tasks that batch
    from lctx.harness.run import runner
    from lctx.tasks import get_task
    from lctx.tasks.base import Cell

    class FakeLM:  # the protocol members batches() reads
        can_batch, name = True, "tiny"

        def settings(self):
            return {"device_type": "cpu", "device": "cpu"}

    chosen = {100: 3, 200: 2}
    monkeypatch.setattr(runner, "auto_batch_size", lambda lm, length: chosen[length])
    lm, pk, ppl = FakeLM(), get_task("passkey")(), get_task("ppl")()
    work = [(lm, pk, Cell(L, d, s), {}) for L in (100, 200) for d in (0.0, 0.5) for s in (0, 1, 2)]
    work += [(lm, ppl, Cell(300, None, 0), {})]
    lines: list[str] = []
    got = runner.batches(work, "auto", log=lines.append)
    assert [len(b) for b in got] == [3, 3, 2, 2, 2, 1]  # 6 cells per length in batches of 3 and 2; ppl alone
    assert len(lines) == 2 and "3 for tiny at 100 tokens" in lines[0] and "2 for tiny at 200 tokens" in lines[1]


@pytest.mark.slow  # two sweeps of two tasks x 3 samples (~10 s quiet)
def test_samples_of_a_cell_never_share_a_prompt(make_checkpoint, tmp_path):
    """Issue 30 item 6: every record carries its prompt's digest (prompt_sha256); the samples of one cell of the
    generated tasks have different prompts (their keys and values are drawn per sample), and a rerun into a fresh
    directory builds the same prompts (the digest is a function of the ids, so the check can fail)."""
    import json

    from helpers import sweep
    from lctx.harness.run.runner import prompt_digest
    from lctx.tasks import get_task

    ck = make_checkpoint("rope")
    tasks = [get_task("passkey")(), get_task("json_kv")()]
    digests = {}
    for run in ("a", "b"):
        sweep(ck, tasks, tmp_path / run, lengths=(400,), depths=(0.5,), samples=3)
        recs = [json.loads(x) for x in (tmp_path / run / "records.jsonl").read_text().splitlines()]
        digests[run] = {(r["task"], r["sample"]): r["prompt_sha256"] for r in recs}
    for task in ("passkey", "json_kv"):
        per_sample = [digests["a"][(task, k)] for k in range(3)]
        assert len(set(per_sample)) == 3 and all(per_sample), (task, per_sample)
    assert digests["a"] == digests["b"]
    assert prompt_digest([1, 2, 3]) != prompt_digest([1, 2, 4])  # control: one token changes it


def test_cache_order_runs_each_haystack_deepest_needle_first():
    """--order cache: per length, the deepest needle first and the sample seeds of one depth together, so each
    prompt repeats the one before up to its own needle (the samples of one length share the haystack up to the
    first needle), which a server's prefix cache reuses; grid is the task's grid as built and shuffle a seeded
    permutation of the same cells. Control: the grid order breaks the cache order's property."""
    from lctx.harness.run.runner import order_cells

    cells = Passkey().cells([512, 256], [0.0, 0.5, 1.0], 2)

    def cache_friendly(seq) -> bool:
        lengths = [c.length for c in seq]
        if len(set(lengths)) != len([L for i, L in enumerate(lengths) if i == 0 or lengths[i - 1] != L]):
            return False  # a length comes back after another: its haystack left the cache between
        return all(nxt.depth <= prev.depth for prev, nxt in zip(seq, seq[1:]) if prev.length == nxt.length)

    got = order_cells(cells, "cache")
    key = lambda c: (c.length, c.depth, c.sample)  # noqa: E731
    assert sorted(got, key=key) == sorted(cells, key=key) and cache_friendly(got)
    assert order_cells(cells, "grid") == cells and not cache_friendly(cells)
    shuffled = order_cells(cells, "shuffle", seed=3)
    assert sorted(shuffled, key=key) == sorted(cells, key=key) and shuffled != cells
    assert order_cells(cells, "shuffle", seed=3) == shuffled  # seeded
    with pytest.raises(LctxError, match="--order 'random' is not one of cache, grid, shuffle"):
        order_cells(cells, "random")


def test_results_do_not_depend_on_the_order(make_checkpoint, tmp_path):
    """The same sweep run in the cache order and shuffled gives the same records cell by cell (prompt digest, every
    metric), in process; tests/test_server_vllm.py checks the same through a server with its prefix cache on."""
    from lctx.harness.run.runner import RunSpec, run_sweep
    from lctx.models.adapters.hf import load_lm

    ck = make_checkpoint("rope")
    got = {}
    for order in ("cache", "shuffle"):
        lm = load_lm(str(ck), device="cpu")
        run_sweep([lm], [Passkey()], RunSpec([96, 128], [0.0, 0.5, 1.0], 2, order=order), tmp_path / order,
                  progress=False)
        got[order] = {(r["length"], r["depth"], r["sample"]): (r["prompt_sha256"], r["metrics"])
                      for r in _records(tmp_path / order)}
    assert len(got["cache"]) == 12 and got["cache"] == got["shuffle"]
