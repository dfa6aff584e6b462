"""Attention of the attention-kind positional methods on RoPE models: attention sinks (StreamingLLM) and
Self-Extend, each as a plain reference (the full [Tq, Tk] score matrix with explicit positions, fp32) and a fast
path (log-sum-exp merges of a few partial softmaxes, O(window) keys per query where the method allows it).

Both functions take what a transformers attention function receives: queries and keys with RoPE already applied at
their true positions (q_i = a R(i) q_i^raw, k_j = a R(j) k_j^raw, a = the model's ``attention_scaling``), and move a
query or key to another position by rotating it by the difference (rotations compose: R(p') x = R(p' - p) R(p) x;
RoFormer, Su et al. 2021, eq. 14), with the model's own ``inv_freq`` and transformers' ``rotate_half`` convention
(cos and sin of each frequency repeated over the two halves of the head). The angle of each delta is computed in
float64; the model's own rotation (fp32 angles, p x inv_freq) is kept as it is, so a re-rotated key differs from
one rotated once to its final position by the rounding of that angle (about p x 6e-8 rad at position p).

**Self-Extend** (Jin et al. 2024, "LLM Maybe LongLM", arXiv 2401.01325, eq. 3-4; reference implementation
datamllab/LongLM ``self_extend_patch/Llama.py`` at commit 18950b5a9230c20b8016d4332a480ac31bf87fd3 (the position
arithmetic) and ``self_extend_patch/selfextend_flash_attn.py`` at 4137843c6e5ecb82b102dd636865182fe873d1f5 (the
merge)): neighbour window w, group size g. A query at position i and a key at j with i - j < w use their true
positions; beyond (i - j >= w) the key sits at floor(j / g) and the query at floor(i / g) + w - floor(w / g)
(LongLM's ``group_query_position = query_position // group_size_1 + _re_group_size_2 - _re_group_size_2 //
group_size_1`` of its flash and decoding paths; its eager path writes the last term with ``/``, the same when g
divides w). One softmax over both parts: LongLM's eager path selects the neighbour or grouped score per (i, j)
(``torch.where(neighbor_attention_mask, ...)``), its flash path merges a windowed attention (``window_size=[w - 1,
0]``) and a grouped attention over the first Tk - w keys by their log-sum-exps; the fast path here does the latter.

**Attention sinks** (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks", arXiv
2309.17453, Sec. 3.2; reference implementation mit-han-lab/streaming-llm ``streaming_llm/kv_cache.py`` and
``streaming_llm/pos_shift/modify_llama.py`` at d729b3ffc947caca63fc0f7644b7468ca2d50881): the query at position p
attends to the first ``n_sink`` keys and to the last ``window`` keys (p - window < j <= p, itself included: the
paper's cache of ``start_size + recent_size`` entries holds the query). ``reassign=False``: every key keeps its true
position. ``reassign=True`` (the paper's position shift: positions are indices inside the cache): the window keys
keep their true distances and a sink key s outside the window sits right before the window, at
p - window + 1 - n_sink + s, so its distance to the query is window - 1 + n_sink - s; done by rotating the query
back by delta(p) = max(0, p - window + 1 - n_sink) for its sink scores (<R(p - delta) q, R(s) k> = <R(p) q, R(s +
delta) k>).

Shapes everywhere: q [B, H, Tq, D]; k, v [B, Hkv, Tk, D] with Hkv dividing H (grouped KV heads: query head h uses
KV head h // (H / Hkv), as transformers' ``repeat_kv``); D = 2 x len(inv_freq). The fast paths assume the keys are
positions 0..Tk-1 and the queries the last Tq of them (a chunk of a prefill or a decode step over a full KV cache);
the references take any positions (``qpos`` [B|1, Tq], ``kpos`` [B|1, Tk]) and a mask (left padding).

On CPU the partial softmaxes run torch's flash kernel, which returns the log-sum-exp; elsewhere an explicit fp32
form in blocks of query rows (a CUDA kernel with the log-sum-exp is not wired here yet, as in
:mod:`lctx.kernels.chunk_attention`). ``tests/test_sinks.py`` and ``tests/test_self_extend.py`` compare each fast
path with its reference, and the reference with the papers' own arithmetic written independently.
"""

from __future__ import annotations

import math

import torch

#: query rows per block of the explicit (reference / non-CPU) forms: bounds their [B, H, rows, Tk] fp32 scores
_BYTES_PER_BLOCK = 64 * 2 ** 20


# -- rotations ------------------------------------------------------------------------------------------------

def rope_cos_sin(delta: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation by ``delta`` positions: delta [..., T] (integers, any sign); inv_freq [n] (the
    model's RoPE frequencies, radians per position). Returns two float32 tensors [..., T, 2n] (each frequency's
    value repeated over the two halves, transformers' layout); the angles delta x inv_freq are taken in float64."""
    ang = delta.to(torch.float64)[..., None] * inv_freq.to(device=delta.device, dtype=torch.float64)
    ang = torch.cat([ang, ang], -1)
    return ang.cos().float(), ang.sin().float()


def rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """``x`` rotated by ``delta`` positions with transformers' ``rotate_half`` convention: x cos + rotate_half(x) sin.

    x: [B, H, T, D]; delta: [T] or [B|1, T] integers; inv_freq: [D / 2]. Returns x's shape and dtype (computed in
    float32).

    Raises:
        ValueError: D is not 2 x len(inv_freq).
    """
    D = x.shape[-1]
    if D != 2 * inv_freq.shape[-1]:
        raise ValueError(f"head dimension {D} is not twice the {inv_freq.shape[-1]} RoPE frequencies")
    d = delta if delta.dim() == 2 else delta[None]
    cos, sin = rope_cos_sin(d.to(x.device), inv_freq)
    cos, sin = cos[:, None], sin[:, None]  # [B|1, 1, T, D]
    xf = x.float()
    half = D // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * cos + rot * sin).to(x.dtype)


def self_extend_positions(pos: torch.Tensor, window: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(grouped query position, grouped key position) of tokens at ``pos`` (integers, any shape): floor(pos / g) + w -
    floor(w / g) and floor(pos / g) (Jin et al. 2024, eq. 4; LongLM ``self_extend_patch/Llama.py``)."""
    return pos // group + window - window // group, pos // group


# -- partial softmaxes ----------------------------------------------------------------------------------------

def _fold(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """[B, H, T, D] -> [B, Hkv, G T, D]: the G = H / Hkv query heads of one KV head as rows of one head."""
    B, H, T, D = q.shape
    return q.reshape(B, hkv, (H // hkv) * T, D)


def _unfold(x: torch.Tensor, H: int) -> torch.Tensor:
    """Inverse of :func:`_fold` for an output [B, Hkv, G T, D] or a log-sum-exp [B, Hkv, G T]."""
    B, hkv, GT = x.shape[:3]
    return x.reshape(B, H, GT * hkv // H, *x.shape[3:])


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, Hkv, T, D] -> [B, Hkv G, T, D], KV head h // G for query head h (transformers' ``repeat_kv``)."""
    if groups == 1:
        return x
    B, hkv, T, D = x.shape
    return x[:, :, None].expand(B, hkv, groups, T, D).reshape(B, hkv * groups, T, D)


def attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None = None,
               causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One softmax attention and its log-sum-exp.

    q: [B, H, Tq, D]; k, v: [B, Hkv, Tk, D]; scale: logit multiplier; mask: [Tq, Tk] bool (True = attend), the same
    for every row and head, or None; causal: upper-left causal (query r sees keys c <= r; with ``mask`` None only).
    Returns (out [B, H, Tq, D] in q's dtype, lse [B, H, Tq] float32, natural log); a row with no allowed key gets
    out 0 and lse -inf (it adds nothing to a merge). The grouped query heads of a KV head are folded into its rows,
    so the keys are not repeated (except for ``causal`` with grouped heads: the causal pattern is per row).
    """
    B, H, Tq, D = q.shape
    hkv, Tk = k.shape[1], k.shape[2]
    G = H // hkv
    if Tk == 0:
        return q.new_zeros(q.shape), torch.full((B, H, Tq), float("-inf"), device=q.device)
    if causal and G > 1:
        k, v, hkv, G = _repeat_kv(k, G), _repeat_kv(v, G), H, 1
    qf = _fold(q, hkv) if G > 1 else q
    m = mask.repeat(G, 1) if (mask is not None and G > 1) else mask
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16):
        add = None if m is None else torch.zeros(m.shape, dtype=q.dtype, device=q.device).masked_fill(~m, float("-inf"))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qf, k, v, 0.0, causal, attn_mask=add,
                                                                              scale=scale)
        lse = lse.float()
    else:
        out, lse = _attend_lse_math(qf, k, v, scale, m, causal)
    if m is not None:  # torch's kernel gives lse 0 (not -inf) to a row without an allowed key
        empty = ~m.any(-1)
        if bool(empty.any()):
            lse = lse.masked_fill(empty, float("-inf"))
            out = out.masked_fill(empty[:, None], 0.0)
    if G > 1:
        out, lse = _unfold(out, H), _unfold(lse, H)
    return out, lse


def _attend_lse_math(q, k, v, scale, mask, causal):
    """:func:`attend_lse` (heads already matched) as explicit fp32 matrix products, in blocks of query rows."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    rows = max(1, _BYTES_PER_BLOCK // max(1, 4 * B * H * Tk))
    outs, lses = [], []
    kf, vf = k.float(), v.float()
    for a in range(0, Tq, rows):
        e = min(a + rows, Tq)
        s = torch.matmul(q[:, :, a:e].float(), kf.transpose(-1, -2)) * scale
        allowed = None
        if mask is not None:
            allowed = mask[a:e]
        elif causal:
            allowed = torch.arange(Tk, device=q.device)[None, :] <= torch.arange(a, e, device=q.device)[:, None]
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse.clamp_min(-1e30)[..., None]).nan_to_num(0.0)
        outs.append(torch.matmul(p, vf).to(q.dtype))
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention over the union of disjoint key sets from each set's (out [..., T, D], lse [..., T]): (out in
    the first part's dtype, lse float32) = (sum_p e^(l_p - M) o_p / sum_p e^(l_p - M), M + log sum_p e^(l_p - M)),
    M = max_p l_p (FlashAttention's online softmax, Dao et al. 2022, Algorithm 1; as
    :func:`lctx.kernels.chunk_attention.merge_two`). A part with lse -inf adds nothing."""
    if len(parts) == 1:
        return parts[0]
    m = torch.stack([lse for _, lse in parts]).amax(0)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    num, den = 0.0, 0.0
    for o, lse in parts:
        w = torch.exp(lse - m)
        num = num + o.float() * w[..., None]
        den = den + w
    out = num / den.clamp_min(1e-30)[..., None]
    return out.to(parts[0][0].dtype), m + torch.log(den)


def causal_lse(q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of the last Tq of Tk positions (query r at key index Tk - Tq + r sees keys <= it), as two
    unmasked/causal parts merged (the split of :func:`lctx.kernels.chunk_attention.chunk_attention`). Shapes as
    :func:`attend_lse`, Tk >= Tq. Returns (out, lse)."""
    Tq, Tk = q.shape[2], k.shape[2]
    past = Tk - Tq
    if Tq == 1:
        return attend_lse(q, k, v, scale)
    own = attend_lse(q, k[:, :, past:], v[:, :, past:], scale, causal=True)
    if past == 0:
        return own
    return merge([attend_lse(q, k[:, :, :past], v[:, :, :past], scale), own])


def _band(rows: int, q0: int, k0: int, nk: int, window: int, device) -> torch.Tensor:
    """[rows, nk] bool: query at position q0 + r sees key at k0 + c iff 0 <= (q0 + r) - (k0 + c) < window."""
    d = (torch.arange(q0, q0 + rows, device=device)[:, None] - torch.arange(k0, k0 + nk, device=device)[None, :])
    return (d >= 0) & (d < window)


def window_lse(q, k, v, window: int, scale: float, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sliding-window causal attention of the last Tq of Tk positions: the query at p sees keys p - window < j <= p.
    Per block of ``block`` queries (default min(256, max(64, window))) over the band of keys it needs, so the work is
    O(Tq (window + block)) whatever Tk. Shapes as :func:`attend_lse`. Returns (out, lse)."""
    Tq, Tk = q.shape[2], k.shape[2]
    past = Tk - Tq
    if Tk <= window:
        return causal_lse(q, k, v, scale)
    b = block or min(256, max(64, window))
    outs, lses = [], []
    for a in range(0, Tq, b):
        e = min(a + b, Tq)
        lo, hi = max(0, past + a - window + 1), past + e
        if e - a == 1:
            o, lse = attend_lse(q[:, :, a:e], k[:, :, lo:hi], v[:, :, lo:hi], scale)
        else:
            band = _band(e - a, past + a, lo, hi - lo, window, q.device)
            o, lse = attend_lse(q[:, :, a:e], k[:, :, lo:hi], v[:, :, lo:hi], scale, band)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def _scale(q, scale):
    return scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _check(q, k, v, inv_freq, window):
    if k.shape[2] < q.shape[2]:
        raise ValueError(f"{q.shape[2]} queries need at least as many keys, got {k.shape[2]}")
    if window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{k.shape[1]} KV heads do not divide {q.shape[1]} query heads")
    if inv_freq is not None and q.shape[-1] != 2 * inv_freq.shape[-1]:
        raise ValueError(f"head dimension {q.shape[-1]} is not twice the {inv_freq.shape[-1]} RoPE frequencies")


# -- Self-Extend ----------------------------------------------------------------------------------------------

def self_extend_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq: torch.Tensor, window: int,
                          group: int, scale: float | None = None) -> torch.Tensor:
    """Self-Extend attention of a prefill chunk or decode step (module docstring), fast path.

    q: [B, H, Tq, D]; k, v: [B, Hkv, Tk, D] (RoPE applied at positions 0..Tk-1; the queries are the last Tq);
    inv_freq: [D / 2], the model's RoPE frequencies; window: w (tokens); group: g; scale: logit multiplier (default
    1 / sqrt(D)). Returns [B, H, Tq, D] in q's dtype, equal to :func:`self_extend_reference` to fp32 rounding.

    The neighbour part is :func:`window_lse` (O(Tq w) work); the grouped part re-rotates the queries that have a
    key at distance >= w (query at p by floor(p/g) + w - floor(w/g) - p) and the keys 0..Tk-1-w (key j by
    floor(j/g) - j), then runs :func:`causal_lse` over them (query p sees grouped keys j <= p - w); the two are
    merged by their log-sum-exps. Memory: the re-rotated copies (Tq + Tk rows per head) and one block's band.

    Raises:
        ValueError: Tk < Tq, window < 1, group < 1, Hkv not dividing H, D != 2 len(inv_freq).
    """
    _check(q, k, v, inv_freq, window)
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    s = _scale(q, scale)
    Tq, Tk = q.shape[2], k.shape[2]
    past = Tk - Tq
    o_n, l_n = window_lse(q, k, v, window, s)
    if Tk <= window:
        return o_n
    r0 = max(0, window - past)  # first query row with a key at distance >= window
    lg = Tk - window  # grouped keys 0..lg-1 (the last query's)
    p = torch.arange(past + r0, Tk, device=q.device)
    gq, _ = self_extend_positions(p, window, group)
    j = torch.arange(lg, device=q.device)
    _, gk = self_extend_positions(j, window, group)
    qg = rotate(q[:, :, r0:], gq - p, inv_freq)
    kg = rotate(k[:, :, :lg], gk - j, inv_freq)
    o_g, l_g = causal_lse(qg, kg, v[:, :, :lg], s)
    o_m, _ = merge([(o_n[:, :, r0:], l_n[:, :, r0:]), (o_g, l_g)])
    return torch.cat([o_n[:, :, :r0], o_m], 2) if r0 else o_m


def _positions(q, k, qpos, kpos):
    Tq, Tk = q.shape[2], k.shape[2]
    if qpos is None:
        qpos = torch.arange(Tk - Tq, Tk, device=q.device)
    if kpos is None:
        kpos = torch.arange(Tk, device=q.device)
    qpos = qpos.to(q.device).long()
    kpos = kpos.to(q.device).long()
    return (qpos if qpos.dim() == 2 else qpos[None]), (kpos if kpos.dim() == 2 else kpos[None])


def _reference(q, v, mask, scale, scores_fn):
    """The shared loop of the references: fp32 scores of a block of query rows [a, e) from ``scores_fn(a, e)`` ->
    (scores [B, H, rows, Tk], allowed [B|1, 1, rows, Tk]), the softmax over the allowed keys (a row with none: 0),
    times v. Memory: [B, H, rows, Tk] fp32 per block."""
    B, H, Tq, D = q.shape
    Tk = v.shape[2]
    vf = _repeat_kv(v.float(), H // v.shape[1])
    rows = max(1, _BYTES_PER_BLOCK // max(1, 4 * B * H * Tk))
    outs = []
    for a in range(0, Tq, rows):
        e = min(a + rows, Tq)
        sc, allowed = scores_fn(a, e)
        if mask is not None:
            allowed = allowed & mask[:, :, a:e].bool()
        sc = (sc * scale).masked_fill(~allowed, float("-inf"))
        p = torch.softmax(sc, -1).nan_to_num(0.0)
        outs.append(torch.matmul(p, vf))
    return torch.cat(outs, 2).to(q.dtype)


def self_extend_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq: torch.Tensor, window: int,
                          group: int, scale: float | None = None, qpos: torch.Tensor | None = None,
                          kpos: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Self-Extend attention as the plain reference: LongLM's eager form with explicit positions, fp32.

    q, k, v, inv_freq, window, group, scale: as :func:`self_extend_attention`. qpos [B|1, Tq] / kpos [B|1, Tk]: the
    positions RoPE was applied at (default: keys 0..Tk-1, queries the last Tq); mask: [B|1, 1, Tq, Tk] bool (True =
    attend; e.g. left padding) or None. The states are rotated back to position 0 (the raw q, k times the model's
    attention scaling) and rotated again to explicit positions: neighbour scores at (qpos, kpos), grouped scores at
    :func:`self_extend_positions`; score(i, j) = neighbour if qpos_i - kpos_j < w else grouped (LongLM's
    ``torch.where(neighbor_attention_mask, ...)``); causal on positions (kpos <= qpos); one fp32 softmax. Memory:
    [B, H, rows, Tk] fp32 per block of query rows. Returns [B, H, Tq, D] in q's dtype.

    Raises:
        ValueError: as :func:`self_extend_attention`.
    """
    _check(q, k, v, inv_freq, window)
    qpos, kpos = _positions(q, k, qpos, kpos)
    H = q.shape[1]
    gq, _ = self_extend_positions(qpos, window, group)
    _, gk = self_extend_positions(kpos, window, group)
    q0 = rotate(q.float(), -qpos, inv_freq)  # the raw (pre-RoPE) states, times the model's attention scaling
    k0 = rotate(k.float(), -kpos, inv_freq)
    kn = _repeat_kv(rotate(k0, kpos, inv_freq), H // k.shape[1])
    kg = _repeat_kv(rotate(k0, gk, inv_freq), H // k.shape[1])

    def scores(a, e):
        qn = rotate(q0[:, :, a:e], qpos[:, a:e], inv_freq)
        qg = rotate(q0[:, :, a:e], gq[:, a:e], inv_freq)
        sn = torch.matmul(qn, kn.transpose(-1, -2))
        sg = torch.matmul(qg, kg.transpose(-1, -2))
        d = (qpos[:, a:e, None] - kpos[:, None, :])[:, None]  # [B|1, 1, rows, Tk]
        return torch.where(d < window, sn, sg), d >= 0

    return _reference(q, v, mask, _scale(q, scale), scores)


# -- attention sinks ------------------------------------------------------------------------------------------

def sinks_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_sink: int, window: int,
                    reassign: bool = False, inv_freq: torch.Tensor | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """StreamingLLM attention of a prefill chunk or decode step (module docstring), fast path.

    q: [B, H, Tq, D]; k, v: [B, Hkv, Tk, D] (RoPE applied at positions 0..Tk-1; the queries are the last Tq);
    n_sink: the first keys every query sees; window: the recent keys a query sees, itself included; reassign: the
    paper's position shift (needs ``inv_freq`` [D / 2]); scale: logit multiplier (default 1 / sqrt(D)). Returns
    [B, H, Tq, D] in q's dtype, equal to :func:`sinks_reference` to fp32 rounding.

    Work O(Tq (window + block + n_sink)), whatever Tk: the window part is :func:`window_lse` over the band of keys
    each block of queries needs (the key/value tensors are sliced, never masked over [Tq, Tk]); the sink part is the
    n_sink first keys for the queries whose window has left them (query rotated back by delta(p) when
    ``reassign``); the two are merged by their log-sum-exps.

    Raises:
        ValueError: Tk < Tq, window < 1, n_sink < 0, Hkv not dividing H, ``reassign`` without ``inv_freq``.
    """
    _check(q, k, v, inv_freq, window)
    if n_sink < 0:
        raise ValueError(f"n_sink must be >= 0, got {n_sink}")
    if reassign and inv_freq is None:
        raise ValueError("reassign needs the model's inv_freq")
    s = _scale(q, scale)
    Tq, Tk = q.shape[2], k.shape[2]
    past = Tk - Tq
    o_w, l_w = window_lse(q, k, v, window, s)
    r0 = max(0, window - past)  # first query row whose window has left key 0 (p - window + 1 >= 1)
    if n_sink == 0 or r0 >= Tq:
        return o_w
    p = torch.arange(past + r0, Tk, device=q.device)
    ns = min(n_sink, Tk)
    qs = q[:, :, r0:]
    if reassign:
        qs = rotate(qs, -(p - window + 1 - n_sink).clamp_min(0), inv_freq)
    outside = torch.arange(ns, device=q.device)[None, :] < (p - window + 1)[:, None]  # sink keys not in the window
    o_s, l_s = attend_lse(qs, k[:, :, :ns], v[:, :, :ns], s, outside)
    o_m, _ = merge([(o_w[:, :, r0:], l_w[:, :, r0:]), (o_s, l_s)])
    return torch.cat([o_w[:, :, :r0], o_m], 2) if r0 else o_m


def sinks_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_sink: int, window: int,
                    reassign: bool = False, inv_freq: torch.Tensor | None = None, scale: float | None = None,
                    qpos: torch.Tensor | None = None, kpos: torch.Tensor | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """StreamingLLM attention as the plain reference: the full [Tq, Tk] score matrix with explicit positions, fp32.

    Arguments as :func:`sinks_attention`, plus qpos / kpos / mask as :func:`self_extend_reference` (positions count
    from the first real token: the sinks are the keys at positions 0..n_sink-1). Key j is visible to query i iff
    0 <= qpos_i - kpos_j and (qpos_i - kpos_j < window or kpos_j < n_sink); a visible key inside the window scores at
    its true position, a sink key outside it at its true position (``reassign`` False) or at kpos_j + delta(qpos_i)
    (``reassign`` True: the query rotated back by delta for that score). One fp32 softmax. Returns [B, H, Tq, D] in
    q's dtype.

    Raises:
        ValueError: as :func:`sinks_attention`.
    """
    _check(q, k, v, inv_freq, window)
    if inv_freq is None:
        raise ValueError("the reference needs the model's inv_freq (it rotates to explicit positions)")
    qpos, kpos = _positions(q, k, qpos, kpos)
    H = q.shape[1]
    delta = (qpos - window + 1 - n_sink).clamp_min(0) if reassign else torch.zeros_like(qpos)
    q0 = rotate(q.float(), -qpos, inv_freq)  # the raw (pre-RoPE) states, times the model's attention scaling
    k0 = rotate(k.float(), -kpos, inv_freq)
    kt = _repeat_kv(rotate(k0, kpos, inv_freq), H // k.shape[1])

    def scores(a, e):
        qt = rotate(q0[:, :, a:e], qpos[:, a:e], inv_freq)
        qsink = rotate(q0[:, :, a:e], qpos[:, a:e] - delta[:, a:e], inv_freq)
        st = torch.matmul(qt, kt.transpose(-1, -2))
        ss = torch.matmul(qsink, kt.transpose(-1, -2))
        d = (qpos[:, a:e, None] - kpos[:, None, :])[:, None]
        kp = kpos[:, None, None, :]
        inside = d < window
        allowed = (d >= 0) & (kp >= 0) & (inside | (kp < n_sink))
        return torch.where(inside, st, ss), allowed

    return _reference(q, v, mask, _scale(q, scale), scores)
