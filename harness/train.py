"""``lctx train``: train a small native lctx model from scratch on a text corpus.

The recipe is the plain GPT-style one, kept small enough to run on a laptop CPU:

1. a byte-level BPE tokenizer with one token per digit (:func:`lctx.models.tokenizer.train_tokenizer`);
2. documents tokenized and joined into one stream with EOS between them; the last ``val_fraction`` of
   every document's tokens is held out (a contiguous tail) as the validation stream;
3. training windows are random crops of ``context_length - 1`` tokens with BOS prepended
   (``[BOS] + text``, ``context_length`` tokens in all), drawn from a seeded ``torch.Generator``;
4. AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), betas (0.9, 0.95), weight
   decay on matrices only, linear warmup then cosine decay (Loshchilov & Hutter 2017, "SGDR") to
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
from pathlib import Path
from typing import Callable

import torch

from .errors import LctxError

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


def _check_args(*, variant, context_length, hidden_size, num_layers, num_heads, vocab_size, steps, batch_size,
                lr, min_lr_ratio, warmup_steps, weight_decay, grad_clip, val_fraction, eval_every, eval_batches,
                variant_options) -> None:
    from ..models import get_variant
    from ..models.tokenizer import MIN_VOCAB_SIZE

    def positive_int(name, value):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise LctxError(f"{name} must be a positive integer, got {value!r}; pass a value >= 1")

    for name, value in [("context_length", context_length), ("hidden_size", hidden_size),
                        ("num_layers", num_layers), ("num_heads", num_heads), ("vocab_size", vocab_size),
                        ("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every),
                        ("eval_batches", eval_batches)]:
        positive_int(name, value)
    if context_length < 2:
        raise LctxError(f"context_length must be at least 2 (BOS + one token), got {context_length}")
    if hidden_size % num_heads:
        raise LctxError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}; "
                        "pick a head count that divides the width")
    if vocab_size < MIN_VOCAB_SIZE:
        raise LctxError(f"vocab_size {vocab_size} is too small; pass at least {MIN_VOCAB_SIZE} "
                        "(3 special tokens + 256 bytes)")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise LctxError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise LctxError(f"lr must be a positive number, got {lr!r}")
    if not (0.0 <= min_lr_ratio <= 1.0):
        raise LctxError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio!r}")
    if not weight_decay >= 0:
        raise LctxError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if not grad_clip >= 0:
        raise LctxError(f"grad_clip must be >= 0 (0 disables clipping), got {grad_clip!r}")
    if not (0.0 < val_fraction < 1.0):
        raise LctxError(f"val_fraction must be in (0, 1), got {val_fraction!r}; e.g. 0.05 holds out 5% of "
                        "every document")
    if variant_options is not None and not isinstance(variant_options, dict):
        raise LctxError(f"variant_options must be a dict, got {type(variant_options).__name__}")
    try:
        get_variant(variant)
    except KeyError as e:
        raise LctxError(str(e.args[0]) if e.args else f"unknown attention variant {variant!r}") from None


def _resolve_device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise LctxError(f"unknown device {device!r} ({e}); pass cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LctxError(f"device {device!r} asked for but CUDA is not available here; pass --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise LctxError(f"device {device!r} does not exist ({torch.cuda.device_count()} GPU(s)); pass cuda:0")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise LctxError(f"device {device!r} asked for but MPS is not available here; pass --device cpu")
    return dev


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
    progress: bool = True,
    log: Callable[[str], None] | None = print,
    warn: Callable[[str], None] | None = None,
) -> dict:
    """Train a native lctx model from scratch and write it to ``out_dir`` as a Hugging Face checkpoint.

    Args:
        docs: ``[(name, text), ...]`` documents (e.g. from :func:`lctx.harness.textdata.load_corpus` or
            :func:`lctx.harness.textdata.pydoc_corpus`).
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
        weight_decay: AdamW decoupled decay, applied to 2-D weights (projections, embeddings) only.
        grad_clip: max global gradient L2 norm (0 disables).
        val_fraction: fraction of every document's tokens (its tail) held out for validation, in (0, 1).
        eval_every: evaluate the held-out loss every this many steps (also before step 1 and at the end).
        eval_batches: number of batches of ``batch_size`` fixed, seeded validation crops per evaluation.
        seed: seeds the model init (``torch.manual_seed``) and the data crops (``torch.Generator``).
        device: torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...). Training is float32.
        tie_embeddings: share the input embedding and the LM head.
        variant_options: extra variant settings stored in ``config.variant_options``.
        progress: show a tqdm bar with the running loss and learning rate.
        log: called with one line of text at every evaluation and at the end (``None``: silent). The
            default ``print`` is routed through ``tqdm.write`` while the bar is shown.
        warn: called with a ``warning: ...`` line, once the arguments are valid, for settings that run but
            are probably a mistake (``warmup_steps >= steps``: the learning rate never decays). Default:
            printed on stderr.

    Returns:
        The dict written to ``train_log.json``: ``args``, ``corpus`` (document names), ``n_docs``,
        ``train_tokens``/``val_tokens`` (stream sizes), ``vocab_size`` (real), ``n_params`` (unique
        parameters), ``evals`` (list of ``{"step", "train_loss", "val_loss", "lr", "elapsed_s"}``;
        ``train_loss`` is the mean training loss since the previous evaluation, ``None`` at step 0;
        losses in nats per token), ``initial_val_loss``, ``final_val_loss``, ``final_val_ppl``,
        ``wall_seconds`` (whole call), ``train_seconds`` (optimizer steps only), ``tokens_per_second``
        (training tokens / train_seconds), ``torch_version``, ``transformers_version``, ``python_version``,
        ``device``, ``num_threads``, ``out_dir``.

    Raises:
        LctxError: a non-positive size or step count, ``hidden_size`` not divisible by ``num_heads``, an
            unknown variant, a bad ``val_fraction``/``lr``/device, no documents, or too little text for one
            training window plus one validation window (the message gives the token counts and the fix).

    Sources: AdamW, Loshchilov & Hutter 2019; cosine schedule, Loshchilov & Hutter 2017 (SGDR); warmup,
    Goyal et al. 2017; betas (0.9, 0.95) and no decay on gains/biases as in GPT-3 (Brown et al. 2020);
    gradient clipping, Pascanu et al. 2013.
    """
    import transformers
    from tqdm.auto import tqdm

    from ..models import LctxConfig, LctxForCausalLM
    from ..models.tokenizer import save_tokenizer, train_tokenizer

    t_start = time.perf_counter()
    args = dict(variant=variant, context_length=context_length, hidden_size=hidden_size, num_layers=num_layers,
                num_heads=num_heads, vocab_size=vocab_size, steps=steps, batch_size=batch_size, lr=lr,
                min_lr_ratio=min_lr_ratio, warmup_steps=warmup_steps, weight_decay=weight_decay,
                grad_clip=grad_clip, val_fraction=val_fraction, eval_every=eval_every,
                eval_batches=eval_batches, seed=seed, device=str(device), tie_embeddings=tie_embeddings,
                variant_options=dict(variant_options or {}))
    _check_args(
        variant=variant, context_length=context_length, hidden_size=hidden_size, num_layers=num_layers,
        num_heads=num_heads, vocab_size=vocab_size, steps=steps, batch_size=batch_size, lr=lr,
        min_lr_ratio=min_lr_ratio, warmup_steps=warmup_steps, weight_decay=weight_decay, grad_clip=grad_clip,
        val_fraction=val_fraction, eval_every=eval_every, eval_batches=eval_batches,
        variant_options=variant_options)
    dev = _resolve_device(device)
    if warmup_steps >= steps:  # lr_at ramps for min(warmup, steps) steps: the cosine decay never starts
        (warn or (lambda m: print(m, file=sys.stderr)))(
            f"warning: warm-up of {warmup_steps} steps >= {steps} steps (--warmup, --steps): the learning rate "
            f"only ramps up and never decays; use a warm-up well below the steps, e.g. {max(1, steps // 10)}")
    docs = [(str(name), text) for name, text in docs if text and text.strip()]
    if not docs:
        raise LctxError("no training text: the corpus has no non-empty documents; pass text files or "
                        "directories of .txt files")

    bar_active = progress
    if log is None:
        def say(msg: str) -> None:
            pass
    elif log is print:
        def say(msg: str) -> None:
            (tqdm.write if bar_active else print)(msg)
    else:
        say = log

    # --- tokenizer (trained on the training part only: each document's head by characters) -------------
    head_texts = [text[: max(1, int(len(text) * (1.0 - val_fraction)))] for _, text in docs]
    tokenizer = train_tokenizer(head_texts, vocab_size)
    real_vocab = len(tokenizer)
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

    # --- model --------------------------------------------------------------------------------------
    torch.manual_seed(seed)
    try:
        cfg = LctxConfig(vocab_size=real_vocab, hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, variant=variant, variant_options=variant_options,
                         train_length=context_length, max_position_embeddings=None,
                         tie_word_embeddings=tie_embeddings, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                         pad_token_id=PAD_ID)
        model = LctxForCausalLM(cfg).to(dev)
    except (ValueError, KeyError) as e:  # a bad variant option: report it as the user's mistake
        raise LctxError(f"cannot build a {variant!r} model: {e.args[0] if e.args else e}; check --option values") from None
    model.train()
    n_params = sum(p.numel() for p in model.parameters())

    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            # a parameter may opt out of weight decay (S4D's A, B, step size: the state-spaces/s4 convention)
            wd_off = getattr(p, "_optim", {}).get("weight_decay", None) == 0.0
            (decay if p.dim() >= 2 and not wd_off else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)

    gen = torch.Generator().manual_seed(seed)
    val_crops = sample_crops(val_stream, eval_batches * batch_size, context_length,
                             torch.Generator().manual_seed(seed + 1))
    warmup = min(warmup_steps, steps)

    say(f"lctx train: {len(docs)} docs, {train_stream.numel()} train / {val_stream.numel()} val tokens, "
        f"vocab {real_vocab}, {n_params:,} params ({model.variant_parameter_count()} positional), "
        f"variant {variant}, ctx {context_length}, "
        f"{steps} steps x {batch_size}, device {dev}")

    evals: list[dict] = []
    train_seconds = 0.0
    window_losses: list[float] = []

    def run_eval(step: int, cur_lr: float) -> float:
        v = evaluate(model, val_crops, batch_size, dev)
        tl = sum(window_losses) / len(window_losses) if window_losses else None
        evals.append({"step": step, "train_loss": tl, "val_loss": v, "lr": cur_lr,
                      "elapsed_s": round(time.perf_counter() - t_start, 3)})
        window_losses.clear()
        tl_s = f"{tl:.4f}" if tl is not None else "-"
        say(f"step {step:>6}/{steps}: train {tl_s}  val {v:.4f} (ppl {math.exp(min(v, 50)):.1f})  lr {cur_lr:.2e}")
        return v

    run_eval(0, lr_at(0, lr=lr, steps=steps, warmup_steps=warmup, min_lr_ratio=min_lr_ratio))
    bar = tqdm(range(steps), desc="train", disable=not progress, dynamic_ncols=True, leave=False)
    try:
        cur_lr = lr
        for step in bar:
            t0 = time.perf_counter()
            cur_lr = lr_at(step, lr=lr, steps=steps, warmup_steps=warmup, min_lr_ratio=min_lr_ratio)
            for g in opt.param_groups:
                g["lr"] = cur_lr
            x = sample_crops(train_stream, batch_size, context_length, gen).to(dev)
            loss = model(input_ids=x, labels=x).loss
            if not torch.isfinite(loss):
                raise LctxError(f"training diverged at step {step + 1} (loss {loss.item()}); lower lr "
                                f"(now {lr}) or raise warmup_steps")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            lv = loss.item()
            train_seconds += time.perf_counter() - t0
            window_losses.append(lv)
            if progress and (step % 5 == 0 or step == steps - 1):
                bar.set_postfix(loss=f"{lv:.3f}", lr=f"{cur_lr:.2e}", refresh=False)
            done = step + 1
            if done % eval_every == 0 and done != steps:
                run_eval(done, cur_lr)
        final = run_eval(steps, cur_lr)
    finally:
        bar.close()
        bar_active = False

    # --- save ---------------------------------------------------------------------------------------
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    bars_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar for a one-file tiny model
    try:
        model.save_pretrained(out)
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()
    save_tokenizer(tokenizer, out)
    tokens_trained = steps * batch_size * context_length
    result = {
        "args": args,
        "corpus": [name for name, _ in docs],
        "n_docs": len(docs),
        "train_tokens": int(train_stream.numel()),
        "val_tokens": int(val_stream.numel()),
        "vocab_size": real_vocab,
        "n_params": n_params,
        "n_positional_params": model.variant_parameter_count(),
        "evals": evals,
        "initial_val_loss": evals[0]["val_loss"],
        "final_val_loss": final,
        "final_val_ppl": math.exp(min(final, 50.0)),
        "tokens_trained": tokens_trained,
        "wall_seconds": round(time.perf_counter() - t_start, 3),
        "train_seconds": round(train_seconds, 3),
        "tokens_per_second": round(tokens_trained / train_seconds, 1) if train_seconds > 0 else None,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python_version": platform.python_version(),
        "device": str(dev),
        "num_threads": torch.get_num_threads(),
        "out_dir": str(out),
    }
    (out / "train_log.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    say(f"done in {result['wall_seconds']:.1f}s ({result['tokens_per_second']} tok/s): val loss "
        f"{evals[0]['val_loss']:.4f} -> {final:.4f}; wrote {out}")
    return result
