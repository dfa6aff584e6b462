"""RULER needle-in-a-haystack: the eight NIAH tasks of RULER (Hsieh et al. 2024, "RULER: What's the Real
Context Size of Your Long-Context Language Models?", section 3.1; reference code NVIDIA/RULER,
``scripts/data/synthetic/niah.py``, ``scripts/data/synthetic/constants.py``, ``scripts/synthetic.yaml`` and
``scripts/eval/synthetic/constants.py``).

What is RULER's (copied verbatim, checked against the reference in ``tests/test_niah.py``):

* the needle "One of the special magic {type_needle_v} for {key} is: {value}." (type always plural);
* the haystacks: ``noise`` (the block "The grass is green. ... There and back again." repeated, one per
  line), ``essay`` (the Paul Graham essays, whitespace collapsed, cut to a number of words and repeated
  when a length needs more) and ``needle`` (distractor needles with random keys and values, one per line);
* keys: adjective-noun words from the wonderwords lists, 7-digit numbers or uuid4s; values: 7-digit
  numbers (first digit non-zero) or uuids;
* the template and answer prefix (base-model template ``{task_template}`` + answer prefix, as
  ``prepare.py`` joins them; with ``--chat-template on`` the task template is the user's turn of the
  model's own chat template and the answer prefix starts the assistant's turn, as RULER's chat templates
  do, through ``HFAdapter.prompt``), made singular exactly as RULER does when one value is asked for
  ('Some' -> 'A', 'are all' -> 'is', 'are' -> 'is', 'answers' -> 'answer', type without its "s");
  several queried keys are joined "a, b, and c";
* the task configurations of ``synthetic.yaml`` (:data:`RULER_CONFIGS`);
* scoring: ``string_match_all`` (fraction of expected values found in the prediction) and
  ``string_match_part`` (1 if any is found), case-insensitive, after RULER's ``postprocess_pred``
  (strip; control characters -> newline).

What lctx does differently:

* depth is a grid axis: the queried needle goes to the allowed boundary (a line of the noise/needle
  haystacks, a sentence boundary of the essay) whose character offset in the haystack is nearest to
  ``depth`` x haystack length (an essay whose nearest sentence boundary is more than 5% of the haystack
  away, e.g. text without sentence ends, falls back to the nearest word boundary); the other needles of
  multi-needle tasks are spread at ``(depth + i/N) mod 1``, i = 1..N-1. RULER draws random depths instead.
  The actual depth (fraction of the prompt tokens before the queried needle) and the token count are
  recorded per sample, and the table flags (``depth_off``) a sample more than 0.05 from its depth;
* exact budgeting: the haystack size (units: noise blocks, distractor needles, essay words) is the
  largest n with ``len([BOS] + prompt(n)) + max_new_tokens <= length``, so the total is within one
  haystack unit of the length (RULER steps by 5..500 units);
* the default generation budget is the tokens of the expected answer + 8 (RULER reserves 128 for chat
  models; set ``max_new_tokens=128`` to match it; the ``ruler`` group does, :mod:`lctx.harness.steps.ruler`);
* generation is seeded per (task, seed, length, depth, sample) and cached to disk (see :class:`RulerNIAH`);
* essay sentences are split by a punctuation + capital-letter rule (:func:`sentence_start_words`; RULER uses
  ``nltk.sent_tokenize``, whose Punkt model is a download); the essay always starts at its first word, as
  in RULER;
* word keys are an adjective and a noun drawn independently (uniform over the pairs; RULER draws from the
  sorted set of all pairs, which is the same distribution up to a handful of duplicate strings);
* matching has a named ``match`` mode: ``substring`` (RULER), ``digits`` (the value must not touch another
  digit, so 1234567 does not match inside 91234567) or ``word`` (no letter/digit/underscore on either side);
* a teacher-forced score so that tiny models show a signal: each expected value, as " value" with the
  tokens it has in context (prompt + value encoded together, the tail taken, as lm-eval's ``_encode_pair``),
  is scored right after the prompt (which ends with the answer prefix), through the prompt's KV cache: ``tf_top1`` (fraction of its tokens the model
  ranks first), ``tf_mrr`` (mean reciprocal rank of those tokens), ``tf_logprob`` (mean log-probability
  per token, nats) and ``tf_gain`` (``tf_logprob`` minus the same score of a control value of the same
  type that is nowhere in the prompt, nats per token: above 0 when the model prefers the value the context
  holds over an equally formatted one, i.e. retrieval rather than a prior over numbers). Tokens that
  decode to whitespace only are left out.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from lctx.errors import LctxError
from lctx.metrics import (MATCH_MODES, match_metric, match_metrics, postprocess_pred, string_match_all,  # noqa: F401
                          string_match_part, tf_gain, tf_logprob, tf_mrr, tf_top1, value_found)

from .base import DECODE_STEP_TOKENS, Cell, Sample, Task, budget_bound, optional_metrics, register_task
from .textdata import MAX_TEXT_BYTES, check_file_size


def use_match_names(task: Task, match: str) -> None:
    """Give ``task`` (a RULER task object) the metric names of match mode ``match``
    (:func:`lctx.metrics.match_metric`): RULER's ``string_match_all`` / ``string_match_part`` for ``substring``;
    for lctx's stricter ``digits`` / ``word`` their own names (``string_match_all_digits``, ...) in ``metrics``,
    ``headline_metric`` and ``heatmap_metrics``, and task version 2, so that a run directory's records of that
    mode made before the rename (under RULER's names) are not resumed beside the renamed ones."""
    if match == "substring":
        return
    cls = type(task)
    task.metrics = match_metrics(cls.metrics, match)
    task.headline_metric = match_metric(cls.headline(), match)
    task.heatmap_metrics = match_metrics(cls.heatmap_metrics, match)
    task.version = 2


def content_key(*paths: str | os.PathLike) -> tuple[str, ...]:
    """The SHA-256 of each file: :func:`lctx.models.fingerprint.content_key`, imported on first use, since
    importing :mod:`lctx.models` loads torch and registers with transformers, which ``lctx list tasks`` must
    not pay for (``tests/test_startup.py``).

    Raises:
        LctxError: a file is missing or unreadable.
    """
    from lctx.models.fingerprint import content_key as key  # lazy: loads torch and transformers (lctx.models)

    return key(*paths)

# --- RULER's text, verbatim -----------------------------------------------------------------------
#: scripts/data/synthetic/constants.py, TASKS["niah"]["template"]
RULER_TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
                  "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
                  "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?")
#: scripts/data/synthetic/constants.py, TASKS["niah"]["answer_prefix"]
RULER_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
#: scripts/data/synthetic/constants.py, TASKS["niah"]["tokens_to_generate"]
RULER_TOKENS_TO_GENERATE = 128
#: scripts/data/synthetic/niah.py, ``needle``
RULER_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
#: scripts/data/synthetic/niah.py, the ``noise`` haystack (called ``repeat`` in early versions)
RULER_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

ESSAY_FILE = "ruler/PaulGrahamEssays.json"
NOUN_FILE = "ruler/wonderwords/nounlist.txt"
ADJ_FILE = "ruler/wonderwords/adjectivelist.txt"

METRICS = ("string_match_all", "string_match_part", "tf_top1", "tf_mrr", "tf_logprob", "tf_gain")
#: the metrics of :data:`METRICS` scored teacher-forced (unavailable together where the model gives no log-probs)
TEACHER_FORCED_METRICS = METRICS[2:]
GENERATOR_VERSION = 3  # bump when the prompt construction changes: old cache entries stop matching
#: an essay needle goes to the nearest sentence boundary unless that is farther than this fraction of the
#: haystack from the requested depth; then to the nearest word boundary (a haystack without sentences)
BOUNDARY_TOLERANCE = 0.05


@dataclass(frozen=True)
class NIAHConfig:
    """One RULER NIAH configuration (the ``args`` of a ``synthetic.yaml`` entry).

    type_haystack: ``noise`` | ``essay`` | ``needle``; type_needle_k / type_needle_v: ``words`` |
    ``numbers`` | ``uuids``; num_needle_k keys (RULER raises it to num_needle_q), num_needle_v values per
    key, num_needle_q queried keys.
    """

    type_haystack: str
    type_needle_k: str
    type_needle_v: str
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1


#: scripts/synthetic.yaml (NVIDIA/RULER): the eight NIAH tasks.
RULER_CONFIGS: dict[str, NIAHConfig] = {
    "niah_single_1": NIAHConfig("noise", "words", "numbers"),
    "niah_single_2": NIAHConfig("essay", "words", "numbers"),
    "niah_single_3": NIAHConfig("essay", "words", "uuids"),
    "niah_multikey_1": NIAHConfig("essay", "words", "numbers", num_needle_k=4),
    "niah_multikey_2": NIAHConfig("needle", "words", "numbers"),
    "niah_multikey_3": NIAHConfig("needle", "uuids", "uuids"),
    "niah_multivalue": NIAHConfig("essay", "words", "numbers", num_needle_v=4),
    "niah_multiquery": NIAHConfig("essay", "words", "numbers", num_needle_q=4),
}


def ruler_template(type_needle_v: str, n_asked: int) -> tuple[str, str]:
    """RULER's prompt template (template + answer prefix, as ``prepare.py`` joins them) and the value type
    word, made singular when ``n_asked`` (queried keys x values per key) is 1, exactly as ``niah.py`` does.

    Returns (template with ``{type_needle_v}``, ``{context}``, ``{query}`` fields, type word to put in it).
    """
    template = RULER_TEMPLATE + RULER_ANSWER_PREFIX
    if n_asked == 1:
        template = template.replace("Some", "A")
        template = template.replace("are all", "is")
        template = template.replace("are", "is")
        template = template.replace("answers", "answer")
        type_needle_v = type_needle_v[:-1]  # remove "s"
    return template, type_needle_v


def ruler_template_prefix(type_needle_v: str, n_asked: int) -> tuple[str, str]:
    """RULER's answer prefix alone, made singular as :func:`ruler_template` makes the whole template (the
    replacements match nothing across the template/prefix boundary, so the pieces join to that template)."""
    prefix = RULER_ANSWER_PREFIX
    if n_asked == 1:
        for a, b in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            prefix = prefix.replace(a, b)
        type_needle_v = type_needle_v[:-1]
    return prefix, type_needle_v


def join_queries(queries: list[str]) -> str:
    """RULER's query phrase: "a" or "a, b, and c"."""
    return ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]


# scoring: RULER's postprocess_pred, string_match_all / string_match_part and the teacher-forced scores are
# registered metrics (lctx.metrics), imported above


# --- data -------------------------------------------------------------------------------------------
def resolve_data_dir(data_dir: str | os.PathLike | None, task: str) -> Path:
    """The data root: ``data_dir`` or ``$LCTX_DATA_DIR``.

    Raises:
        LctxError: neither is set, or it is not a directory.
    """
    raw = data_dir if data_dir not in (None, "") else os.environ.get("LCTX_DATA_DIR")
    if not raw:
        raise LctxError(f"task {task!r} needs RULER's data (ruler/PaulGrahamEssays.json, ruler/wonderwords/); "
                        "pass --data-dir DIR or set LCTX_DATA_DIR (e.g. ../shared/data; `lctx data --out DIR` fetches it)")
    p = Path(raw)
    if not p.is_dir():
        raise LctxError(f"task {task!r}: data dir {str(p)!r} (--data-dir / LCTX_DATA_DIR) is not a directory; "
                        "point it at the folder holding ruler/PaulGrahamEssays.json (`lctx data --out DIR` fetches it)")
    return p


def _file_digest(path: str) -> str:
    """16 hex digits of SHA-1 of a file's bytes (the sample caches' data key), cached in memory by content
    (:func:`lctx.models.fingerprint.content_key`), never by path alone."""
    return _sha1(path, content_key(path))


@functools.lru_cache(maxsize=8)
def _sha1(path: str, content: tuple[str, ...]) -> str:
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:16]


def load_words(data_dir: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(adjectives, nouns) from RULER's wonderwords lists, read as wonderwords does (``readlines`` +
    ``rstrip``), deduplicated and sorted; cached in memory by the files' content."""
    return _load_words(data_dir, content_key(Path(data_dir) / ADJ_FILE, Path(data_dir) / NOUN_FILE))


@functools.lru_cache(maxsize=4)
def _load_words(data_dir: str, content: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    def read(rel):
        with open(Path(data_dir) / rel, encoding="utf-8") as f:
            return tuple(sorted({w.rstrip() for w in f.readlines()} - {""}))
    return read(ADJ_FILE), read(NOUN_FILE)


_SENT_END = re.compile(r"""[.?!]['"\u2019\u201d)\]]*$""")
_SENT_START = re.compile(r"""^['"\u2018\u201c(\[]*[A-Z0-9]""")
_INITIAL = re.compile(r"[A-Za-z]\.$")


def sentence_start_words(words: list[str]) -> np.ndarray:
    """Indices i > 0 of ``words`` that start a sentence: word i-1 ends with ``.``, ``?`` or ``!`` (closing
    quotes/brackets allowed) and is not a one-letter initial, and word i starts with a capital letter, a digit
    or an opening quote/bracket. A rule in the spirit of ``nltk.sent_tokenize`` (RULER's splitter; its
    Punkt model is a download lctx does without); on the first 40k essay words it finds 99% of the splits
    that NLTK's untrained Punkt finds, and misses mainly Punkt's false splits such as "e.g. at"."""
    return np.array([i for i in range(1, len(words))
                     if _SENT_END.search(words[i - 1]) and not _INITIAL.fullmatch(words[i - 1])
                     and _SENT_START.match(words[i])], dtype=np.int64)


class Essay:
    """RULER's essay haystack: the Paul Graham essays as whitespace-separated words, repeated without end.

    Word ``i`` is word ``i mod W`` of the essay (RULER: ``re.sub(r"\\s+", " ", essay).split(" ")``, empty
    strings dropped); :meth:`sentence_starts` gives the word indices where a sentence starts
    (:func:`sentence_start_words`; each new copy of the essay starts one).
    """

    def __init__(self, path: str | os.PathLike):
        text = json.loads(Path(path).read_text(encoding="utf-8"))["text"]
        self.words = [w for w in re.sub(r"\s+", " ", text).split(" ") if w]
        self.W = len(self.words)
        lens = np.fromiter((len(w) + 1 for w in self.words), dtype=np.int64, count=self.W)
        self._char_start = np.concatenate([[0], np.cumsum(lens)])  # char offset of word i in " ".join(words)
        self._starts = sentence_start_words(self.words)

    def sentence_starts(self, n: int) -> np.ndarray:
        """Word indices 0 < i < n at which a sentence starts in the first ``n`` words."""
        if n <= self.W:
            return self._starts[: int(np.searchsorted(self._starts, n))]
        reps = [self._starts + k * self.W for k in range(n // self.W + 1)]
        marks = np.arange(1, n // self.W + 1, dtype=np.int64) * self.W
        allb = np.unique(np.concatenate(reps + [marks]))
        return allb[(allb > 0) & (allb < n)]

    def text(self, a: int, b: int) -> str:
        """Words a..b-1 joined by single spaces."""
        if b <= self.W:
            return " ".join(self.words[a:b])
        return " ".join(self.words[i % self.W] for i in range(a, b))

    def char_offsets(self, idx: np.ndarray) -> np.ndarray:
        """Character offsets of words ``idx`` (int array) in the space-joined, repeated word stream."""
        k, r = np.divmod(np.asarray(idx, dtype=np.int64), self.W)
        return k * self._char_start[self.W] + self._char_start[r]


def load_essay(path: str) -> Essay:
    """The :class:`Essay` of a ``PaulGrahamEssays.json`` (cached in memory by the file's content)."""
    return _load_essay(path, content_key(path))


@functools.lru_cache(maxsize=2)
def _load_essay(path: str, content: tuple[str, ...]) -> Essay:
    return Essay(path)


def default_cache_dir() -> Path:
    """``$LCTX_CACHE_DIR`` or ``$XDG_CACHE_HOME/lctx/samples`` (``~/.cache/lctx/samples``)."""
    if os.environ.get("LCTX_CACHE_DIR"):
        return Path(os.environ["LCTX_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lctx" / "samples"


# --- sample construction ----------------------------------------------------------------------------
@dataclass
class _Needle:
    key: str
    value: str
    text: str
    depth: float  # requested depth in [0, 1]
    queried: bool


def data_files(config: NIAHConfig) -> list[str]:
    """The files a configuration reads under the data dir: the essays for an ``essay`` haystack, the
    wonderwords lists for ``words`` keys or values (none for ``niah_multikey_3``: uuids in a needle haystack)."""
    needed = [ESSAY_FILE] if config.type_haystack == "essay" else []
    if "words" in (config.type_needle_k, config.type_needle_v):
        needed += [ADJ_FILE, NOUN_FILE]
    return needed


class NIAHBuilder:
    """Builds one NIAH prompt for a given haystack size; :meth:`fit` finds the exact size for a length.

    Everything random (keys, values, which key is asked, the order of the other needles, the distractor
    needles of the ``needle`` haystack) is drawn from ``random.Random`` seeded with
    (task, seed, length, depth, sample), before the haystack is sized, so the size search never changes them.
    """

    def __init__(self, task: "RulerNIAH", lm, cell: Cell, seed: int):
        self.task, self.lm, self.cell, self.seed = task, lm, cell, seed
        cfg = task.config
        depth = 0.5 if cell.depth is None else float(cell.depth)
        self.depth = depth
        tag = f"lctx-niah|{task.name}|{seed}|{cell.length}|{depth:.6g}|{cell.sample}"
        rng = random.Random(tag)
        self._rng_hay = random.Random(tag + "|haystack")
        num_k = max(cfg.num_needle_k, cfg.num_needle_q)
        self.keys = self._distinct(rng, cfg.type_needle_k, num_k, set())
        used: set[str] = set(self.keys)
        self.values = [self._distinct(rng, cfg.type_needle_v, cfg.num_needle_v, used) for _ in self.keys]
        for vs in self.values:
            used.update(vs)
        q_idx = rng.sample(range(num_k), cfg.num_needle_q)
        self.queries = [self.keys[i] for i in q_idx]
        self.answers = [v for i in q_idx for v in self.values[i]]
        pairs = [(k, j) for k in range(num_k) for j in range(cfg.num_needle_v)]
        primary = (q_idx[0], 0)
        others = [p for p in pairs if p != primary]
        rng.shuffle(others)
        n = len(pairs)
        self.needles = []
        for i, (k, j) in enumerate([primary] + others):
            d = depth if i == 0 else (depth + i / n) % 1.0
            text = RULER_NEEDLE.format(type_needle_v=cfg.type_needle_v, key=self.keys[k], value=self.values[k][j])
            self.needles.append(_Needle(self.keys[k], self.values[k][j], text, d, k in q_idx))
        template, type_v = ruler_template(cfg.type_needle_v, cfg.num_needle_q * cfg.num_needle_v)
        query = join_queries(self.queries)
        head, tail = template.split("{context}")
        self.head = head.format(type_needle_v=type_v, query=query)
        tail = tail.format(type_needle_v=type_v, query=query)
        # the answer prefix (made singular with the template) starts the answer, or the assistant's turn
        # with the chat template on (lm.prompt); self.tail is the question that ends the user's text
        prefix, _ = ruler_template_prefix(cfg.type_needle_v, cfg.num_needle_q * cfg.num_needle_v)
        self.answer_prefix = prefix.format(type_needle_v=type_v, query=query)
        assert tail.endswith(self.answer_prefix), (tail, self.answer_prefix)
        self.tail = tail[: len(tail) - len(self.answer_prefix)]
        self.budget = (int(task.max_new_tokens) if task.max_new_tokens is not None
                       else len(lm.encode(" " + ", ".join(self.answers))) + 8)
        self._distractors: list[str] = []
        self._counts: dict[int, int] = {}

    # random draws, as RULER's generate_random_* --------------------------------------------------------
    def _draw(self, rng: random.Random, kind: str) -> str:
        if kind == "numbers":
            return str(rng.randint(10**6, 10**7 - 1))
        if kind == "uuids":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if kind == "words":
            adjs, nouns = self.task.words()
            return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
        raise ValueError(f"unknown needle type {kind!r}")

    def _distinct(self, rng: random.Random, kind: str, n: int, avoid: set[str]) -> list[str]:
        out: list[str] = []
        while len(out) < n:
            x = self._draw(rng, kind)
            if x not in avoid and x not in out:
                out.append(x)
        return out

    def _distractor(self, i: int) -> str:
        cfg = self.task.config
        taken = set(self.keys) | {v for vs in self.values for v in vs}
        while len(self._distractors) <= i:
            k = self._draw(self._rng_hay, cfg.type_needle_k)
            v = self._draw(self._rng_hay, cfg.type_needle_v)
            if k in taken or v in taken:
                continue
            self._distractors.append(RULER_NEEDLE.format(type_needle_v=cfg.type_needle_v, key=k, value=v))
        return self._distractors[i]

    def start_word(self, essay: "Essay") -> int:
        """The essay word the haystack starts at: 0 (RULER's; ``haystack_start=first``), or with
        ``haystack_start=random`` a sentence start drawn from (task, seed, length, depth, sample), so the samples
        of a cell read different windows of the essay (a shared haystack lets prefix caching and
        memorisation carry over between samples)."""
        if self.task.haystack_start != "random":
            return 0
        if not hasattr(self, "_start"):
            rng = random.Random(f"lctx-niah|{self.task.name}|{self.seed}|{self.cell.length}|{self.depth:.6g}|"
                                f"{self.cell.sample}|start")
            starts = essay.sentence_starts(essay.W)
            self._start = int(starts[rng.randrange(len(starts))]) if len(starts) else 0
        return self._start

    # the haystack of n units -----------------------------------------------------------------------------
    def _units(self, n: int) -> tuple[Callable[[int, int], str], str, np.ndarray, np.ndarray]:
        """(text of units a..b-1, joiner, allowed insertion indices, their char offsets, incl. n)."""
        kind = self.task.config.type_haystack
        if kind == "essay":
            essay = self.task.essay()
            s = self.start_word(essay)
            if s == 0:  # RULER's: every haystack starts at the essay's first word
                allowed = np.concatenate([[0], essay.sentence_starts(n), [n]]).astype(np.int64)
                allowed = np.unique(allowed)
                return essay.text, " ", allowed, essay.char_offsets(allowed)
            starts = essay.sentence_starts(s + n)
            rel = starts[starts > s] - s
            allowed = np.unique(np.concatenate([[0], rel, [n]]).astype(np.int64))
            offsets = essay.char_offsets(allowed + s) - essay.char_offsets(np.array([s]))[0]
            return (lambda a, b: essay.text(s + a, s + b)), " ", allowed, offsets
        if kind == "noise":
            allowed = np.arange(n + 1, dtype=np.int64)
            return (lambda a, b: "\n".join([RULER_NOISE] * (b - a))), "\n", allowed, allowed * (len(RULER_NOISE) + 1)
        if kind == "needle":
            for i in range(n):
                self._distractor(i)
            lens = np.array([len(self._distractors[i]) + 1 for i in range(n)], dtype=np.int64)
            allowed = np.arange(n + 1, dtype=np.int64)
            return (lambda a, b: "\n".join(self._distractors[a:b])), "\n", allowed, np.concatenate([[0], np.cumsum(lens)])
        raise ValueError(f"unknown haystack {kind!r}")

    def prompt(self, n: int) -> tuple[str, list[int], list[int]]:
        """The task's text with ``n`` haystack units (template head, haystack, question; the answer prefix
        is :attr:`answer_prefix`), the char offset of each needle in it (order of ``self.needles``; the
        first is the queried one) and the unit index each needle went in before."""
        text_of, joiner, allowed, offsets = self._units(n)
        total_chars = max(int(offsets[-1]), 1)
        where = []
        self.boundaries = []
        for nd in self.needles:
            target = nd.depth * total_chars
            j = int(np.argmin(np.abs(offsets - target)))  # first of equally near boundaries
            if (self.task.config.type_haystack == "essay"
                    and abs(int(offsets[j]) - target) > BOUNDARY_TOLERANCE * total_chars):
                # no sentence boundary near the depth (a haystack without sentence ends): a word boundary
                words = np.arange(n + 1, dtype=np.int64)
                k = int(np.argmin(np.abs(self.task.essay().char_offsets(words) - target)))
                where.append(int(words[k]))
                self.boundaries.append("word")
            else:
                where.append(int(allowed[j]))
                self.boundaries.append("sentence" if self.task.config.type_haystack == "essay" else "line")
        order = sorted(range(len(self.needles)), key=lambda i: (where[i], self.needles[i].depth, i))
        pieces: list[str] = []
        needle_pos = [0] * len(self.needles)
        pos, prev = len(self.head), 0
        for i in order:
            if where[i] > prev:
                seg = text_of(prev, where[i])
                pieces.append(seg)
                pos += len(seg) + len(joiner)
                prev = where[i]
            pieces.append(self.needles[i].text)
            needle_pos[i] = pos
            pos += len(self.needles[i].text) + len(joiner)
        if n > prev:
            pieces.append(text_of(prev, n))
        return self.head + joiner.join(pieces) + self.tail, needle_pos, where

    def n_prompt_tokens(self, n: int) -> int:
        """Prompt tokens with ``n`` haystack units, BOS or chat template and answer prefix included
        (``lm.prompt``)."""
        if n not in self._counts:
            self._counts[n] = len(self.lm.prompt(self.prompt(n)[0], self.answer_prefix).ids)
        return self._counts[n]

    def total(self, n: int) -> int:
        """Prompt tokens (BOS included) + generation budget with ``n`` haystack units."""
        return self.n_prompt_tokens(n) + self.budget

    def fit(self) -> int:
        """The haystack size n with total(n) <= length < total(n + 1).

        Raises:
            ValueError: the template, needles, answer prefix and generation budget alone exceed the length.
        """
        L = self.cell.length
        if self.total(0) > L:
            raise ValueError(f"length {L} is shorter than the {self.task.name} template, needles and generation "
                             f"budget ({self.n_prompt_tokens(0)} + {self.budget} tokens)")
        probe = 64 if self.task.config.type_haystack == "essay" else 4
        per_unit = max((self.n_prompt_tokens(probe) - self.n_prompt_tokens(0)) / probe, 1e-3)
        guess = max(0, int((L - self.total(0)) / per_unit))
        step = max(1, guess // 16)
        if self.total(guess) <= L:
            lo, hi = guess, guess + step
            while self.total(hi) <= L:
                lo, hi, step = hi, hi + step, step * 2
        else:
            hi, lo = guess, max(0, guess - step)
            while self.total(lo) > L:
                hi, lo, step = lo, max(0, lo - step), step * 2
        while hi - lo > 1:  # invariant: total(lo) <= L < total(hi)
            mid = (lo + hi) // 2
            if self.total(mid) <= L:
                lo = mid
            else:
                hi = mid
        return lo

    def sample_record(self) -> dict:
        """Fit the haystack and describe the sample as a JSON-able dict (what the cache stores)."""
        n = self.fit()
        text, needle_pos, where = self.prompt(n)
        p = self.lm.prompt(text, self.answer_prefix, marks=needle_pos)
        ids = p.ids
        rng_c = random.Random(f"lctx-niah|{self.task.name}|{self.seed}|{self.cell.length}|{self.depth:.6g}|"
                              f"{self.cell.sample}|control")
        control = self._draw(rng_c, self.task.config.type_needle_v)
        while control.lower() in text.lower():
            control = self._draw(rng_c, self.task.config.type_needle_v)
        depths = [m / len(ids) for m in p.marks]
        return {"input_ids": ids, "n_tokens": len(ids), "depth": depths[0], "prompt": p.text,
                "meta": {"answers": self.answers, "queries": self.queries, "control": control, "n_haystack": n,
                         "haystack": self.task.config.type_haystack, "max_new_tokens": self.budget,
                         "total_tokens": len(ids) + self.budget,
                         "needle_depths": [round(d, 6) for d in depths],
                         "needle_depths_requested": [round(nd.depth, 6) for nd in self.needles],
                         "needle_units": where, "needle_boundaries": list(self.boundaries)}}


def sample_cache_path(cache_dir: Path, task: str, key: dict) -> Path:
    """The sample-cache file of a built sample: ``cache_dir/task/<length>_<depth>_<sample>_<seed>_<h>.json``,
    h = 16 hex digits of SHA-1 over the cache key (every input of the sample, sorted JSON)."""
    h = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    d = "none" if key["depth"] is None else f"{key['depth']:g}"
    return Path(cache_dir) / task / f"{key['length']}_{d}_{key['sample']}_{key['seed']}_{h}.json"


def cached_sample_record(task, lm, cell: Cell, seed: int, make) -> dict:
    """The sample record of ``cell``: from ``task``'s sample cache when an entry with the same key
    (``task.cache_key``) is there, else ``make()``, then stored (atomically) when ``task.use_cache``. A damaged
    or foreign cache file is rebuilt, never trusted."""
    if not task.use_cache:
        return make()
    key = task.cache_key(lm, cell, seed)
    path = task.cache_path(key)
    try:
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            return stored["sample"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rec = make()
    _atomic_write_json(path, {"key": key, "sample": rec})
    return rec


class RulerNIAH(Task):
    """Base class of the eight RULER NIAH tasks (subclasses set ``name`` and ``config``).

    Options (``lctx run --task-option niah_single_1.KEY=VALUE``):
        match: ``substring`` (RULER, default), ``digits`` or ``word``; see :func:`value_found`.
        max_new_tokens: generation budget in tokens, counted in the length (default: the expected answer's
            tokens + 8; RULER uses 128, and the ``ruler`` group sets 128 unless given).
        data_dir: folder holding ``ruler/PaulGrahamEssays.json`` and ``ruler/wonderwords/`` (default
            ``$LCTX_DATA_DIR``).
        cache_dir: where built samples are kept (default :func:`default_cache_dir`; ``lctx run`` passes
            ``OUT/sample_cache`` or ``--cache-dir``); ``cache=False`` turns the cache off.
        haystack_start: ``first`` (RULER's, default): every essay haystack starts at the essay's first word;
            ``random``: each sample starts at its own seeded sentence (:meth:`NIAHBuilder.start_word`). Only the
            essay haystack has a window (noise repeats one sentence; the needle haystack draws its distractors
            per sample already).

    A sample is cached as ``cache_dir/<task>/<length>_<depth>_<sample>_<seed>_<hash>.json``, the hash over
    (task config, generation budget option, tokenizer fingerprint, data file digests, length, depth, sample,
    seed, generator version); a rerun loads it instead of rebuilding.

    Metrics: ``string_match_all``, ``string_match_part`` (0..1, on the greedy continuation of at most the
    generation budget), ``tf_top1``, ``tf_mrr`` (0..1), ``tf_logprob`` (nats per value token, <= 0) and
    ``tf_gain`` (nats per token over a control value absent from the prompt); the last four
    teacher-forced (see the module docstring). The heatmaps show :attr:`heatmap_metrics`.

    Raises (constructor):
        LctxError: unknown match mode, a budget that is not an integer, or RULER's data missing (or a file of it
            past :data:`lctx.tasks.textdata.MAX_TEXT_BYTES`).
        ValueError: ``max_new_tokens`` outside its :attr:`option_bounds` (1 to 65536; checked before this runs).
    """

    config: NIAHConfig
    axes = ("depth", "sample")
    metrics = METRICS
    batched = True  # prompt -> greedy -> metrics (lctx run --batch-size)
    headline_metric = "string_match_all"  # RULER's metric for NIAH
    retrieval = True
    secondary_metric = "tf_top1"  # teacher-forced
    heatmap_metrics = ("string_match_all", "string_match_part", "tf_top1", "tf_mrr")
    option_bounds = {"max_new_tokens": budget_bound()}  # RULER's 128 at most 2**16, below the longest length

    def __init__(self, match: str = "substring", max_new_tokens: int | None = None,
                 data_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                 cache: bool = True, haystack_start: str = "first"):
        if match not in MATCH_MODES:
            raise LctxError(f"task {self.name!r}: match={match!r} is not a match mode; use one of "
                            f"{', '.join(MATCH_MODES)}")
        if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                           or max_new_tokens < 1):
            raise LctxError(f"task {self.name!r}: max_new_tokens={max_new_tokens!r} is not a positive integer; "
                            "write e.g. max_new_tokens=128")
        if haystack_start not in ("first", "random"):
            raise LctxError(f"task {self.name!r}: haystack_start={haystack_start!r} is not first or random; write "
                            f"--task-option {self.name}.haystack_start=random")
        if haystack_start == "random" and self.config.type_haystack != "essay":
            raise LctxError(f"task {self.name!r}: haystack_start=random needs the essay haystack, and this task's "
                            f"is {self.config.type_haystack!r} (already drawn per sample, or one repeated sentence); "
                            "drop the option for it")
        if haystack_start == "first":  # RULER's default, left out of the options so older records still match
            super().__init__(match=match, max_new_tokens=max_new_tokens)
        else:
            super().__init__(match=match, max_new_tokens=max_new_tokens, haystack_start=haystack_start)
        self.match, self.max_new_tokens = match, max_new_tokens
        use_match_names(self, match)  # lctx's stricter modes: not under RULER's metric names
        self.haystack_start = haystack_start
        self.data_dir = resolve_data_dir(data_dir, self.name)
        self.use_cache = bool(cache)
        self.cache_dir = Path(cache_dir) if cache_dir not in (None, "") else default_cache_dir()
        needed = data_files(self.config)
        for rel in needed:
            if not (self.data_dir / rel).is_file():
                raise LctxError(f"task {self.name!r}: {rel} not found under data dir {str(self.data_dir)!r} "
                                "(--data-dir / LCTX_DATA_DIR); point it at the folder holding ruler/, or `lctx data "
                                f"--out {self.data_dir} --only ruler` fetches it")
            check_file_size(self.data_dir / rel, MAX_TEXT_BYTES, f"task {self.name!r}'s {rel}",
                            "5 times RULER's essays, 3.1 MB")  # read whole: refused by its size first
        self._needed = needed

    # pre-flight and progress ------------------------------------------------------------------------------
    def min_length(self, lm) -> int:
        """Template, needles, answer prefix and generation budget with an empty haystack, with ``lm``'s
        tokenizer: the least :meth:`NIAHBuilder.total` of 0 units over 8 draws of keys and values (word keys
        and answers vary by 10-30 tokens between draws; see :meth:`Task.min_length`)."""
        return min(int(NIAHBuilder(self, lm, Cell(1 << 30, 0.5, s), 0).total(0)) for s in range(8))

    def cost(self, lm, cell: Cell) -> float:
        """In prefill tokens (see :data:`DECODE_STEP_TOKENS`): one prefill of the prompt (``cell.length``
        tokens), the generation budget as decode steps, then one short teacher-forced forward per expected
        value and one for the control value, each through the same prefilled KV cache (rewound; a forward of
        a few tokens costs about one decode step)."""
        n_values = self.config.num_needle_q * self.config.num_needle_v
        example = {"numbers": "1234567", "uuids": str(uuid.UUID(int=0, version=4))}[self.config.type_needle_v]
        budget = self.max_new_tokens or len(lm.encode(" " + ", ".join([example] * n_values))) + 8  # as NIAHBuilder
        return float(cell.length) + (budget + n_values + 1) * DECODE_STEP_TOKENS

    # data ------------------------------------------------------------------------------------------------
    def data_files(self) -> dict[str, Path]:
        """RULER's files this task reads, by their path under the data dir (hashed into the fingerprint)."""
        return {rel: self.data_dir / rel for rel in self._needed}

    def words(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(adjectives, nouns) of RULER's key words."""
        return load_words(str(self.data_dir))

    def essay(self) -> Essay:
        """The essay haystack."""
        return load_essay(str(self.data_dir / ESSAY_FILE))

    # cache -----------------------------------------------------------------------------------------------
    def cache_key(self, lm, cell: Cell, seed: int) -> dict:
        """Everything a built sample depends on (JSON-able)."""
        return {"version": GENERATOR_VERSION, "task": self.name, "config": asdict(self.config),
                "max_new_tokens": self.max_new_tokens, "tokenizer": lm.tokenizer_fingerprint(),
                "data": {rel: _file_digest(str(self.data_dir / rel)) for rel in self._needed},
                "length": int(cell.length), "depth": None if cell.depth is None else float(cell.depth),
                "sample": int(cell.sample), "seed": int(seed)} | self._prompt_key(lm) | (
                    {"haystack_start": self.haystack_start} if self.haystack_start != "first" else {})

    @staticmethod
    def _prompt_key(lm) -> dict:
        """What else shapes the prompt's tokens (:meth:`~lctx.models.adapters.protocol.ModelAdapter.prompt_signature`):
        the chat template and system prompt (only when on, so that cache entries written before the chat option
        still match), BOS use when it differs from the tokenizer's."""
        return dict(lm.prompt_signature())

    def cache_path(self, key: dict) -> Path:
        """The cache file of a :meth:`cache_key` (:func:`sample_cache_path`)."""
        return sample_cache_path(self.cache_dir, self.name, key)

    def build(self, lm, cell: Cell, seed: int) -> Sample:
        """Build (or load from the cache) the sample of ``cell``: see :class:`NIAHBuilder`.

        Raises:
            ValueError: the length cannot hold the template, needles and generation budget.
        """
        rec = cached_sample_record(self, lm, cell, seed, lambda: NIAHBuilder(self, lm, cell, seed).sample_record())
        meta = dict(rec["meta"])
        meta["prompt_text"] = rec["prompt"]  # for the in-context answer tokens; dropped after scoring
        meta["answer"] = "|".join(meta["answers"])
        meta["needle_depths"] = ",".join(f"{d:.4f}" for d in meta["needle_depths"])
        meta["needle_boundaries"] = ",".join(meta.get("needle_boundaries") or [])
        return Sample(cell=cell, input_ids=list(rec["input_ids"]), n_tokens=int(rec["n_tokens"]),
                      depth=float(rec["depth"]), meta=meta)

    # scoring ---------------------------------------------------------------------------------------------
    def teacher_forced(self, lm, prefix, value: str, context: str) -> tuple[list[float], list[int]]:
        """Log-probability (nats) and rank (1 = the model's first choice) of each value-bearing token of
        " value" right after the prompt, with the tokens " value" has *in context* (``lm.continuation_ids``,
        as lm-eval's ``_encode_pair``), from ``lm.score_continuation``. ``prefix``: the adapter's handle of the
        prompt (``lm.prefix``) or the prompt's token ids (a list or tuple: made into a handle here);
        ``context``: the prompt's text (``Sample.meta["prompt_text"]``)."""
        if isinstance(prefix, (list, tuple)):
            prefix = lm.prefix(list(prefix))
        v_ids = lm.continuation_ids(context, " " + value)
        pos = [j for j, t in enumerate(v_ids) if lm.decode([t]).strip()]
        got = lm.score_continuation(prefix, v_ids)
        return [float(got.logprobs[j]) for j in pos], [int(got.ranks[j]) for j in pos]

    def score_generated(self, lm, sample: Sample, prefix, cont: list[int]) -> dict:
        """From the greedy continuation ``cont`` (string_match_*), then the teacher-forced scores of every
        expected value and of the control value through the prompt's KV cache ``prefix`` (one prefill per
        sample, or one row of a batched prefill: ``batched``); the teacher-forced ones unavailable
        (:func:`lctx.tasks.optional_metrics`) where the model gives no prompt log-probabilities."""
        answers = sample.meta["answers"]
        context = sample.meta.pop("prompt_text")
        pred = postprocess_pred(lm.decode(cont))
        sample.meta["continuation"] = pred

        def forced() -> dict:
            logps, ranks = [], []
            for v in answers:
                lp, rk = self.teacher_forced(lm, prefix, v, context)
                logps += lp
                ranks += rk
            c_logps, _ = self.teacher_forced(lm, prefix, sample.meta["control"], context)
            sample.meta["answer_logprobs"] = logps  # per value token, for backend parity (lctx compare A B)
            return {"tf_top1": tf_top1(ranks), "tf_mrr": tf_mrr(ranks), "tf_logprob": tf_logprob(logps),
                    "tf_gain": tf_gain(logps, tf_logprob(c_logps))}

        return {match_metric("string_match_all", self.match): string_match_all(pred, answers, self.match),
                match_metric("string_match_part", self.match): string_match_part(pred, answers, self.match),
                **optional_metrics(TEACHER_FORCED_METRICS, forced)}


def _atomic_write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_DESCRIPTIONS = {
    "niah_single_1": "RULER NIAH: one needle, noise haystack, word key, 7-digit value",
    "niah_single_2": "RULER NIAH: one needle, essay haystack, word key, 7-digit value",
    "niah_single_3": "RULER NIAH: one needle, essay haystack, word key, uuid value",
    "niah_multikey_1": "RULER NIAH: 4 keys (1 asked), essay haystack, 7-digit values",
    "niah_multikey_2": "RULER NIAH: needle haystack (distractor needles), word keys, 7-digit values",
    "niah_multikey_3": "RULER NIAH: needle haystack, uuid keys and values",
    "niah_multivalue": "RULER NIAH: one key with 4 values, essay haystack, all 4 asked",
    "niah_multiquery": "RULER NIAH: 4 keys, all 4 asked, essay haystack",
}


def _register(name: str) -> type[RulerNIAH]:
    cls_name = "".join(p.capitalize() for p in name.split("_"))
    cls = type(cls_name, (RulerNIAH,), {
        "name": name, "config": RULER_CONFIGS[name], "description": _DESCRIPTIONS[name], "__module__": __name__,
        "category": "single retrieval" if name.startswith("niah_single") else "multi retrieval",  # RULER's split
        "requires": ", ".join(sorted({f.rsplit("/", 1)[0] + "/" if "wonderwords" in f else f
                                      for f in data_files(RULER_CONFIGS[name])})) or "none (generated)",
        "__doc__": f"RULER ``{name}`` ({RULER_CONFIGS[name]}); see :class:`RulerNIAH`."})
    return register_task(cls)


NIAH_TASKS: dict[str, type[RulerNIAH]] = {name: _register(name) for name in RULER_CONFIGS}
globals().update({cls.__name__: cls for cls in NIAH_TASKS.values()})
