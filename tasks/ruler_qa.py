"""RULER's QA tasks: ``qa_1`` (SQuAD v2.0 dev) and ``qa_2`` (HotpotQA dev, distractor setting): a question
whose gold paragraph(s) sit among distractor paragraphs up to the length.

Reference: Hsieh et al. 2024 (RULER), section 3.4; code NVIDIA/RULER ``scripts/data/synthetic/qa.py``
(``read_squad``, ``read_hotpotqa``, ``generate_input_output``), the ``qa`` entry of
``scripts/data/synthetic/constants.py`` (template, answer prefix " Answer:", 32 tokens to generate),
``scripts/synthetic.yaml`` (qa_1: squad, qa_2: hotpotqa) and ``scripts/eval/synthetic/constants.py``
(metric ``string_match_part``: 1 when any reference answer is in the prediction).

What is RULER's:

* the data reading: SQuAD's documents are the distinct paragraph contexts (sorted), its questions the
  answerable ones (``is_impossible`` false) in file order with all their answer texts as references, and the
  other paragraphs of the same article as the first distractors; HotpotQA's documents are
  ``title + "\\n" + "".join(sentences)`` (sorted, distinct), each question with its answer and its ten
  paragraphs;
* sample i asks question i (RULER takes the first ``num_samples`` questions, the same at every length);
* the context ``"\\n\\n".join("Document {i}:\\n{document}")`` and the template + answer prefix, verbatim.

What lctx does differently:

* data: RULER downloads ``json/squad.json`` (``dev-v2.0.json``) and ``json/hotpotqa.json``
  (``hotpot_dev_distractor_v1.json``); lctx never downloads. It reads a local copy in the official format,
  given by the option ``path=FILE`` or found under the data dir (``--data-dir`` / ``LCTX_DATA_DIR``) as one of
  :data:`SQUAD_FILES` / :data:`HOTPOT_FILES`;
* the gold documents (SQuAD: the question's paragraph; HotpotQA: the paragraphs named in its
  ``supporting_facts``) are a depth axis: they go, together, to the document boundary whose character offset
  is nearest ``depth`` x the context; RULER shuffles all documents with a fixed seed. HotpotQA's other eight
  paragraphs of the question are its first distractors (RULER always includes all ten);
* exact budgets: the number of distractors is the largest with ``len(prompt ids) + max_new_tokens <= length``
  (BOS or chat template included); the distractors are the hard ones first (same article / same question, in random order), then
  random other documents (the document list repeats when a length needs more than the file has, as RULER's
  does); their order in the context is random but fixed per sample, so the search is monotone;
* with a seed other than 0, sample i asks question ``perm(i)`` of a seeded permutation.
"""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lctx.errors import LctxError

from .base import Cell, register_task
from .textdata import check_file_size
from .niah import content_key
from .ruler import HaystackBuilder, RulerTask

#: scripts/data/synthetic/constants.py, TASKS["qa"] (verbatim)
QA_TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and do not output any "
               "other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the "
               "given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}")
QA_ANSWER_PREFIX = " Answer:"
QA_TOKENS_TO_GENERATE = 32
#: scripts/data/synthetic/qa.py
DOCUMENT_PROMPT = "Document {i}:\n{document}"

#: Where lctx looks for the data under the data dir, first match wins: RULER's own name, then the official one.
SQUAD_FILES = ("ruler/squad.json", "squad/dev-v2.0.json", "squad_v2/dev-v2.0.json", "dev-v2.0.json")
HOTPOT_FILES = ("ruler/hotpotqa.json", "hotpotqa/hotpot_dev_distractor_v1.json", "hotpot_dev_distractor_v1.json")
#: the largest question file read (it is parsed whole): 128 MiB, 2.8 times HotpotQA's dev distractor file (46 MB;
#: SQuAD 2.0's dev file is 4.4 MB); refused by its size before it is read
MAX_QA_BYTES = 128 << 20


@dataclass(frozen=True)
class QAItem:
    """One question: the query, its reference answers, its gold documents, its hard distractors (indices
    into the document list)."""

    query: str
    outputs: tuple[str, ...]
    gold: tuple[int, ...]
    hard: tuple[int, ...]


@dataclass(frozen=True)
class QAData:
    """A QA file read as RULER reads it: ``docs`` (sorted distinct documents) and ``items``."""

    docs: tuple[str, ...]
    items: tuple[QAItem, ...]


def read_squad(data) -> QAData:
    """RULER's ``read_squad`` on the parsed SQuAD JSON (``{"data": [{"paragraphs": [{"context", "qas"}]}]}``);
    lctx also keeps each question's paragraph as its gold document. A question without ``is_impossible``
    (SQuAD v1.1) counts as answerable."""
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    idx = {c: i for i, c in enumerate(docs)}
    items = []
    for d in data["data"]:
        more = [idx[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            me = idx[p["context"]]
            for qa in p["qas"]:
                if not qa.get("is_impossible", False):
                    items.append(QAItem(qa["question"], tuple(a["text"] for a in qa["answers"]), (me,),
                                        tuple(i for i in more if i != me)))
    return QAData(tuple(docs), tuple(items))


def read_hotpotqa(data) -> QAData:
    """RULER's ``read_hotpotqa`` on the parsed HotpotQA JSON (a list of ``{"question", "answer", "context":
    [[title, [sentences]]], "supporting_facts": [[title, sent_id]]}``); gold = the paragraphs whose title is in
    ``supporting_facts`` (all ten when none matches), hard distractors = the question's other paragraphs."""
    def doc(t, p):
        return f"{t}\n{''.join(p)}"

    docs = sorted({doc(t, p) for d in data for t, p in d["context"]})
    idx = {c: i for i, c in enumerate(docs)}
    items = []
    for d in data:
        titles = {sf[0] for sf in d.get("supporting_facts", [])}
        mine = [(t, idx[doc(t, p)]) for t, p in d["context"]]
        gold = [i for t, i in mine if t in titles] or [i for _, i in mine]
        gold = list(dict.fromkeys(gold))
        items.append(QAItem(d["question"], (d["answer"],), tuple(gold),
                            tuple(dict.fromkeys(i for _, i in mine if i not in gold))))
    return QAData(tuple(docs), tuple(items))


@functools.lru_cache(maxsize=4)
def _load(path: str, kind: str, content: tuple[str, ...]) -> QAData:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return read_squad(data) if kind == "squad" else read_hotpotqa(data)


def load_qa(path: str | os.PathLike, kind: str, task: str) -> QAData:
    """Read a SQuAD (``kind="squad"``) or HotpotQA (``"hotpotqa"``) JSON file (cached in memory by its content,
    :func:`lctx.models.fingerprint.content_key`: a same-size, same-mtime rewrite is read again).

    Raises:
        LctxError: the file is unreadable, not JSON, not in the official format, or has no usable question.
    """
    p = Path(path)
    want = ('SQuAD v2.0 JSON ({"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"question", '
            '"answers", "is_impossible"}]}]}]}, e.g. dev-v2.0.json)' if kind == "squad" else
            'HotpotQA JSON (a list of {"question", "answer", "supporting_facts", "context": [[title, [sentences]]]}, '
            'e.g. hotpot_dev_distractor_v1.json)')
    try:
        p.stat()
        out = _load(str(p.resolve()), kind, content_key(p))
    except OSError as e:
        raise LctxError(f"task {task!r}: cannot read {str(p)!r} ({e.strerror or e}); pass the {want}") from None
    except json.JSONDecodeError as e:
        raise LctxError(f"task {task!r}: {str(p)!r} is not JSON ({e.msg} at line {e.lineno}); pass the {want}") from None
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        raise LctxError(f"task {task!r}: {str(p)!r} is not in the official format (missing {e}); pass the {want}") from None
    if not out.items or not out.docs:
        raise LctxError(f"task {task!r}: {str(p)!r} has no answerable question; pass the {want}")
    return out


def find_qa_file(kind: str, data_dir: str | os.PathLike | None) -> Path | None:
    """The first of :data:`SQUAD_FILES` / :data:`HOTPOT_FILES` under ``data_dir`` (or ``$LCTX_DATA_DIR``), or None."""
    raw = data_dir if data_dir not in (None, "") else os.environ.get("LCTX_DATA_DIR")
    if not raw:
        return None
    for rel in (SQUAD_FILES if kind == "squad" else HOTPOT_FILES):
        if (Path(raw) / rel).is_file():
            return Path(raw) / rel
    return None


class RulerQA(RulerTask):
    """Base of RULER's ``qa_1`` / ``qa_2`` (subclasses set ``name`` and ``dataset``).

    Options: ``path`` (the JSON file; default: found under ``data_dir``, see :func:`find_qa_file`),
    ``data_dir``, and those of :class:`RulerTask` (``max_new_tokens`` default 32, RULER's). Axes: depth of the
    gold document(s) and sample (= question index). Metric: ``string_match_part`` (RULER's).

    Raises (constructor):
        LctxError: no file given or found, or a file :func:`load_qa` refuses.
    """

    category = "QA"

    dataset: str = "squad"
    axes = ("depth", "sample")
    metrics = ("string_match_part",)
    heatmap_metrics = ("string_match_part",)
    tokens_to_generate = QA_TOKENS_TO_GENERATE

    def __init__(self, path: str | os.PathLike | None = None, match: str = "substring",
                 max_new_tokens: int | None = None, data_dir: str | os.PathLike | None = None,
                 cache_dir: str | os.PathLike | None = None, cache: bool = True):
        self._setup(match, max_new_tokens, cache_dir, cache)
        files = SQUAD_FILES if self.dataset == "squad" else HOTPOT_FILES
        p = Path(path) if path not in (None, "") else find_qa_file(self.dataset, data_dir)
        if p is None:
            raise LctxError(self.missing_data_message(data_dir, files))
        self.path = p
        self._files["qa"] = p
        check_file_size(p, MAX_QA_BYTES, f"task {self.name!r}'s question file", "2.8 times HotpotQA's dev file")
        self.data = load_qa(p, self.dataset, self.name)

    @classmethod
    def missing_data_message(cls, data_dir=None, files=None) -> str:
        """Why the task cannot run without data, and how to give it."""
        files = files or (SQUAD_FILES if cls.dataset == "squad" else HOTPOT_FILES)
        where = f"under {str(data_dir)!r} " if data_dir not in (None, "") else ""
        official = "SQuAD v2.0 dev (dev-v2.0.json)" if cls.dataset == "squad" else \
            "HotpotQA dev distractor (hotpot_dev_distractor_v1.json)"
        return (f"task {cls.name!r} needs the {official} JSON, which lctx never downloads; none found {where}"
                f"({' or '.join(files)}); pass --task-option {cls.name}.path=FILE or put it under --data-dir")

    def generation_config(self) -> dict:
        return {"dataset": self.dataset}

    def question_index(self, sample: int, seed: int) -> int:
        """The question a sample asks: ``sample`` (RULER: the first questions in file order) for seed 0, else
        the ``sample``-th of a permutation seeded with ``seed``; modulo the number of questions."""
        n = len(self.data.items)
        if seed == 0:
            return sample % n
        return random.Random(f"lctx-ruler|{self.name}|questions|{seed}").sample(range(n), n)[sample % n]

    def builder(self, lm, cell: Cell, seed: int) -> "QABuilder":
        """The :class:`QABuilder` of a cell."""
        return QABuilder(self, lm, cell, seed)

    def make_record(self, lm, cell: Cell, seed: int) -> dict:
        return self.builder(lm, cell, seed).record()


class QABuilder(HaystackBuilder):
    """A QA sample: the question of :meth:`RulerQA.question_index`, its gold document(s) at the depth and ``n``
    distractors (hard ones first, then random documents; their context order fixed by random keys)."""

    def __init__(self, task: RulerQA, lm, cell: Cell, seed: int):
        super().__init__(task, lm, cell, seed)
        self.depth = 0.5 if cell.depth is None else float(cell.depth)
        rng = random.Random(self.tag)
        self.qi = task.question_index(cell.sample, seed)
        self.item = task.data.items[self.qi]
        docs = task.data.docs
        self.gold = list(self.item.gold)
        rng.shuffle(self.gold)
        hard = list(self.item.hard)
        rng.shuffle(hard)
        taken = set(self.gold) | set(hard)
        self.pool = hard + [i for i in rng.sample(range(len(docs)), len(docs)) if i not in taken]
        if not self.pool:  # a file of one document: it repeats (RULER repeats its document list)
            self.pool = list(range(len(docs)))
        self.keys = [rng.random() for _ in range(len(self.pool))]

    def layout(self, n: int) -> tuple[list[int], int]:
        """(document indices in context order, position of the first gold document) with n distractors: the
        first n of the pool (cycled), ordered by their keys; the gold block at the boundary whose character
        offset is nearest depth x the context (first of equally near)."""
        docs, P = self.task.data.docs, len(self.pool)
        sel = sorted(range(n), key=lambda j: (self.keys[j % P], j))
        order = [self.pool[j % P] for j in sel]
        sizes = [len(DOCUMENT_PROMPT.format(i=k + 1, document=docs[d])) + 2 for k, d in enumerate(order)]
        offs = np.concatenate([[0], np.cumsum(sizes)]) if sizes else np.zeros(1)
        at = int(np.argmin(np.abs(offs - self.depth * max(float(offs[-1]), 1.0))))
        return order[:at] + self.gold + order[at:], at

    def parts(self, n: int) -> tuple[str, str]:
        docs = self.task.data.docs
        order, _ = self.layout(n)
        ctx = "\n\n".join(DOCUMENT_PROMPT.format(i=k + 1, document=docs[d]) for k, d in enumerate(order))
        return QA_TEMPLATE.format(context=ctx, query=self.item.query), QA_ANSWER_PREFIX

    def record(self) -> dict:
        n = self.fit(4)
        user, _ = self.parts(n)
        _, at = self.layout(n)
        header = DOCUMENT_PROMPT.format(i=at + 1, document=self.task.data.docs[self.gold[0]])
        lead = "The following are given documents.\n\n"
        pos = user.index(header, user.index(lead) + len(lead))
        ids, text, marks = self.prompt(n, [pos])
        t = self.task
        return t._record(self.lm, self.cell, ids, text, list(self.item.outputs), marks[0] / len(ids),
                         question=self.item.query,
                         question_index=self.qi, n_haystack=n, n_docs=n + len(self.gold), gold_position=at + 1,
                         n_gold=len(self.gold), dataset=t.dataset, data_file=str(t.path))


class QA1(RulerQA):
    """RULER ``qa_1``: SQuAD v2.0 dev, one gold paragraph; see :class:`RulerQA`."""

    name = "qa_1"
    requires = "SQuAD v2.0 dev JSON (path=, or ruler/squad.json / squad/dev-v2.0.json; never downloaded)"
    dataset = "squad"
    description = "RULER QA on SQuAD v2 dev: gold paragraph among distractors (local JSON: path= or --data-dir)"


class QA2(RulerQA):
    """RULER ``qa_2``: HotpotQA dev (distractor setting), two gold paragraphs; see :class:`RulerQA`."""

    name = "qa_2"
    requires = ("HotpotQA dev distractor JSON (path=, or ruler/hotpotqa.json / "
                "hotpotqa/hotpot_dev_distractor_v1.json; never downloaded)")
    dataset = "hotpotqa"
    description = "RULER QA on HotpotQA dev distractor: 2 gold paragraphs among distractors (local JSON)"


RULER_QA_TASKS = {cls.name: register_task(cls) for cls in (QA1, QA2)}
