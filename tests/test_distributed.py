"""Sharded sweeps: the split of the work, the merge of rank files, resume from them, and a real 2-process
torchrun (gloo on CPU) whose merged table equals the single-process table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from lctx.harness.run import distributed as D
from lctx.errors import LctxError
from lctx.harness.run.tables import record_key

# columns that differ between any two runs (time, memory, clock, run id)
VOLATILE = ["run_id", "wall_s", "cpu_s", "peak_mem_bytes", "timestamp", "threads"]  # torchrun gives each rank OMP_NUM_THREADS=1
ROW = ["model", "task", "metric", "length", "depth", "sample"]


def stable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=VOLATILE).sort_values(ROW, na_position="first").reset_index(drop=True)


def test_shard_partitions_the_work_deterministically_and_balances_cost():
    costs = [4096, 256, 256, 4096, 512, 1024, 256, 2048, 512, 256, 8192]
    items = list(enumerate(costs))
    world = 3
    shares = [D.shard(items, D.DistInfo(r, world, r), cost=lambda it: it[1]) for r in range(world)]
    # disjoint, complete, each in the original order
    flat = sorted(i for s in shares for i, _ in s)
    assert flat == list(range(len(items)))
    assert all([i for i, _ in s] == sorted(i for i, _ in s) for s in shares)
    # the same call gives the same split (every rank computes it on its own)
    assert shares == [D.shard(items, D.DistInfo(r, world, r), cost=lambda it: it[1]) for r in range(world)]
    # greedy least-loaded assignment: loads differ by at most the largest item (Graham's bound); a plain
    # round-robin in list order gives loads 8704/11008/1792 here and fails this
    loads = [sum(c for _, c in s) for s in shares]
    assert max(loads) - min(loads) <= max(costs)
    # one process takes everything
    assert D.shard(items, D.DistInfo()) == items


def test_rank_device_and_env_errors(monkeypatch):
    two = D.DistInfo(rank=1, world_size=2, local_rank=1)
    assert D.rank_device("cpu", two) == "cpu"
    assert D.rank_device("cuda:0", D.DistInfo()) == "cuda:0"  # one process: unchanged
    if torch.cuda.is_available():
        assert D.rank_device("auto", two) == "cuda:1"
    else:
        assert D.rank_device("auto", two) == "auto"
    with pytest.raises(LctxError, match="one GPU"):
        D.rank_device("cuda:0", two)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(LctxError, match="RANK=2"):
        D.env_info()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(LctxError, match="not an integer"):
        D.env_info()
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert D.env_info() == D.DistInfo(0, 1, 0)


def _rec(length, status="ok", value=1.0):
    return {"model": "m", "model_fingerprint": "f", "dtype": "float32", "attn_impl": "sdpa", "task": "t",
            "length": length, "depth": None, "sample": 0, "seed": 0, "task_options": {}, "status": status,
            "metrics": {"x": value} if status == "ok" else {}}


def test_merge_records_keeps_one_record_per_key_and_removes_rank_files(tmp_path):
    (tmp_path / "records.jsonl").write_text(json.dumps(_rec(1, "error")) + "\n" + json.dumps(_rec(2)) + "\n")
    # rank 0 retried the errored sample; rank 1 ran a new one and was killed mid-line; a stale error for a
    # finished sample must not replace it
    (tmp_path / "records.rank0.jsonl").write_text(json.dumps(_rec(1, value=3.0)) + "\n")
    (tmp_path / "records.rank1.jsonl").write_text(json.dumps(_rec(4)) + "\n" + json.dumps(_rec(2, "error"))
                                                  + "\n" + '{"model": "m", "len')
    assert [p.name for p in D.rank_files(tmp_path)] == ["records.rank0.jsonl", "records.rank1.jsonl"]
    assert len(D.read_all_records(tmp_path)) == 5  # the torn line is skipped
    merged = D.merge_records(tmp_path)
    assert not D.rank_files(tmp_path)
    by_len = {r["length"]: r for r in merged}
    assert sorted(by_len) == [1, 2, 4] and len(merged) == 3
    assert by_len[1]["status"] == "ok" and by_len[1]["metrics"]["x"] == 3.0  # the retry replaced the error
    assert by_len[2]["status"] == "ok"  # ok beats a later error
    on_disk = [json.loads(x) for x in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [record_key(r) for r in on_disk] == [record_key(r) for r in merged]
    # nothing left to merge: records.jsonl is read, not rewritten
    before = (tmp_path / "records.jsonl").stat().st_mtime_ns
    assert len(D.merge_records(tmp_path)) == 3
    assert (tmp_path / "records.jsonl").stat().st_mtime_ns == before


def test_merge_keeps_a_second_finished_record_with_other_metrics_for_the_vetting(tmp_path):
    # issue 25 item 2: an appended ok record of a finished key must not make the merge drop the run's own one
    # (vet_records names it and keeps the first); an exact copy (a rank file read again) is dropped
    (tmp_path / "records.jsonl").write_text(json.dumps(_rec(1)) + "\n")
    (tmp_path / "records.rank0.jsonl").write_text(json.dumps(_rec(1, value=9.0)) + "\n" + json.dumps(_rec(1)) + "\n")
    merged = D.merge_records(tmp_path)
    assert [r["metrics"]["x"] for r in merged] == [1.0, 9.0]


@pytest.mark.slow
def test_single_process_resumes_an_interrupted_sharded_run(make_checkpoint, tmp_path):
    from lctx.models.adapters.hf import load_lm
    from lctx.harness.run.runner import RunSpec, run_sweep
    from lctx.tasks.passkey import Passkey

    lm = load_lm(str(make_checkpoint("alibi")), device="cpu")
    spec = RunSpec(lengths=[160, 200], depths=[0.5], samples=2, seed=0)
    full = run_sweep([lm], [Passkey()], spec, tmp_path / "full", progress=False)
    recs = [json.loads(x) for x in (tmp_path / "full" / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs)
    # a 2-rank run killed after rank 0 finished two samples and rank 1 one (run.json, written before any
    # record, names their invocation)
    out = tmp_path / "sharded"
    out.mkdir()
    (out / "run.json").write_text((tmp_path / "full" / "run.json").read_text())
    (out / "records.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:2]))
    (out / "records.rank1.jsonl").write_text(json.dumps(recs[3]) + "\n")
    res = run_sweep([lm], [Passkey()], spec, out, progress=False)
    assert (res["skipped"], res["ran"]) == (3, 1)
    assert not D.rank_files(out)
    assert len((out / "records.jsonl").read_text().splitlines()) == 4
    pd.testing.assert_frame_equal(stable(res["table"]).drop(columns="git_rev"),
                                  stable(full["table"]).drop(columns="git_rev"))


@pytest.mark.slow
def test_torchrun_two_ranks_on_cpu_give_the_single_process_table(tmp_path, monkeypatch):
    """2 processes under torchrun (gloo) vs one process in this interpreter, on the bundled checkpoint."""
    from lctx.cli import main

    from lctx.harness.evaluate import DEFAULT_MODEL

    args = ["run", "-m", str(DEFAULT_MODEL), "--tasks", "passkey,ppl", "--lengths", "256,512", "--depths", "0.5", "--samples", "1",
            "--ppl-max-tokens", "512", "--device", "cpu", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k not in ("LCTX_DATA_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"  # torchrun's default per rank; the single run below uses 1 thread too
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "lctx.cli", *args, "--out", str(tmp_path / "sharded")]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert proc.stdout.count("wrote ") == 1  # only rank 0 prints

    for k in ("LCTX_DATA_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same reduction order as a rank, so values can be compared exactly
    try:
        assert main([*args, "--out", str(tmp_path / "single")]) == 0
    finally:
        torch.set_num_threads(threads)

    sharded, single = tmp_path / "sharded", tmp_path / "single"
    assert not D.rank_files(sharded)  # merged into records.jsonl
    recs = [json.loads(x) for x in (sharded / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 4 and len({r["run_id"] for r in recs}) == 1  # 2 tasks x 2 lengths, one run id
    assert json.loads((sharded / "run.json").read_text())["world_size"] == 2
    a = stable(pd.read_parquet(sharded / "results.parquet"))
    b = stable(pd.read_parquet(single / "results.parquet"))
    assert len(a) == 12  # passkey: exact, digit_acc; ppl: ppl, nll, n_tokens, n_docs; x 2 lengths
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    sa = pd.read_csv(sharded / "summary.csv")
    sb = pd.read_csv(single / "summary.csv")
    pd.testing.assert_frame_equal(sa, sb, check_exact=True)
    assert sorted(p.name for p in (sharded / "plots").iterdir()) == sorted(p.name for p in (single / "plots").iterdir())
