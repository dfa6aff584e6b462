"""The typed options of the attention variants: :class:`Opt` (one option: type, default, per-version and
per-base defaults, help), :data:`OPTIONS_VERSION`, the lookup of a variant's schema (:func:`option_schema`) and
the check that refuses a ``variant_options`` key a variant does not know, or a value of the wrong type, with
the list of valid keys instead of ignoring it (:func:`check_variant_options`).

The schemas themselves live on the variant classes, the one place their defaults are written: each variant
and modifier class declares ``option_schema = {"lsh_samples": Opt(int, 16, "random binnings s"), ...}`` (a
composed ``"ggd_bam+ssmax"`` takes the union, :func:`lctx.models.variants.get_variant`) and reads its values
through :meth:`lctx.models.variants.AttentionVariant.option_values`. A variant registered outside lctx declares
its schema the same way (without one, its options are not checked).

Without transformers (the variant registry it reads, :mod:`lctx.models.variants`, needs torch only), so that
``lctx list variants`` and argument checks stay light (:class:`lctx.models.config.LctxConfig` imports it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .variants import MODIFIERS, get_variant  # torch, already loaded: lctx.models/__init__ imports variants first

# Version of the variant options' defaults. 1: configs saved before the field existed (GGD-BAM legacy
# form, one prior shared by all layers, content-only SSMax, acc_rot spread 1.0). 2: the seeds' and the
# reference code's defaults. A config.json without ``options_version`` is version 1.
OPTIONS_VERSION = 2


@dataclass(frozen=True)
class Opt:
    """One variant option: its type (``bool``, ``int``, ``float`` or ``str``), default (what a new config,
    :data:`OPTIONS_VERSION`, computes with), a one-line description, allowed values (``choices``, for
    strings) and ``default_means``: what the default does, named beside it in ``lctx list variants`` where a
    result depends on it unseen (``lsh_exact_dispatch``).

    ``legacy``: {options_version: default} for the versions whose default differs, each covering that
    version and the older ones down to the next listed (``{1: "legacy"}``: configs saved before
    ``options_version`` existed); ``per_base``: for a modifier, {base variant: default} where its default
    differs on that base (``ssmax_scale_bias``: ``{"ggd_bam": True}``; a subclass of the base counts). An
    option with either is *recorded*: :class:`lctx.models.config.LctxConfig` writes its default into
    ``variant_options``, so ``config.json`` names the value the model computes with and a config saved
    before a change keeps computing what it computed.
    """

    type: type
    default: object
    doc: str = ""
    choices: tuple = ()
    default_means: str = ""
    legacy: dict = field(default_factory=dict, hash=False)
    per_base: dict = field(default_factory=dict, hash=False)

    @property
    def recorded(self) -> bool:
        """Whether the default depends on the config's version or the base variant (see the class doc)."""
        return bool(self.legacy or self.per_base)

    def default_for(self, cls: type | None = None, version: int | None = None) -> object:
        """The default a variant class ``cls`` (a composed one for a modifier's option) computes with under
        options ``version`` (``None``: :data:`OPTIONS_VERSION`): :attr:`legacy` for an older version, else
        :attr:`per_base` for a base class in ``cls``'s hierarchy, else :attr:`default`."""
        if version is not None:
            for v in sorted(self.legacy):
                if version <= v:
                    return self.legacy[v]
        for c in getattr(cls, "__mro__", ()):
            name = c.__dict__.get("variant_name")
            if name in self.per_base:
                return self.per_base[name]
        return self.default

    def describe(self, default: object = None, per_base: dict | None = None) -> str:
        """``"lsh_samples"``-style help: the type, the choices and the default, e.g. ``int, default 16``.
        ``default``: the default to name instead of :attr:`default` (a variant's ``option_defaults``);
        ``per_base``: {base variant: default} where a modifier's default differs on that base, e.g.
        ``bool, default false; true with ggd_bam``; :attr:`default_means` follows the default after a colon."""
        def show(v):
            return str(v).lower() if isinstance(v, bool) else v

        kind = "|".join(self.choices) if self.choices else self.type.__name__
        text = f"{kind}, default {show(self.default if default is None else default)}"
        if self.default_means and (default is None or default == self.default):
            text += f": {self.default_means}"
        return text + "".join(f"; {show(v)} with {b}" for b, v in (per_base or {}).items())


def option_schema(variant: str) -> dict[str, Opt] | None:
    """The options ``variant`` takes: its class's ``option_schema`` (a composed ``"base+mod"`` takes the union
    of its parts; a modifier's name alone, e.g. ``"ssmax"``, its own), or ``None`` when a part declares none
    (a variant registered outside lctx without an ``option_schema``) or the name is unknown."""
    if variant in MODIFIERS:
        return MODIFIERS[variant].option_schema
    try:
        return get_variant(str(variant)).option_schema
    except KeyError:
        return None


def _type_ok(opt: Opt, v) -> bool:
    if opt.type is bool:
        return isinstance(v, bool)
    if opt.type is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if opt.type is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if opt.type is str:
        return isinstance(v, str) and (not opt.choices or v in opt.choices)
    return isinstance(v, opt.type)


def check_variant_options(variant: str, options: dict | None) -> None:
    """Refuse keys ``variant`` does not take and values of the wrong type (see :func:`option_schema`).

    Raises:
        ValueError: ``options`` is not a dict, has an unknown key (the message lists the valid keys with
            their types and defaults) or a value of the wrong type or outside the choices.
    """
    if options is None:
        return
    if not isinstance(options, dict):
        raise ValueError(f"variant_options must be a JSON object of KEY: VALUE, got {type(options).__name__}")
    schema = option_schema(variant)
    if schema is None:
        return
    valid = ", ".join(f"{k} ({o.describe()})" for k, o in schema.items()) or "none"
    for k, v in options.items():
        if k not in schema:
            raise ValueError(f"variant {variant!r} has no option {k!r}; valid options: {valid}")
        opt = schema[k]
        if not _type_ok(opt, v):
            want = (f"one of {', '.join(map(repr, opt.choices))}" if opt.choices else
                    {"bool": "true or false", "int": "an integer", "float": "a finite number"}.get(
                        opt.type.__name__, opt.type.__name__))
            raise ValueError(f"variant option {k}={v!r} of {variant!r} is not {want}")
