"""Positional methods on real checkpoints (issue 43; lctx.models.position, load_lm's ``position``, --position and
lctx.evaluate(positions=...)): each RoPE-table method's effective table, read from the built model, against its
paper's formula (the plain reference beside the method) with a control that fails on a changed factor; a method whose
config key transformers ignores is refused; Gemma 3's per-layer-type tables; dynamic NTK and LongRoPE give a cell the
same number whatever ran before and whatever the chunk size (Llama and Gemma 3); names, variants, fingerprints and
run.json records of the models x methods cross product; every bad input one line, exit 2, before torch where the
light check can tell."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import assert_one_line_error, run_cli
from lctx.errors import LctxError
from lctx.models.adapters.hf import load_lm
from lctx.models.position import POSITION_METHODS, dynamic, linear, llama3, logn, longrope, ntk, theta, yarn
from lctx.models.position._rope import FACTOR, LAYERS_OPT, ORIGINAL, RopeMethod
from lctx.models.position.base import freq_summary

BUNDLED = Path(__file__).resolve().parents[1] / "models" / "checkpoints" / "pydoc-tiny-rope"
#: the tiny models: head_dim 16 (d = 16: 8 frequencies), RoPE base 10000, training length L = 64
D, BASE, L = 16, 10000.0, 64

#: Relative tolerance of a float32 RoPE table against the float64 formula: transformers computes
#: b ** (2i/d) in float32 and inverts it; the exponent's rounding (2**-24 relative) is amplified by |(2i/d) ln b'|
#: <= ln(b') <= 12 (the largest base here, NTK's 10000 * 4 ** (16/14) ~ 5e4, has ln 10.8), the pow and the division
#: add a few ulps: <= 12 * 6e-8 + 4 * 6e-8 ~ 1e-6. 1e-5 leaves a factor 10; the controls below change a factor by 1 %,
#: a relative change >= 1e-2 on the frequencies it touches.
REL = 1e-5


def _save(model, out: Path) -> Path:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(BUNDLED).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A 2-layer Llama (hidden 64, head dim 16, rope_theta 10000, max_position_embeddings 64), random weights
    (seed 0, init 0.3 so positions matter), with the bundled 1024-token tokenizer, saved as a folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=L, initializer_range=0.3,
                      rope_parameters={"rope_type": "default", "rope_theta": BASE})
    return _save(LlamaForCausalLM(cfg), tmp_path_factory.mktemp("llama") / "tiny-llama")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    """A 2-layer Gemma 3 (one sliding layer of window 16 with base 10000, one global layer with base 1e6; head dim
    16, max_position_embeddings 64), random weights (seed 0), the bundled tokenizer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=D, max_position_embeddings=L,
                           sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                           initializer_range=0.3)
    return _save(Gemma3ForCausalLM(cfg), tmp_path_factory.mktemp("gemma") / "tiny-gemma3")


def _table(lm, layer_type: str | None = None) -> tuple[list[float], float]:
    """The RoPE table the loaded model computes with now (the rotary module's buffer) and its scaling."""
    mod = lm.model.model.rotary_emb
    if layer_type is None:
        return mod.inv_freq.double().tolist(), float(mod.attention_scaling)
    return (getattr(mod, f"{layer_type}_inv_freq").double().tolist(),
            float(getattr(mod, f"{layer_type}_attention_scaling")))


def _close(got: list[float], want: list[float], rel: float = REL) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= rel * abs(w) for g, w in zip(got, want))


def _check(lm, want: tuple[list[float], float], control: tuple[list[float], float], key: str = "all",
           layer_type: str | None = None) -> None:
    """The model's table equals ``want`` (frequencies within REL, the scaling within float rounding), the
    effective record holds that very table (its digest), and the ``control`` (the formula with a changed factor)
    does not pass the same check."""
    got, scaling = _table(lm, layer_type)
    assert _close(got, want[0]), (got, want[0])
    assert scaling == pytest.approx(want[1], rel=1e-12, abs=1e-12)  # both Python floats: math.log in either
    rec = lm.position["effective"]["rope"][key]
    assert rec["sha"] == freq_summary(torch.tensor(got, dtype=torch.float64).float(), scaling)["sha"]
    assert rec["attention_scaling"] == pytest.approx(want[1], rel=1e-12)
    assert not (_close(got, control[0]) and control[1] == pytest.approx(scaling, rel=1e-9)), "the control passed"


# -- each method's table against its formula ----------------------------------------------------------------------
def test_linear_divides_every_frequency(llama):
    lm = load_lm(str(llama), device="cpu", position="linear:factor=4")
    _check(lm, linear.reference(D, BASE, 4.0), linear.reference(D, BASE, 4.04))
    shipped = theta.reference(D, BASE)[0]
    assert all(s / g == pytest.approx(4.0, rel=REL) for s, g in zip(shipped, _table(lm)[0]))  # PI: theta / s, all i


def test_ntk_raises_the_base(llama):
    lm = load_lm(str(llama), device="cpu", position="ntk:factor=4")
    _check(lm, ntk.reference(D, BASE, 4.0), ntk.reference(D, BASE, 4.04))
    got, shipped = _table(lm)[0], theta.reference(D, BASE)[0]
    # NTK-aware: the lowest frequency interpolated by exactly s (b'^(-(d-2)/d) = b^(-(d-2)/d) / s), the highest kept
    assert shipped[-1] / got[-1] == pytest.approx(4.0, rel=REL) and got[0] == pytest.approx(shipped[0], rel=REL)
    assert lm.model.config.rope_parameters["rope_theta"] == pytest.approx(BASE * 4 ** (D / (D - 2)))


def test_theta_replaces_the_base(llama):
    lm = load_lm(str(llama), device="cpu", position="theta:rope_theta=500000")
    _check(lm, theta.reference(D, 500000.0), theta.reference(D, 505000.0))
    assert lm.max_length == L  # a base override claims no extension


def test_yarn_ramp_and_temperature(llama):
    # L = 4096 (the option) puts dimensions on both sides of the ramp: r = L theta_i / 2 pi > 32 for i <= 2, < 1 for
    # i >= 6 (b = 10000, d = 16)
    spec = "yarn:factor=4,original_max_position_embeddings=4096"
    lm = load_lm(str(llama), device="cpu", position=spec)
    want = yarn.reference(D, BASE, 4.0, 4096)
    _check(lm, want, yarn.reference(D, BASE, 4.04, 4096))
    assert want[1] == pytest.approx(0.1 * math.log(4) + 1)  # sqrt(1/t) of the paper's Section 3.4
    got, shipped = _table(lm)[0], theta.reference(D, BASE)[0]
    turns = [4096 * t / (2 * math.pi) for t in shipped]  # the paper's r(d) = L / lambda_d
    for g, s, r in zip(got, shipped, turns):  # NTK-by-parts: r > beta kept, r < alpha interpolated by s
        if r > 32:
            assert g == pytest.approx(s, rel=REL)
        elif r < 1:
            assert g == pytest.approx(s / 4, rel=REL)
    assert any(r > 32 for r in turns) and any(r < 1 for r in turns) and any(1 < r < 32 for r in turns)
    assert lm.max_length == 4 * 4096 and lm.model.config.max_position_embeddings == 4 * 4096


def test_yarn_attention_factor_is_the_one_given(llama):
    # an attention_factor replaced by a computed one was accepted and not applied (ml-explore/mlx-lm PR #1507)
    lm = load_lm(str(llama), device="cpu", position="yarn:factor=2,attention_factor=1.5")
    _check(lm, yarn.reference(D, BASE, 2.0, L, attention_factor=1.5), yarn.reference(D, BASE, 2.0, L))
    lm = load_lm(str(llama), device="cpu", position="yarn:factor=2,mscale=1,mscale_all_dim=0.5")
    assert _table(lm)[1] == pytest.approx(yarn.mscale(2.0, 1) / yarn.mscale(2.0, 0.5), rel=1e-12)


def test_llama3_bands(llama):
    lm = load_lm(str(llama), device="cpu", position="llama3:factor=8")
    want = llama3.reference(D, BASE, 8.0, L)
    _check(lm, want, llama3.reference(D, BASE, 8.08, L))
    shipped = theta.reference(D, BASE)[0]
    waves = [2 * math.pi / t for t in shipped]  # L = 64: wavelength < 16 kept, > 64 divided by 8, a band between
    assert any(w < 16 for w in waves) and any(w > 64 for w in waves) and any(16 <= w <= 64 for w in waves)
    for g, s, w in zip(want[0], shipped, waves):
        assert g == pytest.approx(s if w < 16 else s / 8 if w > 64 else g, rel=1e-12)
    assert lm.max_length == 8 * L


def test_dynamic_at_the_length_it_runs(llama):
    lm = load_lm(str(llama), device="cpu", position="dynamic:factor=2")
    assert lm.max_length == 2 * L and lm.model.config.max_position_embeddings == L  # transformers reads L there
    rec = lm.position["effective"]["rope"]["all"]
    assert rec["rope_type"] == "dynamic" and rec["at_length"]["length"] == 2 * L
    for n in (40, 96, 128):  # within L: the shipped table; beyond: b' from the sample's length
        lm.fix_rope_length(n)
        got = _table(lm)[0]
        assert _close(got, dynamic.reference(D, BASE, 2.0, L, n)[0]), n
        if n > L:
            assert not _close(got, dynamic.reference(D, BASE, 2.02, L, n)[0])  # control: a changed factor
    lm.fix_rope_length(2 * L)
    assert freq_summary(lm.model.model.rotary_emb.inv_freq, 1.0)["sha"] == rec["at_length"]["sha"]
    lm.release_rope()


def test_longrope_short_and_long_factors(llama, tmp_path):
    short = [1.0 + 0.01 * i for i in range(D // 2)]
    long = [1.0 + 0.5 * i for i in range(D // 2)]
    f = tmp_path / "factors.json"
    f.write_text(json.dumps({"short_factor": short, "long_factor": long}))
    lm = load_lm(str(llama), device="cpu", position=f"longrope:factors={f},factor=4")
    assert lm.max_length == 4 * L
    for n in (32, 100):
        lm.fix_rope_length(n)
        want = longrope.reference(D, BASE, short, long, 4.0, L, n)
        assert want[1] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(L)))
        got, scaling = _table(lm)
        assert _close(got, want[0]) and scaling == pytest.approx(want[1], rel=1e-12), n
        other = longrope.reference(D, BASE, short, [v * 1.01 for v in long], 4.0, L, n)
        assert (n <= L) == _close(got, other[0])  # control: changed long factors show beyond L only
    lm.release_rope()
    assert lm.position["effective"]["rope"]["all"]["at_length"]["length"] == 4 * L
    # transformers' own LongRoPE update (lm-eval calls the model directly after release_rope) writes the table in
    # place: the short table a later sample is fixed to must not have been overwritten through an aliased buffer
    with torch.no_grad():
        lm.model(torch.tensor([list(range(100))]))
    lm.fix_rope_length(32)
    assert _close(_table(lm)[0], longrope.reference(D, BASE, short, long, 4.0, L, 32)[0])
    lm.release_rope()
    with pytest.raises(LctxError, match="needs its per-dimension factors"):
        load_lm(str(llama), device="cpu", position="longrope:factor=4")
    f.write_text(json.dumps({"short_factor": short[:3], "long_factor": long}))
    with pytest.raises(LctxError, match="has 3 factors; this model's RoPE has 8"):
        load_lm(str(llama), device="cpu", position=f"longrope:factors={f},factor=4")


def test_logn_is_ssmax_with_one_over_log_train_length(llama):
    lm = load_lm(str(llama), device="cpu", position="logn")
    att = lm.position["effective"]["attention"]
    assert att["implementation"] == "lctx_ssmax_sdpa" and att["train_length"] == L
    assert att["s"] * math.log(100) == pytest.approx(logn.reference(100, L), rel=1e-12)
    assert lm.name == "tiny-llama+logn" and lm.variant == "llama+logn"
    lm = load_lm(str(llama), device="cpu", position="ssmax:s=0.5")
    assert lm.position["effective"]["attention"]["s"] == 0.5 and lm.name == "tiny-llama+ssmax_s0.5"


# -- accepted but not applied --------------------------------------------------------------------------------------
class _TypeKey(RopeMethod):
    """Writes the scale under ``type`` beside the shipped ``rope_type`` (vllm-project/vllm #10293's mix-up): transformers
    reads ``rope_type`` and keeps its default table."""

    name = "test_type_key"
    options = {"factor": FACTOR, "original_max_position_embeddings": ORIGINAL, "layers": LAYERS_OPT}

    def rope_parameters(self, params, cfg, original):
        return {**params, "type": "linear", "factor": float(self.options["factor"])}


class _FactorOnly(_TypeKey):
    """Adds a ``factor`` to the shipped default table (YaRN configured and not applied, NVIDIA-NeMo/Automodel PR
    #1400): transformers' default RoPE reads no factor."""

    name = "test_factor_only"

    def rope_parameters(self, params, cfg, original):
        return {**params, "factor": float(self.options["factor"])}


class _RopeTypeKey(_TypeKey):
    """The control: the same scale under ``rope_type``."""

    name = "test_rope_type_key"

    def rope_parameters(self, params, cfg, original):
        return {**params, "rope_type": "linear", "factor": float(self.options["factor"])}


@pytest.mark.parametrize("cls", [_TypeKey, _FactorOnly])
def test_an_ignored_config_key_is_refused(llama, monkeypatch, cls):
    for c in (cls, _RopeTypeKey):
        monkeypatch.setitem(POSITION_METHODS, c.name, c)
    opts = {"factor": 4.0, "original_max_position_embeddings": None, "layers": "full_attention"}
    with pytest.raises(LctxError) as e:
        load_lm(str(llama), device="cpu", position=cls(**opts))
    msg = str(e.value)
    assert "\n" not in msg and f"--position {cls.name}:factor=4 was accepted but not applied" in msg and "(all)" in msg
    lm = load_lm(str(llama), device="cpu", position=_RopeTypeKey(**opts))  # control: the key transformers reads
    assert _close(_table(lm)[0], linear.reference(D, BASE, 4.0)[0])


def test_a_method_equal_to_the_shipped_model_is_refused(llama):
    with pytest.raises(LctxError, match=r"theta:rope_theta=10000 was accepted but not applied: .*\(all\)"):
        load_lm(str(llama), device="cpu", position="theta:rope_theta=10000")


# -- Gemma 3: a table per layer type ------------------------------------------------------------------------------------
def test_gemma3_applies_to_the_layer_types_named(gemma):
    shipped = load_lm(str(gemma), device="cpu")
    tables = shipped.position["effective"]["rope"]
    assert set(tables) == {"full_attention", "sliding_attention"}
    g_base, l_base = 1e6, 1e4  # Gemma 3's global and local bases
    lm = load_lm(str(gemma), device="cpu", position="linear:factor=4")  # default: the global layers
    assert lm.position["layer_type"] == "full_attention"
    _check(lm, linear.reference(D, g_base, 4.0), linear.reference(D, g_base, 4.04), "full_attention", "full_attention")
    assert lm.position["effective"]["rope"]["sliding_attention"]["sha"] == tables["sliding_attention"]["sha"]
    assert lm.max_length == 4 * L
    lm = load_lm(str(gemma), device="cpu", position="linear:factor=4,layers=all")
    assert lm.position["layer_type"] == "all"
    _check(lm, linear.reference(D, l_base, 4.0), linear.reference(D, l_base, 4.04), "sliding_attention",
           "sliding_attention")
    _check(lm, linear.reference(D, g_base, 4.0), linear.reference(D, g_base, 4.04), "full_attention", "full_attention")
    lm = load_lm(str(gemma), device="cpu", position="linear:factor=4,layers=sliding_attention")
    assert lm.position["effective"]["rope"]["full_attention"]["sha"] == tables["full_attention"]["sha"]
    assert lm.max_length == L  # the sliding layers see their window only: no longer context
    with pytest.raises(LctxError, match=r"accepted but not applied: .*\(full_attention\)"):
        load_lm(str(gemma), device="cpu", position="theta:rope_theta=1000000")


# -- length-dependent tables hold per sample ------------------------------------------------------------------------
def _doc_ids(lm, n: int) -> list[int]:
    from lctx.tasks.textdata import pydoc_corpus

    return lm.encode("\n\n".join(t for _, t in pydoc_corpus("heldout")))[:n]


def _fresh_nll(path, position, ids) -> float:
    """A fresh load and ONE forward of the window through transformers (its own per-forward RoPE update, no lctx
    fix, no chunks): what a cell's value must be whatever ran before it."""
    m = load_lm(str(path), device="cpu", position=position).model
    with torch.no_grad():
        logits = m(torch.tensor([ids[:-1]])).logits[0].double()
    return float(-logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None]).mean())


@pytest.mark.parametrize("which,position", [("llama", "dynamic:factor=2"), ("llama", "longrope"),
                                            ("gemma", "dynamic:factor=2")])
def test_length_dependent_tables_do_not_leak(which, position, request, tmp_path):
    path = request.getfixturevalue(which)
    if position == "longrope":
        f = tmp_path / "f.json"
        f.write_text(json.dumps({"short_factor": [1.0] * (D // 2), "long_factor": [1 + i for i in range(D // 2)]}))
        position = f"longrope:factors={f},factor=4"
    lm = load_lm(str(path), device="cpu", position=position, chunk_size=2048)
    ids = {n: _doc_ids(lm, n) for n in (48, 96, 128)}

    def cell(n, chunk):
        lm.chunk_size = chunk
        nll, _ = lm.token_nll(ids[n], list(range(1, n)))
        return float(nll.mean())

    fresh96, c128, after128, c128_chunk32, c48 = cell(96, 2048), cell(128, 2048), cell(96, 2048), cell(128, 32), \
        cell(48, 16)
    # the same cell, whatever ran before and whatever the chunk size; each equal to one fresh transformers forward.
    # Tolerance: float32 logits of a 2-layer model summed over <= 128 tokens in another order (chunks): 1e-5 nats.
    for n, got in ((96, fresh96), (128, c128), (48, c48)):
        assert got == pytest.approx(_fresh_nll(path, position, ids[n]), abs=1e-5), n
    assert after128 == pytest.approx(fresh96, abs=1e-6) and c128_chunk32 == pytest.approx(c128, abs=1e-5)
    # control: transformers' own per-forward update (no per-sample fix) gives other values for the same cells
    lm.release_rope()
    lm.fix_rope_length = lambda n: None
    leaked = [cell(128, 2048), cell(96, 2048), cell(128, 32)]
    assert abs(leaked[1] - fresh96) > 1e-4 or abs(leaked[2] - c128) > 1e-4


# -- the cross product, names, fingerprints, run.json ------------------------------------------------------------------
def test_names_variants_and_fingerprints(llama):
    from lctx.models.fingerprint import checkpoint_digests, digest_json

    shipped = load_lm(str(llama), device="cpu")
    assert shipped.name == "tiny-llama" and shipped.variant == "llama" and shipped.position["method"] == "shipped"
    assert shipped.model_inputs()["fingerprint"] == digest_json(checkpoint_digests(str(llama)))  # as before
    fps = {}
    for spec in ("yarn:factor=4", "yarn:factor=2", "yarn:beta_fast=16,factor=4"):  # options sorted in the label
        lm = load_lm(str(llama), device="cpu", position=spec)
        fps[spec] = lm.model_inputs()["fingerprint"]
        assert lm.variant == f"llama+{spec}" and lm.model_inputs()["position"]["options"]["factor"] > 1
    assert load_lm(str(llama), device="cpu", position="yarn:factor=4").name == "tiny-llama+yarn_factor4"
    assert len(set(fps.values()) | {shipped.model_inputs()["fingerprint"]}) == 4


def test_evaluate_runs_the_cross_product_and_resumes(llama, tmp_path):
    import lctx

    out = tmp_path / "run"
    kw = dict(tasks=["ppl"], lengths=[64], samples=1, out=out, device="cpu", ppl_max_tokens=128, log=lambda m: None)
    res = lctx.evaluate([str(llama)], positions=["shipped", "linear:factor=2", "linear:factor=2.0"], **kw)
    assert sorted(set(res.table["model"])) == ["tiny-llama", "tiny-llama+linear_factor2"]
    assert set(res.table["variant"]) == {"llama", "llama+linear:factor=2"}
    models = json.loads((out / "run.json").read_text())["inputs"]["models"]
    pos = models["tiny-llama+linear_factor2"]["position"]
    assert pos["base"] == "tiny-llama" and pos["method"] == "linear" and pos["options"]["factor"] == 2.0
    assert pos["layer_type"] == "all" and pos["effective"]["rope"]["all"]["rope_type"] == "linear"
    assert models["tiny-llama"]["position"]["method"] == "shipped"
    again = lctx.evaluate([str(llama)], positions=["shipped", "linear:factor=2"], **kw)
    assert again.ran == 0 and again.skipped == res.ran
    # lengths past the checkpoint's 64: the shipped model is refused before torch, the method addresses 2 x 64
    with pytest.raises(LctxError, match="exceeds the 64 tokens model 'tiny-llama'"):
        lctx.evaluate([str(llama)], positions=["shipped", "linear:factor=2"], **{**kw, "lengths": [128]})
    res = lctx.evaluate([str(llama)], positions="linear:factor=2", **{**kw, "lengths": [128], "out": tmp_path / "r2"})
    assert res.ok == 1


# -- bad input: one line, exit 2 ---------------------------------------------------------------------------------------
LIGHT_MISTAKES = [
    (["--position", "yarnn:factor=4"], "did you mean 'yarn'"),
    (["--position", "yarn+linear:factor=2"], "stacks 2 methods on one model"),
    (["--position", "yarn:factor=1"], "factor=1 does not extend the context"),
    (["--position", "linear:factor"], "is not KEY=VALUE"),
    (["--position", "yarn:factor=2", "-m", "http://127.0.0.1:9/v1"], "runs in its server"),
]


def test_light_mistakes_are_refused_before_torch(tmp_path):
    code = ("import json, sys\nfrom lctx.cli import main\nres = []\n"
            f"for argv in {[a for a, _ in LIGHT_MISTAKES]!r}:\n"
            f"    res.append((main(['run'] + argv + ['--out', {str(tmp_path / 'o')!r}]), 'torch' in sys.modules))\n"
            "print(json.dumps(res))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    errors = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(errors) == len(LIGHT_MISTAKES), errors
    for (code_, torch_loaded), line, (argv, needle) in zip(res, errors, LIGHT_MISTAKES):
        assert code_ == 2 and not torch_loaded and line.startswith("error: ") and needle in line, (argv, line)


@pytest.mark.parametrize("argv,needle", LIGHT_MISTAKES)
def test_light_mistakes_are_one_line(argv, needle, tmp_path, capsys):
    code, _, err = run_cli(["run", *argv, "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, needle)
    assert not (tmp_path / "o").exists()


def test_option_mistakes_are_one_line(llama, tmp_path, capsys):
    for spec, needle in [("linear:beta_fast=16", "beta_fast is an option of yarn"),
                         ("yarn", "needs factor=S"), ("yarn:factor=two", "factor='two' is not a finite number"),
                         ("yarn:factor=2,beta_fast=0.5", "0 < beta_slow < beta_fast"),
                         ("yarn:factor=2,mscale=1", "give mscale and mscale_all_dim together"),
                         ("theta", "needs rope_theta=B"), ("llama3:factor=8,low_freq_factor=4", "low_freq_factor"),
                         ("yarn:factor=2,layers=sliding_attention", "one RoPE for every layer")]:
        code, _, err = run_cli(["run", "-m", llama, "--position", spec, "--tasks", "ppl", "--lengths", "64",
                                "--out", tmp_path / "o", "--no-progress"], capsys)
        assert_one_line_error(code, err, needle)


def test_methods_that_do_not_apply_are_one_line(make_checkpoint, tmp_path, capsys):
    from transformers import BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    bloom = _save(BloomForCausalLM(BloomConfig(vocab_size=1024, hidden_size=32, n_layer=1, n_head=4)),
                  tmp_path / "bloom")
    gpt2 = _save(GPT2LMHeadModel(GPT2Config(vocab_size=1024, n_embd=32, n_layer=1, n_head=4, bos_token_id=1,
                                            eos_token_id=2)), tmp_path / "gpt2")  # learned absolute positions
    for model, spec, needle in [(make_checkpoint("alibi"), "yarn:factor=2", "variant 'alibi') has no RoPE to scale"),
                                (make_checkpoint("rope"), "linear:factor=2", "computes its rotations in lctx's own"),
                                (bloom, "yarn:factor=2", "uses ALiBi"),
                                (gpt2, "ntk:factor=2", "model type 'gpt2' declares no RoPE"),
                                (make_checkpoint("rope"), "alibi_lsh", "needs an ALiBi model")]:
        code, _, err = run_cli(["run", "-m", model, "--position", spec, "--tasks", "ppl", "--lengths", "64",
                                "--out", tmp_path / "o", "--no-progress"], capsys)
        assert_one_line_error(code, err, needle)


def test_an_adapter_object_takes_no_method(llama):
    import lctx

    with pytest.raises(LctxError, match="is an adapter object, loaded already"):
        lctx.evaluate([load_lm(str(llama), device="cpu")], tasks=["ppl"], positions=["yarn:factor=2"])


def test_native_checkpoints_take_ssmax_as_a_method(make_checkpoint):
    lm = load_lm(str(make_checkpoint("rope")), device="cpu", position="ssmax:s=0.5")
    assert lm.variant == "rope+ssmax:s=0.5" and lm.position["effective"]["attention"]["s"] == 0.5
    assert lm.position["effective"]["attention"]["variant_modules"] != \
        lm.position["shipped"]["attention"]["variant_modules"]


# -- GGUF: as an HF folder ------------------------------------------------------------------------------------------------
def test_gguf_takes_a_method_as_its_folder_does(tmp_path):
    from gguf_tiny import write_tiny_gguf

    f = write_tiny_gguf(tmp_path / "tiny.Q0.gguf")  # d = 32 / 4 heads = 8; llama.cpp's default base 10000
    shipped = load_lm(str(f), device="cpu", cache_dir=str(tmp_path / "c"))
    lm = load_lm(str(f), device="cpu", cache_dir=str(tmp_path / "c"), position="linear:factor=2")
    assert lm.name == "tiny.Q0+linear_factor2" and lm.path == str(f) and lm.max_length == 2 * 128
    got, ship = _table(lm)[0], _table(shipped)[0]
    assert _close(got, [s / 2 for s in ship]) and not _close(got, [s / 2.02 for s in ship])


def test_list_positions_names_every_method_and_its_source(capsys):
    code, out, _ = run_cli(["list", "positions"], capsys)
    assert code == 0
    for name, cls in POSITION_METHODS.items():
        line = next((ln for ln in out.splitlines() if f"| {name} " in ln), "")
        assert cls.source and cls.source[:30] in line, name
    assert "factor=<float, required>" in out and "| shipped " in out


# -- a real checkpoint: SmolLM2's GGUF -------------------------------------------------------------------------------------
@pytest.mark.slow  # loads a 135M model four times and runs a 1K-token sweep (12.5 CPU s measured on a busy machine)
def test_smollm2_gguf_under_yarn(data_dir, tmp_path):
    import lctx

    gguf = data_dir / "checkpoints" / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.is_file():
        pytest.skip(f"{gguf} not found")
    lm = load_lm(str(gguf), device="cpu", position="yarn:factor=4")
    cfg = lm.model.config
    d, b, orig = cfg.head_dim, cfg.rope_parameters["rope_theta"], 8192  # SmolLM2: head dim 64, its 8K context
    assert lm.max_length == 4 * orig and lm.name == "SmolLM2-135M-Instruct.Q4_1+yarn_factor4"
    _check(lm, yarn.reference(d, b, 4.0, orig), yarn.reference(d, b, 4.04, orig))
    res = lctx.evaluate(str(gguf), ["passkey"], lengths=[1024], depths=[0.5], samples=1, out=tmp_path / "run",
                        device="cpu", positions=["shipped", "yarn:factor=4"], log=lambda m: None)
    assert set(res.table["model"]) == {"SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q4_1+yarn_factor4"}
    models = json.loads((tmp_path / "run" / "run.json").read_text())["inputs"]["models"]
    pos = models["SmolLM2-135M-Instruct.Q4_1+yarn_factor4"]["position"]
    assert pos["resolved"] == {"original_max_position_embeddings": orig, "factor": 4.0}
    assert pos["effective"]["rope"]["all"]["attention_scaling"] == pytest.approx(0.1 * math.log(4) + 1)
    # 16K on the 8K checkpoint: within yarn x 4's 32K, past the shipped model's 8K (checked before any sample runs)
    from lctx.harness.run.runner import check_lengths

    check_lengths(lm, [16384], False)
    with pytest.raises(LctxError, match="exceeds the 8192 tokens"):
        check_lengths(load_lm(str(gguf), device="cpu"), [16384], False)
