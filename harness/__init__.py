"""The evaluation around the tasks: lctx.evaluate, the runner, tables, plots, report, compare, model adapter,
training, GGUF loading (see the README, "Layout")."""
