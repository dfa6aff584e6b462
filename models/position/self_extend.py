"""``--position self_extend``: Self-Extend (Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window
Without Tuning", arXiv 2401.01325, Sec. 3, eq. 3-4; reference implementation datamllab/LongLM
``self_extend_patch/Llama.py`` at commit 18950b5a9230c20b8016d4332a480ac31bf87fd3 and
``self_extend_patch/selfextend_flash_attn.py`` at 4137843c6e5ecb82b102dd636865182fe873d1f5).

Exact positions inside a neighbour window of ``window`` tokens; beyond it, floor-divided positions (key j at
floor(j / g), query i at floor(i / g) + w - floor(w / g)), one softmax over both parts. Through transformers'
attention interface (:mod:`._attention`): the queries and keys arrive rotated at their true positions and the
grouped part re-rotates them by the position deltas with the model's own ``inv_freq``; the two partial softmaxes
are merged by their log-sum-exps, as LongLM's flash path does
(:func:`lctx.kernels.position_attention.self_extend_attention`; its plain reference, LongLM's eager form with
explicit positions: :func:`~lctx.kernels.position_attention.self_extend_reference`).
"""

from __future__ import annotations

from typing import ClassVar

from lctx.errors import LctxError
from lctx.models.options import Opt

from ._attention import AttentionMethod
from .base import register_position


@register_position
class SelfExtend(AttentionMethod):
    """Self-Extend on a Hugging Face RoPE model (module docstring). Options: ``window`` (the neighbour window w,
    default 1024) and ``group`` (the group size g, default 8). The addressable length becomes (L - w) g + w for a
    model trained on L tokens (the paper's eq. 5 bound, :meth:`max_length`)."""

    name: ClassVar[str] = "self_extend"
    options: ClassVar[dict] = {
        "window": Opt(int, 1024, "the neighbour window w: tokens closer than w keep their exact positions"),
        "group": Opt(int, 8, "the group size g: positions beyond the window are floor-divided by g"),
    }
    source: ClassVar[str] = ("Jin et al. 2024, arXiv 2401.01325, eq. 3-4; datamllab/LongLM "
                             "self_extend_patch/Llama.py @ 18950b5, selfextend_flash_attn.py @ 4137843")
    summary: ClassVar[str] = "Self-Extend: exact positions in a neighbour window, floor(pos / group) beyond it"

    def validate(self) -> None:
        """``window`` >= 1 and ``group`` >= 2 (group 1 is the model as shipped).

        Raises:
            LctxError: one line naming the option and the fix."""
        w, g = self.options["window"], self.options["group"]
        if w < 1:
            raise LctxError(f"--position self_extend: window={w} holds no token; pass the neighbour window (>= 1), "
                            "e.g. self_extend:window=1024")
        if g < 2:
            raise LctxError(f"--position self_extend: group={g} leaves every position as it is (the shipped model); "
                            "pass a group size >= 2, e.g. self_extend:group=8")

    def max_length(self, original: int | None) -> int | None:
        """(original - window) x group + window: the longest input whose grouped positions stay inside the trained
        ones (Jin et al. 2024, eq. 5); None when ``original`` is unknown; ``original`` itself if it is not longer
        than the window."""
        if original is None:
            return None
        w, g = self.options["window"], self.options["group"]
        return original if original <= w else (original - w) * g + w
