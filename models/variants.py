"""Positional / attention variants of the native decoder: one registry, each variant a small module.

A variant is an ``nn.Module`` subclass of :class:`AttentionVariant` registered under a name with
:func:`register_variant`. The decoder's attention layer projects q, k, v and hands them to its variant,
which owns everything positional: rotating q/k, adding a logit bias, or (for fixed-state mixers in later
variants) replacing softmax attention altogether. A variant may also add a signal to the input
embeddings (:meth:`AttentionVariant.input_embedding`, used by ``sinusoidal``). The options a variant takes
(``config.variant_options``) are its class attribute ``option_schema`` ({name: :class:`lctx.models.options.Opt`},
the one place their defaults are written), read through :meth:`AttentionVariant.option_values`.

Shapes used throughout: B batch, H heads, Tq new query tokens, Tk keys visible through the KV cache
(past + new), D head dim. Positions are integer token indices (``LongTensor``), measured from the first
non-padding token of each row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lctx.attn_impl import AttnImpl, get_attn_impl
from lctx.kernels import record_impl
from lctx.registry import Registry

VARIANTS: Registry[type["AttentionVariant"]] = Registry("attention variant")
MODIFIERS: Registry[type["AttentionVariant"]] = Registry("attention modifier")
_COMPOSED: dict[str, type["AttentionVariant"]] = {}


def register_variant(name: str) -> Callable[[type], type]:
    """Class decorator: register an :class:`AttentionVariant` under ``name``.

    Raises:
        ValueError: ``name`` is already registered.
    """

    return VARIANTS.decorator(name, setup=lambda cls: setattr(cls, "variant_name", name))


def register_modifier(name: str) -> Callable[[type], type]:
    """Class decorator: register a modifier (a mixin subclass of :class:`AttentionVariant`) that
    composes with any softmax variant as ``"<variant>+<name>"``, e.g. ``"ggd_bam+ssmax"``.

    Raises:
        ValueError: ``name`` is already registered.
    """

    if name in VARIANTS:
        raise ValueError(f"attention modifier {name!r} is already registered as a variant")
    return MODIFIERS.decorator(name)


def get_variant(name: str) -> type["AttentionVariant"]:
    """Look up a variant class by name; ``"base+mod1+mod2"`` composes modifiers onto a base variant
    (the modifiers' methods run first, in the order written; its ``option_schema`` is the union of the
    parts', base first, or ``None`` when a part declares none).

    Raises:
        KeyError: unknown base or modifier name (the message lists the known ones).
    """
    if name in VARIANTS:
        return VARIANTS[name]
    if name in _COMPOSED:
        return _COMPOSED[name]
    base, *mods = name.split("+")
    if base not in VARIANTS or not mods:
        raise KeyError(f"unknown attention variant {name!r}; known: {VARIANTS.known()}, "
                       f"optionally +{'/+'.join(sorted(MODIFIERS)) or 'modifier'}")
    if len(set(mods)) != len(mods):
        raise KeyError(f"attention variant {name!r} repeats a modifier; write each +modifier once")
    unknown = [m for m in mods if m not in MODIFIERS]
    if unknown:
        raise KeyError(f"unknown attention modifier {unknown[0]!r} in {name!r}; known: {', '.join(sorted(MODIFIERS))}")
    base_cls = VARIANTS[base]
    if not getattr(base_cls, "composable", True):
        raise KeyError(f"variant {base!r} is not softmax attention and cannot take {'+'.join(mods)}")
    parts = [base_cls] + [MODIFIERS[m] for m in mods]
    schemas = [getattr(p, "option_schema", None) for p in parts]
    schema = None if any(s is None for s in schemas) else {k: o for s in schemas for k, o in s.items()}
    cls = type(name.replace("+", "_"), tuple(parts[1:]) + (base_cls,),
               {"variant_name": name, "summary": f"{base_cls.summary} + " + " + ".join(mods),
                "option_schema": schema})
    _COMPOSED[name] = cls
    return cls


@dataclass
class AttnContext:
    """What every layer's variant needs besides q, k, v (built once per forward by the model).

    q_pos: [B, Tq] and k_pos: [B, Tk] token positions from each row's first real token;
    allowed: [B, 1, Tq, Tk] bool (causal and not padding; never an empty row), or ``None`` until first
    asked for: read it through :meth:`mask`, which builds it from ``allowed_fn`` on demand, so fast
    paths that apply causality in-kernel never materialise a Tq x Tk tensor;
    cache: the KV cache (``update(k, v, layer_idx)``) or ``None``;
    shared: the model-level module from :meth:`AttentionVariant.shared_module`, or ``None``;
    key_valid: [B, Tk] bool, real tokens (not padding) among cached + new;
    padded: whether any key is padding or positions were given explicitly (fast paths assume position =
    key index and handle only the unpadded case);
    past: tokens already in the cache before this forward (query i sits at key index past + i).
    """

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    allowed: torch.Tensor | None = None
    cache: object = None
    shared: nn.Module | None = None
    key_valid: torch.Tensor | None = None  # [B, Tk] bool: real (not padding) tokens, cached and new
    probe: Callable | None = None  # probe(layer_idx, probs [B,H,Tq,Tk], ctx): diagnostics see the weights
    memo: dict = field(default_factory=dict)  # per-forward values layers can share (e.g. the float mask)
    allowed_fn: Callable | None = None  # () -> allowed, called once by mask()
    padded: bool = True
    past: int = 0

    def mask(self) -> torch.Tensor:
        """The [B, 1, Tq, Tk] bool attention pattern (built on first call, then kept).

        Raises:
            ValueError: neither ``allowed`` nor ``allowed_fn`` was given.
        """
        if self.allowed is None:
            if self.allowed_fn is None:
                raise ValueError("AttnContext has no attention pattern; pass allowed= or allowed_fn=")
            self.allowed = self.allowed_fn()
        return self.allowed


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi head slopes m_h, shape [n_heads], float64.

    Geometric sequence 2^(-8/n), 2^(-16/n), ... for a power-of-two head count; otherwise the reference
    interleave: the slopes of the closest lower power of two followed by every other slope of twice that
    count (Press et al. 2022, "Train Short, Test Long", and github.com/ofirpress/attention_with_linear_biases,
    ``get_slopes``). For 12 heads the last four are 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.

    Raises:
        ValueError: ``n_heads`` < 1.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = pow2(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = pow2(closest) + alibi_slopes(2 * closest).tolist()[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(slopes: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The ALiBi prior b_h(d) = -m_h d (Press et al. 2022, section 3): slopes [H] (any dtype), d any-shaped
    distances i - j in tokens. Returns [H, *d.shape] float32. The one formula: the reference path
    (:meth:`ALiBi.score_bias`) and the fast paths' Toeplitz table (``PriorSpec.bias``) both call it."""
    m = slopes.to(device=d.device, dtype=torch.float32).reshape(-1, *([1] * d.dim()))
    return -m * d.float()


class AttentionVariant(nn.Module):
    """Causal softmax attention with two positional hooks; the base of every softmax variant.

    Subclasses override :meth:`rotate` (transform q and k by position, e.g. RoPE) and/or
    :meth:`score_bias` (an additive logit bias from query and key positions, e.g. ALiBi). The
    computation is ``softmax(q k^T / sqrt(D) + bias, causal & key-padding mask) v``.

    ``config.attn_impl`` names the path (its :class:`lctx.attn_impl.AttnImpl`, :meth:`attention_impl`):
    ``"reference"`` (explicit fp32 softmax: the source of truth), ``"sdpa"`` (``scaled_dot_product_attention``
    with the bias folded into a float mask; tests check it equals the reference) or ``"fast"`` (the fused
    kernel of :mod:`lctx.kernels.flash_prior` where the variant has a :meth:`prior_spec`, else ``"sdpa"``).
    """

    variant_name = "base"
    summary = "causal softmax attention"  # one line for `lctx list variants`
    #: {option: :class:`lctx.models.options.Opt`} this class reads from ``config.variant_options``: the one
    #: place its defaults are written (read them through :meth:`option_values`). ``None``: not declared (a
    #: variant registered outside lctx without a schema; its options are not checked); ``{}``: no options.
    option_schema: dict | None = None

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.n_heads = config.num_attention_heads
        self.head_dim = config.head_dim

    @classmethod
    def input_embedding(cls, config) -> nn.Module | None:
        """A module ``f(positions [B, T]) -> [B, T, d]`` added to token embeddings, or ``None``."""
        return None

    @classmethod
    def option_defaults(cls, version: int) -> dict:
        """Defaults of the *recorded* options of :attr:`option_schema` (``Opt.recorded``: a default that
        changed between config versions, :data:`lctx.models.options.OPTIONS_VERSION`, or differs by base
        variant), for a config of ``version``; :class:`LctxConfig` writes them into ``variant_options`` so
        ``config.json`` records every value the model computes with, and configs saved before a change keep
        computing what they computed."""
        return {k: o.default_for(cls, version) for k, o in (cls.option_schema or {}).items() if o.recorded}

    @classmethod
    def option_values(cls, config) -> dict:
        """{option: value} this class computes with for ``config``: every key of :attr:`option_schema`, the
        value in ``config.variant_options`` or else the schema's default at ``config.options_version`` (the
        current defaults without one; a modifier's per-base default on this class's base), plus any other
        key ``variant_options`` holds. The one way a variant reads its options: no read site repeats a
        default (tests/test_options.py)."""
        given = dict(getattr(config, "variant_options", None) or {})
        version = getattr(config, "options_version", None)
        for k, o in (cls.option_schema or {}).items():
            if k not in given:
                given[k] = o.default_for(cls, version)
        return given

    @classmethod
    def shared_module(cls, config) -> nn.Module | None:
        """A module owned by the model and handed to every layer as ``ctx.shared`` (one set of
        parameters for all layers), or ``None``."""
        return None

    def attention_impl(self) -> AttnImpl:
        """The attention implementation ``config.attn_impl`` names (:func:`lctx.attn_impl.get_attn_impl`),
        looked up where a forward starts (``lctx run --attn-impl`` sets ``config.attn_impl`` on a built model).

        Raises:
            LctxError: ``config.attn_impl`` is not a registered implementation.
        """
        return get_attn_impl(self.config.attn_impl)

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Position-dependent transform of q or k. x: [B, H, T, D]; pos: [B, T]. Identity here."""
        return x

    def rotate_qk(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor,
                  k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`rotate` q at q_pos and the new keys k at k_pos (both [B, T] for the T new tokens); a
        variant may override it to share work between the two (RoPE computes its angles once)."""
        return self.rotate(q, q_pos), self.rotate(k, k_pos)

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, ctx: AttnContext) -> torch.Tensor | None:
        """Additive logit bias, [B, H, Tq, Tk] float32 (or broadcastable), or ``None`` for no bias.

        q_pos: [B, Tq], k_pos: [B, Tk] positions in tokens.
        """
        return None

    def logit_scale(self, q_pos: torch.Tensor, ctx: AttnContext) -> torch.Tensor | None:
        """Per-query multiplier of the content logits q k^T / sqrt(D), [B, H, Tq, 1] float32, or ``None``."""
        return None

    scale_bias = False  # whether logit_scale also multiplies the bias

    def prior_spec(self, ctx=None):
        """The prior as the fused kernel sees it (:class:`lctx.kernels.flash_prior.PriorSpec`), or
        ``None`` when this variant's bias cannot be computed in-kernel (the fast path then falls back).
        Here: no bias, unless a subclass overrides :meth:`score_bias` without a spec of its own."""
        from lctx.kernels.flash_prior import PriorSpec  # lazy: loads triton

        if type(self).score_bias is not AttentionVariant.score_bias:
            return None
        return PriorSpec("none")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext,
                x: torch.Tensor | None = None) -> torch.Tensor:
        """Attend. q, k, v: [B, H, Tq, D] (new tokens only); ``ctx``: positions, mask, KV cache (see
        :class:`AttnContext`); x: the layer's normalised input [B, Tq, d] (for data-dependent variants).
        Logits: c * (q k^T / sqrt(D)) + b (or c * (q k^T / sqrt(D) + b) when ``scale_bias``), with
        c = :meth:`logit_scale` and b = :meth:`score_bias`. Returns [B, H, Tq, D].
        """
        q, k = self.rotate_qk(q, k, ctx.q_pos, ctx.k_pos[:, -k.shape[2] :])
        if ctx.cache is not None:
            k, v = ctx.cache.update(k, v, self.layer_idx)
        return self.attend(q, k, v, ctx)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        """Softmax attention of positioned q [B, H, Tq, D] over all keys k, v [B, H, Tk, D] (cached + new),
        applying :meth:`score_bias` and :meth:`logit_scale`, by ``config.attn_impl`` (:meth:`attention_impl`).
        Returns [B, H, Tq, D]."""
        impl = self.attention_impl()
        if impl.kernels and ctx.probe is None and not ctx.padded:
            from lctx.kernels.flash_prior import attend_fast  # lazy: loads triton

            out = attend_fast(self, q, k, v, ctx)  # positions, prior and scale are applied in-kernel
            if out is not None:
                return out
        bias = self.score_bias(ctx.q_pos, ctx.k_pos, ctx)
        scale = self.logit_scale(ctx.q_pos, ctx)
        if scale is not None:
            q = q * scale.to(q.dtype)  # c (q.k) = (c q).k: works for both paths below
            if bias is not None and self.scale_bias:
                bias = bias * scale
        if ctx.probe is not None:  # diagnostics: explicit weights, handed to the probe
            probs = attention_probs(q, k, ctx.mask(), bias)
            ctx.probe(self.layer_idx, probs, ctx)
            return torch.matmul(probs, v.float()).to(q.dtype)
        if impl.explicit:
            return reference_attention(q, k, v, ctx.mask(), bias)
        if bias is None and not ctx.padded:  # causal only: no [Tq, Tk] float mask
            from lctx.kernels.chunk_attention import chunk_attention  # lazy: kernels are imported on first use

            record_impl(getattr(self, "variant_name", "?"), "sdpa")
            return chunk_attention(q, k, v)
        key = ("mask", q.dtype)
        if key not in ctx.memo:  # one float mask per forward, shared by every layer
            ctx.memo[key] = torch.zeros(ctx.mask().shape, dtype=q.dtype, device=q.device).masked_fill(
                ~ctx.mask(), float("-inf"))
        mask = ctx.memo[key]
        if bias is not None:
            mask = mask + bias.to(q.dtype)
        record_impl(getattr(self, "variant_name", "?"), "sdpa")
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_probs(q, k, allowed, bias=None) -> torch.Tensor:
    """Causal softmax attention weights in float32, [B, H, Tq, Tk] (rows sum to 1 over allowed keys)."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)


def reference_attention(q, k, v, allowed, bias=None) -> torch.Tensor:
    """Explicit causal softmax attention in float32: softmax(q k^T / sqrt(D) + bias) v.

    q: [B, H, Tq, D]; k, v: [B, H, Tk, D]; allowed: [B, 1|H, Tq, Tk] bool; bias: broadcastable to
    [B, H, Tq, Tk] or ``None``. Returns [B, H, Tq, D] in q's dtype. Memory O(Tq * Tk) per head.
    """
    return torch.matmul(attention_probs(q, k, allowed, bias), v.float()).to(q.dtype)


@register_variant("nope")
class NoPE(AttentionVariant):
    """No positional signal: the causal mask alone orders tokens (a uniform prior over visible keys,
    BAM seed 000; Kazemnejad et al. 2023)."""
    summary = "no positional signal; causal mask only (uniform prior)"
    option_schema = {}


@register_variant("rope")
class RoPE(AttentionVariant):
    """Rotary position embedding (Su et al. 2021, RoFormer eq. 34), half-split layout as in GPT-NeoX and
    Hugging Face Llama (``rotate_half``). Angles pos * theta^(-2i/D) are computed in float64 so long
    positions (512K tokens) keep their precision, then cast to q's dtype.
    """
    summary = "rotary embedding of q, k by position index"
    option_schema = {}

    def tables(self, pos: torch.Tensor, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, 1, T, d] in ``dtype`` for positions [B, T]: angles pos * theta^(-2i/d) in float64,
        each repeated over both halves, sin with the first half negated (so rotate_half(x) * sin is
        cat(x2, x1) * sin)."""
        inv_freq = self.config.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=pos.device) / d)
        ang = pos.to(torch.float64)[:, None, :, None] * inv_freq  # [B, 1, T, D/2]
        cos, sin = torch.cos(ang), torch.sin(ang)
        return torch.cat([cos, cos], -1).to(dtype), torch.cat([-sin, sin], -1).to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x * cos + cat(x2, x1) * sin = cat(x1 cos - x2 sin, x2 cos + x1 sin) for x = cat(x1, x2)."""
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.apply(x, *self.tables(pos, x.shape[-1], x.dtype))

    def rotate_qk(self, q, k, q_pos, k_pos):
        if q_pos.shape == k_pos.shape and q.dtype == k.dtype and torch.equal(q_pos, k_pos):
            cos, sin = self.tables(q_pos, q.shape[-1], q.dtype)  # the new keys sit where the queries do
            return self.apply(q, cos, sin), self.apply(k, cos, sin)
        return self.rotate(q, q_pos), self.rotate(k, k_pos)


@register_variant("alibi")
class ALiBi(AttentionVariant):
    """Attention with Linear Biases: bias -m_h (i - j) for key j <= query i (Press et al. 2022, eq. in
    section 3), slopes from :func:`alibi_slopes`. No positional signal in q, k or the input.
    """
    summary = "logit bias -m_h (i - j), standard geometric slopes"
    option_schema = {}

    def score_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, ctx=None) -> torch.Tensor:
        # slopes are recomputed (H floats), not a buffer: from_pretrained builds modules on the meta
        # device and would leave a non-persistent buffer uninitialised.
        if ctx is not None and "alibi_bias" in ctx.memo:  # the same for every layer of one forward
            return ctx.memo["alibi_bias"]
        dist = (q_pos[:, :, None] - k_pos[:, None, :]).float()  # [B, Tq, Tk]
        bias = alibi_bias(alibi_slopes(self.n_heads), dist).transpose(0, 1)  # [B, H, Tq, Tk]
        if ctx is not None:
            ctx.memo["alibi_bias"] = bias
        return bias

    def prior_spec(self, ctx=None):
        from lctx.kernels.flash_prior import PriorSpec  # lazy: loads triton

        slopes = alibi_slopes(self.n_heads)
        return PriorSpec("alibi", bias=lambda d: alibi_bias(slopes, d))


class SinusoidalEmbedding(nn.Module):
    """Absolute sinusoidal position signal, PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...)
    (Vaswani et al. 2017, section 3.5). Forward: positions [B, T] -> [B, T, d] float32, computed on the
    fly in float64 so any length works.
    """

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        self.d_model = d_model
        self.base = base

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        i = torch.arange(0, self.d_model, 2, dtype=torch.float64, device=pos.device)
        ang = pos.to(torch.float64)[..., None] * self.base ** (-i / self.d_model)
        pe = torch.stack([torch.sin(ang), torch.cos(ang)], dim=-1).flatten(-2)[..., : self.d_model]
        return pe.float()


@register_variant("sinusoidal")
class Sinusoidal(AttentionVariant):
    """Absolute sinusoidal embedding added to the (sqrt(d)-scaled, Vaswani et al. 2017 section 3.4) token
    embeddings; attention itself is NoPE."""
    summary = "absolute sinusoidal embedding added to the input"
    option_schema = {}

    @classmethod
    def input_embedding(cls, config) -> nn.Module:
        return SinusoidalEmbedding(config.hidden_size)
