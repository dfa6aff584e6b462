"""lctx.tasks (tasks/base.py, tasks/__init__.py): the task registry and task files."""

from __future__ import annotations

import pytest

from helpers import assert_one_line_error, run_cli


@pytest.mark.usefixtures("isolated_digests")
def test_task_file_calling_sys_exit(tmp_path, capsys):
    """Issue 10 item 15: a task file that calls sys.exit() while it is imported is one line."""
    f = tmp_path / "exits.py"
    f.write_text("import sys\nsys.exit(0)\n")
    code, _, err = run_cli(["run", "--task-file", f, "--tasks", "passkey", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "sys.exit(0)")


@pytest.mark.usefixtures("plain_console")
def test_unknown_task_error_lists_every_task(capsys, make_checkpoint, tmp_path):
    """Issue 16 item 4: an unknown task's error lists every task, lm-eval's and the derived ones included."""
    from lctx.tasks import TASKS

    code, _, err = run_cli(["run", "--model", make_checkpoint(), "--tasks", "pasky", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "unknown task 'pasky'", "mmlu", "arc_easy", "arc_challenge", "flatness",
                          *sorted(TASKS))


@pytest.mark.parametrize("make, key, near", [
    (lambda P, Q: P(key_digit=3), "key_digit", "key_digits"),
    (lambda P, Q: Q(max_token=500), "max_token", "max_tokens"),
    (lambda P, Q: Q(stride=0.5, strid=0.25), "strid", "stride"),
    (lambda P, Q: P(foo=1), "foo", None),
])
def test_task_objects_refuse_misspelt_options(make, key, near):
    """Issue 26 trial item 1: a task object's constructor took any keyword through ``**options``, so a misspelt
    option ran with the defaults (and sat in the resume key); it is refused, naming the valid options, as
    ``--task-option`` refuses it."""
    from lctx.errors import LctxError
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    with pytest.raises(LctxError) as e:
        make(Passkey, Perplexity)
    msg = str(e.value)
    assert f"has no option {key!r}" in msg and "valid options: " in msg and "\n" not in msg
    assert (f"did you mean {near}?" in msg) if near else "did you mean" not in msg
    valid = "key_digits, max_new_tokens" if "passkey" in msg else "stride, bos, short_docs, max_tokens"
    assert valid in msg


def test_task_objects_keep_their_options_and_the_runners_chat_options():
    """Control of the refusal: the named options, positional ones, and the options the runner adds itself
    (``chat_template``, ``system_prompt``: a record's ``task_options`` rebuild the object) still work, as does a
    subclass with options of its own and a constructor without a ``**`` catch-all (lm-eval's)."""
    from lctx.errors import LctxError
    from lctx.tasks import Task
    from lctx.tasks.base import RECORD_OPTIONS, constructor_options
    from lctx.tasks.lmeval import LmEvalTask
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    assert Passkey(key_digits=3).options == {"key_digits": 3, "max_new_tokens": None}
    assert Passkey(3).key_digits == 3 and Perplexity(stride=0.25, max_tokens=500).max_tokens == 500
    rebuilt = Passkey(key_digits=3, chat_template="on", system_prompt="Be brief.")
    assert {k: rebuilt.options[k] for k in RECORD_OPTIONS} == {"chat_template": "on", "system_prompt": "Be brief."}

    class Sub(Passkey):
        def __init__(self, stop_at=1, **kw):
            super().__init__(**kw)
            self.stop_at = stop_at

    assert Sub(stop_at=2, key_digits=4).key_digits == 4
    assert constructor_options(Sub) == (["stop_at", "key_digits", "max_new_tokens"], True)
    assert constructor_options(LmEvalTask) == (["spec", "suite"], False)  # closed: Python refuses the rest itself

    class Bare(Task):  # no constructor of its own: no option at all, as --task-option says ("valid options: none")
        name, metrics = "bare_test", ("x",)

    assert Bare().options == {}
    with pytest.raises(LctxError, match="valid options: none"):
        Bare(digits=3)


@pytest.mark.parametrize("attr", ["metrics", "axes"])
def test_register_task_refuses_a_str_where_a_tuple_belongs(attr):
    """Issue 26 trial item 7: ``metrics = "nll"`` is the letters n, l, l: every sample failed with "returned no value
    for ['n', 'l', 'l']". register_task refuses it in one line naming the fix; the tuple (control) registers."""
    from lctx.errors import LctxError
    from lctx.tasks import TASKS, Task, register_task

    attrs = {"name": "str_attr_test", "metrics": ("nll",), "axes": ("sample",)}
    bad = type("StrAttr", (Task,), dict(attrs, **{attr: attrs[attr][0]}))
    with pytest.raises(LctxError) as e:
        register_task(bad)
    assert str(e.value) == (f"task class StrAttr: {attr} = {attrs[attr][0]!r} is a str, not a tuple of names; write "
                            f"{attr} = ({attrs[attr][0]!r},)")
    assert "str_attr_test" not in TASKS
    try:
        assert register_task(type("StrAttr", (Task,), attrs)) is TASKS["str_attr_test"]
    finally:
        TASKS.pop("str_attr_test", None)


# ---------------------------------------------------------------------------------- bounds before work (issue 42.4)

#: constructor options that set a size (a count, a budget, a width): each must have a stated upper bound
SIZE_OPTION = r"max_new_tokens|facts|answer_words|needles|samples|num_\w+|freq_\w+|vocab_size|key_digits|" \
              r"max_tokens|coded_wordlen|windows"


def test_every_size_option_of_a_built_in_task_is_bounded():
    """Issue 42 item 4: every built-in task option with a size has a declared upper bound (Task.option_bounds), the
    one mechanism the runner checks before any work; ppl's ``windows`` is bounded by its constructor (2..10 000)."""
    import re

    from lctx.tasks import TASKS
    from lctx.tasks.base import constructor_options

    missing = []
    for name, cls in TASKS.items():
        for opt in constructor_options(cls)[0]:
            if re.fullmatch(SIZE_OPTION, opt) and not (name == "ppl" and opt == "windows"):
                bound = cls.option_bounds.get(opt)
                if bound is None or bound.hi is None:
                    missing.append(f"{name}.{opt}")
    assert not missing
    from lctx.tasks.ppl import Perplexity

    with pytest.raises(ValueError, match="windows must be a whole number from 2 to 10000"):
        Perplexity(windows=10_001)


@pytest.mark.parametrize("task, option, value", [
    ("babi_qa1", "facts", 1e8), ("mrcr", "answer_words", 99999999), ("json_kv", "max_new_tokens", 1e9),
    ("passkey", "max_new_tokens", 10**9), ("niah_single_1", "max_new_tokens", 10**9), ("vt", "num_hops", 10**9),
    ("cwe", "samples", 10**12), ("fwe", "vocab_size", 10**9)])
def test_a_size_far_out_of_range_is_refused_before_the_constructor_runs(task, option, value, tmp_path, monkeypatch):
    """Issue 42 item 5's tries (``babi_qa1.facts=1e8``, ``mrcr.answer_words=99999999`` took 3.5 GB,
    ``json_kv.max_new_tokens=1e9`` was accepted) and their kin: one line naming the option, its cap and the fix,
    before the task's constructor runs (patched to fail: no book is read, no story drawn) and before any folder is
    made, with a small allocation peak (tracemalloc: under 32 MB, where 1e8 facts are gigabytes)."""
    import functools
    import tracemalloc

    import lctx
    from lctx.tasks import TASKS

    @functools.wraps(TASKS[task].__init__)  # the same signature: its options stay known
    def boom(self, *a, **k):
        raise AssertionError("the constructor ran with an out-of-range option")

    monkeypatch.setattr(TASKS[task], "__init__", boom)
    lctx.evaluate  # noqa: B018 - imported before the peak is measured
    tracemalloc.start()
    try:
        with pytest.raises(lctx.LctxError) as e:
            lctx.evaluate(None, task, task_options={task: {option: value}}, out=tmp_path / "o", log=lambda m: None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"bad --task-option {task}.{option} for task '{task}': {option}=")
    assert "is above" in msg and "; pass a whole number" in msg
    assert peak < 32 << 20 and not (tmp_path / "o").exists()


def test_a_size_option_the_longest_length_cannot_hold_is_refused():
    """A budget or a count that alone fills the run's longest length is refused with the largest that fits
    (check_bounds_at; ``lctx run`` calls it before any sample is built); control: at a longer length it passes."""
    import lctx
    from lctx.tasks.base import check_bounds_at
    from lctx.tasks.json_kv import JsonKV

    t = JsonKV(max_new_tokens=4096)
    with pytest.raises(ValueError, match=r"^max_new_tokens=4096 \(tokens\) cannot fit in 2048 tokens, the longest "
                                         r"length of this run; pass max_new_tokens=2047 or less, or longer --lengths$"):
        check_bounds_at(t, [256, 2048])
    check_bounds_at(t, [256, 8192])  # control
    check_bounds_at(JsonKV(), [16])  # a default (not given) is not checked: the template check answers for it
    with pytest.raises(lctx.LctxError, match=r"^bad --task-option json_kv.max_new_tokens for task 'json_kv': "
                                             r"max_new_tokens=4096 \(tokens\) cannot fit in 1024 tokens.*--lengths$"):
        lctx.evaluate(None, "json_kv", lengths=[512, 1024], task_options={"json_kv": {"max_new_tokens": 4096}},
                      log=lambda m: None)


def test_n_cells_counts_what_cells_makes():
    """Task.n_cells (the grid's bound, counted without making it) equals len(cells()) for the axes kinds: depth and
    sample (passkey), windows per length (ppl), a samples option of its own (fwe)."""
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity
    from lctx.tasks.ruler import FrequentWordsExtraction

    for t in (Passkey(), Perplexity(), Perplexity(windows=5), FrequentWordsExtraction(samples=7),
              FrequentWordsExtraction()):
        assert t.n_cells(3, 4, 2) == len(t.cells([1, 2, 3], [0.0, 0.5, 0.7, 1.0], 2)), t.name


def test_the_runs_grid_is_bounded_before_anything_is_built(tmp_path):
    """``--samples`` at most MAX_SAMPLES, and the run's cells (its tasks' summed) at most MAX_CELLS, each one line
    before any folder is made; control: one task's grid at the bound passes the first check and two such tasks are
    refused as a sum."""
    import lctx
    from lctx.harness.args import MAX_SAMPLES
    from lctx.tasks.base import MAX_CELLS

    out = tmp_path / "o"
    with pytest.raises(lctx.LctxError, match=rf"^samples=1000000000 is above {MAX_SAMPLES}, the most samples per "
                                             rf"cell.*pass --samples {MAX_SAMPLES} or fewer$"):
        lctx.evaluate(None, "passkey", samples=10**9, out=out, log=lambda m: None)
    with pytest.raises(lctx.LctxError, match=rf"^this run's grid is 3 lengths x 1000 depths x 5000 samples = "
                                             rf"15000000 cells a task, above {MAX_CELLS}"):
        lctx.evaluate(None, "passkey", samples=5000, depths="random:1000", lengths="256,512,1k", out=out,
                      log=lambda m: None)
    depths = [i / 99 for i in range(100)]
    with pytest.raises(lctx.LctxError, match=rf"^this run's grid is {2 * MAX_CELLS} cells in all \(passkey, "
                                             r"json_kv\), above"):
        lctx.evaluate(None, "passkey,json_kv", samples=MAX_SAMPLES, depths=depths, lengths=[256], out=out,
                      log=lambda m: None)
    assert not out.exists()
