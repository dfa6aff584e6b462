"""Multi-round coreference resolution, after OpenAI's MRCR.

OpenAI MRCR (``openai/mrcr`` on Hugging Face, 2025; after Gemini's MRCR, Vodrahalli et al. 2024, "Michelangelo:
Long Context Evaluations Beyond Haystacks via Latent Structure Queries") is a long conversation of user requests
("write a poem about tapirs") and assistant answers in which 2, 4 or 8 requests are the same; the last turn asks
the model to reproduce the k-th answer to that request, starting with a random string. lctx builds it from local
data:

* requests ``Write a STYLE about TOPIC.`` from 8 styles x 24 topics; ``needles`` of them (default 2; MRCR's 2, 4
  or 8) are one and the same request, the others any other (style, topic);
* each assistant answer is a passage of a Project Gutenberg book (``books/`` under the data dir: ``answer_words``
  words from a seeded sentence start), so the answers are real text and the needles' answers differ;
* the final user turn: ``Prepend RANDOM to the K-th (1st, 2nd, ...) STYLE about TOPIC. Do not include any other
  text in your response.``, RANDOM 10 random letters and digits, as MRCR's ``random_string_to_prepend``.

The whole conversation goes through the model's chat template (a model without one is refused in one line),
budgeted exactly: the most turns whose prompt fits the length with the answer's tokens held back. The **depth**
is the place of the asked (k-th) needle among the turns; k is drawn among the values the depth allows (k - 1
needles before it, the rest after).

Scored as MRCR: ``mrcr_grade`` is MRCR's ``grade`` character for character, 0 unless the response starts with
RANDOM (a leading space or newline included), else the ``difflib.SequenceMatcher`` ratio of the rest and the
expected answer (:func:`lctx.metrics.mrcr_grade`); ``mrcr_stripped`` is lctx's: the same after the response's
leading whitespace is removed (:func:`lctx.metrics.mrcr_stripped`; what lctx recorded as ``mrcr`` before issue
42); ``sequence_ratio`` is the ratio without the prefix rule (:func:`lctx.metrics.sequence_ratio`), for models
that find the answer but do not follow the instruction. These are lctx's conversations, not MRCR's files: not
comparable with MRCR's numbers one for one.
"""

from __future__ import annotations

import os
import random
import string

from lctx import metrics

from .babi import BookTask, load_book
from .base import DECODE_STEP_TOKENS, Bound, Cell, Heatmap, Sample, register_task

STYLES = ("poem", "short story", "riddle", "letter", "speech", "diary entry", "dialogue", "song")
TOPICS = ("tapirs", "lighthouses", "the moon", "bread", "winter", "a lost key", "trains", "bees", "the ocean",
          "a market", "clocks", "foxes", "rain", "a library", "bridges", "tea", "mountains", "a kite", "owls",
          "a garden", "candles", "rivers", "snow", "a violin")
ORDINALS = ("1st", "2nd", "3rd", "4th", "5th", "6th", "7th", "8th")
FINAL = "Prepend {prefix} to the {ordinal} {style} about {topic}. Do not include any other text in your response."


def request(style: str, topic: str) -> str:
    """A user turn: ``Write a poem about tapirs.`` (``an`` before a vowel)."""
    return f"Write {'an' if style[0] in 'aeiou' else 'a'} {style} about {topic}."


@register_task
class MRCR(BookTask):
    """Multi-round coreference (OpenAI MRCR's format) at a target length and depth (the asked needle's turn).

    Options (``--task-option mrcr.KEY=VALUE``):
        needles: how many requests repeat (2, 4 or 8 as MRCR; any whole number from 2 to 8).
        answer_words: words of book text per assistant answer (default 60; at most 10 000, and 3 per word below
            the run's longest length).
        haystack: a book or a folder of ``*.txt`` books, relative to the data dir or absolute (default ``books``).
        data_dir: the data root (default ``$LCTX_DATA_DIR``; ``lctx run --data-dir``).

    Metrics:
        mrcr_grade: MRCR's grade (the prefix first, character for character, then the sequence-match ratio), 0..1.
        mrcr_stripped: lctx's: MRCR's grade of the response without its leading whitespace, 0..1.
        sequence_ratio: the sequence-match ratio without the prefix rule, 0..1.

    Version 2: ``mrcr`` (MRCR's grade after stripping leading whitespace, which MRCR's grade does not
    do) is now ``mrcr_stripped``, beside MRCR's own ``mrcr_grade``.

    Raises (constructor):
        ValueError: ``needles`` outside 2..8 or ``answer_words`` outside 1..10 000 (:attr:`option_bounds`).
        LctxError: no data dir, or no book at ``haystack``.
    """

    name = "mrcr"
    batched = True
    axes = ("depth", "sample")
    metrics = ("mrcr_grade", "mrcr_stripped", "sequence_ratio")
    headline_metric = "mrcr_grade"
    version = 2  # mrcr -> mrcr_grade (MRCR's) + mrcr_stripped: records of version 1 are not resumed into a new run
    secondary_metric = "sequence_ratio"
    category = "multi-round"
    description = "multi-round coreference (OpenAI MRCR's format): reproduce the k-th of repeated requests"
    requires = "books/ under --data-dir (any *.txt books); a model with a chat template"
    adapter_needs = {"chat_prompt": "renders the conversation with the model's chat template"}
    option_hints = {"haystack": "a .txt book or a folder of them"}
    #: needles: MRCR's 2, 4 or 8 (:data:`ORDINALS` names 8); answer_words: the prompt holds at least two needles'
    #: answers and the reply budget a third, each word at least a token (3 per word); capped at 10 000 words (a
    #: 40-page chapter; MRCR's answers are a few hundred words), so a far-off value never fills memory
    option_bounds = {"needles": Bound(2, 8, why="MRCR's 2, 4 or 8 repeated requests"),
                     "answer_words": Bound(1, 10_000, per_length=3, unit="words",
                                           why="a 40-page chapter; MRCR's answers run a few hundred words")}
    plots = ("depth_heatmap",)
    heatmap = Heatmap(title="MRCR (multi-round coreference)", depth_label="Asked needle's turn (0% = first)",
                      panels={"mrcr_grade": "MRCR grade", "mrcr_stripped": "MRCR grade, leading space removed",
                              "sequence_ratio": "Sequence ratio"}, narrow=True)

    def __init__(self, needles: int = 2, answer_words: int = 60, haystack: str = "books",
                 data_dir: str | os.PathLike | None = None, **options):
        # needles, answer_words: checked against option_bounds before this runs (Task.__new__)
        super().__init__(needles=needles, answer_words=answer_words, haystack=haystack, **options)
        self.needles, self.answer_words = int(float(needles)), int(float(answer_words))
        self._set_books(haystack, data_dir)

    def _answer(self, rng: random.Random) -> str:
        """An assistant answer: ``answer_words`` words of a book from a seeded sentence start."""
        book = load_book(self.books[rng.randrange(len(self.books))])
        start = int(book.starts[rng.randrange(len(book.starts))])
        return " ".join(book.window(start, self.answer_words))

    def conversation(self, seed: int, cell: Cell, n_turns: int) -> tuple[list[dict], dict]:
        """The messages of ``n_turns`` request/answer pairs and the final question, deterministic in (seed, cell,
        n_turns); and {"prefix", "answer", "k", "turn", "style", "topic"}: the random string, the expected answer
        (the k-th needle's), k, the asked needle's turn (0-based)."""
        rng = random.Random(f"mrcr|{seed}|{cell.length}|{cell.depth}|{cell.sample}|{n_turns}")
        depth = 0.5 if cell.depth is None else float(cell.depth)
        style, topic = rng.choice(STYLES), rng.choice(TOPICS)
        turn = int(round(depth * (n_turns - 1)))
        n = self.needles
        k = rng.randint(max(1, n - (n_turns - 1 - turn)), min(n, turn + 1))  # k - 1 before, n - k after
        before = sorted(rng.sample(range(turn), k - 1))
        after = sorted(rng.sample(range(turn + 1, n_turns), n - k))
        needle_turns = set(before) | {turn} | set(after)
        others = [(s, t) for s in STYLES for t in TOPICS if (s, t) != (style, topic)]
        msgs, answers = [], []
        for i in range(n_turns):
            s, t = (style, topic) if i in needle_turns else rng.choice(others)
            a = self._answer(rng)
            msgs += [{"role": "user", "content": request(s, t)}, {"role": "assistant", "content": a}]
            if i in needle_turns:
                answers.append(a)
        prefix = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(10))
        msgs.append({"role": "user", "content": FINAL.format(prefix=prefix, ordinal=ORDINALS[k - 1], style=style,
                                                              topic=topic)})
        return msgs, {"prefix": prefix, "answer": answers[k - 1], "k": k, "turn": turn, "style": style,
                      "topic": topic}

    def _new(self, lm, info: dict) -> int:
        """Greedy budget of a conversation: the expected response's tokens (prefix and answer) + 16."""
        return len(lm.encode(info["prefix"] + info["answer"])) + 16

    def _prompt(self, lm, seed: int, cell: Cell, t: int):
        """(prompt, info, its greedy budget) of the conversation of ``t`` turns."""
        msgs, info = self.conversation(seed, cell, t)
        return lm.chat_prompt(msgs), msgs, info, self._new(lm, info)

    def min_length(self, lm) -> int:
        """Tokens of a conversation of ``needles`` turns plus its answer's budget, the fewest over 4 draws; raises
        the one-line error of :meth:`lctx.models.adapters.text.TokenizerSide.chat_prompt` for a model without a
        chat template (so the run refuses before its sweep)."""
        sizes = []
        for s in range(4):
            p, _, _, new = self._prompt(lm, 0, Cell(1 << 30, 0.5, s), self.needles)
            sizes.append(len(p.ids) + new)
        return min(sizes)

    def cost(self, lm, cell: Cell) -> float:
        """Prefill plus the greedy decode steps (about 2 tokens per answer word), in prefill tokens
        (:data:`DECODE_STEP_TOKENS`)."""
        return float(cell.length + 2 * self.answer_words * DECODE_STEP_TOKENS)

    def build(self, lm, cell: Cell, seed: int) -> Sample:
        """The most turns T whose conversation fits ``lm.prompt_budget(length, its greedy budget)`` tokens
        (bisection on T), the asked needle at turn ``round(depth * (T - 1))``.

        Raises:
            ValueError: the length cannot hold ``needles`` turns.
        """
        def fits(t: int) -> bool:
            p, _, _, new = self._prompt(lm, seed, cell, t)
            return len(p.ids) <= lm.prompt_budget(cell.length, new)

        n = self.needles
        if not fits(n):
            p, _, _, new = self._prompt(lm, seed, cell, n)
            raise ValueError(f"length {cell.length} is shorter than an mrcr conversation of {n} turns "
                             f"({len(p.ids)} tokens + {new} for the answer); use a longer length or fewer "
                             "answer_words")
        hi = 2 * n
        while fits(hi):
            hi *= 2
        lo = n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        p, msgs, info, new = self._prompt(lm, seed, cell, lo)
        # the asked needle's answer: its token position (the conversation's text up to it, encoded)
        at = p.text.index(msgs[2 * info["turn"] + 1]["content"])
        return Sample(cell=cell, input_ids=p.ids, n_tokens=len(p.ids), depth=len(lm.encode(p.text[:at])) / len(p.ids),
                      meta={**info, "n_turns": lo, "max_new_tokens": new})

    def max_new_tokens_for(self, sample: Sample) -> int:
        """The expected response's tokens + 16 (the budget its prompt held back)."""
        return int(sample.meta["max_new_tokens"])

    def score_generated(self, lm, sample: Sample, prefix, cont: list[int]) -> dict:
        """mrcr_grade, mrcr_stripped and sequence_ratio of the greedy continuation as decoded
        (:func:`lctx.metrics.mrcr_grade`, :func:`lctx.metrics.mrcr_stripped`, :func:`lctx.metrics.sequence_ratio`)."""
        text = lm.decode(cont)
        sample.meta["continuation"] = text[:200]
        answer, rand = sample.meta["answer"], sample.meta["prefix"]
        sample.meta["answer"] = answer[:60]  # its start (book text, rebuilt from the seed), not the whole passage
        return {"mrcr_grade": metrics.mrcr_grade(text, answer, rand),
                "mrcr_stripped": metrics.mrcr_stripped(text, answer, rand),
                "sequence_ratio": metrics.sequence_ratio(text, answer, rand)}
