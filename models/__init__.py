"""Native lctx models: :class:`LctxConfig`, :class:`LctxForCausalLM` and the attention-variant registry.

Importing this package registers ``model_type="lctx"`` with ``AutoConfig`` and ``AutoModelForCausalLM``,
so ``AutoModelForCausalLM.from_pretrained(dir)`` (and lm-eval's ``hf`` backend) load lctx checkpoints.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .config import LctxConfig
from .model import LctxForCausalLM, LctxModel
from .variants import (MODIFIERS, VARIANTS, AttentionVariant, alibi_slopes, get_variant, register_modifier,
                       register_variant)
from . import bam, lsh, rotations  # noqa: F401,E402  (register ggd_bam, +ssmax, alibi_lsh, acc_rot)
from . import path  # noqa: F401,E402  (registers path)
from . import interdomain  # noqa: F401,E402  (register interdomain, s4d)

AutoConfig.register("lctx", LctxConfig, exist_ok=True)
AutoModel.register(LctxConfig, LctxModel, exist_ok=True)
AutoModelForCausalLM.register(LctxConfig, LctxForCausalLM, exist_ok=True)

__all__ = ["LctxConfig", "LctxForCausalLM", "LctxModel", "VARIANTS", "AttentionVariant", "alibi_slopes",
           "get_variant", "register_variant", "register_modifier", "MODIFIERS"]
