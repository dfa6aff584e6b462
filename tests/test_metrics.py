"""The metrics registry (issue 13.4): every metric lctx's tasks and derived steps report is registered with a
direction and a source; the tasks score with the registered functions; ``lctx compare`` and ``lctx list metrics``
read it."""

from __future__ import annotations

import math

import pytest

from lctx.metrics import METRICS, register_metric


def test_every_builtin_task_metric_is_registered_with_a_source():
    from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived names)
    from lctx.tasks import GROUPS, TASKS

    builtin = [(n, c.metrics) for n, c in TASKS.items() if c.__module__.startswith("lctx.")]  # not test tasks
    builtin += [(g.name, g.metrics) for g in GROUPS.values()]  # mmlu/arc, flatness, ruler
    assert len(builtin) >= 20
    for name, metrics in builtin:
        for m in metrics:
            assert m in METRICS, f"{name} reports {m!r}, which lctx.metrics does not register"
    for m in METRICS.values():
        assert m.direction in ("higher", "lower", "equal") and len(m.summary) > 20, m.name


def test_registered_functions_by_hand():
    # RULER's string_match_all / _part (scripts/eval/synthetic/constants.py), worked by hand: 2 of 3 refs found
    fn_all, fn_part = METRICS["string_match_all"].fn, METRICS["string_match_part"].fn
    assert fn_all("the values are 123 and 456", ["123", "456", "789"]) == pytest.approx(2 / 3)
    assert fn_part("the values are 123", ["789", "123"]) == 1.0 and fn_part("none", ["789"]) == 0.0
    # ranks 1, 2, 4: top-1 = 1/3, MRR = (1 + 1/2 + 1/4) / 3
    assert METRICS["tf_top1"].fn([1, 2, 4]) == pytest.approx(1 / 3)
    assert METRICS["tf_mrr"].fn([1, 2, 4]) == pytest.approx(1.75 / 3)
    assert METRICS["tf_gain"].fn([-1.0, -3.0], -5.0) == pytest.approx(3.0)
    assert math.isnan(METRICS["digit_acc"].fn([])) and METRICS["digit_acc"].fn([True, False]) == 0.5
    assert METRICS["ppl"].fn(math.log(7.0)) == pytest.approx(7.0)
    assert METRICS["exact"].fn("12345", "12345") == 1.0 and METRICS["exact"].fn(None, "12345") == 0.0
    assert METRICS["acc"].fn is None  # lm-eval computes it


def test_tasks_score_with_the_registered_functions():
    from lctx.tasks import niah, passkey, ppl  # noqa: F401

    assert niah.string_match_all is METRICS["string_match_all"].fn
    assert niah.tf_mrr is METRICS["tf_mrr"].fn and ppl.ppl is METRICS["ppl"].fn


def test_registration_rules():
    with pytest.raises(ValueError, match="already registered"):
        register_metric("exact", "higher", "again")
    with pytest.raises(ValueError, match="direction"):
        register_metric("my_metric_x", "up", "x")
    assert "my_metric_x" not in METRICS


def test_compare_takes_directions_from_the_registry():
    from lctx.harness.outputs.compare import DIRECTIONS, Rules

    assert all(DIRECTIONS[m.name] == m.direction for m in METRICS.values())
    assert Rules().direction_for("some_task", "acc,none") == "higher"  # lm-eval's ",filter" suffix dropped
    assert Rules().direction_for("some_task", "bits_per_byte") == "lower"  # another engine's metric
    register_metric("test_only_score", "lower", "a metric registered after compare was imported")
    try:
        assert Rules().direction_for("some_task", "test_only_score") == "lower"
    finally:
        METRICS.pop("test_only_score")


def test_list_metrics(capsys):
    from helpers import run_cli

    code, out, err = run_cli(["list", "metrics"], capsys)
    assert code == 0, err
    for name in ("exact", "digit_acc", "string_match_all", "string_match_part", "nll", "ppl", "acc", "average"):
        assert f"| {name} " in out
    assert "RULER" in out and "Landmark Attention" in out


def test_teacher_forced_metrics_are_labelled(capsys):
    """Issue 24 item 4: digit_acc is 1.00 where greedy output fails; `lctx list metrics` (and every table and
    title that shows a metric, through metrics.label) names the teacher-forced ones as such."""
    from helpers import run_cli

    from lctx.metrics import is_teacher_forced, label

    tf = {m.name for m in METRICS.values() if m.teacher_forced}
    assert {"digit_acc", "tf_top1", "tf_mrr", "tf_logprob", "tf_gain"} <= tf
    assert not {"exact", "string_match_all", "ppl", "acc"} & tf
    assert label("digit_acc") == "digit_acc (teacher-forced)" and label("exact") == "exact"
    assert label("digit_acc", "Digit accuracy") == label("digit_acc", "Digit accuracy (teacher-forced)") \
        == "Digit accuracy (teacher-forced)"  # said once
    assert is_teacher_forced("tf_top1,none")  # an lm-eval ",filter" suffix dropped
    code, out, err = run_cli(["list", "metrics"], capsys)
    assert code == 0, err
    rows = {ln.split("|")[1].strip(): ln for ln in out.splitlines() if ln.startswith("| ") and "---" not in ln}
    for name in tf:
        assert f"{name} (teacher-forced)" in rows, sorted(rows)
    assert "exact" in rows and "greedy continuation" in rows["exact"]
    assert "greedy continuation fails" in rows["digit_acc (teacher-forced)"]  # when it disagrees with exact


# --- the anchors' scorers (issue 42 item 6) ------------------------------------------------------------------
# Each test pins an anchor's rules as read from its own code (repository, file and commit in the docstring), on
# ordinary, hedged, reformatted (case, punctuation, articles, quotes, whitespace, markdown) and multi-answer
# replies. "old" in a case's comment: what lctx scored before issue 42, where it differs from the anchor.

UUID = "3f2b8c1e-9a4d-4e7b-8c2a-1b3c5d7e9f01"
OTHER_UUID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


@pytest.mark.parametrize("text, normalised", [
    ("The Kitchen!", "kitchen"),             # lower case, punctuation, a leading article
    ("a  b\tc\n", "b c"),                    # the article "a", whitespace collapsed
    ("an anthem, the theme", "anthem theme"),  # whole-word articles only
    ("3F2B-9A4D_x.y", "3f2b9a4dxy"),          # hyphen, underscore and dot are ASCII punctuation
    ("don't", "dont"),
    ("“quoted” – dash", "“quoted” – dash"),  # curly quotes and the en dash are not string.punctuation: kept
    ("**bold** `code`", "bold code"),        # markdown marks are punctuation
])
def test_helmet_normalize_answer_rules(text, normalised):
    """HELMET's ``normalize_answer`` (princeton-nlp/HELMET, utils.py, commit 13344b78a2e37f700136b84a1c1071583349fe00):
    lower-case, then drop each character of ``string.punctuation``, then replace ``\\b(a|an|the)\\b`` by a space,
    then ``" ".join(s.split())``."""
    from lctx.metrics import helmet_normalize_answer

    assert helmet_normalize_answer(text) == normalised


@pytest.mark.parametrize("reply, expected", [
    (" " + UUID, 1.0),                                          # ordinary
    (" " + UUID + '"}', 1.0),
    (' "' + UUID.upper() + '"', 1.0),                           # case and quotes
    (" **" + UUID + "**", 1.0),                                 # markdown
    ("\n\n  " + UUID + "  \n", 1.0),                            # whitespace
    (" The value is the " + UUID + ".", 1.0),                   # articles and a sentence around it
    (" I think it's " + UUID + ", or maybe " + OTHER_UUID, 1.0),  # hedged: HELMET counts a substring
    (" " + UUID.replace("-", ""), 1.0),                         # hyphens dropped: HELMET 1, old 0
    (" " + UUID.replace("-", "_"), 1.0),                        # underscores for hyphens: HELMET 1, old 0
    (" " + UUID.replace("-", ".", 1), 1.0),                     # one hyphen a dot: HELMET 1, old 0
    (" " + UUID[:13] + UUID[14:], 1.0),                         # one hyphen lost: HELMET 1, old 0
    (" " + UUID.replace("-", " - "), 0.0),                      # spaced hyphens split the value: 0 (edge)
    (" " + UUID.replace("-", "–"), 0.0),                        # en dashes are no ASCII punctuation: 0 (edge)
    (" " + UUID.replace("-", "\n", 1), 0.0),                    # a line break inside: 0 (edge)
    (" " + UUID[:-1], 0.0),                                     # one character short
    (" " + OTHER_UUID, 0.0),                                    # another pair's value
    ("", 0.0),
])
def test_substring_exact_match_is_helmets_json_kv_scorer(reply, expected):
    """HELMET's json_kv score (princeton-nlp/HELMET, commit 13344b78a2e37f700136b84a1c1071583349fe00: data.py
    ``load_json_kv.post_process``, utils.py ``calculate_metrics`` / ``substring_exact_match_score``): the max of
    ``normalize_answer(answer) in normalize_answer(output)`` over the raw output and the output parsed after
    "corresponding value:" (``parse_output``). The normalisation removes a uuid's hyphens, so a value written
    without them (or with other ASCII punctuation between its groups) counts; lctx's old json_kv scorer (RULER's
    substring of the value as written) scored those 0."""
    from lctx.metrics import METRICS, substring_exact_match

    assert substring_exact_match(reply, [UUID]) == expected
    assert METRICS["substring_exact_match"].fn is substring_exact_match


def test_helmet_parse_output_and_multi_answer_rules():
    """HELMET's ``parse_output`` (utils.py, same commit): the rest of the first line after the prefix
    (case-insensitive), else the first line, stripped and with a repeated prefix removed; and
    ``drqa_metric_max_over_ground_truths``: several answers (a list, or a list of lists) score their best."""
    from lctx.metrics import helmet_parse_output, helmet_substring_exact_match, substring_exact_match

    assert helmet_parse_output("x\nCorresponding value: Corresponding value: ab \nnext", "corresponding value:") == "ab"
    assert helmet_parse_output("  first line \nsecond", "corresponding value:") == "first line"
    assert helmet_parse_output("", "corresponding value:") == ""
    assert helmet_substring_exact_match("the Paris one", ["London", "paris"]) == 1.0
    assert helmet_substring_exact_match("the Paris one", [["London"], ["Rome", "Paris"]]) == 1.0
    assert helmet_substring_exact_match("Berlin", ["London", "Paris"]) == 0.0
    assert substring_exact_match("corresponding value: " + UUID, UUID) == 1.0  # a bare string answer


ROOMS_ = ["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"]
Q1 = "Where is Mary?"
Q3 = "Where was the football before the office?"
QA8_LABELS = ["apple", "football", "milk", "nothing"]


@pytest.mark.parametrize("output, target, question, labels, expected", [
    (" kitchen.", "kitchen", Q1, ROOMS_, 1.0),                          # ordinary
    (" the kitchen.", "kitchen", Q1, ROOMS_, 1.0),                      # an article first: BABILong 1, old 0
    (" Kitchen", "kitchen", Q1, ROOMS_, 1.0),                           # case
    (' "**KITCHEN**"!', "kitchen", Q1, ROOMS_, 1.0),                    # quotes, markdown
    ("\n\n  kitchen  ", "kitchen", Q1, ROOMS_, 1.0),                    # whitespace
    (" kitchens", "kitchen", Q1, ROOMS_, 1.0),                          # a plain substring: BABILong 1, old 0
    (" kitchen, or maybe the garden.", "kitchen", Q1, ROOMS_, 0.0),     # hedged, two rooms: BABILong 0, old 1
    ("I think it's the kitchen, or maybe the garden", "kitchen", Q1, ROOMS_, 0.0),  # hedged
    (" kitchen or garden", "kitchen", Q1, ROOMS_, 0.0),                 # hedged: BABILong 0, old 1
    (" kitchen\ngarden", "kitchen", Q1, ROOMS_, 0.0),                   # a line break is no sentence end: old 1
    (" kitchen. Then she went to the garden.", "kitchen", Q1, ROOMS_, 1.0),  # the first sentence only
    (" garden. No, the kitchen.", "kitchen", Q1, ROOMS_, 0.0),
    (" kitchen <example> garden", "kitchen", Q1, ROOMS_, 1.0),          # cut at <example>
    (" kitchen Question: where is the garden", "kitchen", Q1, ROOMS_, 0.0),  # 'Question' never cuts (lower case)
    (" hallway", "kitchen", Q1, ROOMS_, 0.0),
    ("", "kitchen", Q1, ROOMS_, 0.0),
    (" garden, not the office", "garden", Q3, ROOMS_, 1.0),             # a room of the question is not counted
    (" the office, no, the garden", "garden", Q3, ROOMS_, 1.0),         # BABILong 1, old 0 ("the")
    (" office", "garden", Q3, ROOMS_, 0.0),
    (" apple and football", "apple,football", "What is Mary carrying?", QA8_LABELS, 1.0),  # multi-answer (qa8)
    (" football, apple", "apple,football", "What is Mary carrying?", QA8_LABELS, 1.0),
    (" apple", "apple,football", "What is Mary carrying?", QA8_LABELS, 0.0),
    (" apple, football and milk", "apple,football", "What is Mary carrying?", QA8_LABELS, 0.0),
    (" e,n", "e,n", "How do you go from the garden to the office?", ["e,n", "n,e", "s,e"], 1.0),  # 3 chars: one label
    (" s,e,n", "e,n", "How do you go from the garden to the office?", ["e,n", "n,e", "s,e"], 0.0),
])
def test_babilong_match_is_babilongs_compare_answers(output, target, question, labels, expected):
    """BABILong's ``compare_answers`` (booydar/babilong, babilong/metrics.py, commit
    93d7bfe67ad008b5825b56e728ecf0fbec60a6b0, unchanged at 7a6efee29f5cac03c3c410e6799c80fd2ffe3610) with the
    task's ``TASK_LABELS``: the output lower-cased and cut at its first "." (then at "<context>", "<example>" and
    "Question", which never cuts lower-case text); the labels found in it as plain substrings, less those found in
    the question, must be exactly the target (a target of comma-separated labels longer than 3 characters: all of
    them and no other). lctx's old babi scorer (the first word equals the room) scored hedges 1 and "the kitchen"
    0."""
    from lctx.metrics import METRICS, babilong_match

    assert babilong_match(output, target, question, labels) == expected
    assert METRICS["babilong_match"].fn is babilong_match


PREFIX = "Zq81xK2pLm"
PASSAGE = "The tide came in slowly over the grey stones of the harbour."


def _ratio(a: str, b: str) -> float:
    import difflib

    return difflib.SequenceMatcher(None, a, b).ratio()


@pytest.mark.parametrize("response, expected", [
    (PREFIX + PASSAGE, 1.0),                                          # ordinary
    (" " + PREFIX + PASSAGE, 0.0),                                    # leading space: MRCR 0, old mrcr 1.0
    ("\n\n" + PREFIX + PASSAGE, 0.0),                                 # leading newlines: MRCR 0, old mrcr 1.0
    (PREFIX.lower() + PASSAGE, 0.0),                                  # the string is case-sensitive
    ("**" + PREFIX + "**" + PASSAGE, 0.0),                            # markdown around it
    ('"' + PREFIX + PASSAGE + '"', 0.0),                              # quoted
    (PREFIX + " " + PASSAGE, _ratio(" " + PASSAGE, PASSAGE)),         # a space after the string
    (PREFIX + "\n\n" + PASSAGE, _ratio("\n\n" + PASSAGE, PASSAGE)),
    (PREFIX + PASSAGE.upper(), _ratio(PASSAGE.upper(), PASSAGE)),     # case counts in the ratio
    (PREFIX + PASSAGE + " Or maybe the other one.", _ratio(PASSAGE + " Or maybe the other one.", PASSAGE)),  # hedged
    (PREFIX + PASSAGE + PREFIX + PASSAGE, _ratio(PASSAGE + PREFIX + PASSAGE, PASSAGE)),  # two answers
    (PREFIX, 0.0),                                                    # the string alone
])
def test_mrcr_grade_is_mrcrs_grade(response, expected):
    """OpenAI MRCR's ``grade`` (the openai/mrcr dataset card, README.md at commit
    204b0d4e8d9ca5c0a90bf942fdb2a5969094adc0, as stanford-crfm/helm's
    src/helm/benchmark/metrics/openai_mrcr_metrics.py at 1e45d5569bc3abaa68a0a3c871d4e3630678d95a cites and
    reimplements it): 0 unless ``response.startswith(random_string_to_prepend)``; else
    ``SequenceMatcher(None, response.removeprefix(s), answer.removeprefix(s)).ratio()``. No whitespace is
    stripped: lctx's old ``mrcr`` stripped the response's leading whitespace first (now ``mrcr_stripped``)."""
    from lctx.metrics import METRICS, mrcr_grade, mrcr_stripped

    assert mrcr_grade(response, PASSAGE, PREFIX) == pytest.approx(expected, abs=0.0)  # the same float operations
    assert mrcr_grade(response, PREFIX + PASSAGE, PREFIX) == mrcr_grade(response, PASSAGE, PREFIX)  # MRCR's answers
    assert mrcr_stripped(response, PASSAGE, PREFIX) == mrcr_grade(response.lstrip(), PASSAGE, PREFIX)  # carry it
    assert METRICS["mrcr_grade"].fn is mrcr_grade and METRICS["mrcr"].fn is None  # mrcr: retired, old records only


REF = "1234567"
REFS4 = ["1234567", "7654321", "1111111", "2222222"]


@pytest.mark.parametrize("pred, refs, all_, part", [
    ("1234567", [REF], 1.0, 1.0),                                     # ordinary
    ("The special magic number is: **1234567**.", [REF], 1.0, 1.0),   # markdown, punctuation
    (UUID.upper(), [UUID], 1.0, 1.0),                                 # case-insensitive
    ("either 1234567 or 7654321, I think", [REF], 1.0, 1.0),          # hedged: RULER counts any substring
    ("91234567", [REF], 1.0, 1.0),                                    # a longer number contains it (RULER: 1)
    ("1,234,567", [REF], 0.0, 0.0),                                   # reformatted digits: 0
    ("1234 567", [REF], 0.0, 0.0),
    ("1234567, 7654321 and 9999999", REFS4, 0.5, 1.0),                # multi-answer: fraction / any
    ("none of them", REFS4, 0.0, 0.0),
])
def test_string_match_is_rulers(pred, refs, all_, part):
    """RULER's ``string_match_all`` / ``string_match_part`` (NVIDIA/RULER, scripts/eval/synthetic/constants.py,
    commit 4f6507ee054935417007791211b1f33e2fa2ab68): per sample ``sum(r.lower() in pred.lower()) / len(refs)``
    and ``max(...)``, on the prediction after ``postprocess_pred`` (scripts/eval/evaluate.py, same commit:
    strip, every character in [\\x00-\\x1f] to a newline, strip). With ``match="substring"`` lctx equals it;
    the stricter modes are lctx's and carry their own names (:func:`lctx.metrics.match_metric`)."""
    from lctx.metrics import postprocess_pred, string_match_all, string_match_part

    assert string_match_all(postprocess_pred(pred), refs) == all_
    assert string_match_part(postprocess_pred(pred), refs) == part
    assert postprocess_pred("\x00 1234\x0b567 \t") == "1234\n567"  # control characters inside: no match
    assert string_match_all(postprocess_pred("\x00 1234\x0b567 \t"), [REF]) == 0.0


def test_match_modes_are_not_recorded_under_rulers_names():
    """lctx's stricter ``digits`` / ``word`` matching differs from RULER's substring ("91234567" holds 1234567 for
    RULER): its scores carry their own registered names, never RULER's; substring keeps RULER's."""
    from lctx.metrics import match_metric, match_metrics

    assert match_metric("string_match_all", "substring") == "string_match_all"
    assert match_metric("string_match_all", "digits") == "string_match_all_digits"
    assert match_metrics(("string_match_part", "tf_top1"), "word") == ("string_match_part_word", "tf_top1")
    for name in ("string_match_all_digits", "string_match_all_word", "string_match_part_digits",
                 "string_match_part_word"):
        m = METRICS[name]
        assert m.direction == "higher" and m.bounds == (0.0, 1.0) and "Not RULER's" in m.doc
    assert METRICS["string_match_all_digits"].fn("91234567 and 1234567x", [REF]) == 1.0
    assert METRICS["string_match_all_digits"].fn("91234567", [REF]) == 0.0  # RULER's substring: 1.0
    assert METRICS["string_match_part_word"].fn("x1234567", [REF]) == 0.0
    with pytest.raises(ValueError, match="unknown match mode"):
        match_metric("string_match_all", "fuzzy")


def test_lmeval_acc_is_lmevals_own_per_sample_value():
    """lm-eval's ``acc`` / ``acc_norm`` (EleutherAI/lm-evaluation-harness 0.4.13, lm_eval/api/task.py
    ``ConfigurableTask.process_results``, ``multiple_choice``): lctx takes each sample's values from lm-eval's
    ``log_samples`` as they are, never recomputing them, so they equal lm-eval's by construction; lctx's own
    ``pred`` (argmax of the log-likelihoods) is only a record column. Here lm-eval's value disagrees with that
    argmax on purpose and is still the one recorded."""
    from lctx.tasks.lmeval import LmEvalSpec, sample_records

    spec = LmEvalSpec("arc_easy", None, "arc_easy")
    doc = {"choices": {"label": ["A", "B"], "text": ["yes", "no way"]}}
    s = {"doc_id": 3, "doc": doc, "target": 1, "filtered_resps": [(-1.0, False), (-2.0, False)],
         "arguments": [("Q:", " yes"), ("Q:", " no way")], "acc": 1.0, "acc_norm": 0.0}
    (rec,) = sample_records(spec, [s])
    assert rec["metrics"] == {"acc": 1.0, "acc_norm": 0.0} and rec["extra"]["pred"] == "A"
