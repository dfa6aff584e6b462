"""lctx.harness.run.rundir: a run directory read and written safely. Damaged record lines are skipped and
rerun; a damaged run.json, or a records file that is a directory or a device, is one line; a full disk keeps
what finished; tables are written atomically; one process at a time holds a directory (the lock); run.json
records every invocation into the directory."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from helpers import _records, assert_one_line_error, base_run, run_cli
from lctx.errors import LctxError

#: every test here runs with no data dir from the environment and its own digest cache (conftest.py)
pytestmark = pytest.mark.usefixtures("isolated_digests")


@pytest.mark.parametrize("garbage", [bytes(range(256)) + os.urandom(44), b"[1,2,3]\n", b'{"foo":1}\n',
                                     b'{"status":"ok"}\n'])
def test_damaged_record_lines_are_skipped_counted_and_rerun(make_checkpoint, tmp_path, capsys, garbage):
    """Issue 10 item 9: damaged lines of records.jsonl are skipped, counted, and their samples rerun."""
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


def test_damaged_run_json_is_one_line(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 9: a damaged run.json is one line naming its line; no record is lost."""
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    (out / "run.json").write_text("{bad")
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "run.json", "line 1")
    assert len((out / "records.jsonl").read_text().splitlines()) == 1  # nothing lost


def test_records_file_that_is_a_directory(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 9: a records.jsonl that is a directory is one line."""
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    (out / "records.jsonl").unlink()
    (out / "records.jsonl").mkdir()
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "records.jsonl", "a directory")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("chattr") is None, reason="chattr +i needs root")
def test_immutable_records_file(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 9: an immutable records.jsonl (chattr +i) is one line; its records are kept."""
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


def test_full_disk_keeps_what_finished_and_resumes(make_checkpoint, tmp_path, capsys, monkeypatch):
    """Issue 10 item 10: a full disk keeps the finished samples; the rerun resumes past the torn line."""
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


def test_failed_table_write_leaves_the_old_table(tmp_path, monkeypatch):
    """Issue 10 item 10: a table write that fails leaves the previous table and no temporary file."""
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
def test_device_as_records_file_is_refused(make_checkpoint, tmp_path, capsys, device):
    """Issue 10 item 11: a device (/dev/full, /dev/zero) as records.jsonl is refused in one line."""
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    out, args = base_run(make_checkpoint, tmp_path, capsys)
    (out / "records.jsonl").unlink()
    (out / "records.jsonl").symlink_to(device)
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "records.jsonl", "character device")


def test_second_run_refuses_naming_the_pid(make_checkpoint, tmp_path, capsys):
    """Issue 10 item 13: a second lctx run on a held --out refuses, naming the holder's PID."""
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


def test_lock_held_by_a_real_process(tmp_path):
    """Issue 10 item 13: a real process's lock is seen, and the kernel drops it when the process dies."""
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


def test_every_invocation_into_one_dir_is_in_run_json(capsys, make_checkpoint, tmp_path):
    """Trial 21 item 1: run.json lists every invocation into one directory, and each record names its own."""
    out = tmp_path / "o"
    ck = make_checkpoint()
    args = ["run", "--model", ck, "--tasks", "passkey", "--depths", "0.5", "--samples", "1", "--out", out,
            "--no-progress"]
    assert run_cli(args + ["--lengths", "200"], capsys)[0] == 0
    first = json.loads((out / "run.json").read_text())
    assert run_cli(args + ["--lengths", "256"], capsys)[0] == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["run_id"] == first["run_id"]
    invs = meta["invocations"]
    assert len(invs) == 2 and invs[0] == first["invocations"][0]
    assert invs[0]["lengths"] == [200] and invs[1]["lengths"] == [256]
    assert invs[0]["id"] != invs[1]["id"] and all(i["started"] and i["argv"] for i in invs)
    by_len = {r["length"]: r["invocation"] for r in _records(out)}
    assert by_len == {200: invs[0]["id"], 256: invs[1]["id"]}


def test_one_run_with_two_sweeps_is_one_invocation(capsys, make_checkpoint, tmp_path):
    """Trial 21 item 1: one lctx run of two sweeps (--window) is one invocation entry with both tasks' settings."""
    # --window gives ppl its own sweep beside passkey's: one `lctx run`, one entry with both tasks' settings
    out = tmp_path / "o"
    text = tmp_path / "doc.txt"
    text.write_text("The module documents every function it exports. " * 60)
    code, _, err = run_cli(["run", "--model", make_checkpoint(), "--tasks", "passkey,ppl", "--lengths", "200",
                            "--window", "64", "--ppl-data", text, "--depths", "0.5", "--samples", "1", "--out", out,
                            "--no-progress"], capsys)
    assert code == 0, err
    invs = json.loads((out / "run.json").read_text())["invocations"]
    assert len(invs) == 1 and invs[0]["tasks"] == ["passkey", "ppl"] and invs[0]["lengths"] == [200, 64]
    assert {r["invocation"] for r in _records(out)} == {invs[0]["id"]}


# ---------------------------------------------------------------------------------------------- outside text (issue 42)

PLANTED = "planted-key-9f8e7d6c5b4a"


@pytest.fixture
def planted():
    from lctx import outside

    outside.forget_secrets()
    outside.register_secret(PLANTED)
    yield PLANTED
    outside.forget_secrets()


def test_a_signed_record_is_redacted_and_its_digest_matches_the_line(tmp_path, planted):
    """Issue 42 item 1: a record whose error quotes a server echoing the key, whose task option and model id hold it:
    the line written holds no key, and the digest was taken of what was written, so the tables still vouch for it
    (vet_records keeps it). Control: a record edited after signing is still caught."""
    from lctx.harness.run.rundir import DIGEST, RecordWriter, read_records, record_digest, sign_record
    from lctx.harness.run.tables import vet_records

    rec = {"model": f"m-{planted}", "task": "passkey", "status": "error", "metrics": {"exact": None}, "sample": 0,
           "length": 256, "depth": 0.5, "invocation": "inv", "task_options": {"haystack": f"/data/{planted}.txt"},
           "error": f"http://h/v1: a greedy completion failed with HTTP 401 (Incorrect API key provided: {planted})"}
    with RecordWriter(tmp_path / "records.jsonl") as w:
        w.write(sign_record(rec, "salt"))
    raw = (tmp_path / "records.jsonl").read_bytes()
    assert planted.encode() not in raw and b"[redacted]" in raw
    back = read_records(tmp_path / "records.jsonl")
    assert back[0][DIGEST] == record_digest(back[0], "salt")
    meta = {"invocations": [{"id": "inv", "record_salt": "salt"}]}
    assert vet_records(back, meta) == back
    edited = dict(back[0], error="edited")
    assert vet_records([edited], meta) == []


def test_record_writer_redacts_even_an_unsigned_record(tmp_path, planted):
    """The writer is the last sink: a record that reached it without sign_record is redacted all the same."""
    from lctx.harness.run.rundir import RecordWriter

    with RecordWriter(tmp_path / "records.jsonl") as w:
        w.write({"error": f"Bearer {planted}", "reason": "sk-" + "a" * 30})
    raw = (tmp_path / "records.jsonl").read_text()
    assert planted not in raw and "sk-aaaa" not in raw and raw.count("[redacted]") == 2


def test_run_json_and_the_lock_file_hold_no_key(tmp_path, planted, monkeypatch):
    """run.json (atomic_write_json): the trust probe's reason quoting the key, a key in a dict key and in a value JSON
    cannot hold; the lock file's command line (argv) too. Control: the rest of run.json is as given."""
    from lctx.harness.run.rundir import LOCK_NAME, atomic_write_json, run_dir_lock

    class Odd:
        def __str__(self):
            return f"odd {planted}"

    meta = {"inputs": {"models": {"m": {"server": {"trust_probe": {"ok": False, "reason": f"HTTP 403 ({planted})"}}}}},
            planted: 1, "odd": Odd(), "lengths": [256]}
    atomic_write_json(tmp_path / "run.json", meta)
    text = (tmp_path / "run.json").read_text()
    assert planted not in text and json.loads(text)["lengths"] == [256] and "odd [redacted]" in text
    monkeypatch.setattr(sys, "argv", ["lctx", "run", "--model", f"http://h/v1?key={planted}"])
    with run_dir_lock(tmp_path / "out"):
        assert planted not in (tmp_path / "out" / LOCK_NAME).read_text()


def test_a_hostile_lock_file_is_quoted_capped(tmp_path):
    """A lock file's holder fields are outside text (another process, or anyone, wrote them): the refusal quotes each
    capped and escaped, never a megabyte or a terminal control."""
    from lctx.harness.run.rundir import LOCK_NAME, _holder

    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": "1\x1b]0;x\x07" + "9" * 100_000, "host": "h" * 10_000,
                                                  "started": "\x1b[2J now"}))
    got = _holder(tmp_path / LOCK_NAME)
    assert len(got) < 400 and "\x1b" not in got and "\x07" not in got and "left out" in got, got[:300]
