"""Runner: resume after an interruption, failures recorded without ending the sweep, tidy table shape."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lctx.errors import LctxError
from lctx.models.adapters.hf import load_lm
from lctx.harness.run.runner import RunSpec, run_sweep
from lctx.harness.run.tables import COLUMNS
from lctx.tasks import TASKS, Task, register_task
from lctx.tasks.passkey import Passkey

VOLATILE = ["run_id", "wall_s", "peak_mem_bytes", "timestamp", "git_rev"]


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
                                   "uses_seed": False, "heatmap_metrics": None}
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
