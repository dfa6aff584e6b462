"""The commands besides ``lctx run``: ``lctx train`` (:mod:`.train`), ``lctx bench`` (:mod:`.bench`),
``lctx diagnose`` (:mod:`.diagnostics`), and the GPU lease script (``python -m lctx.harness.commands.gpu_check``)."""
