"""The evaluation around the tasks, in rooms (docs/development.md#layers; each layer imports only the ones before it):

- :mod:`lctx.harness.args`: the run's arguments parsed and checked before torch loads;
- :mod:`lctx.harness.run`: the sweep itself (runner, run directory, records -> tables, ranks, terminal);
- :mod:`lctx.harness.steps`: derived steps over a run's table (flatness, the RULER group, lm-eval's own run);
- :mod:`lctx.harness.outputs`: what a person reads (figures, the report, ``lctx compare``);
- :mod:`lctx.harness.commands`: the other commands (``lctx train``, ``bench``, ``diagnose``, the GPU check);
- :mod:`lctx.harness.evaluate`: ``lctx.evaluate``, the whole of ``lctx run`` as one call.

The model adapters (loading a checkpoint and running it for the tasks) live beside the models, in
:mod:`lctx.models.adapters`."""
