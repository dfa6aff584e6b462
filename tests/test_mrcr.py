"""lctx.tasks.mrcr: MRCR's grade on hand-written responses, the conversation's needles and k, exact budgeting
through the chat template, per-sample conversations, the refusal without a chat template (issue 30 item 2)."""

from __future__ import annotations

import difflib

import pytest

from gguf_tiny import CHAT_TEMPLATE
from lctx.errors import LctxError
from lctx.metrics import mrcr_grade, mrcr_stripped, sequence_ratio
from lctx.tasks import Cell, get_task
from lctx.tasks.mrcr import FINAL, ORDINALS, request


@pytest.fixture
def books(tmp_path):
    """A folder of two 'books' of real English prose (Python's help topics)."""
    from lctx.tasks.textdata import pydoc_corpus

    docs = pydoc_corpus("all")
    d = tmp_path / "books"
    d.mkdir()
    for k in range(2):
        (d / f"book{k}.txt").write_text("\n\n".join(text for _, text in docs[k::2]))
    return tmp_path


@pytest.fixture
def chat_lm(make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("rope")), device="cpu")
    lm.tokenizer.chat_template = CHAT_TEMPLATE  # ChatML, as SmolLM2's
    return lm


def test_grade_is_mrcrs_on_hand_written_responses():
    """MRCR's grade (openai/mrcr's ``grade``): no prefix -> 0; the prefix then the exact answer -> 1; a near-miss
    (one word changed) scores the SequenceMatcher ratio, computed here by hand for the control: "the cat sat" vs
    "the cat sit" share 10 of 11 + 11 characters, ratio 2 * 10 / 22 = 0.909."""
    ans = "the cat sat"
    assert mrcr_grade("Zq81 the cat sat"[5:], ans, "Zq81") == 0.0  # prefix missing
    assert mrcr_grade("Zq81the cat sat", ans, "Zq81") == 1.0
    assert mrcr_grade(" Zq81the cat sat", ans, "Zq81") == 0.0  # MRCR's grade strips nothing: a space first is 0
    assert mrcr_stripped(" Zq81the cat sat", ans, "Zq81") == 1.0  # lctx's variant strips it (its own name)
    assert mrcr_grade("Zq81the cat sit", ans, "Zq81") == pytest.approx(20 / 22)
    assert mrcr_grade("zq81the cat sat", ans, "Zq81") == 0.0  # the prefix is case-sensitive, as MRCR's
    assert sequence_ratio("the cat sat", ans, "Zq81") == 1.0  # the lenient score: no prefix needed
    assert sequence_ratio("Zq81the cat sit", ans, "Zq81") == pytest.approx(difflib.SequenceMatcher(
        None, "the cat sit", ans).ratio())


@pytest.mark.parametrize("needles", [2, 4, 8])
def test_conversation_repeats_the_needle_and_asks_its_kth_answer(books, needles):
    """``needles`` user turns are the one request, every other is a different one; the asked needle sits at
    turn round(depth * (T - 1)) with k - 1 needles before it; the last turn asks for the k-th by ordinal and the
    expected answer is that turn's assistant message; the needles' answers differ."""
    t = get_task("mrcr")(needles=needles, data_dir=books)
    for depth in (0.0, 0.3, 1.0):
        msgs, info = t.conversation(0, Cell(4096, depth, 0), 12)
        users = [m["content"] for m in msgs[:-1:2]]
        answers = [m["content"] for m in msgs[1:-1:2]]
        need = request(info["style"], info["topic"])
        where = [i for i, u in enumerate(users) if u == need]
        assert len(users) == 12 and len(where) == needles
        assert info["turn"] == round(depth * 11) and where.index(info["turn"]) == info["k"] - 1
        assert msgs[-1]["content"] == FINAL.format(prefix=info["prefix"], ordinal=ORDINALS[info["k"] - 1],
                                                   style=info["style"], topic=info["topic"])
        assert info["answer"] == answers[info["turn"]] and len({answers[i] for i in where}) == needles
        assert len(info["prefix"]) == 10 and info["prefix"].isalnum()


def test_budget_is_exact_through_the_chat_template(chat_lm, books):
    """The conversation plus its answer's budget fits the length and one more turn would not; the prompt ends with
    the template's assistant header; the sample's depth rises with the depth."""
    t = get_task("mrcr")(data_dir=books, answer_words=20)
    ds = []
    for depth in (0.0, 0.5, 1.0):
        cell = Cell(2000, depth, 0)
        s = t.build(chat_lm, cell, seed=0)
        new = s.meta["max_new_tokens"]
        assert s.n_tokens + new <= 2000 or chat_lm.prompt_budget(2000, new) == 2000
        assert s.n_tokens <= chat_lm.prompt_budget(2000, new)
        p, _, _, new2 = t._prompt(chat_lm, 0, cell, s.meta["n_turns"] + 1)
        assert len(p.ids) > chat_lm.prompt_budget(2000, new2)  # one more turn does not fit
        assert chat_lm.decode(s.input_ids).endswith("<|im_start|>assistant\n")
        ds.append(s.depth)
    assert ds == sorted(ds) and ds[0] < 0.2 < 0.7 < ds[2]


def test_samples_get_their_own_conversation(chat_lm, books):
    t = get_task("mrcr")(data_dir=books, answer_words=20)
    ss = [t.build(chat_lm, Cell(1500, 0.5, k), seed=0) for k in range(3)]
    assert len({tuple(s.input_ids) for s in ss}) == 3
    assert t.build(chat_lm, Cell(1500, 0.5, 0), seed=0).input_ids == ss[0].input_ids


def test_scores_a_perfect_and_a_wrong_response(chat_lm, books):
    """The expected response scores 1 on both metrics; another needle's answer with the prefix scores below 1
    (the control: the grade tells the k-th answer from the others)."""
    t = get_task("mrcr")(data_dir=books, answer_words=20, needles=4)
    s = t.build(chat_lm, Cell(1500, 0.5, 0), seed=0)
    msgs, info = t.conversation(0, Cell(1500, 0.5, 0), s.meta["n_turns"])
    good = chat_lm.encode(info["prefix"] + info["answer"])
    assert t.score_generated(chat_lm, dict_copy(s), None, good) == {"mrcr_grade": 1.0, "mrcr_stripped": 1.0,
                                                                     "sequence_ratio": 1.0}
    need = msgs[2 * info["turn"]]["content"]
    other = next(msgs[2 * i + 1]["content"] for i in range(s.meta["n_turns"])
                 if msgs[2 * i]["content"] == need and i != info["turn"])
    bad = t.score_generated(chat_lm, dict_copy(s), None, chat_lm.encode(info["prefix"] + other))
    assert bad["mrcr_grade"] < 0.9


def dict_copy(s):
    import copy

    return copy.deepcopy(s)


def test_refuses_a_model_without_a_chat_template_and_bad_options(make_checkpoint, books, tmp_path):
    import lctx

    with pytest.raises(LctxError, match=r"has no chat template, and a multi-turn task \(mrcr\) is a conversation"):
        lctx.evaluate([str(make_checkpoint("rope"))], "mrcr", lengths=[1024], samples=1, data_dir=books,
                      out=tmp_path / "r", memory_check=False, log=lambda m: None)
    with pytest.raises(ValueError, match="needles=1 is below 2"):
        get_task("mrcr")(needles=1, data_dir=books)
    t = get_task("mrcr")(data_dir=books)
    from lctx.models.adapters.hf import load_lm

    lm = load_lm(str(make_checkpoint("rope", name="c2")), device="cpu")
    lm.tokenizer.chat_template = CHAT_TEMPLATE
    with pytest.raises(ValueError, match="shorter than an mrcr conversation of 2 turns"):
        t.build(lm, Cell(300, 0.5, 0), seed=0)


def test_the_headline_is_mrcrs_grade_and_a_leading_space_scores_0(chat_lm, books):
    """Issue 42 item 6: the task's headline is MRCR's own ``grade`` (openai/mrcr dataset card, README.md at
    204b0d4e8d9ca5c0a90bf942fdb2a5969094adc0), which strips nothing, so a continuation that starts with a newline
    before the string scores 0 there (lctx's old ``mrcr`` scored it 1.0); lctx's whitespace-stripping variant is
    ``mrcr_stripped``, and the old name is not recorded any more (records of version 1 carry it)."""
    t = get_task("mrcr")(data_dir=books, answer_words=20)
    s = t.build(chat_lm, Cell(1500, 0.5, 0), seed=0)
    _, info = t.conversation(0, Cell(1500, 0.5, 0), s.meta["n_turns"])
    got = t.score_generated(chat_lm, dict_copy(s), None, chat_lm.encode("\n" + info["prefix"] + info["answer"]))
    assert chat_lm.decode(chat_lm.encode("\n" + info["prefix"])).startswith("\n")  # the tokenizer keeps it
    assert got[t.headline()] == 0.0 and got["mrcr_stripped"] == 1.0 and "mrcr" not in got
    assert t.headline() == "mrcr_grade" and t.version == 2 and "mrcr" not in t.metrics


def test_an_old_runs_mrcr_is_never_compared_as_equal_to_the_new_grade():
    """Issue 42 item 6: ``mrcr`` meant MRCR's grade after stripping the reply's leading whitespace; MRCR's own grade
    is now ``mrcr_grade`` and the old meaning ``mrcr_stripped``. Compared with a committed run of version 1
    (results/2026-12-03-new-tasks, SmolLM2), a new run's mrcr cells are missing / new, so the gate fails
    instead of judging two meanings equal, even where the numbers happen to agree; the control: the old run
    against itself passes."""
    from pathlib import Path

    import pandas as pd

    from lctx.harness.outputs.compare import compare_runs, load_summary, verdict

    old = Path(__file__).resolve().parents[1] / "results" / "2026-12-03-new-tasks" / "runs" / "smollm2"
    base = load_summary(old, "baseline")
    base = base[base["task"] == "mrcr"]
    assert set(base["metric"]) == {"mrcr", "sequence_ratio"}
    kept = base[base["metric"] == "sequence_ratio"]  # unchanged meaning: the same name
    renamed = [base[base["metric"] == "mrcr"].assign(metric=m) for m in ("mrcr_grade", "mrcr_stripped")]
    cmp = compare_runs(pd.concat([kept, *renamed]), base)
    status = cmp.table.groupby("metric")["status"].agg(set).to_dict()
    assert status["mrcr"] == {"missing"} and status["mrcr_grade"] == status["mrcr_stripped"] == {"new"}
    assert status["sequence_ratio"] == {"same"}  # its meaning did not change, nor its name
    assert verdict(cmp).startswith("FAIL") and cmp.exit_code != 0
    assert verdict(compare_runs(base, base)).startswith("PASS")
