"""Small helpers shared by the tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations


def tiny_config(variant: str, **kw):
    from lctx.models import LctxConfig

    args = dict(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, variant=variant,
                train_length=64)
    args.update(kw)
    return LctxConfig(**args)
