"""``logn``: log-n attention scaling (Chiang & Cholak 2022, "Overcoming a Theoretical Limitation of
Self-Attention", arXiv 2202.12172, Section 5.3: scale the logits by log n; Su 2021, "Entropy invariance and the
scaling of attention", kexue.fm/archives/8823: by log n / log n_train so the training length keeps its
logits): the logits of query i are multiplied by

    log(n_i) / log(n_train),   n_i = the keys query i may attend to

which is Scalable-Softmax (:mod:`lctx.models.position.ssmax`) with the fixed scale s = 1 / log(n_train), at 1 at
the training length ("logits x log n / log n_train, fixed"), applied the same way (transformers'
attention interface; native lctx checkpoints' ``+ssmax`` variant). Option: ``train_length`` (n_train; default the
checkpoint's training length, else its max_position_embeddings). :func:`reference` is the formula.
"""

from __future__ import annotations

import math

from lctx.errors import LctxError
from lctx.models.options import Opt

from .base import register_position
from .ssmax import SSMax, held_scale


def reference(n: float, train_length: int) -> float:
    """The log-n logit multiplier log(n) / log(n_train) for ``n`` visible keys."""
    return math.log(n) / math.log(train_length)


@register_position
class LogN(SSMax):
    """log(n) / log(n_train) logit scaling (:mod:`lctx.models.position.logn`)."""

    name = "logn"
    options = {"train_length": Opt(int, None, "n_train (>= 2); default the checkpoint's training length, else its "
                                              "max_position_embeddings")}
    source = ("Chiang & Cholak 2022, arXiv 2202.12172, Section 5.3; Su 2021 (kexue.fm/archives/8823): logits x "
              "log(n) / log(n_train) (SSMax, arXiv 2501.19399 eq. 1, with s = 1 / log(n_train))")
    summary = "log-n scaling: logits x log(n) / log(n_train) (SSMax with s = 1/log(n_train))"

    def __init__(self, **options):
        super().__init__(**options)
        self.train_length: int | None = None

    def validate(self) -> None:
        """``train_length`` >= 2 when given.

        Raises:
            LctxError: one line naming the fix."""
        n = self.options.get("train_length")
        if n is not None and n < 2:
            raise LctxError(f"--position logn: train_length={n} has no log to divide by; pass the training context "
                            "in tokens (>= 2), or leave it out for the checkpoint's")

    def scale(self, lm) -> float:
        """1 / log(n_train), n_train the option, else ``lm.train_length``, else ``lm.max_length``.

        Raises:
            LctxError: none is known."""
        n = self.options.get("train_length") or getattr(lm, "train_length", None) or getattr(lm, "max_length", None)
        if not n or n < 2:
            raise LctxError(f"--position logn: model {getattr(lm, 'name', '?')!r} declares no training length; pass "
                            "logn:train_length=N")
        self.train_length = int(n)
        return 1.0 / math.log(self.train_length)

    def effective(self, lm) -> dict:
        """``{"s": the scale the model holds, "train_length": n_train}``."""
        return {"s": held_scale(lm.model), "train_length": self.train_length}

    def record(self) -> dict:
        """As :meth:`PositionMethod.record`, with the n_train resolved (``resolved``)."""
        return {**super().record(), "resolved": {"train_length": self.train_length}}
