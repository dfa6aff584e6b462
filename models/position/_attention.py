"""What the attention-kind positional methods share (not a method: files starting with ``_`` are not listed):
:class:`AttentionMethod`, the base of :mod:`.sinks` and :mod:`.self_extend`, which puts its attention function on a
loaded Hugging Face model through transformers' two interfaces (``AttentionInterface.register`` for the function,
``AttentionMaskInterface.register`` for its mask; selected with ``model.set_attn_implementation``; no module's code is
replaced), and the checks and effective settings they share.

How a call runs (:func:`position_attention`): each attention module of the model holds a :class:`LayerState` (the
method, its options, where the model's RoPE table lives, the attention implementation the model had before). The
layers the method applies to (every layer with global attention: not Gemma 3's sliding layers, which keep their own
window) run the method's fast path of :mod:`lctx.kernels.position_attention` when the keys are positions 0..Tk-1
(no mask: lctx's chunked prefill and decode through a ``DynamicCache``), per row on the unpadded part of a
left-padded batch, and the method's reference (explicit positions) for any other mask; the other layers run the
implementation the model had (``lctx_sdpa``, ``sdpa`` or ``eager``), whose mask function the method's implementation
takes over.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from lctx.errors import LctxError
from lctx.kernels import position_attention as pa

from .base import PositionMethod, freq_summary

#: Hugging Face model types that add ALiBi inside their attention (no RoPE)
ALIBI_MODEL_TYPES = ("bloom", "mpt")
#: attention implementations whose masks the method's layers read (others: transformers' ``sdpa`` mask)
_MASKS_READ = ("lctx_sdpa", "sdpa", "eager")


def text_config(config):
    """The config that holds the decoder's settings (a multimodal config's text part, else ``config``)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


@dataclass
class LayerState:
    """What :func:`position_attention` reads from an attention module (``module.lctx_position``).

    method: ``"sinks"`` or ``"self_extend"``; options: the method's options; active: whether this layer runs the method
    (False: a sliding-window layer, which runs ``prior``); prior: the attention implementation the model had;
    rotary: the model's rotary module and ``layer_type`` the key of its table (None: its one ``inv_freq``);
    reference: run the plain reference instead of the fast path (tests, checks)."""

    method: str
    options: dict
    active: bool
    prior: str
    rotary: Any = field(repr=False, default=None)
    layer_type: str | None = None
    reference: bool = False

    def rope(self) -> tuple[torch.Tensor, float]:
        """(inv_freq [D/2], attention_scaling) the model's rotary module holds now for this layer's type (read per
        call: a length-dependent table fixed per sample is read as it is held)."""
        mod, lt = self.rotary, self.layer_type
        if lt is not None and hasattr(mod, f"{lt}_inv_freq"):
            return getattr(mod, f"{lt}_inv_freq"), float(getattr(mod, f"{lt}_attention_scaling", 1.0))
        return mod.inv_freq, float(getattr(mod, "attention_scaling", 1.0))


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """A transformers attention mask as bool (True = attend): bool as it is; an additive float mask's entries above
    half the dtype's minimum."""
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def _standard(qpos: torch.Tensor | None, Tq: int, Tk: int) -> bool:
    """Whether the queries sit at positions Tk - Tq .. Tk - 1 in every row (or no positions were passed)."""
    if qpos is None:
        return True
    want = torch.arange(Tk - Tq, Tk, device=qpos.device)
    return qpos.shape[-1] == Tq and bool((qpos == want).all())


def left_padded_rows(allowed: torch.Tensor, qpos: torch.Tensor | None, Tq: int, Tk: int) -> list | None:
    """[(pad, r)] per row when ``allowed`` ([B|1, 1, Tq, Tk] bool) is exactly causal over a left-padded row (keys
    pad..Tk-1 real; query rows r.. real, each at position index - pad) and ``qpos`` agrees; else None (the
    reference runs)."""
    B = allowed.shape[0]
    rows = []
    kj = torch.arange(Tk, device=allowed.device)
    qi = torch.arange(Tk - Tq, Tk, device=allowed.device)
    for b in range(B):
        last = allowed[b, 0, -1]
        pad = Tk - int(last.sum())
        if not bool(last[pad:].all()):
            return None
        r = max(0, pad - (Tk - Tq))
        want = (kj[None, :] >= pad) & (kj[None, :] <= qi[r:, None])
        if not torch.equal(allowed[b, 0, r:], want):
            return None
        if qpos is not None:
            pb = qpos[min(b, qpos.shape[0] - 1), r:]
            if not torch.equal(pb, qi[r:] - pad):
                return None
        rows.append((pad, r))
    return rows


def _fast(st: LayerState, q, k, v, scale, inv_freq):
    o = st.options
    if st.method == "self_extend":
        return pa.self_extend_attention(q, k, v, inv_freq, o["window"], o["group"], scale)
    return pa.sinks_attention(q, k, v, o["n_sink"], o["window"], o["reassign"], inv_freq, scale)


def _reference(st: LayerState, q, k, v, scale, inv_freq, qpos, kpos, mask):
    o = st.options
    if st.method == "self_extend":
        return pa.self_extend_reference(q, k, v, inv_freq, o["window"], o["group"], scale, qpos, kpos, mask)
    return pa.sinks_reference(q, k, v, o["n_sink"], o["window"], o["reassign"], inv_freq, scale, qpos, kpos, mask)


def position_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """The attention function of ``lctx_sinks`` / ``lctx_self_extend`` (transformers ``AttentionInterface``
    signature).

    query: [B, H, Tq, D]; key, value: [B, Hkv, Tk, D] (RoPE applied; the cache included); attention_mask: what the
    prior implementation's mask function built ([B|1, 1, Tq, Tk] bool or additive float) or None (causal over keys
    0..Tk-1); kwargs: ``scaling``, ``dropout``, ``position_ids`` [B|1, Tq] (the queries' positions), ... Returns
    ([B, Tq, H, D], None) as transformers' attention functions do. A module without an active
    :class:`LayerState` runs the prior implementation (``ALL_ATTENTION_FUNCTIONS[prior]``) with the same arguments.

    Raises:
        RuntimeError: dropout, soft-capping, a sliding window or attention weights asked of a method layer (the
            method's checks refuse such models before they run).
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # lazy: loads torch.nn.attention.flex_attention

    st = getattr(module, "lctx_position", None)
    if st is None or not st.active:
        prior = st.prior if st is not None else "sdpa"
        return ALL_ATTENTION_FUNCTIONS[prior](module, query, key, value, attention_mask, **kwargs)
    if kwargs.get("dropout") or kwargs.get("softcap") is not None or kwargs.get("output_attentions") \
            or kwargs.get("sliding_window") is not None:
        raise RuntimeError(f"--position {st.method}: layer {getattr(module, 'layer_idx', '?')} was asked for dropout, "
                           "soft-capping, a sliding window or attention weights, which the method does not compute")
    scale = kwargs.get("scaling")
    inv_freq, _ = st.rope()
    B, H, Tq, D = query.shape
    Tk = key.shape[2]
    qpos = kwargs.get("position_ids")
    if qpos is not None and qpos.dim() == 1:
        qpos = qpos[None]
    allowed = None if attention_mask is None else _allowed(attention_mask)
    if st.reference:
        out = _reference(st, query, key, value, scale, inv_freq, *_explicit_positions(allowed, qpos, Tq, Tk), allowed)
    elif allowed is None and _standard(qpos, Tq, Tk):
        out = _fast(st, query, key, value, scale, inv_freq)
    else:
        rows = None if allowed is None else left_padded_rows(allowed, qpos, Tq, Tk)
        if rows is None:
            qp, kp = _explicit_positions(allowed, qpos, Tq, Tk)
            out = _reference(st, query, key, value, scale, inv_freq, qp, kp, allowed)
        else:
            out = query.new_zeros(query.shape)
            for b, (pad, r) in enumerate(rows):
                if r < Tq:
                    out[b:b + 1, :, r:] = _fast(st, query[b:b + 1, :, r:], key[b:b + 1, :, pad:],
                                                value[b:b + 1, :, pad:], scale, inv_freq)
    return out.transpose(1, 2).contiguous(), None


def _explicit_positions(allowed, qpos, Tq: int, Tk: int):
    """(query positions [B|1, Tq], key positions [B|1, Tk]) for the reference: the queries' ``position_ids`` (default
    Tk - Tq .. Tk - 1); key j at j - pad, pad the first key the last query may see (left padding: the first real key
    is position 0; a hole further on moves no position), or 0..Tk-1 without a mask."""
    dev = allowed.device if allowed is not None else (qpos.device if qpos is not None else None)
    if qpos is None:
        qpos = torch.arange(Tk - Tq, Tk, device=dev)[None]
    kj = torch.arange(Tk, device=qpos.device)[None]
    if allowed is None:
        return qpos, kj
    last = allowed[:, 0, -1]  # [B|1, Tk]
    pad = last.long().argmax(-1, keepdim=True)  # the first True (0 for a row without one)
    return qpos, kj - pad


# -- registration with transformers ------------------------------------------------------------------------------

def register(method: str, prior: str) -> str:
    """Register :func:`position_attention` under ``lctx_<method>`` (``lctx_<method>_over_<prior>`` when the model's
    implementation was not ``lctx_sdpa``) with the prior implementation's mask function (``sdpa``'s for one lctx does
    not read); returns the name for ``model.set_attn_implementation``. Source: transformers' attention interface
    docs (``AttentionInterface.register``, ``AttentionMaskInterface.register``)."""
    # lazy: loads torch.nn.attention.flex_attention
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface  # lazy: as above

    name = f"lctx_{method}" if prior == "lctx_sdpa" else f"lctx_{method}_over_{prior}"
    mask_of = prior if prior in _MASKS_READ and prior in ALL_MASK_ATTENTION_FUNCTIONS else "sdpa"
    AttentionInterface.register(name, position_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[mask_of])
    return name


def _attention_modules(model) -> list:
    """The attention modules of a transformers model: the modules with a ``layer_idx``, a ``head_dim`` and a
    ``scaling`` (what transformers' attention classes hold and hand their attention function)."""
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "head_dim") and hasattr(m, "scaling")]


def _is_sliding(module, cfg) -> bool:
    """Whether an attention module attends through a sliding window (Gemma 3's local layers, a Mistral config with
    ``sliding_window``)."""
    lt = getattr(module, "layer_type", None)
    types = getattr(cfg, "layer_types", None)
    if lt is None and types is not None and getattr(module, "layer_idx", None) is not None:
        lt = types[module.layer_idx]
    return (getattr(module, "sliding_window", None) is not None or bool(getattr(module, "is_sliding", False))
            or lt == "sliding_attention" or (types is None and getattr(cfg, "sliding_window", None) is not None))


def _layer_type(module, cfg) -> str | None:
    lt = getattr(module, "layer_type", None)
    types = getattr(cfg, "layer_types", None)
    if lt is None and types is not None and getattr(module, "layer_idx", None) is not None:
        lt = types[module.layer_idx]
    return lt


def _rotary(model, attn):
    """The rotary module whose table ``attn`` (an attention module) is rotated with: the model's one module holding
    ``inv_freq`` (or ``<layer type>_inv_freq``), else the attention module's own."""
    owners = [m for m in model.modules()
              if any(n == "inv_freq" or (n.endswith("_inv_freq") and "original" not in n)
                     for n, _ in m.named_buffers(recurse=False))]
    if len(owners) == 1:
        return owners[0]
    own = [m for m in attn.modules() if m in owners]
    return own[0] if len(own) == 1 else None


def _same_rotation(attn, inv_freq: torch.Tensor) -> bool:
    """Whether the modeling code of ``attn`` rotates as :func:`lctx.kernels.position_attention.rotate` does
    (transformers' ``rotate_half`` layout over the whole head): its module's ``apply_rotary_pos_emb`` run on a probe
    equals ours."""
    fn = getattr(inspect.getmodule(type(attn)), "apply_rotary_pos_emb", None)
    if fn is None:
        return False
    D = 2 * inv_freq.shape[-1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 5, D, generator=g)
    pos = torch.tensor([0, 1, 7, 100, 3000])
    cos, sin = pa.rope_cos_sin(pos[None], inv_freq.detach().float().cpu())
    try:
        got = fn(x, x, cos, sin)[0]
    except Exception:  # noqa: BLE001 - another signature or layout: not the convention we re-rotate in
        return False
    want = pa.rotate(x, pos, inv_freq.detach().float().cpu())
    return got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5)


class AttentionMethod(PositionMethod):
    """An attention-kind method (kind ``"attention"``): :meth:`apply_model` registers :func:`position_attention` and
    selects it on the loaded model; :meth:`effective` reads back what the layers hold. Subclasses set ``name``,
    ``options``, ``source``, ``summary`` and :meth:`validate` their options."""

    kind: ClassVar[str] = "attention"

    def check(self, config, lm_kind: str = "hf") -> None:
        """Refuse a served model, an lctx checkpoint, an ALiBi model, a model without RoPE (learned or no positions,
        NoPE layers), a partial rotary head, soft-capped logits, and a model whose every layer attends through a
        sliding window (nothing left for the method to extend).

        Raises:
            LctxError: one line naming the model's kind and the fix."""
        super().check(config, lm_kind)
        cfg = text_config(config)
        mt = getattr(cfg, "model_type", "?")
        label = self.spec.label
        if lm_kind == "native" or mt == "lctx":
            raise LctxError(f"--position {label}: this lctx checkpoint (variant {getattr(cfg, 'variant', '?')!r}) runs "
                            "its attention in lctx's own code, not through transformers' attention interface; "
                            f"{self.name} applies to Hugging Face and GGUF checkpoints with RoPE")
        if mt in ALIBI_MODEL_TYPES or (mt == "falcon" and getattr(cfg, "alibi", False)):
            raise LctxError(f"--position {label}: model type {mt!r} uses ALiBi, not RoPE; {self.name} moves RoPE "
                            "positions, so use a RoPE model (Llama, Qwen, Gemma, SmolLM2, ...)")
        if not getattr(cfg, "rope_parameters", None):
            raise LctxError(f"--position {label}: model type {mt!r} declares no RoPE (no rope_parameters: learned or no "
                            f"positions, NoPE); {self.name} moves RoPE positions, so use a RoPE model")
        if getattr(cfg, "no_rope_layers", None) or getattr(cfg, "no_rope_layer_interval", None):
            raise LctxError(f"--position {label}: model type {mt!r} has layers without RoPE (NoPE layers), which "
                            f"{self.name} would treat as rotated; use a model with RoPE in every layer")
        params = cfg.rope_parameters
        tables = [params[k] for k in params if isinstance(params.get(k), dict)] or [params]
        if any(float(t.get("partial_rotary_factor", 1.0) or 1.0) != 1.0 for t in tables) or \
                float(getattr(cfg, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
            raise LctxError(f"--position {label}: model type {mt!r} rotates part of each head (partial_rotary_factor < "
                            f"1), which {self.name}'s re-rotation does not implement; use a model with full-head RoPE")
        if getattr(cfg, "attn_logit_softcapping", None) is not None:
            raise LctxError(f"--position {label}: model type {mt!r} soft-caps its attention logits, which {self.name}'s "
                            "attention does not compute; use a model without attn_logit_softcapping")
        types = getattr(cfg, "layer_types", None)
        if (types is not None and "full_attention" not in types) or \
                (types is None and getattr(cfg, "sliding_window", None) is not None):
            raise LctxError(f"--position {label}: every layer of model type {mt!r} attends through a sliding window "
                            f"(sliding_window={getattr(cfg, 'sliding_window', None)}); {self.name} extends global "
                            "attention, so use a model with full-attention layers")

    def apply_model(self, lm, reference: bool = False) -> None:
        """Put the method on the loaded adapter ``lm`` (an :class:`lctx.models.adapters.hf.HFAdapter`): a
        :class:`LayerState` on each attention module (active on the global-attention layers), the function registered
        and selected with ``set_attn_implementation``; ``lm.attn_impl`` becomes ``hf:<name>``. ``reference``: the
        layers run the plain reference (explicit positions, fp32 scores) instead of the fast path.

        Raises:
            LctxError: the architecture does not call transformers' attention interface, the model already runs an
                lctx attention method or override, no rotary module or a RoPE in another layout than transformers'
                ``rotate_half`` over the whole head, or no global-attention layer; one line each."""
        model = lm.model
        name = getattr(lm, "name", type(model).__name__)
        label = self.spec.label
        cls = type(model)
        if not (getattr(cls, "_supports_attention_backend", False) and cls._can_set_attn_implementation()):
            raise LctxError(f"--position {label}: {cls.__name__} ({name!r}) computes attention in its own code, not "
                            "through transformers' AttentionInterface; use a model whose attention does (Llama, "
                            "Mistral, Qwen2, Gemma 3, ...)")
        prior = str(model.config._attn_implementation or "eager")
        if prior.startswith("lctx_") and prior != "lctx_sdpa":
            raise LctxError(f"--position {label}: model {name!r} already runs {prior!r} (another positional method or "
                            "--attn-override); give one method per model (one --position per model)")
        cfg = text_config(model.config)
        mods = _attention_modules(model)
        states = []
        for m in mods:
            active = not _is_sliding(m, cfg)
            rot = _rotary(model, m)
            lt = _layer_type(m, cfg)
            st = LayerState(self.name, dict(self.options), active, prior if prior in _MASKS_READ else "sdpa", rot, lt,
                            reference)
            if active:
                if rot is None:
                    raise LctxError(f"--position {label}: no single rotary module (inv_freq) found for layer "
                                    f"{m.layer_idx} of {name!r}; {self.name} needs the model's RoPE table")
                inv, _ = st.rope()
                if 2 * inv.shape[-1] != m.head_dim or not _same_rotation(m, inv):
                    raise LctxError(f"--position {label}: {name!r} rotates its heads in another layout than "
                                    "transformers' rotate_half over the whole head (partial or interleaved RoPE), "
                                    f"which {self.name}'s re-rotation does not implement")
            states.append((m, st))
        if not any(st.active for _, st in states):
            raise LctxError(f"--position {label}: {name!r} has no global-attention layer (every layer slides its "
                            f"window); {self.name} has nothing to extend")
        impl = register(self.name, prior)
        for m, st in states:
            m.lctx_position = st  # a plain object attribute (not a submodule): the function reads it
        model.set_attn_implementation(impl)
        if model.config._attn_implementation != impl:
            raise LctxError(f"--position {label}: transformers refused attention implementation {impl!r} for "
                            f"{cls.__name__}; this architecture cannot take the method")
        if hasattr(lm, "attn_impl"):
            lm.attn_impl = f"hf:{impl}"

    def effective(self, lm) -> dict:
        """The settings the model's attention layers hold (read from their :class:`LayerState`, not from
        ``self.options``): ``method``, the method's options, ``layers`` (how many run it, of how many),
        ``layer_types`` (the types they are), ``fast`` (False: the plain reference runs), ``prior`` (what the other
        layers run) and ``rope``: the table the re-rotation uses (:func:`lctx.models.position.base.freq_summary` of
        the active layers' ``inv_freq`` and ``attention_scaling``). {} when no layer holds the method."""
        model = getattr(lm, "model", lm)
        states = [m.lctx_position for m in _attention_modules(model) if getattr(m, "lctx_position", None) is not None]
        active = [s for s in states if s.active]
        if not active:
            return {}
        s0 = active[0]
        inv, scaling = s0.rope()
        return {"method": s0.method, **{k: s0.options[k] for k in sorted(s0.options)},
                "layers": f"{len(active)}/{len(states)}",
                "layer_types": sorted({s.layer_type or "all" for s in active}),
                "fast": not s0.reference, "prior": s0.prior, "rope": freq_summary(inv, scaling)}
