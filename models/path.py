"""Seed 004 (accumulated transforms) / PaTH: attention whose keys are transported to the query through
data-dependent Householder-like transforms (Yang, Shen, Wen, Tan, Mishra, Ren, Panda, Kim 2025, "PaTH
Attention: Position Encoding via Accumulating Householder Transformations", arXiv 2505.16381; reference
code: flash-linear-attention, ``fla/ops/path_attn/naive.py`` (``naive_path_attn``) and
``fla/layers/path_attn.py`` (``PaTHAttention``), fla-core / flash-linear-attention 0.6.0).

Equations (token t, head h, head dim D; i the query, j <= i the key):

    w_t    = l2norm(SiLU(causal depthwise conv_K(W_w x_t)))   per head, [D]  (x_t: the layer's normalised input)
    beta_t = 2 sigmoid(W_b x_t + b_b)                         per head, in (0, 2)
    H_t    = I - beta_t w_t w_t^T                              (beta = 2: a reflection; eigenvalues 1 and 1 - beta)
    P_{j->i} = H_i H_{i-1} ... H_{j+1}                         (the route (j, i]; P_{i->i} = I)
    s_ij   = (q_i^T P_{j->i} k_j + G_i - G_j) / sqrt(D)        G_i - G_j = sum_{t in (j, i]} log f_t, only with
                                                               the forget gate (PaTH-FoX), f_t = sigmoid(W_f x_t + b_f)
    o_i    = sum_{j <= i} softmax_j(s_ij) v_j

As in fla, the forget-gate term is added before the 1/sqrt(D) scale (``naive_path_attn``: ``(A + g_i -
g_j) * scale``; the Triton kernel does the same). W_w is low rank (d -> 32 -> H*D) by default, K = 3, the
conv has no bias; these are fla's ``PaTHAttention`` defaults (``use_low_rank_w``, ``conv_size``,
``use_w_shortconv``). fla's optional per-head q/k RMSNorm (``use_qk_norm``) is not part of this variant:
q and k come from the decoder's projections unchanged.

How the products are computed (no per-pair matrix is ever formed). Transforms are taken in blocks of C
tokens a..a+C-1 (the "UT transform", PaTH paper section 3.2, fla ``naive_path_attn``): for a vector x
entering the block, x' = H_{a+C-1} ... H_a x = x - W^T u with u = A^{-1} diag(beta) W x, where W [C, D]
stacks the block's w_t and A = I + tril(diag(beta) W W^T, -1) is unit lower-triangular (forward
substitution of u_t = beta_t w_t^T (x - sum_{s<t} w_s u_s)). Applying it to every key at once (a triangular
solve with one right-hand side per key) gives, for each query i of the block, the scores against all
earlier keys and, for free, the keys transported to the end of the block:

    U = A^{-1} diag(beta) (W K^T  masked to s > e_j)         [C, keys]; e_j = j for a key of the block,
                                                             a - 1 for a key already transported to a - 1
    s_ij ~ q_i^T k_j - sum_{s <= i} (q_i^T w_s) U_sj           (the masks pick the route (j, i])
    k_j <- k_j - sum_s U_sj w_s                                (now P_{j->a+C-1} k_j)

So the reference keeps one running tensor, the keys transported to the latest token, and walks the new
tokens block by block: O(T_new * T_keys * (D + C)) work and O(C * T_keys) score memory per block.

KV cache. A key's score depends on every transform after it, so what attention reads is the keys
transported to the latest token, K_j = P_{j->latest} k_j, updated with each new block (for one decode
token: K_j <- H_t K_j, O(T D); this is also what fla's layer keeps for decoding). They live in
``cache_states(cache)[layer]`` together with the short conv's last K - 1 inputs (and, with the forget
gate, the per-key log decay sum_{t in (j, latest]} log f_t). These states depend on all tokens so far:
the harness snapshots them after the prompt and restores the snapshot on rewind, which is exactly the
post-prompt state. The KV cache itself (``cache.update``) holds the raw keys and the values, which do not
depend on later tokens, so cropping it is correct; the raw keys are not read for attention (they keep the
cache's length bookkeeping and ``crop`` standard). Transported keys are kept in float32: they are rewritten
at every block, and rounding them to bf16 each time would accumulate error over a long prompt.

Left padding: padded tokens get beta = 0 and log f = 0 (identity transforms) and zero conv input, so a
padded row equals the row alone.

Fast path: with ``attn_impl="sdpa"`` on CUDA, when fla-core (0.6.0, optional) is importable, the chunk
starts an empty cache, no token is padding and D is 16/32/64/128, fla's Triton kernel
``fla.ops.path_attn.parallel_path_attn`` computes the output and the transported keys for the cache.
Anything else runs the plain PyTorch reference below (the source of truth in tests).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from lctx.kernels import record_impl

from .cache import cache_states
from .options import Opt
from .variants import AttentionVariant, AttnContext, register_variant

_FLA_HEAD_DIMS = (16, 32, 64, 128)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float32, or float64 when ``t`` is float64 (tests): the reference never computes in half precision."""
    return torch.promote_types(t.dtype, torch.float32)


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(||x||^2 + eps) over the last dim, as fla's ``l2_norm``. x: [..., D] -> [..., D] (same dtype)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def ut_matrix(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """A = I + tril(diag(beta) W W^T, -1) of a block of C transforms (PaTH section 3.2; fla ``T_mat``
    before its inversion). w: [..., C, D] unit directions; beta: [..., C]. Returns [..., C, C] in float32
    (float64 for float64 input), unit lower-triangular: H_{C-1} ... H_0 = I - W^T A^{-1} diag(beta) W.
    """
    dt = _compute_dtype(w)
    w = w.to(dt)
    a = (beta.to(dt)[..., :, None] * (w @ w.transpose(-1, -2))).tril(-1)
    return a + torch.eye(w.shape[-2], dtype=a.dtype, device=a.device)


def path_block(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
               past_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unscaled PaTH scores of one block of C new tokens, and every key transported to the block's end.

    q, k, w: [B, H, C, D] (new tokens a..a+C-1; w unit-norm per head); beta: [B, H, C];
    past_keys: [B, H, Tp, D], the keys before the block already transported to token a - 1
    (P_{j->a-1} k_j). Returns (scores [B, H, C, Tp + C] with scores[i, j] = q_i^T P_{j->i} k_j for
    every past key and every block key j <= i (entries j > i are meaningless: mask them), keys
    [B, H, Tp + C, D] = P_{j->a+C-1} k_j), both float32 (float64 for float64 q). Implements the block
    ("UT") form in the module docstring; O(C * (Tp + C) * (C + D)) work.
    """
    dt = _compute_dtype(q)
    q, k, w, beta = q.to(dt), k.to(dt), w.to(dt), beta.to(dt)
    keys = torch.cat([past_keys.to(dt), k], dim=2)  # [B, H, Tp+C, D]
    Tp, C = past_keys.shape[2], q.shape[2]
    # R_sj = beta_s w_s^T K_j on the route: every s for a past key, s > j for a key of the block
    route = torch.ones(C, Tp + C, dtype=torch.bool, device=q.device)
    route[:, Tp:] = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    r = (beta[..., :, None] * (w @ keys.transpose(-1, -2))).masked_fill(~route, 0.0)
    u = torch.linalg.solve_triangular(ut_matrix(w, beta), r, upper=False, unitriangular=True)  # [B,H,C,Tp+C]
    qw = (q @ w.transpose(-1, -2)).tril()  # s <= i: transforms up to and including the query's own token
    scores = q @ keys.transpose(-1, -2) - qw @ u
    return scores, keys - u.transpose(-1, -2) @ w


def gate_block(log_f: torch.Tensor, past_gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forget-gate logit bias G_i - G_j of one block and the per-key log decay at the block's end.

    log_f: [B, H, C] log forget gates (<= 0) of the new tokens; past_gate: [B, H, Tp] = sum of log f over
    (j, a-1] for each past key. Returns (bias [B, H, C, Tp + C] = sum of log f over (j, i],
    gate [B, H, Tp + C] = sum of log f over (j, a+C-1]), float32 (float64 for float64 input). Entries j > i
    of the bias are meaningless (masked).
    """
    dt = _compute_dtype(log_f)
    cg = torch.cumsum(log_f.to(dt), dim=-1)  # sum over [a, i]
    past_gate = past_gate.to(dt)
    bias = cg[..., :, None] + torch.cat([past_gate, -cg], dim=-1)[..., None, :]
    last = cg[..., -1:]
    return bias, torch.cat([past_gate + last, last - cg], dim=-1)


def path_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
                   allowed: torch.Tensor, past_keys: torch.Tensor | None = None,
                   log_f: torch.Tensor | None = None, past_gate: torch.Tensor | None = None,
                   block: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """PaTH attention, plain PyTorch reference (PaTH eq. for s_ij and o_i in the module docstring).

    q, k, w: [B, H, T, D] for the T new tokens (w unit-norm per head); v: [B, H, Tp + T, D] values of the
    past then the new tokens; beta: [B, H, T] in [0, 2]; allowed: [B, 1|H, T, Tp + T] bool (causal and
    not padding); past_keys: [B, H, Tp, D] keys already transported to the token before the first new one
    (``None``: no past); log_f: [B, H, T] log forget gates or ``None`` (no gate); past_gate: [B, H, Tp]
    per-key log decay so far (required with log_f when Tp > 0); block: C, new tokens per block.

    Returns (o [B, H, T, D] in q's dtype, keys [B, H, Tp + T, D] transported to the last new token, gate
    [B, H, Tp + T] or ``None``). Keys, gate and scores are float32 (float64 for float64 q); the softmax runs
    over the allowed keys only. Work O(T (Tp + T) (D + C)), score memory O(C (Tp + T)) per head.

    Raises:
        ValueError: shapes disagree or block < 1.
    """
    B, H, T, D = q.shape
    if past_keys is None:
        past_keys = q.new_zeros(B, H, 0, D, dtype=torch.float32)
    Tp = past_keys.shape[2]
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if v.shape[2] != Tp + T or allowed.shape[-1] != Tp + T:
        raise ValueError(f"values cover {v.shape[2]} and the mask {allowed.shape[-1]} keys, but past + new = "
                         f"{Tp} + {T}")
    gate = None
    if log_f is not None:
        gate = past_gate if past_gate is not None else q.new_zeros(B, H, Tp, dtype=torch.float32)
        if gate.shape[-1] != Tp:
            raise ValueError(f"past_gate covers {gate.shape[-1]} keys, past_keys {Tp}")
    keys, scale, outs = past_keys, 1.0 / math.sqrt(D), []
    for a in range(0, T, block):
        e = min(a + block, T)
        scores, keys = path_block(q[:, :, a:e], k[:, :, a:e], w[:, :, a:e], beta[:, :, a:e], keys)
        if log_f is not None:
            bias, gate = gate_block(log_f[:, :, a:e], gate)
            scores = scores + bias
        scores = (scores * scale).masked_fill(~allowed[:, :, a:e, : Tp + e], float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ v[:, :, : Tp + e].to(scores.dtype))
    return torch.cat(outs, dim=2).to(q.dtype), keys, gate


@functools.lru_cache(maxsize=None)
def _fla_path_attn():
    """fla's Triton ``parallel_path_attn`` if fla-core is importable, else ``None``."""
    try:
        from fla.ops.path_attn import parallel_path_attn  # optional dependency (fla-core; seconds to import)
    except Exception:  # noqa: BLE001 - ImportError, or triton failing to initialise
        return None
    return parallel_path_attn


@register_variant("path")
class PaTH(AttentionVariant):
    """PaTH attention (Yang et al. 2025, arXiv 2505.16381): keys reach the query through the accumulated
    data-dependent transforms H_t = I - beta_t w_t w_t^T of the tokens in between (module docstring).

    Parameters (per layer): ``w_proj`` (d -> r -> H*D low rank, or d -> H*D), ``w_conv`` (depthwise causal
    conv, H*D channels, kernel K, no bias), ``beta_proj`` (d -> H, bias), ``gate_proj`` (d -> H, bias; only
    with the forget gate). ``variant_options``: ``path_w_rank`` r (default 32, 0 = full-rank projection),
    ``path_conv_size`` K (default 3, 0 = no conv and no SiLU), ``path_forget_gate`` (default False:
    PaTH-FoX when True), ``path_block`` C (reference block size, default 64).
    """

    summary = "PaTH: data-dependent Householder transforms I - beta w w^T accumulated from key to query"
    composable = False
    option_schema = {"path_w_rank": Opt(int, 32, "rank of the w projection (0 = full)"),
                     "path_conv_size": Opt(int, 3, "short conv width (0 = none)"),
                     "path_forget_gate": Opt(bool, False, "PaTH-FoX forget gate"),
                     "path_block": Opt(int, 64, "block size of the reference")}

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        o = self.option_values(config)
        d, hd = config.hidden_size, self.n_heads * self.head_dim
        rank = int(o["path_w_rank"])
        self.conv_size = int(o["path_conv_size"])
        self.block = int(o["path_block"])
        self.forget_gate = bool(o["path_forget_gate"])
        if rank < 0 or self.conv_size < 0 or self.block < 1:
            raise ValueError(f"path options need path_w_rank >= 0, path_conv_size >= 0, path_block >= 1; got "
                             f"{rank}, {self.conv_size}, {self.block}")
        self.w_proj = (nn.Sequential(nn.Linear(d, rank, bias=False), nn.Linear(rank, hd, bias=False)) if rank
                       else nn.Linear(d, hd, bias=False))
        self.w_conv = (nn.Conv1d(hd, hd, self.conv_size, groups=hd, bias=False) if self.conv_size else None)
        self.beta_proj = nn.Linear(d, self.n_heads, bias=True)
        self.gate_proj = nn.Linear(d, self.n_heads, bias=True) if self.forget_gate else None

    def transforms(self, x: torch.Tensor, valid: torch.Tensor, window: torch.Tensor | None):
        """The per-token transforms of T new tokens.

        x: [B, T, d] the layer's normalised input; valid: [B, T] bool (False: padding, made the identity);
        window: [B, H*D, K-1] the conv's previous inputs (``None``: zeros, a fresh sequence).
        Returns (w [B, H, T, D] float32 unit-norm (zero at padding), beta [B, H, T] float32 in [0, 2),
        log_f [B, H, T] float32 <= 0 or ``None``, new window [B, H*D, K-1] or ``None`` without conv).
        """
        B, T, _ = x.shape
        m = valid.to(x.dtype)
        wp = self.w_proj(x) * m[..., None]  # padding feeds zeros to the conv, as the unpadded row's start
        new_window = None
        if self.w_conv is not None:
            K = self.conv_size
            inp = wp.transpose(1, 2)  # [B, H*D, T]
            inp = F.pad(inp, (K - 1, 0)) if window is None else torch.cat([window.to(inp.dtype), inp], dim=-1)
            new_window = inp[..., inp.shape[-1] - (K - 1):]
            wp = F.silu(self.w_conv(inp)).transpose(1, 2)
        w = l2_normalize(wp.view(B, T, self.n_heads, self.head_dim).transpose(1, 2).float())
        mh = valid.float()[:, None, :]
        beta = 2 * torch.sigmoid(self.beta_proj(x).float()).transpose(1, 2) * mh
        log_f = F.logsigmoid(self.gate_proj(x).float()).transpose(1, 2) * mh if self.forget_gate else None
        return w, beta, log_f, new_window

    def _use_fla(self, q: torch.Tensor, past: int, valid: torch.Tensor) -> bool:
        return (not self.attention_impl().explicit and q.is_cuda and past == 0
                and q.shape[-1] in _FLA_HEAD_DIMS and bool(valid.all()) and _fla_path_attn() is not None)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttnContext,
                x: torch.Tensor | None = None) -> torch.Tensor:
        """PaTH attention of the T new tokens. q, k, v: [B, H, T, D]; x: [B, T, d] (required: w and beta
        are computed from it); ``ctx``: mask, key validity and the KV cache. Returns [B, H, T, D].

        Raises:
            ValueError: ``x`` is missing.
            RuntimeError: the cached PaTH state does not match the KV cache length (the cache was cropped
                without restoring the post-prompt ``lctx_states`` snapshot).
        """

        if x is None:
            raise ValueError("the path variant computes its transforms from the layer input x; pass x")
        B, H, T, D = q.shape
        valid = (ctx.key_valid[:, -T:] if ctx.key_valid is not None
                 else torch.ones(B, T, dtype=torch.bool, device=q.device))
        state = cache_states(ctx.cache).get(self.layer_idx) if ctx.cache is not None else None
        w, beta, log_f, window = self.transforms(x, valid, state.get("conv") if state else None)
        if ctx.cache is not None:
            _, v = ctx.cache.update(k, v, self.layer_idx)  # raw keys (bookkeeping) and all values
        past = v.shape[2] - T
        past_keys = state["keys"] if state else None
        if (past_keys.shape[2] if past_keys is not None else 0) != past:
            raise RuntimeError(f"PaTH layer {self.layer_idx}: the cache state holds "
                               f"{0 if past_keys is None else past_keys.shape[2]} transported keys but the KV "
                               f"cache {past}; restore the post-prompt lctx_states snapshot after cropping")

        if self._use_fla(q, past, valid):
            record_impl(self.variant_name, "fla")  # fla-core's chunk kernel (module docstring)
            out, keys, gate = self._fla_forward(q, k, v, w, beta, log_f, want_cache=ctx.cache is not None)
        else:
            if not self.attention_impl().explicit:  # the reference setting records nothing, as elsewhere
                record_impl(self.variant_name, "reference")  # the PyTorch blockwise form: this module's reference
            out, keys, gate = path_attention(q, k, v, w, beta, ctx.mask(), past_keys, log_f,
                                             state.get("gate") if state else None, block=self.block)
        if ctx.cache is not None:
            st = {"keys": keys}
            if window is not None:
                st["conv"] = window
            if gate is not None:
                st["gate"] = gate
            cache_states(ctx.cache)[self.layer_idx] = st
        return out

    def _fla_forward(self, q, k, v, w, beta, log_f, want_cache: bool):
        """fla's Triton kernel on a fresh, unpadded chunk. Same arguments as :func:`path_attention` (no past);
        returns (o [B, H, T, D], keys [B, H, T, D] float32 transported to the last token or ``None``,
        gate [B, H, T] or ``None``)."""
        bt = lambda t: t.transpose(1, 2).contiguous()  # noqa: E731  [B, H, T, ...] -> fla's [B, T, H, ...]
        o, k_cache = _fla_path_attn()(q=bt(q), k=bt(k), v=bt(v), w=bt(w).float(), beta=bt(beta).float(),
                                      g=None if log_f is None else bt(log_f).float(),
                                      scale=1.0 / math.sqrt(q.shape[-1]), use_cache=want_cache)
        keys = bt(k_cache).float() if k_cache is not None else None
        gate = None
        if log_f is not None and want_cache:
            cg = torch.cumsum(log_f.float(), dim=-1)
            gate = cg[..., -1:] - cg
        return bt(o).to(q.dtype), keys, gate
