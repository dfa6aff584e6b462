"""mmlu/arc through a served model (issue 27): lm-eval's own ``local-completions`` model
(``lm_eval.models.openai_completions.LocalCompletionsAPI``, subclassed by :func:`lctx.tasks.lmeval.served_lmeval_class`)
against ``tests/stub_server.py``, with lctx's records, resume and tables.

The stub's ``reader`` rule knows no pass key in an ARC question, so every token it scores there gets the same
probability, ``(1 - P_FAVOURITE) / (VOCAB - 1)``, and a choice's log-likelihood is its token count times that (its
``acc`` picks the shortest choice): every value has a number by hand (:func:`hand_ll`). A cross-check against lm-eval's
own ``simple_evaluate(model="local-completions")`` on the same server and questions runs too; there lm-eval's own
``parse_logprobs`` (``token_logprobs[ctxlen:-1]``) drops the continuation's last token, because the stub, like
llama-cpp-python, echoes no entry for a generated token it did not generate (the reader stops at once, EOS): its
log-likelihoods are one token short, by exactly that token's log-probability, and its ``acc`` is still the same.
The ``unigram`` rule (a space favoured everywhere, so the server does generate one token and lm-eval's own slice is
right) gives log-likelihoods that depend on the text, not only its length: there both agree to the last digit.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing here may touch the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

import toy_adapter as toy  # noqa: E402
from stub_server import StubServer  # noqa: E402

import lctx  # noqa: E402
from lctx.harness import evaluate as E  # noqa: E402
from lctx.models.adapters import server as S  # noqa: E402
from lctx.tasks import lmeval  # noqa: E402

#: what the reader rule gives every token of an ARC prompt it scores (no pass key to read): nats
OTHER = math.log((1 - toy.P_FAVOURITE) / (toy.VOCAB - 1))
ARC = dict(limit=3, progress=False)


def records(out: Path) -> list[dict]:
    """The run directory's records, in question order."""
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return sorted(recs, key=lambda r: r["sample"])


def lmeval_requests(stub: StubServer) -> int:
    """The stub's /v1/completions requests with lm-eval's payload (``logprobs`` 1; lctx's probes ask for 5)."""
    return sum(1 for r in stub.requests if r.path == "/v1/completions" and isinstance(r.body, dict)
               and r.body.get("logprobs") == 1)


def arc_docs(data_dir: Path, n: int = 3) -> list[dict]:
    """The first ``n`` ARC-Easy test questions, as lm-eval reads them."""
    return lmeval.read_arc(data_dir / "arc" / lmeval.ARC_FILES["arc_easy"][0])[:n]


def hand_ll(doc: dict) -> list[float]:
    """Each choice's log-likelihood by hand under the reader rule: its tokens (one per character of " " + the choice:
    lm-eval's continuation) times :data:`OTHER`."""
    return [len(" " + c) * OTHER for c in doc["choices"]["text"]]


def run(url_or_lm, out: Path, data_dir: Path, warnings: list | None = None, **kw):
    """lctx.evaluate of arc_easy (3 questions of ``data_dir``'s ARC-Easy) into ``out``; warnings collected in
    ``warnings``."""
    sink = warnings if warnings is not None else []
    return lctx.evaluate(url_or_lm, ["arc_easy"], out=out, data_dir=data_dir, log=lambda m: None, warn=sink.append,
                         **{**ARC, **kw})


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory) -> Path:
    """The stub model's tokenizer as a Hugging Face folder (one id per character: BOS 0, EOS 1, unknown 2, printable
    ASCII from 3), for lm-eval's own ``local-completions`` model, which needs a tokenizer of its own."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # the unknown id's text is a new line: the only non-printable character of an ARC prompt, so lm-eval's own
    # decoding of its ids (tokenized_requests=False) gives back the prompt's text
    vocab = {"<s>": toy.BOS, "</s>": toy.EOS, "\n": toy.UNK}
    vocab.update({chr(32 + i): toy.FIRST_CHAR + i for i in range(95)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="\n"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="\n")
    path = tmp_path_factory.mktemp("char-tokenizer")
    fast.save_pretrained(path)
    return path


def lmeval_own(stub: StubServer, data_dir: Path, tokenizer: Path, tmp_path: Path) -> list[dict]:
    """lm-eval's own ``simple_evaluate(model="local-completions", model_args=...)`` of the same 3 ARC-Easy questions
    (lctx's local task config: lm-eval's arc_easy YAML, the local data) against ``stub``: its per-question samples."""
    import lm_eval

    specs, source = lmeval.resolve_tasks(["arc_easy"], data_dir)
    tm, tasks = lmeval.load_tasks(specs, source, data_dir, tmp_path / "cfg")
    res = lm_eval.simple_evaluate(
        model="local-completions", tasks=[tasks["lctx_arc_easy"]], task_manager=tm, limit=3, log_samples=True,
        bootstrap_iters=0, model_args={"base_url": stub.url + "/completions", "model": stub.model_id,
                                       "tokenizer_backend": "huggingface", "tokenizer": str(tokenizer),
                                       "tokenized_requests": False, "max_length": 4096, "max_retries": 1})
    return sorted(res["samples"]["lctx_arc_easy"], key=lambda s: s["doc_id"])


# ------------------------------------------------------------------------------------------- the capability

def test_a_served_model_is_offered_mmlu_and_arc_before_connecting():
    """The capability check before torch (evaluate._check_capabilities, from the server backend's declared
    ``provides``) no longer refuses mmlu/arc for a served model (its ServerAdapter has lmeval_api_model(), lm-eval's
    alternative capability); control: a task needing a capability the server backend lacks is still refused, before
    any connection (the URL's port answers nothing)."""
    from lctx.harness.backends import resolve_models

    url = "http://127.0.0.1:9/v1"
    assert callable(getattr(S.ServerAdapter, "lmeval_api_model", None))
    specs = resolve_models([url])
    assert "lmeval_api_model" in specs[0].backend.provides
    E._check_capabilities(specs, ["arc_easy", "mmlu_anatomy", "passkey"])
    old = lmeval.LMEVAL.adapter_needs
    try:
        lmeval.LMEVAL.adapter_needs = {"lmeval_model": "runs lm-eval's hf backend, which needs a Hugging Face model"}
        with pytest.raises(lctx.LctxError, match="arc_easy runs lm-eval's hf backend.*server model"):
            E._check_capabilities(specs, ["arc_easy"])
    finally:
        lmeval.LMEVAL.adapter_needs = old


# --------------------------------------------------------------------------------------- the cross-check

@pytest.mark.slow  # two lm-eval evaluations and lm-eval's import: about 4.5 s alone on the 2-core machine
def test_arc_through_the_stub_equals_lm_evals_own_local_completions(data_dir, char_tokenizer, tmp_path):
    """arc_easy (3 questions) through the stub: ok records whose acc and acc_norm equal lm-eval's own
    local-completions run against the same stub, each choice's log-likelihood the stub's true value by hand; lm-eval's
    own are one token short (its ``[ctxlen:-1]`` slice over an echo with no generated token), which is the control:
    the by-hand check tells a dropped token apart."""
    with StubServer() as stub:  # text prompts, as llama-cpp-python takes them (lm-eval's tokenized_requests=False)
        res = run(stub.url, tmp_path / "lctx", data_dir)
        ours = records(res.out)
        assert lmeval_requests(stub) == sum(len(d["choices"]["text"]) for d in arc_docs(data_dir))
        theirs = lmeval_own(stub, data_dir, char_tokenizer, tmp_path)
    docs = arc_docs(data_dir)
    assert [r["status"] for r in ours] == ["ok"] * 3 and [r["sample"] for r in ours] == [0, 1, 2]
    assert [r["metrics"]["acc"] for r in ours] == [float(s["acc"]) for s in theirs]
    assert [r["metrics"]["acc_norm"] for r in ours] == [float(s["acc_norm"]) for s in theirs]
    # the tokenizer lm-eval's own used is the stub's (control of the comparison's premise)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(char_tokenizer))
    q = "Question: " + docs[0]["question"] + "\nAnswer: " + docs[0]["choices"]["text"][0]
    ids = hf(q, add_special_tokens=False).input_ids
    assert ids == toy.ToyAdapter("reader").encode(q) and hf.decode(ids) == q
    for rec, doc, s in zip(ours, docs, theirs):
        assert rec["extra"]["ll"] == pytest.approx(hand_ll(doc), abs=1e-3)
        own = [float(r[0]) for r in s["filtered_resps"]]
        assert own == pytest.approx([v - OTHER for v in hand_ll(doc)], abs=1e-6)  # one token short
        assert own != pytest.approx(hand_ll(doc), abs=1e-3)
        gold = doc["choices"]["label"].index(doc["answerKey"])
        best = max(range(len(doc["choices"]["text"])), key=lambda i: hand_ll(doc)[i])
        assert rec["metrics"]["acc"] == float(best == gold)
    assert (res.out / "summary.csv").is_file() and (res.out / "results.csv").is_file()
    acc = res.summary[(res.summary["task"] == "arc_easy") & (res.summary["metric"] == "acc")]
    assert len(acc) == 1 and int(acc["n"].iloc[0]) == 3
    assert float(acc["mean"].iloc[0]) == pytest.approx(sum(r["metrics"]["acc"] for r in ours) / 3)


@pytest.mark.slow  # two lm-eval evaluations
def test_text_dependent_scores_equal_lm_evals_own_to_the_digit(data_dir, char_tokenizer, tmp_path):
    """The unigram rule (a space favoured everywhere: the server generates one token, so lm-eval's own slice is
    right) scores a choice by its spaces and other characters, not only its length: lctx's log-likelihoods, acc and
    acc_norm equal lm-eval's own to 1e-6. The unigram server fails the trust probe (it cannot copy a key), so the probe
    is set passed by hand here: this test is of the scoring path, the gate has its own
    (:func:`test_untrusted_echo_makes_every_cell_unavailable`)."""
    with StubServer("unigram") as stub:
        lm = S.load_server(stub.url, log=lambda m: None)
        assert not lm.trust.ok  # the probe's verdict on this server, overridden below for the scoring path only
        lm.trust = S.TrustReport(True, "")
        ours = records(run(lm, tmp_path / "lctx", data_dir).out)
        theirs = lmeval_own(stub, data_dir, char_tokenizer, tmp_path)
    for rec, s in zip(ours, theirs):
        assert rec["extra"]["ll"] == pytest.approx([float(r[0]) for r in s["filtered_resps"]], abs=1e-4)
        assert rec["metrics"]["acc"] == float(s["acc"]) and rec["metrics"]["acc_norm"] == float(s["acc_norm"])
    assert len({tuple(r["extra"]["ll"]) for r in ours}) == 3


# ---------------------------------------------------------------------------------------------- the resume

def test_rerun_resumes_without_a_request_and_no_memory_check(data_dir, tmp_path, monkeypatch):
    """A rerun into the same out resumes: no lm-eval request reaches the server (only load_server's probes), and
    the table is the same. The first run's log-likelihoods are the stub's by hand (the fast subset's check of the
    values; the cross-check with lm-eval's own is slow). The lm-eval batch memory check never runs for a served model
    (patched to fail). Control: a rerun into a fresh out asks for every choice again."""
    from lctx.models.adapters import memory

    def refuse(*a, **k):
        raise AssertionError("the lm-eval batch memory check ran for a served model")

    monkeypatch.setattr(memory, "check_lmeval_fits", refuse)
    with StubServer() as stub:
        first = run(stub.url, tmp_path / "a", data_dir)
        n = lmeval_requests(stub)
        assert n == sum(len(d["choices"]["text"]) for d in arc_docs(data_dir)) and first.ran == 3
        for rec, doc in zip(records(first.out), arc_docs(data_dir)):
            assert rec["status"] == "ok" and rec["extra"]["ll"] == pytest.approx(hand_ll(doc), abs=1e-3)
            assert set(rec["metrics"]) == {"acc", "acc_norm"} and not rec.get("unavailable")
        again = run(stub.url, tmp_path / "a", data_dir)
        assert lmeval_requests(stub) == n and again.ran == 0 and again.skipped == 3
        assert [r["metrics"] for r in records(again.out)] == [r["metrics"] for r in records(first.out)]
        fresh = run(stub.url, tmp_path / "b", data_dir)  # control: the count does move when something is asked
        assert lmeval_requests(stub) == 2 * n and fresh.ran == 3


# ------------------------------------------------------------------------------------------------ the gate

def test_untrusted_echo_makes_every_cell_unavailable(data_dir, tmp_path):
    """A server whose echoed prompt log-probabilities fail the trust probe (``echo_fault="next"``: what
    llama-cpp-python 0.3.36 reports): every arc_easy cell's acc and acc_norm are unavailable with the probe's reason,
    no value (never 0), and no lm-eval request is sent. Control: the same server without the fault gives values
    (``test_arc_through_the_stub_equals_lm_evals_own_local_completions``; here its probe passes)."""
    with StubServer(echo_fault="next") as stub:
        reason = S.load_server(stub.url, log=lambda m: None).trust.reason
        warnings: list[str] = []
        res = run(stub.url, tmp_path / "o", data_dir, warnings)
        assert lmeval_requests(stub) == 0
    assert "trust probe" in reason
    recs = records(res.out)
    assert len(recs) == 3
    for r in recs:
        assert r["status"] == "ok" and r["metrics"] == {}
        assert r["unavailable"] == {"acc": reason, "acc_norm": reason}
    assert any("unavailable" in w and "acc" in w for w in warnings)
    with StubServer() as good:
        assert S.load_server(good.url, log=lambda m: None).trust.ok


# ------------------------------------------------------------------------------------------------- BOS once

#: a chat template that writes the BOS's own text first, as Llama 2's, Gemma's and Llama 3's do ("{{ bos_token }}")
BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.mark.parametrize("token_prompts", [True, False])
def test_chat_template_with_bos_text_sends_one_bos(data_dir, char_tokenizer, tmp_path, token_prompts):
    """Issue 42 item 8: arc_easy through a served model whose chat template writes ``{{ bos_token }}`` sends the BOS
    exactly once. With token-id prompts (vLLM) every lm-eval request's ids start with one BOS id and hold no other
    (the BOS the tokenizer parses from the template's "<s>" is the one lctx counts; before, lctx put another before it:
    [0, 0, ...]); with text prompts (llama-cpp-python, which puts its own BOS before every text) the text sent holds
    no "<s>" (before, the server read BOS + "<s>": its prompt count disagreed with lctx's, and every question was an
    error). Control: the rendered context does start with "<s>", and lctx's ids of it hold one BOS."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(char_tokenizer))
    tok._tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", toy.BOS)])
    tok.chat_template = BOS_TEMPLATE  # the model takes a BOS (its tokenizer adds one), and the template writes it too
    tok.save_pretrained(tmp_path / "tok")
    with StubServer(token_prompts=token_prompts) as stub:
        lm = S.load_server(stub.url, tokenizer=str(tmp_path / "tok"), chat_template=True, log=lambda m: None)
        assert lm.bos_id == toy.BOS and lm.token_prompts is token_prompts
        res = run(lm, tmp_path / "o", data_dir, chat_template=True)
        sent = [r.body["prompt"] for r in stub.requests if r.path == "/v1/completions"
                and isinstance(r.body, dict) and r.body.get("logprobs") == 1]
    recs = records(res.out)
    assert [r["status"] for r in recs] == ["ok"] * 3, [r.get("error") for r in recs]
    assert all(set(r["metrics"]) == {"acc", "acc_norm"} for r in recs), recs[0].get("unavailable")
    assert len(sent) == sum(len(d["choices"]["text"]) for d in arc_docs(data_dir))
    for p in sent:
        if token_prompts:
            assert p[0] == toy.BOS and p.count(toy.BOS) == 1, p[:4]
        else:
            text = p if isinstance(p, str) else p[0]
            assert "<s>" not in text and text.startswith("user: "), text[:20]
    served = lmeval.served_lmeval_class()(lm)
    ctx = served.apply_chat_template([{"role": "user", "content": "Question: x\nAnswer:"}])
    assert ctx.startswith("<s>user: ")
    assert served.tok_encode(ctx).count(toy.BOS) == 1 and served.tok_encode(ctx)[0] == toy.BOS
