"""Issue 27: the stub server of ``tests/stub_server.py`` does what the server backend's fault tests rely on. Its
happy path is the toy's distribution (passkey scores 1.0 through it; its log-probabilities are the toy's and, by
hand, the causal rule's), and each fault of :data:`stub_server.FAULTS` and each fault setting has a test here, each
with a control (the same request without the fault). Spoken to with httpx, as the server backend speaks to a real
server. All fast (a server on a free port per test, milliseconds each)."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest
import toy_adapter as toy
from stub_server import FAULTS, StubModel, StubServer, expected_logprobs, stub  # noqa: F401 (stub: the fixture)

try:
    import httpx
except ImportError:  # the venv's openai client comes with httpx2, the same API under another name
    import httpx2 as httpx

HIGH = math.log(toy.P_FAVOURITE)
LOW = math.log((1 - toy.P_FAVOURITE) / (toy.VOCAB - 1))
SHORT = ("Find the key. The grass is green. The pass key is 4242. Remember it. The sky is blue. "
         "What is the pass key? The pass key is")
TESTED_FAULTS: set = set()  # filled by the tests below; the last test checks every fault has one


def client(s: StubServer, **kw) -> httpx.Client:
    """An httpx client of the stub (5 s timeout unless given)."""
    kw.setdefault("timeout", 5)
    return httpx.Client(base_url=s.base_url, **kw)


def complete(c: httpx.Client, prompt, **body) -> httpx.Response:
    """POST /v1/completions, greedy with a seed unless told otherwise."""
    body = {"prompt": prompt, "temperature": 0, "seed": 0, **body}
    return c.post("/v1/completions", json=body)


@pytest.fixture(scope="module")
def passkey_sample():
    """A 1K passkey sample built with the toy adapter (character tokens, BOS first)."""
    from lctx.tasks.base import Cell
    from lctx.tasks.passkey import Passkey

    task = Passkey()
    return task, task.build(toy.ToyAdapter("reader"), Cell(1024, 0.5, 0), seed=0)


# ------------------------------------------------------------------------------------------------ happy path

def test_models_and_tokenize_speak_llama_cpp_pythons_api(stub):  # noqa: F811 (the fixture)
    c = client(stub)
    models = c.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["toy-reader"]
    tokens = c.post("/extras/tokenize", json={"input": "Hi!"}).json()["tokens"]
    assert tokens == toy.ToyAdapter().prompt("Hi!").ids == [toy.BOS, 43, 76, 4]  # BOS added, one id a character
    assert c.post("/extras/tokenize", json={"input": "Hi?"}).json()["tokens"][-1] != tokens[-1]  # control
    assert c.post("/extras/tokenize/count", json={"input": "Hi!"}).json() == {"count": 4}
    assert c.post("/extras/detokenize", json={"tokens": tokens + [toy.EOS]}).json() == {"text": "Hi!"}
    # what llama-cpp-python answers outside its API: no /health, no GET completions, a body that is not JSON
    assert c.get("/health").status_code == 404 and c.get("/props").status_code == 404
    assert c.get("/v1/completions").status_code == 405
    bad = c.post("/v1/completions", content=b"{not json")  # llama-cpp-python answers a plain-text 500
    assert bad.status_code == 500 and bad.text == "Internal Server Error"
    wrong = c.post("/extras/tokenize", json={"text": "Hi"})  # a validation error: llama-cpp-python's 500, not 422
    assert wrong.status_code == 500 and "'input'" in wrong.json()["error"]["message"]
    assert [(s.method, s.path, s.status) for s in stub.requests[:2]] == [("GET", "/v1/models", 200),
                                                                         ("POST", "/extras/tokenize", 200)]


def test_passkey_scores_1_through_the_stub_with_the_toys_log_probs(stub, passkey_sample):  # noqa: F811 (the fixture)
    from lctx import metrics
    from lctx.tasks.passkey import parse_answer

    task, sample = passkey_sample
    key, text = sample.meta["key"], sample.meta["prompt_text"]
    r = complete(client(stub), text, max_tokens=task.max_new_tokens, logprobs=1).json()
    choice = r["choices"][0]
    assert choice["text"] == f" {key}." and choice["finish_reason"] == "stop"  # EOS ends it, not returned
    assert metrics.exact(parse_answer(choice["text"]), key) == 1.0
    assert r["usage"] == {"prompt_tokens": sample.n_tokens, "completion_tokens": len(key) + 2,
                          "total_tokens": sample.n_tokens + len(key) + 2}
    assert r["model"] == "toy-reader" and r["object"] == "text_completion" and r["id"].startswith("cmpl-")
    lp = choice["logprobs"]
    toy_lm = toy.ToyAdapter("reader")
    answer_ids = toy_lm.encode(choice["text"])
    assert lp["token_logprobs"] == toy_lm.score_continuation(toy_lm.prefix(sample.input_ids), answer_ids).logprobs
    assert lp["tokens"] == list(choice["text"])
    assert lp["text_offset"] == list(range(len(text), len(text) + len(key) + 2))
    assert lp["top_logprobs"][0] == {" ": HIGH}  # logprobs=1: the favourite (here the token itself)
    # control: the control rule reads nothing, says "0" to the budget, and scores 0
    with StubServer("control") as ctl:
        r = complete(client(ctl), text, max_tokens=task.max_new_tokens).json()
    assert r["choices"][0]["text"] == "0" * task.max_new_tokens and r["choices"][0]["finish_reason"] == "length"
    assert metrics.exact(parse_answer(r["choices"][0]["text"]), key) == 0.0


def test_echoed_prompt_log_probs_are_the_causal_rule_by_hand(stub):  # noqa: F811 (the fixture)
    text = "The pass key is 7. The pass key is 7."
    r = complete(client(stub), text, max_tokens=1, echo=True, logprobs=0).json()
    choice = r["choices"][0]
    # the context ends with the whole target " 7.": EOS is favoured, so nothing is generated
    assert choice["text"] == text and r["usage"]["completion_tokens"] == 0 and choice["finish_reason"] == "stop"
    lp = choice["logprobs"]
    assert lp["tokens"] == list(text) and lp["text_offset"] == list(range(len(text)))  # BOS skipped
    # by hand: before the first sentence ends the key is unread (EOS favoured): every token LOW, the first null.
    # After it, the favourite continues " 7." from the longest prefix the context ends with: " " after a letter,
    # "7" after a space, "." after "7", EOS after "7."
    first = [None] + [LOW] * 17
    H, L = HIGH, LOW
    second = [L, L, L, L, H, L, L, L, L, H, L, L, L, H, L, L, H, H, H]  # " The pass key is 7."
    assert lp["token_logprobs"] == first + second
    assert lp["top_logprobs"][0] is None and lp["top_logprobs"][-1] == {".": HIGH}
    assert expected_logprobs([toy.BOS] + toy.ToyAdapter().encode(text))[2:] == first[1:] + second
    # control: the unigram rule (the toy's ppl distribution): log 0.25 for a space, the rest alike
    with StubServer("unigram") as uni:
        lp = complete(client(uni), text, max_tokens=1, echo=True, logprobs=0).json()["choices"][0]["logprobs"]
    sp, other = math.log(toy.P_SPACE), math.log((1 - toy.P_SPACE) / (toy.VOCAB - 1))
    echoed = lp["token_logprobs"][:len(text)]  # then the " " it generated (it favours " ", never EOS)
    assert echoed == [None] + [sp if ch == " " else other for ch in text[1:]] and lp["tokens"][len(text):] == [" "]
    assert sum(-v for v in echoed[1:]) / (len(text) - 1) == pytest.approx(
        toy.hand_nll(toy.ToyAdapter().encode(text[1:])))


def test_the_distribution_sums_to_one_and_top_k_ranks_it():
    m = StubModel("reader")
    for fav in (toy.EOS, toy.SPACE, toy.char_id("7")):
        assert sum(math.exp(m.logprob(t, fav)) for t in range(toy.VOCAB)) == pytest.approx(1.0, abs=1e-12)
        top = m.top(fav, 3)
        assert top[0] == (fav, HIGH) and [lp for _, lp in top[1:]] == [LOW, LOW]
    with pytest.raises(ValueError, match="rule 'reeder'"):
        StubModel("reeder")


def test_generated_and_echoed_log_probs_agree_unless_the_echo_lies():
    """The trust probe's identity: a token's log-prob when generated equals its log-prob echoed back in the
    prompt; echo_fault breaks it (a constant in nats, or off by one position) and leaves generation alone."""
    def probe(s):
        c = client(s)
        gen = complete(c, SHORT, max_tokens=9, logprobs=1).json()["choices"][0]
        echo = complete(c, SHORT + gen["text"], max_tokens=1, echo=True, logprobs=1).json()
        return gen, echo["choices"][0]["logprobs"]["token_logprobs"][-len(gen["logprobs"]["tokens"]):]

    with StubServer() as honest:
        gen, echoed = probe(honest)
    assert gen["text"] == " 4242." and gen["logprobs"]["token_logprobs"] == echoed == [HIGH] * 6  # control
    with StubServer(echo_fault=-0.5) as lying:
        gen2, echoed = probe(lying)
    assert gen2["logprobs"]["token_logprobs"] == [HIGH] * 6  # generation untouched
    assert echoed == pytest.approx([HIGH - 0.5] * 6, abs=1e-12)
    with StubServer(echo_fault="shift") as shifted:
        gen3, echoed = probe(shifted)
    assert gen3["logprobs"]["token_logprobs"] == [HIGH] * 6
    assert echoed == [LOW] + [HIGH] * 5  # " " reported with the log-prob of the "s" before it
    with StubServer(echo_fault="next") as nxt:  # llama-cpp-python's echo for a model without BOS
        gen4, echoed = probe(nxt)
    assert gen4["logprobs"]["token_logprobs"] == [HIGH] * 6
    assert echoed == [LOW] * 6  # " " scored as if it followed itself (where "4" is favoured), and so on
    with pytest.raises(ValueError, match="echo_fault"):
        StubServer(echo_fault="lie")


# ------------------------------------------------------------------------------------------------ settings

def test_truncation_cuts_the_prompt_to_its_last_n_tokens_and_says_so():
    sent = 1 + len(SHORT)
    with StubServer(n_ctx=40) as s:
        r = complete(client(s), SHORT, max_tokens=9, echo=True).json()
    assert r["usage"]["prompt_tokens"] == 40 < sent  # what a server backend must compare with what it sent
    assert r["choices"][0]["text"] == SHORT[-40:]  # the needle was cut: nothing read, nothing answered
    with StubServer(n_ctx=sent + 1) as s:  # control: the prompt fits
        r = complete(client(s), SHORT, max_tokens=9).json()
    assert r["usage"]["prompt_tokens"] == sent and r["choices"][0]["text"] == " 4242."
    with StubServer(n_ctx=40, overflow="error") as s:  # llama-cpp-python's own answer: a 400
        r = complete(client(s), SHORT, max_tokens=9)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert f"maximum context length is 40 tokens, however you requested {sent + 9} tokens" in r.json()["error"][
        "message"]


def test_max_tokens_0_generates_until_the_context_is_full():
    with StubServer("control", n_ctx=40) as s:
        r = complete(client(s), "ab", max_tokens=0).json()
        assert r["usage"]["completion_tokens"] == 37 and r["choices"][0]["finish_reason"] == "length"
        r = complete(client(s), "ab", max_tokens=5).json()  # control
        assert r["usage"]["completion_tokens"] == 5


def test_an_api_key_is_required_everywhere_and_never_recorded():
    key = "sk-stub-secret-31415"
    with StubServer(api_key=key) as s:
        for headers, want in (({}, 401), ({"Authorization": "Bearer sk-wrong"}, 401),
                              ({"Authorization": f"Bearer {key}"}, 200)):
            c = client(s, headers=headers)
            assert c.get("/v1/models").status_code == want
            assert c.post("/extras/tokenize", json={"input": "a"}).status_code == want
            r = complete(c, SHORT, max_tokens=9)
            assert r.status_code == want
            if want == 401:
                assert r.json() == {"detail": "Invalid API key"}
        assert [x.auth for x in s.requests] == ["missing"] * 3 + ["wrong"] * 3 + ["ok"] * 3
        assert key not in repr(s.requests)
    with StubServer() as s:  # control: no key asked, none needed
        assert client(s).get("/v1/models").status_code == 200 and s.requests[0].auth == "none"


def test_strict_model_names_a_wrong_model_as_vllm_does():
    with StubServer(strict_model=True) as s:
        c = client(s)
        r = complete(c, "ab", model="gpt-4", max_tokens=1)
        assert r.status_code == 404 and r.json()["message"] == "The model `gpt-4` does not exist."
        assert complete(c, "ab", model="toy-reader", max_tokens=1).status_code == 200
        assert complete(c, "ab", max_tokens=1).status_code == 200
    with StubServer() as s:  # control: llama-cpp-python serves its one model whatever the name asked
        assert complete(client(s), "ab", model="gpt-4", max_tokens=1).json()["model"] == "toy-reader"


def test_logits_all_false_refuses_log_probs_as_llama_cpp_python_does():
    with StubServer(logits_all=False) as s:
        c = client(s)
        r = complete(c, SHORT, max_tokens=9, logprobs=1)
        assert r.status_code == 500 and "logits_all=False" in r.json()["error"]["message"]
        assert complete(c, SHORT, max_tokens=9).json()["choices"][0]["text"] == " 4242."  # control


def test_token_id_prompts_only_where_the_server_takes_them():
    ids = toy.ToyAdapter().prompt(SHORT).ids
    with StubServer() as s:  # llama-cpp-python's server: prompt is a str or a list of one str
        c = client(s)
        assert complete(c, ids, max_tokens=9).status_code == 500
        assert complete(c, [SHORT], max_tokens=9).json()["choices"][0]["text"] == " 4242."
        assert complete(c, [SHORT, SHORT], max_tokens=9).status_code == 500
    with StubServer(token_prompts=True) as s:  # vLLM's: ids sent as they are, no BOS added
        r = complete(client(s), ids, max_tokens=9).json()
        assert r["usage"]["prompt_tokens"] == len(ids) and r["choices"][0]["text"] == " 4242."
        r = complete(client(s), ids[1:], max_tokens=9).json()
        assert r["usage"]["prompt_tokens"] == len(ids) - 1


def test_stop_strings_and_seeded_sampling():
    with StubServer() as s:
        c = client(s)
        r = complete(c, SHORT, max_tokens=9, stop=["2"]).json()["choices"][0]
        assert r["text"] == " 4" and r["finish_reason"] == "stop"  # cut before the stop string
        assert complete(c, SHORT, max_tokens=9, stop="x").json()["choices"][0]["text"] == " 4242."  # control
    with StubServer("control") as s:
        c = client(s)
        a, b, other = (complete(c, "ab", max_tokens=50, temperature=1.0, seed=seed).json()["choices"][0]["text"]
                       for seed in (1, 1, 2))
        assert a == b and a != other and a != "0" * 50 and 35 <= a.count("0") <= 50


def test_props_only_when_given():
    with StubServer(props={"total_slots": 4, "default_generation_settings": {"n_ctx": 4096}}) as s:
        assert client(s).get("/props").json()["total_slots"] == 4
    with StubServer() as s:
        assert client(s).get("/props").status_code == 404


def test_hold_shows_how_many_requests_are_in_flight():
    with StubServer() as s:
        def one():
            with client(s) as c:
                assert complete(c, "ab", max_tokens=1).status_code == 200

        s.hold()
        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while s.in_flight < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.in_flight == 4 and s.completions == 0  # all four arrived, none answered
        s.release()
        for t in threads:
            t.join()
        assert s.max_in_flight == 4 and s.completions == 4 and s.in_flight == 0
        s.max_in_flight = 0
        one()
        one()  # control: one at a time
        assert s.max_in_flight == 1


def test_delay_slows_each_completion():
    with StubServer(delay_s=0.3) as s:
        t0 = time.monotonic()
        assert complete(client(s), "ab", max_tokens=1).status_code == 200
        assert time.monotonic() - t0 >= 0.3
        assert s.delayed == 1
        assert client(s).post("/extras/tokenize", json={"input": "a"}).status_code == 200  # control: not delayed
        assert s.delayed == 1  # counted, not timed: a wall-clock upper bound fails on a busy machine (issue 42)


# ------------------------------------------------------------------------------------------------ one-shot faults

def test_a_429_burst_then_service():
    TESTED_FAULTS.add("429")
    with StubServer(retry_after="2") as s:
        c = client(s)
        s.fail("429", times=2)
        got = [complete(c, SHORT, max_tokens=9) for _ in range(3)]
        assert [r.status_code for r in got] == [429, 429, 200]
        assert got[0].headers["Retry-After"] == "2" and got[0].json()["error"]["type"] == "rate_limit_exceeded"
        assert "Retry-After" not in got[2].headers and got[2].json()["choices"][0]["text"] == " 4242."
        assert c.post("/extras/tokenize", json={"input": "a"}).status_code == 200  # another path: not limited
        assert s.count("/v1/completions") == 3 and s.count("/v1/completions", 429) == 2
        assert [x.fault for x in s.requests] == ["429", "429", None, None]


def test_500_and_503_then_service():
    TESTED_FAULTS.update(("500", "503"))
    with StubServer() as s:
        c = client(s)
        s.fail("500")
        s.fail("503", after=2)  # the 500's request and one more go first
        got = [complete(c, SHORT, max_tokens=9) for _ in range(4)]
        assert [r.status_code for r in got] == [500, 200, 503, 200]
        assert got[0].json()["error"]["type"] == "internal_server_error"
        assert got[2].json() == {"detail": "Service is not available"}


@pytest.mark.parametrize("fault", ["reset", "cut"])
def test_a_connection_reset_mid_request_then_service(fault):
    TESTED_FAULTS.add(fault)
    with StubServer() as s:
        c = client(s)
        s.fail(fault)
        with pytest.raises(httpx.TransportError) as err:
            complete(c, SHORT, max_tokens=9)
        assert isinstance(err.value, (httpx.ReadError, httpx.RemoteProtocolError))
        assert complete(c, SHORT, max_tokens=9).json()["choices"][0]["text"] == " 4242."  # control
        assert [x.status for x in s.requests] == ["reset", 200]


def test_a_server_that_dies_mid_sweep_and_comes_back():
    with StubServer() as s:
        c = client(s)
        s.die_after(2)
        assert [complete(c, SHORT, max_tokens=9).status_code for _ in range(2)] == [200, 200]
        with pytest.raises(httpx.TransportError):
            complete(c, SHORT, max_tokens=9)
        with pytest.raises(httpx.ConnectError):  # a new connection is refused
            complete(client(s), SHORT, max_tokens=9)
        assert s.completions == 2
        port = s.port
        s.revive()
        assert s.port == port and complete(client(s), SHORT, max_tokens=9).status_code == 200
        assert s.completions == 3


@pytest.mark.parametrize("fault,status,ctype", [("malformed", 200, "application/json"),
                                                ("200-html", 200, "text/html"), ("502-html", 502, "text/html"),
                                                ("empty-choices", 200, "application/json"),
                                                ("wrong-model", 200, "application/json")])
def test_replies_that_are_not_a_completion(fault, status, ctype):
    TESTED_FAULTS.add(fault)
    with StubServer() as s:
        c = client(s)
        s.fail(fault)
        r = complete(c, SHORT, max_tokens=9)
        assert r.status_code == status and r.headers["Content-Type"].startswith(ctype)
        if fault == "malformed":
            with pytest.raises(json.JSONDecodeError):
                json.loads(r.text)
        elif fault.endswith("html"):
            assert r.text.lstrip().lower().startswith(("<html", "<!doctype html"))
        elif fault == "empty-choices":
            assert r.json()["choices"] == [] and r.json()["object"] == "text_completion"
        else:
            assert r.json()["model"] == "some-other-model" != c.get("/v1/models").json()["data"][0]["id"]
            assert r.json()["choices"][0]["text"] == " 4242."  # a true completion, from another model's name
        ok = complete(c, SHORT, max_tokens=9)  # control: the next one is a completion of the served model
        assert ok.json()["choices"][0]["text"] == " 4242." and ok.json()["model"] == "toy-reader"
        assert s.completions == 1  # only the true one counts


def test_a_hang_trips_the_clients_timeout():
    TESTED_FAULTS.add("hang")
    with StubServer(hang_s=2.0) as s:
        s.fail("hang")
        with pytest.raises(httpx.ReadTimeout):
            complete(client(s, timeout=0.2), SHORT, max_tokens=9)
        assert complete(client(s), SHORT, max_tokens=9).status_code == 200  # control: answered


@pytest.mark.parametrize("fault", ["401-key", "403-key", "500-key"])
def test_a_key_echoing_fault_quotes_the_presented_key(fault):
    """Issue 42 item 1: the gateway faults echo the key the request presented (what lctx must redact); the stub
    itself never records it."""
    TESTED_FAULTS.add(fault)
    key = "sk-stubtest0123456789abcdef"
    with StubServer(api_key=key) as s:
        c = client(s, headers={"Authorization": f"Bearer {key}"})
        s.fail(fault, path="/v1/models")
        got = c.get("/v1/models")
        assert got.status_code == int(fault[:3]) and key in got.json()["error"]["message"]
        assert c.get("/v1/models").status_code == 200  # one-shot: then service
        assert all(key not in repr(x) for x in s.requests)


@pytest.mark.parametrize("fault", ["huge", "huge-stream"])
def test_a_huge_reply_is_written_until_the_client_leaves(fault):
    """Issue 42 item 2: a reply of ``huge_bytes`` (declared or chunked), written piece by piece; a client that reads
    a part and leaves stops it (``Seen.sent`` counts what went out)."""
    TESTED_FAULTS.add(fault)
    with StubServer(huge_bytes=1 << 20) as s:
        s.fail(fault, path="/v1/models")
        with client(s).stream("GET", "/v1/models") as r:
            assert r.status_code == 200
            assert ("content-length" in r.headers) == (fault == "huge")
            body = b"".join(r.iter_raw())
        assert len(body) == 1 << 20 and body.startswith(b'{"object": "list", "data": [')
        assert s.requests[-1].sent == 1 << 20
        assert client(s).get("/v1/models").json()["data"][0]["id"] == s.model_id  # control: one-shot


def test_drip_sends_the_true_reply_one_byte_at_a_time():
    """Issue 42 item 2: the dripped reply is the true one, status line included, one byte per write (so a client's
    per-read timeout, longer than ``drip_s``, never fires)."""
    TESTED_FAULTS.add("drip")
    with StubServer(drip_s=0.001) as s:
        s.fail("drip", path="/v1/models")
        got = client(s).get("/v1/models")
        assert got.status_code == 200 and got.json()["data"][0]["id"] == s.model_id
        assert s.requests[-1].sent > len(got.content)  # the status line and headers were dripped too


def test_nested_is_deep_json_under_every_bound():
    """Issue 42 (trial): a 200 JSON reply nested 20,000 deep, 40 KB: valid brackets, too deep for json's decoder."""
    TESTED_FAULTS.add("nested")
    with StubServer() as s:
        s.fail("nested", path="/v1/models")
        got = client(s).get("/v1/models")
        assert got.status_code == 200 and len(got.content) == 40_000 and got.content.startswith(b"[[[")
        with pytest.raises(RecursionError):
            json.loads(got.content)


def test_the_command_line_takes_settings_and_faults():
    """``python tests/stub_server.py --set KEY=JSON --fault NAME:PATH:TIMES``: the settings and faults of the Python
    API from a shell (a trial had to write its own launcher for them)."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = Path(__file__).with_name("stub_server.py")
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port), "--set", 'model_id="from-cli"',
                             "--fault", "503:/v1/models:1"], stdout=subprocess.PIPE, text=True)
    try:
        assert "stub server (reader) at" in proc.stdout.readline()
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5)
        assert c.get("/v1/models").status_code == 503
        assert c.get("/v1/models").json()["data"][0]["id"] == "from-cli"  # the fault's one time, then the setting
    finally:
        proc.terminate()
        proc.wait(10)


def test_faults_are_checked_by_name_and_all_have_a_test():
    with StubServer() as s:
        with pytest.raises(ValueError, match="fault '249'"):
            s.fail("249")
        s.fail("500", times=None, path="/extras/tokenize")  # every request to that path, from now on
        c = client(s)
        assert [c.post("/extras/tokenize", json={"input": "a"}).status_code for _ in range(3)] == [500] * 3
        assert complete(c, "ab", max_tokens=1).status_code == 200
        s.clear_faults()
        assert c.post("/extras/tokenize", json={"input": "a"}).status_code == 200
    # run last in this module (pytest keeps file order): every fault of FAULTS was exercised above
    missing = set(FAULTS) - TESTED_FAULTS
    if len(TESTED_FAULTS) > 2:  # the module ran, not one test picked with -k
        assert not missing, f"faults without a test: {sorted(missing)}"
