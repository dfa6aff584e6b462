"""An OpenAI-compatible stub server for the fault shapes a real server cannot be made to produce (issue 27).

The happy path and the cross-check of the server backend run against a real llama.cpp server
(llama-cpp-python's); this stub stands in for it where a test needs a server that rate-limits, fails, resets
connections, dies mid-sweep, answers malformed JSON or an HTML page, names the wrong model, asks for an API key or
reports prompt log-probabilities that disagree with its own generation. It speaks llama-cpp-python's flavour of the
API (its ``/extras/tokenize`` endpoints, its request defaults, its error bodies), from the standard library only:
an :class:`http.server.ThreadingHTTPServer` on a free port of 127.0.0.1, in a background thread.

Use it as a context manager, or through the :func:`stub` fixture (``from stub_server import stub`` in a test
module)::

    with StubServer(api_key="sk-test") as s:
        s.fail("429", times=3)        # the next three completion requests get 429 with Retry-After
        s.die_after(5)                # the server stops after five more completions
        run(f"--model {s.url}")       # http://127.0.0.1:PORT/v1
        s.count("/v1/completions")    # every request it got is recorded (never the key)

Behind it is :class:`StubModel`, the toy of ``tests/toy_adapter.py`` made a causal language model: character
tokens (BOS 0, EOS 1, unknown 2, printable ASCII from 3), and at each position one *favourite* next token with
probability ``P_FAVOURITE`` (0.9), every other id of the vocabulary ``(1 - P_FAVOURITE) / (VOCAB - 1)``. Rules:

* ``reader`` (default): once the context holds "The pass key is K." (its first such sentence), the favourite
  continues the target " K." from the longest prefix of it that the context ends with, and is EOS after the whole
  target; before the key is read, EOS. After a passkey prompt (which ends "The pass key is") it generates " K."
  then stops, so passkey scores 1.0 through it, and its log-probabilities of that answer are exactly those of
  ``ToyAdapter("reader").score_continuation``.
* ``control``: always favours "0" (greedy decoding never stops before ``max_tokens``).
* ``unigram``: always favours " " with probability ``P_SPACE`` (0.25), every other id ``(1 - P_SPACE) / (VOCAB -
  1)``: the toy's per-token NLL (``toy_adapter.hand_nll``) as a server's echoed prompt log-probabilities.

A server has one distribution, so the ``reader`` rule's echoed log-probabilities of a text without a pass key are
``log((1 - P_FAVOURITE) / (VOCAB - 1))`` per token, not the ppl unigram of ``ToyAdapter.token_nll``.

Endpoints (llama-cpp-python 0.3's):

* ``GET /v1/models``: ``{"object": "list", "data": [{"id": MODEL_ID, "object": "model", ...}]}``.
* ``POST /extras/tokenize`` ``{"input": text}`` -> ``{"tokens": [BOS, ...]}`` (BOS added, as llama-cpp-python's
  ``Llama.tokenize`` does by default); ``POST /extras/tokenize/count`` -> ``{"count": n}``;
  ``POST /extras/detokenize`` ``{"tokens": [...]}`` -> ``{"text": ...}``.
* ``POST /v1/completions``: ``prompt`` (a str, or a list of at most one str; a list of token ids only with
  ``token_prompts=True``, as vLLM takes them; otherwise llama-cpp-python's 500, as for any request that fails
  validation), ``max_tokens`` (default 16; 0 or null: until EOS or the context is
  full, as llama-cpp-python), ``temperature`` (0: greedy; above 0: sampled from the rule's distribution with
  ``seed``), ``stop`` (the text is cut before the first stop string of the list that appears, as llama-cpp-python
  does), ``echo`` (the prompt's text before the completion's, and its tokens' log-probabilities, the first one null),
  ``logprobs`` (N alternatives: ``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``). The prompt's
  tokens (BOS included) are ``usage.prompt_tokens``; EOS ends generation and is not returned.
* ``GET /props``: the ``props`` dict given (llama-server's endpoint; llama-cpp-python has none: 404 by default).

Faults, each countable in :attr:`StubServer.requests`:

* settings: ``n_ctx`` with ``overflow="truncate"`` (a longer prompt is cut to its last ``n_ctx`` tokens and
  ``usage.prompt_tokens`` says so) or ``"error"`` (llama-cpp-python's 400 ``context_length_exceeded``);
  ``api_key`` (``Authorization: Bearer KEY`` required on every endpoint, 401 otherwise); ``strict_model`` (a
  request naming another model gets vLLM's 404); ``logits_all=False`` (llama-cpp-python's 500 when log-probs are
  asked for); ``echo_fault`` (echoed prompt log-probabilities wrong while generated tokens' stay true: off by a
  constant in nats; ``"shift"``: each token reported with its predecessor's value; ``"next"``: each token reported
  with its log-probability as the token *after* itself, which is what llama-cpp-python 0.3.36 reports for a model
  without BOS, measured on SmolLM2-135M's GGUF, where " key" after "... The pass" came back as -8.35 instead of
  -0.65); ``penalty`` (llama-cpp-python's default ``repeat_penalty`` 1.1, which bends a temperature-0 completion off
  the model's first choice: the first generated token is "~", unless the request sends ``repeat_penalty`` 1.0);
  ``delay_s`` (seconds per completion); :meth:`StubServer.hold` / :meth:`StubServer.release` (completions
  wait at a gate, so a test sees how many are in flight at once: :attr:`StubServer.in_flight`).
* one-shot faults scheduled with :meth:`StubServer.fail`: :data:`FAULTS` (those that answer in the server's place,
  as a proxy or a rate limiter would, come before the API key check).
* bound faults (:data:`BOUND_FAULTS`, issue 42 item 2), scheduled with :meth:`StubServer.fail` on any path: a
  2 GB reply with or without a Content-Length (``huge_bytes``; written piece by piece, never held; :attr:`Seen.sent`
  counts what went out before the client left), and a reply dripped one byte every ``drip_s`` seconds from its
  status line on.
* value faults (issue 42 item 3), settings: ``logprob_fault`` (a value, e.g. 3.0, NaN, inf, 1e300, that every
  reported log-probability becomes: ``logprob_fault_in="token"``, the token's own in ``token_logprobs`` and
  ``top_logprobs``; ``"top"``, the other alternatives only; ``"bare"``: true values, every ``top_logprobs`` entry
  ``{}``), ``usage_fault`` (``usage[usage_field]`` as a string,
  NaN, ``true``, -1 or a fraction: :data:`USAGE_FAULTS`), ``extra_models`` (``/v1/models`` lists that many more
  models), ``tokenize_fail_after`` (``/extras/tokenize`` answers 400 after that many requests).
* :meth:`StubServer.die_after`: the server stops after n more completions (connections refused, open ones
  reset); :meth:`StubServer.revive` starts it again on the same port.

Run it by hand (a server for trying a client): ``python tests/stub_server.py --port 8000 [--rule control]
[--set KEY=JSON ...] [--fault NAME[:PATH[:TIMES]] ...]`` (every setting and fault above, e.g. ``--fault
drip:/v1/models --set drip_s=0.3``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import toy_adapter as toy

#: the one-shot faults of :meth:`StubServer.fail`
FAULTS = {
    "429": "429 Too Many Requests with a Retry-After header and an OpenAI-style error body",
    "500": "500 with llama-cpp-python's internal_server_error body",
    "503": "503 Service Unavailable with llama-cpp-python's {'detail': 'Service is not available'}",
    "502-html": "502 Bad Gateway as a proxy's HTML page (text/html)",
    "200-html": "200 OK with an HTML page (text/html): a captive portal or a misrouted proxy",
    "malformed": "200 OK, application/json, a body cut mid-object (not JSON)",
    "empty-choices": "200 OK, a well-formed completion whose choices list is empty",
    "wrong-model": "200 OK, a true completion whose model field names another model than /v1/models",
    "reset": "the connection reset (TCP RST) after the request is read, no reply",
    "cut": "the status line, headers and half the body, then a reset",
    "hang": "no reply for hang_s seconds (a client timeout fires first), then the true reply",
    # an OpenAI-style gateway's "Incorrect API key provided: sk-..." (issue 42 item 1): the presented key echoed
    "401-key": "401 whose OpenAI-style error body quotes the API key the request presented (Authorization: Bearer)",
    "403-key": "403 whose OpenAI-style error body quotes the API key the request presented",
    "500-key": "500 whose error body quotes the API key the request presented and its Authorization header",
}
#: the faults that answer in the server's place; the others (hang, wrong-model, empty-choices) reach the model
_REPLYING = ("429", "500", "503", "502-html", "200-html", "malformed", "reset", "cut", "401-key", "403-key", "500-key")
RULES = ("reader", "control", "unigram")
#: llama-cpp-python's default context, the cap on ``max_tokens`` 0 or null when no ``n_ctx`` is set
DEFAULT_N_CTX = 2048
_KEY = re.compile(r"The pass key is (\d+)\.")
_HTML_502 = ("<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
             "</center>\r\n<hr><center>nginx/1.24.0</center>\r\n</body>\r\n</html>\r\n")
_HTML_200 = ("<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><h1>Network login</h1>"
             "<p>Sign in to continue.</p></body></html>\n")
#: reply-size and time faults (issue 42 item 2), on any path (``fail(fault, path=...)``)
BOUND_FAULTS = {
    "huge": "200 OK, application/json, Content-Length huge_bytes (default 2 GiB), the body written in 64 KiB pieces "
            "until the client goes away (a 2 GB reply)",
    "huge-stream": "the same without a Content-Length (chunked): the size is known only by reading it",
    "drip": "the true reply, status line and headers included, one byte every drip_s seconds",
    "nested": "200 OK, application/json, a list nested 20,000 deep (40 KB, under every bound): json's decoder "
              "recurses once a level",
}
FAULTS.update(BOUND_FAULTS)
#: ``usage_fault``: what the reply's ``usage[usage_field]`` becomes (issue 42 item 3)
USAGE_FAULTS = {"str": lambda n: str(n), "nan": lambda n: float("nan"), "bool": lambda n: True,
                "negative": lambda n: -1, "float": lambda n: n + 0.5}


# ----------------------------------------------------------------------------------------------- the model

class StubModel:
    """The toy rule as a causal language model: the favourite after a context is a function of that context alone
    (module docstring), so generated tokens and the same tokens echoed back as a prompt get the same
    log-probabilities (what a trust probe checks)."""

    def __init__(self, rule: str = "reader"):
        if rule not in RULES:
            raise ValueError(f"rule {rule!r}: use one of {', '.join(RULES)}")
        self.rule = rule
        self._chars = toy.ToyAdapter("reader")
        self._top: dict = {}

    # -- text
    def encode(self, text: str) -> list[int]:
        """One id per character, no BOS."""
        return self._chars.encode(text)

    def decode(self, ids) -> str:
        """The text of ``ids`` (BOS and EOS dropped, unknown as "?")."""
        return self._chars.decode(ids)

    def piece(self, token: int) -> str:
        """The text of one token ("" for BOS and EOS)."""
        return self.decode([token])

    # -- the distribution
    def p_top(self) -> float:
        """The favourite's probability."""
        return toy.P_SPACE if self.rule == "unigram" else toy.P_FAVOURITE

    def logprob(self, token: int, favourite: int) -> float:
        """log p(token) when ``favourite`` is favoured."""
        p = self.p_top()
        return math.log(p if token == favourite else (1 - p) / (toy.VOCAB - 1))

    def favourites(self, ids: list[int]) -> list[int]:
        """The favourite after each prefix ``ids[:i + 1]``, for every i (one pass)."""
        if self.rule == "control":
            return [toy.char_id("0")] * len(ids)
        if self.rule == "unigram":
            return [toy.SPACE] * len(ids)
        ends, n = [], 0
        for t in ids:  # characters decoded up to and including each token
            n += len(self.piece(t))
            ends.append(n)
        m = _KEY.search(self.decode(ids))
        target = self.encode(f" {m.group(1)}.") if m else []
        out = []
        for i in range(len(ids)):
            # the first "The pass key is K." of a prefix is the first one of the whole text, once it is complete
            out.append(_continue(ids, i + 1, target) if m and ends[i] >= m.end() else toy.EOS)
        return out

    def favourite(self, ids: list[int]) -> int:
        """The favourite after the whole of ``ids``."""
        if self.rule != "reader":
            return self.favourites(ids[-1:])[0]
        m = _KEY.search(self.decode(ids))
        return _continue(ids, len(ids), self.encode(f" {m.group(1)}.")) if m else toy.EOS

    def top(self, favourite: int, k: int) -> list[tuple[int, float]]:
        """The ``k`` most likely ids and their log-probabilities, as llama-cpp-python orders them (log-prob, then
        id, both descending)."""
        if (favourite, k) not in self._top:
            ranked = sorted(((self.logprob(t, favourite), t) for t in range(toy.VOCAB)), reverse=True)
            self._top[(favourite, k)] = [(t, lp) for lp, t in ranked[:k]]
        return self._top[(favourite, k)]

    def prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """log p(ids[i] | ids[:i]) for every i; None for the first (nothing before it)."""
        favs = self.favourites(ids)
        return [None] + [self.logprob(ids[i], favs[i - 1]) for i in range(1, len(ids))]


def _continue(ids: list[int], n: int, target: list[int]) -> int:
    """The reader's favourite after ``ids[:n]``: EOS when it ends with the whole target, else the target's next id
    after the longest prefix of it that ``ids[:n]`` ends with."""
    for j in range(min(len(target), n), -1, -1):
        if ids[n - j:n] == target[:j]:
            return toy.EOS if j == len(target) else target[j]
    return target[0]  # not reached: j = 0 always matches


def expected_logprobs(ids: list[int], rule: str = "reader") -> list[float | None]:
    """What the stub reports as log p(ids[i] | ids[:i]) (None first): the values a test compares with."""
    return StubModel(rule).prompt_logprobs(ids)


# ----------------------------------------------------------------------------------------------- the record

@dataclass
class Seen:
    """One request the stub got: ``status`` is the HTTP status it answered, or ``"reset"`` (no reply, the
    connection reset), ``"dead"`` (arrived while the server was dying) or None while in flight. ``auth``:
    ``"none"`` (no key required), ``"ok"``, ``"missing"`` or ``"wrong"``: the key itself is never kept."""

    method: str
    path: str
    body: object
    auth: str
    fault: str | None = None
    status: int | str | None = None
    t_start: float = field(default_factory=time.monotonic)
    t_end: float | None = None
    sent: int = 0  # bytes of the reply written so far (the bound faults: what the client took before it went away)


class _Dropped(Exception):
    """The handler reset its connection: nothing more is written."""


# ----------------------------------------------------------------------------------------------- the server

class StubServer:
    """The stub: a :class:`StubModel` behind llama-cpp-python's endpoints, with switchable faults (module
    docstring). Every setting is an attribute that a test may change while it runs."""

    def __init__(self, rule: str = "reader", *, model_id: str | None = None, api_key: str | None = None,
                 n_ctx: int | None = None, overflow: str = "truncate", logits_all: bool = True,
                 token_prompts: bool = False, strict_model: bool = False, echo_fault: float | str | None = None,
                 delay_s: float = 0.0, retry_after: str | None = "0", hang_s: float = 30.0, penalty: bool = False,
                 props: dict | None = None, port: int = 0, extra_models: int = 0, logprob_fault=None,
                 logprob_fault_in: str = "token", usage_fault: str | None = None,
                 usage_field: str = "prompt_tokens", tokenize_fail_after: int | None = None,
                 huge_bytes: int = 2 << 30, drip_s: float = 0.05):
        if overflow not in ("truncate", "error"):
            raise ValueError(f"overflow {overflow!r}: use truncate or error")
        if echo_fault not in (None, "shift", "next") and not isinstance(echo_fault, (int, float)):
            raise ValueError(f"echo_fault {echo_fault!r}: a number of nats, 'shift' or 'next'")
        self.model = StubModel(rule)
        self.model_id = model_id if model_id is not None else f"toy-{rule}"
        # value faults (issue 42 items 2-3): see the module docstring
        if logprob_fault_in not in ("token", "top", "bare"):
            raise ValueError(f"logprob_fault_in {logprob_fault_in!r}: token, top or bare")
        if usage_fault not in (None, *USAGE_FAULTS):
            raise ValueError(f"usage_fault {usage_fault!r}: one of {', '.join(USAGE_FAULTS)}")
        self.extra_models, self.logprob_fault, self.logprob_fault_in = extra_models, logprob_fault, logprob_fault_in
        self.usage_fault, self.usage_field, self.tokenize_fail_after = usage_fault, usage_field, tokenize_fail_after
        self.huge_bytes, self.drip_s = huge_bytes, drip_s
        self._tokenized = 0
        self.api_key, self.n_ctx, self.overflow = api_key, n_ctx, overflow
        self.logits_all, self.token_prompts, self.strict_model = logits_all, token_prompts, strict_model
        self.echo_fault, self.delay_s, self.retry_after, self.hang_s = echo_fault, delay_s, retry_after, hang_s
        self.props = props
        self.penalty = penalty
        self.delayed = 0  # requests held for delay_s (counted, so a test needs no wall-clock bound on the others)
        self._port = port
        self._lock = threading.Lock()
        self._log: list[Seen] = []
        self._scheduled: list[list] = []  # [path, first index, last index (exclusive) or None, fault]
        self._die_at: int | None = None
        self._ok_completions = 0
        self._in_flight = 0
        self.max_in_flight = 0
        self._conns: set = set()
        self._dead = False
        self._closing = threading.Event()
        self._gate = threading.Event()
        self._gate.set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life
    def start(self) -> StubServer:
        """Listen on 127.0.0.1 (a free port the first time, the same port after :meth:`revive`)."""
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.stub = self
        self._port = self._httpd.server_address[1]
        self._dead = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=f"stub-server-{self._port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening, reset open connections and wake any hanging or held handler."""
        self._closing.set()
        self._gate.set()
        self._stop()

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def die(self) -> None:
        """Die now, as a killed server: refuse new connections, reset the open ones."""
        self._dead = True
        self._stop()

    def revive(self) -> StubServer:
        """Start again on the same port, after :meth:`die` (the record and the faults not yet used are kept;
        :meth:`die_after` is cleared)."""
        with self._lock:
            self._die_at = None
        return self.start()

    def _stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # -- where
    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``: what ``lctx run --model`` takes."""
        return self.base_url + "/v1"

    # -- faults
    def fail(self, fault: str, times: int | None = 1, *, path: str = "/v1/completions", after: int = 0) -> None:
        """Give the next ``times`` requests to ``path`` (all of them: None), after letting ``after`` more through,
        the one-shot ``fault`` (:data:`FAULTS`)."""
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r}: use one of {', '.join(FAULTS)}")
        with self._lock:
            first = sum(1 for s in self._log if s.path == path) + after
            self._scheduled.append([path, first, None if times is None else first + times, fault])

    def die_after(self, n: int) -> None:
        """Die (:meth:`die`) right after the n-th more completion answered 200 (0: at the next request)."""
        with self._lock:
            self._die_at = self._ok_completions + n
        if n == 0:
            self.die()

    def hold(self) -> None:
        """Make completions wait (in flight, counted) until :meth:`release`."""
        self._gate.clear()

    def release(self) -> None:
        """Let held completions go on."""
        self._gate.set()

    @property
    def in_flight(self) -> int:
        """Completion requests being handled now."""
        with self._lock:
            return self._in_flight

    def clear_faults(self) -> None:
        """Drop the scheduled one-shot faults and :meth:`die_after`."""
        with self._lock:
            self._scheduled.clear()
            self._die_at = None

    # -- the record
    @property
    def requests(self) -> list[Seen]:
        """Every request so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._log)

    def count(self, path: str | None = None, status: int | str | None = None) -> int:
        """How many requests (to ``path``, answered ``status``) it got."""
        return sum(1 for s in self.requests if (path is None or s.path == path)
                   and (status is None or s.status == status))

    @property
    def completions(self) -> int:
        """Completions answered 200 with a true completion."""
        with self._lock:
            return self._ok_completions

    # -- used by the handler
    def _arrive(self, method: str, path: str, body, auth: str) -> Seen:
        with self._lock:
            index = sum(1 for s in self._log if s.path == path)
            seen = Seen(method, path, body, auth)
            for p, first, last, fault in self._scheduled:
                if p == path and first <= index and (last is None or index < last):
                    seen.fault = fault
                    break
            self._log.append(seen)
            return seen

    def _completed(self) -> bool:
        """Count a 200 completion; True when it is the one to die after."""
        with self._lock:
            self._ok_completions += 1
            return self._die_at is not None and self._ok_completions >= self._die_at


class _Handler(BaseHTTPRequestHandler):
    """One connection (HTTP/1.1, kept alive as uvicorn does)."""

    protocol_version = "HTTP/1.1"
    server_version = "lctx-stub/1"

    @property
    def stub(self) -> StubServer:
        return self.server.stub

    def log_message(self, format, *args):  # quiet: the record is StubServer.requests
        """No access log on stderr."""

    def setup(self):
        """Track the connection, so that death resets it."""
        super().setup()
        # no Nagle delay (as uvicorn sets it): the status line, headers and body go out in separate writes, and a
        # kept-alive client's delayed ACK would hold each reply ~40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.stub._lock:
            self.stub._conns.add(self.connection)

    def finish(self):
        """Forget the connection; a reset one may fail to flush."""
        with self.stub._lock:
            self.stub._conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def handle(self):
        """Serve requests until the client closes; a reset or a dead peer ends it quietly."""
        try:
            super().handle()
        except (_Dropped, OSError):
            pass

    def do_GET(self):
        """GET endpoints."""
        self._dispatch("GET")

    def do_POST(self):
        """POST endpoints."""
        self._dispatch("POST")

    # -- the request
    def _dispatch(self, method: str) -> None:
        stub = self.stub
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        seen = stub._arrive(method, self.path.split("?", 1)[0], body, self._auth())
        try:
            if stub._dead:
                seen.status = "dead"
                self._reset()
            if seen.fault in _REPLYING or seen.fault in ("huge", "huge-stream", "nested"):  # in front of the server (a proxy,
                # a rate limiter, the network)
                return self._fault(seen)
            if seen.fault == "hang":
                stub._closing.wait(stub.hang_s)
            if seen.auth in ("missing", "wrong"):
                return self._json(seen, 401, {"detail": "Invalid API key"})
            self._route(seen, method, body)  # wrong-model, empty-choices: altered by _completions
        finally:
            seen.t_end = time.monotonic()

    def _auth(self) -> str:
        if self.stub.api_key is None:
            return "none"
        got = self.headers.get("Authorization")
        if not got:
            return "missing"
        return "ok" if got == f"Bearer {self.stub.api_key}" else "wrong"

    def _route(self, seen: Seen, method: str, body) -> None:
        stub, path = self.stub, self.path.split("?", 1)[0]
        routes = {("GET", "/v1/models"): self._models, ("POST", "/v1/completions"): self._completions,
                  ("POST", "/extras/tokenize"): self._tokenize, ("POST", "/extras/tokenize/count"): self._count,
                  ("POST", "/extras/detokenize"): self._detokenize}
        if stub.props is not None:
            routes[("GET", "/props")] = lambda s, b: self._json(s, 200, stub.props)
        fn = routes.get((method, path))
        if fn is None:
            known = {p for _, p in routes}
            self._json(seen, 405 if path in known else 404,
                       {"detail": "Method Not Allowed" if path in known else "Not Found"})
            return
        if method == "POST" and not isinstance(body, dict):  # llama-cpp-python's error handler fails on it too
            self._send(seen, 500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        fn(seen, body)

    # -- endpoints
    def _models(self, seen: Seen, body) -> None:
        extra = [{"id": f"{self.stub.model_id}-copy-{i:06d}", "object": "model"} for i in range(self.stub.extra_models)]
        self._json(seen, 200, {"object": "list", "data": [{"id": self.stub.model_id, "object": "model",
                                                           "owned_by": "me", "permissions": []}] + extra})

    def _tokenize(self, seen: Seen, body: dict) -> None:
        if not isinstance(body.get("input"), str):
            return self._invalid(seen, "input", "Field required" if "input" not in body else "Input should be a "
                                 "valid string")
        with self.stub._lock:
            self.stub._tokenized += 1
            failing = self.stub.tokenize_fail_after is not None and self.stub._tokenized > self.stub.tokenize_fail_after
        if failing:  # a tokenizer endpoint that starts refusing part-way through a run
            return self._json(seen, 400, {"error": {"message": "tokenizer unavailable", "type": "invalid_request_error",
                                                    "param": None, "code": None}})
        self._json(seen, 200, {"tokens": [toy.BOS] + self.stub.model.encode(body["input"])})

    def _count(self, seen: Seen, body: dict) -> None:
        if not isinstance(body.get("input"), str):
            return self._invalid(seen, "input", "Input should be a valid string")
        self._json(seen, 200, {"count": 1 + len(self.stub.model.encode(body["input"]))})

    def _detokenize(self, seen: Seen, body: dict) -> None:
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return self._invalid(seen, "tokens", "Input should be a valid list of integers")
        self._json(seen, 200, {"text": self.stub.model.decode(tokens)})

    def _completions(self, seen: Seen, body: dict) -> None:
        stub = self.stub
        if stub.strict_model and body.get("model") not in (None, stub.model_id):
            return self._json(seen, 404, {"object": "error", "message": f"The model `{body['model']}` does not "
                                          "exist.", "type": "NotFoundError", "param": None, "code": 404})
        with stub._lock:
            stub._in_flight += 1
            stub.max_in_flight = max(stub.max_in_flight, stub._in_flight)
        try:
            stub._gate.wait()
            if stub.delay_s:
                with stub._lock:
                    stub.delayed += 1
                stub._closing.wait(stub.delay_s)
            status, payload = self._complete(body)
        finally:
            with stub._lock:
                stub._in_flight -= 1
        if status == 200 and seen.fault == "wrong-model":
            payload["model"] = "some-other-model"
        if status == 200 and seen.fault == "empty-choices":
            payload["choices"] = []
        dying = status == 200 and not seen.fault and stub._completed()  # counted before the client can look
        self._json(seen, status, payload)
        if dying:
            stub.die()

    def _complete(self, body: dict) -> tuple[int, dict]:
        """(status, reply) of one completion request."""
        stub, model = self.stub, self.stub.model
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if not stub.token_prompts:
                return 500, _validation("prompt", "Input should be a valid string")
            ids, text = list(prompt), model.decode(prompt)
        else:
            if isinstance(prompt, list):
                if len(prompt) > 1 or not all(isinstance(p, str) for p in prompt):
                    return 500, _validation("prompt", "Input should be a valid string")
                prompt = prompt[0] if prompt else ""
            if not isinstance(prompt, str):
                return 500, _validation("prompt", "Input should be a valid string")
            ids, text = [toy.BOS] + model.encode(prompt), prompt
        max_tokens = body.get("max_tokens", 16)
        logprobs = body.get("logprobs")
        if logprobs is not None and not stub.logits_all:
            return 500, _server_error("logprobs is not supported for models created with logits_all=False")
        if stub.n_ctx is not None and len(ids) >= stub.n_ctx:
            if stub.overflow == "error":
                return 400, _context_exceeded(stub.n_ctx, len(ids), max_tokens)
            if len(ids) > stub.n_ctx:
                ids = ids[-stub.n_ctx:]
                text = model.decode(ids)
        if max_tokens is None or max_tokens <= 0:
            max_tokens = max((stub.n_ctx or DEFAULT_N_CTX) - len(ids), 1)
        temperature = body.get("temperature", 0.8)
        seed = body.get("seed")
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)

        rng = random.Random(seed)
        out, favs, finish, cut = [], [], "length", None
        while len(out) < max_tokens:
            fav = model.favourite(ids + out)
            tok = fav if not temperature or temperature <= 0 else _sample(model, fav, rng)
            if stub.penalty and not out and body.get("repeat_penalty", 1.1) != 1.0:  # a repetition penalty bends it
                tok = toy.char_id("~") if fav != toy.char_id("~") else toy.char_id("}")
            if tok == toy.EOS:
                finish = "stop"
                break
            out.append(tok)
            favs.append(fav)
            so_far = model.decode(out)
            hit = [s for s in stops if s and s in so_far]
            if hit:
                cut, finish = so_far[: so_far.index(hit[0])], "stop"
                break
        completion = model.decode(out) if cut is None else cut
        choice = {"text": (text + completion) if body.get("echo") else completion, "index": 0,
                  "logprobs": None if logprobs is None else self._logprobs(ids, text, out, favs, int(logprobs),
                                                                           bool(body.get("echo"))),
                  "finish_reason": finish}
        return 200, {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
                     "model": stub.model_id, "choices": [choice],
                     "usage": self._usage({"prompt_tokens": len(ids), "completion_tokens": len(out),
                                           "total_tokens": len(ids) + len(out)})}

    def _usage(self, usage: dict) -> dict:
        """``usage`` with :attr:`StubServer.usage_fault` applied to its ``usage_field``."""
        stub = self.stub
        if stub.usage_fault is not None:
            usage[stub.usage_field] = USAGE_FAULTS[stub.usage_fault](usage[stub.usage_field])
        return usage

    def _logprobs(self, ids: list[int], text: str, out: list[int], favs: list[int], k: int, echo: bool) -> dict:
        """The OpenAI completions ``logprobs`` object, llama-cpp-python's way: with echo the prompt's tokens (BOS
        skipped, the first one's values null) before the completion's."""
        model, stub = self.stub.model, self.stub
        tokens, lps, tops, offsets = [], [], [], []
        if echo:
            all_ids = ids + out
            after = model.favourites(all_ids)  # the favourite after each token
            all_favs = [None] + after[:-1]  # the favourite before each token
            true = [None if f is None else model.logprob(t, f) for t, f in zip(all_ids, all_favs)]
            n_prompt = len(ids)
            reported = list(true)
            if stub.echo_fault == "shift":  # each prompt token reported with its predecessor's value
                reported[:n_prompt] = [None] + true[: n_prompt - 1]
            elif stub.echo_fault == "next":  # each prompt token scored by the distribution after itself
                reported[:n_prompt] = [model.logprob(t, f) for t, f in zip(all_ids[:n_prompt], after[:n_prompt])]
            elif stub.echo_fault is not None:
                reported[:n_prompt] = [None if v is None else v + float(stub.echo_fault) for v in true[:n_prompt]]
            rows = [(i, t) for i, t in enumerate(all_ids) if t != toy.BOS]
            base = 0
        else:
            all_ids, all_favs, reported = out, favs, [model.logprob(t, f) for t, f in zip(out, favs)]
            rows, base = list(enumerate(out)), len(text)
        starts, n_chars = [], 0  # characters before each token
        for t in all_ids:
            starts.append(n_chars)
            n_chars += len(model.piece(t))
        for n, (i, t) in enumerate(rows):
            piece = model.piece(t)
            tokens.append(piece)
            offsets.append(base + starts[i])
            if (echo and n == 0) or reported[i] is None:
                lps.append(None)
                tops.append(None)
                continue
            if stub.logprob_fault_in == "bare":  # true values, no alternatives at all: {} where k were asked
                lps.append(reported[i])
                tops.append({})
                continue
            bad = stub.logprob_fault
            value = reported[i] if bad is None or stub.logprob_fault_in == "top" else bad
            lps.append(value)
            top = {model.piece(a): (lp if bad is None or stub.logprob_fault_in == "token" else bad)
                   for a, lp in model.top(all_favs[i], k)}
            top[piece] = value
            tops.append(top)
        return {"tokens": tokens, "text_offset": offsets, "token_logprobs": lps, "top_logprobs": tops}

    # -- faults
    def _fault(self, seen: Seen) -> None:
        stub, fault = self.stub, seen.fault
        if fault == "429":
            headers = {} if stub.retry_after is None else {"Retry-After": stub.retry_after}
            self._json(seen, 429, {"error": {"message": "Rate limit reached, retry after "
                                             f"{stub.retry_after or 'a while'} s", "type": "rate_limit_exceeded",
                                             "param": None, "code": "rate_limit_exceeded"}}, headers)
        elif fault == "500":
            self._json(seen, 500, _server_error("llama_decode returned -3"))
        elif fault == "503":
            self._json(seen, 503, {"detail": "Service is not available"})
        elif fault == "502-html":
            self._send(seen, 502, _HTML_502.encode(), "text/html")
        elif fault == "200-html":
            self._send(seen, 200, _HTML_200.encode(), "text/html; charset=utf-8")
        elif fault == "malformed":
            self._send(seen, 200, b'{"id": "cmpl-1", "object": "text_completion", "choices": [{"text": " 1',
                       "application/json")
        elif fault in ("401-key", "403-key", "500-key"):  # the presented key echoed (never kept in the record)
            got = self.headers.get("Authorization") or ""
            key = got[len("Bearer "):] if got.startswith("Bearer ") else got
            msg = f"Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys."
            if fault == "500-key":
                msg = f"upstream auth failed for Authorization: {got} (key {key})"
            self._json(seen, int(fault[:3]), {"error": {"message": msg, "type": "invalid_request_error", "param": None,
                                                        "code": "invalid_api_key"}})
        elif fault in ("huge", "huge-stream"):
            self._huge(seen, chunked=fault == "huge-stream")
        elif fault == "nested":
            self._send(seen, 200, b"[" * 20_000 + b"]" * 20_000, "application/json")
        elif fault == "reset":
            seen.status = "reset"
            self._reset()
        elif fault == "cut":
            payload = json.dumps(self._complete(self._body(seen))[1]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            seen.status = "reset"
            self._reset()

    def _body(self, seen: Seen) -> dict:
        return seen.body if isinstance(seen.body, dict) else {}

    def _huge(self, seen: Seen, chunked: bool) -> None:
        """A 200 JSON reply of ``huge_bytes`` (declared, or chunked without a length), written in 64 KiB pieces made
        once, until it is all written or the client goes away (a write fails): never held whole."""
        total = self.stub.huge_bytes
        piece = (b'{"id": "filler-model", "object": "model"}, ' * 1600)[: 64 * 1024]
        seen.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(total))
        self.end_headers()
        head = b'{"object": "list", "data": ['
        left = total
        first = True
        while left > 0 and not self.stub._closing.is_set():
            data = (head + piece)[: min(len(piece), left)] if first else piece[: min(len(piece), left)]
            first = False
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            self.wfile.flush()
            seen.sent += len(data)
            left -= len(data)
        if chunked and left <= 0:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    # -- writing
    def _invalid(self, seen: Seen, where: str, msg: str) -> None:
        self._json(seen, 500, _validation(where, msg))

    def _json(self, seen: Seen, status: int, payload, headers: dict | None = None) -> None:
        self._send(seen, status, json.dumps(payload).encode(), "application/json", headers)

    def _send(self, seen: Seen, status: int, data: bytes, ctype: str, headers: dict | None = None) -> None:
        if self.stub._dead:
            seen.status = "dead"
            self._reset()
        seen.status = status  # recorded before the client can see the reply
        if seen.fault == "drip":
            return self._drip(seen, status, data, ctype, headers)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _drip(self, seen: Seen, status: int, data: bytes, ctype: str, headers: dict | None) -> None:
        """The reply written one byte every ``drip_s`` seconds, from the status line on (each byte alone: a client's
        inactivity timeout never fires)."""
        lines = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}", f"Content-Type: {ctype}",
                 f"Content-Length: {len(data)}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + data
        for i in range(len(raw)):
            if self.stub._closing.wait(self.stub.drip_s):
                return
            self.wfile.write(raw[i:i + 1])
            self.wfile.flush()
            seen.sent += 1

    def _reset(self) -> None:
        """Reset the connection (an RST, no reply and no FIN before it) and stop handling it."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()  # the socket closes only once its file objects are closed
            self.connection.close()
        except OSError:
            pass
        raise _Dropped


def _sample(model: StubModel, favourite: int, rng: random.Random) -> int:
    """One draw from the rule's distribution: the favourite with its probability, else any other id uniformly."""
    if rng.random() < model.p_top():
        return favourite
    other = rng.randrange(toy.VOCAB - 1)
    return other + (other >= favourite)


def _validation(field_name: str, msg: str) -> dict:
    """What llama-cpp-python 0.3.36 answers a request that fails validation (a prompt of token ids, a missing
    field): not FastAPI's 422, but its error handler's 500 with the validation message (measured)."""
    return _server_error(f"1 validation error:\n  {{'loc': ('body', '{field_name}'), 'msg': '{msg}'}}")


def _server_error(message: str) -> dict:
    """llama-cpp-python's 500 body for an unexpected exception."""
    return {"error": {"message": message, "type": "internal_server_error", "param": None, "code": None}}


def _context_exceeded(n_ctx: int, prompt_tokens: int, max_tokens) -> dict:
    """llama-cpp-python's 400 body for a prompt of ``prompt_tokens`` >= ``n_ctx``."""
    completion = max_tokens or 0
    return {"error": {"message": f"This model's maximum context length is {n_ctx} tokens, however you requested "
                                 f"{prompt_tokens + completion} tokens ({prompt_tokens} in your prompt; {completion} "
                                 "for the completion). Please reduce your prompt; or completion length.",
                      "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}


try:  # a fixture for test modules (``from stub_server import stub``); the module runs without pytest too
    import pytest

    @pytest.fixture
    def stub():
        """A running :class:`StubServer` (reader rule, no faults), closed after the test."""
        with StubServer() as s:
            yield s
except ImportError:  # pragma: no cover
    pass


def main(argv=None) -> None:
    """``python tests/stub_server.py --port 8000``: serve until interrupted."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--rule", choices=RULES, default="reader")
    ap.add_argument("--n-ctx", type=int)
    ap.add_argument("--api-key-env", help="require the key held in this environment variable")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="a StubServer setting, its value as JSON, e.g. --set logprob_fault=3.0 --set "
                         "'props={\"default_generation_settings\": {\"n_ctx\": 1024}}' --set drip_s=0.3")
    ap.add_argument("--fault", action="append", default=[], metavar="NAME[:PATH[:TIMES]]",
                    help=f"a fault on every request to PATH (default /v1/completions), or on the next TIMES; one of "
                         f"{', '.join(FAULTS)}")
    a = ap.parse_args(argv)
    import os

    key = os.environ.get(a.api_key_env) if a.api_key_env else None
    settings = {}
    for item in a.set:
        k, eq, v = item.partition("=")
        if not eq:
            ap.error(f"--set {item!r} is not KEY=JSON")
        try:
            settings[k.strip()] = json.loads(v)
        except ValueError:
            ap.error(f"--set {item!r}: {v!r} is not JSON (a string needs quotes: --set 'model_id=\"x\"')")
    with StubServer(a.rule, n_ctx=a.n_ctx, api_key=key, port=a.port, **settings) as s:
        for f in a.fault:
            name, _, rest = f.partition(":")
            path, _, times = rest.partition(":")
            s.fail(name, times=int(times) if times else None, path=path or "/v1/completions")
        print(f"stub server ({a.rule}) at {s.url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
