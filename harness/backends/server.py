"""The ``server`` backend: a model served over the OpenAI-compatible API (vLLM, llama.cpp's ``llama-server``,
llama-cpp-python; docs/serving.md), ``--model http://HOST:PORT[/v1][,URL...]``, by
:func:`lctx.models.adapters.server.load_server`. It claims every ``http://`` / ``https://`` value. Its positional
code runs in the server (start the server with the method: docs/positions.md#served-and-gguf-models), so it takes
no ``--position``.

Per-model arguments (``-M``): ``served_model``, ``tokenizer``, ``api_key_env``, ``concurrency``, ``request_timeout``,
``retries``, ``think_end``, ``think_budget``; run-wide by default (``--served-model`` ...), each within
:data:`SERVED_BOUNDS`. Light: the load imports the ``openai`` client and torch when it runs.
"""

from __future__ import annotations

from lctx.errors import LctxError
from lctx.harness.backends import Backend

#: bounds of the served model's request options, checked before any work ({name: (lowest, highest, why/fix)}): a
#: thinking budget enlarges every request's ``max_tokens`` and the byte bound of its reply
SERVED_BOUNDS = {
    "think_budget": (0, 65536, "the tokens a reasoning model may think before its answer; 64K at most, a bound on "
                              "every reply's size: pass e.g. --think-budget 2048"),
    "retries": (0, 100, "retries of one request with exponential back-off; 100 already waits for hours: pass e.g. "
                        "--retries 4"),
    "request_timeout": (0.1, 86400, "seconds from connect to the last byte of one reply, at most a day: pass e.g. "
                                    "--request-timeout 600"),
    "concurrency": (1, 1024, "requests in flight at once over all servers; pass e.g. --concurrency 8"),
}


def check_bounds(values: dict) -> None:
    """Every key of :data:`SERVED_BOUNDS` in ``values`` (numbers; others left to their own checks) within its bounds.

    Raises:
        LctxError: the first one outside (one line with its bounds and the fix)."""
    for k, (lo, hi, fix) in SERVED_BOUNDS.items():
        v = values.get(k)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not (lo <= v <= hi):  # NaN fails too
            raise LctxError(f"{k.replace('_', '-')} {v!r} is outside [{lo:g}, {hi:g}] ({fix})")


def _claims(location: str) -> bool:
    """An ``http://`` or ``https://`` URL, or a comma list of them (:func:`lctx.model_files.is_server_url`)."""
    from lctx.model_files import is_server_url  # light: stdlib only

    return is_server_url(location)


def _check(location: str) -> None:
    """Each URL well-formed (:func:`lctx.model_files.split_server_urls`); no connection.

    Raises:
        LctxError: one line naming the fix."""
    from lctx.model_files import split_server_urls  # light: stdlib only

    split_server_urls(location)


def _load(location: str, settings: dict, positions, log) -> list:
    """One :class:`~lctx.models.adapters.server.ServerAdapter` (connected, its tokenizer and trust probe checked).

    Raises:
        LctxError: what :func:`~lctx.models.adapters.server.load_server` raises."""
    from lctx.models.adapters.server import load_server  # lazy: loads the openai client and torch

    s = dict(settings)
    s["timeout_s"] = s.pop("request_timeout")
    for k in ("device", "dtype", "chunk_size", "trust_remote_code", "attn_impl", "attn_override", "cache_dir",
              "progress"):
        s.pop(k, None)  # run-wide load settings of in-process checkpoints
    return [load_server(location, log=log, **s)]


BACKEND = Backend(
    name="server",
    summary="an OpenAI-compatible server (vLLM, llama-server, llama-cpp-python): --model http://HOST:PORT[,URL...]",
    claims=_claims, check=_check, load=_load,
    options={"served_model": (str, "the model id to use when the server lists several (--served-model)"),
             "tokenizer": (str, "a local tokenizer when the server has no endpoint (--tokenizer)"),
             "api_key_env": (str, "the environment variable holding the API key (--api-key-env)"),
             "concurrency": (int, "requests in flight at once (--concurrency)"),
             "request_timeout": (float, "seconds per request, connect to last byte (--request-timeout)"),
             "retries": (int, "retries on 429/5xx (--retries)"),
             "think_end": (str, "the tag that ends a reasoning model's thinking (--think-end)"),
             "think_budget": (int, "tokens a reasoning model may think (--think-budget)")},
    provides=frozenset({"lmeval_api_model", "check_answer_room", "sample_notes", "chat_source", "chat_prompt"}),
    positions=False, max_before_load=False, adapter="lctx.models.adapters.server:ServerAdapter")
