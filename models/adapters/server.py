"""The server adapter: a model behind an OpenAI-compatible ``/v1`` API (vLLM, SGLang, TGI, llama.cpp's
``llama-server``, llama-cpp-python's server) as lctx's :class:`~lctx.models.adapters.protocol.ModelAdapter`.

``lctx run --model http://HOST:PORT/v1`` builds the same samples as for a local checkpoint, in the *served model's*
tokens, and sends them as completion requests through the ``openai`` client (its timeouts, and its retries with
exponential back-off on 408/409/429/5xx and reset connections, honouring ``Retry-After``; no retry on other 4xx).
What it checks, so that a served number is as trustworthy as an in-process one:

* **Exact token budgets.** Text is tokenised by the server's own endpoint (llama-server's and vLLM's ``/tokenize``,
  llama-cpp-python's ``/extras/tokenize``: :class:`ServerTokenizer`) or by a local tokenizer
  (``--tokenizer PATH``, checked against the server's endpoint where it has one). Prompts go as token ids where the
  server takes them (vLLM), else as their text. Every reply's ``usage.prompt_tokens`` must equal the tokens sent:
  a prompt the server cut (a context smaller than the cell) is that sample's error, never a score (lm-eval #2880,
  #3421 score cut prompts silently).
* **Generation** is greedy: ``temperature`` 0, a fixed ``seed``, the task's answer budget as ``max_tokens``
  (plus ``--think-budget`` for a reasoning model, whose span up to ``--think-end`` is dropped before scoring, as
  lm-eval's ``think_end_token`` does).
* **Teacher-forced scores and perplexity** read echoed prompt log-probabilities (``echo`` + ``logprobs``). They are
  used only after a trust probe (:func:`trust_probe`) passes; otherwise (no log-probabilities, or ones that disagree
  with the server's own generation) those metrics are unavailable with the reason
  (:class:`lctx.errors.MetricUnavailable`), never 0.
* **Identity**: the resume key holds what the server says it serves (``/v1/models`` id, ``/props`` / ``/version``
  where it has them), the URL without credentials, the tokenizer's fingerprint (from its ids) and every request
  option. A served model's weights are known by name only.
* **Faults**: a reply that is not a completion (HTML, malformed JSON, no choices, another model's name, a refused
  prompt) is the sample's error (:class:`lctx.errors.ServerReplyError`, one line); a server that stops answering
  after the retries ends the run (:class:`lctx.errors.ServerUnreachable`) with every finished sample recorded, and
  the same command resumes.
* **Nothing from the server is trusted**: every reply is read with a byte bound derived from its request
  (:func:`completion_bound`, :func:`tokenize_bound`, :data:`MODELS_BOUND`, ...: the reading stops as soon as the
  bound is passed, so a 2 GB reply costs at most the bound), and ``--request-timeout`` is a deadline on each request
  from connect to last byte (:class:`_DeadlineStream`: every socket read waits at most what is left, so a server that
  drips a byte a second is cut at the deadline, headers included). Log-probabilities must be finite and at most
  :data:`LOGPROB_TOL` above 0, usage counts whole numbers >= 0 (:class:`lctx.errors.ServerValueError`). Every
  message that quotes a reply goes through :func:`lctx.outside.quote` (the API key redacted, control characters
  escaped, capped), and the key read by :func:`api_key_from_env` is registered with
  :func:`lctx.outside.register_secret`.

Several servers of one model (``--model URL1,URL2``) share the requests (each goes to the server with the fewest in
flight); ``--concurrency N`` keeps at most N in flight over all of them (the runner's batches of the generating tasks,
each row its own request, so every number is the one a request alone gets).

Source: the OpenAI completions API (``echo``, ``logprobs``, ``usage``); RULER's and lm-eval's server clients
(``lm_eval/models/openai_completions.py``: echo + ``logprobs`` with one generated token for log-likelihoods).
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import json
import math
import os
import threading
import time
import urllib.request
from collections import OrderedDict
from importlib.metadata import version
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit, urlunsplit

from lctx.defaults import CONCURRENCY, REQUEST_TIMEOUT_S, RETRIES
from lctx.errors import LctxError, MetricUnavailable, ServerReplyError, ServerUnreachable, ServerValueError
from lctx.outside import MIN_SECRET, quote, quote_list, register_secret
from lctx.model_files import is_server_url, redact_url, split_server_urls  # noqa: F401  (kept as lctx.models.adapters.server.*)
from lctx.models.adapters.protocol import ContinuationScores
from lctx.models.adapters.text import Prompt, TokenizerSide, _first_line, tokenizer_fingerprint

#: log-probability alternatives asked per token (``logprobs``): ranks past it are reported as ``TOP_K + 1``
TOP_K = 5
#: the prompt ids that pick a server in a list of several (:meth:`ServerAdapter._pick`): prompts that start alike
#: (samples of one haystack at other depths, passkey's shared filler) go to the server whose prefix cache holds them
AFFINITY_TOKENS = 256
#: the trust probe's tolerance on |echoed - generated| log-probability of the same token after the same context, in
#: nats. Both numbers come from one server, one set of weights and the same context: they differ only by the float
#: rounding of its batched prompt path against its one-token decode path (llama.cpp's quantised kernels: measured
#: in results/2026-12-02-server-backend), orders of magnitude below this; a misaligned echo (each token scored by
#: the distribution after itself, as llama-cpp-python 0.3.36 reports) moves them by nats.
ECHO_TOL = 0.05
#: the trust probe's certain-continuation margin, nats per token: the echoed log-probabilities of a key's repeat must
#: beat those of its first, unpredictable, statement by at least this (copying a key just read is near-certain for
#: any language model; a misaligned echo reports the repeat as unlikely)
CERTAIN_MARGIN = 1.0
#: request fields beyond the OpenAI API that keep greedy decoding greedy: llama.cpp's servers apply a repetition
#: penalty unless told not to (llama-cpp-python 0.3.36 defaults ``repeat_penalty`` to 1.1: measured here, its
#: "temperature 0" answer to a NIAH prompt took "." at -2.97 nats over its first choice "6" at -0.07, a digit the
#: context had just used); vLLM and SGLang name it ``repetition_penalty`` (default 1.0). A server ignores the one it
#: does not know.
GREEDY_EXTRA = {"repeat_penalty": 1.0, "repetition_penalty": 1.0}
#: the longest served model id lctx takes (characters): ids are names or paths (vLLM's default is the model path)
MAX_MODEL_ID = 512
#: retries of the trust probe's requests: a server that refuses log-probabilities answers 500 (llama-cpp-python
#: without logits_all) or 400, which is its answer, not a fault to wait out
PROBE_RETRIES = 1
#: default request timeout in seconds (``--request-timeout``) and retries (``--retries``): :mod:`lctx.defaults`'
DEFAULT_TIMEOUT_S, DEFAULT_RETRIES = REQUEST_TIMEOUT_S, RETRIES
#: texts whose ids fingerprint a server's tokenizer (ASCII, digits, spaces, punctuation, accents, CJK, emoji)
FINGERPRINT_TEXTS = ("The pass key is 48213. Remember it.", "  leading spaces,\ttabs\nand new lines\n\n",
                     "0123456789 3.14159 -42 1e-5 #$%&*+/<=>@[]^_`{|}~", "naïve café Ünïcödé Ελληνικά русский",
                     "日本語の文章と中文句子", "emoji 🙂🚀 and a uuid 123e4567-e89b-12d3-a456-426614174000")
_ENCODE_CACHE = 512  # prompts kept tokenised (a task's budgeting encodes the same text a few times)
#: the most a log-probability a server reports may lie above 0 and still be read as rounding, in nats. A probability
#: is at most 1, so log p <= 0; a server computes log_softmax in float32 (vLLM, SGLang, llama.cpp), whose rounding near
#: 0 is below 1e-6 for logits of magnitude < 100 (float32's spacing at 100 is 7.6e-6, and log_softmax subtracts two
#: such numbers). 1e-3 nats is far above that and far below anything a score could feel (a factor e^0.001 on a
#: probability). Anything above it, and NaN or an infinity, makes the reply unusable (:class:`ServerValueError`).
LOGPROB_TOL = 1e-3

# ---------------------------------------------------------------------------------------------------------------
# bounded replies: the most bytes read of each reply, derived from its request
# ---------------------------------------------------------------------------------------------------------------

#: bytes allowed for a reply's envelope beside what scales with its tokens: ids, the model name, ``usage``, the
#: finish reason and the fields a server adds (vLLM's ``prompt_logprobs``: null, ``kv_transfer_params``, ...);
#: measured replies carry under 1 KiB of it, and an HTTP error body (an nginx page, a FastAPI detail) is a few KiB
REPLY_ENVELOPE = 64 * 1024
#: bytes allowed for one token's text as JSON: a string of up to 42 characters each escaped as ``\uXXXX`` (6 bytes),
#: or 256 bytes of plain text. Tokens of real vocabularies are a few characters (the longest in Llama 3's and Qwen
#: 2.5's are runs of 16-128 spaces or "=" signs: plain ASCII, under 256 bytes)
PIECE_BYTES = 256
#: bytes allowed for one number in JSON and its separators: ``-1.2345678901234567e-300, `` is 25
NUMBER_BYTES = 32
#: ``GET /v1/models``: 8 MiB, the list of a gateway that serves hundreds of models with descriptions (a few hundred
#: KiB measured for OpenAI's), far more than one self-hosted server lists (one model, and its LoRA adapters)
MODELS_BOUND = 8 << 20
#: ``GET /props`` (llama-server): 1 MiB; it holds the chat template (measured up to ~20 KiB) and the default
#: generation settings
PROPS_BOUND = 1 << 20
#: ``GET /version`` (vLLM): 64 KiB for ``{"version": "..."}``
VERSION_BOUND = 64 << 10
#: bytes allowed per token id in a tokenize reply (``"151643, "`` is 8; twice that for a pretty-printed reply)
TOKEN_ID_BYTES = 16

_REPLY_LIMIT: contextvars.ContextVar = contextvars.ContextVar("lctx_reply_limit", default=None)
_DEADLINE: contextvars.ContextVar = contextvars.ContextVar("lctx_request_deadline", default=None)


def completion_bound(max_tokens: Optional[int], prompt_tokens: int = 0, echo: bool = False,
                     top_k: Optional[int] = None) -> int:
    """The most bytes read of a ``/v1/completions`` reply: ``REPLY_ENVELOPE + n * per_token`` with ``n`` the tokens
    the reply can hold (``max_tokens``, plus the prompt's ``prompt_tokens`` when ``echo``; ``max_tokens`` None counts
    16, the API's default) and ``per_token`` what each adds at most: its text (:data:`PIECE_BYTES`), and with
    ``logprobs`` = ``top_k``: its entry in ``tokens`` (:data:`PIECE_BYTES`), in ``token_logprobs`` and ``text_offset``
    (2 x :data:`NUMBER_BYTES`) and ``top_k`` alternatives of ``top_logprobs`` (each :data:`PIECE_BYTES` +
    :data:`NUMBER_BYTES`). With ``top_k`` 5 that is 2,016 bytes a token, about 7x a measured llama-cpp-python echo
    (~300 bytes a token at ``logprobs`` 5): the margin. Source: the OpenAI completions API's reply shape."""
    n = (16 if max_tokens is None else max(int(max_tokens), 0)) + (max(int(prompt_tokens), 0) if echo else 0)
    per = PIECE_BYTES
    if top_k is not None:
        per += PIECE_BYTES + 2 * NUMBER_BYTES + int(top_k) * (PIECE_BYTES + NUMBER_BYTES)
    return REPLY_ENVELOPE + n * per


def tokenize_bound(text: str) -> int:
    """The most bytes read of a tokenize reply for ``text``: ``REPLY_ENVELOPE + TOKEN_ID_BYTES * (utf-8 bytes of
    text + 16)``. A token covers at least one byte of text (a byte-level vocabulary's worst case), plus a few special
    tokens; vLLM adds ``count`` and ``max_model_len`` to the envelope."""
    return REPLY_ENVELOPE + TOKEN_ID_BYTES * (len(text.encode("utf-8", "replace")) + 16)


def detokenize_bound(n_ids: int) -> int:
    """The most bytes read of a detokenize reply for ``n_ids`` ids: ``REPLY_ENVELOPE + PIECE_BYTES * n_ids``."""
    return REPLY_ENVELOPE + PIECE_BYTES * int(n_ids)


def _size(n: int) -> str:
    """Bytes as a short size ("8 MiB", "66.1 KiB", "512 bytes")."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{n} bytes"


class _ReplyRefused(Exception):
    """Raised by :class:`_BoundedTransport` for a reply it stops reading (past its byte bound, or compressed though
    lctx asked for none): not an ``httpx`` error, so the openai client (>= 3) neither retries it nor calls the server
    unreachable; :meth:`Endpoint.call` makes it a :class:`ServerReplyError` naming the bound."""


def _http_modules():
    """(httpx, httpcore) as the installed openai client uses them: ``httpx2`` / ``httpcore2`` (openai >= 3) or
    ``httpx`` / ``httpcore`` (openai 1.x-2.x): the ``Client`` class that ``openai.DefaultHttpxClient`` derives from
    names the package."""
    import openai  # lazy: loads the openai client (only a served model needs it)

    base = next(c for c in openai.DefaultHttpxClient.__mro__[1:] if not c.__module__.startswith("openai"))
    hx = importlib.import_module(base.__module__.split(".")[0])
    return hx, importlib.import_module("httpcore2" if hx.__name__ == "httpx2" else "httpcore")


def _left(timeout: Optional[float], exc) -> Optional[float]:
    """The timeout for one socket operation under the current request's deadline (:data:`_DEADLINE`): the smaller of
    ``timeout`` and what is left; ``exc`` (httpcore's ReadTimeout, WriteTimeout or ConnectTimeout) when nothing is."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise exc("the request's deadline passed (--request-timeout: connect to last byte)")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """An httpcore network stream whose every read, write and TLS handshake waits at most what is left of the
    current request's deadline (httpcore's own timeouts are per operation: a server that sends a byte before each
    one runs out holds a request forever)."""

    def __init__(self, inner, hc):
        self._inner, self._hc = inner, hc

    def read(self, max_bytes: int, timeout: Optional[float] = None) -> bytes:
        """Read at most ``max_bytes`` within the deadline."""
        return self._inner.read(max_bytes, _left(timeout, self._hc.ReadTimeout))

    def write(self, buffer: bytes, timeout: Optional[float] = None) -> None:
        """Write ``buffer`` within the deadline."""
        return self._inner.write(buffer, _left(timeout, self._hc.WriteTimeout))

    def close(self) -> None:
        """Close the stream."""
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout: Optional[float] = None):
        """The TLS handshake within the deadline; the TLS stream is wrapped too."""
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _left(timeout, self._hc.ConnectTimeout)), self._hc)

    def get_extra_info(self, info: str):
        """As the wrapped stream."""
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """An httpcore network backend whose connections are :class:`_DeadlineStream` s and whose connect waits at most
    what is left of the deadline."""

    def __init__(self, inner, hc):
        self._inner, self._hc = inner, hc

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        """Connect within the deadline."""
        return _DeadlineStream(self._inner.connect_tcp(host, port, _left(timeout, self._hc.ConnectTimeout),
                                                       local_address, socket_options), self._hc)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        """Connect within the deadline."""
        return _DeadlineStream(self._inner.connect_unix_socket(path, _left(timeout, self._hc.ConnectTimeout),
                                                               socket_options), self._hc)

    def sleep(self, seconds: float) -> None:
        """As the wrapped backend."""
        self._inner.sleep(seconds)


def _bounded_transport(url: str, timeout_s: float):
    """An ``httpx`` transport for the server at ``url`` that enforces, per request (each attempt of the openai
    client's retries):

    * the deadline: ``timeout_s`` seconds from the start of the request to its last byte (:class:`_DeadlineBackend`
      under the connection pool);
    * the byte bound of :data:`_REPLY_LIMIT` (set by :meth:`Endpoint.call`): a ``Content-Length`` above it is refused
      before the body is read, and the body is read piece by piece (64 KiB at most each) and dropped as soon as it
      passes the bound, so memory never holds more than the bound and one piece; ``Accept-Encoding: identity`` is
      asked, and a compressed reply refused (its expanded size is unbounded: a gzip bomb);
    * proxies from the environment (``HTTP(S)_PROXY`` / ``NO_PROXY``, as the openai client would use them), through
      the same bounded connection pool.

    Raises (per request): :class:`_ReplyRefused`; httpx's ``ReadTimeout`` (etc.) at the deadline."""
    hx, hc = _http_modules()
    parts = urlsplit(url)
    proxy = None
    if not urllib.request.proxy_bypass(parts.hostname or ""):
        proxy = urllib.request.getproxies().get(parts.scheme)

    class BoundedTransport(hx.HTTPTransport):
        def handle_request(self, request):
            limit = _REPLY_LIMIT.get() or (REPLY_ENVELOPE, "a request")
            bound, what = limit
            request.headers["Accept-Encoding"] = "identity"
            token = _DEADLINE.set(time.monotonic() + timeout_s)
            try:
                resp = super().handle_request(request)
                try:
                    enc = resp.headers.get("content-encoding", "identity").strip().lower()
                    if enc not in ("", "identity"):
                        raise _ReplyRefused(f"the reply to {what} is compressed ({quote(enc, 40)}) though lctx asked "
                                            "for none (Accept-Encoding: identity); its expanded size cannot be bounded")
                    declared = resp.headers.get("content-length", "")
                    if declared.strip().isdigit() and int(declared) > bound:
                        raise _ReplyRefused(f"the reply to {what} declares {_size(int(declared))} (Content-Length), "
                                            f"more than its bound of {_size(bound)}; nothing of it was read")
                    pieces, n = [], 0
                    for piece in resp.stream:
                        n += len(piece)
                        if n > bound:
                            raise _ReplyRefused(f"the reply to {what} passed its bound of {_size(bound)} (HTTP "
                                                f"{resp.status_code}); lctx stopped reading it there")
                        pieces.append(piece)
                finally:
                    resp.close()
                return hx.Response(resp.status_code, headers=resp.headers, stream=hx.ByteStream(b"".join(pieces)),
                                   extensions=resp.extensions)
            finally:
                _DEADLINE.reset(token)

    transport = BoundedTransport(proxy=proxy)
    pool = transport._pool  # httpx's connection pool (a proxy's too): its connections read through the deadline
    pool._network_backend = _DeadlineBackend(pool._network_backend, hc)
    return transport


def api_key_from_env(name: Optional[str]) -> Optional[str]:
    """The API key in environment variable ``name`` (``--api-key-env``), or None when no name is given. The key is
    registered with :func:`lctx.outside.register_secret`, so that no message, record or report shows it (a gateway's
    401 "Incorrect API key provided: sk-..." quotes it back).

    Raises:
        LctxError: the variable is unset or empty, or its key shorter than :data:`lctx.outside.MIN_SECRET`
            characters (the message names the variable, never a value).
    """
    if not name:
        return None
    key = os.environ.get(name, "")
    if not key.strip():
        raise LctxError(f"--api-key-env {name}: the environment variable {name} is not set (or empty); export it "
                        "with the server's API key, or drop --api-key-env for a server without one")
    if len(key.strip()) < MIN_SECRET:
        raise LctxError(f"--api-key-env {name}: the key in {name} has fewer than {MIN_SECRET} characters, too short to "
                        "be told apart from ordinary text and kept out of messages and files; give the server a "
                        "longer key")
    register_secret(key.strip())
    return key.strip()


# ---------------------------------------------------------------------------------------------------------------
# one server
# ---------------------------------------------------------------------------------------------------------------

class Endpoint:
    """One server: its base URL (``.../v1``), root (the URL without ``/v1``, where the tokenizer endpoints live), an
    ``openai.OpenAI`` client (retries, the API key) over a bounded transport (:func:`_bounded_transport`: a byte bound
    per reply, ``timeout_s`` as a deadline per request from connect to last byte), and the count of requests in
    flight."""

    def __init__(self, url: str, api_key: Optional[str], timeout_s: float, retries: int):
        import openai  # lazy: loads the openai client (only a served model needs it)

        self.url = url
        self.shown = redact_url(url)
        parts = urlsplit(url)
        self.root = urlunsplit((parts.scheme, parts.netloc, parts.path[: -len("/v1")], "", ""))
        self.timeout_s = timeout_s
        # trust_env off: the environment's proxies are the transport's own (_bounded_transport), so no request
        # leaves through a mount without the bound and the deadline
        http = openai.DefaultHttpxClient(transport=_bounded_transport(url, timeout_s), trust_env=False)
        self.client = openai.OpenAI(base_url=url, api_key=api_key or "no-key", max_retries=retries,
                                    timeout=timeout_s, http_client=http)
        self.retries = retries
        self.in_flight = 0
        self.lock = threading.Lock()

    @property
    def probe_retries(self) -> int:
        """Retries of a load-time request (``/v1/models``, the trust probe): :data:`PROBE_RETRIES`, never more than
        ``--retries`` (``--retries 0`` means none anywhere)."""
        return min(PROBE_RETRIES, self.retries)

    def call(self, what: str, fn, *args, bound: int, retries: Optional[int] = None, **kw):
        """``fn(client, ...)`` with the openai client's errors as lctx's: a timeout or a reply that cannot be used
        (an HTTP error after the retries, HTML, malformed JSON, more than ``bound`` bytes) is
        :class:`ServerReplyError`, a server that cannot be reached after the retries :class:`ServerUnreachable` (ends
        the run). ``bound``: the most bytes read of each reply (stated by every caller: :func:`completion_bound`,
        :data:`MODELS_BOUND`, ...); a reply past it is not retried (the same request would get it again).
        ``retries`` overrides the client's (0 for capability probes, whose refusal is an answer)."""
        import openai  # lazy: loads the openai client (imported already by __init__)

        client = self.client if retries is None else self.client.with_options(max_retries=retries)
        token = _REPLY_LIMIT.set((int(bound), what))
        try:
            return fn(client, *args, **kw)
        except _ReplyRefused as e:
            raise ServerReplyError(f"{self.shown}: {e}") from None
        except openai.APITimeoutError:
            raise ServerReplyError(f"{self.shown}: no complete reply to {what} within the request deadline "
                                   f"({self.timeout_s:g} s from connect to last byte; --request-timeout)") from None
        except openai.APIConnectionError as e:
            if isinstance(e.__cause__, _ReplyRefused):  # an openai client that wraps every exception (1.x, 2.x)
                raise ServerReplyError(f"{self.shown}: {e.__cause__}") from None
            cause = quote(_first_line(e.__cause__), 160) if e.__cause__ is not None else "connection error"
            raise ServerUnreachable(f"the server {self.shown} stopped answering ({cause}; {what}, after the "
                                    "retries); the records so far are kept: rerun the same command to resume once "
                                    "it is back") from None
        except openai.APIStatusError as e:
            raise ServerReplyError(f"{self.shown}: {what} failed with HTTP {e.status_code}"
                                   f" ({_status_detail(e)})") from None
        except ValueError as e:  # json.JSONDecodeError: a 200 whose body is not JSON
            raise ServerReplyError(f"{self.shown}: the reply to {what} is not valid JSON "
                                   f"({quote(_first_line(e), 160)})") from None
        except RecursionError:  # json's decoder recurses per nesting level: [[[[...]]]] a few thousand deep
            raise ServerReplyError(f"{self.shown}: the reply to {what} is JSON nested too deeply to read (thousands of "
                                   "levels); no OpenAI-API reply nests more than a few") from None
        finally:
            _REPLY_LIMIT.reset(token)

    def take(self) -> "Endpoint":
        """Count one more request in flight (:meth:`complete` counts it off)."""
        with self.lock:
            self.in_flight += 1
        return self

    def get_json(self, path: str, bound: int, retries: Optional[int] = 0) -> Any:
        """GET ``root + path`` as JSON, at most ``bound`` bytes of it (``None`` for a 404/405: the server has no such
        endpoint)."""
        return self._json("GET", path, None, retries, bound)

    def post_json(self, path: str, body: dict, bound: int, retries: Optional[int] = None) -> Any:
        """POST ``body`` to ``root + path`` as JSON, at most ``bound`` bytes of the reply (``None`` for a 404/405)."""
        return self._json("POST", path, body, retries, bound)

    def _json(self, method: str, path: str, body, retries, bound: int) -> Any:

        def go(client):
            if method == "GET":
                return client.get(self.root + path, cast_to=object)
            return client.post(self.root + path, body=body, cast_to=object)

        try:
            return self.call(f"{method} {path}", lambda c: go(c), retries=retries, bound=bound)
        except ServerReplyError as e:
            if " HTTP 404 " in f" {e} " or " HTTP 405 " in f" {e} ":
                return None
            raise

    def complete(self, what: str, bound: int, retries: Optional[int] = None, **body) -> Any:
        """One ``/v1/completions`` request (``body``: the API's fields; counted in flight by :meth:`take`, which
        must come first), at most ``bound`` bytes of its reply (:func:`completion_bound`), the reply checked to be a
        completion with a choice and whole-number usage counts (:func:`_check_completion`) as the server wrote it
        (the raw JSON: the openai client's model would read ``"57"`` or ``true`` as a count), then built as the openai
        client's ``Completion``."""
        try:
            raw = self.call(what, lambda c: c.post("/completions", body={**body, **GREEDY_EXTRA}, cast_to=object),
                            retries=retries, bound=bound)
        finally:
            with self.lock:
                self.in_flight -= 1
        return _check_completion(raw, self.shown, what)


def _status_detail(e) -> str:
    """The first line of an HTTP error's message as the server wrote it (OpenAI, FastAPI or vLLM bodies; an HTML
    page as its title), quoted (:func:`lctx.outside.quote`: the API key a gateway echoes redacted, control characters
    escaped, at most :data:`lctx.outside.QUOTE_LIMIT` characters)."""
    body = getattr(e, "body", None)
    msg = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        msg = inner.get("message") if isinstance(inner, dict) else inner
        msg = msg or body.get("detail") or body.get("message")
    if msg is None:
        text = getattr(getattr(e, "response", None), "text", "") or ""
        if "<title>" in text.lower():
            start = text.lower().index("<title>") + 7
            msg = "an HTML page: " + text[start:text.lower().find("</title>", start)].strip()
        else:
            msg = text or str(e)
    return quote(msg)


def _check_completion(reply: Any, shown: str, what: str) -> Any:
    """``reply`` (the JSON as parsed) as the openai client's ``Completion`` if it is a completion (an object) with at
    least one choice whose ``usage`` counts, where given, are whole numbers >= 0 (:func:`_count`), else
    :class:`ServerReplyError` naming what came (:class:`ServerValueError` for a count)."""
    from openai.types import Completion  # lazy: loads the openai client (loaded already by the request)

    if isinstance(reply, str):
        head = quote(reply, 60)
        kind = "an HTML page" if "<html" in reply.lower() or "<!doctype" in reply.lower() else "text"
        raise ServerReplyError(f"{shown}: the reply to {what} is {kind}, not a completion ({head!r}); is --model "
                               "the API's base URL, ending in /v1?")
    if not isinstance(reply, dict):
        raise ServerReplyError(f"{shown}: the reply to {what} is {quote(repr(reply), 60)}, not a completion object")
    choices = reply.get("choices")
    if not choices or not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ServerReplyError(f"{shown}: the reply to {what} has no choices (an empty completion list)")
    usage = reply.get("usage")
    if isinstance(usage, dict):
        for k in ("prompt_tokens", "completion_tokens"):
            if usage.get(k) is not None:
                _count(usage[k], f"usage.{k}", shown)
    elif usage is not None:
        raise ServerReplyError(f"{shown}: the reply to {what} has usage {quote(repr(usage), 60)}, not an object")
    return Completion.construct(**reply)  # the client's own loose construction: values kept as the server sent them


# ---------------------------------------------------------------------------------------------------------------
# the server's tokenizer
# ---------------------------------------------------------------------------------------------------------------

class ServerTokenizer:
    """A server's own tokenizer as the few ``transformers`` tokenizer members :class:`TokenizerSide` uses
    (``encode(text, add_special_tokens=False)``, ``decode(ids, skip_special_tokens=True)``, ``bos_token_id``,
    ``chat_template``, ``special_tokens_map``), each a request to its endpoint: ``kind`` ``"tokenize"``
    (llama-server's ``/tokenize`` ``{"content"}``, vLLM's ``{"prompt"}``; both sent, without special tokens) or
    ``"extras"`` (llama-cpp-python's ``/extras/tokenize`` ``{"input"}``, which adds the BOS the model wants: dropped
    here). Recent encodings are kept (a task budgets a prompt by encoding it a few times).

    Each reply is read with a bound proportional to what was sent (:func:`tokenize_bound`,
    :func:`detokenize_bound`).

    Raises (each method): :class:`ServerReplyError` / :class:`ServerUnreachable` as :meth:`Endpoint.call`; a reply
    without ``tokens`` as a list of whole numbers >= 0 is a :class:`ServerReplyError`.
    """

    def __init__(self, endpoint: Endpoint, kind: str, model_id: str):
        self.endpoint, self.kind, self.model_id = endpoint, kind, model_id
        self.chat_template: Optional[str] = None
        self.special_tokens_map: dict = {}
        self._lock = threading.Lock()
        self._enc: OrderedDict = OrderedDict()
        self._dec: dict = {}
        self.bos_token_id: Optional[int] = None
        self.bos_token_id = self._specials()

    def _raw(self, text: str, special: bool) -> list[int]:
        bound = tokenize_bound(text)
        if self.kind == "extras":
            got = self.endpoint.post_json("/extras/tokenize", {"input": text}, bound)
        else:
            got = self.endpoint.post_json("/tokenize", {"content": text, "prompt": text, "model": self.model_id,
                                                        "add_special": special, "add_special_tokens": special}, bound)
        toks = got.get("tokens") if isinstance(got, dict) else None
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                 for t in toks):
            raise ServerReplyError(f"{self.endpoint.shown}: the tokenizer endpoint answered {quote(got, 80)!r}, not "
                                   "{'tokens': [ids >= 0]}")
        return toks

    def _specials(self) -> Optional[int]:
        """The BOS the server puts first (the ids it gives an empty text with special tokens), or None."""
        ids = self._raw("", True)
        return ids[0] if ids else None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` as the server tokenises a prompt, without the BOS it adds."""
        with self._lock:
            hit = self._enc.get(text)
            if hit is not None:
                self._enc.move_to_end(text)
                return list(hit)
        ids = self._raw(text, False)
        if self.kind == "extras" and self.bos_token_id is not None and ids[:1] == [self.bos_token_id]:
            ids = ids[1:]
        with self._lock:
            self._enc[text] = tuple(ids)
            while len(self._enc) > _ENCODE_CACHE:
                self._enc.popitem(last=False)
        return list(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (``/extras/detokenize``, ``/detokenize``; the BOS dropped)."""
        ids = [int(i) for i in ids if int(i) != self.bos_token_id]
        key = tuple(ids)
        if len(key) <= 8 and key in self._dec:
            return self._dec[key]
        if not ids:
            return ""
        bound = detokenize_bound(len(ids))
        if self.kind == "extras":
            got = self.endpoint.post_json("/extras/detokenize", {"tokens": ids}, bound)
        else:
            got = self.endpoint.post_json("/detokenize", {"tokens": ids, "model": self.model_id}, bound)
        text = None
        if isinstance(got, dict):
            text = next((got[k] for k in ("text", "content", "prompt") if isinstance(got.get(k), str)), None)
        if text is None:
            raise ServerReplyError(f"{self.endpoint.shown}: the detokenize endpoint answered {quote(got, 80)!r}")
        if len(key) <= 8:
            self._dec[key] = text
        return text

    def get_chat_template(self) -> str:
        """The chat template the server reports (llama-server's ``/props``).

        Raises:
            ValueError: it reports none."""
        if not self.chat_template:
            raise ValueError("the server reports no chat template")
        return self.chat_template

    def fingerprint(self) -> str:
        """16 hex digits over the ids of :data:`FINGERPRINT_TEXTS` and the BOS: two servers with equal fingerprints
        tokenise those texts identically (a served tokenizer can be known by its outputs only)."""
        if getattr(self, "_fp", None) is None:  # asked once, at load (load_server): never again mid-run
            body = json.dumps({"bos": self.bos_token_id, "ids": [self._raw(t, False) for t in FINGERPRINT_TEXTS]})
            self._fp = hashlib.sha256(body.encode()).hexdigest()[:16]
        return self._fp


def _local_tokenizer(spec: str):
    """A local tokenizer for ``--tokenizer``: a folder with tokenizer files, a ``.gguf`` file (its tokenizer, read by
    transformers) or a hub id already in the local cache; never downloaded.

    Raises:
        LctxError: none of those (one line naming what to give)."""
    from transformers import AutoTokenizer  # lazy: loads transformers (only for --tokenizer)

    p = Path(spec).expanduser()
    if not p.exists() and (spec.startswith((".", "/", "~")) or p.suffix in (".gguf", ".json", ".model")):
        raise LctxError(f"--tokenizer {spec!r}: no such file or folder; give a folder with tokenizer files, a .gguf "
                        "file, or a hub id already in the local cache")
    if p.is_file() and p.suffix != ".gguf":
        raise LctxError(f"--tokenizer {spec!r} is a file but not a .gguf; give the folder that holds the tokenizer "
                        "files, or a .gguf file")
    try:
        if p.is_file() and p.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        return AutoTokenizer.from_pretrained(str(p) if p.exists() else spec, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - one line: what to give instead
        raise LctxError(f"--tokenizer {spec!r}: no tokenizer could be read there ({_first_line(e)}); give a folder "
                        "with tokenizer files, a .gguf file, or a hub id already in the local cache") from None


# ---------------------------------------------------------------------------------------------------------------
# the adapter
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class ServerPrefix:
    """The server adapter's opaque prompt handle: the prompt's ids and, when lctx built it, its text."""

    ids: list
    text: Optional[str] = None
    endpoint: Any = None  # the server that last answered for this prompt (its prompt cache may hold it)


@dataclass
class TrustReport:
    """What the trust probe (:func:`trust_probe`) found: ``ok`` (prompt log-probabilities usable), ``reason`` (one
    line when not), and the measurements: ``max_abs_diff`` (nats, echoed vs generated, over ``n_compared`` tokens),
    ``top1_agree`` (the echoed first choices are the generated tokens), ``certain_gain`` (nats per token: the key's
    repeat over its first statement), ``greedy_is_argmax`` (each token the server generated at temperature 0 was its
    own first choice there: no repetition penalty or sampler bent it; checked apart from ``ok``); ``problems``: every
    check that failed (``reason`` names the first)."""

    ok: bool
    reason: str = ""
    greedy_is_argmax: Optional[bool] = None
    max_abs_diff: Optional[float] = None
    n_compared: int = 0
    top1_agree: Optional[bool] = None
    certain_gain: Optional[float] = None
    tolerance: float = ECHO_TOL
    margin: float = CERTAIN_MARGIN
    problems: list = field(default_factory=list)

    def as_dict(self) -> dict:
        """JSON-able, for run.json."""
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class ServerAdapter(TokenizerSide):
    """A served model (module docstring). Build it with :func:`load_server`.

    Attributes: ``endpoints`` (one per server), ``model_id`` (the served model's id, ``/v1/models``), ``tokenizer``
    (a :class:`ServerTokenizer` or a local ``transformers`` tokenizer), ``token_prompts`` (the server takes prompts
    as token ids), ``concurrency`` (requests in flight at most: the runner's batch for generating tasks), ``trust``
    (the :class:`TrustReport`), ``seed``, ``think_end`` / ``think_budget`` (a reasoning model's end marker and
    extra token budget), ``served`` (what the servers say of themselves: ``/props``, ``/version``)."""

    endpoints: list
    model_id: str
    tokenizer: Any
    name: str = ""
    path: str = ""
    variant: str = "served"
    train_length: Optional[int] = None
    max_length: Optional[int] = None
    max_length_source: str = "the server's reported maximum context"
    add_bos: bool = False
    chat_template: bool = False
    system_prompt: Optional[str] = None
    token_prompts: bool = False
    concurrency: int = CONCURRENCY
    seed: int = 0
    think_end: Optional[str] = None
    think_budget: int = 0
    trust: TrustReport = field(default_factory=lambda: TrustReport(False, "not probed"))
    served: dict = field(default_factory=dict)
    tokenizer_source: str = "server"
    _texts: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _lock: Any = field(default_factory=threading.Lock, repr=False)
    _inputs: Optional[dict] = field(default=None, repr=False)
    _notes: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _affinity: OrderedDict = field(default_factory=OrderedDict, repr=False)
    #: greedy replies whose thinking never closed (no ``think_end`` in the text): scored as empty answers
    think_unclosed: int = 0

    # -- text -----------------------------------------------------------------------------------------------------
    def check_chat_template(self) -> None:
        """Raises LctxError when no chat template is known (``--chat-template on`` needs one: a ``--tokenizer`` whose
        tokenizer has it, or a server that reports it in ``/props``)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise LctxError(f"--chat-template on: the server {self.path} reports no chat template and no --tokenizer "
                            "with one was given; give --tokenizer PATH (a folder or .gguf file whose tokenizer has "
                            "the model's template), or use --chat-template off")

    def chat_source(self) -> str:
        """Where the chat template comes from, for messages."""
        return f"model {self.name!r} ({self.tokenizer_source})"

    def prompt_budget(self, length: int, answer_tokens: int) -> int:
        """:meth:`TokenizerSide.prompt_budget` with the request's whole ``max_tokens`` held back: the task's
        ``answer_tokens`` and ``think_budget`` (a greedy request asks for both), so that prompt + ``max_tokens`` <=
        the server's context (``max_length``) whenever it reports one."""
        return super().prompt_budget(length, int(answer_tokens) + int(self.think_budget))

    def check_answer_room(self, lengths) -> None:
        """Refuse, before the sweep, a length at which a generating task's request would not fit the server's
        context with the thinking budget: ``length + think_budget + 1`` (at least one answer token) must be at most
        ``max_length``. The answer's own budget is held back from the prompt (:meth:`prompt_budget`), as for an
        in-process model at its maximum; the thinking budget is not (a cell would lose thousands of tokens). Lengths
        above ``max_length`` (``--allow-beyond-max``) and a server that reports no context are not checked.

        Raises:
            LctxError: the longest such length, with the arithmetic and the fix, in one line."""
        if not self.think_budget or not self.max_length:
            return
        bad = [int(L) for L in lengths if L <= self.max_length and L + self.think_budget + 1 > self.max_length]
        if bad:
            L, tb = max(bad), int(self.think_budget)
            room = self.max_length - tb - 1
            fix = (f"use lengths up to {room}, or a smaller --think-budget" if room >= 1 else
                   f"the thinking budget alone fills it: use --think-budget below {self.max_length - L}, or a server "
                   "with a longer context")
            raise LctxError(f"length {L} does not fit {self.name}'s served context with the thinking budget: {L} "
                            f"prompt + {tb} --think-budget + at least 1 answer token = {L + tb + 1} tokens > "
                            f"{self.max_length} ({self.max_length_source}); {fix}")

    def sample_notes(self, ids) -> dict:
        """What the adapter noted of the sample whose prompt is ``ids``, taken off its list (the runner puts it in the
        record's ``extra``): ``{"think_unclosed": why}`` when its thinking never closed (:meth:`greedy`),
        ``cached_tokens`` (the prompt tokens of its greedy request the server took from its prefix cache, where it
        says), ``server`` (which of several servers answered: the index in the list); {} else."""
        with self._lock:
            return self._notes.pop(tuple(ids), {})

    def _note(self, ids, **notes) -> None:
        with self._lock:
            self._notes[tuple(ids)] = {**self._notes.get(tuple(ids), {}), **notes}
            while len(self._notes) > 4096:  # a caller that never takes them (lctx.evaluate always does)
                self._notes.popitem(last=False)

    def tokenizer_fingerprint(self) -> str:
        """The tokenizer's fingerprint: a local tokenizer's definition, or the server tokenizer's ids
        (:meth:`ServerTokenizer.fingerprint`)."""
        if isinstance(self.tokenizer, ServerTokenizer):
            if not hasattr(self, "_tok_fp"):
                self._tok_fp = self.tokenizer.fingerprint()
            return self._tok_fp
        return tokenizer_fingerprint(self.tokenizer)

    def prompt(self, user: str, answer_prefix: str = "", marks=()) -> Prompt:
        """:meth:`TokenizerSide.prompt`, its text kept for the request (a server that takes text gets the text the
        ids came from, not a decoding of them)."""
        p = super().prompt(user, answer_prefix, marks)
        with self._lock:
            self._texts[tuple(p.ids)] = p.text
            while len(self._texts) > 64:
                self._texts.popitem(last=False)
        return p

    # -- requests ---------------------------------------------------------------------------------------------------
    @property
    def can_batch(self) -> bool:
        """Batches are concurrent requests: offered when ``concurrency`` > 1."""
        return self.concurrency > 1

    @property
    def teacher_forced(self):
        """A capability (:func:`lctx.models.adapters.protocol.capabilities`): True when the server's prompt
        log-probabilities passed the trust probe, else the probe's reason (teacher-forced metrics are unavailable)."""
        return True if self.trust.ok else (self.trust.reason or "the server's prompt log-probabilities are untrusted")

    def _pick(self, prefer: Optional[Endpoint] = None, ids: Optional[Sequence[int]] = None) -> Endpoint:
        """A server with the fewest requests in flight, counted in (:meth:`Endpoint.take`): ``prefer`` (the one that
        last served this prompt, whose prompt cache may still hold it) when it is one of them, else the one that
        last served a prompt starting with the same :data:`AFFINITY_TOKENS` ids as ``ids`` (samples of one haystack
        share it up to their needle: that server's prefix cache holds it), else the next of them in turn (so
        requests one after another spread over the servers too)."""
        key = hash(tuple(ids[:AFFINITY_TOKENS])) if ids is not None and len(self.endpoints) > 1 else None
        with self._lock:
            low = min(e.in_flight for e in self.endpoints)
            if prefer is None and key is not None:
                prefer = self._affinity.get(key)
            if prefer is not None and prefer.in_flight == low:
                ep = prefer
            else:
                free = [e for e in self.endpoints if e.in_flight == low]
                self._turn = (getattr(self, "_turn", -1) + 1) % len(free)
                ep = free[self._turn]
            if key is not None:
                self._affinity[key] = ep
                while len(self._affinity) > 4096:
                    self._affinity.popitem(last=False)
            return ep.take()

    def _prompt_field(self, ids: list, text: Optional[str]):
        """What to send as ``prompt``: the ids when the server takes them, else the text (lctx's own, or the ids
        decoded without the BOS the server adds itself)."""
        if self.token_prompts:
            return list(ids)
        if text is None:
            body = ids[1:] if self.bos_id is not None and ids[:1] == [self.bos_id] else ids
            text = self.tokenizer.decode(body, skip_special_tokens=False)  # special tokens kept: the server parses them
        elif self.bos_id is not None and ids[:1] == [self.bos_id]:  # BOS exactly once: a chat
            bos = getattr(self.tokenizer, "bos_token", None) or (  # template's "{{ bos_token }}" text is the BOS
                getattr(self.tokenizer, "special_tokens_map", None) or {}).get("bos_token")  # the server puts first
            if isinstance(bos, str) and bos and text.startswith(bos):
                text = text[len(bos):]
        return text

    def _request(self, what: str, ids: list, text: Optional[str], retries: Optional[int] = None,
                 handle: Optional["ServerPrefix"] = None, **body) -> Any:
        """One completion of the prompt ``ids`` (sent as :meth:`_prompt_field`), its ``usage.prompt_tokens`` checked
        against ``len(ids)`` and its model against ``model_id``.

        The reply is read up to :func:`completion_bound` of the request (``max_tokens``, the echoed prompt, the
        ``logprobs`` asked).

        Raises:
            ServerReplyError: the server counted other prompt tokens (it cut, or re-tokenised, the prompt), named
                another model, gave no usage, or the request failed; :class:`ServerValueError` for a usage count
                that is not a whole number >= 0.
        """
        prompt = self._prompt_field(ids, text)  # before a server is counted in (a detokenize may fail)
        bound = completion_bound(body.get("max_tokens"), len(ids), bool(body.get("echo")), body.get("logprobs"))
        ep = self._pick(handle.endpoint if handle is not None else None, ids)
        if handle is not None:
            handle.endpoint = ep
        reply = ep.complete(what, bound, retries=retries, model=self.model_id, prompt=prompt, **body)
        got_model = getattr(reply, "model", None)
        if got_model and got_model != self.model_id:
            raise ServerReplyError(f"{ep.shown}: the reply is from model {quote(got_model, 80)!r}, not "
                                   f"{self.model_id!r} (the one asked for); another model answers at this URL")
        usage = getattr(reply, "usage", None)
        n = getattr(usage, "prompt_tokens", None)
        if n is None:
            raise ServerReplyError(f"{ep.shown}: the reply has no usage.prompt_tokens, so a cut prompt could not be "
                                   "caught; use a server that reports usage")
        n = _count(n, "usage.prompt_tokens", ep.shown)
        if int(n) == len(ids) + 1 and not self.token_prompts and self.tokenizer.bos_token_id is not None \
                and ids[:1] != [self.tokenizer.bos_token_id]:
            raise ServerReplyError(f"{ep.shown}: sent a prompt of {len(ids)} tokens without a BOS as text, and the "
                                   "server put its BOS before it (it does for every text prompt); a prompt without "
                                   "one (ppl's --ppl-bos none) needs a server that takes token ids")
        if int(n) != len(ids):
            raise ServerReplyError(f"{ep.shown}: sent a prompt of {len(ids)} tokens, the server counted {int(n)}: it "
                                   + ("cut the prompt (its context is smaller than the cell: raise --n_ctx / "
                                      "--max-model-len / -c, or drop the length)" if int(n) < len(ids) else
                                      "tokenised the text into other tokens (is --tokenizer the served model's?)"))
        return reply

    def prefix(self, ids: list[int]) -> ServerPrefix:
        """A handle holding the ids (and lctx's text of them, when :meth:`prompt` built them); nothing is sent yet.

        Raises:
            ValueError: empty ``ids``."""
        if not ids:
            raise ValueError("an empty prompt")
        with self._lock:
            text = self._texts.get(tuple(ids))
        return ServerPrefix(list(ids), text)

    def greedy(self, prefix: ServerPrefix, max_new_tokens: int, stop_ids: Optional[set[int]] = None) -> list[int]:
        """Greedy continuation (``temperature`` 0, ``seed``), ``max_tokens`` = ``max_new_tokens`` (+
        ``think_budget``); stop strings: the text of each of ``stop_ids`` (the server stops at EOS itself). A
        reasoning model's text up to its last ``think_end`` is dropped; a text without ``think_end`` (the thinking
        never closed, or the budget cut it) is an empty answer, as vLLM's reasoning parsers give no content then: it
        is counted (:attr:`think_unclosed`) and noted for the sample's record (:meth:`sample_notes`). Returns the
        ids of the answer text (the server's tokenizer, re-encoded: the completions API returns text).

        Raises:
            ServerReplyError: the request failed or its reply breaks a check (:meth:`_request`), or its text is
                not a string."""
        stops = sorted({s for s in (self.decode([i]) for i in (stop_ids or ())) if s}) or None
        reply = self._request("a greedy completion", prefix.ids, prefix.text, handle=prefix, max_tokens=int(max_new_tokens)
                              + int(self.think_budget), temperature=0, seed=self.seed, stop=stops)
        ep = prefix.endpoint if prefix.endpoint is not None else self.endpoints[0]
        cached = _cached_tokens(reply, len(prefix.ids), ep.shown)
        if cached is not None:  # the record's extra: how much of the prompt the server's prefix cache gave
            self._note(prefix.ids, cached_tokens=cached)
        if len(self.endpoints) > 1 and ep in self.endpoints:
            self._note(prefix.ids, server=self.endpoints.index(ep))
        text = reply.choices[0].text or ""
        if not isinstance(text, str):
            raise ServerReplyError(f"{self.endpoints[0].shown}: the completion's text is {quote(repr(text), 60)}, not "
                                   "a string")
        if self.think_end:
            if self.think_end in text:
                text = text.split(self.think_end)[-1]
            else:
                cut = getattr(reply.choices[0], "finish_reason", None) == "length"
                with self._lock:
                    self.think_unclosed += 1
                self._note(prefix.ids, think_unclosed="cut by the token budget" if cut else
                           f"no {self.think_end} in the reply")
                text = ""
        return self.encode(text) if text else []

    def prompt_logprobs(self, ids: list, text: Optional[str] = None, what: str = "an echo",
                        handle: Optional[ServerPrefix] = None, **body) -> tuple:
        """Echoed prompt log-probabilities of ``ids`` (sent as :meth:`_prompt_field`: the ids, or ``text`` / their
        text for a server that takes text), one completion request with ``body`` (the API's fields; default
        ``max_tokens`` 1, ``temperature`` 0, ``seed``, ``echo``, ``logprobs`` :data:`TOP_K`), ``usage.prompt_tokens``
        checked against ``len(ids)``; ``handle``: the prompt's handle, so the request goes back to the server that
        answered it (its prompt cache). Returns ``(logprobs, tops)`` aligned with ``ids``: ``logprobs[p]`` is ``log
        p(ids[p] | ids[:p])`` in nats (``None`` at 0, and at a BOS the server leaves out of its echo), ``tops[p]``
        the values of the alternatives the server listed there, highest first (:func:`_echoed`, which lines up
        servers that echo the BOS or not and that return all, fewer or none of the generated tokens).

        Raises:
            MetricUnavailable: the trust probe did not pass (its reason).
            ServerReplyError: as :meth:`_request`, or an echo that cannot be lined up with ``ids``."""
        if not self.trust.ok:
            raise MetricUnavailable(self.trust.reason)
        body = {"max_tokens": 1, "temperature": 0, "seed": self.seed, "echo": True, "logprobs": TOP_K, **body}
        reply = self._request(what, list(ids), text, handle=handle, **body)
        return _echoed(reply, list(ids), self.bos_id, self.endpoints[0].shown, lambda i: self.decode([i]))

    def lmeval_api_model(self) -> dict:
        """What lm-eval's OpenAI-completions model (``lm_eval.models.openai_completions.LocalCompletionsAPI``, as
        :func:`lctx.tasks.lmeval.served_lmeval_class` subclasses it) needs to run mmlu/arc through this server
        (:class:`lctx.models.adapters.protocol.LmEvalApiCapable`): ``{"base_url": the first server's
        ``/v1/completions`` URL (no credentials: the API key stays in the endpoints' clients), "model": the served
        id, "seed": the request seed, "concurrency": requests in flight at most, "max_length": the server's
        reported context or None}``. lm-eval's log-likelihoods are echoed prompt log-probabilities, so they are
        offered only after the trust probe passed.

        Raises:
            MetricUnavailable: the trust probe did not pass (its reason): every mmlu/arc metric is unavailable."""
        if not self.trust.ok:
            raise MetricUnavailable(self.trust.reason)
        return {"base_url": self.endpoints[0].url.rstrip("/") + "/completions", "model": self.model_id,
                "seed": self.seed, "concurrency": self.concurrency, "max_length": self.max_length}

    def score_continuation(self, prefix: ServerPrefix, cont: list[int]) -> ContinuationScores:
        """Teacher-forced scores of ``cont`` after the prompt, from the echoed log-probabilities of prompt + ``cont``
        (one request; ``TOP_K`` alternatives, so a rank past them is ``TOP_K + 1``).

        Raises:
            MetricUnavailable: the server's prompt log-probabilities are not trusted (:func:`trust_probe`).
            ServerReplyError: as :meth:`_request`."""
        if not self.trust.ok:
            raise MetricUnavailable(self.trust.reason)
        ids = list(prefix.ids) + list(cont)
        text = None if prefix.text is None else prefix.text + self.decode(cont)
        lps, tops = self.prompt_logprobs(ids, text, "a teacher-forced score", handle=prefix)
        n = len(prefix.ids)
        out_lp, out_top1, out_rank = [], [], []
        for j in range(len(cont)):
            lp, top = lps[n + j], tops[n + j]
            if lp is None:
                raise ServerReplyError(f"{self.endpoints[0].shown}: the echo has no log-probability at position "
                                       f"{n + j} of the prompt and its continuation")
            # its rank among the TOP_K alternatives the server listed (the token itself may be among them); past them
            # TOP_K + 1 (ContinuationScores: an adapter that sees only the top k says so)
            if not top:
                raise ServerReplyError(f"{self.endpoints[0].shown}: the echo lists no alternatives (top_logprobs) at "
                                       f"position {n + j} though {TOP_K} were asked; a rank cannot be read")
            rank = 1 + sum(1 for v in top if v > lp + 1e-9)
            rank = rank if any(abs(v - lp) <= 1e-9 for v in top) or rank <= len(top) else TOP_K + 1
            out_lp.append(float(lp))
            out_top1.append(rank == 1)
            out_rank.append(int(rank))
        return ContinuationScores(out_lp, out_top1, out_rank)

    def token_nll(self, ids: list[int], targets: list[int]):
        """NLL (nats) and first-choice flag of ``ids[p]`` for each ``p`` in ``targets``, from one echo of ``ids``.

        Raises:
            ValueError: a target outside [1, len(ids)).
            MetricUnavailable: prompt log-probabilities not trusted.
            ServerReplyError: as :meth:`_request`."""
        if targets and (min(targets) < 1 or max(targets) >= len(ids)):
            raise ValueError(f"targets must lie in [1, {len(ids)})")
        lps, tops = self.prompt_logprobs(list(ids), None, "a perplexity window")
        gap = next((p for p in targets if lps[p] is None), None)
        if gap is not None:
            raise ServerReplyError(f"{self.endpoints[0].shown}: the echo has no log-probability at position {gap} (a "
                                   "server that echoes the token after the BOS without one, as llama-cpp-python); "
                                   "run ppl with --ppl-bos none through it")
        bare = next((p for p in targets if not tops[p]), None)
        if bare is not None:
            raise ServerReplyError(f"{self.endpoints[0].shown}: the echo lists no alternatives (top_logprobs) at "
                                   f"position {bare} though {TOP_K} were asked; the first-choice flag cannot be read")
        nll = [-float(lps[p]) for p in targets]
        top1 = [not any(v > lps[p] + 1e-9 for v in tops[p]) for p in targets]
        return nll, top1

    # -- batches: concurrent requests ------------------------------------------------------------------------------
    def prefix_batch(self, rows: list[list[int]]) -> list[ServerPrefix]:
        """One handle per row (sent together by :meth:`greedy_batch`).

        Raises:
            ValueError: no rows, an empty row."""
        if not rows:
            raise ValueError("no prompts")
        return [self.prefix(r) for r in rows]

    def greedy_batch(self, batch: list[ServerPrefix], max_new_tokens, stop_ids=None) -> list[list[int]]:
        """:meth:`greedy` of every row, at most ``concurrency`` requests in flight (threads); each row's ids are those
        it gets alone."""
        budgets = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(batch)
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(batch)))) as pool:
            return list(pool.map(lambda hb: self.greedy(hb[0], hb[1], stop_ids), zip(batch, budgets)))

    def batch_row(self, batch: list[ServerPrefix], i: int) -> ServerPrefix:
        """Row ``i``'s handle."""
        return batch[i]

    # -- identity ---------------------------------------------------------------------------------------------------
    def request_options(self) -> dict:
        """Every request option that can change a number (hashed into the resume key)."""
        return {"temperature": 0, "seed": self.seed, "logprobs": TOP_K, "echo_max_tokens": 1, **GREEDY_EXTRA,
                "token_prompts": self.token_prompts, "think_end": self.think_end, "think_budget": self.think_budget,
                "prompt_logprobs": "trusted" if self.trust.ok else "unavailable"}

    def model_inputs(self) -> dict:
        """``{"path": the URL(s) without credentials, "fingerprint": 16 hex digits over the served model's id, what
        the servers report of themselves, the tokenizer's fingerprint and the request options, "files": {},
        "server": what run.json records of it (the trust probe's measurements included)}``."""
        if self._inputs is None:
            ident = {"model_id": self.model_id, "served": self.served, "tokenizer": self.tokenizer_fingerprint(),
                     "tokenizer_source": self.tokenizer_source, "options": self.request_options()}
            fp = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
            self._inputs = {"path": self.path, "fingerprint": fp, "files": {},
                            "server": {"urls": [e.shown for e in self.endpoints], **ident,
                                       "trust_probe": self.trust.as_dict(), "concurrency": self.concurrency,
                                       "chat": "local template, /v1/completions" if self.chat_template else None}}
        return self._inputs

    def settings(self) -> dict:
        """No dtype, attention or chunks of ours; the device is the server (its URL); versions: the openai client's
        (the server's own are in :meth:`model_inputs`)."""
        return {"dtype": None, "attn_impl": None, "chunk_size": None, "device_type": "server",
                "device": ",".join(e.shown for e in self.endpoints), "versions": {"openai": version("openai")}}

    # -- memory: the server's, not ours ------------------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        """Nothing measured (the memory is the server's)."""

    def peak_memory_bytes(self) -> None:
        """Unknown: the server's memory is not ours."""
        return None

    def free_memory(self) -> None:
        """Nothing held."""

    def memory_plan(self, length: int, batch: int = 1, kept_logits: int = 1) -> None:
        """Nothing to check: the server's memory is not ours."""
        return None


def _echoed(reply, ids: list, bos: Optional[int], shown: str, piece=None) -> tuple[list, list]:
    """(log-probabilities, top-k values sorted high first) per position of ``ids`` from an echo reply. The prompt's
    entries come first; after them the completion's, all of them (``usage.completion_tokens``) or fewer
    (llama-cpp-python leaves out the last generated token, whose logits it never computed); a server that leaves the
    BOS out of the echo (llama-cpp-python) gives one entry fewer at the start, the BOS's own (``None``). Where the
    count fits both layouts, the echoed token texts of the prompt's last tokens decide (``piece(id)``: a token's
    text).

    Every value used (the prompt's log-probabilities and their alternatives) must be a log-probability
    (:func:`_logprob`), and ``usage.completion_tokens`` a whole number >= 0.

    Raises:
        ServerReplyError: no ``token_logprobs``, or a count (or texts) that fits neither layout; a
            :class:`ServerValueError` for a value that cannot be (NaN, infinite, above 0 past :data:`LOGPROB_TOL`, a
            count that is not a whole number >= 0)."""
    lp = reply.choices[0].logprobs
    tokens = list(getattr(lp, "token_logprobs", None) or []) if lp is not None else []
    if not tokens:
        raise ServerReplyError(f"{shown}: the echo reply has no token_logprobs")
    tops = list(getattr(lp, "top_logprobs", None) or [None] * len(tokens))
    strs = list(getattr(lp, "tokens", None) or [])
    n_gen = getattr(reply.usage, "completion_tokens", None)
    n_gen = 0 if n_gen is None else _count(n_gen, "usage.completion_tokens", shown)
    layouts = [(len(ids), 0)] + ([(len(ids) - 1, 1)] if bos is not None and ids[:1] == [bos] else [])
    fits = [(m, pad) for m, pad in layouts if m <= len(tokens) <= m + n_gen]
    if len(fits) > 1 and piece is not None and len(strs) == len(tokens):
        window = range(max(1, len(ids) - 8), len(ids))  # the prompt's last tokens, BOS never among them

        def matches(m, pad):
            return sum(strs[p - pad] == piece(ids[p]) for p in window if 0 <= p - pad < m)

        score = {f: matches(*f) for f in fits}
        best = max(score.values())
        fits = [f for f in fits if score[f] == best]
    if len(fits) != 1:
        raise ServerReplyError(f"{shown}: the server echoed {len(tokens)} log-probabilities ({n_gen} generated) for a "
                               f"prompt of {len(ids)} tokens; they cannot be lined up with it")
    m, pad = fits[0]
    vals = []
    for i, t in enumerate(tops[:m]):
        if t is not None and not isinstance(t, dict):
            raise ServerReplyError(f"{shown}: the echo's top_logprobs at position {i} is {quote(repr(t), 60)}, not "
                                   "{token: log-probability}")
        vals.append(sorted((_logprob(v, f"among the alternatives (top_logprobs) at position {i} of the echo", shown)
                            for v in (t or {}).values()), reverse=True))
    lps = [None if v is None else _logprob(v, f"at position {i} of the echo", shown) for i, v in enumerate(tokens[:m])]
    return [None] * pad + lps, [[]] * pad + vals


def _logprob(v: Any, where: str, shown: str) -> float:
    """``v`` as a float if it can be a log-probability: a number (not a bool), finite, at most :data:`LOGPROB_TOL`
    above 0.

    Raises:
        ServerValueError: anything else (the value quoted, ``where`` it was, the rule), one line."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v > LOGPROB_TOL:
        raise ServerValueError(f"{shown}: the server reported a log-probability of {quote(repr(v), 40)} {where}; a "
                               f"log-probability is finite and at most 0 ({LOGPROB_TOL:g} above it for rounding), so "
                               "the reply is not scored")
    return float(v)


def _count(v: Any, what: str, shown: str) -> int:
    """``v`` if it is a whole number >= 0 (an int, not a bool).

    Raises:
        ServerValueError: anything else (a string, NaN, a fraction, a bool, a negative), one line naming ``what``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ServerValueError(f"{shown}: the reply's {what} is {quote(repr(v), 40)}, not a whole number >= 0, so the "
                               "reply is not used")
    return v


def _cached_tokens(reply: Any, n_prompt: int, shown: str) -> Optional[int]:
    """The prompt tokens the server says it took from its prefix cache for ``reply`` (vLLM with
    ``--enable-prompt-tokens-details`` and llama-server: ``usage.prompt_tokens_details.cached_tokens``;
    llama-server also ``timings.cache_n``), or None where it says nothing.

    Raises:
        ServerValueError: a count that is not a whole number >= 0 (:func:`_count`).
        ServerReplyError: more cached tokens than the prompt has (an impossible value)."""
    details = getattr(getattr(reply, "usage", None), "prompt_tokens_details", None)
    v = details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    if v is None:
        timings = getattr(reply, "timings", None)
        v = timings.get("cache_n") if isinstance(timings, dict) else None
    if v is None:
        return None
    v = _count(v, "cached_tokens", shown)
    if v > n_prompt:
        raise ServerReplyError(f"{shown}: the reply says {v} cached prompt tokens of a {n_prompt}-token prompt, an "
                               "impossible count, so the reply is not used")
    return v


def trust_probe(lm: ServerAdapter) -> TrustReport:
    """Whether ``lm``'s server gives prompt log-probabilities that can be used, checked two ways on a short passkey
    prompt (docs/serving.md#teacher-forced-metrics-and-the-trust-probe):

    1. the log-probabilities it reports for tokens it generated (greedy, after "... The pass key is") against those
       it echoes for the same tokens sent back in the prompt: at most :data:`ECHO_TOL` nats apart, and each
       generated token the echo's first choice at its position;
    2. a certain continuation: the echoed log-probabilities of the key where it is repeated beat those of its first
       statement by at least :data:`CERTAIN_MARGIN` nats per token.

    Returns a :class:`TrustReport` (``ok`` False with the reason and the measured values when a check fails, the
    server refuses log-probabilities, or the echo cannot be lined up with the prompt)."""
    key = "7396"
    user = (f"Remember the key. The pass key is {key}. Remember it. {key} is the pass key. The pass key is {key}. "
            "What is the pass key?")
    first_at = user.index(f" {key}")
    again_at = user.index(f" {key}", first_at + 1)
    p = TokenizerSide.prompt(lm, user, " The pass key is", marks=[first_at, again_at])
    first = lm.continuation_ids(user[:first_at], f" {key}")
    shown = lm.endpoints[0].shown
    try:
        gen = lm._request("the trust probe's greedy completion", p.ids, p.text, max_tokens=len(first) + 2,
                          temperature=0, seed=lm.seed, logprobs=TOP_K, retries=lm.endpoints[0].probe_retries)
    except ServerValueError:  # a value that cannot be: the load fails (load_server), not just the metrics
        raise
    except ServerReplyError as e:
        return TrustReport(False, f"the server gives no log-probabilities ({e})")
    glp = gen.choices[0].logprobs
    gen_lps = list(getattr(glp, "token_logprobs", None) or []) if glp is not None else []
    gen_text = gen.choices[0].text or ""
    if not gen_lps or not gen_text:
        return TrustReport(False, "the server returned no log-probabilities for generated tokens (logprobs)")
    if not isinstance(gen_text, str):
        raise ServerReplyError(f"{shown}: the trust probe's completion text is {quote(repr(gen_text), 60)}, not a "
                               "string")
    gen_lps = [None if v is None else _logprob(v, f"for generated token {i} of the trust probe", shown)
               for i, v in enumerate(gen_lps)]
    gen_tops = list(getattr(glp, "top_logprobs", None) or [])
    gen_tops = [{k: _logprob(v, f"among the alternatives of generated token {i} of the trust probe", shown)
                 for k, v in t.items()} if isinstance(t, dict) else t for i, t in enumerate(gen_tops)]
    greedy = all(t and v is not None and max(t.values()) - v <= 1e-6 for t, v in zip(gen_tops, gen_lps)) \
        if len(gen_tops) == len(gen_lps) else None
    gen_ids = lm.continuation_ids(p.text, gen_text)
    both = p.ids + gen_ids
    try:
        lps, tops = _echoed(lm._request("the trust probe's echo", both, p.text + gen_text, max_tokens=1,
                                        temperature=0, seed=lm.seed, echo=True, logprobs=TOP_K,
                                        retries=lm.endpoints[0].probe_retries),
                            both, lm.bos_id, lm.endpoints[0].shown, lambda i: lm.decode([i]))
    except ServerValueError:
        raise
    except ServerReplyError as e:
        return TrustReport(False, f"the server gives no usable prompt log-probabilities (echo: {e})", greedy)
    n = min(len(gen_ids), len(gen_lps))
    if n == 0 or len(gen_ids) != len(gen_lps):
        return TrustReport(False, f"the server's {len(gen_lps)} generated tokens re-tokenise to {len(gen_ids)}; the "
                                  "probe cannot line them up", greedy)
    echo_gen = lps[len(p.ids):len(p.ids) + n]
    diff = max(abs(float(a) - float(b)) for a, b in zip(gen_lps[:n], echo_gen))
    top1 = all(t and abs(t[0] - float(v)) <= 1e-6 for t, v in zip(tops[len(p.ids):len(p.ids) + n], echo_gen))
    # the key's tokens where it is stated first (unpredictable) and where it is repeated ("Remember it. {key} is")
    k = len(first)
    firsts = [v for v in lps[p.marks[0]:p.marks[0] + k] if v is not None]
    repeats = [v for v in lps[p.marks[1]:p.marks[1] + k] if v is not None]
    gain = (sum(repeats) / len(repeats) - sum(firsts) / len(firsts)) if firsts and repeats else float("nan")
    report = TrustReport(True, "", greedy, diff, n, top1, gain)
    problems = []
    if diff > ECHO_TOL:
        problems.append(f"echoed vs generated up to {diff:.3g} nats, tolerance {ECHO_TOL}")
    if not top1:
        problems.append("the echo's first choices are not the generated tokens")
    if not math.isfinite(gain) or gain < CERTAIN_MARGIN:
        problems.append(f"a repeated key {gain:.3g} nats/token over its first statement, expected >= {CERTAIN_MARGIN}")
    if problems:  # the reason one short line (the first problem); every problem in run.json (as_dict)
        report.ok = False
        report.problems = problems
        more = f"; {len(problems) - 1} more in run.json" if len(problems) > 1 else ""
        report.reason = f"echoed prompt log-probabilities fail lctx's trust probe ({problems[0]}{more})"
    return report


def load_server(model: str, *, concurrency: int = CONCURRENCY, tokenizer: Optional[str] = None,
                api_key_env: Optional[str] = None, served_model: Optional[str] = None,
                timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = DEFAULT_RETRIES, chat_template: bool = False,
                system_prompt: Optional[str] = None, think_end: Optional[str] = None, think_budget: int = 0,
                seed: int = 0, name: Optional[str] = None, log=print) -> ServerAdapter:
    """Connect to the server(s) of ``model`` (``URL[,URL...]``) and return a :class:`ServerAdapter`: the served
    model (``/v1/models``; ``served_model`` chooses one of several), what each server says of itself (``/props``,
    ``/version``), its tokenizer (the server's endpoint, or ``tokenizer``: a local one, checked against the
    server's), whether it takes token-id prompts, its maximum context where it reports one, and the trust probe of its
    prompt log-probabilities (a failed probe is told to ``log`` once). Every server of the list must serve the same
    model id and tokenizer.

    Every reply of the load (the listings, the tokenizer's fingerprint, the trust probe) is checked as a sample's
    would be; one that fails its check (a bound, the deadline, a log-probability that cannot be, an HTTP error) ends
    the load in one line, before anything runs.

    Raises:
        LctxError: a bad URL, an unset ``--api-key-env`` variable, a server that cannot be reached or refuses the key,
            lists no model or several without ``served_model``, one that is not listed, servers that disagree, no
            tokenizer (neither an endpoint nor ``tokenizer``), a local tokenizer that tokenises otherwise than the
            server, ``concurrency`` below 1, a reply of the load that fails its checks (:class:`ServerReplyError`,
            :class:`ServerValueError`).
    """
    try:
        return _load_server(model, concurrency=concurrency, tokenizer=tokenizer, api_key_env=api_key_env,
                            served_model=served_model, timeout_s=timeout_s, retries=retries,
                            chat_template=chat_template, system_prompt=system_prompt, think_end=think_end,
                            think_budget=think_budget, seed=seed, name=name, log=log)
    except ServerReplyError as e:
        raise LctxError(f"{e} (while loading the served model, before anything ran)") from None


def _load_server(model: str, *, concurrency, tokenizer, api_key_env, served_model, timeout_s, retries, chat_template,
                 system_prompt, think_end, think_budget, seed, name, log) -> ServerAdapter:
    """:func:`load_server`'s body (its ServerReplyErrors become one LctxError there)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise LctxError(f"--concurrency {concurrency!r} is not a whole number >= 1; write e.g. --concurrency 4")
    key = api_key_from_env(api_key_env)
    urls = split_server_urls(model)
    eps = [Endpoint(u, key, timeout_s, retries) for u in urls]
    ids, served = [], {}
    for ep in eps:
        mid, info = _served_model(ep, served_model, api_key_env if key is not None else None)
        ids.append(mid)
        served[ep.shown] = info
    if len(set(ids)) != 1:
        raise LctxError("the servers of --model serve different models (" + ", ".join(f"{e.shown}: {quote(i, 80)!r}"
                        for e, i in zip(eps, ids)) + "); give the servers of one model")
    model_id = ids[0]
    kinds = [_tokenizer_kind(ep, strict=not tokenizer) for ep in eps]
    server_toks = [ServerTokenizer(ep, k, model_id) if k else None for ep, k in zip(eps, kinds)]
    fps = {t.fingerprint() for t in server_toks if t is not None}
    if len(fps) > 1:
        raise LctxError("the servers of --model tokenise differently (their tokenizer fingerprints differ); give the "
                        "servers of one model")
    if tokenizer:
        tok = _local_tokenizer(tokenizer)
        source = f"local tokenizer {tokenizer}"
        st = next((t for t in server_toks if t is not None), None)
        if st is not None:
            _check_local_tokenizer(tok, st)
        from lctx.models.adapters.hf import _tokenizer_adds_bos  # lazy: loads torch

        add_bos = _tokenizer_adds_bos(tok, None)
    else:
        tok = next((t for t in server_toks if t is not None), None)
        if tok is None:
            raise LctxError(f"the server {eps[0].shown} has no tokenizer endpoint (/tokenize, /extras/tokenize), so "
                            "lengths cannot be counted in its tokens; give --tokenizer PATH (the served model's "
                            "tokenizer: a folder, a .gguf file or a cached hub id)")
        source = f"the server's {'/extras/tokenize' if tok.kind == 'extras' else '/tokenize'}"
        add_bos = tok.bos_token_id is not None
        props = next((s.get("props") for s in served.values() if s.get("props")), None) or {}
        if isinstance(props.get("chat_template"), str):
            tok.chat_template = props["chat_template"]
            tok.special_tokens_map = {k: props[k] for k in ("bos_token", "eos_token") if isinstance(props.get(k), str)}
    shown = ",".join(e.shown for e in eps)
    lm = ServerAdapter(endpoints=eps, model_id=model_id, tokenizer=tok, name=name or _display_name(model_id),
                       path=shown, add_bos=add_bos, chat_template=chat_template, system_prompt=system_prompt,
                       concurrency=concurrency, seed=seed, think_end=think_end or None,
                       think_budget=int(think_budget or 0), served=served, tokenizer_source=source)
    lm.max_length = _max_length(served)
    lm.tokenizer_fingerprint()  # now, so a tokenizer endpoint that fails does so at load (cached for the resume key)
    if chat_template:
        lm.check_chat_template()
    lm.token_prompts = all([_takes_token_ids(ep, model_id, lm) for ep in eps])  # each server asked
    lm.trust = trust_probe(lm)
    if lm.trust.greedy_is_argmax is False:
        log(f"warning: {lm.name}: the server's temperature-0 completions are not its own first choices (a repetition "
            "penalty or a sampler lctx's request could not turn off): exact-match scores are those of its decoding, "
            "not of greedy decoding (docs/serving.md)")
    if not lm.trust.ok:  # said now, before the sweep; the run's end names the metrics it left without a value
        log(f"warning: {lm.name}: teacher-forced metrics (digit_acc, tf_*), ppl and mmlu/arc will be unavailable "
            f"through {lm.path}: {lm.trust.reason} (docs/serving.md#teacher-forced-metrics-and-the-trust-probe)")
    return lm


def _display_name(model_id: str) -> str:
    """A served model's display name: its id's last path part without a ``.gguf`` suffix."""
    base = model_id.replace("\\", "/").rstrip("/").split("/")[-1] or model_id
    return base[: -len(".gguf")] if base.lower().endswith(".gguf") else base


def _served_model(ep: Endpoint, served_model: Optional[str], key_env: Optional[str]) -> tuple[str, dict]:
    """(the model id, what the server says of itself) from ``/v1/models``, ``/props`` and ``/version``.

    Raises:
        LctxError: unreachable, a refused key, no model, several without ``served_model``, or it is not listed."""
    try:
        got = ep.call("GET /v1/models", lambda c: c.get(ep.url + "/models", cast_to=object), retries=ep.probe_retries,
                      bound=MODELS_BOUND)
    except ServerUnreachable as e:
        if ep.url.startswith("https://") and any(w in str(e) for w in ("SSL", "TLS", "ssl", "record layer")):
            raise LctxError(f"{ep.shown}: the TLS handshake failed ({str(e).split('(', 1)[-1].split(';')[0]}); is the "
                            "server plain HTTP? then write --model http://...") from None
        raise LctxError(f"no server answers at {ep.shown}; start it first (e.g. python -m llama_cpp.server --model "
                        "FILE.gguf --port 8000) or fix --model") from None
    except ServerReplyError as e:
        msg = str(e)
        if ("HTTP 401" in msg or "HTTP 403" in msg) and key_env:
            raise LctxError(f"{ep.shown} refused the API key in ${key_env} (--api-key-env {key_env}); check that "
                            "variable's value against the server's key") from None
        if "HTTP 401" in msg or "HTTP 403" in msg:
            raise LctxError(f"{ep.shown} wants an API key; put it in an environment variable and name it with "
                            "--api-key-env NAME") from None
        raise LctxError(f"{msg}; is --model the API's base URL, ending in /v1?") from None
    data = got.get("data") if isinstance(got, dict) else None
    listed = [d.get("id") for d in data if isinstance(d, dict) and isinstance(d.get("id"), str)
              and d.get("id").strip()] if isinstance(data, list) else []
    long_id = next((i for i in listed if len(i) > MAX_MODEL_ID), None)
    if long_id is not None:
        raise LctxError(f"{ep.shown}/models lists a model id of {len(long_id)} characters ({quote(long_id, 60)!r}), "
                        f"more than the {MAX_MODEL_ID} lctx takes (a name, not a document); serve the model under a "
                        "shorter name (vLLM: --served-model-name)")
    if not listed:
        raise LctxError(f"{ep.shown}/models lists no model with a non-empty id ({quote(got, 80)!r}); is --model the "
                        "API's base URL?")
    if served_model is not None:
        if served_model not in listed:
            raise LctxError(f"{ep.shown} does not serve {quote(served_model, 80)!r} (it lists {quote_list(listed)}); "
                            "fix --served-model")
        mid = served_model
    elif len(listed) > 1:
        raise LctxError(f"{ep.shown} serves several models ({quote_list(listed)}); choose one with "
                        "--served-model ID")
    else:
        mid = listed[0]
    entry = next(d for d in data if isinstance(d, dict) and d.get("id") == mid)
    info: dict = {"model": {k: entry[k] for k in ("id", "root", "max_model_len", "owned_by", "created")
                            if k in entry and k != "created"}}
    props = ep.get_json("/props", PROPS_BOUND)
    if isinstance(props, dict):
        keep = ("model_path", "total_slots", "build_info", "chat_template", "bos_token", "eos_token")
        info["props"] = {k: props[k] for k in keep if k in props}
        dgs = props.get("default_generation_settings")
        if isinstance(dgs, dict) and isinstance(dgs.get("n_ctx"), int):
            info["props"]["n_ctx"] = dgs["n_ctx"]
    version = ep.get_json("/version", VERSION_BOUND)
    if isinstance(version, dict):
        info["version"] = version
    return mid, info


def _max_length(served: dict) -> Optional[int]:
    """The smallest maximum context the servers report (vLLM's ``max_model_len``, llama-server's ``n_ctx``), or
    None (llama-cpp-python reports none: a prompt past its ``--n_ctx`` is refused per request)."""
    vals = []
    for info in served.values():
        v = info.get("model", {}).get("max_model_len") or (info.get("props") or {}).get("n_ctx")
        if isinstance(v, int) and v > 0:
            vals.append(v)
    return min(vals) if vals else None


def _tokenizer_kind(ep: Endpoint, strict: bool = True) -> Optional[str]:
    """Which tokenizer endpoint the server has: ``"tokenize"`` (``/tokenize``), ``"extras"`` (llama-cpp-python's
    ``/extras/tokenize``) or None (neither exists: both answer 404/405; or, not ``strict``, neither works: a local
    ``--tokenizer`` is given and a broken endpoint is left unused).

    Raises:
        LctxError: an endpoint that exists but fails (an HTTP error other than 404/405, a reply past its bound or its
            deadline, a reply without a ``tokens`` list) while the other does not answer: the first such failure,
            quoted, so that the message names the cause rather than "no tokenizer endpoint"."""
    failures = []
    for kind, path, body in (("tokenize", "/tokenize", {"content": "a", "prompt": "a"}),
                             ("extras", "/extras/tokenize", {"input": "a"})):
        try:
            got = ep.post_json(path, body, tokenize_bound("a"), retries=0)
        except ServerReplyError as e:
            failures.append(str(e))
            continue
        if isinstance(got, dict) and isinstance(got.get("tokens"), list) \
                and all(isinstance(t, int) and not isinstance(t, bool) for t in got["tokens"]):
            return kind
        if got is not None:  # it answered, but not {"tokens": [ids]}
            failures.append(f"{ep.shown}: POST {path} answered {quote(got, 80)!r}, not {{'tokens': [ids]}}")
    if failures and strict:
        raise LctxError(f"the server's tokenizer endpoint failed ({failures[0]}); fix the server, or give --tokenizer "
                        "PATH (the served model's tokenizer) to count tokens locally")
    return None


def _check_local_tokenizer(tok, server_tok: ServerTokenizer) -> None:
    """Refuse a ``--tokenizer`` that tokenises :data:`FINGERPRINT_TEXTS` otherwise than the server.

    Raises:
        LctxError: the first text tokenised differently (counts shown)."""
    for t in FINGERPRINT_TEXTS:
        mine, theirs = tok.encode(t, add_special_tokens=False), server_tok.encode(t)
        if list(mine) != list(theirs):
            raise LctxError(f"--tokenizer tokenises {t[:30]!r} into {len(mine)} tokens, the server into {len(theirs)}: "
                            "it is not the served model's tokenizer; give the right one, or drop --tokenizer to use "
                            "the server's")


def _takes_token_ids(ep: Endpoint, model_id: str, lm: ServerAdapter) -> bool:
    """Whether the server takes a prompt as token ids (one probe request, no retries: a refusal is an answer)."""
    ids = lm.prompt("a").ids
    try:
        reply = ep.call("a token-id prompt", lambda c: c.completions.create(model=model_id, prompt=ids, max_tokens=1,
                                                                           temperature=0), retries=0,
                        bound=completion_bound(1))
    except ServerReplyError:
        return False
    n = getattr(getattr(reply, "usage", None), "prompt_tokens", None)
    return bool(getattr(reply, "choices", None)) and type(n) is int and n == len(ids)
