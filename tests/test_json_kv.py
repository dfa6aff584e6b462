"""lctx.tasks.json_kv: token budgeting, the asked pair's depth, per-sample objects, scoring (issue 30 item 1)."""

from __future__ import annotations

import json

import pytest

from lctx.tasks import Cell, get_task
from lctx.tasks.json_kv import ANSWER_PREFIX, INSTRUCTION, make_pairs


@pytest.fixture
def lm(make_checkpoint):
    from lctx.models.adapters.hf import load_lm

    return load_lm(str(make_checkpoint("rope")), device="cpu")


@pytest.mark.parametrize("length", [600, 1500])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_json_kv_budget_is_exact_and_the_asked_pair_sits_at_its_depth(lm, length, depth):
    """The prompt fits the budget and one more pair would not (exact budgeting); the object parses as JSON and
    holds the asked key once, at pair round(depth * (N - 1))."""
    task = get_task("json_kv")()
    s = task.build(lm, Cell(length, depth, 0), seed=3)
    assert s.n_tokens == len(s.input_ids) <= lm.prompt_budget(length, task._budget_new(lm))
    n = s.meta["n_pairs"]
    assert n >= 2
    pairs = make_pairs(3, Cell(length, depth, 0), n + 1)
    more = task._user(pairs, int(round(depth * n)))[0]
    assert len(lm.prompt(more, ANSWER_PREFIX).ids) > lm.prompt_budget(length, task._budget_new(lm))
    text = s.meta["prompt_text"]
    body = text[text.index(INSTRUCTION) + len(INSTRUCTION):text.index('\n\nKey: "')]
    obj = json.loads(body)
    assert len(obj) == n and obj[s.meta["key"]] == s.meta["answer"]
    assert list(obj).index(s.meta["key"]) == s.meta["asked"] == int(round(depth * (n - 1)))
    if depth == 0.0:
        assert s.depth < 0.2
    if depth == 1.0:  # the last pair, before the question (its key repeated): ~0.77 of a 600-token prompt
        assert s.depth > 0.6


def test_json_kv_samples_of_a_cell_never_share_a_prompt(lm):
    """Issue 30 item 6: each sample of a cell gets its own object (so prefix caching or memorisation cannot carry
    one sample's answer into the next); the same (seed, cell) gives the same prompt."""
    task = get_task("json_kv")()
    prompts = [tuple(task.build(lm, Cell(600, 0.5, k), seed=0).input_ids) for k in range(4)]
    assert len(set(prompts)) == 4
    assert prompts[0] == tuple(task.build(lm, Cell(600, 0.5, 0), seed=0).input_ids)


def test_json_kv_scores_the_value_by_substring(lm):
    """string_match_all is 1 when the asked value occurs in the continuation, 0 for another pair's value (the
    control), with the substring mode named in the task's options."""
    task = get_task("json_kv")()
    s = task.build(lm, Cell(600, 0.5, 0), seed=0)
    other = next(v for k, v in make_pairs(0, Cell(600, 0.5, 0), s.meta["n_pairs"]) if k != s.meta["key"])
    assert task.score_generated(lm, s, None, lm.encode(" " + s.meta["answer"] + '"'))["string_match_all"] == 1.0
    assert task.score_generated(lm, s, None, lm.encode(" " + other))["string_match_all"] == 0.0
    assert task.options["match"] == "substring"


@pytest.mark.parametrize("reply, helmet, ruler", [
    (" {v}", 1.0, 1.0),                              # ordinary
    (' "{V}"', 1.0, 1.0),                            # case and quotes
    (" **{v}**", 1.0, 1.0),                          # markdown
    (" the value is {v}, or maybe {o}", 1.0, 1.0),   # hedged
    (" {nohyphen}", 1.0, 0.0),                       # hyphens dropped: HELMET's normalisation removes them
    (" {underscore}", 1.0, 0.0),                     # other ASCII punctuation between the groups
    (" {o}", 0.0, 0.0),                              # another pair's value
])
def test_json_kv_headline_is_helmets_substring_exact_match(lm, reply, helmet, ruler):
    """Issue 42 item 6: json_kv's headline is HELMET's json_kv score, ``substring_exact_match`` with its
    ``normalize_answer`` (princeton-nlp/HELMET, data.py ``load_json_kv.post_process`` and utils.py, commit
    13344b78a2e37f700136b84a1c1071583349fe00), scored on the decoded continuation; RULER's substring
    ``string_match_all`` of the value as written stays beside it. A value written without its hyphens is HELMET's
    1 and RULER's 0 (lctx's old headline, which called itself HELMET's)."""
    task = get_task("json_kv")()
    s = task.build(lm, Cell(600, 0.5, 0), seed=0)
    v = s.meta["answer"]
    o = next(x for k, x in make_pairs(0, Cell(600, 0.5, 0), s.meta["n_pairs"]) if k != s.meta["key"])
    text = reply.format(v=v, V=v.upper(), o=o, nohyphen=v.replace("-", ""), underscore=v.replace("-", "_"))
    assert lm.decode(lm.encode(text)).strip() == text.strip()  # the tokenizer round-trips the reply
    got = task.score_generated(lm, s, None, lm.encode(text))
    assert task.headline() == "substring_exact_match" and task.version == 2
    assert got[task.headline()] == helmet and got["string_match_all"] == ruler


def test_json_kv_match_modes_keep_off_rulers_name(lm):
    """``match=digits|word`` is lctx's, not RULER's substring: its score is recorded as ``string_match_all_digits``
    (declared in the task's metrics), HELMET's headline unchanged."""
    task = get_task("json_kv")(match="word")
    s = task.build(lm, Cell(600, 0.5, 0), seed=0)
    got = task.score_generated(lm, s, None, lm.encode(" " + s.meta["answer"]))
    assert set(got) == set(task.metrics) == {"substring_exact_match", "string_match_all_word"}
    assert task.declaration()["metrics"] == ["substring_exact_match", "string_match_all_word"]


def test_json_kv_refuses_bad_options_and_too_short_lengths(lm):
    with pytest.raises(ValueError, match="match must be one of"):
        get_task("json_kv")(match="fuzzy")
    with pytest.raises(ValueError, match="shorter than the json_kv template"):
        get_task("json_kv")().build(lm, Cell(30, 0.5, 0), seed=0)


def test_json_kv_min_length_holds_every_draw_and_answers_stay_in_budget(lm):
    """The run's up-front check passes a length only when every sample can hold one pair there (uuids take a
    varying number of tokens: a bound from one draw let 170 through where a sample needed 172), and a sample's
    greedy budget never exceeds what the prompt budget held back (an answer past the model's last position)."""
    task = get_task("json_kv")()
    L = task.min_length(lm)
    for k in range(12):
        s = task.build(lm, Cell(L, 0.5, k), seed=0)
        assert s.meta["n_pairs"] >= 1 and task.max_new_tokens_for(s) <= task._budget_new(lm)
    with pytest.raises(ValueError, match="shorter than the json_kv template"):  # control: well below the bound
        task.build(lm, Cell(L - 40, 0.5, 0), seed=0)
