"""``--position sinks``: attention sinks (StreamingLLM; Xiao et al. 2023, "Efficient Streaming Language Models with
Attention Sinks", arXiv 2309.17453, Sec. 3.2; reference implementation mit-han-lab/streaming-llm
``streaming_llm/kv_cache.py`` (``StartRecentKVCache``) and ``streaming_llm/pos_shift/modify_llama.py`` at commit
d729b3ffc947caca63fc0f7644b7468ca2d50881).

Each query attends to the first ``n_sink`` tokens and to the last ``window`` tokens (itself included), through
transformers' attention interface (:mod:`._attention`); the fast path slices the key/value tensors to the sink keys
and each query block's band of recent keys, so the work per query is O(window), not O(T)
(:func:`lctx.kernels.position_attention.sinks_attention`; its plain reference
:func:`~lctx.kernels.position_attention.sinks_reference`). ``reassign=false`` keeps every key at its true position
(the KV cache as lctx fills it); ``reassign=true`` places the sink keys right before the window, as the paper's
position shift does inside its rolling cache.
"""

from __future__ import annotations

from typing import ClassVar

from lctx.errors import LctxError
from lctx.models.options import Opt

from ._attention import AttentionMethod
from .base import register_position


@register_position
class Sinks(AttentionMethod):
    """StreamingLLM's attention sinks on a Hugging Face RoPE model (module docstring). Options: ``n_sink`` (first
    tokens every query sees, default 4, the paper's), ``window`` (recent tokens, the query included; default 2048),
    ``reassign`` (the paper's position shift; default false). The addressable length is unbounded
    (:meth:`max_length`: None)."""

    name: ClassVar[str] = "sinks"
    options: ClassVar[dict] = {
        "n_sink": Opt(int, 4, "the first tokens every query attends to (the attention sinks)"),
        "window": Opt(int, 2048, "the recent tokens each query attends to, itself included"),
        "reassign": Opt(bool, False, "positions re-assigned inside the cache (sinks right before the window), as "
                                     "the paper's rolling cache; false: every key keeps its true position"),
    }
    source: ClassVar[str] = ("Xiao et al. 2023, arXiv 2309.17453, Sec. 3.2; mit-han-lab/streaming-llm "
                             "streaming_llm/kv_cache.py, pos_shift/modify_llama.py @ d729b3f")
    summary: ClassVar[str] = "attention sinks (StreamingLLM): n_sink first tokens + a window of recent ones"

    def validate(self) -> None:
        """``window`` >= 1 and ``n_sink`` >= 0.

        Raises:
            LctxError: one line naming the option and the fix."""
        if self.options["window"] < 1:
            raise LctxError(f"--position sinks: window={self.options['window']} holds no token; pass the recent "
                            "tokens each query sees (>= 1), e.g. sinks:window=2048")
        if self.options["n_sink"] < 0:
            raise LctxError(f"--position sinks: n_sink={self.options['n_sink']} is negative; pass the first tokens "
                            "every query sees (>= 0; the paper uses 4)")

    def max_length(self, original: int | None) -> int | None:
        """None: a window of recent keys plus the sinks addresses any length."""
        return None
