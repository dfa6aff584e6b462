"""Small helpers shared by the tests (importable: pytest puts tests/ on sys.path)."""

from __future__ import annotations


def tiny_config(variant: str, **kw):
    from lctx.models import LctxConfig

    args = dict(vocab_size=400, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, variant=variant,
                train_length=64)
    args.update(kw)
    return LctxConfig(**args)


def run_cli(args, capsys):
    """Run ``lctx`` in-process with ``args`` (converted to str); returns (exit code, stdout, stderr)."""
    from lctx.cli import main

    code = main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_one_line_error(code, err, *needles):
    """A user mistake: exit 2, exactly one stderr line starting with "error: ", no traceback, and each of
    ``needles`` in that line."""
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
