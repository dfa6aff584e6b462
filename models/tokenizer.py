"""Byte-level BPE tokenizer for lctx's own models, trained with the Hugging Face ``tokenizers`` library.

The tokenizer is deliberately simple and lossless:

* byte-level BPE (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword Units";
  the byte-level alphabet of GPT-2, Radford et al. 2019), so any Unicode text encodes without ``<unk>``
  and ``decode(encode(s)) == s`` exactly;
* every digit is its own token (``pre_tokenizers.Digits(individual_digits=True)``, as in LLaMA,
  Touvron et al. 2023), so passkeys and numbers are read digit by digit and round-trip exactly;
* special tokens ``<pad>`` = 0, ``<s>`` (BOS) = 1, ``</s>`` (EOS) = 2, matching the defaults of
  :class:`lctx.models.LctxConfig`; nothing is added automatically (lctx prepends BOS itself).

The result is a ``transformers`` fast tokenizer: ``save_pretrained(dir)`` writes ``tokenizer.json`` and
``transformers.AutoTokenizer.from_pretrained(dir)`` loads it back with identical ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from lctx.errors import LctxError

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<pad>", "<s>", "</s>"
#: smallest usable vocabulary: the 3 special tokens plus the 256 byte symbols. lctx.harness.args.MIN_VOCAB_SIZE
#: repeats it for ``lctx train``'s checks before torch loads (a model layer may not import harness;
#: tests/test_tokenizer.py keeps the two equal)
MIN_VOCAB_SIZE = 3 + 256
#: Special tokens in id order: ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2.
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Digits split one by one, then GPT-2 byte-level splitting and byte-to-symbol mapping."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def train_tokenizer(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2,
                    show_progress: bool = False) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``.

    Args:
        texts: documents (any iterable of ``str``; each string is one training sequence).
        vocab_size: target vocabulary size in tokens, special tokens and the 256 byte symbols included
            (so at least :data:`MIN_VOCAB_SIZE` = 259). A small corpus may yield fewer tokens than asked
            for when no pair reaches ``min_frequency``; ``len(tokenizer)`` is the real size.
        min_frequency: a pair must occur at least this many times to be merged.
        show_progress: show the ``tokenizers`` trainer's progress bar.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``pad_token_id`` 0, ``bos_token_id`` 1,
        ``eos_token_id`` 2, no automatic BOS/EOS (``tok(s)["input_ids"]`` is the text only),
        ``add_prefix_space=False`` and ``clean_up_tokenization_spaces=False`` so
        ``tok.decode(tok(s)["input_ids"]) == s`` for any string ``s`` without special-token text in it.

    Raises:
        LctxError: ``vocab_size`` below :data:`MIN_VOCAB_SIZE`, or ``texts`` holds no non-empty text.

    Source: byte-level BPE (Sennrich et al. 2016; Radford et al. 2019), individual digits
    (Touvron et al. 2023), as implemented by ``tokenizers.trainers.BpeTrainer``.
    """
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise LctxError(
            f"tokenizer vocab_size {vocab_size!r} is too small; pass at least {MIN_VOCAB_SIZE} "
            "(3 special tokens + 256 bytes)"
        )
    seen = [0]

    def nonempty():
        for t in texts:
            if t:
                seen[0] += 1
                yield t

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tok.train_from_iterator(nonempty(), trainer=trainer)
    if not seen[0]:
        raise LctxError("cannot train a tokenizer on no text; pass at least one non-empty document")
    for i, s in enumerate(SPECIAL_TOKENS):  # BpeTrainer puts special tokens first, in order
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return wrap_tokenizer(tok)


def floor_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer that makes every pre-token one token (``<unk>``, id 3, after lctx's special tokens):
    :func:`train_tokenizer`'s pre-tokenizer (digits one by one, GPT-2's byte-level splits) over a word-level
    model with an empty vocabulary. BPE merges never cross the pre-tokenizer's splits, so no tokenizer that
    :func:`train_tokenizer` makes, whatever its corpus and vocabulary size, encodes a text in fewer tokens:
    a template that does not fit a budget with this one fits with none (``lctx train`` checks its retrieval
    documents with it before it trains the real tokenizer). Its ids say nothing about the text."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIAL_TOKENS + ["<unk>"])}, unk_token="<unk>"))
    tok.pre_tokenizer = _pre_tokenizer()
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a raw ``tokenizers.Tokenizer`` (with lctx's special tokens) as a ``transformers`` fast tokenizer
    with the lctx settings (no automatic BOS, no prefix space, no space clean-up)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        add_bos_token=False,
        add_eos_token=False,
        add_prefix_space=False,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tok: PreTrainedTokenizerFast, out_dir) -> None:
    """``tok.save_pretrained(out_dir)``, then record ``tokenizer_class`` as ``"PreTrainedTokenizerFast"``.

    transformers 5 writes its own class name (``TokenizersBackend``), which transformers 4 cannot
    resolve; ``PreTrainedTokenizerFast`` loads the same ``tokenizer.json`` in both, so checkpoints
    written here stay loadable with ``AutoTokenizer`` across the versions lctx supports (>= 4.48).
    """

    tok.save_pretrained(out_dir)
    cfg_path = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
