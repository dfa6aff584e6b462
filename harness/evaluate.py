"""``lctx.evaluate``: the whole evaluation of ``lctx run`` as one Python call (lm-eval's ``simple_evaluate``
is the model): build the tasks, load the models, check every length before anything runs, lock the run
directory, run the sweeps (a task with lengths of its own, ppl's ``--window``, in a pass of its own; the tasks an outside
evaluator builds, lm-eval's, in the first, after the others), apply the derived post-processing steps (flatness, the
ruler group: :mod:`lctx.harness.steps.derived`), write the tables and draw the figures
(:func:`lctx.harness.outputs.plots.write_run_outputs`) and return them.

It knows no task by name: what it needs of a task (its run-wide flags and their defaults, lengths of its own, its data
check, what it keeps for the memory check) the task declares (:class:`lctx.tasks.Task`, :class:`lctx.tasks.RunOption`);
names that are not one class declare through their group (:class:`lctx.tasks.TaskGroup`: lm-eval's family builds its
tasks; a derived step registers its expander, :data:`lctx.harness.steps.derived.EXPANDERS`).

``lctx run`` parses its arguments, calls :func:`evaluate` and prints the :class:`Result`.
"""

from __future__ import annotations

import json
import numbers
import os
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

from lctx.defaults import DEMO_MODELS as DEMO_MODEL_NAMES, DEMO_RELATIVE, DEMO_TASKS
from lctx.defaults import (CHUNK_SIZE, CONCURRENCY, DEVICE, DTYPE, LMEVAL_BATCH_SIZE, ORDER, ORDERS, REQUEST_TIMEOUT_S,
                           RETRIES)
from lctx.harness.backends import ModelSpec, resolve_models
from lctx.harness.backends.server import SERVED_BOUNDS, check_bounds  # noqa: F401  (SERVED_BOUNDS re-exported)
from lctx.harness.args import (MAX_SAMPLES, check_positions, check_results_out, check_run_options,
                               check_task_options, check_writable_dir, chat_options, parse_batch_size, parse_depths,
                               parse_lengths, parse_task_options, task_option_names)
from lctx.harness.run.console import say
from lctx.outside import register_secret
from lctx.errors import EXIT_ALL_FAILED, EXIT_OK, EXIT_SOME_FAILED, LctxError, split_list

DEFAULT_LENGTHS = (256, 512, 1024, 2048)
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
CHECKPOINTS = Path(__file__).resolve().parent.parent / "models" / "checkpoints"
#: the bundled tiny RoPE model (pydoc text only): ``lctx plan``'s default and the tests' small real checkpoint
DEFAULT_MODEL = CHECKPOINTS / "pydoc-tiny-rope"
#: what ``lctx run`` evaluates without ``--model``: the bundled demo pair (:data:`lctx.defaults.DEMO_MODELS`)
DEMO_MODELS = tuple(CHECKPOINTS / name for name in DEMO_MODEL_NAMES)


@dataclass
class Result:
    """What :func:`evaluate` returns.

    table: the tidy results table (one row per sample x metric, ``results.parquet``; a pandas DataFrame);
    summary: mean/std/n per (model, task, options, metric, length, depth) (``summary.csv``);
    plots: the figures written; out: the run directory; ran / skipped / errors / ok / superseded: samples run
    now, resumed from earlier runs, failed now, ok in total, and records of older inputs left out of the
    tables; reports: the text of the task families and derived steps (``{"lmeval": ..., "flatness": ..., "ruler": ...}``),
    in order; late_reports: the names of those to show after the plots (a step that declares
    ``report_after_plots``: the ruler group's grid). ``table`` is None on the
    non-main ranks of a distributed run (rank 0 writes and returns the tables) and when nothing ran. dry_run: the
    call only planned (``evaluate(dry_run=True)``); plan: the plan's rows (:class:`lctx.harness.run.estimate.PlanRow`).
    """

    out: Path
    table: object = None
    summary: object = None
    plots: list = field(default_factory=list)
    ran: int = 0
    skipped: int = 0
    errors: int = 0
    ok: int = 0
    superseded: int = 0
    reports: dict = field(default_factory=dict)
    is_main: bool = True
    late_reports: list = field(default_factory=list)
    dry_run: bool = False
    plan: list = field(default_factory=list)

    @property
    def paths(self) -> dict[str, Path]:
        """The files of the run directory: records, results (parquet, csv), summary, run.json."""
        o = Path(self.out)
        return {"records": o / "records.jsonl", "results": o / "results.parquet", "results_csv": o / "results.csv",
                "summary": o / "summary.csv", "run": o / "run.json"}

    @property
    def failed(self):
        """The rows of ``table`` whose status is error (an empty frame when none is; a metric the model could not
        give, status ``unavailable``, is no failure: :meth:`unavailable`)."""
        return self.table[self.table["status"] == "error"]

    @property
    def exit_status(self) -> int:
        """What ``lctx run`` exits with after this call (docs/troubleshooting.md#exit-codes): :data:`EXIT_OK` (0) when
        no sample of this call failed, :data:`EXIT_ALL_FAILED` (3) when every one did, :data:`EXIT_SOME_FAILED` (4)
        when some did (served or not; a metric the model could not give is no failure). :func:`evaluate` itself
        returns normally either way: a script checks this, ``errors`` or :attr:`failed`."""
        if self.errors > 0:
            return EXIT_ALL_FAILED if self.ok == 0 else EXIT_SOME_FAILED
        return EXIT_OK

    @property
    def unavailable(self):
        """The rows of ``table`` whose metric the model could not give (status ``unavailable``, the reason in
        ``reason``; :class:`lctx.errors.MetricUnavailable`); an empty frame when every metric was given."""
        return self.table[self.table["status"] == "unavailable"]


def passive_omp_wait() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user set it (or GNU OpenMP's ``GOMP_SPINCOUNT``), if torch is
    not loaded yet (OpenMP reads the variable once, when torch loads it): a torch thread that waits at the end of a parallel op then sleeps
    instead of spinning. With spinning threads a busy machine (load above the cores) makes every barrier wait
    for a descheduled thread: measured on 2 cores at load 4-6 (``python tests/tools/thread_speed.py``, median
    of 3 rounds), the default ``lctx run --tasks ppl`` on 2 spinning threads took 2.9-5.6x the wall time of 1
    thread, and 1.0-1.6x with PASSIVE (docs/kernels-and-bench.md#threads)."""
    if not ({"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ)) and "torch" not in sys.modules:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def parse_flag_lengths(text: str, flag: str = "--lengths", hint: str = "lengths like 256,512,1k,4k") -> list[int]:
    """Lengths in tokens ("256,1k") given with ``flag``, a task's own lengths (:class:`lctx.tasks.RunOption` with
    ``lengths=True``: ppl's ``--window``), as :func:`lctx.harness.args.parse_lengths`.

    Raises:
        LctxError: an entry is not a positive number of tokens (the error names ``flag`` and ``hint``, e.g. "write ppl
            window sizes in tokens like --window 256,1k").
    """
    try:
        return parse_lengths(text)
    except LctxError as e:
        raise LctxError(str(e).replace("length ", f"{flag} ", 1).replace(
            "write lengths like 256,512,1k,4k", f"write {hint}")) from None


def _as_list(x, parse, what: str) -> list:
    """``x`` (a str as the CLI writes it, one number, or a list of them: numpy numbers and arrays too) parsed by
    ``parse``; a bool is written as the text it is ("True"), which ``parse`` refuses."""
    if isinstance(x, str):
        return parse(x)
    if isinstance(x, numbers.Real) or type(x).__name__ == "bool_":  # numpy.int64(256), numpy.bool_: one value
        return parse(str(_plain(x)))
    return parse(",".join(str(_plain(v)) for v in x)) if x is not None else []


def _plain(v):
    """``v`` as a Python number when it is a numpy (or other ``numbers``) one: an integer as int, a real as float; a
    bool (Python's or numpy's) and anything else as it is. lctx records its arguments in run.json and seeds draws
    with them, and ``numpy.int64(3)`` is neither JSON nor an ``int``."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real) and type(v) is not float:  # numpy.float64 is a float subclass: made plain too
        return float(v)
    return v


def _plain_numbers(**values) -> dict:
    """The numeric arguments of :func:`evaluate` as Python numbers (:func:`_plain`); ``seed`` a whole number in
    [-2**63, 2**63); the served options within :data:`SERVED_BOUNDS`.

    Raises:
        LctxError: a ``seed`` that is not a whole number (a bool counts as none) or out of int64's range, a served
            option out of its bounds; in one line.
    """
    out = {k: _plain(v) for k, v in values.items()}
    seed = out.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise LctxError(f"seed={values.get('seed')!r} is not a whole number; pass an integer, e.g. seed=0 (--seed)")
    if not -SEED_LIMIT <= seed < SEED_LIMIT:
        raise LctxError(f"seed={seed} is outside [-2**63, 2**63) (the tables store it as a 64-bit integer); pass a "
                        "smaller seed, e.g. seed=0 (--seed)")
    check_bounds(out)
    return out


#: seeds are stored as int64 (results.parquet; numpy's generators take 64 bits)
SEED_LIMIT = 2 ** 63


def _task_option_items(task_options) -> list[str]:
    """``{"niah_single_1": {"match": "digits"}}`` or ``["niah_single_1.match=digits"]`` as CLI items."""
    if not task_options:
        return []
    if isinstance(task_options, dict):
        return [f"{t}.{k}={json.dumps(v)}" for t, kv in task_options.items() for k, v in kv.items()]
    return list(task_options)


def _unique(values: list, what: str, warn) -> list:
    """``values`` without repeats, first occurrence kept (a repeated length, depth or task would run its cells
    twice: the tables keep one, the time is lost); ``warn(str)`` says what was dropped."""
    out = list(dict.fromkeys(values))
    if len(out) < len(values) and warn:
        warn(f"note: {what} repeat ({', '.join(map(str, values))}); each runs once")
    return out


#: the most lm-eval requests per forward for MMLU/ARC when ``--batch-size`` is not given (or is auto); the memory
#: check lowers it to the largest batch that fits (:func:`lctx.models.adapters.memory.check_lmeval_fits`). lctx's lm-eval
#: model keeps the batch's logits at the continuations only, and runs its rows in memory-sized blocks
#: (docs/kernels-and-bench.md#batches---batch-size; lm-eval's own model: 19 GB for SmolLM2-135M's 5-shot MMLU at 32)
LMEVAL_BATCH = LMEVAL_BATCH_SIZE


def evaluate(models=None, tasks=None,
             lengths: Union[str, Sequence[int], None] = None, depths: Union[str, Sequence[float]] = DEFAULT_DEPTHS,
             samples: int = 2, out: Union[str, Path, None] = None, *, relative: Union[str, Sequence[float], None] = None,
             train_length: Optional[int] = None, task_options=None, task_files: Iterable[str] = (),
             data_dir: Union[str, Path, None] = None, device: Optional[str] = None, dtype: Optional[str] = None,
             seed: int = 0, chunk_size: Optional[int] = None, allow_beyond_max: bool = False,
             attn_impl: Optional[str] = None,
             cache_dir: Union[str, Path, None] = None, cache_dir_from_env: bool = False, trust_remote_code: bool = False,
             attn_override: Optional[str] = None, positions: Union[str, Sequence[str], None] = None,
             model_args=None,
             chat_template: bool = False, system_prompt: Optional[str] = None,
             memory_check: bool = True, progress: bool = False, batch_size: Union[int, str, None] = None,
             order: str = ORDER, stride: float = 0.5,
             window: Union[str, Sequence[int], None] = None, ppl_data: Optional[Sequence[str]] = None,
             ppl_bos: str = "prepend", ppl_short_docs: str = "drop", ppl_max_tokens: int = 32768,
             key_digits: int = 5, limit: Optional[int] = None, num_fewshot: Optional[int] = None,
             concurrency: int = CONCURRENCY, tokenizer: Optional[str] = None, api_key_env: Optional[str] = None,
             served_model: Optional[str] = None, request_timeout: float = REQUEST_TIMEOUT_S,
             retries: int = RETRIES,
             think_end: Optional[str] = None, think_budget: int = 0, plan: bool = False, dry_run: bool = False,
             log: Optional[Callable[[str], None]] = None, warn: Optional[Callable[[str], None]] = None) -> Result:
    """Evaluate models on tasks x lengths x depths x samples and write the run directory ``out``.

    models: a model or a list of them, each a checkpoint path (lctx, Hugging Face, GGUF; loaded with
    :func:`lctx.models.adapters.hf.load_lm` and this call's ``device``, ``dtype``, ``chunk_size``, ``attn_impl``,
    ``attn_override``, ``trust_remote_code``, ``chat_template`` / ``system_prompt``; ``device``, ``dtype`` and
    ``chunk_size`` None: ``"auto"``, ``"float32"``, 2048) or a model adapter object
    (:class:`lctx.models.adapters.protocol.ModelAdapter`: ``load_lm(...)``'s, or your own), run as it is (a
    ``device``, ``dtype``, ``chunk_size`` or ``attn_impl`` given beside it must be the adapter's own, its
    ``settings()``; ``attn_override`` and ``trust_remote_code`` cannot be given; ``chat_template`` /
    ``system_prompt`` must say what the adapter does; it is checked against the protocol's contract before anything
    runs, :func:`lctx.models.adapters.protocol.check_adapter`, and its outputs while it runs,
    :class:`lctx.models.adapters.protocol.CheckedAdapter`); None: the bundled demo pair (:data:`DEMO_MODELS`, at
    :data:`DEMO_RELATIVE` times their training length unless ``lengths`` or ``relative`` is given; an empty list is an
    error). tasks: a task or a list of them, each a name (``lctx list
    tasks``; ``flatness`` and ``ruler`` expand into the tasks they derive from) or a :class:`lctx.tasks.Task`
    object (run with its own options; the run-wide task flags such as ``key_digits`` or ``stride`` are for tasks
    given by name), or one comma-separated string of names; default the tasks that declare
    :attr:`lctx.tasks.Task.default_run` (passkey and ppl, :func:`lctx.tasks.default_tasks`; ``flatness`` for the demo
    pair, models None) when None (an empty
    list is an error), and then a note names the tasks of ``task_files`` that do not run. A task that declares
    :attr:`lctx.tasks.Task.adapter_needs` (mmlu/arc: ``lmeval_model()`` or, for a served model,
    ``lmeval_api_model()``) runs only on adapters that have those methods. lengths: context
    lengths in tokens (or "256,1k"; default 256..2048, or ``relative`` x the training length); depths: needle
    depths, fractions in [0, 1]; samples: per (length, depth) cell; out: the run directory (default: a fresh
    temporary directory; rerun with the same ``out`` to resume). The other options are those of ``lctx run``
    (``lctx run --help``): ``task_options`` as ``{task: {key: value}}`` or ``["task.key=value"]``,
    ``chat_template`` True/False, ``order`` the order samples run in (:func:`lctx.harness.run.runner.order_cells`),
    ``batch_size`` an int or ``"auto"`` (docs/kernels-and-bench.md#batches---batch-size;
    None: 1 sample of the length sweeps and for lm-eval the largest batch up to :data:`LMEVAL_BATCH` that the memory
    check fits; an int N: N for both, refused when lm-eval's batch does not fit, unless ``memory_check=False``),
    ``cache_dir_from_env`` True when ``cache_dir`` is ``$LCTX_CACHE_DIR``, not the user's ``--cache-dir`` (no warning
    then that it reaches nothing). The run-wide task flags (``stride``, ``window``, ``ppl_*``, ``key_digits``, ``limit``,
    ``num_fewshot``) go to the tasks that declare them (:attr:`lctx.tasks.Task.run_options`); set for a run without
    such a task they are named in a warning. ``lengths``, ``depths`` and ``window`` may be the CLI's strings ("256,1k"):
    they are parsed here, once, before torch loads. ``log`` / ``warn`` receive progress notes and warnings (one line
    each); by default they are printed on stdout through :func:`lctx.harness.run.console.say` (secrets redacted,
    control characters from outside escaped, each line capped). A ``log`` of your own gets the lines as
    lctx wrote them: pass them through :func:`lctx.outside.cap` before a terminal sees them.

    model_args: per-model arguments (``-M``, as lm-eval's ``--model_args``; docs/adapters.md#where-a-new-backend-goes):
    None, one ``"KEY=VALUE,..."`` string or dict for every model, or a list of exactly one per model in order, each
    typed against its model's backend (:mod:`lctx.harness.backends`: a checkpoint takes ``dtype``, ``chunk_size``,
    ``attn_impl``, ``trust_remote_code``; a server ``served_model``, ``tokenizer``, ``api_key_env``, ``concurrency``,
    ``request_timeout``, ``retries``, ``think_end``, ``think_budget``), over this call's run-wide values. A model may
    name its backend, ``"NAME:LOCATION"`` (``"checkpoint:PATH"``, a plug-in's ``"toy:reader"``).

    positions: positional methods (``--position``, docs/positions.md): a spec (``"yarn:factor=4"``) or a list of them;
    None: ``["shipped"]``, the checkpoints as shipped. Every checkpoint path runs under every one (the cross product):
    each (model, method) pair is a model of the run with its own name (``{name}+{label}``, e.g.
    ``SmolLM2-135M-Instruct+yarn_factor4``; ``shipped`` keeps the name), variant, fingerprint (resume key) and
    run.json entry (``inputs.models[name]["position"]``: the method, its options, the layer types and the effective
    positional parameters read from the built model); a method is refused before the sweep when it changed nothing.
    A method other than ``shipped`` takes checkpoint paths only (not a served model, not an adapter object).

    A model may be a served one: ``"http://HOST:PORT/v1"`` (or ``"URL1,URL2"``: several servers of one model sharing
    the requests), an OpenAI-compatible server (vLLM, SGLang, llama.cpp's servers) reached through
    :func:`lctx.models.adapters.server.load_server` with ``concurrency`` (requests in flight at most), ``tokenizer``
    (a local tokenizer where the server has no tokenizer endpoint), ``api_key_env`` (the environment variable holding
    its API key; the key is never written anywhere), ``served_model`` (the id, where it serves several),
    ``request_timeout`` (seconds), ``retries`` (on 429/5xx and reset connections, exponential back-off),
    ``think_end`` / ``think_budget`` (a reasoning model's end-of-thinking marker, and the tokens added to each answer
    budget for its thinking) and ``seed``; the in-process load settings (``device``, ``dtype``, ``chunk_size``,
    ``attn_impl``) do not reach it (docs/serving.md). A server that stops answering ends the run
    (:class:`lctx.errors.ServerUnreachable`) with every finished sample recorded; rerun to resume.

    A metric a model cannot give (:class:`lctx.errors.MetricUnavailable`: a server without prompt log-probabilities)
    is recorded as unavailable with the reason (never 0; :attr:`Result.unavailable`), and ``warn`` gets one line per
    (model, metric) naming it, once per call (:func:`lctx.harness.run.tables.unavailable_lines`).

    plan (``lctx run`` sets it; default off): print, after the models load and every check has passed, the samples per (model, task, length) and an
    estimate of the time (:mod:`lctx.harness.run.estimate`: a short calibration of each in-process model on this
    machine); dry_run: print that plan and return without running anything or writing ``out`` (``Result.dry_run``
    True, the plan's rows in ``Result.plan``).

    Returns: a :class:`Result` (tables as DataFrames, plot paths, counts).

    Raises:
        LctxError: any bad input (one line naming the fix), found before any model runs; another process holds
            ``out``; no model or no task (an empty list); a model object that is not an adapter (a class, missing
            members, a member that breaks the contract), or a load setting given with one that is not its own;
            two tasks of one name; a task on an adapter that lacks a method the task needs (mmlu/arc without
            ``lmeval_model()`` or ``lmeval_api_model()``); a positional method that does not parse, does not apply
            to a model, or was accepted but not applied.
    """
    log = log or say
    if api_key_env:  # the key is a secret from the first message on: an option check may quote a value holding it
        register_secret(os.environ.get(str(api_key_env), ""))
    warn, said = _kept(warn or log)  # this call's warnings: a long reason one gave is not repeated
    nums = _plain_numbers(samples=samples, seed=seed, chunk_size=chunk_size, train_length=train_length,
                          key_digits=key_digits, ppl_max_tokens=ppl_max_tokens, limit=limit, num_fewshot=num_fewshot,
                          concurrency=concurrency, retries=retries, think_budget=think_budget, stride=stride,
                          request_timeout=request_timeout, batch_size=batch_size)  # numpy numbers as Python's
    samples, seed, chunk_size, train_length, key_digits = (nums[k] for k in ("samples", "seed", "chunk_size",
                                                                             "train_length", "key_digits"))
    ppl_max_tokens, limit, num_fewshot, concurrency = (nums[k] for k in ("ppl_max_tokens", "limit", "num_fewshot",
                                                                        "concurrency"))
    retries, think_budget, stride, request_timeout, batch_size = (nums[k] for k in ("retries", "think_budget", "stride",
                                                                                   "request_timeout", "batch_size"))
    if order not in ORDERS:  # before anything loads
        raise LctxError(f"--order {order!r} is not one of {', '.join(ORDERS)}; use --order {ORDER} (the default)")
    call = _check_call(models, tasks, task_files, model_args=model_args, lengths=lengths, depths=depths, samples=samples, relative=relative,
                       batch_size=batch_size, data_dir=data_dir, cache_dir=cache_dir, out=out,
                       train_length=train_length, chat_template=chat_template, system_prompt=system_prompt, warn=warn,
                       seed=seed, device=device, dtype=dtype, chunk_size=chunk_size, attn_impl=attn_impl,
                       attn_override=attn_override, trust_remote_code=trust_remote_code)
    for spec in call.specs:  # per-model arguments (-M) within the bounds of their run-wide flags
        if "chunk_size" in spec.args:
            chunk = spec.args["chunk_size"]
            if chunk < 1:
                raise LctxError(f"-M chunk_size={chunk} is not a whole number >= 1; pass chunk_size=1 or more")
            check_chunk_size(chunk, "-M chunk_size")
        if spec.backend is not None and spec.args.get("api_key_env"):
            register_secret(os.environ.get(str(spec.args["api_key_env"]), ""))
        check_bounds(spec.args)
        check_run_options(**{k: spec.args.get(k) for k in ("dtype", "attn_impl")})
    positions = check_positions(positions, call.specs, warn)  # --position: syntax, names, served/objects (no torch)
    # a checkpoint path's load defaults; beside an adapter object these were given only if not None (checked above)
    device, dtype, chunk_size = (v if v is not None else _PATH_DEFAULTS[k]
                                 for k, v in (("device", device), ("dtype", dtype), ("chunk_size", chunk_size)))
    values = dict(limit=limit, num_fewshot=num_fewshot, stride=stride, window=window,  # in the order warnings name them
                  ppl_data=list(ppl_data) if ppl_data else None, ppl_bos=ppl_bos, ppl_short_docs=ppl_short_docs,
                  ppl_max_tokens=ppl_max_tokens, key_digits=key_digits)  # the run-wide task flags (RunOption.param)
    build = partial(_build_run_tasks, out=out, data_dir=call.data_dir, cache_dir=call.cache_dir, values=values)
    own_lengths = _check_before_torch(call.specs, call.task_names, task_options,
                                      None if call.relative else call.lengths, values, allow_beyond_max, device,
                                      call.explicit_lengths, build=build, data_dir=call.data_dir, samples=samples,
                                      depths=call.depths, given_tasks=call.given_tasks, n_lengths=call.n_lengths,
                                      positions=positions)

    dinfo, device = _start_torch(device)
    if system_prompt is not None and not chat_template:
        raise LctxError("--system-prompt needs --chat-template on (without a chat template there is no system turn)")
    out = _run_dir(out)  # only once the arguments are known good: a rejected call leaves no folder behind
    run_tasks = _plan_tasks(call, task_options, values, own_lengths, out, dinfo, samples=samples, seed=seed,
                            chat_template=chat_template, system_prompt=system_prompt,
                            cache_dir_from_env=cache_dir_from_env, progress=progress, log=log, warn=warn)
    server = dict(concurrency=concurrency, tokenizer=tokenizer, api_key_env=api_key_env, served_model=served_model,
                  timeout_s=request_timeout, retries=retries, think_end=think_end, think_budget=think_budget, seed=seed)
    lms = _load_models(call.specs, attn_override, warn, device=device, dtype=dtype, chunk_size=chunk_size,
                       trust_remote_code=trust_remote_code, attn_impl=attn_impl, cache_dir=call.cache_dir,
                       chat_template=chat_template, system_prompt=system_prompt, progress=progress, server=server,
                       positions=positions)
    if chat_template:  # the setting reaches every record (and so the resume key) through the task options
        for t in run_tasks.objs:
            t.options.update(chat_options(system_prompt))

    relative, groups = _length_groups(lms, call, run_tasks.rel_step, train_length)
    skips = _check_before_run(groups, run_tasks.objs, run_tasks.own, allow_beyond_max, memory_check,
                              relative=bool(relative))
    if run_tasks.family_objs and memory_check:  # lm-eval's batch: the one that fits (default) or the one asked for
        _fit_family_batches(lms, run_tasks.family_objs, call.lmeval_batch, call.explicit_batch, warn)
    for line in skips["notes"]:
        warn(line)
    note = _busy_note(lms, dinfo)
    if note:
        warn(note)
    rows = _say_plan(groups, run_tasks, lms, dinfo, device, depths=call.depths, samples=samples, seed=seed,
                     skip_below=skips["skip_below"], order=order, log=log) if (plan or dry_run) else []
    if dry_run:
        return Result(out=out, is_main=dinfo.is_main, dry_run=True, plan=rows)
    unclosed = {id(lm): getattr(lm, "think_unclosed", 0) for lm in lms}  # a served model's count, before the sweep
    res = _sweep_and_write(groups, run_tasks, out, dinfo, depths=call.depths, samples=samples, seed=seed,
                           skip_below=skips["skip_below"], batch=call.batch, relative=relative, lms=lms,
                           progress=progress, log=log, order=order)
    if res.table is not None:  # metrics the models could not give: one line per (model, metric), once per call
        from lctx.harness.run.tables import unavailable_lines  # lazy: loads pandas (loaded by the run already)

        for line in unavailable_lines(res.table, said=said):
            warn(line)
    for lm in lms if dinfo.is_main else []:  # a served reasoning model's thinking that never closed
        n = getattr(lm, "think_unclosed", 0) - unclosed.get(id(lm), 0)
        if n:
            warn(f"warning: {lm.name}: in {n} greedy repl{'y' if n == 1 else 'ies'} the thinking never closed (no "
                 f"{lm.think_end} in the text, or --think-budget cut it): scored as empty answers, as vLLM's reasoning "
                 "parser gives none; their records say so (extra.think_unclosed)")
    return res


def _kept(warn):
    """(``warn`` that also keeps each line, the list it keeps them in): :func:`evaluate`'s warnings, so the closing
    unavailable lines refer to a long reason a warning gave before (the trust probe's at load) instead of printing it
    again (:func:`lctx.harness.run.tables.unavailable_lines`)."""
    said: list[str] = []

    def kept(msg) -> None:
        said.append(str(msg))
        if warn is not None:
            warn(msg)
    return kept, said


# ---------------------------------------------------------------------------------------------------------------
# the steps of evaluate, in the order it takes them
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class _Call:
    """:func:`evaluate`'s arguments once parsed and checked before torch loads (:func:`_check_call`).

    models: the checkpoint paths and adapter objects given (a list); task_names: the task names given (default: the
    default tasks), repeats dropped; given_tasks: the task objects given; lengths (tokens) and depths (fractions),
    repeats dropped; explicit_lengths: ``lengths`` was given; relative: ``--relative``'s multiples as text ("1,2,4")
    or as given when not a list (None, ""); batch: the length sweeps' batch (an int or ``"auto"``; 1 when not
    given); explicit_batch: a whole-number batch was given (lm-eval's is then checked, not fitted); lmeval_batch:
    lm-eval's batch (the given one, else :data:`LMEVAL_BATCH`); data_dir, cache_dir: as Paths, or None; n_lengths:
    how many lengths each model runs at (``--relative``'s multiples, or the lengths).
    """

    models: list
    task_names: list
    given_tasks: list
    lengths: list
    depths: list
    explicit_lengths: bool
    relative: object
    batch: object
    explicit_batch: bool
    lmeval_batch: int
    data_dir: Optional[Path]
    cache_dir: Optional[Path]
    n_lengths: int = 0
    specs: list = field(default_factory=list)


def _check_call(models, tasks, task_files, *, model_args=None, lengths, depths, samples, relative, batch_size, data_dir, cache_dir,
                out, train_length, chat_template, system_prompt, warn, seed=0, **load) -> _Call:
    """The checks of :func:`evaluate`'s arguments that cost no torch import, in the order their errors come:
    ``samples`` and ``chunk_size`` whole numbers; the lengths, depths and batch size parsed (the one place they are);
    ``data_dir`` a directory; not both ``lengths`` and ``relative``; repeated lengths, depths and tasks dropped (a
    note to ``warn``); the task names and model paths (:func:`_check_names`; with ``tasks`` None, a note to ``warn``
    naming the tasks ``task_files`` add that do not run); the adapter and task objects
    (:func:`_check_adapter_objects`; ``load``: the settings of :data:`_LOAD_SETTINGS`, None when not given); ``out``
    and ``cache_dir`` writable (:func:`_check_out_dirs`); the run options (:func:`lctx.harness.args.check_run_options`, before torch
    loads: docs/troubleshooting.md#mistakes-caught-before-anything-heavy-loads); ``relative``'s multiples; the task
    families' data (:func:`_check_families`).

    Raises:
        LctxError: the first problem found (one line naming the fix).
    """
    given_models, given = models, tasks
    if models is None and tasks is None:  # the demo pair's question: flat ppl, and retrieval past 1x?
        tasks = DEMO_TASKS
    models = _model_list(models)
    tasks, given_tasks = _split_tasks(tasks)
    if given_models is not None and not models:  # only None means "the default"
        raise LctxError(f"models={given_models!r} names no model; pass a checkpoint path or a model adapter object, "
                        "or leave models out (None) for the bundled demo pair")
    if given is not None and not isinstance(given, str) and not tasks and not given_tasks:
        raise LctxError(f"tasks={given!r} names no task; pass task names or objects (e.g. ['passkey'] or "
                        "[Passkey()]), or leave tasks out (None) for the default tasks")
    for name, value in (("samples", samples), ("chunk_size", load["chunk_size"])):  # the CLI's typer bounds (min=1)
        if name == "chunk_size" and value is None:
            continue  # not given: 2048 for a checkpoint path, the adapter's own for an object
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LctxError(f"{name}={value!r} is not a whole number >= 1; pass {name}=1 or more "
                            f"(--{name.replace('_', '-')})")
    check_chunk_size(load["chunk_size"])
    if samples > MAX_SAMPLES:  # before anything is built: 1e9 samples took 6 GB in 33 s
        raise LctxError(f"samples={samples} is above {MAX_SAMPLES}, the most samples per cell lctx runs (the 95% "
                        f"interval of a 0/1 metric's mean is +-1 point there); pass --samples {MAX_SAMPLES} or fewer")
    if given_models is None and lengths is None and not relative:  # the demo pair: 1x to 8x its training length
        relative = DEMO_RELATIVE
    explicit_lengths = lengths is not None  # the one place --lengths, --depths and --batch-size are parsed
    length_list = _as_list(lengths if explicit_lengths else DEFAULT_LENGTHS, parse_lengths, "lengths")
    depth_list = _as_list(depths, partial(parse_depths, seed=seed), "depths")  # seed: an int (_plain_numbers)
    batch = parse_batch_size(batch_size) if batch_size is not None else 1
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise LctxError(f"--data-dir {str(data_dir)!r} is not a directory; `lctx data --out {data_dir}` fetches the "
                            "evaluation data there (or point --data-dir / LCTX_DATA_DIR at a folder that holds it)")
    if relative and explicit_lengths:
        raise LctxError("give either --lengths (tokens) or --relative (multiples of the training length), not both")
    length_list, depth_list = _unique(length_list, "lengths", warn), _unique(depth_list, "depths", warn)
    explicit_batch = batch_size is not None and isinstance(batch, int)
    cache_dir = Path(cache_dir) if cache_dir is not None else None
    if isinstance(relative, (list, tuple)):
        relative = ",".join(f"{r:g}" for r in relative)
    # one-line errors before torch loads
    task_names, file_tasks = _check_names(models, tasks, task_files)
    specs = resolve_models(models or list(DEMO_MODELS), model_args)  # backends and -M, parsed once (no torch)
    _check_capabilities(specs, task_names)
    task_names = _unique(task_names, "tasks", warn)
    idle = [n for n in file_tasks if n not in task_names] if tasks is None else []
    if idle:  # `lctx run --task-file F` without --tasks: F's tasks do not run unless they declare default_run
        one = len(idle) == 1
        warn(f"note: --task-file {', '.join(str(f) for f in task_files)} adds {', '.join(idle)}, which "
             f"{'does' if one else 'do'} not run: without --tasks this run runs the default tasks "
             f"({', '.join(task_names)}); to run {'it' if one else 'them'}, pass --tasks {','.join(idle)}")
    _check_adapter_objects(models, task_names, given_tasks, chat_template=chat_template, system_prompt=system_prompt,
                           **load)
    _check_out_dirs(out, cache_dir)
    check_run_options(dtype=load["dtype"], device=load["device"], attn_impl=load["attn_impl"],
                      attn_override=load["attn_override"], train_length=train_length)  # before torch (docs/troubleshooting.md)
    n_lengths = len(length_list)
    if relative:
        from lctx.harness.steps.flatness import parse_relative  # light: lctx.tasks and numpy, no torch

        n_lengths = len(parse_relative(relative))
    check_grid(n_lengths, len(depth_list), samples)  # one task's grid; the run's, tasks summed: _check_before_torch
    _check_families(task_names, data_dir)
    return _Call(models=models, task_names=task_names, given_tasks=given_tasks, lengths=length_list,
                 depths=depth_list, explicit_lengths=explicit_lengths, relative=relative, batch=batch,
                 explicit_batch=explicit_batch, lmeval_batch=batch if explicit_batch else LMEVAL_BATCH,
                 data_dir=data_dir, cache_dir=cache_dir, n_lengths=n_lengths, specs=specs)


def check_chunk_size(chunk, flag: str = "--chunk-size") -> None:
    """A prefill chunk (tokens) no longer than :data:`lctx.harness.args.MAX_LENGTH` (2**31), the longest prompt lctx
    runs: a larger one would change nothing but overflow the tables' 64-bit columns after the whole sweep (found by a
    trial: ``-M chunk_size=10**26`` ran, then failed writing results.parquet). None (not given) passes.

    Raises:
        LctxError: a chunk above the bound (one line naming the fix)."""
    from lctx.harness.args import MAX_LENGTH  # light

    if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > MAX_LENGTH:
        raise LctxError(f"{flag} {chunk} is above {MAX_LENGTH} tokens, the longest prompt lctx runs; pass e.g. "
                        f"{flag}{'=' if flag.startswith('-M') else ' '}2048 (a chunk longer than the prompt is one chunk)")


def check_grid(n_lengths: int, n_depths: int, samples: int, n_cells: Optional[int] = None,
               tasks: str = "") -> None:
    """Refuse a run whose grid is past :data:`lctx.tasks.base.MAX_CELLS` cells, before anything is built: ``n_cells``
    (the run's cells, summed over its tasks: :meth:`lctx.tasks.Task.n_cells`; ``tasks`` names them) or, when None,
    one task's grid, ``n_lengths`` x ``n_depths`` x ``samples``.

    Raises:
        LctxError: too many cells (one line with the arithmetic and the fix).
    """
    from lctx.tasks.base import MAX_CELLS  # lazy: loads lctx.tasks and numpy (_check_names loads them next anyway)

    grid = n_lengths * n_depths * samples
    cells = grid if n_cells is None else n_cells
    if cells > MAX_CELLS:
        what = (f"{n_lengths} lengths x {n_depths} depths x {samples} samples = {grid} cells a task" if n_cells is None
                else f"{cells} cells in all ({tasks})")
        raise LctxError(f"this run's grid is {what}, above {MAX_CELLS}, the most one run may have (a record each); "
                        "pass fewer --samples, --depths or --lengths, or split the run")


def _check_out_dirs(out, cache_dir: Optional[Path]) -> None:
    """``out`` (when given) a writable directory that is no checkpoint and that no other process holds;
    ``cache_dir`` (when given) writable: answered before torch, the tasks' data and the models load.

    Raises:
        LctxError: an ``out`` or ``cache_dir`` that cannot be written, a checkpoint folder as ``out``, a busy ``out``.
    """
    if out is not None:
        check_writable_dir(Path(out))  # before torch, the tasks' data and the models load
        check_results_out(Path(out), "run")  # not into a checkpoint: its fingerprint would change
        from lctx.harness.run.rundir import check_not_locked  # lazy: +7 ms (socket) to lctx.cli's import (-X importtime)

        check_not_locked(Path(out))  # a busy --out answers now, not after the models load
    if cache_dir is not None:  # a file there failed the first NIAH sample, after the models loaded (F6)
        check_writable_dir(cache_dir, flag="--cache-dir")


def _build_run_tasks(names: list[str], opts: dict, lengths: Optional[dict] = None, *, out, data_dir, cache_dir,
                     values: dict) -> list:
    """The run's task objects (:func:`_build_tasks`) in run directory ``out`` (None, before one is made: the
    current directory stands in, for objects that are only checked); :func:`_check_before_torch` calls it (as
    ``build``) to check them before torch loads, :func:`_plan_tasks` to build the ones that run."""
    from lctx.tasks import get_task  # lazy: loads lctx.tasks and numpy (lctx.cli imports this module)

    run_dir = Path(out) if out is not None else Path(".")  # out: a fresh folder once the checks passed
    return _build_tasks(names, opts, get_task, run_dir, data_dir, cache_dir, values, lengths=lengths)


def _start_torch(device: str):
    """Start torch for the run: OpenMP's passive wait (:func:`passive_omp_wait`, before torch loads it), the CPU
    threads (:func:`lctx.kernels.configure_threads`; docs/kernels-and-bench.md#threads), and under torchrun /
    accelerate launch the process group. Returns (the distributed info, this rank's device: rank r on
    cuda:LOCAL_RANK)."""
    passive_omp_wait()  # before torch loads OpenMP (docs/kernels-and-bench.md#threads)
    from lctx.kernels import configure_threads  # lazy: loads torch

    configure_threads()  # docs/kernels-and-bench.md#threads
    from lctx.harness.run import distributed as dist_  # lazy: loads torch

    dinfo = dist_.init(device)  # [distributed] under torchrun / accelerate launch: join the job (else no-op)
    return dinfo, dist_.rank_device(device, dinfo)  # rank r on cuda:LOCAL_RANK


def _run_dir(out) -> Path:
    """``out`` as a Path; None: a fresh temporary directory (``lctx-*``), made now."""
    if out is None:
        import tempfile  # lazy: +1.5 ms to lctx.cli's import, which imports this module (-X importtime)

        out = tempfile.mkdtemp(prefix="lctx-")
    return Path(out)


@dataclass
class _Tasks:
    """The run's tasks once built (:func:`_plan_tasks`).

    names: the task names the length sweeps run; family_names / families: the names a task family builds
    (``{family: names}``, lm-eval's); objs: the length sweeps' task objects; family_objs: those an outside evaluator
    runs (in the first sweep, after the others); own: {task key: its own lengths} (ppl's ``--window``); steps: the
    derived steps asked for (:func:`expand_derived`).
    """

    names: list
    family_names: list
    families: dict
    objs: list
    family_objs: list
    own: dict
    steps: list

    @property
    def rel_step(self):
        """The derived step whose lengths are relative to the training length (flatness), or None."""
        return next((st for st in self.steps if st.relative), None)


def _plan_tasks(call: _Call, task_options, values: dict, own_lengths: dict, out: Path, dinfo, *, samples: int,
                seed: int, chat_template: bool, system_prompt, cache_dir_from_env: bool, progress: bool, log,
                warn) -> _Tasks:
    """Build the run's tasks: the derived steps expanded (their notes to ``log`` on the main rank), the names a task
    family builds set apart, a warning for run-wide flags no task uses, the families' task objects
    (:func:`_family_objects`), the others' (:func:`_build_run_tasks`, then the task objects given), each task's own
    lengths, a warning for a ``--cache-dir`` that reaches nothing, and every task's data checked.

    Raises:
        LctxError: a bad option of a derived step or task, a family that cannot be sharded under torchrun, a task's
            data that cannot be read.
    """
    task_names, task_option, steps = expand_derived(call.task_names, _task_option_items(task_options),
                                                    log if dinfo.is_main else None, data_dir=call.data_dir,
                                                    samples=samples, depths=call.depths)
    families = _families(task_names)  # lm-eval's: its evaluator builds their task objects, no length axis
    family_names = [n for names in families.values() for n in names]
    task_names = [n for n in task_names if n not in family_names]
    ignored = _ignored_options(task_names, family_names, objects=[t.key for t in call.given_tasks], **values)
    if ignored and dinfo.is_main:
        warn(ignored)
    family_objs = _family_objects(families, values, dinfo, data_dir=call.data_dir, seed=seed,
                                  batch_size=call.lmeval_batch, chat_template=chat_template,
                                  system_prompt=system_prompt, log=log if progress else None)
    given_family = [t for t in call.given_tasks if _families([t.name])]  # task objects an outside evaluator runs
    family_objs += given_family
    task_objs = _build_run_tasks(task_names, parse_task_options(task_option, task_names), out=out,
                                 data_dir=call.data_dir, cache_dir=call.cache_dir, values=values)
    task_objs += [t for t in call.given_tasks if not any(t is g for g in given_family)]
    own = {t.key: own_lengths[ro.param] for t in task_objs for ro in type(t).run_options
           if ro.lengths and ro.param in own_lengths}  # {task: its own lengths} (ppl's --window)
    if call.cache_dir is not None and not cache_dir_from_env and dinfo.is_main:  # only a --cache-dir the user gave
        unused = _unused_cache_dir(call.models, task_objs, task_names + family_names)
        if unused:
            warn(unused)
    for t in task_objs:
        t.check_data()  # fail fast on unreadable data (ppl's documents), before any model runs
    return _Tasks(names=task_names, family_names=family_names, families=families, objs=task_objs,
                  family_objs=family_objs, own=own, steps=steps)


def _family_objects(families: dict, values: dict, dinfo, **build) -> list:
    """The task objects each task family builds of its names (:meth:`lctx.tasks.TaskFamily.build` with the run-wide
    flags ``values`` and ``build``'s settings; it checks their data); they run in the first sweep, after the others.

    Raises:
        LctxError: a family that cannot be sharded, under torchrun / accelerate launch; a family's data or settings.
    """
    for fam, names in families.items():
        if not fam.shardable and dinfo.distributed:  # [distributed]
            raise LctxError(f"{', '.join(names)} cannot be sharded across processes yet; run them without "
                            "torchrun / accelerate launch (the length sweeps can be)")
    return [obj for fam, names in families.items() for obj in fam.build(names, values, **build)]


def _length_groups(lms: list, call: _Call, rel_step, train_length: Optional[int]) -> tuple:
    """The sweeps' lengths per group of models: with ``--relative`` (or a derived step's relative lengths, flatness,
    when no lengths were given) one group per training length (each model's resolved first,
    :func:`lctx.harness.steps.flatness.resolve_train_lengths`), else every model at ``call.lengths``. Returns
    (``--relative``'s multiples as text, or the value given; [(models, lengths in tokens)]).

    Raises:
        LctxError: a model without a training length where one is needed.
    """
    from lctx.harness.steps import flatness  # relative lengths and training lengths; lazy: loads lctx.tasks and numpy

    relative = call.relative
    if rel_step and not relative and not call.explicit_lengths:
        relative = ",".join(f"{r:g}" for r in rel_step.relative)
    if relative or rel_step or train_length is not None:
        flatness.resolve_train_lengths(lms, train_length)
    groups = (flatness.groups_by_train_length(lms, flatness.parse_relative(relative)) if relative
              else [(lms, call.lengths)])
    return relative, groups


def _fit_family_batches(lms: list, family_objs: list, lmeval_batch: int, explicit: bool, warn) -> None:
    """Set each lm-eval suite's batch (of ``family_objs``) to the largest up to ``lmeval_batch`` that fits every model
    (:func:`lctx.models.adapters.memory.check_lmeval_fits`; ``explicit``: the batch was asked for, so it is checked,
    not lowered); the note of each goes to ``warn``. Only in-process models (``lmeval_model()``) are planned: a served
    model's memory is its server's (lm-eval's requests to it go ``concurrency`` at a time), and with no in-process
    model nothing is checked.

    Raises:
        LctxError: an ``explicit`` batch that does not fit.
    """
    from lctx.models.adapters.protocol import optional  # lazy: loads lctx.models (torch, loaded by now)

    lms = [lm for lm in lms if optional(lm, "lmeval_model")]  # a served model's memory is the server's
    if not lms:
        return
    from lctx.models.adapters.memory import check_lmeval_fits  # lazy: loads torch

    for suite in {id(t.suite): t.suite for t in family_objs if getattr(t, "suite", None) is not None}.values():
        fits, note = check_lmeval_fits(lms, suite.request_lengths, lmeval_batch, explicit=explicit)
        suite.set_batch_size(fits)
        warn(note)


def _busy_note(lms: list, dinfo) -> Optional[str]:
    """On the main rank, when a model runs on the CPU: :func:`lctx.kernels.busy_note` (a busy machine), else None."""
    if not dinfo.is_main:
        return None
    from lctx.kernels import busy_note  # lazy: loads torch

    return busy_note() if any(str(lm.settings().get("device") or "").startswith("cpu") for lm in lms) else None


def _say_plan(groups: list, run_tasks: _Tasks, lms: list, dinfo, device, *, depths, samples: int, seed: int,
              skip_below: dict, order: str, log) -> list:
    """Print the run's plan on the main rank (:mod:`lctx.harness.run.estimate`: the samples per model, task and length,
    the time estimated from a calibration of each in-process model) and return its rows."""
    from lctx.harness.run import estimate as est  # lazy: loads torch (loaded by now)
    from lctx.harness.run.console import print_table  # light

    if not dinfo.is_main:
        return []
    rows = est.plan_rows(_sweep_passes(groups, run_tasks, depths=depths, samples=samples, seed=seed,
                                       skip_below=skip_below, order=order))
    if not rows:
        return rows
    lengths = {}
    for r in rows:
        if r.length is not None:
            lengths.setdefault(r.model, []).append(r.length)
    cals = {lm.name: est.calibrate(lm, sorted(set(lengths.get(lm.name, [])))) for lm in lms}
    est.estimate(rows, cals)
    header, table = est.plan_table(rows)
    print_table(header, table, right=header[2:], title="plan (samples per length)")
    from lctx.models.adapters.devices import resolve_device  # lazy: loads torch (loaded by now)

    for line in est.plan_lines(rows, cals, str(resolve_device(device))):
        log(line)
    return rows


def _sweep_and_write(groups: list, run_tasks: _Tasks, out: Path, dinfo, *, depths: list, samples: int, seed: int,
                     skip_below: dict, batch, relative, lms: list, progress: bool, log, order: str = ORDER) -> Result:
    """Lock ``out`` (created now, after every check: a rejected call leaves nothing behind), run the sweeps
    (:func:`_sweep_passes`, one :func:`lctx.harness.run.runner.run_sweep` each, one invocation of run.json), leave
    the process group, and on the main rank write the tables, figures and reports (:func:`_write_outputs`).

    Raises:
        LctxError: another process holds ``out``; a file cannot be written.
    """
    from lctx.harness.run import distributed as dist_  # lazy: loads torch
    from lctx.harness.run.rundir import run_dir_lock  # lazy: +7 ms (socket) to lctx.cli's import (-X importtime)
    from lctx.harness.run.runner import new_invocation, run_sweep  # lazy: loads torch, transformers, pandas

    results = []
    invocation = new_invocation()  # this call's sweeps share one entry of run.json's "invocations"
    with run_dir_lock(out, dinfo):  # created here, after every check: a rejected call leaves nothing behind
        for lms_g, objs, spec in _sweep_passes(groups, run_tasks, depths=depths, samples=samples, seed=seed, order=order,
                                               skip_below=skip_below):
            results.append(run_sweep(lms_g, objs, spec, out, progress=progress, log=log, batch_size=batch,
                                     tables=False, invocation=invocation))
        dist_.destroy()  # [distributed] leave the process group; only rank 0 writes the tables
        totals = {k: sum(r[k] for r in results) for k in ("ran", "skipped", "errors", "ok")}
        res = Result(out=out, is_main=dinfo.is_main, **totals)
        if dinfo.is_main and results:
            _write_outputs(res, run_tasks, relative, lms)
    return res


def _sweep_passes(groups: list, run_tasks: _Tasks, *, depths: list, samples: int, seed: int, skip_below: dict,
                  order: str = ORDER):
    """The sweeps to run, in order, as (models, task objects, :class:`lctx.harness.run.runner.RunSpec`): per group of
    models (one per training length with ``--relative``), the tasks at the group's lengths (lm-eval's after the
    others), then one pass per set of own lengths (ppl's ``--window``); a pass without tasks is left out."""
    from lctx.harness.run.runner import RunSpec  # lazy: loads torch, transformers, pandas

    objs_all, own = run_tasks.objs, run_tasks.own
    for lms_g, length_list in groups:  # one sweep per training length with --relative
        spec = RunSpec(lengths=length_list if objs_all else [], depths=depths, samples=samples, seed=seed,
                       skip_below=skip_below, order=order)
        own_passes: dict[tuple, list] = {}  # a task with lengths of its own (ppl's --window): a sweep of its own
        for t in objs_all:
            if t.key in own:
                own_passes.setdefault(tuple(own[t.key]), []).append(t)
        passes = [([t for t in objs_all if t.key not in own] + run_tasks.family_objs, spec)]
        passes += [(objs, RunSpec(list(lens), depths, samples, seed, order=order)) for lens, objs in own_passes.items()]
        for objs, sp in passes:
            if objs:
                yield lms_g, objs, sp


def _write_outputs(res: Result, run_tasks: _Tasks, relative, lms: list) -> None:
    """Fill ``res`` (the main rank's, after every sweep): the flatness note of a ``--relative`` run, the tables and
    figures (:func:`lctx.harness.outputs.plots.write_run_outputs`, once), the superseded count, and the reports of
    the task families and derived steps."""
    from lctx.harness.steps import flatness  # lazy: loads lctx.tasks and numpy
    from lctx.harness.steps.lmeval_run import format_summary  # a family's summary text; lazy: loads lctx.tasks and numpy
    from lctx.harness.outputs.plots import write_run_outputs  # lazy: loads pandas, matplotlib

    out, steps = res.out, run_tasks.steps
    if relative:
        flatness.note_run(out, models=[lm.path for lm in lms], relative=flatness.parse_relative(relative),
                          train_lengths={lm.name: lm.train_length for lm in lms})
    res.table, res.summary, res.plots = write_run_outputs(out, steps)  # once, after every sweep
    res.superseded = int(res.table.attrs.get("superseded", 0))
    for fam in run_tasks.families:
        res.reports[fam.name] = format_summary(res.summary, fam.owns_label)
    res.reports.update({st.name: st.report(res.table) for st in steps if st.report})
    res.late_reports = [st.name for st in steps if st.report and st.report_after_plots]


def _families(task_names: list[str]) -> dict:
    """{:class:`lctx.tasks.TaskFamily`: the names of ``task_names`` its groups claim} (lm-eval's ``mmlu``,
    ``mmlu_<subject>``, ``arc_*``): the names an outside evaluator builds, in order; registered tasks and derived
    steps are in none."""
    from lctx.tasks import TASKS, group_of  # lazy: loads lctx.tasks and numpy

    out: dict = {}
    for name in task_names:
        group = None if name in TASKS else group_of(name)
        if group is not None and group.family is not None:
            out.setdefault(group.family, []).append(name)
    return out


def _check_families(task_names: list[str], data_dir) -> None:
    """Each task family's data check of its names (:meth:`lctx.tasks.TaskFamily.check_data`: lm-eval's tasks without
    ``--data-dir`` read the Hugging Face hub; offline and not cached, they are refused now, before torch loads, not
    after lm-eval's retries).

    Raises:
        LctxError: a family's data cannot be reached.
    """
    for fam, names in _families(task_names).items():
        fam.check_data(names, data_dir)


def _check_before_torch(models, task_names: list[str], task_options, lengths: Optional[list[int]], values: dict,
                        allow_beyond_max: bool, device: str, explicit_lengths: bool, build: Callable,
                        given_tasks: Sequence = (), n_lengths: Optional[int] = None, positions: Sequence[str] = (),
                        **run) -> dict[str, list[int]]:
    """The checks of a run that need no model, before torch and the weights load (they came after
    15-31 s; 40-150 s on a busy machine): a CUDA ``device`` on a machine without one
    (:func:`lctx.harness.args.check_device_present`); every task option, run-wide (``--stride``, ``--key-digits``,
    ``--ppl-max-tokens``, ...: ``values``, the tasks' :attr:`lctx.tasks.Task.run_options`) or ``--task-option`` (a
    task or key that is not there, a value out of range, a task's missing data) and the lengths each task is to run
    at (its own ones when it declares them and they are given, ppl's ``--window``; else the lengths; its
    :meth:`lctx.tasks.Task.check_lengths`, e.g. a whole-number ``--stride`` longer than a window), by building the task
    objects with ``build(names, {task: options}, {task: lengths})`` (:func:`_build_tasks`, the same call that builds
    the run's tasks later; they are light, and dropped here); a task family's settings (lm-eval's ``--limit`` /
    ``--num-fewshot``, :meth:`lctx.tasks.TaskFamily.check_settings`); own lengths that are no list of lengths; and a
    length (``lengths``; None: relative to the training length, known once the models load) or own length above a
    model's declared maximum, read from its ``config.json`` or GGUF metadata
    (:func:`lctx.harness.args.declared_max`). The same checks run again on the loaded models and built tasks
    (:func:`_check_before_run`). A task's shortest prompt needs the model's tokenizer: that check stays after
    loading. ``given_tasks`` (task objects) check their lengths too; a model adapter object declares its maximum
    itself (``max_length``); a checkpoint that runs under positional methods only (``positions`` without
    ``shipped``) is checked once loaded, at the length its method addresses (a RoPE scale: factor x the original).
    The size options of every task (:attr:`lctx.tasks.Task.option_bounds`) against the
    longest length (:func:`lctx.tasks.base.check_bounds_at`), and the run's grid, its tasks' cells summed
    (:meth:`lctx.tasks.Task.n_cells`; ``n_lengths`` lengths a model, ``run``'s ``depths`` and ``samples``), at most
    :data:`lctx.tasks.base.MAX_CELLS` (:func:`check_grid`). Returns the own lengths given, parsed once:
    {:attr:`lctx.tasks.RunOption.param`: lengths}.

    Raises:
        LctxError: the first problem found (one line naming the fix).
    """
    from lctx.model_files import check_declared_max, declared_max  # light
    from lctx.harness.args import check_device_present  # light
    from lctx.tasks import get_task  # lazy: loads lctx.tasks and numpy

    check_device_present(device)
    names, items, steps = expand_derived(task_names, _task_option_items(task_options), None, **run)
    families = _families(names)
    plain = [n for n in names if not any(n in group for group in families.values())]
    parsed: dict[str, list[int]] = {}  # {param: lengths}: a task's own lengths (ppl's --window), each flag parsed once
    own: dict[str, list[int]] = {}  # {task: its own lengths}
    own_objs = [t for t in given_tasks if not _families([t.name])]
    for name, cls in [(n, get_task(n)) for n in plain] + [(t.key, type(t)) for t in own_objs]:
        for ro in cls.run_options:
            if ro.lengths and values.get(ro.param):
                if ro.param not in parsed:
                    parsed[ro.param] = _as_list(values[ro.param], lambda t, ro=ro: parse_flag_lengths(t, ro.flag, ro.hint),
                                                ro.flag)
                own[name] = parsed[ro.param]
    relative = lengths is None or (any(st.relative for st in steps) and not explicit_lengths)
    built = build(plain, parse_task_options(items, plain),
                  {n: own.get(n) or (None if relative else list(lengths)) for n in plain}) or []
    from lctx.tasks.base import check_bounds_at  # lazy: loads lctx.tasks and numpy (loaded above)

    for t in own_objs:  # as _build_tasks checks the tasks given by name
        lens = own.get(t.key) or (None if relative else list(lengths))
        if lens:
            try:
                check_bounds_at(t, lens)
                t.check_lengths(lens)
            except ValueError as e:
                raise LctxError(f"task object {t.name!r} cannot run at these lengths ({e}); change its options "
                                "or the lengths") from None
    if run.get("samples") is not None and run.get("depths") is not None:  # the run's grid, its tasks' cells summed
        n_len = n_lengths or len(lengths or ()) or 1
        objs = list(built) + list(own_objs)
        cells = sum(t.n_cells(len(own.get(getattr(t, "key", t.name)) or ()) or n_len, len(run["depths"]),
                              run["samples"]) for t in objs)
        check_grid(n_len, len(run["depths"]), run["samples"], n_cells=cells,
                   tasks=", ".join(getattr(t, "key", t.name) for t in objs))
    for fam in families:
        fam.check_settings(values)
    if relative or not (plain or own_objs):
        return parsed  # lengths relative to the training length (flatness without --lengths: its default multiples)
    extra = [L for lens in parsed.values() for L in lens]
    for spec in _specs(models):
        m = spec.given
        if spec.backend is not None and not spec.backend.max_before_load:
            continue  # e.g. a served model's maximum, known once connected (_check_before_run)
        if spec.backend is not None and spec.backend.positions and positions and "shipped" not in positions:
            continue  # a method's own maximum (factor x the original) is known once it is loaded (_check_before_run)
        if spec.backend is not None:
            check_declared_max(*declared_max(spec.location), list(lengths) + extra, allow_beyond_max)
        else:  # a model adapter object: its own declared maximum
            check_declared_max(m.name, m.max_length, list(lengths) + extra, allow_beyond_max,
                               source=getattr(m, "max_length_source", "max_length"))
    return parsed


def _unused_cache_dir(models, task_objs: list, task_names: list[str]) -> str | None:
    """One ``warning:`` line when ``--cache-dir`` reaches nothing: no model is a GGUF file (whose dequantised
    weights it holds) and no task of the run keeps built samples there (the NIAH / RULER tasks); else None."""
    from lctx.model_files import find_gguf  # lazy: stdlib only, but most runs never ask

    names = [models] if isinstance(models, (str, Path)) else [m for m in models or [] if isinstance(m, (str, Path))]
    if any(find_gguf(m) for m in names) or any("cache_dir" in task_option_names(type(t)) for t in task_objs):
        return None
    return ("warning: --cache-dir is ignored: it holds GGUF models' dequantised weights and the NIAH/RULER tasks' "
            f"samples, and this run has neither (tasks: {', '.join(task_names)})")


def _ignored_options(task_names: list[str], family_names: list[str], objects: Sequence[str] = (),
                     **values) -> str | None:
    """One ``warning:`` line naming the run-wide task flags set (not at their defaults) that no task of the run
    declares (:attr:`lctx.tasks.Task.run_options`, a group's or family's; ``--limit 2`` with passkey only: lm-eval's
    tasks take it), each with who takes it, in the order of ``values`` ({lctx.evaluate keyword: value}), or None when
    every one applies. ``family_names``: the run's names a task family builds (lm-eval's); ``objects``: the names of
    the task objects given (they keep their own options: a run-wide flag reaches tasks given by name only, and the
    line says so)."""
    from lctx.tasks import all_run_options, declared  # lazy: loads lctx.tasks and numpy

    used = {ro.param for name in task_names + family_names for ro in getattr(declared(name), "run_options", ())}
    unused = [(ro, users) for ro, users in all_run_options()
              if values.get(ro.param) not in (ro.default, None, [], ()) and ro.param not in used]
    order = list(values)
    unused.sort(key=lambda item: order.index(item[0].param))
    if not unused:
        return None
    one = len(unused) == 1
    whose = ", ".join(f"{ro.flag} ({users})" for ro, users in unused)
    named = ", ".join(task_names + family_names) or "none"
    objs = f"; task objects keep their own options: {', '.join(objects)}" if objects else ""
    return (f"warning: {whose} {'is' if one else 'are'} ignored: no task of this run {'given by name ' if objects else ''}"
            f"uses {'it' if one else 'them'} (tasks: {named}{objs})")


def _check_names(models, tasks, task_files) -> tuple[list[str], list[str]]:
    """(The task names of ``tasks`` (a comma-separated string or a list; None: :func:`lctx.tasks.default_tasks`),
    the names ``task_files`` register), after registering the plug-ins' tasks and ``task_files``; checked with what
    costs no torch or transformers import (``lctx run`` answers these mistakes in well under a second): every name is a task or one a group
    runs (:func:`lctx.tasks.group_of`: a derived step, an lm-eval task), and every path of ``models`` exists.

    Raises:
        LctxError: an unknown task name (the message lists the known ones), a model path that does not exist
            (nor is a hub id in the local Hugging Face cache), a checkpoint folder without tokenizer files, or a
            task file that does not load (:func:`lctx.tasks.load_task_file`).
    """
    from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived names: light, no pandas); lazy: loads lctx.tasks and numpy
    from lctx.tasks import TASKS, default_tasks, get_task, group_of, load_entry_point_tasks, load_task_file  # lazy: loads lctx.tasks and numpy

    load_entry_point_tasks()
    from_files = [n for tf in task_files or [] for n in load_task_file(str(tf))]
    names = (default_tasks() if tasks is None else
             split_list(tasks, "--tasks", "--tasks passkey,ppl (see `lctx list tasks`)") if isinstance(tasks, str)
             else list(tasks))
    bad = next((t for t in names if not isinstance(t, str)), None)
    if bad is not None:
        raise LctxError(f"task {bad!r} is neither a task name nor a lctx.tasks.Task object; pass names such as "
                        "'passkey' or objects such as Passkey()")
    for name in names:
        if name not in TASKS and group_of(name) is None:
            get_task(name)  # raises the one-line error naming the known tasks
    return names, list(dict.fromkeys(from_files))


def _specs(models) -> list:
    """``models`` as :class:`~lctx.harness.backends.ModelSpec` s: as they are when resolved already, else resolved
    (:func:`lctx.harness.backends.resolve_models`; None: the bundled demo pair)."""
    listed = _model_list(models)
    if listed and all(isinstance(m, ModelSpec) for m in listed):
        return listed
    return resolve_models(listed or list(DEMO_MODELS))


def _check_capabilities(specs: Sequence, task_names: list[str]) -> None:
    """No task whose :attr:`lctx.tasks.Task.adapter_needs` (or its family's: mmlu/arc's ``lmeval_model()`` or
    ``lmeval_api_model()``) a model's backend lacks, read from the backend's declared ``provides`` (no import of the
    adapter, no connection; an adapter object is checked by :func:`_check_adapter_objects`).

    Raises:
        LctxError: the first task a model cannot run (one line naming the fix)."""
    from lctx.tasks import TASKS  # lazy: loads lctx.tasks and numpy

    needs = [(n, fam.adapter_needs) for fam, names in _families(task_names).items() for n in names]
    needs += [(n, TASKS[n].adapter_needs) for n in task_names if n in TASKS]
    for spec in specs:
        if spec.backend is None:
            continue
        for name, wanted in needs:
            for methods, why in dict(wanted).items():
                alts = (methods,) if isinstance(methods, str) else tuple(methods)
                if not set(alts) & spec.backend.provides:
                    shown = str(spec.location).split(",")[0]
                    raise LctxError(f"{name} {why}, and a {spec.backend.name} model (--model {shown}) has none: drop "
                                    f"{name} for it, or evaluate it through a backend that has "
                                    f"{_capability_names(methods)} (docs/serving.md)")


def _has_capability(obj, methods) -> bool:
    """Whether ``obj`` (an adapter, or its class) has a capability of :attr:`lctx.tasks.Task.adapter_needs`: a key
    naming one method (``"lmeval_model"``) or a tuple of alternatives, any one of which will do (lm-eval's tasks:
    ``("lmeval_model", "lmeval_api_model")``, :data:`lctx.models.adapters.protocol.LMEVAL_CAPABILITIES`)."""
    return any(callable(getattr(obj, m, None)) for m in ((methods,) if isinstance(methods, str) else methods))


def _capability_names(methods) -> str:
    """``"m()"`` or ``"m1() or m2()"`` for a capability key, for messages."""
    return " or ".join(f"{m}()" for m in ((methods,) if isinstance(methods, str) else methods))


def _load_models(specs, attn_override, warn, server: Optional[dict] = None, positions: Sequence[str] = ("shipped",),
                 **load) -> list:
    """The model adapters of ``specs`` (:class:`~lctx.harness.backends.ModelSpec` s, or models as
    :func:`lctx.evaluate` takes them; default: the bundled demo pair), in order, each through its backend's ``load``
    (:mod:`lctx.harness.backends`): the run-wide settings (``load``: a checkpoint's; ``server``: a served model's)
    with the model's own ``-M`` arguments on top; a backend that takes positional methods loads the model once per
    method of ``positions`` (the cross product, model by model: each pair a model of its own); an adapter object as it
    is (checked against the :class:`~lctx.models.adapters.protocol.ModelAdapter` protocol by
    :func:`_check_adapter_objects`). Names made unique (``name#i``) when two share one. ``attn_override`` (the older
    name of a method, ``--attn-override ssmax``) applies to every checkpoint loaded, on top of its method; a note
    points to ``--position``.

    Raises:
        LctxError: a bad ``attn_override`` or ``positions`` (before any model loads: every spec is parsed against its
            method's options first) or a model its backend refuses (a method that does not apply to it, or that
            changed nothing; a server that cannot be reached).
    """
    specs = _specs(specs)
    if attn_override and any(sp.backend is not None and sp.backend.positions for sp in specs):
        from lctx.models.adapters.overrides import parse_override  # lazy: loads torch, transformers, triton

        ov = parse_override(attn_override)  # a bad spec fails before any model loads
        warn(f"note: --attn-override {ov.label} is the positional method {ov.name}, applied here to every model; "
             f"--position {ov.label} runs it as a model of its own beside the shipped one (docs/positions.md)")
    if any(sp.backend is not None and sp.backend.positions for sp in specs) and list(positions) != ["shipped"]:
        from lctx.models.position import parse_position  # lazy: loads lctx.models (torch)

        for p in positions:
            parse_position(p)  # every option checked before any model loads
    run_wide = {"checkpoint": dict(load, attn_override=attn_override),
                "server": dict(server or {}, chat_template=load.get("chat_template", False),
                               system_prompt=load.get("system_prompt"))}
    if "timeout_s" in run_wide["server"]:
        run_wide["server"]["request_timeout"] = run_wide["server"].pop("timeout_s")
    lms = []
    for sp in specs:
        if sp.backend is None:
            lms.append(sp.given)
            continue
        settings = dict(run_wide.get(sp.backend.name, {k: load.get(k) for k in ("chat_template", "system_prompt")}))
        settings.update(sp.args)
        lms.extend(sp.backend.load(sp.location, settings, list(positions) if sp.backend.positions else ["shipped"],
                                   warn))
    names = [lm.name for lm in lms]
    if len(set(names)) != len(names):
        for i, lm in enumerate(lms):
            lm.name = f"{lm.name}#{i}"
    return lms


def _model_list(models) -> list:
    """``models`` as a list: ``[]`` for None, ``[m]`` for one path or one adapter object (anything with
    ``encode``), else the items of the list, tuple or other iterable."""
    if models is None:
        return []
    if isinstance(models, (str, Path)) or hasattr(models, "encode") or not hasattr(models, "__iter__"):
        return [models]
    return list(models)


def _split_tasks(tasks) -> tuple:
    """(the task names: None, a comma-separated string or a list of names; the task objects given), from
    ``tasks``: None (the default tasks), a string, a :class:`lctx.tasks.Task` object, or a list (any iterable)
    mixing names and objects; an item that is neither stays with the names, where :func:`_check_names` refuses
    it. Light (no import)."""
    if tasks is None or isinstance(tasks, str):
        return tasks, []
    items = [tasks] if (hasattr(tasks, "cells") or not hasattr(tasks, "__iter__")) else list(tasks)
    objs = [t for t in items if not isinstance(t, (str, type)) and hasattr(t, "cells") and hasattr(t, "name")]
    return [t for t in items if not any(t is o for o in objs)], objs


#: ``lctx.evaluate``'s settings of how a checkpoint path loads, as they are when not given: beside a model adapter
#: object (loaded already) ``device``, ``dtype``, ``chunk_size`` and ``attn_impl`` may only say what it has
#: (:data:`_ADAPTER_SETTINGS`); ``attn_override`` and ``trust_remote_code`` set otherwise are refused
_LOAD_SETTINGS = {"device": None, "dtype": None, "chunk_size": None, "attn_impl": None, "attn_override": None,
                  "trust_remote_code": False}
#: what a checkpoint path loads with when ``device``, ``dtype`` or ``chunk_size`` is not given (None)
_PATH_DEFAULTS = {"device": DEVICE, "dtype": DTYPE, "chunk_size": CHUNK_SIZE}
#: the load settings an adapter object reports in its ``settings()``: one given beside it must be its own
_ADAPTER_SETTINGS = ("device", "dtype", "chunk_size", "attn_impl")


def _is_own_setting(key: str, value, settings: dict) -> bool:
    """Whether load setting ``key`` = ``value`` says what an adapter has (``settings``: its ``settings()``):
    ``device`` ``"auto"``, its ``device`` or its ``device_type`` (``"cuda"`` for ``"cuda:0"``); ``attn_impl`` its
    own or, for a Hugging Face model (``"hf:<impl>"``), the transformers attention that name runs
    (``sdpa``: ``hf:sdpa``, ``reference``: ``hf:eager``); the others equal."""
    own = settings.get(key)
    if key == "device":
        return value == "auto" or str(value) in (str(settings.get("device")), str(settings.get("device_type")))
    if key == "attn_impl" and value != own and isinstance(own, str) and own.startswith("hf:"):
        from lctx.attn_impl import ATTN_IMPL_REGISTRY  # light: no torch

        impl = ATTN_IMPL_REGISTRY.get(value)
        return impl is not None and impl.hf is not None and own == f"hf:{impl.hf}"
    return value == own


def _check_adapter_objects(models: list, task_names: list[str], given_tasks: list, **settings) -> None:
    """The checks of model adapter objects and task objects, before any model or data loads (``settings``: the
    load settings of :data:`_LOAD_SETTINGS`, None or False when not given, and ``chat_template`` /
    ``system_prompt``): two tasks of one name (their records would share a key); an adapter class where an object
    belongs; a task whose declared :attr:`lctx.tasks.Task.adapter_needs` (or its family's: lm-eval's
    ``lmeval_model()`` or ``lmeval_api_model()``, :func:`_has_capability`) an adapter object lacks (refused before torch loads); an object that lacks members of
    :class:`~lctx.models.adapters.protocol.ModelAdapter` (named; this check loads torch, with lctx's models) or
    whose members break their contract (:func:`~lctx.models.adapters.protocol.check_adapter`); a load setting
    given beside an object that is not the object's own (:data:`_ADAPTER_SETTINGS`, its ``settings()``) or cannot
    reach it; a chat setting that does not say what the adapter does (its
    :meth:`~lctx.models.adapters.protocol.ModelAdapter.prompt_signature`: the records name the chat template
    through the task options).

    Raises:
        LctxError: the first problem found (one line naming the fix).
    """
    objs = [m for m in models if not isinstance(m, (str, Path))]
    keys = list(task_names) + [getattr(t, "key", t.name) for t in given_tasks]
    twice = next((k for k in keys if keys.count(k) > 1), None)
    if twice is not None:
        raise LctxError(f"two tasks named {twice!r} in one run: their records would share a resume key; give one, "
                        "or run the other into another out directory")
    if not objs:
        return
    cls = next((m for m in objs if isinstance(m, type)), None)
    if cls is not None:  # ToyAdapter, not ToyAdapter(): its methods would be called without self
        raise LctxError(f"model {cls.__name__} is a class, not a model adapter object: pass an instance, "
                        f"{cls.__name__}(...)")
    from lctx.tasks import TASKS  # lazy: loads lctx.tasks and numpy

    needs = [(n, fam.adapter_needs) for fam, names in _families(task_names).items() for n in names]
    needs += [(n, TASKS[n].adapter_needs) for n in task_names if n in TASKS]
    needs += [(t.name, type(t).adapter_needs) for t in given_tasks]
    for name, wanted in needs:  # before torch: the refusal costs nothing
        for methods, why in dict(wanted).items():
            lacking = next((m for m in objs if not _has_capability(m, methods)), None)
            if lacking is not None:
                raise LctxError(f"{name} {why}, and model {getattr(lacking, 'name', lacking)!r} has none (no "
                                f"{_capability_names(methods)}): drop {name} for it, or pass a checkpoint path (or "
                                "load_lm's adapter)")
    from lctx.models.adapters.protocol import check_adapter, missing_members  # lazy: loads lctx.models (torch); objects only

    for m in objs:
        if missing_members(m):
            raise LctxError(f"model {m!r} is neither a checkpoint path nor a model adapter: it lacks "
                            f"{', '.join(missing_members(m))} (lctx.models.adapters.protocol.ModelAdapter); pass a "
                            "path, load_lm(path), or an object with every member of the protocol")
        check_adapter(m)  # each member's shape, before anything runs (docs/adapters.md)
    for key, unset in _LOAD_SETTINGS.items():
        value = settings[key]
        if value == unset or value is None:
            continue
        if key in _ADAPTER_SETTINGS:
            for m in objs:
                if not _is_own_setting(key, value, m.settings()):
                    own = m.settings().get(key)
                    raise LctxError(f"{key}={value!r} is not the setting of model {m.name!r}, an adapter object "
                                    f"loaded with {key}={own!r} (its settings()): leave {key} out, or make the "
                                    f"adapter with it (e.g. load_lm(path, {key}={value!r})) or pass its path")
            continue
        raise LctxError(f"{key}={value!r} sets how lctx loads a checkpoint path, and model {objs[0].name!r} "
                        f"is an adapter object, loaded already: make it with that setting (e.g. "
                        f"load_lm(path, {key}={value!r})) or pass its path")
    for m in objs:
        chat = (m.prompt_signature() or {}).get("chat") if hasattr(m, "prompt_signature") else None
        system = chat.get("system_prompt") if isinstance(chat, dict) else None
        if bool(chat) != bool(settings["chat_template"]) or (chat and system != settings["system_prompt"]):
            raise LctxError(f"model {m.name!r} builds prompts with the chat template "
                            f"{'on' if chat else 'off'}{f' (system prompt {system!r})' if system else ''} but "
                            f"chat_template={settings['chat_template']!r}, system_prompt={settings['system_prompt']!r}: "
                            "pass the adapter's own setting, so the records name it")


def _check_before_run(groups, task_objs: list, own_lengths: Optional[dict] = None, allow_beyond_max: bool = False,
                      memory_check: bool = True, relative: bool = False) -> dict:
    """Every problem found before the first sweep starts: lengths above :data:`lctx.harness.args.MAX_LENGTH`
    (``--relative`` x a training length), lengths a model cannot address, lengths shorter than
    a task's template, lengths a task refuses (:meth:`lctx.tasks.Task.check_lengths`, with ``--relative``'s lengths:
    given ones were checked before torch), a longest prefill that does not fit the device (the memory model of
    ``lctx plan``; a task that :attr:`lctx.tasks.Task.keeps_logits` counts a logits tensor of its longest length).
    ``own_lengths``: {task key: its own lengths} (ppl's ``--window``), which it runs at instead of the group's.
    ``relative`` (``--relative``): a task is left out at the lengths shorter than its template instead
    (:func:`lctx.harness.run.runner.check_min_lengths` with ``drop=True``). Returns {"skip_below": for
    :class:`RunSpec`, "notes": one line per task left out somewhere}.

    Raises:
        LctxError: the first problem found (one line naming the fix).
    """
    from lctx.harness.args import check_max_length  # light
    from lctx.harness.run.runner import check_lengths, check_min_lengths  # lazy: loads torch, transformers, pandas
    from lctx.tasks.base import check_bounds_at  # lazy: loads lctx.tasks and numpy (loaded by the runner)
    from lctx.models.adapters.protocol import optional  # lazy: loads lctx.models (torch, loaded by the runner)

    own = own_lengths or {}
    own_all = [L for lens in own.values() for L in lens]
    by_own: dict[tuple, list] = {}
    for t in task_objs:
        if t.key in own:
            by_own.setdefault(tuple(own[t.key]), []).append(t)
    skip_below, notes = {}, []
    for lms_g, length_list in groups:  # every problem found before the first sweep starts
        check_max_length(length_list)  # --relative's lengths (typed ones were checked when parsed)
        for lm in lms_g if task_objs else []:
            check_lengths(lm, length_list + own_all, allow_beyond_max)
            room = optional(lm, "check_answer_room")  # a served model's --think-budget within its context
            if room is not None and any(not t.keeps_logits and not t.whole for t in task_objs if t.key not in own):
                room(length_list)  # the generating tasks' lengths (not ppl's, not lm-eval's)
        for t in task_objs if relative else []:  # lengths or own lengths given: checked before torch
            if t.key in own:
                continue
            try:  # before the template check below builds a prompt with the task's options
                check_bounds_at(t, length_list)
                t.check_lengths(length_list)
            except ValueError as e:
                declared = {ro.option: t.options.get(ro.option) for ro in type(t).run_options if ro.option}
                own_opts = {k: v for k, v in t.options.items() if k not in declared}  # --task-option's (or the object's)
                raise _bad_option(type(t), t.name, e, own_opts, declared) from None
        skip, lines = check_min_lengths(lms_g, [t for t in task_objs if t.key not in own], length_list, drop=relative)
        skip_below.update(skip)
        notes += lines
        for lens, objs in by_own.items():
            check_min_lengths(lms_g, objs, list(lens))
        if memory_check and task_objs:  # the memory model of `lctx plan`, for the longest prefill
            from lctx.models.adapters.memory import check_run_fits  # lazy: loads torch

            longest = max(length_list + own_all)
            kept = [max(own.get(t.key) or length_list) for t in task_objs if t.keeps_logits]
            check_run_fits(lms_g, longest, kept_logits=max(kept) if kept else 1)
    return {"skip_below": skip_below, "notes": notes}


def _derived_expanders() -> dict:
    """The registry of derived post-processing steps: {name in ``--tasks``: expander}
    (:data:`lctx.harness.steps.derived.EXPANDERS`, where each step registers its own on import). An expander takes
    (task names, ``--task-option`` items, data_dir=, samples=, depths=) and returns (task names with its own
    replaced by the tasks it derives from, the option items not addressed to it, its
    :class:`lctx.harness.steps.derived.DerivedStep` or None when not asked for, lines to print)."""
    from lctx.harness.steps import flatness, ruler  # noqa: F401  (they register their expanders); lazy: loads lctx.tasks and numpy
    from lctx.harness.steps.derived import EXPANDERS  # lazy: +2 ms to lctx.cli's import (-X importtime)

    return dict(EXPANDERS)


def expand_derived(task_names: list[str], task_option: list[str], log=None, **run) -> tuple[list[str], list[str], list]:
    """Apply every derived step's expander (:func:`_derived_expanders`, in order) to the task names and option
    items; returns (task names, option items, the steps asked for). ``log`` gets the expanders' notes.

    Raises:
        LctxError: a bad option of a derived step, or a group none of whose tasks can run.
    """
    steps = []
    for expand in _derived_expanders().values():
        task_names, task_option, st, notes = expand(task_names, task_option, **run)
        steps += [st] if st else []
        for line in notes if log else []:
            log(line)
    return task_names, task_option, steps


def _run_defaults(cls, values: dict) -> dict:
    """{constructor option: value} of the run-wide flags task class ``cls`` declares (:attr:`lctx.tasks.Task.run_options`
    with an ``option``), from ``values`` ({lctx.evaluate keyword: value}).

    Raises:
        LctxError: a declared flag that is no keyword of :func:`evaluate` (a task file's mistake).
    """
    out = {}
    for ro in cls.run_options:
        if ro.option is None:
            continue
        if ro.param not in values:
            raise LctxError(f"task {cls.name!r} declares the run option {ro.flag} (lctx.evaluate keyword {ro.param!r}), "
                            f"which lctx run does not have; declare one of {', '.join(values)}, or take the value "
                            f"with --task-option {cls.name}.{ro.option}=VALUE")
        out[ro.option] = values[ro.param]
    return out


def _build_tasks(task_names: list[str], task_opts: dict, get_task, out: Path, data_dir, cache_dir, values: dict,
                 lengths: Optional[dict] = None) -> list:
    """The task objects of ``task_names``: the run-wide flags each declares (``values``, :func:`_run_defaults`), the
    data and sample-cache directories of tasks that take them, under each task's own ``task_opts``; with
    ``lengths`` ({task: the lengths it is to run at, in tokens, or None}) each task checks them
    (:meth:`lctx.tasks.Task.check_lengths`; ppl: a whole-number stride longer than a window). Light: no torch
    (``lctx run`` builds them once before torch loads to check the values, :func:`_check_before_torch`).

    Raises:
        LctxError: an option the task does not name, a value its constructor, its :attr:`lctx.tasks.Task.option_bounds`
            or length check refuses (naming the flag that set it), or a task's missing data.
    """
    from lctx.tasks.base import check_bounds_at  # lazy: loads lctx.tasks and numpy (get_task has loaded them)

    objs = []
    for name in task_names:
        cls = get_task(name)
        opts = task_opts.get(name, {})
        check_task_options(name, cls, opts)
        defaults = _run_defaults(cls, values)
        valid = task_option_names(cls)  # settings a task may take from the run: data and sample cache
        defaults.update({k: v for k, v in (("data_dir", data_dir), ("cache_dir", cache_dir or out / "sample_cache"))
                         if k in valid and v is not None and k not in defaults})
        run_lengths = (lengths or {}).get(name)
        try:
            objs.append(cls(**{**defaults, **opts}))
            if run_lengths:
                check_bounds_at(objs[-1], run_lengths)  # a size option the longest length cannot hold
                objs[-1].check_lengths(run_lengths)
        except (ValueError, TypeError) as e:
            raise _bad_option(cls, name, e, opts, defaults) from None
    return objs


def _bad_option(cls, name: str, e: Exception, opts: dict, defaults: dict) -> LctxError:
    """The one-line error for a task constructor's (or length check's) ValueError/TypeError ``e``: it names the flag
    that set the bad value (a run option's flag, ``--stride``, as task class ``cls`` declares it; else
    ``--task-option passkey.key_digits``, ...) and a fix (:meth:`lctx.tasks.Task.option_hint`), not only Python's
    text."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

    def culprit(kv: dict):
        return next((k for k, v in kv.items() if k in msg or (isinstance(v, str) and v and repr(v) in msg)), None)

    key = culprit(opts)
    if key is not None:
        flag, value = f"--task-option {name}.{key}", opts[key]
    else:
        key = culprit(defaults)
        ro = cls.run_option(key) if key is not None else None
        flag, value = (ro.flag if ro else f"--task-option {name}.{key}"), defaults.get(key)
    if key is None:
        return LctxError(f"bad option for task {name!r}: {msg}; fix the option (`lctx list tasks` shows the "
                         "tasks; --task-option TASK.KEY=VALUE sets one)")
    if "invalid literal" in msg or "could not convert" in msg:
        msg = f"{value!r} is not a number"
    if "; pass " in msg:  # the message names its own fix (an option the run's lengths cannot hold)
        return LctxError(f"bad {flag} for task {name!r}: {msg}")
    hint = cls.option_hint(key)
    return LctxError(f"bad {flag} for task {name!r}: {msg}; pass {hint or 'a valid value'}")
