"""lctx.harness.commands.gpu_check: the GPU lease script fits the lease (its written-down estimate and its budgets
under 8 minutes, at most 6 files under --out), records a step that fails or runs out of time and goes on, refuses
user mistakes in one line, and (slow) rehearses every step at tiny sizes on CPU, run as the GPU machine runs it:
``python3 harness/commands/gpu_check.py`` from the repository root, no install needed."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import tarfile
from pathlib import Path

import pytest

from lctx.harness.commands import gpu_check as G

REPO = Path(__file__).resolve().parent.parent


def test_estimate_and_budgets_fit_the_lease_and_match_the_docstring():
    rows = G.estimate()
    assert [r["step"] for r in rows] == [s.name for s in G.STEPS]
    assert sum(r["total_s"] for r in rows) <= G.LEASE_S == 8 * 60
    assert G.TOTAL_BUDGET_S <= G.LEASE_S  # the budgets are the timeouts: they bound the run, the estimate does not
    assert all(r["total_s"] <= r["budget_s"] for r in rows), rows
    doc = re.search(r"\.\. estimate-table\n\n(.*?)\n\n\.\. end-estimate-table", G.__doc__, re.S).group(1)
    assert doc == G.estimate_table(rows)  # the docstring's table is the code's, not an older one
    # control: a 512K prefill of twice the variants would not fit its budget
    big = G.sizes(False)
    big["prefill_512k"]["variants"] = big["prefill_512k"]["variants"] * 2
    assert next(r for r in G.estimate(big) if r["step"] == "prefill_512k")["total_s"] > 125


def _fill(out: Path, names) -> None:
    out.mkdir(exist_ok=True)
    for n in names:
        (out / n).write_text(f"{n}\n")


def test_pack_out_keeps_at_most_six_files_and_no_folder(tmp_path):
    own = G.own_files()[:-1]  # log + one CSV per step
    assert len(own) == G.MAX_FILES == 6
    out = tmp_path / "out"
    _fill(out, own)
    assert G.pack_out(out) == sorted(own)  # nothing else there: untouched, nothing packed
    assert not (out / G.ARCHIVE_NAME).exists()
    (out / "stray.png").write_text("x")  # something a step wrote besides its table, and a folder
    (out / "bench").mkdir()
    (out / "bench" / "deep.csv").write_text("y")
    assert len(list(out.iterdir())) == 8  # control: more than the device tool brings back
    left = G.pack_out(out)
    names = sorted(p.name for p in out.iterdir())
    assert names == left and len(names) == G.MAX_FILES and all((out / n).is_file() for n in names)
    assert G.LOG_NAME in names and G.ARCHIVE_NAME in names
    with tarfile.open(out / G.ARCHIVE_NAME) as tar:  # the lowest-priority table went in with the strays: nothing lost
        assert set(tar.getnames()) == {"stray.png", "bench", "bench/deep.csv", own[-1]}
    assert G.pack_out(out) == left  # a second call leaves the archive as it is (no archive inside an archive)


def test_table_rows_reach_the_file_one_by_one(tmp_path):
    t = G.Table(tmp_path / "x.csv")
    t.add(T=4096, ms=1.5, status="ok")
    assert G.read_csv(tmp_path / "x.csv") == [{"T": "4096", "ms": "1.5", "status": "ok"}]
    t.add(T=8192, status="error: OutOfMemoryError: CUDA out of memory")  # a later row may lack or add columns
    rows = G.read_csv(tmp_path / "x.csv")
    assert [r["T"] for r in rows] == ["4096", "8192"] and rows[1]["ms"] == ""


def test_a_failing_or_slow_step_is_recorded_and_the_next_one_runs(tmp_path, monkeypatch):
    """Real processes standing in for the steps: one fails, one outlives its budget (killed), the rest get no time;
    each is a row of its CSV and a line of the log, and the run still ends with the packed folder."""
    scripts = {"kernel_tests": "print('boom'); raise SystemExit(3)",
               "prior_vs_flex": "import time; print('working', flush=True); time.sleep(60)"}
    monkeypatch.setattr(G, "child_command", lambda name, out, rehearse: [sys.executable, "-c",
                                                                         scripts.get(name, "pass")])
    monkeypatch.setattr(G, "MIN_STEP_S", 0.5)
    out = tmp_path / "out"
    said = []
    assert G.run_check(out, rehearse=True, budget_s=1.5, echo=said.append) == 1  # a partial run is not exit 0
    assert said[-1].startswith("not every step ran to the end (kernel_tests, prior_vs_flex, chunk_split")
    status = {s.name: G.read_csv(out / s.csv)[-1]["status"] for s in G.STEPS}
    assert status["kernel_tests"] == "step failed (exit 3)"
    assert status["prior_vs_flex"].startswith("step timed out (budget ")
    assert all(status[n] == "step skipped (no time left in the budget)"
               for n in ("chunk_split", "prefill_512k", "real_models"))
    log = (out / G.LOG_NAME).read_text()
    assert "boom" in log and "working" in log and "step kernel_tests: failed (exit 3)" in log
    assert len(list(out.iterdir())) <= G.MAX_FILES


def test_an_interrupted_run_kills_the_step_it_was_running(tmp_path, monkeypatch):
    """Ctrl-C during a step: the step runs in a session of its own (so a timeout can kill its whole group), so the
    interruption must kill that group too, or the step would go on writing into --out after the command exited.
    The stand-in step writes a file every 50 ms; after the interrupt the file stops changing."""
    import threading

    beat = tmp_path / "beat"
    script = (f"import time, pathlib\np = pathlib.Path({str(beat)!r})\n"
              "for i in range(400):\n    p.write_text(str(i)); time.sleep(0.05)")
    monkeypatch.setattr(G, "child_command", lambda name, out, rehearse: [sys.executable, "-c", script])
    main = threading.main_thread().ident

    def interrupt():
        while not beat.exists():
            time.sleep(0.02)
        import _thread
        _thread.interrupt_main()

    # a process started in the background by a non-interactive shell (CI's nohup ... &) inherits SIGINT ignored, and
    # then Python installs no handler and interrupt_main does nothing: install Python's own for this test
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            G.run_check(tmp_path / "out", rehearse=True, steps="kernel_tests", echo=lambda s: None)
    finally:
        signal.signal(signal.SIGINT, old)
    assert main == threading.get_ident()
    time.sleep(0.3)
    first = beat.read_text()
    time.sleep(0.3)  # six beats later: a surviving step would have written again
    assert beat.read_text() == first and int(first) < 399  # stopped, and not by running to its end
    assert "interrupted: the step's process group was killed" in (tmp_path / "out" / G.LOG_NAME).read_text()


def test_user_mistakes_are_one_line(tmp_path, capsys):
    from helpers import assert_one_line_error

    (tmp_path / "afile").write_text("x")
    cases = [(["--out", str(tmp_path / "afile")], "cannot write to --out"),
             (["--out", ""], "--out is empty"),
             (["--out", str(tmp_path / "o"), "--rehearse", "--steps", "prefill,chunk_split"], "unknown step prefill"),
             (["--out", str(tmp_path)], "holds files that are not the GPU check's")]
    for argv, needle in cases:
        code = G.main(argv)
        assert_one_line_error(code, capsys.readouterr().err, needle)
    import torch

    if not torch.cuda.is_available():  # the lease script without a GPU, not rehearsing
        code = G.main(["--out", str(tmp_path / "new")])
        assert_one_line_error(code, capsys.readouterr().err, "needs a CUDA device", "--rehearse")
        assert not (tmp_path / "new").exists()


def test_passkey_ids_plant_the_key_at_its_depth_and_the_end():
    ids = G.passkey_ids(1000, 500, seed=1, depth=0.25)
    assert len(ids) == 1000 and min(ids) >= 3 and max(ids) < 500
    assert ids[250:255] == ids[-5:] and ids[:5] != ids[-5:]
    with pytest.raises(ValueError, match="length >= 12"):
        G.passkey_ids(5, 500)


def test_real_model_shapes_build_with_yarn():
    cfg = G.hf_config(G.SMOLLM2, rehearse=False, position="yarn:factor=16")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (576, 30, 9, 3)
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 16
    g = G.hf_config(G.GEMMA3)
    assert (g.sliding_window, g.head_dim, g.layer_types.count("full_attention")) == (512, 256, 3)


@pytest.mark.slow
def test_rehearsal_runs_every_step_on_cpu(tmp_path):
    """``--rehearse`` as the GPU machine would run the script (a file, from the repository root, lctx imported from
    the checkout), the packages its image lacks refused: every step ends ok within its rehearsal budget, each
    table has rows and no failed one, and at most 6 files are left. About a minute on 2 busy cores."""
    out = tmp_path / "gc"
    p = subprocess.run([sys.executable, "harness/commands/gpu_check.py", "--rehearse", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=G.REHEARSE_TOTAL_S + 60)
    assert p.returncode == 0, p.stderr[-3000:]
    files = sorted(f.name for f in out.iterdir())
    assert files == sorted(G.own_files()[:-1]) and len(files) <= G.MAX_FILES, files
    log = (out / G.LOG_NAME).read_text()
    for step in G.STEPS:
        assert f"step {step.name}: ok" in log, log[-3000:]
        rows = G.read_csv(out / step.csv)
        assert rows and all(r["status"] == "ok" for r in rows), (step.name, rows)
    # every accuracy row is within its derived tolerance, and every control outside it
    for name in ("prior_vs_flex", "chunk_split"):
        acc = [r for r in G.read_csv(out / f"{name}.csv") if r["part"] == "accuracy"]
        assert acc and all(r["ok"] == "True" for r in acc), acc
    assert "CPU (rehearsal)" in log and "TRITON_INTERPRET=1" in log
