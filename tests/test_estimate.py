"""The plan and time estimate said before a run (harness/run/estimate.py) and ``lctx run --dry-run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from lctx.harness.run import estimate as est

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "models" / "checkpoints" / "pydoc-tiny-rope"


def test_estimate_scales_the_calibrated_prefill_by_each_sample_cost():
    cal = est.Calibration(a=1e-3, b=1e-6)
    rows = [est.PlanRow("m", "passkey", 1000, 10, 10 * 1000.0), est.PlanRow("m", "ppl", 1000, 1, 3000.0),
            est.PlanRow("m", "mmlu", None, 5, 5 * 100.0), est.PlanRow("served", "passkey", 1000, 2, 2000.0)]
    est.estimate(rows, {"m": cal, "served": None})
    one = 1e-3 * 1000 + 1e-6 * 1000 ** 2  # t(1000) = 2 s
    tol = 1e-12 * one  # float rounding of three products
    assert abs(rows[0].seconds - 10 * one) <= 10 * tol
    assert abs(rows[1].seconds - 3 * one) <= 3 * tol  # a ppl sample of three windows costs three prefills
    assert abs(rows[2].seconds - 500 * cal.seconds(est.CAL_SHORT) / est.CAL_SHORT) <= tol
    assert rows[3].seconds is None  # a served model is not timed
    header, table = est.plan_table(rows)
    assert header[-1] == "time (est.)" and "questions" in header
    assert [r[-1] for r in table] == ["20 s", "6.0 s", est.say_seconds(rows[2].seconds), "not estimated"]
    # control: a quadratic term that doubles changes the estimate
    rows2 = [est.PlanRow("m", "passkey", 1000, 10, 10 * 1000.0)]
    est.estimate(rows2, {"m": est.Calibration(a=1e-3, b=2e-6)})
    assert rows2[0].seconds - rows[0].seconds > 100 * tol


@pytest.mark.slow
def test_calibration_times_the_model_and_fits_nonnegative_terms():
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(BUNDLED), device="cpu")
    cal = est.calibrate(lm, [256, 512])
    assert cal is not None and [p[0] for p in cal.points] == [256, 512]
    assert cal.a >= 0 and cal.b >= 0 and cal.seconds(1024) > 0 and cal.took > 0
    assert cal.seconds(2048) >= cal.seconds(1024)  # more tokens never cost less
    assert len(est.calibrate(lm, [64]).points) == 1  # one short length: one point, linear


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(["run", "-m", BUNDLED, "--lengths", "128,256", "--depths", "0,1", "--samples", "3", "--dry-run",
                                 "--no-progress", "--out", out], capsys)
    assert code == 0, err
    assert "plan: 14 samples" in stdout  # passkey 2 lengths x 2 depths x 3 samples + ppl 1 per length
    assert "estimated time" in stdout and "calibrated here" in stdout
    assert "dry run: nothing ran" in stdout
    assert not out.exists()


def test_the_plan_is_printed_before_a_run_and_run_json_records_the_dtype(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(["run", "-m", BUNDLED, "--tasks", "passkey", "--lengths", "128", "--depths", "0.5", "--samples", "1",
                                 "--no-progress", "--out", out], capsys)
    assert code == 0, err
    assert stdout.index("plan: 1 sample") < stdout.index("wrote ")
    meta = json.loads((out / "run.json").read_text())
    assert meta["dtype"] == {"pydoc-tiny-rope": "float32"}


@pytest.mark.slow
def test_a_folder_holding_one_gguf_says_which_file(tmp_path, capsys, data_dir):
    gguf = data_dir / "checkpoints" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    folder = tmp_path / "smol"
    folder.mkdir()
    (folder / gguf.name).symlink_to(gguf)
    code, stdout, err = run_cli(["run", "-m", folder, "--tasks", "passkey", "--lengths", "256", "--depths", "0.5",
                                 "--samples", "1", "--dry-run", "--no-progress", "--out", tmp_path / "o"], capsys)
    assert code == 0, err
    assert f"holds one .gguf file, {gguf.name}: loading it" in stdout + err
