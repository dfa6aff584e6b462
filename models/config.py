"""Configuration of the native lctx decoder (a ``transformers`` ``PretrainedConfig``); ``variant_options`` are
checked against the variant's typed option schema (:mod:`lctx.models.options`): a key the variant does not
know, or a value of the wrong type, is refused with the list of valid keys instead of being ignored."""

from __future__ import annotations

import math
from dataclasses import dataclass

from transformers import PretrainedConfig

from lctx.attn_impl import ATTN_IMPL_REGISTRY

from .options import OPTIONS_VERSION, Opt, check_variant_options, option_schema  # noqa: F401
from .variants import get_variant


class LctxConfig(PretrainedConfig):
    """Hyper-parameters of :class:`lctx.models.model.LctxForCausalLM`.

    The positional scheme is the ``variant`` field (a name from :data:`lctx.models.variants.VARIANTS`,
    e.g. ``"rope"``, ``"alibi"``, ``"sinusoidal"``, ``"nope"``), so a checkpoint records how it sees
    position and ``from_pretrained`` rebuilds the same attention.

    Args:
        vocab_size: number of token ids.
        hidden_size: model width d (channels).
        num_hidden_layers: number of decoder blocks.
        num_attention_heads: H; ``hidden_size`` must be divisible by it (head dim d/H).
        intermediate_size: SwiGLU hidden width (default: 8/3 d rounded up to a multiple of 32).
        variant: positional variant name (see ``lctx list variants``).
        variant_options: extra per-variant settings (a dict stored in ``config.json``).
        rope_theta: RoPE base (Su et al. 2021, eq. 15; 10000 in the paper).
        max_position_embeddings: the largest length (tokens) the checkpoint claims it can address, or
            ``None`` when the variant has no hard limit (all native variants compute positions on the fly).
        train_length: context length (tokens) the model was trained at; the harness marks it on plots.
        attn_impl: ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention`` with the variant's bias
            as an additive mask), ``"reference"`` (the explicit softmax, the source of truth in tests) or
            ``"fast"`` (the variant's kernel from :mod:`lctx.kernels`: Triton on CUDA, FlexAttention or a
            chunked form on CPU; falls back to ``"sdpa"`` where a variant has none).
        rms_norm_eps: epsilon of RMSNorm.
        tie_word_embeddings: share the input embedding and output projection.
        initializer_range: std of the normal init of linear and embedding weights.
        options_version: version of the variant options' defaults (:data:`OPTIONS_VERSION` for a new
            config; a ``config.json`` without the field loads as version 1, see :meth:`from_dict`). The
            defaults that changed (each variant's ``option_defaults``) are written into
            ``variant_options``, so the saved config records them.

    Raises:
        ValueError: non-positive sizes, ``hidden_size`` not divisible by ``num_attention_heads``, or an
            odd head dim with ``rope``, or an unknown ``attn_impl``; an unknown ``variant``; a
            ``variant_options`` key the variant does not take or a value of the wrong type
            (:func:`check_variant_options`).
    """

    model_type = "lctx"

    def __init__(
        self,
        vocab_size: int = 1024,
        hidden_size: int = 128,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        intermediate_size: int | None = None,
        variant: str = "rope",
        variant_options: dict | None = None,
        rope_theta: float = 10000.0,
        max_position_embeddings: int | None = None,
        train_length: int | None = None,
        attn_impl: str = "sdpa",
        rms_norm_eps: float = 1e-5,
        tie_word_embeddings: bool = True,
        initializer_range: float = 0.02,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        pad_token_id: int | None = 0,
        options_version: int = OPTIONS_VERSION,
        **kwargs,
    ):
        if ATTN_IMPL_REGISTRY.get_interface(attn_impl) is None:
            raise ValueError(f"attn_impl must be one of {', '.join(ATTN_IMPL_REGISTRY)}, got {attn_impl!r}")

        try:
            get_variant(variant)
        except KeyError as e:
            raise ValueError(str(e.args[0]) if e.args else f"unknown attention variant {variant!r}") from None
        check_variant_options(variant, variant_options)
        if num_attention_heads < 1 or hidden_size < 1:
            raise ValueError(f"hidden_size ({hidden_size}) and num_attention_heads ({num_attention_heads}) "
                             "must be positive")
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_attention_heads}; "
                "pick a head count that divides the width"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        if variant == "rope" and self.head_dim % 2:
            raise ValueError(f"rope needs an even head dim, got {self.head_dim} "
                             f"(hidden_size {hidden_size} / {num_attention_heads} heads); change either")
        if intermediate_size is None:
            intermediate_size = 32 * ((8 * hidden_size // 3 + 31) // 32)
        self.intermediate_size = intermediate_size
        self.variant = variant
        self.options_version = int(options_version)
        self.variant_options = {**_versioned_defaults(variant, self.options_version), **dict(variant_options or {})}
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.train_length = train_length
        self.attn_impl = attn_impl
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """Build from a ``config.json`` dict (``from_pretrained`` comes here). A dict without
        ``options_version`` was saved before the field existed: it loads as version 1, so the variant
        keeps the options it was trained with."""
        if "options_version" not in config_dict:
            config_dict = {**config_dict, "options_version": 1}
        return super().from_dict(config_dict, **kwargs)


def _versioned_defaults(variant: str, version: int) -> dict:
    """The option defaults of ``variant`` at ``version`` (empty for an unknown variant: the model
    constructor reports that)."""

    try:
        cls = get_variant(variant)
    except KeyError:
        return {}
    return dict(cls.option_defaults(version))
