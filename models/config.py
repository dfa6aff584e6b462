"""Configuration of the native lctx decoder (a ``transformers`` ``PretrainedConfig``) and the typed option
schema of every attention variant (:data:`VARIANT_OPTIONS`): ``variant_options`` with a key a variant does
not know, or a value of the wrong type, is refused with the list of valid keys instead of being ignored."""

from __future__ import annotations

import math
from dataclasses import dataclass

from transformers import PretrainedConfig

from lctx import ATTN_IMPLS

# Version of the variant options' defaults. 1: configs saved before the field existed (GGD-BAM legacy
# form, one prior shared by all layers, content-only SSMax, acc_rot spread 1.0). 2: the seeds' and the
# reference code's defaults (issue 12). A config.json without ``options_version`` is version 1.
OPTIONS_VERSION = 2


@dataclass(frozen=True)
class Opt:
    """One variant option: its type (``bool``, ``int``, ``float`` or ``str``), default, allowed values
    (``choices``, for strings) and a one-line description."""

    type: type
    default: object
    doc: str = ""
    choices: tuple = ()

    def describe(self) -> str:
        """``"lsh_samples"``-style help: the type, the choices and the default, e.g. ``int, default 16``."""
        kind = "|".join(self.choices) if self.choices else self.type.__name__
        default = str(self.default).lower() if isinstance(self.default, bool) else self.default
        return f"{kind}, default {default}"


#: The options of each variant and modifier (a composed ``"ggd_bam+ssmax"`` takes the union). The code that
#: reads them is the variant's (``models/bam.py``, ``lsh.py``, ``rotations.py``, ``path.py``,
#: ``interdomain.py``); a variant registered elsewhere may declare its own ``option_schema`` class attribute.
VARIANT_OPTIONS: dict[str, dict[str, Opt]] = {
    "rope": {}, "nope": {}, "alibi": {}, "sinusoidal": {},
    "ggd_bam": {"ggd_form": Opt(str, "reference", "prior form: reference -e^theta(|j-i-mu|+eps)^beta, paper "
                                "-(|(j-i-mu)/alpha|+eps)^beta, legacy (options_version 1)",
                                ("reference", "paper", "legacy")),
                "ggd_shared": Opt(bool, False, "one prior for all layers (BAM's global_positional_encoding)"),
                "ggd_learn_mu": Opt(bool, False, "learn the prior's centre mu"),
                "ggd_eps": Opt(float, 1e-5, "epsilon inside |z| + eps")},
    "ssmax": {"ssmax_scale_bias": Opt(bool, False, "scale the prior too (BAM's seq_scale on the bias; "
                                      "default true with ggd_bam)")},
    "alibi_lsh": {"lsh_samples": Opt(int, 16, "random binnings s"), "lsh_seed": Opt(int, 0, "seed of layer 0"),
                  "lsh_block": Opt(int, 128, "query block of the reference"),
                  "lsh_resample_eval": Opt(bool, False, "resample the bins at evaluation"),
                  "lsh_exact_dispatch": Opt(bool, True, "fast path on CPU: run exact ALiBi where every query "
                                                         "shares a bin with every key in all samples")},
    "acc_rot": {"acc_rot_mode": Opt(str, "random", "random or learned increments", ("random", "learned")),
                "acc_rot_spread": Opt(float, 0.25, "std of the random increments / scale of the learned map (rad)"),
                "acc_rot_base": Opt(str, "rope", "base frequencies", ("rope", "zero")),
                "acc_rot_seed": Opt(int, 0, "seed of the random increments"),
                "rotate_values": Opt(bool, False, "transport values too")},
    "path": {"path_w_rank": Opt(int, 32, "rank of the w projection (0 = full)"),
             "path_conv_size": Opt(int, 3, "short conv width (0 = none)"),
             "path_forget_gate": Opt(bool, False, "PaTH-FoX forget gate"),
             "path_block": Opt(int, 64, "block size of the reference")},
    "interdomain": {"id_modes": Opt(int, 16, "complex modes N per head"), "id_chunk": Opt(int, 64, "scan chunk"),
                    "id_conv": Opt(int, 4, "short conv width K"),
                    "id_feature_norm": Opt(str, "l2", "feature map norm", ("l2", "sq")),
                    "id_input_norm": Opt(str, "joint", "RMSNorm of [xi(k); v]", ("joint", "split")),
                    "id_readout": Opt(str, "linear", "readout", ("linear", "normalized")),
                    "id_eta_eps": Opt(float, 1e-2, "eps of the normalized readout"),
                    "id_conj": Opt(bool, True, "conjugate-transpose readout"),
                    "id_dt_min": Opt(float, 1e-3, "smallest initial Delta"),
                    "id_dt_max": Opt(float, 1e-1, "largest initial Delta")},
    "s4d": {"s4d_modes": Opt(int, 16, "modes N per channel"), "s4d_chunk": Opt(int, 64, "scan chunk"),
            "s4d_dt_min": Opt(float, 1e-3, "smallest initial Delta"),
            "s4d_dt_max": Opt(float, 1e-1, "largest initial Delta")},
}


def option_schema(variant: str) -> dict[str, Opt] | None:
    """The options ``variant`` takes (a composed ``"base+mod"`` takes the union of its parts), or ``None``
    when a part declares none (a variant registered outside lctx without an ``option_schema``)."""
    from .variants import MODIFIERS, VARIANTS

    out: dict[str, Opt] = {}
    for part in str(variant).split("+"):
        sch = VARIANT_OPTIONS.get(part)
        if sch is None:
            cls = VARIANTS.get(part) or MODIFIERS.get(part)
            sch = getattr(cls, "option_schema", None)
        if sch is None:
            return None
        out.update(sch)
    return out


def _type_ok(opt: Opt, v) -> bool:
    if opt.type is bool:
        return isinstance(v, bool)
    if opt.type is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if opt.type is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if opt.type is str:
        return isinstance(v, str) and (not opt.choices or v in opt.choices)
    return isinstance(v, opt.type)


def check_variant_options(variant: str, options: dict | None) -> None:
    """Refuse keys ``variant`` does not take and values of the wrong type (see :data:`VARIANT_OPTIONS`).

    Raises:
        ValueError: ``options`` is not a dict, has an unknown key (the message lists the valid keys with
            their types and defaults) or a value of the wrong type or outside the choices.
    """
    if options is None:
        return
    if not isinstance(options, dict):
        raise ValueError(f"variant_options must be a JSON object of KEY: VALUE, got {type(options).__name__}")
    schema = option_schema(variant)
    if schema is None:
        return
    valid = ", ".join(f"{k} ({o.describe()})" for k, o in schema.items()) or "none"
    for k, v in options.items():
        if k not in schema:
            raise ValueError(f"variant {variant!r} has no option {k!r}; valid options: {valid}")
        opt = schema[k]
        if not _type_ok(opt, v):
            want = (f"one of {', '.join(map(repr, opt.choices))}" if opt.choices else
                    {"bool": "true or false", "int": "an integer", "float": "a finite number"}.get(
                        opt.type.__name__, opt.type.__name__))
            raise ValueError(f"variant option {k}={v!r} of {variant!r} is not {want}")


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
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {', '.join(ATTN_IMPLS)}, got {attn_impl!r}")
        from .variants import get_variant

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
    from .variants import get_variant

    try:
        cls = get_variant(variant)
    except KeyError:
        return {}
    return dict(cls.option_defaults(version))
