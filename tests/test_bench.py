"""lctx.harness.commands.bench (lctx bench): exponent fit, interleaved pairs and their statistics, one small sweep
(two variants, 64/128 tokens), skips, memory method, the worker process, the whole-model prefill mode, CLI errors.

No timed assertions: times are only checked to be measured (finite, positive)."""

from __future__ import annotations

import io
import math
import sys

import pandas as pd
import pytest
import torch
from helpers import assert_one_line_error, run_cli
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
from lctx.harness.commands.bench import (
    BenchCase,
    BenchGroup,
    PeakMemory,
    estimate_bytes,
    fit_exponent,
    MAX_CALLS,
    calls_per_timing,
    interleave,
    pair_stats,
    run_bench,
    run_group_isolated,
    write_bench,
)


def test_fit_exponent_on_synthetic_power_laws():
    lengths = [1024, 4096, 16384, 65536]
    # y = c * T^p exactly: the log-log least-squares slope is p (hand: log y = log c + p log T)
    assert fit_exponent(lengths, [3e-6 * t**1.5 for t in lengths]) == pytest.approx(1.5, abs=1e-9)
    assert fit_exponent(lengths, [7.0 * t**2 for t in lengths]) == pytest.approx(2.0, abs=1e-9)
    # two points: slope = log(y2 / y1) / log(x2 / x1) = log(4) / log(8) (hand)
    assert fit_exponent([1000, 8000], [2.0, 8.0]) == pytest.approx(math.log(4) / math.log(8), abs=1e-9)
    # NaN / non-positive points are ignored: what is left is 1024 -> 1.0 and 65536 -> 8.0, slope log 8 / log 64
    assert fit_exponent(lengths, [1.0, float("nan"), 0.0, 8.0]) == pytest.approx(0.5, abs=1e-9)
    assert math.isnan(fit_exponent([1024], [1.0]))
    assert math.isnan(fit_exponent([1024, 2048], [float("nan"), 1.0]))


def test_interleave_alternates_and_pair_stats_are_per_round():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "c": lambda: calls.append("c")}
    times = interleave(fns, 4, torch.device("cpu"))
    # forward order on even rounds, backward on odd ones: drift weighs on every function alike
    assert calls == list("abc" "cba" "abc" "cba")
    assert all(len(t) == 4 and min(t) >= 0 for t in times.values())
    # ratios are taken per round (pairs timed back to back), not of medians (hand: 2, 3, 2.5 -> median 2.5)
    st = pair_stats([2.0, 6.0, 5.0], [1.0, 2.0, 2.0])
    assert st["min"] == pytest.approx(2.0) and st["median"] == pytest.approx(2.5)
    assert st["spread"] == pytest.approx((3.0 - 2.0) / 2.5)


def test_autorange_repeats_short_calls_within_a_timing():
    import time

    dev = torch.device("cpu")
    fns = {"noop": lambda: None, "short": lambda: time.sleep(0.01), "long": lambda: time.sleep(0.06)}
    n = calls_per_timing(fns, dev, 0.05)
    # ceil(0.05 / t): a 60 ms call needs 1; a >= 10 ms call at most ceil(0.05 / 0.01) = 5 (sleep never
    # returns early; a slow probe only lowers the count); a no-op hits the cap
    assert n["long"] == 1 and 1 <= n["short"] <= 5 and n["noop"] == MAX_CALLS
    assert calls_per_timing(fns, dev, 0.0) == {"noop": 1, "short": 1, "long": 1}  # --min-time 0: old behaviour
    calls = []
    times = interleave({"a": lambda: calls.append("a"), "b": lambda: time.sleep(0.01)}, 3, dev, {"a": 7, "b": 2})
    assert calls.count("a") == 3 * 7  # 7 calls per timing, 3 rounds
    # the recorded time is per call, not per timing: each sleep(0.01) call takes >= 10 ms, two of them < 1 s
    assert all(0.01 <= t < 0.5 for t in times["b"])


@pytest.mark.slow
def test_small_sweep_two_variants(tmp_path):
    # alibi: a bias variant (sdpa float mask + bias); interdomain: a fixed-state mixer that reads x
    table, exps = run_bench(["alibi", "interdomain"], ["sdpa"], [64, 128], heads=2, head_dim=16, repeats=3,
                            warmup=0, isolate=False)
    assert list(map(tuple, table[["variant", "impl"]].drop_duplicates().values)) == [
        ("alibi", "sdpa"), ("interdomain", "sdpa")]
    assert (table["status"] == "ok").all(), table["status"].tolist()
    assert len(table) == 2 * 2
    assert (table["time_s"] > 0).all() and table["peak_bytes"].notna().all() and (table["base_time_s"] > 0).all()
    assert table["ratio_sdpa"].notna().all() and (table["ratio_sdpa_min"] <= table["ratio_sdpa"] + 1e-12).all()
    assert (table["threads"] >= 1).all() and table["load_avg_start"].notna().all()
    # calls of ~1 ms at 64-128 tokens: the default 0.1 s autorange repeats them within each timing
    assert (table["calls_per_timing"] >= 1).all() and (table["calls_per_timing"] > 1).any()
    alibi, inter = table[table["variant"] == "alibi"], table[table["variant"] == "interdomain"]
    assert alibi["has_bias"].all() and alibi["ratio_sdpa_bias"].notna().all()
    assert not inter["has_bias"].any() and inter["ratio_sdpa_bias"].isna().all()
    assert table["unstable"].dtype == bool
    assert set(zip(exps["variant"], exps["impl"])) == {("alibi", "sdpa"), ("interdomain", "sdpa")}
    assert (exps["n_lengths"] == 2).all() and exps["time_exponent"].notna().all()
    paths = write_bench(table, exps, tmp_path / "out")
    names = {p.name for p in paths}
    assert names == {"bench.parquet", "bench.csv", "exponents.csv", "ratios.md", "bench.png"}
    back = pd.read_parquet(tmp_path / "out" / "bench.parquet")
    assert len(back) == len(table) and list(back["status"]) == list(table["status"])
    md = (tmp_path / "out" / "ratios.md").read_text()
    assert "alibi [sdpa]" in md and "| 64 | 128 |" in md and "load average" in md


def test_dense_reference_at_64k_is_skipped_not_run():
    # hand: the reference path holds 3 float32 T x T score tensors: 3 * 65536^2 * 4 B = 48 GiB for one head
    case = BenchCase("rope", "reference", 65536, heads=1, head_dim=64)
    est = estimate_bytes(case, {"mask_asked": True, "float_mask": False, "has_bias": False})
    assert est >= 3 * 65536**2 * 4
    table, exps = run_bench(["rope"], ["reference"], [65536], heads=1, head_dim=64, repeats=1, warmup=0,
                            isolate=False, mem_limit=8 * 2**30, baselines=False)
    assert list(table["variant"]) == ["rope"]
    assert len(table) == 1 and table["status"].iloc[0].startswith("skipped: needs ~")
    assert math.isnan(table["time_s"].iloc[0]) and exps["n_lengths"].iloc[0] == 0


def test_estimate_grows_quadratically_only_for_dense_paths():
    dense = {"mask_asked": True, "float_mask": True, "has_bias": True}
    fixed = {"mask_asked": False, "float_mask": False, "has_bias": False}
    e = lambda T, p: estimate_bytes(BenchCase("x", "sdpa", T, heads=2, head_dim=16), p)  # noqa: E731
    assert fit_exponent([4096, 65536], [e(4096, dense), e(65536, dense)]) > 1.9
    assert fit_exponent([4096, 65536], [e(4096, fixed), e(65536, fixed)]) == pytest.approx(1.0, abs=1e-9)


def test_peak_memory_sees_a_large_allocation():
    n = 64 * 2**20  # 64 MiB of float32: above glibc's mmap threshold, so it is fresh resident memory
    with PeakMemory("cpu") as pm:
        x = torch.ones(n // 4)
        del x
    if "clear_refs" not in pm.method:
        pytest.skip(f"no /proc/self/clear_refs here ({pm.method})")
    assert pm.peak >= 0.95 * n


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM / clear_refs are Linux")
def test_one_worker_process_per_variant_streams_its_rows():
    group = BenchGroup("alibi", ["sdpa", "fast"], [128, 256], heads=2, head_dim=16, repeats=2, warmup=0, threads=1)
    seen = []
    rows = run_group_isolated(group, seen.append, timeout=300)
    assert [(r["impl"], r["length"]) for r in rows] == [("sdpa", 128), ("sdpa", 256), ("fast", 128), ("fast", 256)]
    assert seen == rows and all(r["status"] == "ok" for r in rows), rows
    assert all(r["threads"] == 1 for r in rows)  # the worker took the asked thread count
    assert "VmHWM" in rows[0]["mem_method"]
    # the sdpa path of alibi holds at least the [1, 2, 256, 256] float32 bias
    assert rows[1]["peak_bytes"] >= 2 * 256 * 256 * 4


@pytest.mark.slow
def test_a_crashing_worker_gives_error_rows():
    group = BenchGroup("alibi", ["sdpa"], [64, 128], heads=2, head_dim=16, repeats=1, warmup=0, threads=1,
                       dtype="no-such-dtype")
    rows = run_group_isolated(group, timeout=120)
    assert len(rows) == 2 and all(r["status"].startswith("error") for r in rows)


@pytest.mark.parametrize("args,needles", [
    (["--variants", "nosuch"], ["nosuch", "lctx list variants"]),
    (["--impl", "fastest"], ["fastest", "fast, sdpa, reference"]),
    (["--lengths", "1.5k"], ["1.5k"]),
    (["--mem-limit", "3x"], ["3x"]),
    (["--heads", "0"], ["--heads"]),
    (["--variants", "rope", "--head-dim", "15"], ["rope", "head dim"]),
])
def test_cli_bench_errors_are_one_line(capsys, tmp_path, args, needles):
    code, _, err = run_cli(["bench", "--out", str(tmp_path / "b"), "--lengths", "64", "--in-process", *args], capsys)
    assert_one_line_error(code, err, *needles)


def test_cli_bench_happy_path(capsys, tmp_path):
    out = tmp_path / "b"
    code, stdout, _ = run_cli(["bench", "--variants", "nope", "--impl", "sdpa", "--lengths", "64,128", "--heads", "2",
                               "--head-dim", "16", "--repeats", "1", "--warmup", "0", "--in-process", "--out",
                               str(out)], capsys)
    assert code == 0
    assert (out / "bench.csv").is_file() and (out / "bench.png").is_file()
    assert "scaling exponents" in stdout


@pytest.mark.slow
def test_cli_bench_prints_the_ratio_table(capsys, tmp_path):
    out = tmp_path / "b"
    code, stdout, _ = run_cli(["bench", "--variants", "alibi,rope", "--impl", "fast", "--lengths", "64,128", "--heads",
                               "2", "--head-dim", "16", "--repeats", "2", "--warmup", "0", "--in-process", "--out",
                               str(out)], capsys)
    assert code == 0
    assert "time / SDPA causal time, median" in stdout and "alibi [fast]" in stdout and "rope [fast]" in stdout
    assert (out / "ratios.md").is_file()


@pytest.mark.slow
def test_cli_bench_model_mode_compares_peak_with_the_plan(capsys, tmp_path):
    # the whole-model prefill (was benchmarks/long_cpu.py): one fresh process per impl x length
    out = tmp_path / "new" / "b"  # neither exists yet: created after the measurements (was a traceback)
    code, stdout, _ = run_cli(["bench", "--model", str(REPO / "models" / "checkpoints" / "pydoc-tiny-rope"),
                               "--impl", "sdpa", "--lengths", "512", "--chunk-size", "256", "--out", str(out)], capsys)
    assert code == 0, stdout
    df = pd.read_csv(out / "prefill.csv")
    assert list(df["status"]) == ["ok"] and df["peak_bytes"].iloc[0] > 0 and df["plan_bytes"].iloc[0] > 0
    assert df["plan_path"].iloc[0] == "chunk-split" and "plan error" in stdout  # RoPE on sdpa: no mask (issue 28)


@pytest.mark.usefixtures("isolated_digests")
def test_bench_option_goes_to_the_variants_that_take_it(tmp_path, capsys):
    """Issue 10 item 15: lctx bench --option goes to the variants that take it; one that no variant takes is refused."""
    from lctx.harness.commands.bench import make_config

    assert make_config("rope", "sdpa", 1, 16, {"lsh_samples": 4}).variant_options == {}
    assert make_config("alibi_lsh", "sdpa", 1, 16, {"lsh_samples": 4}).variant_options == {"lsh_samples": 4}
    code, _, err = run_cli(["bench", "--variants", "rope,alibi_lsh", "--option", "lsh_sampels=4", "--lengths", "64",
                            "--out", tmp_path / "b"], capsys)
    assert_one_line_error(code, err, "lsh_sampels", "not an option of any variant")
    assert not (tmp_path / "b").exists()


@pytest.mark.usefixtures("plain_console")
def test_bench_tables_whole_off_a_terminal():
    """Issue 16 item 1: lctx bench's tables print whole off a terminal; each column header stays on one line."""
    from lctx.harness.commands.bench import print_bench

    table = pd.DataFrame([dict(variant="ggd_bam+ssmax", impl="fast", impl_ran="flex-compiled", length=16384,
                               time_s=0.179123, peak_bytes=3 * 2**30, ratio_sdpa=12.3456, ratio_sdpa_bias=0.98765,
                               status="ok")])
    exps = pd.DataFrame([dict(variant="ggd_bam+ssmax", impl="fast", time_exponent=1.987, mem_exponent=1.01,
                              lengths="1024,4096,16384")])
    buf = io.StringIO()
    print_bench(table, exps, file=buf)
    out = buf.getvalue()
    header = next(ln for ln in out.splitlines() if "variant" in ln and "status" in ln)
    for h in ("time ms", "peak MiB", "x sdpa", "x sdpa+bias"):  # `x sdpa` used to break across lines
        assert f" {h} " in header, header
    row = next(ln for ln in out.splitlines() if "flex-compiled" in ln)
    for cell in ("ggd_bam+ssmax", "16384", "179.12", "3072.0", "12.35", "0.99"):
        assert cell in row, (cell, row)
    assert "1024,4096,16384" in out and "…" not in out
