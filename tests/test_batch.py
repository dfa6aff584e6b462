"""lctx run --batch-size: left-padded batched prefill and greedy decode give each sample the numbers it gets
alone (issue 15 item 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import assert_one_line_error, run_cli, tiny_config
from lctx.models.adapters.hf import load_lm

BUNDLED = Path(__file__).resolve().parents[1] / "models" / "checkpoints" / "pydoc-tiny-rope"


@pytest.fixture(scope="module")
def fake_data(tmp_path_factory) -> Path:
    """A RULER-shaped data folder (as tests/test_niah.py): an essay of 150 sentences and word lists."""
    from helpers import write_niah_data

    return write_niah_data(tmp_path_factory.mktemp("ruler_data"))


def _tiny_lm(tmp_path, tokenizer, variant, **kw):
    from lctx.models import LctxForCausalLM

    torch.manual_seed(0)
    path = tmp_path / variant
    LctxForCausalLM(tiny_config(variant, vocab_size=len(tokenizer), **kw)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return load_lm(str(path), device="cpu", chunk_size=16)


def _check_rows_equal_alone(lm, prompts, budgets):
    """Batched prefill + greedy + a row's teacher-forced continuation against each prompt alone."""
    bp = lm.prefill_batch(prompts)
    conts = lm.greedy_batch(bp, budgets, stop_ids=set())
    for i, (p, n) in enumerate(zip(prompts, budgets)):
        alone, _ = lm.prefill(p)
        torch.testing.assert_close(bp.last_logits[i], alone.last_logits, atol=1e-4, rtol=1e-4)
        assert conts[i] == lm.greedy(alone, n, stop_ids=set())  # per-row budgets: rows stop on their own
        assert len(conts[i]) == n
        row, cont = bp.row(i), [7, 8, 9, 10]
        torch.testing.assert_close(lm.continuation_logits(row, cont), lm.continuation_logits(alone, cont),
                                   atol=1e-4, rtol=1e-4)
        # the row's cache holds the prompt only (decoded tokens of the batch are not in it), and greedy on it
        # continues as the prompt alone does
        assert lm.greedy(row, 3, stop_ids=set()) == lm.greedy(alone, 3, stop_ids=set())


@pytest.mark.parametrize("variant,kw", [("rope", {}), ("alibi", {"attn_impl": "fast"}), ("ggd_bam", {}),
                                        ("interdomain", {}), ("path", {})])
def test_padded_batch_rows_equal_alone(tmp_path, tokenizer, variant, kw):
    # prompts of 37, 30, 41 and 19 tokens, prefilled in chunks of 16: padding spans whole chunks and the
    # last chunk of every row is real; fixed-state layers (interdomain, path) carry their state per row
    lm = _tiny_lm(tmp_path, tokenizer, variant, **kw)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (37, 30, 41, 19)]
    _check_rows_equal_alone(lm, prompts, [5, 2, 6, 1])


def test_padded_batch_hf_model_gets_positions_from_the_mask(tmp_path):
    # a Hugging Face Llama (tiny GGUF) takes no positions from the mask itself: prefill_batch passes
    # position_ids counted from each row's first real token, as transformers' generate does
    from gguf_tiny import write_tiny_gguf

    f = write_tiny_gguf(tmp_path / "tiny.gguf")
    lm = load_lm(str(f), device="cpu", cache_dir=str(tmp_path / "cache"), chunk_size=16)
    assert not lm.is_lctx and lm.can_batch
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (33, 21, 40)]
    _check_rows_equal_alone(lm, prompts, [4, 6, 3])


def _metrics(out: Path) -> dict:
    recs = [json.loads(ln) for ln in (out / "records.jsonl").read_text().splitlines()]
    return {(r["task"], r["length"], r["depth"], r["sample"]): (r["metrics"], r["batch_size"], r["status"])
            for r in recs}


@pytest.mark.slow
def test_cli_batch_4_records_equal_batch_1(tmp_path, fake_data, capsys):
    # issue 15 item 3: a passkey + NIAH run at --batch-size 4 gives the records of --batch-size 1. The bundled
    # model; niah_single_2's essay haystack makes prompts of unequal lengths (padded batches). Discrete metrics
    # (exact, string_match_*, tf_top1, tf_mrr) must be equal; the log-probabilities agree to float32 rounding
    # of a padded forward (measured differences ~1e-6 nats)
    args = ["run", "--tasks", "passkey,niah_single_2", "--lengths", "200,300", "--depths", "0,0.5,1",
            "--samples", "2", "--data-dir", fake_data, "--no-progress", "--no-memory-check"]
    code, _, err = run_cli(args + ["--out", tmp_path / "b1"], capsys)
    assert code == 0, err
    code, _, err = run_cli(args + ["--out", tmp_path / "b4", "--batch-size", "4"], capsys)
    assert code == 0, err
    one, four = _metrics(tmp_path / "b1"), _metrics(tmp_path / "b4")
    assert one.keys() == four.keys() and len(one) == 2 * 2 * 3 * 2
    assert {v[1] for v in one.values()} == {1} and max(v[1] for v in four.values()) == 4
    assert all(v[2] == "ok" for v in list(one.values()) + list(four.values()))
    for k, (m1, _, _) in one.items():
        m4 = four[k][0]
        assert m1.keys() == m4.keys()
        for name, v in m1.items():
            if name in ("tf_logprob", "tf_gain"):
                assert m4[name] == pytest.approx(v, rel=1e-4, abs=1e-4), (k, name)
            else:
                assert m4[name] == v, (k, name)


def test_batches_group_one_length_of_a_batched_task():
    from lctx.harness.run.runner import batches
    from lctx.tasks import get_task
    from lctx.tasks.base import Cell

    class FakeLM:
        can_batch = True

    lm = FakeLM()
    pk, ppl = get_task("passkey")(), get_task("ppl")()
    work = [(lm, pk, Cell(L, d, s), {}) for L in (100, 200) for d in (0.0, 0.5) for s in (0, 1, 2)]
    work += [(lm, ppl, Cell(100, None, 0), {}), (lm, ppl, Cell(100, None, 1), {})]
    sizes = [[(it[2].length, it[1].name) for it in b] for b in batches(work, 4)]
    assert [len(b) for b in sizes] == [4, 2, 4, 2, 1, 1]  # 6 passkey cells per length; ppl does not batch
    assert all(len({x for x in b}) == 1 for b in sizes)  # one length, one task per batch
    assert [len(b) for b in batches(work, 1)] == [1] * len(work)
    with pytest.raises(Exception, match="batch size"):
        batches(work, 0)


def test_auto_batch_size_is_capped_and_fits_memory(monkeypatch):
    from lctx.harness.run import runner

    lm = load_lm(str(BUNDLED), device="cpu")
    assert runner.auto_batch_size(lm, 1024) == runner.AUTO_BATCH_CAP["cpu"]  # a tiny model fits 4 easily
    monkeypatch.setattr("lctx.models.adapters.memory.device_memory", lambda dev, override=None: (1, "test"))
    assert runner.auto_batch_size(lm, 1024) == 1  # nothing fits: one at a time


def test_failed_batch_runs_its_samples_alone(tmp_path, capsys, monkeypatch):
    # a batch whose prefill fails (here: out of memory) must not turn samples that run alone into errors
    from lctx.models.adapters.hf import HFAdapter

    def boom(self, ids):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(HFAdapter, "prefill_batch", boom)
    code, _, err = run_cli(["run", "--tasks", "passkey", "--lengths", "200", "--depths", "0,1", "--samples", "1",
                            "--out", tmp_path / "o", "--batch-size", "2", "--no-progress"], capsys)
    assert code == 0, err
    got = _metrics(tmp_path / "o")
    assert len(got) == 2 and all(v[2] == "ok" and v[1] == 1 for v in got.values())


def test_bad_batch_size_is_a_one_line_error(tmp_path, capsys):
    code, _, err = run_cli(["run", "--tasks", "passkey", "--out", tmp_path / "o", "--batch-size", "0"], capsys)
    assert_one_line_error(code, err, "--batch-size", "auto")


def test_auto_batch_size_is_told_once_per_model_and_length(monkeypatch):
    # `--batch-size auto` says the N it chose, once per (model, length), and only for tasks that batch
    from lctx.harness.run import runner
    from lctx.tasks import get_task
    from lctx.tasks.base import Cell

    class FakeLM:  # the protocol members batches() reads
        can_batch, name = True, "tiny"

        def settings(self):
            return {"device_type": "cpu", "device": "cpu"}

    chosen = {100: 3, 200: 2}
    monkeypatch.setattr(runner, "auto_batch_size", lambda lm, length: chosen[length])
    lm, pk, ppl = FakeLM(), get_task("passkey")(), get_task("ppl")()
    work = [(lm, pk, Cell(L, d, s), {}) for L in (100, 200) for d in (0.0, 0.5) for s in (0, 1, 2)]
    work += [(lm, ppl, Cell(300, None, 0), {})]
    lines: list[str] = []
    got = runner.batches(work, "auto", log=lines.append)
    assert [len(b) for b in got] == [3, 3, 2, 2, 2, 1]  # 6 cells per length in batches of 3 and 2; ppl alone
    assert len(lines) == 2 and "3 for tiny at 100 tokens" in lines[0] and "2 for tiny at 200 tokens" in lines[1]


def test_progress_counts_samples_not_batches():
    # a batch of 4 advances the sample count by 4, against the total in samples: [1-4/6], then [5/6], [6/6]
    import io

    from lctx.harness.run.console import SweepProgress

    with SweepProgress([1.0] * 6, file=io.StringIO()) as bar:
        seen = []
        for n in (4, 1, 1):
            bar.start("cell", n=n)
            seen.append(bar.bar.desc)
            bar.done(n)
    assert [s.split("]")[0].split("[")[1] for s in seen] == ["sample 1-4/6", "sample 5/6", "sample 6/6"]


def test_counts_in_messages_agree_with_their_number():
    from lctx.harness.run.console import count

    assert [count(0, "sample"), count(1, "sample"), count(2, "error"), count(1, "row")] == \
        ["0 samples", "1 sample", "2 errors", "1 row"]
