"""Tests of lctx.harness.outputs.plots on a synthetic results table (no model, no GPU)."""

from __future__ import annotations

import functools
import math
import struct
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from lctx.harness.outputs.plots import (
    depth_counts,
    depth_errors,
    depth_grid,
    format_length,
    make_plots,
    ppl_vs_length,
    safe_filename,
    task_heatmaps,
)

# the passkey task's depth x length tables and heatmaps (plots.py knows no task by name: the task is an argument)
passkey_grid = functools.partial(depth_grid, task="passkey")
passkey_counts = functools.partial(depth_counts, task="passkey")
passkey_errors = functools.partial(depth_errors, task="passkey")


def passkey_heatmaps(df, out_dir):
    return task_heatmaps(df, out_dir, "passkey")

LENGTHS = [512, 1024, 2048, 4096]
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
MODELS = {  # model -> (variant, train_length, base ppl)
    "rope-1k": ("rope", 1024, 12.0),
    "org/alibi 1k": ("alibi", 1024, 14.0),
}
ERR_CELL = ("org/alibi 1k", 4096, 0.5)  # every sample of this cell fails: one error row


def _row(**kw):
    base = dict(run_id="r1", n_tokens=None, seed=0, status="ok", error="", wall_s=0.1,
                peak_mem_bytes=1000, device="cpu", dtype="float32", lctx_version="0.1.0",
                git_rev="abc", timestamp="2026-01-01T00:00:00")
    base.update(kw)
    if base["n_tokens"] is None:
        base["n_tokens"] = base["length"]
    return base


def _exact(m, L, d, s):
    # deterministic, varied: short contexts succeed, long ones fail more, by depth and sample
    return float((L <= 1024) or ((int(d * 4) + s + L // 1024) % 3 == 0))


def _digit(m, L, d, s):
    return round(min(1.0, 1.2 - L / 4096 + 0.1 * d - 0.05 * s + (0.1 if m == "rope-1k" else 0.0)), 4)


def synthetic() -> pd.DataFrame:
    rows = []
    for m, (var, tl, base) in MODELS.items():
        for L in LENGTHS:
            for d in DEPTHS:
                if (m, L, d) == ERR_CELL:
                    rows.append(_row(model=m, variant=var, task="passkey", metric=None, length=L,
                                     depth=d, sample=0, value=np.nan, status="error",
                                     error="OutOfMemoryError: CUDA out of memory", train_length=tl))
                    continue
                for s in range(2):
                    rows.append(_row(model=m, variant=var, task="passkey", metric="exact", length=L,
                                     depth=d, sample=s, value=_exact(m, L, d, s), train_length=tl))
                    rows.append(_row(model=m, variant=var, task="passkey", metric="digit_acc",
                                     length=L, depth=d, sample=s, value=_digit(m, L, d, s),
                                     train_length=tl))
            ppl = base * (1.0 if L <= tl else (L / tl) ** 3)
            for metric, v in (("ppl", ppl), ("nll", math.log(ppl)), ("n_tokens", 8 * L), ("n_docs", 4)):
                rows.append(_row(model=m, variant=var, task="ppl", metric=metric, length=L,
                                 depth=np.nan, sample=0, value=float(v), train_length=tl))
    df = pd.DataFrame(rows)
    df["length"] = df["length"].astype("int64")
    df["n_tokens"] = df["n_tokens"].astype("int64")
    df["train_length"] = df["train_length"].astype("float64")
    return df


def _check_png(path, min_bytes=10_000):
    assert path.exists(), path
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > min_bytes
    w, h = struct.unpack(">II", data[16:24])  # IHDR width/height
    assert 300 < w < 3000 and 200 < h < 2000, (w, h)
    return w, h


def test_make_plots_writes_pngs(tmp_path):
    df = synthetic()
    paths = make_plots(df, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted([
        "passkey_heatmap_rope-1k.png",
        "passkey_heatmap_org_alibi_1k.png",
        "ppl_vs_length.png",
    ])
    for p in paths:
        assert p.parent == tmp_path / "plots"
        _check_png(p)


def test_passkey_grid_means_match_hand_computed():
    df = synthetic()
    for m in MODELS:
        for metric, fn in (("exact", _exact), ("digit_acc", _digit)):
            grid = passkey_grid(df, m, metric)
            assert list(grid.index) == DEPTHS  # 0 first: top row of the heatmap
            assert list(grid.columns) == LENGTHS
            for L in LENGTHS:
                for d in DEPTHS:
                    if (m, L, d) == ERR_CELL:
                        continue
                    expected = (fn(m, L, d, 0) + fn(m, L, d, 1)) / 2
                    assert grid.loc[d, L] == pytest.approx(expected), (m, metric, L, d)
    # one spot check by hand: rope-1k, 4096 tokens, depth 0.25 -> samples 1 - 0 + 0.025 + 0.1 (-0.05)
    g = passkey_grid(df, "rope-1k", "digit_acc")
    assert g.loc[0.25, 4096] == pytest.approx(((0.325) + (0.275)) / 2)


def test_error_cell_is_nan_and_flagged():
    df = synthetic()
    m, L, d = ERR_CELL
    for metric in ("exact", "digit_acc"):
        grid = passkey_grid(df, m, metric)
        assert math.isnan(grid.loc[d, L])
        assert int(grid.isna().to_numpy().sum()) == 1  # only that cell
        errs = passkey_errors(df, m, metric)
        assert bool(errs.loc[d, L]) and int(errs.to_numpy().sum()) == 1
        counts = passkey_counts(df, m, metric)
        assert counts.loc[d, L] == 0 and (counts.to_numpy().sum() == 2 * (len(LENGTHS) * len(DEPTHS) - 1))
    # the other model is unaffected
    assert not passkey_grid(df, "rope-1k", "exact").isna().to_numpy().any()


def test_partial_error_keeps_ok_mean():
    df = synthetic()
    sel = ((df.model == "rope-1k") & (df.task == "passkey") & (df.length == 2048)
           & (df.depth == 0.75) & (df["sample"] == 1))
    df.loc[sel, "status"] = "error"
    df.loc[sel, "value"] = 0.0  # must be ignored: not an ok row
    grid = passkey_grid(df, "rope-1k", "digit_acc")
    assert grid.loc[0.75, 2048] == pytest.approx(_digit("rope-1k", 2048, 0.75, 0))
    assert not passkey_errors(df, "rope-1k", "digit_acc").loc[0.75, 2048]
    assert passkey_counts(df, "rope-1k", "digit_acc").loc[0.75, 2048] == 1


def test_absent_tasks_are_skipped(tmp_path):
    df = synthetic()
    only_ppl = df[df.task == "ppl"]
    assert passkey_heatmaps(only_ppl, tmp_path) == []
    assert [p.name for p in make_plots(only_ppl, tmp_path)] == ["ppl_vs_length.png"]
    only_passkey = df[df.task == "passkey"]
    assert ppl_vs_length(only_passkey, tmp_path / "x") is None
    assert not (tmp_path / "x").exists()
    assert len(make_plots(only_passkey, tmp_path / "y")) == 2
    assert make_plots(df.iloc[0:0], tmp_path / "z") == []


def test_single_length_and_unknown_train_length(tmp_path):
    df = synthetic()
    df = df[df.length == 1024].copy()
    df["train_length"] = np.nan
    for p in make_plots(df, tmp_path):
        _check_png(p, min_bytes=5_000)


def test_helpers():
    assert [format_length(n) for n in (256, 512, 1024, 2048, 1536, 131072, 1048576, 1000)] == [
        "256", "512", "1K", "2K", "1.5K", "128K", "1M", "1000"]
    assert safe_filename("org/model name:v1") == "org_model_name_v1"
    assert safe_filename("../..") == "model"


def test_palette_pairs_are_distinct():
    """20 series (bench.png draws 14) get 20 different (colour, marker) pairs; the first 10 keep tab10's
    colours in order, and the 11th reuses colour 0 with another marker (and a dashed line)."""
    from lctx.harness.outputs.plots import palette, series_style

    pal = palette([f"s{i}" for i in range(20)])
    pairs = [(c, m) for c, m, _ in pal.values()]
    assert len(set(pairs)) == 20
    assert len({c for c, _ in pairs[:10]}) == 10
    assert pal["s10"][0] == pal["s0"][0] and pal["s10"][1] != pal["s0"][1] and pal["s10"][2] != "-"
    assert len({series_style(i)[:2] for i in range(110)}) == 110  # 10 colours x 11 markers, coprime


def test_run_and_report_draw_one_ppl_figure(tmp_path):
    """lctx run's ppl_vs_length.png and the report's perplexity panel come from one function (draw_ppl)."""
    import lctx.harness.outputs.report as report
    from lctx.harness.outputs import plots

    # the report draws its perplexity figure with plots' own (which draws with draw_ppl), not a copy of its own
    assert report.perplexity_figure is plots.perplexity_figure and not hasattr(report, "_draw_ppl")
    calls = []
    real = plots.draw_ppl

    def spy(ax, table, pal):
        calls.append(sorted(pal))
        return real(ax, table, pal)

    plots.draw_ppl = spy
    try:
        df = pd.DataFrame({"model": ["m", "m"], "variant": ["rope", "rope"], "task": ["ppl", "ppl"],
                           "metric": ["ppl", "ppl"], "length": [256, 512], "value": [10.0, 12.0],
                           "status": ["ok", "ok"], "train_length": [256, 256]})
        assert plots.ppl_vs_length(df, tmp_path) is not None
    finally:
        plots.draw_ppl = real
    assert calls == [["m (rope)"]]


# ------------------------------------------------------------------------------- issue 24: labels, subtitles

def _figure_texts(fig):
    """(figure-level texts, axes titles) of a drawn figure."""
    return [t for t in fig.texts if t.get_text()], [ax.get_title() for ax in fig.axes if ax.get_title()]


def test_teacher_forced_panels_say_so():
    """Issue 24 item 4: passkey digit_acc (and NIAH tf_top1) are scored teacher-forced; their heatmap panel says
    so, exact's (greedy) does not."""
    from lctx.harness.outputs.plots import _heatmap_figure

    fig = _heatmap_figure(synthetic(), "rope-1k", None, "rope", "passkey")
    _, titles = _figure_texts(fig)
    flat = [t.replace("\n", " ") for t in titles]
    assert any(t.startswith("Digit accuracy") and "(teacher-forced)" in t for t in flat), flat
    assert any(t.startswith("Exact match") and "teacher-forced" not in t for t in flat), flat
    niah = synthetic().replace({"task": {"passkey": "niah_single_1"}, "metric": {"digit_acc": "tf_top1"}})
    fig = _heatmap_figure(niah, "rope-1k", None, "rope", "niah_single_1",
                          {"exact": "exact", "tf_top1": "tf_top1"}, "niah_single_1")
    flat = [t.replace("\n", " ") for t in _figure_texts(fig)[1]]
    assert "tf_top1 (teacher-forced)" in flat and "exact" in flat, flat


def test_long_subtitle_is_wrapped_inside_the_figure():
    """Issue 24 item 7: a subtitle wider than the figure (one length: a narrow figure; errors, an off-depth
    needle and a training length all named) was clipped at both edges; it is wrapped onto lines that lie
    inside the figure, as do the title and panel titles."""
    from lctx.harness.outputs.plots import _heatmap_figure

    df = synthetic()
    df = df[df["model"] == "org/alibi 1k"].copy()
    df = df[df["length"] == 4096]  # the length of ERR_CELL: one errored cell
    df["depth_off"] = (df["depth"] == 0.25) & (df["sample"] == 0)
    df.loc[df["status"] == "error", "depth_off"] = False
    df["train_length"] = 4096.0
    df["model"] = "org/alibi 1k with a rather long checkpoint name that runs past the figure"
    fig = _heatmap_figure(df, df["model"].iloc[0], None, "alibi", "passkey")
    texts, _ = _figure_texts(fig)
    for dpi in (80, 130):  # 130: the PNGs' (plots._DPI); at 80 the renderer's hinting draws text widest
        fig.set_dpi(dpi)
        fig.canvas.draw()
        _inside(fig, texts + [ax.title for ax in fig.axes if ax.get_title()])
    sub = [t for t in texts if t.get_fontsize() < 12]
    assert len(sub) >= 2, [t.get_text() for t in sub]  # wrapped onto several lines
    joined = "  ·  ".join(t.get_text() for t in sub)
    for part in ("errored cell", "off its depth", "training length 4K"):
        assert part in joined, joined


def _inside(fig, artists):
    """Every text artist lies inside the figure, and none overlaps another (title, subtitle lines, panels)."""
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    exts = [t.get_window_extent(renderer) for t in artists]
    for t, e in zip(artists, exts):
        assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, (t.get_text(), e, box)
    exts.sort(key=lambda e: -e.y1)
    for a, b in zip(exts, exts[1:]):
        assert b.y1 <= a.y0 + 1 or b.x1 <= a.x0 or a.x1 <= b.x0, (a, b)


def test_wrap_to_width_keeps_every_word():
    from lctx.harness.outputs.plots import wrap_to_width

    parts = ["n = 2 samples per cell (status ok)", "3 errored cells (err)", "a" * 10 + " " + "b" * 10]
    lines = wrap_to_width(parts, 1.5, 9.5)
    assert len(lines) > 3 and " ".join(lines).replace("  ·  ", " ").split() == " ".join(parts).split()
    assert wrap_to_width(parts, 40, 9.5) == ["  ·  ".join(parts)]  # wide enough: one line


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


@pytest.mark.usefixtures("plain_console")
def test_train_lengths_coloured_by_model_and_clear_of_titles(tmp_path, monkeypatch):
    """Issue 16 item 6: training lengths are marked in each model's colour, clear of the axes titles."""
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


# ---------------------------------------------------------------------------------------------- positional methods

@pytest.mark.slow  # a report table loaded and two figures built (not rendered): ~2.0 CPU s, busy 2 cores (load 2.7)
def test_positional_methods_figures_one_line_and_one_panel_per_method(tmp_path, monkeypatch):
    """Issue 43 item 5, on test_report's run of a checkpoint as shipped and under two methods (built from records).
    Retrieval vs length: one line per method (its legend name its label) whose points are positional_retrieval's
    means, each with its interval as a band, the declared maxima and the training length marked; the heatmaps: one
    panel per method in one row, a cell the method did not run drawn empty ("–"), not 0."""
    from test_report import M_EXACT, M_NIAH, METHODS, MT, _means, _method_run, _method_tables

    from lctx.harness.outputs import plots
    from lctx.harness.outputs.report import load_runs, method_series, palette

    run = _method_run(tmp_path / "run", list(METHODS))
    (disp, num, info), positions, members = _method_tables([run])
    table, _ = load_runs([run])
    series = method_series(table, members, info["titles"], info["tasks"])
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, name: figs.append(fig) or out / name)
    pal = palette(members)
    maxes = {m: positions[m]["max_positions"] for m in members}
    plots.methods_retrieval_figure(series, tmp_path, "smol", pal, info["titles"], 0.8, MT, maxes)
    axes = [ax for ax in figs[0].axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["passkey: exact", "niah_single_2: string_match_all"]
    names = set(info["titles"].values())
    for ax, task in zip(axes, ("passkey", "niah_single_2")):
        lines = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_label() in names}
        ran = {info["titles"][m] for m in members if (series[(series["task"] == task)]["label"] == m).any()}
        assert set(lines) == ran  # one line per method that ran the task (linear did not run niah_single_2)
        for m in members:
            title = info["titles"][m]
            if title not in ran:
                continue
            x, y = lines[title].get_data()
            src = M_EXACT if task == "passkey" else M_NIAH
            model = positions[m]["name"]
            assert list(x) == sorted(src[model]) and list(y) == pytest.approx([_means(src[model])[L] for L in x])
        assert len(ax.collections) == len(ran)  # a band each
        vlines = [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_label() in ("_max", "_train")
                  and len(ln.get_xdata()) == 2]
        # the training length, and the declared maximum of each method drawn in this panel within 2x of its longest
        # length (niah_single_2 ran to 512: yarn's 2K is named at the edge instead)
        longest = series.loc[series["task"] == task, "length"].max()
        drawn = [maxes[m] for m in members if info["titles"][m] in ran and maxes[m] <= 2 * longest]
        assert sorted(vlines) == sorted([MT] + drawn)
        far = [f"{info['titles'][m]}: max {maxes[m] // 1024}K →" for m in members
               if info["titles"][m] in ran and maxes[m] > 2 * longest]
        assert [t.get_text() for t in ax.texts if "max" in t.get_text()] == far
    # a declared maximum far past the longest length drawn (> 2x) is named at the edge, not drawn as a line there
    figs.clear()
    plots.methods_retrieval_figure(series, tmp_path, "smol", pal, info["titles"], 0.8, MT, {members[0]: 65536})
    ax = next(ax for ax in figs[0].axes if ax.get_title() == "passkey: exact")
    assert [t.get_text() for t in ax.texts if "max" in t.get_text()] == ["shipped: max 64K →"]
    assert not [ln for ln in ax.get_lines() if ln.get_label() == "_max"] and ax.get_xlim()[1] < 65536
    figs.clear()
    plots.method_heatmaps(table, tmp_path, "niah_single_2", members, info["titles"], "smol", train_len=MT)
    panels = [ax for ax in figs[0].axes if (ax.get_gid() or "").startswith("method:")]
    # one row, a panel per method in the table's order; linear ran no niah_single_2: its panel says so
    assert [ax.get_title() for ax in panels] == ["shipped", "linear:factor=2 (not run)", "yarn:factor=4"]
    assert len({round(ax.get_position().y0, 6) for ax in panels}) == 1  # one row
    texts = [t.get_text() for t in panels[1].texts]
    assert texts and set(texts) == {"–"}, texts
    assert "0.00" not in texts
