"""The native lctx decoder: a small Llama-style Transformer whose positional scheme is a pluggable variant.

Reads top to bottom: RMSNorm -> SwiGLU MLP -> Attention (projections; positions handed to the variant)
-> Block (pre-norm residual) -> LctxModel (embeddings, blocks, final norm) -> LctxForCausalLM (LM head,
loss, targeted logits). It is a ``transformers.PreTrainedModel``: ``save_pretrained``/``from_pretrained``
(safetensors), ``AutoModelForCausalLM`` and lm-eval's ``hf`` backend load it once ``lctx.models`` is
imported.

KV cache: any ``transformers`` ``Cache`` (``DynamicCache`` by default). The attention mask follows the
Hugging Face convention: [B, past + new] with 1 for real tokens and 0 for (left) padding. Positions are
counted from each row's first real token, so a left-padded row gives the same result as the row alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .cache import cache_states  # noqa: F401  (re-exported: lctx.models.model.cache_states)
from .config import LctxConfig
from .variants import AttnContext, get_variant


class RMSNorm(nn.Module):
    """Root-mean-square LayerNorm (Zhang & Sennrich 2019): x / rms(x) * g, computed in float32.
    x: [..., d] -> [..., d]."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    """Gated MLP W_down(SiLU(W_gate x) * W_up x) (Shazeer 2020). x: [B, T, d] -> [B, T, d]."""

    def __init__(self, config: LctxConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Multi-head self-attention: q, k, v projections, then the positional variant attends.

    x: [B, T, d] -> [B, T, d]. The variant (``config.variant``) is looked up in
    :data:`lctx.models.variants.VARIANTS`.
    """

    def __init__(self, config: LctxConfig, layer_idx: int):
        super().__init__()
        self.n_heads, self.head_dim = config.num_attention_heads, config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.variant = get_variant(config.variant)(config, layer_idx)

    def forward(self, x, ctx: AttnContext):
        B, T, _ = x.shape

        def heads(t):
            return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)

        out = self.variant(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)), ctx, x)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class Block(nn.Module):
    """Pre-norm decoder block: x + Attn(norm(x)), then + MLP(norm(x))."""

    def __init__(self, config: LctxConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x, ctx: AttnContext):
        x = x + self.attn(self.attn_norm(x), ctx)
        return x + self.mlp(self.mlp_norm(x))


class LctxPreTrainedModel(PreTrainedModel):
    """Base class wiring :class:`LctxConfig` into ``transformers`` (init, save/load)."""

    config_class = LctxConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _supports_sdpa = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear) and getattr(module, "_lctx_zero_init", False):
            nn.init.zeros_(module.weight)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


def positions_and_mask(attention_mask: torch.Tensor | None, B: int, T: int, past: int, device,
                       lazy: bool = False):
    """Positions and the attention pattern for T new tokens after ``past`` cached ones.

    attention_mask: [B, past + T] (1 real, 0 padding) or ``None`` (all real).
    Returns q_pos [B, T], k_pos [B, past + T] (tokens from each row's first real token) and
    allowed [B, 1, T, past + T] bool (causal and not padding; a padding query sees itself only,
    so no row is empty and no NaN appears). With ``lazy=True`` the third value is a function that
    builds ``allowed`` when called (O(T * (past + T)) memory, only for paths that need it).

    Raises:
        ValueError: the mask length is not past + T.
    """
    Tk = past + T
    if attention_mask is None:
        key_valid = torch.ones(B, Tk, dtype=torch.bool, device=device)
    else:
        if attention_mask.shape[-1] != Tk:
            raise ValueError(
                f"attention_mask covers {attention_mask.shape[-1]} tokens but past + new = {Tk}; "
                "pass the mask of the whole sequence (cached and new tokens)"
            )
        key_valid = attention_mask.to(device=device, dtype=torch.bool)
    k_pos = (torch.cumsum(key_valid.long(), dim=-1) - 1).clamp_min(0)

    def build():
        q_idx = torch.arange(past, Tk, device=device)
        k_idx = torch.arange(Tk, device=device)
        causal = k_idx[None, :] <= q_idx[:, None]  # [T, Tk]
        allowed = causal[None] & key_valid[:, None, :]  # [B, T, Tk]
        empty = ~allowed.any(-1, keepdim=True)
        allowed = allowed | (empty & (k_idx[None, None, :] == q_idx[None, :, None]))
        return allowed[:, None]

    return k_pos[:, past:], k_pos, (build if lazy else build())


def cache_length(cache) -> int:
    """Tokens already in ``cache`` (0 for ``None``). lctx records the count on the cache itself
    (``cache.lctx_length``) because fixed-state layers keep no per-token keys a cache could count."""
    if cache is None:
        return 0
    n = getattr(cache, "lctx_length", None)
    return int(n) if n is not None else int(cache.get_seq_length())


class LctxModel(LctxPreTrainedModel):
    """Embeddings, decoder blocks and the final norm. input_ids [B, T] -> hidden states [B, T, d]."""

    def __init__(self, config: LctxConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        variant_cls = get_variant(config.variant)
        self.pos_embed = variant_cls.input_embedding(config)
        # a module every layer's variant reads (e.g. the GGD-BAM prior shared across layers), or None
        self.variant_shared = variant_cls.shared_module(config)
        self.embed_scale = math.sqrt(config.hidden_size) if self.pos_embed is not None else 1.0
        self.layers = nn.ModuleList([Block(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                past_key_values=None, inputs_embeds=None, use_cache=None, attn_probe=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        if use_cache and cache is None:
            cache = DynamicCache()
        past = cache_length(cache)
        q_pos, k_pos, allowed_fn = positions_and_mask(attention_mask, B, T, past, x.device, lazy=True)
        if position_ids is not None:  # explicit positions for the new tokens override the mask-derived ones
            q_pos = position_ids.expand(B, T).to(x.device)
            k_pos = torch.cat([k_pos[:, :past], q_pos], dim=1)
        if self.pos_embed is not None:
            x = x * self.embed_scale + self.pos_embed(q_pos).to(x.dtype)
        key_valid = (attention_mask.to(device=x.device, dtype=torch.bool) if attention_mask is not None
                     else torch.ones(B, past + T, dtype=torch.bool, device=x.device))
        # fast kernels assume position = key index: no padding and no explicit position_ids
        padded = (attention_mask is not None and not bool(key_valid.all())) or position_ids is not None
        ctx = AttnContext(q_pos=q_pos, k_pos=k_pos, allowed_fn=allowed_fn, cache=cache, shared=self.variant_shared,
                          key_valid=key_valid, probe=attn_probe, padded=padded, past=past)
        for block in self.layers:
            x = block(x, ctx)
        if cache is not None:
            cache.lctx_length = past + T
        return BaseModelOutputWithPast(last_hidden_state=self.norm(x), cache=cache)


class LctxForCausalLM(LctxPreTrainedModel, GenerationMixin):
    """Causal LM head over :class:`LctxModel`.

    forward(input_ids [B, T], attention_mask [B, past+T], cache, labels [B, T], logits_to_keep) returns
    ``CausalLMOutputWithPast`` with logits [B, T', vocab] float32, where T' = T, or the last
    ``logits_to_keep`` positions (int > 0), or the positions listed in a 1-D ``logits_to_keep`` tensor
    (the harness asks only for the positions it scores, never the full T x vocab at long lengths).
    ``labels`` are the input ids (shifted inside; -100 ignored); loss is the mean token NLL in nats.
    ``attn_probe(layer_idx, probs [B, H, T, Tk], ctx)``, when given, receives every softmax layer's
    attention weights (diagnostics; it forces the explicit-softmax path).

    Raises:
        ValueError: ``labels`` together with ``logits_to_keep`` != 0, or a mask that does not cover
            cached + new tokens.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: LctxConfig):
        super().__init__(config)
        self.model = LctxModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def variant_parameter_count(self) -> int:
        """Trainable parameters owned by the positional variant (e.g. GGD-BAM's alpha and beta, 2 per head,
        per layer when not shared; SSMax's s_h), counted once even when shared across layers."""
        mods = [self.model.variant_shared] + [blk.attn.variant for blk in self.model.layers]
        params = {id(p): p for m in mods if m is not None for p in m.parameters() if p.requires_grad}
        return sum(p.numel() for p in params.values())

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
                logits_to_keep: int | torch.Tensor = 0, return_dict=None, attn_probe=None, **kwargs):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache if cache is not None else past_key_values,
                         inputs_embeds=inputs_embeds, use_cache=use_cache, attn_probe=attn_probe)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep > 0 else h
        else:
            h = h[:, logits_to_keep.to(h.device)]
        logits = self.lm_head(h).float()
        loss = None
        if labels is not None:
            if logits.shape[1] != labels.shape[1]:
                raise ValueError("labels need logits at every position; call with logits_to_keep=0")
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1).to(logits.device), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache)
