"""``lctx compare RUN_A RUN_B``: backend parity sample by sample (lctx.harness.outputs.parity). Two in-process runs
of one checkpoint with other prefill chunk sizes (the same network, another summation order) are "same"; a run of
other weights is caught on the teacher-forced log-probabilities and exits 1; the rules' [parity] table is checked.
The real cross-backend runs (vLLM, llama-server) are tests/test_server_vllm.py and
results/2026-12-05-served-parity/."""

from __future__ import annotations

import pytest

from helpers import run_cli
from lctx.errors import LctxError
from lctx.harness.outputs.parity import LOGPROB_TOL, ParityRules, compare_pair, parity, parity_rules

GRID = ["--tasks", "passkey", "--lengths", "192", "--depths", "0,1", "--samples", "1", "--no-progress"]


@pytest.fixture
def runs(make_checkpoint, tmp_path, capsys):
    """Three runs: A (chunk 2048), B (the same checkpoint, chunk 16: prefilled 16 tokens at a time), C (other
    weights)."""
    ck = make_checkpoint("rope")
    import torch

    from lctx.models import LctxForCausalLM

    m = LctxForCausalLM.from_pretrained(ck)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    m.save_pretrained(tmp_path / "ck_other")
    import shutil

    for f in ck.iterdir():
        if f.name.startswith("tok") or f.name == "special_tokens_map.json":
            shutil.copy(f, tmp_path / "ck_other" / f.name)
    for name, model, extra in (("a", ck, []), ("b", ck, ["--chunk-size", "16"]), ("c", tmp_path / "ck_other", [])):
        code, _, err = run_cli(["run", "--model", model, *GRID, *extra, "--out", tmp_path / name], capsys)
        assert code == 0, err[-2000:]
    return tmp_path


def test_same_network_is_same_other_weights_differ(runs, capsys):
    """A vs B (other chunk size): prompt ids, greedy text, scores equal and log-probabilities within the default
    tolerance (the tolerance: float32 summation-order differences, module LOGPROB_TOL); A vs C (weights moved by 2 %):
    the answer tokens' log-probabilities differ by more, the verdict names it and the command exits 1."""
    p = parity(runs / "a", runs / "b")
    assert len(p.table) == 2 and not p.failed and p.exit_code == 0
    assert (p.table["prompt_ids"] == "equal").all() and (p.table["greedy"] == "equal").all()
    assert p.table["max_logprob_diff"].max() <= LOGPROB_TOL
    code, out, err = run_cli(["compare", runs / "a", runs / "b", "--out", runs / "ab"], capsys)
    assert code == 0 and "same on 2 samples" in out + err
    assert (runs / "ab" / "parity.csv").is_file() and (runs / "ab" / "parity.md").is_file()
    q = parity(runs / "a", runs / "c")  # control: other weights
    assert q.failed.get("logprobs") and q.exit_code == 1 and q.table["max_logprob_diff"].min() > LOGPROB_TOL
    code, out, err = run_cli(["compare", runs / "a", runs / "c", "--out", runs / "ac"], capsys)
    assert code == 1 and "logprobs differs on" in out + err


def test_a_rules_file_gates_on_parity(runs, tmp_path, capsys):
    """[parity] require = ["prompt_ids", "greedy"] passes A vs C (same prompts, same greedy text), though their
    log-probabilities differ; a loose logprob_tol passes it too; bad [parity] entries are one line."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[parity]\nrequire = ["prompt_ids"]\n')
    code, out, err = run_cli(["compare", runs / "a", runs / "c", "--rules", rules, "--out", runs / "r1"], capsys)
    assert code == 0 and "(not required)" in out + err
    assert parity(runs / "a", runs / "c", ParityRules(logprob_tol=100.0)).failed.get("logprobs") is None
    for bad, msg in (({"logprob_tol": -1}, "not a number >= 0"), ({"require": ["ids"]}, "a list of"),
                     ({"tol": 1}, "unknown key")):
        with pytest.raises(LctxError, match=msg):
            parity_rules(bad)
    code, _, err = run_cli(["compare", runs / "a", runs / "c", "--baseline", runs / "b"], capsys)
    assert code == 2 and "not both" in err


def test_compare_pair_reads_each_check():
    """One pair by hand: other prompt digests, other greedy text, a metric only one side has, an lm-eval ``ll``
    list and ppl's nll."""
    a = {"prompt_sha256": "x", "metrics": {"exact": 1.0, "digit_acc": 1.0, "nll": 2.0},
         "extra": {"continuation": "42", "answer_logprobs": [-0.1, -0.2], "ll": [-1.0, -2.0]}}
    b = {"prompt_sha256": "y", "metrics": {"exact": 1.0, "nll": 2.0004}, "extra": {"continuation": "43",
         "answer_logprobs": [-0.1, -0.25], "ll": [-1.0, -2.0]}}
    row = compare_pair(a, b, ParityRules())
    assert row["prompt_ids"] == "differ" and row["greedy"] == "differ" and row["scores"] == "equal"
    assert row["only_a"] == "digit_acc" and row["logprobs"] == "differ"
    assert row["max_logprob_diff"] == pytest.approx(0.05)
