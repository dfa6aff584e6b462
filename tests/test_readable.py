"""lctx reads whole everywhere (issue 16): tables and --help off a terminal, usage lines, a progress bar counted
in tokens, too-short lengths refused before the sweep, tasks and variants discoverable, lm-eval's git noise
silenced, training lengths marked on plots without crowding titles."""

from __future__ import annotations

import io
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from helpers import _forward_work, assert_one_line_error, run_cli

from lctx.harness.run.console import markdown_table, print_table

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def plain_env(monkeypatch):
    monkeypatch.delenv("LCTX_DATA_DIR", raising=False)
    monkeypatch.delenv("LCTX_TABLE_FORMAT", raising=False)
    monkeypatch.setenv("COLUMNS", "80")  # the width rich assumes off a terminal: where cells used to be cut


# ----------------------------------------------------------------------------------------------- 1. tables

def _summary(model: str, ppl: float, match: float) -> pd.DataFrame:
    rows = [(model, "rope", "ppl", "ppl", 256, math.nan, ppl, math.nan, 1, 0)]
    for metric in ("string_match_all", "string_match_part"):
        rows.append((model, "rope", "niah_single_1", metric, 256, 0.5, match, 0.1, 4, 0))
    return pd.DataFrame(rows, columns=["model", "variant", "task", "metric", "length", "depth", "mean", "stderr",
                                       "n", "n_error"])


def test_compare_with_stdout_piped_prints_every_cell_whole(tmp_path):
    """What a CI job sees: `lctx compare` with stdout going to a pipe (not a terminal), 80 columns assumed."""
    model = "a-checkpoint-with-a-rather-long-name-v2"
    for name, ppl, match in (("base", 179.123456, 0.75), ("run", 190.987654, 0.25)):
        (tmp_path / name).mkdir()
        _summary(model, ppl, match).to_csv(tmp_path / name / "summary.csv", index=False)
    env = dict(os.environ, COLUMNS="80")
    r = subprocess.run([sys.executable, "-m", "lctx.cli", "compare", str(tmp_path / "run"), "--baseline",
                        str(tmp_path / "base")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=300)
    assert r.returncode == 1, r.stderr  # three regressions
    out = r.stdout
    assert "…" not in out
    for metric in ("string_match_part", "string_match_all"):  # both used to print as `string_…`
        line = next(ln for ln in out.splitlines() if f" {metric} " in ln)
        # the whole row on one line: status, model, task, metric, length, baseline and run values
        for cell in ("regression", model, "niah_single_1", "256", "0.75", "0.25"):
            assert cell in line, (cell, line)
    ppl_line = next(ln for ln in out.splitlines() if " ppl " in ln)
    assert "179.1" in ppl_line and "191" in ppl_line, ppl_line  # numbers used to print as `179.…`
    assert "FAIL: 3 regressed" in out


def test_rich_tables_fold_instead_of_cutting(monkeypatch):
    """On a terminal (forced here) a text cell that does not fit wraps onto the next line; no character is lost;
    a number never wraps (issue 24 item 7: it used to fold too)."""
    monkeypatch.setenv("LCTX_TABLE_FORMAT", "rich")
    monkeypatch.setenv("COLUMNS", "32")
    buf = io.StringIO()
    long = "string_match_part_of_a_long_metric_name"
    print_table(["metric", "value"], [[long, "179.123456789"]], right=["value"], file=buf)
    cells = [ln.split("│") for ln in buf.getvalue().splitlines() if ln.count("│") == 3]
    assert len(cells) > 2  # folded over several lines
    assert "".join(c[1].strip() for c in cells) == long
    assert cells[0][2].strip() == "179.123456789"  # whole on the first line
    assert "…" not in buf.getvalue()


def test_markdown_table_is_aligned_and_escapes_pipes():
    text = markdown_table(["name", "value"], [["a|b", "1.5"], ["much-longer-name", "22"]], right=["value"])
    lines = text.splitlines()
    assert len({len(ln) for ln in lines}) == 1  # every row as wide: columns line up in a log
    assert lines[1].endswith("-:|")  # right-aligned numbers
    assert "a\\|b" in text


def test_bench_tables_whole_off_a_terminal():
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


def test_run_summary_whole_off_a_terminal(capsys):
    from lctx.cli import _print_summary

    model = "stories260K+ssmax_s0.43-with-a-long-suffix"
    summary = pd.DataFrame([(model, "llama", "niah_single_1", "string_match_part", 131072, 0.5, 0.123456, 0.1, 2, 0),
                            (model, "llama", "ppl", "ppl", 131072, math.nan, 179.123456, math.nan, 1, 0)],
                           columns=["model", "variant", "task", "metric", "length", "depth", "mean", "stderr", "n",
                                    "n_error"])
    _print_summary(summary)
    out = capsys.readouterr().out
    assert "…" not in out
    assert any(model in ln and "string_match_part" in ln and "0.123" in ln for ln in out.splitlines()), out
    assert any("ppl" in ln and "179.123" in ln for ln in out.splitlines()), out


@pytest.mark.slow
def test_report_prints_its_summary_whole(tmp_path, capsys):
    from test_report import _run

    run = _run(tmp_path / "runs" / "run-with-a-long-directory-name", ["rope", "alibi"], flat=True)
    code, out, err = run_cli(["report", run, "--out", tmp_path / "rep"], capsys)
    assert code == 0, err
    header = next(ln for ln in out.splitlines() if ln.startswith("| model"))
    for col in ("train length", "PPL at train length", "flat until", "effective length", "passkey exact @ 1×"):
        assert col in header, header
    assert "…" not in out


# ----------------------------------------------------------------------------------------------- --help, usage

def test_help_off_a_terminal_is_whole(capsys):
    code, out, _ = run_cli(["run", "--help"], capsys)
    assert code == 0
    assert "…" not in out
    assert "--allow-beyond-max" in out and "0,0.25,0.5,0.75,1" in out  # used to print as `--allow-beyond-…`
    code, out, _ = run_cli(["--help"], capsys)
    flat = " ".join(out.split())
    assert "write records.jsonl, results.parquet/csv, summary.csv and plots." in flat  # click cut it to `write...`
    assert "Convert checkpoints from other formats into Hugging Face directories." in flat


def test_usage_lines_read_like_the_arguments(capsys):
    for args, usage in ((["convert", "llama2c"], "lctx convert llama2c [OPTIONS] SRC"),
                        (["compare"], "lctx compare [OPTIONS] RUN_DIR"),
                        (["report"], "lctx report [OPTIONS] RUN_DIR..."),
                        (["list"], "lctx list [OPTIONS] WHAT")):
        code, out, _ = run_cli(args + ["--help"], capsys)
        assert code == 0 and f"Usage: {usage}\n" in out, out[:200]
        assert "{" not in out.splitlines()[0]
    code, _, err = run_cli(["convert", "llama2c"], capsys)
    assert_one_line_error(code, err, "Missing argument 'SRC'")


# ----------------------------------------------------------------------------------------------- 2. progress

@pytest.fixture
def lm(make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    return load_lm(str(make_checkpoint("rope")), device="cpu")


def _count_tokens(monkeypatch, lm, method: str) -> list[int]:
    fed: list[int] = []
    orig = getattr(lm, method)

    def counting(ids, *a, **kw):
        fed.append(len(ids))
        return orig(ids, *a, **kw)

    monkeypatch.setattr(lm, method, counting)
    return fed


@pytest.mark.slow
def test_ppl_cost_is_the_tokens_it_feeds(lm, monkeypatch):
    """The progress bar weighs a ppl cell by exactly what the model is fed: every window of every document."""
    from lctx.tasks import Cell
    from lctx.tasks.ppl import Perplexity

    task = Perplexity(max_tokens=600)
    fed = _count_tokens(monkeypatch, lm, "token_nll")
    for L in (32, 64, 200):
        fed.clear()
        cell = Cell(L, None, 0)
        task.score(lm, task.build(lm, cell, 0))
        assert task.cost(lm, cell) == sum(fed), L


def test_passkey_cost_is_its_prompt_and_decode_steps(lm, monkeypatch):
    from lctx.tasks import Cell
    from lctx.tasks.passkey import Passkey

    task = Passkey()
    work = _forward_work(monkeypatch, lm)
    for L in (160, 400):
        work.clear()
        s = task.build(lm, Cell(L, 0.5, 0), 0)
        task.score(lm, s)
        # prompt (within one filler sentence of L) + greedy steps + the teacher-forced key, in prefill tokens
        assert 0.9 < sum(work) / task.cost(lm, s.cell) <= 1.0, (L, sum(work), task.cost(lm, s.cell))


def test_niah_cost_is_the_work_it_does(data_dir, lm, monkeypatch):
    from lctx.tasks import Cell, get_task

    for name in ("niah_single_1", "niah_multivalue"):
        task = get_task(name)(data_dir=data_dir, cache=False)
        sample = task.build(lm, Cell(800, 0.5, 0), 0)
        work = _forward_work(monkeypatch, lm)
        task.score(lm, sample)
        monkeypatch.undo()
        # greedy prompt + decode steps + one teacher-forced prefill per value + the control
        assert 0.85 < sum(work) / task.cost(lm, sample.cell) <= 1.1, (name, sum(work), task.cost(lm, sample.cell))


def test_progress_bar_names_the_cell(lm, tmp_path, capsys):
    from lctx.harness.run.runner import RunSpec, run_sweep
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    run_sweep([lm], [Passkey(), Perplexity(max_tokens=300)], RunSpec([160, 200], [0.5], 1), tmp_path / "o",
              progress=True)
    err = capsys.readouterr().err
    assert f"[sample 4/4] {lm.name} ppl L=200" in err and "100% of tokens" in err  # off a terminal: every 10 s


def test_progress_bar_says_what_each_number_counts():
    # the count is in samples, the percentage in tokens (a sample weighs its tokens): the line must name both,
    # and the percentage must be the tokens' share (here 1 cheap sample of 4 done = 10 % of the tokens, not 25 %)
    import io

    from lctx.harness.run.console import SweepProgress

    with SweepProgress([100.0, 300.0, 300.0, 300.0], file=io.StringIO()) as bar:
        bar.start("tiny ppl L=256")
        bar.done(100.0)
        line = str(bar.bar)
    assert "[sample 1/4] tiny ppl L=256" in line, line
    assert " 10% of tokens" in line and "100/1.00k tokens" in line, line


# ----------------------------------------------------------------------------------------------- 3. pre-flight

def test_passkey_min_length_is_its_template(lm):
    from lctx.tasks import Cell
    from lctx.tasks.passkey import Passkey

    task = Passkey()
    m = task.min_length(lm)
    assert task.build(lm, Cell(m, 0.5, 0), 0).n_tokens <= m
    with pytest.raises(ValueError, match="shorter than the passkey template"):
        task.build(lm, Cell(m - 1, 0.5, 0), 0)


def test_niah_min_length_is_its_empty_haystack(data_dir, lm):
    from lctx.tasks import Cell, get_task

    task = get_task("niah_single_1")(data_dir=data_dir, cache=False)
    m = task.min_length(lm)
    cells = [Cell(m - 1, d, s) for d in (0.0, 0.5, 1.0) for s in range(4)]
    for c in cells:  # too short for every one of these draws
        with pytest.raises(ValueError, match="shorter than the niah_single_1 template"):
            task.build(lm, c, 0)
    for c in cells:  # word keys and answers vary by up to ~30 tokens between draws
        assert task.build(lm, Cell(m + 40, c.depth, c.sample), 0).n_tokens <= m + 40


def test_run_refuses_lengths_shorter_than_a_template_before_the_sweep(capsys, make_checkpoint, tmp_path):
    from lctx.models.adapters.hf import load_lm
    from lctx.tasks.passkey import Passkey

    ck = make_checkpoint("rope")
    need = Passkey().min_length(load_lm(str(ck), device="cpu"))
    out = tmp_path / "o"
    code, _, err = run_cli(["run", "--model", ck, "--tasks", "ppl,passkey", "--lengths", f"32,{need - 1},{need}",
                            "--out", out, "--no-progress"], capsys)
    assert_one_line_error(code, err, f"passkey needs at least {need} tokens", f"lengths 32, {need - 1} are shorter",
                          "drop those lengths")
    assert not (out / "records.jsonl").exists()  # refused before anything ran (ppl first in --tasks)


def test_train_warns_when_warmup_covers_every_step(tmp_path):
    from lctx.errors import LctxError
    from lctx.harness.commands.train import train

    got: list[str] = []
    with pytest.raises(LctxError, match="no training text"):  # a refused run: its error line alone (trial21 9)
        train([("empty", "")], tmp_path / "m", steps=30, warmup_steps=50, progress=False, log=None, warn=got.append)
    assert got == []


@pytest.mark.slow
def test_train_warns_when_warmup_covers_every_step_once_it_can_run(tmp_path):
    from lctx.harness.commands.train import train

    got: list[str] = []
    text = "The module documents every function it exports. A function takes arguments and returns a value. " * 40
    tiny = dict(context_length=16, hidden_size=16, num_layers=1, num_heads=2, vocab_size=300, batch_size=2,
                eval_every=100, eval_batches=1, progress=False, log=None, warn=got.append)
    train([("doc", text)], tmp_path / "m", steps=2, warmup_steps=5, **tiny)  # the warning, once the run can start
    assert len(got) == 1 and "warm-up of 5 steps >= 2 steps" in got[0] and "never decays" in got[0]
    got.clear()
    train([("doc", text)], tmp_path / "m2", steps=2, warmup_steps=1, **tiny)
    assert got == []


@pytest.mark.slow
def test_cli_train_prints_the_warmup_warning_on_stderr(capsys, tmp_path):
    code, out, err = run_cli(["train", "--steps", "2", "--context-length", "32", "--hidden-size", "16", "--layers", "1",
                              "--heads", "2", "--vocab-size", "300", "--batch-size", "2", "--no-progress",
                              "--out", tmp_path / "m"], capsys)
    assert code == 0, err
    assert err.startswith("warning: warm-up of 50 steps >= 2 steps (--warmup, --steps)"), err
    assert "warning" not in out


# ----------------------------------------------------------------------------------------------- 4. discoverable

def test_list_variants_shows_the_ssmax_modifier(capsys):
    code, out, _ = run_cli(["list", "variants"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if "+ssmax" in ln)
    assert "Scalable-Softmax" in line and "rope+ssmax" in line and "ggd_bam" in line


def test_list_variants_names_the_defaults_a_new_model_computes_with(capsys):
    # +ssmax's ssmax_scale_bias defaults to false but to true on ggd_bam (BAM-SSMax scales the prior too): the
    # listing must say so, and agree with the config a new ggd_bam+ssmax / alibi+ssmax model writes
    from lctx.models import LctxConfig

    code, out, _ = run_cli(["list", "variants"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if "+ssmax" in ln)
    assert "ssmax_scale_bias=<bool, default false; true with ggd_bam>" in line
    for base, want in (("ggd_bam", True), ("alibi", False), ("rope", False)):
        cfg = LctxConfig(variant=f"{base}+ssmax", hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
        assert cfg.variant_options["ssmax_scale_bias"] is want, base


def test_unknown_task_error_lists_every_task(capsys, make_checkpoint, tmp_path):
    from lctx.tasks import TASKS

    code, _, err = run_cli(["run", "--model", make_checkpoint(), "--tasks", "pasky", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "unknown task 'pasky'", "mmlu", "arc_easy", "arc_challenge", "flatness",
                          *sorted(TASKS))


def test_list_tasks_is_aligned_and_uses_a_task_docstring(capsys, tmp_path, request):
    from lctx.tasks import TASKS

    saved = dict(TASKS)
    request.addfinalizer(lambda: (TASKS.clear(), TASKS.update(saved)))  # unregister the task file's task
    f = tmp_path / "my_task.py"
    f.write_text('''
from lctx.tasks import Sample, Task, register_task

@register_task
class AVeryLongCustomTaskNameForListing(Task):
    """Mean NLL of the last token of a repeated phrase.

    More text that is not part of the one-line description.
    """
    name = "a_very_long_custom_task_name_for_listing"
    metrics = ("nll",)
''')
    code, out, err = run_cli(["list", "tasks", "--task-file", f], capsys)
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert len({len(ln) for ln in lines}) == 1, out  # every row as wide: columns line up
    mine = next(ln for ln in lines if "a_very_long_custom_task_name_for_listing" in ln)
    assert "Mean NLL of the last token of a repeated phrase." in mine and "More text" not in mine
    for name in ("passkey", "ppl", "niah_single_1", "niah_multikey_3", "mmlu", "arc_easy", "arc_challenge", "flatness"):
        assert any(ln.startswith(f"| {name} ") for ln in lines), name
    niah = next(ln for ln in lines if ln.startswith("| niah_single_2 "))
    assert "ruler/PaulGrahamEssays.json" in niah  # the data it needs


def test_readme_lists_every_task_and_the_data_it_needs():
    from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived names)
    from lctx.tasks import TASKS, task_catalog

    readme = (REPO / "README.md").read_text()
    for t in task_catalog():
        if t.name in TASKS and not TASKS[t.name].__module__.startswith("lctx.tasks"):
            continue  # a task file another test loaded
        assert f"`{t.name}`" in readme, t.name
    for path in ("ruler/PaulGrahamEssays.json", "ruler/wonderwords/"):
        assert path in readme


# ----------------------------------------------------------------------------------------------- 5. noise

def test_lm_eval_git_probe_is_silent_outside_a_repository(tmp_path, monkeypatch, capfd):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import get_git_commit_hash

    from lctx.tasks.lmeval import quiet_git_probe

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # never find a repository above
    get_git_commit_hash()
    assert "not a git repository" in capfd.readouterr().err  # what lm-eval prints on every run
    original = evaluator.get_git_commit_hash
    with quiet_git_probe():
        assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    assert evaluator.get_git_commit_hash is original


# ----------------------------------------------------------------------------------------------- 6. plots

def _table() -> pd.DataFrame:
    rows = []
    for model, T in (("rope-256", 256), ("alibi-256", 256), ("ggd-512", 512), ("nope-1k", 1024)):
        for L in (256, 512, 1024, 2048):
            for metric in ("exact", "digit_acc"):
                rows.append(dict(run_id="r", model=model, variant=model.split("-")[0], task="passkey", metric=metric,
                                 length=L, depth=0.5, sample=0, value=float(L <= T), status="ok", error="",
                                 train_length=T, task_options="{}"))
            rows.append(dict(run_id="r", model=model, variant=model.split("-")[0], task="ppl", metric="ppl", length=L,
                             depth=None, sample=0, value=30.0 * L / T, status="ok", error="", train_length=T,
                             task_options="{}"))
    return pd.DataFrame(rows)


def _check_train_marks(fig, colour_of: dict[str, tuple], trained_at: dict[int, list[str]]) -> None:
    """Each training length: a vertical line in the colour of every model trained there, and its tick label
    says "train" in that model's colour (grey when shared); no label overlaps an axes title."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        if not ax.get_title():
            continue
        vlines = {}
        for ln in ax.get_lines():
            x = ln.get_xdata()
            if len(x) == 2 and x[0] == x[1] and tuple(ln.get_ydata()) == (0, 1):
                vlines.setdefault(float(x[0]), []).append(matplotlib.colors.to_hex(ln.get_color()))
        assert {k: sorted(v) for k, v in vlines.items()} == {
            float(T): sorted(matplotlib.colors.to_hex(colour_of[m]) for m in ms) for T, ms in trained_at.items()}
        title = ax.title.get_window_extent(renderer)
        marked = {}
        for lbl in ax.get_xticklabels():
            assert not lbl.get_window_extent(renderer).overlaps(title)
            if lbl.get_text().endswith("\ntrain"):
                marked[lbl.get_text().split("\n")[0]] = matplotlib.colors.to_hex(lbl.get_color())
        assert marked == {"256": "#333333", "512": matplotlib.colors.to_hex(colour_of["ggd-512"]),
                          "1K": matplotlib.colors.to_hex(colour_of["nope-1k"])}
        texts = [t for t in ax.texts if "train" in t.get_text()]
        assert not texts  # no "train N" annotation above the axes any more


def test_train_lengths_coloured_by_model_and_clear_of_titles(tmp_path, monkeypatch):
    from lctx.harness.outputs import plots, report

    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, name: figs.append(fig) or Path(out) / name)
    table = _table().assign(label=lambda d: d["model"])
    pal = report.palette(list(dict.fromkeys(table["label"])))
    report.accuracy_figure(table, "passkey", tmp_path, pal)
    trained_at = {256: ["rope-256", "alibi-256"], 512: ["ggd-512"], 1024: ["nope-1k"]}
    _check_train_marks(figs[-1], {m: pal[m][0] for m in pal}, trained_at)  # used to be grey lines
    report.perplexity_figure(table, tmp_path, pal)
    ppl_fig = figs[-1]
    ppl_fig.axes[1].set_title("")  # the ratio panel (no flatness rows here): checked by the report tests
    _check_train_marks(ppl_fig, {m: pal[m][0] for m in pal}, trained_at)

    saved = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda self, *a, **k: saved.append(self))
    plots.ppl_vs_length(_table(), tmp_path)
    tab10 = matplotlib.colormaps["tab10"].colors
    _check_train_marks(saved[-1], {m: tab10[i] for i, m in enumerate(["rope-256", "alibi-256", "ggd-512", "nope-1k"])},
                       trained_at)


def test_readme_gives_the_test_suite_duration():
    # the README's Tests section says how long the fast subset takes (a line the lead fills in where the placeholder
    # stands: a measurement, so it is dated) and links the dated measurements of the fast subset and the full suite
    readme = (REPO / "README.md").read_text()
    tests = readme.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    assert "<!-- fast-subset-time -->" in tests or re.search(r"\d+ (s|min|minutes) of CPU", tests), \
        "no fast-subset time (or its placeholder) in the README's test section"
    link = re.search(r"\]\((results/[^)]*test-suite[^)]*)\)", tests)
    assert link, "the README's test section does not link the measured test-suite durations"
    page = (REPO / link.group(1)).read_text()
    assert re.search(r"about \d+ min", page) and re.search(r"\d{4}-\d{2}-\d{2}", page), link.group(1)


def test_list_variants_says_what_the_lsh_exact_dispatch_default_does(capsys):
    # alibi_lsh's rows on the CPU fast path may come from exact ALiBi (issue 24, item 9): the listing names the
    # default, what it does and the attn_kernel it records, and the default is what a new model computes with
    from lctx.models import LctxConfig

    code, out, _ = run_cli(["list", "variants"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("| alibi_lsh"))
    opt = line.split("lsh_exact_dispatch=<", 1)[1].split(">", 1)[0]
    assert opt.startswith("bool, default true: with --attn-impl fast on CPU, exact ALiBi runs"), opt
    assert "lsh-exact-alibi" in opt and "false: always LSH (lsh-blocks)" in opt
    cfg = LctxConfig(variant="alibi_lsh", hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
    assert cfg.variant_options.get("lsh_exact_dispatch", True) is True
