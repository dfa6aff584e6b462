"""Passkey retrieval (Mohtashami & Jaggi 2023, "Landmark Attention", appendix; the prompt used by the
BAM paper, seed 000, up to 512K tokens).

Prompt: instruction; filler sentences repeated; the needle "The pass key is K. Remember it. K is the
pass key."; more filler; "What is the pass key? The pass key is". The filler is budgeted one sentence at
a time so that the whole prompt (BOS included) is at most the target length and within one filler
sentence of it.
"""

from __future__ import annotations

import random
import re

from lctx import metrics

from .base import (DECODE_STEP_TOKENS, Bound, Cell, Heatmap, RunOption, Sample, Task, budget_bound, optional_metrics,
                   register_task)

INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there.")
FILLER_SENTENCES = (" The grass is green.", " The sky is blue.", " The sun is yellow.", " Here we go.",
                    " There and back again.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key?"
ANSWER_PREFIX = " The pass key is"  # starts the assistant's turn with --chat-template on

_NUMBER = re.compile(r"\d+")


def parse_answer(continuation: str) -> str | None:
    """The first run of digits in the model's continuation after the answer prefix, or ``None``.

    " 48213." -> "48213"; "482137" -> "482137" (so it does not equal key 48213); "12 48213" -> "12".
    """
    m = _NUMBER.search(continuation)
    return m.group(0) if m else None


def make_key(seed: int, cell: Cell, width: int) -> str:
    """A fixed-width decimal key (first digit non-zero), deterministic in (seed, length, depth, sample)."""
    rng = random.Random(f"passkey|{seed}|{cell.length}|{cell.depth}|{cell.sample}")
    return str(rng.randrange(10 ** (width - 1), 10**width))


def filler(n: int, start: int = 0) -> str:
    """``n`` filler sentences, cycling through :data:`FILLER_SENTENCES` from index ``start``."""
    k = len(FILLER_SENTENCES)
    return "".join(FILLER_SENTENCES[(start + i) % k] for i in range(n))


@register_task
class Passkey(Task):
    """Passkey retrieval at a target length and needle depth.

    Options:
        key_digits: key width in digits (default 5).
        max_new_tokens: greedy decode budget (default key_digits + 4 tokens).

    Metrics:
        exact: 1.0 when the first number in the greedy continuation equals the key exactly.
        digit_acc: teacher-forced; fraction of the answer's digit-bearing tokens (" K" appended to the
            prompt) that the model ranks top-1 (with lctx tokenizers every digit is one token); unavailable (with
            the reason, never 0) for a model without prompt log-probabilities, ``exact`` still scored.
    """

    name = "passkey"
    batched = True  # prompt -> greedy -> metrics (lctx run --batch-size)
    axes = ("depth", "sample")
    metrics = ("exact", "digit_acc")
    headline_metric = "exact"
    retrieval = True
    category = "single retrieval"
    secondary_metric = "digit_acc"  # teacher-forced
    description = "passkey retrieval (exact + teacher-forced digit accuracy) over length x depth"
    requires = "none (generated)"
    default_run = True  # `lctx run` without --tasks runs passkey and ppl
    run_options = (RunOption("--key-digits", "key_digits", "key_digits", 5, "a whole number from 1 to 30"),)
    option_bounds = {"key_digits": Bound(1, 30, unit="digits", why="a key of 30 digits is past any model's recall"),
                     "max_new_tokens": budget_bound()}
    plots = ("depth_heatmap",)
    heatmap = Heatmap(title="Passkey retrieval", depth_label="Passkey depth (0% = start)",
                      panels={"exact": "Exact match", "digit_acc": "Digit accuracy"}, narrow=True)

    def __init__(self, key_digits: int = 5, max_new_tokens: int | None = None, **options):
        # key_digits and max_new_tokens: checked against option_bounds before this runs (Task.__new__)
        super().__init__(key_digits=key_digits, max_new_tokens=max_new_tokens, **options)
        self.key_digits = int(float(key_digits))
        self.max_new_tokens = int(float(max_new_tokens)) if max_new_tokens else self.key_digits + 4

    def _prompt(self, n_filler: int, depth: float, key: str) -> tuple[str, str]:
        """(user text, character offset of the needle in it) with ``n_filler`` filler sentences."""
        n_before = int(round(depth * n_filler))
        before = INSTRUCTION + filler(n_before)
        rest = NEEDLE.format(key=key) + filler(n_filler - n_before, n_before) + QUESTION
        return before + rest, len(before)

    def min_length(self, lm) -> int:
        """Tokens of the prompt with no filler (BOS, instruction, needle, question) with ``lm``'s tokenizer:
        the fewest over a few keys, so it is a lower bound whatever the key (see :meth:`Task.min_length`)."""
        keys = [make_key(0, Cell(0, 0.5, s), self.key_digits) for s in range(4)]
        return min(len(lm.prompt(self._prompt(0, 0.5, k)[0], ANSWER_PREFIX).ids) for k in keys)

    def cost(self, lm, cell: Cell) -> float:
        """Prefill of the prompt (at most ``cell.length`` tokens), ``max_new_tokens`` greedy decode steps and
        one teacher-forced pass over the key, in prefill tokens (see :data:`DECODE_STEP_TOKENS`)."""
        return float(cell.length + (self.max_new_tokens + 1) * DECODE_STEP_TOKENS)

    def build(self, lm, cell: Cell, seed: int) -> Sample:
        """Budget the filler so that the prompt (BOS, or the chat template's tokens, included) is at most
        ``lm.prompt_budget(cell.length, max_new_tokens)`` tokens (the length, less what the answer needs past
        a model's last position), within one filler sentence. The prompt comes from ``lm.prompt``: the
        question is the user's text and " The pass key is" starts the answer (the assistant's turn with
        ``--chat-template on``).

        Raises:
            ValueError: the length is too short for instruction + needle + question.
        """
        key = make_key(seed, cell, self.key_digits)
        depth = 0.5 if cell.depth is None else float(cell.depth)
        budget = lm.prompt_budget(cell.length, self.max_new_tokens)

        def count(n: int) -> int:
            return len(lm.prompt(self._prompt(n, depth, key)[0], ANSWER_PREFIX).ids)

        n_fixed = count(0)
        if n_fixed > budget:
            raise ValueError(f"length {cell.length} is shorter than the passkey template ({n_fixed} tokens"
                             + (f" + {cell.length - budget} for the answer" if budget < cell.length else "") + ")")
        per_sentence = len(lm.encode(filler(len(FILLER_SENTENCES)))) / len(FILLER_SENTENCES)
        n = max(0, int((budget - n_fixed) / per_sentence))
        while n > 0 and count(n) > budget:
            n -= 1
        while count(n + 1) <= budget:
            n += 1
        user, at = self._prompt(n, depth, key)
        p = lm.prompt(user, ANSWER_PREFIX, marks=[at])
        return Sample(cell=cell, input_ids=p.ids, n_tokens=len(p.ids), depth=p.marks[0] / len(p.ids),
                      meta={"key": key, "n_filler": n, "prompt_text": p.text})

    def max_new_tokens_for(self, sample: Sample) -> int:
        """The greedy budget: ``max_new_tokens`` (default key_digits + 4)."""
        return self.max_new_tokens

    def score_generated(self, lm, sample: Sample, prefix, cont: list[int]) -> dict:
        """exact from the greedy continuation ``cont``; digit_acc teacher-forced on the key's tokens *in
        context* (``lm.continuation_ids(prompt, " " + key)``, lm-eval's ``_encode_pair``) through ``prefix``, or
        unavailable (:func:`lctx.tasks.optional_metrics`) where the model gives no prompt log-probabilities."""
        key = sample.meta["key"]
        answer = parse_answer(lm.decode(cont))
        text = sample.meta.pop("prompt_text", None)  # not a record column (the prompt is rebuilt from the seed)
        sample.meta["continuation"] = lm.decode(cont)

        def digit_acc() -> dict:
            answer_ids = lm.continuation_ids(text, " " + key) if text is not None else lm.encode(" " + key)
            got = lm.score_continuation(prefix, answer_ids)
            top1 = got.top1
            sample.meta["answer_logprobs"] = [float(x) for x in got.logprobs]  # per token, for backend parity
            digit_pos = [i for i, t in enumerate(answer_ids) if any(c.isdigit() for c in lm.decode([t]))]
            return {"digit_acc": metrics.digit_acc([bool(top1[i]) for i in digit_pos])}

        return {"exact": metrics.exact(answer, key), **optional_metrics(("digit_acc",), digit_acc)}
