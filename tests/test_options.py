"""lctx.models.options: each variant and modifier class carries its option schema (``option_schema``, issue
26): the defaults are written there only, read through ``AttentionVariant.option_values``; per-version and
per-base defaults come out of the ``Opt`` (``legacy``, ``per_base``); a variant registered outside lctx declares
its schema the same way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import assert_one_line_error, run_cli
from lctx.models import MODIFIERS, VARIANTS, LctxConfig, get_variant
from lctx.models.options import OPTIONS_VERSION, Opt, option_schema
from lctx.models.variants import AttentionVariant

ROOT = Path(__file__).resolve().parent.parent
#: The package's source folders scanned for read sites (tests, tools and checkpoints are not the package).
SCANNED = ("models", "kernels", "tasks", "harness")


def option_names() -> set[str]:
    """Every option any registered variant or modifier declares."""
    return {k for cls in [*VARIANTS.values(), *MODIFIERS.values()] for k in (cls.option_schema or {})}


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant)


def repeated_defaults(source: str, names: set[str], filename: str = "<src>") -> list[str]:
    """``file:line: code`` of each read site that bypasses the schema: a ``.get("<option>", ...)`` (with or
    without a default: the schema's default is not applied) or any call that passes an option name followed by
    a literal (``_opt(opts, "id_conv", 4, int)``, ``getattr(c, "lsh_seed", 0)``) or a literal ``default=``."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        args = list(node.args)
        hits = [i for i, a in enumerate(args) if isinstance(a, ast.Constant) and a.value in names]
        is_get = isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault", "pop")
        bad = any((is_get and i == 0) or (i + 1 < len(args) and _literal(args[i + 1])) or
                  any(kw.arg == "default" and _literal(kw.value) for kw in node.keywords) for i in hits)
        if bad:
            out.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_scan_catches_a_repeated_default():
    # control: the forms the variants used before the schemas moved onto them, and the reads that are fine
    src = ('n = int(opts.get("lsh_samples", 16))\nk = _opt(opts, "id_conv", 4, int)\n'
           'e = opts.get("ggd_eps")\nd = getattr(cfg, "id_eta_eps", -1e-2)\n'
           'ok = o["lsh_samples"]\nok2 = schema.get(k)\nok3 = _opt(o, "id_conv", int)\n')
    found = repeated_defaults(src, {"lsh_samples", "id_conv", "ggd_eps", "id_eta_eps"})
    assert sorted(int(f.split(":")[1]) for f in found) == [1, 2, 3, 4], found


def test_no_read_site_repeats_a_default():
    names = option_names()
    assert {"lsh_samples", "ggd_form", "ssmax_scale_bias", "id_conv", "acc_rot_spread"} <= names
    found = []
    for folder in SCANNED:
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "checkpoints" not in p.parts:
                found += repeated_defaults(p.read_text(), names, str(p.relative_to(ROOT)))
    assert not found, ("read variant options through AttentionVariant.option_values (the schema's defaults), not "
                       "with a default of their own:\n" + "\n".join(found))


def test_every_builtin_class_declares_its_schema():
    for name, cls in [*VARIANTS.items(), *MODIFIERS.items()]:
        if cls.__module__.startswith("lctx."):
            assert isinstance(cls.__dict__.get("option_schema"), dict), name  # declared on the class itself
            assert all(isinstance(o, Opt) for o in cls.option_schema.values()), name
            assert option_schema(name) is cls.option_schema
    assert option_schema("nope") == {} and option_schema("no_such_variant") is None


def test_a_composition_takes_the_union_base_first():
    comp = get_variant("ggd_bam+ssmax")
    assert list(comp.option_schema) == [*VARIANTS["ggd_bam"].option_schema, "ssmax_scale_bias"]
    assert option_schema("rope+ssmax") == {"ssmax_scale_bias": MODIFIERS["ssmax"].option_schema["ssmax_scale_bias"]}


@pytest.mark.parametrize("variant,version,want", [
    # per-version (legacy) and per-base defaults: what LctxConfig writes into variant_options
    ("ggd_bam", 1, {"ggd_form": "legacy", "ggd_shared": True}),
    ("ggd_bam", 2, {"ggd_form": "reference", "ggd_shared": False}),
    ("ggd_bam+ssmax", 1, {"ggd_form": "legacy", "ggd_shared": True, "ssmax_scale_bias": False}),
    ("ggd_bam+ssmax", 2, {"ggd_form": "reference", "ggd_shared": False, "ssmax_scale_bias": True}),
    ("alibi+ssmax", 2, {"ssmax_scale_bias": False}),
    ("acc_rot", 1, {"acc_rot_spread": 1.0}),
    ("acc_rot", 2, {"acc_rot_spread": 0.25}),
    ("alibi_lsh", 1, {}), ("rope", 2, {}),
])
def test_recorded_defaults_by_version_and_base(variant, version, want):
    cfg = LctxConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, variant=variant,
                     options_version=version)
    assert cfg.variant_options == want
    values = get_variant(variant).option_values(cfg)
    assert set(values) == set(option_schema(variant)) and values.items() >= want.items()


def test_option_values_fill_the_schema_and_keep_the_config():
    cfg = LctxConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, variant="alibi_lsh",
                     variant_options={"lsh_samples": 3})
    assert get_variant("alibi_lsh").option_values(cfg) == {
        "lsh_samples": 3, "lsh_seed": 0, "lsh_block": 128, "lsh_resample_eval": False, "lsh_exact_dispatch": True}
    assert get_variant("alibi_lsh")(cfg, 2).seed == 2  # lsh_seed 0 + layer
    # a config built for the base (lctx run --attn-override ssmax): the composition's default at its version
    cfg = LctxConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, variant="ggd_bam")
    assert get_variant("ggd_bam+ssmax")(cfg, 0).scale_bias is True
    cfg = LctxConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, variant="ggd_bam", options_version=1)
    assert get_variant("ggd_bam+ssmax")(cfg, 0).scale_bias is False


def test_opt_default_for_versions_and_bases():
    o = Opt(int, 3, "x", legacy={1: 1, 2: 2})
    assert [o.default_for(None, v) for v in (0, 1, 2, 3, None)] == [1, 1, 2, 3, 3]
    assert o.recorded and not Opt(int, 3).recorded
    sub = type("SubBam", (get_variant("ggd_bam"),), {})  # a subclass of the base counts as that base
    p = Opt(bool, False, per_base={"ggd_bam": True}, legacy={1: False})
    assert (p.default_for(sub, 2), p.default_for(sub, 1), p.default_for(VARIANTS["rope"], 2)) == (True, False, False)
    assert OPTIONS_VERSION == 2


def test_a_user_variant_declares_its_schema_the_same_way(monkeypatch):
    class Mine(AttentionVariant):
        """A variant registered outside lctx, with one option."""
        variant_name = "mine_test"
        option_schema = {"mine_width": Opt(int, 7, "a width", legacy={1: 5})}

        def __init__(self, config, layer_idx):
            super().__init__(config, layer_idx)
            self.width = self.option_values(config)["mine_width"]

    monkeypatch.setitem(VARIANTS, "mine_test", Mine)
    assert "mine_width=<int, default 7>" in f"mine_width=<{option_schema('mine_test')['mine_width'].describe()}>"
    with pytest.raises(ValueError, match=r"has no option 'width'; valid options: mine_width \(int, default 7\)"):
        LctxConfig(hidden_size=32, num_attention_heads=4, variant="mine_test", variant_options={"width": 1})
    cfg = LctxConfig(hidden_size=32, num_attention_heads=4, variant="mine_test")
    assert cfg.variant_options == {"mine_width": 7} and Mine(cfg, 0).width == 7  # recorded: it has a legacy default
    old = LctxConfig.from_dict({"hidden_size": 32, "num_attention_heads": 4, "variant": "mine_test"})
    assert Mine(old, 0).width == 5
    # without a schema its options are not checked (as before schemas existed)
    monkeypatch.setitem(VARIANTS, "loose_test", type("Loose", (AttentionVariant,), {"variant_name": "loose_test"}))
    assert LctxConfig(hidden_size=32, num_attention_heads=4, variant="loose_test",
                      variant_options={"anything": 1}).variant_options == {"anything": 1}


@pytest.mark.usefixtures("isolated_digests")
def test_unknown_variant_option_keys(tmp_path, capsys):
    """Issue 10 item 15: an unknown or misspelt variant option, or a value of the wrong type, is refused."""
    from lctx.models import LctxConfig

    code, _, err = run_cli(["train", "--option", "bogus_opt=3", "--steps", "1", "--out", tmp_path / "m"], capsys)
    assert_one_line_error(code, err, "bogus_opt", "valid options")
    assert not (tmp_path / "m").exists()
    code, _, err = run_cli(["train", "--variant", "alibi_lsh", "--option", "lsh_sampels=4", "--steps", "1",
                            "--out", tmp_path / "m"], capsys)
    assert_one_line_error(code, err, "lsh_sampels", "lsh_samples (int, default 16)")
    with pytest.raises(ValueError, match="no option 'lsh_sampels'"):
        LctxConfig(variant="alibi_lsh", variant_options={"lsh_sampels": 4})
    with pytest.raises(ValueError, match="not true or false"):
        LctxConfig(variant="ggd_bam", variant_options={"ggd_shared": "false"})  # bool("false") was True
    with pytest.raises(ValueError, match="not an integer"):
        LctxConfig(variant="alibi_lsh", variant_options={"lsh_samples": 4.5})
    with pytest.raises(ValueError, match="one of 'random', 'learned'"):
        LctxConfig(variant="acc_rot", variant_options={"acc_rot_mode": "lerned"})
    LctxConfig(variant="ggd_bam+ssmax", variant_options={"ggd_shared": False, "ssmax_scale_bias": True})


@pytest.mark.usefixtures("isolated_digests")
def test_every_variant_has_an_option_schema():
    """Issue 10 item 15: every variant and modifier has an option schema."""
    from lctx.models import MODIFIERS, VARIANTS
    from lctx.models.config import option_schema

    for name in list(VARIANTS) + list(MODIFIERS):
        assert option_schema(name) is not None, name


@pytest.mark.usefixtures("plain_console")
def test_list_variants_shows_the_ssmax_modifier(capsys):
    """Issue 16 item 4: lctx list variants shows the +ssmax modifier and the variants it composes with."""
    code, out, _ = run_cli(["list", "variants"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if "+ssmax" in ln)
    assert "Scalable-Softmax" in line and "rope+ssmax" in line and "ggd_bam" in line


@pytest.mark.usefixtures("plain_console")
def test_list_variants_names_the_defaults_a_new_model_computes_with(capsys):
    """Issue 16 item 4: the listed defaults are those a new model writes (ssmax_scale_bias true with ggd_bam)."""
    # +ssmax's ssmax_scale_bias defaults to false but to true on ggd_bam (BAM-SSMax scales the prior too): the
    # listing must say so, and agree with the config a new ggd_bam+ssmax / alibi+ssmax model writes
    from lctx.models import LctxConfig

    code, out, _ = run_cli(["list", "variants"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if "+ssmax" in ln)
    assert "ssmax_scale_bias=<bool, default false; true with ggd_bam>" in line
    for base, want in (("ggd_bam", True), ("alibi", False), ("rope", False)):
        cfg = LctxConfig(variant=f"{base}+ssmax", hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
        assert cfg.variant_options["ssmax_scale_bias"] is want, base


@pytest.mark.usefixtures("plain_console")
def test_list_variants_says_what_the_lsh_exact_dispatch_default_does(capsys):
    """Issue 24 item 9: the listing says what lsh_exact_dispatch's default does and the attn_kernel it records."""
    # alibi_lsh's rows on the CPU fast path may come from exact ALiBi (issue 24, item 9): the listing names the
    # default, what it does and the attn_kernel it records, and the default is what a new model computes with
    from lctx.models import LctxConfig

    code, out, _ = run_cli(["list", "variants"], capsys)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("| alibi_lsh"))
    opt = line.split("lsh_exact_dispatch=<", 1)[1].split(">", 1)[0]
    assert opt.startswith("bool, default true: with --attn-impl fast on CPU, exact ALiBi runs"), opt
    assert "lsh-exact-alibi" in opt and "false: always LSH (lsh-blocks)" in opt
    cfg = LctxConfig(variant="alibi_lsh", hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
    assert cfg.variant_options.get("lsh_exact_dispatch", True) is True
