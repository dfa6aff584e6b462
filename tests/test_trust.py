"""Issue 10, trustworthy results: one test (at least) per numbered item of the issue.

A number in a run directory always comes from the inputs named beside it (items 1-6); a broken model is an
error, not a score (7, 8); damaged, hostile or unwritable files, a full disk and a second process give one
line and exit 2, never a traceback and never lost results (9-14); inputs that were silently accepted are
refused (15); messages say what happened (16); a needle depth that cannot be honoured is flagged (17).
The numbers in the asserts are exact by construction (counts of samples, lines, exit codes); none is a
measured result.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import (TEXT, _left_out, assert_one_line_error, base_run, edited_checkpoint, nan_checkpoint, ppl_task, ruler_data,
                     ruler_qa_data, run_cli, sweep, value)

from lctx.models import fingerprint as F
from lctx.errors import EXIT_ALL_FAILED, LctxError, NonFiniteLogitsError, check_finite_logits
from lctx.models.adapters.hf import load_lm
from lctx.harness.run.runner import RunSpec, run_sweep
from lctx.harness.run.tables import COLUMNS, DEPTH_TOLERANCE, label_names
from lctx.tasks import Task, register_task
from lctx.tasks.passkey import Passkey
from lctx.tasks.ppl import Perplexity


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No data dir from the environment; the digest cache in the test's own folder."""
    monkeypatch.delenv("LCTX_DATA_DIR", raising=False)
    monkeypatch.setenv("LCTX_HASH_CACHE", str(tmp_path / "digests.json"))


@pytest.fixture
def data(tmp_path) -> Path:
    p = tmp_path / "doc.txt"
    p.write_text(TEXT)
    return p


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


# ---------------------------------------------------------------------------------------------------
# 1-6: the resume key identifies every input; the tables never mix inputs

def test_1_same_size_same_mtime_new_weights_rerun(make_checkpoint, data, tmp_path):
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


def test_1_digest_cache_cannot_hide_a_same_size_same_mtime_rewrite(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "RACY_S", 0.0)  # trust entries at once (normally 2 s after the file's last change)
    calls = []
    real = F._hash_file
    monkeypatch.setattr(F, "_hash_file", lambda p: calls.append(p) or real(p))
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 4096)
    d1 = F.file_digest(f)
    F.flush_cache()
    assert F.file_digest(f) == d1 and len(calls) == 1  # unchanged: served from the cache, not re-read
    st = os.stat(f)
    time.sleep(0.01)
    f.write_bytes(b"b" * 4096)  # same size ...
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... same mtime to the nanosecond
    assert F.file_digest(f) != d1 and len(calls) == 2  # the ctime moved: re-hashed
    assert json.loads((tmp_path / "digests.json").read_text())  # the cache is on disk


def test_1_racy_cache_entry_is_not_trusted(tmp_path, monkeypatch):
    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 100)
    calls = []
    real = F._hash_file
    monkeypatch.setattr(F, "_hash_file", lambda p: calls.append(p) or real(p))
    F.file_digest(f)
    F.file_digest(f)  # hashed within RACY_S of the file's change: the entry could hide a change, so re-read
    assert len(calls) == 2


def test_2_config_change_reruns(make_checkpoint, data, tmp_path):
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    first = sweep(ck, [ppl_task(data)], out)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["rope_theta"] = 37.0
    (ck / "config.json").write_text(json.dumps(cfg))
    second = sweep(ck, [ppl_task(data)], out)
    assert second["ran"] == 1 and value(second, "ppl", "ppl") != value(first, "ppl", "ppl")


def test_3_data_change_reruns(make_checkpoint, data, tmp_path):
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


def test_3b_same_data_file_spelled_two_ways_is_one_cell(make_checkpoint, tmp_path):
    # last stop's finding (issue 11's SmolLM2 run): --ppl-data ../shared/data/books/x.txt in one session and
    # /work/shared/data/books/x.txt (from LCTX_DATA_DIR) in the next made two cells, and the window reran (175 s).
    # The recorded option is now the path relative to the data root, so every spelling resumes the first.
    ck = make_checkpoint("rope")
    root = tmp_path / "data"
    (root / "books").mkdir(parents=True)
    (root / "books" / "x.txt").write_text(TEXT)
    alias = tmp_path / "link"
    alias.symlink_to(root)  # as ../shared -> /work/shared
    out = tmp_path / "o"
    first = sweep(ck, [Perplexity(data=["books/x.txt"], data_dir=str(root))], out)
    assert first["ran"] == 1
    for data, data_dir in ((str(root / "books" / "x.txt"), root), (str(alias / "books" / "x.txt"), alias),
                           (os.path.relpath(root / "books" / "x.txt"), str(alias))):
        again = sweep(ck, [Perplexity(data=[data], data_dir=data_dir)], out)
        assert again["ran"] == 0 and again["skipped"] == 1, data
    rec = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    assert rec["task_options"]["data"] == ["books/x.txt"]
    # a file outside the data root is named by its absolute real path (not as typed, not relative to the cwd)
    assert Perplexity(data=[str(alias / "books" / "x.txt")]).options["data"] == [str((root / "books" / "x.txt").resolve())]


def test_3c_two_checkpoints_of_one_name_are_refused_not_hidden(make_checkpoint, data, tmp_path):
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


def test_4_retrain_tabulates_only_current_inputs(make_checkpoint, data, tmp_path):
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


def test_4_reverted_weights_tabulate_their_own_records(make_checkpoint, data, tmp_path):
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


def test_5_other_task_options_are_separate_labelled_cells(make_checkpoint, data, tmp_path):
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


@pytest.mark.parametrize("change", ["tokenizer", "dtype", "attn_impl", "chunk_size", "task_version", "seed",
                                    "task_file_code"])
def test_6_every_other_input_changes_the_key(make_checkpoint, data, tmp_path, change, monkeypatch):
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


def test_6_resume_key_is_stable_for_an_unchanged_rerun(make_checkpoint, data, tmp_path):
    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    sweep(ck, [ppl_task(data), Passkey()], out, lengths=(160,))
    shutil.copytree(ck, tmp_path / "copy", copy_function=shutil.copy2)  # cp -rp: another path, same bytes
    res = sweep(tmp_path / "copy", [ppl_task(data), Passkey()], tmp_path / "o2", lengths=(160,))
    again = sweep(ck, [ppl_task(data), Passkey()], out, lengths=(160,))
    assert again["ran"] == 0 and again["skipped"] == 2
    assert set(res["table"]["model_fingerprint"]) == set(again["table"]["model_fingerprint"])


# ---------------------------------------------------------------------------------------------------
# 7-8: non-finite logits are an error for every task; a run where everything failed exits 3


@pytest.mark.parametrize("how", ["layer0", "embedding_inf"])
def test_7_nan_model_is_an_error_in_every_task(make_checkpoint, data, tmp_path, how):
    from lctx.tasks import get_task

    ck = nan_checkpoint(make_checkpoint, how)
    root = ruler_data(tmp_path / "d", " ".join(f"Sentence {i} is here." for i in range(300)))
    niah = get_task("niah_single_2")(data_dir=root, cache=False)
    res = sweep(ck, [Passkey(), ppl_task(data), niah], tmp_path / "o", lengths=(256,))
    t = res["table"]
    assert set(t["task"]) == {"passkey", "ppl", "niah_single_2"}
    assert (t["status"] == "error").all(), t[["task", "metric", "status", "value"]]  # passkey was ok, exact 0
    assert t["error"].str.contains("non-finite logits").all()


def test_7_check_finite_logits_allows_masked_tokens():
    check_finite_logits(torch.tensor([[0.0, float("-inf"), 1.0]]))  # a masked token is fine
    for bad in ([[float("nan"), 0.0]], [[float("inf"), 0.0]], [[float("-inf"), float("-inf")]]):
        with pytest.raises(NonFiniteLogitsError):
            check_finite_logits(torch.tensor(bad))


def test_8_every_sample_failed_exits_3(make_checkpoint, tmp_path, capsys):
    ck = nan_checkpoint(make_checkpoint, "layer0")
    code, out, err = run_cli(["run", "-m", ck, "--tasks", "passkey", "--lengths", "160", "--depths", "0.5",
                              "--samples", "2", "--out", tmp_path / "o", "--no-progress"], capsys)
    assert code == EXIT_ALL_FAILED == 3
    assert "every sample of this run failed" in err and "Traceback" not in err
    good = tmp_path / "good"
    code, _, _ = run_cli(["run", "-m", make_checkpoint("rope"), "--tasks", "passkey", "--lengths", "160",
                          "--depths", "0.5", "--samples", "1", "--out", good, "--no-progress"], capsys)
    assert code == 0


# ---------------------------------------------------------------------------------------------------
# 9-11: damaged run directories, a full disk, a device as the records file


@pytest.mark.parametrize("garbage", [bytes(range(256)) + os.urandom(44), b"[1,2,3]\n", b'{"foo":1}\n',
                                     b'{"status":"ok"}\n'])
def test_9_damaged_record_lines_are_skipped_counted_and_rerun(make_checkpoint, tmp_path, capsys, garbage):
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    rec = out / "records.jsonl"
    with open(rec, "ab") as f:
        f.write(garbage)
    args[args.index("--samples") + 1] = 2
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    assert "could not be read and" in err and "skipped" in err and "Traceback" not in err
    from lctx.harness.run.rundir import read_records

    assert len(read_records(rec)) == 2  # the good record was kept and reused: only the new sample ran
    t = pd.read_csv(out / "results.csv")
    assert len(t) == 4 and (t["status"] == "ok").all()


def test_9_damaged_run_json_is_one_line(make_checkpoint, tmp_path, capsys):
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    (out / "run.json").write_text("{bad")
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "run.json", "line 1")
    assert len((out / "records.jsonl").read_text().splitlines()) == 1  # nothing lost


def test_9_records_file_that_is_a_directory(make_checkpoint, tmp_path, capsys):
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    (out / "records.jsonl").unlink()
    (out / "records.jsonl").mkdir()
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "records.jsonl", "a directory")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None, reason="chattr +i needs root")
def test_9_immutable_records_file(make_checkpoint, tmp_path, capsys):
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    rec = out / "records.jsonl"
    if subprocess.run(["chattr", "+i", str(rec)], capture_output=True).returncode:
        pytest.skip("this file system has no immutable attribute")
    try:
        args[args.index("--samples") + 1] = 2
        code, _, err = run_cli(args, capsys)
        assert_one_line_error(code, err, "cannot append to", "records.jsonl")
    finally:
        subprocess.run(["chattr", "-i", str(rec)])
    assert len(rec.read_text().splitlines()) == 1


def test_10_full_disk_keeps_what_finished_and_resumes(make_checkpoint, tmp_path, capsys, monkeypatch):
    from lctx.harness.run import rundir

    ck = make_checkpoint("rope")
    out = tmp_path / "o"
    args = ["run", "-m", ck, "--tasks", "passkey", "--lengths", "160", "--depths", "0,0.5,1", "--samples", 1,
            "--out", out, "--no-progress"]
    real_write, n = os.write, {"records": 0}

    def full_after_one(fd, data):  # the second record hits a full disk halfway through its line
        if os.readlink(f"/proc/self/fd/{fd}").endswith("records.jsonl"):
            n["records"] += 1
            if n["records"] >= 2:
                real_write(fd, bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(rundir.os, "write", full_after_one)
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "No space left on device", "1 finished sample is kept", "rerun")
    monkeypatch.setattr(rundir.os, "write", real_write)  # space freed
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    assert len(rundir.read_records(out / "records.jsonl")) == 3  # 1 kept + 2 run; the torn half line skipped
    t = pd.read_csv(out / "results.csv")
    assert len(t) == 6 and not t.duplicated(["depth", "metric"]).any()


def test_10_failed_table_write_leaves_the_old_table(tmp_path, monkeypatch):
    from lctx.harness.run.rundir import atomic_write

    p = tmp_path / "summary.csv"
    p.write_text("old")

    def boom(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(LctxError, match="No space left"):
        atomic_write(p, boom)
    assert p.read_text() == "old" and [f.name for f in tmp_path.iterdir()] == ["summary.csv"]


@pytest.mark.parametrize("device", ["/dev/full", "/dev/zero"])
def test_11_device_as_records_file_is_refused(make_checkpoint, tmp_path, capsys, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    (out / "records.jsonl").unlink()
    (out / "records.jsonl").symlink_to(device)
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "records.jsonl", "character device")


# ---------------------------------------------------------------------------------------------------
# 12: lctx compare on lm-eval runs, deep TOML, hand-edited summaries, typed tolerances, crash = exit 2

SUMMARY_HEAD = "model,variant,task,metric,length,depth,mean,stderr,n,n_error\n"


def run_dir(root: Path, name: str, rows: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "summary.csv").write_text(SUMMARY_HEAD + rows)
    return d


def test_12_compare_lmeval_runs_without_length(tmp_path, capsys):
    rows = "m,llama,arc_easy,acc,,,0.5,0.2,3,0\nm,llama,arc_easy,acc_norm,,,0.33,0.2,3,0\n"
    a, b = run_dir(tmp_path, "a", rows), run_dir(tmp_path, "b", rows.replace("0.33", "0.1"))
    code, out, err = run_cli(["compare", a, "--baseline", a], capsys)
    assert code == 0 and "PASS" in out, err
    code, out, err = run_cli(["compare", b, "--baseline", a, "--tolerance", "stderr=0"], capsys)
    assert code == 1 and "regression" in out  # a real regression on a length-less cell: exit 1, no crash


def test_12_compare_deep_toml_is_one_line(tmp_path, capsys):
    a = run_dir(tmp_path, "a", "m,rope,ppl,ppl,256,,10,,1,0\n")
    for i, body in enumerate(["x = " + "[" * 5000 + "]" * 5000, "x = " + "{a = " * 5000 + "1" + "}" * 5000]):
        rules = tmp_path / f"deep{i}.toml"
        rules.write_text(body)
        code, _, err = run_cli(["compare", a, "--baseline", a, "--rules", rules], capsys)
        assert_one_line_error(code, err, "--rules")


@pytest.mark.parametrize("row,needle", [("m,rope,ppl,ppl,256,,abc,,1,0\n", "mean 'abc' is not a number"),
                                        ("m,rope,ppl,ppl,256,,10,,,0\n", "n '' is not a number"),
                                        (",rope,ppl,ppl,256,,10,,1,0\n", "model '' is not a name"),
                                        ("m,rope,ppl,ppl,25.5,,10,,1,0\n", "length '25.5'")])
def test_12_compare_hand_edited_summary(tmp_path, capsys, row, needle):
    good = run_dir(tmp_path, "good", "m,rope,ppl,ppl,256,,10,,1,0\n")
    bad = run_dir(tmp_path, "bad", row)
    code, _, err = run_cli(["compare", bad, "--baseline", good], capsys)
    assert_one_line_error(code, err, "row 1", needle)


def test_12_compare_empty_length_is_a_lengthless_cell_not_a_crash(tmp_path, capsys):
    a = run_dir(tmp_path, "a", "m,rope,ppl,ppl,,,10,,1,0\n")
    code, out, err = run_cli(["compare", a, "--baseline", a], capsys)
    assert code == 0, err


@pytest.mark.parametrize("tol", ['abs = "1e9"', "abs = true", 'rel = "0.5"', "stderr = false"])
def test_12_compare_tolerances_must_be_numbers(tmp_path, capsys, tol):
    base = run_dir(tmp_path, "base", "m,rope,ppl,ppl,256,,10,,1,0\n")
    run = run_dir(tmp_path, "run", "m,rope,ppl,ppl,256,,15,,1,0\n")  # 50 % worse
    rules = tmp_path / "r.toml"
    rules.write_text(f"[tolerance]\n{tol}\n")
    code, _, err = run_cli(["compare", run, "--baseline", base, "--rules", rules], capsys)
    assert_one_line_error(code, err, "not a number")
    rules.write_text(f"[metrics.ppl]\n{tol}\n")
    code, _, err = run_cli(["compare", run, "--baseline", base, "--rules", rules], capsys)
    assert_one_line_error(code, err, "not a number")


def test_12_compare_crash_exits_2_never_1(tmp_path, capsys, monkeypatch):
    from lctx.harness.outputs import compare

    a = run_dir(tmp_path, "a", "m,rope,ppl,ppl,256,,10,,1,0\n")
    monkeypatch.setattr(compare, "compare_runs", lambda *a, **k: 1 / 0)
    code, _, err = run_cli(["compare", a, "--baseline", a], capsys)
    assert_one_line_error(code, err, "ZeroDivisionError")


def test_12_compare_matches_option_sets(make_checkpoint, data, tmp_path, capsys):
    ck = make_checkpoint("rope")
    for d in ("run", "base"):
        sweep(ck, [ppl_task(data)], tmp_path / d)
        sweep(ck, [ppl_task(data, stride=1)], tmp_path / d)
    code, out, err = run_cli(["compare", tmp_path / "run", "--baseline", tmp_path / "base"], capsys)
    assert code == 0 and "PASS" in out, err


# ---------------------------------------------------------------------------------------------------
# 13: a second process on the same --out

def test_13_second_run_refuses_naming_the_pid(make_checkpoint, tmp_path, capsys):
    import fcntl

    out, args = base_run(make_checkpoint, tmp_path, capsys)
    fd = os.open(out / ".lctx.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another holder (flock is per open file)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": 424242, "host": os.uname().nodename}).encode())
    try:
        code, _, err = run_cli(args, capsys)
        assert_one_line_error(code, err, "in use by another lctx run", "PID 424242")
    finally:
        os.close(fd)
    code, _, err = run_cli(args, capsys)  # released: runs (resumes) again
    assert code == 0, err


def test_13_lock_held_by_a_real_process(tmp_path):
    from lctx.harness.run.rundir import run_dir_lock

    out = tmp_path / "o"
    code = ("import sys, time; from lctx.harness.run.rundir import run_dir_lock\n"
            f"with run_dir_lock(__import__('pathlib').Path({str(out)!r})):\n"
            "    print('locked', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(LctxError, match=f"PID {p.pid}"):
            with run_dir_lock(out):
                pass
    finally:
        p.kill()
        p.wait()
    with run_dir_lock(out):  # the kernel dropped the dead holder's lock: no stale lock
        pass


# ---------------------------------------------------------------------------------------------------
# 14: commands that read a checkpoint refuse remote code unless --trust-remote-code

def remote_code_checkpoint(tmp_path) -> tuple[Path, Path]:
    d = tmp_path / "remote"
    d.mkdir()
    marker = tmp_path / "REMOTE_CODE_RAN"
    (d / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_lctx_test'\n")
    (d / "config.json").write_text(json.dumps({"model_type": "evil_lctx_test", "hidden_size": 64,
                                               "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    return d, marker


@pytest.mark.parametrize("cmd", [["plan", "--model", "{d}", "--length", "1k"],
                                 ["run", "--model", "{d}", "--tasks", "passkey", "--lengths", "160"],
                                 ["diagnose", "far-mass", "--model", "{d}", "--lengths", "256"],
                                 ["diagnose", "prior", "--model", "{d}"],
                                 ["bench", "--model", "{d}", "--lengths", "64"]])  # bench --model came later
def test_14_remote_code_is_refused(tmp_path, capsys, cmd, monkeypatch):
    d, marker = remote_code_checkpoint(tmp_path)
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # nobody to answer a prompt
    args = [str(d) if a == "{d}" else a for a in cmd] + ["--out", tmp_path / "o"] * (cmd[0] != "plan")
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "--trust-remote-code")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------
# 15: inputs that were accepted without a word

def test_15_task_file_calling_sys_exit(tmp_path, capsys):
    f = tmp_path / "exits.py"
    f.write_text("import sys\nsys.exit(0)\n")
    code, _, err = run_cli(["run", "--task-file", f, "--tasks", "passkey", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "sys.exit(0)")


def test_15_task_calling_sys_exit_while_scoring_is_an_error_sample(make_checkpoint, tmp_path):
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


def test_15_unknown_variant_option_keys(tmp_path, capsys):
    from lctx.models import LctxConfig

    code, _, err = run_cli(["train", "--option", "bogus_opt=3", "--steps", "1", "--out", tmp_path / "m"], capsys)
    assert_one_line_error(code, err, "bogus_opt", "valid options")
    assert not (tmp_path / "m").exists()
    code, _, err = run_cli(["train", "--variant", "alibi_lsh", "--option", "lsh_sampels=4", "--steps", "1",
                            "--out", tmp_path / "m"], capsys)
    assert_one_line_error(code, err, "lsh_sampels", "lsh_samples (int, default 16)")
    with pytest.raises(ValueError, match="no option 'lsh_sampels'"):
        LctxConfig(variant="alibi_lsh", variant_options={"lsh_sampels": 4})
    with pytest.raises(ValueError, match="not true or false"):
        LctxConfig(variant="ggd_bam", variant_options={"ggd_shared": "false"})  # bool("false") was True
    with pytest.raises(ValueError, match="not an integer"):
        LctxConfig(variant="alibi_lsh", variant_options={"lsh_samples": 4.5})
    with pytest.raises(ValueError, match="one of 'random', 'learned'"):
        LctxConfig(variant="acc_rot", variant_options={"acc_rot_mode": "lerned"})
    LctxConfig(variant="ggd_bam+ssmax", variant_options={"ggd_shared": False, "ssmax_scale_bias": True})


def test_15_every_variant_has_an_option_schema():
    from lctx.models import MODIFIERS, VARIANTS
    from lctx.models.config import option_schema

    for name in list(VARIANTS) + list(MODIFIERS):
        assert option_schema(name) is not None, name


@pytest.mark.parametrize("cmd", ["run", "train"])
def test_15_binary_file_as_text_data(tmp_path, capsys, cmd):
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(4096))
    if cmd == "run":
        args = ["run", "--tasks", "ppl", "--ppl-data", f, "--lengths", "256", "--out", tmp_path / "o"]
    else:
        args = ["train", "--data", f, "--steps", "1", "--out", tmp_path / "m"]
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "not a text file")


def test_15_binary_detection_keeps_real_text():
    from lctx.tasks.textdata import binary_reason

    latin1 = "Caf\u00e9 \u00e0 la cr\u00e8me, na\u00efve. " * 50
    assert binary_reason(latin1.encode("latin-1"), latin1) is None
    assert binary_reason(b"tab\tand\r\nlines\f", "tab\tand\r\nlines\f") is None
    assert "NUL" in binary_reason("hi".encode("utf-16"), "x")


@pytest.mark.parametrize("dist", ["-5", "0"])
def test_15_negative_distance(tmp_path, capsys, dist):
    code, _, err = run_cli(["diagnose", "far-mass", "-m", "x", f"--distance={dist}", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "--distance")


def test_15_distance_beyond_every_length(tmp_path, capsys):
    code, _, err = run_cli(["diagnose", "far-mass", "-m", "x", "--distance", "4096", "--lengths", "256,512",
                            "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "--distance 4096", "longest length 512")


@pytest.mark.parametrize("flag,value", [("--lengths", "256,,512"), ("--lengths", "256,"), ("--depths", "0,,1"),
                                        ("--tasks", "passkey,,ppl"), ("--relative", "1,,2")])
def test_15_empty_list_entries(tmp_path, capsys, flag, value):
    code, _, err = run_cli(["run", flag, value, "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "empty entry")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------------
# 16: messages that misled


def test_16_hidden_size_mismatch_is_one_line(make_checkpoint, tmp_path, capsys):
    ck = edited_checkpoint(make_checkpoint, hidden_size=64)
    code, out, err = run_cli(["run", "-m", ck, "--tasks", "passkey", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "do not match its config.json", "MISMATCH")
    assert "LOAD REPORT" not in out + err


def test_16_nonpositive_max_position_embeddings(make_checkpoint, tmp_path, capsys):
    ck = edited_checkpoint(make_checkpoint, max_position_embeddings=-5)
    code, _, err = run_cli(["run", "-m", ck, "--tasks", "passkey", "--lengths", "160", "--out", tmp_path / "o"],
                           capsys)
    assert_one_line_error(code, err, "max_position_embeddings = -5", "not a positive number")
    assert "<= -5" not in err


def test_16_unknown_variant_in_config_is_not_called_corrupt_weights(make_checkpoint, tmp_path, capsys):
    ck = edited_checkpoint(make_checkpoint, variant="ropey")
    code, _, err = run_cli(["run", "-m", ck, "--tasks", "passkey", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "unknown attention variant 'ropey'", "config.json")
    assert "corrupt" not in err


def test_16_ctrl_c_prints_the_resume_hint(make_checkpoint, tmp_path, capsys):
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
def test_16_sigint_and_sigterm_in_a_real_process(make_checkpoint, tmp_path):
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


def test_16_failure_summary_counts_what_it_leaves_out(make_checkpoint, tmp_path, capsys):
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
    assert code == 0  # one sample succeeded
    assert err.count("failed (1 sample)") == 5
    assert "and 2 more distinct error messages (2 samples) not shown" in err


def test_16_rejected_command_creates_no_out_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["run", "--tasks", "passkay"], capsys)
    assert_one_line_error(code, err, "unknown task 'passkay'")
    assert not (tmp_path / "lctx-out").exists()
    code, _, err = run_cli(["train", "--variant", "ropey", "--steps", "1", "--out", tmp_path / "m"], capsys)
    assert code == 2 and not (tmp_path / "m").exists()


# ---------------------------------------------------------------------------------------------------
# 17: a needle depth that cannot be honoured

def test_17_niah_without_sentence_boundaries_falls_back_to_words(make_checkpoint, tmp_path):
    from lctx.tasks import Cell, get_task
    from lctx.tasks.niah import NIAHBuilder

    root = ruler_data(tmp_path / "d", "aaa bbb ccc " * 100)
    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    task = get_task("niah_single_2")(data_dir=root, cache=False)
    s = task.build(lm, Cell(256, 0.5, 0), 0)
    assert s.meta["needle_boundaries"] == "word"
    b = NIAHBuilder(task, lm, Cell(256, 0.5, 0), 0)
    n = b.fit()
    text, pos, where = b.prompt(n)
    # the needle goes before haystack word `where` of n (was word 0: before the first word, for depth 0.5)
    assert abs(where[0] / n - 0.5) <= max(DEPTH_TOLERANCE, 1 / n), (where, n)  # the nearest word
    assert s.depth > 0.35  # the depth_actual was 0.218, the template's share of the prompt
    assert text[pos[0] - 4: pos[0]] in ("aaa ", "bbb ", "ccc ")  # between two haystack words


def test_17_depth_off_flag_column_and_heatmap(make_checkpoint, tmp_path):
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


@pytest.mark.slow
def test_12_compare_a_real_arc_run_and_7_lmeval_nan_model(data_dir, make_checkpoint, tmp_path, capsys):
    # the command: lctx run --tasks arc_easy --limit 3 --data-dir DATA --out arc; lctx compare arc --baseline arc
    arc = tmp_path / "arc"
    common = ["--tasks", "arc_easy", "--limit", "3", "--data-dir", data_dir, "--no-progress"]
    code, _, err = run_cli(["run", "-m", make_checkpoint("rope"), *common, "--out", arc], capsys)
    assert code == 0, err
    code, out, err = run_cli(["compare", arc, "--baseline", arc], capsys)
    assert code == 0 and "PASS" in out, err
    # lm-eval's model calls go through the same finite-logits check: a NaN model fails every question
    code, _, err = run_cli(["run", "-m", nan_checkpoint(make_checkpoint, "layer0"), *common, "--out",
                            tmp_path / "nan"], capsys)
    assert code == EXIT_ALL_FAILED, err
    t = pd.read_csv(tmp_path / "nan" / "results.csv")
    assert (t["status"] == "error").all() and t["error"].str.contains("NonFiniteLogitsError|logits").all()


def test_5_display_names_split_options_but_not_derived_metrics():
    rows = [dict(model="m", task="ppl", metric="ppl", task_options=json.dumps({"stride": s, "bos": "prepend"}),
                 variant="rope", dtype="float32", attn_impl="sdpa", seed=0) for s in (0.5, 1)]
    rows += [dict(model="m", task="flatness", metric=m, task_options=json.dumps({"criterion": m}), variant="rope",
                  dtype="float32", attn_impl="sdpa", seed=0) for m in ("flat_until", "effective_length")]
    names = list(label_names(pd.DataFrame(rows)))
    assert names == ["m [stride=0.5]", "m [stride=1]", "m", "m"]


def test_15_bench_option_goes_to_the_variants_that_take_it(tmp_path, capsys):
    from lctx.harness.commands.bench import make_config

    assert make_config("rope", "sdpa", 1, 16, {"lsh_samples": 4}).variant_options == {}
    assert make_config("alibi_lsh", "sdpa", 1, 16, {"lsh_samples": 4}).variant_options == {"lsh_samples": 4}
    code, _, err = run_cli(["bench", "--variants", "rope,alibi_lsh", "--option", "lsh_sampels=4", "--lengths", "64",
                            "--out", tmp_path / "b"], capsys)
    assert_one_line_error(code, err, "lsh_sampels", "not an option of any variant")
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------------------------------------------
# Inputs that main gained after the first pass (GGUF loading, RULER's vt/cwe/fwe/qa, the ruler group)


def rewrite_same_size_same_mtime(path: Path, new: bytes) -> None:
    st = os.stat(path)
    assert len(new) == st.st_size
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_3_ruler_tasks_put_their_data_files_in_the_key(tmp_path):
    # RulerTask kept its files in an attribute named data_files, which hid Task.data_files(): every
    # `lctx run --tasks vt|cwe|fwe|qa_1|qa_2|ruler` died with TypeError "'dict' object is not callable"
    from lctx.tasks import get_task

    root = ruler_qa_data(tmp_path / "d")
    for name in ("vt", "fwe"):  # generated from a seed: no data file
        assert get_task(name)().data_fingerprint() is None
    cwe, qa = get_task("cwe")(data_dir=root, cache=False), get_task("qa_1")(data_dir=root, cache=False)
    assert set(cwe.data_files()) == {"ruler/wonderwords/nounlist.txt", "ruler/wonderwords/adjectivelist.txt",
                                     "ruler/wonderwords/verblist.txt", "ruler/PaulGrahamEssays.json"}
    assert set(qa.data_files()) == {"qa"}
    niah = get_task("niah_single_2")(data_dir=root, cache=False)  # NIAH's essay haystack
    assert "ruler/PaulGrahamEssays.json" in niah.data_files()  # and the word lists of its keys
    fps = {"cwe": cwe.data_fingerprint(), "qa_1": qa.data_fingerprint(), "niah": niah.data_fingerprint()}
    assert all(isinstance(v, str) and len(v) == 16 for v in fps.values())
    noun = root / "ruler" / "wonderwords" / "nounlist.txt"
    rewrite_same_size_same_mtime(noun, noun.read_bytes().upper())
    squad = root / "squad" / "dev-v2.0.json"
    rewrite_same_size_same_mtime(squad, squad.read_bytes().replace(b"market town", b"harbor town"))
    assert get_task("cwe")(data_dir=root, cache=False).data_fingerprint() != fps["cwe"]
    assert get_task("qa_1")(data_dir=root, cache=False).data_fingerprint() != fps["qa_1"]
    essay = root / "ruler" / "PaulGrahamEssays.json"
    rewrite_same_size_same_mtime(essay, essay.read_bytes().replace(b"the sea", b"the air"))
    assert get_task("niah_single_2")(data_dir=root, cache=False).data_fingerprint() != fps["niah"]


@pytest.mark.slow
def test_3_ruler_qa_data_change_reruns_through_the_runner(make_checkpoint, tmp_path):
    from lctx.tasks import get_task

    root = ruler_qa_data(tmp_path / "d")
    ck, out = make_checkpoint("rope"), tmp_path / "o"
    lm = load_lm(str(ck), device="cpu")

    def qa():
        return get_task("qa_1")(data_dir=root, cache=False, max_new_tokens=2)

    length = qa().min_length(lm) + 64
    first = run_sweep([lm], [qa()], RunSpec([length], [0.5], 1), out, progress=False)
    assert first["ran"] == 1 and first["errors"] == 0, first["table"][["status", "error"]]
    again = run_sweep([lm], [qa()], RunSpec([length], [0.5], 1), out, progress=False)
    assert again["ran"] == 0  # unchanged inputs resume
    squad = root / "squad" / "dev-v2.0.json"
    rewrite_same_size_same_mtime(squad, squad.read_bytes().replace(b"market town", b"harbor town"))
    third = run_sweep([lm], [qa()], RunSpec([length], [0.5], 1), out, progress=False)
    assert third["ran"] == 1 and third["superseded"] == 1  # the old record leaves the tables
    assert third["table"]["data_fingerprint"].nunique() == 1
    meta = json.loads((out / "run.json").read_text())
    assert meta["inputs"]["data"]["qa_1"] == third["table"]["data_fingerprint"].iloc[0]


@pytest.mark.slow
def test_1_gguf_content_is_the_model_fingerprint(tmp_path, monkeypatch):
    from gguf_tiny import write_tiny_gguf

    monkeypatch.setenv("LCTX_CACHE_DIR", str(tmp_path / "cache"))
    g = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = tmp_path / "doc.txt"
    data.write_text(TEXT)
    out = tmp_path / "o"
    first = sweep(g, [ppl_task(data)], out, cache_dir=str(tmp_path / "cache"))
    assert first["ran"] == 1
    meta = json.loads((out / "run.json").read_text())
    assert meta["inputs"]["models"]["tiny"]["files"] == {"tiny.gguf": F.file_digest(g)}  # the GGUF's own bytes
    st = os.stat(g)
    write_tiny_gguf(g, seed=1)  # other weights, same size; mtime put back as cp -p leaves it
    os.utime(g, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(g).st_size == st.st_size
    second = sweep(g, [ppl_task(data)], out, cache_dir=str(tmp_path / "cache"))
    assert second["ran"] == 1 and second["superseded"] == 1
    assert value(second, "ppl", "ppl") != value(first, "ppl", "ppl")
    # byte-identical copy elsewhere, same stem: the same fingerprint, so a run there would resume
    (tmp_path / "copy").mkdir()
    shutil.copy2(g, tmp_path / "copy" / "tiny.gguf")
    again = sweep(tmp_path / "copy" / "tiny.gguf", [ppl_task(data)], out, cache_dir=str(tmp_path / "cache"))
    assert again["ran"] == 0


def ruler_run_dir(root: Path, name: str, niah: tuple[float, float], threshold: float = 50.0) -> Path:
    """A run directory whose tables hold task rows and the ruler group's derived rows (average per length and
    an effective_length row without a length), made by the same code as `lctx run --tasks ruler`."""
    from lctx.harness.steps import ruler as group

    d = root / name
    d.mkdir()
    recs = []
    for L, v in zip((1024, 2048), niah):
        for task, metric, depth in (("niah_single_1", "string_match_all", 0.5), ("cwe", "string_match_all", None)):
            recs.append({"model": "m", "variant": "llama", "task": task, "length": L, "depth": depth, "sample": 0,
                         "metrics": {metric: v}, "status": "ok", "error": "", "seed": 0, "task_options": {},
                         "train_length": None})
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    group.write_tables_with_ruler(d, group.RulerSpec(threshold=threshold, tasks=("niah_single_1", "cwe")))
    return d


def test_12_compare_ruler_runs_with_a_lengthless_effective_length(tmp_path, capsys):
    good = ruler_run_dir(tmp_path, "good", (0.9, 0.8))  # averages 90, 80: effective length 2048
    worse = ruler_run_dir(tmp_path, "worse", (0.9, 0.1))  # 90, 10: effective length 1024
    s = pd.read_csv(good / "summary.csv")
    eff = s[s["metric"] == "effective_length"]
    assert len(eff) == 1 and pd.isna(eff["length"].iloc[0]) and eff["mean"].iloc[0] == 2048
    code, out, err = run_cli(["compare", good, "--baseline", good], capsys)
    assert code == 0 and "PASS" in out, err
    code, out, err = run_cli(["compare", worse, "--baseline", good], capsys)
    assert code == 1 and "regression" in out and "Traceback" not in err  # a regression, not a crash
    table = pd.read_csv(tmp_path / "worse" / "compare" / "compare.csv")
    regressed = table[table["status"] == "regression"]
    assert {"effective_length", "average"} <= set(regressed["metric"])
    # an errored effective_length (empty mean, n = 0) is an error cell, not a crash
    s.loc[s["metric"] == "effective_length", ["mean", "n", "n_error"]] = [None, 0, 1]
    s.to_csv(worse / "summary.csv", index=False)
    code, out, err = run_cli(["compare", worse, "--baseline", good], capsys)
    assert code == 1 and "Traceback" not in err and "1 errored" in out
    table = pd.read_csv(tmp_path / "worse" / "compare" / "compare.csv")
    assert table.set_index("metric").loc["effective_length", "status"] == "error"


@pytest.mark.slow
def test_7_nan_model_is_an_error_in_the_ruler_tasks(make_checkpoint, tmp_path):
    # vt/cwe/fwe/qa score by greedy generation (HFAdapter.prefill + HFAdapter.greedy): the same shared check applies
    from lctx.tasks import get_task

    ck = nan_checkpoint(make_checkpoint, "layer0")
    root = ruler_qa_data(tmp_path / "d")
    lm = load_lm(str(ck), device="cpu")
    tasks = [get_task("vt")(max_new_tokens=2, cache=False), get_task("qa_1")(data_dir=root, cache=False,
                                                                             max_new_tokens=2)]
    length = max(t.min_length(lm) for t in tasks) + 32
    res = run_sweep([lm], tasks, RunSpec([length], [0.5], 1), tmp_path / "o", progress=False)
    t = res["table"]
    assert set(t["task"]) == {"vt", "qa_1"} and res["errors"] == 2
    assert (t["status"] == "error").all() and t["error"].str.contains("non-finite logits").all()


def test_4_ruler_average_uses_only_the_current_inputs_records(tmp_path):
    # after a retrain into the same --out, the derived ruler rows average the new weights' records only
    from lctx.harness.steps import ruler as group
    from lctx.harness.run.tables import label_of

    d = tmp_path / "o"
    d.mkdir()
    recs, current = [], {}
    for fp, v in (("old", 1.0), ("new", 0.2)):
        for task, depth in (("niah_single_1", 0.5), ("cwe", None)):
            r = {"model": "m", "variant": "llama", "task": task, "length": 1024, "depth": depth, "sample": 0,
                 "metrics": {"string_match_all": v}, "status": "ok", "error": "", "seed": 0, "task_options": {},
                 "train_length": None, "fingerprint": fp, "model_fingerprint": fp}
            recs.append(r)
            current[label_of(r)] = "new"
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "run.json").write_text(json.dumps({"current": current}))
    table, summary = group.write_tables_with_ruler(d, group.RulerSpec(threshold=50.0, tasks=("niah_single_1", "cwe")))
    avg = summary[(summary["task"] == "ruler") & (summary["metric"] == "average")]
    assert len(avg) == 1 and avg["mean"].iloc[0] == pytest.approx(20.0)  # 100 x 0.2, not (100 + 20) / 2
    assert (summary[summary["task"] != "ruler"]["n"] == 1).all()


def test_3_in_process_data_caches_follow_the_content(tmp_path):
    # the parsed-data caches of NIAH/RULER were keyed by path (qa: path, size and mtime): within one process a
    # file rewritten in place was served stale while the record's fingerprint named the new content
    from lctx.tasks import niah as N
    from lctx.tasks import ruler as R
    from lctx.tasks.ruler_qa import load_qa

    root = ruler_qa_data(tmp_path / "d")
    squad = root / "squad" / "dev-v2.0.json"
    noun = root / "ruler" / "wonderwords" / "nounlist.txt"
    essay = root / "ruler" / "PaulGrahamEssays.json"
    before = (load_qa(squad, "squad", "qa_1").docs, N.load_words(str(root)), R.load_cwe_words(str(root)),
              N._file_digest(str(essay)), R.load_essay_words(str(root), ()))
    rewrite_same_size_same_mtime(squad, squad.read_bytes().replace(b"market town", b"harbor town"))
    rewrite_same_size_same_mtime(noun, noun.read_bytes().upper())
    rewrite_same_size_same_mtime(essay, essay.read_bytes().replace(b"the sea", b"the air"))
    after = (load_qa(squad, "squad", "qa_1").docs, N.load_words(str(root)), R.load_cwe_words(str(root)),
             N._file_digest(str(essay)), R.load_essay_words(str(root), ()))
    for what, a, b in zip(("qa docs", "niah words", "cwe words", "essay digest", "essay words"), before, after):
        assert a != b, what
    assert any("harbor town" in d for d in after[0]) and "air" in after[4] and "air" not in before[4]


# ---------------------------------------------------------------------------------------------------
# issue 25 item 2: records that cannot be forged into a mean (F2, F3)

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
def test_25_F2_forged_duplicate_leaves_the_mean_and_is_named(make_checkpoint, tmp_path, capsys, how, kind):
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
def test_25_F3_record_of_a_model_the_run_never_ran(make_checkpoint, tmp_path, capsys, resign):
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
def test_25_tampered_record_of_a_known_invocation_is_left_out(make_checkpoint, tmp_path, capsys, edit):
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


def test_25_legitimate_resumed_run_keeps_all_its_records(make_checkpoint, tmp_path, capsys):
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


def test_25_legacy_records_without_digest_still_load(make_checkpoint, tmp_path, capsys):
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


def test_25_compare_from_records_leaves_forged_records_out(tmp_path, capsys):
    # lctx compare summarising a run directory that has only records.jsonl: the same checks
    from lctx.harness.outputs.compare import load_summary
    from lctx.harness.run.rundir import SALT, sign_record

    def rec(model, value, inv="i1"):
        return {"model": model, "variant": "rope", "task": "passkey", "length": 256, "depth": 0.5, "sample": 0,
                "seed": 0, "task_options": {}, "status": "ok", "error": "", "fingerprint": "fp",
                "metrics": {"exact": value}, "run_id": "r", "invocation": inv}

    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"run_id": "r", "invocations": [{"id": "i1", SALT: "s"}],
                                            "inputs": {"models": {"m": {}}}}))
    good = sign_record(rec("m", 0.0), "s")
    lines = [good, sign_record(rec("m", 1.0), "s"), rec("m", 1.0, inv="x"), sign_record(rec("other", 1.0), "s"),
             dict(good, metrics={"exact": 1.0})]
    (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    s = load_summary(d)
    assert list(s["model"]) == ["m"] and list(s["mean"].astype(float)) == [0.0] and list(s["n"].astype(int)) == [1]
    err = capsys.readouterr().err
    assert len(_left_out(err)) == 4, err  # one line per kind: duplicate, invocation, model, digest


def test_25_F2_depth_spelled_as_an_int_is_the_same_sample():
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


def test_25_report_and_compare_name_records_appended_after_the_run(make_checkpoint, tmp_path, capsys):
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


def test_25_one_warning_per_kind_when_one_run_has_two_sweeps(make_checkpoint, tmp_path, capsys):
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
