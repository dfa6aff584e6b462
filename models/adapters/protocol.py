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

Optional capability (not part of :class:`ModelAdapter`): lm-eval's mmlu/arc tasks run lm-eval's own ``hf``
backend over a Hugging Face model, so they need :class:`LmEvalCapable` (``lmeval_model()``); ``lctx.evaluate``
refuses those tasks, before anything runs, for an adapter without it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Protocol, Sequence, runtime_checkable


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


#: the members :class:`ModelAdapter` declares (attributes and methods), for messages that name what is missing
ADAPTER_MEMBERS = ("name", "path", "variant", "train_length", "max_length", "can_batch", "bos_id", "encode",
                   "decode", "prompt", "continuation_ids", "prompt_budget", "tokenizer_fingerprint",
                   "prompt_signature", "prefix", "greedy", "score_continuation", "token_nll", "prefix_batch",
                   "greedy_batch", "batch_row", "model_inputs", "settings", "reset_peak_memory",
                   "peak_memory_bytes", "free_memory", "memory_plan")


def missing_members(obj: Any) -> list[str]:
    """The :data:`ADAPTER_MEMBERS` ``obj`` lacks (``[]`` for an adapter)."""
    return [m for m in ADAPTER_MEMBERS if not hasattr(obj, m)]
