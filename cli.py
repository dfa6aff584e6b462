"""The ``lctx`` command line (typer): ``lctx run``, ``lctx train``, ``lctx list``.

User mistakes raise :class:`lctx.harness.errors.LctxError`; :func:`main` prints them as one line
(``error: ...``) on stderr and exits with status 2, never with a traceback.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import List, Optional

import click
import typer

from lctx.harness.errors import LctxError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="lctx: does a model really use context longer than it was trained on?")

DEFAULT_MODEL = Path(__file__).resolve().parent / "models" / "checkpoints" / "pydoc-tiny-rope"
DEFAULT_DEPTHS = "0,0.25,0.5,0.75,1"


def parse_lengths(text: str) -> list[int]:
    """Parse "256,512,1k,4K,512k" into token counts (k = 1024, m = 1024**2).

    Raises:
        LctxError: an entry is not a positive integer (with optional k/m suffix).
    """
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        m = re.fullmatch(r"(\d+)([kKmM]?)", part)
        if not m or int(m.group(1)) <= 0:
            raise LctxError(f"length {part!r} is not a positive integer; write lengths like 256,512,1k,4k")
        out.append(int(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2).lower()])
    if not out:
        raise LctxError("no lengths given; write lengths like --lengths 256,512,1k")
    return out


def parse_depths(text: str) -> list[float]:
    """Parse "0,0.25,0.5" into fractions in [0, 1].

    Raises:
        LctxError: an entry is not a number in [0, 1].
    """
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        try:
            d = float(part)
        except ValueError:
            d = -1.0
        if not 0.0 <= d <= 1.0:
            raise LctxError(f"depth {part!r} is not a fraction in [0, 1]; write depths like 0,0.25,0.5,0.75,1")
        out.append(d)
    if not out:
        raise LctxError("no depths given; write depths like --depths 0,0.5,1")
    return out


def parse_options(items: list[str]) -> dict:
    """Parse ["ggd_shared=false", "lsh_samples=16", "acc_rot_mode=learned"] into a dict; values are read
    as JSON when they parse (numbers, true/false, null), else kept as strings.

    Raises:
        LctxError: an item without "=".
    """
    import json

    out = {}
    for item in items:
        if "=" not in item:
            raise LctxError(f"--option {item!r} is not KEY=VALUE; write e.g. --option lsh_samples=16")
        key, val = item.split("=", 1)
        try:
            out[key.strip()] = json.loads(val)
        except json.JSONDecodeError:
            out[key.strip()] = val
    return out


def check_writable_dir(path: Path) -> None:
    """Create ``path`` if needed and check a file can be written there, before any work starts.

    Raises:
        LctxError: it is a file, under a file, or not writable.
    """
    if str(path) == "":
        raise LctxError("--out is empty; pass a directory for the results, e.g. --out runs/my-run")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".lctx-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise LctxError(f"cannot write to --out {str(path)!r} ({e.strerror or e}); pass a writable directory") from None


def _data_path(p: str, data_dir: Optional[Path]) -> str:
    if os.path.exists(p) or data_dir is None:
        return p
    cand = data_dir / p
    return str(cand) if cand.exists() else p


@app.command()
def run(
    model: List[str] = typer.Option(None, "--model", "-m", help="Checkpoint directory (repeatable). Default: the bundled tiny model."),
    tasks: str = typer.Option("passkey,ppl", "--tasks", "-t", help="Comma-separated task names (see `lctx list tasks`)."),
    task_file: List[Path] = typer.Option(None, "--task-file", help="Python file defining extra tasks (repeatable)."),
    lengths: str = typer.Option("256,512,1k,2k", "--lengths", "-l", help="Context lengths in tokens (k = 1024)."),
    depths: str = typer.Option(DEFAULT_DEPTHS, "--depths", "-d", help="Needle depths, fractions in [0, 1]."),
    samples: int = typer.Option(2, "--samples", "-n", min=1, help="Samples per (length, depth) cell."),
    stride: float = typer.Option(0.5, "--stride", help="ppl: tokens between windows, or a fraction (<= 1) of the window."),
    window: Optional[str] = typer.Option(None, "--window", help="ppl: window sizes in tokens (default: the --lengths)."),
    ppl_data: List[str] = typer.Option(None, "--ppl-data", help="ppl: text files/folders (relative to --data-dir if not found). Default: held-out pydoc topics."),
    ppl_bos: str = typer.Option("prepend", "--ppl-bos", help="ppl BOS policy: prepend (to every window) or none."),
    ppl_short_docs: str = typer.Option("drop", "--ppl-short-docs", help="ppl: drop or count documents shorter than the window."),
    ppl_max_tokens: int = typer.Option(32768, "--ppl-max-tokens", help="ppl: score at most this many tokens per document (0 = all)."),
    key_digits: int = typer.Option(5, "--key-digits", min=1, help="passkey: digits in the key."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", envvar="LCTX_DATA_DIR", help="Root of evaluation data (e.g. ../shared/data)."),
    out: Path = typer.Option(Path("lctx-out"), "--out", "-o", help="Run directory (rerun with the same --out to resume)."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    seed: int = typer.Option(0, "--seed", help="Seed of sample generation."),
    chunk_size: int = typer.Option(2048, "--chunk-size", min=1, help="Prefill chunk in tokens."),
    allow_beyond_max: bool = typer.Option(False, "--allow-beyond-max", help="Run lengths past a checkpoint's declared maximum."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
):
    """Evaluate checkpoints on tasks x lengths x depths; write records.jsonl, results.parquet/csv, summary.csv and plots."""
    from lctx.harness.lm import load_lm
    from lctx.harness.runner import RunSpec, check_lengths, run_sweep
    from lctx.tasks import get_task, load_entry_point_tasks, load_task_file

    if data_dir is not None and not data_dir.is_dir():
        raise LctxError(f"--data-dir {str(data_dir)!r} is not a directory; point it at the evaluation data "
                        "(e.g. ../shared/data) or unset LCTX_DATA_DIR")
    length_list, depth_list = parse_lengths(lengths), parse_depths(depths)
    check_writable_dir(out)
    load_entry_point_tasks()
    for tf in task_file or []:
        load_task_file(str(tf))
    task_names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not task_names:
        raise LctxError("no task given; pass --tasks passkey,ppl (see `lctx list tasks`)")
    task_objs = []
    for name in task_names:
        cls = get_task(name)
        try:
            if name == "ppl":
                task_objs.append(cls(data=[_data_path(p, data_dir) for p in ppl_data] if ppl_data else None,
                                     stride=stride, bos=ppl_bos, short_docs=ppl_short_docs, max_tokens=ppl_max_tokens))
            elif name == "passkey":
                task_objs.append(cls(key_digits=key_digits))
            else:
                task_objs.append(cls())
        except ValueError as e:
            raise LctxError(f"bad option for task {name!r}: {e}") from None
    if window and "ppl" in task_names:
        ppl_lengths = parse_lengths(window)
    else:
        ppl_lengths = None
    if any(t.name == "ppl" for t in task_objs):
        ppl = next(t for t in task_objs if t.name == "ppl")
        ppl.documents()  # fail fast on unreadable data, before any model runs
    paths = list(model) if model else [str(DEFAULT_MODEL)]
    lms = [load_lm(p, device=device, dtype=dtype, chunk_size=chunk_size) for p in paths]
    names = [lm.name for lm in lms]
    if len(set(names)) != len(names):
        for i, lm in enumerate(lms):
            lm.name = f"{lm.name}#{i}"
    for lm in lms:
        check_lengths(lm, length_list + (ppl_lengths or []), allow_beyond_max)
    spec = RunSpec(lengths=length_list, depths=depth_list, samples=samples, seed=seed)
    if ppl_lengths:
        # ppl sweeps its own windows: run it as a separate pass over those lengths
        others = [t for t in task_objs if t.name != "ppl"]
        ppl_task = [t for t in task_objs if t.name == "ppl"]
        if others:
            run_sweep(lms, others, spec, out, progress=progress)
        result = run_sweep(lms, ppl_task, RunSpec(ppl_lengths, depth_list, samples, seed), out, progress=progress)
    else:
        result = run_sweep(lms, task_objs, spec, out, progress=progress)
    _print_summary(result["summary"])
    failed = result["table"][result["table"]["status"] != "ok"]
    if len(failed):
        msgs = failed.drop_duplicates(["model", "task", "length", "depth", "sample"])["error"].value_counts()
        for msg, n in msgs.head(5).items():
            typer.echo(f"failed ({n} samples): {msg}", err=True)
    typer.echo(f"wrote {out}/results.parquet, results.csv, summary.csv ({len(result['table'])} rows; "
               f"{result['ran']} samples run, {result['skipped']} resumed, {result['errors']} errors)")
    for p in result["plots"]:
        typer.echo(f"plot: {p}")


def _print_summary(summary) -> None:
    """Print mean per (model, task, metric, length), averaged over depths, as a rich table."""
    from rich.console import Console
    from rich.table import Table

    if summary.empty:
        return
    g = summary.groupby(["model", "task", "metric", "length"], dropna=False)
    agg = g.apply(lambda d: (d["mean"] * d["n"]).sum() / d["n"].sum() if d["n"].sum() else float("nan"),
                  include_groups=False)
    agg = agg.rename("value").reset_index()
    wide = agg.pivot_table(index=["model", "task", "metric"], columns="length", values="value")
    table = Table(title="mean over depths and samples")
    for c in ["model", "task", "metric"] + [str(c) for c in wide.columns]:
        table.add_column(c, justify="right" if c.isdigit() else "left")
    for idx, row in wide.iterrows():
        if idx[2] in ("n_docs",):
            continue
        table.add_row(*idx, *[("" if v != v else (f"{v:.0f}" if idx[2] == "n_tokens" else f"{v:.3f}")) for v in row])
    Console(stderr=False).print(table)


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
    device: str = typer.Option("auto", "--device"),
    out: Path = typer.Option(..., "--out", "-o", help="Checkpoint directory to write."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
):
    """Train a small model of one variant (tokenizer + AdamW/cosine), write a checkpoint directory."""
    from lctx.harness import textdata
    from lctx.harness.lm import resolve_device
    from lctx.harness.train import train as train_fn

    variant_options = parse_options(option or [])
    check_writable_dir(out)
    docs = textdata.load_corpus(data) if data else textdata.pydoc_corpus("train")
    dev = resolve_device(device)
    train_fn(docs, out, variant=variant, context_length=context_length, hidden_size=hidden_size,
                       num_layers=layers, num_heads=heads, vocab_size=vocab_size, steps=steps,
                       batch_size=batch_size, lr=lr, warmup_steps=warmup, eval_every=eval_every,
                       val_fraction=val_fraction, seed=seed, device=str(dev), progress=progress,
                       variant_options=variant_options,
                       log=typer.echo)


diagnose_app = typer.Typer(help="Diagnostics: learned GGD prior shapes, attention far-mass.", no_args_is_help=True)
app.add_typer(diagnose_app, name="diagnose")


@diagnose_app.command("prior")
def diagnose_prior(
    model: str = typer.Option(..., "--model", "-m", help="A ggd_bam checkpoint directory."),
    out: Path = typer.Option(Path("lctx-diagnostics"), "--out", "-o"),
    max_distance: Optional[int] = typer.Option(None, "--max-distance", help="Largest distance plotted (tokens; default 8x train length)."),
):
    """Plot each head's learned GGD-BAM prior exp(b(d)) vs distance, coloured by beta; write prior_params.csv."""
    from lctx.harness.diagnostics import plot_priors, prior_table
    from lctx.harness.lm import load_lm

    lm = load_lm(model, device="cpu")
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
    distance: Optional[int] = typer.Option(None, "--distance", help="Far means farther than this many tokens (default: half the training length)."),
    data: Optional[str] = typer.Option(None, "--data", help="Text file to run (default: held-out pydoc topics)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", envvar="LCTX_DATA_DIR"),
    queries: int = typer.Option(32, "--queries", min=1, help="Last queries averaged per length."),
    device: str = typer.Option("auto", "--device"),
    out: Path = typer.Option(Path("lctx-diagnostics"), "--out", "-o"),
):
    """Share of attention mass beyond a distance as the context grows (seed 004's near/far mass)."""
    import pandas as pd

    from lctx.harness import textdata
    from lctx.harness.diagnostics import far_mass, plot_far_mass
    from lctx.harness.lm import load_lm

    length_list = parse_lengths(lengths)
    docs = textdata.load_corpus([_data_path(data, data_dir)]) if data else textdata.pydoc_corpus("heldout")
    text = "\n\n".join(t for _, t in docs)
    frames = []
    for path in model:
        lm = load_lm(path, device=device)
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


@app.command("list")
def list_(what: str = typer.Argument(..., help="tasks or variants")):
    """List registered tasks or attention variants."""
    if what == "tasks":
        from lctx.tasks import TASKS, load_entry_point_tasks

        load_entry_point_tasks()
        for name, cls in sorted(TASKS.items()):
            typer.echo(f"{name:12s} {cls.description}  metrics: {', '.join(cls.metrics)}")
    elif what == "variants":
        from lctx.models import VARIANTS

        for name, cls in sorted(VARIANTS.items()):
            typer.echo(f"{name:12s} {cls.summary}")
    else:
        raise LctxError(f"cannot list {what!r}; use `lctx list tasks` or `lctx list variants`")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``lctx`` console script: run the typer app, turn user errors into one line.

    Returns (and exits with) 0 on success, 2 on a user error (LctxError or a bad option), 130 on Ctrl-C.
    """
    # typer >= 0.20 vendors click (typer._click); older typer raises click's own exceptions.
    usage_errors = tuple({getattr(typer, "TyperException", click.ClickException), click.ClickException})
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="lctx")
        code = rv if isinstance(rv, int) else 0
    except LctxError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except (typer.Exit, click.exceptions.Exit) as e:
        code = e.exit_code
    except (KeyboardInterrupt, typer.Abort, click.exceptions.Abort):
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        code = 130
    except usage_errors as e:
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        if type(e).__name__ == "NoArgsIsHelpError":
            print(msg, file=sys.stderr)  # the help text
        else:
            print(f"error: {' '.join(msg.split()).rstrip('.')}; see `lctx --help`", file=sys.stderr)
        code = 2
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
