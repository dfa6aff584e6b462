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
