"""The ``lctx`` command line (typer): ``lctx run``, ``lctx train``, ``lctx list``.

User mistakes raise :class:`lctx.errors.LctxError`; :func:`main` prints them as one line
(``error: ...``) on stderr and exits with status 2, never with a traceback.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import List, Optional

import click
import typer

import lctx
from lctx import ATTN_IMPLS
from lctx.attn_impl import ATTN_IMPL_REGISTRY
from lctx.defaults import CHUNK_SIZE, CONCURRENCY, DEVICE, DTYPE, ORDER, REQUEST_TIMEOUT_S, RETRIES
from lctx.harness.run.console import count, print_frame, print_table, say, table_format
from lctx.harness.args import (check_checkpoint_out, check_results_out, check_train_args, check_writable_dir, data_path, parse_lengths, parse_options)
from lctx.errors import EXIT_ALL_FAILED, EXIT_USAGE, LctxError, ServerReplyError, split_list
from lctx.outside import cap, quote, redact
from lctx.harness.evaluate import DEFAULT_MODEL, evaluate, passive_omp_wait

class _WholeHelp:
    """Help that is never cut: usage lines as the rest of the world writes them (``lctx compare [OPTIONS]
    RUN_DIR``, not typer's ``{run_dir}``: required arguments carry an upper-case ``metavar`` and only the
    braces are dropped here), and a command's one-line help whole in the command list (click shortens it
    to ``...`` to fit 80 columns; the list wraps it instead)."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"^\{(.*)\}((\.\.\.)?)$", r"\1\2", p) for p in super().collect_usage_pieces(ctx)]

    def get_short_help_str(self, limit: int = 45) -> str:
        text = inspect.cleandoc(self.short_help or self.help or "").split("\n\n")[0]
        return " ".join(text.split())


class _Command(_WholeHelp, typer.core.TyperCommand):
    pass


class _Group(_WholeHelp, typer.core.TyperGroup):
    pass


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lctx: does a model really use context longer than it was trained on?")

DEFAULT_DEPTHS = "0,0.25,0.5,0.75,1"


def _light_models() -> None:
    """Let a first ``import lctx.models`` skip the transformers modeling stack (seconds, ~200 MiB): for commands
    that need the variant registry only (``lctx list variants``, ``lctx train``'s checks). Loading a checkpoint
    registers ``model_type="lctx"`` later all the same (:func:`lctx.models.register_with_transformers`)."""
    lctx._light_import = True


def _out_arg(value) -> Path:
    """The parser of every command's ``--out``: the text as typed, to a Path. An empty one (``--out ""``, a
    script's ``--out "$OUT"`` with OUT unset) is refused here: a Path of "" is ".", the current directory, and
    would write (for ``lctx train``: overwrite) whatever lies there.

    Raises:
        LctxError: the value is empty or blank.
    """
    if isinstance(value, Path):  # the default
        return value
    if not str(value).strip():
        raise LctxError("--out is empty; pass a directory for the results, e.g. --out runs/my-run "
                        "(a script's --out \"$OUT\" with OUT unset?)")
    return Path(value)


def _data_out_arg(value) -> Path:
    """``lctx data``'s ``--out`` parser: :func:`_out_arg`, with the data folder named in its error.

    Raises:
        LctxError: the value is empty or blank.
    """
    if not isinstance(value, Path) and not str(value).strip():
        raise LctxError("--out is empty; pass the data folder to fill, e.g. --out ../shared/data (a script's "
                        "--out \"$DIR\" with DIR unset?)")
    return _out_arg(value)


def _checked_out(value: Optional[Path]) -> Optional[Path]:
    """The callback of every command's ``--out``: an unwritable directory is refused while the arguments are
    parsed (one ``error:`` line, exit 2), before torch, a model or any data loads (:func:`check_writable_dir`:
    nothing is created)."""
    if value is not None:
        check_writable_dir(Path(value))
    return value


def _results_out(command: str, run_dir_ok: bool = True):
    """The ``--out`` callback of a command that writes results (``lctx run``, ``report``, ``bench``, ``compare``,
    ``diagnose``): :func:`_checked_out`, and neither a checkpoint folder nor (``run_dir_ok`` False) an ``lctx run``
    directory (:func:`lctx.harness.args.check_results_out`)."""

    def callback(value: Optional[Path]) -> Optional[Path]:
        if value is not None:
            check_writable_dir(Path(value))
            check_results_out(Path(value), command, run_dir_ok=run_dir_ok)
        return value

    return callback


def _checked_cache_dir(ctx: typer.Context, value: Optional[Path]) -> Optional[Path]:
    """The callback of ``lctx run --cache-dir``: a file, or a directory that cannot be written, is refused while
    the arguments are parsed (:func:`check_writable_dir`: the first NIAH sample failed with
    NotADirectoryError once the models had loaded), naming ``LCTX_CACHE_DIR`` when the value came from it."""
    if value is not None:
        source = getattr(ctx.get_parameter_source("cache_dir"), "name", None)
        check_writable_dir(Path(value), flag="LCTX_CACHE_DIR" if source == "ENVIRONMENT" else "--cache-dir")
    return value


def _configure_threads(device: str = "cpu") -> None:
    """Intra-op threads for a computing command: LCTX_NUM_THREADS / OMP_NUM_THREADS, else torch's default, with a
    note when the machine is busy (:func:`lctx.kernels.default_threads`, :func:`lctx.kernels.busy_note`;
    docs/kernels-and-bench.md#threads)."""
    from lctx.kernels import busy_note, configure_threads  # lazy: loads torch

    configure_threads()
    note = busy_note() if str(device).startswith("cpu") else None
    if note:
        say(note, err=True)


@app.command()
def run(
    ctx: typer.Context,
    model: List[str] = typer.Option(None, "--model", "-m", help="Checkpoint directory, .gguf file, or a served model's URL http://HOST:PORT/v1 (URL1,URL2: several servers of one model; docs/serving.md) (repeatable). Default: the bundled demo pair (ALiBi and GGD-BAM, 128-token training length) at 1x-8x it."),
    model_args: List[str] = typer.Option(None, "--model-args", "-M", help="Per-model arguments KEY=VALUE,... (as lm-eval's --model_args): one -M for every --model, or one per --model in the same order; the keys of its backend (`lctx list backends`: dtype, chunk_size, attn_impl, trust_remote_code for a checkpoint; served_model, tokenizer, api_key_env, concurrency, request_timeout, retries, think_end, think_budget for a server). The run-wide flags are the defaults. A --model may name its backend: checkpoint:PATH, server:URL."),
    tasks: str = typer.Option("passkey,ppl", "--tasks", "--task", "-t", help="Comma-separated task names (see `lctx list tasks`); `flatness` runs ppl + a retrieval task and derives ppl_ratio, flat_until, effective_length; `ruler` runs RULER's 13 tasks and derives their average and effective length."),
    task_file: List[Path] = typer.Option(None, "--task-file", help="Python file defining extra tasks (repeatable)."),
    lengths: str = typer.Option("256,512,1k,2k", "--lengths", "-l", help="Context lengths in tokens (k = 1024)."),
    relative: Optional[str] = typer.Option(None, "--relative", help="Lengths as multiples of each model's training length, e.g. 0.5,1,2,4,8 (instead of --lengths; default for flatness)."),
    train_length: Optional[int] = typer.Option(None, "--train-length", help="Training length in tokens, for checkpoints whose config records none (overrides the config's)."),
    depths: str = typer.Option(DEFAULT_DEPTHS, "--depths", "-d", help="Needle depths, fractions in [0, 1], or random:N (N depths drawn uniformly, seeded by --seed)."),
    samples: int = typer.Option(2, "--samples", "-n", min=1, help="Samples per (length, depth) cell."),
    stride: float = typer.Option(0.5, "--stride", help="ppl: tokens between windows, or a fraction (<= 1) of the window."),
    window: Optional[str] = typer.Option(None, "--window", help="ppl: window sizes in tokens (default: the --lengths)."),
    ppl_data: List[str] = typer.Option(None, "--ppl-data", help="ppl: text files/folders (relative to --data-dir if not found). Default: held-out pydoc topics."),
    ppl_bos: str = typer.Option("prepend", "--ppl-bos", help="ppl BOS policy: prepend (to every window) or none."),
    ppl_short_docs: str = typer.Option("drop", "--ppl-short-docs", help="ppl: drop or count documents shorter than the window."),
    ppl_max_tokens: int = typer.Option(32768, "--ppl-max-tokens", help="ppl: score at most this many tokens per document (0 = all)."),
    key_digits: int = typer.Option(5, "--key-digits", min=1, help="passkey: digits in the key."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="mmlu/arc_*: only the first N test questions of each task (each MMLU subject)."),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", min=0, help="mmlu/arc_*: few-shot examples (default: mmlu 5, arc 0)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", envvar="LCTX_DATA_DIR", help="Root of evaluation data (e.g. ../shared/data)."),
    out: Path = typer.Option(Path("lctx-out"), "--out", "-o", parser=_out_arg, callback=_results_out("run"), help="Run directory (rerun with the same --out to resume)."),
    device: str = typer.Option(DEVICE, "--device", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option(DTYPE, "--dtype", help="float32, bfloat16 or float16."),
    seed: int = typer.Option(0, "--seed", help="Seed of sample generation."),
    chunk_size: int = typer.Option(CHUNK_SIZE, "--chunk-size", min=1, help="Prefill chunk in tokens."),
    allow_beyond_max: bool = typer.Option(False, "--allow-beyond-max", help="Run lengths past a checkpoint's declared maximum."),
    attn_impl: Optional[str] = typer.Option(None, "--attn-impl", help=f"{', '.join(ATTN_IMPLS)}. fast (the default): lctx models' kernels (Triton / FlexAttention on GPU, the blocked path on CPU), Hugging Face models' lctx_sdpa (no masked rectangle in a chunked prefill); sdpa: torch SDPA with a float mask (transformers' sdpa); reference: explicit fp32 softmax (transformers' eager). Recorded in the table."),
    task_option: List[str] = typer.Option(None, "--task-option", help="Task option TASK.KEY=VALUE (repeatable; VALUE parsed as JSON when it can be), e.g. niah_single_1.match=digits."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", envvar="LCTX_CACHE_DIR", callback=_checked_cache_dir, help="Cache root: built samples of niah_* (default: OUT/sample_cache) and dequantised GGUF checkpoints (default: the user cache dir, ~/.cache/lctx)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Run Python code shipped with a Hugging Face checkpoint (auto_map). Off by default."),
    attn_override: Optional[str] = typer.Option(None, "--attn-override", help="Change the attention of the loaded models: ssmax[:s=X] (Scalable-Softmax, s fixed, default 1) or alibi_lsh[:s=N] (ALiBi models); recorded in the variant column. The same methods as --position, applied to every model."),
    position: List[str] = typer.Option(None, "--position", help="Positional method NAME[:KEY=VALUE,...] (repeatable: every --model runs under each, side by side, as models of their own), e.g. yarn:factor=4, linear:factor=2, dynamic:factor=2, ntk:factor=4, sinks, self_extend, ssmax:s=0.4; shipped (the default): as the checkpoint ships. `lctx list positions`; docs/positions.md."),
    chat_template: str = typer.Option("off", "--chat-template", help="on: wrap each task prompt in the model's chat template (the task text is the user's turn, its answer prefix starts the assistant's; mmlu/arc: lm-eval's apply_chat_template). off (default, as lm-eval). Recorded in task_options."),
    system_prompt: Optional[str] = typer.Option(None, "--system-prompt", help="System message for --chat-template on (default: the template's own, if any)."),
    memory_check: bool = typer.Option(True, "--memory-check/--no-memory-check", help="Refuse, before the sweep, a run whose longest prefill or lm-eval batch does not fit the device (memory model of `lctx plan`)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    concurrency: int = typer.Option(CONCURRENCY, "--concurrency", min=1, help="Served models: requests in flight at most, over all their servers (match the server's parallel slots; results do not depend on it)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Served models: a local tokenizer (folder, .gguf file or cached hub id) for a server without a tokenizer endpoint, or with a chat template for --chat-template on; checked against the server's."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Served models: the environment variable that holds the API key (never given on the command line, never written)."),
    served_model: Optional[str] = typer.Option(None, "--served-model", help="Served models: the model id to use where the server lists several (/v1/models)."),
    request_timeout: float = typer.Option(REQUEST_TIMEOUT_S, "--request-timeout", min=0.1, help="Served models: the deadline of each request in seconds, from connect to the last byte of its reply (each retry gets its own)."),
    retries: int = typer.Option(RETRIES, "--retries", min=0, help="Served models: retries of a request on 429/5xx and reset connections, with exponential back-off (Retry-After honoured)."),
    think_end: Optional[str] = typer.Option(None, "--think-end", help="Served reasoning models: the marker that ends the thinking span (e.g. '</think>'); the text up to it is dropped before scoring."),
    think_budget: int = typer.Option(0, "--think-budget", min=0, help="Served reasoning models: tokens added to each answer budget for the thinking span."),
    batch_size: Optional[str] = typer.Option(None, "--batch-size", help="N or auto: prefill and decode N samples of one length together (passkey, niah_*, RULER's tasks, custom tasks with batched = True; ppl runs one at a time); mmlu/arc: N requests per lm-eval forward, refused when the memory check finds it does not fit (default 1 and, for mmlu/arc, the largest up to 32 that fits, printed). auto: the most that lctx plan's memory model fits in half the device (at most 4 on CPU, 32 on CUDA). Records equal batch 1's to rounding; see \"Batches\" in docs/kernels-and-bench.md."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Load the models, check everything, print the plan (samples per model, task and length, and the estimated time) and exit without running or writing the run directory."),
    plan: bool = typer.Option(True, "--plan/--no-plan", help="Print the plan and a time estimate before the sweep (a short calibration of each in-process model on this machine: a few prefills)."),
    order: str = typer.Option(ORDER, "--order", help="The order samples run in: cache (per length, the deepest needle first, the sample seeds of one depth together: each prompt repeats the one before up to its needle, so a server's prefix cache reuses it), grid (lengths x depths x samples) or shuffle (seeded; the control when measuring the saving). Scores do not depend on it."),
):
    """Evaluate checkpoints on tasks x lengths x depths; write records.jsonl, results.parquet/csv, summary.csv and plots."""
    if chat_template not in ("on", "off"):
        raise LctxError(f"--chat-template {chat_template!r} is not on or off; write --chat-template on")
    # --lengths, --depths, --window and --batch-size go to lctx.evaluate as typed: it parses them, once, before torch
    # loads (their one-line errors come before the heavy imports all the same)
    explicit_lengths = getattr(ctx.get_parameter_source("lengths"), "name", "DEFAULT") != "DEFAULT"  # --lengths given
    env_cache_dir = getattr(ctx.get_parameter_source("cache_dir"), "name", "") == "ENVIRONMENT"  # LCTX_CACHE_DIR
    explicit_tasks = getattr(ctx.get_parameter_source("tasks"), "name", "DEFAULT") != "DEFAULT"  # --tasks given
    # without --tasks: the default tasks (lctx.tasks.default_tasks), and a note names a --task-file's tasks
    warned = _Warnings()  # printed redacted, escaped and capped; kept for the notes under the table
    result = evaluate(
        list(model) if model else None, tasks if explicit_tasks else None,
        lengths=lengths if explicit_lengths else None, depths=depths,
        samples=samples, out=out, relative=relative, train_length=train_length, task_options=task_option or [],
        task_files=task_file or [], data_dir=data_dir, device=device, dtype=dtype, seed=seed, chunk_size=chunk_size,
        allow_beyond_max=allow_beyond_max, attn_impl=attn_impl, cache_dir=cache_dir, cache_dir_from_env=env_cache_dir,
        trust_remote_code=trust_remote_code, attn_override=attn_override, positions=list(position) if position else None,
        model_args=list(model_args) if model_args else None, chat_template=chat_template == "on",
        system_prompt=system_prompt, memory_check=memory_check, progress=progress, batch_size=batch_size,
        order=order, stride=stride, window=window,
        ppl_data=ppl_data or None, ppl_bos=ppl_bos, ppl_short_docs=ppl_short_docs, ppl_max_tokens=ppl_max_tokens,
        key_digits=key_digits, limit=limit, num_fewshot=num_fewshot, concurrency=concurrency, tokenizer=tokenizer,
        api_key_env=api_key_env, served_model=served_model, request_timeout=request_timeout, retries=retries,
        think_end=think_end, think_budget=think_budget, plan=plan, dry_run=dry_run, log=say, warn=warned)
    if result.dry_run:
        say(f"dry run: nothing ran and nothing was written; the same command without --dry-run runs it into {out}")
        return
    if not result.is_main or result.table is None:
        return
    for name, text in result.reports.items():  # lm-eval's table, flatness; the ruler group's grid comes last
        if name not in result.late_reports:
            say(text, limit=None)
    from lctx.harness.run.tables import declared_directions, print_summary  # lazy: loads pandas (the run has)

    print_summary(result.summary, declared_directions(result.out), said=warned.lines)
    failed = result.failed
    if len(failed):
        msgs = failed.drop_duplicates(["model", "task", "length", "depth", "sample"])["error"].value_counts()
        for msg, n in msgs.head(5).items():
            say(f"failed ({count(n, 'sample')}): {quote(msg)}", err=True)
        if len(msgs) > 5:
            rest = int(msgs.iloc[5:].sum())
            say(f"... and {len(msgs) - 5} more distinct error messages ({count(rest, 'sample')}) not shown; "
                f"see the error column of {out}/results.csv", err=True)
    if result.superseded:
        say(f"note: {count(result.superseded, 'record')} of earlier inputs (other weights, data, settings or versions) "
            f"are kept in {out}/records.jsonl but left out of the tables", err=True)
    say(f"wrote {out}/results.parquet, results.csv, summary.csv ({count(len(result.table), 'row')}; "
        f"{count(result.ran, 'sample')} run, {result.skipped} resumed, {count(result.errors, 'error')})")
    for p in result.plots:
        say(f"plot: {p}")
    for name in result.late_reports:  # after the plots (DerivedStep.report_after_plots)
        say(result.reports[name], limit=None)
    if result.ok == 0 and result.errors > 0:
        say(f"error: every sample of this run failed ({count(result.errors, 'error')}; see above and "
            f"{out}/results.csv); exit status {EXIT_ALL_FAILED}", err=True)
        raise typer.Exit(EXIT_ALL_FAILED)
    if result.exit_status:  # some samples failed, the others were scored: docs/troubleshooting.md#exit-codes
        typer.echo(f"error: {count(result.errors, 'sample')} of this run failed (see above and {out}/results.csv); the "
                   f"others are scored; exit status {result.exit_status}", err=True)
        raise typer.Exit(result.exit_status)


class _Warnings:
    """``lctx run``'s warning sink: each line printed on stderr through :func:`lctx.harness.run.console.say`
    (redacted, escaped, capped) and kept in ``lines``, so that a note after the sweep refers to a long reason a
    warning gave (the trust probe's) instead of printing it again."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, msg) -> None:
        self.lines.append(str(msg))
        say(msg, err=True)


@app.command()
def train(
    data: List[str] = typer.Option(None, "--data", help="Text files or folders (repeatable). Default: Python's pydoc topics (train split)."),
    variant: str = typer.Option("rope", "--variant", help="Positional variant (see `lctx list variants`); add +ssmax for Scalable-Softmax."),
    option: List[str] = typer.Option(None, "--option", help="Variant option KEY=VALUE (repeatable; VALUE parsed as JSON when it can be), e.g. ggd_shared=false, lsh_samples=16."),
    context_length: int = typer.Option(256, "--context-length", "--ctx", help="Training context in tokens (BOS included)."),
    hidden_size: int = typer.Option(128, "--hidden-size"),
    layers: int = typer.Option(4, "--layers"),
    heads: int = typer.Option(4, "--heads"),
    vocab_size: int = typer.Option(2048, "--vocab-size", help="BPE vocabulary size (tokens)."),
    steps: int = typer.Option(1000, "--steps"),
    batch_size: int = typer.Option(16, "--batch-size"),
    lr: float = typer.Option(3e-3, "--lr"),
    warmup: int = typer.Option(50, "--warmup", help="Linear warm-up steps."),
    eval_every: int = typer.Option(200, "--eval-every", help="Held-out loss every N steps."),
    val_fraction: float = typer.Option(0.05, "--val-fraction", help="Tail of each document held out for the validation loss."),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option(DEVICE, "--device"),
    out: Path = typer.Option(..., "--out", "-o", parser=_out_arg, callback=_checked_out, help="Checkpoint directory to write."),
    retrieval_fraction: float = typer.Option(0.0, "--retrieval-fraction", help="Share of training windows that start with a synthetic retrieval document (0 = plain text)."),
    retrieval: str = typer.Option("passkey", "--retrieval", help="Tasks that build the retrieval documents, comma-separated: passkey and/or niah_* (e.g. passkey,niah_multikey_1)."),
    retrieval_min_length: Optional[int] = typer.Option(None, "--retrieval-min-length", help="Shortest retrieval document in tokens (default: half the context)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="RULER data root for niah_* retrieval documents (default $LCTX_DATA_DIR)."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a checkpoint already in --out (refused without it)."),
):
    """Train a small model of one variant (tokenizer + AdamW/cosine), write a checkpoint directory."""
    check_checkpoint_out(out, overwrite, "train")  # before any training: a typo must not destroy a trained model
    check_train_args(context_length=context_length, hidden_size=hidden_size, num_layers=layers, num_heads=heads,
                     vocab_size=vocab_size, steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup,
                     eval_every=eval_every, val_fraction=val_fraction, retrieval_fraction=retrieval_fraction,
                     retrieval_min_length=retrieval_min_length)  # before torch loads (train() checks them again)
    variant_options = parse_options(option or [])
    _light_models()  # the variant checks below need the registry only (one-line errors without transformers)
    from lctx.models.options import check_variant_options  # lazy: loads torch (lctx.models)
    from lctx.models.variants import get_variant  # lazy: loads torch (lctx.models)

    try:
        get_variant(variant)
        check_variant_options(variant, variant_options)
    except KeyError as e:
        raise LctxError(f"{e.args[0]}; see `lctx list variants`") from None
    except ValueError as e:
        raise LctxError(f"--option: {e}") from None
    from lctx.tasks import textdata  # lazy: loads lctx.tasks and numpy (-X importtime: 0.4 s, more than lctx.cli itself)
    from lctx.models.adapters.devices import resolve_device  # lazy: loads torch
    from lctx.harness.commands.train import RetrievalMix  # lazy: loads torch, transformers
    from lctx.harness.commands.train import train as train_fn  # lazy: loads torch, transformers

    dev = resolve_device(device)
    _configure_threads(str(dev))
    docs = textdata.load_corpus(data) if data else textdata.pydoc_corpus("train")
    train_fn(docs, out, variant=variant, context_length=context_length, hidden_size=hidden_size,
                       num_layers=layers, num_heads=heads, vocab_size=vocab_size, steps=steps,
                       batch_size=batch_size, lr=lr, warmup_steps=warmup, eval_every=eval_every,
                       val_fraction=val_fraction, seed=seed, device=str(dev), progress=progress,
                       variant_options=variant_options,
                       retrieval=(RetrievalMix(fraction=retrieval_fraction,
                                               tasks=tuple(t.strip() for t in retrieval.split(",") if t.strip()),
                                               min_length=retrieval_min_length, data_dir=data_dir)
                                  if retrieval_fraction > 0 else None),
                       log=say, warn=lambda m: say(m, err=True))


diagnose_app = typer.Typer(cls=_Group, help="Diagnostics: learned GGD prior shapes, attention far-mass.", no_args_is_help=True)
app.add_typer(diagnose_app, name="diagnose")


@diagnose_app.command("prior")
def diagnose_prior(
    model: str = typer.Option(..., "--model", "-m", help="A ggd_bam checkpoint directory."),
    out: Path = typer.Option(Path("lctx-diagnostics"), "--out", "-o", parser=_out_arg, callback=_results_out("diagnose")),
    max_distance: Optional[int] = typer.Option(None, "--max-distance", min=1, help="Largest distance plotted (tokens; default 8x train length)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Run Python code shipped with a Hugging Face checkpoint (auto_map). Off by default."),
):
    """Plot each head's learned GGD-BAM prior exp(b(d)) vs distance, coloured by beta; write prior_params.csv."""
    from lctx.harness.commands.diagnostics import plot_priors, prior_table  # lazy: loads torch, transformers, matplotlib
    from lctx.models.adapters.hf import load_lm  # lazy: loads torch, transformers

    lm = load_lm(model, device="cpu", trust_remote_code=trust_remote_code)
    out.mkdir(parents=True, exist_ok=True)
    table = prior_table(lm)
    table.to_csv(out / "prior_params.csv", index=False)
    path = plot_priors(lm, out, max_distance)
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {out / 'prior_params.csv'} and {path}")


@diagnose_app.command("far-mass")
def diagnose_far_mass(
    model: List[str] = typer.Option(..., "--model", "-m", help="Checkpoint directory (repeatable)."),
    lengths: str = typer.Option("256,512,1k,2k", "--lengths", "-l"),
    distance: Optional[int] = typer.Option(None, "--distance", min=1, help="Far means farther than this many tokens (default: half the training length)."),
    data: Optional[str] = typer.Option(None, "--data", help="Text file to run (default: held-out pydoc topics)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", envvar="LCTX_DATA_DIR"),
    queries: int = typer.Option(32, "--queries", min=1, help="Last queries averaged per length."),
    device: str = typer.Option(DEVICE, "--device"),
    out: Path = typer.Option(Path("lctx-diagnostics"), "--out", "-o", parser=_out_arg, callback=_results_out("diagnose")),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Run Python code shipped with a Hugging Face checkpoint (auto_map). Off by default."),
):
    """Share of attention mass beyond a distance as the context grows (seed 004's near/far mass)."""
    from lctx.model_files import check_model_path  # light: the argument checks come before torch loads

    length_list = parse_lengths(lengths)
    if distance is not None and distance >= max(length_list):
        raise LctxError(f"--distance {distance} is not below the longest length {max(length_list)}: no key would be "
                        "that far and every far mass would be 0; pass a smaller --distance or longer --lengths")
    for m in model:
        check_model_path(m)
    import pandas as pd  # lazy: loads pandas

    from lctx.tasks import textdata  # lazy: loads lctx.tasks and numpy
    from lctx.harness.commands.diagnostics import far_mass, plot_far_mass  # lazy: loads torch, transformers, matplotlib
    from lctx.models.adapters.hf import load_lm  # lazy: loads torch, transformers
    docs = textdata.load_corpus([data_path(data, data_dir)]) if data else textdata.pydoc_corpus("heldout")
    text = "\n\n".join(t for _, t in docs)
    frames = []
    for path in model:
        lm = load_lm(path, device=device, trust_remote_code=trust_remote_code)
        dist = distance if distance is not None else max(1, (lm.train_length or 512) // 2)
        ids = lm.with_bos(lm.encode(text))
        frames.append(far_mass(lm, ids, length_list, dist, n_queries=queries))
    df = pd.concat(frames, ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "far_mass.csv", index=False)
    plot = plot_far_mass(df, out)
    summary = df.groupby(["model", "length"])["far_mass"].mean().unstack("length")
    typer.echo(summary.to_string(float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {out / 'far_mass.csv'} and {plot}")


@app.command()
def compare(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR", help="Run directory to check (written by lctx run)."),
    other: Optional[Path] = typer.Argument(None, metavar="RUN_B", help="A second run of the same model through another backend (in process, vLLM, llama-server, llama-cpp-python): check their parity sample by sample (prompt ids, greedy text, scores, largest log-probability difference) instead of gating on a baseline; docs/serving.md#backend-parity."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", "-b", help="Baseline run directory (summary.csv at least)."),
    parity_models: Optional[str] = typer.Option(None, "--parity-models", help="A=B: with RUN_B, model A of RUN_DIR against model B of RUN_B (needed when a run holds several models)."),
    rules: Optional[Path] = typer.Option(None, "--rules", help="TOML rules file: tolerances, per-metric directions and tolerances, aliases (see \"The rules file\" in docs/compare-ci.md)."),
    tolerance: List[str] = typer.Option(None, "--tolerance", help="[METRIC:]abs=X,rel=X,stderr=K,interval=on (repeatable); a difference counts only when it exceeds each (and, with interval=on, the run's 95 % interval excludes the baseline mean)."),
    alias: List[str] = typer.Option(None, "--alias", help="NEW=OLD: run model NEW is baseline model OLD (repeatable)."),
    allow_missing: bool = typer.Option(False, "--allow-missing", help="Baseline cells absent from the run do not fail the gate."),
    allow_option_changes: bool = typer.Option(False, "--allow-option-changes", help="Judge cells whose options (task options, dtype, attn_impl, seed) differ from the baseline's instead of refusing them as not comparable (exit 2)."),
    across_seeds: bool = typer.Option(False, "--across-seeds", help="The run and the baseline used different --seed on purpose (a reproduction check): a different seed does not make cells incomparable; other options still do. Pair it with --tolerance interval=on."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_out_arg, callback=_results_out("compare"), help="Where compare.csv and compare.md go (default: RUN_DIR/compare)."),
):
    """Gate a run on a baseline (exit 0 when nothing regressed, 1 on a regression, 2 on bad input or cells whose options differ from the baseline's), or check two runs of one model through two backends for parity (RUN_DIR RUN_B: exit 1 when a required check differs)."""
    from lctx.harness.outputs.compare import Rules, compare_dirs, load_rules, parse_aliases, parse_tolerances, print_report, write_report  # lazy: loads pandas

    if other is not None:
        if baseline is not None:
            raise LctxError("give either --baseline (gate a run on a baseline) or a second run RUN_B (backend parity), "
                            "not both")
        _parity(run_dir, other, load_rules(rules) if rules is not None else Rules(), parity_models, out)
        return
    if baseline is None:
        raise LctxError("lctx compare needs --baseline BASELINE_DIR (a gate) or a second run folder (backend parity); "
                        "e.g. lctx compare RUN --baseline results/baselines/pydoc-tiny-rope")

    try:
        r = load_rules(rules) if rules is not None else Rules()
        cli_rules = parse_tolerances(tolerance or [])
        cli_rules.alias = parse_aliases(alias or [])
        cmp = compare_dirs(run_dir, baseline, r.merged(cli_rules), allow_missing=allow_missing,
                           allow_option_changes=allow_option_changes, across_seeds=across_seeds)
        out = out if out is not None else run_dir / "compare"
        check_writable_dir(out)
        print_report(cmp)
        csv, md = write_report(cmp, out)
    except LctxError:
        raise
    except Exception as e:  # noqa: BLE001 - exit 1 means "regression" to CI: a crash must never read as one
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise LctxError(f"lctx compare could not compare {str(run_dir)!r} with {str(baseline)!r} "
                        f"({type(e).__name__}: {first}); check both run directories' summary.csv") from None
    say(f"wrote {csv} and {md}")
    if cmp.exit_code == EXIT_USAGE:  # nothing regressed, but cells measured other things than the baseline's
        raise LctxError(f"{count(cmp.counts['incomparable'], 'cell')} not comparable with the baseline, made with other "
                        f"options ({' | '.join(cmp.option_notes())}); rerun with the baseline's options (its run.json, "
                        "results.csv) or pass --allow-option-changes")
    raise typer.Exit(cmp.exit_code)


def _parity(run_a: Path, run_b: Path, rules, models: Optional[str], out: Optional[Path]) -> None:
    """``lctx compare RUN_A RUN_B``: print the parity table's verdict and the samples that differ, write
    parity.csv / parity.md, exit 1 when a required check differs (:mod:`lctx.harness.outputs.parity`)."""
    from lctx.harness.outputs.parity import CHECKS, parity, write_parity  # lazy: loads pandas
    from lctx.harness.run.console import print_table  # lazy: loads rich

    pair = None
    if models is not None:
        if models.count("=") != 1 or not all(models.split("=")):
            raise LctxError(f"--parity-models {models!r} is not A=B; write e.g. --parity-models smollm2-hf=smollm2")
        pair = tuple(models.split("="))
    p = parity(run_a, run_b, rules.parity, pair)
    out = out if out is not None else run_a / "parity"
    check_writable_dir(out)
    differ = p.table[(p.table[list(CHECKS)] == "differ").any(axis=1)]
    cols = ["task", "length", "depth", "sample", *CHECKS, "max_logprob_diff"]
    if len(differ):
        print_table(cols, differ[cols].head(40).values.tolist(), title="samples that differ (first 40)",
                    right=["length", "depth", "sample", "max_logprob_diff"])
    lp = p.table["max_logprob_diff"].dropna()
    say(p.verdict() + (f"; largest log-probability difference {lp.max():.3g} nats" if len(lp) else ""))
    csv, md = write_parity(p, out)
    say(f"wrote {csv} and {md}")
    raise typer.Exit(p.exit_code)


convert_app = typer.Typer(cls=_Group, help="Convert checkpoints from other formats into Hugging Face directories.", no_args_is_help=True)
app.add_typer(convert_app, name="convert")


@convert_app.command("llama2c")
def convert_llama2c(
    src: Path = typer.Argument(..., metavar="SRC", help="llama2.c checkpoint .bin (legacy, version 1 or version 2 export)."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-z", help="llama2.c tokenizer .bin (e.g. tok512.bin)."),
    out: Path = typer.Option(..., "--out", "-o", parser=_out_arg, callback=_checked_out, help="Directory to write the Hugging Face LlamaForCausalLM into."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a checkpoint already in --out (refused without it)."),
):
    """Convert a llama2.c checkpoint and its tokenizer into a Hugging Face Llama directory (safetensors)."""
    check_checkpoint_out(out, overwrite, "convert llama2c")
    from lctx.models.convert import convert_llama2c as convert_fn  # lazy: loads torch, transformers

    path = convert_fn(src, tokenizer, out)
    typer.echo(f"wrote {path} (LlamaForCausalLM + tokenizer); run it with `lctx run --model {path}`")


@convert_app.command("gguf")
def convert_gguf(
    src: Path = typer.Argument(..., help="GGUF file (.gguf), e.g. a llama.cpp Q4_1 / Q8_0 / K-quant checkpoint."),
    out: Path = typer.Option(..., "--out", "-o", parser=_out_arg, callback=_checked_out, help="Directory to write the Hugging Face checkpoint into."),
    dtype: str = typer.Option(DTYPE, "--dtype", help="Dtype of the dequantised weights: float32, bfloat16 or float16."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a checkpoint already in --out, whole (refused without it)."),
):
    """Dequantise a GGUF checkpoint (transformers' GGUF support) into a Hugging Face directory (safetensors + tokenizer with its chat template)."""
    check_checkpoint_out(out, overwrite, "convert gguf", whole_dir=True)  # it replaces --out whole (rmtree)
    from lctx.models.adapters.gguf import convert_gguf as convert_fn  # lazy: +7 ms (hashlib, tempfile) to lctx.cli's import (-X importtime)
    from lctx.model_files import find_gguf  # lazy: +7 ms (hashlib, tempfile) to lctx.cli's import (-X importtime)

    if not src.exists():
        raise LctxError(f"{str(src)!r} does not exist; pass the path of a .gguf file (or a folder holding one)")
    gguf_file = find_gguf(src)
    if gguf_file is None:
        raise LctxError(f"{str(src)!r} is not a .gguf file (nor a directory holding one); pass the GGUF file")
    path = convert_fn(gguf_file, out, dtype=dtype)
    typer.echo(f"wrote {path} (dequantised to {dtype}); run it with `lctx run --model {path}`")


@app.command()
def data(
    out: Optional[Path] = typer.Option(None, "--out", "-o", envvar="LCTX_DATA_DIR", parser=_data_out_arg, callback=_checked_out, help="The data folder to fill (the --data-dir of later runs), e.g. ../shared/data, the layout the README's examples read. Default: $LCTX_DATA_DIR."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated groups to fetch (default: all; `lctx data --list`), e.g. ruler,mmlu."),
    mirror: Optional[str] = typer.Option(None, "--mirror", help="A base URL standing in for https://raw.githubusercontent.com (the same OWNER/REPO/COMMIT/PATH layout), e.g. a local copy served on 127.0.0.1. PyPI wheels come through pip and its own settings (PIP_INDEX_URL)."),
    list_groups: bool = typer.Option(False, "--list", help="List the groups (files, size, licence) and exit."),
    check: bool = typer.Option(False, "--check", help="Check the files already in --out against the manifest (no network) and exit: 1 when one is missing or differs."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
):
    """Fetch the evaluation data (RULER's haystack and word lists, books, WikiText, MMLU, ARC, small checkpoints) from
    its public sources into --out, each file checked against lctx's checksum manifest; rerun to resume."""
    from lctx.harness.commands import data as D  # light: httpx and rich load only to fetch
    from lctx.harness.run.console import print_table  # light

    groups = D.load_manifest()
    names = D.pick_groups(groups, only)
    if list_groups:
        rows = [[n, len(g["entries"]), f"{sum(e.size for e in g['entries']) / 1e6:.1f} MB", g["what"], g["license"]]
                for n, g in groups.items() if n in names]
        print_table(["group", "files", "size", "what", "licence"], rows, right=["files", "size"])
        return
    if out is None:
        raise LctxError("lctx data needs --out DIR (the folder to fill, e.g. ../shared/data) or LCTX_DATA_DIR")
    if out.exists() and not out.is_dir():
        raise LctxError(f"--out {str(out)!r} is a file; give a folder (it is created when missing)")
    entries = [e for n in names for e in groups[n]["entries"]]
    if check:
        ok, missing, bad = D.status(out, entries)
        shown = 10  # the first few by name; the count says the rest
        for e in (missing + bad)[:shown]:
            say(f"{'missing' if e in missing else 'differs'}: {e.path}")
        if len(missing + bad) > shown:
            say(f"... and {len(missing + bad) - shown} more")
        part = f" --only {only}" if only else ""
        say(f"{out}: {len(ok)} of {len(entries)} files match the manifest"
            + (f"; {len(missing)} missing, {len(bad)} differ: `lctx data --out {out}{part}` fetches them"
               if missing or bad else ""))
        if missing or bad:
            raise typer.Exit(1)
        return
    size = sum(e.size for e in entries) / 1e6
    say(f"lctx data: {len(entries)} files ({size:.1f} MB) of {', '.join(names)} into {out}")
    got = D.fetch(out, entries, mirror=mirror, progress=progress, log=say)
    say(f"{out}: {got['fetched']} files fetched ({got['bytes'] / 1e6:.1f} MB), {got['kept']} already there; every "
        f"file matches the manifest; provenance in {out / D.PROVENANCE}. Licences: `lctx data --list`. Use it with "
        f"--data-dir {out} (or LCTX_DATA_DIR)")


@app.command()
def bench(
    variants: Optional[str] = typer.Option(None, "--variants", help="Comma-separated variants (default: all of `lctx list variants`); +ssmax compositions allowed."),
    lengths: str = typer.Option("1k,4k,16k,64k", "--lengths", "-l", help="Sequence lengths in tokens (k = 1024)."),
    heads: int = typer.Option(1, "--heads", help="Attention heads H."),
    head_dim: int = typer.Option(64, "--head-dim", help="Head dim D."),
    batch: int = typer.Option(1, "--batch", help="Batch size B."),
    impl: str = typer.Option(",".join(ATTN_IMPLS[::-1]), "--impl", help=f"attn_impl values to time: {', '.join(ATTN_IMPLS[::-1])}."),
    device: str = typer.Option(DEVICE, "--device", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option(DTYPE, "--dtype", help="float32, bfloat16 or float16."),
    repeats: int = typer.Option(5, "--repeats", help="Interleaved rounds: each times SDPA causal and the variant back to back."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed calls of each function before measuring (compilation happens there)."),
    min_time: float = typer.Option(0.1, "--min-time", min=0.0, help="Seconds each timing spans at least: a faster call is repeated within the timing (timeit's autorange; 0: one call per timing)."),
    option: List[str] = typer.Option(None, "--option", help="Variant option KEY=VALUE (repeatable), e.g. lsh_samples=16."),
    isolate: Optional[bool] = typer.Option(None, "--isolate/--in-process", help="One fresh process per variant (default on CPU)."),
    threads: Optional[str] = typer.Option(None, "--threads", help="Intra-op threads of the measuring processes, e.g. 1 or 1,2 (several: measured in the same interleaved rounds, one row each; default: torch's)."),
    busy: int = typer.Option(0, "--busy", min=0, help="Run this many CPU-bound processes beside the measurement (a loaded machine on purpose)."),
    mem_limit: Optional[str] = typer.Option(None, "--mem-limit", help="Skip measurements estimated above this size (e.g. 16g; default 80% of free RAM / 90% of GPU memory)."),
    time_budget: float = typer.Option(300.0, "--time-budget", help="Skip a measurement predicted to take longer than this (seconds, all calls)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Instead of one layer: a whole checkpoint's chunked prefill per --impl x length, each in a fresh process, with peak RSS against `lctx plan`."),
    chunk_size: int = typer.Option(CHUNK_SIZE, "--chunk-size", min=1, help="--model: prefill chunk in tokens."),
    warmup_tokens: int = typer.Option(0, "--warmup-tokens", min=0, help="--model: prefill this many tokens before measuring (kernel compilation)."),
    out: Path = typer.Option(Path("lctx-bench"), "--out", "-o", parser=_out_arg, callback=_results_out("bench"), help="Output directory (bench.parquet/csv, exponents.csv, ratios.md, bench.png)."),
):
    """Time one attention layer forward per variant x impl x length, alternately with SDPA causal: ratios (median, min), peak memory, exponents. With --model: a whole-model prefill against the memory plan."""
    length_list = parse_lengths(lengths)
    impls = [i.strip() for i in impl.split(",") if i.strip()]
    bad = [i for i in impls if ATTN_IMPL_REGISTRY.get_interface(i) is None]
    if bad:
        raise LctxError(f"unknown attention implementation {bad[0]!r}; use {', '.join(ATTN_IMPLS[::-1])}")
    thread_list = None
    if threads is not None:
        try:
            thread_list = [int(t) for t in threads.split(",") if t.strip()]
        except ValueError:
            thread_list = [0]
        if not thread_list or min(thread_list) < 1:
            raise LctxError(f"--threads {threads!r} is not a list of positive integers; write e.g. --threads 1,2")
    if model is not None:
        from lctx.harness.commands.bench import print_prefill, run_prefill_bench  # lazy: loads torch, transformers, triton

        if "--impl" not in sys.argv and impl == ",".join(ATTN_IMPLS[::-1]):
            impls = ["sdpa", "fast"]
        table, exps = run_prefill_bench(model, impls, length_list, chunk=chunk_size, warmup_tokens=warmup_tokens,
                                        threads=thread_list[0] if thread_list else None,
                                        log=lambda s: say(s, err=True))
        print_prefill(table, exps)
        out.mkdir(parents=True, exist_ok=True)  # after the measurements: a rejected command leaves nothing
        table.to_csv(out / "prefill.csv", index=False)
        exps.to_csv(out / "prefill_exponents.csv", index=False)
        typer.echo(f"wrote {out / 'prefill.csv'} and {out / 'prefill_exponents.csv'}")
        return
    _light_models()  # a misspelt --variants is refused from the registry alone (2 s, not 10 s)
    from lctx.models import VARIANTS  # lazy: loads torch (lctx.models)
    from lctx.models.variants import get_variant  # lazy: loads torch (lctx.models)

    if variants is not None:  # an empty item (--variants "", "rope,") is a mistake, not "all variants"
        names = split_list(variants, "--variants", "--variants rope,alibi (see `lctx list variants`)")
    else:
        names = sorted(VARIANTS)
    for name in names:
        try:
            get_variant(name)
        except KeyError as e:
            raise LctxError(f"--variants: {e.args[0]}; see `lctx list variants`") from None
    from lctx.harness.commands.bench import print_bench, run_bench, write_bench  # lazy: loads torch, transformers, triton
    from lctx.models.adapters.memory import parse_bytes  # lazy: loads torch

    table, exps = run_bench(names, impls, length_list, heads=heads, head_dim=head_dim, batch=batch, device=device,
                            dtype=dtype, repeats=repeats, warmup=warmup, options=parse_options(option or []),
                            isolate=isolate, mem_limit=parse_bytes(mem_limit) if mem_limit else None,
                            time_budget=time_budget, threads=thread_list, busy=busy, min_time=min_time,
                            log=lambda s: say(s, err=True))
    print_bench(table, exps)
    for p in write_bench(table, exps, out):
        typer.echo(f"wrote {p}")


@app.command("gpu-check")
def gpu_check(
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_out_arg, callback=_checked_out, help="Folder for the log and one table per step: at most 6 files (what the device tool brings back); new, empty, or an earlier gpu-check's. Required unless --estimate."),
    rehearse: bool = typer.Option(False, "--rehearse", help="Every step at tiny sizes on CPU (Triton's interpreter), under 2 minutes: the script is known to run before a GPU lease starts."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Only these steps, comma-separated: kernel_tests, prior_vs_flex, chunk_split, prefill_512k, real_models."),
    budget: Optional[float] = typer.Option(None, "--budget", min=10, help="Seconds for all steps (default: the steps' budgets, 470 s; rehearsal 115 s)."),
    show_estimate: bool = typer.Option(False, "--estimate", help="Print the written-down time estimate per step (FLOPs, bytes, compiles on an H200) and exit."),
):
    """The GPU lease script: kernel tests on CUDA, fused prior kernel vs FlexAttention, the chunk split vs its reference, a 512K prefill per variant, real model shapes lean vs masked; each step under a time budget, each table written as it fills (docs/kernels-and-bench.md#on-a-gpu)."""
    from lctx.harness.commands.gpu_check import estimate_table, run_check  # lazy: lctx --help need not parse it

    if show_estimate:
        typer.echo(estimate_table())
        raise typer.Exit(0)
    if out is None:
        raise LctxError("--out is required: the folder for the log and the tables, e.g. --out \"$OUT\"")
    raise typer.Exit(run_check(out, rehearse=rehearse, steps=steps, budget_s=budget, echo=say))


@app.command()
def plan(
    model: str = typer.Option(str(DEFAULT_MODEL), "--model", "-m", help="Checkpoint directory (lctx or Hugging Face config.json)."),
    length: str = typer.Option("512k", "--length", "-l", help="Prompt length in tokens (k = 1024)."),
    chunk_size: int = typer.Option(CHUNK_SIZE, "--chunk-size", min=1, help="Prefill chunk in tokens."),
    dtype: str = typer.Option(DTYPE, "--dtype", help="float32, bfloat16 or float16."),
    device: str = typer.Option(DEVICE, "--device", help="cpu, cuda, cuda:N or auto: whose memory to compare with."),
    attn_impl: Optional[str] = typer.Option(None, "--attn-impl", help="fast, sdpa or reference (default: fast, the lean path)."),
    kept_logits: int = typer.Option(1, "--kept-logits", min=0, help="Positions whose logits are kept (1: generation; the window for ppl)."),
    batch: int = typer.Option(1, "--batch", min=1, help="Rows prefilled together."),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", help="Plan for this much memory instead of the device's (e.g. 141g)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Run Python code shipped with a Hugging Face checkpoint (auto_map) to read its config. Off by default."),
):
    """Print the expected peak memory of a chunked prefill (weights, KV cache, activations) and refuse one that cannot fit."""
    T = parse_lengths(length)
    if len(T) != 1:
        raise LctxError(f"--length {length!r} names {len(T)} lengths; pass one, e.g. --length 512k")
    from lctx.model_files import check_model_path  # light: checks before torch loads
    from lctx.harness.args import check_run_options  # light: checks before torch loads

    model_dir = check_model_path(model)  # a hub id: its snapshot in the local Hugging Face cache
    check_run_options(dtype=dtype, device=device, attn_impl=attn_impl)
    from lctx.models.adapters import memory as P  # lazy: loads torch

    override = P.parse_bytes(device_memory) if device_memory else None
    if override is None:
        from lctx.models.adapters.devices import resolve_device  # lazy: loads torch

        import torch  # lazy: loaded by lctx.models.adapters.memory already

        # plan for a GPU you lack: docs/kernels-and-bench.md#plan-memory-lctx-plan
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise LctxError(f"--device {device}: this machine has no CUDA GPU whose memory plan could read; to plan "
                            f"for a GPU you lack give its memory, e.g. --device {device} --device-memory 80g (or "
                            "--device cpu to plan for this machine)")
        device = str(resolve_device(device))
    cfg = P.load_config(model_dir, trust_remote_code=trust_remote_code)
    shown = Path(model).resolve()  # a hub id OWNER/NAME: NAME
    shown = shown.stem if shown.suffix.lower() == ".gguf" else shown.name  # as `lctx run` names the model
    if attn_impl is not None:
        from lctx.models.adapters.hf import check_attn_impl  # lazy: loads torch, transformers

        check_attn_impl(attn_impl, cfg, shown)  # e.g. SDPA on a soft-capped model: refused
    mp = P.plan_memory(cfg, T[0], chunk_size=chunk_size, dtype=dtype, impl=attn_impl, batch=batch,
                       kept_logits=kept_logits, name=shown,
                       device="cuda" if str(device).startswith("cuda") or (override is not None and device == "auto")
                       else "cpu")
    room, source = P.device_memory(device, override)
    rows = [[r["component"], f"{r['bytes']:,}", f"{r['GiB']:.3f}", r["formula"]] for _, r in mp.table().iterrows()]
    print_table(["component", "bytes", "GiB", "formula"], rows, right=("bytes", "GiB"),
                title=f"memory plan: {mp.model}, {mp.length:,} tokens, chunk {mp.chunk_size}, {mp.dtype}, "
                      f"attn_impl {mp.impl} ({mp.attn_path})")
    for note in mp.notes:
        say(f"note: {note}")
    typer.echo(f"device: {P.gib(room)} ({source})")
    P.check_fits(mp, room, source)
    typer.echo(f"fits: {P.gib(mp.total)} of {P.gib(room)}")


@app.command()
def report(
    run_dirs: List[Path] = typer.Argument(..., metavar="RUN_DIR", help="Run directories written by lctx run (one or more)."),
    out: Path = typer.Option(Path("lctx-report"), "--out", "-o", parser=_out_arg, callback=_results_out("report", run_dir_ok=False), help="Where report.html, report.md, plots/ and summary.csv go."),
    at: Optional[str] = typer.Option(None, "--at", help="Lengths of the summary's retrieval columns: multiples of the training length (4x) or tokens (2k). Default 1x,2x,8x; the tested lengths when no model has a training length."),
    title: Optional[str] = typer.Option(None, "--title", help="Page title."),
    train_length: List[str] = typer.Option(None, "--train-length", help="Training length in tokens for models whose runs record none (a GGUF's): N for all of them, or MODEL=N (repeatable)."),
):
    """Write one extrapolation report (HTML with embedded plots, Markdown, PNGs, summary.csv) from run directories."""
    from lctx.harness.outputs.report import build_report, parse_train_lengths  # lazy: loads pandas, matplotlib

    res = build_report([str(d) for d in run_dirs], out, at=at, title=title,
                       train_lengths=parse_train_lengths(train_length or []))
    disp = res["summary_table"].drop(columns=["runs"], errors="ignore")  # the runs: summary.csv and the page
    print_frame(disp, right=[c for c in disp.columns if c != "model"])
    for note in res["notes"]:
        say(f"note: {note}")
    for answer in res.get("answers", []):  # per base model of several positional methods: which extends it, how far
        say(answer)
    say(f"wrote {res['html']}, {res['markdown']}, {res['summary']}, {res['failures']} and {len(res['plots'])} plots")


@app.command("list")
def list_(
    what: str = typer.Argument(..., metavar="WHAT", help="tasks, metrics, variants, positions or backends"),
    task_file: List[Path] = typer.Option(None, "--task-file", help="Python file defining extra tasks (repeatable), listed too."),
):
    """List the tasks `lctx run --tasks` accepts, the metrics they report (registered in lctx.metrics, with their
    source), the attention variants and modifiers `lctx train --variant` accepts, or the positional methods
    `lctx run --position` accepts (with their options and sources)."""
    if what == "tasks":
        from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived names); lazy: loads lctx.tasks and numpy
        from lctx.tasks import load_entry_point_tasks, load_task_file, task_catalog  # lazy: loads lctx.tasks and numpy

        load_entry_point_tasks()
        for tf in task_file or []:
            load_task_file(str(tf))
        print_table(["task", "description", "metrics", "data (under --data-dir)"],
                    [[t.name, t.description, ", ".join(t.metrics), t.requires or "none declared"] for t in task_catalog()])
    elif what == "metrics":
        from lctx.harness.steps import flatness, ruler  # noqa: F401  (register the derived names); lazy: loads lctx.tasks and numpy
        from lctx.metrics import METRICS, label  # lazy: +3 ms to lctx.cli's import (-X importtime)
        from lctx.tasks import load_entry_point_tasks, load_task_file, task_catalog  # lazy: loads lctx.tasks and numpy

        load_entry_point_tasks()
        for tf in task_file or []:
            load_task_file(str(tf))
        used: dict[str, list[str]] = {}
        for t in task_catalog():
            for m in t.metrics:  # RULER's eight NIAH tasks as one entry
                name = "niah_*" if t.name.startswith("niah_") else t.name
                used.setdefault(m, []) if name in used.get(m, []) else used.setdefault(m, []).append(name)
        print_table(["metric", "better", "tasks", "what it is (source)"],
                    [[label(m.name), m.direction, ", ".join(used.get(m.name, [])), m.summary]
                     for m in sorted(METRICS.values(), key=lambda m: m.name)])
    elif what == "variants":
        _light_models()
        from lctx.models import MODIFIERS, VARIANTS, get_variant  # lazy: loads torch (lctx.models)
        from lctx.models.options import OPTIONS_VERSION, option_schema  # lazy: loads torch (lctx.models)

        takes = sorted(n for n, c in VARIANTS.items() if getattr(c, "composable", True))

        def defaults(name: str) -> dict:  # what a new model computes with (config's options_version)
            cls = MODIFIERS[name] if name in MODIFIERS else get_variant(name)
            return cls.option_defaults(OPTIONS_VERSION)

        def options(name: str, modifier: bool = False) -> str:
            own = defaults(name)
            out = []
            for k, o in (option_schema(name) or {}).items():
                d = own.get(k, o.default)
                per_base = {b: v for b in takes if modifier
                            for v in [defaults(f"{b}+{name}").get(k, d)] if v != d}  # e.g. ssmax_scale_bias on ggd_bam
                out.append(f"{k}=<{o.describe(d, per_base)}>")
            return ", ".join(out)

        rows = [[name, cls.summary, options(name)] for name, cls in sorted(VARIANTS.items())]
        for name, cls in sorted(MODIFIERS.items()):  # e.g. rope+ssmax
            rows.append([f"+{name}", f"{cls.summary}; a modifier: add it to a softmax variant "
                                     f"({', '.join(takes)}), e.g. --variant rope+{name}", options(name, True)])
        print_table(["variant", "what it is", "options (--option KEY=VALUE; typed, others refused)"], rows)
    elif what == "positions":
        _light_models()
        from lctx.models.position import POSITION_METHODS  # lazy: loads torch (lctx.models)
        from lctx.models.position.base import _describe  # lazy: loads torch (lctx.models)

        rows = [["shipped", "-", "the checkpoint as it ships (the default)", "", ""]]
        for name, cls in sorted(POSITION_METHODS.items()):
            opts = ", ".join(f"{k}=<{_describe(o)}>" for k, o in cls.options.items())
            rows.append([name, cls.kind, cls.summary, opts or "none", cls.source])
        print_table(["method", "kind", "what it is", "options (--position NAME:KEY=VALUE,...)", "source"], rows)
    elif what == "backends":
        from lctx.harness.backends import backends  # light: no torch

        print_table(["backend", "what it runs (--model [NAME:]LOCATION)", "per-model arguments (-M KEY=VALUE,...)",
                     "--position"],
                    [[b.name, b.summary, ", ".join(f"{k} ({t.__name__})" for k, (t, h) in b.options.items())
                      or "none", "yes" if b.positions else "no (in the server)"] for b in backends().values()])
    else:
        raise LctxError(f"cannot list {what!r}; use `lctx list tasks`, `lctx list metrics`, `lctx list variants`, "
                        "`lctx list positions` or `lctx list backends`")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or torchrun's stop), raised like Ctrl-C so finished work is kept and what was kept
    is printed (:func:`_interrupted`)."""


_SIGNAL = {"term": False}


def _on_sigterm(signum, frame):
    _SIGNAL["term"] = True
    raise Terminated()


#: What an interrupted command leaves behind, by command: only ``lctx run`` resumes (its records are written as
#: samples finish); ``lctx train`` writes its checkpoint at the end only.
_KEPT = {
    "run": "finished samples are kept: rerun the same command to resume",
    "train": "nothing was saved (lctx train writes its checkpoint only when it ends, and does not resume): "
             "rerun the command to train from step 0",
}
_KEPT_OTHER = "its output may be missing or incomplete: rerun the command"


def _command_of(argv: list[str] | None) -> str | None:
    """The command ``argv`` (``sys.argv[1:]`` when None) names: its first word that is not an option."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not str(a).startswith("-")]
    return str(words[0]) if words else None


def _interrupted(command: str | None = None) -> int:
    """Print what an interrupted ``command`` kept (:data:`_KEPT`) on stderr; return 143 (SIGTERM) or 130."""
    term = _SIGNAL["term"]
    print(f"{'terminated (SIGTERM)' if term else 'interrupted'}; {_KEPT.get(command, _KEPT_OTHER)}",
          file=sys.stderr)
    return 143 if term else 130


for _typer_app in (app, diagnose_app, convert_app):  # every command gets the whole-help class
    for _info in _typer_app.registered_commands:
        if _info.cls in (None, typer.core.TyperCommand):
            _info.cls = _Command


def _help_format() -> None:
    """``--help`` as rich panels on a terminal; off one (a log, a pipe) as click's plain text, which wraps
    long help instead of cutting option names and defaults to ``…`` (rich's panels are 80 columns there)."""
    mode = "rich" if table_format() == "rich" else None
    for a in (app, diagnose_app, convert_app):
        a.rich_markup_mode = mode


def _bad_value(e: Exception) -> str | None:
    """One line naming the problem and the fix for an option value typer refused (``--samples 0``: "--samples 0
    is below the minimum 1; pass --samples 1 or more"), from the validation error typer raises it from (typer
    >= 0.2x checks values with pydantic: ``errors()`` of ``e.__cause__``); ``None`` when that is unknown."""
    param, cause = getattr(e, "param", None), e.__cause__
    errors = cause.errors() if callable(getattr(cause, "errors", None)) else None
    opts = [o for o in (getattr(param, "opts", None) or []) if o.startswith("--")]
    if not (errors and opts and isinstance(errors[0], dict)):
        return None
    err, name = errors[0], opts[0]
    value, bound = err.get("input"), err.get("ctx") or {}
    cmd = getattr(getattr(getattr(e, "ctx", None), "command", None), "name", None)
    helps = f"`lctx {cmd} --help`" if cmd else "`lctx --help`"
    kind = err.get("type")
    if kind == "greater_than_equal":
        return f"{name} {value} is below the minimum {bound['ge']}; pass {name} {bound['ge']} or more"
    if kind == "greater_than":
        return f"{name} {value} is not above {bound['gt']}; pass {name} above {bound['gt']}"
    if kind == "less_than_equal":
        return f"{name} {value} is above the maximum {bound['le']}; pass {name} {bound['le']} or less"
    if kind == "less_than":
        return f"{name} {value} is not below {bound['lt']}; pass {name} below {bound['lt']}"
    if kind in ("int_parsing", "int_from_float"):
        return f"{name} {value!r} is not a whole number; pass one, e.g. {name} 2 (see {helps})"
    if kind == "float_parsing":
        return f"{name} {value!r} is not a number; pass one, e.g. {name} 0.5 (see {helps})"
    return None


def _help_of(e: Exception) -> str:
    """The help command of the (sub)command a usage error ``e`` came from: ``lctx run --help`` for ``lctx run
    --num_fewshot 3``, ``lctx diagnose far-mass --help``; ``lctx --help`` for a mistake in the command's name."""
    path = getattr(getattr(e, "ctx", None), "command_path", None) or "lctx"
    return f"{path} --help"


class _PipeSafe:
    """A text stream (``sys.stdout`` / ``sys.stderr``) that redacts every write (:func:`lctx.outside.redact`: the API
    key and credential patterns, whichever code printed them: the second line of defence behind the sinks' own
    redaction) and whose reader may go away (``lctx report ... | head -1``): the
    first write or flush that meets a closed pipe (BrokenPipeError) points the stream's file descriptor at
    /dev/null (Python's recipe: https://docs.python.org/3/library/signal.html#note-on-sigpipe) and the command
    goes on quietly: its files are written and it exits with its own status. A stream with no file descriptor
    (captured in tests) drops the rest of its output. Everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream, self.broken = stream, False

    def _closed(self) -> None:
        self.broken = True
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)  # the buffered rest is flushed into /dev/null, at exit too
        os.close(devnull)

    def write(self, text):
        if self.broken and not self._has_fd():
            return len(text)
        try:
            self._stream.write(redact(text))  # every secret lctx holds, whatever printed it
            return len(text)
        except BrokenPipeError:
            self._closed()
            return len(text)

    def flush(self) -> None:
        if self.broken and not self._has_fd():
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._closed()

    def _has_fd(self) -> bool:
        try:
            self._stream.fileno()
            return True
        except (AttributeError, OSError, ValueError):
            return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


def uncaught_text(exc: BaseException) -> str:
    """What the ``lctx`` console script prints of an exception no handler caught (a bug): Python's traceback of it,
    redacted, control characters escaped and capped (:func:`lctx.outside.cap`), since its message may quote a
    server's reply or a file."""
    import traceback  # lazy: only a crash needs it

    return cap("".join(traceback.format_exception(exc)), 20_000)


def _redacted_excepthook(kind, exc, tb) -> None:
    """``sys.excepthook`` of the console script: :func:`uncaught_text` on stderr (exit status 1, as Python's)."""
    if exc.__traceback__ is None:
        exc = exc.with_traceback(tb)
    sys.stderr.write(uncaught_text(exc) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lctx`` console script: run the typer app, turn user errors into one line.

    Returns (and exits with) 0 on success, 1 when ``lctx compare`` finds a regression, 2 on a user error
    or damaged input (LctxError or a bad option: one ``error:`` line; ``lctx compare``'s cells made with other
    options than the baseline's), 3 when every sample of an ``lctx run`` failed, 130 on Ctrl-C and 143 on
    SIGTERM (both print what was kept: `lctx run` resumes). A reader of stdout/stderr that goes away changes none of these
    (:class:`_PipeSafe`).
    """
    if argv is None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    if argv is None:  # the console script: a bug's traceback is printed redacted, escaped and bounded
        sys.excepthook = _redacted_excepthook
    _SIGNAL["term"] = False
    passive_omp_wait()  # every command, before any loads torch (docs/kernels-and-bench.md#threads)
    _help_format()
    streams = sys.stdout, sys.stderr
    # a reader that goes away: docs/troubleshooting.md#pipes
    sys.stdout, sys.stderr = _PipeSafe(sys.stdout), _PipeSafe(sys.stderr)
    try:
        code = _main(argv)
    finally:
        sys.stdout.flush(), sys.stderr.flush()  # a pipe closed before anything was flushed: found here, quietly
        sys.stdout, sys.stderr = streams
    if argv is None:
        sys.exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    """:func:`main`'s body: the command's exit status."""
    # typer >= 0.20 vendors click (typer._click); older typer raises click's own exceptions.
    usage_errors = tuple({getattr(typer, "TyperException", click.ClickException), click.ClickException})
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="lctx")
        code = rv if isinstance(rv, int) else 0
        if code == 130:  # typer turns Ctrl-C (and our SIGTERM) into a returned 130: say what was kept
            code = _interrupted(_command_of(argv))
    except (LctxError, ServerReplyError) as e:  # a served model's reply outside any sample: one line too
        say(f"error: {e}", err=True)  # redacted, control characters escaped, capped
        code = EXIT_USAGE
    except (typer.Exit, click.exceptions.Exit) as e:
        code = _interrupted(_command_of(argv)) if e.exit_code == 130 else e.exit_code
    except (KeyboardInterrupt, typer.Abort, click.exceptions.Abort):
        code = _interrupted(_command_of(argv))
    except usage_errors as e:
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        if type(e).__name__ == "NoArgsIsHelpError":
            print(msg, file=sys.stderr)  # the help text
        else:
            line = _bad_value(e) or f"{' '.join(msg.split()).rstrip('.')}; see `{_help_of(e)}`"
            say(f"error: {line}", err=True)
        code = EXIT_USAGE
    return code


if __name__ == "__main__":
    main()
