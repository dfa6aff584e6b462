"""Memory model of a long-context evaluation: expected peak memory before a run starts (``lctx plan``).

A chunked prefill of T tokens in chunks of c = min(chunk_size, T) tokens (``HFAdapter.prefill``) holds, at its
peak (the last chunk, when the KV cache is nearly full):

======================  ==========================================================================
weights                 parameters x bytes per element (counted on the meta device, tied weights once)
KV cache                T x per-token bytes; softmax variants: 2 x layers x kv_heads x head_dim x bytes
                        (K and V). Variants that keep something else (fixed-state mixers: a state whose
                        size does not grow with T; PaTH: transported keys in float32 as well) are measured
                        from their own cache after a probe forward of one layer (:func:`cache_bytes`).
KV cache growth         with a ``DynamicCache``, one layer's cache once more: ``update`` concatenates the
                        new chunk to the old keys (``torch.cat``), so old and new tensors coexist for one
                        layer. A :class:`lctx.models.cache.PreallocatedKVCache` (what ``HFAdapter`` gives lctx
                        models when it has ``new_cache``) holds T + decode budget tokens from the start
                        and writes in place: no growth copy (a per-token state beside it still grows).
positions               B x T x 17 bytes: k_pos (int64), its cumsum temporary (int64), key_valid (bool).
activations             one decoder layer is live at a time: B x c x max(10 d, 2 d + 3 I) x bytes, the larger
                        of the attention half (residual, norm output, q/k/v, rotated q/k, attention output,
                        o_proj) and the SwiGLU half (residual, norm output, gate, up, product), + B x c x d x 8
                        (RMSNorm's float32 temporaries). Was 8 d + 4 I (both halves at once) until the
                        measured peaks, in which the sdpa mask had hidden the overestimate.
attention working set   depends on the path that runs (found by a probe forward, see :func:`probe_layer`):
                        * chunk-split (variants without a bias on CPU, ``sdpa`` or ``fast``; Hugging Face
                          models on ``lctx_sdpa``): :mod:`lctx.kernels.chunk_attention`, the past and own
                          parts' outputs and their fp32 merge B x H x c x (3 D x bytes + 2 D x 4 + 8), no
                          chunk x T buffer (+ grouped KV heads repeated, 2 x B x H x T x D x bytes);
                        * fused kernel (``attn_impl="fast"`` and the variant describes its prior to
                          the kernel through ``prior_spec``): B x H x c x D x 16 (float32 q tile, output
                          accumulator and row statistics): O(chunk x head_dim), no chunk x T buffer;
                        * sdpa: the bool pattern and its negation 2 x B x c x T, and the float mask
                          2 x B x c x T x bytes (``zeros(...).masked_fill(~pattern, -inf)``: the zeros and
                          the filled copy coexist while it is built); for bias variants also the bias
                          B x H x c x T x 4 and mask + bias B x H x c x T x bytes;
                        * reference: the pattern and its negation 2 x B x c x T + float32 scores, masked
                          scores and probabilities 3 x B x H x c x T x 4 (+ the bias B x H x c x T x 4);
                        * blockwise references (alibi_lsh, PaTH): the bool pattern + a block of 128
                          queries' scores against all keys, B x H x 128 x T x 16;
                        * fixed-state mixers (no pattern asked for): B x H x c x D x 32 (chunk tables and
                          state updates of the chunked scan, an upper estimate);
                        * Hugging Face models: by the transformers attention that runs (``sdpa``: its bool
                          masks and SDPA's float copy, ``repeat_kv``'s copies of grouped K/V heads; ``eager``:
                          the scores too; a path without a chunk x T mask: its partial outputs),
                          :func:`hf_attention_working_set`.
logits                  produced one chunk at a time, k = min(kept positions, chunk) rows: the larger of a
                        chunk's forward (the previous chunk's float32 logits still bound, ``lm_head``'s output,
                        a soft-capping copy, the float32 copy of half-precision logits) and, when more than one
                        position is scored (``HFAdapter.token_nll``: ppl scores every position of its first
                        window), the chunk's float32 logits + a 512-row float64 block and its log-softmax,
                        and ~256 B of Python objects per scored position (:func:`logits_working_set`).
lm-eval (MMLU/ARC)      lctx's lm-eval model runs min(batch, requests) rows x the longest request in row
                        blocks (one unchunked forward each, no KV cache, planned working set <=
                        :data:`LMEVAL_BLOCK_BYTES`) and computes logits at the continuation positions
                        only: rows x longest continuation x vocab x 4 for lctx models (the dtype's size
                        for HF), and their log-softmax, made once the forward's working set is freed
                        (:func:`plan_lmeval`, :func:`check_lmeval_fits`).
======================  ==========================================================================

The model is an estimate from the shapes (no allocator overhead, no fragmentation); ``lctx bench --model``
and ``results/2026-12-02-memory-plan`` compare it with measured peaks. Hugging Face checkpoints
(``num_key_value_heads`` etc.) get the softmax KV formula. A refusal names only the changes that lower the plan
for that model (:func:`advice`, which plans each again). Source of the KV-cache formula: the usual per-token KV size
2 n_layers n_kv_heads d_head bytes (e.g. Pope et al. 2022, "Efficiently Scaling Transformer Inference").
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lctx.attn_impl import ATTN_IMPL_REGISTRY, DEFAULT_ATTN_IMPL, get_attn_impl
from lctx.defaults import CHUNK_SIZE, DTYPE
from lctx.errors import LctxError

from lctx.models.adapters.devices import resolve_dtype
from lctx.models.adapters.gguf import gguf_config
from lctx.model_files import find_gguf, raise_if_remote_code

GIB = 1024**3
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
               "g": GIB, "gb": GIB, "gib": GIB, "t": 1024**4, "tb": 1024**4, "tib": 1024**4}


def parse_bytes(text: str) -> int:
    """Parse a memory size: ``"141g"``, ``"141GiB"``, ``"512m"``, ``"1.5t"`` or plain bytes (binary units:
    g = 1024^3 bytes).

    Raises:
        LctxError: not a positive number with an optional unit.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS or float(m.group(1)) <= 0:
        raise LctxError(f"memory size {text!r} is not a positive size; write e.g. 141g, 80GiB or 512m")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def gib(n: float) -> str:
    """Bytes as a short GiB string, e.g. ``"1.50 GiB"``."""
    return f"{n / GIB:.2f} GiB"


@dataclass
class MemoryItem:
    """One line of the memory model: a component, its bytes and the formula that gave them."""

    name: str
    bytes: int
    formula: str


@dataclass
class MemoryPlan:
    """The expected peak memory (bytes) of a chunked prefill of ``length`` tokens, as a list of items.

    ``attn_path``: which attention working set was counted (``fused``, ``sdpa``, ``reference``,
    ``blockwise``, ``fixed-state``; for Hugging Face models the transformers attention, e.g. ``sdpa``, ``eager``);
    ``notes``: caveats found while planning; ``device``: where it runs (``"cpu"``, ``"cuda:0"``), whose memory
    :func:`check_run_fits` compares it with; ``lctx``, ``base_total``, ``replan``: what :func:`advice` needs.
    """

    model: str
    length: int
    chunk_size: int
    dtype: str
    impl: str
    attn_path: str
    kv_cache: str = "dynamic"
    items: list[MemoryItem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"  # where the prefill runs (str of a torch device): the room the checks compare with
    lctx: bool = True  # an lctx checkpoint (``--attn-impl`` names its kernels) or a Hugging Face one
    base_total: int = 0  # the total :func:`plan_memory` made, before a caller added items (other models' weights)
    #: the same plan with some of :func:`plan_memory`'s keyword arguments changed (``replan(dtype="bfloat16")``),
    #: or None for a plan made by hand: what :func:`advice` tries
    replan: object = field(default=None, repr=False, compare=False)

    @property
    def total(self) -> int:
        """Sum of the items in bytes."""
        return int(sum(i.bytes for i in self.items))

    def get(self, name: str) -> int:
        """Bytes of the item called ``name`` (0 when absent)."""
        return int(sum(i.bytes for i in self.items if i.name == name))

    def largest(self) -> MemoryItem:
        """The item with the most bytes."""
        return max(self.items, key=lambda i: i.bytes)

    def table(self):
        """The breakdown as a pandas DataFrame: component, bytes, GiB, formula (plus a total row)."""
        import pandas as pd  # lazy: loads pandas

        rows = [{"component": i.name, "bytes": i.bytes, "GiB": i.bytes / GIB, "formula": i.formula}
                for i in self.items]
        rows.append({"component": "total", "bytes": self.total, "GiB": self.total / GIB, "formula": ""})
        return pd.DataFrame(rows)


@dataclass
class ModelShape:
    """The sizes the memory model needs, read from a config (lctx or Hugging Face).

    layers, heads, kv_heads, head_dim, hidden (d), intermediate (I), vocab: counts; n_params: parameters
    (tied weights once); lctx: whether it is a native lctx model (then ``variant`` names its attention).
    """

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    n_params: int
    lctx: bool
    variant: str
    attn_impl: str


def load_config(path: str, trust_remote_code: bool = False):
    """The config of a checkpoint directory (lctx or Hugging Face) or of a GGUF file, without loading weights.
    A GGUF's config comes from its header (:func:`lctx.models.adapters.gguf.gguf_config`: nothing dequantised or
    written, under a second for a 262K-token vocabulary). Code shipped with the checkpoint (``auto_map``) runs
    only with ``trust_remote_code=True``.

    Raises:
        LctxError: not a directory, no config.json, an unreadable config, or one that needs remote code
            without ``trust_remote_code``; a GGUF file that is damaged or of an architecture transformers
            cannot load from GGUF.
    """
    from lctx.models import register_with_transformers  # lazy: loads lctx.models and transformers

    register_with_transformers()  # model_type "lctx" for the Auto classes, also after a light import (cli)
    from transformers import AutoConfig  # lazy: loads transformers

    p = Path(path)

    gguf_file = find_gguf(p)
    if gguf_file is not None:  # the config in a GGUF file's header: no tensor read, no vocabulary parsed
        return gguf_config(gguf_file)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise LctxError(f"--model {path!r} is not a checkpoint directory with a config.json; pass a folder "
                        "written by `lctx train` or save_pretrained")
    try:
        return AutoConfig.from_pretrained(p, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any parse failure is a bad checkpoint
        raise_if_remote_code(path, e)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise LctxError(f"checkpoint {path!r} has an unreadable config.json ({first}); re-save it with "
                        "save_pretrained") from None


def count_parameters(config) -> int:
    """Parameters of the causal LM a config describes, counted on the meta device (no memory, no weights
    read); shared (tied) tensors count once. Falls back to 12 L d^2 + V d (the usual decoder estimate)
    when the architecture cannot be built."""
    from transformers import AutoModelForCausalLM  # lazy: loads transformers

    try:
        with torch.device("meta"):  # a copy: building a model sets config._attn_implementation, which the plan reads
            model = AutoModelForCausalLM.from_config(copy.deepcopy(config))
        seen = {}
        for t in model.parameters():  # buffers (e.g. rotary inv_freq) are a few floats: not counted
            seen[id(t)] = t.numel()
        return int(sum(seen.values()))
    except Exception:  # noqa: BLE001 - unknown architecture: the textbook estimate
        d = int(getattr(config, "hidden_size", 0) or 0)
        return int(12 * int(getattr(config, "num_hidden_layers", 0) or 0) * d * d
                   + int(getattr(config, "vocab_size", 0) or 0) * d)


def model_shape(config) -> ModelShape:
    """Read layer/head/width/vocab sizes from an lctx or Hugging Face config (``num_key_value_heads``
    defaults to ``num_attention_heads``, ``head_dim`` to hidden / heads, ``intermediate_size`` to 4 d).

    Raises:
        LctxError: the config lacks hidden_size, num_hidden_layers or num_attention_heads.
    """
    get = lambda *names, default=None: next((getattr(config, n) for n in names  # noqa: E731
                                             if getattr(config, n, None) is not None), default)
    d = get("hidden_size", "n_embd", "d_model")
    L = get("num_hidden_layers", "n_layer", "num_layers")
    H = get("num_attention_heads", "n_head", "num_heads")
    if not (d and L and H):
        raise LctxError(f"config of model_type {getattr(config, 'model_type', '?')!r} lacks hidden_size, "
                        "num_hidden_layers or num_attention_heads; lctx plan needs a decoder config")
    is_lctx = getattr(config, "model_type", "") == "lctx"
    return ModelShape(layers=int(L), heads=int(H), kv_heads=int(get("num_key_value_heads", default=H)),
                      head_dim=int(get("head_dim", default=d // H)), hidden=int(d),
                      intermediate=int(get("intermediate_size", "n_inner", default=4 * d)),
                      vocab=int(get("vocab_size", default=0)), n_params=count_parameters(config),
                      lctx=is_lctx, variant=str(getattr(config, "variant", getattr(config, "model_type", "?"))),
                      attn_impl=str(getattr(config, "attn_impl", "sdpa")))


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def cache_bytes(cache, layer_idx: int = 0, state: bool = True) -> int:
    """Bytes one layer keeps on a KV cache: its keys and values (a transformers ``DynamicCache``'s
    ``layers[i].keys/values``, or the allocated buffers of :class:`lctx.models.cache.PreallocatedKVCache`)
    plus, with ``state``, the lctx per-layer state (``cache.lctx_states[layer_idx]``: fixed-state mixers,
    PaTH's transported keys)."""
    n = 0
    layers = getattr(cache, "layers", None) or []
    keys, values = getattr(cache, "keys", None), getattr(cache, "values", None)
    if layer_idx < len(layers):
        n += _nbytes(getattr(layers[layer_idx], "keys", None)) + _nbytes(getattr(layers[layer_idx], "values", None))
    elif isinstance(keys, list) and isinstance(values, list) and layer_idx < len(keys):
        n += _nbytes(keys[layer_idx]) + _nbytes(values[layer_idx])
    if state:
        n += _nbytes((getattr(cache, "lctx_states", None) or {}).get(layer_idx))
    return n


#: tokens the in-process adapter reserves past the prompt in a preallocated KV cache (greedy decoding and
#: teacher-forced continuations write there): :attr:`lctx.models.adapters.hf.HFAdapter.decode_budget`'s default
DECODE_BUDGET = 256


def default_kv_cache() -> tuple[str, int]:
    """(kind, decode budget in tokens) of the KV cache :class:`lctx.models.adapters.hf.HFAdapter` gives lctx models:
    ``("preallocated", DECODE_BUDGET)`` (a :class:`PreallocatedKVCache` of prompt + budget tokens,
    :meth:`~lctx.models.adapters.hf.HFAdapter.new_cache`; other models get a ``DynamicCache``, which concatenates
    per chunk)."""
    return "preallocated", DECODE_BUDGET


@dataclass
class LayerProbe:
    """What one lctx attention layer did on a small forward (see :func:`probe_layer`).

    per_token / fixed: cache bytes of the layer per token and independent of tokens (keys, values and
    state); kv_per_token: the part of per_token stored through ``cache.update`` (keys and values); mask_asked: it read
    the Tq x Tk pattern (``ctx.mask()``); float_mask: it built the sdpa float mask (``ctx.memo``);
    used_attend: it went through :meth:`AttentionVariant.attend` (dense softmax); has_bias: its
    ``score_bias`` is not ``None``; fused_ok: it goes through ``attend`` and its ``prior_spec`` (the
    fused kernel's description of its prior) is not ``None``, so ``attn_impl="fast"`` runs the fused kernel;
    ssmax / scaled_bias: that spec has a Scalable-Softmax scale / one that multiplies a prior (the CPU
    blocked path then builds each block's mask instead of viewing the table).
    """

    per_token: int
    fixed: int
    kv_per_token: int
    mask_asked: bool
    float_mask: bool
    used_attend: bool
    has_bias: bool
    fused_ok: bool
    ssmax: bool = False
    scaled_bias: bool = False


def probe_layer(config, dtype: torch.dtype, t1: int = 16, t2: int = 48) -> LayerProbe:
    """Run one layer of an lctx config's variant on CPU twice into a ``DynamicCache`` (t1 tokens, then
    t2 - t1 more) with random q, k, v, x in ``dtype`` and read what it kept and which path it took.
    Layer 0 of a 1-layer copy of the config is used (same heads, head dim and options); cost: a few ms.
    The probe runs ``attn_impl="reference"`` when the config asks for it and ``"sdpa"`` otherwise (a
    ``"fast"`` probe would compile kernels); whether the fused kernel takes over is read from the
    variant's ``prior_spec`` instead.
    """
    from transformers.cache_utils import DynamicCache  # lazy: loads transformers

    from lctx.models.model import positions_and_mask  # lazy: loads lctx.models and transformers
    from lctx.models.variants import AttentionVariant, AttnContext, get_variant  # lazy: loads lctx.models (its kernels load triton)

    cls = get_variant(config.variant)
    impl = get_attn_impl(getattr(config, "attn_impl", "sdpa")).fallback  # fast -> sdpa: no kernel compiled
    cfg = config.__class__.from_dict({**config.to_dict(), "num_hidden_layers": 1, "attn_impl": impl})
    mod = cls(cfg, 0).eval()
    shared = cls.shared_module(cfg)
    if shared is not None:
        shared = shared.to(dtype)
    mod = mod.to(dtype)
    used = {"attend": False}
    orig_attend = mod.attend

    def attend(*a, **kw):
        used["attend"] = True
        return orig_attend(*a, **kw)

    mod.attend = attend
    H, D, d = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    cache, sizes, kv_sizes, mask_asked, float_mask = DynamicCache(), [], [], False, False
    with torch.inference_mode():
        for past, T in ((0, t1), (t1, t2 - t1)):
            q, k, v = (torch.randn(1, H, T, D, generator=g).to(dtype) for _ in range(3))
            x = torch.randn(1, T, d, generator=g).to(dtype)
            q_pos, k_pos, allowed_fn = positions_and_mask(None, 1, T, past, "cpu", lazy=True)
            ctx = AttnContext(q_pos=q_pos, k_pos=k_pos, allowed_fn=allowed_fn, cache=cache, shared=shared,
                              key_valid=torch.ones(1, past + T, dtype=torch.bool), padded=False, past=past)
            mod(q, k, v, ctx, x)
            cache.lctx_length = past + T
            mask_asked |= ctx.allowed is not None
            float_mask |= any(isinstance(key, tuple) and key and key[0] == "mask" for key in ctx.memo)
            sizes.append(cache_bytes(cache, 0))
            kv_sizes.append(cache_bytes(cache, 0, state=False))
        has_bias = (type(mod).score_bias is not AttentionVariant.score_bias
                    and mod.score_bias(ctx.q_pos, ctx.k_pos, ctx) is not None)
        try:
            spec = mod.prior_spec(ctx) if hasattr(mod, "prior_spec") else None
        except Exception:  # noqa: BLE001 - no usable spec: no fused kernel
            spec = None
    per_token = (sizes[1] - sizes[0]) // (t2 - t1)
    return LayerProbe(per_token=int(per_token), fixed=int(sizes[0] - per_token * t1),
                      kv_per_token=int((kv_sizes[1] - kv_sizes[0]) // (t2 - t1)), mask_asked=mask_asked,
                      float_mask=float_mask, used_attend=used["attend"], has_bias=has_bias,
                      fused_ok=used["attend"] and spec is not None,
                      ssmax=spec is not None and spec.ssmax is not None,
                      scaled_bias=spec is not None and spec.ssmax is not None and bool(spec.scale_bias)
                      and getattr(spec, "bias", None) is not None)


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype

    return resolve_dtype(str(dtype))


def plan_memory(config, length: int, chunk_size: int = CHUNK_SIZE, dtype=DTYPE, impl: str | None = None,
                batch: int = 1, kept_logits: int = 1, name: str | None = None, kv_cache: str = "auto",
                decode_budget: int | None = None, device="cpu", shape: ModelShape | None = None) -> MemoryPlan:
    """The memory model (module docstring) for a chunked prefill of ``length`` tokens.

    config: an lctx ``LctxConfig`` or a Hugging Face config; length: tokens (T); chunk_size: prefill chunk
    (tokens); dtype: weights/activations dtype (name or torch dtype); impl: ``attn_impl`` to plan for
    (default: the config's); batch: rows (B); kept_logits: positions whose logits are kept (1 for
    generation; the window for ppl); kv_cache: ``"dynamic"`` (``DynamicCache``: the cache grows by
    concatenation, one layer is copied at a time), ``"preallocated"`` (buffers of length + ``decode_budget``
    tokens written in place), ``"sliding"`` (a ``DynamicCache`` built from a Hugging Face config: its
    ``sliding_attention`` layers keep their window, :func:`sliding_layers`) or ``"auto"`` (what ``HFAdapter``
    uses for this config: :func:`default_kv_cache` for lctx models; for Hugging Face ones ``"sliding"`` where
    the config has sliding layers, as ``HFAdapter.new_cache`` builds ``DynamicCache(config=...)``, else
    ``"dynamic"``, so ``lctx plan`` plans what ``lctx run``'s memory check plans);
    device: where it runs (the fast paths differ: Triton on CUDA, the blocked / vectorised PyTorch forms
    on CPU); shape: :func:`model_shape` of ``config`` when the caller has it (it counts parameters on the meta
    device). Returns a :class:`MemoryPlan` (bytes) whose ``replan`` makes it again with some arguments changed.

    Raises:
        LctxError: non-positive length / chunk / batch, an unknown dtype or impl, or a config lctx cannot
            read.
    """
    if length < 1 or chunk_size < 1 or batch < 1 or kept_logits < 0:
        raise LctxError(f"length ({length}), chunk size ({chunk_size}) and batch ({batch}) must be positive; "
                        "pass e.g. --length 512k --chunk-size 2048")
    dt = _dtype(dtype)
    b = torch.tensor([], dtype=dt).element_size()
    s = shape or model_shape(config)
    asked = dict(length=length, shape=s, chunk_size=chunk_size, dtype=dtype, impl=impl, batch=batch,
                 kept_logits=kept_logits, name=name, kv_cache=kv_cache, decode_budget=decode_budget, device=device)
    hf_attn = None if s.lctx else hf_attention(config, impl)
    impl = impl or (DEFAULT_ATTN_IMPL if s.lctx else _impl_name(hf_attn))  # lctx: what load_lm runs by default
    path = get_attn_impl(impl) if s.lctx or impl in ATTN_IMPL_REGISTRY else get_attn_impl("sdpa")
    B, T, c = batch, length, min(chunk_size, length)
    L, H, D, d, I, V = s.layers, s.heads, s.head_dim, s.hidden, s.intermediate, s.vocab
    plan = MemoryPlan(model=name or s.variant, length=T, chunk_size=chunk_size, dtype=str(dt).replace("torch.", ""),
                      impl=impl, attn_path="sdpa", device=str(device), lctx=s.lctx)
    add = lambda n, v, f: plan.items.append(MemoryItem(n, int(v), f))  # noqa: E731
    add("weights", s.n_params * b, f"{s.n_params:,} parameters x {b} B")
    kv_formula = 2 * s.kv_heads * D * b  # per token per layer
    if s.lctx:
        cfg = config.__class__.from_dict({**config.to_dict(), "attn_impl": impl})
        try:
            pr = probe_layer(cfg, dt)
        except Exception as e:  # noqa: BLE001 - a variant that cannot run on CPU: fall back to the formula
            plan.notes.append(f"probe forward failed ({type(e).__name__}: {str(e)[:120]}); softmax formula used")
            pr = LayerProbe(kv_formula, 0, kv_formula, True, not path.explicit, True, False, False)
    else:  # a Hugging Face model: its attention's working set is hf_attention_working_set's
        pr = LayerProbe(kv_formula, 0, kv_formula, True, True, True, False, False)
    if kv_cache == "auto":
        kv_cache, auto_budget = default_kv_cache() if s.lctx else (
            "sliding" if sliding_layers(config)[0] else "dynamic", 0)  # HFAdapter.new_cache: DynamicCache(config=)
        decode_budget = auto_budget if decode_budget is None else decode_budget
    if kv_cache not in ("dynamic", "preallocated", "sliding"):
        raise LctxError(f"unknown KV cache kind {kv_cache!r}; use auto, dynamic, preallocated or sliding")
    n_slide, window = sliding_layers(config) if kv_cache == "sliding" else (0, None)
    if kv_cache == "sliding" and (s.lctx or not n_slide):
        raise LctxError("KV cache kind 'sliding' applies to Hugging Face configs with sliding_attention layers "
                        "and a sliding_window; use dynamic")
    win_tok = min(T, window - 1 + c) if n_slide else T  # a sliding layer's keys: its window's, plus a chunk
    plan.kv_cache = kv_cache
    cap = T + (int(decode_budget or 0) if kv_cache == "preallocated" else 0)
    st_tok = pr.per_token - pr.kv_per_token  # per-token state beside the cache (PaTH's transported keys)
    if n_slide:
        kv_text = (f"({L - n_slide} full layers x {T:,} + {n_slide} sliding layers x {win_tok:,} tokens: window "
                   f"{window} - 1 + chunk, the concatenation its view keeps) x 2 (K,V) x {s.kv_heads} kv heads x "
                   f"{D} head dim x {b} B")
    elif pr.per_token == kv_formula and pr.fixed == 0:
        kv_text = f"{cap:,} tokens x 2 (K,V) x {L} layers x {s.kv_heads} kv heads x {D} head dim x {b} B"
    else:
        kv_text = (f"{pr.kv_per_token} B x {cap:,} tokens + {st_tok} B x {T:,} tokens + {pr.fixed} B fixed, per layer "
                   f"x {L} layers (measured from the variant's cache)")
    if kv_cache == "preallocated":
        kv_text += f" ({kv_cache}: prompt + {cap - T} decode tokens)"
    if n_slide:
        add("KV cache / state", B * pr.kv_per_token * ((L - n_slide) * T + n_slide * win_tok), kv_text)
    else:
        add("KV cache / state", L * B * (pr.kv_per_token * cap + st_tok * T + pr.fixed), kv_text)
    if kv_cache in ("dynamic", "sliding"):
        grown = T if n_slide < L else win_tok
        add("KV cache growth", B * pr.per_token * grown, "one layer's cache copied once (DynamicCache torch.cat)")
    else:
        add("KV cache growth", B * st_tok * T, "one layer's per-token state copied once (torch.cat); "
            "keys and values are written in place")
    add("positions", B * T * 17, "B x T x (8 + 8 + 1) B: k_pos, cumsum, key_valid")
    if pr.used_attend:  # softmax layers: a block's peak is its attention half (x, norm, q k v, rotated q k,
        # outputs, o_proj ~ 10 d) or its MLP half (x, norm, gate, up, act: 2 d + 3 I), whichever is larger
        act, act_text = max(10 * d, 2 * d + 3 * I), f"max(10 x {d}, 2 x {d} + 3 x {I})"
    else:  # fixed-state and blockwise mixers build per-token gates, steps and readouts besides q, k, v: the
        # conservative bound (both halves at once) is what matched their measured peaks (test_memory.py, slow)
        act, act_text = 8 * d + 4 * I, f"(8 x {d} + 4 x {I})"
    add("activations", B * c * act * b + B * c * d * 8,
        f"chunk {c} x {act_text} x {b} B + chunk x d x 8 (RMSNorm fp32)")
    cuda = torch.device(device).type == "cuda"
    split = pr.used_attend and not path.explicit and not pr.has_bias and not (cuda and path.kernels)
    if hf_attn is not None:
        plan.attn_path = hf_attn
        for item in hf_attention_working_set(config, hf_attn, B, H, s.kv_heads, c, T, D, b,
                                             sliding_keys=win_tok if n_slide else None):
            add(*item)
    elif split and (not pr.mask_asked or (path.kernels and pr.fused_ok)):  # kernels.chunk_attention: no mask
        plan.attn_path = "chunk-split"
        add("attention working set", B * H * c * (3 * D * b + 2 * D * 4 + 8),
            f"B x H x chunk x (3 x D x {b} + 2 x D x 4 + 8) B: the past and own parts' outputs, the fp32 merge and "
            "their log-sum-exps (kernels/chunk_attention.py)")
        if s.heads != s.kv_heads:
            add("grouped KV repeated", 2 * B * H * T * D * b, f"2 x B x H x T x D x {b} B: one layer's keys and "
                f"values repeated to {H} heads for the CPU flash kernel")
    elif path.kernels and pr.fused_ok:
        plan.attn_path = "fused"
        for item in fused_working_set(B, H, c, D, T, cuda, pr):
            add(*item)
    elif not pr.mask_asked:
        plan.attn_path = "fixed-state"
        for item in fixed_state_working_set(s.variant, _option_values(config), B, H, c, D, path.kernels, cuda):
            add(*item)
    elif pr.used_attend and (path.explicit and not pr.float_mask):
        plan.attn_path = "reference"
        add("attention pattern (bool)", 2 * B * c * T, f"2 x B x chunk x T = 2 x {c} x {T:,} x 1 B (pattern, negation)")
        add("attention scores (fp32)", 3 * B * H * c * T * 4 + (B * H * c * T * 4 if pr.has_bias else 0),
            "3 x B x H x chunk x T x 4 (scores, masked, probs)" + (" + bias x 4" if pr.has_bias else ""))
    elif pr.used_attend:
        plan.attn_path = "sdpa"
        add("attention pattern (bool)", 2 * B * c * T, f"2 x B x chunk x T = 2 x {c} x {T:,} x 1 B (pattern, negation)")
        add("sdpa float mask", 2 * B * c * T * b + (B * H * c * T * (4 + b) if pr.has_bias else 0),
            f"2 x B x chunk x T x {b} B (zeros + masked_fill copy)"
            + (f" + bias B x H x chunk x T x (4 + {b}) B" if pr.has_bias else ""))
        if path.kernels:
            plan.notes.append(f"attn_impl fast: {s.variant!r} has no prior_spec for the fused kernel, so the "
                              "sdpa fallback (chunk x T float mask) is counted")
    elif s.variant == "alibi_lsh" and path.kernels and not cuda:
        plan.attn_path = "lsh-blocked"
        for item in lsh_working_set(_option_values(config), B, H, c, D, T):
            add(*item)
    elif s.variant == "path" and not path.explicit and cuda and T <= c and _fla_importable():
        plan.attn_path = "fla-path"
        add("attention working set", B * H * c * (8 * D * 4 + 64 * 4),
            "fla PaTH kernel (one chunk, empty cache): B x H x chunk x (8 D x 4 + 64 x 4) B: q/k/v/w in its "
            "layout, output, transported keys, the per-64-token UT blocks")
    else:
        plan.attn_path = "blockwise"
        add("attention pattern (bool)", B * c * T, f"B x chunk x T = {c} x {T:,} x 1 B")
        add("attention blocks (fp32)", B * H * 128 * T * 16, "B x H x 128 queries x T x 16 B (blockwise reference)")
    for item in logits_working_set(B, T, c, V, b, kept_logits, getattr(config, "final_logit_softcapping", None)):
        add(*item)
    if not s.lctx:
        plan.notes.append(f"Hugging Face config: softmax KV formula; transformers' {hf_attn!r} attention counted")
    plan.base_total = plan.total
    plan.replan = lambda **change: plan_memory(config, **{**asked, **change})
    return plan


#: the attention transformers runs for a Hugging Face model loaded without ``--attn-impl``
#: (``from_pretrained``'s default where the architecture supports it)
HF_DEFAULT_ATTENTION = "lctx_sdpa"  # lctx's default (--attn-impl fast), load_lm's _default_attn_impl


def hf_attention(config, impl: str | None) -> str:
    """The transformers attention (``attn_implementation``) a Hugging Face model runs: ``impl``'s
    (:attr:`lctx.attn_impl.AttnImpl.hf`) when given, else the config's ``_attn_implementation`` (set on a loaded
    model's config), else :data:`HF_DEFAULT_ATTENTION`.

    Raises:
        LctxError: an unknown ``impl``, or one that applies to lctx checkpoints only.
    """
    if impl is None:
        return str(getattr(config, "_attn_implementation", None) or HF_DEFAULT_ATTENTION)
    entry = get_attn_impl(impl)
    if entry.hf is None:
        raise LctxError(f"--attn-impl {impl} applies to lctx checkpoints only; this Hugging Face "
                        f"{getattr(config, 'model_type', '?')} model runs transformers' attention: use "
                        + " or ".join(n for n in ATTN_IMPL_REGISTRY if ATTN_IMPL_REGISTRY[n].hf) + ", or omit it")
    return entry.hf


def _impl_name(hf_attn: str) -> str:
    """The ``--attn-impl`` name whose transformers attention is ``hf_attn`` (``sdpa`` for ``sdpa``), else
    ``hf:<name>``."""
    return next((n for n in ATTN_IMPL_REGISTRY if ATTN_IMPL_REGISTRY[n].hf == hf_attn), f"hf:{hf_attn}")


def sliding_layers(config) -> tuple[int, int | None]:
    """(layers whose ``layer_types`` entry is ``"sliding_attention"``, the config's ``sliding_window``) of a
    Hugging Face config; (0, None) when it has none or no window."""
    window = getattr(config, "sliding_window", None)
    n = sum(t == "sliding_attention" for t in (getattr(config, "layer_types", None) or []))
    return (n, int(window)) if n and window else (0, None)


def hf_attention_working_set(config, hf_attn: str, B: int, H: int, kv: int, c: int, T: int, D: int,
                             b: int, sliding_keys: int | None = None) -> list[tuple]:
    """(name, bytes, formula) of a Hugging Face model's attention for a chunk of c queries against T keys, by the
    transformers attention it runs (transformers ``masking_utils`` and ``integrations/sdpa_attention.py``, and
    ``eager_attention_forward`` of its models):

    * ``sdpa``: the chunk x keys bool mask transformers builds once a forward per kind of layer (``layer_types``:
      full and sliding), and in a layer's call its negation and SDPA's float copy (torch turns a bool mask into an
      additive one), B x c x (sum of the kinds' keys + (1 + b) x the most keys); with grouped-query heads and a
      mask, ``repeat_kv`` copies one layer's keys and values to every head, 2 x B x H x keys x D x b;
    * ``eager``: the mask (bool and float, B x c x keys x (1 + b) per kind), the scores and their float32
      softmax B x H x c x keys x (b + 4), and the ``repeat_kv`` copies;
    * any other (a kernel that takes no chunk x T mask, such as the one ``--attn-impl fast`` names): the
      partial outputs and log-sum-exp merge of the chunk, 4 x B x H x c x D x 4 (an upper estimate).

    Keys: T for full layers; ``sliding_keys`` for sliding ones when the cache slides (``DynamicCache(config=...)``:
    window - 1 + c), else T as well.
    """
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    keys = [sliding_keys if (t == "sliding_attention" and sliding_keys) else T for t in sorted(types)]
    most = max(keys)
    rep = 2 * B * H * most * D * b if kv < H else 0
    rep_text = f"repeat_kv: 2 x B x {H} heads x {most:,} keys x {D} x {b} B"
    masks = " + ".join(f"{k:,}" for k in keys)
    if hf_attn == "sdpa":
        items = [("attention mask", B * c * (sum(keys) + (1 + b) * most),
                  f"{len(keys)} bool mask(s) of chunk x ({masks}) keys + negation and SDPA's float copy of the "
                  f"largest, chunk x {most:,} x (1 + {b}) B")]
    elif hf_attn == "eager":
        items = [("attention mask", B * c * sum(keys) * (1 + b),
                  f"B x chunk x ({masks}) keys x (1 + {b}) B (bool, float)"),
                 ("attention scores", B * H * c * most * (b + 4), f"B x {H} heads x chunk x {most:,} keys x ({b} "
                                                                  "+ 4) B (scores, float32 softmax)")]
    else:
        items = [("attention working set", B * H * c * D * 16,
                  f"{hf_attn}: no chunk x T mask; partial outputs and log-sum-exp merge 4 x B x H x chunk x D x 4 B")]
        if hf_attn != "lctx_sdpa":  # lctx_sdpa repeats grouped heads for the CPU flash kernel (below)
            return items
    if rep:
        items.append(("GQA key/value copies", rep, rep_text))
    return items


#: rows of a chunk's logits :meth:`lctx.models.adapters.hf.HFAdapter.token_nll` reduces at a time in float64
NLL_BLOCK_ROWS = 512
#: Python objects per scored position of ``token_nll`` under the ppl task: its {position: (nll, top-1)} dict, the
#: target and wanted-position lists with their int objects, ``prefill``'s sorted set of wanted positions, the
#: window's id list. Measured with tracemalloc over ``sliding_nll`` on the bundled model: 247 B at a 16K window
#: (527 B at 4K, where a fixed ~1 MB weighs in); the peak RSS of 64K-token ppl runs was 16-30 MiB over a plan
#: without it (results/2026-12-02-memory-plan)
NLL_PYTHON_BYTES = 256


def logits_working_set(B: int, T: int, c: int, V: int, b: int, kept: int, softcap=None) -> list[tuple]:
    """(name, bytes, formula) of the logits of a chunked prefill of T tokens in chunks of c (vocabulary V, model
    dtype of b bytes) that keeps the logits of ``kept`` positions, as
    :meth:`lctx.models.adapters.hf.HFAdapter.prefill` and :meth:`~lctx.models.adapters.hf.HFAdapter.token_nll`
    produce them: one chunk at a time, k = min(kept, c) rows (``logits_to_keep``; 1 row, the chunk's last, when
    nothing is kept). Two moments hold the most:

    * the forward of a chunk after the first: the previous chunk's float32 logits are still bound (``prefill``
      rebinds them when the forward returns), k x V x 4, beside ``lm_head``'s output k x V x b, a second one
      while a final soft-capping (``final_logit_softcapping``, Gemma 2: ``logits / cap``, ``tanh``, ``* cap``)
      runs, and the float32 copy k x V x 4 when b < 4 (``.float()``);
    * the scoring of a chunk when more than one position is kept (``token_nll``, the ppl task): the chunk's
      float32 logits and, per block of m = min(k, 512) rows, the float64 copy and its log-softmax, 2 x m x V x 8.

    The larger of the two, x B rows. Kept positions past one chunk's worth cost no more logits: a chunk's logits
    are reduced and dropped before the next one comes; each scored position keeps :data:`NLL_PYTHON_BYTES` of
    Python objects (its score and the bookkeeping), a second item when more than one position is kept.
    """
    k = max(1, min(int(kept), c))
    m = min(k, NLL_BLOCK_ROWS)
    prev = k * V * 4 if T > c else 0
    forward = prev + k * V * b * (2 if softcap else 1) + (k * V * 4 if b < 4 else 0)
    score = k * V * 4 + (2 * m * V * 8 if kept > 1 else 0)
    if forward >= score:
        rows = f"{k} row{'s' if k > 1 else ''}"
        text = (f"forward of a chunk: {rows} x vocab {V:,} x ({'4 previous chunk + ' if prev else ''}{b} lm_head"
                + (f" + {b} soft-capping" if softcap else "") + (" + 4 float32 copy" if b < 4 else "") + ") B")
    else:
        text = (f"scoring a chunk: {k} rows x vocab {V:,} x 4 B (float32) + 2 x {m} rows x {V:,} x 8 B "
                f"(float64 block of {NLL_BLOCK_ROWS} and its log-softmax)")
    items = [("logits", B * max(forward, score), text)]
    if kept > 1:
        items.append(("scores (Python objects)", B * min(int(kept), T) * NLL_PYTHON_BYTES,
                      f"{min(int(kept), T):,} scored positions x {NLL_PYTHON_BYTES} B (token_nll's scores and lists)"))
    return items


def _fla_importable() -> bool:
    return importlib.util.find_spec("fla") is not None


def fused_working_set(B: int, H: int, c: int, D: int, T: int, cuda: bool, pr: LayerProbe) -> list[tuple]:
    """(name, bytes, formula) items of the fused-prior fast path for a chunk of c queries against T keys.

    CUDA (Triton, :func:`lctx.kernels.flash_prior.flash_prior_triton`): the float32 output and row
    statistics B x H x c x D x 16 B, plus the Toeplitz table H x T x 4 B. CPU
    (:func:`lctx.kernels.flash_prior.flash_prior_blocked`): float32 copies of q (reversed, SSMax-scaled), the
    blocks' outputs and their concatenation, B x H x c x D x 4 B each (4, 5 with SSMax); the table and its
    reversed copy with rows of -inf, 2 x H x (T + rows) x 4 B; with a scaled bias each block's mask is
    built, H x rows x T x 4 B (rows = :func:`lctx.kernels.flash_prior.default_block`)."""
    if cuda:
        return [("attention working set", B * H * c * D * 16 + H * T * 4,
                 "fused Triton kernel: B x H x chunk x D x 16 + prior table H x T x 4; no chunk x T buffer")]
    from lctx.kernels.flash_prior import default_block  # lazy: loads triton

    rows = min(default_block(c), c)
    copies = 5 if pr.ssmax else 4
    items = [("attention working set", B * H * c * D * 4 * copies + 2 * H * (T + rows) * 4,
              f"blocked CPU path: {copies} x B x H x chunk x D x 4 (q copies, block outputs, concatenation) + "
              f"2 x H x (T + {rows}) x 4 (prior table, reversed); masks are views of the table")]
    if pr.scaled_bias:
        items.append(("scaled-bias block mask", H * rows * T * 4,
                      f"SSMax on the bias: one block's mask c_i b materialised, H x {rows} rows x T x 4"))
    return items


def _option_values(config) -> dict:
    """Every option value an lctx config's variant computes with: its ``variant_options`` over the defaults of
    the variant's option schema (:meth:`lctx.models.variants.AttentionVariant.option_values`)."""
    from lctx.models.variants import get_variant  # lazy: loads lctx.models (its kernels load triton)

    return get_variant(config.variant).option_values(config)


def fixed_state_working_set(variant: str, opts: dict, B: int, H: int, c: int, D: int, fast: bool,
                            cuda: bool) -> list[tuple]:
    """(name, bytes, formula) items of a fixed-state mixer's chunk of c tokens (``interdomain`` / ``s4d``,
    :mod:`lctx.models.interdomain`; N modes, inner chunk L, conv width K from ``opts``, every option value of
    the variant: :func:`_option_values`).

    Triton (CUDA, fast): B x H x c x D x 32 B. CPU, the vectorised form
    (:func:`lctx.kernels.interdomain_scan.interdomain_scan_cpu`, ``attn_impl="fast"``) holds whole-chunk
    tensors: interdomain's feature maps (K + 8) x B H c D x 4 (the conv's unfolded product, SiLU, norms,
    inputs), [kt; vt; 1] as float and complex B H c (2D + 1) x 12, the per-inner-chunk scores and
    readout matrix with their einsum copies 4 x B H c L x 4, the per-mode readouts 6 x B H c N x 8, and
    the decay tables 3 x H 2N L^2 x 4; s4d: 9 x B H c D x 4 + 2 x H D L^2 x 4 + 2 x H D N L x 8. The
    model's per-inner-chunk form (sdpa / reference) keeps only one inner chunk's temporaries beside the
    feature maps, its outputs and their concatenation (2 x B H c D x 4) and the same tables.
    Estimates from the shapes of the code (allocator overhead not counted)."""
    if cuda and fast:
        return [("attention working set", B * H * c * D * 32, "fixed-state Triton scan: B x H x chunk x D x 32")]
    if variant == "s4d":
        N, L = int(opts["s4d_modes"]), int(opts["s4d_chunk"])
        tables = 2 * H * D * L * L * 4 + 2 * H * D * N * L * 8
        per = 9 * D * 4 if fast else 2 * D * 4 + 4 * D * 4
        form = "vectorised over inner chunks" if fast else "per inner chunk"
        return [("attention working set", B * H * c * per + tables,
                 f"s4d scan ({form}, N {N}, L {L}): B x H x chunk x {per} B + tables 2 x H x D x L^2 x 4 + "
                 "2 x H x D x N x L x 8")]
    N, L, K = int(opts["id_modes"]), int(opts["id_chunk"]), int(opts["id_conv"])
    feat = (K + 8) * D * 4
    core = (12 * (2 * D + 1) + 16 * L + 48 * N) if fast else 2 * D * 4
    tables = 3 * H * 2 * N * L * L * 4
    form = "vectorised over inner chunks" if fast else "per inner chunk"
    return [("attention working set", B * H * c * (feat + core) + tables,
             f"interdomain scan ({form}, N {N}, L {L}, K {K}): B x H x chunk x ({feat} feature maps + {core} "
             f"core) B + decay tables 3 x H x 2N x L^2 x 4")]


def lsh_working_set(opts: dict, B: int, H: int, c: int, D: int, T: int) -> list[tuple]:
    """(name, bytes, formula) items of ``alibi_lsh``'s CPU kernel (:func:`lctx.kernels.lsh_blocks.
    lsh_attention_blocked`) for a chunk of c queries (``opts``: every option value of the variant,
    :func:`_option_values`): the bin starts and their sorted per-row increments
    (s + 2 int64 per query and head, plus the float64 temporaries of :func:`bin_starts`, 5 x s per query
    and head), one block's histogram and its running sum 2 x H x rows x (rows + age) x 4 with age about
    4 sigma_max (sigma = 1 / the smallest ALiBi slope: the bins' Gamma(2, sigma) widths rarely exceed it),
    and the outputs with their concatenation 2 x B x H x c x D x 4. Exact ALiBi, run instead where it is
    cheaper, needs less (a table)."""
    from lctx.models.variants import alibi_slopes  # lazy: loads lctx.models (its kernels load triton)

    s = int(opts["lsh_samples"])
    rows = 256
    age = int(4 / float(alibi_slopes(H).min()))
    w = min(T, rows + age)
    n = H * c * (s + 2) * 8 + 5 * s * H * c * 8 + 2 * H * rows * (w + 1) * 4 + 2 * B * H * c * D * 4
    return [("attention working set", n,
             f"LSH blocked (s {s}): H x chunk x (s + 2 + 5 s) x 8 (bin starts) + 2 x H x {rows} x {w} x 4 (one "
             "block's mask) + 2 x B x H x chunk x D x 4")]


def device_memory(device, override: int | None = None) -> tuple[int, str]:
    """(bytes, source) the device can hold: ``override`` when given; CUDA: the GPU's total memory
    (``torch.cuda.get_device_properties``); CPU: ``MemAvailable`` from ``/proc/meminfo`` (or total
    physical memory from ``os.sysconf`` where there is no /proc).

    Raises:
        LctxError: a CUDA device on a machine without one.
    """
    if override is not None:
        return int(override), "--device-memory"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise LctxError(f"device {str(device)!r} has no CUDA GPU here; plan with --device cpu, or pass "
                            "--device-memory 141g to plan for a GPU you do not have")
        return int(torch.cuda.get_device_properties(dev).total_memory), f"{torch.cuda.get_device_name(dev)} total memory"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "CPU MemAvailable (/proc/meminfo)"
    except OSError:
        pass

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "CPU physical memory"


#: a change :func:`advice` names lowers the plan's total by at least this fraction
ADVICE_MIN_SAVING = 0.05
#: the smallest ``--chunk-size`` :func:`advice` tries
ADVICE_MIN_CHUNK = 128


def advice(plan: MemoryPlan, room: int | None = None) -> list[str]:
    """What would lower ``plan``'s estimate for its model, each with the total it would give (e.g.
    ``"--chunk-size 512 (about 3.10 GiB)"``), tried by making the plan again (``plan.replan``) with one change:

    * half the length (``"shorter lengths"``);
    * a smaller ``--chunk-size`` (halves down to :data:`ADVICE_MIN_CHUNK`): the largest that fits ``room``
      bytes, else the one that needs the least;
    * ``--dtype bfloat16`` when the plan is float32;
    * another ``--attn-impl``: only those that apply to the model (every one for lctx checkpoints; for Hugging
      Face ones those with a transformers attention, :attr:`lctx.attn_impl.AttnImpl.hf`), the one that needs
      the least.

    A change is named only when it lowers the total by :data:`ADVICE_MIN_SAVING` of it or more; the sizes
    include what a caller added to the plan after :func:`plan_memory` (other models' weights). A plan made by
    hand (no ``replan``) gets the generic ``"shorter lengths"`` and ``"a smaller --chunk-size"``.
    """
    if plan.replan is None:
        return ["shorter lengths", "a smaller --chunk-size"]
    extra = plan.total - plan.base_total  # items added after planning, the same under every change

    def need(**change) -> int | None:
        try:
            return plan.replan(**change).total + extra
        except LctxError:  # a change this model cannot take
            return None

    def worth(n: int | None) -> bool:
        return n is not None and n <= plan.total * (1 - ADVICE_MIN_SAVING)

    out = []
    if plan.length > 1 and worth(n := need(length=max(1, plan.length // 2))):
        out.append(f"shorter lengths (half: about {gib(n)})")
    c, tried = min(plan.chunk_size, plan.length) // 2, []
    while c >= ADVICE_MIN_CHUNK:
        tried.append((c, need(chunk_size=c)))
        c //= 2
    tried = [(c, n) for c, n in tried if worth(n)]
    if tried:
        fits = [t for t in tried if room is not None and t[1] <= room]
        c, n = fits[0] if fits else min(tried, key=lambda t: t[1])
        out.append(f"--chunk-size {c} (about {gib(n)})")
    if plan.dtype == "float32" and worth(n := need(dtype="bfloat16")):
        out.append(f"--dtype bfloat16 (about {gib(n)})")
    impls = [(name, need(impl=name)) for name in ATTN_IMPL_REGISTRY
             if name != plan.impl and (plan.lctx or ATTN_IMPL_REGISTRY[name].hf is not None)]
    impls = [t for t in impls if worth(t[1])]
    if impls:
        name, n = min(impls, key=lambda t: t[1])
        out.append(f"--attn-impl {name} (about {gib(n)})")
    return out


def check_fits(plan: MemoryPlan, available: int, source: str, resident: int = 0, hint: str = "") -> None:
    """Refuse a plan whose total exceeds ``available + resident`` bytes (``resident``: bytes of the plan
    that are already allocated and so already missing from ``available``, e.g. loaded weights on CPU).

    Raises:
        LctxError: one line with the need, the room, the largest part and what to change (:func:`advice`:
            only options that apply to the model and lower the estimate).
    """
    room = available + resident
    if plan.total <= room:
        return
    big = plan.largest()
    ways = advice(plan, room) + ["a bigger device"]
    use = ways[0] if len(ways) == 1 else f"{', '.join(ways[:-1])} or {ways[-1]}"
    raise LctxError(f"a {plan.length:,}-token prefill of {plan.model} needs about {gib(plan.total)} but the device "
                    f"has {gib(room)} ({source}); largest part: {big.name} {gib(big.bytes)}. Use {use}{hint}")


def check_run_fits(lms: list, length: int, kept_logits: int = 1, available: int | None = None) -> list[MemoryPlan]:
    """Before a sweep: plan the longest prefill of every model adapter
    (:meth:`~lctx.models.adapters.protocol.ModelAdapter.memory_plan`) and refuse the run when one model's prefill
    plus the weights of all loaded models exceed their device's memory (the plan's ``device``). On CPU the
    loaded weights are already out of ``MemAvailable``, so they are added back to the room. An adapter whose plan
    is ``None`` (a server) is not checked. Returns the plans made.

    Raises:
        LctxError: a run that cannot fit (see :func:`check_fits`).
    """
    plans, by_dev = [], {}
    for lm in lms:
        plan = lm.memory_plan(length, kept_logits=kept_logits)
        if plan is None:
            continue
        plans.append(plan)
        by_dev.setdefault(str(plan.device), []).append((lm, plan))
    for dev, pairs in by_dev.items():
        weights = sum(p.get("weights") for _, p in pairs)
        room, source = device_memory(dev, available)
        resident = weights if torch.device(dev).type == "cpu" and available is None else 0
        for lm, plan in pairs:
            others = weights - plan.get("weights")
            if others:
                plan.items.append(MemoryItem("other models' weights", others, "loaded at the same time"))
            check_fits(plan, room, source, resident,
                       hint=f"; `lctx plan --model {lm.path} --length {length}` shows the breakdown, "
                            "--no-memory-check skips this check")
    return plans


#: copies of a batch's logits that lm-eval's ``hf`` backend holds at once: the model's output and its
#: log-softmax (``F.log_softmax(self._model_call(batched_inps), dim=-1)``, lm-eval 0.4
#: ``HFLM._loglikelihood_tokens``; the input is freed only after the call returns)
LMEVAL_LOGIT_COPIES = 2
#: planned bytes of one row block's forward working set in lctx's lm-eval model (``LctxHFLM``,
#: :func:`lctx.tasks.lmeval.lctx_hflm_class`): it runs a batch's rows through the model this many planned bytes at a
#: time (:func:`lmeval_block_rows`; lm-eval's batch, its requests per ``_model_call``, stays as asked). SmolLM2-135M
#: at 3,094 tokens plans 136 MB a row, so 7 rows a block (results/2026-12-02-lmeval-lean/README.md)
LMEVAL_BLOCK_BYTES = GIB
#: HF attention implementations that, given no attention mask and no cache (lm-eval's right-padded causal rows),
#: run causal attention without a T x T mask (transformers' ``sdpa_mask`` returns None and the kernel gets
#: ``is_causal``; flash and flex take no float mask)
_MASKLESS_HF_ATTN = ("sdpa", "lctx_sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


def lmeval_logit_bytes(config, dtype) -> int:
    """Bytes per logit element of a model's forward under lm-eval: 4 for lctx models (their forward returns
    float32 logits, ``lctx.models.model``: ``self.lm_head(h).float()``), else the model dtype's size (Hugging Face
    causal LMs return ``lm_head``'s output as is, e.g. ``LlamaForCausalLM``); lm-eval's ``softmax_dtype`` is
    unset, so the log-softmax keeps that dtype."""
    if getattr(config, "model_type", "") == "lctx":
        return 4
    return torch.tensor([], dtype=_dtype(dtype)).element_size()


def lmeval_forward_plan(config, length: int, rows: int, dtype=DTYPE, name: str | None = None,
                        device="cpu") -> MemoryPlan:
    """The memory model of one forward of lctx's lm-eval model over ``rows`` right-padded rows of ``length``
    tokens (``LctxHFLM``: ``model(ids, use_cache=False)`` and the output embeddings applied only at the scored
    positions): :func:`plan_memory` with chunk = length, B = rows, no kept logits, and without the KV cache (no
    cache is made). Hugging Face models whose attention is one of :data:`_MASKLESS_HF_ATTN` also lose the sdpa
    pattern and float mask (no mask is built for mask-free causal rows). Measured on SmolLM2-135M (sdpa, float32,
    CPU): 2 and 4 rows x 1,500 tokens, 2 rows x 3,000 tokens held 32-40 KB per row-token above the loaded model;
    this plan charges 43.9 KB at 3,000 tokens (activations, lctx_sdpa's attention working set and repeated KV
    heads), an upper estimate.

    Raises:
        LctxError: non-positive sizes (as :func:`plan_memory`).
    """
    plan = plan_memory(config, length, chunk_size=length, dtype=dtype, batch=rows, kept_logits=0, name=name,
                       kv_cache="dynamic", device=device)
    drop = {"KV cache / state", "KV cache growth", "logits"}
    if (getattr(config, "model_type", "") != "lctx"
            and getattr(config, "_attn_implementation", None) in _MASKLESS_HF_ATTN):
        drop |= {"attention pattern (bool)", "sdpa float mask"}
    plan.items = [i for i in plan.items if i.name not in drop]
    return plan


def lmeval_block_rows(config, length: int, cont: int, dtype=DTYPE, budget: int = LMEVAL_BLOCK_BYTES,
                      device="cpu") -> int:
    """Rows of ``length`` tokens (the batch's padded length) that lctx's lm-eval model runs through the model at
    once: the most whose planned working set, :func:`lmeval_forward_plan` less the weights plus each row's
    ``cont`` scored positions x vocab x :func:`lmeval_logit_bytes` (the block's head output), stays within
    ``budget`` bytes; at least 1. The working set is taken as linear in the rows (every item of one row's plan
    scales with B).

    Raises:
        LctxError: non-positive sizes (as :func:`plan_memory`).
    """
    one = lmeval_forward_plan(config, length, 1, dtype=dtype, device=device)
    per_row = one.total - one.get("weights") + int(cont) * model_shape(config).vocab * lmeval_logit_bytes(config, dtype)
    return max(1, int(budget) // max(1, per_row))


def plan_lmeval(config, longest: int, batch: int, requests: int | None = None, dtype=DTYPE,
                name: str | None = None, device="cpu", cont: int | None = None,
                block_bytes: int = LMEVAL_BLOCK_BYTES) -> MemoryPlan:
    """The memory model of one lm-eval forward (MMLU/ARC): rows = min(batch, requests) requests right-padded to
    the ``longest`` (tokens) (no chunks: lm-eval calls the model directly), and the logits lm-eval keeps plus
    their log-softmax, a second copy made after the forward's working set is freed, so it adds max(0, copy -
    working set). Peak = weights + max(working set + copy, 2 copies). lm-eval sorts requests longest first, so
    its first batch is the largest.

    ``cont`` given (tokens of the longest continuation: lctx's own lm-eval model, ``LctxHFLM``, which computes
    logits only where lm-eval scores): the working set is one row block's forward, :func:`lmeval_forward_plan` at
    min(rows, :func:`lmeval_block_rows` with ``block_bytes``) rows plus the block's head output; a copy is rows x
    cont x vocab x :func:`lmeval_logit_bytes`.

    ``cont`` None (lm-eval's own ``hf`` model, ``HFLM``: full logits, one forward with a KV cache): the working
    set is :func:`plan_memory` with chunk = length and B = rows (kept positions dropped); a copy is rows x
    longest x vocab x :func:`lmeval_logit_bytes`. Measured: SmolLM2-135M, 5-shot MMLU
    high_school_european_history, 20 rows of 3,039 tokens, float32 on CPU: planned 22.76 GiB, peak RSS 22.74 GiB
    (results/2026-12-01-smollm2-135m/README.md).

    Raises:
        LctxError: non-positive sizes (as :func:`plan_memory`).
    """
    rows = max(1, min(int(batch), int(requests))) if requests else int(batch)
    V, b = model_shape(config).vocab, lmeval_logit_bytes(config, dtype)
    if cont is None:
        plan = plan_memory(config, longest, chunk_size=longest, dtype=dtype, batch=rows, kept_logits=0, name=name,
                           kv_cache="dynamic", device=device)
        plan.items = [i for i in plan.items if i.name != "logits"]
        scored, what = longest, f"{rows} requests x {longest:,} tokens x vocab {V:,} x {b} B"
    else:
        scored = max(1, min(int(cont), int(longest)))
        blk = min(rows, lmeval_block_rows(config, longest, scored, dtype=dtype, budget=block_bytes, device=device))
        plan = lmeval_forward_plan(config, longest, blk, dtype=dtype, name=name, device=device)
        plan.items.append(MemoryItem("row block logits", blk * scored * V * b,
                                     f"row block of {blk} x {scored} continuation tokens x vocab {V:,} x {b} B"))
        plan.notes.append(f"forward in row blocks of {blk} of the {rows} rows (planned working set <= "
                          f"{gib(block_bytes)} a block)")
        what = f"{rows} requests x {scored} continuation tokens x vocab {V:,} x {b} B"
    work = plan.total - plan.get("weights")
    copy = rows * scored * V * b
    plan.items.append(MemoryItem("lm-eval logits", copy, what))
    plan.items.append(MemoryItem("lm-eval log-softmax", max(0, copy - work),
                                 f"a second copy of the logits, made once the forward's {gib(work)} are freed: "
                                 "max(0, copy - forward working set)"))
    return plan


def _pareto(lengths: dict) -> list[tuple]:
    """(label, tokens, requests, cont) of the tasks of ``lengths`` ({label: (longest, requests[, cont])}) that no
    other task dominates (a task with no more tokens, requests and continuation tokens than another never needs
    more memory), longest first; cont None where the tuple has none (the full-logit plan)."""
    items = sorted(((lb, int(v[0]), int(v[1]), (int(v[2]) if len(v) > 2 else None)) for lb, v in lengths.items()),
                   key=lambda t: (-t[1], -t[2], -(t[3] or 0)))
    keep = []
    for lb, n_tok, n_req, n_cont in items:
        if n_tok <= 0:
            continue
        if not any(k[1] >= n_tok and k[2] >= n_req and (k[3] or k[1]) >= (n_cont or n_tok) for k in keep):
            keep.append((lb, n_tok, n_req, n_cont))
    return keep


def check_lmeval_fits(lms: list, request_lengths, batch: int, explicit: bool,
                      available: int | None = None) -> tuple[int, str]:
    """Before lm-eval's tasks run: the largest batch (requests per forward) up to ``batch`` whose
    :func:`plan_lmeval` at every task's longest request fits the device of every loaded model, beside the
    weights of the other models on it (the room as :func:`check_run_fits`: the device's memory, on CPU plus the
    loaded weights, already out of ``MemAvailable``). ``request_lengths(lm)`` gives ``{task label: (longest
    request in tokens, requests, longest continuation in tokens)}``
    (:meth:`lctx.tasks.lmeval.LmEvalSuite.request_lengths`; label ``mmlu/<subject>`` or the task); a pair without
    the continuation is planned with full logits (lm-eval's own ``HFLM``). ``explicit``: ``batch`` is the user's
    ``--batch-size``, refused when it does not fit; else it is the default's upper bound and lowered.

    Returns (batch, one ``note:`` line that says the batch and the arithmetic behind it).

    Raises:
        LctxError: an explicit batch that does not fit (names the largest that does), or a single request that
            does not fit (names what to change).
    """
    by_dev: dict[str, list] = {}
    models = {id(lm): lm.lmeval_model()[0] for lm in lms}  # the capability mmlu/arc need (LmEvalCapable)
    for lm in lms:
        by_dev.setdefault(lm.settings()["device"], []).append(lm)
    best, why = int(batch), None
    for dev, group in by_dev.items():
        room, source = device_memory(dev, available)
        weights = {id(lm): _loaded_bytes(models[id(lm)]) for lm in group}
        if torch.device(dev).type == "cpu" and available is None:
            room += sum(weights.values())
        for lm in group:
            cfg = models[id(lm)].config
            dtype = lm.settings()["dtype"]
            others = sum(weights.values()) - weights[id(lm)]
            front = _pareto(request_lengths(lm))
            if not front:
                continue

            def need(b, cfg=cfg, lm=lm, front=front, others=others, dtype=dtype):
                plans = [(plan_lmeval(cfg, n_tok, b, n_req, dtype=dtype, name=lm.name, device=dev, cont=n_cont),
                          label) for label, n_tok, n_req, n_cont in front]
                plan, label = max(plans, key=lambda p: p[0].total)
                return plan.total + others, plan, label, min(b, next(t[2] for t in front if t[0] == label))

            V, eb = model_shape(cfg).vocab, lmeval_logit_bytes(cfg, dtype)
            top, n_top, _, c_top = front[0]
            if c_top is None:
                arith = (f"longest request {n_top:,} tokens ({top}) x vocab {V:,} x {eb} B x {LMEVAL_LOGIT_COPIES} "
                         f"copies = {gib(n_top * V * eb * LMEVAL_LOGIT_COPIES)} per request")
            else:
                arith = (f"longest request {n_top:,} tokens ({top}), logits at {c_top} continuation "
                         f"token{'s' if c_top != 1 else ''} x vocab {V:,} x {eb} B x {LMEVAL_LOGIT_COPIES} copies = "
                         f"{gib(c_top * V * eb * LMEVAL_LOGIT_COPIES)} per request")
            total, plan, label, _ = need(best)
            task = label.split("/")[0]
            lo, hi = 0, best  # the largest b in [0, best] whose plan fits (the need grows with b)
            if total <= room:
                lo = best
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if need(mid)[0] <= room:
                    lo = mid
                else:
                    hi = mid - 1
            if lo == 0:
                one, plan1, label1, _ = need(1)
                raise LctxError(f"{task}: one lm-eval request of {plan1.length:,} tokens ({label1}) on {lm.name} needs "
                                f"about {gib(one)} but the device has {gib(room)} ({source}); largest part: "
                                f"{plan1.largest().name} {gib(plan1.largest().bytes)}; use fewer few-shot examples "
                                "(--num-fewshot), --dtype bfloat16, a bigger device, or --no-memory-check")
            if explicit and lo < best:
                raise LctxError(f"--batch-size {best}: {task}'s lm-eval batch on {lm.name} needs about {gib(total)} "
                                f"({arith}) but the device has {gib(room)} ({source}); pass --batch-size {lo} or "
                                "less, or --no-memory-check")
            if lo < best or why is None:
                best = lo
                total, plan, label, rows = need(lo)
                blocks = next((n for n in plan.notes if n.startswith("forward in row blocks")), None)
                why = (label.split("/")[0], lm.name, arith + (f"; {blocks}" if blocks else ""), total, rows, label,
                       room, source)
    if why is None:
        return best, f"note: lm-eval batch {best} (no requests to plan)"
    task, name, arith, total, rows, label, room, source = why
    head = (f"lm-eval batch lowered from {batch} to {best}" if best < batch
            else f"lm-eval batch {best}" + ("" if explicit else " (the default)"))
    return best, (f"note: {task}: {head} for {name} ({arith}; its largest forward, {rows} rows of {label}, plans "
                  f"{gib(total)} of {gib(room)} available, {source})")


def _loaded_bytes(model) -> int:
    """Bytes of a loaded model's parameters (shared tensors once)."""
    seen = {}
    for t in model.parameters():
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return int(sum(seen.values()))
