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


def test_random_depths_are_seeded_uniform_and_recorded_as_drawn():
    """Issue 30 item 5: ``--depths random:N`` draws N depths in [0, 1] (RULER draws a depth per prompt), the same
    for the same seed, others for another seed; rounded to 4 decimals, sorted. A control: 200 draws are spread
    over [0, 1] (each quarter holds 50 +- 3 sigma, sigma = sqrt(200 * 1/4 * 3/4) = 6.1; a draw stuck at one value
    or in half the range fails)."""
    from lctx.harness.args import parse_depths, random_depths

    d = parse_depths("random:8", seed=0)
    assert len(d) == 8 and d == sorted(d) and all(0.0 <= x <= 1.0 and round(x, 4) == x for x in d)
    assert d == parse_depths("random:8", seed=0) == random_depths(8, 0) and d != parse_depths("random:8", seed=1)
    many = random_depths(200, 3)
    quarters = [sum(q / 4 <= x < (q + 1) / 4 for x in many) for q in range(4)]
    assert len(many) >= 195 and all(abs(k - 50) <= 3 * 6.1 for k in quarters), quarters
    for bad in ("random", "random:0", "random:x", "random:1001", "random:-2"):
        with pytest.raises(LctxError, match=r"write random:N with N a whole number from 1 to 1000"):
            parse_depths(bad)


def test_random_depths_reach_the_run_and_run_json(make_checkpoint, tmp_path):
    import json

    import lctx

    res = lctx.evaluate([str(make_checkpoint("rope"))], "passkey", lengths=[160], depths="random:3", samples=1,
                        seed=5, key_digits=3, out=tmp_path / "r", memory_check=False, log=lambda m: None)
    from lctx.harness.args import random_depths

    drawn = random_depths(3, 5)
    assert sorted(set(res.table["depth"].dropna())) == drawn
    assert json.loads((tmp_path / "r" / "run.json").read_text())["depths"] == drawn
