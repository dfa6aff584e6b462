"""One registry type (lctx.registry.Registry) behind tasks, derived names, variants, modifiers and
--attn-override names."""

from __future__ import annotations

import pytest
from lctx.harness.overrides import OVERRIDES
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
