"""The server adapter (:mod:`lctx.models.adapters.server`, issue 27) against ``tests/stub_server.py``, an
OpenAI-compatible stub with llama-cpp-python's endpoints whose model is the toy rule (so every score has a value by
hand), for the fault shapes a real server cannot be made to produce: a cut prompt, a refused one, 429 bursts, a
death mid-sweep, malformed replies, another model's name, a required API key, misaligned echoed log-probabilities.
The happy path and the cross-check against the in-process run use a real llama.cpp server
(``tests/test_server_llama.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import toy_adapter as toy
from stub_server import StubServer, stub  # noqa: F401  (the fixture)

import lctx
from lctx.errors import LctxError, ServerReplyError, ServerUnreachable
from lctx.models.adapters import server as S

#: a passkey grid the stub answers in about a second: 2 samples at one length and depth
GRID = dict(lengths=[300], depths=[0.5], samples=2, progress=False)


def run(url, tmp_path, tasks=("passkey",), name="run", **kw):
    """lctx.evaluate of the stub's model into tmp_path/name; warnings collected in the result's ``warnings``."""
    warnings: list[str] = []
    opts = {**GRID, **kw}
    res = lctx.evaluate(url, list(tasks), out=tmp_path / name, log=lambda m: None, warn=warnings.append, **opts)
    res.warnings = warnings
    return res


def records(out: Path) -> list[dict]:
    """The run directory's records."""
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------- the happy path

def test_passkey_through_the_stub_scores_as_the_toy(stub, tmp_path):
    """passkey through the server: exact 1.0 (the reader rule reads the key), digit_acc 1.0, and the echoed
    log-probabilities of the key equal the toy's by hand (log P_FAVOURITE per token); run.json records the served
    model's id, the trust probe's measurements and the URL."""
    res = run(stub.url, tmp_path)
    recs = records(res.out)
    assert [r["status"] for r in recs] == ["ok", "ok"]
    assert all(r["metrics"]["exact"] == 1.0 and r["metrics"]["digit_acc"] == 1.0 for r in recs)
    meta = json.loads((res.out / "run.json").read_text())
    served = next(iter(meta["inputs"]["models"].values()))
    assert served["path"] == stub.url
    assert served["server"]["model_id"] == "toy-reader"
    assert served["server"]["trust_probe"]["ok"] is True
    assert served["server"]["trust_probe"]["max_abs_diff"] == 0.0  # one rule behind both readings: equal
    lm = S.load_server(stub.url, log=lambda m: None)
    p = lm.prefix(lm.prompt("The pass key is 123. What is it?", " The pass key is").ids)
    sc = lm.score_continuation(p, lm.encode(" 123"))
    assert sc.logprobs == pytest.approx([math.log(toy.P_FAVOURITE)] * 4, abs=1e-12)  # by hand: the reader's favourite
    assert sc.top1 == [True] * 4 and sc.ranks == [1] * 4
    wrong = lm.score_continuation(p, lm.encode(" 124"))  # control: a wrong last digit is not the first choice
    assert wrong.top1 == [True, True, True, False] and wrong.ranks[-1] > 1


def test_ppl_through_the_stub_is_the_rules_by_hand(tmp_path):
    """ppl through echoed log-probabilities: the reader rule gives a text without a pass key (1 - P_FAVOURITE) /
    (VOCAB - 1) per token, so the perplexity is (VOCAB - 1) / (1 - P_FAVOURITE) = 970 (by hand), every token
    scored once. A server that takes token ids (vLLM-like) runs windows without a BOS (``--ppl-bos none``)."""
    text = tmp_path / "book.txt"  # one document (the default pydoc corpus is hundreds: one tokenize request each)
    text.write_text(" ".join(f"word{i % 97} and more text." for i in range(400)))
    ppl = dict(tasks=("ppl",), lengths=[256], samples=1, ppl_data=[str(text)])
    with StubServer(token_prompts=True) as s:
        res = run(s.url, tmp_path, ppl_bos="none", **ppl)
    got = res.summary.set_index("metric")["mean"]
    assert got["ppl"] == pytest.approx((toy.VOCAB - 1) / (1 - toy.P_FAVOURITE), rel=1e-9)
    assert got["n_tokens"] > 200


def test_ppl_through_a_text_only_bos_server_is_an_error_not_a_number(tmp_path):
    """Controls of the test above: through a llama-cpp-python-style server (text prompts, its BOS added to each, the
    token after it echoed without a value) both BOS policies are error records that name the cause."""
    text = tmp_path / "book.txt"
    text.write_text(" ".join(f"word{i % 97} and more text." for i in range(400)))
    ppl = dict(tasks=("ppl",), lengths=[256], samples=1, ppl_data=[str(text)])
    with StubServer() as s:
        bos = run(s.url, tmp_path, name="bos", **ppl)
        none = run(s.url, tmp_path, name="none", ppl_bos="none", **ppl)
    assert all(r["status"] == "error" and "--ppl-bos none" in r["error"] for r in records(bos.out))
    assert all(r["status"] == "error" and "put its BOS" in r["error"] for r in records(none.out))


def test_served_model_prompt_ids_are_the_servers_tokens(stub):
    """The adapter's ids are the server's: /extras/tokenize's (its BOS, which the server adds to a text prompt, is
    the prompt's first id) and every completion's usage.prompt_tokens equals them (checked per request)."""
    lm = S.load_server(stub.url, log=lambda m: None)
    assert lm.bos_id == toy.BOS and lm.encode("ab") == [toy.char_id("a"), toy.char_id("b")]
    ids = lm.prompt("hello", " world").ids
    assert ids == [toy.BOS] + toy.ToyAdapter().encode("hello world")
    assert not lm.token_prompts  # llama-cpp-python's validation refuses token ids: the text is sent


def test_token_id_prompts_are_sent_where_the_server_takes_them(tmp_path):
    """A server that takes token-id prompts (vLLM) gets the ids lctx built, not their text."""
    with StubServer(token_prompts=True) as s:
        lm = S.load_server(s.url, log=lambda m: None)
        assert lm.token_prompts
        ids = lm.prompt("The pass key is 42. What?", " The pass key is").ids
        assert lm.decode(lm.greedy(lm.prefix(ids), 5)) == " 42."
        sent = [r.body["prompt"] for r in s.requests if r.path == "/v1/completions"]
        assert sent[-1] == ids


# ---------------------------------------------------------------------------------------------- the trust probe

@pytest.mark.parametrize("fault", ["next", "shift", -0.5])
def test_trust_probe_refuses_misaligned_echoes(fault, tmp_path):
    """Echoed prompt log-probabilities that disagree with the server's own generation (llama-cpp-python 0.3.36's
    'next', a shift by one, a constant 0.5 nats low): digit_acc is unavailable with the measured disagreement in the
    reason (never 0), exact is still scored, and run.json holds the measurement. (0.5 nats *high* would put the
    favourite's log 0.9 above 0: a value that cannot be, refused at load: test_impossible_logprobs_at_load.)"""
    with StubServer(echo_fault=fault) as s:
        res = run(s.url, tmp_path)
    recs = records(res.out)
    assert all(r["metrics"]["exact"] == 1.0 for r in recs)
    assert all("digit_acc" not in r["metrics"] and "trust probe" in r["unavailable"]["digit_acc"] for r in recs)
    meta = json.loads((res.out / "run.json").read_text())
    probe = next(iter(meta["inputs"]["models"].values()))["server"]["trust_probe"]
    assert probe["ok"] is False and probe["max_abs_diff"] > S.ECHO_TOL
    assert sum("unavailable through" in w for w in res.warnings) == 1  # said once before the sweep, with the numbers
    assert f"up to {probe['max_abs_diff']:.3g} nats" in res.warnings[0]
    ends = [w for w in res.warnings if "recorded as unavailable" in w]
    assert len(ends) == 1 and "digit_acc (passkey, 2 samples)" in ends[0]  # and once at the end, naming the metric


def test_trust_probe_tolerance_passes_rounding(tmp_path):
    """Control of the tolerance: echoes 0.01 nats off (below ECHO_TOL = 0.05, float-rounding scale) pass the
    probe; 0.1 nats off (above it) do not."""
    with StubServer(echo_fault=0.01) as s:
        assert S.load_server(s.url, log=lambda m: None).trust.ok
    with StubServer(echo_fault=0.1) as s:
        assert not S.load_server(s.url, log=lambda m: None).trust.ok


def test_no_logprobs_server_makes_teacher_forced_metrics_unavailable(tmp_path):
    """A server that refuses log-probabilities (llama-cpp-python without logits_all: a 500) gives exact and leaves
    digit_acc unavailable naming the refusal, and ppl all unavailable; nothing is recorded as 0."""
    text = tmp_path / "book.txt"
    text.write_text(" ".join(f"word{i % 97} and more text." for i in range(400)))
    with StubServer(logits_all=False) as s:
        res = run(s.url, tmp_path, tasks=("passkey",))
        ppl = run(s.url, tmp_path, tasks=("ppl",), name="ppl", lengths=[256], samples=1, ppl_data=[str(text)])
    recs = records(res.out)
    assert all(r["metrics"] == {"exact": 1.0} and "no log-probabilities" in r["unavailable"]["digit_acc"]
               for r in recs)
    assert all(r["metrics"] == {} and r["status"] == "ok" for r in records(ppl.out))


def test_greedy_requests_turn_the_repetition_penalty_off(tmp_path, monkeypatch):
    """llama-cpp-python applies repeat_penalty 1.1 unless told otherwise, which bent its temperature-0 answers off its
    own first choice (measured: "." at -2.97 nats over "6" at -0.07): every request sends repeat_penalty 1.0, so the
    stub's penalty (the same default) leaves greedy decoding greedy and the probe finds it so. Control: without that
    field the first token is bent, and the probe says so in one warning."""
    with StubServer(penalty=True) as s:
        lm = S.load_server(s.url, log=lambda m: None)
        assert lm.trust.greedy_is_argmax is True and lm.trust.ok
        monkeypatch.setattr(S, "GREEDY_EXTRA", {})
        said: list[str] = []
        bent = S.load_server(s.url, log=said.append)
    assert bent.trust.greedy_is_argmax is False
    assert sum("not its own first choices" in w for w in said) == 1


# ---------------------------------------------------------------------------------------------- faults

def test_truncated_prompt_is_an_error_record(tmp_path):
    """A server whose context (n_ctx 400) is smaller than the cell cuts the prompt and says so in
    usage.prompt_tokens: the 600-token cell is an error record naming both counts, never a score; the 300-token
    cell (control) is scored."""
    with StubServer(n_ctx=400, overflow="truncate") as s:
        res = run(s.url, tmp_path, lengths=[300, 600], samples=1)
    by_len = {r["length"]: r for r in records(res.out)}
    assert by_len[300]["status"] == "ok" and by_len[300]["metrics"]["exact"] == 1.0
    bad = by_len[600]
    assert bad["status"] == "error" and bad["metrics"] == {}
    assert "the server counted 400" in bad["error"] and "cut the prompt" in bad["error"]
    assert "\n" not in bad["error"] and "Traceback" not in bad["error"]


def test_refused_long_prompt_is_an_error_record(tmp_path):
    """llama-cpp-python's 400 context_length_exceeded for a prompt past n_ctx: the sample's error, one line, with the
    server's message; not retried (a 4xx)."""
    with StubServer(n_ctx=400, overflow="error") as s:
        res = run(s.url, tmp_path, lengths=[600], samples=1)
        n = s.count("/v1/completions", 400)
    (rec,) = records(res.out)
    assert rec["status"] == "error" and "HTTP 400" in rec["error"] and "maximum context length" in rec["error"]
    assert n == 1


def test_429_burst_is_retried(tmp_path):
    """Three 429s (Retry-After 0.05 s, honoured) before a completion are retried: the greedy answer is right and the
    stub saw the three 429s. Control: with --retries 1 the same burst is the request's error naming HTTP 429."""
    with StubServer(retry_after="0.05") as s:
        lm = S.load_server(s.url, log=lambda m: None, retries=4)
        s.fail("429", times=3)
        ids = lm.prompt("The pass key is 42. What?", " The pass key is").ids
        assert lm.decode(lm.greedy(lm.prefix(ids), 5)) == " 42."
        assert s.count("/v1/completions", 429) == 3
        lm1 = S.load_server(s.url, log=lambda m: None, retries=1)
        s.fail("429", times=3)
        with pytest.raises(ServerReplyError, match="HTTP 429"):
            lm1.greedy(lm1.prefix(ids), 5)


@pytest.mark.parametrize("fault,message", [("malformed", "not valid JSON"), ("200-html", "an HTML page"),
                                           ("empty-choices", "no choices"), ("wrong-model", "from model"),
                                           ("502-html", "HTTP 502")])
def test_a_bad_reply_is_one_error_line(fault, message, tmp_path):
    """Malformed JSON, an HTML page (200 and a proxy's 502, after the retries), an empty choice list, another model's
    name: each is that sample's error record, one line naming what came, never a traceback; the other sample of the
    cell is scored (control)."""
    with StubServer() as s:
        lm = S.load_server(s.url, log=lambda m: None, retries=1)
        res_ok = run(s.url, tmp_path, name="ok", samples=1)
        s.fail(fault, times=None if fault == "502-html" else 1, after=0)
        res = lctx.evaluate(lm, ["passkey"], out=tmp_path / "bad", log=lambda m: None, warn=lambda m: None,
                            **{**GRID, "samples": 2})
    assert records(res_ok.out)[0]["status"] == "ok"
    recs = sorted(records(res.out), key=lambda r: r["sample"])
    assert recs[0]["status"] == "error" and message in recs[0]["error"], recs[0]["error"]
    assert "\n" not in recs[0]["error"] and "Traceback" not in recs[0]["error"]
    if fault != "502-html":
        assert recs[1]["status"] == "ok"


def test_dead_server_ends_the_run_and_the_rerun_resumes(tmp_path):
    """A server that dies mid-sweep: the run ends with one ServerUnreachable line (an LctxError, exit 2 from the CLI),
    every finished sample is in records.jsonl, and the same call resumes them once the server is back."""
    with StubServer() as s:
        lm_args = dict(lengths=[300], depths=[0.0, 0.5, 1.0], samples=2)
        s.die_after(6)  # the trust probe's 2 completions, then 4 of the sweep (a sample: greedy + its score)
        with pytest.raises(ServerUnreachable, match="stopped answering.*rerun the same command to resume"):
            run(s.url, tmp_path, retries=1, **lm_args)
        done = [r for r in records(tmp_path / "run") if r["status"] == "ok"]
        assert 0 < len(done) < 6  # some finished, not all
        s.revive()
        res = run(s.url, tmp_path, **lm_args)
    assert res.skipped == len(done) and res.ran == 6 - len(done)
    assert sorted((r["depth"], r["sample"]) for r in records(res.out) if r["status"] == "ok") == \
        sorted((d, i) for d in (0.0, 0.5, 1.0) for i in range(2))


def test_unreachable_server_is_refused_before_the_run(tmp_path):
    """No server at the URL: one line before anything runs, naming the URL and how to start one."""
    with StubServer() as s:
        url = s.url
    with pytest.raises(LctxError, match="no server answers at"):
        run(url, tmp_path)
    assert not (tmp_path / "run" / "records.jsonl").exists()


# ---------------------------------------------------------------------------------------------- identity and keys

@pytest.mark.slow  # five runs and a report: ~6 s
def test_api_key_is_read_from_the_environment_and_never_written(tmp_path, monkeypatch, capsys):
    """The key comes from --api-key-env's variable only; it reaches the server (the run works) and nothing lctx
    writes or says: run.json, records, tables, plots, warnings and error messages. Without it the server's 401 is
    one line naming --api-key-env; an unset variable is named (never a value); a URL carrying it is refused without
    echoing it. The report of the run is grepped too."""
    secret = "sk-test-3f9a1c77e0d2"
    with StubServer(api_key=secret) as s:
        with pytest.raises(LctxError, match="wants an API key.*--api-key-env"):
            run(s.url, tmp_path, name="nokey")
        with pytest.raises(LctxError, match="LCTX_TEST_KEY is not set"):
            run(s.url, tmp_path, name="unset", api_key_env="LCTX_TEST_KEY")
        monkeypatch.setenv("LCTX_TEST_KEY", "sk-wrong")
        with pytest.raises(LctxError, match=r"refused the API key in \$LCTX_TEST_KEY") as wrong:
            run(s.url, tmp_path, name="wrong", api_key_env="LCTX_TEST_KEY")
        assert "sk-wrong" not in str(wrong.value)
        monkeypatch.setenv("LCTX_TEST_KEY", secret)
        with pytest.raises(LctxError, match="credentials in the URL") as in_url:
            run(s.url.replace("http://", f"http://user:{secret}@"), tmp_path, name="url", api_key_env="LCTX_TEST_KEY")
        assert secret not in str(in_url.value)
        res = run(s.url, tmp_path, name="ok", api_key_env="LCTX_TEST_KEY")
        assert all(r["status"] == "ok" for r in records(res.out))
        assert all(seen.auth == "ok" for seen in s.requests if seen.path == "/v1/completions")
    from lctx.cli import main

    assert main(["report", str(res.out), "--out", str(tmp_path / "report")]) == 0  # the report, grepped below too
    assert (tmp_path / "report" / "report.html").is_file()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in written)
    for p in written:
        assert secret.encode() not in p.read_bytes(), p
    out = capsys.readouterr()
    assert secret not in out.out + out.err + " ".join(res.warnings)


def test_resume_key_holds_the_served_identity(tmp_path):
    """Two servers answering to other model ids (or the same id with another tokenizer) have other fingerprints, so
    their records never resume one another; the same server twice has the same one."""
    with StubServer(model_id="m-a") as a, StubServer(model_id="m-b") as b:
        fa = S.load_server(a.url, log=lambda m: None).model_inputs()["fingerprint"]
        fa2 = S.load_server(a.url, log=lambda m: None).model_inputs()["fingerprint"]
        fb = S.load_server(b.url, log=lambda m: None).model_inputs()["fingerprint"]
        fs = S.load_server(a.url, log=lambda m: None, seed=1).model_inputs()["fingerprint"]  # a request option
    assert fa == fa2 and fa != fb and fa != fs


def test_url_checks_before_connecting(tmp_path):
    """A bad URL and a server named twice are refused in one line before any connection. (mmlu/arc run through a
    served model, lm-eval's local-completions: tests/test_server_lmeval.py, with the refusal of a task whose
    capability a served model lacks.)"""
    with pytest.raises(LctxError, match="is not a server URL"):
        run("http://", tmp_path)
    with pytest.raises(LctxError, match="twice"):
        run("http://127.0.0.1:9/v1,http://127.0.0.1:9", tmp_path)
    assert S.redact_url("https://u:p@host:8443/v1?key=x#f") == "https://host:8443/v1"


def test_served_model_is_chosen_among_several():
    """A server listing several models needs --served-model; one it does not list is refused."""
    with StubServer(model_id="only") as s:
        with pytest.raises(LctxError, match="does not serve 'other'"):
            S.load_server(s.url, served_model="other", log=lambda m: None)
        assert S.load_server(s.url, served_model="only", log=lambda m: None).model_id == "only"


# ---------------------------------------------------------------------------------------------- concurrency, servers

def test_concurrency_keeps_n_in_flight_and_results_equal(tmp_path):
    """--concurrency 3: the stub sees 3 completions in flight at once (held at its gate), never more, and every
    record's numbers equal those of --concurrency 1."""
    import threading

    with StubServer(delay_s=0.05) as s:
        one = run(s.url, tmp_path, name="c1", samples=6)
        s.max_in_flight = 0
        res = {}
        t = threading.Thread(target=lambda: res.update(r=run(s.url, tmp_path, name="c3", samples=6, concurrency=3)))
        t.start()
        t.join(60)
        assert not t.is_alive()
        assert s.max_in_flight == 3
    key = lambda r: (r["sample"], json.dumps(r["metrics"], sort_keys=True))  # noqa: E731
    assert sorted(map(key, records(one.out))) == sorted(map(key, records(res["r"].out)))
    assert {r["batch_size"] for r in records(res["r"].out)} == {3}


def test_two_servers_share_one_sweep(tmp_path):
    """One model on two servers (--model URL1,URL2): both answer completions, each sample is recorded once, and the
    table is the one server alone gives; servers of different models are refused."""
    with StubServer() as a, StubServer() as b:
        both = run(f"{a.url},{b.url}", tmp_path, name="two", samples=6, concurrency=2)
        alone = run(a.url, tmp_path, name="one", samples=6)
        assert a.count("/v1/completions") > 2 and b.count("/v1/completions") > 2
    recs = records(both.out)
    assert len(recs) == 6 and len({(r["depth"], r["sample"]) for r in recs}) == 6
    assert both.summary["mean"].tolist() == alone.summary["mean"].tolist()
    with StubServer(model_id="x") as a, StubServer(model_id="y") as b:
        with pytest.raises(LctxError, match="serve different models"):
            S.load_server(f"{a.url},{b.url}", log=lambda m: None)


def test_thinking_span_is_dropped_before_scoring(stub, monkeypatch):
    """A reasoning model's text up to --think-end is dropped before the task reads the answer, and --think-budget
    is added to max_tokens (lm-eval's think_end_token)."""
    lm = S.load_server(stub.url, think_end="</think>", think_budget=32, log=lambda m: None)
    sent = {}

    class Reply:
        choices = [type("C", (), {"text": "<think>the key, the key</think> 42."})()]

    def fake(what, ids, text, **body):
        sent.update(body)
        return Reply()

    monkeypatch.setattr(lm, "_request", fake)
    out = lm.greedy(lm.prefix([toy.BOS, 5]), 8)
    assert lm.decode(out) == " 42." and sent["max_tokens"] == 8 + 32
    lm.think_end = None  # control: without the marker the span stays in the answer
    assert lm.decode(lm.greedy(lm.prefix([toy.BOS, 5]), 8)).startswith("<think>")


def test_setup_mistakes_are_one_line_naming_the_fix(tmp_path):
    """https:// to a plain-HTTP server names the TLS failure and http:// (it said "no server answers", with the
    server up: the fresh-user trial of issue 27); a --tokenizer that does not exist, or is a file that is not a GGUF,
    says so instead of transformers' hub-id text."""
    with StubServer() as s:
        with pytest.raises(LctxError, match=r"TLS handshake failed.*--model http://"):
            S.load_server(s.url.replace("http://", "https://"), retries=0, log=lambda m: None)
        with pytest.raises(LctxError, match="no such file or folder"):
            S.load_server(s.url, tokenizer=str(tmp_path / "missing"), log=lambda m: None)
        (tmp_path / "notes.txt").write_text("x")
        with pytest.raises(LctxError, match="not a .gguf"):
            S.load_server(s.url, tokenizer=str(tmp_path / "notes.txt"), log=lambda m: None)
        assert S.split_server_urls(s.url) == [s.url]  # control: the URL itself is good (http:// loads elsewhere)


# ---------------------------------------------------------------------------------------------- issue 42: replies

def _load(s, **kw):
    return S.load_server(s.url, log=lambda m: None, **kw)


def _passkey_ids(lm):
    return lm.prompt("The pass key is 42. What?", " The pass key is").ids


def test_a_huge_models_listing_is_one_short_line():
    """Issue 42 item 6: a server listing 20,000 models (2.6 MB of error line for 100,000 before) gives one line of a
    few hundred characters: eight ids, quoted, and how many more were left out."""
    with StubServer(extra_models=20_000) as s:
        with pytest.raises(LctxError) as e:
            _load(s)
    msg = str(e.value)
    assert "serves several models" in msg and "and 19993 more" in msg  # 20,001 listed, 8 shown
    assert len(msg) < 1000 and "\n" not in msg


@pytest.mark.parametrize("fault", ["huge", "huge-stream"])
def test_a_2gb_models_reply_stops_at_its_bound(fault):
    """Issue 42 item 2: a 2 GiB reply to /v1/models (declared by Content-Length, or chunked with no length) is refused
    at load in one line naming the bound, having read at most the bound: the stub sent at most MODELS_BOUND plus what
    loopback socket buffers hold (< 16 MiB on Linux: net.core.wmem_max + rmem_max defaults are 208 KiB each, and
    autotuning caps at tcp_wmem/tcp_rmem's 4 MiB / 6 MiB), and the allocation peak (tracemalloc, the openai client
    imported first) stays under twice the bound: the bytes kept and one join of them; reading it whole took 6 GB."""
    import tracemalloc

    with StubServer() as warm:
        _load(warm)  # the openai client and its modules imported: not counted in the peak
    with StubServer() as s:
        s.fail(fault, times=None, path="/v1/models")
        tracemalloc.start()
        try:
            with pytest.raises(LctxError) as e:
                _load(s, retries=0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        sent = max(r.sent for r in s.requests if r.path == "/v1/models")
    msg = str(e.value)
    assert "GET /v1/models" in msg and "8 MiB" in msg and "\n" not in msg, msg
    if fault == "huge":
        assert "declares 2 GiB (Content-Length)" in msg and sent < 16 << 20
    else:
        assert "passed its bound" in msg and sent < S.MODELS_BOUND + (16 << 20)
    assert peak < 2 * S.MODELS_BOUND, peak


def test_a_huge_completion_is_that_samples_error_and_not_retried(tmp_path):
    """Issue 42 item 2: a completion past its bound (a 2 GiB reply to a greedy request of a few tokens) is that
    sample's error record naming the bound, not retried (the same request would get it again; the openai client must
    not call it a server that stopped answering), and the sweep goes on: the other sample is scored."""
    with StubServer() as s:
        lm = _load(s, retries=3)
        s.fail("huge", times=1)
        res = lctx.evaluate(lm, ["passkey"], out=tmp_path / "o", log=lambda m: None, warn=lambda m: None, **GRID)
        huge = [r for r in s.requests if r.fault == "huge"]
    recs = sorted(records(res.out), key=lambda r: r["sample"])
    assert recs[0]["status"] == "error" and "more than its bound of" in recs[0]["error"], recs[0]["error"]
    assert recs[0]["metrics"] == {} and recs[1]["status"] == "ok"
    assert len(huge) == 1  # no retry
    assert res.exit_status == 4  # some samples failed (EXIT_SOME_FAILED)


def test_completion_bound_leaves_a_margin_over_a_real_echo(stub):
    """The completion bound's margin: the stub's echo of a 300-token prompt with 5 alternatives per token (as
    llama-cpp-python writes it) is under half of completion_bound for that request, so a true reply is never cut; the
    bound still grows with the echo (proportional, not a constant)."""
    import httpx2

    text = "The pass key is 123. " + "x y " * 70
    body = {"prompt": text, "max_tokens": 1, "echo": True, "logprobs": S.TOP_K, "temperature": 0}
    size = len(httpx2.post(stub.url + "/completions", json=body).content)
    n = len(text) + 1  # the stub's tokens: one per character, and its BOS
    assert size * 2 < S.completion_bound(1, n, echo=True, top_k=S.TOP_K), size
    assert S.completion_bound(1, 2 * n, echo=True, top_k=5) > S.completion_bound(1, n, echo=True, top_k=5)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/models"])
def test_request_timeout_is_a_deadline_for_a_dripping_server(path):
    """Issue 42 item 3: a server that drips its reply one byte every 0.05 s (status line and headers included) never
    lets an inactivity timeout fire; --request-timeout 0.5 now cuts it at the deadline (it took the whole reply
    before, 18 s for one completion with --request-timeout 1 --retries 0). A completion: that request's one-line
    error naming the deadline; /v1/models at load (each try): one LctxError line. Each time the stub sent fewer than
    100 bytes, less than the status line and headers alone (the client went away early; no wall-clock bound
    asserted)."""
    with StubServer() as s:
        if path == "/v1/completions":
            lm = _load(s, retries=0, timeout_s=0.5)
            s.fail("drip", times=1)
            with pytest.raises(ServerReplyError, match=r"request deadline \(0.5 s from connect to last byte; "
                                                       r"--request-timeout\)"):
                lm.greedy(lm.prefix(_passkey_ids(lm)), 5)
        else:
            s.fail("drip", times=None, path=path)  # every try (the listing is asked with one retry)
            with pytest.raises(LctxError, match="request deadline"):
                _load(s, retries=0, timeout_s=0.5)
        dripped = [r for r in s.requests if r.fault == "drip"]
    assert dripped and all(r.sent < 100 for r in dripped), [r.sent for r in dripped]


@pytest.mark.parametrize("value,where", [(3.0, "token"), (float("nan"), "token"), (float("inf"), "token"),
                                         (1e300, "token"), (float("-inf"), "token"), (0.5, "top")])
def test_impossible_logprobs_are_error_records_never_scores(value, where, tmp_path):
    """Issue 42 item 4: echoed log-probabilities above 0, NaN, +-inf or 1e300 (at the answer's tokens or among the
    alternatives) make the sample an error record naming the value: never a digit_acc (NaN, +inf and positive
    values got rank 1 and counted correct before) and never a mean. Control: 5e-4 (within LOGPROB_TOL, rounding)
    is scored."""
    with StubServer() as s:
        lm = _load(s)
        s.logprob_fault, s.logprob_fault_in = value, where
        bad = lctx.evaluate(lm, ["passkey"], out=tmp_path / "bad", log=lambda m: None, warn=lambda m: None, **GRID)
        s.logprob_fault, s.logprob_fault_in = 5e-4, "token"
        ok = lctx.evaluate(lm, ["passkey"], out=tmp_path / "ok", log=lambda m: None, warn=lambda m: None, **GRID)
    for r in records(bad.out):
        assert r["status"] == "error" and r["metrics"] == {} and "log-probability of" in r["error"], r
        assert ("top_logprobs" in r["error"]) == (where == "top") or value != value or where == "token"
    assert bad.table["value"].isna().all() and set(bad.table["status"]) == {"error"} and bad.exit_status == 3
    assert [r["status"] for r in records(ok.out)] == ["ok", "ok"]


@pytest.mark.parametrize("value", [3.0, 1e300])
def test_impossible_logprobs_give_no_perplexity(value, tmp_path):
    """Issue 42 item 4: ppl from echoed log-probabilities of +3.0 (ppl 0.05 before) or 1e300 (ppl 0.0 before): the
    window is an error record and no ppl is averaged."""
    text = tmp_path / "book.txt"
    text.write_text(" ".join(f"word{i % 97} and more text." for i in range(400)))
    with StubServer(token_prompts=True) as s:
        lm = _load(s)
        s.logprob_fault = value
        res = lctx.evaluate(lm, ["ppl"], out=tmp_path / "o", log=lambda m: None, warn=lambda m: None, lengths=[256],
                            samples=1, ppl_data=[str(text)], ppl_bos="none", progress=False)
    assert all(r["status"] == "error" and "log-probability" in r["error"] for r in records(res.out))
    assert res.table["value"].isna().all() and set(res.table["status"]) == {"error"}


def test_impossible_logprobs_in_the_trust_probe_end_the_load(tmp_path, capsys):
    """Issue 42 item 4: the trust probe at load meeting a NaN log-probability is one error line and exit 2 from the
    CLI (no traceback, nothing run), not a probe that quietly fails."""
    from helpers import assert_one_line_error, run_cli

    with StubServer(logprob_fault=float("nan")) as s:
        with pytest.raises(LctxError, match="log-probability of nan.*trust probe.*while loading"):
            _load(s)
        code, _, err = run_cli(["run", "--model", s.url, "--tasks", "passkey", "--lengths", 300, "--samples", 1,
                                "--no-progress", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "log-probability of nan")
    assert not (tmp_path / "o" / "records.jsonl").exists()


@pytest.mark.parametrize("fault", ["str", "nan", "bool", "negative", "float"])
@pytest.mark.parametrize("field_name", ["prompt_tokens", "completion_tokens"])
def test_usage_counts_must_be_whole_numbers(fault, field_name, tmp_path):
    """Issue 42 item 4: usage.prompt_tokens / completion_tokens as "57", NaN, true, -1 or 57.5 (a str passed as the
    count before; NaN was a ValueError with a traceback location) make the sample an error record naming the field,
    read from the raw JSON (the openai client's model reads "57" and true as counts)."""
    with StubServer() as s:
        lm = _load(s)
        s.usage_fault, s.usage_field = fault, field_name
        res = lctx.evaluate(lm, ["passkey"], out=tmp_path / "o", log=lambda m: None, warn=lambda m: None, **GRID)
    for r in records(res.out):
        assert r["status"] == "error" and f"usage.{field_name} is" in r["error"] and " at " not in r["error"], r


def test_a_tokenizer_failing_mid_run_is_no_traceback(tmp_path, capsys):
    """Issue 42 item 4: a tokenizer endpoint that starts answering 400 during the load (its fingerprint used to be
    asked only when the sweep began: a traceback there) or before the sweep (a template's length) is one line, exit
    2; one that starts during the sweep (its last request fails) makes that sample an error record and the run exits
    4 (some samples failed), never a traceback."""
    from helpers import assert_one_line_error, run_cli

    args = ["run", "--tasks", "passkey", "--lengths", 300, "--depths", 0.5, "--samples", 2, "--no-progress"]
    with StubServer() as s:
        _load(s)
        at_load = s._tokenized  # the tokenize requests a load makes
    with StubServer() as s:
        assert run_cli(args + ["--model", s.url, "--out", tmp_path / "dry"], capsys)[0] == 0
        total = s._tokenized  # ... and a whole run
    with StubServer(tokenize_fail_after=at_load - 1) as s:
        code, _, err = run_cli(args + ["--model", s.url, "--out", tmp_path / "load"], capsys)
    assert_one_line_error(code, err, "HTTP 400", "while loading the served model")
    with StubServer(tokenize_fail_after=at_load) as s:
        code, _, err = run_cli(args + ["--model", s.url, "--out", tmp_path / "before"], capsys)
    assert_one_line_error(code, err, "HTTP 400")
    with StubServer(tokenize_fail_after=total - 1) as s:
        code, _, err = run_cli(args + ["--model", s.url, "--out", tmp_path / "sweep"], capsys)
    assert code == 4 and "Traceback" not in err, err
    assert sorted(r["status"] for r in records(tmp_path / "sweep")) == ["error", "ok"]
    assert all("HTTP 400" in r["error"] for r in records(tmp_path / "sweep") if r["status"] == "error")


# ---------------------------------------------------------------------------------------------- issue 42: budgets

def test_think_budget_is_inside_the_served_context(tmp_path):
    """Issue 42 item 7: a server reporting a 512-token context (llama-server's /props n_ctx): every greedy request's
    prompt + max_tokens (passkey's 9 answer tokens + --think-budget) is at most 512 (at length 500 with a budget of 10
    the prompt is held to 493; before, 500 + 19 = 519 went out), and a length that leaves no room for the thinking
    budget is refused before the sweep with the arithmetic."""
    props = {"default_generation_settings": {"n_ctx": 512}}
    with StubServer(props=props) as s:
        with pytest.raises(LctxError, match=r"300 prompt \+ 300 --think-budget \+ at least 1 answer token = 601 "
                                            r"tokens > 512.*lengths up to 211"):
            run(s.url, tmp_path, name="refused", lengths=[300], think_end="4", think_budget=300)
        assert not (tmp_path / "refused" / "records.jsonl").exists()
        start = len(s.requests)
        run(s.url, tmp_path, name="fits", lengths=[500], think_end="</think>", think_budget=10)
        sent = [r.body for r in s.requests[start:] if r.path == "/v1/completions" and r.body.get("max_tokens") == 19]
    assert len(sent) == 2 and all(len(b["prompt"]) + 1 + b["max_tokens"] <= 512 for b in sent)  # a token a character
    assert max(len(b["prompt"]) + 1 for b in sent) > 493 - 8  # the prompt near its budget of 493, not cut further


def test_unclosed_thinking_is_an_empty_answer_flagged_and_counted(tmp_path):
    """Issue 42 item 7: --think-end that never comes in the reply (the stub's model never writes it; or the budget
    cut the thinking) makes the answer empty (vLLM's reasoning parser gives no content then): exact 0 instead of the
    1.0 the same text scored as an answer, each record flagged in extra.think_unclosed, and one warning counting
    them. Control: the same run without --think-end scores 1.0."""
    with StubServer() as s:
        plain = run(s.url, tmp_path, name="plain")
        res = run(s.url, tmp_path, name="think", think_end="</think>")
    assert [r["metrics"]["exact"] for r in records(plain.out)] == [1.0, 1.0]
    recs = records(res.out)
    assert [r["metrics"]["exact"] for r in recs] == [0.0, 0.0] and all(r["status"] == "ok" for r in recs)
    assert all(r["extra"]["think_unclosed"] == "no </think> in the reply" for r in recs)
    said = [w for w in res.warnings if "thinking never closed" in w]
    assert len(said) == 1 and "in 2 greedy replies" in said[0]


def test_thinking_cut_by_the_budget_is_named(stub, monkeypatch):
    """A reply cut by max_tokens inside its thinking (finish_reason "length", no --think-end) is noted as cut by
    the budget, for the sample's record; a closed one is not noted."""
    lm = S.load_server(stub.url, think_end="</think>", think_budget=4, log=lambda m: None)

    def reply(text, finish):
        choice = type("C", (), {"text": text, "finish_reason": finish})()
        return type("R", (), {"choices": [choice]})()

    monkeypatch.setattr(lm, "_request", lambda what, ids, text, **body: reply("<think>the key is", "length"))
    assert lm.greedy(lm.prefix([toy.BOS, 5]), 8) == [] and lm.think_unclosed == 1
    assert lm.sample_notes([toy.BOS, 5]) == {"think_unclosed": "cut by the token budget"}
    assert lm.sample_notes([toy.BOS, 5]) == {}  # taken once
    monkeypatch.setattr(lm, "_request", lambda what, ids, text, **body: reply("<think>x</think> 42.", "stop"))
    assert lm.decode(lm.greedy(lm.prefix([toy.BOS, 6]), 8)) == " 42." and lm.sample_notes([toy.BOS, 6]) == {}


@pytest.mark.parametrize("path", ["/v1/models", "/extras/tokenize", "/v1/completions"])
def test_a_key_echoed_by_the_server_is_redacted_where_the_message_is_built(path, monkeypatch):
    """Issue 42 item 1, the server side (tests/test_outside.py greps every sink of a whole run): the key read by
    api_key_from_env is registered as a secret, so the one-line message built from a gateway's 500 that quotes it
    (at load: /v1/models, the tokenizer; mid-run: a completion) holds "[redacted]" and never the key, before any sink
    sees it. The key has no sk- prefix, so only its registration can redact it; control: the stub echoed it."""
    key = "lctx-echo-test-k3y-7f3a9c"
    monkeypatch.setenv("LCTX_ECHO_KEY", key)
    with StubServer(api_key=key) as s:
        if path == "/v1/completions":
            lm = _load(s, api_key_env="LCTX_ECHO_KEY", retries=0)
            s.fail("500-key", times=1)
            with pytest.raises(ServerReplyError) as e:
                lm.greedy(lm.prefix(_passkey_ids(lm)), 5)
        else:
            s.fail("500-key", times=None, path=path, after=int(path == "/extras/tokenize"))  # past its detection
            with pytest.raises(LctxError) as e:
                _load(s, api_key_env="LCTX_ECHO_KEY", retries=0)
        assert s.count(path, 500) >= 1  # the stub quoted the key
    assert key not in str(e.value) and "[redacted]" in str(e.value) and "HTTP 500" in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------- issue 42: the trial

@pytest.mark.parametrize("path", ["/v1/models", "/extras/tokenize", "/v1/completions"])
def test_json_nested_too_deeply_is_one_line_not_a_traceback(path, tmp_path):
    """A reply nested 20,000 deep (40 KB, under every bound) made json's decoder raise RecursionError: an 88-line
    traceback at load, "RecursionError ... decoder.py" in a record. Now: at load one LctxError line naming it; in a
    completion that sample's error record saying so."""
    with StubServer() as s:
        if path == "/v1/completions":
            lm = _load(s, retries=0)
            s.fail("nested", times=1)
            res = lctx.evaluate(lm, ["passkey"], out=tmp_path / "o", log=lambda m: None, warn=lambda m: None, **GRID)
            errs = [r["error"] for r in records(res.out) if r["status"] == "error"]
            assert len(errs) == 1 and "nested too deeply" in errs[0] and "decoder.py" not in errs[0], errs
        else:
            s.fail("nested", times=None, path=path)
            with pytest.raises(LctxError, match="nested too deeply") as e:
                _load(s, retries=0)
            assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_id,needle", [("", "lists no model with a non-empty id"),
                                             ("m" * 100_000, "model id of 100000 characters")])
def test_an_empty_or_huge_served_model_id_is_refused_at_load(model_id, needle):
    """An id "" was taken (one error record, then "run has no records.jsonl records"); a 100 KB id filled every
    warning line and made a 200 KB summary.csv. Both are refused at load, in one short line."""
    with StubServer(model_id=model_id) as s:
        with pytest.raises(LctxError, match=needle) as e:
            _load(s)
    assert len(str(e.value)) < 500


@pytest.mark.parametrize("fault", ["401-key", "huge", "drip", "nested"])
def test_a_failing_tokenizer_endpoint_is_named_not_called_missing(fault):
    """A tokenizer endpoint that exists but fails at load (a refused key, a reply past its bound or its deadline, a
    reply json cannot read) was reported as "has no tokenizer endpoint ... give --tokenizer": the cause hidden. Now
    the message quotes the failure. Control: a server with no tokenizer endpoint at all still says so."""
    with StubServer(drip_s=0.3) as s:
        s.fail(fault, times=None, path="/extras/tokenize")
        with pytest.raises(LctxError) as e:
            _load(s, retries=0, timeout_s=1.0)
    msg = str(e.value)
    assert "tokenizer endpoint failed" in msg and "no tokenizer endpoint" not in msg, msg
    with StubServer() as s:
        s.fail("500", times=None, path="/nowhere")  # unrelated path: the endpoint itself answers
        assert S._tokenizer_kind(S.Endpoint(s.url, None, 5.0, 0)) == "extras"


def test_a_key_too_short_to_redact_is_refused(monkeypatch):
    """A 3-character key ("k9Z") cannot be told apart from text: it reached records, run.json and the tables. Now
    --api-key-env refuses a key shorter than lctx.outside.MIN_SECRET, naming the variable, never the value."""
    from lctx.outside import MIN_SECRET

    monkeypatch.setenv("LCTX_SHORT_KEY", "k9Z")
    with pytest.raises(LctxError, match=f"fewer than {MIN_SECRET} characters") as e:
        S.api_key_from_env("LCTX_SHORT_KEY")
    assert "k9Z" not in str(e.value)
    monkeypatch.setenv("LCTX_SHORT_KEY", "EMPTY")  # control: vLLM's customary placeholder key is long enough
    assert S.api_key_from_env("LCTX_SHORT_KEY") == "EMPTY"


def test_no_alternatives_where_k_were_asked_is_an_error_not_a_rank(tmp_path):
    """An echo whose top_logprobs are all {} (5 alternatives asked) scored digit_acc 0.0 with status ok: a rank read
    from nothing. Now each such sample is an error record; control: the same server with alternatives scores 1.0."""
    with StubServer() as s:
        lm = _load(s)
        ok = lctx.evaluate(lm, ["passkey"], out=tmp_path / "ok", log=lambda m: None, warn=lambda m: None, **GRID)
        s.logprob_fault_in = "bare"
        bad = lctx.evaluate(lm, ["passkey"], out=tmp_path / "bad", log=lambda m: None, warn=lambda m: None, **GRID)
    assert all(r["metrics"]["digit_acc"] == 1.0 for r in records(ok.out))
    for r in records(bad.out):
        assert r["status"] == "error" and "lists no alternatives" in r["error"], r


def test_retries_0_means_no_retry_at_load():
    """--retries 0 still retried /v1/models once (a hard-coded probe retry): a dripping listing took twice the
    deadline. Now a load-time request retries min(1, --retries) times."""
    with StubServer() as s:
        s.fail("500", times=None, path="/v1/models")
        with pytest.raises(LctxError):
            _load(s, retries=0)
        assert s.count("/v1/models") == 1
    with StubServer() as s:  # control: with retries the listing is asked again, once
        s.fail("500", times=None, path="/v1/models")
        with pytest.raises(LctxError):
            _load(s, retries=3)
        assert s.count("/v1/models") == 2


def test_a_think_budget_larger_than_the_context_says_how_to_fit(tmp_path):
    """A thinking budget that alone fills the served context said "use lengths up to -1025"; now it names the
    budget that fits."""
    props = {"default_generation_settings": {"n_ctx": 1024}}
    with StubServer(props=props) as s:
        with pytest.raises(LctxError, match=r"use --think-budget below 724") as e:
            run(s.url, tmp_path, lengths=[300], think_end="</think>", think_budget=2048)
    assert "up to -" not in str(e.value)


@pytest.mark.parametrize("opt,value", [("think_budget", 10 ** 9), ("retries", 10 ** 9), ("request_timeout", 1e9),
                                       ("concurrency", 10 ** 6), ("seed", 2 ** 64), ("seed", -(2 ** 63) - 1)])
def test_served_options_and_the_seed_are_bounded_before_any_work(opt, value, tmp_path):
    """--think-budget 1e9 made every reply's byte bound unbounded (2 GiB read, 6.5 GB RSS), --retries 1e9 retried a
    429 for ever, a seed past int64 ran the sweep and then failed writing results.parquet (a traceback, tables lost).
    Each is refused before anything runs (no run directory)."""
    with pytest.raises(LctxError, match="outside") as e:
        lctx.evaluate("http://127.0.0.1:9/v1", ["passkey"], out=tmp_path / "o", lengths=[256], log=lambda m: None,
                      **{opt: value})
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()


def test_the_key_is_a_secret_before_the_first_option_check(tmp_path, monkeypatch, capsys):
    """A key inside a task option or a task name was printed by the option check, which ran before the server
    adapter registered the key. lctx.evaluate registers it first; control: without --api-key-env the value shows."""
    from helpers import run_cli

    key = "planted0SECRET0value0XYZ"
    monkeypatch.setenv("LCTX_OPT_KEY", key)
    base = ["run", "--model", "http://127.0.0.1:9/v1", "--lengths", 256, "--out", tmp_path / "o"]
    for extra in (["--tasks", "passkey", "--task-option", f"passkey.key_digits={key}"], ["--tasks", key]):
        code, out, err = run_cli(base + extra + ["--api-key-env", "LCTX_OPT_KEY"], capsys)
        assert code == 2 and key not in out + err and "[redacted]" in err, err
    from lctx.outside import forget_secrets

    forget_secrets()
    code, _, err = run_cli(base + ["--tasks", key], capsys)
    assert code == 2 and key in err


def test_samples_of_one_haystack_go_to_the_server_that_holds_it(tmp_path):
    """Two servers, one request at a time: every sample of one haystack (passkey at one length: the filler is shared
    up to the needle) goes to the server that answered the first, whose prefix cache holds it (records' extra
    ``server``); round robin would alternate. Control: prompts of other haystacks (another length) may go elsewhere,
    and the scores equal one server's."""
    with StubServer() as a, StubServer() as b:
        both = run(f"{a.url},{b.url}", tmp_path, name="two", lengths=[1200], samples=3, depths=[0.5, 1.0], concurrency=1)
        alone = run(a.url, tmp_path, name="one", lengths=[1200], samples=3, depths=[0.5, 1.0])
    recs = records(both.out)
    by_length: dict = {}
    for r in recs:
        by_length.setdefault(r["length"], set()).add(r["extra"]["server"])
    assert all(len(s) == 1 for s in by_length.values()), by_length
    assert both.summary["mean"].tolist() == alone.summary["mean"].tolist()


def test_cached_prompt_tokens_are_read_and_checked():
    """The prefix-cache count a server reports (vLLM and llama-server: ``usage.prompt_tokens_details.cached_tokens``;
    llama-server also ``timings.cache_n``) is read from either form; an impossible count (more than the prompt, a
    negative, a string: fault shapes no real server gave) is refused in one line; none reported is None."""
    from types import SimpleNamespace as NS

    def reply(details=None, timings=None):
        return NS(usage=NS(prompt_tokens=100, prompt_tokens_details=details), timings=timings)

    assert S._cached_tokens(reply(NS(cached_tokens=96)), 100, "srv") == 96
    assert S._cached_tokens(reply({"cached_tokens": 64}), 100, "srv") == 64
    assert S._cached_tokens(reply(None, {"cache_n": 80}), 100, "srv") == 80
    assert S._cached_tokens(reply(None, None), 100, "srv") is None
    assert S._cached_tokens(reply(NS(cached_tokens=None)), 100, "srv") is None
    with pytest.raises(ServerReplyError, match="101 cached prompt tokens of a 100-token prompt"):
        S._cached_tokens(reply(NS(cached_tokens=101)), 100, "srv")
    for bad in (-1, "96", 9.5, True):
        with pytest.raises(ServerReplyError, match="not a whole number >= 0"):
            S._cached_tokens(reply(NS(cached_tokens=bad)), 100, "srv")
