"""Compatibility: the errors moved to the package root, :mod:`lctx.errors` (issue 13, layers: every layer
may raise :class:`lctx.errors.LctxError` without importing the harness). Import from there."""

from lctx.errors import (EXIT_ALL_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, CapturedLog,  # noqa: F401
                         LctxError, NonFiniteLogitsError, check_finite_logits, split_list)
