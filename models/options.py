"""The typed option schema of every attention variant (:data:`VARIANT_OPTIONS`): ``variant_options`` with a
key a variant does not know, or a value of the wrong type, is refused with the list of valid keys instead of
being ignored. Without transformers (the variant registry it reads, :mod:`lctx.models.variants`, needs torch
only), so that ``lctx list variants`` and argument checks stay light (:class:`lctx.models.config.LctxConfig`
imports it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .variants import MODIFIERS, VARIANTS  # torch, already loaded: lctx.models/__init__ imports variants first

# Version of the variant options' defaults. 1: configs saved before the field existed (GGD-BAM legacy
# form, one prior shared by all layers, content-only SSMax, acc_rot spread 1.0). 2: the seeds' and the
# reference code's defaults (issue 12). A config.json without ``options_version`` is version 1.
OPTIONS_VERSION = 2


@dataclass(frozen=True)
class Opt:
    """One variant option: its type (``bool``, ``int``, ``float`` or ``str``), default, allowed values
    (``choices``, for strings), a one-line description and ``default_means``: what the default does, named
    beside it in ``lctx list variants`` where a result depends on it unseen (``lsh_exact_dispatch``)."""

    type: type
    default: object
    doc: str = ""
    choices: tuple = ()
    default_means: str = ""

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


#: The options of each variant and modifier (a composed ``"ggd_bam+ssmax"`` takes the union). The code that
#: reads them is the variant's (``models/bam.py``, ``lsh.py``, ``rotations.py``, ``path.py``,
#: ``interdomain.py``); a variant registered elsewhere may declare its own ``option_schema`` class attribute.
VARIANT_OPTIONS: dict[str, dict[str, Opt]] = {
    "rope": {}, "nope": {}, "alibi": {}, "sinusoidal": {},
    "ggd_bam": {"ggd_form": Opt(str, "reference", "prior form: reference -e^theta(|j-i-mu|+eps)^beta, paper "
                                "-(|(j-i-mu)/alpha|+eps)^beta, legacy (options_version 1)",
                                ("reference", "paper", "legacy")),
                "ggd_shared": Opt(bool, False, "one prior for all layers (BAM's global_positional_encoding)"),
                "ggd_learn_mu": Opt(bool, False, "learn the prior's centre mu"),
                "ggd_eps": Opt(float, 1e-5, "epsilon inside |z| + eps")},
    "ssmax": {"ssmax_scale_bias": Opt(bool, False, "scale the prior too (BAM's seq_scale on the bias; "
                                      "default true with ggd_bam)")},
    "alibi_lsh": {"lsh_samples": Opt(int, 16, "random binnings s"), "lsh_seed": Opt(int, 0, "seed of layer 0"),
                  "lsh_block": Opt(int, 128, "query block of the reference"),
                  "lsh_resample_eval": Opt(bool, False, "resample the bins at evaluation"),
                  "lsh_exact_dispatch": Opt(bool, True, "fast path on CPU: run exact ALiBi where it is estimated "
                                            "cheaper than the LSH kernel (kernels.lsh_blocks.prefer_exact)",
                                            default_means="with --attn-impl fast on CPU, exact ALiBi runs where it "
                                            "is estimated cheaper than LSH (short inputs), attn_kernel "
                                            "lsh-exact-alibi; false: always LSH (lsh-blocks)")},
    "acc_rot": {"acc_rot_mode": Opt(str, "random", "random or learned increments", ("random", "learned")),
                "acc_rot_spread": Opt(float, 0.25, "std of the random increments / scale of the learned map (rad)"),
                "acc_rot_base": Opt(str, "rope", "base frequencies", ("rope", "zero")),
                "acc_rot_seed": Opt(int, 0, "seed of the random increments"),
                "rotate_values": Opt(bool, False, "transport values too")},
    "path": {"path_w_rank": Opt(int, 32, "rank of the w projection (0 = full)"),
             "path_conv_size": Opt(int, 3, "short conv width (0 = none)"),
             "path_forget_gate": Opt(bool, False, "PaTH-FoX forget gate"),
             "path_block": Opt(int, 64, "block size of the reference")},
    "interdomain": {"id_modes": Opt(int, 16, "complex modes N per head"), "id_chunk": Opt(int, 64, "scan chunk"),
                    "id_conv": Opt(int, 4, "short conv width K"),
                    "id_feature_norm": Opt(str, "l2", "feature map norm", ("l2", "sq")),
                    "id_input_norm": Opt(str, "joint", "RMSNorm of [xi(k); v]", ("joint", "split")),
                    "id_readout": Opt(str, "linear", "readout", ("linear", "normalized")),
                    "id_eta_eps": Opt(float, 1e-2, "eps of the normalized readout"),
                    "id_conj": Opt(bool, True, "conjugate-transpose readout"),
                    "id_dt_min": Opt(float, 1e-3, "smallest initial Delta"),
                    "id_dt_max": Opt(float, 1e-1, "largest initial Delta")},
    "s4d": {"s4d_modes": Opt(int, 16, "modes N per channel"), "s4d_chunk": Opt(int, 64, "scan chunk"),
            "s4d_dt_min": Opt(float, 1e-3, "smallest initial Delta"),
            "s4d_dt_max": Opt(float, 1e-1, "largest initial Delta")},
}


def option_schema(variant: str) -> dict[str, Opt] | None:
    """The options ``variant`` takes (a composed ``"base+mod"`` takes the union of its parts), or ``None``
    when a part declares none (a variant registered outside lctx without an ``option_schema``)."""
    out: dict[str, Opt] = {}
    for part in str(variant).split("+"):
        sch = VARIANT_OPTIONS.get(part)
        if sch is None:
            cls = VARIANTS.get(part) or MODIFIERS.get(part)
            sch = getattr(cls, "option_schema", None)
        if sch is None:
            return None
        out.update(sch)
    return out


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
    """Refuse keys ``variant`` does not take and values of the wrong type (see :data:`VARIANT_OPTIONS`).

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
