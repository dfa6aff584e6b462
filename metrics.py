"""The metrics registry: every metric an lctx record or derived row can carry, by name (:data:`METRICS`), with
which way is better and its source; the per-sample function where lctx computes it (the tasks call these).
``lctx list metrics`` prints it; ``lctx compare`` takes its directions from it (:mod:`lctx.harness.outputs.compare`).

A leaf of the package root (it imports only :mod:`lctx.registry` and the standard library), so every layer
and the light commands (``compare``, ``list``) may read it without importing torch. A task of one's own may
report a metric that is not registered (the report and compare then go by its name); register it with
:func:`register_metric` to give it a direction and a line in ``lctx list metrics``.
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
import string
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from lctx.registry import Registry

DIRECTIONS = ("higher", "lower", "equal")


@dataclass(frozen=True)
class Metric:
    """One registered metric: ``name`` (the record's metric name), ``direction`` (``higher`` / ``lower`` is
    better; ``equal``: bookkeeping that must not change between runs of the same inputs), ``doc`` (what it is,
    its unit and its source: paper, reference repository file), ``fn``: the per-sample function lctx computes
    it with (``None`` where another engine computes it, e.g. lm-eval's ``acc``, or a derived step does);
    ``teacher_forced``: scored on the expected answer fed after the prompt, not on what the model generates
    (passkey ``digit_acc``, NIAH ``tf_*``): it can be 1.0 where greedy decoding fails (:func:`label`);
    ``bounds``: the (low, high) range every value lies in (0..1 scores), or None: the tables clip a mean's t
    interval to it (:func:`bounds_of`)."""

    name: str
    direction: str
    doc: str
    fn: Optional[Callable] = None
    teacher_forced: bool = False
    bounds: Optional[tuple] = None

    @property
    def summary(self) -> str:
        """The first paragraph of ``doc`` on one line."""
        return " ".join(inspect.cleandoc(self.doc).split("\n\n")[0].split())


METRICS: Registry[Metric] = Registry("metric")


def register_metric(name: str, direction: str, doc: str, fn: Optional[Callable] = None,
                    teacher_forced: bool = False, bounds: Optional[tuple] = None) -> Metric:
    """Register metric ``name``: its direction, its doc (what, unit, source), its per-sample function
    (``None`` when another engine or a derived step computes it) and whether it is teacher-forced
    (:attr:`Metric.teacher_forced`); returns its :class:`Metric`.

    Raises:
        ValueError: an unknown ``direction``, an empty name or one already registered.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"metric {name!r}: direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    return METRICS.add(name, Metric(name, direction, inspect.cleandoc(doc), fn, teacher_forced,
                                    None if bounds is None else (float(bounds[0]), float(bounds[1]))))


def metric(name: str, direction: str, teacher_forced: bool = False,
           bounds: Optional[tuple] = None) -> Callable[[Callable], Callable]:
    """Decorator: register the decorated per-sample function as metric ``name`` (its docstring is the doc;
    ``teacher_forced`` and ``bounds`` as :func:`register_metric`); returns the function unchanged.

    Raises:
        ValueError: as :func:`register_metric`.
    """

    def deco(fn: Callable) -> Callable:
        register_metric(name, direction, fn.__doc__ or name, fn, teacher_forced, bounds)
        return fn

    return deco


#: What :func:`label` adds to a teacher-forced metric's name wherever it is shown.
TEACHER_FORCED = "teacher-forced"


def is_teacher_forced(name: str) -> bool:
    """Whether metric ``name`` is registered as teacher-forced (:attr:`Metric.teacher_forced`)."""
    m = METRICS.get(str(name).split(",", 1)[0])
    return bool(m and m.teacher_forced)


def label(name: str, text: Optional[str] = None) -> str:
    """How metric ``name`` is shown (tables, plot titles, the report): ``text`` (default the name), with
    `` (teacher-forced)`` after it when the metric is teacher-forced, e.g. ``digit_acc (teacher-forced)``,
    ``Digit accuracy (teacher-forced)``; a reader must not take it for what the model generates."""
    text = str(name) if text is None else text
    return f"{text} ({TEACHER_FORCED})" if is_teacher_forced(name) and TEACHER_FORCED not in text.lower() else text


def bounds_of(name: str) -> Optional[tuple]:
    """The registered (low, high) range of metric ``name`` (an lm-eval ``",filter"`` suffix dropped), or None."""
    m = METRICS.get(str(name).split(",", 1)[0])
    return m.bounds if m else None


def may_be_proportion(name: str) -> bool:
    """Whether a cell of metric ``name`` whose values are all 0 or 1 is a proportion (a Wilson interval): a metric
    registered with bounds (0, 1), or one lctx does not register (a custom task's, judged by its values); not a
    registered metric of another range (ppl_ratio 1.0 at the training length, n_docs 1)."""
    m = METRICS.get(str(name).split(",", 1)[0])
    return m is None or m.bounds == (0.0, 1.0)


def direction_of(name: str) -> Optional[str]:
    """The registered direction of metric ``name`` (an lm-eval ``",filter"`` suffix dropped), or None."""
    m = METRICS.get(name.split(",", 1)[0])
    return m.direction if m else None


# --- passkey ----------------------------------------------------------------------------------------
@metric("exact", "higher", bounds=(0, 1))
def exact(answer: Optional[str], key: str) -> float:
    """lctx's exact match: 1.0 when the answer parsed from the greedy continuation equals the expected one as a
    string, else 0.0. passkey parses the first run of digits (the passkey retrieval task of Mohtashami & Jaggi
    2023, "Landmark Attention", appendix); babi_qa* the first run of letters, lower-cased.

    Not an anchor's scorer: Landmark Attention's ``llama/run_test.py`` (epfml/landmark-attention) compares
    ``int()`` of the first digit run with the key, so it also counts "048213" or non-ASCII digits for 48213;
    BABILong's label match is ``babilong_match``.

    ``answer``: the parsed answer (None when the continuation has none); ``key``: the expected answer."""
    return float(answer == key)


@metric("digit_acc", "higher", teacher_forced=True, bounds=(0, 1))
def digit_acc(top1: Sequence[bool]) -> float:
    """Teacher-forced digit accuracy (lctx's, for models too small to generate the key): the fraction of the
    key's digit-bearing tokens, fed after the prompt, that the model ranks first. Each token is scored after
    the true tokens before it (a leading space token included, not scored), so it can be 1.0 where the greedy
    continuation fails (``exact`` 0), e.g. one that starts with words instead of the key.

    ``top1``: per digit token,
    whether it was the argmax; NaN for none."""
    return float(sum(bool(t) for t in top1) / len(top1)) if len(top1) else math.nan


# --- RULER (NVIDIA/RULER, scripts/eval/synthetic/constants.py and scripts/eval/evaluate.py) -------------
MATCH_MODES = ("substring", "digits", "word")
_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_pred(text: str) -> str:
    """RULER's ``postprocess_pred`` (scripts/eval/evaluate.py): strip, control characters -> newline, strip."""
    return _CONTROL.sub("\n", text.strip()).strip()


def value_found(pred: str, value: str, match: str = "substring") -> bool:
    """Whether ``value`` occurs in ``pred``, case-insensitive.

    match: ``substring`` (RULER: plain ``in``), ``digits`` (not preceded or followed by a digit: 1234567
    is not found in "91234567" nor in "12345678") or ``word`` (not touching a letter, digit or underscore).

    Raises:
        ValueError: unknown mode.
    """
    p, v = pred.lower(), value.lower()
    if match == "substring":
        return v in p
    if match == "digits":
        return re.search(r"(?<!\d)" + re.escape(v) + r"(?!\d)", p) is not None
    if match == "word":
        return re.search(r"(?<!\w)" + re.escape(v) + r"(?!\w)", p) is not None
    raise ValueError(f"unknown match mode {match!r}; use one of {', '.join(MATCH_MODES)}")


@metric("string_match_all", "higher", bounds=(0, 1))
def string_match_all(pred: str, refs: list[str], match: str = "substring") -> float:
    """RULER's ``string_match_all`` for one sample (scripts/eval/synthetic/constants.py): the fraction of
    ``refs`` found in ``pred`` (0..1; RULER reports x100 averaged over samples), each ``r.lower() in
    pred.lower()``, on the prediction after RULER's ``postprocess_pred``. RULER's only with ``match="substring"``
    (the default); the stricter modes are lctx's and are recorded as ``string_match_all_digits`` /
    ``string_match_all_word`` (:func:`match_metric`)."""
    return sum(value_found(pred, r, match) for r in refs) / len(refs)


@metric("string_match_part", "higher", bounds=(0, 1))
def string_match_part(pred: str, refs: list[str], match: str = "substring") -> float:
    """RULER's ``string_match_part`` for one sample (scripts/eval/synthetic/constants.py): 1.0 if any of
    ``refs`` is found in ``pred`` (case-insensitive substring), else 0.0. RULER's only with
    ``match="substring"``; the stricter modes are recorded as ``string_match_part_digits`` /
    ``string_match_part_word`` (:func:`match_metric`)."""
    return float(max(value_found(pred, r, match) for r in refs))


#: RULER's metrics that take a ``match`` mode (:func:`match_metric`).
RULER_MATCH_METRICS = ("string_match_all", "string_match_part")


def match_metric(name: str, match: str) -> str:
    """The name a RULER metric scored with match mode ``match`` is recorded under: ``name`` itself for
    ``substring`` (RULER's own scorer), ``{name}_{match}`` for lctx's stricter ``digits`` / ``word`` (not
    RULER's numbers, so not under RULER's name); any other metric name unchanged.

    Raises:
        ValueError: an unknown match mode.
    """
    if match not in MATCH_MODES:
        raise ValueError(f"unknown match mode {match!r}; use one of {', '.join(MATCH_MODES)}")
    return name if match == "substring" or name not in RULER_MATCH_METRICS else f"{name}_{match}"


def match_metrics(names, match: str) -> Optional[tuple]:
    """:func:`match_metric` of each of ``names`` (a tuple; None stays None)."""
    return None if names is None else tuple(match_metric(str(n), match) for n in names)


def _register_match_variants() -> None:
    """Register ``string_match_{all,part}_{digits,word}``: lctx's stricter matching under names of their own."""
    what = {"digits": "the value must not touch another digit (1234567 is not found in 91234567 nor in 12345678)",
            "word": "the value must not touch a letter, digit or underscore"}
    for base, fn in (("string_match_all", string_match_all), ("string_match_part", string_match_part)):
        for mode in ("digits", "word"):
            def score(pred: str, refs: list[str], _fn=fn, _mode=mode) -> float:
                return _fn(pred, refs, _mode)

            register_metric(match_metric(base, mode), "higher", bounds=(0, 1), fn=score, doc=f"""lctx's stricter
                variant of RULER's ``{base}`` (``--task-option TASK.match={mode}``): the same fraction / any-of
                rule, case-insensitive, but {what[mode]}. Not RULER's scorer, so not under its name: it does not
                enter RULER's average.""")


_register_match_variants()


# --- HELMET (princeton-nlp/HELMET, utils.py and data.py) -------------------------------------------------
_ASCII_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def helmet_normalize_answer(s: str) -> str:
    """HELMET's ``normalize_answer`` (utils.py, from DensePhrases / the SQuAD script): lower-case, drop every
    ASCII punctuation character (``string.punctuation``), replace the whole words a / an / the by a space,
    collapse whitespace (``" ".join(s.split())``). Returns the normalised text."""
    s = "".join(ch for ch in s.lower() if ch not in _ASCII_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def helmet_parse_output(output: str, prefix: str = "Answer:") -> Optional[str]:
    """HELMET's ``parse_output`` (utils.py): the rest of the first line after ``prefix`` (a regular expression,
    case-insensitive, as HELMET writes it unescaped), else the first line; stripped, with a repeated ``prefix``
    at its start removed (escaped there, as HELMET's ``lstrip_string``). None only if neither pattern matches
    (the second always does)."""
    patterns = [re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")]
    for pat in patterns:
        m = pat.search(output)
        if m is not None:
            return re.sub(f"^{re.escape(prefix)}", "", m[1].strip(), flags=re.IGNORECASE).strip()
    return None


def _ground_truths(answers) -> list[str]:
    """HELMET's ``drqa_metric_max_over_ground_truths`` flattening: a string, a list, or a list of lists."""
    if isinstance(answers, str):
        return [answers]
    answers = list(answers)
    if answers and isinstance(answers[0], list):
        return [a for group in answers for a in group]
    return answers


def helmet_substring_exact_match(prediction: str, answers) -> float:
    """HELMET's ``substring_exact_match`` of one prediction (utils.py ``calculate_metrics``): 1.0 when, for any
    of ``answers`` (a string, a list, or a list of lists), ``normalize_answer(answer) in
    normalize_answer(prediction)`` (:func:`helmet_normalize_answer`), else 0.0."""
    pred = helmet_normalize_answer(prediction)
    return float(max(helmet_normalize_answer(a) in pred for a in _ground_truths(answers)))


#: HELMET's json_kv answer prefix, as its ``post_process`` parses the output (data.py ``load_json_kv``).
HELMET_JSON_KV_PREFIX = "corresponding value:"


@metric("substring_exact_match", "higher", bounds=(0, 1))
def substring_exact_match(output: str, answers, prefix: str = HELMET_JSON_KV_PREFIX) -> float:
    """HELMET's ``substring_exact_match`` as its json_kv task scores a generation (princeton-nlp/HELMET,
    data.py ``load_json_kv``'s ``post_process``; utils.py ``normalize_answer``, ``parse_output``,
    ``calculate_metrics``): the larger of :func:`helmet_substring_exact_match` on the raw output and on the
    output parsed after ``prefix`` (:func:`helmet_parse_output`). Normalisation: lower case, ASCII punctuation
    removed (a uuid's hyphens too: "3f2b...9f01" written without them counts), articles removed, whitespace
    collapsed. ``output``: the generated text as decoded (no other post-processing); ``answers``: the expected
    value(s). 0..1."""
    score = helmet_substring_exact_match(output, answers)
    parsed = helmet_parse_output(output, prefix)
    return max(score, helmet_substring_exact_match(parsed, answers)) if parsed is not None else score


# --- BABILong (booydar/babilong, babilong/metrics.py) ------------------------------------------------------
def babilong_preprocess_output(output: str) -> str:
    """BABILong's ``preprocess_output`` (babilong/metrics.py): lower-case, keep the text before the first ".",
    then before ``<context>``, ``<example>`` and ``Question`` (that last split never cuts, the text being lower
    case already: kept as BABILong has it)."""
    output = output.lower().split(".")[0]
    for cut in ("<context>", "<example>", "Question"):
        output = output.split(cut)[0]
    return output


def babilong_compare_answers(target: str, output: str, question: str, task_labels: Sequence[str]) -> bool:
    """BABILong's ``compare_answers`` (babilong/metrics.py): the labels of the task's vocabulary ``task_labels``
    that occur (plain substring, lower case) in the preprocessed output (:func:`babilong_preprocess_output`),
    less those that occur in ``question``, must be exactly the target: the one label, or for a target of
    several comma-separated labels longer than 3 characters (qa8's "apple,football"), all of them and no
    other. True when they are."""
    output = babilong_preprocess_output(output)
    target = target.lower()
    labels = {label.lower() for label in task_labels}
    in_question = {label for label in labels if label in question.lower()}
    in_output = {label for label in labels if label in output} - in_question
    if "," in target and len(target) > 3:
        subtargets = target.split(",")
        return all(t in in_output for t in subtargets) and len(in_output) == len(subtargets)
    return target in in_output and len(in_output) == 1


@metric("babilong_match", "higher", bounds=(0, 1))
def babilong_match(output: str, target: str, question: str, task_labels: Sequence[str]) -> float:
    """BABILong's label match for one sample (booydar/babilong, babilong/metrics.py ``compare_answers``, with
    the task's label vocabulary ``TASK_LABELS``; its accuracy is the mean): 1.0 when the answer names exactly
    the target among the task's labels (first sentence only, case-insensitive substring, labels named in the
    question not counted), else 0.0. A hedged answer that names two rooms scores 0; "the kitchen" scores 1."""
    return float(babilong_compare_answers(target, output, question, task_labels))


@metric("mrcr_grade", "higher", bounds=(0, 1))
def mrcr_grade(response: str, answer: str, prefix: str) -> float:
    """OpenAI MRCR's ``grade`` for one sample (the openai/mrcr dataset card, README.md at 204b0d4, as HELM's
    ``OpenAIMRCRMetric`` cites it), character for character: 0 unless the response starts with the random string
    it was asked to prepend (case- and whitespace-sensitive: a leading space or newline scores 0); then the
    ``difflib.SequenceMatcher(None, response, answer).ratio()`` (0..1) of the response and the expected answer,
    each with that string removed from its start (``str.removeprefix``: MRCR's answers carry it, lctx's do not;
    either gives the same score)."""
    if not response.startswith(prefix):
        return 0.0
    return float(difflib.SequenceMatcher(None, response.removeprefix(prefix), answer.removeprefix(prefix)).ratio())


@metric("mrcr_stripped", "higher", bounds=(0, 1))
def mrcr_stripped(response: str, answer: str, prefix: str) -> float:
    """lctx's variant of MRCR's grade (:func:`mrcr_grade`) on the response with its leading whitespace removed
    first: a continuation may start with a space or newline that a tokenizer puts before the first word, which
    MRCR's grade scores 0. Equal to ``mrcr_grade`` whenever the response starts without whitespace. (This is what
    lctx recorded as ``mrcr`` before the rename.)"""
    return mrcr_grade(response.lstrip(), answer, prefix)


register_metric("mrcr", "higher", bounds=(0, 1), doc="""Retired name, kept so that run directories written
    before the rename still read: what is now ``mrcr_stripped`` (MRCR's grade after the response's leading whitespace
    is removed), which is not MRCR's own ``grade``. New runs record ``mrcr_grade`` (MRCR's) and ``mrcr_stripped``.""")


@metric("sequence_ratio", "higher", bounds=(0, 1))
def sequence_ratio(response: str, answer: str, prefix: str = "") -> float:
    """lctx's lenient companion of ``mrcr_grade``: the ``difflib.SequenceMatcher`` ratio (0..1) of the response (leading
    whitespace and, when present, the prefix removed) and the expected answer, whether or not the prefix was
    written: how much of the right earlier answer a model reproduces when it ignores the instruction."""
    response = response.lstrip()
    if prefix and response.startswith(prefix):
        response = response[len(prefix):]
    return float(difflib.SequenceMatcher(None, response, answer).ratio())


# --- NIAH teacher-forced scores (lctx's; the expected values fed after the prompt) ------------------
@metric("tf_top1", "higher", teacher_forced=True, bounds=(0, 1))
def tf_top1(ranks: Sequence[int]) -> float:
    """Teacher-forced top-1 (lctx's NIAH score): the fraction of the expected values' tokens, fed after the
    prompt, that the model ranks first.

    ``ranks``: 1-based rank of each token; NaN for none."""
    return sum(r == 1 for r in ranks) / len(ranks) if len(ranks) else math.nan


@metric("tf_mrr", "higher", teacher_forced=True, bounds=(0, 1))
def tf_mrr(ranks: Sequence[int]) -> float:
    """Teacher-forced mean reciprocal rank (lctx's NIAH score) of the expected values' tokens (0..1); NaN for
    none."""
    return sum(1.0 / r for r in ranks) / len(ranks) if len(ranks) else math.nan


@metric("tf_logprob", "higher", teacher_forced=True)
def tf_logprob(logps: Sequence[float]) -> float:
    """Teacher-forced mean log-probability (nats per token, <= 0; lctx's NIAH score) of the expected values'
    tokens; NaN for none."""
    return sum(logps) / len(logps) if len(logps) else math.nan


@metric("tf_gain", "higher", teacher_forced=True)
def tf_gain(logps: Sequence[float], control_mean: float) -> float:
    """Teacher-forced gain (nats per token; lctx's NIAH score): :func:`tf_logprob` of the expected values minus
    the same score of a control value of the same kind absent from the prompt (``control_mean``): what the
    context adds beyond the prior of the value; NaN for none."""
    return tf_logprob(logps) - control_mean if len(logps) else math.nan


# --- perplexity -------------------------------------------------------------------------------------
register_metric("nll", "lower", """Mean negative log-likelihood, nats per scored token, of a corpus under
    sliding windows (window = the length, stride a fraction of it; each token scored once with up to a window
    of context: the Hugging Face "Perplexity of fixed-length models" recipe).""")


@metric("ppl", "lower")
def ppl(nll: float) -> float:
    """Perplexity exp(nll) from the mean negative log-likelihood ``nll`` (nats per token)."""
    return math.exp(nll)


register_metric("n_tokens", "equal", "Tokens scored by a ppl record (bookkeeping: the same inputs score the same count).")
register_metric("n_docs", "equal", "Documents read by a ppl record (bookkeeping: the same inputs read the same count).")

# --- lm-eval (computed by lm-eval's evaluator, lctx.tasks.lmeval) ------------------------------------
register_metric("acc", "higher", bounds=(0, 1), doc="""Multiple-choice accuracy as lm-eval computes it (``Task.process_results``
    for ``multiple_choice``): 1 when the choice with the largest summed log-likelihood is the gold one (MMLU,
    Hendrycks et al. 2021; ARC, Clark et al. 2018).""")
register_metric("acc_norm", "higher", bounds=(0, 1), doc="""lm-eval's length-normalised multiple-choice accuracy: the argmax of
    each choice's log-likelihood divided by its length in characters (ARC).""")

# --- derived steps (lctx.harness.steps.flatness, lctx.harness.steps.ruler) ---------------------------------------
register_metric("ppl_ratio", "lower", """Flatness (lctx.harness.steps.flatness): PPL(L) / PPL(T), ppl at length L over
    ppl at the training length T (seed 004 reports RoPE 16.2x at 16T and ALiBi 0.96x at 128T).""")
register_metric("ppl_ratio_low", "lower", """Flatness: the low end of ppl_ratio's 95 % interval, where the ppl task scored
    several windows per length (its ``windows`` option): exp(nll(L) - nll(T) - 1.96 se), se over the windows.""")
register_metric("ppl_ratio_high", "lower", """Flatness: the high end of ppl_ratio's 95 % interval (see ppl_ratio_low).""")
register_metric("flat_until", "higher", """Flatness (lctx.harness.steps.flatness): the largest length L >= T (tokens)
    such that every tested length in [T, L] has ppl_ratio <= max_ratio (default 1.1; seed 002 calls a model
    "flat" to 3.5T).""")
register_metric("effective_length", "higher", """RULER's "effective length" (Hsieh et al. 2024, section 4): the
    largest tested length (tokens) such that the score is >= a threshold at every tested length up to it. The
    flatness step scores the retrieval task's mean (threshold 0.8, lctx.harness.steps.flatness); the ruler group
    scores RULER's average (threshold 85.6, Llama-2-7B's RULER score at 4K, lctx.harness.steps.ruler).""")
register_metric("average", "higher", """RULER's average at a length, in percent (Hsieh et al. 2024, section 4
    and Table 3): the mean over its tasks of each task's score (string_match_all for NIAH, vt, cwe, fwe;
    string_match_part for QA), every task weighing the same (lctx.harness.steps.ruler).""")
