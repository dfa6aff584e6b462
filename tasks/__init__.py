"""Evaluation tasks and their registry.

Built-in tasks register on import: ``passkey`` (:mod:`lctx.tasks.passkey`), ``ppl``
(:mod:`lctx.tasks.ppl`) and RULER's eight NIAH tasks ``niah_*`` (:mod:`lctx.tasks.niah`). A custom task subclasses :class:`Task` and is decorated with
:func:`register_task`; see the README's "Add your own task".
"""

from typing import NamedTuple

from .base import TASKS, Cell, Sample, Task, get_task, load_entry_point_tasks, load_task_file, register_task
from . import niah, passkey, ppl  # noqa: F401,E402  (register the built-in tasks)

__all__ = ["TASKS", "Cell", "Sample", "Task", "TaskInfo", "get_task", "load_entry_point_tasks", "load_task_file",
           "register_task", "task_catalog"]


class TaskInfo(NamedTuple):
    """One line of ``lctx list tasks``: a name ``lctx run --tasks`` accepts."""

    name: str
    description: str
    metrics: tuple[str, ...]
    requires: str


def task_catalog() -> list[TaskInfo]:
    """Every task name ``lctx run --tasks`` accepts, sorted: the registered tasks (built-in, ``--task-file``,
    plug-ins loaded so far), lm-eval's ``mmlu``/``arc_*`` (:mod:`lctx.tasks.lmeval`; ``mmlu_<subject>`` and
    ``mmlu_<category>`` too) and the derived ``flatness`` sweep (:mod:`lctx.harness.flatness`)."""
    from lctx.harness import flatness

    from . import lmeval

    out = [TaskInfo(n, c.description, tuple(c.metrics), c.requires) for n, c in TASKS.items()]
    for n in lmeval.DESCRIPTION:
        out.append(TaskInfo(n, lmeval.DESCRIPTION[n], lmeval.METRICS[n], lmeval.REQUIRES[n]))
    out.append(TaskInfo(flatness.TASK, flatness.DESCRIPTION, flatness.METRICS, "as ppl and the retrieval task"))
    return sorted(out, key=lambda t: t.name)
