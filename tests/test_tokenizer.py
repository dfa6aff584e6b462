"""Tests of lctx.models.tokenizer: lossless byte-level BPE, one token per digit, HF save/load."""

import pytest
from transformers import AutoTokenizer

from lctx.errors import LctxError
from lctx.models.tokenizer import save_tokenizer, train_tokenizer
from lctx.tasks.textdata import pydoc_corpus

SAMPLES = [
    "The pass key is 7340192. Remember it. 7340192 is the pass key.",
    "0123456789 9876543210 000 1e-5 3.14159 x=42;y=-7",
    "  leading and trailing spaces  \n\n\ttabs\tand\nnewlines\n",
    "Unicode: caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F642 \u00df\u2014\u201cquotes\u201d",
    "",
    " ",
    "\r\n windows line\r\n",
]


@pytest.fixture(scope="module")
def tok():
    docs = pydoc_corpus()
    return train_tokenizer([t for _, t in docs[:30]], 600)


def test_special_ids_and_no_auto_bos(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "<s>", "</s>"]
    ids = tok("hello")["input_ids"]
    assert ids and ids[0] != 1 and ids[-1] != 2
    assert len(tok) <= 600


@pytest.mark.parametrize("s", SAMPLES)
def test_round_trip(tok, s):
    ids = tok(s)["input_ids"]
    assert tok.decode(ids) == s


def test_each_digit_is_one_token(tok):
    s = "year 1842, key 0987654321 and 55"
    ids = tok(s)["input_ids"]
    toks = tok.convert_ids_to_tokens(ids)
    digit_toks = [t for t in toks if any(c.isdigit() for c in t)]
    assert all(len(t) == 1 for t in digit_toks), digit_toks
    assert "".join(digit_toks) == "1842098765432155"
    # a digit string encodes to exactly one token per digit, each decoding to that digit
    digits = "31415926535897932384"
    dids = tok(digits)["input_ids"]
    assert len(dids) == len(digits)
    assert [tok.decode([i]) for i in dids] == list(digits)


def test_autotokenizer_round_trip(tok, tmp_path):
    save_tokenizer(tok, tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    assert (tok2.pad_token_id, tok2.bos_token_id, tok2.eos_token_id) == (0, 1, 2)
    assert len(tok2) == len(tok)
    for s in SAMPLES:
        assert tok2(s)["input_ids"] == tok(s)["input_ids"]
        assert tok2.decode(tok2(s)["input_ids"]) == s


def test_bad_vocab_size():
    with pytest.raises(LctxError, match="too small"):
        train_tokenizer(["some text"], 100)
    with pytest.raises(LctxError, match="no text"):
        train_tokenizer(["", ""], 300)


def test_min_vocab_size_is_the_special_tokens_and_the_bytes():
    # lctx.harness.args repeats it (lctx train checks it before torch loads): both must stay what the tokenizer needs
    from lctx.harness import args
    from lctx.models.tokenizer import MIN_VOCAB_SIZE, SPECIAL_TOKENS

    assert MIN_VOCAB_SIZE == len(SPECIAL_TOKENS) + 256 == args.MIN_VOCAB_SIZE
    train_tokenizer(["some text"], MIN_VOCAB_SIZE)  # the smallest accepted size trains
    with pytest.raises(LctxError, match="too small"):
        train_tokenizer(["some text"], MIN_VOCAB_SIZE - 1)


def test_floor_tokenizer_is_a_lower_bound_of_every_trained_tokenizer(tok):
    # lctx train checks retrieval templates with it before the real tokenizer trains (issue 24, item 10): no
    # tokenizer train_tokenizer makes may encode a text in fewer tokens, and it is one token per pre-token
    from lctx.models.tokenizer import _pre_tokenizer, floor_tokenizer

    floor = floor_tokenizer()
    big = train_tokenizer([t for _, t in pydoc_corpus()[:30]] + SAMPLES * 50, 4000)
    for s in SAMPLES:
        n = len(floor(s)["input_ids"])
        assert n == len(_pre_tokenizer().pre_tokenize_str(s))
        assert n <= len(big(s)["input_ids"]) and n <= len(tok(s)["input_ids"])
    assert len(floor("The pass key is 7340192.")["input_ids"]) == 5 + 7 + 1  # words, digits one by one, "."
    assert (floor.bos_token_id, floor.eos_token_id) == (1, 2)
