"""Evaluation tasks and their registry.

Built-in tasks register on import: ``passkey`` (:mod:`lctx.tasks.passkey`) and ``ppl``
(:mod:`lctx.tasks.ppl`). A custom task subclasses :class:`Task` and is decorated with
:func:`register_task`; see the README's "Add your own task".
"""

from .base import TASKS, Cell, Sample, Task, get_task, load_entry_point_tasks, load_task_file, register_task
from . import passkey, ppl  # noqa: F401,E402  (register the built-in tasks)

__all__ = ["TASKS", "Cell", "Sample", "Task", "get_task", "load_entry_point_tasks", "load_task_file",
           "register_task"]
