"""PaTH attention (seed 004 / arXiv 2505.16381): the block (UT) reference against the definition (explicit
per-pair products of Householder matrices), fla's naive reference when importable, identities (beta = 0
is NoPE, beta = 2 with a fixed direction is a parity rule), KV-cache, chunking, padding, rewind, gradients,
save/load."""

from __future__ import annotations

import math

import pytest
import torch

from lctx.models import LctxForCausalLM
from lctx.models.path import PaTH, l2_normalize, path_attention
from lctx.models.variants import AttnContext, reference_attention

from helpers import tiny_config

OPTION_SETS = {
    "default": {},
    "forget_gate": {"path_forget_gate": True},
    "full_rank_no_conv": {"path_w_rank": 0, "path_conv_size": 0},
}


def causal(B, T, Tp=0):
    """allowed [B, 1, T, Tp + T] for T new queries after Tp past keys, no padding."""
    return torch.ones(T, Tp + T, dtype=torch.bool).tril(Tp)[None, None].expand(B, 1, T, Tp + T)


def random_inputs(B=2, H=3, T=29, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, w = torch.randn(4, B, H, T, D, generator=g, dtype=torch.float64).unbind(0)
    beta = 2 * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, H, T, generator=g, dtype=torch.float64) + 2)
    return q, k, v, l2_normalize(w), beta, log_f


def brute_force(q, k, v, w, beta, log_f=None):
    """The definition: s_ij = (q_i^T H_i H_{i-1} ... H_{j+1} k_j + sum_{t in (j, i]} log f_t) / sqrt(D) with
    explicit D x D matrices H_t = I - beta_t w_t w_t^T, then a causal softmax. O(T^2 D^3); float64."""
    B, H, T, D = q.shape
    out = torch.empty_like(q)
    eye = torch.eye(D, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            s = torch.full((T, T), float("-inf"), dtype=q.dtype)
            for i in range(T):
                P = eye.clone()  # P = H_i ... H_{j+1}, grown leftwards as j decreases
                for j in range(i, -1, -1):
                    s[i, j] = q[b, h, i] @ P @ k[b, h, j]
                    if log_f is not None:
                        s[i, j] += log_f[b, h, j + 1 : i + 1].sum()
                    P = P @ (eye - beta[b, h, j] * torch.outer(w[b, h, j], w[b, h, j]))
            out[b, h] = torch.softmax(s / math.sqrt(D), -1) @ v[b, h]
    return out


@pytest.mark.parametrize("gate", [False, True])
def test_reference_equals_explicit_householder_products(gate):
    q, k, v, w, beta, log_f = random_inputs()
    lf = log_f if gate else None
    want = brute_force(q, k, v, w, beta, lf)
    T = q.shape[2]
    for block in (1, 5, 64):  # one block per token, several blocks, one block
        got, _, _ = path_attention(q, k, v, w, beta, causal(2, T), log_f=lf, block=block)
        assert torch.allclose(got, want, atol=1e-10), block
    # the same through a "cache": 11 tokens, then the rest with the keys transported so far
    n = 11
    o1, keys, gate_state = path_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], w[:, :, :n], beta[..., :n],
                                          causal(2, n), log_f=None if lf is None else lf[..., :n], block=4)
    o2, _, _ = path_attention(q[:, :, n:], k[:, :, n:], v, w[:, :, n:], beta[..., n:], causal(2, T - n, n),
                              past_keys=keys, log_f=None if lf is None else lf[..., n:], past_gate=gate_state,
                              block=4)
    assert torch.allclose(torch.cat([o1, o2], 2), want, atol=1e-10)


def test_transported_keys_are_the_product_applied_to_each_key():
    q, k, v, w, beta, _ = random_inputs(B=1, H=1, T=9, D=4)
    _, keys, _ = path_attention(q, k, v, w, beta, causal(1, 9), block=4)
    eye = torch.eye(4, dtype=torch.float64)
    for j in range(9):
        x = k[0, 0, j]
        for t in range(j + 1, 9):  # k_j <- H_t k_j for every later token
            x = (eye - beta[0, 0, t] * torch.outer(w[0, 0, t], w[0, 0, t])) @ x
        assert torch.allclose(keys[0, 0, j], x, atol=1e-12)


def test_matches_fla_naive_reference():
    # fla-core's plain PyTorch reference (fla/ops/path_attn/naive.py) runs on CPU when fla and einops
    # are importable; lctx does not depend on them, so this skips otherwise.
    fla_path = pytest.importorskip("fla.ops.path_attn", exc_type=ImportError)
    q, k, v, w, beta, log_f = random_inputs(T=45, D=16)
    bt = lambda x: x.transpose(1, 2)  # noqa: E731  fla's layout [B, T, H, ...]
    ours, _, _ = path_attention(q, k, v, w, beta, causal(2, 45), log_f=log_f, block=8)
    theirs = bt(fla_path.naive_path_attn(bt(q), bt(k), bt(v), bt(w), bt(beta), bt(log_f), 16 ** -0.5,
                                         chunk_size=16))
    assert torch.allclose(ours, theirs.double(), atol=1e-5)  # fla's naive computes in float32


def test_beta_zero_is_nope_attention():
    q, k, v, w, _, _ = random_inputs()
    allowed = causal(2, q.shape[2])
    got, keys, _ = path_attention(q, k, v, w, torch.zeros(2, 3, q.shape[2], dtype=torch.float64), allowed)
    assert torch.allclose(got, reference_attention(q, k, v, allowed).double(), atol=1e-6)
    assert torch.equal(keys, k)  # identity transforms leave the keys where they were


def test_reflection_with_fixed_direction_depends_on_parity():
    # beta = 2 and w_t = u for all t: H = I - 2uu^T is a reflection, H^2 = I, so
    # s_ij = q_i^T k_j for even i - j and q_i^T H k_j for odd i - j (hand rule, no library code).
    B, H, T, D = 1, 1, 6, 4
    q, k, v, _, _, _ = random_inputs(B, H, T, D)
    u = l2_normalize(torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=torch.float64))
    w = u.expand(B, H, T, D)
    refl = torch.eye(D, dtype=torch.float64) - 2 * torch.outer(u, u)
    s = torch.full((T, T), float("-inf"), dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            s[i, j] = q[0, 0, i] @ (refl if (i - j) % 2 else torch.eye(D, dtype=torch.float64)) @ k[0, 0, j]
    want = torch.softmax(s / 2.0, -1) @ v[0, 0]
    got, _, _ = path_attention(q, k, v, w, torch.full((B, H, T), 2.0, dtype=torch.float64), causal(B, T), block=4)
    assert torch.allclose(got[0, 0], want, atol=1e-10)


def test_model_with_identity_transforms_equals_nope_model():
    torch.manual_seed(0)
    nope = LctxForCausalLM(tiny_config("nope")).eval()
    path = LctxForCausalLM(tiny_config("path")).eval()
    missing, unexpected = path.load_state_dict(nope.state_dict(), strict=False)
    assert not unexpected and all(".variant." in n for n in missing)
    ids = torch.randint(0, 400, (2, 30))
    assert not torch.allclose(path(ids).logits, nope(ids).logits, atol=1e-3)
    with torch.no_grad():
        for blk in path.model.layers:
            blk.attn.variant.beta_proj.weight.zero_()
            blk.attn.variant.beta_proj.bias.fill_(-200.0)  # beta = 2 sigmoid(-200) ~ 3e-87
    assert torch.allclose(path(ids).logits, nope(ids).logits, atol=1e-5)


def make_model(opts, **kw):
    torch.manual_seed(0)
    return LctxForCausalLM(tiny_config("path", variant_options=dict(opts), **kw)).eval()


@pytest.mark.slow
@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_prefill_equals_prefill_plus_decode_and_chunks(opts):
    model = make_model({**OPTION_SETS[opts], "path_block": 4})  # several reference blocks per chunk
    ids = torch.randint(0, 400, (2, 26))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :19], use_cache=True)
        cache, steps = out.cache, [out.logits]
        for t in range(19, 26):
            steps.append(model(ids[:, t : t + 1], cache=cache).logits)
        assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
        out = model(ids[:, :7], use_cache=True)  # uneven chunks: 7, 10, 9
        cache, parts = out.cache, [out.logits]
        for s, e in ((7, 17), (17, 26)):
            parts.append(model(ids[:, s:e], cache=cache).logits)
        assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("opts", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_left_padding_is_identity_in_prefill_and_decode(opts):
    model = make_model(OPTION_SETS[opts])
    a, b = torch.randint(3, 400, (1, 12)), torch.randint(3, 400, (1, 7))
    batch = torch.zeros(2, 12, dtype=torch.long)
    mask = torch.zeros(2, 12, dtype=torch.long)
    batch[0], mask[0] = a[0], 1
    batch[1, 5:], mask[1, 5:] = b[0], 1  # five left-padding tokens
    nxt = torch.randint(3, 400, (2, 3))
    with torch.no_grad():
        out = model(batch, attention_mask=mask, use_cache=True)
        assert torch.allclose(out.logits[0], model(a).logits[0], atol=1e-5)
        assert torch.allclose(out.logits[1, 5:], model(b).logits[0], atol=1e-5)
        cache, m = out.cache, mask
        for t in range(3):  # decode through the padded cache
            m = torch.cat([m, torch.ones(2, 1, dtype=torch.long)], 1)
            step = model(nxt[:, t : t + 1], attention_mask=m, cache=cache).logits
            ref_a = model(torch.cat([a, nxt[:1, : t + 1]], 1)).logits[0, -1]
            ref_b = model(torch.cat([b, nxt[1:, : t + 1]], 1)).logits[0, -1]
            assert torch.allclose(step[0, 0], ref_a, atol=1e-5)
            assert torch.allclose(step[1, 0], ref_b, atol=1e-5)


def test_harness_rewind_restores_the_post_prompt_state():
    # HFAdapter.prefill (chunked) -> greedy (extends the cache) -> score_continuation (rewinds: the KV part is
    # cropped and the transported keys come back from the post-prompt snapshot) equals a fresh forward.
    from lctx.models.adapters.hf import HFAdapter

    model = make_model({"path_forget_gate": True})
    lm = HFAdapter(model=model, tokenizer=None, name="path", path="", variant="path", train_length=64, max_length=None,
            device=torch.device("cpu"), dtype=torch.float32, chunk_size=8)
    prompt, cont = torch.randint(3, 400, (21,)).tolist(), torch.randint(3, 400, (4,)).tolist()
    prefix, _ = lm.prefill(prompt)
    assert prefix.states is not None and set(prefix.states[0]) == {"keys", "conv", "gate"}
    lm.greedy(prefix, 5, stop_ids=set())
    logprob = torch.tensor(lm.score_continuation(prefix, cont).logprobs, dtype=torch.float64)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + cont])).logits[0, len(prompt) - 1 : -1].double()
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont)[:, None])[:, 0]
    assert torch.allclose(logprob, want, atol=1e-5)


def test_cropping_without_restoring_the_state_is_an_error():
    model = make_model({})
    with torch.no_grad():
        out = model(torch.randint(3, 400, (1, 10)), use_cache=True)
        out.cache.crop(-2)
        out.cache.lctx_length = 8
        with pytest.raises(RuntimeError, match="lctx_states"):
            model(torch.randint(3, 400, (1, 1)), cache=out.cache)


def test_gradients_reach_w_beta_and_gate_parameters():
    model = make_model({"path_forget_gate": True})
    model.train()
    ids = torch.randint(0, 400, (2, 16))
    model(ids, labels=ids).loss.backward()
    names = [n for n, _ in model.named_parameters() if ".variant." in n]
    assert {n.split(".variant.")[1].split(".")[0] for n in names} == {"w_proj", "w_conv", "beta_proj", "gate_proj"}
    for n, p in model.named_parameters():
        if n in names:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
    assert model.variant_parameter_count() == sum(p.numel() for n, p in model.named_parameters() if n in names)


def test_save_load_round_trip_keeps_options(tmp_path):
    from transformers import AutoModelForCausalLM

    model = make_model({"path_forget_gate": True, "path_w_rank": 8})
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    var = loaded.model.layers[1].attn.variant
    assert isinstance(var, PaTH) and var.forget_gate and var.w_proj[0].out_features == 8
    ids = torch.randint(0, 400, (2, 17))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)  # bit-exact: same weights, same kernels, one process


def test_transforms_are_in_range_and_padding_is_identity():
    var = PaTH(tiny_config("path"), 0)
    x = torch.randn(2, 6, 32)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, :2] = False
    w, beta, log_f, window = var.transforms(x, valid, None)
    assert w.shape == (2, 4, 6, 8) and beta.shape == (2, 4, 6) and log_f is None and window.shape == (2, 32, 2)
    assert torch.allclose(w[0].norm(dim=-1), torch.ones(4, 6), atol=1e-3)
    assert ((beta[0] > 0) & (beta[0] < 2)).all()
    assert (beta[1, :, :2] == 0).all() and (w[1, :, :2] == 0).all()


def test_errors():
    cfg = tiny_config("path")
    var = PaTH(cfg, 0)
    q = torch.randn(1, 4, 3, 8)
    pos = torch.arange(3)[None]
    ctx = AttnContext(q_pos=pos, k_pos=pos, allowed=causal(1, 3))
    with pytest.raises(ValueError, match="layer input x"):
        var(q, q, q, ctx)
    assert var(q, q, q, ctx, torch.randn(1, 3, 32)).shape == q.shape
    with pytest.raises(ValueError, match="path_block"):
        PaTH(tiny_config("path", variant_options={"path_block": 0}), 0)
    with pytest.raises(ValueError, match="block"):
        path_attention(q, q, q, q, torch.ones(1, 4, 3), causal(1, 3), block=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's Triton kernel needs a CUDA GPU")
@pytest.mark.parametrize("gate", [False, True])
def test_fla_fast_path_matches_reference_on_gpu(gate):
    pytest.importorskip("fla.ops.path_attn", exc_type=ImportError)
    torch.manual_seed(0)
    cfg = dict(hidden_size=256, num_attention_heads=4, variant_options={"path_forget_gate": gate})  # D = 64
    ref = LctxForCausalLM(tiny_config("path", attn_impl="reference", **cfg)).cuda().eval()
    fast = LctxForCausalLM(tiny_config("path", attn_impl="sdpa", **cfg)).cuda().eval()
    fast.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 400, (2, 300), device="cuda")
    with torch.no_grad():
        assert torch.allclose(ref(ids).logits, fast(ids).logits, atol=2e-2)
        out = fast(ids[:, :250], use_cache=True)  # the kernel's transported keys feed the decode steps
        steps = [out.logits[:, -1:]] + [fast(ids[:, t : t + 1], cache=out.cache).logits for t in range(250, 299)]
        assert torch.allclose(torch.cat(steps, 1), ref(ids).logits[:, 249:], atol=2e-2)
