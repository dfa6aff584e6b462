"""The ``checkpoint`` backend: a checkpoint run in this process (an lctx or Hugging Face folder, a GGUF file or a
folder holding one, a hub id in the local Hugging Face cache, a packaged model such as ``gemma3-270m``), loaded by
:func:`lctx.models.adapters.hf.load_lm` once per positional method (``--position``: the cross product). It takes
every ``--model`` value no other backend claims.

Per-model arguments (``-M``): ``dtype``, ``chunk_size``, ``attn_impl``, ``trust_remote_code`` (run-wide by default
``--dtype`` ...) and ``prefix_reuse`` (off by default). Light: the load imports torch when it runs.
"""

from __future__ import annotations

from lctx.harness.backends import Backend


def _claims(location: str) -> bool:
    """Never claims on its own: the fallback of :func:`lctx.harness.backends.claim`."""
    return False


def _check(location: str) -> None:
    """The path exists (or is a cached hub id / packaged model) and a folder has tokenizer files
    (:func:`lctx.model_files.check_model_path`, :func:`~lctx.model_files.check_tokenizer_files`).

    Raises:
        LctxError: one line naming the fix."""
    from lctx.model_files import check_model_path, check_tokenizer_files  # light: stdlib only

    check_tokenizer_files(check_model_path(location))


def _load(location: str, settings: dict, positions, log) -> list:
    """One :class:`~lctx.models.adapters.hf.HFAdapter` per positional method of ``positions`` (specs, repeats by
    label dropped with a note to ``log``), loaded with ``settings`` (:func:`~lctx.models.adapters.hf.load_lm`'s
    keywords).

    Raises:
        LctxError: a bad method option (every spec parsed before any model loads), a checkpoint ``load_lm``
            refuses (a method that does not apply to it or changed nothing)."""
    from lctx.models.adapters.hf import load_lm  # lazy: loads torch, transformers
    from lctx.models.position import parse_position  # lazy: loads lctx.models (torch), loaded by load_lm anyway

    positions = list(positions or ["shipped"])
    parsed = [parse_position(p) for p in positions]
    labels = [m.spec.label if m is not None else "shipped" for m in parsed]
    methods = [positions[labels.index(lab)] for lab in dict.fromkeys(labels)]  # one per label
    if len(methods) < len(positions):
        log(f"note: --position {', '.join(positions)} name {len(methods)} distinct methods; each runs once")
    return [load_lm(location, log=log, position=spec, **settings) for spec in methods]


BACKEND = Backend(
    name="checkpoint",
    summary="an lctx / Hugging Face folder, a GGUF file, a cached hub id or a packaged model, run in process",
    claims=_claims, check=_check, load=_load,
    options={"dtype": (str, "weights' dtype (--dtype)"), "chunk_size": (int, "prefill chunk in tokens (--chunk-size)"),
             "attn_impl": (str, "attention implementation (--attn-impl)"),
             "trust_remote_code": (bool, "run code shipped with the checkpoint (--trust-remote-code)"),
             "prefix_reuse": (bool, "reuse the previous prompt's KV cache up to the shared prefix (samples of one "
                                    "haystack; not for sliding-window or length-dependent RoPE models)")},
    provides=frozenset({"lmeval_model", "chat_source", "chat_prompt"}),
    positions=True, max_before_load=True, adapter="lctx.models.adapters.hf:HFAdapter")
