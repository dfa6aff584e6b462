"""The experiment scripts under results/ (issue 24, item 8): they never write over committed results unless
asked (FORCE=1), default to an output folder outside the repository, and record the git revision and the
dirty state of the tree that ran them. Nothing is trained: the guard runs on a throw-away git repository
with a fake committed table, and the real scripts run against a fake `lctx` that fails if it is reached."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None,
                                reason="needs git and bash")

# a run.sh of the shape every results script has: out_init, then its tables copied into $PUB
FAKE_RUN = """#!/usr/bin/env bash
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../out_lib.sh"
out_init exp "$@"
echo new > "$OUT/table.md"
mkdir -p "$PUB"; cp "$OUT/table.md" "$PUB/table.md"
"""


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def fake_repo(tmp_path):
    """A git repository holding results/out_lib.sh and results/exp/{run.sh, table.md} (committed)."""
    repo = tmp_path / "repo"
    (repo / "results" / "exp").mkdir(parents=True)
    shutil.copy(RESULTS / "out_lib.sh", repo / "results" / "out_lib.sh")
    (repo / "results" / "exp" / "run.sh").write_text(FAKE_RUN)
    (repo / "results" / "exp" / "table.md").write_text("committed\n")
    (repo / ".gitignore").write_text("/runs/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    return repo


def _run(repo, tmp_path, *args, **env):
    (tmp_path / "tmp").mkdir(exist_ok=True)
    e = {k: v for k, v in os.environ.items() if k not in ("OUT", "FORCE", "STEPS", "SEEDS", "SETS", "VARIANTS",
                                                          "NAMES", "JOBS")}
    e.update(TMPDIR=str(tmp_path / "tmp"), **env)
    return subprocess.run(["bash", "results/exp/run.sh", *args], cwd=repo, env=e, capture_output=True,
                          text=True, timeout=30)


def test_out_inside_the_repository_is_refused(fake_repo, tmp_path):
    r = _run(fake_repo, tmp_path, "results/exp")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: results/exp is inside the repository") and "FORCE=1" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert (fake_repo / "results" / "exp" / "table.md").read_text() == "committed\n"
    assert _git(fake_repo, "status", "--porcelain") == ""
    # a git-ignored folder inside the repository is fine (nothing committed can be there)
    r = _run(fake_repo, tmp_path, "runs/exp")
    assert r.returncode == 0, r.stderr
    assert (fake_repo / "runs" / "exp" / "results" / "table.md").read_text() == "new\n"


def test_default_out_is_outside_the_repository_with_provenance(fake_repo, tmp_path):
    r = _run(fake_repo, tmp_path, STEPS="20")
    assert r.returncode == 0, r.stderr
    out = Path(r.stderr.split("OUT=", 1)[1].split()[0])
    assert out.parent == tmp_path / "tmp" and out.name.startswith("lctx-exp.")
    assert (out / "results" / "table.md").read_text() == "new\n"
    assert (fake_repo / "results" / "exp" / "table.md").read_text() == "committed\n"
    prov = (out / "provenance.txt").read_text()
    assert f"revision: {_git(fake_repo, 'rev-parse', 'HEAD')}" in prov and "dirty: no" in prov
    assert "STEPS: 20" in prov and "SEEDS:" not in prov  # the size knobs that were set, and only those
    # a dirty tree is refused before anything runs (issue 31 item 4), naming the changed file and the way out
    (fake_repo / "results" / "exp" / "run.sh").write_text(FAKE_RUN + "# edited\n")
    r = _run(fake_repo, tmp_path, str(out))
    assert r.returncode == 2 and "uncommitted changes (results/exp/run.sh)" in r.stderr and "ALLOW_DIRTY=1" in r.stderr
    assert len((out / "provenance.txt").read_text().split("# ")[1:]) == 1  # nothing appended
    # with ALLOW_DIRTY=1 a resumed run appends its own block, naming the changed file
    assert _run(fake_repo, tmp_path, str(out), ALLOW_DIRTY="1").returncode == 0
    blocks = (out / "provenance.txt").read_text().split("# ")[1:]
    assert len(blocks) == 2 and "dirty: yes" in blocks[1] and "results/exp/run.sh" in blocks[1]
    assert "ALLOW_DIRTY: 1" in blocks[1]


def test_force_writes_the_committed_copies(fake_repo, tmp_path):
    r = _run(fake_repo, tmp_path, str(tmp_path / "out"), FORCE="1")
    assert r.returncode == 0, r.stderr
    assert (fake_repo / "results" / "exp" / "table.md").read_text() == "new\n"
    assert "FORCE: 1" in (tmp_path / "out" / "provenance.txt").read_text()
    # and FORCE=1 lets an OUT inside the repository through (the tree is dirty now: the copy above changed it)
    assert _run(fake_repo, tmp_path, "results/exp/out", FORCE="1").returncode == 2
    assert _run(fake_repo, tmp_path, "results/exp/out", FORCE="1", ALLOW_DIRTY="1").returncode == 0


def test_an_lctx_from_another_checkout_is_refused(tmp_path):
    """The revision provenance.txt records names the code that ran only when the `lctx` on PATH imports this
    checkout: an lctx checkout whose `lctx` imports another one (the development checkout's editable install) is
    refused before anything runs, naming the fix; the same checkout's own install passes; ALLOW_DIRTY=1 lets the
    other through."""
    import sys

    repo = tmp_path / "lctx"  # named lctx, so that PYTHONPATH=tmp_path imports this folder as the package
    (repo / "results" / "exp").mkdir(parents=True)
    shutil.copy(RESULTS / "out_lib.sh", repo / "results" / "out_lib.sh")
    (repo / "results" / "exp" / "run.sh").write_text(FAKE_RUN)
    for name in ("pyproject.toml", "cli.py", "__init__.py"):
        (repo / name).write_text("")
    (repo / ".gitignore").write_text("/runs/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "lctx").write_text(f"#!{sys.executable}\nraise SystemExit(1)\n")  # an entry point: only its python read
    (bin_ / "lctx").chmod(0o755)
    path = f"{bin_}:{os.environ['PATH']}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = _run(repo, tmp_path, str(tmp_path / "o1"), PATH=path, PYTHONPATH=str(tmp_path))
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["bash", "results/exp/run.sh", str(tmp_path / "o2")], cwd=repo, capture_output=True,
                       text=True, timeout=30, env={**env, "PATH": path, "TMPDIR": str(tmp_path)})
    assert r.returncode == 2 and "runs the code in" in r.stderr and "not this checkout" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o2").exists()
    r = subprocess.run(["bash", "results/exp/run.sh", str(tmp_path / "o3")], cwd=repo, capture_output=True,
                       text=True, timeout=30, env={**env, "PATH": path, "TMPDIR": str(tmp_path), "ALLOW_DIRTY": "1"})
    assert r.returncode == 0, r.stderr


def _fake_lctx(tmp_path):
    """A PATH with an `lctx` that leaves a mark and fails, and a data folder of empty books."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "lctx").write_text(f"#!/bin/sh\ntouch {tmp_path}/lctx-called\nexit 1\n")
    (bin_ / "lctx").chmod(0o755)
    books = tmp_path / "data" / "books"
    books.mkdir(parents=True)
    for b in ("pg1342_pride_and_prejudice", "pg1661_adventures_of_sherlock_holmes", "pg345_dracula",
              "pg98_a_tale_of_two_cities"):
        (books / f"{b}.txt").write_text("")
    (tmp_path / "tmp").mkdir()
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "LCTX_DATA_DIR": str(tmp_path / "data"),
            "TMPDIR": str(tmp_path / "tmp"), "FORCE": "0", "ALLOW_DIRTY": "1"}  # the checkout under test may be dirty


def test_seed_script_refuses_its_own_folder_before_training(tmp_path):
    env = _fake_lctx(tmp_path)
    r = subprocess.run(["bash", "results/2026-12-01-seed000-bam/run.sh", "results/2026-12-01-seed000-bam"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "inside the repository" in r.stderr, r.stderr
    assert not (tmp_path / "lctx-called").exists()
    # with no OUT, the script gets as far as its first `lctx` call, in a folder outside the repository
    r = subprocess.run(["bash", "results/2026-12-01-seed000-bam/run.sh"], cwd=REPO,
                       env={**env, "NAMES": "alibi", "JOBS": "1"}, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and (tmp_path / "lctx-called").exists()
    out = Path(r.stderr.split("OUT=", 1)[1].split()[0])
    assert out.parent == tmp_path / "tmp" and (out / "provenance.txt").is_file()
    assert "tables and plots: " + str(out / "results") in r.stderr


def test_every_results_script_uses_the_guard():
    """Each script under results/ that writes an output folder sets it through out_lib.sh (directly or
    through seeds_lib.sh), so none of them can default into the repository."""
    libs = {"out_lib.sh", "seeds_lib.sh", "preset.sh"}  # the presets take a required OUT_DIR (CI's gate)
    scripts = [p for p in RESULTS.rglob("*.sh") if p.name not in libs]
    assert len(scripts) >= 9
    for p in scripts:
        text = p.read_text()
        assert "out_init " in text or "seeds_lib.sh" in text, p


def _replicates():
    """results/2026-12-03-seed-replicates/make_tables.py as a module (a script, not a package)."""
    import importlib.util

    path = RESULTS / "2026-12-03-seed-replicates" / "make_tables.py"
    spec = importlib.util.spec_from_file_location("seed_replicate_tables", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # 5.3 CPU s (reads 35 committed run directories): over the fast subset's budget (issue 42 item 10)
def test_seeds_md_replicate_table_is_the_committed_runs(tmp_path):
    """Issue 31: seeds.md's three-seed claims table is, line for line, what make_tables.py makes from the committed
    per-seed runs (so every spread and verdict there is traceable to a summary.csv). Control: one seed's passkey
    cell changed in a copy of the runs (ALiBi seed 1 retrieving perfectly at 64x) makes the check fail."""
    mod = _replicates()
    runs = RESULTS / "2026-12-03-seed-replicates" / "runs"
    assert mod.check(runs, RESULTS / "seeds.md") == 0
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    p = copy / "bam_alibi_s1" / "summary.csv"
    import pandas as pd

    s = pd.read_csv(p)
    sel = (s["task"] == "passkey") & (s["metric"] == "exact") & (s["length"] == 8192)
    assert sel.any()
    s.loc[sel, "mean"] = 1.0
    s.to_csv(p, index=False)
    assert mod.check(copy, RESULTS / "seeds.md") == 1


@pytest.mark.slow  # reads the committed run directories like the test above
def test_replicate_retrieval_claims_count_learned_seeds_and_far_needles():
    """The retrieval rules judge far needles (depths 0-0.75) of the seeds that learned: GGD-BAM seed 0's probe
    never reached 0.8, so it is "did not learn", not a failure; ALiBi's near needle (depth 1.0) retrieving at 64x
    does not count for its far retrieval. Control: the same model's far cells set to 1.0 flip its seed to holding."""
    import pandas as pd

    mod = _replicates()
    runs = RESULTS / "2026-12-03-seed-replicates" / "runs"
    df, probe = mod.load(runs), mod.probes(runs)
    assert not mod.learned(df, probe, "bam", "ggd_bam", 0) and mod.learned(df, probe, "bam", "ggd_bam", 2)
    _, holds = mod.c_bam_retrieves(df, None, probe)
    assert holds == [mod.DID_NOT_LEARN, False, False]
    assert mod.value(df, "bam", "alibi", "passkey", "exact", 64, 1, "near") == 1.0
    assert mod.value(df, "bam", "alibi", "passkey", "exact", 64, 1, "far") == 0.0
    far = (df.set == "bam") & (df.variant == "ggd_bam") & (df.seed == 2) & (df.depths == "far") & (df.metric == "exact")
    assert far.sum() == 7
    _, holds = mod.c_bam_retrieves(pd.concat([df[~far], df[far].assign(value=1.0)]), None, probe)
    assert holds == [mod.DID_NOT_LEARN, False, True]


def test_replicate_verdicts_follow_their_seeds():
    """A claim is reproduced only when it holds in every seed; otherwise the count is said (issue 31 item 1)."""
    mod = _replicates()
    assert mod.verdict([True, True, True]) == "reproduced: 3 of 3"
    assert mod.verdict([True, False, True]) == "mixed: 2 of 3"
    assert mod.verdict([False, False, False]) == "not reproduced: 0 of 3"
    assert mod.verdict([True, None]) == "holds (1 seed): 1 of 1"  # a seed not run is not counted
    assert mod.verdict([]) == "not run"
    # a seed that never learned the task is counted apart, never as a failure to extrapolate
    dnl = mod.DID_NOT_LEARN
    assert mod.verdict([dnl, False, False]) == "not reproduced: 0 of 2 (1 of 3 did not learn)"
    assert mod.verdict([dnl, dnl, dnl]) == "did not learn: 0 of 3 seeds learned the task"
    assert mod.verdict([dnl, True, dnl]).startswith("inconclusive at this scale: 1 of 3 seeds learned")
    assert mod.verdict("inconclusive at this scale: the control did not learn").endswith("did not learn")
    assert mod.spread([0.2, 0.4, 0.9]) == "0.5 [0.2, 0.9] (3 seeds)"


@pytest.mark.slow  # reads 24 committed run directories
def test_seeds_md_cheap_claims_table_is_the_committed_runs(tmp_path):
    """seeds.md's cheap-claims table is, line for line, what the experiment's tables.py makes from its committed
    runs, LSH error table and next-token accuracies. Control: one LSH seed's held-out ppl halved in a copy changes
    the table, and the check fails."""
    import importlib.util

    import pandas as pd

    folder = RESULTS / "2026-12-06-cheap-claims"
    spec = importlib.util.spec_from_file_location("cheap_claims_tables", folder / "tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(folder), "--check", str(RESULTS / "seeds.md")]) == 0
    copy = tmp_path / "cc"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.py", "*.sh", "*.md"))
    p = copy / "runs" / "lshbam_alibilsh_s0" / "summary.csv"
    s = pd.read_csv(p)
    sel = (s["task"] == "ppl") & (s["metric"] == "ppl") & (s["length"] == 128)
    assert sel.sum() == 1
    s.loc[sel, "mean"] = s.loc[sel, "mean"] / 2
    s.to_csv(p, index=False)
    assert mod.main([str(copy), "--check", str(RESULTS / "seeds.md")]) == 1
