"""The commands besides ``lctx run``: ``lctx train`` (:mod:`.train`), ``lctx bench`` (:mod:`.bench`),
``lctx diagnose`` (:mod:`.diagnostics`), and the GPU lease script ``lctx gpu-check`` (:mod:`.gpu_check`; ``python3 harness/commands/gpu_check.py`` uninstalled)."""
