"""What lctx's tasks and runner need from a model: the :class:`ModelAdapter` protocol.

Every task and the sweep runner talk to a model through these methods and attributes only, never through a
torch model, a tokenizer object or a KV cache, so a model can live anywhere: in this process
(:class:`lctx.models.adapters.hf.HFAdapter`: lctx checkpoints, Hugging Face folders, GGUF files, converted
llama2.c exports) or behind a server (an OpenAI-compatible ``/v1`` endpoint: tokenising through the server,
greedy generation, teacher-forced scores from echoed log-probabilities). An adapter is any object that has
them (a structural :class:`typing.Protocol`: no base class to inherit); ``lctx.evaluate(adapter, [task], ...)``
runs it.

The parts, and what an adapter must guarantee:

* **Describe**: ``name`` (display name; the runner may append ``#i`` to make names unique), ``path`` (where it
  came from, as given: a folder, a file, a URL), ``variant`` (the positional variant, or the architecture),
  ``train_length`` / ``max_length`` (tokens, or ``None``: unknown; ``train_length`` is settable, the flatness
  sweep's ``--train-length`` sets it); optionally ``max_length_source``, where ``max_length`` was read (messages
  name it; default ``"max_length"``).
* **Text**: ``encode`` / ``decode`` (no special tokens), ``bos_id``; prompts only through :meth:`prompt` (the one
  place a chat template is applied), answers through :meth:`continuation_ids` (the tokens an answer has *in
  context*), budgets through :meth:`prompt_budget`; :meth:`tokenizer_fingerprint` and :meth:`prompt_signature`
  key the tasks' on-disk sample caches (so a task never reads a tokenizer).
* **Score**: :meth:`prefix` turns a prompt into an **opaque handle**; a task hands it back to :meth:`greedy`
  (at most once per handle) and :meth:`score_continuation` (any number of times, before or after the greedy
  call), and never reads it: the in-process adapter keeps the prompt's KV cache in it (prefill once, then
  generate and score through the same cache), a server adapter only the ids. :meth:`token_nll` scores tokens
  of a sequence against their own prefixes (perplexity windows).
* **Batch** (optional speed): ``can_batch``; when True the runner may score several prompts of one length
  with :meth:`prefix_batch` / :meth:`greedy_batch` / :meth:`batch_row`, whose numbers must equal those of
  prompts run alone (to floating-point rounding). An adapter with ``can_batch = False`` is never asked for them
  (they may raise ``NotImplementedError``).
* **Identity** (the resume key): :meth:`model_inputs` (what the model is, by content) and :meth:`settings`
  (how it runs: every setting that can change a number). The runner hashes them into every record's
  ``fingerprint`` (:func:`lctx.harness.run.runner.sample_base`), so a record is reused only for the same
  content and settings.
* **Memory**: :meth:`reset_peak_memory` / :meth:`peak_memory_bytes` around each sample (the record's
  ``peak_mem_bytes``), :meth:`free_memory` after a failed batch, :meth:`memory_plan` for the pre-flight check
  (``None``: nothing to check, as for a server).

Types a task receives are plain: token ids are ``list[int]``; :meth:`score_continuation` returns a
:class:`ContinuationScores` of Python lists; :meth:`token_nll` returns two 1-D sequences that a task reads item
by item with ``float(x)`` / ``bool(x)`` (lists; the in-process adapter returns torch float64 / bool tensors,
which read the same). This module imports nothing from torch.

**Capabilities** (optional members, not part of :class:`ModelAdapter`, each with a default: :data:`OPTIONAL_MEMBERS`):
what the runner and the tasks need to know of a model beyond the protocol, read only through :func:`capabilities` /
:func:`optional`, never by asking which backend an adapter is: ``concurrency`` (a served model's requests at once: the
runner's batch), ``teacher_forced`` (True, or why scores are unavailable), ``positional_methods`` (what
``models/position/`` methods a model of the backend takes at load), ``max_length_source``, ``sample_notes``,
``chat_prompt``, and the engines lm-eval's mmlu/arc can use instead of the protocol: :class:`LmEvalCapable`
(``lmeval_model()``: a Hugging Face model for lm-eval's ``hf`` model, in process) or :class:`LmEvalApiCapable`
(``lmeval_api_model()``: a served model for lm-eval's ``local-completions`` model). An adapter with neither runs
mmlu/arc through the protocol itself (:mod:`lctx.tasks.lmeval`'s one bridge: ``prefix`` + ``score_continuation``).

The contract is checked, not only written down: :func:`check_adapter` calls each member once before a run (one
line naming a member of the wrong shape), and the runner runs a user's adapter (not lctx's own) in a
:class:`CheckedAdapter`, which checks what the scoring methods return while samples run (a violation is that
sample's error, :class:`AdapterContractError`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

from lctx.errors import ContractError, LctxError


class ContinuationScores(NamedTuple):
    """Teacher-forced scores of a continuation's tokens after a prompt (:meth:`ModelAdapter.score_continuation`),
    one entry per continuation token, in order.

    logprobs: natural-log probability of each token given the prompt and the tokens before it (nats, <= 0);
    top1: whether the token is the model's first choice there (the argmax of its next-token distribution);
    ranks: the token's rank among the vocabulary there (1 = first choice; tokens with a strictly higher score,
    plus one). An adapter that sees only the top k candidates (a server's ``top_logprobs``) reports ``k + 1``
    for a token outside them and says so in its documentation.
    """

    logprobs: list[float]
    top1: list[bool]
    ranks: list[int]


@runtime_checkable
class ModelAdapter(Protocol):
    """A model as lctx's tasks and runner see it (module docstring). ``isinstance(obj, ModelAdapter)`` checks
    that the members exist (not their signatures)."""

    name: str
    path: str
    variant: str
    train_length: Optional[int]
    max_length: Optional[int]
    can_batch: bool

    # -- text ---------------------------------------------------------------------------------------------------
    @property
    def bos_id(self) -> Optional[int]:
        """The token id put first in a sequence (:meth:`prompt` does it; ppl's ``--ppl-bos prepend`` puts it
        before each window), or ``None`` when the model takes none."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens (no BOS)."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens dropped)."""

    def prompt(self, user: str, answer_prefix: str = "", marks: Sequence[int] = ()) -> Any:
        """A task's prompt as the model reads it: an object with ``ids`` (list[int]: BOS and chat template
        included; a task budgets ``len(ids) <= length``), ``text`` (str: the prompt as text, chat template
        included, without a BOS the model adds) and ``marks`` (list[int]: for each character offset in ``user``
        of ``marks``, the prompt tokens before it). ``answer_prefix`` is the text the answer follows (passkey's
        ``" The pass key is"``); with a chat template it starts the assistant's turn.

        Raises:
            LctxError: a chat template that cannot format the prompt (one line naming the fix).
        """

    def continuation_ids(self, context: str, continuation: str) -> list[int]:
        """The tokens ``continuation`` has right after ``context`` (a prompt's ``text``): both encoded together,
        the context's tokens dropped (lm-eval's ``_encode_pair``). Teacher-forced scores use these."""

    def prompt_budget(self, length: int, answer_tokens: int) -> int:
        """Prompt tokens a generating task may use at ``length`` tokens so that ``answer_tokens`` more still
        fall on positions the model can address (``length`` when it declares no maximum)."""

    def tokenizer_fingerprint(self) -> str:
        """A short hash of the tokenizer's full definition: two adapters with equal fingerprints tokenise every
        text identically. Tasks key their built samples by it (with :meth:`prompt_signature`)."""

    def prompt_signature(self) -> dict:
        """What else shapes a prompt's tokens, JSON-able, for the tasks' sample-cache keys: ``{}`` for plain
        prompts; ``"chat"`` (template hash and system prompt) when a chat template is applied; ``"bos"`` when
        the BOS put first differs from the tokenizer's own."""

    # -- scoring ------------------------------------------------------------------------------------------------
    def prefix(self, ids: list[int]) -> Any:
        """An opaque handle of the prompt ``ids`` for :meth:`greedy` and :meth:`score_continuation`. The
        in-process adapter runs the prompt now (a chunked prefill into a KV cache); another adapter may keep the
        ids and send them later. Tasks pass the handle back and never read it.

        Raises:
            ValueError: empty ``ids``.
        """

    def greedy(self, prefix: Any, max_new_tokens: int, stop_ids: Optional[set[int]] = None) -> list[int]:
        """Greedy (argmax) continuation of the prompt of ``prefix``: up to ``max_new_tokens`` ids, ending after
        the first id in ``stop_ids`` (default: the end-of-sequence token), that id included. At most once per
        handle."""

    def score_continuation(self, prefix: Any, cont: list[int]) -> ContinuationScores:
        """Teacher-forced scores of the tokens ``cont`` right after the prompt of ``prefix`` (take ``cont`` from
        :meth:`continuation_ids`): a :class:`ContinuationScores` of ``len(cont)`` entries each. Leaves the handle
        as it was (it can be scored again, or passed to :meth:`greedy`)."""

    def token_nll(self, ids: list[int], targets: list[int]) -> tuple[Sequence[float], Sequence[bool]]:
        """(NLL in nats of ``ids[p]`` given ``ids[:p]``, whether ``ids[p]`` was the first choice) for each
        position p in ``targets`` (1 <= p < len(ids)), in that order: two 1-D sequences read item by item
        (``float(x)``, ``bool(x)``).

        Raises:
            ValueError: a target outside [1, len(ids)).
        """

    # -- batches (only when can_batch) ------------------------------------------------------------------------
    def prefix_batch(self, rows: list[list[int]]) -> Any:
        """An opaque handle of several prompts run together (:meth:`greedy_batch`, :meth:`batch_row`).

        Raises:
            ValueError: no prompts, an empty prompt, or ``can_batch`` is False.
        """

    def greedy_batch(self, batch: Any, max_new_tokens, stop_ids: Optional[set[int]] = None) -> list[list[int]]:
        """:meth:`greedy` for every prompt of ``batch`` (``max_new_tokens``: an int, or one per row); one id list
        per row, each as the row would get alone."""

    def batch_row(self, batch: Any, i: int) -> Any:
        """A :meth:`prefix` handle of row ``i`` of ``batch`` (its prompt only), for :meth:`score_continuation`."""

    # -- identity (the resume key) and records -----------------------------------------------------------------
    def model_inputs(self) -> dict:
        """What the model is, by content: ``{"path": where it is (resolved), "fingerprint": 16 hex digits,
        "files": {name: sha256}}`` (run.json's ``inputs.models[name]``; ``fingerprint`` goes into every record's
        ``model_fingerprint`` and resume key). Computed once per adapter (it may hash gigabytes). A server
        adapter fingerprints what it can know of the served model (its id, revision, tokenizer)."""

    def settings(self) -> dict:
        """How the model runs, each entry a record field: ``dtype``, ``attn_impl``, ``chunk_size``
        (int or None), ``device_type`` (e.g. ``"cpu"``, ``"cuda"``), ``versions`` ({package: version} of the code
        that computes its numbers; lctx's own version is added by the runner) -- all hashed into the resume key --
        and ``device`` (where it runs, e.g. ``"cuda:0"``; recorded, not hashed). A value that does not apply is
        ``None``."""

    # -- memory -------------------------------------------------------------------------------------------------
    def reset_peak_memory(self) -> None:
        """Start measuring the peak memory of the next sample (a no-op where nothing is measured)."""

    def peak_memory_bytes(self) -> Optional[int]:
        """Peak memory in bytes since :meth:`reset_peak_memory` (or the process's high-water mark), or ``None``
        where the adapter cannot tell (a server)."""

    def free_memory(self) -> None:
        """Give back cached memory after a failed batch, before its samples run again alone (may be a no-op)."""

    def memory_plan(self, length: int, batch: int = 1, kept_logits: int = 1) -> Optional[Any]:
        """The expected peak of one prefill of ``length`` tokens in ``batch`` rows keeping ``kept_logits``
        positions' logits, as a :class:`lctx.models.adapters.memory.MemoryPlan` (``total``, ``get("weights")``,
        ``device``), for the checks before a run; ``None``: nothing to check (a server's memory is not ours).

        Raises:
            LctxError: a length the adapter cannot plan.
        """


@runtime_checkable
class LmEvalCapable(Protocol):
    """The optional capability lm-eval's mmlu/arc tasks need (:mod:`lctx.tasks.lmeval`): a Hugging Face model
    that lm-eval's own ``hf`` backend (``HFLM``) can call directly."""

    def lmeval_model(self) -> tuple[Any, Any]:
        """(the ``transformers`` ``PreTrainedModel`` in eval mode, its tokenizer), ready for direct calls; called
        before each lm-eval evaluation."""

    def chat_source(self) -> str:
        """Where the chat template comes from, for messages (e.g. "model 'NAME' (PATH)")."""


@runtime_checkable
class LmEvalApiCapable(Protocol):
    """The other capability lm-eval's mmlu/arc tasks accept (:mod:`lctx.tasks.lmeval`): a model behind an
    OpenAI-compatible ``/v1/completions`` endpoint that echoes prompt log-probabilities, scored by lm-eval's own
    ``LocalCompletionsAPI`` (``local-completions``) with the adapter's tokenizer and requests
    (:class:`lctx.models.adapters.server.ServerAdapter`)."""

    def lmeval_api_model(self) -> dict:
        """``{"base_url": the ``.../v1/completions`` URL, "model": the served id, "seed", "concurrency", "max_length":
        tokens or None}``; called before each lm-eval evaluation.

        Raises:
            lctx.errors.MetricUnavailable: the server's prompt log-probabilities cannot be used (the reason): every
                metric of the evaluation is then recorded as unavailable."""

    def prompt_logprobs(self, ids: list, text: Optional[str] = None, what: str = "an echo", **body) -> tuple:
        """``(logprobs, tops)`` aligned with ``ids``: ``log p(ids[p] | ids[:p])`` (nats; ``None`` where the server
        gives none) and the alternatives' values there, from one echoed completion request (``body``: its fields)."""

    def chat_source(self) -> str:
        """Where the chat template comes from, for messages."""


#: the capabilities that give lm-eval's mmlu/arc tasks a faster engine than the protocol's, any one of them
#: (:attr:`Capabilities.lmeval`; without either, lm-eval runs over the protocol itself)
LMEVAL_CAPABILITIES = ("lmeval_model", "lmeval_api_model")


# ---------------------------------------------------------------------------------------------------------------
# capabilities: the optional members, each with its default, read in one place (capabilities / optional)
# ---------------------------------------------------------------------------------------------------------------

#: ``positional_methods`` of a backend that applies every method of ``models/position/`` at load (each method's own
#: ``check`` then refuses a checkpoint it does not apply to)
EVERY_METHOD = ("*",)

#: The optional members of a model adapter, beyond :class:`ModelAdapter`: {name: (default, contract)}. An adapter
#: without one has its default. lctx reads them only here (:func:`optional`, :func:`capabilities`), never by asking
#: which backend an adapter is, so a new backend declares what it can do and no caller changes.
OPTIONAL_MEMBERS = {
    "concurrency": (None, "None (the runner batches by --batch-size) or an int >= 1: the requests the adapter runs at "
                          "once (a served model's --concurrency); the runner groups that many samples of one length "
                          "of a batched task"),
    "teacher_forced": (True, "True, or the reason (a non-empty str) why score_continuation / token_nll give no score "
                             "(they raise MetricUnavailable): every teacher-forced metric is then unavailable"),
    "positional_methods": ((), "a tuple of the positional methods (models/position/ names) a model of this backend "
                               "takes at load, EVERY_METHOD for all of them, () for none"),
    "max_length_source": ("max_length", "a str: where max_length was read, for messages"),
    "sample_notes": (None, "a method sample_notes(ids) -> dict: notes of a sample for its record's extra"),
    "check_answer_room": (None, "a method check_answer_room(lengths): refuses, before the sweep, a length whose "
                                "answer would not fit (a served model's thinking budget)"),
    "think_unclosed": (0, "an int: greedy replies whose thinking never closed (a served reasoning model)"),
    "chat_source": (None, "a method chat_source() -> str: where the chat template comes from, for messages"),
    "chat_prompt": (None, "a method chat_prompt(messages, answer_prefix='') -> a prompt of a whole conversation in "
                          "the model's chat template (mrcr)"),
    "lmeval_model": (None, "a method lmeval_model() -> (transformers model, tokenizer): lm-eval's hf engine "
                           "(LmEvalCapable)"),
    "lmeval_api_model": (None, "a method lmeval_api_model() -> dict: lm-eval's local-completions engine over a "
                               "server (LmEvalApiCapable)"),
}
#: the members of :data:`OPTIONAL_MEMBERS` that are methods (None when absent)
_OPTIONAL_METHODS = ("sample_notes", "check_answer_room", "chat_source", "chat_prompt", "lmeval_model",
                     "lmeval_api_model")


def optional(lm: Any, name: str) -> Any:
    """The optional member ``name`` of ``lm`` (:data:`OPTIONAL_MEMBERS`), or its default when ``lm`` has none; for a
    method, the bound method or None (also for a non-callable attribute of that name).

    Raises:
        KeyError: ``name`` is not an optional member (a caller's mistake: add it to :data:`OPTIONAL_MEMBERS`)."""
    default = OPTIONAL_MEMBERS[name][0]
    value = getattr(lm, name, default)
    if isinstance(value, property):  # read from a class: an instance's value, unknown until one is made
        return default
    if name in _OPTIONAL_METHODS:
        return value if callable(value) else None
    return value


@dataclass(frozen=True)
class Capabilities:
    """What a model adapter can do beyond :class:`ModelAdapter`, read from its optional members
    (:func:`capabilities`).

    concurrency: requests run at once (a served model), or None: the runner batches by ``--batch-size``.
    teacher_forced: whether ``score_continuation`` / ``token_nll`` give scores; ``unavailable`` the reason when not.
    positional_methods: the positional methods a model of this backend takes at load (:data:`EVERY_METHOD`: all).
    lmeval: the engine lm-eval's mmlu/arc run on (:mod:`lctx.tasks.lmeval`): ``"hf"`` (lm-eval's ``hf`` model over
        ``lmeval_model()``), ``"api"`` (its ``local-completions`` model over ``lmeval_api_model()``), or
        ``"protocol"`` (any adapter: lm-eval's requests scored through ``prefix`` / ``score_continuation``).
    max_length_source: where ``max_length`` was read, for messages.
    chat_history: the adapter renders a whole conversation (``chat_prompt``, or lm-eval's own engine's template).
    """

    concurrency: Optional[int] = None
    teacher_forced: bool = True
    unavailable: Optional[str] = None
    positional_methods: tuple = ()
    lmeval: str = "protocol"
    max_length_source: str = "max_length"
    chat_history: bool = False

    def takes_position(self, method: str) -> bool:
        """Whether a model of this backend takes positional method ``method`` at load (``"shipped"`` always)."""
        return method == "shipped" or self.positional_methods == EVERY_METHOD or method in self.positional_methods


def capabilities(lm: Any) -> Capabilities:
    """The :class:`Capabilities` of ``lm`` (an adapter, a :class:`CheckedAdapter`, or a class: read from class
    attributes), each optional member checked against its contract (:data:`OPTIONAL_MEMBERS`). Torch-free, cheap
    (attribute reads).

    Raises:
        LctxError: a member of the wrong shape (one line: the member, its value, the contract, where it is written).
    """
    def bad(member: str, value: Any) -> LctxError:
        cls = lm.__name__ if isinstance(lm, type) else type(lm.adapter if isinstance(lm, CheckedAdapter) else lm).__name__
        return LctxError(f"model adapter {cls}: {member} is {_show(value)}, which breaks its contract "
                         f"({CONTRACT_DOC}: {OPTIONAL_MEMBERS[member][1]}); fix {cls}.{member}")

    conc = optional(lm, "concurrency")
    if conc is not None and (not _is_int(conc) or conc < 1):
        raise bad("concurrency", conc)
    tf = optional(lm, "teacher_forced")
    if not (tf is True or (isinstance(tf, str) and tf.strip())):
        raise bad("teacher_forced", tf)
    pos = optional(lm, "positional_methods")
    if not isinstance(pos, tuple) or not all(isinstance(m, str) and m for m in pos):
        raise bad("positional_methods", pos)
    src = optional(lm, "max_length_source")
    if not isinstance(src, str):
        raise bad("max_length_source", src)
    kind = next((LMEVAL_KINDS[m] for m in LMEVAL_CAPABILITIES if optional(lm, m) is not None), "protocol")
    return Capabilities(concurrency=None if conc is None else int(conc), teacher_forced=tf is True,
                        unavailable=None if tf is True else tf, positional_methods=pos, lmeval=kind,
                        max_length_source=src,
                        chat_history=kind != "protocol" or optional(lm, "chat_prompt") is not None)


#: the lm-eval engine each capability of :data:`LMEVAL_CAPABILITIES` gives (:attr:`Capabilities.lmeval`)
LMEVAL_KINDS = {"lmeval_model": "hf", "lmeval_api_model": "api"}


#: the members :class:`ModelAdapter` declares (attributes and methods), for messages that name what is missing
ADAPTER_MEMBERS = ("name", "path", "variant", "train_length", "max_length", "can_batch", "bos_id", "encode",
                   "decode", "prompt", "continuation_ids", "prompt_budget", "tokenizer_fingerprint",
                   "prompt_signature", "prefix", "greedy", "score_continuation", "token_nll", "prefix_batch",
                   "greedy_batch", "batch_row", "model_inputs", "settings", "reset_peak_memory",
                   "peak_memory_bytes", "free_memory", "memory_plan")


def missing_members(obj: Any) -> list[str]:
    """The :data:`ADAPTER_MEMBERS` ``obj`` lacks (``[]`` for an adapter)."""
    return [m for m in ADAPTER_MEMBERS if not hasattr(obj, m)]


# ---------------------------------------------------------------------------------------------------------------
# the contract, checked: once before a run (check_adapter), and on a user's adapter's outputs while it runs
# (CheckedAdapter)
# ---------------------------------------------------------------------------------------------------------------

#: where each member's contract is written down, for messages
CONTRACT_DOC = "docs/adapters.md"

#: the keys :meth:`ModelAdapter.settings` must have (each a record field)
SETTINGS_KEYS = ("dtype", "attn_impl", "chunk_size", "device_type", "versions", "device")

#: members tasks written before the protocol used, {name: what to write instead} (docs/custom-tasks.md), for the
#: message of the AttributeError an adapter without them gives (:class:`CheckedAdapter`)
RENAMED = {
    "prefill": "renamed prefix (docs/custom-tasks.md)",
    "prefill_batch": "renamed prefix_batch (docs/custom-tasks.md)",
    "with_bos": "HFAdapter only: write ([lm.bos_id] if lm.bos_id is not None else []) + ids, or build the prompt "
                "with lm.prompt (docs/custom-tasks.md)",
    "tokenizer": "HFAdapter only: a task tokenises through lm.encode / lm.prompt (docs/custom-tasks.md)",
    "model": "HFAdapter only: a task scores through lm.prefix / lm.greedy / lm.score_continuation / lm.token_nll "
             "(docs/custom-tasks.md)",
}

#: slack of the sign checks of log-probabilities (<= 0) and NLLs (>= 0): float rounding of a log-softmax
SIGN_TOLERANCE = 1e-4


class AdapterContractError(ContractError):
    """A model adapter's output that breaks the protocol's contract while a run scores a sample
    (:class:`CheckedAdapter`); the message names the member, what it returned and the contract, and the runner
    records it as that sample's error."""


def _show(value: Any, width: int = 60) -> str:
    """``repr(value)``, cut to ``width`` characters, with its type: ``'a b' (str)``."""
    r = repr(value)
    r = r if len(r) <= width else r[: width - 3] + "..."
    return f"{r} ({type(value).__name__})"


def _is_int(x: Any) -> bool:
    """An integer, not a bool (numpy's integers count: they register as :class:`numbers.Integral`)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_seq(x: Any) -> bool:
    """A sequence of items with a length, not a str or bytes (a list, a tuple, a 1-D array or tensor)."""
    return hasattr(x, "__len__") and hasattr(x, "__getitem__") and not isinstance(x, (str, bytes, dict))


def _float(x: Any) -> Optional[float]:
    """``float(x)``, or None for what is no number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _ids_problem(ids: Any, what: str = "token ids") -> Optional[str]:
    """Why ``ids`` is not a list of int token ids (None when it is)."""
    if not isinstance(ids, list):
        return f"not a list of {what}"
    bad = next((i for i in ids if not _is_int(i)), None)
    return None if bad is None and not any(_is_int(i) and i < 0 for i in ids) else \
        f"a list holding {_show(bad) if bad is not None else 'a negative id'}, not only {what} (int >= 0)"


def check_adapter(obj: Any) -> None:
    """One cheap check of ``obj`` against :class:`ModelAdapter`'s contract (docs/adapters.md), before a run, so a
    member of the wrong shape is named now instead of as a traceback far from it or as an error in every sample:
    every member there (:func:`missing_members`); ``name`` a non-empty str, ``path`` and ``variant`` str,
    ``train_length`` / ``max_length`` None or a positive int, ``can_batch`` a bool, ``bos_id`` None or an int;
    every method callable; ``encode("a b")`` a list of int, ``decode`` of it a str, ``prompt("x", " y", marks=[0])``
    with ``ids`` (a non-empty list of int), ``text`` (str) and ``marks`` (one int), ``continuation_ids`` a list of
    int, ``prompt_budget(256, 8)`` an int <= 256, ``tokenizer_fingerprint()`` a non-empty str,
    ``prompt_signature()`` a dict, ``settings()`` a dict with :data:`SETTINGS_KEYS` (``versions`` a dict,
    ``chunk_size`` None or an int), ``model_inputs()`` a dict with ``path`` and a str ``fingerprint``. It calls
    ``model_inputs()``, which the run calls anyway (an adapter computes it once). Torch-free.

    Raises:
        LctxError: the first member that breaks the contract (one line: the member, what it returned, the contract,
            and where it is written); what a member raises as ``LctxError`` itself (a chat template that cannot
            format a prompt).
    """
    cls = type(obj).__name__
    missing = missing_members(obj)
    if missing:
        raise LctxError(f"model {obj!r} is not a model adapter: it lacks {', '.join(missing)} "
                        f"(lctx.models.adapters.protocol.ModelAdapter, {CONTRACT_DOC}); give it every member")

    def bad(member: str, got: str, contract: str) -> LctxError:
        return LctxError(f"model adapter {cls}: {member} {got}, which breaks its contract ({CONTRACT_DOC}: "
                         f"{contract}); fix {cls}.{member.split('(')[0]}")

    def call(member: str, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except LctxError:
            raise
        except Exception as e:  # noqa: BLE001 - a user's adapter: name the member, not a traceback
            msg = str(e).strip().splitlines()
            raise LctxError(f"model adapter {cls}: {member} raised {type(e).__name__}: {msg[0][:200] if msg else ''}; "
                            f"fix {cls}.{member.split('(')[0]} ({CONTRACT_DOC})") from None

    name = obj.name
    if not isinstance(name, str) or not name.strip():
        raise bad("name", f"is {_show(name)}", "a non-empty str, the model's display name in every record")
    for member in ("path", "variant"):
        value = getattr(obj, member)
        if not isinstance(value, str):
            raise bad(member, f"is {_show(value)}", "a str" + (", where the model came from, as given"
                                                                if member == "path" else ", the positional variant"))
    for member in ("train_length", "max_length"):
        value = getattr(obj, member)
        if value is not None and (not _is_int(value) or value < 1):
            raise bad(member, f"is {_show(value)}", "None (unknown) or a positive int of tokens")
    if not isinstance(obj.can_batch, bool):
        raise bad("can_batch", f"is {_show(obj.can_batch)}", "a bool, True only if the batch methods work")
    capabilities(obj)  # the optional members (concurrency, teacher_forced, positional_methods, ...) of their shapes
    bos = obj.bos_id
    if bos is not None and not (_is_int(bos) and bos >= 0):
        raise bad("bos_id", f"is {_show(bos)}", "None or the int token id put first in a sequence")
    attrs = {"name", "path", "variant", "train_length", "max_length", "can_batch", "bos_id"}
    for member in ADAPTER_MEMBERS:
        if member not in attrs and not callable(getattr(obj, member)):
            raise bad(member, f"is {_show(getattr(obj, member))}", "a method")

    ids = call("encode('a b')", obj.encode, "a b")
    problem = _ids_problem(ids) or (None if ids else "an empty list")
    if problem:
        raise bad("encode('a b')", f"returned {_show(ids)}: {problem}", "a list of int token ids, no special tokens")
    text = call(f"decode({ids!r})", obj.decode, ids)
    if not isinstance(text, str):
        raise bad(f"decode({ids!r})", f"returned {_show(text)}", "the str the ids spell")
    p = call("prompt('x', ' y', marks=[0])", obj.prompt, "x", " y", marks=[0])
    contract = ("an object with ids (a list of int: BOS and chat template included), text (str) and marks "
                "(a list of int)")
    if not all(hasattr(p, a) for a in ("ids", "text", "marks")):
        raise bad("prompt('x', ' y', marks=[0])", f"returned {_show(p)}", contract)
    problem = _ids_problem(p.ids) or (None if p.ids else "an empty list")
    if problem:
        raise bad("prompt('x', ' y', marks=[0])", f"returned ids {_show(p.ids)}: {problem}", contract)
    if not isinstance(p.text, str):
        raise bad("prompt('x', ' y', marks=[0])", f"returned text {_show(p.text)}", contract)
    if not _is_seq(p.marks) or len(p.marks) != 1 or not _is_int(p.marks[0]):
        raise bad("prompt('x', ' y', marks=[0])", f"returned marks {_show(p.marks)}",
                  "marks: one int per offset asked for (the prompt tokens before it)")
    cont = call("continuation_ids('x', ' y')", obj.continuation_ids, "x", " y")
    problem = _ids_problem(cont)
    if problem:
        raise bad("continuation_ids('x', ' y')", f"returned {_show(cont)}: {problem}",
                  "the list of int ids the continuation has after the context")
    budget = call("prompt_budget(256, 8)", obj.prompt_budget, 256, 8)
    if not _is_int(budget) or budget > 256:
        raise bad("prompt_budget(256, 8)", f"returned {_show(budget)}", "an int of prompt tokens, at most the length")
    fp = call("tokenizer_fingerprint()", obj.tokenizer_fingerprint)
    if not isinstance(fp, str) or not fp:
        raise bad("tokenizer_fingerprint()", f"returned {_show(fp)}", "a non-empty str hash of the tokenizer")
    sig = call("prompt_signature()", obj.prompt_signature)
    if not isinstance(sig, dict):
        raise bad("prompt_signature()", f"returned {_show(sig)}", "a dict ({} for plain prompts)")
    st = call("settings()", obj.settings)
    contract = f"a dict with {', '.join(SETTINGS_KEYS)} (None where one does not apply; versions a dict)"
    if not isinstance(st, dict):
        raise bad("settings()", f"returned {_show(st)}", contract)
    lacking = [k for k in SETTINGS_KEYS if k not in st]
    if lacking:
        raise bad("settings()", f"has no {', '.join(lacking)}", contract)
    if not isinstance(st["versions"], dict):
        raise bad("settings()", f"returned versions {_show(st['versions'])}", contract)
    if st["chunk_size"] is not None and not _is_int(st["chunk_size"]):
        raise bad("settings()", f"returned chunk_size {_show(st['chunk_size'])}", "chunk_size: None or an int")
    mi = call("model_inputs()", obj.model_inputs)
    contract = 'a dict {"path": ..., "fingerprint": a str of 16 hex digits, "files": {name: sha256}}'
    if not isinstance(mi, dict):
        raise bad("model_inputs()", f"returned {_show(mi)}", contract)
    if "path" not in mi or not isinstance(mi.get("fingerprint"), str) or not mi["fingerprint"]:
        got = "has no path" if "path" not in mi else f"returned fingerprint {_show(mi.get('fingerprint'))}"
        raise bad("model_inputs()", got, contract)
    if not isinstance(mi.get("files") or {}, dict):
        raise bad("model_inputs()", f"returned files {_show(mi['files'])}", contract)


class CheckedAdapter:
    """A user's model adapter with the outputs of its scoring methods checked against the contract while a run
    uses it (the runner wraps every adapter that is not lctx's own, :func:`checked`): :meth:`greedy` /
    :meth:`greedy_batch` (lists of int ids, at most ``max_new_tokens``, none after a stop id),
    :meth:`score_continuation` (``logprobs`` <= 0, ``top1``, ``ranks`` >= 1: one each per token) and :meth:`token_nll` (two sequences of
    ``len(targets)``, NLLs >= 0). A violation raises :class:`AdapterContractError` naming the member and the
    contract, which the runner records as the sample's error. Transparent otherwise: every other member, attribute
    reads and writes (``name``, ``train_length``) go to the adapter, which gets its own handles back, so records,
    identity and resume keys are the adapter's. A member a task written for the old API asks for
    (``prefill``, :data:`RENAMED`) fails with what to write instead."""

    def __init__(self, adapter: Any):
        object.__setattr__(self, "_adapter", adapter)

    def __getattr__(self, name: str) -> Any:
        adapter = object.__getattribute__(self, "_adapter")
        try:
            return getattr(adapter, name)
        except AttributeError:
            if name in RENAMED:
                raise AttributeError(f"{type(adapter).__name__!r} object has no attribute {name!r}: "
                                     f"{RENAMED[name]}") from None
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._adapter, name, value)

    def __repr__(self) -> str:
        return repr(self._adapter)

    @property
    def adapter(self) -> Any:
        """The adapter checked."""
        return self._adapter

    def _fail(self, member: str, got: str, contract: str) -> AdapterContractError:
        return AdapterContractError(f"{type(self._adapter).__name__}.{member} returned {got} ({CONTRACT_DOC}: "
                                    f"{contract})")

    def _check_ids(self, member: str, ids: Any, budget: int, stop_ids) -> None:
        contract = "a list of at most max_new_tokens int ids, ending after the first stop id"
        if not _is_seq(ids):
            raise self._fail(member, _show(ids), contract)
        if len(ids) > int(budget):
            raise self._fail(member, f"{len(ids)} ids for max_new_tokens={budget}", "at most max_new_tokens")
        bad = next((i for i in ids if not _is_int(i)), None)
        if bad is not None:
            raise self._fail(member, f"a non-int id {_show(bad)}", contract)
        if stop_ids:
            early = next((j for j, i in enumerate(ids[:-1]) if i in stop_ids), None)
            if early is not None:
                raise self._fail(member, f"ids past stop id {ids[early]} (at {early} of {len(ids)})",
                                 "ending after the first id in stop_ids, that id included")

    def greedy(self, prefix: Any, max_new_tokens: int, *args, **kwargs) -> list[int]:
        """The adapter's :meth:`ModelAdapter.greedy`, its ids checked."""
        out = self._adapter.greedy(prefix, max_new_tokens, *args, **kwargs)
        self._check_ids("greedy", out, max_new_tokens, args[0] if args else kwargs.get("stop_ids"))
        return out

    def greedy_batch(self, batch: Any, max_new_tokens, *args, **kwargs) -> list[list[int]]:
        """The adapter's :meth:`ModelAdapter.greedy_batch`, each row's ids checked."""
        out = self._adapter.greedy_batch(batch, max_new_tokens, *args, **kwargs)
        stops = args[0] if args else kwargs.get("stop_ids")
        if not _is_seq(out):
            raise self._fail("greedy_batch", _show(out), "one list of ids per row")
        budgets = list(max_new_tokens) if _is_seq(max_new_tokens) else [max_new_tokens] * len(out)
        if len(budgets) != len(out):
            raise self._fail("greedy_batch", f"{len(out)} rows for {len(budgets)} prompts", "one list of ids per row")
        for row, budget in zip(out, budgets):
            self._check_ids("greedy_batch", row, budget, stops)
        return out

    def score_continuation(self, prefix: Any, cont: list[int]) -> Any:
        """The adapter's :meth:`ModelAdapter.score_continuation`, its scores checked."""
        out = self._adapter.score_continuation(prefix, cont)
        n = len(cont)
        contract = f"ContinuationScores(logprobs, top1, ranks), three lists of len(cont) = {n} entries"
        if not all(hasattr(out, f) for f in ContinuationScores._fields):
            got = f"a {type(out).__name__} of {len(out)}" if _is_seq(out) else _show(out)
            raise self._fail("score_continuation", got, contract)
        for f in ContinuationScores._fields:
            seq = getattr(out, f)
            if not _is_seq(seq) or len(seq) != n:
                raise self._fail("score_continuation", f"{f} {_show(seq)}", contract)
        lp = next(((j, x) for j, x in enumerate(out.logprobs) if not (_float(x) is not None and
                                                                     _float(x) <= SIGN_TOLERANCE)), None)
        if lp is not None:
            raise self._fail("score_continuation", f"logprob {_show(lp[1])} at token {lp[0]}",
                             "natural-log probabilities, <= 0")
        rk = next(((j, r) for j, r in enumerate(out.ranks) if not (_is_int(r) and r >= 1)), None)
        if rk is not None:
            raise self._fail("score_continuation", f"rank {_show(rk[1])} at token {rk[0]}", "ranks, ints >= 1")
        t1 = next(((j, t) for j, t in enumerate(out.top1) if t not in (True, False)), None)
        if t1 is not None:
            raise self._fail("score_continuation", f"top1 {_show(t1[1])} at token {t1[0]}", "top1, bools")
        return out

    def token_nll(self, ids: list[int], targets: list[int]) -> Any:
        """The adapter's :meth:`ModelAdapter.token_nll`, its NLLs checked."""
        out = self._adapter.token_nll(ids, targets)
        n = len(targets)
        contract = f"(NLLs, top1s): two sequences of len(targets) = {n} entries"
        if not _is_seq(out) or len(out) != 2:
            raise self._fail("token_nll", _show(out), contract)
        for what, seq in zip(("NLLs", "top1s"), out):
            if not _is_seq(seq) or len(seq) != n:
                raise self._fail("token_nll", f"{what} {_show(seq)}", contract)
        neg = next(((j, x) for j, x in enumerate(out[0]) if not (_float(x) is not None and
                                                                _float(x) >= -SIGN_TOLERANCE)), None)
        if neg is not None:
            raise self._fail("token_nll", f"NLL {_show(neg[1])} at target {neg[0]}",
                             "NLLs in nats, >= 0 (-log of a probability)")
        return out


def checked(lm: Any) -> Any:
    """``lm`` in a :class:`CheckedAdapter`, unless it is lctx's own (its class defined in ``lctx``: the in-process
    :class:`~lctx.models.adapters.hf.HFAdapter`, whose hot path stays unchecked) or checked already."""
    if isinstance(lm, CheckedAdapter) or type(lm).__module__.split(".")[0] == "lctx":
        return lm
    return CheckedAdapter(lm)
