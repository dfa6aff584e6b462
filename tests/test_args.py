"""lctx.harness.args: the parsing of --lengths and --batch-size."""

from __future__ import annotations

import pytest

from helpers import assert_one_line_error, run_cli
from lctx.harness.args import parse_lengths
from lctx.errors import LctxError


def test_bad_batch_size_is_a_one_line_error(tmp_path, capsys):
    """Issue 15 item 3: a --batch-size that is neither a positive integer nor auto is one line."""
    code, _, err = run_cli(["run", "--tasks", "passkey", "--out", tmp_path / "o", "--batch-size", "0"], capsys)
    assert_one_line_error(code, err, "--batch-size", "auto")


def test_parse_lengths_suffixes():
    """--lengths takes k/K and m suffixes."""
    assert parse_lengths("256, 512,1k,4K,1m") == [256, 512, 1024, 4096, 1024**2]


def test_parse_lengths_refuses_lengths_past_the_bound():
    """Issue 25 F5: a length past MAX_LENGTH is refused (it ran 60 s to 6.6 GB, then died in pyarrow)."""
    # issue 25, F5: 99999999999999999999 ran 60 s to 6.6 GB, then died in pyarrow (past int64)
    from lctx.harness.args import MAX_LENGTH

    assert parse_lengths("2048m") == [MAX_LENGTH]
    for text in ("2049m", str(MAX_LENGTH + 1), "256,99999999999999999999"):
        with pytest.raises(LctxError, match=f"is above {MAX_LENGTH} tokens"):
            parse_lengths(text)
