"""lctx: a long-context evaluation harness for positional-encoding and attention-variant research.

The repository's top-level folders are installed as subpackages of ``lctx``, layered one way
(docs/development.md#layers): ``lctx.cli`` (the ``lctx`` command) -> ``lctx.harness`` (evaluation, runner,
tables, plots) -> ``lctx.tasks`` (passkey, ppl, RULER, lm-eval, custom tasks) -> ``lctx.models`` (native decoder
and attention variants) -> ``lctx.kernels`` (fast paths) -> this package root (:mod:`lctx.errors`).

From Python: ``lctx.evaluate(models, tasks, lengths=..., ...)`` runs what ``lctx run`` runs and returns the
tables (:class:`lctx.Result`).
"""

__version__ = "0.1.0"

from lctx.errors import LctxError  # noqa: E402  (light: the one user-error type, for every layer)
from lctx.attn_impl import ATTN_IMPL_REGISTRY  # noqa: E402  (light: no torch)

#: The names of the attention paths of lctx models (``--attn-impl``, ``LctxConfig.attn_impl``), in order:
#: ``reference`` (explicit softmax, the source of truth), ``sdpa`` (PyTorch SDPA with the bias as a mask),
#: ``fast`` (the kernels of :mod:`lctx.kernels`). What each does is its entry in
#: :data:`lctx.attn_impl.ATTN_IMPL_REGISTRY` (code looks the entry up; this tuple is for help text and checks).
ATTN_IMPLS = ATTN_IMPL_REGISTRY.names()

__all__ = ["ATTN_IMPLS", "evaluate", "Result", "LctxError", "__version__"]


def __getattr__(name: str):
    """Lazy exports, so ``import lctx`` stays light (no torch, pandas or transformers until used):
    :func:`lctx.evaluate` and :class:`lctx.Result` (:mod:`lctx.harness.evaluate`)."""
    if name in ("evaluate", "Result"):
        # lazy: the public API sits in lctx.harness, above the root (tests/test_layers.py ALLOWED)
        from lctx.harness import evaluate as _ev

        return getattr(_ev, name)
    raise AttributeError(f"module 'lctx' has no attribute {name!r}")
