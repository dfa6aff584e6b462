"""MMLU and ARC through lm-eval (lctx.tasks.lmeval): local data layouts, generated configs, scoring."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing here may touch the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from helpers import assert_one_line_error, nan_checkpoint, run_cli
from lctx.errors import EXIT_ALL_FAILED, LctxError  # noqa: E402
from lctx.harness.steps import lmeval_run  # noqa: E402
from lctx.tasks import lmeval  # noqa: E402

# MMLU rows (question, A, B, C, D, answer letter): the right choice says RIGHT, so an oracle can find it.
# "None" and "4" stay strings: the CSV reader must not turn them into NaN or numbers.
MMLU_DEV = [[f"Dev question {i}?", "None", "4", "x RIGHT", "y", "C"] for i in range(5)]
MMLU_TEST = [["Which bone is in the ear?", "femur", "stapes RIGHT", "tibia", "ulna", "B"],
             ["How many chambers has the heart?", "2", "3", "4 RIGHT", "None of the above", "C"]]
# ARC-V1 records: letter labels, digit labels (answerKey "3": gold index 2), and three choices
ARC_TEST = [
    {"id": "q1", "question": {"stem": "What do plants need?", "choices": [
        {"text": "sand", "label": "A"}, {"text": "light RIGHT", "label": "B"}, {"text": "salt", "label": "C"},
        {"text": "oil", "label": "D"}]}, "answerKey": "B"},
    {"id": "q2", "question": {"stem": "Which is a metal?", "choices": [
        {"text": "wood", "label": "1"}, {"text": "glass", "label": "2"}, {"text": "iron RIGHT", "label": "3"},
        {"text": "paper", "label": "4"}]}, "answerKey": "3"},
    {"id": "q3", "question": {"stem": "What falls from clouds?", "choices": [
        {"text": "rain RIGHT", "label": "A"}, {"text": "rocks", "label": "B"}, {"text": "cars", "label": "C"}]},
     "answerKey": "A"},
]


@pytest.fixture
def tiny_data(tmp_path):
    """A data dir in the original layouts: mmlu/{dev,test}/anatomy_*.csv and arc/ARC-Easy-{Test,Dev}.jsonl."""
    root = tmp_path / "data"
    for split, rows in (("dev", MMLU_DEV), ("test", MMLU_TEST)):
        (root / "mmlu" / split).mkdir(parents=True)
        with open(root / "mmlu" / split / f"anatomy_{split}.csv", "w", newline="") as f:
            csv.writer(f).writerows(rows)
    (root / "arc").mkdir()
    lines = "".join(json.dumps(r) + "\n" for r in ARC_TEST)
    (root / "arc" / "ARC-Easy-Test.jsonl").write_text(lines)
    (root / "arc" / "ARC-Easy-Dev.jsonl").write_text(lines)
    return root


def _mmlu_prompt(rows_dev, row, k=5):
    """lm-eval's mmlu/default prompt, written out by hand from its YAML: description line, k dev shots
    ("question\\nA. ..\\nD. ..\\nAnswer: X", joined by a blank line), then the test question."""
    def body(r):
        return f"{r[0].strip()}\nA. {r[1]}\nB. {r[2]}\nC. {r[3]}\nD. {r[4]}\nAnswer:"

    shots = "".join(f"{body(r)} {r[5]}\n\n" for r in rows_dev[:k])
    return "The following are multiple choice questions (with answers) about anatomy.\n\n" + shots + body(row)


def _oracle(prefer_right: bool):
    """An lm-eval LM that scores the choice containing RIGHT 0 and the others -5 (or the reverse)."""
    from lm_eval.api.model import LM

    class Oracle(LM):
        def __init__(self):
            super().__init__()
            self.contexts = []

        def loglikelihood(self, requests, disable_tqdm=False):
            out = []
            for req in requests:
                ctx, cont = req.args
                self.contexts.append(ctx)
                if cont.strip() in ("A", "B", "C", "D"):  # MMLU: find the letter's line in the last question
                    line = [l for l in ctx.splitlines()[-5:-1] if l.startswith(cont.strip() + ".")][0]
                    right = "RIGHT" in line
                else:  # ARC: the continuation is the choice text
                    right = "RIGHT" in cont
                out.append((0.0 if right == prefer_right else -5.0, False))
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return Oracle()


def test_readers_keep_strings_and_map_digit_labels(tiny_data):
    rows = lmeval.read_mmlu_csv(tiny_data / "mmlu" / "dev" / "anatomy_dev.csv", "anatomy")
    assert rows[0]["choices"][:2] == ["None", "4"] and rows[0]["answer"] == 2  # "C" -> 2
    arc = lmeval.read_arc(tiny_data / "arc" / "ARC-Easy-Test.jsonl")
    assert arc[1]["choices"]["label"] == ["1", "2", "3", "4"] and arc[1]["answerKey"] == "3"
    bad = tiny_data / "bad.jsonl"
    rec = dict(ARC_TEST[1], answerKey="C")  # a letter key on digit labels: unscorable
    bad.write_text(json.dumps(rec) + "\n")
    with pytest.raises(LctxError, match="answerKey 'C' is not exactly one of the labels"):
        lmeval.read_arc(bad)


def test_missing_data_is_one_line_error(tmp_path):
    (tmp_path / "arc").mkdir()
    for names, what in ((["mmlu"], "mmlu"), (["arc_challenge"], "arc")):
        with pytest.raises(LctxError) as e:
            lmeval.resolve_tasks(names, tmp_path)
        msg = str(e.value)
        assert "\n" not in msg and what in msg and "--data-dir" in msg
    with pytest.raises(LctxError, match="unknown lm-eval task"):
        lmeval.resolve_tasks(["mmlu_not_a_subject"], tmp_path)


def test_cli_missing_data_dir_exits_2(tmp_path, capsys):
    from lctx.cli import main

    code = main(["run", "--tasks", "arc_easy,mmlu", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1 and "ARC-Easy-Test.jsonl" in err


def test_subject_expansion():
    subjects = lmeval.mmlu_subjects()
    assert len(subjects) == 57 and subjects["anatomy"] == "stem"  # lm-eval's mmlu/default: 57 subject YAMLs
    specs, source = lmeval.resolve_tasks(["mmlu_humanities", "mmlu_formal_logic"], None)
    assert source == "hub" and all(s.lmeval_name == f"mmlu_{s.subject}" for s in specs)
    assert len(specs) == sum(c == "humanities" for c in subjects.values())  # formal_logic is humanities: no repeat


def _mmlu_records(subjects, fingerprint="f"):
    """Two MMLU question records per subject (acc 0 then 1) and one ARC record, as the runner writes them."""
    recs = [{"model": "m", "task": "mmlu", "task_options": {"subject": s, "num_fewshot": 5}, "sample": i,
             "status": "ok", "metrics": {"acc": float(i)}, "fingerprint": f"{fingerprint}-{s}"}
            for s in subjects for i in range(2)]
    return recs + [{"model": "m", "task": "arc_easy", "task_options": {"num_fewshot": 0}, "sample": 0,
                    "status": "ok", "metrics": {"acc": 1.0, "acc_norm": 0.0}, "fingerprint": "arc"}]


def test_summary_names_mmlu_by_the_subjects_it_ran():
    """Issue 24.6: `--tasks mmlu_astronomy` was summarised (summary.csv, the printed table) as `mmlu`, the name of all
    57 subjects. The summary's task now names what its cell pooled; the records (and so resume) keep task mmlu."""
    from lctx.harness.run.tables import summarize, to_table

    subjects = lmeval.mmlu_subjects()
    stem = [s for s, c in subjects.items() if c == "stem"]
    for subs, want in ((["astronomy"], "mmlu_astronomy"), (stem, "mmlu_stem"), (list(subjects), "mmlu"),
                       (["astronomy", "anatomy"], "mmlu (2 subjects)")):
        recs = _mmlu_records(subs)
        table = to_table(recs)
        summ = summarize(table)
        assert set(summ["task"]) == {want, "arc_easy"}, subs
        row = summ[summ["task"] == want].iloc[0]
        assert row["n"] == 2 * len(subs) and row["mean"] == pytest.approx(0.5)  # still one pooled cell
        assert set(table["task"]) == {"mmlu", "arc_easy"} and all(r["task"] == "mmlu" for r in recs[:-1])
    printed = lmeval_run.format_summary(summarize(to_table(_mmlu_records(["astronomy"]))))
    assert "| mmlu_astronomy " in printed and "| mmlu " not in printed and "arc_easy" in printed
    assert lmeval.pooled_label("arc_easy", []) == "arc_easy" and lmeval.pooled_label("mmlu", []) == "mmlu"


@pytest.mark.slow
def test_generated_configs_load_offline_and_oracle_scores(tiny_data, tmp_path):
    """Configs load in lm-eval offline; the prompt is lm-eval's MMLU format; an oracle gets acc 1 and an
    anti-oracle acc 0, so gold indices (digit ARC labels included) follow the label positions."""
    import lm_eval

    specs, source = lmeval.resolve_tasks(["mmlu_anatomy", "arc_easy"], tiny_data)
    tm, tasks = lmeval.load_tasks(specs, source, tiny_data, tmp_path / "cfg")
    assert set(tasks) == {"lctx_mmlu_anatomy", "lctx_arc_easy"}
    assert len(tasks["lctx_arc_easy"].eval_docs) == 3 and len(tasks["lctx_mmlu_anatomy"].eval_docs) == 2
    for prefer, want in ((True, 1.0), (False, 0.0)):
        oracle = _oracle(prefer)
        res = lm_eval.simple_evaluate(model=oracle, tasks=list(tasks.values()), num_fewshot=None,
                                      task_manager=tm, bootstrap_iters=0, log_samples=True)
        r = res["results"]
        assert r["lctx_arc_easy"]["acc,none"] == want and r["lctx_arc_easy"]["acc_norm,none"] == want
        assert r["lctx_mmlu_anatomy"]["acc,none"] == want
    # lm-eval's mmlu default has no num_fewshot; lctx sets 5 (as run_lmeval does): check the prompt by hand
    assert oracle.contexts[0] == _mmlu_prompt(MMLU_DEV, MMLU_TEST[0], k=0)
    oracle = _oracle(True)
    tasks["lctx_mmlu_anatomy"].set_config(key="num_fewshot", value=5)
    lm_eval.simple_evaluate(model=oracle, tasks=[tasks["lctx_mmlu_anatomy"]], task_manager=tm,
                            bootstrap_iters=0, samples={"lctx_mmlu_anatomy": [0]})
    assert oracle.contexts[0] == _mmlu_prompt(MMLU_DEV, MMLU_TEST[0])


@pytest.mark.slow
def test_run_lmeval_matches_independent_scoring_and_resumes(tiny_data, tmp_path, make_checkpoint, capfd):
    """acc of a random tiny lctx model equals an independent computation: the summed log-probability of
    each choice's tokens after the BOS-prefixed prompt (lctx's own HFAdapter.token_nll), argmax vs gold."""
    import pandas as pd
    from lm_eval.api.registry import get_model

    from lctx.models.adapters.hf import load_lm

    ck = make_checkpoint("rope")
    lm = load_lm(str(ck), device="cpu")
    lmeval.lctx_hflm_class()  # registers "lctx" with lm-eval: a checkpoint dir loads through the hf backend
    hflm = get_model("lctx").create_from_arg_obj({"pretrained": str(ck), "device": "cpu"})
    assert hflm.tok_encode("Answer:")[0] == lm.bos_id and hflm.tok_encode("Answer:")[1:] == lm.encode("Answer:")
    specs, source = lmeval.resolve_tasks(["arc_easy", "mmlu_anatomy"], tiny_data)
    out = tmp_path / "run"
    res = lmeval_run.run_lmeval([lm], specs, source, out, data_dir=tiny_data, limit=None, progress=False,
                            log=lambda *_: None)
    assert res["ran"] == 5 and res["errors"] == 0
    drawn = capfd.readouterr()
    # progress=False (`--no-progress`) silences lm-eval's own tqdm bars too (they drew on stderr before)
    assert "Running loglikelihood requests" not in drawn.err and "Checking cached requests" not in drawn.err

    def choice_ll(ctx, cont):
        ids = lm.with_bos(lm.encode(ctx + cont))
        n_ctx = len(lm.with_bos(lm.encode(ctx)))
        nll, _ = lm.token_nll(ids, list(range(n_ctx, len(ids))))
        return -float(nll.sum())

    expect = {}
    for i, r in enumerate(ARC_TEST):
        ctx = f"Question: {r['question']['stem']}\nAnswer:"  # lm-eval's arc_easy.yaml doc_to_text
        texts = [c["text"] for c in r["question"]["choices"]]
        labels = [c["label"] for c in r["question"]["choices"]]
        lls = [choice_ll(ctx, " " + t) for t in texts]
        norm = [ll / len(t) for ll, t in zip(lls, texts)]  # lm-eval's acc_norm: per character of the choice
        expect[("arc_easy", i)] = (labels[lls.index(max(lls))], labels[norm.index(max(norm))], r["answerKey"])
    for i, row in enumerate(MMLU_TEST):
        lls = [choice_ll(_mmlu_prompt(MMLU_DEV, row), " " + x) for x in "ABCD"]
        expect[("mmlu", i)] = ("ABCD"[lls.index(max(lls))], None, row[5])

    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 5
    for rec in recs:
        pred, pred_norm, gold = expect[(rec["task"], rec["sample"])]
        assert rec["extra"]["pred"] == pred and rec["extra"]["gold"] == gold
        assert rec["metrics"]["acc"] == float(pred == gold)
        if pred_norm is not None:
            assert rec["extra"]["pred_norm"] == pred_norm and rec["metrics"]["acc_norm"] == float(pred_norm == gold)
        assert rec["length"] is None and rec["n_tokens"] > 0 and rec["status"] == "ok"

    summ = pd.read_csv(out / "summary.csv")
    arc = summ[(summ["task"] == "arc_easy") & (summ["metric"] == "acc")].iloc[0]
    accs = [float(expect[("arc_easy", i)][0] == expect[("arc_easy", i)][2]) for i in range(3)]
    assert arc["n"] == 3 and arc["mean"] == pytest.approx(sum(accs) / 3)
    assert pd.isna(arc["length"]) and list(pd.read_parquet(out / "results.parquet").columns) == \
        __import__("lctx.harness.run.tables", fromlist=["COLUMNS"]).COLUMNS
    subj = pd.read_csv(out / "mmlu_subjects.csv")
    assert subj.iloc[0]["subject"] == "anatomy" and subj.iloc[0]["n"] == 2
    assert summ[summ["task"].str.startswith("mmlu")]["task"].tolist() == ["mmlu_anatomy"]  # as run (issue 24.6)

    again = lmeval_run.run_lmeval([lm], specs, source, out, data_dir=tiny_data, progress=False, log=lambda *_: None)
    assert again["ran"] == 0 and again["skipped"] == 5  # resumed: every question already recorded

    # issue 10 item 3: new contents of a local data file (same size, same mtime) rerun that task only
    arc_file = tiny_data / "arc" / "ARC-Easy-Test.jsonl"
    st = arc_file.stat()
    arc_file.write_text(arc_file.read_text().replace("clouds", "CLOUDS"))
    os.utime(arc_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert arc_file.stat().st_size == st.st_size
    third = lmeval_run.run_lmeval([lm], specs, source, out, data_dir=tiny_data, progress=False, log=lambda *_: None)
    assert third["ran"] == 3 and third["skipped"] == 2  # arc_easy's 3 questions rerun, mmlu's 2 resume
    t = pd.read_parquet(out / "results.parquet")
    assert t[t["task"] == "arc_easy"]["data_fingerprint"].nunique() == 1 and (t["status"] == "ok").all()
    assert not t.duplicated(["task", "metric", "sample"]).any()  # the old arc records left the tables


def test_batch_size_reaches_lm_eval(tiny_data, tmp_path, monkeypatch):
    """--batch-size N sets lm-eval's requests per forward too (README said MMLU/ARC ran one at a time, while they
    always went in lm-eval batches of 32: 19 GB of logits for SmolLM2's 5-shot MMLU); without it, 32."""
    import lctx
    from lctx.errors import LctxError

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["batch_size"])
        raise LctxError("stop here")  # before any model loads

    monkeypatch.setattr(lmeval, "build_tasks", spy)
    for bs in (None, 4, "auto", "2"):
        with pytest.raises(LctxError, match="stop here"):
            lctx.evaluate(tasks="arc_easy", data_dir=tiny_data, batch_size=bs, out=tmp_path / "o", log=lambda *_: None)
    assert seen == [32, 4, 32, 2]


# hand (issue 25 item 3): one lm-eval row of 2,000 tokens on the bundled model (172,352 float32 parameters =
# 689,408 B, vocab 1,024): forward working set KV 2,000 x 1,024 + growth 1,024,000 + positions 34,000 + activations
# 2,000 x (704 x 4 + 512) + the mask-free attention 4 heads x 2,000 x 328 = 12,386,000 B, plus logits 2,000 x 1,024
# x 4 = 8,192,000 (the log-softmax fits in the freed working set): 20,578,000 B a row (as tests/test_memory.py's ROW)
ROW, WEIGHTS = 20_578_000, 172_352 * 4


@pytest.fixture
def small_machine(monkeypatch):
    """A run whose arc_easy requests are 2,000 tokens long (300 rows) on a CPU with room for 4 rows beside the
    loaded weights (MemAvailable 4 x ROW + 1: on CPU the weights are already out of it), stopped before its
    sweep; returns the lm-eval batch each sweep would have run at."""
    from lctx.models.adapters import memory as plan
    from lctx.harness.run import runner

    monkeypatch.setattr(lmeval.LmEvalSuite, "request_lengths", lambda self, lm: {"arc_easy": (2000, 300)})
    monkeypatch.setattr(plan, "device_memory", lambda dev, override=None: (4 * ROW + 1, "test MemAvailable"))
    seen = []

    def stop(lms, objs, spec, out, **kw):
        seen.append(objs[-1].suite.batch_size)
        raise LctxError("stop here")

    monkeypatch.setattr(runner, "run_sweep", stop)
    return seen


def test_default_lmeval_batch_is_lowered_to_fit_and_printed(tiny_data, tmp_path, small_machine):
    """F4: the default MMLU/ARC batch (32) is the largest that fits the device, chosen from the plan and said."""
    import lctx

    lines = []
    with pytest.raises(LctxError, match="stop here"):
        lctx.evaluate(tasks="arc_easy", data_dir=tiny_data, out=tmp_path / "o", log=lines.append, warn=lines.append)
    assert small_machine == [4]
    note = [ln for ln in lines if "lm-eval batch" in ln]
    assert len(note) == 1 and note[0].startswith("note: arc_easy: lm-eval batch lowered from 32 to 4 for ")
    # hand: 2,000 tokens x 1,024 vocab x 4 B x 2 copies = 16,384,000 B = 0.02 GiB per request
    assert "longest request 2,000 tokens (arc_easy) x vocab 1,024 x 4 B x 2 copies = 0.02 GiB per request" in note[0]


def test_explicit_lmeval_batch_that_does_not_fit_is_refused(tiny_data, tmp_path, small_machine, capsys):
    """F4: `--batch-size 32` that does not fit is one line naming the fix; --no-memory-check runs it as asked."""
    from helpers import run_cli

    args = ["run", "--tasks", "arc_easy", "--data-dir", str(tiny_data), "--batch-size", "32", "--no-progress",
            "--out", str(tmp_path / "r")]
    code, _, err = run_cli(args, capsys)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[-1].startswith("error: --batch-size 32: arc_easy's lm-eval batch"), err
    assert lines[-1].endswith("pass --batch-size 4 or less, or --no-memory-check") and small_machine == []
    code, _, err = run_cli(args + ["--no-memory-check"], capsys)
    assert code == 2 and "stop here" in err and small_machine == [32]


def test_context_tokens_encode_the_shared_few_shot_part_once():
    """The few-shot examples all contexts of a task share are encoded once: prefix + own part + 1 (the cut)."""
    calls = []

    def encode(s, add_special_tokens=None):  # a word tokenizer with a BOS, as lctx models' wrapper adds one
        calls.append(s)
        return ([] if add_special_tokens is False else ["<s>"]) + s.split()

    shots = "".join(f"Example question {i}?\nAnswer: yes\n\n" for i in range(12))  # 398 characters
    ctxs = [shots + "Which one?\nAnswer:", shots + "Which other one is it?\nAnswer:"]
    got = lmeval.context_tokens(ctxs + [""], encode)
    # hand: BOS + 12 x 5 words = 61 for the shots, + 3 / + 6 words of its own, + 1 for the cut; "" counts 1
    assert got == {ctxs[0]: 61 + 3 + 1, ctxs[1]: 61 + 6 + 1, "": 1}
    assert calls == [shots, "Which one?\nAnswer:", "Which other one is it?\nAnswer:"]
    short = ["Q: a\nA:", "Q: b c\nA:"]  # nothing long shared: each encoded whole, exactly
    assert lmeval.context_tokens(short, encode) == {short[0]: 4, short[1]: 5}


@pytest.mark.slow
def test_request_lengths_are_lm_evals_rows(tiny_data, tmp_path, make_checkpoint, monkeypatch):
    """The memory check's longest request and row count are those of lm-eval's own forwards (its input rows:
    BOS + prompt + choice less the last token, ``inp[:-1]``), counted from the requests lm-eval builds."""
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    got = lmeval.build_tasks(["mmlu_anatomy", "arc_easy"], tiny_data)[0].suite.request_lengths(lm)
    # hand: each request's tokens as lm-eval encodes it (lctx models: BOS first), less the one it drops
    mmlu = max(len(lm.with_bos(lm.encode(_mmlu_prompt(MMLU_DEV, r) + " " + x))) - 1 for r in MMLU_TEST for x in "ABCD")
    arc = max(len(lm.with_bos(lm.encode(f"Question: {r['question']['stem']}\nAnswer: {c['text']}"))) - 1
              for r in ARC_TEST for c in r["question"]["choices"])
    assert mmlu <= got["mmlu/anatomy"][0] <= mmlu + 2 and arc <= got["arc_easy"][0] <= arc + 2  # seams: context_tokens
    # the third number: the longest continuation's tokens, where LctxHFLM computes logits (MMLU's " A".." D")
    arc_cont = max(len(lm.encode(" " + c["text"])) for r in ARC_TEST for c in r["question"]["choices"])
    assert got["mmlu/anatomy"][2] == max(len(lm.encode(" " + x)) for x in "ABCD") and got["arc_easy"][2] == arc_cont
    cls = lmeval.lctx_hflm_class()
    shapes, original = [], cls._model_call

    def counting(self, inps, attn_mask=None, labels=None):
        shapes.append(tuple(inps.shape))  # rows x padded tokens of one lm-eval forward
        return original(self, inps, attn_mask=attn_mask, labels=labels)

    monkeypatch.setattr(cls, "_model_call", counting)
    for name, label in (("mmlu_anatomy", "mmlu/anatomy"), ("arc_easy", "arc_easy")):
        shapes[:] = []
        specs, source = lmeval.resolve_tasks([name], tiny_data)
        lmeval_run.run_lmeval([lm], specs, source, tmp_path / name, data_dir=tiny_data, batch_size=64,
                              progress=False, log=lambda *_: None, tables=False)
        assert got[label][1] == sum(r for r, _ in shapes)  # every row lm-eval ran (one forward at batch 64)
        assert max(t for _, t in shapes) <= got[label][0] <= max(t for _, t in shapes) + 2


def test_quiet_progress_disables_tqdm_and_restores_it():
    """--no-progress: bars made inside quiet_progress draw nothing (tqdm and tqdm.auto); after it they draw."""
    import io

    from tqdm import tqdm
    from tqdm.auto import tqdm as auto_tqdm

    buf = io.StringIO()
    with lmeval.quiet_progress(True):
        list(tqdm(range(3), file=buf, desc="a"))
        list(auto_tqdm(range(3), file=buf, desc="b"))
    assert buf.getvalue() == ""
    with lmeval.quiet_progress(False):
        list(tqdm(range(3), file=buf, desc="c"))
    list(tqdm(range(3), file=buf, desc="d"))
    assert "c: 100%" in buf.getvalue() and "d: 100%" in buf.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("task", ["arc_easy", "arc_challenge"])
def test_real_arc_digit_labels_scored_by_position(data_dir, tmp_path, task):
    """Every real ARC test record: its answerKey is among its labels, and lm-eval's gold index (through the
    generated config) is the answerKey's position, with the choice text there the keyed text."""
    specs, source = lmeval.resolve_tasks([task], data_dir)
    _, tasks = lmeval.load_tasks(specs, source, data_dir, tmp_path / "cfg")
    t = tasks[f"lctx_{task}"]
    raw = [json.loads(l) for l in open(data_dir / "arc" / lmeval.ARC_FILES[task][0])]
    docs = list(t.eval_docs)
    assert len(docs) == len(raw)
    n_digit = 0
    for doc, r in zip(docs, raw):
        labels = [c["label"] for c in r["question"]["choices"]]
        assert r["answerKey"] in labels
        gold = t.doc_to_target(doc)
        assert gold == labels.index(r["answerKey"])
        assert t.doc_to_choice(doc)[gold] == r["question"]["choices"][gold]["text"]
        n_digit += labels[0].isdigit()
    assert n_digit > 0  # the real test split has digit-labelled records (97 Easy, 22 Challenge)


def test_hub_task_names_exist_in_lm_eval():
    """Without a data dir lctx runs lm-eval's built-in tasks; their names must exist in this lm-eval. Loading
    them offline (no cached copy) is a one-line error that says to pass --data-dir."""
    import datasets

    specs, source = lmeval.resolve_tasks(["arc_easy", "arc_challenge", "mmlu"], None)
    index = set(lmeval._task_manager(source, None).all_subtasks)
    assert source == "hub" and len(specs) == 59 and all(s.lmeval_name in index for s in specs)
    if not datasets.config.HF_HUB_OFFLINE:
        pytest.skip("datasets was imported before this module set HF_HUB_OFFLINE; not probing the hub")
    try:
        lmeval.load_tasks(specs[:1], source, None, None)
    except LctxError as e:  # the usual case on an offline machine without a cached copy
        assert "\n" not in str(e) and "--data-dir" in str(e)


@pytest.mark.slow
def test_lmeval_tasks_run_through_the_one_runner(tiny_data, tmp_path, make_checkpoint):
    """Issue 13.2: arc/mmlu are Tasks the runner drives: in one `lctx.evaluate` with passkey their records carry
    the same fields (one record builder), their resume key is the runner's, and run.json names every task."""
    import lctx
    from lctx.models.adapters.hf import load_lm
    from lctx.harness.run.runner import sample_base

    ck = make_checkpoint("rope")
    out = tmp_path / "run"
    res = lctx.evaluate(str(ck), "passkey,arc_easy,mmlu_anatomy", lengths=[256], depths=[0.5], samples=1, out=out,
                        data_dir=tiny_data, limit=2, log=lambda *_: None)
    assert res.errors == 0 and res.ran == 1 + 2 + 2
    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    by_task = {}
    for r in recs:
        by_task.setdefault(r["task"], []).append(r)
    assert set(by_task) == {"passkey", "arc_easy", "mmlu"}
    assert set(by_task["arc_easy"][0]) == set(by_task["passkey"][0]) == set(by_task["mmlu"][0])
    arc = by_task["arc_easy"][0]
    assert arc["length"] is None and arc["batch_size"] is None and arc["run_id"] == by_task["passkey"][0]["run_id"]
    assert {"pred", "gold", "ll", "lmeval_task"} <= set(arc["extra"]) and len(arc["extra"]["ll"]) == 4
    # the fingerprint is sample_base's with the chunk size left out (lm-eval does not prefill through the adapter)
    lm = load_lm(str(ck), device="cpu")
    import lm_eval

    want = sample_base(lm, "arc_easy", {"lm_eval": lm_eval.__version__}, arc["task_options"],
                       arc["data_fingerprint"], 0, chunked=False)
    assert arc["fingerprint"] == want["fingerprint"] and arc["chunk_size"] is None
    meta = json.loads((out / "run.json").read_text())
    assert meta["tasks"] == ["passkey", "arc_easy", "mmlu"] and meta["lmeval"]["limit"] == 2
    assert meta["lengths"] == [256]
    again = lctx.evaluate(str(ck), "passkey,arc_easy,mmlu_anatomy", lengths=[256], depths=[0.5], samples=1, out=out,
                          data_dir=tiny_data, limit=2, log=lambda *_: None)
    assert again.ran == 0 and again.skipped == 5


@pytest.mark.slow
def test_stopped_lmeval_call_resumes_from_request_cache(tiny_data, tmp_path, make_checkpoint, monkeypatch):
    """A run stopped inside lm-eval's call (here: Ctrl-C at its second batch of requests) keeps the finished
    batches in the run directory's request cache (partial/<fingerprint>/, lm-eval's CachingLM); the rerun asks
    the model only for the rest, and its records equal those of an uninterrupted run. Another checkpoint in the
    same run directory gets its own cache folder (its records' fingerprint): no answer is reused across models."""
    from lctx.models.adapters.hf import load_lm

    cls = lmeval.lctx_hflm_class()
    rows, stop_at = [], [2]  # rows given to the model per forward; the forward number that raises (None: never)
    original = cls._model_call

    def counting(self, inps, attn_mask=None, labels=None):
        rows.append(int(inps.shape[0]))
        if stop_at[0] is not None and len(rows) == stop_at[0]:
            raise KeyboardInterrupt
        return original(self, inps, attn_mask=attn_mask, labels=labels)

    monkeypatch.setattr(cls, "_model_call", counting)
    specs, source = lmeval.resolve_tasks(["arc_easy"], tiny_data)
    n_requests = sum(len(r["question"]["choices"]) for r in ARC_TEST)  # one loglikelihood request per choice: 11
    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    quiet = {"data_dir": tiny_data, "batch_size": 4, "progress": False, "log": lambda *_: None}

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        lmeval_run.run_lmeval([lm], specs, source, out, **quiet)
    assert rows == [4, 4]  # the model's first batch answered, the second stopped
    recorded = (out / "records.jsonl").read_text() if (out / "records.jsonl").exists() else ""
    assert recorded == ""  # no record: the call never returned
    (fp_dir,) = (out / "partial").iterdir()
    stop_at[0], rows[:] = None, []
    res = lmeval_run.run_lmeval([lm], specs, source, out, **quiet)
    assert res["ran"] == 3 and res["errors"] == 0
    assert sum(rows) == n_requests - 4  # the first batch's 4 answers came from the cache, the rest from the model
    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert {r["fingerprint"] for r in recs} == {fp_dir.name}  # the cache folder is the records' fingerprint

    rows[:] = []
    fresh = tmp_path / "fresh"
    lmeval_run.run_lmeval([lm], specs, source, fresh, **quiet)
    assert sum(rows) == n_requests
    again = {r["sample"]: r["extra"]["ll"] for r in map(json.loads, (fresh / "records.jsonl").read_text().splitlines())}
    assert {r["sample"]: r["extra"]["ll"] for r in recs} == again  # cached answers = computed ones

    other = load_lm(str(make_checkpoint("rope", name="ck_other", num_hidden_layers=3)), device="cpu")
    rows[:] = []
    lmeval_run.run_lmeval([other], specs, source, out, **quiet)
    assert sum(rows) == n_requests  # another checkpoint: every request asked of the model again
    assert len(list((out / "partial").iterdir())) == 2


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_digests")
def test_compare_a_real_arc_run_and_lmeval_nan_model(data_dir, make_checkpoint, tmp_path, capsys):
    """Issue 10 items 12 and 7: a real arc_easy run compares with itself; a NaN model fails every lm-eval question."""
    # the command: lctx run --tasks arc_easy --limit 3 --data-dir DATA --out arc; lctx compare arc --baseline arc
    arc = tmp_path / "arc"
    common = ["--tasks", "arc_easy", "--limit", "3", "--data-dir", data_dir, "--no-progress"]
    code, _, err = run_cli(["run", "-m", make_checkpoint("rope"), *common, "--out", arc], capsys)
    assert code == 0, err
    code, out, err = run_cli(["compare", arc, "--baseline", arc], capsys)
    assert code == 0 and "PASS" in out, err
    # lm-eval's model calls go through the same finite-logits check: a NaN model fails every question
    code, _, err = run_cli(["run", "-m", nan_checkpoint(make_checkpoint, "layer0"), *common, "--out",
                            tmp_path / "nan"], capsys)
    assert code == EXIT_ALL_FAILED, err
    t = pd.read_csv(tmp_path / "nan" / "results.csv")
    assert (t["status"] == "error").all() and t["error"].str.contains("NonFiniteLogitsError|logits").all()


@pytest.mark.usefixtures("plain_console")
def test_lm_eval_git_probe_is_silent_outside_a_repository(tmp_path, monkeypatch, capfd):
    """Issue 16 item 5: lm-eval's git probe prints nothing outside a repository."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import get_git_commit_hash

    from lctx.tasks.lmeval import quiet_git_probe

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # never find a repository above
    get_git_commit_hash()
    assert "not a git repository" in capfd.readouterr().err  # what lm-eval prints on every run
    original = evaluator.get_git_commit_hash
    with quiet_git_probe():
        assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    assert evaluator.get_git_commit_hash is original


def _no_network(monkeypatch, tmp_path):
    import socket

    def refuse(*a, **k):
        raise OSError("[Errno -2] Name or service not known")  # what this sandbox answers

    monkeypatch.setattr(socket, "create_connection", refuse)
    for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.mark.usefixtures("isolated_digests")
def test_offline_hub_task_fails_at_once_with_one_line(capsys, monkeypatch, tmp_path):
    """Trial 21 item 3: an lm-eval task offline without --data-dir fails at once in one line, with no hub retries."""
    _no_network(monkeypatch, tmp_path)
    code, _, err = run_cli(["run", "--tasks", "arc_easy", "--limit", "1", "--out", tmp_path / "o"], capsys)
    assert_one_line_error(code, err, "allenai/ai2_arc", "--data-dir")
    assert "Retrying" not in err and not (tmp_path / "o").exists()


@pytest.mark.usefixtures("isolated_digests")
def test_offline_hub_task_cached_switches_to_offline_mode(monkeypatch, tmp_path):
    """Trial 21 item 3: offline with the dataset cached, the hub libraries are switched to offline mode."""
    import huggingface_hub.constants as hc

    from lctx.tasks import lmeval

    _no_network(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored after the test (check_hub sets it)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", hc.HF_HUB_OFFLINE)
    (tmp_path / "hf" / "hub" / "datasets--allenai--ai2_arc").mkdir(parents=True)  # a cached copy
    lmeval.check_hub(lmeval.resolve_tasks(["arc_easy"], None)[0])  # no error: the cache can serve it
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1" and hc.HF_HUB_OFFLINE is True
    with pytest.raises(Exception, match="mmlu"):  # MMLU is not cached: refused
        lmeval.check_hub(lmeval.resolve_tasks(["mmlu_anatomy"], None)[0])


@pytest.mark.usefixtures("isolated_digests")
def test_offline_hub_cache_found_where_the_libraries_look(monkeypatch, tmp_path):
    """Trial 21 item 3: the hub cache is found where the libraries look (XDG_CACHE_HOME, their configured caches)."""
    # last stop's finding: the check knew HF_HOME, HF_HUB_CACHE and HF_DATASETS_CACHE but not XDG_CACHE_HOME, which
    # huggingface_hub and datasets follow when HF_HOME is unset (constants.py / config.py): a cache they read was
    # reported missing. Nor did it see the caches the imported libraries were configured with.
    import huggingface_hub.constants as hc

    from lctx.tasks import lmeval

    _no_network(monkeypatch, tmp_path)
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert not lmeval._hub_cached("allenai/ai2_arc")
    (tmp_path / "xdg" / "huggingface" / "hub" / "datasets--allenai--ai2_arc").mkdir(parents=True)
    assert lmeval._hub_cached("allenai/ai2_arc")  # where huggingface_hub would read it
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "lib-hub"))
    (tmp_path / "lib-hub" / "datasets--cais--mmlu").mkdir(parents=True)
    assert lmeval._hub_cached("cais/mmlu")  # where the imported library was set to read


@pytest.mark.usefixtures("isolated_digests")
def test_offline_hub_error_loads_no_torch(tmp_path):
    """Trial 21 items 3 and 4: the offline-hub error comes before torch is imported."""
    code = ("import sys\nfrom lctx.errors import LctxError\nfrom lctx.harness.evaluate import evaluate\n"
            f"try:\n    evaluate(tasks='arc_easy', limit=1, out={str(tmp_path / 'o')!r})\n"
            "except LctxError as e:\n    print('ERR', e)\nprint('torch' in sys.modules)\n")
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "ERR lm-eval task 'arc_easy'" in p.stdout and p.stdout.strip().endswith("False"), p.stdout + p.stderr


# -- continuation-only logits (issue 28 item 5) ------------------------------------------------------------------
# Requests as lm-eval's _loglikelihood_tokens takes them: ((context, continuation), context ids, continuation ids).
# Rows of different lengths and continuation lengths in one batch; four that share a context (MMLU's letters, one
# lm-eval row); a long one cut from the left at max_length; one whose real last token is 0 (the padding id).
_REQS = [((f"c{i}", f"x{i}"), ctx, cont) for i, (ctx, cont) in enumerate([
    ([5, 17, 33, 2, 9, 41, 7, 8, 12, 3], [44]), ([5, 17, 33, 2, 9, 41, 7, 8, 12, 3], [45]),
    ([5, 17, 33, 2, 9, 41, 7, 8, 12, 3], [46]), ([5, 17, 33, 2, 9, 41, 7, 8, 12, 3], [47]),
    ([11, 12], [13, 14, 15, 16, 17, 18, 19]), ([30] * 3, [31, 32]), ([6, 0, 6, 0], [8, 0]),
    (list(range(1, 90)), [90, 91, 92]), ([50, 51, 52, 53, 54, 55], [56, 57, 58, 59]), ([3], [4])])]
# tolerance: both sides compute the same float32 ops on the same rows, but the lean path's matmuls see other shapes
# (row blocks; the output embeddings on K gathered positions instead of all P), so BLAS may sum in another order:
# each logit moves by a few ulp of its dot products (|logit| < 10, d = 32: ~1e-6), a log-probability by about
# twice that, and a sum of <= 7 continuation tokens by < 2e-5 (measured: 0.0 on both models here).
LL_TOL = 2e-5


def _lm_pair(ck, **lean):
    """lm-eval's plain HFLM and LctxHFLM over the same loaded model, batch 4, max_length 64 (one request is cut)."""
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(ck)).eval()
    tok = AutoTokenizer.from_pretrained(str(ck))
    kw = dict(pretrained=model, tokenizer=tok, batch_size=4, max_length=64, device="cpu")
    return HFLM(**kw), lmeval.lctx_hflm_class()(**kw, **lean)


def _max_delta(a, b):
    assert [g for _, g in a] == [g for _, g in b]  # is_greedy agrees too
    return max(abs(x - y) for (x, _), (y, _) in zip(a, b))


@pytest.mark.parametrize("variant", ["rope", "hf-llama"])
def test_continuation_only_logits_equal_lm_evals(make_checkpoint, tmp_path, variant):
    """LctxHFLM's log-likelihoods equal lm-eval's HFLM on the same tiny random model (an lctx checkpoint and a
    Hugging Face Llama), with every batch on the continuation-only path, in row blocks of 1 and in one block; a
    control that reads the logits one position early is caught."""
    import torch

    ck = make_checkpoint("rope")
    if variant == "hf-llama":  # a transformers model (the sdpa path lm-eval direct runs), with the same tokenizer
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
                         ).save_pretrained(tmp_path / "llama")
        AutoTokenizer.from_pretrained(str(ck)).save_pretrained(tmp_path / "llama")
        ck = tmp_path / "llama"
    plain, lean = _lm_pair(ck, block_bytes=1)  # 1 byte: every row block is one row
    want = plain._loglikelihood_tokens(_REQS, disable_tqdm=True)
    got = lean._loglikelihood_tokens(_REQS, disable_tqdm=True)
    assert lean.lean_calls == 2  # 2 lm-eval batches of 4 and 3 rows (the 4 letters share one), both lean
    assert _max_delta(want, got) <= LL_TOL
    lean.block_bytes, lean._blocks = 1 << 40, {}  # one block: the whole batch in one forward
    assert _max_delta(want, lean._loglikelihood_tokens(_REQS, disable_tqdm=True)) <= LL_TOL
    plan = lean._cont_plan  # control: positions one token early (off-by-one slicing) must show as a difference

    def early(inps):
        p = plan(inps)
        return p and ([max(1, n - 1) for n in p[0]], p[1])

    lean._cont_plan = early
    assert _max_delta(want, lean._loglikelihood_tokens(_REQS, disable_tqdm=True)) > 1000 * LL_TOL


def test_rows_not_noted_take_lm_evals_full_path(make_checkpoint):
    """Fallback: a batch whose rows are not requests of the current call (another caller of _model_call), or whose
    row is ambiguous (a request ending in the padding id 0 and one without it look alike padded), gets lm-eval's
    own full [B, P, V] logits, and the same answers."""
    import torch

    plain, lean = _lm_pair(make_checkpoint("rope"))
    x = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    full = lean._model_call(x)
    assert full.shape == (2, 4, 400) and lean.lean_calls == 0 and torch.equal(full, plain._model_call(x))
    twins = [(("a", "b"), [5, 6], [0, 7]), (("a", "c"), [5, 6], [9]), (("d", "e"), [5, 6, 0], [9, 9])]
    want = plain._loglikelihood_tokens(twins, disable_tqdm=True)
    got = lean._loglikelihood_tokens(twins, disable_tqdm=True)
    assert lean.lean_calls == 0 and _max_delta(want, got) <= LL_TOL  # one batch, ambiguous rows: the full path
    assert lean._cont_rows is None and not lean._packed  # nothing noted outlives the call


@pytest.mark.slow  # 3.4 s of CPU alone (lm-eval's HFLM twice; most of it lm-eval's import)
def test_rolling_loglikelihood_scores_no_doubled_bos(make_checkpoint, tmp_path):
    """Issue 42 item 8 (lm-eval #3333's behaviour, still in lm-eval 0.4.13): with a tokenizer that adds BOS itself
    (Llama's, Gemma's), lm-eval's rolling log-likelihood conditions the first window on ``prefix_token_id`` (BOS) and
    then scores the tokenizer's BOS after it. LctxHFLM's windows hold one BOS (the context), and score exactly the
    text's tokens. Control: lm-eval's own HFLM over the same model and tokenizer holds two and scores one more
    token (the BOS); and LctxHFLM's rolling value equals its per-token sum computed by hand through the same model."""
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from tokenizers import processors
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    ck = make_checkpoint("rope")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=128)).eval()
    tok = AutoTokenizer.from_pretrained(str(ck))
    bos = tok.bos_token_id
    tok._tokenizer.post_processor = processors.TemplateProcessing(single=f"{tok.bos_token} $A",
                                                                  special_tokens=[(tok.bos_token, bos)])
    text = "Perplexity of a short document, scored in rolling windows of the model's length."
    plain_ids = tok(text, add_special_tokens=False).input_ids
    assert tok(text).input_ids == [bos] + plain_ids  # the tokenizer adds BOS (the premise)
    kw = dict(pretrained=model, tokenizer=tok, batch_size=4, max_length=64, device="cpu")
    req = [Instance("loglikelihood_rolling", {}, (text,), 0)]

    def windows(lm):
        seen = []
        inner = lm._loglikelihood_tokens

        def spy(requests, **k):
            seen.extend(requests)
            return inner(requests, **k)

        lm._loglikelihood_tokens = spy
        total = lm.loglikelihood_rolling(req, disable_tqdm=True)[0]
        return total, seen

    ours, got = windows(lmeval.lctx_hflm_class()(**kw))
    theirs, their_windows = windows(HFLM(**kw))
    scored = [t for _, _, cont in got for t in cont]
    assert list(got[0][1]) == [bos] and scored == plain_ids  # BOS once, as the context; the text's tokens scored
    assert sum(list(c).count(bos) + list(x).count(bos) for _, c, x in got) == 1
    first = list(their_windows[0][1]) + list(their_windows[0][2])
    assert first[:2] == [bos, bos] and len([t for *_, c in their_windows for t in c]) == len(plain_ids) + 1  # control
    with torch.no_grad():  # by hand: one window holds the whole text (its tokens + BOS <= max_length + 1)
        assert len(plain_ids) + 1 <= 65
        ids = torch.tensor([[bos] + plain_ids])
        lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        hand = float(lp[torch.arange(len(plain_ids)), torch.tensor(plain_ids)].sum())
    assert ours == pytest.approx(hand, abs=LL_TOL * len(plain_ids))  # LL_TOL per token, summed
    assert abs(theirs - ours) > 1e-3  # the doubled BOS changes the value (the control's effect is visible)


# -- the one bridge over the protocol (issue 43, Architecture) --------------------------------------------------
class ProtocolOnly:
    """A model of a backend lm-eval has no engine for, as lctx sees it: the in-process adapter's protocol members and
    none of its optional lm-eval engines (``lmeval_model``, ``lmeval_api_model``), so its mmlu/arc run through the
    protocol bridge."""

    def __init__(self, lm):
        self._lm = lm

    def __getattr__(self, name):
        from lctx.models.adapters.protocol import LMEVAL_CAPABILITIES

        if name in LMEVAL_CAPABILITIES:
            raise AttributeError(name)
        return getattr(self._lm, name)


# tolerance of the protocol bridge against lm-eval's own hf model on the same weights and ids: the same float32
# network, but lctx's chunked prefill into a KV cache (its attention kernel, the continuation teacher-forced after the
# cached context) against lm-eval's one full forward (transformers' attention): each logit moves by a few ulp of its
# d = 32 dot products (~1e-6), a float64 log-softmax of it by about twice that, and a sum of <= 7 continuation tokens
# by < 2e-5 (LL_TOL); measured on this model: 8.8e-7
PROTOCOL_TOL = LL_TOL


def test_protocol_bridge_equals_lm_evals_hf_model(make_checkpoint):
    """lm-eval's requests scored through the protocol (``prefix`` once per context, ``score_continuation`` per
    continuation) equal lm-eval's own ``hf`` model on the same weights and ids; one prefill per distinct context
    (the four that share one: MMLU's letters); control: the context one token short is caught."""
    from lm_eval.models.huggingface import HFLM

    from lctx.models.adapters.hf import load_lm

    ck = make_checkpoint("rope")
    lm = load_lm(str(ck), device="cpu")
    reqs = [r for r in _REQS if len(r[1]) + len(r[2]) <= 64]  # lm-eval's max_length 64 cuts none of these
    plain = HFLM(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=4, max_length=64, device="cpu")
    bridged = lmeval.adapter_lmeval_class()(ProtocolOnly(lm))
    prefills = []
    inner = lm.prefix
    lm.prefix = lambda ids: prefills.append(list(ids)) or inner(ids)
    want = plain._loglikelihood_tokens(reqs, disable_tqdm=True)
    got = bridged._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert _max_delta(want, got) <= PROTOCOL_TOL
    assert len(prefills) == len({tuple(c) for _, c, _ in reqs}) == len(reqs) - 3  # the four sharing one context
    short = [(k, c[:-1] or c, x) for k, c, x in reqs]  # control: an off-by-one context changes the numbers
    assert max(abs(a - b) for (a, _), (b, _) in zip(want, bridged._loglikelihood_tokens(short))) > 1000 * PROTOCOL_TOL


def test_protocol_bridge_puts_one_bos(make_checkpoint):
    """Issue 42's BOS rule on the protocol bridge: ``lm.bos_id`` first, once, also before a text that writes the BOS's
    own text (a chat template's ``{{ bos_token }}``); none with ``add_special_tokens=False``; lm-eval's pair encoding
    gives the continuation's tokens without a BOS."""
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    bridged = lmeval.adapter_lmeval_class()(ProtocolOnly(lm))
    bos, text = lm.bos_id, "Question: what falls from clouds?\nAnswer:"
    assert bos is not None and bridged.tok_encode(text) == [bos] + lm.encode(text)
    bos_text = lm.tokenizer.convert_ids_to_tokens(bos)
    assert lm.encode(bos_text + text)[:1] == [bos]  # the premise: the tokenizer reads the BOS's text as the BOS
    assert bridged.tok_encode(bos_text + text) == bridged.tok_encode(text)  # one BOS, not two
    assert bridged.tok_encode(text, add_special_tokens=False) == lm.encode(text)
    ctx, cont = bridged._encode_pair(text, " rain")
    assert ctx.count(bos) == 1 and bos not in cont and cont == lm.continuation_ids(text, " rain")


def test_the_bridge_is_the_adapters_capability_not_its_backend(make_checkpoint):
    """LmEvalSuite.bridge picks lm-eval's engine from the adapter's capabilities: the in-process adapter's ``hf``
    (its batch planned), a served adapter's ``api``, and any other adapter (a backend lctx never heard of) the
    protocol; an adapter without teacher-forced scores is unavailable with its reason before any request; a chat
    template it cannot render is one line."""
    import toy_adapter as toy

    from lctx.errors import MetricUnavailable
    from lctx.models.adapters.hf import load_lm

    suite = lmeval.LmEvalSuite([], "local")
    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    assert (suite.bridge(lm).kind, suite.bridge(lm).planned) == ("hf", True)
    assert suite.bridge(lm) is suite.bridge(lm)  # made once per adapter
    assert (suite.bridge(ProtocolOnly(lm)).kind, suite.bridge(ProtocolOnly(lm)).planned) == ("protocol", False)
    assert suite.bridge(toy.ToyAdapter()).kind == "protocol"

    class Untrusted(toy.ToyAdapter):
        teacher_forced = "the echo failed the trust probe"

        def lmeval_api_model(self):
            raise AssertionError("not reached: the capability says no scores first")

    with pytest.raises(MetricUnavailable, match="the echo failed the trust probe"):
        suite.bridge(Untrusted())
    chat = lmeval.LmEvalSuite([], "local", chat_template=True)
    with pytest.raises(LctxError, match=r"^--chat-template on: model 'toy-reader' renders no conversation.*off for it$"):
        chat.bridge(toy.ToyAdapter())
    suite.set_batch_size(3)  # reaches the in-process engine's batch; the protocol's has none to set
    assert suite.bridge(lm).model.batch_size_per_gpu == 3


@pytest.mark.slow  # two lm-eval evaluations of 5 questions (~5 s with lm-eval's import)
def test_a_backend_without_an_engine_runs_mmlu_and_arc_with_the_same_numbers(tiny_data, tmp_path, make_checkpoint):
    """The whole path through ``lctx.evaluate``: the same checkpoint as a model of an unknown backend (the protocol
    bridge) and as the in-process adapter (lm-eval's hf engine) gives the same answers on arc_easy and 5-shot
    mmlu_anatomy: every question's choice log-likelihoods within PROTOCOL_TOL (plus the records' 4-decimal rounding)
    and the same pred/acc; records are ok and not cut."""
    import lctx

    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    prefills = []
    inner = lm.prefix
    lm.prefix = lambda ids: prefills.append(len(ids)) or inner(ids)
    runs = {}
    for label, model in (("hf", lm), ("protocol", ProtocolOnly(lm))):
        res = lctx.evaluate(model, ["arc_easy", "mmlu_anatomy"], data_dir=tiny_data, out=tmp_path / label,
                            progress=False, log=lambda *_: None)
        assert res.ran == 5 and res.errors == 0
        recs = [json.loads(x) for x in (res.out / "records.jsonl").read_text().splitlines()]
        runs[label] = {(r["task"], r["sample"]): r for r in recs}
        assert len(prefills) == (0 if label == "hf" else 5)  # the protocol: one prefill per question, none on hf's
    assert runs["hf"].keys() == runs["protocol"].keys() and len(runs["hf"]) == 5
    for key, want in runs["hf"].items():
        got = runs["protocol"][key]
        assert got["status"] == "ok" and not got["extra"]["truncated"]
        assert got["extra"]["ll"] == pytest.approx(want["extra"]["ll"], abs=PROTOCOL_TOL + 1e-4)
        assert (got["extra"]["pred"], got["metrics"]) == (want["extra"]["pred"], want["metrics"])
