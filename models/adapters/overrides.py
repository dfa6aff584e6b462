"""Attention overrides on a loaded checkpoint (``lctx run --attn-override NAME[:KEY=VALUE,...]``).

Hugging Face models are changed through transformers' attention interface, not copied modeling code:
a function is registered with ``AttentionInterface.register`` (and the matching mask function with
``AttentionMaskInterface.register``), then selected with ``model.set_attn_implementation``. Every
model whose attention layers call ``ALL_ATTENTION_FUNCTIONS.get_interface(...)`` (Llama, Mistral,
Qwen2, GPT-NeoX, ... in transformers 5) takes it; others get a one-line :class:`LctxError`.

Overrides:

- ``ssmax`` (option ``s``, default 1): Scalable-Softmax (Nakanishi 2025, arXiv 2501.19399, eq. 1; seed
  000's ``+ssmax``): the logits of query i are multiplied by s * log(n_i), n_i = the keys query i may
  attend to (counted from the attention mask the model built; without one, the causal count
  Tk - Tq + i + 1). s is a fixed scalar here (no training). Implemented as q_i <- s log(n_i) q_i before
  transformers' own ``sdpa`` attention function (the logits are linear in q), with sdpa's mask function.
- ``alibi_lsh`` (options ``s`` samples, default 16, and ``seed``): ALiBi replaced by its positional-LSH
  approximation (seed 003, ``models/lsh.py``). Hugging Face's ALiBi models (BLOOM, MPT, Falcon with
  ``alibi=True``) add the ALiBi bias inside their own attention classes (``alibi.baddbmm`` in
  BloomAttention; ``position_bias`` in MptAttention) and never call the attention interface, so in
  transformers 5 there is no clean hook: lctx raises a :class:`LctxError` saying so. Native lctx
  checkpoints of variant ``alibi`` take it (their per-layer variant module is swapped for ``alibi_lsh``).

For native lctx checkpoints ``ssmax`` swaps each layer's variant for ``<variant>+ssmax`` with every
head's scale fixed to s (the variant's own parameters are kept).

The override is recorded in the results table: ``lm.variant`` becomes e.g. ``llama+ssmax`` or
``llama+ssmax:s=0.43``, and the model name gets the same suffix (``stories260K+ssmax_s0.43``), so runs
with and without it into one ``--out`` are separate samples (a sample's identity is keyed by model name)
and separate lines in the plots.
"""

from __future__ import annotations

import copy

import torch

from lctx.errors import LctxError
from lctx.models.variants import get_variant
from lctx.registry import Registry

from lctx.override_spec import OVERRIDES, AttnOverride, _fmt, parse_override  # noqa: F401  (light: no torch)

ALIBI_MODEL_TYPES = ("bloom", "mpt", "falcon")


# -- Scalable-Softmax through the attention interface -------------------------------------------------

def ssmax_factor(n: torch.Tensor, s: float) -> torch.Tensor:
    """The SSMax logit multiplier s * log(n) (Nakanishi 2025, eq. 1). n: visible keys, any shape, float."""
    return s * torch.log(n)


def visible_keys(attention_mask: torch.Tensor | None, q_len: int, k_len: int, device) -> torch.Tensor:
    """n_i, the keys each query may attend to: [B|1, 1|H, Tq, 1] float32.

    attention_mask: the mask the model hands its attention function: bool (True = visible), additive
    float (0 = visible, a large negative value = masked), or ``None`` (plain causal: the Tq queries
    are the last Tq of Tk positions, so query i sees Tk - Tq + i + 1 keys).
    """
    if attention_mask is None:
        return (torch.arange(q_len, device=device, dtype=torch.float32) + (k_len - q_len + 1)).view(1, 1, q_len, 1)
    if attention_mask.dtype == torch.bool:
        ok = attention_mask
    else:
        ok = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return ok[..., -k_len:].sum(-1, keepdim=True).float().clamp_min(1.0)


def _make_ssmax(base: str):
    def ssmax_attention(module, query, key, value, attention_mask, **kwargs):
        """Scalable-Softmax around transformers' ``{base}`` attention. query: [B, H, Tq, D]; key/value:
        [B, Hkv, Tk, D]; attention_mask as the model built it for ``{base}``. Returns what ``{base}`` does."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # lazy: loads torch.nn.attention.flex_attention

        cfg = getattr(module, "config", None)
        s = getattr(cfg, "lctx_ssmax_s", None)
        if s is None:
            raise RuntimeError(f"{type(module).__name__} has no config.lctx_ssmax_s; apply the override with "
                               "lctx.models.adapters.overrides.apply_override")
        n = visible_keys(attention_mask, query.shape[2], key.shape[2], query.device)
        c = ssmax_factor(n, float(s)).to(query.dtype)
        return ALL_ATTENTION_FUNCTIONS[base](module, query * c, key, value, attention_mask, **kwargs)

    ssmax_attention.__doc__ = ssmax_attention.__doc__.format(base=base)
    return ssmax_attention


def register_ssmax(base: str = "sdpa") -> str:
    """Register the SSMax wrapper of transformers' ``base`` attention (a key of ALL_ATTENTION_FUNCTIONS) and the matching
    mask function; returns the implementation name (``lctx_ssmax_<base>``) for ``set_attn_implementation``."""
    # lazy: loads torch.nn.attention.flex_attention
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface  # lazy: loads torch.nn.attention.flex_attention

    name = f"lctx_ssmax_{base}"
    AttentionInterface.register(name, _make_ssmax(base))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    return name


# -- applying an override to a loaded LM --------------------------------------------------------------

def apply_override(lm, override: AttnOverride | str) -> None:
    """Apply ``override`` to ``lm`` (an :class:`lctx.models.adapters.hf.HFAdapter`) in place; append its label to ``lm.variant``
    (``llama+ssmax:s=0.43``) and to ``lm.name`` (``name+ssmax_s0.43``).

    Raises:
        LctxError: the model cannot take the override (not softmax attention, not an ALiBi model, or an HF
            architecture whose attention does not go through transformers' attention interface).
    """
    ov = parse_override(override) if isinstance(override, str) else override
    model = lm.model
    if getattr(model.config, "model_type", None) == "lctx":
        _apply_native(model, ov)
    elif ov.name == "ssmax":
        _apply_hf_ssmax(model, ov.options["s"], lm.name)
        if hasattr(lm, "attn_impl"):
            lm.attn_impl = f"hf:{model.config._attn_implementation}"
    else:
        _refuse_hf_alibi_lsh(model, lm.name)
    lm.variant = f"{lm.variant}+{ov.label}"
    lm.name = f"{lm.name}+{ov.label.replace(':', '_').replace('=', '').replace(',', '_')}"


def _apply_hf_ssmax(model, s: float, name: str) -> None:
    cls = type(model)
    if not (getattr(cls, "_supports_attention_backend", False) and cls._can_set_attn_implementation()):
        raise LctxError(f"--attn-override ssmax: {cls.__name__} ({name!r}) computes attention in its own code, "
                        "not through transformers' AttentionInterface, so it cannot be overridden; use a model "
                        "whose attention does (e.g. Llama, Mistral, Qwen2)")
    current = model.config._attn_implementation
    if current.startswith("lctx_ssmax_"):
        raise LctxError(f"model {name!r} already has the ssmax override; apply it once")
    impl = register_ssmax("sdpa")
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    for cfg in configs.values():
        cfg.lctx_ssmax_s = float(s)
    model.set_attn_implementation(impl)
    if model.config._attn_implementation != impl:
        raise LctxError(f"--attn-override ssmax: transformers refused attention implementation {impl!r} for "
                        f"{cls.__name__}; this architecture cannot be overridden")


def _refuse_hf_alibi_lsh(model, name: str) -> None:
    cfg = model.config
    mt = getattr(cfg, "model_type", "?")
    uses_alibi = mt in ("bloom", "mpt") or (mt == "falcon" and getattr(cfg, "alibi", False))
    if uses_alibi:
        import transformers  # lazy: loads transformers

        raise LctxError(f"--attn-override alibi_lsh: {mt} models in transformers {transformers.__version__} add "
                        "ALiBi inside their own attention code, not through the attention interface, so there is no "
                        "clean hook; use a native lctx alibi checkpoint (lctx train --variant alibi)")
    raise LctxError(f"--attn-override alibi_lsh needs an ALiBi model; {name!r} ({mt}) does not use ALiBi")


def _apply_native(model, ov: AttnOverride) -> None:
    cfg = model.config
    base = cfg.variant
    if ov.name == "alibi_lsh":
        if base != "alibi":
            raise LctxError(f"--attn-override alibi_lsh needs an ALiBi model; this lctx checkpoint is {base!r}")
        new_cfg = copy.deepcopy(cfg)
        new_cfg.variant = "alibi_lsh"
        new_cfg.variant_options = dict(cfg.variant_options or {}, lsh_samples=int(ov.options["s"]),
                                       lsh_seed=int(ov.options["seed"]))
        make = lambda layer: get_variant("alibi_lsh")(new_cfg, layer)  # noqa: E731
    else:
        if "ssmax" in base.split("+"):
            raise LctxError(f"this lctx checkpoint is already {base!r}; --attn-override ssmax applies to plain softmax")
        try:
            cls = get_variant(f"{base}+ssmax")
        except KeyError as e:
            raise LctxError(f"--attn-override ssmax: {e.args[0]}") from None
        make = lambda layer: cls(cfg, layer)  # noqa: E731
    for i, block in enumerate(model.model.layers):
        old = block.attn.variant
        new = make(i)
        new.load_state_dict(old.state_dict(), strict=False)
        if ov.name == "ssmax":
            with torch.no_grad():
                new.ssmax_scale.fill_(float(ov.options["s"]))
        p = next(block.parameters())
        block.attn.variant = new.to(p.device).to(p.dtype).eval()
