"""``lctx train``: train a small native lctx model from scratch on a text corpus.

The recipe is the plain GPT-style one, kept small enough to run on a laptop CPU:

1. a byte-level BPE tokenizer with one token per digit (:func:`lctx.models.tokenizer.train_tokenizer`);
2. documents tokenized and joined into one stream with EOS between them; the last ``val_fraction`` of
   every document's tokens is held out (a contiguous tail) as the validation stream;
3. training windows are random crops of ``context_length - 1`` tokens with BOS prepended
   (``[BOS] + text``, ``context_length`` tokens in all), drawn from a seeded ``torch.Generator``;
   optionally a chosen fraction of the windows start with a synthetic retrieval document instead
   (:class:`RetrievalMix`: a passkey or NIAH prompt built by the evaluation task's own code, its answer
   and EOS, then text), so that tiny models learn to retrieve;
4. AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), betas (0.9, 0.95), weight
   decay on matrices only (:func:`param_groups`), linear warmup then cosine decay (Loshchilov & Hutter 2017, "SGDR") to
   ``min_lr_ratio * lr``, global-norm gradient clipping (Pascanu et al. 2013);
5. held-out loss on fixed seeded validation crops every ``eval_every`` steps and at the end;
6. the model, the tokenizer and ``train_log.json`` written to ``out_dir`` (a Hugging Face directory that
   ``lctx run``, ``AutoModelForCausalLM`` and lm-eval load).

The same arguments and seed give the same model, bit for bit, on the same machine and thread count.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import torch
import transformers
from tqdm.auto import tqdm
from transformers.utils import logging as hf_logging

import lctx
from lctx.errors import LctxError
from lctx.tasks import Cell, get_task

from lctx.models import LctxConfig, LctxForCausalLM, get_variant
from lctx.models.tokenizer import floor_tokenizer, save_tokenizer, train_tokenizer
from lctx.harness.args import check_train_args
from lctx.models.adapters.devices import resolve_device
from lctx.models.adapters.hf import TokenizerSide

BOS_ID, EOS_ID, PAD_ID = 1, 2, 0


def lr_at(step: int, *, lr: float, steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup then cosine decay.

    Warmup: lr * (step + 1) / warmup_steps for step < warmup_steps (Goyal et al. 2017). Then a half cosine
    from lr down to min_lr_ratio * lr, reached at the last step (Loshchilov & Hutter 2017, SGDR, eq. 5,
    one cycle without restarts). Returns the rate (same unit as ``lr``).
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(1, steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    min_lr = min_lr_ratio * lr
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def split_streams(token_docs: list[list[int]], val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Split tokenized documents into a training and a validation stream.

    Each document's last ``round(len * val_fraction)`` tokens (at least 1 when the document has 2 or more
    tokens, and never the whole document) go to validation; the heads, and separately the tails, are
    joined with :data:`EOS_ID` between consecutive documents.

    Returns:
        (train, val): 1-D ``torch.long`` tensors of token ids.
    """
    train_parts: list[list[int]] = []
    val_parts: list[list[int]] = []
    for ids in token_docs:
        n = len(ids)
        if n == 0:
            continue
        n_val = int(round(n * val_fraction))
        n_val = min(max(n_val, 1 if n >= 2 else 0), n - 1)
        train_parts.append(ids[: n - n_val])
        if n_val:
            val_parts.append(ids[n - n_val:])

    def join(parts: list[list[int]]) -> torch.Tensor:
        out: list[int] = []
        for i, p in enumerate(parts):
            if i:
                out.append(EOS_ID)
            out.extend(p)
        return torch.tensor(out, dtype=torch.long)

    return join(train_parts), join(val_parts)


def sample_crops(stream: torch.Tensor, n: int, context_length: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` random windows from ``stream``: [BOS] + ``context_length - 1`` consecutive tokens each.

    stream: 1-D long tensor with at least ``context_length - 1`` tokens. Crop starts are uniform over
    every valid offset, drawn from ``generator``. Returns a [n, context_length] long tensor.
    """
    span = context_length - 1
    starts = torch.randint(0, stream.numel() - span + 1, (n,), generator=generator)
    idx = starts[:, None] + torch.arange(span)[None, :]
    bos = torch.full((n, 1), BOS_ID, dtype=torch.long)
    return torch.cat([bos, stream[idx]], dim=1)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: weight decay on weight matrices only.

    A trainable parameter is decayed when it has 2 or more dimensions after squeezing (projections,
    embeddings, convolution kernels) and is not marked ``p._optim = {"weight_decay": 0.0}`` (the
    state-spaces/s4 convention; :mod:`lctx.models.interdomain` marks its SSM parameters, gains and
    biases). Gains, biases and per-head scalars (RMSNorm weights, the GGD-BAM prior, SSMax's s_h) are
    not decayed: GPT-3's rule (Brown et al. 2020) and the BAM reference's ``train.py`` (lines 306-318:
    ``p.squeeze().dim() >= 2 and 'prior' not in n`` decayed, the rest not).

    Returns ``[{"params": decayed, "weight_decay": weight_decay, "names": [...]}, {"params": rest,
    "weight_decay": 0.0, "names": [...]}]`` (``names`` for logs and tests; torch ignores the key).
    """
    decay, no_decay, dn, nn_ = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        wd_off = getattr(p, "_optim", {}).get("weight_decay", None) == 0.0
        if p.squeeze().dim() >= 2 and not wd_off:
            decay.append(p)
            dn.append(name)
        else:
            no_decay.append(p)
            nn_.append(name)
    return [{"params": decay, "weight_decay": weight_decay, "names": dn},
            {"params": no_decay, "weight_decay": 0.0, "names": nn_}]


class TokenizerLM(TokenizerSide):
    """The part of :class:`lctx.models.adapters.hf.HFAdapter` that a task's ``build`` uses (``encode``, ``decode``,
    ``with_bos``, ``prompt``, ``prompt_budget``, ``continuation_ids``: :class:`lctx.models.adapters.hf.TokenizerSide`),
    over a tokenizer alone: training documents are built by the evaluation tasks' own code, so their format
    is the evaluation's, token for token (chat template off, BOS first, no position limit)."""

    def __init__(self, tokenizer, bos_id: int = BOS_ID):
        self.tokenizer, self._bos = tokenizer, bos_id
        self.name, self.add_bos, self.chat_template, self.system_prompt, self.max_length = \
            "training tokenizer", True, False, None, None

    @property
    def bos_id(self) -> int:
        """The BOS id training puts first (``BOS_ID`` unless given)."""
        return self._bos


@dataclass
class RetrievalMix:
    """Synthetic retrieval documents mixed into the training windows.

    fraction: share of training windows (per batch: floor(fraction * batch) windows, plus one more with
        probability equal to the remainder) that begin with a retrieval document.
    tasks: evaluation tasks whose ``build`` makes the documents, drawn uniformly per document:
        ``"passkey"`` (the passkey prompt, random 5-digit key, random depth) and/or RULER NIAH tasks
        (``"niah_single_1"``, ``"niah_multikey_1"``, ...: key-value needles; they need RULER's data,
        ``data_dir`` or ``$LCTX_DATA_DIR``).
    min_length: shortest document in tokens (default: half the context length); lengths are uniform in
        [min_length, context_length], depths uniform in [0, 1].
    seed: seeds keys and haystacks (documents differ from the evaluation's, which uses the run seed and
        integer depths/sample indices, by construction of the task's seeded generators).

    A document is ``[BOS] + prompt + " " + answer + "." + [EOS]`` (the prompt ends with the task's answer
    prefix, e.g. "The pass key is"); the rest of the window is a text crop. Every token is a target.
    """

    fraction: float = 0.0
    tasks: tuple[str, ...] = ("passkey",)
    min_length: int | None = None
    data_dir: str | None = None
    seed: int = 1_000_003
    _built: dict = field(default_factory=dict, repr=False)

    def task(self, name: str):
        """The task instance that builds ``name``'s documents (NIAH without its disk cache).

        Raises:
            LctxError: unknown task, a task that is not passkey or NIAH, or RULER's data missing.
        """
        if name not in self._built:
            cant = LctxError(f"retrieval task {name!r} cannot make training documents; use passkey or a niah_* task")
            try:
                cls = get_task(name)
            except LctxError:
                from lctx.tasks import group_of  # lazy: loads lctx.tasks (already loaded by get_task)

                if group_of(name) is not None:  # a known name that is no sampled task (mmlu, flatness): its
                    raise cant from None  # "unknown task 'mmlu'; known: ... mmlu ..." contradicted itself
                raise
            if name == "passkey":
                self._built[name] = cls()
            elif name.startswith("niah_"):
                self._built[name] = cls(cache=False, data_dir=self.data_dir)
            else:
                raise cant
        return self._built[name]

    def document(self, lm: TokenizerLM, name: str, length: int, depth: float, index: int) -> list[int]:
        """One document of at most ``length`` tokens: [BOS] + prompt + answer + [EOS].

        Raises:
            ValueError: ``length`` cannot hold the task's template.
        """

        task = self.task(name)
        if name == "passkey":
            n_answer = len(lm.encode(" " + "1" * task.key_digits + "."))  # a key of the same width
            sample = task.build(lm, Cell(length - n_answer - 1, depth, index), self.seed)
            answer = lm.encode(" " + sample.meta["key"] + ".")
        else:
            sample = task.build(lm, Cell(length, depth, index), self.seed)
            answer = lm.encode(" " + ", ".join(sample.meta["answer"].split("|")) + ".")
        doc = list(sample.input_ids) + answer + [EOS_ID]
        return doc[:length]

    def record(self) -> dict:
        """The settings, JSON-able (for ``train_log.json``)."""
        d = asdict(self)
        d.pop("_built")
        d["tasks"] = list(self.tasks)
        return d


@torch.no_grad()
def passkey_probe(model, prompts: list[tuple[list[int], list[int], list[int]]], device: torch.device
                  ) -> dict[str, float]:
    """Teacher-forced passkey retrieval of ``model`` on fixed prompts: a cheap learning curve for
    :class:`RetrievalMix` training (``lctx run --tasks passkey`` is the evaluation).

    prompts: ``[(prompt_ids, answer_ids, digit_positions), ...]`` (prompt ending in "The pass key is",
    answer the tokens of " KEY", digit_positions the indices of ``answer_ids`` that carry digits, as
    ``passkey``'s digit_acc counts them). Returns ``{"passkey_tf_digit_acc": fraction of
    key digits ranked first, "passkey_tf_exact": fraction of prompts with every digit ranked first}``.
    """
    was_training = model.training
    model.eval()
    digits, exact = [], []
    for prompt, answer, pos in prompts:
        ids = torch.tensor([prompt + answer], device=device)
        logits = model(input_ids=ids).logits[0]
        at = torch.tensor(pos, device=device)
        ok = logits[len(prompt) - 1 + at].argmax(-1) == ids[0, len(prompt) + at]
        digits.append(ok.float().mean().item())
        exact.append(float(bool(ok.all())))
    model.train(was_training)
    return {"passkey_tf_digit_acc": sum(digits) / len(digits), "passkey_tf_exact": sum(exact) / len(exact)}


def check_retrieval_fits(mix: RetrievalMix, context_length: int, tokenizer=None) -> None:
    """Refuse a retrieval mix whose documents cannot fit a training window: one document of each task at
    ``context_length`` tokens, built with ``tokenizer`` (the trained one), or, before any tokenizer is trained
    (``None``), with :func:`lctx.models.tokenizer.floor_tokenizer`, one token per word: what does not fit then
    fits with no tokenizer ``lctx train`` can train, so the run is refused before its tokenizer training.

    Raises:
        LctxError: a task's template is longer than the window (names it, the counts and the fix).
    """
    lm = TokenizerLM(tokenizer if tokenizer is not None else floor_tokenizer())
    for name in mix.tasks:
        try:
            mix.document(lm, name, context_length, 0.5, 0)
        except ValueError as e:
            if tokenizer is None:
                raise LctxError(f"context_length {context_length} cannot hold a {name} retrieval document even at "
                                f"one token per word, the fewest any trained tokenizer gives ({e}); raise "
                                "--context-length (no --vocab-size makes it fit) or drop that task") from None
            raise LctxError(f"context_length {context_length} cannot hold a {name} retrieval document ({e}); raise "
                            "--context-length or --vocab-size (a larger vocabulary makes the template shorter)") from None


def sample_batch(stream: torch.Tensor, n: int, context_length: int, generator: torch.Generator,
                 mix: RetrievalMix | None = None, lm: TokenizerLM | None = None, counter: list[int] | None = None
                 ) -> torch.Tensor:
    """A training batch [n, context_length] (long): :func:`sample_crops`, with ``mix.fraction`` of the rows
    (the first ones) replaced by a retrieval document followed by a text crop (see :class:`RetrievalMix`).
    ``counter`` ([next document index]) numbers the documents so each gets its own key; all randomness
    comes from ``generator``.
    """
    crops = sample_crops(stream, n, context_length, generator)
    if mix is None or mix.fraction <= 0:
        return crops
    k = int(mix.fraction * n)
    if torch.rand((), generator=generator).item() < mix.fraction * n - k:
        k += 1
    lo = min(context_length, mix.min_length or context_length // 2)
    for r in range(min(k, n)):
        length = int(torch.randint(lo, context_length + 1, (), generator=generator))
        depth = round(float(torch.rand((), generator=generator)), 4)
        name = mix.tasks[int(torch.randint(0, len(mix.tasks), (), generator=generator))]
        idx = counter[0] if counter is not None else r
        if counter is not None:
            counter[0] += 1
        try:
            doc = mix.document(lm, name, length, depth, idx)
        except ValueError:  # too short for the template: use the whole window
            doc = mix.document(lm, name, context_length, depth, idx)
        fill = context_length - len(doc)
        if fill > 0:
            start = int(torch.randint(0, stream.numel() - fill + 1, (), generator=generator))
            doc = doc + stream[start:start + fill].tolist()
        crops[r] = torch.tensor(doc, dtype=torch.long)
    return crops


def _check_args(*, variant, variant_options, retrieval=None, **numbers) -> None:
    """The arguments of :func:`train`: its numbers (and ``retrieval``'s fraction and shortest length) with
    :func:`lctx.harness.args.check_train_args`, the check ``lctx train`` runs before torch loads; the variant.

    Raises:
        LctxError: a value out of range, options that are not a dict, an unknown variant.
    """
    check_train_args(**numbers, **({} if retrieval is None else
                                   dict(retrieval_fraction=retrieval.fraction,
                                        retrieval_min_length=retrieval.min_length)))
    if variant_options is not None and not isinstance(variant_options, dict):
        raise LctxError(f"variant_options must be a dict, got {type(variant_options).__name__}")
    try:
        get_variant(variant)
    except KeyError as e:
        raise LctxError(str(e.args[0]) if e.args else f"unknown attention variant {variant!r}") from None


@torch.no_grad()
def evaluate(model, crops: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Mean next-token NLL (nats per token) of ``model`` on ``crops`` [N, T] (long), in batches of
    ``batch_size``; every crop has the same length, so the mean over batches is the token mean.
    The BOS in position 0 is context only (never a target)."""
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    for i in range(0, crops.shape[0], batch_size):
        x = crops[i:i + batch_size].to(device)
        loss = model(input_ids=x, labels=x).loss
        total += loss.item() * x.shape[0]
        n += x.shape[0]
    model.train(was_training)
    return total / n


def train(
    docs: list[tuple[str, str]],
    out_dir: str | os.PathLike,
    *,
    variant: str = "rope",
    context_length: int = 256,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    vocab_size: int = 2048,
    steps: int = 1000,
    batch_size: int = 16,
    lr: float = 3e-3,
    min_lr_ratio: float = 0.1,
    warmup_steps: int = 50,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    val_fraction: float = 0.05,
    eval_every: int = 200,
    eval_batches: int = 8,
    seed: int = 0,
    device: str = "cpu",
    tie_embeddings: bool = True,
    variant_options: dict | None = None,
    retrieval: RetrievalMix | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
    warn: Callable[[str], None] | None = None,
) -> dict:
    """Train a native lctx model from scratch and write it to ``out_dir`` as a Hugging Face checkpoint.

    Args:
        docs: ``[(name, text), ...]`` documents (e.g. from :func:`lctx.tasks.textdata.load_corpus` or
            :func:`lctx.tasks.textdata.pydoc_corpus`).
        out_dir: output directory (created; existing files of the same names are overwritten). Receives
            ``config.json`` + ``model.safetensors`` (``model.save_pretrained``), ``tokenizer.json`` +
            ``tokenizer_config.json`` and ``train_log.json``.
        variant: attention/positional variant name (see :data:`lctx.models.VARIANTS`).
        context_length: training window in tokens, BOS included (the model sees [BOS] + context_length - 1
            text tokens); recorded as ``config.train_length``.
        hidden_size, num_layers, num_heads: model width d, depth and head count (d % heads == 0).
        vocab_size: BPE vocabulary size asked of the tokenizer (>= 259); the model uses the size the
            tokenizer actually reached.
        steps: optimizer steps; batch_size: windows per step (tokens per step = batch_size * context_length).
        lr: peak learning rate; min_lr_ratio: final lr as a fraction of ``lr``; warmup_steps: linear warmup.
        weight_decay: AdamW decoupled decay, applied to weight matrices only (:func:`param_groups`).
        grad_clip: max global gradient L2 norm (0 disables).
        val_fraction: fraction of every document's tokens (its tail) held out for validation, in (0, 1).
        eval_every: evaluate the held-out loss every this many steps (also before step 1 and at the end).
        eval_batches: number of batches of ``batch_size`` fixed, seeded validation crops per evaluation.
        seed: seeds the model init (``torch.manual_seed``) and the data crops (``torch.Generator``).
        device: torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...). Training is float32.
        tie_embeddings: share the input embedding and the LM head.
        variant_options: extra variant settings stored in ``config.variant_options``.
        retrieval: synthetic retrieval documents mixed into the training windows (:class:`RetrievalMix`),
            or ``None``. The validation loss stays on text crops only.
        progress: show a tqdm bar with the running loss and learning rate.
        log: called with one line of text at every evaluation and at the end (``None``: silent). The
            default ``print`` is routed through ``tqdm.write`` while the bar is shown.
        warn: called with a ``warning: ...`` line, once the arguments are valid, for settings that run but
            are probably a mistake (``warmup_steps >= steps``: the learning rate never decays). Default:
            printed on stderr.

    Returns:
        The dict written to ``train_log.json``: ``args``, ``corpus`` (document names), ``n_docs``,
        ``train_tokens``/``val_tokens`` (stream sizes), ``vocab_size`` (real), ``n_params`` (unique
        parameters), ``evals`` (list of ``{"step", "train_loss", "val_loss", "lr", "elapsed_s"}``, plus
        ``passkey_tf_exact``/``passkey_tf_digit_acc`` (:func:`passkey_probe` on 20 fixed prompts of the
        context length) when ``retrieval`` includes passkey;
        ``train_loss`` is the mean training loss since the previous evaluation, ``None`` at step 0;
        losses in nats per token), ``initial_val_loss``, ``final_val_loss``, ``final_val_ppl``,
        ``wall_seconds`` (whole call), ``train_seconds`` (optimizer steps only), ``tokens_per_second``
        (training tokens / train_seconds), ``torch_version``, ``transformers_version``, ``python_version``,
        ``lctx_version``, ``git_rev`` (the revision of the lctx source that trained, ``-dirty`` when it had
        uncommitted changes; read when training starts), ``device``, ``num_threads``, ``out_dir``; with ``retrieval``, ``retrieval`` (its settings) and
        ``retrieval_docs`` (documents trained on).

    Raises:
        LctxError: a non-positive size or step count, ``hidden_size`` not divisible by ``num_heads``, an
            unknown variant, a bad ``val_fraction``/``lr``/device, no documents, or too little text for one
            training window plus one validation window (the message gives the token counts and the fix).

    Sources: AdamW, Loshchilov & Hutter 2019; cosine schedule, Loshchilov & Hutter 2017 (SGDR); warmup,
    Goyal et al. 2017; betas (0.9, 0.95) and no decay on gains/biases as in GPT-3 (Brown et al. 2020);
    gradient clipping, Pascanu et al. 2013.
    """

    t_start = time.perf_counter()
    from lctx.harness.run.runner import git_revision  # lazy: the revision of the code that is about to train

    code = {"lctx_version": lctx.__version__, "git_rev": git_revision()}
    _check_args(  # first: args below reads variant_options as a dict
        variant=variant, context_length=context_length, hidden_size=hidden_size, num_layers=num_layers,
        num_heads=num_heads, vocab_size=vocab_size, steps=steps, batch_size=batch_size, lr=lr,
        min_lr_ratio=min_lr_ratio, warmup_steps=warmup_steps, weight_decay=weight_decay, grad_clip=grad_clip,
        val_fraction=val_fraction, eval_every=eval_every, eval_batches=eval_batches,
        variant_options=variant_options, retrieval=retrieval)
    args = dict(variant=variant, context_length=context_length, hidden_size=hidden_size, num_layers=num_layers,
                num_heads=num_heads, vocab_size=vocab_size, steps=steps, batch_size=batch_size, lr=lr,
                min_lr_ratio=min_lr_ratio, warmup_steps=warmup_steps, weight_decay=weight_decay,
                grad_clip=grad_clip, val_fraction=val_fraction, eval_every=eval_every,
                eval_batches=eval_batches, seed=seed, device=str(device), tie_embeddings=tie_embeddings,
                variant_options=dict(variant_options or {}),
                retrieval=retrieval.record() if retrieval is not None else None)
    _check_retrieval(retrieval, context_length)
    dev = resolve_device(device)
    docs = _text_docs(docs)
    say = _Say(log, bar_active=progress)

    # --- tokenizer and token streams, model, optimizer -----------------------------------------------
    tokenizer = _fit_tokenizer(docs, vocab_size, val_fraction, retrieval, context_length)
    train_stream, val_stream = _token_streams(docs, tokenizer, val_fraction, context_length)
    model = _build_model(dev, vocab_size=len(tokenizer), seed=seed, variant=variant, variant_options=variant_options,
                         context_length=context_length, hidden_size=hidden_size, num_layers=num_layers,
                         num_heads=num_heads, tie_embeddings=tie_embeddings)
    # after every check that can refuse the run: a refused run prints its error line alone
    _warn_long_warmup(warmup_steps, steps, warn)
    n_params = sum(p.numel() for p in model.parameters())
    opt = _adamw(model, lr, weight_decay)

    # --- data: training batches (text crops, retrieval documents), fixed validation crops --------------
    mix = retrieval if retrieval is not None and retrieval.fraction > 0 else None
    doc_lm, doc_counter = TokenizerLM(tokenizer), [0]
    next_batch = partial(sample_batch, train_stream, batch_size, context_length, torch.Generator().manual_seed(seed),
                         mix, doc_lm, doc_counter)
    val_crops = sample_crops(val_stream, eval_batches * batch_size, context_length,
                             torch.Generator().manual_seed(seed + 1))
    say(f"lctx train: {len(docs)} docs, {train_stream.numel()} train / {val_stream.numel()} val tokens, "
        f"vocab {len(tokenizer)}, {n_params:,} params ({model.variant_parameter_count()} positional), "
        f"variant {variant}, ctx {context_length}, "
        f"{steps} steps x {batch_size}, device {dev}")

    # --- train, evaluating every eval_every steps ----------------------------------------------------
    record = _TrainRecord(model=model, val_crops=val_crops, batch_size=batch_size, dev=dev, steps=steps, say=say,
                          t_start=t_start, probes=_passkey_probes(mix, doc_lm, context_length, seed))
    lr_of = partial(lr_at, lr=lr, steps=steps, warmup_steps=min(warmup_steps, steps), min_lr_ratio=min_lr_ratio)
    final = _optimize(record, opt, next_batch, lr_of, lr=lr, grad_clip=grad_clip, eval_every=eval_every,
                      progress=progress)

    # --- save ---------------------------------------------------------------------------------------
    out = _save(model, tokenizer, out_dir)
    result = _train_log(args, docs, train_stream, val_stream, tokenizer, model, n_params, record, final, dev, out,
                        tokens_trained=steps * batch_size * context_length)
    result.update(code)
    if retrieval is not None:
        result["retrieval"] = retrieval.record()
        result["retrieval_docs"] = doc_counter[0]
    (out / "train_log.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    say(f"done in {result['wall_seconds']:.1f}s ({result['tokens_per_second']} tok/s): val loss "
        f"{record.evals[0]['val_loss']:.4f} -> {final:.4f}; wrote {out}")
    return result


# ---------------------------------------------------------------------------------------------------------------
# the steps of train, in the order it takes them
# ---------------------------------------------------------------------------------------------------------------

def _check_retrieval(retrieval: RetrievalMix | None, context_length: int) -> None:
    """The checks of ``retrieval`` that need no tokenizer, before any work: a task is named, every task is known
    and has its data, and (when the mix is used) each template fits ``context_length`` even at one token per word
    (:func:`check_retrieval_fits` without a tokenizer: refused before the tokenizer trains).

    Raises:
        LctxError: no task given, an unknown task or RULER's data missing, a template that cannot fit.
    """
    if retrieval is None:
        return
    if not retrieval.tasks:
        raise LctxError("no retrieval task given; write e.g. --retrieval passkey or passkey,niah_single_1")
    for name in retrieval.tasks:
        retrieval.task(name)  # unknown task or missing RULER data: the user's mistake, before any work
    if retrieval.fraction > 0:  # a template that fits with no tokenizer: refused before the tokenizer trains
        check_retrieval_fits(retrieval, context_length)


def _text_docs(docs) -> list[tuple[str, str]]:
    """``docs`` as ``[(name as str, text), ...]`` without the documents that are empty or whitespace only.

    Raises:
        LctxError: no document has text.
    """
    docs = [(str(name), text) for name, text in docs if text and text.strip()]
    if not docs:
        raise LctxError("no training text: the corpus has no non-empty documents; pass text files or "
                        "directories of .txt files")
    return docs


class _Say:
    """:func:`train`'s ``log`` as one callable: ``None`` says nothing, ``print`` goes through ``tqdm.write`` while
    the progress bar may be shown (``bar_active``, cleared once the bar is closed), any other callable gets the
    line as it is."""

    def __init__(self, log: Callable[[str], None] | None, bar_active: bool):
        self.log, self.bar_active = log, bar_active

    def __call__(self, msg: str) -> None:
        """Say one line of text."""
        if self.log is None:
            return
        if self.log is print:
            (tqdm.write if self.bar_active else print)(msg)
        else:
            self.log(msg)


def _fit_tokenizer(docs: list[tuple[str, str]], vocab_size: int, val_fraction: float,
                   retrieval: RetrievalMix | None, context_length: int):
    """The BPE tokenizer (:func:`lctx.models.tokenizer.train_tokenizer`, ``vocab_size`` asked) trained on the
    training part only: each document's head by characters, its last ``val_fraction`` left out. A retrieval mix in
    use is checked again with it, exactly (the check before training was a lower bound).

    Raises:
        LctxError: a retrieval template longer than ``context_length`` tokens with this tokenizer.
    """
    head_texts = [text[: max(1, int(len(text) * (1.0 - val_fraction)))] for _, text in docs]
    tokenizer = train_tokenizer(head_texts, vocab_size)
    if retrieval is not None and retrieval.fraction > 0:  # exact now (the check before training: a lower bound)
        check_retrieval_fits(retrieval, context_length, tokenizer)
    return tokenizer


def _token_streams(docs: list[tuple[str, str]], tokenizer, val_fraction: float, context_length: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents tokenized and split into the training and the validation stream (:func:`split_streams`).

    Raises:
        LctxError: either stream is shorter than one window of ``context_length - 1`` tokens (the message gives
            the token counts and the fix).
    """
    backend = tokenizer.backend_tokenizer
    token_docs = [enc.ids for enc in backend.encode_batch([text for _, text in docs], add_special_tokens=False)]
    train_stream, val_stream = split_streams(token_docs, val_fraction)
    n_tokens = sum(len(t) for t in token_docs)
    span = context_length - 1
    if train_stream.numel() < span or val_stream.numel() < span:
        need = int(math.ceil(span / val_fraction)) + span
        raise LctxError(
            f"not enough text: the corpus has {n_tokens} tokens ({train_stream.numel()} for training, "
            f"{val_stream.numel()} held out) but one window needs {span} tokens in each; add text (about "
            f"{need} tokens), lower context_length, or raise val_fraction"
        )
    return train_stream, val_stream


def _build_model(dev: torch.device, *, vocab_size: int, seed: int, variant: str, variant_options: dict | None,
                 context_length: int, hidden_size: int, num_layers: int, num_heads: int,
                 tie_embeddings: bool) -> LctxForCausalLM:
    """A new :class:`lctx.models.LctxForCausalLM` on ``dev`` in training mode, initialised after
    ``torch.manual_seed(seed)``, with the training length ``context_length`` and the ids :data:`BOS_ID`,
    :data:`EOS_ID`, :data:`PAD_ID`.

    Raises:
        LctxError: the variant refuses its options (a bad ``--option`` value).
    """
    torch.manual_seed(seed)
    try:
        cfg = LctxConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, variant=variant, variant_options=variant_options,
                         train_length=context_length, max_position_embeddings=None,
                         tie_word_embeddings=tie_embeddings, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                         pad_token_id=PAD_ID)
        model = LctxForCausalLM(cfg).to(dev)
    except (ValueError, KeyError) as e:  # a bad variant option: report it as the user's mistake
        raise LctxError(f"cannot build a {variant!r} model: {e.args[0] if e.args else e}; check --option values") from None
    model.train()
    return model


def _warn_long_warmup(warmup_steps: int, steps: int, warn: Callable[[str], None] | None) -> None:
    """Warn (``warn``, default stderr) when the warm-up is as long as the run: :func:`lr_at` then ramps for
    min(warmup, steps) steps and the cosine decay never starts."""
    if warmup_steps >= steps:  # lr_at ramps for min(warmup, steps) steps: the cosine decay never starts
        (warn or (lambda m: print(m, file=sys.stderr)))(
            f"warning: warm-up of {warmup_steps} steps >= {steps} steps (--warmup, --steps): the learning rate "
            f"only ramps up and never decays; use a warm-up well below the steps, e.g. {max(1, steps // 10)}")


def _adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (decay on matrices only), betas (0.9, 0.95), eps 1e-8, peak rate ``lr``."""
    groups = [{k: v for k, v in g.items() if k != "names"} for g in param_groups(model, weight_decay)]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def _passkey_probes(mix: RetrievalMix | None, lm: TokenizerLM, context_length: int, seed: int) -> list[tuple]:
    """The fixed held-out prompts of :func:`passkey_probe` when ``mix`` trains passkey (else ``[]``): 20 prompts at
    the full context, depths 0, 0.25, ..., 1 in turn, seeded ``seed + 7``."""
    probes = []
    if mix is not None and "passkey" in mix.tasks:  # fixed held-out passkey prompts at the full context
        pk = mix.task("passkey")
        for i in range(20):
            s = pk.build(lm, Cell(context_length - 1, i % 5 / 4, i), seed + 7)
            answer = lm.encode(" " + s.meta["key"])
            probes.append((s.input_ids, answer,
                           [j for j, t in enumerate(answer) if any(c.isdigit() for c in lm.decode([t]))]))
    return probes


@dataclass
class _TrainRecord:
    """What the training loop keeps: the evaluations so far (``evals``, :func:`train`'s ``train_log.json``), the
    training losses since the last one, and the seconds spent in optimizer steps.

    model, val_crops, batch_size, dev: what :meth:`evaluate_now` evaluates, on what, how; probes: the passkey
    prompts of :func:`passkey_probe` (or none); steps: the run's step count (for the log line); say: the log;
    t_start: :func:`time.perf_counter` when :func:`train` was called (``elapsed_s``).
    """

    model: torch.nn.Module
    val_crops: torch.Tensor
    batch_size: int
    dev: torch.device
    steps: int
    say: _Say
    t_start: float
    probes: list = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    window_losses: list[float] = field(default_factory=list)
    train_seconds: float = 0.0

    def evaluate_now(self, step: int, cur_lr: float) -> float:
        """Evaluate after ``step`` optimizer steps at learning rate ``cur_lr``: the held-out loss (:func:`evaluate`),
        the mean training loss since the last evaluation, the passkey probes; appended to ``evals`` and said in one
        line. Returns the held-out loss (nats per token)."""
        v = evaluate(self.model, self.val_crops, self.batch_size, self.dev)
        tl = sum(self.window_losses) / len(self.window_losses) if self.window_losses else None
        row = {"step": step, "train_loss": tl, "val_loss": v, "lr": cur_lr}
        extra = ""
        if self.probes:
            row.update(passkey_probe(self.model, self.probes, self.dev))
            extra = f"  passkey tf exact {row['passkey_tf_exact']:.2f} digits {row['passkey_tf_digit_acc']:.2f}"
        row["elapsed_s"] = round(time.perf_counter() - self.t_start, 3)
        self.evals.append(row)
        self.window_losses.clear()
        tl_s = f"{tl:.4f}" if tl is not None else "-"
        self.say(f"step {step:>6}/{self.steps}: train {tl_s}  val {v:.4f} (ppl {math.exp(min(v, 50)):.1f})  "
                 f"lr {cur_lr:.2e}" + extra)
        return v


def _optimize(record: _TrainRecord, opt: torch.optim.Optimizer, next_batch: Callable[[], torch.Tensor],
              lr_of: Callable[[int], float], *, lr: float, grad_clip: float, eval_every: int, progress: bool) -> float:
    """The training loop: ``record.steps`` optimizer steps (:func:`_optimizer_step`) on ``next_batch()`` at the
    rate ``lr_of(step)``, evaluating (:meth:`_TrainRecord.evaluate_now`) before the first, every ``eval_every``
    steps and after the last; a tqdm bar with the running loss and rate when ``progress``. Returns the final
    held-out loss (nats per token).

    Raises:
        LctxError: training diverged (a non-finite loss; ``lr`` named in the message).
    """
    steps = record.steps
    record.evaluate_now(0, lr_of(0))
    bar = tqdm(range(steps), desc="train", disable=not progress, dynamic_ncols=True, leave=False)
    try:
        cur_lr = lr
        for step in bar:
            t0 = time.perf_counter()
            cur_lr = lr_of(step)
            for g in opt.param_groups:
                g["lr"] = cur_lr
            lv = _optimizer_step(record.model, opt, next_batch().to(record.dev), grad_clip, step=step, lr=lr)
            record.train_seconds += time.perf_counter() - t0
            record.window_losses.append(lv)
            if progress and (step % 5 == 0 or step == steps - 1):
                bar.set_postfix(loss=f"{lv:.3f}", lr=f"{cur_lr:.2e}", refresh=False)
            done = step + 1
            if done % eval_every == 0 and done != steps:
                record.evaluate_now(done, cur_lr)
        return record.evaluate_now(steps, cur_lr)
    finally:
        bar.close()
        record.say.bar_active = False


def _optimizer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, grad_clip: float, *,
                    step: int, lr: float) -> float:
    """One optimizer step on the batch ``x`` [batch, context_length] (long; every token a target), the gradient's
    global norm clipped to ``grad_clip`` (0: not clipped). Returns the batch's loss before the step (nats per token).

    Raises:
        LctxError: a non-finite loss (training diverged at ``step + 1``; the message names the peak ``lr``).
    """
    loss = model(input_ids=x, labels=x).loss
    if not torch.isfinite(loss):
        raise LctxError(f"training diverged at step {step + 1} (loss {loss.item()}); lower lr "
                        f"(now {lr}) or raise warmup_steps")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss.item()


def _save(model, tokenizer, out_dir: str | os.PathLike) -> Path:
    """Write the model (``save_pretrained``, without transformers' shard bar) and the tokenizer into ``out_dir``
    (created). Returns it as a :class:`~pathlib.Path`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    bars_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a one-file tiny model
    try:
        model.save_pretrained(out)
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()
    save_tokenizer(tokenizer, out)
    return out


def _train_log(args: dict, docs: list[tuple[str, str]], train_stream: torch.Tensor, val_stream: torch.Tensor,
               tokenizer, model, n_params: int, record: _TrainRecord, final: float, dev: torch.device, out: Path, *,
               tokens_trained: int) -> dict:
    """The dict of ``train_log.json`` (see :func:`train`'s Returns), without the ``retrieval`` keys; ``wall_seconds``
    measured from ``record.t_start`` to now."""
    train_seconds = record.train_seconds
    return {
        "args": args,
        "corpus": [name for name, _ in docs],
        "n_docs": len(docs),
        "train_tokens": int(train_stream.numel()),
        "val_tokens": int(val_stream.numel()),
        "vocab_size": len(tokenizer),
        "n_params": n_params,
        "n_positional_params": model.variant_parameter_count(),
        "evals": record.evals,
        "initial_val_loss": record.evals[0]["val_loss"],
        "final_val_loss": final,
        "final_val_ppl": math.exp(min(final, 50.0)),
        "tokens_trained": tokens_trained,
        "wall_seconds": round(time.perf_counter() - record.t_start, 3),
        "train_seconds": round(train_seconds, 3),
        "tokens_per_second": round(tokens_trained / train_seconds, 1) if train_seconds > 0 else None,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
        "device": str(dev),
        "num_threads": torch.get_num_threads(),
        "out_dir": str(out),
    }
