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
    assert len(many) == 200 and all(abs(k - 50) <= 3 * 6.1 for k in quarters), quarters
    for bad in ("random", "random:0", "random:x", "random:1001", "random:-2"):
        with pytest.raises(LctxError, match=r"write random:N with N a whole number from 1 to 1000"):
            parse_depths(bad)


def test_random_depths_are_n_distinct_ones_even_where_draws_round_alike():
    """Issue 42 item 9: ``random:N`` gives N distinct depths. 1000 draws rounded to 4 decimals repeat about
    1000^2 / (2 x 10001) = 50 times, which left ~950 before (the control: the first 1000 draws of the same generator
    hold repeats); the first draws are kept, repeats drawn again. N past the distinct depths the rounding has is
    refused."""
    import random

    from lctx.harness.args import DEPTH_VALUES, MAX_RANDOM_DEPTHS, random_depths

    first = [round(random.Random("depths|1000|0").random(), 4) for _ in range(1000)]
    assert len(set(first)) < 1000  # control: the plain draws repeat
    d = random_depths(1000, 0)
    assert len(d) == len(set(d)) == 1000 and set(first) <= set(d) and d == sorted(d)
    assert MAX_RANDOM_DEPTHS <= DEPTH_VALUES == 10_001
    assert random_depths(DEPTH_VALUES, 1) == [round(i / 10_000, 4) for i in range(DEPTH_VALUES)]  # every one drawn
    with pytest.raises(LctxError, match=r"holds 1 to 10001 distinct depths"):
        random_depths(DEPTH_VALUES + 1)


def test_random_depths_reach_the_run_and_run_json(make_checkpoint, tmp_path):
    """The drawn depths are the run's and run.json's; numpy numbers are taken as Python's (issue 42 item 9: a
    ``numpy.int64`` seed drew with seed 0, recorded 3, then failed writing run.json): seed, lengths and samples as
    numpy values give the run of the Python ones, the seed recorded as drawn."""
    import json

    import numpy as np

    import lctx

    res = lctx.evaluate([str(make_checkpoint("rope"))], "passkey", lengths=np.array([160]), depths="random:3",
                        samples=np.int64(1), seed=np.int64(5), key_digits=np.int64(3), out=tmp_path / "r",
                        memory_check=False, log=lambda m: None)
    from lctx.harness.args import random_depths

    drawn = random_depths(3, 5)
    assert drawn != random_depths(3, 0)  # control: the seed the draw fell back to before
    assert sorted(set(res.table["depth"].dropna())) == drawn
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["depths"] == drawn and run["invocations"][-1]["seed"] == 5 == res.table["seed"].iloc[0]


@pytest.mark.parametrize("kw, said", [
    (dict(seed=True), "seed=True is not a whole number"), (dict(seed=1.5), "seed=1.5 is not a whole number"),
    (dict(samples=True), "samples=True is not a whole number >= 1"),
    (dict(lengths=True), "length 'True' is not a positive integer"),
    (dict(depths=[True]), "depth 'True' is not a fraction")])
def test_bools_are_refused_where_lctx_evaluate_wants_numbers(kw, said, tmp_path):
    """A bool is not a number of lctx.evaluate's: one line each, nothing made."""
    import lctx

    with pytest.raises(LctxError, match=said):
        lctx.evaluate(None, "passkey", out=tmp_path / "o", log=lambda m: None, **kw)
    assert not (tmp_path / "o").exists()
