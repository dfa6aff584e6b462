"""RULER's other synthetic tasks: variable tracking (``vt``), common words extraction (``cwe``) and frequent
words extraction (``fwe``), the shared machinery of lctx's RULER tasks, and the list of RULER's 13 tasks.
QA (``qa_1``, ``qa_2``) lives in :mod:`lctx.tasks.ruler_qa`; the eight ``niah_*`` tasks in
:mod:`lctx.tasks.niah`.

Reference: Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?",
sections 3.2 (multi-hop tracing: variable tracking) and 3.3 (aggregation: common / frequent words
extraction); code NVIDIA/RULER, ``scripts/data/synthetic/{variable_tracking,common_words_extraction,
freq_words_extraction}.py``, ``scripts/data/synthetic/constants.py`` (templates, answer prefixes,
``tokens_to_generate``), ``scripts/synthetic.yaml`` (vt: noise haystack, 1 chain of 4 hops; cwe: freq_cw 30,
freq_ucw 3, num_cw 10; fwe: alpha 2) and ``scripts/eval/synthetic/constants.py`` (metric:
``string_match_all`` for all three).

What is RULER's (copied verbatim; ``tests/test_ruler.py`` checks it against the source text):

* the templates and answer prefixes, joined as ``prepare.py`` joins them for a base model
  (``{task_template}`` + answer prefix; with ``--chat-template on`` the task text is the user's turn of the
  model's chat template and the answer prefix opens the assistant's turn, as RULER's model templates do,
  through :meth:`lctx.models.adapters.hf.HFAdapter.prompt`), and RULER's generation budgets (30, 120, 50 tokens) as the
  default ``max_new_tokens``;
* ``vt``: chains ``VAR XXXXX = 12345`` then ``VAR YYYYY = VAR XXXXX `` (trailing space, as RULER), five
  upper-case letters per variable, values in [10000, 99998] (numpy's ``randint(10000, 99999)``), the chain's
  lines inserted in order among lines of the ``noise`` block of NIAH, ``". \\n" -> ".\\n"``; the question asks
  for the value of the first statement and the answer prefix states how many variables there are. The one
  in-context example of ``variable_tracking.py`` comes first: a prompt of at most 500 tokens (no BOS, no
  generation budget) built with three-letter variables and the value 12345, followed by its answer, then
  per sample its variable names and value redrawn (RULER's ``randomize_icl``), then ``"\\n"`` and the
  question prompt;
* ``cwe``: a numbered list ``"1. w 2. w ..."`` in which ``num_cw`` common words appear ``freq_cw`` times and the
  other words ``freq_ucw`` times, shuffled; below 4096 tokens RULER hard-codes 6 and 1; one solved example
  first (20 words at 3/1 below 4096 tokens, else 40 words at 10/3), formatted as the question followed by
  ``" 1. a 2. b ..."`` (its common words); answer: the ``num_cw`` common words;
* ``fwe``: a vocabulary of ``(length - generation budget) // 50`` random six-letter words (sorted, shuffled,
  the first replaced by the noise word ``...``), word of rank k repeated ``int(n k^-alpha / zeta(alpha))``
  times (``scipy.special.zeta``, as RULER), shuffled and space-joined; answer: the words of rank 2, 3, 4;
* scoring: RULER's ``postprocess_pred`` and ``string_match_all`` (and ``string_match_part``, also reported).

Word lists: RULER's ``cwe`` draws from wonderwords' noun, adjective and verb lists
(``ruler/wonderwords/{nounlist,adjectivelist,verblist}.txt``, about 8.6k distinct words) and, when a length
needs more distinct words than that, from ``json/english_words.json``. That file is only a Git-LFS pointer in
every public copy of RULER and is not in lctx's data. lctx then takes the distinct lower-case alphabetic words
of RULER's essay haystack (``ruler/PaulGrahamEssays.json``) that are not in the wonderwords lists as the extra
pool (only past ~120K tokens; the sample records which pool it used), and fails the sample when even that is
too small.

What lctx does differently (the same choices as :mod:`lctx.tasks.niah`):

* exact budgets: the haystack size (``vt``: noise lines; ``cwe``: distinct words; ``fwe``: the word-count
  scale n) is the largest with ``len(prompt ids) + max_new_tokens <= length``, the ids counting the BOS or
  the chat template's tokens, found by search; RULER binary-searches without them and, for ``fwe``, steps by
  ``length / 32`` words;
* the solved examples (``vt``, ``cwe``) are part of the task text, so with the chat template on they sit in
  the user's turn (RULER's ``vt`` puts its example after the model template's opening too; its ``cwe`` formats
  the example with the whole model template, repeating it);
* everything random is drawn from ``random.Random`` seeded with (task, seed, length, depth, sample), and
  built samples are cached on disk like NIAH's (:class:`RulerTask`); RULER reshuffles every list with the
  same fixed seed, lctx with the sample's;
* ``vt`` has a depth axis: the first statement (the value) goes to the noise-line boundary nearest
  ``depth`` and the hops follow it in order at ``depth + (1 - depth) j / (hops + 1)``, j = 1..hops (depth 0
  spreads the chain over the haystack, depth 1 puts it right before the question); RULER draws random
  distinct lines. The actual depth of the value statement (fraction of prompt tokens before it) is
  recorded; other chains (``num_chains`` > 1) go to random lines as in RULER. The in-context example is
  built once per (seed, tokenizer), as RULER builds one per dataset;
* ``cwe`` and ``fwe`` have no depth axis (the words are spread by the shuffle); ``samples=N`` runs N samples
  per length instead of ``--samples`` (the ``ruler`` group uses it so that every task has as many samples per
  length as a depth task);
* variable names are drawn distinct (RULER tops up a list with duplicates and can then build an extra chain)
  and the in-context example's names are replaced all at once (RULER's sequential ``str.replace`` can rename
  one name twice).
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import string
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np

from lctx.errors import LctxError

from .base import DECODE_STEP_TOKENS, MAX_CELLS, Bound, Cell, Sample, Task, budget_bound, register_task
from .textdata import MAX_TEXT_BYTES, check_file_size
from .niah import (ADJ_FILE, ESSAY_FILE, MATCH_MODES, NOUN_FILE, RULER_NOISE, RulerNIAH, _file_digest, content_key,
                   cached_sample_record, default_cache_dir, match_metric, postprocess_pred, resolve_data_dir,
                   sample_cache_path, string_match_all, string_match_part, use_match_names)

VERB_FILE = "ruler/wonderwords/verblist.txt"

#: scripts/config_tasks.sh (NVIDIA/RULER): the 13 tasks of RULER's benchmark, in RULER's order.
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")

# --- RULER's text, verbatim (scripts/data/synthetic/constants.py) --------------------------------------
VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_ANSWER_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
                    "are assigned the value {query}, they are: ")
VT_TOKENS_TO_GENERATE = 30
CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
                "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
                "list?")
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
CWE_TOKENS_TO_GENERATE = 120
FWE_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
                "the dots '....'. What are the three most frequently appeared words in the above coded text?")
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
FWE_TOKENS_TO_GENERATE = 50
#: variable_tracking.py: the in-context example is a prompt of at most this many tokens.
VT_ICL_MAX_TOKENS = 500

GENERATOR_VERSION = 1  # bump when a prompt construction changes: old cache entries stop matching


# --- shared helpers -----------------------------------------------------------------------------------------
def fit_size(total: Callable[[int], int], length: int, lo: int, guess: int | None = None,
             hi_cap: int | None = None) -> int:
    """The largest n >= ``lo`` with ``total(n) <= length``, for ``total`` nondecreasing in n (tokens).

    ``guess`` seeds an exponential search (default ``lo``); ``hi_cap``: n never exceeds it (the largest size
    the haystack can take). The result n satisfies ``total(n) <= length < total(n + 1)`` unless n = hi_cap.

    Raises:
        ValueError: ``total(lo) > length`` (the template and fixed parts alone exceed the length).
    """
    if total(lo) > length:
        raise ValueError(f"length {length} is shorter than the prompt's fixed parts and generation budget "
                         f"({total(lo)} tokens at the smallest haystack)")
    cap = hi_cap if hi_cap is not None else 1 << 40
    g = min(max(lo, guess if guess is not None else lo), cap)
    step = max(1, (g - lo) // 16)
    if total(g) <= length:
        a, b = g, min(g + step, cap)
        while b > a and total(b) <= length:
            if b == cap:
                return cap
            a, b, step = b, min(b + step, cap), step * 2
        if b == a:
            return a
    else:
        b, a = g, max(lo, g - step)
        while total(a) > length:
            b, a, step = a, max(lo, a - step), step * 2
    while b - a > 1:  # invariant: total(a) <= length < total(b)
        mid = (a + b) // 2
        if total(mid) <= length:
            a = mid
        else:
            b = mid
    return a


def load_cwe_words(data_dir: str) -> tuple[str, ...]:
    """RULER's ``cwe`` word pool: wonderwords' nouns + adjectives + verbs, each list read as wonderwords'
    ``_get_words_from_text_file`` does (lines, right-stripped), then ``sorted(set(...))`` as
    ``common_words_extraction.py`` does; cached in memory by the files' content."""
    return _load_cwe_words(data_dir, content_key(*(Path(data_dir) / rel for rel in (NOUN_FILE, ADJ_FILE, VERB_FILE))))


@functools.lru_cache(maxsize=4)
def _load_cwe_words(data_dir: str, content: tuple[str, ...]) -> tuple[str, ...]:
    words: set[str] = set()
    for rel in (NOUN_FILE, ADJ_FILE, VERB_FILE):
        with open(Path(data_dir) / rel, encoding="utf-8") as f:
            words |= {w.rstrip() for w in f.readlines()}
    words.discard("")
    return tuple(sorted(words))


def load_essay_words(data_dir: str, exclude: tuple[str, ...]) -> tuple[str, ...]:
    """lctx's stand-in for RULER's ``english_words.json``: the distinct lower-case alphabetic words of the essay
    haystack (``ruler/PaulGrahamEssays.json``) not in ``exclude``, sorted; cached in memory by the file's content."""
    return _load_essay_words(data_dir, exclude, content_key(Path(data_dir) / ESSAY_FILE))


@functools.lru_cache(maxsize=2)
def _load_essay_words(data_dir: str, exclude: tuple[str, ...], content: tuple[str, ...]) -> tuple[str, ...]:
    text = json.loads((Path(data_dir) / ESSAY_FILE).read_text(encoding="utf-8"))["text"]
    found = set(re.findall(r"(?<![\w'-])[a-z]+(?![\w'-])", text))
    return tuple(sorted(found - set(exclude)))


class RulerTask(Task):
    """Shared machinery of lctx's RULER tasks other than NIAH: options, the on-disk sample cache, greedy
    scoring with RULER's ``string_match_*``.

    Subclasses set ``name``, ``axes``, ``metrics`` (RULER's metric first), ``tokens_to_generate`` (RULER's
    budget, the default ``max_new_tokens``) and implement :meth:`generation_config` (the options that change
    a prompt) and :meth:`make_record` (build one sample as a JSON-able dict with ``input_ids``, ``n_tokens``,
    ``depth``, ``prompt`` and ``meta``, whose ``answers`` lists the reference strings).

    Common options: ``match`` (``substring`` = RULER, ``digits``, ``word``; see
    :func:`lctx.tasks.niah.value_found`), ``max_new_tokens`` (generation budget in tokens, counted in the
    length), ``cache_dir`` / ``cache`` (as NIAH: ``cache_dir/<task>/<length>_<depth>_<sample>_<seed>_<hash>.json``,
    the hash over the generation options, budget, tokenizer, data digests, cell and seed).

    Raises (constructor):
        LctxError: an unknown match mode or a budget that is not a positive integer.
        ValueError: an option outside its :attr:`option_bounds` (checked before the constructor runs).
    """

    tokens_to_generate: ClassVar[int] = 32
    metrics = ("string_match_all", "string_match_part")
    batched = True  # prompt -> greedy -> metrics (lctx run --batch-size)
    retrieval = True  # headline: RULER's metric, the first of ``metrics``
    heatmap_metrics = ("string_match_all", "string_match_part")
    #: max_new_tokens: a budget (:func:`lctx.tasks.base.budget_bound`); samples (cwe/fwe: per length, instead of
    #: ``--samples``; the ``ruler`` group sets samples x depths): at most a run's grid, :data:`lctx.tasks.base.MAX_CELLS`
    option_bounds: ClassVar[dict[str, Bound]] = {
        "max_new_tokens": budget_bound(),
        "samples": Bound(1, MAX_CELLS, unit="samples", why="the most cells one run may have")}

    def _setup(self, match: str, max_new_tokens: int | None, cache_dir, cache: bool, samples: int | None = None,
               **options: Any) -> None:
        if match not in MATCH_MODES:
            raise LctxError(f"task {self.name!r}: match={match!r} is not a match mode; use one of "
                            f"{', '.join(MATCH_MODES)}")
        for key, v in (("max_new_tokens", max_new_tokens), ("samples", samples)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise LctxError(f"task {self.name!r}: {key}={v!r} is not a positive integer; write e.g. {key}=32")
        # ``samples`` picks how many cells run, not what a sample is: it stays out of the recorded options (the
        # resume key), so growing the depth list of a ``ruler`` run (cwe/fwe samples = samples x depths) resumes
        # the samples already run instead of rerunning them as new inputs beside the old ones
        Task.__init__(self, match=match, max_new_tokens=max_new_tokens, **options)
        self.match = match
        use_match_names(self, match)  # lctx's stricter modes: not under RULER's metric names
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.use_cache = bool(cache)
        self.cache_dir = Path(cache_dir) if cache_dir not in (None, "") else default_cache_dir()
        self._files: dict[str, Path] = {}  # files a sample depends on (digested into the cache key)

    def data_files(self) -> dict[str, Path]:
        """The data files a sample depends on ({name under the data dir: path}), found at construction: hashed
        into every record's fingerprint (:meth:`lctx.tasks.base.Task.data_fingerprint`) and the cache key."""
        return dict(self._files)

    @property
    def budget(self) -> int:
        """Generation budget in tokens: ``max_new_tokens`` or RULER's ``tokens_to_generate``."""
        return int(self.max_new_tokens) if self.max_new_tokens is not None else int(self.tokens_to_generate)

    #: the cell length at which :meth:`min_length` sizes the smallest prompt (cwe: below 4096, its smaller example)
    min_length_probe: ClassVar[int] = 1 << 20

    def min_length(self, lm) -> int:
        """The fewest tokens a sample can take with ``lm``: the prompt at the smallest haystack plus the
        generation budget, the least over 8 draws (word lists and questions vary by tens of tokens; see
        :meth:`lctx.tasks.Task.min_length`)."""
        d = 0.5 if "depth" in self.axes else None
        totals = []
        for s in range(8):
            b = self.builder(lm, Cell(self.min_length_probe, d, s), 0)
            totals.append(int(b.total(b.lo)))
        return min(totals)

    def cost(self, lm, cell: Cell) -> float:
        """In prefill tokens (:data:`lctx.tasks.base.DECODE_STEP_TOKENS`): one prefill of the prompt and the
        generation budget as decode steps (``cell.length`` tokens in all)."""
        return float(cell.length) + self.budget * (DECODE_STEP_TOKENS - 1)

    def builder(self, lm, cell: Cell, seed: int) -> "HaystackBuilder":
        """The :class:`HaystackBuilder` of a cell."""
        raise NotImplementedError

    def cells(self, lengths: list[int], depths: list[float], samples: int) -> list[Cell]:
        """As :meth:`Task.cells`; the ``samples`` option (tasks without a depth axis) overrides ``--samples``."""
        return super().cells(lengths, depths, self.samples or samples)

    def n_cells(self, n_lengths: int, n_depths: int, samples: int) -> int:
        """As :meth:`Task.n_cells`, with the ``samples`` option as :meth:`cells` takes it."""
        return super().n_cells(n_lengths, n_depths, self.samples or samples)

    # prompt -> ids -----------------------------------------------------------------------------------
    @staticmethod
    def make_prompt(lm, user: str, answer_prefix: str, marks: tuple[int, ...] | list[int] = ()
                    ) -> tuple[list[int], str, list[int]]:
        """The prompt as the model reads it, through ``lm.prompt`` (:meth:`lctx.models.adapters.hf.HFAdapter.prompt`: BOS as
        the model takes it; with ``--chat-template on`` the task text is the user's turn and the answer prefix
        starts the assistant's, as RULER's model templates): (token ids, text, tokens before each character
        offset ``marks`` of ``user``)."""
        p = lm.prompt(user, answer_prefix, marks=list(marks))
        return list(p.ids), p.text, list(p.marks)

    @staticmethod
    def prompt_key(lm) -> dict:
        """What shapes a prompt's tokens besides the tokenizer (chat template, BOS use), for the cache key; the
        same as NIAH's."""
        return RulerNIAH._prompt_key(lm)

    # to implement --------------------------------------------------------------------------------------
    def generation_config(self) -> dict:
        """The options that change a built prompt (JSON-able), part of the cache key."""
        raise NotImplementedError

    def make_record(self, lm, cell: Cell, seed: int) -> dict:
        """Build the sample of ``cell`` (see the class docstring)."""
        raise NotImplementedError

    # cache ------------------------------------------------------------------------------------------
    def cache_key(self, lm, cell: Cell, seed: int) -> dict:
        """Everything a built sample depends on (JSON-able)."""
        return {"version": GENERATOR_VERSION, "task": self.name, "config": self.generation_config(),
                "max_new_tokens": self.budget, "tokenizer": lm.tokenizer_fingerprint(),
                "data": {k: _file_digest(str(p)) for k, p in sorted(self._files.items())},
                "length": int(cell.length), "depth": None if cell.depth is None else float(cell.depth),
                "sample": int(cell.sample), "seed": int(seed)} | self.prompt_key(lm)

    def cache_path(self, key: dict) -> Path:
        """The cache file of a :meth:`cache_key` (:func:`lctx.tasks.niah.sample_cache_path`)."""
        return sample_cache_path(self.cache_dir, self.name, key)

    def build(self, lm, cell: Cell, seed: int) -> Sample:
        """Build (or load from the cache) the sample of ``cell``.

        Raises:
            ValueError: the length cannot hold the template, fixed parts and generation budget.
        """
        rec = cached_sample_record(self, lm, cell, seed, lambda: self.make_record(lm, cell, seed))
        meta = dict(rec["meta"])
        meta["answer"] = "|".join(meta["answers"])
        return Sample(cell=cell, input_ids=list(rec["input_ids"]), n_tokens=int(rec["n_tokens"]),
                      depth=None if rec.get("depth") is None else float(rec["depth"]), meta=meta)

    # scoring ----------------------------------------------------------------------------------------
    def score_generated(self, lm, sample: Sample, prefix, cont: list[int]) -> dict[str, float]:
        """From the greedy continuation ``cont`` of at most the generation budget (``meta["max_new_tokens"]``):
        RULER's ``postprocess_pred``, then ``string_match_all`` / ``string_match_part`` against
        ``meta["answers"]`` (0..1; RULER reports x100), under their names for ``match``
        (:func:`lctx.metrics.match_metric`). Batched with ``lctx run --batch-size``."""
        pred = postprocess_pred(lm.decode(cont))
        sample.meta["continuation"] = pred
        answers = sample.meta["answers"]
        fns = {"string_match_all": string_match_all, "string_match_part": string_match_part}
        return {match_metric(m, self.match): fns[m](pred, answers, self.match) for m in type(self).metrics}

    def _record(self, lm, cell: Cell, ids: list[int], text: str, answers: list[str], depth: float | None,
                **meta) -> dict:
        if len(ids) + self.budget > cell.length:  # the fit guarantees it; a guard against a non-monotone count
            raise ValueError(f"{self.name}: built {len(ids)} + {self.budget} tokens for a length of {cell.length}")
        return {"input_ids": ids, "n_tokens": len(ids), "depth": depth, "prompt": text,
                "meta": {"answers": list(answers), "max_new_tokens": self.budget, "total_tokens": len(ids) + self.budget,
                         **meta}}

    def _tag(self, cell: Cell, seed: int) -> str:
        d = "none" if cell.depth is None else f"{float(cell.depth):.6g}"
        return f"lctx-ruler|{self.name}|{seed}|{cell.length}|{d}|{cell.sample}"

    def _need(self, data_dir, rels: list[str]) -> Path:
        root = resolve_data_dir(data_dir, self.name)
        for rel in rels:
            if not (root / rel).is_file():
                raise LctxError(f"task {self.name!r}: {rel} not found under data dir {str(root)!r} "
                                "(--data-dir / LCTX_DATA_DIR); point it at the folder holding ruler/")
            check_file_size(root / rel, MAX_TEXT_BYTES, f"task {self.name!r}'s {rel}",
                            "5 times RULER's essays, 3.1 MB")  # read whole: refused by its size first
            self._files[rel] = root / rel
        return root


class HaystackBuilder:
    """One sample under construction: :meth:`text` (prompt of haystack size n), :meth:`total` (its tokens with BOS
    + the generation budget, memoised), :meth:`fit` (the largest n within the length) and :meth:`record`.

    Subclasses draw everything random in ``__init__`` (from ``random.Random`` seeded with the sample's tag), so
    that the size search never changes what is drawn, and implement :meth:`text` and :meth:`record`; ``lo`` is
    the smallest haystack size, ``cap`` the largest (None: unbounded).
    """

    lo: int = 0
    cap: int | None = None

    def __init__(self, task: RulerTask, lm, cell: Cell, seed: int):
        self.task, self.lm, self.cell, self.seed = task, lm, cell, seed
        self.tag = task._tag(cell, seed)
        self._counts: dict[int, int] = {}

    def parts(self, n: int) -> tuple[str, str]:
        """(the task's text with haystack size ``n``: template filled in, ending with the question; the
        answer prefix). RULER's prompt is their concatenation."""
        raise NotImplementedError

    def text(self, n: int) -> str:
        """The task's text and answer prefix joined (the prompt without BOS or chat template)."""
        user, prefix = self.parts(n)
        return user + prefix

    def prompt(self, n: int, marks: tuple[int, ...] | list[int] = ()) -> tuple[list[int], str, list[int]]:
        """(ids, text, tokens before each offset ``marks`` of the task's text) with haystack size ``n``
        (:meth:`RulerTask.make_prompt`)."""
        return self.task.make_prompt(self.lm, *self.parts(n), marks=marks)

    def total(self, n: int) -> int:
        """Tokens of the prompt with haystack size ``n`` (BOS or chat template included) plus the generation
        budget."""
        if n not in self._counts:
            self._counts[n] = len(self.prompt(n)[0]) + self.task.budget
        return self._counts[n]

    def fit(self, probe: int = 8) -> int:
        """The largest n in [lo, cap] with ``total(n) <= length`` (see :func:`fit_size`).

        Raises:
            ValueError: the prompt at the smallest size already exceeds the length.
        """
        lo, L = self.lo, self.cell.length
        if self.total(lo) > L:
            raise ValueError(f"length {L} is shorter than the {self.task.name} template, fixed parts and generation "
                             f"budget ({self.total(lo) - self.task.budget} + {self.task.budget} tokens)")
        hi = lo + probe if self.cap is None else min(lo + probe, self.cap)
        per = max((self.total(hi) - self.total(lo)) / max(hi - lo, 1), 1e-3)
        return fit_size(self.total, L, lo, guess=lo + int((L - self.total(lo)) / per), hi_cap=self.cap)

    def record(self) -> dict:
        """Fit and build the sample record (see :meth:`RulerTask.make_record`)."""
        raise NotImplementedError


# --- variable tracking ------------------------------------------------------------------------------------
def vt_chains(rng: random.Random, num_chains: int, num_hops: int, is_icl: bool = False,
              value: int | None = None) -> tuple[list[list[str]], list[list[str]]]:
    """RULER's ``generate_chains``: (variable names per chain, statements per chain).

    Names: 5 upper-case letters (3 for the in-context example, whose hops are capped at 10 and whose value is
    12345), all distinct. Statement 0 is ``"VAR A = v"`` (v in [10000, 99998]), statement j+1
    ``"VAR B = VAR A "`` (with RULER's trailing space).
    """
    k = 3 if is_icl else 5
    hops = min(10, num_hops) if is_icl else num_hops
    names: list[str] = []
    while len(names) < num_chains * (hops + 1):
        v = "".join(rng.choices(string.ascii_uppercase, k=k))
        if v not in names:
            names.append(v)
    vars_, chains = [], []
    for i in range(0, len(names), hops + 1):
        this = names[i:i + hops + 1]
        vars_.append(this)
        val = 12345 if is_icl else (value if value is not None else rng.randint(10000, 99998))
        chain = [f"VAR {this[0]} = {val}"]
        chain += [f"VAR {this[j + 1]} = VAR {this[j]} " for j in range(hops)]
        chains.append(chain)
    return vars_, chains


def vt_context(n_noise: int, placed: list[tuple[int, str]]) -> str:
    """The noise haystack of ``n_noise`` lines with statements inserted: ``placed`` = [(boundary index in
    0..n_noise, statement)], inserted before noise line ``index`` in list order (so a chain keeps its order);
    lines joined by ``"\\n"``, then RULER's ``". \\n" -> ".\\n"``."""
    by_line: dict[int, list[str]] = {}
    for idx, st in placed:
        by_line.setdefault(int(idx), []).append(st)
    lines: list[str] = []
    for i in range(n_noise + 1):
        lines += by_line.get(i, [])
        if i < n_noise:
            lines.append(RULER_NOISE)
    return "\n".join(lines).replace(". \n", ".\n")


def vt_prompt(context: str, value: str, num_v: int) -> str:
    """RULER's vt template + answer prefix filled in."""
    return (VT_TEMPLATE + VT_ANSWER_PREFIX).format(context=context, query=value, num_v=num_v)


def randomize_icl(icl: str, rng: random.Random, num_hops: int) -> str:
    """RULER's ``randomize_icl``: the example's last ``num_hops + 1`` words (its answer: the variable names) get
    new random upper-case names of the same length and its value 12345 a new value in [10000, 99998]. lctx
    renames all at once (one regex pass) with distinct new names."""
    old = icl.strip().split()[-num_hops - 1:]
    new: dict[str, str] = {}
    for item in old:
        while item not in new:
            cand = "".join(rng.choices(string.ascii_uppercase, k=len(item)))
            if cand not in new.values() and cand not in old:
                new[item] = cand
    out = re.sub(r"\b(" + "|".join(map(re.escape, old)) + r")\b", lambda m: new[m.group(1)], icl)
    return out.replace("12345", str(rng.randint(10000, 99998)))


_ICL_CACHE: dict[tuple, str] = {}


def vt_icl_example(lm, seed: int, num_chains: int, num_hops: int) -> str:
    """RULER's vt in-context example for this tokenizer: a prompt (3-letter names, value 12345, RULER's random
    distinct lines) with the most noise lines (at least max(5, hops + 1)) that keeps it within 500 tokens (no
    BOS, as RULER's ``text_to_tokens``), then ``" " + " ".join(answer) + "\\n"``. One per (seed, tokenizer,
    chains, hops), as RULER builds one per dataset."""
    key = (lm.tokenizer_fingerprint(), seed, num_chains, num_hops)
    if key in _ICL_CACHE:
        return _ICL_CACHE[key]
    tag = f"lctx-ruler|vt-icl|{seed}|{num_chains}|{num_hops}"
    vars_, chains = vt_chains(random.Random(tag), num_chains, num_hops, is_icl=True)
    hops = min(10, num_hops)
    lo = max(5, hops + 1)

    def text(n: int) -> str:
        r = random.Random(f"{tag}|{n}")
        placed: list[tuple[int, str]] = []
        for ch in chains:  # RULER: sorted(random.sample(range(len(sentences)), len(chain)))
            placed += list(zip(sorted(r.sample(range(n), len(ch))), ch))
        placed.sort(key=lambda x: x[0])
        return vt_prompt(vt_context(n, placed), "12345", hops + 1)

    counts: dict[int, int] = {}

    def total(n: int) -> int:
        if n not in counts:
            counts[n] = len(lm.encode(text(n)))
        return counts[n]

    try:
        n = fit_size(total, VT_ICL_MAX_TOKENS, lo, guess=lo * 3)
    except ValueError:
        n = lo  # RULER: "optimal_num_noises if found else incremental"
    out = text(n) + " " + " ".join(vars_[0]) + "\n"
    _ICL_CACHE[key] = out
    return out


class VTBuilder(HaystackBuilder):
    """A ``vt`` sample: the randomised in-context example, ``"\\n"``, then the question over ``n`` noise lines with
    the chain statements placed by depth (see the module docstring)."""

    def __init__(self, task: "VariableTracking", lm, cell: Cell, seed: int):
        super().__init__(task, lm, cell, seed)
        self.depth = 0.5 if cell.depth is None else float(cell.depth)
        rng = random.Random(self.tag)
        self.icl = randomize_icl(vt_icl_example(lm, seed, task.num_chains, task.num_hops), rng, task.num_hops)
        self.vars, self.chains = vt_chains(rng, task.num_chains, task.num_hops)
        self.value = self.chains[0][0].split("=")[-1].strip()
        k = task.num_hops
        self.fracs = [self.depth + (1.0 - self.depth) * j / (k + 1) for j in range(k + 1)]  # queried chain, in order
        self.other_fracs = [sorted(rng.random() for _ in ch) for ch in self.chains[1:]]  # RULER: random lines

    def placed(self, n: int) -> list[tuple[int, str]]:
        """[(noise-line boundary 0..n, statement)] in insertion order (a chain keeps its order)."""
        out = [(int(round(f * n)), st) for f, st in zip(self.fracs, self.chains[0])]
        for fs, ch in zip(self.other_fracs, self.chains[1:]):
            out += [(int(round(f * n)), st) for f, st in zip(fs, ch)]
        return sorted(out, key=lambda x: x[0])  # stable sort

    def parts(self, n: int) -> tuple[str, str]:
        num_v = self.task.num_hops + 1
        user = self.icl + "\n" + VT_TEMPLATE.format(context=vt_context(n, self.placed(n)), query=self.value, num_v=num_v)
        return user, VT_ANSWER_PREFIX.format(query=self.value, num_v=num_v)

    def record(self) -> dict:
        n = self.fit()
        user, _ = self.parts(n)
        main = user.index(VT_TEMPLATE[:40], len(self.icl))
        offs = [user.index(st, main) for st in self.chains[0]]
        ids, text, marks = self.prompt(n, offs)
        depths = [m / len(ids) for m in marks]
        return self.task._record(self.lm, self.cell, ids, text, self.vars[0], depths[0], value=self.value, n_haystack=n,
                                 haystack="noise", statement_depths=",".join(f"{d:.4f}" for d in depths),
                                 statement_depths_requested=",".join(f"{f:.4f}" for f in self.fracs),
                                 icl_tokens=len(self.lm.encode(self.icl)))


class VariableTracking(RulerTask):
    """RULER ``vt`` (multi-hop tracing): find every variable a chain of assignments binds to a value.

    Options: ``num_chains`` (1), ``num_hops`` (4) as ``synthetic.yaml``; plus those of :class:`RulerTask`
    (``max_new_tokens`` default 30, RULER's). Depth: see the module docstring. Metrics:
    ``string_match_all`` (RULER's: fraction of the chain's num_hops + 1 names found in the continuation),
    ``string_match_part``. Needs no data files.

    Raises (constructor):
        LctxError: bad options (non-positive chains or hops, see :class:`RulerTask`).
    """

    name = "vt"
    category = "multi-hop tracing"
    requires = "none (generated)"
    description = "RULER variable tracking: 1 chain of 4 hops in the noise haystack (+1 solved example)"
    axes = ("depth", "sample")
    tokens_to_generate = VT_TOKENS_TO_GENERATE
    #: a hop is a statement ("VAR ABCDE = VAR FGHIJ") of at least 4 tokens, a chain at least 2 of them; both capped at
    #: 1000 (RULER's synthetic.yaml: 1 chain of 4 hops)
    option_bounds = {**RulerTask.option_bounds,
                     "num_chains": Bound(1, 1000, per_length=8, unit="chains", why="RULER runs 1"),
                     "num_hops": Bound(1, 1000, per_length=4, unit="hops", why="RULER runs 4")}

    def __init__(self, num_chains: int = 1, num_hops: int = 4, match: str = "substring",
                 max_new_tokens: int | None = None, cache_dir: str | os.PathLike | None = None, cache: bool = True):
        for k, v in (("num_chains", num_chains), ("num_hops", num_hops)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LctxError(f"task 'vt': {k}={v!r} is not a positive integer; write e.g. {k}=1")
        self._setup(match, max_new_tokens, cache_dir, cache, num_chains=num_chains, num_hops=num_hops)
        self.num_chains, self.num_hops = num_chains, num_hops

    def generation_config(self) -> dict:
        return {"num_chains": self.num_chains, "num_hops": self.num_hops, "haystack": "noise"}

    def builder(self, lm, cell: Cell, seed: int) -> VTBuilder:
        """The :class:`VTBuilder` of a cell."""
        return VTBuilder(self, lm, cell, seed)

    def make_record(self, lm, cell: Cell, seed: int) -> dict:
        return self.builder(lm, cell, seed).record()


# --- common words extraction ------------------------------------------------------------------------------
def cwe_list(words: list[str], common_nums: int, common_repeats: int, uncommon_repeats: int,
             rng: random.Random) -> tuple[str, list[str]]:
    """RULER's ``get_example`` on given words: the first ``common_nums`` repeated ``common_repeats`` times, the rest
    ``uncommon_repeats`` times, shuffled with ``rng``, formatted ``"1. w1 2. w2 ..."``. Returns (list text,
    common words)."""
    common, uncommon = words[:common_nums], words[common_nums:]
    word_list = common * int(common_repeats) + uncommon * int(uncommon_repeats)
    rng.shuffle(word_list)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), list(common)


class CWEBuilder(HaystackBuilder):
    """A ``cwe`` sample: the solved example(s), ``"\\n"``, then the question over a list of ``n`` distinct words
    (the first ``num_cw`` of them common) drawn from ``pool``."""

    def __init__(self, task: "CommonWordsExtraction", lm, cell: Cell, seed: int, pool: tuple[str, ...],
                 pool_name: str = "wonderwords"):
        super().__init__(task, lm, cell, seed)
        (fs_words, fs_c, fs_u), (_, self.c_rep, self.u_rep) = task.frequencies(cell.length)
        shots = []
        for s in range(task.num_fewshot):
            r = random.Random(f"{self.tag}|fewshot|{s}")
            ctx, ans = cwe_list(r.sample(task.words(), fs_words), task.num_cw, fs_c, fs_u, r)
            shots.append(task.template.format(num_cw=task.num_cw, context=ctx, query="") + " "
                         + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ans)))
        self.head = "\n".join(shots) + "\n"
        self.pool_name = pool_name
        self.order = random.Random(f"{self.tag}|words|{pool_name}").sample(pool, len(pool))
        self.lo, self.cap = task.num_cw + 1, len(pool)

    def words_and_answer(self, n: int) -> tuple[str, list[str]]:
        """(the task's text with n words: solved example(s) and question, the common words)."""
        ctx, ans = cwe_list(self.order[:n], self.task.num_cw, self.c_rep, self.u_rep,
                            random.Random(f"{self.tag}|shuffle|{n}"))
        return self.head + self.task.question.format(num_cw=self.task.num_cw, context=ctx, query=""), ans

    def parts(self, n: int) -> tuple[str, str]:
        return self.words_and_answer(n)[0], self.task.answer_prefix

    def fit(self, probe: int = 40) -> int:
        return super().fit(probe)

    def record(self) -> dict:
        n = self.fit()
        _, answers = self.words_and_answer(n)
        ids, text, _ = self.prompt(n)
        t = self.task
        return t._record(self.lm, self.cell, ids, text, answers, None, n_haystack=n, word_pool=self.pool_name,
                         repeats=f"{self.c_rep}/{self.u_rep}", n_entries=t.num_cw * self.c_rep + (n - t.num_cw) * self.u_rep)


class CommonWordsExtraction(RulerTask):
    """RULER ``cwe`` (aggregation): name the ``num_cw`` words repeated most often in a long numbered list.

    Options: ``freq_cw`` (30), ``freq_ucw`` (3), ``num_cw`` (10) as ``synthetic.yaml`` (below 4096 tokens RULER
    uses 6 and 1 whatever they say; the template's "10" follows ``num_cw``), ``num_fewshot`` (1, RULER's
    default), ``data_dir`` (holding ``ruler/wonderwords/``), ``samples`` (per length, instead of
    ``--samples``), and those of :class:`RulerTask` (``max_new_tokens`` default 120, RULER's). No depth axis.
    Metric: ``string_match_all`` (RULER's), ``string_match_part``.

    Raises (constructor):
        LctxError: bad options, or the word lists missing under the data dir.
    """

    name = "cwe"
    category = "aggregation"
    min_length_probe = 2048
    requires = "ruler/wonderwords/ (and ruler/PaulGrahamEssays.json past ~120K tokens)"
    description = "RULER common words extraction: 10 words x30 among words x3 (x6/x1 below 4K), +1 solved example"
    axes = ("sample",)
    tokens_to_generate = CWE_TOKENS_TO_GENERATE
    #: each list entry ("12. word") is at least 2 tokens: a common word appears >= 2 times (4 tokens), each repeat of
    #: one 2 tokens; caps: RULER's values (30, 3, 10, 1) times a few hundred, num_cw at the wonderwords pool's order
    option_bounds = {**RulerTask.option_bounds,
                     "freq_cw": Bound(1, 10_000, per_length=2, unit="repeats", why="RULER repeats 30 times"),
                     "freq_ucw": Bound(1, 10_000, per_length=2, unit="repeats", why="RULER repeats 3 times"),
                     "num_cw": Bound(1, 1000, per_length=4, unit="words", why="RULER asks for 10"),
                     "num_fewshot": Bound(0, 16, unit="examples", why="RULER gives 1")}

    def __init__(self, freq_cw: int = 30, freq_ucw: int = 3, num_cw: int = 10, num_fewshot: int = 1,
                 match: str = "substring", max_new_tokens: int | None = None, data_dir: str | os.PathLike | None = None,
                 cache_dir: str | os.PathLike | None = None, cache: bool = True, samples: int | None = None):
        for k, v, lo in (("freq_cw", freq_cw, 1), ("freq_ucw", freq_ucw, 1), ("num_cw", num_cw, 1),
                         ("num_fewshot", num_fewshot, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise LctxError(f"task 'cwe': {k}={v!r} is not an integer >= {lo}; write e.g. {k}={max(lo, 1)}")
        if freq_cw <= freq_ucw:
            raise LctxError(f"task 'cwe': freq_cw={freq_cw} must exceed freq_ucw={freq_ucw} (the common words must "
                            "be the most frequent)")
        self._setup(match, max_new_tokens, cache_dir, cache, samples, freq_cw=freq_cw, freq_ucw=freq_ucw,
                    num_cw=num_cw, num_fewshot=num_fewshot)
        self.freq_cw, self.freq_ucw, self.num_cw, self.num_fewshot = freq_cw, freq_ucw, num_cw, num_fewshot
        self.data_dir = self._need(data_dir, [NOUN_FILE, ADJ_FILE, VERB_FILE])
        if (self.data_dir / ESSAY_FILE).is_file():  # the extra word pool past wonderwords' (long lengths)
            check_file_size(self.data_dir / ESSAY_FILE, MAX_TEXT_BYTES, f"task {self.name!r}'s {ESSAY_FILE}",
                            "5 times RULER's essays, 3.1 MB")
            self._files[ESSAY_FILE] = self.data_dir / ESSAY_FILE
        self.template = (CWE_TEMPLATE + CWE_ANSWER_PREFIX).replace("10", str(num_cw))  # of the solved example
        self.question = CWE_TEMPLATE.replace("10", str(num_cw))
        self.answer_prefix = CWE_ANSWER_PREFIX.replace("10", str(num_cw))

    def generation_config(self) -> dict:
        return {"freq_cw": self.freq_cw, "freq_ucw": self.freq_ucw, "num_cw": self.num_cw,
                "num_fewshot": self.num_fewshot}

    def words(self) -> tuple[str, ...]:
        """The wonderwords pool (:func:`load_cwe_words`)."""
        return load_cwe_words(str(self.data_dir))

    def frequencies(self, length: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """((words, common repeats, uncommon repeats) of the solved example, (-, common, uncommon repeats) of the
        question), as ``common_words_extraction.py``'s ``generate_input_output`` picks them by length."""
        if length < 4096:
            return (20, 3, 1), (0, 6, 1)
        return (40, 10, 3), (0, self.freq_cw, self.freq_ucw)

    def builder(self, lm, cell: Cell, seed: int, extended: bool = False) -> CWEBuilder:
        """The :class:`CWEBuilder` of a cell over the wonderwords pool, or (``extended``) wonderwords + the essay
        vocabulary (lctx's stand-in for RULER's english_words.json).

        Raises:
            ValueError: ``extended`` and the essay file is absent.
        """
        pool = self.words()
        if not extended:
            return CWEBuilder(self, lm, cell, seed, pool)
        if not (self.data_dir / ESSAY_FILE).is_file():
            raise ValueError(f"cwe at {cell.length} tokens needs more than the {len(pool)} wonderwords words; RULER "
                             f"then reads english_words.json (absent); lctx reads {ESSAY_FILE}, not found")
        return CWEBuilder(self, lm, cell, seed, pool + load_essay_words(str(self.data_dir), pool), "wonderwords+essay")

    def make_record(self, lm, cell: Cell, seed: int) -> dict:
        b = self.builder(lm, cell, seed)
        if b.fit() == b.cap and b.total(b.cap) < cell.length:  # the pool ran out first: RULER's english_words
            b = self.builder(lm, cell, seed, extended=True)
            if b.fit() == b.cap and b.total(b.cap) < cell.length:
                raise ValueError(f"cwe at {cell.length} tokens needs more than the {b.cap} distinct words lctx has "
                                 "(wonderwords + essay vocabulary)")
        return b.record()


# --- frequent words extraction ----------------------------------------------------------------------------
def fwe_counts(num_words: int, vocab_size: int, alpha: float) -> np.ndarray:
    """RULER's word counts: ``(num_words * k**-alpha / zeta(alpha)).astype(int)`` for ranks k = 1..vocab_size
    (``freq_words_extraction.py``, ``gen_text``; ``scipy.special.zeta``)."""
    from scipy.special import zeta  # lazy: loads scipy

    k = np.arange(1, vocab_size + 1)
    return (num_words * (k ** -alpha) / zeta(alpha)).astype(int)


class FWEBuilder(HaystackBuilder):
    """A ``fwe`` sample: the coded text at word-count scale ``n`` (word of rank k repeated
    ``int(n k^-alpha / zeta(alpha))`` times, shuffled)."""

    def __init__(self, task: "FrequentWordsExtraction", lm, cell: Cell, seed: int):
        super().__init__(task, lm, cell, seed)
        self.size = task.vocab_size or (cell.length - task.budget) // 50
        if self.size < 5:
            raise ValueError(f"fwe at {cell.length} tokens: a vocabulary of (length - {task.budget}) // 50 = "
                             f"{self.size} words is too small (needs >= 5); use a longer length or vocab_size=")
        self.vocab = task.vocab(random.Random(f"{self.tag}|vocab"), self.size)
        self.answers = self.vocab[1:4]
        from scipy.special import zeta  # lazy: loads scipy

        lo = int(np.ceil(zeta(task.alpha) * 4 ** task.alpha))  # the smallest n at which rank 4 appears
        while fwe_counts(lo, self.size, task.alpha)[3] < 1:
            lo += 1
        self.lo = lo

    def counts(self, n: int) -> np.ndarray:
        """Occurrences of each vocabulary word (rank order) at scale n."""
        return fwe_counts(n, self.size, self.task.alpha)

    def parts(self, n: int) -> tuple[str, str]:
        sampled = [w for w, c in zip(self.vocab, self.counts(n)) for _ in range(int(c))]
        random.Random(f"{self.tag}|shuffle|{n}").shuffle(sampled)
        return FWE_TEMPLATE.format(context=" ".join(sampled), query=""), FWE_ANSWER_PREFIX

    def fit(self, probe: int = 200) -> int:
        return super().fit(probe)

    def record(self) -> dict:
        n = self.fit()
        cnt = self.counts(n)
        ids, text, _ = self.prompt(n)
        return self.task._record(self.lm, self.cell, ids, text, self.answers, None, n_haystack=n,
                                 vocab_size=self.size, answer_counts=",".join(str(int(c)) for c in cnt[1:4]),
                                 noise_count=int(cnt[0]), n_words=int(cnt.sum()))


class FrequentWordsExtraction(RulerTask):
    """RULER ``fwe`` (aggregation): name the three most frequent coded words of a Zipf-distributed text.

    Options: ``alpha`` (2.0, ``synthetic.yaml``), ``coded_wordlen`` (6) and ``vocab_size`` (default
    ``(length - max_new_tokens) // 50``, RULER's), ``samples`` (per length, instead of ``--samples``) and those
    of :class:`RulerTask` (``max_new_tokens`` default 50, RULER's). No depth axis; needs no data files.
    Metric: ``string_match_all`` (RULER's), ``string_match_part``.

    Raises (constructor):
        LctxError: bad options.
    """

    name = "fwe"
    category = "aggregation"
    requires = "none (generated)"
    description = "RULER frequent words extraction: top-3 coded words of a Zipf(alpha=2) text"
    axes = ("sample",)
    tokens_to_generate = FWE_TOKENS_TO_GENERATE
    #: vocab_size: RULER's default is (length - budget) // 50; capped at 100 000 (that default at a 5M-token length);
    #: coded_wordlen: letters per coded word, capped at 32 (RULER's is 6)
    option_bounds = {**RulerTask.option_bounds,
                     "vocab_size": Bound(5, 100_000, unit="words", why="RULER's (length - budget) // 50 at 5M tokens"),
                     "coded_wordlen": Bound(2, 32, unit="letters", why="RULER's is 6")}

    def __init__(self, alpha: float = 2.0, coded_wordlen: int = 6, vocab_size: int | None = None,
                 match: str = "substring", max_new_tokens: int | None = None,
                 cache_dir: str | os.PathLike | None = None, cache: bool = True, samples: int | None = None):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 1.0:
            raise LctxError(f"task 'fwe': alpha={alpha!r} must be a number > 1 (the zeta distribution's exponent); "
                            "write e.g. alpha=2.0")
        if isinstance(coded_wordlen, bool) or not isinstance(coded_wordlen, int) or coded_wordlen < 2:
            raise LctxError(f"task 'fwe': coded_wordlen={coded_wordlen!r} must be an integer >= 2")
        if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 5):
            raise LctxError(f"task 'fwe': vocab_size={vocab_size!r} must be an integer >= 5 (noise word + 3 answers + "
                            "at least one more)")
        self._setup(match, max_new_tokens, cache_dir, cache, samples, alpha=float(alpha), coded_wordlen=coded_wordlen,
                    vocab_size=vocab_size)
        self.alpha, self.coded_wordlen, self.vocab_size = float(alpha), coded_wordlen, vocab_size

    def generation_config(self) -> dict:
        return {"alpha": self.alpha, "coded_wordlen": self.coded_wordlen, "vocab_size": self.vocab_size}

    def vocab(self, rng: random.Random, size: int) -> list[str]:
        """RULER's coded vocabulary: ``size`` distinct random lower-case words, sorted, shuffled, the first
        replaced by ``"..."`` (the noise word)."""
        words: set[str] = set()
        while len(words) < size:
            words.add("".join(rng.choices(string.ascii_lowercase, k=self.coded_wordlen)))
        vocab = sorted(words)
        rng.shuffle(vocab)
        vocab[0] = "..."
        return vocab

    def min_length(self, lm) -> int:
        """As :meth:`RulerTask.min_length`, and at least what a vocabulary of 5 words needs (RULER's
        ``(length - budget) // 50`` words; with ``vocab_size`` unset)."""
        return max(super().min_length(lm), 0 if self.vocab_size else 5 * 50 + self.budget)

    def builder(self, lm, cell: Cell, seed: int) -> FWEBuilder:
        """The :class:`FWEBuilder` of a cell.

        Raises:
            ValueError: the vocabulary the length implies is too small."""
        return FWEBuilder(self, lm, cell, seed)

    def make_record(self, lm, cell: Cell, seed: int) -> dict:
        return self.builder(lm, cell, seed).record()


RULER_OTHER_TASKS = {cls.name: register_task(cls) for cls in (VariableTracking, CommonWordsExtraction,
                                                              FrequentWordsExtraction)}
