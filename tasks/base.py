"""The Task interface and the task registry.

A task is a small Python class: it declares its ``name``, the grid ``axes`` it sweeps and the
``metrics`` it reports, builds one sample per grid cell (:meth:`Task.build`) and scores it
(:meth:`Task.score`). Register it with :func:`register_task`; lctx finds tasks in this package, in a
Python file given with ``lctx run --task-file my_task.py``, and in installed packages that declare an
entry point in the ``lctx.tasks`` group (``[project.entry-points."lctx.tasks"] my_task = "pkg.mod:MyTask"``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import itertools
import math
import numbers
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from lctx.errors import LctxError, MetricUnavailable
from lctx.registry import Registry

TASKS: Registry[type["Task"]] = Registry("task", replace=True)  # a task file may be reloaded

#: A greedy decode step (one token through the model with its KV cache) costs about as much as prefilling
#: this many tokens: measured on the bundled model on 2 CPU cores, a decode step takes ~60-80 ms where a
#: prefill takes ~1 ms per token (passkey at 256 tokens: 1.0 s, at 2048: 1.5 s, with 10 decode steps each);
#: on a GPU a decode step is memory-bound and likewise worth tens to hundreds of prefill tokens. Used by
#: :meth:`Task.cost`, so a sweep's progress bar does not under-count generation.
DECODE_STEP_TOKENS = 64

#: The task categories (:attr:`Task.category`), in the report's column order: RULER's (Hsieh et al. 2024,
#: "RULER: What's the Real Context Size of Your Long-Context Language Models?", section 3: retrieval, multi-hop
#: tracing, aggregation, question answering; its retrieval split into one needle and several), then the kinds
#: HELMET / MRCR (multi-round coreference) and BABILong (reasoning over scattered facts) add.
CATEGORIES = ("single retrieval", "multi retrieval", "multi-hop tracing", "aggregation", "QA", "multi-round",
              "reasoning")


@dataclass(frozen=True)
class Cell:
    """One point of a task's grid: target ``length`` (tokens; ``None`` for a task without a length axis, e.g.
    an lm-eval question), needle ``depth`` (fraction of the prompt before the needle, or ``None`` for tasks
    without depth) and ``sample`` index."""

    length: int
    depth: float | None
    sample: int


@dataclass
class Sample:
    """A built sample: the cell, the prompt token ids and whatever the scorer needs in ``meta``.

    ``n_tokens`` is the actual prompt length in tokens and ``depth`` the actual needle depth
    (``None`` where the task has none); both go into the results table.
    """

    cell: Cell
    input_ids: list[int]
    n_tokens: int
    depth: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Unavailable:
    """A metric's value that the model cannot give, with the reason (:class:`lctx.errors.MetricUnavailable`'s
    message): what :func:`optional_metrics` puts in place of a number. The runner records it under the record's
    ``unavailable`` {metric: reason}, never as a value; a task may also return one itself from :meth:`Task.score`."""

    reason: str


#: the longest reason a record keeps (one line)
REASON_CHARS = 300
#: the longest list of numbers a record's ``extra`` keeps (:meth:`Task.record_extra`)
EXTRA_LIST_MAX = 64


def unavailable_reason(e: BaseException) -> str:
    """The one-line reason a record keeps for a :class:`lctx.errors.MetricUnavailable` (its message, first line, at
    most :data:`REASON_CHARS` characters; its type's name when it has none)."""
    lines = str(e).strip().splitlines()
    return (lines[0].strip() if lines else type(e).__name__)[:REASON_CHARS]


def optional_metrics(names, compute) -> dict:
    """``compute()``'s {metric: value}, or, when the model cannot give them (``compute`` raises
    :class:`lctx.errors.MetricUnavailable`: a server without prompt log-probabilities), each of ``names`` as
    :class:`Unavailable` with the reason. A task computes its teacher-forced metrics through it, so that the metrics
    it computed otherwise (greedy ones) are kept::

        out = {"exact": exact(answer, key)}
        out.update(optional_metrics(("digit_acc",), lambda: {"digit_acc": digit_acc(lm, prefix, key)}))

    Any other exception propagates (the sample's error)."""
    try:
        return dict(compute())
    except MetricUnavailable as e:
        return {str(n): Unavailable(unavailable_reason(e)) for n in names}


@dataclass(frozen=True)
class RunOption:
    """A run-wide ``lctx run`` flag (a keyword of :func:`lctx.evaluate`) that a task declares it takes
    (:attr:`Task.run_options`): the runner gives each task of the run the values of the flags it declares, warns
    about a flag set (not at its default) that no task of the run declares, and names the flag in the one-line
    error for a value the task's constructor refuses.

    flag: the flag as the user types it (``"--stride"``); param: the :func:`lctx.evaluate` keyword that carries it
    (``"stride"``; one of its keyword arguments); option: the constructor keyword the value is given to (``"stride"``),
    or None for a value the runner reads itself (``lengths``); default: its value when not given (the flag's
    default); hint: what a valid value looks like, for the error ("pass {hint}"); users: how the warning names
    the tasks that take it (default: the declaring task's name); lengths: the value is a list of lengths in tokens
    (``"256,1k"``) this task runs at instead of ``--lengths``, in a sweep of its own (``ppl``'s ``--window``).
    """

    flag: str
    param: str
    option: str | None = None
    default: Any = None
    hint: str = ""
    users: str = ""
    lengths: bool = False


@dataclass(frozen=True)
class Heatmap:
    """How a task's depth x length heatmap is drawn (:attr:`Task.heatmap`; ``plots/<task>_heatmap_<model>.png``).

    title: the figure's title before the model's name (default the task's name); depth_label: the y axis label
    (default "Needle depth (0% = start)"); panels: fixed panels {metric: panel title}, drawn whatever their values
    (default: the task's :attr:`Task.heatmap_metrics`, or every metric, those whose ok values lie in [0, 1]);
    narrow: ``lctx report`` sets two such figures side by side instead of one per row.
    """

    title: str = ""
    depth_label: str = ""
    panels: dict[str, str] | None = None
    narrow: bool = False


#: The largest greedy answer budget (``max_new_tokens`` of any task), tokens. A budget is counted in the length (prompt
#: + answer <= length), so a run refuses one that alone fills its longest length (:func:`check_bounds_at`); this cap
#: holds whatever the lengths: 64 K tokens, 512 times RULER's largest budget (128, NIAH's) and above any answer a task
#: scores (an MRCR reply of 10 000 words is ~13 K tokens). A reasoning model's thinking has its own ``--think-budget``.
MAX_NEW_TOKENS = 1 << 16

#: The most cells (length x depth x sample, summed over the run's tasks) one run may have: each cell is a record
#: (~1 KB in ``records.jsonl``) and an entry of the sweep's plan, so a run stays under ~1 GB of records and its plan
#: under ~100 MB of memory. Checked before any work (:func:`lctx.harness.evaluate.evaluate`).
MAX_CELLS = 1_000_000


@dataclass(frozen=True)
class Bound:
    """The bounds of a size option of a task (:attr:`Task.option_bounds`): what values it may take, checked on the
    keywords given before the constructor runs (:func:`check_option_bounds`, from :meth:`Task.__new__`) and against the
    run's longest length before any sample is built (:func:`check_bounds_at`), each a one-line error naming the bound.

    lo, hi: the smallest and largest value (``hi`` a stated cap, derived from what the option is for: ``why``);
    whole: only whole numbers; per_length: tokens one unit of the option takes at least in a sample (a budget's
    token: 1; a bAbI fact: 4), so that ``value * per_length`` must stay below the run's longest length (0: no
    relation to the length); unit: what the option counts, for messages ("tokens", "facts").
    """

    lo: float = 1
    hi: float | None = None
    whole: bool = True
    per_length: float = 0.0
    unit: str = ""
    why: str = ""

    def hint(self) -> str:
        """What a valid value looks like, for an error's fix: "a whole number of tokens from 1 to 65536"."""
        kind = "a whole number" if self.whole else "a number"
        unit = f" of {self.unit}" if self.unit else ""
        lo = _num(self.lo)
        return f"{kind}{unit} from {lo} to {_num(self.hi)}" if self.hi is not None else f"{kind}{unit} >= {lo}"

    def check(self, name: str, value: Any) -> None:
        """Refuse ``value`` (the option ``name``'s) outside these bounds, before anything is built with it.

        Raises:
            ValueError: not a number (a bool counts as none), not finite, not whole where ``whole``, below ``lo`` or
                above ``hi`` (one line naming the option, the bound and ``why``).
        """
        if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
            raise ValueError(f"{name}={value!r} is not a number")
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} is not a number") from None
        if not math.isfinite(v) or (self.whole and not v.is_integer()):
            raise ValueError(f"{name}={value!r} is not {'a whole' if self.whole else 'a finite'} number")
        if v < self.lo:
            what = ("not a positive whole number" if self.whole and self.lo == 1 else "negative" if self.lo == 0
                    else f"below {_num(self.lo)}")
            raise ValueError(f"{name}={value!r} is {what}")
        if self.hi is not None and v > self.hi:
            why = f" ({self.why})" if self.why else ""
            raise ValueError(f"{name}={value!r} is above {_num(self.hi)}{' ' + self.unit if self.unit else ''}, the "
                             f"most it may be{why}")


def _num(x) -> str:
    """A bound as a message writes it: a whole number without a decimal point (65536, not 65536.0 or 6.6e+04)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def budget_bound(why: str = "") -> Bound:
    """The :class:`Bound` of a greedy answer budget (``max_new_tokens``): a whole number of tokens from 1 to
    :data:`MAX_NEW_TOKENS`, below the run's longest length (it is counted in the length)."""
    return Bound(1, MAX_NEW_TOKENS, per_length=1, unit="tokens",
                 why=why or "a greedy answer budget: 512 times RULER's largest, 128")


def check_option_bounds(cls, options: dict) -> None:
    """Check the keyword options given to task class ``cls`` (``None``: the default, not checked) against its
    :attr:`Task.option_bounds`, before its constructor runs: a value far out of range (``babi_qa1.facts=1e8``,
    ``mrcr.answer_words=99999999``) is refused here, not after it filled memory.

    Raises:
        ValueError: a value out of its bounds (:meth:`Bound.check`; ``lctx run`` names the flag that set it).
    """
    for key, bound in (getattr(cls, "option_bounds", None) or {}).items():
        value = options.get(key)
        if value is not None:
            bound.check(key, value)


def check_bounds_at(task: "Task", lengths) -> None:
    """Refuse a task's size option that the run's longest length cannot hold: ``value * per_length`` of each
    :attr:`Task.option_bounds` entry with a ``per_length`` (its given value, ``task.options``) at or above
    ``max(lengths)`` tokens (a ``max_new_tokens`` of 1e9 at 2K, 1e8 bAbI facts), before any sample is built. ``lctx run``
    calls it with the lengths each task runs at (:func:`lctx.harness.evaluate.evaluate`), then
    :meth:`Task.check_lengths`.

    Raises:
        ValueError: an option the longest length cannot hold (names it, the length and the fix).
    """
    lengths = [int(L) for L in lengths or ()]
    if not lengths:
        return
    longest = max(lengths)
    for key, bound in (getattr(type(task), "option_bounds", None) or {}).items():
        value = (getattr(task, "options", None) or {}).get(key)
        if not bound.per_length or value is None or isinstance(value, bool):
            continue
        try:
            need = float(value) * bound.per_length
        except (TypeError, ValueError):
            continue
        if need >= longest:
            each = (f" of at least {_num(bound.per_length)} token{'s' if bound.per_length != 1 else ''} each"
                    if bound.unit != "tokens" else "")
            most = math.ceil(longest / bound.per_length) - 1  # the largest value whose need stays below the length
            fix = (f"pass {key}={most} or less, or longer --lengths" if most >= bound.lo
                   else "pass longer --lengths")
            raise ValueError(f"{key}={value!r} ({bound.unit or 'units'}{each}) cannot fit in {longest} tokens, the "
                             f"longest length of this run; {fix}")


#: The figure kinds a task may declare in :attr:`Task.plots` (drawn by :mod:`lctx.harness.outputs.plots`):
#: ``depth_heatmap``: a depth x length heatmap per model (:class:`Heatmap`); ``perplexity_vs_length``: the headline
#: metric against length on log axes, one line per model (``plots/<task>_vs_length.png``).
PLOT_KINDS = ("depth_heatmap", "perplexity_vs_length")


class Task:
    """Base class of lctx tasks.

    Class attributes to set:
        name: registry name (``lctx run --tasks NAME``).
        axes: grid axes swept besides length, a subset of ``("depth", "sample")``.
        metrics: names of the values :meth:`score` returns (each becomes a row of the results table).
        version: an integer to bump when a change of the task's code (prompt, scoring) changes its numbers;
            it is part of every record's fingerprint, so old records of the task are not reused.

    Optional (what the report, the plots, ``lctx compare`` and the flatness sweep read, from ``run.json``'s
    ``task_meta`` where ``lctx run`` records them, :meth:`declaration`; never the task's name):
        headline_metric: the metric a summary shows (default: the first of ``metrics``; :meth:`headline`).
        higher_is_better: whether a larger headline metric is better (ppl, NLL: False), or {metric: bool} as
            lm-eval writes it; default None: ``lctx compare`` goes by the metric's name.
        uses_seed: whether ``build`` draws anything from its ``seed`` (default True); False (ppl: fixed windows
            over fixed documents) lets ``lctx compare`` match cells of runs made with other ``--seed`` values.
        retrieval: a retrieval task (a needle to find): filed under "Retrieval" in the report, with an accuracy
            threshold, and usable as the retrieval task of a flatness sweep's effective length (default False).
        secondary_metric: a metric drawn beside the headline one (passkey's digit_acc, NIAH's teacher-forced
            tf_top1; default none).
        category: what ability the task measures, one of :data:`CATEGORIES` (RULER's grouping, Hsieh et al. 2024
            section 3, widened by HELMET's, MRCR's and BABILong's kinds): the report's length x category table
            averages each category's tasks (default None: in no category).
        description: one line for ``lctx list tasks``; when a class sets none, the first paragraph of its
            docstring is used.
        requires: the data the task reads, for ``lctx list tasks`` (e.g. ``ruler/ under --data-dir``).
        min_length(lm): the fewest tokens a sample can have with ``lm`` (its fixed template); ``lctx run``
            refuses shorter lengths before the sweep starts instead of recording error rows.
        cost(lm, cell): what one cell costs, in prefill tokens (a decode step counts
            :data:`DECODE_STEP_TOKENS`); the progress bar and its time-left estimate are weighted by it.
        batched: ``True`` opts in to ``lctx run --batch-size``: the task scores a sample as prompt ->
            greedy continuation -> metrics, by implementing :meth:`score_generated` (and, when the budget is
            not ``sample.meta["max_new_tokens"]``, :meth:`max_new_tokens_for`) instead of :meth:`score`; the
            runner then prefills and decodes several samples of a length together (:meth:`score_batch`).
            Tasks that leave it ``False`` run one sample at a time.
        whole: ``True``: the task scores all its cells of one model in one call (:meth:`score_all`), as an
            outside evaluator does (lm-eval's ``simple_evaluate`` for mmlu/arc, :mod:`lctx.tasks.lmeval`); the
            runner builds each cell's record as for any other task.
        state_dir: for a :attr:`whole` task, set by the runner around each :meth:`score_all` call: a folder of
            the run directory (``partial/<fingerprint>/``) private to this model and these inputs (the
            records' fingerprint: checkpoint content, options, data, versions), where the task may keep
            partial work (lm-eval's request cache) so that a run stopped inside the call resumes without
            redoing it; ``None`` (the default, and outside a run): keep nothing.
        adapter_needs: {method: why} that the model adapter must have beyond
            :class:`lctx.models.adapters.protocol.ModelAdapter`; a key may be a tuple of alternative methods, any one
            of which will do (lm-eval's tasks: ``{("lmeval_model", "lmeval_api_model"): "runs lm-eval's hf backend (a
            Hugging Face model) or its local-completions model (a served model)"}``); ``lctx.evaluate`` refuses the
            task, in one line before torch loads, for an adapter object (or a served model) without them. Default
            none.
        chunked: ``False`` for a task that does not run through the adapter's chunked prefill (lm-eval's): the
            prefill chunk size then does not reach its numbers and is left out of its records' fingerprint.
        subtask: a part of a task run as its own task object whose records keep the task's ``name`` (an MMLU
            subject, also in its options); the runner tells the objects apart by ``name/subtask``.

    What the runner and the outputs need of a task, declared (never looked up by the task's name; class
    attributes, read from the registered class):
        run_options: the run-wide ``lctx run`` flags it takes (:class:`RunOption`: ``ppl``'s ``--stride``,
            ``--window``, ``--ppl-data``, ...; ``passkey``'s ``--key-digits``): each flag's value (its default when
            not given) becomes the constructor option it names, under the task's own ``--task-option`` values; a
            flag no task of the run takes is named in a warning; a bad value's error names the flag. A
            :class:`RunOption` with ``lengths=True`` gives the task lengths of its own (``ppl``'s ``--window``):
            it then runs in a sweep of its own at those lengths.
        option_hints: {option: what a valid value looks like} for the one-line error of a bad
            ``--task-option TASK.KEY=VALUE`` (``mrcr.haystack``: "a .txt book or a folder of them"); a
            run option's hint serves its option too.
        option_bounds: {option: :class:`Bound`} of every option with a size (answer budgets, fact counts, answer
            words, samples): its smallest and largest value, checked on the keywords given before the constructor
            runs (:func:`check_option_bounds`), and, with ``per_length``, against the run's longest length before
            any sample is built (:func:`check_bounds_at`); its :meth:`Bound.hint` is the option's hint.
        default_run: the task runs when ``--tasks`` is not given (``passkey``, ``ppl``: :func:`default_tasks`).
        keeps_logits: scoring keeps the logits of every scored position of a prefill (``ppl``): the memory check
            counts a vocabulary-wide logits tensor of the longest length, not one row.
        plots: the figure kinds ``lctx run`` draws of its rows (:data:`PLOT_KINDS`); None (the default): a depth x
            length heatmap when its rows have depths.
        heatmap: how that heatmap is drawn (:class:`Heatmap`: title, depth label, fixed panels); heatmap_metrics:
            the metrics its panels show (recorded in ``run.json``; default every metric with values in [0, 1]).
        check_lengths(lengths): refuse lengths it cannot run at (``ppl``: a whole-number stride longer than a
            window), before any model loads; check_data(): a pre-flight check of its data (``ppl`` reads its
            documents), before any model loads.
        extra_tables(table), pooled_label(subtasks): tables it writes beside ``summary.csv`` and the name a
            summary cell pooled over its sub-tasks is shown under (both also on :class:`TaskGroup`, where
            MMLU's ``mmlu_subjects.csv`` and ``mmlu_astronomy`` come from).

    Constructor keyword arguments are the task's options (e.g. ``window``/``stride`` for ``ppl``); they
    are recorded with every result, and a rerun with different options does not reuse old records.
    A task that reads files names them in :meth:`data_files` (or overrides :meth:`data_fingerprint`), so
    that new contents under the same path are a different input.

    The ``lm`` every method receives is a model adapter (:class:`lctx.models.adapters.protocol.ModelAdapter`):
    a task uses its methods only (``encode``, ``prompt``, ``prefix`` / ``greedy`` / ``score_continuation``,
    ``token_nll``, ...), never a tokenizer, a torch model or a cache, so it runs on every adapter. Every logit
    the in-process adapter (:class:`lctx.models.adapters.hf.HFAdapter`) computes passes the shared check
    :func:`lctx.errors.check_finite_logits`: NaN or infinite logits make the sample an error
    (status ``error``) whatever the task computes from them.

    Metrics a model cannot give: an adapter raises :class:`lctx.errors.MetricUnavailable` from a scoring call it
    cannot serve (a server without prompt log-probabilities: ``score_continuation``, ``token_nll``). Uncaught, it
    makes every metric of the sample unavailable (the record keeps the reason; the sample is finished, not an
    error). A task that computes a metric beside others (passkey's teacher-forced ``digit_acc`` beside its greedy
    ``exact``) computes it through :func:`optional_metrics`, so that only that metric is unavailable and the others
    are kept. An unavailable metric is never 0: it is left out of every mean and shown as unavailable with its
    reason (docs/custom-tasks.md#metrics-a-model-cannot-give).
    """

    name: ClassVar[str] = ""
    axes: ClassVar[tuple[str, ...]] = ("sample",)
    metrics: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    version: ClassVar[int] = 1
    requires: ClassVar[str] = ""
    batched: ClassVar[bool] = False
    headline_metric: ClassVar[str | None] = None
    higher_is_better: ClassVar[bool | dict | None] = None
    uses_seed: ClassVar[bool] = True
    retrieval: ClassVar[bool] = False
    secondary_metric: ClassVar[str | None] = None
    category: ClassVar[str | None] = None
    whole: ClassVar[bool] = False
    chunked: ClassVar[bool] = True
    adapter_needs: ClassVar[dict] = {}
    subtask: str | None = None
    state_dir: Path | None = None
    run_options: ClassVar[tuple[RunOption, ...]] = ()
    option_hints: ClassVar[dict[str, str]] = {}
    option_bounds: ClassVar[dict[str, Bound]] = {}
    default_run: ClassVar[bool] = False
    keeps_logits: ClassVar[bool] = False
    plots: ClassVar[tuple[str, ...] | None] = None
    heatmap: ClassVar[Heatmap | None] = None
    heatmap_metrics: ClassVar[tuple[str, ...] | None] = None

    def __new__(cls, *args: Any, **options: Any):
        # the caller's keywords, before any constructor runs: a misspelt option (``Passkey(key_digit=3)``) would
        # otherwise land in ``options`` through a ``**options`` catch-all and run with the defaults
        check_option_names(cls, options)
        check_option_bounds(cls, options)  # a size far out of range: refused before the constructor builds with it
        return super().__new__(cls)

    def __init__(self, **options: Any):
        self.options = options

    @classmethod
    def headline(cls) -> str:
        """The metric a summary shows: ``headline_metric``, else the first of ``metrics``."""
        return cls.headline_metric or (cls.metrics[0] if cls.metrics else "")

    def declaration(self) -> dict:
        """What this task declares about its numbers, as ``run.json`` records it under ``task_meta[name]`` when a
        run starts (so ``lctx report``, ``lctx compare`` and the flatness sweep read it without the task's code:
        a ``--task-file`` need not be there afterwards, :func:`task_meta`): ``name``, ``version``, ``metrics``,
        ``headline_metric`` (:meth:`headline`), ``higher_is_better`` as {metric: bool} (a bool is the headline
        metric's; {} when it declares nothing), ``retrieval``, ``secondary_metric``, ``axes``, ``uses_seed`` and
        ``heatmap_metrics`` (None when not declared) and ``category`` (None when not declared). JSON-ready."""
        metrics = [str(m) for m in self.metrics]
        headline = self.headline_metric or (metrics[0] if metrics else "")
        hib = self.higher_is_better
        hib = ({str(k): bool(v) for k, v in hib.items()} if isinstance(hib, dict)
               else {headline: hib} if isinstance(hib, bool) and headline else {})
        heat = getattr(self, "heatmap_metrics", None)
        return {"name": self.name, "version": getattr(self, "version", 1), "metrics": metrics,
                "headline_metric": headline, "higher_is_better": hib, "retrieval": bool(self.retrieval),
                "secondary_metric": self.secondary_metric, "axes": [str(a) for a in self.axes],
                "uses_seed": bool(self.uses_seed), "heatmap_metrics": [str(m) for m in heat] if heat else None,
                "category": self.category}

    @classmethod
    def run_option(cls, option: str) -> RunOption | None:
        """The :class:`RunOption` that sets constructor option ``option``, or None."""
        return next((ro for ro in cls.run_options if ro.option == option), None)

    @classmethod
    def option_hint(cls, option: str) -> str | None:
        """What a valid value of constructor option ``option`` looks like (:attr:`option_hints`, else its run
        option's hint, else its :attr:`option_bounds` entry's :meth:`Bound.hint`), or None."""
        ro = cls.run_option(option)
        bound = (cls.option_bounds or {}).get(option)
        return (cls.option_hints.get(option) or (ro.hint if ro else None) or (bound.hint() if bound else None)
                or None)

    @classmethod
    def extra_tables(cls, table) -> dict:
        """Tables this task's rows add beside ``summary.csv``, {file name: DataFrame}, from the run's results
        table (all its tasks' rows); written by :func:`lctx.harness.steps.derived.write_run_tables`. Default none."""
        return {}

    @classmethod
    def pooled_label(cls, subtasks) -> str:
        """The name a summary cell of this task pooled over ``subtasks`` (the :data:`lctx.harness.run.tables.POOLED_OPTIONS`
        values its rows hold) is shown under. Default: the task's name."""
        return cls.name

    def check_lengths(self, lengths: list[int]) -> None:
        """Refuse ``lengths`` (tokens) this task cannot run at with its options: ``lctx run`` calls it before any
        model loads with the lengths given (its own ones, :attr:`run_options` ``lengths=True``, when set), and
        again with ``--relative``'s once the training lengths are known. Default: every length is fine.

        Raises:
            ValueError: a length it cannot run at (the message names the option at fault; the runner names its flag).
        """

    def check_data(self) -> None:
        """A pre-flight check of the task's data, run once the run's task objects are built and before any model
        loads (so unreadable data fails fast, not after the weights load). Default: nothing to check.

        Raises:
            LctxError: data missing or unreadable.
        """

    @property
    def key(self) -> str:
        """This task object's name in a run: ``name``, or ``name/subtask`` for a part of a task."""
        return f"{self.name}/{self.subtask}" if self.subtask else self.name

    def run_json(self) -> dict:
        """Entries this task adds to the run's ``run.json`` (e.g. lm-eval's version and data source under
        ``"lmeval"``); default none."""
        return {}

    def record_extra(self, sample: Sample) -> dict:
        """What a scored sample adds to its record's ``extra``. Default: the str/int/float/bool values of
        ``sample.meta``, and its short lists of numbers (at most :data:`EXTRA_LIST_MAX`: the answer tokens'
        teacher-forced log-probabilities, ``answer_logprobs``, which ``lctx compare RUN_A RUN_B`` lines up across
        backends)."""
        return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in sample.meta.items()
                if isinstance(v, (str, int, float, bool)) or (
                    isinstance(v, (list, tuple)) and len(v) <= EXTRA_LIST_MAX
                    and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v))}

    def score_all(self, lm, cells: list[Cell]) -> list[tuple[Sample, dict[str, float]]]:
        """For a :attr:`whole` task: score every cell of ``cells`` on ``lm`` in one call; returns per cell (in
        order) its sample (``n_tokens``, ``depth``, ``meta``) and {metric: value}. An exception fails every
        cell of the call (each gets an error record); :class:`lctx.errors.LctxError` (a user mistake) ends the
        run.

        Raises:
            NotImplementedError: the task is not :attr:`whole`.
        """
        raise NotImplementedError(f"task {self.name!r} scores one sample at a time (whole = False)")

    def data_files(self) -> dict[str, Path]:
        """The files this task reads, {name: path} (names such as paths relative to the data root; where
        the files live is not part of the identity, their content is). Default: none."""
        return {}

    def data_fingerprint(self) -> str | None:
        """16 hex digits identifying the data this task reads (SHA-256 of the content of
        :meth:`data_files`), or ``None`` for a task without data files. Computed once per task object.

        Raises:
            LctxError: a data file is missing, not a regular file or unreadable.
        """
        if not hasattr(self, "_data_fp"):
            from lctx.models.fingerprint import digest_files  # lazy: loads torch

            files = self.data_files()
            self._data_fp = digest_files(files) if files else None
        return self._data_fp

    def min_length(self, lm) -> int:
        """The fewest tokens (BOS included) a sample of this task can have with ``lm``'s tokenizer: its fixed
        template (instruction, needle, question, and any generation budget counted in the length) with no
        filler. A lower bound: ``lctx run`` refuses every requested length below it, for every model, before
        the sweep starts (:func:`lctx.harness.run.runner.check_min_lengths`); :meth:`build` still raises for a
        sample that does not fit. Default 1 (no template)."""
        return 1

    def cost(self, lm, cell: Cell) -> float:
        """What ``cell`` costs the model, in prefill tokens: tokens prefilled (every pass) plus
        :data:`DECODE_STEP_TOKENS` per greedy decode step. ``lctx run``'s progress bar and its time-left
        estimate are weighted by it. Default: one prefill of ``cell.length`` tokens. Override when a sample
        costs more (several passes, many windows, generation)."""
        return float(cell.length)

    def n_cells(self, n_lengths: int, n_depths: int, samples: int) -> int:
        """How many cells :meth:`cells` makes for ``n_lengths`` lengths, ``n_depths`` depths and ``samples``, counted
        without making them (the run's bound on its grid, :data:`MAX_CELLS`). Override with :meth:`cells`."""
        return int(n_lengths) * (int(n_depths) if "depth" in self.axes else 1) * (
            int(samples) if "sample" in self.axes else 1)

    def cells(self, lengths: list[int], depths: list[float], samples: int) -> list[Cell]:
        """The grid: lengths x (depths if "depth" in axes) x (range(samples) if "sample" in axes)."""
        ds = depths if "depth" in self.axes else [None]
        ss = range(samples) if "sample" in self.axes else [0]
        return [Cell(int(L), d, s) for L, d, s in itertools.product(lengths, ds, ss)]

    def build(self, lm, cell: Cell, seed: int) -> Sample:
        """Build the sample of ``cell`` for the model ``lm`` (a :class:`lctx.models.adapters.protocol.ModelAdapter`),
        deterministically from ``seed``. Must not exceed ``cell.length`` tokens."""
        raise NotImplementedError

    def score(self, lm, sample: Sample) -> dict[str, float]:
        """Run the model on ``sample`` and return {metric: value} for every name in ``metrics`` (a value is a number,
        or :class:`Unavailable` for one the model cannot give: :func:`optional_metrics`; a
        :class:`lctx.errors.MetricUnavailable` raised here makes every metric of the sample unavailable).

        Default (for :attr:`batched` tasks): the prompt's handle (``lm.prefix``), its greedy continuation
        (:meth:`max_new_tokens_for` tokens at most, :meth:`stop_ids`), then :meth:`score_generated`."""
        if not self.batched:
            raise NotImplementedError(f"task {self.name!r} implements neither score() nor batched scoring")
        prefix = lm.prefix(sample.input_ids)
        stops = self.stop_ids(lm)
        n = self.max_new_tokens_for(sample)
        cont = lm.greedy(prefix, n) if stops is None else lm.greedy(prefix, n, stops)
        return self.score_generated(lm, sample, prefix, cont)

    # -- batched scoring (``batched = True``) ------------------------------------------------------------
    def max_new_tokens_for(self, sample: Sample) -> int:
        """Greedy decode budget of ``sample`` in tokens. Default: ``sample.meta["max_new_tokens"]``."""
        return int(sample.meta["max_new_tokens"])

    def stop_ids(self, lm) -> set[int] | None:
        """Token ids that end the greedy continuation (``None``: the tokenizer's EOS)."""
        return None

    def score_generated(self, lm, sample: Sample, prefix, continuation: list[int]) -> dict[str, float]:
        """{metric: value} of ``sample`` from its greedy ``continuation`` (token ids) and ``prefix`` (the
        adapter's opaque handle of the prompt, for teacher-forced scores: ``lm.score_continuation(prefix, ...)``;
        the in-process adapter scores through the prompt's KV cache). Called after one prompt alone or as a row
        of a batch; it must not depend on which."""
        raise NotImplementedError

    def score_batch(self, lm, samples: list[Sample]) -> list[dict[str, float] | BaseException]:
        """Score several samples of one length together: one batch handle and one batched greedy decode
        (the adapter's ``prefix_batch``, ``greedy_batch``; the in-process adapter: one left-padded prefill), then
        :meth:`score_generated` per row (``batch_row``). Returns, per sample, its metrics or the exception its scoring
        raised. Errors of the batched prefill or decode (e.g. out of memory) propagate: the runner then
        scores the samples one at a time.

        Raises:
            NotImplementedError: the task is not :attr:`batched`.
        """
        if not self.batched:
            raise NotImplementedError(f"task {self.name!r} does not batch")
        bp = lm.prefix_batch([s.input_ids for s in samples])
        conts = lm.greedy_batch(bp, [self.max_new_tokens_for(s) for s in samples], self.stop_ids(lm))
        out: list = []
        for i, (s, cont) in enumerate(zip(samples, conts)):
            try:
                out.append(self.score_generated(lm, s, lm.batch_row(bp, i), cont))
            except Exception as e:  # noqa: BLE001 - one row's failure is that sample's error record
                out.append(e)
        return out


#: Options the runner adds to a task's ``options`` itself (``--chat-template on`` and its system prompt,
#: :func:`lctx.harness.args.chat_options`), so they reach every record's ``task_options`` and resume key. A
#: constructor that takes ``**options`` (passkey's, ppl's, the docs' examples) passes them on to
#: :class:`Task`, so a task object rebuilt from a record's ``task_options`` takes them too; no other name
#: reaches the catch-all (:func:`check_option_names`).
RECORD_OPTIONS = ("chat_template", "system_prompt")


def constructor_options(cls) -> tuple[list[str], bool]:
    """(the keyword options task class ``cls``'s constructors name, outermost first; whether an unknown keyword
    would reach :class:`Task`'s ``**options``): the ``__init__`` of each class of its MRO is read while each passes
    ``**options`` on; a constructor without a ``**`` catch-all ends the walk (Python refuses an unknown keyword
    there itself). Light: no instance is made."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        if klass is Task:
            return names, True
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names += [p.name for p in params if p.name != "self" and p.name not in names
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return names, False
    return names, False


def check_option_names(cls, options: dict) -> None:
    """Refuse keyword options task class ``cls``'s constructor does not name, before it runs: through a
    ``**options`` catch-all they would land in ``options`` (and the records' resume key) while the task runs with
    its defaults (``Passkey(key_digit=3)``, ``Perplexity(strid=0.25)``). The :data:`RECORD_OPTIONS` the runner adds
    are accepted. ``lctx run --task-option`` refuses the same names (:func:`lctx.harness.args.check_task_options`).

    Raises:
        LctxError: an unknown option (the message names the valid ones, and the nearest one).
    """
    names, open_ = constructor_options(cls)
    if not open_:
        return
    for key in options:
        if key in names or key in RECORD_OPTIONS:
            continue
        import difflib  # lazy: only for the message of a mistake

        near = difflib.get_close_matches(str(key), names, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise LctxError(f"task {getattr(cls, 'name', '') or cls.__name__!r} ({cls.__name__}) has no option {key!r}"
                        f"{hint}; valid options: {', '.join(names) or 'none'}")


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: register a :class:`Task` subclass under ``cls.name``.

    Re-registering the same name replaces the earlier class (so a task file can be reloaded).

    Raises:
        LctxError: the class has no ``name`` or no ``metrics``, ``metrics`` or ``axes`` is a str (not a tuple of
            names), or it is not a Task.
    """
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise LctxError(f"{cls!r} is not a subclass of lctx.tasks.Task; subclass it to register a task")
    if not cls.name or not cls.metrics:
        raise LctxError(f"task class {cls.__name__} must set `name` and `metrics`")
    for attr in ("metrics", "axes"):  # a str is a sequence of letters: metric 'n', 'l', 'l' in every sample's error
        value = getattr(cls, attr)
        if isinstance(value, str):
            raise LctxError(f"task class {cls.__name__}: {attr} = {value!r} is a str, not a tuple of names; write "
                            f"{attr} = ({value!r},)")
    if not cls.__dict__.get("description") and cls.__dict__.get("__doc__"):
        cls.description = doc_summary(cls.__doc__)  # the class's own docstring beats an inherited description
    return TASKS.add(cls.name, cls)


def doc_summary(doc: str | None) -> str:
    """The first paragraph of a docstring on one line ("" for none)."""

    text = inspect.cleandoc(doc or "").split("\n\n")[0]
    return " ".join(text.split())


def load_task_file(path: str) -> list[str]:
    """Import a Python file that defines and registers tasks; returns the names it added.

    Raises:
        LctxError: the file does not exist, fails to import (the error's first line is quoted),
            or registers no task.
    """
    p = Path(path)
    if p.is_file() and p.suffix != ".py":
        raise LctxError(f"task file {path!r} is not a Python file; pass a .py file that defines a Task subclass "
                        "decorated with @register_task")
    if p.is_dir():
        raise LctxError(f"task file {path!r} is a directory; pass the path of a .py file in it that "
                        "defines a Task subclass decorated with @register_task")
    if not p.is_file():
        raise LctxError(f"task file {path!r} does not exist; pass the path of a .py file that "
                        "defines a Task subclass decorated with @register_task")
    before = dict(TASKS)
    mod_name = f"lctx_user_task_{p.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except LctxError:
        raise
    except SystemExit as e:  # sys.exit() in a task file would end lctx silently, with nothing run
        raise LctxError(f"task file {path!r} called sys.exit({e.code!r}) while being imported; a task file "
                        "must only define and register tasks: remove the call") from None
    except Exception as e:  # noqa: BLE001 - user code: report, do not crash
        msg = str(e).strip().splitlines()
        raise LctxError(f"task file {path!r} failed to import: {type(e).__name__}: "
                        f"{msg[0] if msg else ''}; fix the file and rerun") from None
    added = [n for n, c in TASKS.items() if before.get(n) is not c]
    clobbered = [n for n in added if n in before and before[n].__module__.startswith("lctx.tasks")]
    if clobbered:
        TASKS.update({n: before[n] for n in clobbered})
        raise LctxError(f"task file {path!r} registers {clobbered[0]!r}, the name of a built-in task; "
                        "give your task another name")
    if not added:
        raise LctxError(f"task file {path!r} registered no task; decorate your Task subclass with "
                        "@register_task (from lctx.tasks import Task, register_task)")
    return added


def load_entry_point_tasks() -> list[str]:
    """Register tasks from installed packages' ``lctx.tasks`` entry points; returns the names added.
    A plug-in that fails to load is skipped with a warning on stderr (it must not break lctx)."""
    added = []
    for ep in importlib.metadata.entry_points(group="lctx.tasks"):
        try:
            obj = ep.load()
            if isinstance(obj, type) and issubclass(obj, Task) and obj.name not in TASKS:
                register_task(obj)
                added.append(obj.name)
        except Exception as e:  # noqa: BLE001
            print(f"warning: task plug-in {ep.name!r} failed to load: {e}", file=sys.stderr)
    return added


def get_task(name: str) -> type[Task]:
    """The task class registered as ``name``.

    Raises:
        LctxError: unknown name (the message lists the known ones).
    """
    if name not in TASKS:
        from lctx.errors import did_you_mean  # light

        names = [t.name for t in task_catalog()]
        raise LctxError(f"unknown task {name!r}{did_you_mean(name, names)}; known tasks: {', '.join(names)} "
                        "(see `lctx list tasks`, or add one with --task-file)")
    return TASKS[name]


class TaskInfo(NamedTuple):
    """One line of ``lctx list tasks``: a name ``lctx run --tasks`` accepts."""

    name: str
    description: str
    metrics: tuple[str, ...]
    requires: str


class TaskFamily:
    """Tasks that an outside evaluator makes per run (lm-eval's ``mmlu``/``arc_*``: :data:`lctx.tasks.lmeval.LMEVAL`):
    the names of a run that its groups (:class:`TaskGroup` with this ``family``) claim are built together by
    :meth:`build` (one evaluator shared by all of them), not from one registered :class:`Task` class each.
    Subclass it and override what applies.

    name: the key of its summary text in :class:`lctx.harness.evaluate.Result`'s ``reports``; run_options: the
    run-wide flags its tasks take (:class:`RunOption`, ``option`` None: :meth:`build` reads them from ``values``);
    shardable: False refuses the family under ``torchrun`` / ``accelerate launch``.
    """

    name: str = ""
    run_options: tuple[RunOption, ...] = ()
    shardable: bool = True
    adapter_needs: dict = {}  # {method: why} its tasks need of a model adapter (Task.adapter_needs)

    def check_settings(self, values: dict) -> None:
        """Refuse bad run-wide values of :attr:`run_options` (``values``: {param: value}), before torch loads.

        Raises:
            LctxError: a bad value (names the flag and the fix).
        """

    def check_data(self, names: list[str], data_dir) -> None:
        """Refuse ``names`` whose data cannot be reached (``data_dir`` None: no ``--data-dir``), before torch loads.

        Raises:
            LctxError: data missing or unreachable.
        """

    def build(self, names: list[str], values: dict, *, data_dir=None, seed: int = 0, batch_size: int = 1,
              chat_template: bool = False, system_prompt: str | None = None, log=None) -> list[Task]:
        """The task objects of ``names`` (names its groups claim) with the run's settings: ``values`` the run-wide
        flags ({param: value}), ``batch_size`` its requests per forward, ``log`` (or None) progress lines.

        Raises:
            LctxError: a bad setting or missing data.
        """
        raise NotImplementedError(f"task family {self.name!r} builds no tasks")

    def owns_label(self, label: str) -> bool:
        """True for a summary row's task that is one of this family's (its pooled labels included): the rows of
        its summary text."""
        return any(g.family is self and g.owns_label(label) for g in GROUPS.values())


class TaskGroup:
    """A name ``lctx run --tasks`` accepts that is not one :class:`Task` class of :data:`TASKS`: lm-eval's ``mmlu`` /
    ``arc_*`` (whose task objects its :class:`TaskFamily` makes per run, per MMLU subject) and the harness's derived
    steps (``flatness``, ``ruler``: :mod:`lctx.harness.steps.derived`, which expand into the tasks they derive from).
    Registered with :func:`register_group`; :func:`task_catalog` lists it as a :class:`TaskInfo`.

    name, description, metrics, requires: as :class:`TaskInfo`; run_options: the run-wide flags it takes (default its
    family's); family: the :class:`TaskFamily` that builds its tasks (None for a derived step); benchmark: a
    multiple-choice knowledge benchmark ``lctx report`` draws as accuracy bars, the int its place among them (MMLU 0,
    ARC 1; ties by name); None: not one. Override :meth:`claims`, :meth:`owns_label`, :meth:`pooled_label`,
    :meth:`extra_tables` where the group has sub-tasks (MMLU's subjects).
    """

    def __init__(self, name: str, description: str, metrics: tuple[str, ...], requires: str = "", *,
                 run_options: tuple[RunOption, ...] | None = None, family: TaskFamily | None = None,
                 benchmark: int | None = None):
        self.name, self.description, self.metrics, self.requires = name, description, tuple(metrics), requires
        self.family, self.benchmark = family, benchmark
        self.run_options = tuple(run_options if run_options is not None else (family.run_options if family else ()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def info(self) -> TaskInfo:
        """This group as a line of ``lctx list tasks``."""
        return TaskInfo(self.name, self.description, self.metrics, self.requires)

    def claims(self, name: str) -> bool:
        """True for a ``--tasks`` name this group runs (its own; MMLU: ``mmlu_<subject>`` too)."""
        return name == self.name

    def owns_label(self, label: str) -> bool:
        """True for a results table's task that comes from this group (its pooled labels included)."""
        return label == self.name

    def pooled_label(self, subtasks) -> str:
        """The name a summary cell of this group pooled over ``subtasks`` is shown under (MMLU: ``mmlu_astronomy``
        for one subject). Default: the group's name."""
        return self.name

    def extra_tables(self, table) -> dict:
        """Tables this group's rows add beside ``summary.csv``, {file name: DataFrame} (MMLU: ``mmlu_subjects.csv``).
        Default none."""
        return {}


#: Names ``lctx run --tasks`` accepts that are not :class:`Task` classes in :data:`TASKS`, {name: TaskGroup}:
#: lm-eval's ``mmlu``/``arc_*`` (:mod:`lctx.tasks.lmeval`, whose task objects are made per subject) and the
#: harness's derived steps (``flatness``, ``ruler``: :mod:`lctx.harness.steps.derived`); each registers itself on
#: import with :func:`register_group`, so this module lists them without importing them.
GROUPS: Registry[TaskGroup] = Registry("derived task name", replace=True)


def register_group(group: TaskGroup | TaskInfo) -> TaskGroup:
    """Add a name to :func:`task_catalog` (:data:`GROUPS`): a :class:`TaskGroup`, or a :class:`TaskInfo` (a group
    that declares nothing else); returns the registered group."""
    if isinstance(group, TaskInfo):
        group = TaskGroup(group.name, group.description, group.metrics, group.requires)
    return GROUPS.add(group.name, group)


def task_catalog() -> list[TaskInfo]:
    """Every task name ``lctx run --tasks`` accepts, sorted: the registered tasks (built-in, ``--task-file``,
    plug-ins loaded so far) and the names registered in :data:`GROUPS` (lm-eval's ``mmlu``/``arc_*``, whose
    ``mmlu_<subject>`` and ``mmlu_<category>`` are accepted too; the harness's ``flatness`` sweep and ``ruler``
    group, once :mod:`lctx.harness.steps.flatness` / :mod:`lctx.harness.steps.ruler` are imported)."""
    out = [TaskInfo(n, c.description, tuple(c.metrics), c.requires) for n, c in TASKS.items()]
    out += [g.info() for g in GROUPS.values()]
    return sorted(out, key=lambda t: t.name)


def group_of(name: str) -> TaskGroup | None:
    """The registered group that runs the ``--tasks`` name ``name`` (:data:`GROUPS`: its own name, or one it
    claims, MMLU's ``mmlu_<subject>``), or None."""
    name = str(name)
    return GROUPS.get(name) or next((g for g in GROUPS.values() if g.claims(name)), None)


def group_of_label(label: str) -> TaskGroup | None:
    """The registered group a results table's task comes from (its pooled labels included: ``mmlu (3 subjects)``),
    or None."""
    label = str(label)
    return GROUPS.get(label) or next((g for g in GROUPS.values() if g.owns_label(label)), None)


def declared(name: str):
    """What declares the task ``name``: its registered :class:`Task` class, else its :class:`TaskGroup`
    (:func:`group_of`), else None (a name neither registers, e.g. a ``--task-file`` task not loaded)."""
    return TASKS.get(str(name)) or group_of(name)


def default_tasks() -> list[str]:
    """The tasks ``lctx run`` runs when ``--tasks`` is not given: the registered tasks that declare
    :attr:`Task.default_run`, in registration order (``passkey``, ``ppl``)."""
    return [n for n, c in TASKS.items() if c.default_run]


def all_run_options() -> list[tuple[RunOption, str]]:
    """(run option, users) of every run-wide flag a registered task or group declares, each flag once, in
    registration order (groups first); users: how a warning names who takes it (:attr:`RunOption.users`, else the
    names of the tasks and groups declaring it, joined by "/")."""
    seen: dict[str, tuple[RunOption, list[str]]] = {}
    decls = [(g.name, g.run_options) for g in GROUPS.values()] + [(n, c.run_options) for n, c in TASKS.items()]
    for owner, options in decls:
        for ro in options:
            first, users = seen.setdefault(ro.param, (ro, []))
            who = ro.users or owner
            if who not in users:
                users.append(who)
    return [(ro, "/".join(users)) for ro, users in seen.values()]


def pooled_label(task: str, subtasks) -> str:
    """The name a summary cell of ``task`` pooled over ``subtasks`` is shown under, as its declaration says
    (:meth:`Task.pooled_label`, :meth:`TaskGroup.pooled_label`: one MMLU subject is ``mmlu_astronomy``); ``task``
    for a task that declares nothing, or without sub-tasks."""
    decl = declared(task)
    subs = [s for s in subtasks or () if s is not None and s == s]
    return decl.pooled_label(subs) if decl is not None and subs else str(task)


def extra_tables(table) -> dict:
    """The tables the tasks of a results table declare beside ``summary.csv`` (:meth:`Task.extra_tables`,
    :meth:`TaskGroup.extra_tables`), {file name: DataFrame}."""
    out: dict = {}
    for name in dict.fromkeys(str(t) for t in table["task"]):
        decl = declared(name)
        if decl is not None:
            out.update(decl.extra_tables(table))
    return out


@dataclass(frozen=True)
class TaskMeta:
    """What the report, the plots and ``lctx compare`` know of a task by name (see :class:`Task`'s attributes):
    headline metric, whether higher is better (None: unknown), retrieval or not, the secondary metric, and
    whether it has a depth axis, and its category (:data:`CATEGORIES`, None: none)."""

    headline: str
    higher_is_better: bool | None
    retrieval: bool
    secondary: str | None
    has_depth: bool
    category: str | None = None


def task_meta(name: str, metrics: tuple[str, ...] | list[str] = (), has_depth: bool = False,
              declared: dict | None = None) -> TaskMeta:
    """The declared metadata of task ``name``: what its run directory recorded when the run started
    (``declared``: ``run.json``'s ``task_meta[name]``, :meth:`Task.declaration`; a ``--task-file`` task needs no
    task file afterwards), else its class attributes when it is registered; for a task neither records nor
    registers (a run directory written before ``task_meta`` was recorded): the first of ``metrics`` as headline,
    direction unknown, not retrieval, ``has_depth`` as the table shows it. A run recorded before tasks declared a
    ``category`` takes the registered class's (None for a task lctx does not register)."""
    cls = TASKS.get(str(name))
    if isinstance(declared, dict) and declared.get("headline_metric"):
        hib = declared.get("higher_is_better")
        hib = hib.get(declared["headline_metric"]) if isinstance(hib, dict) else hib
        axes = declared.get("axes")
        cat = declared["category"] if "category" in declared else getattr(cls, "category", None)
        return TaskMeta(str(declared["headline_metric"]), hib if isinstance(hib, bool) else None,
                        bool(declared.get("retrieval")), declared.get("secondary_metric") or None,
                        "depth" in axes if isinstance(axes, list) else bool(has_depth),
                        cat if cat in CATEGORIES else None)
    if cls is None:
        return TaskMeta(str(metrics[0]) if len(metrics) else "", None, False, None, bool(has_depth))
    hib = cls.higher_is_better
    hib = hib.get(cls.headline()) if isinstance(hib, dict) else hib
    return TaskMeta(cls.headline(), hib, cls.retrieval, cls.secondary_metric, "depth" in cls.axes, cls.category)
