"""Evaluation tasks and their registry.

Built-in tasks register on import: ``passkey`` (:mod:`lctx.tasks.passkey`), ``ppl``
(:mod:`lctx.tasks.ppl`), RULER's eight NIAH tasks ``niah_*`` (:mod:`lctx.tasks.niah`) and its other five,
``vt``, ``cwe``, ``fwe`` (:mod:`lctx.tasks.ruler`), ``qa_1``, ``qa_2`` (:mod:`lctx.tasks.ruler_qa`). A custom task subclasses :class:`Task` and is decorated with
:func:`register_task`; see the README's "Add your own task".
"""

from .base import (GROUPS, TASKS, Cell, Sample, Task, TaskInfo, TaskMeta, get_task, load_entry_point_tasks,
                   load_task_file, register_group, register_task, task_catalog, task_meta)
from . import lmeval, niah, passkey, ppl, ruler, ruler_qa  # noqa: F401,E402  (register the built-in tasks)

__all__ = ["TASKS", "Cell", "Sample", "Task", "TaskInfo", "get_task", "load_entry_point_tasks", "load_task_file",
           "register_group", "register_task", "task_catalog", "GROUPS", "TaskMeta", "task_meta"]
