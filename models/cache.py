"""A preallocated KV cache for long prefills of native lctx models.

``transformers``' ``DynamicCache`` concatenates every new chunk onto the cached keys and values, so a
chunked prefill of T tokens copies O(T^2 / chunk) elements and briefly holds two copies of a layer's
cache. :class:`PreallocatedKVCache` allocates each layer's buffers once, for ``capacity`` tokens, and
writes each chunk in place; attention reads views of the filled part. It grows (by doubling, one copy)
only when a decode runs past the capacity. It implements the part of the ``Cache`` interface lctx
models and :class:`lctx.models.adapters.hf.HFAdapter` use: ``update``, ``get_seq_length`` and ``crop``.
"""

from __future__ import annotations

import torch


def cache_states(cache) -> dict:
    """The per-layer recurrent states of fixed-state mixers kept on a KV cache (``cache.lctx_states``,
    {layer_idx: state}); created empty on first use. A state is a dict of tensors whose size does not
    grow with the number of tokens."""
    states = getattr(cache, "lctx_states", None)
    if states is None:
        states = {}
        cache.lctx_states = states
    return states


class PreallocatedKVCache:
    """Per-layer key/value buffers [B, H, capacity, D] filled in place.

    Args:
        capacity: tokens to allocate for (prompt length plus the expected decode budget).

    Memory: 2 * layers * B * H * capacity * D * bytes(dtype), allocated on first ``update`` of each
    layer in the dtype and device of the keys it receives.

    Raises:
        ValueError: capacity < 1, or ``crop`` asked to keep more tokens than the cache holds.
    """

    is_compileable = False

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 token, got {capacity}")
        self.capacity = int(capacity)
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self.lengths: list[int] = []

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Append T new tokens' keys and values ([B, H, T, D]) to layer ``layer_idx``; returns views of
        all cached keys and values, [B, H, n + T, D]."""
        while len(self.keys) <= layer_idx:
            self.keys.append(None)
            self.values.append(None)
            self.lengths.append(0)
        n, T = self.lengths[layer_idx], key_states.shape[2]
        kb, vb = self.keys[layer_idx], self.values[layer_idx]
        if kb is None or n + T > kb.shape[2]:
            size = max(self.capacity, n + T) if kb is None else max(2 * kb.shape[2], n + T)
            B, H, _, Dk = key_states.shape
            nk = key_states.new_empty(B, H, size, Dk)
            nv = value_states.new_empty(B, H, size, value_states.shape[-1])
            if kb is not None:
                nk[:, :, :n] = kb[:, :, :n]
                nv[:, :, :n] = vb[:, :, :n]
            kb, vb = nk, nv
            self.keys[layer_idx], self.values[layer_idx] = kb, vb
        kb[:, :, n:n + T] = key_states
        vb[:, :, n:n + T] = value_states
        self.lengths[layer_idx] = n + T
        return kb[:, :, :n + T], vb[:, :, :n + T]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens cached for layer ``layer_idx`` (0 before its first update)."""
        return self.lengths[layer_idx] if layer_idx < len(self.lengths) else 0

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` tokens of every layer; a negative value removes that many from
        the end (the ``DynamicCache.crop`` convention). The buffers are kept for reuse."""
        for i, n in enumerate(self.lengths):
            keep = n + max_length if max_length < 0 else max_length
            if keep > n:
                raise ValueError(f"cannot crop to {keep} tokens: layer {i} holds {n}")
            self.lengths[i] = max(0, keep)

    def nbytes(self) -> int:
        """Bytes held by the allocated buffers."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
