"""The text half of a model adapter: a ``transformers``-style tokenizer as the protocol's text members
(:class:`TokenizerSide`: encode / decode, task prompts with the chat template, continuation ids in context, prompt
budgets, the sample-cache keys), shared by the in-process adapter (:class:`lctx.models.adapters.hf.HFAdapter`) and
the server adapter (:class:`lctx.models.adapters.server.ServerAdapter`), whose tokenizer may be the server's own
(:class:`lctx.models.adapters.server.ServerTokenizer`, the same few methods over its ``/tokenize`` endpoint)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from lctx.chat import render_chat
from lctx.errors import LctxError

_TOK_FP: dict[int, tuple[object, str]] = {}


def tokenizer_fingerprint(tok) -> str:
    """A short hash (16 hex digits) of a tokenizer's full definition (a fast tokenizer's JSON, else its vocabulary
    and special tokens, then its BOS id and class name): two tokenizers with the same hash tokenize identically.
    Memoised per tokenizer object. (Formerly ``lctx.tasks.niah.tokenizer_fingerprint``: the same value, so the
    tasks' sample caches written before keep matching.)"""
    hit = _TOK_FP.get(id(tok))
    if hit is not None and hit[0] is tok:
        return hit[1]
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        body = backend.to_str()
    else:
        vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
        body = json.dumps(sorted(vocab.items())) + repr(getattr(tok, "all_special_tokens", None))
    body += f"|bos={getattr(tok, 'bos_token_id', None)}|{type(tok).__name__}"
    fp = hashlib.sha1(body.encode()).hexdigest()[:16]
    _TOK_FP[id(tok)] = (tok, fp)
    return fp


@dataclass
class Prompt:
    """A built prompt: ``ids`` (tokens, BOS / chat template included), ``text`` (the prompt as text, chat
    template included, without the BOS the model adds) and ``marks`` (tokens before each requested
    character offset of the task's text)."""

    ids: list[int]
    text: str
    marks: list[int]


class TokenizerSide:
    """The tokenizer half of :class:`HFAdapter` over a ``transformers`` tokenizer: the text part of the
    :class:`~lctx.models.adapters.protocol.ModelAdapter` protocol (text <-> ids, task prompts: the one place a
    chat template is applied, the sample-cache keys). A subclass provides ``tokenizer``, ``name``, ``add_bos``,
    ``chat_template``, ``system_prompt`` and ``max_length``; :class:`HFAdapter` is one, and
    ``lctx.harness.commands.train.TokenizerLM`` (training documents built by the evaluation tasks' own code,
    without a model) is another."""

    # -- text <-> ids ------------------------------------------------------------------------------
    @property
    def bos_id(self) -> int | None:
        """The BOS token id lctx puts first (:attr:`add_bos`), or ``None`` when the model takes none."""
        return self.tokenizer.bos_token_id if self.add_bos else None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens (no BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (special tokens dropped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def with_bos(self, ids: list[int]) -> list[int]:
        """``[BOS] + ids`` when the model takes a BOS token (:attr:`add_bos`), else ``ids``."""
        return ([self.bos_id] if self.bos_id is not None else []) + list(ids)

    # -- prompts (the one place a chat template is applied) ------------------------------------------
    def check_chat_template(self) -> None:
        """Raises LctxError when the tokenizer has no chat template (``--chat-template on`` cannot apply)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise LctxError(f"--chat-template on: the tokenizer of model {self.name!r} has no chat template; "
                            "use --chat-template off (the default) for this model")

    def chat_source(self) -> str:
        """Where the chat template comes from, for messages: "model 'NAME' (PATH)" (a GGUF file's path for a
        template from its metadata)."""
        path = getattr(self, "path", None)
        return f"model {self.name!r}" + (f" ({path})" if path else "")

    def chat_signature(self) -> dict | None:
        """What the chat setting changes in a prompt, for cache keys and records: ``None`` when off, else
        {"template": sha1 of the template text, "system_prompt": ...}."""
        if not self.chat_template:
            return None

        tmpl = self.tokenizer.chat_template
        return {"template": hashlib.sha1(str(tmpl).encode()).hexdigest()[:12], "system_prompt": self.system_prompt}

    def tokenizer_fingerprint(self) -> str:
        """:func:`tokenizer_fingerprint` of the tokenizer (the protocol's sample-cache key)."""
        return tokenizer_fingerprint(self.tokenizer)

    def prompt_signature(self) -> dict:
        """What shapes a prompt's tokens besides the tokenizer, for the tasks' sample-cache keys: ``"chat"``
        (:meth:`chat_signature`) only when the chat template is on, and ``"bos"`` (:attr:`bos_id`) only when it
        differs from the tokenizer's own BOS (SmolLM2: none put first), so that cache entries written before
        either option keep matching; ``{}`` otherwise."""
        out: dict = {}
        chat = self.chat_signature()
        if chat is not None:
            out["chat"] = chat
        if self.bos_id != getattr(self.tokenizer, "bos_token_id", None):
            out["bos"] = self.bos_id
        return out

    def prompt_text(self, user: str, answer_prefix: str = "") -> tuple[str, int]:
        """The prompt as text and the character offset where ``user`` starts in it.

        Chat template off: ``user + answer_prefix`` (offset 0). On: the tokenizer's chat template rendered with
        limits (:func:`lctx.chat.render_chat`, the text ``apply_chat_template`` writes) for
        [system (``system_prompt``, when given), user] with the generation prompt (the assistant turn's
        header), then ``answer_prefix`` as the start of the assistant's turn, as RULER joins its model
        templates with its answer prefixes (NVIDIA/RULER ``scripts/data/prepare.py``); the prefix keeps its
        leading space, as there.
        """
        if not self.chat_template:
            return user + answer_prefix, 0
        self.check_chat_template()
        mark = "\x00lctx-user\x00"
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else [])
        msgs.append({"role": "user", "content": mark})
        try:
            text = render_chat(self.tokenizer, msgs, add_generation_prompt=True, source=self.chat_source())
        except LctxError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a template that refuses a system turn
            drop = "drop --system-prompt or " if self.system_prompt is not None else ""  # only what was given
            raise LctxError(f"the chat template of {self.chat_source()} cannot format this prompt "
                            f"({_first_line(e)}); {drop}use --chat-template off") from None
        if text.count(mark) != 1:
            raise LctxError(f"the chat template of model {self.name!r} does not place the user message verbatim; "
                            "use --chat-template off")
        start = text.index(mark)
        return text[:start] + user + text[start + len(mark):] + answer_prefix, start

    def prompt(self, user: str, answer_prefix: str = "", marks: tuple[int, ...] | list[int] = ()) -> "Prompt":
        """The token ids of a task prompt: the one helper every task (built-in or custom) builds prompts with.

        ``user`` is the task's text (instruction, context, question); ``answer_prefix`` the text the answer
        follows (passkey's " The pass key is", RULER's answer prefixes). With the chat template off the ids
        are ``with_bos(encode(user + answer_prefix))``; with it on, the template's tokens (system turn, user
        turn, assistant header, any BOS the template writes) are part of the ids, so a task that budgets
        ``len(prompt(...).ids) <= length`` counts them. ``marks``: character offsets in ``user``; the result
        gives, for each, the number of prompt tokens before it (e.g. where the needle starts).

        Returns a :class:`Prompt` (ids, text, marks).

        Raises:
            LctxError: chat template on and the tokenizer has none, it cannot format the turn, or rendering it
                goes past a limit (size, steps, time: :mod:`lctx.chat`).
        """
        text, start = self.prompt_text(user, answer_prefix)
        head = self.bos_prefix()
        ids = head + self.encode(text)
        pos = [len(head) + len(self.encode(text[: start + m])) if start + m > 0 else len(head) for m in marks]
        return Prompt(ids=ids, text=text, marks=pos)

    def chat_prompt(self, messages: list[dict], answer_prefix: str = "") -> "Prompt":
        """The token ids of a whole conversation in the model's chat template, whatever ``--chat-template`` says
        (a multi-turn task, ``mrcr``, is a conversation or nothing): [system (``system_prompt``, when given)] +
        ``messages`` ({"role": "user" | "assistant", "content": str}) rendered with limits
        (:func:`lctx.chat.render_chat`) with the generation prompt, then ``answer_prefix``; ids = ``encode(text)``
        (the template writes any BOS as text). ``marks`` is empty: a task finds its offsets in ``text``.

        Raises:
            LctxError: the tokenizer has no chat template, the template cannot format the conversation, or
                rendering it goes past a limit (:mod:`lctx.chat`).
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise LctxError(f"model {self.name!r} has no chat template, and a multi-turn task (mrcr) is a "
                            "conversation; run it on a chat model (e.g. SmolLM2-135M-Instruct) or drop the task")
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else [])
        try:
            text = render_chat(self.tokenizer, msgs + list(messages), add_generation_prompt=True,
                               source=self.chat_source())
        except LctxError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a template that refuses a system turn or alternation
            raise LctxError(f"the chat template of {self.chat_source()} cannot format this conversation "
                            f"({_first_line(e)}); drop the multi-turn task for this model") from None
        text += answer_prefix
        return Prompt(ids=self.encode(text), text=text, marks=[])

    def bos_prefix(self) -> list[int]:
        """The ids put before an encoded prompt: ``[BOS]`` when the model takes one, except with the chat
        template on (the template writes any BOS it wants as text)."""
        return [] if self.chat_template else self.with_bos([])

    def continuation_ids(self, context: str, continuation: str) -> list[int]:
        """The tokens ``continuation`` has *after* ``context`` (encode both together, take the tail), as
        lm-eval's ``_encode_pair`` (lm_eval/api/model.py): trailing spaces of the context move to the
        continuation first. Every teacher-forced score uses these, not ``encode(continuation)`` alone: a
        SentencePiece tokenizer encodes " 27611" alone with an extra "▁" it does not have in context.
        ``context`` is a :meth:`prompt`'s ``text`` (no BOS; BOS does not change the tail).
        """
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.encode(context + continuation)
        return whole[len(self.encode(context)):]

    def prompt_budget(self, length: int, answer_tokens: int) -> int:
        """Prompt tokens a generating task may use at ``length`` so that its ``answer_tokens`` still fall on
        positions the model can address: ``length``, less what the answer would need past ``max_length``
        when ``length <= max_length`` (GPT-2 at ``n_positions`` = 1024 has no position 1024; past the
        declared maximum, an ``--allow-beyond-max`` study, the length is taken as given)."""
        if self.max_length and length <= self.max_length:
            return min(length, self.max_length - answer_tokens)
        return length


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]
