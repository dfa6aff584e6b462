"""Accumulated SO(2) rotations (seed 004): constant step = RoPE, value transport, chunk-independent angles."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import LctxForCausalLM, get_variant
from lctx.models.rotations import RandomAngles, rotate
from lctx.models.variants import AttnContext

from helpers import tiny_config


def copy_weights(dst, src):
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    assert all("angle_proj" in n for n in missing + unexpected)
    return dst


def test_constant_angle_equals_rope():
    # spread 0: omega_t = RoPE's frequency of each plane, theta_t = (t + 1) * freq; scores depend on
    # theta_i - theta_j = (i - j) * freq, exactly RoPE's.
    torch.manual_seed(0)
    rope = LctxForCausalLM(tiny_config("rope")).eval()
    acc = copy_weights(LctxForCausalLM(tiny_config("acc_rot", variant_options={"acc_rot_spread": 0.0})), rope).eval()
    ids = torch.randint(0, 400, (2, 40))
    assert torch.allclose(acc(ids).logits, rope(ids).logits, atol=1e-4)
    noisy = copy_weights(LctxForCausalLM(tiny_config("acc_rot", variant_options={"acc_rot_spread": 0.5})), rope).eval()
    assert not torch.allclose(noisy(ids).logits, rope(ids).logits, atol=1e-3)


def plane_rotation(theta: torch.Tensor, D: int) -> torch.Tensor:
    """Explicit [D, D] matrix of Rot(theta) (half-split planes), theta [D/2]."""
    R = torch.zeros(D, D, dtype=torch.float64)
    P = D // 2
    for p in range(P):
        c, s = math.cos(theta[p]), math.sin(theta[p])
        R[p, p], R[p, p + P], R[p + P, p], R[p + P, p + P] = c, -s, s, c
    return R


def test_rotate_matches_explicit_matrix():
    x = torch.randn(1, 1, 1, 6, dtype=torch.float64)
    th = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
    assert torch.allclose(rotate(x, th[None, None, None]), (plane_rotation(th, 6) @ x[0, 0, 0])[None, None, None])


def test_value_transport_equals_direct_sum():
    # o_i = sum_j a_ij Rot(theta_j - theta_i) v_j, brute force with explicit matrices.
    torch.manual_seed(0)
    cfg = tiny_config("acc_rot", attn_impl="reference",
                      variant_options={"rotate_values": True, "acc_rot_spread": 0.7, "acc_rot_seed": 3})
    var = get_variant("acc_rot")(cfg, 0)
    B, H, T, D = 1, 4, 9, 8
    q, k, v = torch.randn(3, B, H, T, D, dtype=torch.float64).unbind(0)
    pos = torch.arange(T)[None]
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]
    ctx = AttnContext(q_pos=pos, k_pos=pos, allowed=allowed)
    out = var(q, k, v, ctx)
    theta = var.random.theta(pos)[0]  # [H, T, P]
    for h in range(H):
        R = [plane_rotation(theta[h, t], D) for t in range(T)]
        for i in range(T):
            s = torch.tensor([q[0, h, i] @ (R[i].T @ R[j]) @ k[0, h, j] / math.sqrt(D) for j in range(i + 1)])
            a = torch.softmax(s, 0)
            want = sum(a[j] * (R[i].T @ R[j]) @ v[0, h, j] for j in range(i + 1))
            assert torch.allclose(out[0, h, i], want, atol=1e-5)  # the reference softmax runs in float32


def test_random_angles_do_not_depend_on_chunking():
    ra = RandomAngles(2, 3, torch.zeros(3), spread=1.0, seed=5, layer=1, block=16)
    full = ra.theta(torch.arange(50)[None])
    parts = torch.cat([RandomAngles(2, 3, torch.zeros(3), 1.0, 5, 1, 16).theta(torch.arange(a, b)[None])
                       for a, b in ((0, 7), (7, 33), (33, 50))], dim=2)
    assert torch.allclose(full, parts)
    # accumulation: theta_t - theta_{t-1} = omega_t, a non-constant step
    steps = torch.remainder(full[0, 0, 1:] - full[0, 0, :-1], 2 * math.pi)
    assert steps.std() > 0.1


@pytest.mark.parametrize("opts", [{"acc_rot_mode": "learned"}, {"acc_rot_mode": "learned", "rotate_values": True},
                                  {"rotate_values": True}])
def test_prefill_equals_decode_for_options(opts):
    torch.manual_seed(0)
    m = LctxForCausalLM(tiny_config("acc_rot", variant_options=opts)).eval()
    if "learned" in opts.values():
        with torch.no_grad():
            for blk in m.model.layers:
                blk.attn.variant.angle_proj.weight.normal_(0, 0.5)
    ids = torch.randint(0, 400, (2, 20))
    full = m(ids).logits
    out = m(ids[:, :13], use_cache=True)
    steps, cache = [out.logits], out.cache
    for t in range(13, 20):
        out = m(ids[:, t : t + 1], cache=cache)
        steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


def test_learned_rotation_gets_gradients_and_starts_at_zero_map():
    torch.manual_seed(0)
    m = LctxForCausalLM(tiny_config("acc_rot", variant_options={"acc_rot_mode": "learned"}))
    proj = m.model.layers[0].attn.variant.angle_proj
    assert torch.count_nonzero(proj.weight) == 0  # zero init survives post_init
    ids = torch.randint(0, 400, (2, 16))
    m(ids, labels=ids).loss.backward()
    assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_learned_padding_does_not_turn_the_route():
    torch.manual_seed(0)
    m = LctxForCausalLM(tiny_config("acc_rot", variant_options={"acc_rot_mode": "learned"})).eval()
    with torch.no_grad():
        for blk in m.model.layers:
            blk.attn.variant.angle_proj.weight.normal_(0, 0.5)
    a = torch.randint(3, 400, (1, 8))
    batch = torch.cat([torch.zeros(1, 4, dtype=torch.long), a], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)], 1)
    assert torch.allclose(m(batch, attention_mask=mask).logits[0, 4:], m(a).logits[0], atol=1e-5)


@pytest.mark.parametrize("spread,d,want", [
    (1.0, 1, 0.61), (1.0, 4, 0.14), (1.0, 16, 0.0),  # issue 12's numbers for the old default: a 2-token window
    (0.25, 1, 0.969), (0.25, 16, 0.607), (0.25, 32, 0.368), (0.25, 64, 0.135),  # exp(-spread^2 d / 2)
])
def test_mixing_window_of_random_rotations(spread, d, want):
    # E cos(theta_i - theta_{i-d}) of the random part (base 0): the sum of d N(0, spread^2) steps has
    # characteristic function exp(-spread^2 d / 2) (hand computation), measured over 4 x 32 x 2K samples
    ra = RandomAngles(4, 32, torch.zeros(32), spread=spread, seed=0, layer=0)
    th = ra.theta(torch.arange(2048)[None])[0]
    assert torch.cos(th[:, d:] - th[:, :-d]).mean().item() == pytest.approx(want, abs=0.015)


def test_default_spread_is_recorded_and_legacy_keeps_one():
    from lctx.models import LctxConfig

    cfg = tiny_config("acc_rot")
    assert cfg.variant_options["acc_rot_spread"] == 0.25  # 2 / 0.25^2 = 32-token window
    assert get_variant("acc_rot")(cfg, 0).spread == 0.25
    old = LctxConfig.from_dict({**{k: v for k, v in cfg.to_dict().items() if k != "options_version"},
                                "variant_options": {}})
    assert old.options_version == 1 and old.variant_options["acc_rot_spread"] == 1.0
