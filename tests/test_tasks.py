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
