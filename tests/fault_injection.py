"""Fault injection for lctx run directories (issue 10): kill runs, damage their files, change their inputs,
and check that every number still comes from the inputs named beside it.

Run it (several minutes: each check starts real ``lctx`` processes on the bundled tiny checkpoint)::

    python tests/fault_injection.py [--kills 8] [--seed 0] [--keep DIR] [--only SECTION ...]

It prints one line per check, ``[held]`` or ``[FAILED]``, with what was tried and what was seen, then the
counts: tried, held, failed. Exit status 0 when everything held, 1 otherwise. Checks that need root
(``chattr +i``, a small tmpfs for a full disk) fall back or say they were skipped.

Not collected by pytest (no ``test_`` prefix): the unit tests of the same faults
are issue 10's tests in ``test_rundir.py``, ``test_runner.py``, ``test_tables.py`` and ``test_cli.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "models" / "checkpoints" / "pydoc-tiny-rope"
LCTX = [sys.executable, "-m", "lctx.cli"]
VOLATILE = ["run_id", "wall_s", "cpu_s", "peak_mem_bytes", "timestamp", "git_rev"]
TEXT = ("Every module documents the functions it exports. A function takes arguments and returns a value, "
        "which may be None when nothing is returned. The examples below show a call and its result. ") * 20


SECTIONS = ("inputs", "damage", "full_disk", "others", "kills", "issue25")


class Report:
    """Counts of checks that held and failed, printed as they go."""

    def __init__(self):
        self.held, self.failed, self.skipped = [], [], []

    def check(self, what: str, ok: bool, seen: str) -> bool:
        (self.held if ok else self.failed).append(what)
        print(f"[{'held' if ok else 'FAILED'}] {what}: {seen}", flush=True)
        return ok

    def skip(self, what: str, why: str) -> None:
        self.skipped.append(what)
        print(f"[skipped] {what}: {why}", flush=True)

    def summary(self) -> str:
        n = len(self.held) + len(self.failed)
        return (f"tried {n} checks: {len(self.held)} held, {len(self.failed)} failed"
                + (f", {len(self.skipped)} skipped" if self.skipped else "")
                + ("" if not self.failed else "\nfailed: " + "; ".join(self.failed)))


def lctx(*args, timeout=900, preexec=None, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(LCTX + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec, stdin=stdin)


def one_line_error(p: subprocess.CompletedProcess) -> bool:
    """Exit 2 with exactly one ``error:`` line, the last on stderr, and no traceback. Notes and warnings before
    it (``note: this machine is busy ...`` on a loaded machine, ``dequantised X ...``, a flag no task uses) are
    not errors."""
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    return p.returncode == 2 and len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in p.stderr


def tail(p: subprocess.CompletedProcess) -> str:
    err = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return f"exit {p.returncode}; " + (err[-1][:220] if err else "(no stderr)")


def counts(p: subprocess.CompletedProcess) -> tuple[int, int] | None:
    """(samples run, samples resumed) from lctx run's last line, or None."""
    import re

    m = re.search(r"(\d+) samples? run, (\d+) resumed", p.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def table(out: Path) -> pd.DataFrame:
    t = pd.read_csv(out / "results.csv")
    return t.drop(columns=[c for c in VOLATILE if c in t.columns]).sort_values(
        ["task", "metric", "length", "depth", "sample"]).reset_index(drop=True)


def ppl_of(out: Path) -> float:
    s = pd.read_csv(out / "summary.csv")
    return float(s[(s["task"] == "ppl") & (s["metric"] == "ppl")]["mean"].iloc[0])


def n_of(out: Path) -> set:
    return set(pd.read_csv(out / "summary.csv")["n"])


class Lab:
    """A scratch folder with a copy of the bundled checkpoint (``cp -rp``) and a text file."""

    def __init__(self, root: Path):
        self.root = root
        self.ck = root / "m"
        shutil.copytree(BUNDLED, self.ck, copy_function=shutil.copy2)
        self.data = root / "f.txt"
        self.data.write_text(TEXT)

    def args(self, out: Path, *extra, tasks="passkey,ppl", lengths="256", depths="0.5", samples=1):
        return ["run", "-m", self.ck, "--tasks", tasks, "--lengths", lengths, "--depths", depths, "--samples",
                samples, "--ppl-data", self.data, "--ppl-max-tokens", 1024, "--device", "cpu", "--no-progress",
                "--out", out, *extra]

    def rewrite_weights_same_size(self, scale=3.0):
        from safetensors.torch import load_file, save_file

        path = self.ck / "model.safetensors"
        st = os.stat(path)
        t = load_file(path)
        for k in t:
            if "q_proj" in k or "embed" in k:
                t[k] = t[k] * scale
        save_file(t, path, metadata={"format": "pt"})
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p / rsync -a leave it
        return os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


# ------------------------------------------------------------------------------------------------ kills

def kills(lab: Lab, rep: Report, n_kills: int, rng: random.Random) -> None:
    grid = dict(lengths="256,384", depths="0,0.5,1", samples=2)
    ref = lab.root / "ref"
    t0 = time.time()
    p = lctx(*lab.args(ref, **grid))
    full_s = time.time() - t0
    if not rep.check("uninterrupted reference run", p.returncode == 0, tail(p)):
        return
    out = lab.root / "killed"
    sigs = [signal.SIGKILL] * n_kills + [signal.SIGINT, signal.SIGTERM] * max(1, n_kills // 4)
    rng.shuffle(sigs)
    codes = []
    for sig in sigs:
        proc = subprocess.Popen(LCTX + [str(a) for a in lab.args(out, **grid)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                # as from a terminal (this script may run as `cmd &`, which ignores SIGINT)
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(rng.uniform(0.3, 1.0) * full_s)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=600)
        codes.append((sig, proc.returncode, "rerun the same command to resume" in err, "Traceback" in err))
    finished = [c for c in codes if c[1] == 0]
    hinted = all(hint for sig, code, hint, tb in codes if sig != signal.SIGKILL and code in (130, 143))
    rep.check(f"{len(sigs)} signals at random points ({sigs.count(signal.SIGKILL)} SIGKILL, "
              f"{len(sigs) - sigs.count(signal.SIGKILL)} SIGINT/SIGTERM): Ctrl-C/TERM print the resume hint",
              hinted and not any(tb for *_, tb in codes),
              f"exit codes {sorted({c[1] for c in codes})}, {len(finished)} runs finished before their signal")
    p = lctx(*lab.args(out, **grid))
    ok = p.returncode == 0
    same = False
    if ok:
        a, b = table(ref), table(out)
        same = a.equals(b)
        dup = b.duplicated(["model", "task", "metric", "length", "depth", "sample"]).any()
    rep.check("resume after the kills gives the uninterrupted table (no row lost, none twice)",
              ok and same and not dup, tail(p) if not ok else f"{len(table(out))} rows, identical: {same}")


# ------------------------------------------------------------------------------------------------ inputs

def input_changes(lab: Lab, rep: Report) -> None:
    out = lab.root / "inputs"
    p = lctx(*lab.args(out, tasks="ppl"))
    if not rep.check("base run for the input changes", p.returncode == 0, tail(p)):
        return
    base = ppl_of(out)

    p = lctx(*lab.args(out, tasks="ppl"))
    rep.check("rerun with nothing changed resumes", p.returncode == 0 and counts(p) == (0, 1),
              p.stdout.strip().splitlines()[-1] if p.stdout.strip() else tail(p))

    os.utime(lab.ck / "model.safetensors")  # touch: same content
    p = lctx(*lab.args(out, tasks="ppl"))
    rep.check("touch model.safetensors (same bytes) still resumes", counts(p) == (0, 1),
              p.stdout.strip().splitlines()[-1] if p.stdout.strip() else tail(p))

    same = lab.rewrite_weights_same_size()
    p = lctx(*lab.args(out, tasks="ppl"))
    fresh = lab.root / "fresh_w"
    lctx(*lab.args(fresh, tasks="ppl"))
    rep.check("new weights, same size, mtime restored to the ns: rerun, table = a fresh run, n = 1",
              same and counts(p) == (1, 0) and ppl_of(out) == ppl_of(fresh) != base and n_of(out) == {1},
              f"ppl {base:.3f} -> {ppl_of(out):.3f} (fresh run {ppl_of(fresh):.3f}), n {n_of(out)}")

    cfg_path = lab.ck / "config.json"
    cfg = json.loads(cfg_path.read_text())
    before = ppl_of(out)
    cfg["rope_theta"] = 37.0
    cfg_path.write_text(json.dumps(cfg, indent=2))
    p = lctx(*lab.args(out, tasks="ppl"))
    rep.check("config.json rope_theta 10000 -> 37: rerun", counts(p) == (1, 0) and ppl_of(out) != before,
              f"ppl {before:.3f} -> {ppl_of(out):.3f}")

    tok_path = lab.ck / "tokenizer.json"
    tok = json.loads(tok_path.read_text())
    tok["normalizer"] = {"type": "Lowercase"}
    tok_path.write_text(json.dumps(tok))
    before = ppl_of(out)
    p = lctx(*lab.args(out, tasks="ppl"))
    rep.check("tokenizer.json normalizer changed: rerun", counts(p) == (1, 0), tail(p))

    st = os.stat(lab.data)
    # other words of the same length (not a change of case: the Lowercase normalizer set above would undo it)
    lab.data.write_text(TEXT.replace("value", "thing").replace("function", "argument"))
    os.utime(lab.data, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = ppl_of(out)
    p = lctx(*lab.args(out, tasks="ppl"))
    rep.check("--ppl-data rewritten (same size and mtime): rerun", counts(p) == (1, 0) and ppl_of(out) != before,
              f"ppl {before:.3f} -> {ppl_of(out):.3f}")

    p = lctx(*lab.args(out, "--ppl-bos", "none", "--stride", "1", tasks="ppl"))
    s = pd.read_csv(out / "summary.csv")
    cells = s[(s["task"] == "ppl") & (s["metric"] == "ppl")]
    rep.check("--ppl-bos none --stride 1 into the same --out: a separate labelled cell, n = 1 each",
              p.returncode == 0 and len(cells) == 2 and set(cells["n"]) == {1} and cells["task_options"].nunique() == 2,
              f"{len(cells)} ppl cells, n {sorted(cells['n'])}")

    p = lctx(*lab.args(out, "--chunk-size", "64", tasks="ppl"))
    s = pd.read_csv(out / "summary.csv")
    rep.check("--chunk-size 64: rerun, old chunk size left out of the tables",
              counts(p) == (1, 0) and "left out of the tables" in p.stderr and set(s["n"]) == {1}, tail(p))


# ------------------------------------------------------------------------------------------------ damage

def damage(lab: Lab, rep: Report, rng: random.Random) -> None:
    out = lab.root / "damaged"
    p = lctx(*lab.args(out, tasks="passkey"))
    if not rep.check("base run for the damage", p.returncode == 0, tail(p)):
        return
    rec = out / "records.jsonl"
    good = rec.read_bytes()
    more = dict(tasks="passkey", samples=2)  # one more sample to run each time

    for what, junk in [("300 random bytes appended to records.jsonl", rng.randbytes(300)),
                       ("a [1,2,3] line", b"[1,2,3]\n"), ('a {"foo":1} line', b'{"foo":1}\n'),
                       ('a {"status":"ok"} line', b'{"status":"ok"}\n')]:
        rec.write_bytes(good + junk)
        p = lctx(*lab.args(out, **more))
        rep.check(what, p.returncode == 0 and "could not be read" in p.stderr and counts(p) == (1, 1)
                  and "Traceback" not in p.stderr, tail(p))
        rec.write_bytes(good)

    meta = (out / "run.json").read_text()
    (out / "run.json").write_text("{bad")
    p = lctx(*lab.args(out, **more))
    rep.check("run.json = '{bad'", one_line_error(p) and "run.json" in p.stderr, tail(p))
    (out / "run.json").write_text(meta)

    if os.geteuid() == 0 and shutil.which("chattr") and \
            subprocess.run(["chattr", "+i", str(rec)], capture_output=True).returncode == 0:
        p = lctx(*lab.args(out, **more))
        subprocess.run(["chattr", "-i", str(rec)])
        rep.check("records.jsonl immutable (chattr +i)", one_line_error(p) and rec.read_bytes() == good, tail(p))
    else:
        rep.skip("records.jsonl immutable (chattr +i)", "needs root and a file system with attributes")

    rec.unlink()
    rec.mkdir()
    p = lctx(*lab.args(out, **more))
    rep.check("records.jsonl replaced by a directory", one_line_error(p), tail(p))
    rec.rmdir()

    rec.symlink_to("/dev/full")
    t0 = time.time()
    p = lctx(*lab.args(out, **more), timeout=300)
    rep.check("records.jsonl -> /dev/full (a device)", one_line_error(p), f"{tail(p)} in {time.time() - t0:.0f} s")
    rec.unlink()
    rec.write_bytes(good)

    (out / "summary.csv").unlink()
    (out / "summary.csv").symlink_to("/dev/full")
    p = lctx(*lab.args(out, tasks="passkey"))
    rep.check("summary.csv -> /dev/full: replaced by the real table", p.returncode == 0 and
              (out / "summary.csv").is_file() and not (out / "summary.csv").is_symlink(), tail(p))

    # a second process on the same --out
    # the holder has far more samples than it can finish while a second process starts (seconds to a minute
    # on a loaded machine); it is killed once the second run has answered
    slow = lab.args(out, tasks="passkey", lengths="256,384,512", depths="0,0.25,0.5,0.75,1", samples=60)
    first = subprocess.Popen(LCTX + [str(a) for a in slow], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL)
    lock = out / ".lctx.lock"  # emptied when a run releases it: non-empty = held, with the holder's PID
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None and not (lock.exists() and lock.read_text().strip()):
        time.sleep(0.2)
    p = lctx(*slow)
    still = first.poll() is None
    rep.check("a second lctx run on the same --out", still and one_line_error(p) and f"PID {first.pid}" in p.stderr,
              tail(p) + ("" if still else f" (the holder had ended first, exit {first.returncode})"))
    first.send_signal(signal.SIGKILL)
    first.wait()
    p = lctx(*lab.args(out, tasks="passkey"))
    rep.check("after the holder is killed -9, the lock is free", p.returncode == 0, tail(p))


def full_disk(lab: Lab, rep: Report) -> None:
    mnt = lab.root / "small_fs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                             capture_output=True).returncode == 0
    try:
        out = mnt / "o"
        grid = dict(tasks="passkey", lengths="256", depths="0,0.25,0.5,0.75,1", samples=4)
        if mounted:
            ballast = mnt / "ballast"
            p = lctx(*lab.args(out, tasks="passkey", depths="0"))
            before = len((out / "records.jsonl").read_text().splitlines())
            free = shutil.disk_usage(mnt).free
            ballast.write_bytes(b"\0" * max(0, free - 1024))  # not one 4 KB page left: run.json cannot be written
            p = lctx(*lab.args(out, **grid))
            rep.check("full disk before the run writes anything (a 1 MB tmpfs, no page free)", one_line_error(p)
                      and "space" in p.stderr and ("kept" in p.stderr or "safe" in p.stderr)
                      and len((out / "records.jsonl").read_text().splitlines()) == before, tail(p))
            ballast.unlink()
            free = shutil.disk_usage(mnt).free
            ballast.write_bytes(b"\0" * max(0, free - 3 * 4096))  # room for run.json and a few records only
            how = "a 1 MB tmpfs with three 4 KB pages free: full in the middle of the records"
            p = lctx(*lab.args(out, **grid))
        else:
            how = "RLIMIT_FSIZE (no mount permission)"
            out = lab.root / "fsize"
            lctx(*lab.args(out, tasks="passkey", depths="0"))
            size = (out / "records.jsonl").stat().st_size
            lim = size + 3000
            p = lctx(*lab.args(out, **grid), preexec=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim)))
        rep.check(f"full disk ({how})", one_line_error(p) and ("space" in p.stderr or "too large" in p.stderr)
                  and ("kept" in p.stderr or "safe" in p.stderr), tail(p))
        if mounted:
            ballast.unlink()
        p = lctx(*lab.args(out, **grid))
        ok = p.returncode == 0
        t = table(out) if ok else None
        rep.check("after space is freed the run resumes and completes",
                  ok and len(t) == 40 and not t.duplicated(["metric", "depth", "sample"]).any(),
                  tail(p) if not ok else f"{len(t)} rows")
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)])


# ------------------------------------------------------------------------------------------------ others

def other_inputs(lab: Lab, rep: Report) -> None:
    from safetensors.torch import load_file, save_file

    nan = lab.root / "nan"
    shutil.copytree(BUNDLED, nan)
    t = load_file(nan / "model.safetensors")
    for k in t:
        if k.startswith("model.layers.0."):
            t[k] = t[k] * float("nan")
    save_file(t, nan / "model.safetensors", metadata={"format": "pt"})
    p = lctx("run", "-m", nan, "--tasks", "passkey,ppl", "--lengths", 256, "--depths", 0.5, "--samples", 1,
             "--ppl-data", lab.data, "--no-progress", "--out", lab.root / "nan_out")
    s = pd.read_csv(lab.root / "nan_out" / "results.csv") if (lab.root / "nan_out" / "results.csv").exists() else None
    rep.check("layer 0 = NaN: every sample an error (passkey too), exit 3",
              p.returncode == 3 and s is not None and (s["status"] == "error").all(), tail(p))

    remote = lab.root / "remote"
    remote.mkdir()
    marker = lab.root / "REMOTE_CODE_RAN"
    (remote / "configuration_x.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                               "from transformers import PretrainedConfig\n"
                                               "class XConfig(PretrainedConfig):\n    model_type = 'x_fault'\n")
    (remote / "config.json").write_text(json.dumps({"model_type": "x_fault", "auto_map":
                                                    {"AutoConfig": "configuration_x.XConfig"}}))
    p = lctx("plan", "--model", remote, "--length", "1k")
    rep.check("lctx plan on a checkpoint with auto_map code", one_line_error(p) and not marker.exists(), tail(p))

    tf = lab.root / "exits.py"
    tf.write_text("import sys\nsys.exit(0)\n")
    p = lctx("run", "--task-file", tf, "--tasks", "passkey", "--out", lab.root / "tf_out")
    rep.check("--task-file that calls sys.exit(0)", one_line_error(p), tail(p))

    blob = lab.root / "blob.bin"
    blob.write_bytes(os.urandom(8192))
    p = lctx(*lab.args(lab.root / "bin_out", tasks="ppl")[:-2], "--out", lab.root / "bin_out", "--ppl-data", blob)
    rep.check("binary --ppl-data", one_line_error(p), tail(p))

    cwd = lab.root / "cwd"
    cwd.mkdir()
    p = subprocess.run(LCTX + ["run", "--lengths", "256,,512"], cwd=cwd, capture_output=True, text=True)
    rep.check("--lengths 256,,512 (and no lctx-out/ left behind)", one_line_error(p) and not any(cwd.iterdir()),
              tail(p))
    p = subprocess.run(LCTX + ["run", "--tasks", "passkay"], cwd=cwd, capture_output=True, text=True)
    rep.check("--tasks passkay leaves no lctx-out/", one_line_error(p) and not any(cwd.iterdir()), tail(p))

    p = lctx("diagnose", "far-mass", "-m", lab.ck, "--distance=-5", "--out", lab.root / "fm")
    rep.check("diagnose far-mass --distance=-5", one_line_error(p), tail(p))

    p = lctx("train", "--option", "bogus_opt=3", "--steps", 1, "--out", lab.root / "tr")
    rep.check("lctx train --option bogus_opt=3", one_line_error(p) and "valid options" in p.stderr, tail(p))

    # lctx compare on damaged and lm-eval-shaped summaries
    head = "model,variant,task,metric,length,depth,mean,stderr,n,n_error\n"
    arc = lab.root / "arc"
    arc.mkdir()
    (arc / "summary.csv").write_text(head + "m,llama,arc_easy,acc,,,0.5,0.2,3,0\n")
    p = lctx("compare", arc, "--baseline", arc)
    rep.check("lctx compare on an arc run (no length)", p.returncode == 0, tail(p))
    deep = lab.root / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000)
    p = lctx("compare", arc, "--baseline", arc, "--rules", deep)
    rep.check("lctx compare --rules nested 5000 deep", one_line_error(p), tail(p))
    for row in ["m,llama,arc_easy,acc,,,abc,0.2,3,0\n", "m,llama,arc_easy,acc,,,0.5,0.2,,0\n",
                ",llama,arc_easy,acc,,,0.5,0.2,3,0\n"]:
        bad = lab.root / f"bad{abs(hash(row))}"
        bad.mkdir()
        (bad / "summary.csv").write_text(head + row)
        p = lctx("compare", bad, "--baseline", arc)
        rep.check(f"lctx compare on a hand-edited summary.csv row {row.strip()!r}", one_line_error(p), tail(p))
    worse = lab.root / "worse"
    worse.mkdir()
    (worse / "summary.csv").write_text(head + "m,llama,arc_easy,acc,,,0.25,0.2,3,0\n")
    for tol in ['abs = "1e9"', "abs = true"]:
        rules = lab.root / "tol.toml"
        rules.write_text(f"[tolerance]\n{tol}\n")
        p = lctx("compare", worse, "--baseline", arc, "--rules", rules)
        rep.check(f"lctx compare with {tol} against a 50% regression", one_line_error(p), tail(p))



# ------------------------------------------------------------------------------------------------ issue 25

#: A ``sitecustomize`` put first on a child's PYTHONPATH: an audit hook (PEP 578) that SIGKILLs the process
#: the moment it replaces the file named by LCTX_FI_KILL_ON_REPLACE (lctx writes every table to a temporary
#: file and ``os.replace``s it), so a kill inside the final table write lands at the same point every time.
KILL_HOOK = """import os, signal, sys
_target = os.environ.get("LCTX_FI_KILL_ON_REPLACE")
if _target:
    def _kill_on_replace(event, args):
        if event == "os.rename" and str(args[1]).endswith(_target):
            os.kill(os.getpid(), signal.SIGKILL)
    sys.addaudithook(_kill_on_replace)
"""

#: a chat template that renders a 2 GB string (issue 25, F1)
TEMPLATE_BOMB = "{{ 'a' * 2000000000 }}"


def killed_at(lab: Lab, target: str, args: list) -> subprocess.CompletedProcess:
    """``lctx *args`` killed by SIGKILL as it replaces ``target`` (a file name), deterministically."""
    hook = lab.root / "kill_hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(KILL_HOOK)
    env = {**os.environ, "LCTX_FI_KILL_ON_REPLACE": target,
           "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run(LCTX + [str(a) for a in args], capture_output=True, text=True, timeout=900, env=env,
                          stdin=subprocess.DEVNULL)


def summary_means(out: Path) -> dict:
    """{(model, task, metric, length, depth): (mean, n)} of ``out/summary.csv`` (no depth: -1, as NaN != NaN)."""
    s = pd.read_csv(out / "summary.csv").fillna({"depth": -1.0})
    return {(r.model, r.task, r.metric, r.length, r.depth): (float(r.mean), int(r.n)) for r in s.itertuples()}


def append_record(out: Path, change) -> dict:
    """Append to ``out/records.jsonl`` a copy of its first ok passkey record, edited by ``change(rec)``."""
    lines = (out / "records.jsonl").read_text().splitlines()
    rec = next(r for r in map(json.loads, lines) if r["task"] == "passkey" and r["status"] == "ok")
    change(rec)
    with open(out / "records.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


def issue25(lab: Lab, rep: Report) -> None:
    # 1. SIGKILL inside the final table write, at two fixed points; the rerun resumes every sample and writes
    #    the uninterrupted run's tables
    grid = dict(lengths="256", depths="0,1", samples=1)
    ref = lab.root / "ref25"
    p = lctx(*lab.args(ref, **grid))
    if not rep.check("issue 25 reference run", p.returncode == 0, tail(p)):
        return
    for target in ("results.parquet", "summary.csv"):
        out = lab.root / f"kill_{target.split('.')[0]}"
        k = killed_at(lab, target, lab.args(out, **grid))
        p = lctx(*lab.args(out, **grid))
        ok = k.returncode == -signal.SIGKILL and p.returncode == 0 and counts(p) == (0, 3)  # 2 passkey + 1 ppl
        same = ok and table(ref).equals(table(out)) and summary_means(ref) == summary_means(out)
        rep.check(f"SIGKILL as the final table write replaces {target}: the rerun resumes all samples and writes "
                  "the uninterrupted tables", ok and same,
                  f"killed: exit {k.returncode}; rerun {tail(p)}, {counts(p)} (run, resumed), same tables: {same}")

    # 2. forged records (F2, F3): appended to records.jsonl, never in any aggregate, each named in a warning
    for what, change in [
            ("a second record of a finished sample, other value, unknown invocation (F2)",
             lambda r: r.update(metrics={**r["metrics"], "exact": 1.0 - r["metrics"]["exact"]},
                                invocation="20990101T000000.000000Z-1", run_id="20990101T000000Z-1")),
            ("a second record of a finished sample, other value, the run's own invocation id",
             lambda r: r.update(metrics={**r["metrics"], "exact": 1.0 - r["metrics"]["exact"]})),
            ("a record of a model the run never ran (F3)",
             lambda r: r.update(model="forged-model", model_fingerprint="0123456789abcdef")),
    ]:
        out = lab.root / f"forged_{len(list(lab.root.glob('forged_*')))}"
        shutil.copytree(ref, out)
        before = summary_means(ref)
        append_record(out, change)
        p = lctx(*lab.args(out, **grid))
        after = summary_means(out) if (out / "summary.csv").exists() else {}
        rp = lctx("report", out, "--out", lab.root / f"{out.name}_report")
        warned = "record" in p.stderr.lower() and "record" in rp.stderr.lower()
        rep.check(f"forged: {what}: the means and n are the run's own, and run and report warn",
                  p.returncode == 0 and rp.returncode == 0 and after == before and warned,
                  f"{tail(p)}; report {tail(rp)}; summary unchanged: {after == before}")

    # 3. a GGUF whose chat template renders 2 GB (F1): one line within seconds, under a 4 GB address-space cap
    bomb = write_tiny_gguf_with_template(lab.root / "bomb" / "bomb.gguf", TEMPLATE_BOMB)
    cap = 4 * 2**30
    t0 = time.time()
    p = lctx("run", "-m", bomb, "--tasks", "passkey", "--lengths", 1024, "--depths", 0.5, "--samples", 1,
             "--chat-template", "on", "--cache-dir", lab.root / "bomb_cache", "--no-progress",
             "--out", lab.root / "bomb_out", timeout=300,
             preexec=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    took = time.time() - t0
    rep.check("GGUF chat template {{ 'a' * 2000000000 }} with --chat-template on: one line, exit 2, under 4 GB",
              one_line_error(p) and "MemoryError" not in p.stderr, f"{tail(p)} in {took:.0f} s")

    # 4. an lm-eval task (arc_easy on three questions): SIGKILL in its final table write, then resume
    data = lab.root / "arc_data"
    (data / "arc").mkdir(parents=True)
    qs = [{"id": f"q{i}", "question": {"stem": f"Which number is {w}?", "choices": [
        {"text": w, "label": "A"}, {"text": "never", "label": "B"}, {"text": "cars", "label": "C"}]},
        "answerKey": "A"} for i, w in enumerate(["one", "two", "three"])]
    for split in ("Test", "Dev"):
        (data / "arc" / f"ARC-Easy-{split}.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    arc = ["run", "-m", lab.ck, "--tasks", "arc_easy", "--data-dir", data, "--device", "cpu", "--no-progress"]
    ref_arc, out_arc = lab.root / "arc_ref", lab.root / "arc_killed"
    p = lctx(*arc, "--out", ref_arc)
    if rep.check("arc_easy reference run (lm-eval, 3 questions)", p.returncode == 0, tail(p)):
        k = killed_at(lab, "summary.csv", [*arc, "--out", out_arc])
        p = lctx(*arc, "--out", out_arc)
        same = p.returncode == 0 and table(ref_arc).equals(table(out_arc))
        rep.check("arc_easy: SIGKILL as summary.csv is replaced, then resume: the uninterrupted table",
                  k.returncode == -signal.SIGKILL and same, f"killed: exit {k.returncode}; rerun {tail(p)}; same: {same}")


def write_tiny_gguf_with_template(path: Path, template: str) -> Path:
    """The tests' tiny GGUF (tests/gguf_tiny.py; 2,048-token context) with ``template`` as its
    ``tokenizer.chat_template``."""
    sys.path.insert(0, str(REPO / "tests"))
    import gguf_tiny  # the tests' writer, beside this script

    saved = gguf_tiny.CHAT_TEMPLATE
    gguf_tiny.CHAT_TEMPLATE = template
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return gguf_tiny.write_tiny_gguf(path, ctx=2048)
    finally:
        gguf_tiny.CHAT_TEMPLATE = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=8, help="SIGKILLs at random points (plus a quarter as many "
                                                          "SIGINT and SIGTERM each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, default=None, help="Keep the scratch folder here.")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=None, help="Run only these sections.")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    root = a.keep or Path(tempfile.mkdtemp(prefix="lctx-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LCTX_HASH_CACHE", str(root / "digests.json"))
    rep = Report()
    t0 = time.time()
    try:
        for name, fn in [("inputs", lambda: input_changes(Lab(root / "inputs"), rep)),
                         ("damage", lambda: damage(Lab(root / "damage"), rep, rng)),
                         ("full_disk", lambda: full_disk(Lab(root / "disk"), rep)),
                         ("others", lambda: other_inputs(Lab(root / "others"), rep)),
                         ("kills", lambda: kills(Lab(root / "kills"), rep, a.kills, rng)),
                         ("issue25", lambda: issue25(Lab(root / "issue25"), rep))]:
            if a.only and name not in a.only:
                continue
            print(f"--- {name}", flush=True)
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a broken check is a failure, the others still run
                rep.check(f"{name} checks ran to the end", False, f"{type(e).__name__}: {e}")
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{rep.summary()} ({time.time() - t0:.0f} s)")
    return 0 if not rep.failed else 1


if __name__ == "__main__":
    sys.exit(main())
