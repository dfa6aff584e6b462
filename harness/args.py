"""Argument parsing and checks shared by the ``lctx`` commands and :func:`lctx.evaluate`: length, depth and
option lists as users write them, task options, writable output directories. Light: imports nothing heavy.

Every function raises :class:`lctx.errors.LctxError` with a one-line message naming the fix.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import random
import re
import sys
from pathlib import Path
from typing import Optional

from lctx.errors import LctxError, did_you_mean, split_list  # noqa: F401  (did_you_mean re-exported)
from lctx.paths import data_path  # noqa: F401  (re-exported: the CLI's --data-dir lookups)


#: The longest length (tokens) any lctx command accepts: 2**31 (``2048m``). Far past what any device holds (the
#: bundled tiny model's KV cache alone is 2 TiB there, ``lctx plan``), so a longer length is a typo (an extra digit,
#: a pasted number) and is refused in one line before torch loads; past 2**63 (int64 positions) a length would
#: not even fit the results table (F5: pyarrow's OverflowError after 60 s and 6.6 GB).
MAX_LENGTH = 2**31


def check_max_length(lengths, what: str = "length") -> None:
    """Refuse a length above :data:`MAX_LENGTH` tokens (:func:`parse_lengths`; the lengths ``--relative`` makes
    once the training lengths are known, :func:`lctx.harness.evaluate.evaluate`).

    Raises:
        LctxError: a length exceeds it (names the length, the bound and the fix).
    """
    over = [L for L in lengths if L > MAX_LENGTH]
    if over:
        raise LctxError(f"{what} {max(over)} is above {MAX_LENGTH} tokens (2**31, 2048m), the longest lctx runs; "
                        "write lengths like 256,512,1k,4k")


def parse_lengths(text: str) -> list[int]:
    """Parse "256,512,1k,4K,512k" into token counts (k = 1024, m = 1024**2), each at most :data:`MAX_LENGTH`.

    Raises:
        LctxError: an entry is not a positive integer (with optional k/m suffix), is empty ("256,,512"), or is
            above :data:`MAX_LENGTH` (:func:`check_max_length`).
    """
    out = []
    for part in split_list(text, "the length list", "--lengths 256,512,1k"):
        m = re.fullmatch(r"(\d+)([kKmM]?)", part)
        if not m or int(m.group(1)) <= 0:
            raise LctxError(f"length {part!r} is not a positive integer; write lengths like 256,512,1k,4k")
        out.append(int(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2}[m.group(2).lower()])
    check_max_length(out)
    return out


#: The most depths ``--depths random:N`` draws (each is a row of every task's grid); at most :data:`DEPTH_VALUES`, the
#: distinct depths a draw can give at :data:`DEPTH_DECIMALS` decimals.
MAX_RANDOM_DEPTHS = 1000
#: the decimals a random depth is rounded to (so a table's depth is the depth run)
DEPTH_DECIMALS = 4
#: the distinct depths a random draw can give: 0, 0.0001, ..., 1
DEPTH_VALUES = 10**DEPTH_DECIMALS + 1

#: The most samples per cell (``--samples``, ``lctx.evaluate(samples=)``): at 10 000 samples the 95 % interval of a
#: 0/1 metric's mean is at most +-1 percentage point (1.96 * sqrt(0.25 / 10 000) = 0.0098); more buys nothing a
#: table shows, and ``--samples 1000000000`` took 6 GB in 33 s before any check. A run's grid as a
#: whole is bounded too (:data:`lctx.tasks.base.MAX_CELLS`).
MAX_SAMPLES = 10_000


def random_depths(n: int, seed: int = 0) -> list[float]:
    """``n`` distinct needle depths drawn uniformly from [0, 1] (``--depths random:N``), as RULER samples a depth per
    prompt instead of a fixed grid (Hsieh et al. 2024; its ``niah.py`` draws each sample's depth at random): a pure
    function of (n, seed), ``random.Random(f"depths|{n}|{seed}")``, each draw rounded to :data:`DEPTH_DECIMALS`
    decimals (so a table's depth is the depth run), drawn until ``n`` distinct ones are found (a repeat is drawn
    again: two draws that round alike would otherwise leave fewer than ``n``), sorted. With ``lctx run --seed S`` the
    draw is seeded by S; ``run.json`` records the drawn list (``depths``) and the seed. A seed whose ``n`` first draws
    are distinct gives those (the list drawn before repeats were drawn again).

    Raises:
        LctxError: ``n`` is not a whole number from 1 to :data:`DEPTH_VALUES` (more distinct depths than the rounding
            has).
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= DEPTH_VALUES:
        raise LctxError(f"random:{n!r}: a random depth list holds 1 to {DEPTH_VALUES} distinct depths (depths are "
                        f"rounded to {DEPTH_DECIMALS} decimals); write e.g. --depths random:10")
    rng = random.Random(f"depths|{n}|{seed}")
    out: set[float] = set()
    while len(out) < n:  # ends: n <= DEPTH_VALUES, and every value has a chance of at least 1/20000 a draw
        out.add(round(rng.random(), DEPTH_DECIMALS))
    return sorted(out)


def parse_depths(text: str, seed: int = 0) -> list[float]:
    """Parse "0,0.25,0.5" into fractions in [0, 1]; "random:N" draws N distinct depths (:func:`random_depths`, seeded
    by ``seed``).

    Raises:
        LctxError: an entry is not a number in [0, 1], or is empty ("0,,1"); N is not a whole number from 1 to
            :data:`MAX_RANDOM_DEPTHS`.
    """
    t = str(text).strip()
    if t.lower().startswith("random"):
        n = t.split(":", 1)[1].strip() if ":" in t else ""
        if not n.isdigit() or not 1 <= int(n) <= MAX_RANDOM_DEPTHS:
            raise LctxError(f"--depths {t!r}: write random:N with N a whole number from 1 to {MAX_RANDOM_DEPTHS} "
                            "(e.g. --depths random:10), or a list like 0,0.5,1")
        return random_depths(int(n), seed)
    out = []
    for part in split_list(text, "the depth list", "--depths 0,0.5,1"):
        try:
            d = float(part)
        except ValueError:
            d = -1.0
        if not 0.0 <= d <= 1.0:
            raise LctxError(f"depth {part!r} is not a fraction in [0, 1]; write depths like 0,0.25,0.5,0.75,1")
        out.append(d)
    return out


def parse_options(items: list[str]) -> dict:
    """Parse ["ggd_shared=false", "lsh_samples=16", "acc_rot_mode=learned"] into a dict; values are read
    as JSON when they parse (numbers, true/false, null), else kept as strings.

    Raises:
        LctxError: an item without "=".
    """

    out = {}
    for item in items:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise LctxError(f"--option {item!r} is not KEY=VALUE; write e.g. --option lsh_samples=16")
        key, val = item.split("=", 1)
        try:
            out[key.strip()] = json.loads(val)
        except json.JSONDecodeError:
            out[key.strip()] = val
    return out


def parse_task_options(items: list[str], task_names: list[str]) -> dict[str, dict]:
    """Parse ``--task-option`` items ["niah_single_1.match=digits", ...] into {task: {key: value}} (values as
    in :func:`parse_options`).

    Raises:
        LctxError: an item is not TASK.KEY=VALUE, or names a task that is not in ``task_names``.
    """
    out: dict[str, dict] = {}
    for item in items:
        head = item.split("=", 1)[0]
        if "=" not in item or "." not in head or not all(p.strip() for p in head.split(".", 1)):
            raise LctxError(f"--task-option {item!r} is not TASK.KEY=VALUE; write e.g. "
                            "--task-option niah_single_1.match=digits")
        task, rest = item.split(".", 1)
        task = task.strip()
        if task not in task_names:
            raise LctxError(f"--task-option {item!r} names task {task!r}, which is not in --tasks "
                            f"({', '.join(task_names) or 'none'}); add it to --tasks or drop the option")
        out.setdefault(task, {}).update(parse_options([rest]))
    return out


def task_option_names(cls) -> list[str]:
    """The keyword options a task class's constructor names (``**kwargs`` catch-alls not counted)."""

    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def check_task_options(name: str, cls, opts: dict) -> None:
    """Refuse options a task does not name.

    Raises:
        LctxError: an unknown key (the message lists the valid ones).
    """
    valid = task_option_names(cls)
    for key in opts:
        if key not in valid:
            raise LctxError(f"--task-option {name}.{key}: task {name!r} has no option {key!r}; "
                            f"valid options: {', '.join(valid) or 'none'}")


def check_writable_dir(path: Path, create: bool = False, flag: str = "--out") -> None:
    """Check, before any work starts, that a file can be written in ``path``: an existing directory gets a
    probe file (removed again); a missing one must have a writable existing ancestor, and is created only
    with ``create`` (so a command rejected later leaves no empty directory behind). ``flag``: the option the
    message names (``--out``; ``--cache-dir`` or ``LCTX_CACHE_DIR``).

    Raises:
        LctxError: it is a file, under a file, or not writable.
    """
    if str(path) == "":
        raise LctxError(f"{flag} is empty; pass a directory" + (" for the results, e.g. --out runs/my-run"
                                                               if flag == "--out" else ""))
    fix = "pass a writable directory"
    try:
        if not path.exists() and not create:
            anc = path.absolute().parent
            while not anc.exists():
                anc = anc.parent
            if not anc.is_dir():
                raise LctxError(f"cannot write to {flag} {str(path)!r} ({str(anc)!r} is a file); {fix}")
            if not os.access(anc, os.W_OK | os.X_OK):
                raise LctxError(f"cannot write to {flag} {str(path)!r} ({str(anc)!r} is not writable); {fix}")
            _probe_create(path, anc)  # os.access says yes to root everywhere (/proc/x): try it for real
            return
        if path.exists() and not path.is_dir():
            raise LctxError(f"cannot write to {flag} {str(path)!r} (it is a file, not a directory); {fix}")
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".lctx-write-test-{os.getpid()}"  # per process: torchrun ranks probe the same --out
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise LctxError(f"cannot write to {flag} {str(path)!r} ({e.strerror or e}); {fix}") from None


#: Files whose presence makes a directory a checkpoint (``save_pretrained``, ``lctx train``, ``lctx convert``).
CHECKPOINT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                    "tokenizer.json", "train_log.json")

#: files that mark an ``lctx run`` output directory (:mod:`lctx.harness.run.runner`): its metadata and records, the
#: per-rank records of a sharded run stopped before they merged, its lock, and lm-eval's request caches
RUN_DIR_FILES = ("run.json", "records.jsonl", "records.rank*.jsonl", ".lctx.lock", "partial")


def checkpoint_files(path: Path) -> list[str]:
    """The :data:`CHECKPOINT_FILES` present in ``path`` (empty: no checkpoint there)."""
    return [f for f in CHECKPOINT_FILES if (path / f).exists()]


def run_dir_files(path: Path) -> list[str]:
    """The :data:`RUN_DIR_FILES` patterns that match something in ``path`` (empty: not an ``lctx run`` directory)."""
    return [f for f in RUN_DIR_FILES if any(path.glob(f))]


def check_results_out(path: Path, command: str, run_dir_ok: bool = True) -> None:
    """Refuse, before any work starts, a results ``--out`` (``lctx run``, ``report``, ``bench``, ``compare``,
    ``diagnose``) that is a checkpoint folder: files written among the weights become part of the checkpoint's
    content fingerprint (every top-level file a loader might read is hashed), so the model would look new and
    every later run would redo it. With ``run_dir_ok=False`` (``lctx report``), also an ``lctx run`` directory,
    whose own ``summary.csv`` the command would replace.

    Raises:
        LctxError: ``path`` holds checkpoint files (:data:`CHECKPOINT_FILES`), or run files (``run_dir_ok`` False).
    """
    if not path.is_dir():
        return
    held = checkpoint_files(path)
    if held:
        raise LctxError(f"--out {str(path)!r} is a checkpoint folder ({', '.join(held)}); lctx {command} would write "
                        "its results among the weights and change the model's fingerprint: pass another --out")
    run_files = run_dir_files(path)
    if run_files and not run_dir_ok:
        raise LctxError(f"--out {str(path)!r} is an lctx run directory ({', '.join(run_files)}); lctx {command} would "
                        f"replace its summary.csv: pass another --out, e.g. {str(path / command)!r}")


def check_checkpoint_out(path: Path, overwrite: bool, command: str, whole_dir: bool = False) -> None:
    """Refuse, before any work starts, an ``--out`` that already holds a checkpoint (``lctx train``, ``lctx
    convert``): writing there would silently replace trained weights. ``overwrite`` (``--overwrite``) allows it.
    ``whole_dir``: the command replaces the directory whole (``lctx convert gguf``), so a non-empty directory
    that is not a checkpoint is refused even with ``overwrite`` (its files would be deleted).

    Raises:
        LctxError: ``path`` is an ``lctx run`` directory (:data:`RUN_DIR_FILES`; even with ``overwrite``), holds
            checkpoint files (without ``overwrite``), or other files (``whole_dir``).
    """
    if not path.is_dir():
        return
    run_files = run_dir_files(path)
    if run_files:  # even with --overwrite: results and their records would share a folder with new weights
        raise LctxError(f"--out {str(path)!r} is an lctx run directory ({', '.join(run_files)}); lctx {command} "
                        "writes a checkpoint: pass another --out, e.g. a new folder beside it")
    held = checkpoint_files(path)
    if held and not overwrite:
        raise LctxError(f"--out {str(path)!r} already holds a checkpoint ({', '.join(held)}); pass another --out, "
                        f"or `lctx {command} ... --overwrite` to replace it")
    if whole_dir and not held and any(path.iterdir()):
        raise LctxError(f"--out {str(path)!r} is a folder of other files, and lctx {command} replaces its --out "
                        "whole; pass a new or empty directory")


def _probe_create(path: Path, anc: Path) -> None:
    """Check that the missing directory ``path`` could be made below its existing ancestor ``anc``: make a directory
    of this process's own there (``.lctx-write-test-PID``), write a probe file in it and remove both again, so a
    directory that cannot really be made is refused now and a rejected command still leaves nothing behind. The
    probe is per process, not ``path`` itself: torchrun's ranks check the same missing ``--out`` at once, and one
    rank's clean-up removed the directory another was probing (a flaky "File exists" / "No such file" refusal).

    Raises:
        OSError: the directory or the file cannot be created (the caller words it).
    """
    probe_dir = anc / f".lctx-write-test-{os.getpid()}"
    probe_dir.mkdir()
    try:
        (probe_dir / "probe").write_text("")
        (probe_dir / "probe").unlink()
    finally:
        try:
            probe_dir.rmdir()
        except OSError:
            pass


def chat_options(system_prompt: Optional[str]) -> dict:
    """The task options that record ``--chat-template on`` (and the system prompt) in every record; with
    the template off nothing is added, so runs from before the option resume as they were."""
    return {"chat_template": "on", **({"system_prompt": system_prompt} if system_prompt is not None else {})}


def parse_batch_size(value) -> "int | str":
    """``--batch-size``: a positive integer (int or digits) or ``"auto"`` (:func:`lctx.harness.run.runner.batches`).

    Raises:
        LctxError: anything else (one line naming the fix).
    """
    t = str(value).strip().lower()
    if t == "auto":
        return "auto"
    if not isinstance(value, bool) and t.isdigit() and int(t) >= 1:
        return int(t)
    raise LctxError(f"--batch-size {value!r} is not a positive integer nor auto; write e.g. --batch-size 4")


#: The smallest vocabulary ``lctx train`` can train (:func:`lctx.models.tokenizer.train_tokenizer`): its 3 special
#: tokens (``<pad>``, ``<s>``, ``</s>``) plus the 256 byte symbols. Here, so that it is checked before torch loads.
MIN_VOCAB_SIZE = 3 + 256

#: the ``lctx train`` flag of each :func:`lctx.harness.commands.train.train` argument :func:`check_train_args` checks
TRAIN_FLAGS = {"context_length": "--context-length", "hidden_size": "--hidden-size", "num_layers": "--layers",
               "num_heads": "--heads", "vocab_size": "--vocab-size", "steps": "--steps", "batch_size": "--batch-size",
               "lr": "--lr", "warmup_steps": "--warmup", "eval_every": "--eval-every", "val_fraction": "--val-fraction",
               "retrieval_fraction": "--retrieval-fraction", "retrieval_min_length": "--retrieval-min-length"}


def check_train_args(*, context_length, hidden_size, num_layers, num_heads, vocab_size, steps, batch_size, lr,
                     warmup_steps, eval_every, val_fraction, min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0,
                     eval_batches=8, retrieval_fraction=None, retrieval_min_length=None) -> None:
    """The numbers of ``lctx train`` (:func:`lctx.harness.commands.train.train`'s arguments; ``retrieval_fraction`` and
    ``retrieval_min_length``: its :class:`~lctx.harness.commands.train.RetrievalMix`'s), checked without torch: ``lctx
    train`` calls it before anything loads, :func:`lctx.harness.commands.train.train` again. Sizes and counts are positive
    integers, ``context_length`` in [2, :data:`MAX_LENGTH`], ``hidden_size`` a multiple of ``num_heads``,
    ``vocab_size`` at least :data:`MIN_VOCAB_SIZE`, ``warmup_steps`` >= 0, ``lr`` positive and finite,
    ``min_lr_ratio`` and ``retrieval_fraction`` in [0, 1], ``val_fraction`` in (0, 1), ``weight_decay`` and
    ``grad_clip`` >= 0. Each message names the argument, its ``lctx train`` flag (:data:`TRAIN_FLAGS`) and the fix.

    Raises:
        LctxError: the first value out of range.
    """
    def flag(name: str) -> str:
        return f" ({TRAIN_FLAGS[name]})" if name in TRAIN_FLAGS else ""

    def whole(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    for name, value in [("context_length", context_length), ("hidden_size", hidden_size),
                        ("num_layers", num_layers), ("num_heads", num_heads), ("vocab_size", vocab_size),
                        ("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every),
                        ("eval_batches", eval_batches)]:
        if not whole(value) or value <= 0:
            raise LctxError(f"{name} must be a positive integer, got {value!r}; pass a value >= 1{flag(name)}")
    if context_length < 2:
        raise LctxError(f"context_length must be at least 2 (BOS + one token), got {context_length}"
                        f"{flag('context_length')}")
    if context_length > MAX_LENGTH:
        raise LctxError(f"context_length {context_length} is above {MAX_LENGTH} tokens (2**31), the longest lctx "
                        f"runs; pass a training window in tokens, e.g. 256{flag('context_length')}")
    if hidden_size % num_heads:
        raise LctxError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}; "
                        f"pick a head count that divides the width (--hidden-size, --heads)")
    if vocab_size < MIN_VOCAB_SIZE:
        raise LctxError(f"vocab_size {vocab_size} is too small{flag('vocab_size')}; pass at least {MIN_VOCAB_SIZE} "
                        "(3 special tokens + 256 bytes)")
    if not whole(warmup_steps) or warmup_steps < 0:
        raise LctxError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}{flag('warmup_steps')}")
    if not (number(lr) and math.isfinite(lr) and lr > 0):
        raise LctxError(f"lr must be a positive number, got {lr!r}; pass e.g. 3e-3{flag('lr')}")
    if not (number(min_lr_ratio) and 0.0 <= min_lr_ratio <= 1.0):
        raise LctxError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
    if not (number(weight_decay) and weight_decay >= 0):
        raise LctxError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if not (number(grad_clip) and grad_clip >= 0):
        raise LctxError(f"grad_clip must be >= 0 (0 disables clipping), got {grad_clip!r}")
    if not (number(val_fraction) and 0.0 < val_fraction < 1.0):
        raise LctxError(f"val_fraction must be in (0, 1), got {val_fraction!r}; e.g. 0.05 holds out 5% of "
                        f"every document{flag('val_fraction')}")
    if retrieval_fraction is not None and not (number(retrieval_fraction) and 0.0 <= retrieval_fraction <= 1.0):
        raise LctxError(f"retrieval fraction must be in [0, 1], got {retrieval_fraction!r}; e.g. 0.5 makes half "
                        f"the training windows retrieval documents{flag('retrieval_fraction')}")
    if retrieval_min_length is not None and (not whole(retrieval_min_length) or retrieval_min_length < 1):
        raise LctxError(f"retrieval_min_length must be a positive number of tokens, got {retrieval_min_length!r}; "
                        f"pass e.g. 64, or leave it out for half the context{flag('retrieval_min_length')}")


#: the ``--dtype`` names (:data:`lctx.models.adapters.devices.DTYPES` maps them to torch dtypes)
DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
#: torch's device types (``torch.device`` accepts these names, with an optional ``:N``)
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "meta", "hpu", "xla", "ipu", "mtia", "maia", "hip", "ve", "lazy",
                "vulkan", "privateuseone")


def check_run_options(dtype: Optional[str] = None, device: Optional[str] = None, attn_impl: Optional[str] = None,
                      attn_override: Optional[str] = None, train_length: Optional[int] = None) -> None:
    """The checks of ``--dtype``, ``--device``, ``--attn-impl``, ``--attn-override`` and ``--train-length``
    that need no torch, so that ``lctx run`` / ``lctx plan`` answer these mistakes before torch loads (the
    same lines the later, torch-side checks give).

    Raises:
        LctxError: an unknown dtype, device type, attention path or override (or a bad override option),
            a training length that is not a positive number of tokens up to :data:`MAX_LENGTH`.
    """
    from lctx.attn_impl import ATTN_IMPL_REGISTRY  # light: no torch

    if dtype is not None and dtype not in DTYPE_NAMES:
        raise LctxError(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16")
    if device is not None and device != "auto":
        m = re.fullmatch(r"([a-z_]+)(:\d+)?", str(device))
        if not m or m.group(1) not in DEVICE_TYPES:
            raise LctxError(f"unknown device {device!r}; use cpu, cuda, cuda:N or auto")
    if attn_impl is not None and ATTN_IMPL_REGISTRY.get_interface(attn_impl) is None:
        raise LctxError(f"unknown --attn-impl {attn_impl!r}; use {', '.join(ATTN_IMPL_REGISTRY)}")
    if attn_override:
        from lctx.override_spec import parse_override  # light: no torch

        parse_override(attn_override)
    if train_length is not None and (isinstance(train_length, bool) or not isinstance(train_length, int)
                                     or train_length < 1):
        raise LctxError(f"--train-length {train_length} is not a positive number of tokens; pass e.g. "
                        "--train-length 4096")
    if train_length is not None and train_length > MAX_LENGTH:
        raise LctxError(f"--train-length {train_length} is above {MAX_LENGTH} tokens (2**31), the longest lctx runs; "
                        "pass the length the model was trained at, e.g. --train-length 4096")


def check_positions(positions, models=(), warn=None) -> list[str]:
    """``--position`` / ``lctx.evaluate(positions=...)`` as a list of spec strings, checked without torch: None is
    ``["shipped"]``, one string is one spec, a list its items (repeats dropped, ``warn`` told); each spec's syntax
    and method name (:func:`lctx.position_spec.split_position`: a misspelt method with the closest name, two methods
    stacked with ``+``); and a method other than ``shipped`` only on models whose backend takes one (``models``:
    :class:`lctx.harness.backends.ModelSpec` s; ``Backend.positions``): a served model's positional code runs in its
    server, an adapter object is loaded already. The options are checked against each method's
    schema before any model loads (:func:`lctx.models.position.base.parse_position`).

    Raises:
        LctxError: the first problem found (one line naming the fix)."""
    from lctx.position_spec import SHIPPED, split_position  # light: no torch

    if positions is None:
        return [SHIPPED]
    items = [positions] if isinstance(positions, str) else list(positions)
    bad = next((p for p in items if not isinstance(p, str)), None)
    if bad is not None or not items:
        raise LctxError(f"positions={positions!r} names no positional method; pass strings such as 'shipped' or "
                        "'yarn:factor=4' (--position), or leave it out (None) for the models as shipped")
    names = [split_position(p)[0] for p in items]
    out = list(dict.fromkeys(p.strip() for p in items))
    if len(out) < len(items) and warn:
        warn(f"note: --position repeats ({', '.join(items)}); each runs once")
    methods = [p for p, n in zip(items, names) if n != SHIPPED]
    if methods:  # which models take a method is their backend's to say (Backend.positions), read by the caller
        listed = [models] if isinstance(models, (str, Path)) or hasattr(models, "encode") else list(models or [])
        for m in listed:
            obj = m.given if hasattr(m, "given") else m  # a resolved ModelSpec (lctx.harness.backends) or a model
            if not isinstance(obj, (str, Path)):
                m = obj
                raise LctxError(f"--position {methods[0]}: model {getattr(m, 'name', m)!r} is an adapter object, "
                                "loaded already; pass its checkpoint path (lctx loads it once per method), or "
                                "load_lm(path, position=...) yourself")
            backend = getattr(m, "backend", None) if hasattr(m, "given") else None
            if backend is not None and not backend.positions:
                shown = str(m.location).split(",")[0]
                raise LctxError(f"--position {methods[0]}: a served model's positional code runs in its server (the "
                                f"{backend.name} backend takes no method; --model {shown}); start the server with the method "
                                "(docs/positions.md#served-and-gguf-models) and evaluate it as shipped")
    return out


#: the device nodes under /dev of a GPU ``torch.cuda`` can use: NVIDIA (``nvidia0``...; Jetson: ``nvhost-*``,
#: ``nvmap``), ROCm (``kfd``), WSL (``dxg``)
GPU_DEVICE_NODES = ("nvidia[0-9]*", "nvhost-*", "nvmap", "kfd", "dxg")


def cuda_absent(dev: Path = Path("/dev")) -> bool:
    """True when this machine surely has no GPU ``torch.cuda`` could use, told without importing torch:
    ``CUDA_VISIBLE_DEVICES`` hides every device (empty, or ``-1`` first), macOS, or Linux with none of the
    device nodes a GPU driver makes (:data:`GPU_DEVICE_NODES`) in ``dev``. False when unsure (other systems): torch's own
    check (:func:`lctx.models.adapters.devices.resolve_device`) still follows."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and (not visible.strip() or visible.split(",")[0].strip() == "-1"):
        return True
    if sys.platform == "darwin":
        return True
    if sys.platform.startswith("linux"):
        return not any(any(Path(dev).glob(g)) for g in GPU_DEVICE_NODES)
    return False


def check_device_present(device: Optional[str]) -> None:
    """Refuse ``--device cuda`` / ``cuda:N`` on a machine without a CUDA GPU before torch loads (:func:`cuda_absent`;
    the line :func:`lctx.models.adapters.devices.resolve_device` gives after the imports).

    Raises:
        LctxError: a CUDA device is asked for and this machine surely has none.
    """
    if device is not None and re.fullmatch(r"cuda(:\d+)?", str(device)) and cuda_absent():
        raise LctxError(f"device {device!r} requested but this machine has no CUDA GPU; use --device cpu")


