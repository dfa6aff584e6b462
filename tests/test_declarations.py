"""Issue 26 part 2: tasks declare what the runner needs, and the runner obeys.

The runner's entry (``harness/evaluate.py``), the tables (``harness/**/tables.py``) and the figures
(``harness/outputs/plots.py``) name no registered task: a string literal there equal to a task or group name, or
starting with a name family (``niah_``, ``mmlu_``, ...), fails :func:`test_runner_tables_and_figures_name_no_task`.
What they need of a task comes from its declarations (:class:`lctx.tasks.Task`, :class:`lctx.tasks.RunOption`,
:class:`lctx.tasks.TaskGroup`); the other tests give a task *not* built in those declarations and check the runner,
the tables and the figures obey them.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pandas as pd
import pytest

from lctx.errors import LctxError
from lctx.tasks import (GROUPS, TASKS, Heatmap, RunOption, Task, TaskGroup, extra_tables, pooled_label, register_group,
                        register_task)

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------- no task names in the runner's files

def strict_files(root: Path = ROOT) -> list[Path]:
    """The files that must name no task: harness/evaluate.py, every harness/**/tables.py, harness/outputs/plots.py."""
    return [root / "harness" / "evaluate.py", *sorted((root / "harness").rglob("tables.py")),
            root / "harness" / "outputs" / "plots.py"]


def registered_names() -> tuple[set[str], tuple[str, ...]]:
    """(every registered task and group name, the name prefixes of families: ``niah_``, ``mmlu_`` (the names MMLU's
    group claims), ``arc_``, ``qa_``)."""
    from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived steps' names)

    names = set(TASKS) | set(GROUPS)
    prefixes = {n.split("_", 1)[0] + "_" for n in names if "_" in n}
    prefixes |= {g.name + "_" for g in GROUPS.values() if type(g).claims is not TaskGroup.claims}  # mmlu_<subject>
    return names, tuple(sorted(prefixes))


def task_name_literals(path: Path, names: set[str], prefixes: tuple[str, ...]) -> list[str]:
    """``file:line: 'literal'`` for every string literal of ``path`` (f-string parts included) that is a task or
    group name or starts with a family prefix."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value
            if v in names or v.startswith(prefixes):
                out.append(f"{path.name}:{node.lineno}: {v!r}")
    return out


def test_runner_tables_and_figures_name_no_task():
    files = strict_files()
    assert {p.relative_to(ROOT).as_posix() for p in files} >= {
        "harness/evaluate.py", "harness/run/tables.py", "harness/outputs/plots.py"}
    names, prefixes = registered_names()
    assert {"passkey", "ppl", "niah_single_1", "vt", "cwe", "fwe", "qa_1", "qa_2", "mmlu", "arc_easy",
            "arc_challenge", "flatness", "ruler"} <= names and {"niah_", "mmlu_"} <= set(prefixes)
    found = [hit for p in files for hit in task_name_literals(p, names, prefixes)]
    assert not found, ("task names in the runner's, the tables' or the figures' code (declare what is needed on the "
                       "task instead, lctx.tasks.Task):\n" + "\n".join(found))


def test_the_name_check_catches_one(tmp_path):
    # the control: a file that branches on names, as evaluate.py and plots.py did, is caught (and a docstring or a
    # comment that mentions one is not a literal equal to it)
    bad = tmp_path / "evaluate.py"
    bad.write_text('"""Runs ppl and passkey."""\n\n'
                   'def f(t, task):\n'
                   '    if t.name == "ppl":  # ppl keeps logits\n'
                   '        return f"{task}"\n'
                   '    return task.startswith("mmlu_astronomy"), task in ("niah_single_1",), "passkey_heatmap"\n')
    names, prefixes = registered_names()
    assert task_name_literals(bad, names, prefixes) == [
        "evaluate.py:4: 'ppl'", "evaluate.py:6: 'mmlu_astronomy'", "evaluate.py:6: 'niah_single_1'"]


# ------------------------------------------------------------------------- a task the runner has never seen

@pytest.fixture
def declared_task():
    """A registered task that declares a run option (``--stride``, as ppl does), lengths of its own (``--window``),
    a figure kind and a heatmap; removed again after the test."""

    class Windowed(Task):
        """A test task: one window per length."""

        name = "windowed_test"
        axes = ("depth", "sample")
        metrics = ("score", "loss")
        run_options = (RunOption("--stride", "stride", "hop", 0.5, "a hop of 0.1 to 1"),
                       RunOption("--window", "window", None, None, "window sizes like --window 64,128", lengths=True))
        option_hints = {"width": "a width of 1 or more"}
        keeps_logits = True
        plots = ("perplexity_vs_length", "depth_heatmap")
        heatmap = Heatmap(title="Windowed retrieval", depth_label="Window depth", panels={"score": "Score panel"})

        def __init__(self, hop: float = 0.5, width: int = 1, **options):
            if not 0.1 <= float(hop) <= 1:
                raise ValueError(f"hop must be in [0.1, 1], got {hop}")
            if int(width) < 1:
                raise ValueError(f"width must be >= 1, got {width}")
            super().__init__(hop=hop, width=width, **options)

        def check_lengths(self, lengths):
            if min(lengths) < 32:
                raise ValueError(f"hop {self.options['hop']}: a window of {min(lengths)} tokens is below 32")

    register_task(Windowed)
    try:
        yield Windowed
    finally:
        TASKS.pop(Windowed.name, None)


def test_run_options_warnings_defaults_and_errors_come_from_the_declarations(declared_task, tmp_path):
    from lctx.harness.evaluate import _build_tasks, _ignored_options
    from lctx.tasks import get_task

    values = dict(stride=0.25, window=None, ppl_data=None, ppl_bos="prepend", ppl_short_docs="drop",
                  ppl_max_tokens=32768, key_digits=5, limit=None, num_fewshot=None)
    # --stride is used by any task that declares it: no warning with the test task alone; named for passkey alone,
    # with both its users
    assert _ignored_options([declared_task.name], [], **values) is None
    assert _ignored_options(["passkey"], [], **values) == (
        "warning: --stride (ppl/windowed_test) is ignored: no task of this run uses it (tasks: passkey)")
    # the flag's value becomes the option it names; the task's own --task-option wins
    obj, = _build_tasks([declared_task.name], {}, get_task, tmp_path, None, None, values)
    assert obj.options["hop"] == 0.25
    obj, = _build_tasks([declared_task.name], {declared_task.name: {"hop": 1}}, get_task, tmp_path, None, None, values)
    assert obj.options["hop"] == 1
    # a bad value names the declared flag and hint, or the --task-option and the option's hint
    with pytest.raises(LctxError, match=r"^bad --stride for task 'windowed_test': hop must be in \[0.1, 1\], got 5; "
                                        r"pass a hop of 0.1 to 1$"):
        _build_tasks([declared_task.name], {}, get_task, tmp_path, None, None, dict(values, stride=5))
    with pytest.raises(LctxError, match=r"^bad --task-option windowed_test.width for task 'windowed_test': .*; "
                                        r"pass a width of 1 or more$"):
        _build_tasks([declared_task.name], {declared_task.name: {"width": 0}}, get_task, tmp_path, None, None, values)
    # the lengths it runs at are its check_lengths'
    with pytest.raises(LctxError, match=r"bad --stride for task 'windowed_test': hop 0.25: a window of 16 tokens"):
        _build_tasks([declared_task.name], {}, get_task, tmp_path, None, None, values, {declared_task.name: [16, 64]})


def test_a_run_option_lctx_run_lacks_is_named(declared_task, tmp_path):
    from lctx.harness.evaluate import _build_tasks
    from lctx.tasks import get_task

    declared_task.run_options = (RunOption("--hop", "hop", "hop", 0.5),)
    with pytest.raises(LctxError, match=r"task 'windowed_test' declares the run option --hop .* which lctx run does "
                                        r"not have; .* --task-option windowed_test.hop=VALUE"):
        _build_tasks([declared_task.name], {}, get_task, tmp_path, None, None, {"stride": 0.5})


def test_own_lengths_are_parsed_once_and_checked_before_torch(declared_task):
    from lctx.harness.evaluate import _check_before_torch

    seen = []

    def build(names, opts, lengths):
        seen.append(lengths)
        return []

    values = dict(stride=0.5, window="64,1k", limit=None, num_fewshot=None)
    own = _check_before_torch(None, [declared_task.name, "passkey"], [], [128], values, False, "cpu", True,
                              build=build, data_dir=None, samples=1, depths=[0.5])
    assert own == {"window": [64, 1024]}
    assert seen == [{declared_task.name: [64, 1024], "passkey": [128]}]  # its own lengths, the others' --lengths
    with pytest.raises(LctxError, match=r"^--window '6x' is not a positive integer; write window sizes like "
                                        r"--window 64,128$"):
        _check_before_torch(None, [declared_task.name], [], [128], dict(values, window="6x"), False, "cpu", True,
                            build=build, data_dir=None, samples=1, depths=[0.5])
    # a run without a task that takes --window does not read it (lctx.evaluate warns that it is ignored)
    assert _check_before_torch(None, ["passkey"], [], [128], dict(values, window="6x"), False, "cpu", True,
                               build=build, data_dir=None, samples=1, depths=[0.5]) == {}


def test_kept_logits_and_relative_lengths_follow_the_declarations(declared_task, monkeypatch):
    import lctx.models.adapters.memory as memory
    from lctx.harness.evaluate import _check_before_run

    kept = []
    monkeypatch.setattr(memory, "check_run_fits", lambda lms, longest, kept_logits=1: kept.append((longest, kept_logits)))
    t = declared_task(hop=0.5)
    _check_before_run([([], [128, 512])], [t], {t.key: [64, 1024]}, False, True)
    _check_before_run([([], [128, 512])], [t], None, False, True)
    declared_task.keeps_logits = False
    _check_before_run([([], [128, 512])], [t], None, False, True)
    assert kept == [(1024, 1024), (512, 512), (512, 1)]
    with pytest.raises(LctxError, match=r"bad --stride for task 'windowed_test': hop 0.5: a window of 16 tokens"):
        _check_before_run([([], [16, 512])], [t], None, False, False, relative=True)  # --relative's lengths


def _rows(task, metrics, lengths=(64, 128), depths=(0.0, 0.5), **extra):
    return pd.DataFrame([dict(model="m", variant="rope", task=task, metric=m, length=L, depth=d, sample=0,
                              value=v, status="ok", error="", train_length=64, **extra)
                         for L in lengths for d in depths for m, v in metrics.items()])


def test_figures_come_from_the_declared_kinds(declared_task, tmp_path):
    from lctx.harness.outputs import plots

    df = _rows(declared_task.name, {"score": 0.5, "loss": 3.0})
    assert plots.figure_kinds(df, declared_task.name) == ("perplexity_vs_length", "depth_heatmap")
    assert plots.heatmap_panels(df, declared_task.name) == {"score": "Score panel"}
    fig = plots._heatmap_figure(df, "m", None, "rope", declared_task.name)
    texts = [t.get_text() for t in fig.texts] + [ax.get_ylabel() for ax in fig.axes]
    assert any("Windowed retrieval" in t for t in texts) and "Window depth" in texts
    # an undeclared task with depths gets the default heatmap, of its [0, 1] metrics; without depths, nothing
    other = _rows("undeclared_test", {"acc": 0.5, "nll": 3.0})
    assert plots.figure_kinds(other, "undeclared_test") == ("depth_heatmap",)
    assert plots.heatmap_panels(other, "undeclared_test") == {"acc": "acc"}
    assert plots.figure_kinds(other.assign(depth=None), "undeclared_test") == ()
    declared_task.plots = ("perplexity_vs_length",)
    assert [p.name for p in plots.make_plots(df, tmp_path)] == [f"{declared_task.name}_vs_length.png"]


def test_extra_tables_and_pooled_labels_are_the_groups(tmp_path):
    from lctx.harness.run.tables import summarize
    from lctx.harness.steps.derived import write_run_tables

    class Pooled(TaskGroup):
        def pooled_label(self, subtasks):
            return f"{self.name}[{'+'.join(sorted(subtasks))}]"

        def extra_tables(self, table):
            rows = table[table["task"] == self.name]
            return {"pooled_parts.csv": rows[["task", "metric", "value"]]} if len(rows) else {}

    register_group(Pooled("pooled_test", "a test group", ("acc",)))
    try:
        recs = [{"model": "m", "variant": "rope", "task": "pooled_test", "length": None, "depth": None, "sample": i,
                 "metrics": {"acc": float(i % 2)}, "status": "ok", "error": "", "seed": 0,
                 "task_options": {"subject": s}, "train_length": None} for i, s in enumerate(["b", "a"])]
        (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        table, summary = write_run_tables(tmp_path)
        assert summary["task"].tolist() == ["pooled_test[a+b]"]  # the cell named as the group declares
        assert pooled_label("pooled_test", ["x"]) == "pooled_test[x]" and pooled_label("nosuch", ["x"]) == "nosuch"
        assert set(extra_tables(table)) == {"pooled_parts.csv"}
        assert len(pd.read_csv(tmp_path / "pooled_parts.csv")) == 2  # written beside summary.csv
        assert summarize(table.assign(task_options="{}"))["task"].tolist() == ["pooled_test"]  # no sub-tasks
    finally:
        GROUPS.pop("pooled_test", None)
