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


def test_every_exit_code_is_documented():
    """Each EXIT_* code of errors.py has its row in docs/troubleshooting.md#exit-codes (a new code without one, or a
    row for a code that is gone, fails here)."""
    import re
    from pathlib import Path

    import lctx.errors as E

    codes = {v for k, v in vars(E).items() if k.startswith("EXIT_") and k != "EXIT_INTERRUPTED"}
    doc = (Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md").read_text()
    table = doc.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.M)}
    assert codes == rows, (codes, rows)
    assert E.EXIT_SOME_FAILED == 4 and E.EXIT_ALL_FAILED == 3


def test_a_served_run_with_errors_never_exits_0(tmp_path, capsys):
    """Issue 42 item 7: a served run where one sample's reply is unusable exits 4 (EXIT_SOME_FAILED, the other sample
    scored) with one closing error line; every sample's reply unusable exits 3; none, 0. lctx run exited 0 unless every
    sample failed."""
    from stub_server import StubServer

    args = ["run", "--tasks", "passkey", "--lengths", 300, "--depths", 0.5, "--samples", 2, "--no-progress"]
    at_load = 3  # the completions a load sends: the token-id probe and the trust probe's two
    with StubServer() as s:
        s.fail("empty-choices", times=1, after=at_load)
        some = run_cli(args + ["--model", s.url, "--out", tmp_path / "some"], capsys)
        s.clear_faults()
        s.fail("empty-choices", times=None, after=at_load)
        every = run_cli(args + ["--model", s.url, "--out", tmp_path / "every"], capsys)
        s.clear_faults()
        none = run_cli(args + ["--model", s.url, "--out", tmp_path / "none"], capsys)
    assert some[0] == 4 and "error: 1 sample of this run failed" in some[2] and "exit status 4" in some[2], some[2]
    assert every[0] == 3 and "every sample of this run failed" in every[2], every[2]
    assert none[0] == 0, none[2]
