"""Seed 004 ("why accumulated transforms extrapolate"): accumulated SO(2) rotations, ``acc_rot``.

Each head's D dims form D/2 planes (the RoPE half-split layout: dim p pairs with dim p + D/2). Every
token t carries a per-plane angle increment omega_t in R^{H x D/2}; the accumulated angle is
theta_t = sum_{tau <= t} omega_tau (float64, reduced mod 2 pi). With Rot(a) the counter-clockwise
rotation of each plane by a (RoPE's convention, Su et al. 2021),

    score_ij = (Rot(theta_i) q_i)^T (Rot(theta_j) k_j) = q_i^T Rot(theta_j - theta_i) k_j,

so key j is transported to query i by Rot(theta_j - theta_i) = the product of the per-token steps
Rot(-omega_t) along the route t in (j, i] (the seed's "route transport" P_{j->i}; the issue writes it
R(theta_i - theta_j) with R the transposed convention). With ``rotate_values`` the values take the same
route: o_i = sum_j a_ij Rot(theta_j - theta_i) v_j, computed as Rot(-theta_i) sum_j a_ij Rot(theta_j) v_j.

Angles: omega_t = base + spread * eps_t. ``base`` is RoPE's frequency of each plane (theta^(-2p/D)) by
default, so spread = 0 gives RoPE exactly (accumulating a constant step is indexing by position), or 0.
The spread sets the mixing window: over a route of d tokens the random part of the angle is
N(0, spread^2 d), so E cos(theta_i - theta_j - d base) = exp(-spread^2 d / 2), which falls to 1/e at
d = 2 / spread^2 tokens. The default ``acc_rot_spread = 0.25`` rad gives a 32-token window (measured on
:class:`RandomAngles`, 4 heads x 32 planes x 2K positions: E cos = 0.97 at d = 1, 0.61 at 16, 0.37 at
32, 0.14 at 64, 0.01 at 128, each within 0.01 of the formula); the old default 1.0 (still what configs
saved before ``options_version`` get) mixed within about 2 tokens (0.61 at d = 1, 0.14 at 4, 0 at 16),
too local for seed 004's near/far mechanism.

``acc_rot_mode = "random"``: eps_t ~ N(0, 1) i.i.d. per (token position, head, plane), drawn from a
generator seeded by (acc_rot_seed, layer, block of 4096 positions), so every position has the same
angle whatever the chunking. ``"learned"``: eps_t = W x_t, a learned linear map of the layer's input
(token-dependent rotations), W initialised to zero.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .cache import cache_states
from .options import Opt
from .variants import AttentionVariant, AttnContext, register_variant

TWO_PI = 2 * math.pi


def rotate(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Rot(theta) x per plane (half-split layout). x: [B, H, T, D]; theta: [B, H, T, D/2] radians
    (float64 is cast to x's dtype after cos/sin). Returns [B, H, T, D]."""
    cos, sin = torch.cos(theta).to(x.dtype), torch.sin(theta).to(x.dtype)
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RandomAngles:
    """Accumulated i.i.d. angles theta_t for any positions, without storing a table of all of them.

    theta(pos) for pos [B, T] returns [B, H, T, P] float64 in [0, 2 pi). Increments are drawn per
    block of ``block`` positions from a generator seeded by (seed, layer, block); the angle at the start
    of each block is kept (one [H, P] row per block), so memory is O(T / block).
    """

    def __init__(self, n_heads: int, planes: int, base: torch.Tensor, spread: float, seed: int, layer: int,
                 block: int = 4096):
        self.h, self.p, self.base, self.spread = n_heads, planes, base.double(), float(spread)
        self.seed, self.layer, self.block = seed, layer, block
        self.starts = [torch.zeros(n_heads, planes, dtype=torch.float64, device="cpu")]  # theta before block b

    def _omega(self, b: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed, self.layer, b)) & 0x7FFFFFFFFFFFFFFF)
        eps = torch.randn(self.block, self.h, self.p, dtype=torch.float64, generator=g, device="cpu")
        return self.base[None, None, :] + self.spread * eps  # [block, H, P]

    def _block_theta(self, b: int) -> torch.Tensor:
        while len(self.starts) <= b:
            k = len(self.starts) - 1
            self.starts.append(torch.remainder(self.starts[k] + self._omega(k).sum(0), TWO_PI))
        return torch.remainder(self.starts[b][None] + torch.cumsum(self._omega(b), 0), TWO_PI)  # [block, H, P]

    def theta(self, pos: torch.Tensor) -> torch.Tensor:
        flat = pos.reshape(-1).cpu()
        out = torch.empty(flat.numel(), self.h, self.p, dtype=torch.float64, device="cpu")
        blocks = torch.div(flat, self.block, rounding_mode="floor")
        for b in blocks.unique().tolist():
            sel = blocks == b
            out[sel] = self._block_theta(int(b))[flat[sel] - b * self.block]
        return out.view(*pos.shape, self.h, self.p).permute(0, 2, 1, 3).to(pos.device)


@register_variant("acc_rot")
class AccumulatedRotation(AttentionVariant):
    """Accumulated SO(2) rotations of q and k (and optionally v) along the route (seed 004).

    ``variant_options``: ``acc_rot_mode`` "random" (default) or "learned"; ``acc_rot_spread`` (default
    0.25 rad, a 32-token mixing window; 1.0 for configs saved before ``options_version``): std of the
    random increments, or the scale of the learned map's output; ``acc_rot_base``
    "rope" (default) or "zero"; ``acc_rot_seed`` (default 0); ``rotate_values`` (default False).
    Learned mode keeps the last accumulated angle of each row in the cache's per-layer state.
    """

    summary = "accumulated per-token SO(2) rotations (random or learned), optional value transport"

    option_schema = {
        "acc_rot_mode": Opt(str, "random", "random or learned increments", ("random", "learned")),
        # 1.0 rad for version 1 configs, 0.25 rad (a 32-token window) from version 2
        "acc_rot_spread": Opt(float, 0.25, "std of the random increments / scale of the learned map (rad)",
                              legacy={1: 1.0}),
        "acc_rot_base": Opt(str, "rope", "base frequencies", ("rope", "zero")),
        "acc_rot_seed": Opt(int, 0, "seed of the random increments"),
        "rotate_values": Opt(bool, False, "transport values too")}

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        o = self.option_values(config)
        self.mode = o["acc_rot_mode"]
        if self.mode not in ("random", "learned"):
            raise ValueError(f"acc_rot_mode must be 'random' or 'learned', got {self.mode!r}")
        self.spread = float(o["acc_rot_spread"])
        self.rotate_values = bool(o["rotate_values"])
        P = self.head_dim // 2
        if o["acc_rot_base"] == "rope":
            # explicit device: from_pretrained builds modules under a meta-device context
            base = config.rope_theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64, device="cpu")
                                         / self.head_dim)
        else:
            base = torch.zeros(P, dtype=torch.float64, device="cpu")
        self._base = base[:P].clone()  # kept off-device and out of the state dict (meta-safe)
        if self.mode == "learned":
            self.angle_proj = nn.Linear(config.hidden_size, self.n_heads * P, bias=False)
            self.angle_proj._lctx_zero_init = True  # starts as fixed-step rotations (see _init_weights)
        else:
            self.random = RandomAngles(self.n_heads, P, self._base, self.spread,
                                       int(o["acc_rot_seed"]), layer_idx)

    def angles(self, ctx: AttnContext, x: torch.Tensor | None, T: int) -> torch.Tensor:
        """theta of the T new tokens, [B, H, T, P] float64."""
        if self.mode == "random":
            return self.random.theta(ctx.q_pos)
        B = ctx.q_pos.shape[0]
        omega = self._base.to(x.device)[None, None, None, :] + self.spread * self.angle_proj(x).double().view(
            B, T, self.n_heads, -1).permute(0, 2, 1, 3)
        valid = ctx.key_valid[:, -T:] if ctx.key_valid is not None else torch.ones(B, T, dtype=torch.bool)
        omega = omega * valid.to(x.device)[:, None, :, None]  # padding tokens do not turn the route
        state = cache_states(ctx.cache).get(self.layer_idx) if ctx.cache is not None else None
        start = state["theta_last"] if state is not None else torch.zeros_like(omega[:, :, 0])
        theta = torch.remainder(start[:, :, None] + torch.cumsum(omega, dim=2), TWO_PI)
        if ctx.cache is not None:
            cache_states(ctx.cache)[self.layer_idx] = {"theta_last": theta[:, :, -1]}
        return theta

    def forward(self, q, k, v, ctx: AttnContext, x=None):
        theta = self.angles(ctx, x, q.shape[2])
        q, k = rotate(q, theta), rotate(k, theta)
        if self.rotate_values:
            v = rotate(v, theta)
        if ctx.cache is not None:
            k, v = ctx.cache.update(k, v, self.layer_idx)
        out = self.attend(q, k, v, ctx)
        return rotate(out, -theta) if self.rotate_values else out
