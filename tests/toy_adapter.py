"""A model adapter with no torch in it (issue 26): the proof that lctx's tasks and runner need only the
:class:`lctx.models.adapters.protocol.ModelAdapter` protocol. Importable on its own (``python -c "import
toy_adapter"`` loads neither torch nor lctx's models).

:class:`ToyAdapter` tokenises by character (ids: 0 BOS, 1 EOS, 2 unknown, then printable ASCII from 3) and is a
*rule*, not a network, with an explicit next-token distribution, so every score has a value by hand:

* generation and teacher-forced scores (passkey): at each position the rule names one *favourite* next token,
  which gets probability :data:`P_FAVOURITE`; every other id of the :data:`VOCAB` gets ``(1 - P_FAVOURITE) / (VOCAB
  - 1)``. The ``reader`` rule reads the pass key out of the prompt ("The pass key is 12345.") and favours
  " 12345." token by token, then EOS; the ``control`` rule reads nothing and always favours "0". Greedy decoding
  is the argmax of that distribution, so it emits the favourites.
* per-token NLL (ppl): a context-free unigram, ``P_SPACE`` for " " and ``(1 - P_SPACE) / (VOCAB - 1)`` for any
  other id, so a corpus's NLL is a count of its spaces: :func:`hand_nll`.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

BOS, EOS, UNK = 0, 1, 2
FIRST_CHAR = 3
#: ids: BOS, EOS, UNK and the 95 printable ASCII characters " " .. "~"
VOCAB = FIRST_CHAR + 95
P_FAVOURITE = 0.9
P_SPACE = 0.25
_KEY = re.compile(r"The pass key is (\d+)\.")


def char_id(c: str) -> int:
    """The id of one character (:data:`UNK` outside printable ASCII)."""
    o = ord(c)
    return FIRST_CHAR + o - 32 if 32 <= o <= 126 else UNK


SPACE = char_id(" ")


class Scores(NamedTuple):
    """The fields of :class:`lctx.models.adapters.protocol.ContinuationScores`, declared here (the protocol is
    structural: the toy imports nothing from lctx)."""

    logprobs: list
    top1: list
    ranks: list


@dataclass
class ToyPrompt:
    """What :meth:`ToyAdapter.prompt` returns: ids (BOS first), text, marks (tokens before each offset)."""

    ids: list
    text: str
    marks: list


@dataclass
class _Handle:
    """The toy's opaque prompt handle: the prompt's ids (a server adapter would keep no more)."""

    ids: list
    generated: bool = False


@dataclass
class ToyAdapter:
    """A character-level rule model (module docstring): ``rule`` is ``"reader"`` (reads the pass key from its
    prompt) or ``"control"`` (always favours "0"); ``version`` goes into its settings' versions (so a new
    version is a new resume key)."""

    rule: str = "reader"
    name: str = ""
    version: str = "1"
    train_length: int | None = 512
    max_length: int | None = None
    can_batch: bool = False
    variant: str = "toy-rule"
    calls: dict = field(default_factory=lambda: {"prefix": 0, "greedy": 0, "score": 0, "token_nll": 0})

    def __post_init__(self):
        if self.rule not in ("reader", "control"):
            raise ValueError(f"rule {self.rule!r}: use reader or control")
        self.name = self.name or f"toy-{self.rule}"
        self.path = f"toy://{self.rule}"

    # -- text ---------------------------------------------------------------------------------------------
    @property
    def bos_id(self) -> int:
        """BOS (0), put first in every prompt."""
        return BOS

    def encode(self, text: str) -> list:
        """One id per character."""
        return [char_id(c) for c in text]

    def decode(self, ids) -> str:
        """The characters of ``ids`` (BOS, EOS dropped; unknown as "?")."""
        return "".join("?" if i == UNK else chr(i - FIRST_CHAR + 32) for i in ids if i not in (BOS, EOS))

    def prompt(self, user: str, answer_prefix: str = "", marks=()) -> ToyPrompt:
        """``[BOS] + encode(user + answer_prefix)``; a mark at character offset m is 1 + m tokens in."""
        text = user + answer_prefix
        return ToyPrompt([BOS] + self.encode(text), text, [1 + int(m) for m in marks])

    def continuation_ids(self, context: str, continuation: str) -> list:
        """Characters do not merge: the continuation's own ids."""
        return self.encode(continuation)

    def prompt_budget(self, length: int, answer_tokens: int) -> int:
        """No declared maximum: the whole length."""
        return length

    def tokenizer_fingerprint(self) -> str:
        """The character table's name."""
        return "toy-chars-v1"

    def prompt_signature(self) -> dict:
        """No chat template, BOS as the tokenizer's."""
        return {}

    # -- the rule -----------------------------------------------------------------------------------------
    def favourite(self, prompt_ids: list, so_far: list) -> int:
        """The id this rule favours after ``prompt_ids`` + ``so_far``: the reader continues " KEY." (the key read
        from the prompt) and then EOS; the control always "0"."""
        if self.rule == "control":
            return char_id("0")
        m = _KEY.search(self.decode(prompt_ids))
        target = self.encode(f" {m.group(1)}.") if m else []
        return target[len(so_far)] if so_far == target[: len(so_far)] and len(so_far) < len(target) else EOS

    def prob(self, token: int, favourite: int) -> float:
        """The rule's next-token probability of ``token`` when ``favourite`` is favoured."""
        return P_FAVOURITE if token == favourite else (1 - P_FAVOURITE) / (VOCAB - 1)

    # -- scoring ------------------------------------------------------------------------------------------
    def prefix(self, ids: list) -> _Handle:
        """A handle holding the ids."""
        if not ids:
            raise ValueError("an empty prompt")
        self.calls["prefix"] += 1
        return _Handle(list(ids))

    def greedy(self, prefix: _Handle, max_new_tokens: int, stop_ids=None) -> list:
        """The favourites, up to ``max_new_tokens`` or a stop id (default EOS), that id included."""
        self.calls["greedy"] += 1
        stop = {EOS} if stop_ids is None else set(stop_ids)
        out: list = []
        while len(out) < max_new_tokens:
            out.append(self.favourite(prefix.ids, out))
            if out[-1] in stop:
                break
        prefix.generated = True
        return out

    def score_continuation(self, prefix: _Handle, cont: list):
        """log p, top-1 and rank (1 for the favourite, 2 for any other id: they tie below it) of each token."""
        self.calls["score"] += 1
        favs = [self.favourite(prefix.ids, list(cont[:j])) for j in range(len(cont))]
        return Scores([math.log(self.prob(t, f)) for t, f in zip(cont, favs)],
                                  [t == f for t, f in zip(cont, favs)], [1 if t == f else 2 for t, f in zip(cont, favs)])

    def token_nll(self, ids: list, targets: list):
        """The unigram's NLL of ``ids[p]`` (nats) and whether it is " " (its first choice), per target."""
        self.calls["token_nll"] += 1
        if targets and (min(targets) < 1 or max(targets) >= len(ids)):
            raise ValueError(f"targets must lie in [1, {len(ids)})")
        return [unigram_nll(ids[p]) for p in targets], [ids[p] == SPACE for p in targets]

    def prefix_batch(self, rows):
        """Not offered (``can_batch`` is False)."""
        raise NotImplementedError("the toy does not batch")

    def greedy_batch(self, batch, max_new_tokens, stop_ids=None):
        """Not offered (``can_batch`` is False)."""
        raise NotImplementedError("the toy does not batch")

    def batch_row(self, batch, i):
        """Not offered (``can_batch`` is False)."""
        raise NotImplementedError("the toy does not batch")

    # -- identity -----------------------------------------------------------------------------------------
    def model_inputs(self) -> dict:
        """The rule's name, hashed: no files."""
        return {"path": self.path, "fingerprint": hashlib.sha256(f"toy|{self.rule}".encode()).hexdigest()[:16],
                "files": {}}

    def settings(self) -> dict:
        """No dtype, attention or chunks; its own version."""
        return {"dtype": None, "attn_impl": None, "chunk_size": None, "device_type": "toy", "device": "toy",
                "versions": {"toy_adapter": self.version}}

    # -- memory -------------------------------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        """Nothing measured."""

    def peak_memory_bytes(self):
        """Unknown."""
        return None

    def free_memory(self) -> None:
        """Nothing held."""

    def memory_plan(self, length: int, batch: int = 1, kept_logits: int = 1):
        """Nothing to check."""
        return None


def unigram_nll(token: int) -> float:
    """-log p(token) under the ppl unigram (nats)."""
    return -math.log(P_SPACE if token == SPACE else (1 - P_SPACE) / (VOCAB - 1))


def hand_nll(tokens: list) -> float:
    """Mean NLL (nats per token) of ``tokens`` when every one is scored once: the spaces at -log P_SPACE, the
    others at -log((1 - P_SPACE) / (VOCAB - 1))."""
    spaces = sum(t == SPACE for t in tokens)
    return (spaces * -math.log(P_SPACE) + (len(tokens) - spaces) * -math.log((1 - P_SPACE) / (VOCAB - 1))) / len(tokens)
