"""One registry type (lctx.registry.Registry) behind tasks, derived names, variants, modifiers and
--attn-override names."""

from __future__ import annotations

import pytest
from lctx.models.adapters.overrides import OVERRIDES
from lctx.models.variants import MODIFIERS, VARIANTS, register_modifier, register_variant
from lctx.registry import Registry
from lctx.tasks.base import GROUPS, TASKS


def test_every_registry_is_one_type():
    for reg in (TASKS, GROUPS, VARIANTS, MODIFIERS, OVERRIDES):
        assert isinstance(reg, Registry) and isinstance(reg, dict)
    assert {"passkey", "ppl"} <= set(TASKS) and {"rope", "alibi"} <= set(VARIANTS) and "ssmax" in MODIFIERS
    assert OVERRIDES["ssmax"] == {"s": 1.0}


def test_registry_add_replace_and_errors():
    reg = Registry("widget")
    assert reg.add("a", 1) == 1 and reg == {"a": 1}
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.add("a", 2)
    with pytest.raises(ValueError, match="non-empty name"):
        reg.add("", 3)
    loose = Registry("task", {"a": 1}, replace=True)
    loose.add("a", 2)  # a reloaded task file replaces its class
    assert loose["a"] == 2 and loose.known() == "a"


def test_variant_decorators_keep_their_rules():
    with pytest.raises(ValueError, match="already registered"):
        register_variant("rope")(type("Dup", (), {}))
    with pytest.raises(ValueError, match="already registered as a variant"):
        register_modifier("rope")
    assert VARIANTS["rope"].variant_name == "rope"


def _variant_table(text: str, heading: str) -> dict[str, str]:
    """{variant or modifier: its last cell} of the first table after ``heading`` (``<any softmax variant>+NAME``
    and ``+NAME`` name a modifier)."""
    import re

    section = text.split(heading, 1)[1]
    rows = {}
    for line in section.splitlines():
        if rows and not line.startswith("|"):
            break  # the end of the first table
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        m = re.fullmatch(r"`(<any softmax variant>)?\+?([a-z0-9_]+)`", cells[0]) if cells else None
        if m:
            rows[m.group(2)] = cells[-1]
    return rows


def test_docs_variant_table_lists_every_option():
    # docs/variants.md's table must not drift from the registry `lctx list variants` prints: a row per variant (and
    # per modifier, `<any softmax variant>+NAME`), naming every key of its option schema; the README's short table
    # (no options) has a row per variant and modifier too
    from pathlib import Path

    from lctx.models import MODIFIERS, VARIANTS
    from lctx.models.options import option_schema

    repo = Path(__file__).resolve().parent.parent
    names = set(VARIANTS) | set(MODIFIERS)
    short = _variant_table((repo / "README.md").read_text(), "## Attention variants")
    assert set(short) == names, set(short) ^ names
    rows = _variant_table((repo / "docs" / "variants.md").read_text(), "## The variants")
    assert set(rows) == names, set(rows) ^ names
    for name, opts in rows.items():
        missing = [k for k in (option_schema(name) or {}) if f"`{k}`" not in opts]
        assert not missing, f"docs/variants.md's table lacks {name}'s options {missing} (see `lctx list variants`)"
    # control: a table without a row, or a row without one of its options, is caught
    text = (repo / "docs" / "variants.md").read_text()
    assert "s4d" not in _variant_table(text.replace("| `s4d` |", "| s4d |"), "## The variants")
    assert "`lsh_samples`" not in _variant_table(text.replace("`lsh_samples` (16), ", ""), "## The variants")["alibi_lsh"]
