"""lctx.errors: the one finite-logits check every task's logits go through, and list arguments with an empty
entry (split_list)."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_one_line_error, run_cli
from lctx.errors import NonFiniteLogitsError, check_finite_logits

#: every test here runs with no data dir from the environment and its own digest cache (conftest.py)
pytestmark = pytest.mark.usefixtures("isolated_digests")


def test_check_finite_logits_allows_masked_tokens():
    """Issue 10 item 7: -inf (a masked token) passes the finite-logits check; NaN, +inf and an all -inf row do not."""
    check_finite_logits(torch.tensor([[0.0, float("-inf"), 1.0]]))  # a masked token is fine
    for bad in ([[float("nan"), 0.0]], [[float("inf"), 0.0]], [[float("-inf"), float("-inf")]]):
        with pytest.raises(NonFiniteLogitsError):
            check_finite_logits(torch.tensor(bad))


@pytest.mark.parametrize("flag,value", [("--lengths", "256,,512"), ("--lengths", "256,"), ("--depths", "0,,1"),
                                        ("--tasks", "passkey,,ppl"), ("--relative", "1,,2")])
def test_empty_list_entries(tmp_path, capsys, flag, value):
    """Issue 10 item 15: an empty entry in a list argument is one line, before an --out is made."""
    code, _, err = run_cli(["run", flag, value, "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "empty entry")
    assert not (tmp_path / "o").exists()
