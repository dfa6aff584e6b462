"""``theta``: a plain ``rope_theta`` override (HELMET's only positional setting; Xiong et al. 2023, "Effective
Long-Context Scaling of Foundation Models", arXiv 2309.16039, Section 2.1, raise the base from 10,000 to 500,000):
RoPE's base b is replaced, the rest of the checkpoint's table kept (its ``rope_type`` and options):

    θ_i = b'^(-2i/d)      (RoPE: Su et al. 2021, eq. 15, with b' for 10000)

It claims no longer context (lctx keeps the checkpoint's maximum: pass ``--allow-beyond-max`` to go past it).
Options: ``rope_theta`` (b' > 0, required), ``layers`` (Gemma 3). :func:`reference` is the formula in plain
Python, for the tests.
"""

from __future__ import annotations

from lctx.errors import LctxError
from lctx.models.options import Opt

from ._rope import LAYERS_OPT, RopeMethod
from .base import _fmt, register_position


def reference(dim: int, base: float) -> tuple[list[float], float]:
    """Plain RoPE's frequencies for base ``base``: (b^(-2i/d) for i < d/2, 1.0)."""
    return [base ** (-2 * i / dim) for i in range(dim // 2)], 1.0


@register_position
class Theta(RopeMethod):
    """A ``rope_theta`` override (:mod:`lctx.models.position.theta`)."""

    name = "theta"
    options = {"rope_theta": Opt(float, None, "the new RoPE base b (> 0); required"), "layers": LAYERS_OPT}
    source = "Su et al. 2021, eq. 15 with another base (Xiong et al. 2023, arXiv 2309.16039, Section 2.1; HELMET)"
    summary = "a plain rope_theta override (the base of every frequency)"
    extends = False
    requires_factor = False

    def validate(self) -> None:
        """``rope_theta`` given and > 0.

        Raises:
            LctxError: one line naming the fix."""
        b = self.options.get("rope_theta")
        if b is None:
            raise LctxError("--position theta needs rope_theta=B, the new RoPE base: e.g. --position "
                            "theta:rope_theta=500000")
        if b <= 0:
            raise LctxError(f"--position theta: rope_theta={_fmt(b)} is not a RoPE base; pass a number > 0 (e.g. "
                            "rope_theta=500000)")

    def rope_parameters(self, params: dict, cfg, original: int) -> dict:
        """The shipped table with ``rope_theta`` replaced."""
        return {**params, "rope_theta": float(self.options["rope_theta"])}

    def factor(self) -> float | None:
        """None: a base override claims no extension."""
        return None
