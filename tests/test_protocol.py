"""The model-adapter seam (issue 26): tasks and the runner need only :class:`ModelAdapter`.

A toy adapter with no torch in it (:mod:`toy_adapter`: characters as tokens, a rule with an explicit next-token
distribution) runs passkey and ppl end to end through ``lctx.evaluate(adapter, [task], ...)``, with the values its
rule dictates; the in-process adapter (:class:`HFAdapter`) keeps the resume key of the code before the seam
(pinned against records the old ``LM`` wrote for the bundled model).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import typing
from pathlib import Path

import pandas as pd
import pytest

import toy_adapter as toy
from lctx.errors import LctxError
from lctx.models.adapters.protocol import ADAPTER_MEMBERS, LmEvalCapable, ModelAdapter, missing_members

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
BUNDLED = REPO / "models" / "checkpoints" / "pydoc-tiny-rope"
#: columns that differ between two runs of the same inputs (when, how long, which process, how much memory)
RUN_SPECIFIC = ["run_id", "wall_s", "cpu_s", "peak_mem_bytes", "timestamp", "git_rev"]


def test_member_list_is_the_protocols():
    # the names messages quote (missing_members) are exactly what the Protocol declares, no more, no less
    assert set(ADAPTER_MEMBERS) == set(typing._get_protocol_attrs(ModelAdapter))  # noqa: SLF001 (3.11's way to list them)
    assert len(ADAPTER_MEMBERS) == len(set(ADAPTER_MEMBERS))


def test_toy_is_an_adapter_and_imports_no_torch():
    assert isinstance(toy.ToyAdapter(), ModelAdapter) and missing_members(toy.ToyAdapter()) == []
    assert not isinstance(toy.ToyAdapter(), LmEvalCapable)  # no Hugging Face model to give lm-eval
    # control: an object without the members is no adapter, and the message can name them all
    assert not isinstance(object(), ModelAdapter) and missing_members(object()) == list(ADAPTER_MEMBERS)
    code = "import sys, toy_adapter; print(sorted(m for m in ('torch', 'lctx', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=TESTS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_hf_adapter_conforms_and_can_serve_lmeval():
    from lctx.models.adapters.hf import HFAdapter, load_lm

    lm = load_lm(str(BUNDLED), device="cpu")
    assert isinstance(lm, HFAdapter) and isinstance(lm, ModelAdapter) and isinstance(lm, LmEvalCapable)
    model, tok = lm.lmeval_model()
    assert model is lm.model and tok is lm.tokenizer


def test_capabilities_are_optional_members_with_defaults():
    """Issue 43 (Architecture): what the runner and the tasks need beyond the protocol is read through
    ``capabilities`` with a documented default for each, never by asking which backend a model is: the toy (no
    optional member) has every default; the in-process adapter takes every positional method and lm-eval's ``hf``
    engine; the server adapter runs ``concurrency`` requests at once, takes no positional method (its positions are
    the server's) and lm-eval's ``api`` engine; a server whose echo failed the trust probe gives no teacher-forced
    scores, with the probe's reason."""
    from lctx.models.adapters.hf import HFAdapter
    from lctx.models.adapters.protocol import EVERY_METHOD, OPTIONAL_MEMBERS, Capabilities, capabilities, optional
    from lctx.models.adapters.server import ServerAdapter, TrustReport

    assert capabilities(toy.ToyAdapter()) == Capabilities()  # every default
    assert all(optional(toy.ToyAdapter(), m) == d for m, (d, _) in OPTIONAL_MEMBERS.items())
    hf = capabilities(HFAdapter)
    assert (hf.lmeval, hf.concurrency, hf.positional_methods) == ("hf", None, EVERY_METHOD)
    assert hf.takes_position("yarn") and hf.max_length_source == "max_position_embeddings"
    served = ServerAdapter(endpoints=[], model_id="m", tokenizer=None, concurrency=8,
                           trust=TrustReport(False, "the echo's log-probabilities are all zero"))
    caps = capabilities(served)
    assert (caps.lmeval, caps.concurrency, caps.positional_methods) == ("api", 8, ())
    assert not caps.takes_position("yarn") and caps.takes_position("shipped")
    assert not caps.teacher_forced and caps.unavailable == "the echo's log-probabilities are all zero"
    served.trust = TrustReport(True, "")
    assert capabilities(served).teacher_forced and capabilities(served).unavailable is None


@pytest.mark.parametrize("member, value", [("concurrency", 0), ("concurrency", "4"), ("teacher_forced", False),
                                           ("teacher_forced", " "), ("positional_methods", ["yarn"]),
                                           ("max_length_source", None)])
def test_a_capability_of_the_wrong_shape_is_one_line_before_the_run(tmp_path, member, value):
    """A user's adapter whose optional member breaks its contract is refused by the contract check before the run
    (one line: the member, its value, the contract), and the run directory is not made."""
    import lctx

    bad = toy.ToyAdapter()
    object.__setattr__(bad, member, value)
    with pytest.raises(LctxError, match=rf"^model adapter ToyAdapter: {member} is .*breaks its contract "
                                        rf"\(docs/adapters.md: .*fix ToyAdapter.{member}$"):
        lctx.evaluate(bad, ["passkey"], lengths=[4000], depths=[0.5], samples=1, out=tmp_path / "o", log=None)
    assert not (tmp_path / "o").exists()


def test_toy_rule_scores_by_hand():
    # the toy's own numbers, before any task: the reader favours " KEY." then EOS, at P_FAVOURITE each
    reader = toy.ToyAdapter("reader")
    p = reader.prompt("filler The pass key is 4711. Remember it.", " The pass key is")
    h = reader.prefix(p.ids)
    assert reader.decode(reader.greedy(h, 20)) == " 4711."  # stopped at EOS (default stop id)
    got = reader.score_continuation(h, reader.encode(" 4712"))
    wrong = math.log((1 - toy.P_FAVOURITE) / (toy.VOCAB - 1))
    # exact: every value is a log of one of two constants, computed the same way
    assert got.logprobs == [math.log(toy.P_FAVOURITE)] * 4 + [wrong] and got.top1 == [True] * 4 + [False]
    assert got.ranks == [1, 1, 1, 1, 2]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """``lctx.evaluate`` of the reader and the control on passkey and ppl (task objects), one call: (result, out
    dir, the adapters, the ppl task)."""
    import lctx
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    out = tmp_path_factory.mktemp("toy") / "run"
    reader, control = toy.ToyAdapter("reader"), toy.ToyAdapter("control")
    ppl = Perplexity(max_tokens=3000)
    res = lctx.evaluate([reader, control], [Passkey(), ppl], lengths=[400, 600], depths=[0.0, 1.0], samples=1,
                        out=out, log=lambda m: None)
    return res, out, (reader, control), ppl


def test_toy_runs_passkey_and_ppl_end_to_end(toy_run):
    res, out, (reader, control), ppl = toy_run
    assert res.errors == 0 and res.ran == 2 * (2 * 2 + 2)  # 2 models x (passkey 2 lengths x 2 depths + ppl 2)
    for f in ("records.jsonl", "results.parquet", "results.csv", "summary.csv", "run.json"):
        assert (out / f).is_file(), f
    t = res.table
    pk = t[t.task == "passkey"].pivot_table(index=["model", "length", "depth"], columns="metric", values="value")
    assert (pk.loc["toy-reader", "exact"] == 1.0).all() and (pk.loc["toy-control", "exact"] == 0.0).all()
    assert (pk.loc["toy-reader", "digit_acc"] == 1.0).all()
    # the control favours "0": its digit accuracy is the share of zeros in each key (records keep the key)
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    for r in recs:
        if r["model"] == "toy-control" and r["task"] == "passkey":
            key = r["extra"]["key"]
            assert r["metrics"]["digit_acc"] == pytest.approx(key.count("0") / len(key), abs=1e-12)  # k/5 in float
    # ppl: every token of the corpus (its first 3000, BOS before each window) scored once under the unigram
    tokens = reader.encode(ppl.documents()[0][1])[:3000]
    pp = t[t.task == "ppl"].pivot_table(index=["model", "length"], columns="metric", values="value")
    assert (pp["n_tokens"] == len(tokens)).all() and (pp["n_docs"] == 1).all()
    # a sum of ~3000 terms in another order: 1e-9 relative is ~1e6 float64 roundings
    assert pp["nll"].to_numpy() == pytest.approx(toy.hand_nll(tokens), rel=1e-9)
    assert pp["ppl"].to_numpy() == pytest.approx(math.exp(toy.hand_nll(tokens)), rel=1e-9)


def test_toy_records_carry_the_adapters_identity_and_resume(toy_run):
    import lctx
    from lctx.models.fingerprint import digest_json
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    res, out, (reader, control), ppl = toy_run
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    for r in recs:
        lm = reader if r["model"] == "toy-reader" else control
        assert r["model_fingerprint"] == lm.model_inputs()["fingerprint"]
        assert r["versions"] == {"lctx": lctx.__version__, "toy_adapter": "1"}  # lctx's and the adapter's, no torch
        assert (r["dtype"], r["attn_impl"], r["chunk_size"], r["device_type"], r["device"]) == (
            None, None, None, "toy", "toy")
        assert r["peak_mem_bytes"] is None and r["variant"] == "toy-rule"
        ident = {k: r[k] for k in ("variant", "model_fingerprint", "data_fingerprint", "dtype", "attn_impl",
                                   "chunk_size", "task", "seed", "task_options", "versions", "device_type",
                                   "task_version", "code")}
        assert r["fingerprint"] == digest_json(ident)  # recomputed from the record alone
    meta = json.loads((out / "run.json").read_text())
    assert meta["inputs"]["models"]["toy-reader"] == reader.model_inputs()
    # resume: the same call again runs nothing
    again = lctx.evaluate([toy.ToyAdapter("reader"), toy.ToyAdapter("control")], [Passkey(), Perplexity(max_tokens=3000)],
                          lengths=[400, 600], depths=[0.0, 1.0], samples=1, out=out, log=lambda m: None)
    assert again.ran == 0 and again.skipped == res.ran
    # control: a new adapter version is a new identity, so its samples run again (the resume key is the adapter's)
    newer = toy.ToyAdapter("reader", version="2")
    third = lctx.evaluate([newer], [Passkey()], lengths=[400, 600], depths=[0.0, 1.0], samples=1, out=out,
                          log=lambda m: None)
    assert third.ran == 4 and third.skipped == 0 and newer.calls["greedy"] == 4


@pytest.mark.slow
def test_toy_run_never_loads_the_hf_adapter():
    # in a fresh interpreter: the run of a non-torch adapter never loads the in-process adapter on its behalf
    code = """
import sys, tempfile, lctx, toy_adapter
from lctx.tasks.passkey import Passkey
res = lctx.evaluate(toy_adapter.ToyAdapter(), [Passkey()], lengths=[400], depths=[0.5], samples=1,
                    out=tempfile.mkdtemp(), log=lambda m: None)
print(res.ran, res.errors, 'lctx.models.adapters.hf' in sys.modules, 'lm_eval' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "0", "False", "False"]


def test_a_task_needing_a_capability_the_adapter_lacks_is_refused_before_torch(tmp_path):
    # mrcr renders a conversation (adapter_needs: chat_prompt): a toy has none, refused in one line before torch loads
    code = f"""
import sys, lctx, toy_adapter
try:
    lctx.evaluate(toy_adapter.ToyAdapter(), ["passkey", "mrcr"], out={str(tmp_path / 'o')!r}, log=print)
except lctx.LctxError as e:
    print(e)
print('torch' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=TESTS)
    assert out.returncode == 0, out.stderr[-2000:]
    msg, loaded = out.stdout.strip().splitlines()
    assert "mrcr" in msg and "chat_prompt()" in msg and "toy-reader" in msg
    assert loaded == "False" and not (tmp_path / "o").exists()


def test_lmeval_needs_nothing_beyond_the_protocol():
    # mmlu/arc run on any adapter (the protocol bridge): the check passes the toy for them; control: a task that
    # needs a capability the toy lacks (mrcr: chat_prompt) is still refused by the same check
    from lctx.harness.evaluate import _check_adapter_objects

    settings = dict(device=None, dtype=None, chunk_size=None, attn_impl=None, attn_override=None,
                    trust_remote_code=False, chat_template=False, system_prompt=None)  # none given
    _check_adapter_objects([toy.ToyAdapter()], ["arc_easy", "mmlu_anatomy"], [], **settings)
    with pytest.raises(LctxError, match="chat_prompt"):
        _check_adapter_objects([toy.ToyAdapter()], ["mrcr"], [], **settings)


@pytest.mark.slow  # lm-eval's import and one evaluation: about 4 s
def test_toy_runs_arc_through_the_protocol_bridge_with_hand_values(data_dir, tmp_path):
    """arc_easy (3 questions of the real ARC-Easy) on the toy, an adapter lm-eval has no engine for, through the one
    bridge: each choice's log-likelihood is the rule's by hand (the reader knows no pass key in a question, so every
    token of " " + choice gets (1 - P_FAVOURITE) / (VOCAB - 1)), ``acc`` picks the shortest choice; one prefill per
    question (its choices share the context), one score per choice; a rerun resumes without a call."""
    import lctx
    from lctx.tasks.lmeval import ARC_FILES, read_arc

    other = math.log((1 - toy.P_FAVOURITE) / (toy.VOCAB - 1))
    lm = toy.ToyAdapter("reader")
    kw = dict(out=tmp_path / "o", data_dir=data_dir, limit=3, progress=False, log=lambda m: None)
    res = lctx.evaluate(lm, ["arc_easy"], **kw)
    docs = read_arc(data_dir / "arc" / ARC_FILES["arc_easy"][0])[:3]
    recs = sorted((json.loads(x) for x in (res.out / "records.jsonl").read_text().splitlines()),
                  key=lambda r: r["sample"])
    assert [r["status"] for r in recs] == ["ok"] * 3
    assert lm.calls["prefix"] == 3 and lm.calls["score"] == sum(len(d["choices"]["text"]) for d in docs)
    for rec, doc in zip(recs, docs):
        hand = [len(" " + c) * other for c in doc["choices"]["text"]]
        assert rec["extra"]["ll"] == pytest.approx(hand, abs=1e-4)  # the record rounds to 4 decimals
        best = max(range(len(hand)), key=lambda i: hand[i])
        assert rec["metrics"]["acc"] == float(doc["choices"]["label"][best] == doc["answerKey"])
        assert rec["extra"]["pred"] == doc["choices"]["label"][best]
    calls = dict(lm.calls)
    again = lctx.evaluate(lm, ["arc_easy"], **kw)
    assert again.ran == 0 and lm.calls == calls  # resumed: not one call to the adapter


def test_objects_that_cannot_run_are_one_line_errors(tmp_path):
    import lctx
    from lctx.tasks.passkey import Passkey

    def refused(match, *args, **kw):
        with pytest.raises(LctxError, match=match) as e:
            lctx.evaluate(*args, out=tmp_path / "o", log=lambda m: None, **kw)
        assert "\n" not in str(e.value) and not (tmp_path / "o").exists()

    refused("lacks name, path, variant", object(), ["passkey"])  # not an adapter: the missing members named
    refused(r"dtype='bfloat16' is not the setting of model 'toy-reader', an adapter object loaded with dtype=None",
            toy.ToyAdapter(), ["passkey"], dtype="bfloat16")
    refused(r"attn_override='ssmax' sets how lctx loads a checkpoint path", toy.ToyAdapter(), ["passkey"],
            attn_override="ssmax")
    refused("chat template off", toy.ToyAdapter(), ["passkey"], chat_template=True)
    refused("two tasks named 'passkey'", toy.ToyAdapter(), ["passkey", Passkey(key_digits=3)])
    refused("neither a task name nor a lctx.tasks.Task object", toy.ToyAdapter(), [42])
    refused("objects such as Passkey", toy.ToyAdapter(), [Passkey])  # the class, not an object
    # an adapter's own max_length is named as such, not as a checkpoint's config.json key
    refused(r"exceeds the 300 tokens model 'toy-reader' declares it can address \(max_length\)",
            toy.ToyAdapter(max_length=300), [Passkey(key_digits=3)], lengths=[512])


def test_run_flag_beside_task_objects_says_they_keep_their_own_options(tmp_path):
    """A run-wide flag (key_digits) reaches tasks given by name only; with a Passkey *object* the warning says the
    object keeps its own options and names it, where it used to list no task at all ("tasks: ")."""
    import lctx
    from lctx.tasks.passkey import Passkey

    said = []
    lctx.evaluate(toy.ToyAdapter(), [Passkey(key_digits=3)], lengths=[256], depths=[0.5], samples=1,
                  key_digits=4, out=tmp_path / "o", log=said.append)
    line = next(m for m in said if "--key-digits" in m)
    assert "is ignored: no task of this run given by name uses it" in line
    assert line.endswith("(tasks: none; task objects keep their own options: passkey)"), line
    said.clear()  # control: the same flag with the task given by name is used, no warning
    lctx.evaluate(toy.ToyAdapter(), ["passkey"], lengths=[256], depths=[0.5], samples=1, key_digits=4,
                  out=tmp_path / "p", log=said.append)
    assert not any("--key-digits" in m for m in said)


def test_hf_identity_is_the_old_lms(tmp_path):
    """The resume key of the in-process adapter is what the old ``LM`` gave (issue 26 moved it behind the
    protocol): the bundled model's content fingerprint, files and every identity field of a passkey and a ppl
    record, as ``lctx run`` wrote them before the seam (3f004f2, CPU, float32, defaults), so old run directories
    resume."""
    import lctx
    import torch
    import transformers

    from lctx.harness.run.runner import _new_record, model_inputs, sample_base
    from lctx.models.adapters.hf import load_lm
    from lctx.models.fingerprint import digest_json

    # attn_impl="sdpa": what the default was then (issue 28 made fast the default, a new key, so an old run
    # directory recomputes its cells on the default path instead of mixing two paths' numbers)
    lm = load_lm(str(BUNDLED), device="cpu", attn_impl="sdpa")
    inputs = model_inputs(lm)
    assert inputs.pop("position")["method"] == "shipped"  # run.json's positional record (issue 43), not in the key
    assert inputs == {"path": str(BUNDLED.resolve()), "fingerprint": "4501e8a83f380a80", "files": {
        "config.json": "a35520a6fb26bf2e9f30336c67e0a5c91568b4073721a01b3be887bf7c7ed038",
        "generation_config.json": "ea3076142c27ad2d40e185d59184de05240cdcaa031eb12bdfdba8b814ce0a70",
        "model.safetensors": "7c181a935969bada5246effe59b94ac17cafa7b34c0c9356a2774d9a33c6a1ec",
        "tokenizer.json": "07e05d5ebc1a47cb65bebd6d20b155477adfe643a493fd1932871c169af35548",
        "tokenizer_config.json": "1151ff97bf74abe6646320f7d3ddfd7b561bc66d52ec1fe249f7298ba6d0dfd8"}}
    vs = {"lctx": lctx.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
    recorded = ("0.1.0", "2.13.0+cpu", "5.24.0")  # the versions the pinned fingerprints below were written with
    ppl_opts = {"data": None, "stride": 0.5, "bos": "prepend", "short_docs": "drop", "max_tokens": 32768, "concat": True}
    for task, opts, data_fp, old_fp in (("passkey", {"key_digits": 5, "max_new_tokens": None}, None, "66c33c26faf74723"),
                                        ("ppl", ppl_opts, "75731bf5efb77006", "6996fcfe69e98390")):
        base = sample_base(lm, task, 1, opts, data_fp, 0)
        old = {"model": "pydoc-tiny-rope", "variant": "rope", "model_fingerprint": "4501e8a83f380a80",
               "data_fingerprint": data_fp, "dtype": "float32", "attn_impl": "sdpa", "chunk_size": 2048, "task": task,
               "seed": 0, "task_options": opts, "versions": vs, "device_type": "cpu", "task_version": 1, "code": None}
        # the fields, their order (records keep it) and the old formula: everything but the name, hashed
        assert list(base) == list(old) + ["fingerprint"] and {k: base[k] for k in old} == old
        assert base["fingerprint"] == digest_json({k: v for k, v in old.items() if k != "model"})
        if tuple(vs.values()) == recorded:
            assert base["fingerprint"] == old_fp  # byte for byte what the old code wrote
        rec = _new_record(lm, base)
        assert (rec["device"], rec["dtype"], rec["train_length"]) == ("cpu", "float32", 256)
    # control: a setting that changes numbers changes the key
    lm.chunk_size = 512
    assert sample_base(lm, "passkey", 1, {"key_digits": 5, "max_new_tokens": None}, None, 0)["fingerprint"] != \
        sample_base(load_lm(str(BUNDLED), device="cpu"), "passkey", 1, {"key_digits": 5, "max_new_tokens": None},
                    None, 0)["fingerprint"]


def test_evaluate_with_an_adapter_and_task_objects_equals_lctx_run(tmp_path, capsys):
    # lctx.evaluate(adapter, [task objects]) is `lctx run` with the equivalent flags: the same tidy table
    import lctx
    from helpers import run_cli
    from lctx.models.adapters.hf import load_lm
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    res = lctx.evaluate(load_lm(str(BUNDLED)), [Passkey(key_digits=3), Perplexity(max_tokens=2048)],
                        lengths=[200, 256], depths=[0.5], samples=1, out=tmp_path / "api", log=lambda m: None)
    code, _, err = run_cli(["run", "--model", BUNDLED, "--tasks", "passkey,ppl", "--lengths", "200,256", "--depths",
                            "0.5", "--samples", "1", "--key-digits", "3", "--ppl-max-tokens", "2048", "--no-progress",
                            "--out", tmp_path / "cli"], capsys)
    assert code == 0, err

    def comparable(t):
        t = t.drop(columns=[c for c in RUN_SPECIFIC if c in t.columns])
        return t.sort_values(["task", "metric", "length", "depth", "sample"]).reset_index(drop=True)

    cli = pd.read_parquet(tmp_path / "cli" / "results.parquet")
    assert len(res.table) == len(cli) == 2 * 2 + 4 * 2 and res.errors == 0  # passkey 2 metrics, ppl 4, 2 lengths
    pd.testing.assert_frame_equal(comparable(res.table), comparable(cli), check_dtype=False)


# -- the seam defended (issue 26 trial): the contract checked before a run and while it runs ----------------------

def _evaluate(adapter, tasks, out, **kw):
    """``lctx.evaluate`` of ``adapter`` on ``tasks`` at 256 tokens, one sample, quiet."""
    import lctx

    return lctx.evaluate(adapter, tasks, **{"lengths": [256], "depths": [0.5], "samples": 1, "out": out,
                                            "log": lambda m: None, **kw})


def test_an_adapter_class_is_refused_with_pass_an_instance(tmp_path):
    """Trial item 4: ``ToyAdapter`` (the class) gave a TypeError traceback (methods called without self) or "it lacks
    path"; it is one line saying to pass an instance, before anything is made; the instance (control) runs."""
    from lctx.tasks.passkey import Passkey

    with pytest.raises(LctxError) as e:
        _evaluate(toy.ToyAdapter, [Passkey(key_digits=3)], tmp_path / "o")
    assert str(e.value) == "model ToyAdapter is a class, not a model adapter object: pass an instance, ToyAdapter(...)"
    assert not (tmp_path / "o").exists()
    assert _evaluate(toy.ToyAdapter(), [Passkey(key_digits=3)], tmp_path / "p").errors == 0


class _Bfloat16Toy(toy.ToyAdapter):
    """The toy, saying it runs in bfloat16 on a CPU with 512-token chunks and sdpa (load settings to compare with)."""

    def settings(self) -> dict:
        return dict(super().settings(), dtype="bfloat16", chunk_size=512, attn_impl="sdpa", device="cpu",
                    device_type="cpu")


@pytest.mark.parametrize("setting, value, own", [("dtype", "float32", "'bfloat16'"), ("chunk_size", 2048, "512"),
                                                 ("device", "cuda", "'cpu'"), ("attn_impl", "fast", "'sdpa'")])
def test_load_settings_beside_an_adapter_are_judged_against_its_own(tmp_path, setting, value, own):
    """Trial item 3: a load setting beside an adapter object was judged against the path defaults: the adapter's own
    dtype was refused (with advice to do just that) and float32 beside a bfloat16 adapter passed silently. A
    setting that differs from the adapter's ``settings()`` is refused, saying what it has."""
    from lctx.tasks.passkey import Passkey

    with pytest.raises(LctxError) as e:
        _evaluate(_Bfloat16Toy(), [Passkey(key_digits=3)], tmp_path / "o", **{setting: value})
    assert str(e.value).startswith(f"{setting}={value!r} is not the setting of model 'toy-reader', an adapter object "
                                   f"loaded with {setting}={own} (its settings()): leave {setting} out")
    assert not (tmp_path / "o").exists()


def test_load_settings_that_are_the_adapters_own_are_accepted(tmp_path):
    """Control of the refusal above: the adapter's own settings (``device`` as its device type too) run, and an
    in-process adapter loaded in bfloat16 passes dtype="bfloat16" (refused before, with advice to do exactly that),
    its sdpa as attn_impl="sdpa" and its device "cpu"; float32 beside it is refused."""
    from lctx.harness.evaluate import _check_adapter_objects
    from lctx.models.adapters.hf import load_lm
    from lctx.tasks.passkey import Passkey

    res = _evaluate(_Bfloat16Toy(), [Passkey(key_digits=3)], tmp_path / "o", dtype="bfloat16", chunk_size=512,
                    device="cpu", attn_impl="sdpa")
    assert res.errors == 0 and res.ran == 1
    lm = load_lm(str(BUNDLED), device="cpu", dtype="bfloat16", attn_impl="sdpa")
    given = dict(device=None, dtype=None, chunk_size=None, attn_impl=None, attn_override=None,
                 trust_remote_code=False, chat_template=False, system_prompt=None)
    _check_adapter_objects([lm], ["passkey"], [], **dict(given, dtype="bfloat16", attn_impl="sdpa", device="cpu",
                                                         chunk_size=2048))
    with pytest.raises(LctxError, match=r"dtype='float32' is not the setting of model 'pydoc-tiny-rope', an adapter "
                                        r"object loaded with dtype='bfloat16'"):
        _check_adapter_objects([lm], ["passkey"], [], **dict(given, dtype="float32"))


def _break(member: str, value):
    """A toy whose ``member`` (a method, or an attribute) gives ``value``."""
    adapter = toy.ToyAdapter()
    if member in ("name", "path", "variant", "train_length", "max_length", "can_batch"):
        object.__setattr__(adapter, member, value)
        return adapter
    cls = type(f"Broken_{member}", (toy.ToyAdapter,), {member: lambda self, *a, **k: value(self, *a, **k)})
    return cls()


_PROMPT = toy.ToyAdapter.prompt
_SETTINGS = toy.ToyAdapter.settings
_INPUTS = toy.ToyAdapter.model_inputs


@pytest.mark.parametrize("member, value, said", [
    ("prompt", lambda s, *a, **k: tuple(vars(_PROMPT(s, *a, **k)).values()),
     "prompt('x', ' y', marks=[0]) returned ([0, 91, 3, 92], 'x y', [1]) (tuple)"),
    ("encode", lambda s, t: t, "encode('a b') returned 'a b' (str): not a list of token ids"),
    ("decode", lambda s, ids: list(ids), "decode([68, 3, 69]) returned [68, 3, 69] (list)"),
    ("settings", lambda s: None, "settings() returned None (NoneType)"),
    ("settings", lambda s: {k: v for k, v in _SETTINGS(s).items() if k != "device_type"},
     "settings() has no device_type"),
    ("model_inputs", lambda s: {k: v for k, v in _INPUTS(s).items() if k != "fingerprint"},
     "model_inputs() returned fingerprint None (NoneType)"),
    ("tokenizer_fingerprint", lambda s: None, "tokenizer_fingerprint() returned None (NoneType)"),
    ("prompt_signature", lambda s: None, "prompt_signature() returned None (NoneType)"),
    ("name", None, "name is None (NoneType)"),
    ("name", "", "name is '' (str)"),
    ("path", Path("toy"), "path is PosixPath('toy') (PosixPath)"),
    ("max_length", 0, "max_length is 0 (int)"),
    ("train_length", "512", "train_length is '512' (str)"),
    ("can_batch", "no", "can_batch is 'no' (str)"),
])
def test_the_contract_check_names_the_member_what_it_returned_and_the_contract(tmp_path, member, value, said):
    """Trial item 5: an adapter member of the wrong shape gave a traceback before the run (prompt() a tuple:
    AttributeError in check_min_lengths) or a misleading error after it (name None: every sample ran, then "has no
    records.jsonl records"). One contract check of each object before anything runs names the member, what it
    returned and the contract (docs/adapters.md), in one line; nothing is made."""
    from lctx.tasks.passkey import Passkey

    with pytest.raises(LctxError) as e:
        _evaluate(_break(member, value), [Passkey(key_digits=3)], tmp_path / "o")
    msg = str(e.value)
    assert said in msg and "which breaks its contract (docs/adapters.md: " in msg and "\n" not in msg, msg
    assert msg.endswith(f".{member}") and not (tmp_path / "o").exists()


def test_the_contract_check_passes_the_toy_and_the_in_process_adapter():
    """Control of the contract check: both adapters lctx ships pass it as they are; a member that raises is named
    with what it raised."""
    from lctx.models.adapters.hf import load_lm
    from lctx.models.adapters.protocol import check_adapter

    check_adapter(toy.ToyAdapter())
    check_adapter(load_lm(str(BUNDLED), device="cpu"))

    def boom(self, text):
        raise KeyError("vocab")

    with pytest.raises(LctxError, match=r"^model adapter Boom: encode\('a b'\) raised KeyError: 'vocab'; fix "
                                        r"Boom.encode \(docs/adapters.md\)$"):
        check_adapter(type("Boom", (toy.ToyAdapter,), {"encode": boom})())


_GREEDY = toy.ToyAdapter.greedy
_SCORE = toy.ToyAdapter.score_continuation
_NLL = toy.ToyAdapter.token_nll


@pytest.mark.parametrize("member, value, task, error", [
    ("greedy", lambda s, h, n, stop_ids=None: [toy.char_id("7")] * 53, "passkey",
     "Broken_greedy.greedy returned 53 ids for max_new_tokens=7 (docs/adapters.md: at most max_new_tokens)"),
    ("greedy", lambda s, h, n, stop_ids=None: ["1", "2"], "passkey",
     "Broken_greedy.greedy returned a non-int id '1' (str) (docs/adapters.md: a list of at most max_new_tokens "
     "int ids, ending after the first stop id)"),
    ("score_continuation", lambda s, h, c: tuple(_SCORE(s, h, c))[:2], "passkey",
     "Broken_score_continuation.score_continuation returned a tuple of 2 (docs/adapters.md: "
     "ContinuationScores(logprobs, top1, ranks), three lists of len(cont) = 4 entries)"),  # " 123"
    ("score_continuation", lambda s, h, c: _SCORE(s, h, c)._replace(logprobs=[0.5] * len(c)), "passkey",
     "Broken_score_continuation.score_continuation returned logprob 0.5 (float) at token 0 (docs/adapters.md: "
     "natural-log probabilities, <= 0)"),
    ("token_nll", lambda s, ids, t: ([-x for x in _NLL(s, ids, t)[0]], _NLL(s, ids, t)[1]), "ppl",
     f"Broken_token_nll.token_nll returned NLL {-toy.unigram_nll(toy.char_id('a'))!r} (float) at target 0 "
     "(docs/adapters.md: NLLs in "
     "nats, >= 0 (-log of a probability))"),
])
def test_outputs_that_break_the_contract_are_the_samples_error(tmp_path, member, value, task, error):
    """Trial item 6: outputs that break the contract were accepted (negative NLLs: ppl 0.009) or crashed far from
    the cause (53 greedy ids for 3: an AttributeError at passkey.py). A user's adapter runs in a checking wrapper:
    the violation is the sample's error record, naming the member and the contract."""
    from lctx.tasks.passkey import Passkey
    from lctx.tasks.ppl import Perplexity

    obj = Passkey(key_digits=3) if task == "passkey" else Perplexity(max_tokens=300)
    res = _evaluate(_break(member, value), [obj], tmp_path / "o")
    assert res.ran == 1 and res.errors == 1 and res.ok == 0
    assert list(res.failed["error"].unique()) == [error]


class _BatchingToy(toy.ToyAdapter):
    """The toy with batches: each row run alone (the contract: a batch's numbers are the rows' own)."""

    def __init__(self, *a, extra: int = 0, **k):
        super().__init__(*a, **k)
        self.can_batch, self.extra, self.batches = True, extra, 0

    def prefix_batch(self, rows):
        self.batches += 1
        return [self.prefix(r) for r in rows]

    def greedy_batch(self, batch, max_new_tokens, stop_ids=None):
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(batch)
        return [self.greedy(h, n, stop_ids) + [toy.EOS] * self.extra for h, n in zip(batch, budgets)]

    def batch_row(self, batch, i):
        return batch[i]


def test_the_checking_wrapper_is_transparent_and_batches_still_work(tmp_path):
    """Control of the wrapper: a correct adapter's batched run (through the wrapper) gives the records of its run
    one sample at a time (metrics, identity), with batch_size 2; a batch whose greedy_batch breaks the contract
    falls back to the rows alone, which are fine. Attribute writes reach the adapter, lctx's own adapter is not
    wrapped, and a member the old API had is named with what to write instead."""
    from lctx.models.adapters.protocol import CheckedAdapter, checked
    from lctx.tasks.passkey import Passkey

    one = _evaluate(_BatchingToy(), [Passkey(key_digits=3)], tmp_path / "one", samples=2)
    batched = _BatchingToy()
    two = _evaluate(batched, [Passkey(key_digits=3)], tmp_path / "two", samples=2, batch_size=2)
    cols = ["fingerprint", "metric", "value", "sample"]
    assert batched.batches == 1 and two.errors == 0 and set(two.table["batch_size"]) == {2}
    pd.testing.assert_frame_equal(one.table[cols].sort_values(cols).reset_index(drop=True),
                                  two.table[cols].sort_values(cols).reset_index(drop=True))
    broken = _BatchingToy(extra=20)  # its batched greedy answers are too long: the rows run alone, and pass
    three = _evaluate(broken, [Passkey(key_digits=3)], tmp_path / "three", samples=2, batch_size=2)
    assert broken.batches == 1 and three.errors == 0 and set(three.table["batch_size"]) == {1}

    inner = toy.ToyAdapter()
    w = checked(inner)
    assert isinstance(w, CheckedAdapter) and isinstance(w, ModelAdapter) and checked(w) is w
    w.name, w.train_length = "renamed", 1024
    assert (inner.name, inner.train_length) == ("renamed", 1024) and w.model_inputs() == inner.model_inputs()
    with pytest.raises(AttributeError, match=r"'ToyAdapter' object has no attribute 'prefill': renamed prefix "
                                             r"\(docs/custom-tasks.md\)"):
        w.prefill([1, 2])
    assert not hasattr(w, "prefill") and getattr(w, "tokenizer", None) is None
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(BUNDLED), device="cpu")
    assert checked(lm) is lm  # the in-process adapter's hot path is not wrapped


def _one_token_task(name: str, score):
    """A task object scoring the last token of a short prompt with ``score(lm, sample)``."""
    from lctx.tasks import Sample, Task

    def build(self, lm, cell, seed):
        ids = [lm.bos_id] + lm.encode("a b " * 8)
        return Sample(cell=cell, input_ids=ids, n_tokens=len(ids))

    return type(name, (Task,), {"name": name, "metrics": ("nll",), "build": build, "score": score})()


@pytest.mark.parametrize("score, error", [
    (lambda self, lm, s: {"nll": lm.prefill(s.input_ids)},
     "AttributeError: 'ToyAdapter' object has no attribute 'prefill': renamed prefix (docs/custom-tasks.md) at "),
    (lambda self, lm, s: 0.5, "task 'custom_test' scored a sample as 0.5 (float), not {metric: number} for each of "
                              "its metrics ['nll'] (docs/custom-tasks.md)"),
    (lambda self, lm, s: {"nll": "low"}, "task 'custom_test' scored metric 'nll' as 'low' (str), not a number: it "
                                         "must return {metric: number} for each of its metrics ['nll']"),
])
def test_a_custom_task_breaking_the_api_is_told_what_to_write(tmp_path, score, error):
    """Trial item 7: a task written for the old API (``lm.prefill``) failed with "'ToyAdapter' object has no attribute
    'prefill'", and a score that is not a dict with a bare AttributeError in the runner; the records now say what
    to write (renamed prefix) and name the task and the contract. Control: the same task scoring through the
    protocol runs."""
    res = _evaluate(toy.ToyAdapter(), [_one_token_task("custom_test", score)], tmp_path / "o")
    assert res.errors == 1 and res.failed["error"].iloc[0].startswith(error), res.failed["error"].iloc[0]

    def right(self, lm, s):
        return {"nll": float(lm.token_nll(s.input_ids, [len(s.input_ids) - 1])[0][0])}

    ok = _evaluate(toy.ToyAdapter(), [_one_token_task("custom_test", right)], tmp_path / "p")
    assert ok.errors == 0 and ok.table["value"].iloc[0] == pytest.approx(toy.unigram_nll(toy.SPACE))
