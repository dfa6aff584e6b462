"""lctx.kernels.interdomain_scan: the Triton chunked scans of interdomain / s4d against the PyTorch chunked
and recurrent forms of lctx.models.interdomain (the references), on CPU under the Triton interpreter in
float32 at small sizes; the model's attn_impl="fast" dispatch; and a bf16 CUDA check that skips without a GPU.

The kernels are jitted on first use for the mode TRITON_INTERPRET selects at that moment (see the kernel
module's docstring), so setting the variable per test with monkeypatch works even when another test module
imported triton first; ``interp`` checks that the kernel really is an interpreted one.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny_config
from lctx import kernels
from lctx.kernels import interdomain_scan as ids
from lctx.models import LctxForCausalLM
from lctx.models.interdomain import (
    interdomain_chunked,
    interdomain_recurrent,
    interdomain_state,
    s4d_chunked,
    s4d_recurrent,
    zoh,
)

pytest.importorskip("triton")

RTOL = 1e-4  # relative to the largest reference value (float32 kernels vs float32 references)


@pytest.fixture
def interp(monkeypatch):
    """Run the Triton kernels in the interpreter (CPU, numpy) for this test."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from triton.runtime.interpreter import InterpretedFunction

    assert isinstance(ids._kernel(ids._interdomain_fwd), InterpretedFunction)
    assert isinstance(ids._kernel(ids._s4d_fwd), InterpretedFunction)
    assert kernels.triton_runs("cpu")


def _ssm(shape, n, seed=0, with_b=True):
    """A random stable S4D system (spread-out step sizes and frequencies, complex B), as in test_interdomain."""
    g = torch.Generator().manual_seed(seed)
    log_dt = torch.randn(shape, generator=g) * 0.5 - 2.0
    log_a_real = torch.randn(*shape, n, generator=g) * 0.3 + math.log(0.5)
    a_imag = torch.randn(*shape, n, generator=g) * 3
    b = torch.complex(torch.randn(*shape, n, generator=g), torch.randn(*shape, n, generator=g)) if with_b else None
    return zoh(log_dt, log_a_real, a_imag, b)


def _rand_state(B, H, N, D, normalized, seed):
    """A non-zero starting state (as after an earlier prefill)."""
    g = torch.Generator().manual_seed(seed)
    st = interdomain_state(B, H, N, D, normalized, "cpu")
    return {k: torch.complex(torch.randn(v.shape, generator=g), torch.randn(v.shape, generator=g)) * 0.3
            for k, v in st.items()}


def _rel(x, ref):
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def _close(x, ref, rtol=RTOL):
    assert _rel(x, ref) <= rtol, f"max abs err {(x - ref).abs().max().item():.3g} vs max {ref.abs().max().item():.3g}"


# ---- interdomain -----------------------------------------------------------------------------------

# (T, chunk, normalized, conj): lengths around the chunk sizes, each readout and chunk size covered
ID_CASES = [(1, 16, False, True), (17, 16, True, True), (64, 32, False, True), (127, 64, True, False),
            (128, 32, False, False), (129, 64, False, True), (257, 64, True, True)]


@pytest.mark.parametrize("T,chunk,normalized,conj", ID_CASES)
def test_interdomain_scan_equals_chunked_and_recurrent(interp, T, chunk, normalized, conj):
    B, H, D, N = 1, 3, 12, 6  # odd head count, head dim and mode count not powers of two (masked lanes)
    g = torch.Generator().manual_seed(T)
    fq, kt, vt = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    dt_a, bbar = _ssm((H,), N, seed=T)
    st0 = _rand_state(B, H, N, D, normalized, seed=T)
    eps = 1.0 if normalized else 1e-2  # well-conditioned denominator for a float32 comparison (test_interdomain)
    m = torch.ones(B, T, dtype=torch.bool)
    o, st = ids.interdomain_scan_triton(fq, kt, vt, dt_a, bbar, st0, conj, eps, chunk=chunk)
    o_chk, st_chk = interdomain_chunked(fq, kt, vt, m, dt_a, bbar, st0, 7, conj, eps)
    o_rec, st_rec = interdomain_recurrent(fq, kt, vt, m, dt_a, bbar, st0, conj, eps)
    assert set(st) == set(st_chk)
    _close(o, o_chk)
    _close(o, o_rec)
    for name in st:
        _close(st[name], st_chk[name])
        _close(st[name], st_rec[name])
    assert torch.equal(st0["U"], _rand_state(B, H, N, D, normalized, seed=T)["U"])  # input state untouched


@pytest.mark.parametrize("normalized", [False, True])
def test_interdomain_mode_groups_sum_to_the_same(interp, normalized):
    # N = 6 modes split over programs of 2 (3 programs per head, outputs summed with atomics) and of 4
    # (the last program half empty) give the one-program result
    B, H, T, D, N = 2, 1, 20, 8, 6
    g = torch.Generator().manual_seed(5)
    fq, kt, vt = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    dt_a, bbar = _ssm((H,), N, seed=5)
    st0 = _rand_state(B, H, N, D, normalized, seed=5)
    o1, s1 = ids.interdomain_scan_triton(fq, kt, vt, dt_a, bbar, st0, eta_eps=1.0, chunk=16, block_n=8)
    for bn in (2, 4):
        o, s = ids.interdomain_scan_triton(fq, kt, vt, dt_a, bbar, st0, eta_eps=1.0, chunk=16, block_n=bn)
        _close(o, o1)
        for name in s:
            _close(s[name], s1[name])


@pytest.mark.parametrize("normalized", [False, True])
def test_interdomain_prefill_prefill_decode_equals_one_call(interp, normalized):
    # state carried across calls: scan(40) -> scan(50) -> 3 decode steps equals one reference pass of 93 tokens
    B, H, D, N, T = 1, 3, 8, 4, 93
    g = torch.Generator().manual_seed(7)
    fq, kt, vt = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    dt_a, bbar = _ssm((H,), N, seed=7)
    eps = 1.0 if normalized else 1e-2
    st = interdomain_state(B, H, N, D, normalized, "cpu")
    ref, st_ref = interdomain_chunked(fq, kt, vt, torch.ones(B, T, dtype=torch.bool), dt_a, bbar, st, 64, True, eps)
    outs = []
    for a, e in ((0, 40), (40, 90)):
        o, st = ids.interdomain_scan_triton(fq[:, :, a:e], kt[:, :, a:e], vt[:, :, a:e], dt_a, bbar, st,
                                            eta_eps=eps, chunk=32)
        outs.append(o)
    for t in range(90, T):
        o, st = ids.interdomain_decode_step(fq[:, :, t:t + 1], kt[:, :, t:t + 1], vt[:, :, t:t + 1], dt_a, bbar, st,
                                            eta_eps=eps)
        outs.append(o)
    _close(torch.cat(outs, 2), ref)
    for name in st:
        _close(st[name], st_ref[name])


@pytest.mark.parametrize("conj", [True, False])
def test_interdomain_decode_step_equals_recurrent(conj):
    # plain PyTorch, no interpreter: the fast decode step is the recurrent form with m = 1
    B, H, D, N = 2, 3, 5, 6
    g = torch.Generator().manual_seed(11)
    fq, kt, vt = (torch.randn(B, H, 1, D, generator=g) for _ in range(3))
    dt_a, bbar = _ssm((H,), N, seed=11)
    st0 = _rand_state(B, H, N, D, True, seed=11)
    o, st = ids.interdomain_decode_step(fq, kt, vt, dt_a, bbar, st0, conj, 0.5)
    o_ref, st_ref = interdomain_recurrent(fq, kt, vt, torch.ones(B, 1, dtype=torch.bool), dt_a, bbar, st0, conj, 0.5)
    _close(o, o_ref, 1e-5)
    for name in st:
        _close(st[name], st_ref[name], 1e-5)
    with pytest.raises(ValueError, match="one token"):
        ids.interdomain_decode_step(fq.expand(B, H, 2, D), kt, vt, dt_a, bbar, st0)


def test_interdomain_scan_rejects_bad_arguments(interp):
    B, H, T, D, N = 1, 2, 8, 4, 3
    x = torch.randn(B, H, T, D)
    dt_a, bbar = _ssm((H,), N)
    st = interdomain_state(B, H, N, D, False, "cpu")
    with pytest.raises(ValueError, match="power of two"):
        ids.interdomain_scan_triton(x, x, x, dt_a, bbar, st, chunk=24)
    with pytest.raises(ValueError, match="shapes"):
        ids.interdomain_scan_triton(x, x[..., :3], x, dt_a, bbar, st)


def test_scans_refuse_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.randn(1, 1, 4, 4)
    dt_a, bbar = _ssm((1,), 2)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        ids.interdomain_scan_triton(x, x, x, dt_a, bbar, interdomain_state(1, 1, 2, 4, False, "cpu"))


# ---- s4d --------------------------------------------------------------------------------------------

S4D_CASES = [(1, 16, 4), (17, 16, 8), (64, 32, 16), (127, 64, 16), (128, 32, 8), (129, 64, 8), (257, 64, 16)]


def _s4d_system(H, D, N, seed):
    dt_a, bbar = _ssm((H, D), N, seed=seed, with_b=False)
    g = torch.Generator().manual_seed(seed + 1)
    c = torch.complex(torch.randn(H, D, N, generator=g), torch.randn(H, D, N, generator=g))
    return dt_a, bbar, c, torch.randn(H, D, generator=g)


@pytest.mark.parametrize("T,chunk,block_d", S4D_CASES)
def test_s4d_scan_equals_chunked_and_recurrent(interp, T, chunk, block_d):
    B, H, D, N = 1, 3, 12, 6  # D = 12 with blocks of 8 / 16: a partly empty channel block
    g = torch.Generator().manual_seed(T)
    u = torch.randn(B, H, T, D, generator=g)
    dt_a, bbar, c, d_skip = _s4d_system(H, D, N, seed=T)
    x0 = torch.complex(torch.randn(B, H, D, N, generator=g), torch.randn(B, H, D, N, generator=g)) * 0.3
    m = torch.ones(B, T, dtype=torch.bool)
    y, x = ids.s4d_scan_triton(u, dt_a, bbar, c, d_skip, x0, chunk=chunk, block_d=block_d)
    y_chk, x_chk = s4d_chunked(u, m, dt_a, bbar, c, d_skip, x0, 7)
    y_rec, x_rec = s4d_recurrent(u, m, dt_a, bbar, c, d_skip, x0)
    _close(y, y_chk)
    _close(y, y_rec)
    _close(x, x_chk)
    _close(x, x_rec)


def test_s4d_prefill_prefill_decode_equals_one_call(interp):
    B, H, D, N, T = 1, 3, 8, 4, 75
    g = torch.Generator().manual_seed(3)
    u = torch.randn(B, H, T, D, generator=g)
    dt_a, bbar, c, d_skip = _s4d_system(H, D, N, seed=3)
    x = torch.zeros(B, H, D, N, dtype=torch.complex64)
    ref, x_ref = s4d_chunked(u, torch.ones(B, T, dtype=torch.bool), dt_a, bbar, c, d_skip, x, 64)
    outs = []
    for a, e in ((0, 33), (33, 72)):
        y, x = ids.s4d_scan_triton(u[:, :, a:e], dt_a, bbar, c, d_skip, x, chunk=16)
        outs.append(y)
    for t in range(72, T):
        y, x = ids.s4d_decode_step(u[:, :, t:t + 1], dt_a, bbar, c, d_skip, x)
        outs.append(y)
    _close(torch.cat(outs, 2), ref)
    _close(x, x_ref)


# ---- the model's dispatch ---------------------------------------------------------------------------

MODEL_CASES = [("interdomain", {"id_modes": 4}),
               ("interdomain", {"id_modes": 3, "id_readout": "normalized", "id_conj": False}),
               ("s4d", {"s4d_modes": 4})]


def _pair(variant, opts, seed=0):
    """The same random weights under attn_impl="reference" and "fast"."""
    torch.manual_seed(seed)
    kw = {"variant_options": opts, "num_hidden_layers": 1}
    ref = LctxForCausalLM(tiny_config(variant, attn_impl="reference", **kw)).eval()
    fast = LctxForCausalLM(tiny_config(variant, attn_impl="fast", **kw)).eval()
    fast.load_state_dict(ref.state_dict())
    return ref, fast


@pytest.mark.parametrize("variant,opts", MODEL_CASES)
def test_model_fast_path_runs_triton_and_matches_reference(interp, variant, opts):
    ref, fast = _pair(variant, opts)
    ids_ = torch.randint(0, 400, (1, 37))
    kernels.impls_used(reset=True)
    with torch.no_grad():
        want = ref(ids_).logits
        out = fast(ids_[:, :30], use_cache=True)  # Triton prefill
        assert kernels.impls_used() == {variant: "triton"}
        steps, cache = [out.logits], out.cache
        out = fast(ids_[:, 30:35], cache=cache)  # a second Triton prefill continues the cached state
        steps.append(out.logits)
        for t in (35, 36):  # decode steps
            out = fast(ids_[:, t:t + 1], cache=cache)
            steps.append(out.logits)
    assert kernels.impls_used(reset=True) == {variant: "triton"}  # decode steps keep the prefill's record
    _close(torch.cat(steps, 1), want)


def test_model_fast_path_falls_back_to_chunked(interp):
    ref, fast = _pair("interdomain", {"id_modes": 4})
    ids_ = torch.randint(0, 400, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding: the kernels take unpadded rows only
    kernels.impls_used(reset=True)
    with torch.no_grad():
        got = fast(ids_, attention_mask=mask).logits
        want = ref(ids_, attention_mask=mask).logits
    assert kernels.impls_used(reset=True) == {"interdomain": "chunked"}
    _close(got, want)
    # training needs a backward, which the forward-only kernels lack: the vectorised chunked form runs
    # (unpadded rows) and gradients flow
    fast.train()
    loss = fast(ids_).logits.float().pow(2).mean()
    assert kernels.impls_used(reset=True) == {"interdomain": "vectorized"}
    loss.backward()
    assert fast.model.layers[0].attn.variant.log_dt.grad.abs().sum() > 0


@pytest.mark.parametrize("variant,opts", [MODEL_CASES[0], MODEL_CASES[2]])
def test_model_fast_path_without_triton_is_vectorized(monkeypatch, variant, opts):
    # CPU without the interpreter: Triton cannot run, so "fast" is the vectorised chunked form (and the
    # decode step)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not kernels.triton_runs("cpu")
    ref, fast = _pair(variant, opts)
    ids_ = torch.randint(0, 400, (2, 24))
    kernels.impls_used(reset=True)
    with torch.no_grad():
        want = ref(ids_).logits
        out = fast(ids_[:, :22], use_cache=True)
        steps = [out.logits] + [fast(ids_[:, t:t + 1], cache=out.cache).logits for t in (22, 23)]
    assert kernels.impls_used(reset=True) == {variant: "vectorized"}
    _close(torch.cat(steps, 1), want)


# ---- the CPU path: the chunked form vectorised over chunks ------------------------------------------

@pytest.mark.parametrize("T,chunk,normalized,conj", ID_CASES + [(300, 7, True, True)])
def test_interdomain_scan_cpu_equals_chunked_and_recurrent(T, chunk, normalized, conj):
    # full chunks and a remainder, both readouts, a non-zero starting state (a continued prefill)
    B, H, N, D, eps = 2, 3, 5, 8, 1e-2
    g = torch.Generator().manual_seed(T)
    fq, kt, vt = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    dt_a, bbar = _ssm((H,), N, seed=T)
    st0 = _rand_state(B, H, N, D, normalized, seed=T + 1)
    m = torch.ones(B, T, dtype=torch.bool)
    o_chk, st_chk = interdomain_chunked(fq, kt, vt, m, dt_a, bbar, st0, 16, conj, eps)
    o, st = ids.interdomain_scan_cpu(fq, kt, vt, dt_a, bbar, st0, chunk, conj, eps)
    _close(o, o_chk)
    for k in st_chk:
        _close(st[k], st_chk[k])
    if T <= 64:  # and the token-by-token recurrence (the definition)
        o_rec, _ = interdomain_recurrent(fq, kt, vt, m, dt_a, bbar, st0, conj, eps)
        _close(o, o_rec)


@pytest.mark.parametrize("T,chunk", [(1, 16), (63, 16), (64, 16), (200, 64), (130, 7)])
def test_s4d_scan_cpu_equals_chunked_and_recurrent(T, chunk):
    B, H, D, N = 2, 2, 6, 4
    g = torch.Generator().manual_seed(T)
    dt_a, bbar = _ssm((H, D), N, seed=T, with_b=False)
    c = torch.complex(torch.randn(H, D, N, generator=g), torch.randn(H, D, N, generator=g))
    d_skip = torch.randn(H, D, generator=g)
    x0 = torch.complex(torch.randn(B, H, D, N, generator=g), torch.randn(B, H, D, N, generator=g))
    u = torch.randn(B, H, T, D, generator=g)
    m = torch.ones(B, T, dtype=torch.bool)
    y_chk, x_chk = s4d_chunked(u, m, dt_a, bbar, c, d_skip, x0, 16)
    y, x = ids.s4d_scan_cpu(u, dt_a, bbar, c, d_skip, x0, chunk)
    _close(y, y_chk)
    _close(x, x_chk)
    y_rec, x_rec = s4d_recurrent(u, m, dt_a, bbar, c, d_skip, x0)
    _close(y, y_rec)
    _close(x, x_rec)


@pytest.mark.slow
def test_scan_cpu_op_count_does_not_grow_per_chunk():
    # the point of the vectorised form: about two ops per chunk (the state scan) instead of ~15; counted
    # with the profiler at 4096 tokens in chunks of 64 (64 chunks)
    B, H, N, D, T = 1, 1, 16, 64, 4096
    fq, kt, vt = (torch.randn(B, H, T, D) for _ in range(3))
    dt_a, bbar = _ssm((H,), N)
    st0 = interdomain_state(B, H, N, D, False, "cpu")
    m = torch.ones(B, T, dtype=torch.bool)

    def ops(fn):
        with torch.profiler.profile() as p:
            fn()
        return sum(e.count for e in p.key_averages() if e.key.startswith("aten::"))

    with torch.no_grad():
        n_vec = ops(lambda: ids.interdomain_scan_cpu(fq, kt, vt, dt_a, bbar, st0, 64))
        n_chk = ops(lambda: interdomain_chunked(fq, kt, vt, m, dt_a, bbar, st0, 64))
    assert n_vec * 4 < n_chk, (n_vec, n_chk)


def test_reference_impl_records_nothing(interp):
    ref, _ = _pair("s4d", {"s4d_modes": 4})
    kernels.impls_used(reset=True)
    with torch.no_grad():
        ref(torch.randint(0, 400, (1, 20)))
    assert "s4d" not in kernels.impls_used(reset=True)


# ---- CUDA -------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for the compiled Triton kernels")
@pytest.mark.parametrize("normalized", [False, True])
def test_cuda_kernels_bf16_realistic_size(normalized):
    dev = "cuda"
    B, H, T, D, N = 2, 8, 1000, 64, 16
    g = torch.Generator().manual_seed(0)
    fq, kt, vt = (torch.randn(B, H, T, D, generator=g).bfloat16().float().to(dev) for _ in range(3))
    dt_a, bbar = (x.to(dev) for x in _ssm((H,), N))
    st0 = {k: v.to(dev) for k, v in _rand_state(B, H, N, D, normalized, seed=1).items()}
    m = torch.ones(B, T, dtype=torch.bool, device=dev)
    o, st = ids.interdomain_scan_triton(fq, kt, vt, dt_a, bbar, st0, eta_eps=1.0)
    o_ref, st_ref = interdomain_chunked(fq, kt, vt, m, dt_a, bbar, st0, 64, True, 1.0)
    _close(o, o_ref, 2e-3)  # tf32x3 dots: about float32 accuracy
    for name in st:
        _close(st[name], st_ref[name], 2e-3)
    dt_a, bbar, c, d_skip = (x.to(dev) for x in _s4d_system(H, D, N, seed=2))
    u = fq
    x0 = torch.zeros(B, H, D, N, dtype=torch.complex64, device=dev)
    y, x = ids.s4d_scan_triton(u, dt_a, bbar, c, d_skip, x0)
    y_ref, x_ref = s4d_chunked(u, m, dt_a, bbar, c, d_skip, x0, 64)
    _close(y, y_ref, 2e-3)
    _close(x, x_ref, 2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for the compiled Triton kernels")
@pytest.mark.parametrize("variant", ["interdomain", "s4d"])
def test_cuda_model_bf16_fast_matches_reference(variant):
    torch.manual_seed(0)
    cfg = {"hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 2}
    ref = LctxForCausalLM(tiny_config(variant, attn_impl="reference", **cfg)).cuda().bfloat16().eval()
    fast = LctxForCausalLM(tiny_config(variant, attn_impl="fast", **cfg)).cuda().bfloat16().eval()
    fast.load_state_dict(ref.state_dict())
    ids_ = torch.randint(0, 400, (2, 2048), device="cuda")
    kernels.impls_used(reset=True)
    with torch.no_grad():
        want = ref(ids_).logits.float()
        got = fast(ids_).logits.float()
    assert kernels.impls_used(reset=True) == {variant: "triton"}
    _close(got, want, 3e-2)  # bf16 activations: both paths round their float32 mixer output to bf16
