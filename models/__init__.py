"""Native lctx models: :class:`LctxConfig`, :class:`LctxForCausalLM` and the attention-variant registry.

Importing this package registers every built-in variant (torch only) and ``model_type="lctx"`` with
``AutoConfig`` and ``AutoModelForCausalLM`` (:func:`register_with_transformers`), so
``AutoModelForCausalLM.from_pretrained(dir)`` (and lm-eval's ``hf`` backend) load lctx checkpoints.
``LctxConfig``, ``LctxForCausalLM`` and ``LctxModel`` are imported on first use. Start-up: the
transformers modeling stack costs seconds and ~200 MiB; commands that only need the registry (``lctx
list variants``) set ``lctx._light_import = True`` before importing this package, which then skips the
registration until one of those names is used or :func:`register_with_transformers` is called.
"""

from .variants import (MODIFIERS, VARIANTS, AttentionVariant, alibi_slopes, get_variant, register_modifier,
                       register_variant)
from . import bam, lsh, rotations  # noqa: F401,E402  (register ggd_bam, +ssmax, alibi_lsh, acc_rot)
from . import path  # noqa: F401,E402  (registers path)
from . import interdomain  # noqa: F401,E402  (register interdomain, s4d)

_HF_NAMES = ("LctxConfig", "LctxForCausalLM", "LctxModel")
_registered = False


def register_with_transformers() -> None:
    """Register ``model_type="lctx"`` with transformers' ``AutoConfig``, ``AutoModel`` and
    ``AutoModelForCausalLM`` (imports the modeling stack; idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM  # lazy: loads transformers

    from .config import LctxConfig  # lazy: loads transformers
    from .model import LctxForCausalLM, LctxModel  # lazy: loads transformers

    AutoConfig.register("lctx", LctxConfig, exist_ok=True)
    AutoModel.register(LctxConfig, LctxModel, exist_ok=True)
    AutoModelForCausalLM.register(LctxConfig, LctxForCausalLM, exist_ok=True)
    _registered = True


def __getattr__(name: str):
    if name in _HF_NAMES:
        register_with_transformers()
        from . import config, model  # lazy: loads transformers

        return getattr(config if name == "LctxConfig" else model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


import lctx as _lctx  # noqa: E402

if not getattr(_lctx, "_light_import", False):
    register_with_transformers()

__all__ = ["LctxConfig", "LctxForCausalLM", "LctxModel", "VARIANTS", "AttentionVariant", "alibi_slopes",
           "get_variant", "register_variant", "register_modifier", "MODIFIERS", "register_with_transformers"]
