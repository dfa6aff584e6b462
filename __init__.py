"""lctx: a long-context evaluation harness for positional-encoding and attention-variant research.

The repository's top-level folders are installed as subpackages of ``lctx``:
``lctx.models`` (native decoder and attention variants), ``lctx.kernels`` (fast paths),
``lctx.tasks`` (passkey, ppl, custom tasks), ``lctx.harness`` (runner, tables, plots)
and ``lctx.cli`` (the ``lctx`` command).
"""

__version__ = "0.1.0"

__all__ = ["evaluate", "Result", "__version__"]


def __getattr__(name: str):
    """Lazy exports, so ``import lctx`` stays light (no torch, pandas or transformers until used):
    :func:`lctx.evaluate` and :class:`lctx.Result` (:mod:`lctx.harness.evaluate`)."""
    if name in ("evaluate", "Result"):
        from lctx.harness import evaluate as _ev

        return getattr(_ev, name)
    raise AttributeError(f"module 'lctx' has no attribute {name!r}")
