"""Reasoning over facts scattered in book text, in the style of bAbI tasks 1-3 as BABILong uses them.

``babi_qa1``, ``babi_qa2``, ``babi_qa3``: a small simulated world (four people, six rooms, three objects: bAbI's
names) is run for a seeded number of steps; each step is one fact ("Mary went to the kitchen.", "John picked up
the football.", "John put down the football."), and a question is asked whose answer needs one, two or three of
those facts:

* ``babi_qa1`` (one supporting fact, bAbI task 1): "Where is Mary?" -- her latest move.
* ``babi_qa2`` (two supporting facts, bAbI task 2): "Where is the football?" -- who picked it up (or put it
  down) and where that person was (went) last.
* ``babi_qa3`` (three supporting facts, bAbI task 3): "Where was the football before the office?" -- the
  object's last two places, each set by a move of the person carrying it, and the pick-up between them.

The facts are hidden, in story order, between the sentences of a Project Gutenberg book (BABILong's PG19
background; here ``books/`` under the data dir, one book per sample, its window starting at a seeded sentence),
and the haystack is budgeted exactly like RULER's (the most book words whose prompt fits the length). The
**depth** is the place of the last supporting fact (the one that settles the answer): the story's earlier facts
are spread uniformly at random before it, its later facts after it.

Named honestly: lctx generates these stories itself, in the style of bAbI (Weston et al. 2015, "Towards
AI-Complete Question Answering: A Set of Prerequisite Toy Tasks", arXiv:1502.05698, tasks 1-3) and BABILong
(Kuratov et al. 2024, "BABILong: Testing the Limits of LLMs with Long Context Reasoning-in-a-Haystack",
NeurIPS 2024 Datasets and Benchmarks; github.com/booydar/babilong); they are not those benchmarks' files, and
scores are not comparable with theirs number for number. The answer is one word (a room), and the greedy
continuation after the answer prefix ("Answer: Mary is in the") is scored two ways: ``babilong_match``,
BABILong's own label match (booydar/babilong, babilong/metrics.py ``compare_answers`` with the task's labels,
the six rooms: its first sentence must name exactly the answer's room, rooms named in the question not counted),
and ``exact``, lctx's stricter first-word match.
"""

from __future__ import annotations

import functools
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lctx import metrics
from lctx.errors import LctxError

from .base import DECODE_STEP_TOKENS, Bound, Cell, Heatmap, Sample, Task, budget_bound, register_task
from .niah import content_key, sentence_start_words
from .textdata import MAX_TEXT_BYTES, check_file_size, corpus_files, read_text

PEOPLE = ("Mary", "John", "Daniel", "Sandra")  # bAbI tasks 1-3's actors
ROOMS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")  # BABILong's qa1-qa3 labels
#: BABILong's label vocabulary of each task (babilong/metrics.py ``TASK_LABELS["qa1"]``..``["qa3"]``: the rooms)
TASK_LABELS = {1: ROOMS, 2: ROOMS, 3: ROOMS}
OBJECTS = ("football", "apple", "milk")
MOVES = ("went to", "moved to", "journeyed to", "travelled to", "went back to")
PICKS = ("picked up", "got", "grabbed", "took")
DROPS = ("put down", "dropped", "discarded", "left")

INSTRUCTION = ("Below is a passage from a book. Hidden in it are short facts about where people go and what they "
               "carry. Answer the question from those facts alone; when the facts disagree, the latest one "
               "counts.\n\n<context>\n")
CONTEXT_END = "\n</context>\n\n"
DEFAULT_FACTS = {1: 10, 2: 16, 3: 24}  # facts per story (bAbI's stories of tasks 1-3 run 2-15, 2-45, 2-130)
MAX_TRIES = 1000  # stories drawn until one has a question of the task's kind
#: the most facts a story may have (``facts``): 10 000, 77 times bAbI's longest story (130 facts, task 3), ~60 K tokens
#: of facts; a story of that many is drawn in well under a second
MAX_FACTS = 10_000


@dataclass
class Story:
    """One world's facts and its question.

    facts: the sentences, in story order; question: e.g. "Where is Mary?"; prefix: the answer's start
    ("Mary is in the"); answer: the room; supporting: indices into ``facts`` of the facts the answer needs
    (sorted; the last one settles it).
    """

    facts: list[str]
    question: str
    prefix: str
    answer: str
    supporting: list[int] = field(default_factory=list)


def _qa1(rng: random.Random, n: int) -> Story | None:
    """bAbI task 1: n moves; "Where is P?" for a person who moved (their latest move supports it)."""
    facts, where, last = [], {}, {}
    for i in range(n):
        p = rng.choice(PEOPLE)
        room = rng.choice([r for r in ROOMS if r != where.get(p)])
        facts.append(f"{p} {rng.choice(MOVES)} the {room}.")
        where[p], last[p] = room, i
    p = rng.choice(sorted(where))
    return Story(facts, f"Where is {p}?", f"{p} is in the", where[p], [last[p]])


def _world(rng: random.Random, n: int):
    """n facts of moves, pick-ups and put-downs (bAbI tasks 2-3): a person picks up an object only where it is
    (or one not seen yet) and only while somewhere; a carried object moves with its carrier. Yields per fact
    (text, kind, person, object or None, the person's room after it)."""
    where: dict[str, str] = {}
    holder: dict[str, str | None] = {o: None for o in OBJECTS}
    at: dict[str, str | None] = {o: None for o in OBJECTS}  # an object's room when put down, None: unseen / carried
    out = []
    for _ in range(n):
        placed = [p for p in PEOPLE if p in where]
        carrying = [p for p in placed if any(holder[o] == p for o in OBJECTS)]
        r = rng.random()
        if placed and r < 0.25 and any(holder[o] is None and at[o] in (None, where[p]) for p in placed for o in OBJECTS):
            pairs = [(p, o) for p in placed for o in OBJECTS if holder[o] is None and at[o] in (None, where[p])]
            p, o = rng.choice(pairs)
            holder[o], at[o] = p, None
            out.append((f"{p} {rng.choice(PICKS)} the {o}.", "pick", p, o, where[p]))
        elif carrying and r < 0.40:
            p = rng.choice(carrying)
            o = rng.choice([o for o in OBJECTS if holder[o] == p])
            holder[o], at[o] = None, where[p]
            out.append((f"{p} {rng.choice(DROPS)} the {o}.", "drop", p, o, where[p]))
        else:
            p = rng.choice(PEOPLE)
            room = rng.choice([x for x in ROOMS if x != where.get(p)])
            where[p] = room
            out.append((f"{p} {rng.choice(MOVES)} the {room}.", "move", p, None, room))
    return out


def _history(events, obj: str) -> list[tuple[str, int, int | None]]:
    """The rooms ``obj`` has been in, in order: (room, index of the fact that put it there, index of the pick-up
    it was carried under, or None), a new entry whenever its room changes."""
    hist: list[tuple[str, int, int | None]] = []
    carrier, picked = None, None
    for i, (_, kind, p, o, room) in enumerate(events):
        if kind == "pick" and o == obj:
            carrier, picked = p, i
            if not hist or hist[-1][0] != room:
                hist.append((room, i, i))
        elif kind == "drop" and o == obj:
            carrier = None
        elif kind == "move" and p == carrier:
            hist.append((room, i, picked))
    return hist


def _last_move(events, person: str, before: int) -> int:
    """Index of ``person``'s last move before fact ``before``."""
    return max(i for i in range(before) if events[i][1] == "move" and events[i][2] == person)


def _qa2(rng: random.Random, n: int) -> Story | None:
    """bAbI task 2: "Where is the O?" for an object that has been picked up: where its carrier is now (the
    pick-up and the carrier's latest move), or where it was put down (the put-down and the move before it)."""
    ev = _world(rng, n)
    seen = [o for o in OBJECTS if any(e[1] == "pick" and e[3] == o for e in ev)]
    if not seen:
        return None
    o = rng.choice(seen)
    last = max(i for i, e in enumerate(ev) if e[3] == o)  # its last pick-up or put-down
    kind, p = ev[last][1], ev[last][2]
    if kind == "pick":
        moves = [i for i, e in enumerate(ev) if e[1] == "move" and e[2] == p]
        support = sorted({last, moves[-1]})
        answer = ev[moves[-1]][4]
    else:
        mv = _last_move(ev, p, last)
        support, answer = [mv, last], ev[last][4]
    return Story([e[0] for e in ev], f"Where is the {o}?", f"The {o} is in the", answer, support)


def _qa3(rng: random.Random, n: int) -> Story | None:
    """bAbI task 3: "Where was the O before the R?" where R is the object's current room and occurs once in its
    history: the room before R (the move or pick-up that put it there, the pick-up it was carried under, and the
    move that took it to R)."""
    ev = _world(rng, n)
    cands = []
    for o in OBJECTS:
        h = _history(ev, o)
        if len(h) >= 2 and [r for r, _, _ in h].count(h[-1][0]) == 1:
            cands.append((o, h))
    if not cands:
        return None
    o, h = rng.choice(cands)
    (before, i_before, _), (room, i_room, picked) = h[-2], h[-1]
    support = sorted({i_before, i_room} | ({picked} if picked is not None else set()))
    return Story([e[0] for e in ev], f"Where was the {o} before the {room}?",
                 f"Before the {room}, the {o} was in the", before, support)


MAKERS = {1: _qa1, 2: _qa2, 3: _qa3}


def make_story(task: int, seed: int, cell: Cell, n_facts: int) -> Story:
    """The story of one sample: deterministic in (task, seed, length, depth, sample) and the number of facts.

    Raises:
        ValueError: no story of ``n_facts`` facts with a question of this kind in :data:`MAX_TRIES` draws.
    """
    rng = random.Random(f"babi_qa{task}|{seed}|{cell.length}|{cell.depth}|{cell.sample}")
    for _ in range(MAX_TRIES):
        s = MAKERS[task](rng, n_facts)
        if s is not None:
            return s
    raise ValueError(f"facts={n_facts} is too few for a babi_qa{task} question; use facts >= {task * 3}")


def place_facts(rng: random.Random, n_facts: int, pin: int, depth: float) -> list[float]:
    """Positions in [0, 1] of the story's facts (non-decreasing, story order): fact ``pin`` at ``depth``, the
    facts before it uniformly in [0, depth], those after it uniformly in [depth, 1]."""
    before = sorted(rng.uniform(0.0, depth) for _ in range(pin))
    after = sorted(rng.uniform(depth, 1.0) for _ in range(n_facts - pin - 1))
    return before + [depth] + after


class Book:
    """A book as whitespace-separated words, repeated without end (as RULER repeats its essay), with the word
    indices that start a sentence (:func:`lctx.tasks.niah.sentence_start_words`)."""

    def __init__(self, text: str):
        self.words = [w for w in re.sub(r"\s+", " ", text).split(" ") if w]
        if len(self.words) < 2:
            raise LctxError("a babi haystack book holds fewer than 2 words; pass a book with text")
        self.W = len(self.words)
        self.starts = sentence_start_words(self.words)
        if not len(self.starts):
            self.starts = np.array([0], dtype=np.int64)

    def window(self, start: int, n: int) -> list[str]:
        """Words start..start+n-1 (wrapping around the book)."""
        if start + n <= self.W:
            return self.words[start:start + n]
        return [self.words[(start + i) % self.W] for i in range(n)]


@functools.lru_cache(maxsize=16)
def _load_book(path: str, content: tuple[str, ...]) -> Book:
    return Book(read_text(path, MAX_TEXT_BYTES, "haystack book"))


def load_book(path: str | os.PathLike) -> Book:
    """The :class:`Book` of a text file (Gutenberg header and footer stripped), cached in memory by content.

    Raises:
        LctxError: the file is larger than :data:`lctx.tasks.textdata.MAX_TEXT_BYTES` (refused by its size, before
            it is hashed or read), or :func:`lctx.tasks.textdata.read_text` refuses it.
    """
    check_file_size(path, MAX_TEXT_BYTES, "haystack book")
    return _load_book(str(path), content_key(path))


def book_files(task: str, haystack: str | os.PathLike, data_dir: str | os.PathLike | None) -> list[Path]:
    """The book files of a task's ``haystack`` option: a ``.txt`` file or a folder of them, relative to
    ``data_dir`` (else ``$LCTX_DATA_DIR``) or absolute (:func:`lctx.tasks.textdata.corpus_files`).

    Raises:
        LctxError: a relative path with no data dir, a path that does not exist, a folder without ``*.txt``.
    """
    raw = data_dir if data_dir not in (None, "") else os.environ.get("LCTX_DATA_DIR")
    hp = Path(haystack)
    if not hp.is_absolute():
        if not raw:
            raise LctxError(f"task {task!r} reads books: pass --data-dir DIR (the folder holding {haystack}/) or "
                            f"set LCTX_DATA_DIR (`lctx data --out DIR --only books` fetches them), or give an absolute "
                            f"--task-option {task}.haystack=PATH")
        hp = Path(raw) / hp
    if not hp.exists():  # name the task and both ways to point it at books (corpus_files would name only a path)
        raise LctxError(f"task {task!r} reads its books from '{hp}', which does not exist; pass the --data-dir "
                        f"holding {haystack}/ (e.g. ../shared/data; `lctx data --out DIR --only books`) or --task-option "
                        f"{task}.haystack=PATH")
    return corpus_files(hp)  # LctxError: an empty folder


#: The fewest sentence starts a haystack book must have: fewer cannot place a story's facts between sentences
#: (nor give mrcr answers that differ).
MIN_BOOK_SENTENCES = 100


def check_books(task: str, books: list[Path]) -> None:
    """Read every book now (:func:`load_book`): a binary, empty or too-short one is refused in one line before
    the sweep, not as a failed sample each time it is drawn.

    Raises:
        LctxError: a book is not text (:func:`lctx.tasks.textdata.read_text`) or has fewer than
            :data:`MIN_BOOK_SENTENCES` sentences.
    """
    for p in books:
        try:
            b = load_book(p)
        except LctxError as e:
            raise LctxError(f"task {task!r}: {e}") from None
        if len(b.starts) < MIN_BOOK_SENTENCES:
            raise LctxError(f"task {task!r}: book '{p}' has {len(b.starts)} sentences, fewer than "
                            f"{MIN_BOOK_SENTENCES}; give a real book (--task-option {task}.haystack=PATH)")


#: the most bytes of books one haystack may hold in all: 4 times the text lctx reads of one file, 6 times the
#: bundled PG books (11 MiB); a folder of 80 links to a 13 MiB book (1 GiB) took 67 s and 1.3 GB before any sample
MAX_HAYSTACK_BYTES = 64 << 20


class BookTask(Task):
    """What babi_qa* and mrcr share: a ``haystack`` of PG books (:func:`book_files`, set by :meth:`_set_books`),
    their content the run's data fingerprint, every book read before the sweep (:func:`check_books`)."""

    books: list[Path]

    def _set_books(self, haystack: str | os.PathLike, data_dir: str | os.PathLike | None) -> None:
        """Resolve the ``haystack`` option (:func:`book_files`).

        Raises:
            LctxError: as :func:`book_files`; a book larger than :data:`lctx.tasks.textdata.MAX_TEXT_BYTES`, or books
                larger than :data:`MAX_HAYSTACK_BYTES` in all (by their sizes, nothing read: a prompt uses a window of
                one book, and each book is read, checked and fingerprinted before the sweep).
        """
        self.books = book_files(self.name, haystack, data_dir)
        total = sum(check_file_size(p, MAX_TEXT_BYTES, f"{self.name}'s haystack book") for p in self.books)
        if total > MAX_HAYSTACK_BYTES:
            raise LctxError(f"{self.name}'s haystack {str(haystack)!r} holds {len(self.books)} books, "
                            f"{total / (1 << 20):.1f} MiB in all, above the {MAX_HAYSTACK_BYTES >> 20} MiB lctx reads "
                            "for one task (every book is checked and fingerprinted before the sweep); pass a folder "
                            "with fewer books (--task-option TASK.haystack=FOLDER)")

    def data_files(self) -> dict[str, Path]:
        """The books a sample may draw (their content is the run's data fingerprint)."""
        return {p.name: p for p in self.books}

    def check_data(self) -> None:
        """:func:`check_books` before any model loads.

        Raises:
            LctxError: a book that is not text or too short.
        """
        check_books(self.name, self.books)


class BabiQA(BookTask):
    """Base of ``babi_qa1``-``babi_qa3`` (subclasses set ``name`` and ``hops``): bAbI-style facts of a simulated
    world hidden in book text at a target length and depth (the last supporting fact's place).

    Options (``--task-option babi_qa2.KEY=VALUE``):
        facts: facts per story (default 10, 16, 24 for qa1, qa2, qa3; at most :data:`MAX_FACTS`, and 4 tokens
            each below the run's longest length).
        haystack: the book file, or a folder of ``*.txt`` books (one drawn per sample, seeded), relative to the
            data dir or absolute (default ``books``: the PG books of ``../shared/data``).
        data_dir: the data root (default ``$LCTX_DATA_DIR``; ``lctx run --data-dir``).
        max_new_tokens: greedy budget (default: the longest room's tokens + 3).

    Metrics:
        babilong_match: BABILong's ``compare_answers`` (:func:`lctx.metrics.babilong_match`) of the greedy
            continuation, with the task's labels (:data:`TASK_LABELS`) and the question: 1.0 when its first
            sentence names the answer's room and no other room (rooms in the question not counted).
        exact: lctx's: 1.0 when the first word of the greedy continuation (letters only, case-insensitive) is the
            answer's room (" the kitchen" is 0, " kitchen, or maybe the garden" is 1).

    Version 2: ``babilong_match`` added as the headline (version 1 records hold only ``exact``).

    Raises (constructor):
        LctxError: no data dir, or no book at ``haystack``.
        ValueError: a facts count or budget outside its :attr:`option_bounds` (a whole number from 1 to the cap).
    """

    hops: int = 1
    batched = True
    axes = ("depth", "sample")
    metrics = ("babilong_match", "exact")
    headline_metric = "babilong_match"
    version = 2  # babilong_match (BABILong's) added: records of version 1 are not resumed into a new run
    category = "reasoning"
    requires = "books/ under --data-dir (any *.txt books)"
    option_hints = {"haystack": "a .txt book or a folder of them"}
    #: facts: a fact ("Mary got the milk.") is at least 4 tokens, so the facts must stay below the longest length / 4;
    #: capped at :data:`MAX_FACTS`
    option_bounds = {"facts": Bound(1, MAX_FACTS, per_length=4, unit="facts",
                                    why="77 times bAbI's longest story, task 3's 130 facts"),
                     "max_new_tokens": budget_bound()}
    plots = ("depth_heatmap",)

    def __init__(self, facts: int | None = None, haystack: str = "books", data_dir: str | os.PathLike | None = None,
                 max_new_tokens: int | None = None, **options):
        # facts, max_new_tokens: checked against option_bounds before this runs (Task.__new__)
        super().__init__(facts=facts, haystack=haystack, max_new_tokens=max_new_tokens, **options)
        self.n_facts = int(float(facts)) if facts is not None else DEFAULT_FACTS[self.hops]
        self.max_new_tokens = None if max_new_tokens is None else int(float(max_new_tokens))
        self._set_books(haystack, data_dir)

    def _user(self, book: Book, start: int, n: int, story: Story, pos: list[float]) -> tuple[str, int]:
        """(user text, character offset of the last supporting fact) with ``n`` book words from ``start`` and the
        facts inserted, in order, at the sentence starts nearest their positions."""
        words = book.window(start, n)
        rel = book.starts - start
        if start + n > book.W:  # wrapped: the window's sentence starts, over every copy it spans
            rel = np.concatenate([book.starts + k * book.W - start for k in range((start + n) // book.W + 1)])
        cuts = np.unique(np.concatenate([[0, n], rel[(rel > 0) & (rel < n)]]))
        at = [int(cuts[np.abs(cuts - p * n).argmin()]) for p in pos]
        pin = story.supporting[-1]
        pieces, offset, prev, pin_at = [], len(INSTRUCTION), 0, 0
        for i, (cut, fact) in enumerate(zip(at, story.facts)):
            chunk = " ".join(words[prev:cut])
            if chunk:
                pieces.append(chunk)
                offset += len(chunk) + 1
            if i == pin:
                pin_at = offset
            pieces.append(fact)
            offset += len(fact) + 1
            prev = cut
        tail = " ".join(words[prev:])
        if tail:
            pieces.append(tail)
        context = " ".join(pieces)
        return INSTRUCTION + context + CONTEXT_END + f"Question: {story.question}", pin_at

    def _new(self, lm) -> int:
        return self.max_new_tokens or max(len(lm.encode(" " + r)) for r in ROOMS) + 3

    def _draw(self, seed: int, cell: Cell):
        """(story, fact positions, book path, book, start word) of a sample, from the seed and the cell."""
        story = make_story(self.hops, seed, cell, self.n_facts)
        rng = random.Random(f"babi_qa{self.hops}|place|{seed}|{cell.length}|{cell.depth}|{cell.sample}")
        depth = 0.5 if cell.depth is None else float(cell.depth)
        pos = place_facts(rng, len(story.facts), story.supporting[-1], depth)
        path = self.books[rng.randrange(len(self.books))]
        book = load_book(path)
        start = int(book.starts[rng.randrange(len(book.starts))])
        return story, pos, path, book, start

    def min_length(self, lm) -> int:
        """Tokens of the prompt with no book words (instruction, facts, question, answer prefix) plus the answer's
        budget, the fewest over 4 stories: a lower bound (:meth:`Task.min_length`)."""
        out = []
        for s in range(4):
            story = make_story(self.hops, 0, Cell(1 << 30, 0.5, s), self.n_facts)
            book = Book("Word. " * 4)
            user, _ = self._user(book, 0, 0, story, [0.0] * len(story.facts))
            out.append(len(lm.prompt(user, "\nAnswer: " + story.prefix).ids))
        return min(out) + self._new(lm)

    def cost(self, lm, cell: Cell) -> float:
        """Prefill of the prompt plus the greedy decode steps, in prefill tokens (:data:`DECODE_STEP_TOKENS`)."""
        return float(cell.length + self._new(lm) * DECODE_STEP_TOKENS)

    def build(self, lm, cell: Cell, seed: int) -> Sample:
        """The most book words N whose prompt is at most ``lm.prompt_budget(length, max_new_tokens)`` tokens
        (bisection on N), the facts hidden at their drawn places.

        Raises:
            ValueError: the length cannot hold the instruction, the facts and the question.
        """
        story, pos, path, book, start = self._draw(seed, cell)
        new = self._new(lm)
        budget = lm.prompt_budget(cell.length, new)
        prefix = "\nAnswer: " + story.prefix

        def prompt(n: int):
            user, at = self._user(book, start, n, story, pos)
            return lm.prompt(user, prefix, marks=[at])

        def fits(n: int) -> bool:
            return len(prompt(n).ids) <= budget

        if not fits(0):
            raise ValueError(f"length {cell.length} is shorter than the {self.name} template with its "
                             f"{len(story.facts)} facts ({len(prompt(0).ids)} tokens); use a longer length or "
                             "fewer facts")
        hi = max(2, budget)  # a word is at least one token in common tokenizers; doubled below if not
        while fits(hi):
            hi *= 2
        lo = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        p = prompt(lo)
        return Sample(cell=cell, input_ids=p.ids, n_tokens=len(p.ids), depth=p.marks[0] / len(p.ids),
                      meta={"answer": story.answer, "question": story.question,
                            "supporting": ",".join(map(str, story.supporting)), "n_facts": len(story.facts),
                            "book": path.name, "start_word": start, "n_words": lo, "max_new_tokens": new})

    def max_new_tokens_for(self, sample: Sample) -> int:
        """The greedy budget (the longest room's tokens + 3, or ``max_new_tokens``)."""
        return int(sample.meta.get("max_new_tokens") or self.max_new_tokens or 8)

    def score_generated(self, lm, sample: Sample, prefix, cont: list[int]) -> dict:
        """babilong_match: BABILong's label match of the continuation (with the task's labels and the sample's
        question); exact: its first word equals the answer (:func:`first_word`)."""
        text = lm.decode(cont)
        sample.meta["continuation"] = text
        answer = sample.meta["answer"]
        return {"babilong_match": metrics.babilong_match(text, answer, sample.meta["question"], TASK_LABELS[self.hops]),
                "exact": metrics.exact(first_word(text), answer)}


_WORD = re.compile(r"[A-Za-z]+")


def first_word(text: str) -> str | None:
    """The first run of letters in ``text``, lower-cased, or None: " kitchen." -> "kitchen", "Kitchen" ->
    "kitchen", " kitchens" -> "kitchens" (not the answer kitchen), " the garden" -> "the"."""
    m = _WORD.search(text)
    return m.group(0).lower() if m else None


def _register(hops: int, what: str) -> type[BabiQA]:
    cls = type(f"BabiQA{hops}", (BabiQA,), {
        "name": f"babi_qa{hops}", "hops": hops,
        "description": f"bAbI/BABILong-style reasoning, {what} in PG book text (generated by lctx)",
        "heatmap": Heatmap(title=f"babi_qa{hops}: {what}", depth_label="Last supporting fact's depth",
                           panels={"babilong_match": "BABILong label match", "exact": "First word exact"},
                           narrow=True),
        "__doc__": f"``babi_qa{hops}``: {what} (see :class:`BabiQA`).",
        "__module__": __name__})
    return register_task(cls)


BabiQA1 = _register(1, "one supporting fact")
BabiQA2 = _register(2, "two supporting facts")
BabiQA3 = _register(3, "three supporting facts")
