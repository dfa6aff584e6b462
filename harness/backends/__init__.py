"""The model backends: how a ``--model`` value becomes model adapters, in one place.

A backend is one file of this folder, named as the backend, holding one light :class:`Backend` (``BACKEND``): which
``--model`` values it claims, the checks it makes of one before torch loads, the per-model arguments it takes
(``-M KEY=VALUE,...``, as lm-eval's ``--model_args``), the optional capabilities its adapters have (named without
importing them, for the checks made before torch; ``tests/test_backends.py`` compares them with the adapter class's
:func:`lctx.models.adapters.protocol.capabilities`), whether it takes positional methods, and a lazy ``load``.
A plug-in registers one more with :func:`register_backend` (from a Python file or a package), and names it as
``NAME:LOCATION`` or by its ``claims``. Shipped: ``checkpoint`` (lctx, Hugging Face and GGUF checkpoints, in process)
and ``server`` (OpenAI-compatible servers: vLLM, llama-server, llama-cpp-python).

A model spec is resolved here only (:func:`resolve_models`): the location, its backend (named, or the one that claims
it; ``checkpoint`` takes what no other claims) and its per-model arguments parsed against the backend's schema. The
run-wide flags (``--dtype``, ``--concurrency``, ...) are each backend's defaults; ``-M`` overrides them per model.

Light: imports no torch (``lctx run``'s one-line errors come before it loads).
"""

from __future__ import annotations

import difflib
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from lctx.errors import LctxError
from lctx.registry import Registry

#: files of this folder that are not backends
_NOT_BACKENDS = {"__init__"}


@dataclass(frozen=True)
class Backend:
    """One way of running a model (one file of ``harness/backends/``, or a plug-in's :func:`register_backend`).

    name: what ``NAME:LOCATION`` and run.json call it. summary: one line for ``lctx list backends``.
    claims(location: str) -> bool: whether a ``--model`` value is this backend's (light; the ``checkpoint`` backend
    claims what no other does). check(location: str) -> None: the checks of a location that cost no torch and no
    connection (raises :class:`~lctx.errors.LctxError`). options: {key: (type, help)} of the per-model arguments
    (``-M``; type ``int``, ``float``, ``bool`` or ``str``); their run-wide values come from ``lctx run``'s flags /
    :func:`lctx.evaluate`'s keywords of the same name. provides: the optional capabilities of its adapters
    (:data:`lctx.models.adapters.protocol.OPTIONAL_MEMBERS` methods, e.g. ``"lmeval_model"``) for the checks made
    before anything loads. positions: it takes positional methods (``--position``; one model per method).
    max_before_load: it knows a model's declared maximum context before loading it (a checkpoint's config); a served
    model's is known once connected. adapter: ``"module:Class"`` of its adapters (read by tests, never imported
    here). load(location, settings, positions, log) -> list of adapters: ``settings`` the run-wide values merged with
    the per-model ones (only keys of ``options`` plus the run's ``chat_template``, ``system_prompt``, ``progress``,
    ``cache_dir``, ``seed``, ``attn_override``), ``positions`` the positional method specs (``["shipped"]`` for a
    backend without positions). Source: lm-eval's model registry and ``--model_args`` (lm_eval/api/registry.py),
    inspect_ai's providers.
    """

    name: str
    summary: str
    claims: Callable[[str], bool]
    check: Callable[[str], None]
    load: Callable[..., list]
    options: dict = field(default_factory=dict)
    provides: frozenset = frozenset()
    positions: bool = False
    max_before_load: bool = False
    adapter: str = ""


#: the backends known so far (the files of this folder load on first use: :func:`backends`)
BACKENDS: Registry[Backend] = Registry("model backend", replace=True)
#: the backend a location no other claims goes to
FALLBACK = "checkpoint"


def backend_names() -> list[str]:
    """The backends lctx ships: the ``*.py`` files of this folder but ``__init__``, sorted (no import)."""
    here = Path(__file__).resolve().parent
    return sorted(p.stem for p in here.glob("*.py") if p.stem not in _NOT_BACKENDS and not p.stem.startswith("_"))


def register_backend(backend: Backend) -> Backend:
    """Register a backend (a plug-in's; replaces one of the same name); returns it.

    Raises:
        LctxError: ``backend`` is not a :class:`Backend`, or its name is empty or holds ``:``."""
    if not isinstance(backend, Backend):
        raise LctxError(f"register_backend({backend!r}): pass a lctx.harness.backends.Backend")
    if not backend.name or ":" in backend.name or not backend.name.isidentifier():
        raise LctxError(f"backend name {backend.name!r} must be an identifier (it is written NAME:LOCATION)")
    return BACKENDS.add(backend.name, backend)


def backends() -> Registry[Backend]:
    """Every backend: the shipped files (imported once, light) and the registered plug-ins."""
    for name in backend_names():
        if name not in BACKENDS:
            register_backend(importlib.import_module(f"{__name__}.{name}").BACKEND)
    return BACKENDS


def get_backend(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        LctxError: no backend of that name (the closest named)."""
    reg = backends()
    if name not in reg:
        near = difflib.get_close_matches(name, list(reg), n=1)
        raise LctxError(f"unknown model backend {name!r}; {'did you mean ' + repr(near[0]) + '? ' if near else ''}"
                        f"use one of {reg.known()} (`lctx list backends`)")
    return reg[name]


@dataclass
class ModelSpec:
    """One ``--model`` resolved: ``location`` (a path, URL or a plug-in's own text; None for an adapter object),
    ``backend`` (None for an adapter object, which runs as it is), ``args`` ({key: value} of its per-model
    arguments, typed), ``given`` (what the user passed)."""

    given: Any
    location: Optional[str]
    backend: Optional[Backend]
    args: dict = field(default_factory=dict)

    @property
    def is_object(self) -> bool:
        """An adapter object (loaded already), not a location."""
        return self.backend is None


def split_backend(model: str) -> tuple[Optional[str], str]:
    """(the backend named as ``NAME:LOCATION``, else None; the location) of a ``--model`` value. ``NAME`` must be a
    known backend (so ``http://...`` and a path holding ``:`` stay locations)."""
    name, sep, rest = model.partition(":")
    if sep and name in backends() and not rest.startswith("//"):
        return name, rest
    return None, model


def claim(model: str) -> tuple[Backend, str]:
    """(the backend, the location) of a ``--model`` string: the one named (``NAME:LOCATION``), else the one that
    claims it, else :data:`FALLBACK`.

    Raises:
        LctxError: two backends claim it (name one of them)."""
    named, loc = split_backend(model)
    if named:
        return get_backend(named), loc
    reg = backends()
    mine = [b for n, b in reg.items() if n != FALLBACK and b.claims(model)]
    if len(mine) > 1:
        raise LctxError(f"--model {model!r} is claimed by the backends {', '.join(b.name for b in mine)}; name one, "
                        f"e.g. --model {mine[0].name}:{model}")
    return (mine[0] if mine else reg[FALLBACK]), model


def _typed(backend: Backend, key: str, text, where: str):
    """``text`` (a -M value as written, or a Python value from :func:`lctx.evaluate`) as ``backend.options[key]``'s
    type."""
    kind = backend.options[key][0]
    if not isinstance(text, str):
        ok = isinstance(text, kind) and not (kind is not bool and isinstance(text, bool))
        if kind is float and isinstance(text, int) and not isinstance(text, bool):
            ok, text = True, float(text)
        if not ok:
            raise LctxError(f"{where}: {key}={text!r} is not {kind.__name__}; pass e.g. {key}="
                            f"{_example(kind)}")
        return text
    try:
        if kind is bool:
            low = text.lower()
            if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError
            return low in ("true", "1", "yes", "on")
        return kind(text) if kind is not str else text
    except ValueError:
        raise LctxError(f"{where}: {key}={text!r} is not {'a whole number' if kind is int else kind.__name__}; "
                        f"pass e.g. {key}={_example(kind)}") from None


def _example(kind) -> str:
    return {int: "8", float: "1.5", bool: "true"}.get(kind, "NAME")


def parse_model_args(text, backend: Backend, where: str = "-M") -> dict:
    """The per-model arguments of one ``-M KEY=VALUE[,KEY=VALUE...]`` (a string, a JSON object as text, or a dict
    from :func:`lctx.evaluate`) for ``backend``: {key: value of the option's type}.

    Raises:
        LctxError: an item that is not KEY=VALUE, a key given twice, a key the backend does not take (its keys
            named), a value that is not of the key's type; one line each."""
    if text is None or text == "":
        return {}
    if isinstance(text, str) and text.lstrip().startswith("{"):
        try:
            text = json.loads(text)
        except json.JSONDecodeError as e:
            raise LctxError(f"{where} {text!r} is not a JSON object ({e.msg}); write KEY=VALUE,... or "
                            "'{\"key\": value}'") from None
    if isinstance(text, dict):
        items = list(text.items())
    elif isinstance(text, str):
        items = []
        for item in (p.strip() for p in text.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise LctxError(f"{where} {text!r}: {item!r} is not KEY=VALUE; write e.g. -M "
                                f"{next(iter(backend.options), 'key')}=VALUE")
            items.append((key.strip(), value.strip()))
    else:
        raise LctxError(f"model_args={text!r} is neither a KEY=VALUE,... string nor a dict")
    out: dict = {}
    for key, value in items:
        if not isinstance(key, str):
            raise LctxError(f"{where}: key {key!r} is not a string")
        if key in out:
            raise LctxError(f"{where}: {key} is given twice")
        if key not in backend.options:
            near = difflib.get_close_matches(key, list(backend.options), n=1)
            keys = ", ".join(backend.options) or "none"
            raise LctxError(f"{where}: the {backend.name} backend takes no {key!r}; "
                            f"{'did you mean ' + repr(near[0]) + '? ' if near else ''}its keys: {keys}")
        out[key] = _typed(backend, key, value, where)
    return out


def _is_object(model) -> bool:
    return not isinstance(model, (str, Path))


def resolve_models(models: Sequence, model_args=None) -> list[ModelSpec]:
    """``models`` (paths, URLs, ``NAME:LOCATION`` strings, adapter objects) as :class:`ModelSpec` s, each with its
    per-model arguments: ``model_args`` None, one spec for every model (a string or dict; an adapter object takes
    none), or a list of exactly one per model, paired in order (lm-eval's ``--model_args``, per model).

    Raises:
        LctxError: a model two backends claim, an unknown ``NAME:``, a location its backend's light check refuses,
            a count of ``model_args`` that is neither 1 nor one per model, arguments beside an adapter object, a
            bad argument (:func:`parse_model_args`); one line each."""
    models = list(models)
    if model_args is None or isinstance(model_args, (str, dict)):
        per = [model_args] * len(models)
        shared = True
    else:
        per = list(model_args)
        shared = len(per) == 1
        if shared:
            per = per * len(models)
        elif len(per) != len(models):
            raise LctxError(f"{len(per)} -M/--model-args for {len(models)} models; give one for every model, or "
                            "exactly one per --model, in the same order")
    out = []
    for m, args in zip(models, per):
        if _is_object(m):
            if args and not shared:
                raise LctxError(f"-M {args!r} is given for model {getattr(m, 'name', m)!r}, an adapter object "
                                "loaded already; set its options when you build it")
            out.append(ModelSpec(given=m, location=None, backend=None))
            continue
        backend, loc = claim(str(m))
        backend.check(loc)
        where = f"-M {args}" if isinstance(args, str) else "model_args"
        out.append(ModelSpec(given=m, location=loc, backend=backend, args=parse_model_args(args, backend, where)))
    return out
