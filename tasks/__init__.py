"""Evaluation tasks and their registry.

Built-in tasks register on import: ``passkey`` (:mod:`lctx.tasks.passkey`), ``ppl``
(:mod:`lctx.tasks.ppl`), RULER's eight NIAH tasks ``niah_*`` (:mod:`lctx.tasks.niah`) and its other five,
``vt``, ``cwe``, ``fwe`` (:mod:`lctx.tasks.ruler`), ``qa_1``, ``qa_2`` (:mod:`lctx.tasks.ruler_qa`), ``json_kv`` (:mod:`lctx.tasks.json_kv`, HELMET's key-value recall), ``babi_qa1``-``babi_qa3`` (:mod:`lctx.tasks.babi`,
bAbI/BABILong-style reasoning over facts in book text), ``mrcr`` (:mod:`lctx.tasks.mrcr`, OpenAI MRCR's
multi-round coreference). A custom task subclasses :class:`Task` and is decorated with
:func:`register_task`; see docs/custom-tasks.md. What the runner and the outputs need of a task (its
run-wide flags, its own lengths, its data check, its figures, its extra tables) it declares on its class
(:class:`Task`'s docstring); names that are not one class (lm-eval's ``mmlu``/``arc_*``, the derived ``flatness`` and
``ruler``) declare through their :class:`TaskGroup`.
"""

from .base import (CATEGORIES, GROUPS, PLOT_KINDS, TASKS, Cell, Heatmap, RunOption, Sample, Task, TaskFamily, TaskGroup,
                   TaskInfo, TaskMeta, Unavailable, all_run_options, declared, default_tasks, extra_tables, get_task, group_of,
                   group_of_label, load_entry_point_tasks, load_task_file, optional_metrics, pooled_label,
                   register_group, register_task, task_catalog, task_meta)
from . import babi, json_kv, lmeval, mrcr, niah, passkey, ppl, ruler, ruler_qa  # noqa: F401,E402  (register the built-in tasks)

__all__ = ["CATEGORIES", "TASKS", "Cell", "Sample", "Task", "TaskInfo", "get_task", "load_entry_point_tasks", "load_task_file",
           "register_group", "register_task", "task_catalog", "GROUPS", "TaskMeta", "task_meta", "RunOption", "Heatmap",
           "PLOT_KINDS", "TaskGroup", "TaskFamily", "group_of", "group_of_label", "declared", "default_tasks",
           "all_run_options", "pooled_label", "extra_tables", "Unavailable", "optional_metrics"]
