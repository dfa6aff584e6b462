"""The CLI as a Unix user drives it: a reader that goes away (``lctx ... | head -1``) and an unwritable ``--out``
(refused while the arguments are parsed, before torch or a model loads)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import typer

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
    # Python's default: BrokenPipeError -> a traceback and exit 1 (or "Exception ignored" and 120 at exit)
    p = _closed_reader(["list", "tasks"])
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr and "Exception ignored" not in p.stderr


def _summary(ppl: float) -> pd.DataFrame:
    return pd.DataFrame([("tiny", "rope", "ppl", "ppl", 256, math.nan, ppl, math.nan, 1, 0)],
                        columns=["model", "variant", "task", "metric", "length", "depth", "mean", "stderr", "n",
                                 "n_error"])


def test_closed_stdout_still_writes_files_and_the_gate_verdict(tmp_path):
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
    # the Python API as the CLI: lctx.evaluate(out=...) refuses an unwritable directory before importing torch
    (tmp_path / "afile").write_text("x")
    code = ("import sys, lctx\n"
            f"try:\n    lctx.evaluate(out={str(tmp_path / 'afile' / 'out')!r})\n"
            "except lctx.LctxError as e:\n    print('refused:', e, 'torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("refused: cannot write to --out") and p.stdout.strip().endswith("False"), p.stdout


def test_empty_out_is_refused_by_every_command(tmp_path):
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
