"""The in-process model adapter: one torch causal LM + tokenizer as :class:`HFAdapter`, lctx's
:class:`~lctx.models.adapters.protocol.ModelAdapter` for lctx checkpoints, Hugging Face causal-LM folders, GGUF
files (dequantised by transformers, :mod:`.gguf`) and llama2.c exports once converted (``lctx convert``).

Tasks talk to it through the protocol only. It runs long inputs as a chunked prefill into a KV cache (chunk size
``chunk_size`` tokens) and asks the model for logits only at the positions a task scores (``logits_to_keep``), so
a long prompt never materialises T x vocab logits; the protocol's opaque prompt handle is a :class:`Prefix`
holding that cache, so a prompt is prefilled once for its greedy continuation and every teacher-forced score.
It works for lctx checkpoints and for any Hugging Face causal LM whose forward takes a KV cache and
``logits_to_keep`` (transformers >= 4.45 models do). Torch-level methods beside the protocol
(:meth:`HFAdapter.prefill` with logits, :meth:`HFAdapter.continuation_logits`, ``model`` and ``tokenizer``) serve
lctx's own commands and tests; lm-eval's mmlu/arc reach the model through :meth:`HFAdapter.lmeval_model`.
"""

from __future__ import annotations

import copy
import inspect
import json
import platform
import resource
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

import torch
import transformers
from transformers.cache_utils import DynamicCache
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import logging as hf_logging

from lctx.attn_impl import ATTN_IMPL_REGISTRY, DEFAULT_ATTN_IMPL, get_attn_impl
from lctx.defaults import CHUNK_SIZE, DEVICE, DTYPE
from lctx.errors import CapturedLog, LctxError, check_finite_logits
from lctx.models.adapters.devices import DTYPES, resolve_device, resolve_dtype  # noqa: F401  (lctx.models.adapters.hf.resolve_* kept)

from lctx.models.adapters.gguf import cached_gguf_dir
from lctx.models.adapters.memory import DECODE_BUDGET, plan_memory
from lctx.models.adapters.protocol import EVERY_METHOD, ContinuationScores
from lctx.models.adapters.hf_attention import LCTX_SDPA, register as register_lctx_sdpa
from lctx.models.adapters.text import Prompt, TokenizerSide, _first_line, tokenizer_fingerprint  # noqa: F401  (kept as lctx.models.adapters.hf.*)
from lctx.model_files import find_gguf, raise_if_remote_code as _raise_if_remote_code

@dataclass
class Prefix:
    """A prompt already run through the model: its KV cache and the logits after its last token. The
    :class:`HFAdapter`'s opaque prompt handle (:meth:`HFAdapter.prefix`): tasks pass it back to ``greedy`` and
    ``score_continuation`` and never read its fields.

    cache: the model's KV cache holding ``n_tokens`` tokens; last_logits: [vocab] float32, the
    next-token logits after the prompt.
    """

    cache: object
    last_logits: torch.Tensor
    n_tokens: int
    states: dict | None = None  # snapshot of fixed-state layers' states after the prompt (lctx models)
    # a row of a left-padded batch (:meth:`BatchPrefix.row`): [1, n_tokens] long, 1 real / 0 padding; the cache
    # then holds the padding too (``n_tokens`` cache entries) and every later forward passes this mask
    mask: torch.Tensor | None = None


@dataclass
class BatchPrefix:
    """Several prompts run through the model together, left-padded to the longest (:meth:`HFAdapter.prefill_batch`;
    the opaque batch handle of :meth:`HFAdapter.prefix_batch`).

    cache: the model's KV cache with B rows of ``width`` entries each (padding included); mask: [B, width]
    long, 1 for a real token and 0 for padding (each row's padding comes first); last_logits: [B, vocab]
    float32, the next-token logits after each prompt; n_tokens: each row's prompt length (tokens);
    states: snapshot of fixed-state layers' states after the prompts (lctx models), batch dimension first.
    """

    cache: object
    mask: torch.Tensor
    last_logits: torch.Tensor
    n_tokens: list[int]
    states: dict | None = None

    @property
    def width(self) -> int:
        """Cache entries per row after the prefill (the longest prompt), tokens."""
        return int(self.mask.shape[1])

    def row(self, i: int) -> Prefix:
        """Row ``i`` as a :class:`Prefix` of its own (a copy of its KV entries and post-prompt states, its
        left padding kept and masked), so a task's per-sample code (``score_continuation``,
        ``continuation_logits``, ``greedy``) runs on it as on a prompt prefilled alone. Decoded tokens of
        :meth:`HFAdapter.greedy_batch` are not part of it (it holds the prompt only)."""
        W = self.width
        cache = _select_row(self.cache, i, W)
        states = ({k: {n: t[i:i + 1].clone() for n, t in st.items()} for k, st in self.states.items()}
                  if self.states else None)
        if states is not None:
            cache.lctx_states = {k: {n: t.clone() for n, t in st.items()} for k, st in states.items()}
        return Prefix(cache=cache, last_logits=self.last_logits[i], n_tokens=W, states=states,
                      mask=self.mask[i:i + 1])


def _select_row(cache, i: int, width: int):
    """A new cache holding row ``i`` of ``cache``'s first ``width`` entries (lctx's
    :class:`~lctx.models.cache.PreallocatedKVCache` or a transformers ``Cache`` with ``layers``); the
    original is left as it is."""
    if hasattr(cache, "lengths") and hasattr(cache, "keys") and isinstance(cache.keys, list):  # PreallocatedKVCache
        new = type(cache)(cache.capacity)
        new.keys = [None if k is None else k[i:i + 1].clone() for k in cache.keys]
        new.values = [None if v is None else v[i:i + 1].clone() for v in cache.values]
        new.lengths = [min(n, width) for n in cache.lengths]
    else:  # transformers' DynamicCache: shallow copies whose batch_select_indices makes new tensors
        new = copy.copy(cache)
        new.layers = [copy.copy(layer) for layer in cache.layers]
        new.batch_select_indices(torch.tensor([i], device=getattr(cache.layers[0], "device", None) or "cpu"))
        extra = new.get_seq_length() - width
        if extra > 0:
            new.crop(-extra)
    if hasattr(new, "lctx_states"):
        new.lctx_states = {}
    if getattr(cache, "lctx_length", None) is not None:
        new.lctx_length = width
    return new


@dataclass
class HFAdapter(TokenizerSide):
    """A torch causal LM and its ``transformers`` tokenizer in this process: lctx's
    :class:`~lctx.models.adapters.protocol.ModelAdapter` for lctx checkpoints, Hugging Face folders, GGUF files and
    converted llama2.c exports (:func:`load_lm` makes one), with the optional lm-eval capability
    (:meth:`lmeval_model`). The prompt handle of :meth:`prefix` is a :class:`Prefix` (its KV cache), the batch
    handle a :class:`BatchPrefix`.

    Attributes:
        model: a ``PreTrainedModel`` in eval mode on ``device``.
        tokenizer: a ``PreTrainedTokenizerBase``.
        name: display name (the checkpoint directory's name unless given).
        variant: positional variant (lctx checkpoints) or the HF ``model_type``.
        train_length: training context length in tokens, if the config records it.
        max_length: the longest input (tokens) the checkpoint declares it can address, or ``None``.
        chunk_size: prefill chunk length in tokens.
        prefix_reuse: :meth:`prefix` keeps the last prompt's KV cache and prefills only what the next prompt does
            not share with it (``-M prefix_reuse=true``; :meth:`reusable`).
        add_bos: whether prompts start with the BOS token (:meth:`with_bos`). Default (``None``): always for
            lctx checkpoints (their training puts BOS first); for other models, when their tokenizer adds
            it itself (``encode(..., add_special_tokens=True)``), as lm-eval's ``hf`` backend and
            ``generate`` pipelines do. SmolLM2's tokenizer does not (its BOS is the chat-turn opener).
        chat_template: wrap task prompts in the tokenizer's chat template (:meth:`prompt`); ``--chat-template``.
        system_prompt: system message of the chat template (``None``: the template's default, if any).
    """

    model: object
    tokenizer: object
    name: str
    path: str
    variant: str
    train_length: int | None
    max_length: int | None
    device: torch.device
    dtype: torch.dtype
    chunk_size: int = CHUNK_SIZE
    prefix_reuse: bool = False  # :meth:`prefix` reuses the previous prompt's KV cache up to their common prefix
    decode_budget: int = DECODE_BUDGET  # tokens reserved past the prompt in a preallocated KV cache
    attn_impl: str = ""  # lctx models: reference | sdpa | fast (config.attn_impl); HF models: "hf:<impl>"
    add_bos: bool | None = None
    chat_template: bool = False
    system_prompt: str | None = None
    _cache_kw: str = field(default="cache", repr=False)
    _length_ropes: list = field(default_factory=list, repr=False)
    _inputs: dict | None = field(default=None, repr=False)  # model_inputs(), hashed once
    #: the positional method it runs with (:func:`load_lm`'s ``position``): ``{"base", "method",
    #: "options", "layer_type", "effective"}`` as run.json records it; None for an adapter made without load_lm
    position: dict | None = field(default=None, repr=False)
    #: where ``max_length`` comes from, for messages (config.json's or the GGUF metadata's key)
    max_length_source: ClassVar[str] = "max_position_embeddings"
    #: the positional methods ``load_lm(position=...)`` applies (a capability,
    #: :func:`lctx.models.adapters.protocol.capabilities`): every method of ``models/position/``, whose own check
    #: refuses a checkpoint it does not apply to
    positional_methods: ClassVar[tuple] = EVERY_METHOD

    def __post_init__(self):
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        if self.add_bos is None:
            self.add_bos = _tokenizer_adds_bos(self.tokenizer, getattr(getattr(self.model, "config", None),
                                                                       "model_type", None))
        self._length_ropes = _length_dependent_ropes(self.model)
        if self.chat_template:
            self.check_chat_template()

    # -- identity and records (protocol) -------------------------------------------------------------
    def model_inputs(self) -> dict:
        """{"path": the checkpoint's resolved path, "fingerprint": 16 hex digits, "files": {name: sha256}} of the
        checkpoint's weights, config, tokenizer and other model files
        (:func:`lctx.models.fingerprint.checkpoint_digests`, :func:`~lctx.models.fingerprint.digest_json`), hashed
        once per adapter (and per process: the digest cache of :mod:`lctx.models.fingerprint` skips unchanged
        files). A GGUF model's path is the ``.gguf`` file itself. A model loaded with a positional method
        (:attr:`position`) has ``"position"`` too, and its fingerprint hashes the method, its options and layer
        types with the checkpoint's (the shipped model's fingerprint is the checkpoint's alone, as before).

        Raises:
            LctxError: a model file that cannot be read.
        """
        if self._inputs is None:
            from lctx.models.fingerprint import checkpoint_digests, digest_json  # lazy: loads lctx.models (its kernels load triton)

            files = checkpoint_digests(self.path)
            fp = digest_json(files)
            if self.position and self.position.get("method") not in (None, "shipped") \
                    and self.position.get("via") != "--attn-override":  # the method is an input too (the flag's: its variant)
                fp = digest_json({"checkpoint": fp, "position": {k: self.position.get(k) for k in
                                                                 ("method", "options", "layer_type")}})
            self._inputs = {"path": str(Path(self.path).resolve()), "fingerprint": fp, "files": files}
            if self.position is not None:
                self._inputs["position"] = self.position
        return self._inputs

    def settings(self) -> dict:
        """``dtype`` ("float32"), ``attn_impl`` (lctx models: reference | sdpa | fast; Hugging Face models:
        ``hf:<transformers attention>``), ``chunk_size`` (prefill chunk, tokens), ``device_type`` ("cpu", "cuda"),
        ``versions`` (torch, transformers) and ``device`` ("cuda:0"): the protocol's settings, read now (a test
        may change ``chunk_size`` between runs)."""
        out = {"dtype": str(self.dtype).replace("torch.", ""), "attn_impl": self.attn_impl,
               "chunk_size": int(self.chunk_size), "device_type": torch.device(self.device).type,
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
               "device": str(self.device)}
        if self.prefix_reuse:  # only when on: runs without it keep their resume keys
            out["prefix_reuse"] = True
        return out

    # -- memory (protocol) -------------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        """On a GPU, reset CUDA's peak-allocation counter (``torch.cuda.reset_peak_memory_stats``); on CPU nothing
        (the peak resident set size is a process-wide high-water mark)."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory_bytes(self) -> int:
        """Peak memory in bytes: CUDA max allocated since :meth:`reset_peak_memory` on a GPU; on CPU the process's
        peak resident set size (``ru_maxrss``, a process-wide high-water mark; KiB on Linux, bytes on macOS)."""
        if torch.device(self.device).type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss if platform.system() == "Darwin" else rss * 1024)

    def free_memory(self) -> None:
        """On a GPU, give cached blocks back to the device (``torch.cuda.empty_cache``), e.g. after a batch ran
        out of memory and before its samples run alone; on CPU nothing."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.empty_cache()

    def memory_plan(self, length: int, batch: int = 1, kept_logits: int = 1):
        """The memory model of ``lctx plan`` (:func:`lctx.models.adapters.memory.plan_memory`) for one prefill of
        ``length`` tokens in ``batch`` rows on this adapter's config, dtype, chunk size, KV cache (the one
        :meth:`new_cache` really makes) and device, keeping ``kept_logits`` positions' logits. Batches of lctx
        models plan the path padded rows take (``fast`` runs them on the masked SDPA path,
        :meth:`prefill_batch`). Returns a :class:`~lctx.models.adapters.memory.MemoryPlan` (bytes; its
        ``device`` is this adapter's).

        Raises:
            LctxError: non-positive sizes, or a config the memory model cannot read.
        """
        cfg = self.model.config
        if self.is_lctx:
            impl = getattr(cfg, "attn_impl", None)
        else:  # "hf:<transformers attention>" -> the registry entry that runs it (hf:lctx_sdpa -> fast)
            hf = str(self.attn_impl).removeprefix("hf:")
            impl = next((n for n in ATTN_IMPL_REGISTRY if ATTN_IMPL_REGISTRY.get(n).hf == hf), "sdpa")
        if batch > 1 and impl is not None:
            impl = get_attn_impl(impl).fallback  # padded rows: the masked SDPA path (the lean paths take unpadded rows)
        probe = self.new_cache(1)
        kind = ("preallocated" if type(probe).__name__ == "PreallocatedKVCache"
                else "sliding" if _sliding_layers(probe) else "dynamic")
        return plan_memory(cfg, length, chunk_size=self.chunk_size, dtype=self.dtype, impl=impl, batch=batch,
                           kept_logits=kept_logits, name=self.name, kv_cache=kind,
                           decode_budget=int(self.decode_budget or 0), device=self.device)

    # -- lm-eval (optional capability) ---------------------------------------------------------------
    def lmeval_model(self) -> tuple[object, object]:
        """(the ``PreTrainedModel``, its tokenizer) for lm-eval's ``hf`` backend, which calls the model directly:
        length-dependent RoPE modules get their own per-forward behaviour back first (:meth:`release_rope`).
        The :class:`~lctx.models.adapters.protocol.LmEvalCapable` capability mmlu/arc need."""
        self.release_rope()
        return self.model, self.tokenizer

    # -- model calls -------------------------------------------------------------------------------
    def new_cache(self, capacity: int):
        """An empty KV cache for ``capacity`` tokens: lctx models get a
        :class:`lctx.models.cache.PreallocatedKVCache` (chunks written in place, no concatenation),
        other models transformers' ``DynamicCache`` built from the model's config, as ``generate`` builds it:
        a sliding-window layer (Gemma 3's 512-token local layers) keeps only its last window - 1 keys
        (``DynamicSlidingWindowLayer``), so its attention and KV memory are O(window), not O(T)."""
        config = getattr(self.model, "config", None)
        if getattr(config, "model_type", "") == "lctx":
            from lctx.models.cache import PreallocatedKVCache  # lazy: loads lctx.models (its kernels load triton)

            return PreallocatedKVCache(capacity)
        if config is None:
            return DynamicCache()
        cache = DynamicCache(config=config)
        for layer in _sliding_layers(cache):  # keep decoded tokens' evicted keys until rewind crops them
            layer.activate_past_recording()
        return cache

    @property
    def is_lctx(self) -> bool:
        """Whether the model is an lctx checkpoint (positions come from the attention mask)."""
        return getattr(getattr(self.model, "config", None), "model_type", "") == "lctx"

    @property
    def can_batch(self) -> bool:
        """Whether :meth:`prefill_batch` gives each row the numbers it gets alone: not for length-dependent
        RoPE (dynamic NTK, LongRoPE), whose frequencies :meth:`fix_rope_length` sets per prompt length."""
        return not self._length_ropes

    def _forward(self, ids: torch.Tensor, cache, keep, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, object]:
        """One forward of ``ids`` ([T], one row, or [B, T]) through ``cache``; ``mask``: [B, past + T] long
        (1 real, 0 padding) for padded rows, or ``None``. Returns (logits [T', vocab] for one row or
        [B, T', vocab], float32; the cache). lctx models take positions from the mask; other models get
        ``position_ids`` counted from each row's first real token, as transformers' ``generate`` does."""
        one = ids.dim() == 1
        x = ids[None] if one else ids
        kw = {}
        if mask is not None:
            kw["attention_mask"] = mask
            if not self.is_lctx:
                kw["position_ids"] = (mask.long().cumsum(-1) - 1).clamp_min(0)[:, -x.shape[1]:]
        out = self.model(input_ids=x, use_cache=True, logits_to_keep=keep, **kw, **{self._cache_kw: cache})
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        logits = out.logits[0].float() if one else out.logits.float()
        check_finite_logits(logits, f"{self.name}, {x.shape[-1]} tokens")  # every task's one shared check
        return logits, (new_cache if new_cache is not None else cache)

    def _fwd(self, ids: torch.Tensor, cache, keep, mask: torch.Tensor | None):
        """:meth:`_forward`, with the mask passed only when there is one (wrappers of the 3-argument
        ``_forward(ids, cache, keep)``, e.g. tests counting forwards, keep working)."""
        return self._forward(ids, cache, keep) if mask is None else self._forward(ids, cache, keep, mask)

    @torch.inference_mode()
    def prefill(self, ids: list[int], want: list[int] | None = None,
                on_logits=None) -> tuple[Prefix, dict[int, torch.Tensor]]:
        """Run ``ids`` (length T) through the model in chunks of ``chunk_size`` tokens into a fresh KV cache.

        ``want``: positions p (0 <= p < T) whose next-token logits are needed besides the last one.
        Returns the :class:`Prefix` (cache + logits after position T-1) and {p: logits [vocab] float32}.
        Peak activation memory is O(chunk_size * (T + vocab)) per layer; logits are computed only at
        the wanted positions. lctx models prefill into a KV cache preallocated for T +
        ``decode_budget`` tokens. ``on_logits(positions: list[int], logits [k, vocab] float32)``, when given,
        receives each chunk's wanted logits instead of the returned dict (which then holds position T-1
        only), so a caller that reduces them (:meth:`token_nll`) never holds T x vocab floats at once
        (16K tokens x SmolLM2's 49,152-token vocabulary is 3.2 GB in float32).

        Raises:
            ValueError: empty ``ids``.
        """
        if not ids:
            raise ValueError("prefill needs at least one token")
        x = torch.tensor(ids, dtype=torch.long, device=self.device)
        T = len(ids)
        self.fix_rope_length(T)
        want_set = sorted(set(want or []) | {T - 1})
        wanted = torch.tensor(want_set, dtype=torch.long, device=self.device)
        cache = self.new_cache(T + self.decode_budget)
        got: dict[int, torch.Tensor] = {}
        for s in range(0, T, self.chunk_size):
            e = min(s + self.chunk_size, T)
            idx = wanted[(wanted >= s) & (wanted < e)]
            keep = idx - s if len(idx) else torch.tensor([e - s - 1], device=self.device)
            logits, cache = self._forward(x[s:e], cache, keep)
            trim_sliding(cache)
            pos = (idx if len(idx) else keep + s).tolist()
            if on_logits is not None and len(idx):
                on_logits(pos, logits)
                if pos[-1] == T - 1:
                    got[T - 1] = logits[-1]
                continue
            for j, p in enumerate(pos):
                got[p] = logits[j]
        states = getattr(cache, "lctx_states", None)
        snapshot = {k: {n: t.clone() for n, t in st.items()} for k, st in states.items()} if states else None
        return Prefix(cache, got[T - 1], T, snapshot), got

    def prefix(self, ids: list[int]) -> Prefix:
        """The protocol's prompt handle: :meth:`prefill` of ``ids`` (its KV cache and last logits, a
        :class:`Prefix`). With :attr:`prefix_reuse`, the previous handle's cache is cropped to the longest common
        prefix of the two prompts and only the rest is prefilled (:meth:`_extend`), when :meth:`reusable` allows;
        the previous handle is then spent (a task finishes with a sample's handle before the next sample's).

        Raises:
            ValueError: empty ``ids``.
        """
        last = getattr(self, "_last_prefix", None)
        self._last_prefix = None
        if self.prefix_reuse and last is not None:
            got = self._extend(last, list(ids))
            if got is not None:
                self._last_prefix = (list(ids), got)
                return got
        p = self.prefill(ids)[0]
        if self.prefix_reuse and self.reusable(p.cache):
            self._last_prefix = (list(ids), p)
        return p

    #: the shortest shared prefix (tokens) worth reusing a cache for; shorter ones prefill afresh
    REUSE_MIN_TOKENS = 64

    def reusable(self, cache) -> bool:
        """Whether a prompt's cache can be cropped back and grown again for the next prompt: not for a model whose
        RoPE depends on the prompt's length (dynamic NTK, LongRoPE: :meth:`fix_rope_length` sets it per prompt),
        nor one with sliding-window layers (Gemma 3's local layers keep only their window: a cropped sliding cache
        cannot grow back), nor fixed-state layers (lctx's interdomain / s4d states are not cropped)."""
        return (not self._length_ropes and not _sliding_layers(cache)
                and not getattr(cache, "lctx_states", None))

    @torch.inference_mode()
    def _extend(self, last: tuple, ids: list[int]) -> Prefix | None:
        """The handle of ``ids`` from the previous prompt's (``last`` = (its ids, its :class:`Prefix`)): its cache
        rewound to its prompt, cropped to the common prefix, and the rest of ``ids`` prefilled in chunks of
        :attr:`chunk_size` from there (the same forward as a chunk boundary at that token). None when they share
        fewer than :data:`REUSE_MIN_TOKENS` tokens (a fresh prefill is as cheap).

        Numbers: the chunk boundaries fall elsewhere than in a fresh prefill, so the logits differ by float
        summation order only (tests/test_hf.py compares records with and without reuse)."""
        old_ids, old = last
        n = min(len(old_ids), len(ids) - 1)  # at least one new token: its logits are the handle's last logits
        lcp = next((i for i in range(n) if old_ids[i] != ids[i]), n)
        if lcp < self.REUSE_MIN_TOKENS:
            return None
        self.rewind(old)
        extra = old.cache.get_seq_length() - lcp
        if extra > 0:
            old.cache.crop(-extra)  # transformers >= 5 crops by a negative count (as :meth:`rewind`)
        if hasattr(old.cache, "lctx_length"):
            old.cache.lctx_length = lcp
        cache, T = old.cache, len(ids)
        x = torch.tensor(ids, dtype=torch.long, device=self.device)
        logits = None
        for s in range(lcp, T, self.chunk_size):
            e = min(s + self.chunk_size, T)
            logits, cache = self._forward(x[s:e], cache, torch.tensor([e - s - 1], device=self.device))
        return Prefix(cache, logits[-1], T, None)

    def prefix_batch(self, rows: list[list[int]]) -> BatchPrefix:
        """The protocol's batch handle: :meth:`prefill_batch` of ``rows``.

        Raises:
            ValueError: as :meth:`prefill_batch`.
        """
        return self.prefill_batch(rows)

    def batch_row(self, batch: BatchPrefix, i: int) -> Prefix:
        """Row ``i`` of a batch handle as a prompt handle of its own (:meth:`BatchPrefix.row`)."""
        return batch.row(i)

    def fix_rope_length(self, n_tokens: int) -> None:
        """Set every length-dependent RoPE (dynamic NTK, LongRoPE) to the frequencies transformers computes
        for one forward of ``n_tokens`` tokens from a fresh load, and hold them for the whole sample (prefill
        chunks, decode steps, teacher-forced continuations). Without this, transformers' dynamic NTK keeps the
        frequencies of the longest forward it has seen and re-decides per chunk, so a cell's score depended
        on the cells run before it and on ``--chunk-size``. A module with a table per layer type
        (Gemma 3's ``full_attention`` / ``sliding_attention``) has each length-dependent table fixed the same way
        (``--position dynamic`` on its global layers). A no-op for other models."""
        for mod, rt, scaling, lt in self._length_ropes:
            prefix, kw = (f"{lt}_", {"layer_type": lt}) if lt is not None else ("", {})
            _set_rope_type(mod, lt, "lctx_fixed")  # not "dynamic"/"longrope": transformers' per-call update is skipped
            dev = getattr(mod, f"{prefix}inv_freq").device
            original = getattr(mod, f"{prefix}original_inv_freq")
            params = mod.config.rope_parameters[lt] if lt is not None else mod.config.rope_parameters
            new_scaling = scaling
            if rt == "longrope":
                orig = params["original_max_position_embeddings"]
                inv = ROPE_INIT_FUNCTIONS[rt](mod.config, dev, seq_len=orig + 1, **kw)[0] if n_tokens > orig else original
            elif n_tokens > mod.original_max_seq_len:
                inv, new_scaling = ROPE_INIT_FUNCTIONS[rt](mod.config, dev, seq_len=n_tokens, **kw)
            else:
                inv = original
            setattr(mod, f"{prefix}attention_scaling" if lt is not None else "attention_scaling", new_scaling)
            mod.register_buffer(f"{prefix}inv_freq", inv.to(dev).clone(), persistent=False)  # never the original
            setattr(mod, f"{prefix}max_seq_len_cached", max(n_tokens, mod.original_max_seq_len))

    def release_rope(self) -> None:
        """Give length-dependent RoPE modules back their own per-forward behaviour (fresh-load state), for
        code that calls the model directly (lm-eval's ``hf`` backend)."""
        for mod, rt, scaling, lt in self._length_ropes:
            prefix = f"{lt}_" if lt is not None else ""
            _set_rope_type(mod, lt, rt)
            setattr(mod, f"{prefix}attention_scaling" if lt is not None else "attention_scaling", scaling)
            original = getattr(mod, f"{prefix}original_inv_freq")
            # a copy: transformers' LongRoPE update writes the buffer in place (copy_), which would overwrite the
            # original table the buffer aliased and every later short sample with it
            mod.register_buffer(f"{prefix}inv_freq", original.to(getattr(mod, f"{prefix}inv_freq").device).clone(),
                                persistent=False)
            setattr(mod, f"{prefix}max_seq_len_cached", mod.original_max_seq_len)

    def length_rope_types(self) -> dict:
        """{table key of :func:`lctx.models.position.base.rotary_tables`: rope_type} of the length-dependent RoPE
        tables :meth:`fix_rope_length` holds (their modules say ``lctx_fixed`` while a sample runs)."""
        from lctx.models.position.base import rotary_tables  # lazy: loads lctx.models (its kernels load triton)

        held = {(id(mod), lt): rt for mod, rt, _, lt in self._length_ropes}
        return {key: held[(id(mod), lt)] for key, mod, lt in rotary_tables(self.model) if (id(mod), lt) in held}

    @torch.inference_mode()
    def greedy(self, prefix: Prefix, max_new_tokens: int, stop_ids: set[int] | None = None) -> list[int]:
        """Greedy continuation of a prefilled prompt, one decode step per token through the KV cache.

        Returns up to ``max_new_tokens`` ids, stopping after a token in ``stop_ids`` (default: EOS).
        The prefix's cache is extended; call :meth:`rewind` to reuse it.
        """
        stop = stop_ids if stop_ids is not None else {self.tokenizer.eos_token_id}
        out: list[int] = []
        logits, cache, mask = prefix.last_logits, prefix.cache, prefix.mask
        for _ in range(max_new_tokens):
            tok = int(torch.argmax(logits))
            out.append(tok)
            if tok in stop or len(out) == max_new_tokens:
                break
            if mask is not None:
                mask = torch.cat([mask, mask.new_ones(1, 1)], 1)
            step, cache = self._fwd(torch.tensor([tok], device=self.device), cache, 1, mask)
            logits = step[-1]
        prefix.cache = cache
        return out

    @torch.inference_mode()
    def prefill_batch(self, ids: list[list[int]]) -> BatchPrefix:
        """Run B prompts through the model together: left-padded to the longest (width W tokens) with the
        attention mask marking the padding, in chunks of ``chunk_size`` tokens into one fresh KV cache.
        Each row's positions count from its first real token, so a row gets the numbers it gets alone up
        to floating-point rounding (lctx models: ``tests/test_model.py::test_padded_batch_equals_unpadded``;
        Hugging Face models: ``position_ids`` from the mask, as ``generate`` does). lctx models run the
        padded rows through their masked SDPA/reference path (the fast kernels take unpadded rows only),
        unless every prompt has the same length.

        Returns a :class:`BatchPrefix` (cache, mask [B, W], last logits [B, vocab], lengths). Memory: B
        times a single prefill's KV cache and activations.

        Raises:
            ValueError: no prompts, an empty prompt, or a model whose RoPE depends on the length
                (:attr:`can_batch` is False).
        """
        if not ids or any(len(r) == 0 for r in ids):
            raise ValueError("prefill_batch needs at least one non-empty prompt")
        if not self.can_batch:
            raise ValueError(f"model {self.name!r} has a length-dependent RoPE; prefill its prompts one at a time")
        B, W = len(ids), max(len(r) for r in ids)
        pad_id = next((t for t in (getattr(self.tokenizer, "pad_token_id", None),
                                   getattr(self.tokenizer, "eos_token_id", None)) if isinstance(t, int)), 0)
        x = torch.full((B, W), pad_id, dtype=torch.long)
        mask = torch.zeros(B, W, dtype=torch.long)
        for i, r in enumerate(ids):
            x[i, W - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, W - len(r):] = 1
        x, mask = x.to(self.device), mask.to(self.device)
        padded = bool((mask == 0).any())
        cache = self.new_cache(W + self.decode_budget)
        logits = None
        for s in range(0, W, self.chunk_size):
            e = min(s + self.chunk_size, W)
            logits, cache = self._fwd(x[:, s:e], cache, 1, mask[:, :e] if padded else None)
            trim_sliding(cache)
        states = getattr(cache, "lctx_states", None)
        snapshot = {k: {n: t.clone() for n, t in st.items()} for k, st in states.items()} if states else None
        return BatchPrefix(cache=cache, mask=mask, last_logits=logits[:, -1], n_tokens=[len(r) for r in ids],
                           states=snapshot)

    @torch.inference_mode()
    def greedy_batch(self, prefix: BatchPrefix, max_new_tokens: int | list[int],
                     stop_ids: set[int] | None = None) -> list[list[int]]:
        """Greedy continuations of a batch, one decode step per token for all rows together.

        Each row stops as :meth:`greedy` would alone: after a token in ``stop_ids`` (default: EOS) or
        ``max_new_tokens`` tokens (an int, or one per row); finished rows ride along until every row is done
        (their extra tokens are discarded). Returns one id list per row. The batch's cache is extended
        (:meth:`BatchPrefix.row` copies the prompt part only).
        """
        B = len(prefix.n_tokens)
        budget = [max_new_tokens] * B if isinstance(max_new_tokens, int) else [int(n) for n in max_new_tokens]
        if len(budget) != B:
            raise ValueError(f"max_new_tokens has {len(budget)} entries for a batch of {B}")
        stop = stop_ids if stop_ids is not None else {self.tokenizer.eos_token_id}
        out: list[list[int]] = [[] for _ in range(B)]
        done = [n <= 0 for n in budget]
        logits, cache, mask = prefix.last_logits, prefix.cache, prefix.mask
        padded = bool((mask == 0).any())
        while True:
            toks = logits.argmax(-1)  # [B]
            for i, t in enumerate(toks.tolist()):
                if not done[i]:
                    out[i].append(t)
                    done[i] = t in stop or len(out[i]) == budget[i]
            if all(done):
                break
            mask = torch.cat([mask, mask.new_ones(B, 1)], 1)
            step, cache = self._fwd(toks[:, None], cache, 1, mask if padded else None)
            logits = step[:, -1]
        prefix.cache = cache
        return out

    def rewind(self, prefix: Prefix) -> None:
        """Drop decoded tokens from the prefix's cache so it holds the prompt only again (KV entries are
        cropped; fixed-state layers get their post-prompt state back)."""
        extra = prefix.cache.get_seq_length() - prefix.n_tokens
        if extra > 0:
            prefix.cache.crop(-extra)  # transformers >= 5: a negative count removes that many tokens
        if hasattr(prefix.cache, "lctx_length"):
            prefix.cache.lctx_length = prefix.n_tokens
        if prefix.states is not None:
            prefix.cache.lctx_states = {k: {n: t.clone() for n, t in st.items()} for k, st in prefix.states.items()}

    @torch.inference_mode()
    def continuation_logits(self, prefix: Prefix, cont: list[int]) -> torch.Tensor:
        """Next-token logits [n, vocab] (float32) at each token of ``cont`` teacher-forced after a prefilled
        prompt: row j predicts ``cont[j]``. One forward of ``cont[:-1]`` through the prompt's KV cache, which
        is rewound to the prompt before and after."""
        self.rewind(prefix)
        logits = [prefix.last_logits]
        if len(cont) > 1:
            mask = (None if prefix.mask is None
                    else torch.cat([prefix.mask, prefix.mask.new_ones(1, len(cont) - 1)], 1))
            step, prefix.cache = self._fwd(torch.tensor(cont[:-1], device=self.device), prefix.cache, 0, mask)
            logits.extend(step)
        self.rewind(prefix)
        return torch.stack(logits)

    @torch.inference_mode()
    def score_continuation(self, prefix: Prefix, cont: list[int]) -> ContinuationScores:
        """Teacher-forced scores of ``cont`` after a prefilled prompt (take ``cont`` from
        :meth:`continuation_ids`, the tokens it has in context), from :meth:`continuation_logits` (float32).

        Returns a :class:`~lctx.models.adapters.protocol.ContinuationScores` of Python lists: ``logprobs`` (the
        float64 log-softmax of each position's logits at its token), ``top1`` (the token is the float32 logits'
        argmax, ties to the lowest id), ``ranks`` (1 + the vocabulary entries with a strictly higher logit). The
        cache is rewound to the prompt afterwards.
        """
        lg = self.continuation_logits(prefix, cont)
        target = torch.tensor(cont, device=lg.device)
        lgd = lg.double()
        logprob = torch.log_softmax(lgd, -1).gather(-1, target[:, None])[:, 0]
        ranks = (lgd > lgd.gather(-1, target[:, None])).sum(-1) + 1
        return ContinuationScores(logprob.cpu().tolist(), (lg.argmax(-1) == target).cpu().tolist(),
                                  ranks.cpu().tolist())

    @torch.inference_mode()
    def token_nll(self, ids: list[int], targets: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """NLL (nats, float64) of ``ids[p]`` given ``ids[:p]`` for each p in ``targets`` (1 <= p < T),
        and whether it was the argmax. One chunked prefill over ``ids[:max(targets)]``; memory: one chunk's
        logits and a 512 x vocab float64 block at a time (:meth:`prefill` ``on_logits``), not T x vocab.

        Raises:
            ValueError: a target outside [1, T).
        """
        if not targets:
            return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.bool)
        if min(targets) < 1 or max(targets) >= len(ids):
            raise ValueError(f"targets must lie in [1, {len(ids)}), got {min(targets)}..{max(targets)}")
        scored: dict[int, tuple[float, bool]] = {}  # position p - 1 -> (nll of ids[p], top-1)

        def reduce(pos: list[int], logits: torch.Tensor) -> None:
            # per chunk, in blocks of 512 rows: float64 log-softmax of [512, vocab], never [T, vocab]
            for b in range(0, len(pos), 512):
                lg = logits[b:b + 512].double()
                tgt = torch.tensor([ids[p + 1] for p in pos[b:b + 512]], device=lg.device)
                nll = -torch.log_softmax(lg, -1).gather(-1, tgt[:, None])[:, 0]
                for p, v, t in zip(pos[b:b + 512], nll.tolist(), (lg.argmax(-1) == tgt).tolist()):
                    scored[p] = (v, t)

        self.prefill(ids[: max(targets)], want=[p - 1 for p in targets], on_logits=reduce)
        return (torch.tensor([scored[p - 1][0] for p in targets], dtype=torch.float64),
                torch.tensor([scored[p - 1][1] for p in targets], dtype=torch.bool))


def _sliding_layers(cache) -> list:
    """The sliding-window layers (``DynamicSlidingWindowLayer``) of a transformers cache; [] for other caches."""
    return [layer for layer in getattr(cache, "layers", ()) or () if hasattr(layer, "activate_past_recording")]


def trim_sliding(cache) -> None:
    """After a prefill chunk, cut each sliding-window layer of ``cache`` back to the last window - 1 keys it
    needs (transformers' ``crop(0)``). :meth:`HFAdapter.new_cache` turns on their past recording so a decode can
    be rewound (``crop(-n)``; without it transformers refuses to crop a layer past its window), which would
    otherwise keep every prompt key; decode steps are not trimmed (their keys are what a rewind removes)."""
    for layer in _sliding_layers(cache):
        if layer.get_seq_length() >= layer.sliding_window:
            layer.crop(0)


def load_lm(path: str, device: str = DEVICE, dtype: str = DTYPE, name: str | None = None,
            chunk_size: int = CHUNK_SIZE, trust_remote_code: bool = False, attn_override: str | None = None,
            attn_impl: str | None = None, cache_dir: str | None = None, log=None, chat_template: bool = False,
            system_prompt: str | None = None, progress: bool = True, position=None,
            prefix_reuse: bool = False) -> HFAdapter:
    """Load a checkpoint (lctx or Hugging Face causal-LM directory, or a GGUF file) as an :class:`HFAdapter`.

    A ``.gguf`` file, or a directory holding exactly one (and no ``config.json``), is dequantised to
    ``dtype`` by transformers' GGUF support into a Hugging Face directory cached under ``cache_dir`` (default
    the user cache directory) and keyed by the file's SHA-256 (:mod:`lctx.models.adapters.gguf`); the model's name is
    the file's stem and ``HFAdapter.path`` the file itself.

    Weights: ``*.safetensors`` when the directory has any (``use_safetensors=True``); otherwise a
    ``.bin`` through ``torch.load(weights_only=True)`` (transformers' loader, which refuses pickled code).
    Code shipped with a checkpoint (``auto_map``) runs only with ``trust_remote_code=True``.
    ``attn_override``: e.g. ``"ssmax:s=0.43"``, applied by :func:`lctx.models.adapters.overrides.apply_override`.
    ``attn_impl``: lctx checkpoints: ``"reference"``, ``"sdpa"`` or ``"fast"`` (the kernels of
    :mod:`lctx.kernels`) replaces the checkpoint's ``config.attn_impl``; ``None``: ``"fast"``, the lean default
    (:func:`_default_attn_impl`). Hugging Face checkpoints: ``"reference"`` runs transformers' ``eager``
    attention, ``"sdpa"`` its ``sdpa``, ``"fast"`` lctx's ``lctx_sdpa``
    (:mod:`lctx.models.adapters.hf_attention`: no masked rectangle in a chunked prefill); ``None``: ``lctx_sdpa``
    where transformers would run ``sdpa``.
    ``chat_template`` / ``system_prompt``: see :meth:`HFAdapter.prompt` (``--chat-template on``, ``--system-prompt``).
    ``progress`` False (``--no-progress``): no de-quantising bar when a GGUF file is converted.
    ``position``: a positional method (``"yarn:factor=4"``, a
    :class:`~lctx.models.position.PositionSpec` or a parsed method; None or ``"shipped"``: as shipped), see
    :func:`_apply_position`: a RoPE-table method edits the config's ``rope_parameters`` before the weights load,
    an attention method is applied after; the model's name and variant get its label (``+yarn_factor4``,
    ``llama+yarn:factor=4``), ``max_length`` the length it addresses, and :attr:`HFAdapter.position` what it
    computes with (read back from the built modules; a method that changed nothing is refused).

    ``path``: a folder, a ``.gguf`` file, or a Hugging Face hub id found in the local cache (named ``NAME`` of
    ``OWNER/NAME``; :func:`lctx.harness.args.resolve_model_path`: nothing is downloaded).

    Raises:
        LctxError: an SDPA ``attn_impl`` for a Hugging Face checkpoint that soft-caps its logits; ``chat_template`` for a tokenizer without
            one; the path does not exist (nor is a cached hub id), the folder has no tokenizer files, a directory has no ``config.json`` (nor one ``.gguf``), a GGUF
            file is truncated or of an architecture transformers cannot load from GGUF, a directory
            holds several ``.gguf`` files, a directory needs remote code without
            ``trust_remote_code``, fails to load (corrupt or incomplete weights, unsafe pickle, no
            tokenizer), or cannot take the override; a ``position`` that does not parse, does not apply to the
            checkpoint or was accepted but not applied; the message says what to do.
    """
    from lctx.model_files import resolve_model_path  # light
    from lctx.models.position import parse_position  # lazy: loads lctx.models (its kernels load triton)

    method = parse_position(position) if not hasattr(position, "apply_config") else position  # before any load

    path, hub_name = resolve_model_path(path)  # a hub id: its snapshot in the local Hugging Face cache
    name = name or hub_name
    from lctx.models import register_with_transformers  # lazy: loads lctx.models (its kernels load triton)

    register_with_transformers()  # model_type "lctx" for the Auto classes, also after a light import (cli)
    hf_logging.disable_progress_bar()  # one lctx progress bar, not one per checkpoint shard

    path, source, name = _checkpoint_dir(path, name, dtype=dtype, cache_dir=cache_dir, log=log, progress=progress)
    p = Path(path)
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    config = _load_config(p, path, trust_remote_code)
    load_config = _position_config(method, config)  # a RoPE-table method's config, before the weights load
    tok = _load_tokenizer(p, path, trust_remote_code)
    model = _load_weights(p, path, dt, dev, trust_remote_code, config=load_config)
    if attn_impl is not None:
        _set_attn_impl(model, config, attn_impl, name or p.resolve().name)
    else:
        _default_attn_impl(model, config)
    impl = (model.config.attn_impl if config.model_type == "lctx"
            else "hf:" + str(getattr(model.config, "_attn_implementation", None) or "eager"))
    variant = getattr(config, "variant", None) or config.model_type
    train_length = getattr(config, "train_length", None)
    max_length = getattr(config, "max_position_embeddings", None)
    lm = HFAdapter(model=model, tokenizer=tok, name=name or p.resolve().name, path=str(source), variant=variant,
            train_length=train_length, max_length=max_length, device=dev, dtype=dt, chunk_size=chunk_size,
            attn_impl=impl, chat_template=chat_template, system_prompt=system_prompt, prefix_reuse=bool(prefix_reuse))
    _apply_position(lm, method, config)
    if attn_override:
        from lctx.models.adapters.overrides import apply_override  # lazy: loads lctx.models (its kernels load triton)

        apply_override(lm, attn_override)
        _record_override(lm, attn_override)
    return lm


def _record_override(lm: HFAdapter, attn_override: str) -> None:
    """Update :attr:`HFAdapter.position` after ``--attn-override`` (the older name of the methods ``ssmax`` and
    ``alibi_lsh``): on a shipped model the record names that method and its options (``"via": "--attn-override"``:
    the fingerprint stays the checkpoint's, as runs made with the flag before ``--position`` keyed it, and the variant
    holds the label); on a model under another method it is noted as ``attn_override``; either way ``effective`` is
    read again, after the override."""
    from lctx.models.adapters.overrides import parse_override  # lazy: loads lctx.models (its kernels load triton)
    from lctx.models.position import PositionSpec, effective_positions, parse_position  # lazy: as above

    ov = parse_override(attn_override)
    method = parse_position(PositionSpec(ov.name, dict(ov.options)))
    if lm.position.get("method") == "shipped":
        lm.position.update({**method.record(), "via": "--attn-override"})
    else:
        lm.position["attn_override"] = ov.label
    lm.position["effective"] = effective_positions(lm, method)


# ---------------------------------------------------------------------------------------------------------------
# the steps of load_lm, in the order it takes them
# ---------------------------------------------------------------------------------------------------------------

def _checkpoint_dir(path, name: str | None, *, dtype: str, cache_dir, log, progress: bool) -> tuple:
    """The Hugging Face directory ``path`` loads from, checked: a GGUF file (or a folder holding one and no
    ``config.json``) converted into its cached directory (:func:`lctx.models.adapters.gguf.cached_gguf_dir`), named
    by its stem unless ``name`` is given; else ``path`` itself, which must hold tokenizer files. Returns (the
    directory as ``cached_gguf_dir`` gives it or ``path``, the source :attr:`HFAdapter.path` names: the GGUF file or
    ``path``, the name or None).

    Raises:
        LctxError: a GGUF file that cannot be converted; a path that is no directory, a directory without
            ``config.json`` (a llama2.c folder: the convert command), a folder without tokenizer files.
    """
    from lctx.model_files import check_model_path, check_tokenizer_files  # light

    gguf_file = find_gguf(path)
    source = path
    if gguf_file is not None:
        if Path(path).is_dir() and log is not None:  # a folder holding one .gguf: say which file it is
            log(f"note: {str(path)!r} holds one .gguf file, {gguf_file.name}: loading it")
        path, _ = cached_gguf_dir(gguf_file, dtype=dtype, cache_dir=cache_dir, log=log, progress=progress)
        name = name or gguf_file.stem
        source = str(gguf_file)
    p = Path(path)
    if not p.is_dir():
        raise LctxError(f"checkpoint {path!r} is not a directory nor a .gguf file; pass a folder written by "
                        "`lctx train` or save_pretrained, a .gguf file (or omit --model for the bundled default)")
    if not (p / "config.json").is_file():
        check_model_path(p)  # a llama2.c folder gets the convert command
        raise LctxError(f"checkpoint {path!r} has no config.json; pass a folder written by `lctx train` "
                        "or save_pretrained")
    if gguf_file is None:
        check_tokenizer_files(p)  # no tokenizer: named now, not as transformers' "Couldn't instantiate ..."
    return path, source, name


def _load_config(p: Path, path, trust_remote_code: bool):
    """The checkpoint's config (``AutoConfig``) from directory ``p`` (``path``: as the errors name it).

    Raises:
        LctxError: remote code without ``trust_remote_code``; a value this lctx cannot use; an unreadable file.
    """
    from transformers import AutoConfig  # lazy: loads transformers' Auto classes (-X importtime: ~1 s)

    try:
        json.loads((p / "config.json").read_text())
        return AutoConfig.from_pretrained(p, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt checkpoint
        _raise_if_remote_code(path, e)
        if isinstance(e, ValueError) and not isinstance(e, json.JSONDecodeError):  # parsed, but a bad value
            raise LctxError(f"checkpoint {path!r}: config.json has a value this lctx cannot use ({_first_line(e)}); "
                            "fix it in config.json, or use the lctx version that wrote the checkpoint") from None
        raise LctxError(f"checkpoint {path!r} has an unreadable config.json ({_first_line(e)}); "
                        "re-save it with save_pretrained") from None


def _load_tokenizer(p: Path, path, trust_remote_code: bool):
    """The checkpoint's tokenizer (``AutoTokenizer``) from directory ``p`` (``path``: as the errors name it).

    Raises:
        LctxError: remote code without ``trust_remote_code``; no loadable tokenizer.
    """
    from transformers import AutoTokenizer  # lazy: loads transformers' Auto classes and tokenizers (-X importtime: ~1 s)

    try:
        return AutoTokenizer.from_pretrained(p, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001
        _raise_if_remote_code(path, e)
        raise LctxError(f"checkpoint {path!r} has no loadable tokenizer ({_first_line(e)}); save the "
                        "tokenizer beside the weights with tokenizer.save_pretrained") from None


def _load_weights(p: Path, path, dt: torch.dtype, dev: torch.device, trust_remote_code: bool, config=None):
    """The model (``AutoModelForCausalLM``) from directory ``p`` in ``dt`` on ``dev``, in eval mode: safetensors when
    the directory has any, else ``.bin`` through ``torch.load(weights_only=True)``; built from ``config`` when given
    (a positional method's edited copy), else from the directory's. Transformers' multi-line load report is replayed
    on success and cut to its first problem on failure.

    Raises:
        LctxError: remote code without ``trust_remote_code``; weights that do not match ``config.json``; pickled
            ``.bin`` weights torch refuses; corrupt or incomplete weights.
    """
    from transformers import AutoModelForCausalLM  # lazy: loads transformers' Auto classes (-X importtime: ~1 s)

    captured = CapturedLog()  # transformers' multi-line load report: replayed on success, one line on failure
    try:
        safetensors = any(p.glob("*.safetensors"))
        with captured:
            model = AutoModelForCausalLM.from_pretrained(p, dtype=dt, trust_remote_code=trust_remote_code,
                                                         use_safetensors=True if safetensors else None,
                                                         weights_only=True,
                                                         **({"config": config} if config is not None else {})
                                                         ).to(dev).eval()
    except Exception as e:  # noqa: BLE001
        _raise_if_remote_code(path, e)
        if captured.first_problem():
            raise LctxError(f"checkpoint {path!r} could not be loaded: its weights do not match its config.json "
                            f"({captured.first_problem()}); fix config.json or use the weights it was saved with") from None
        if not safetensors and "weights_only" in str(e):
            raise LctxError(f"checkpoint {path!r} has .bin weights that torch.load(weights_only=True) refuses "
                            "(they pickle code or objects); lctx does not unpickle them: re-save the weights as "
                            "safetensors from a trusted environment") from None
        raise LctxError(f"checkpoint {path!r} could not be loaded ({_first_line(e)}); the weights are "
                        "corrupt or incomplete: re-save or retrain it") from None
    captured.replay()
    return model


def _position_config(method, config):
    """For a RoPE-table ``method`` (kind ``"rope"``): a copy of the checkpoint's ``config`` with the method applied to
    each layer type it names (:meth:`~lctx.models.position.base.PositionMethod.apply_config`), to build the model
    from; None otherwise (the checkpoint's own config). The method's :meth:`check` runs first, for every kind.

    Raises:
        LctxError: the method does not apply to the checkpoint (a served model, an lctx checkpoint's own rotations,
            ALiBi, no RoPE, a layer type it lacks), or its options do not fit it."""
    if method is None:
        return None
    method.check(config, "native" if getattr(config, "model_type", None) == "lctx" else "hf")
    if method.kind != "rope":
        return None
    edited = copy.deepcopy(config)
    for layer_type in method.layer_types(edited):
        method.apply_config(edited, layer_type)
    return edited


def _apply_position(lm: HFAdapter, method, config) -> None:
    """Finish loading ``lm`` under positional ``method`` (None: as shipped) and record what it computes with
    (:attr:`HFAdapter.position`): an attention method is applied now (``apply_model``); ``max_length`` becomes the
    length the method addresses (:meth:`~lctx.models.position.base.PositionMethod.max_length`: factor x the
    original for a RoPE scale); the effective parameters are read from the built modules, length-dependent tables
    at that length (:func:`lctx.models.position.base.effective_positions`), and compared with the shipped model's
    (``config``'s tables rebuilt, or the attention before the method): a method that changed nothing is refused
    (:func:`lctx.models.position.base.check_took_effect`). The name gets the label's suffix (``+yarn_factor4``) and
    the variant the label (``llama+yarn:factor=4``).

    Raises:
        LctxError: the method could not be applied, or was accepted but not applied."""
    from lctx.models.position.base import (attention_state, check_took_effect, effective_positions,  # lazy: loads lctx.models (its kernels load triton)
                                           shipped_tables, table_summaries)

    base_name = lm.name
    if method is None:
        lm.position = {"base": base_name, "method": "shipped", "options": {}, "layer_type": "all",
                       "effective": effective_positions(lm)}
        return
    shipped_attention = attention_state(lm.model)
    if method.kind == "attention":
        method.apply_model(lm)
    shipped_max = lm.max_length
    lm.max_length = method.max_length(shipped_max)
    if lm.max_length != shipped_max:
        lm.max_length_source = f"--position {method.spec.label}"
    probe = lm.max_length if method.kind == "rope" else None
    effective = effective_positions(lm, method, probe_length=probe)
    baseline = {"rope": table_summaries(shipped_tables(lm.model, config), probe) if method.kind == "rope" else {},
                "attention": shipped_attention}
    keys = None
    if method.kind == "rope":
        wanted = {lt or "all" for lt in method.layer_types(config)}
        keys = [k for k in effective["rope"] if k.rsplit(":", 1)[-1] in wanted] or sorted(wanted)
    check_took_effect(method, effective, baseline, base_name, keys)
    spec = method.spec
    lm.name = base_name + spec.name_suffix
    lm.variant = f"{lm.variant}+{spec.label}"
    lm.position = {"base": base_name, **method.record(), "effective": effective,
                   "shipped": {"rope": baseline["rope"]} if method.kind == "rope" else {"attention": shipped_attention}}


def _set_attn_impl(model, config, attn_impl: str, name: str) -> None:
    """Run ``model`` with ``--attn-impl`` ``attn_impl`` (checked first, :func:`check_attn_impl`): an lctx model's
    ``config.attn_impl``; transformers' own attention otherwise (reference = eager, sdpa = sdpa).

    Raises:
        LctxError: an unknown value, or ``fast`` for a Hugging Face checkpoint (``name`` in the message).
    """
    check_attn_impl(attn_impl, config, name)
    if config.model_type == "lctx":
        model.config.attn_impl = attn_impl
    else:  # transformers' attention: reference = eager, sdpa = sdpa, fast = lctx_sdpa (registered here)
        hf = get_attn_impl(attn_impl).hf
        if hf == LCTX_SDPA:
            register_lctx_sdpa()
        model.set_attn_implementation(hf)


def _softcapped(config) -> bool:
    """Whether a Hugging Face config asks for attention-logit soft-capping (Gemma 2), which SDPA cannot run."""
    cfg = getattr(config, "get_text_config", lambda: config)()
    return getattr(cfg, "attn_logit_softcapping", None) is not None


def _default_attn_impl(model, config) -> None:
    """The attention a checkpoint runs without ``--attn-impl`` (:data:`lctx.attn_impl.DEFAULT_ATTN_IMPL`, the lean
    path): lctx models ``fast`` whatever their saved ``config.attn_impl`` (a training-time choice); Hugging Face
    models ``lctx_sdpa`` where transformers chose ``sdpa`` and the model has no soft-capping (others keep the
    attention transformers chose, e.g. ``eager`` for a model without SDPA support)."""
    if config.model_type == "lctx":
        model.config.attn_impl = DEFAULT_ATTN_IMPL
    elif getattr(model.config, "_attn_implementation", None) == "sdpa" and not _softcapped(model.config):
        model.set_attn_implementation(register_lctx_sdpa())


def check_attn_impl(attn_impl: str, config, name: str) -> None:
    """Refuse an ``--attn-impl`` a checkpoint cannot take (used by ``lctx run`` and ``lctx plan``).

    Raises:
        LctxError: an unknown value, or ``fast`` for a Hugging Face checkpoint (it used to be
            ignored without a word).
    """
    impl = ATTN_IMPL_REGISTRY.get_interface(attn_impl)
    if impl is None:
        raise LctxError(f"unknown --attn-impl {attn_impl!r}; use {', '.join(ATTN_IMPL_REGISTRY)}")
    if getattr(config, "model_type", None) == "lctx":
        return
    if impl.hf is None:
        raise LctxError(f"--attn-impl {attn_impl} applies to lctx checkpoints only; model {name!r} is a Hugging Face "
                        f"{getattr(config, 'model_type', '?')} checkpoint: use --attn-impl fast, sdpa or reference")
    if impl.hf != "eager" and _softcapped(config):
        raise LctxError(f"model {name!r} soft-caps its attention logits (attn_logit_softcapping), which SDPA cannot "
                        f"compute: use --attn-impl reference (transformers' eager), or omit --attn-impl")


def _tokenizer_adds_bos(tok, model_type: str | None) -> bool:
    """lctx checkpoints: True (BOS first in training). Others: whether ``tok`` puts its BOS first when it
    encodes with special tokens (Llama-2 / SentencePiece tokenizers do; GPT-2-style BPE such as SmolLM2's
    does not)."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return False
    if model_type == "lctx":
        return True
    try:
        ids = tok.encode("a", add_special_tokens=True)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode: keep the old behaviour
        return True
    return bool(ids) and ids[0] == bos


def _length_dependent(rt) -> bool:
    return isinstance(rt, str) and ("dynamic" in rt or rt == "longrope")


def _set_rope_type(mod, layer_type: str | None, value: str) -> None:
    """Set a rotary module's ``rope_type`` (of ``layer_type`` when the module holds one per layer type)."""
    if layer_type is None:
        mod.rope_type = value
    else:
        mod.rope_type = {**mod.rope_type, layer_type: value}


def _length_dependent_ropes(model) -> list:
    """Transformers rotary-embedding modules whose frequencies depend on the sequence length the module
    sees (``rope_type`` "dynamic" (dynamic NTK) or "longrope"). Their ``dynamic_rope_update`` keeps the
    frequencies of the longest forward seen and switches on the length of each chunk (transformers
    ``modeling_rope_utils.py``), so :meth:`HFAdapter.prefill` fixes them per sample. A module with a table per
    layer type (Gemma 3: ``rope_type`` a dict, buffers ``<layer type>_inv_freq``) gives one entry per
    length-dependent type. Returns [(module, rope_type, attention_scaling at load, layer type or None)]."""
    out = []
    for mod in getattr(model, "modules", lambda: [])():
        rt = getattr(mod, "rope_type", None)
        if _length_dependent(rt) and hasattr(mod, "original_inv_freq"):
            out.append((mod, rt, getattr(mod, "attention_scaling", 1.0), None))
        elif isinstance(rt, dict):
            for lt, v in rt.items():
                if _length_dependent(v) and hasattr(mod, f"{lt}_original_inv_freq"):
                    out.append((mod, v, getattr(mod, f"{lt}_attention_scaling", 1.0), lt))
    return out
