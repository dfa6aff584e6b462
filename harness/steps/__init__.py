"""Derived steps over a run's table (:mod:`.derived`): the flatness sweep (:mod:`.flatness`), the RULER group's
average and effective length (:mod:`.ruler`), and lm-eval's tasks run on their own (:mod:`.lmeval_run`). A step
computes numbers and names the figures it wants; :mod:`lctx.harness.outputs.plots` draws them."""
