"""Tests of lctx.tasks.textdata: decoding, newline normalisation, Gutenberg stripping, corpora."""

import os

import pytest

from helpers import assert_one_line_error, run_cli
from lctx.errors import LctxError
from lctx.tasks.textdata import load_corpus, pydoc_corpus, read_text, strip_gutenberg

PG_SAMPLE = (
    "\ufeffThe Project Gutenberg EBook of Tiny Book, by Nobody\r\n"
    "\r\n"
    "This eBook is for the use of anyone anywhere at no cost.\r\n"
    "\r\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK TINY BOOK ***\r\n"
    "\r\n"
    "\r\n"
    "CHAPTER I.\r\n"
    "\r\n"
    "It was a dark night, 1842.\r\n"
    "Caf\u00e9 \u201cquotes\u201d stay.\r\n"
    "\r\n"
    "End of the Project Gutenberg EBook of Tiny Book, by\r\n"
    "Nobody\r\n"
    "\r\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK TINY BOOK ***\r\n"
    "\r\n"
    "***** This file should be named 1-0.txt *****\r\n"
    "Project Gutenberg-tm license text.\r\n"
)
PG_BODY = "CHAPTER I.\n\nIt was a dark night, 1842.\nCaf\u00e9 \u201cquotes\u201d stay.\n"


def test_gutenberg_synthetic_bom_crlf(tmp_path):
    p = tmp_path / "pg1.txt"
    p.write_bytes(PG_SAMPLE.encode("utf-8"))
    assert read_text(p) == PG_BODY


def test_gutenberg_the_variant_and_no_end_marker():
    text = "header\n***START OF THE PROJECT GUTENBERG EBOOK X***\nbody line\nmore\n"
    assert strip_gutenberg(text) == "body line\nmore\n"
    text2 = "h\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nbody\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlic\n"
    assert strip_gutenberg(text2) == "body\n"


def test_plain_text_kept_and_cr_normalised(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"line one\r\nline two\rline three\n")
    assert read_text(p) == "line one\nline two\nline three\n"


def test_latin1_fallback(tmp_path):
    p = tmp_path / "l1.txt"
    p.write_bytes("na\u00efve caf\u00e9\n".encode("latin-1"))
    assert read_text(p) == "na\u00efve caf\u00e9\n"


def test_errors(tmp_path):
    with pytest.raises(LctxError, match="does not exist"):
        read_text(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"\xef\xbb\xbf \r\n")
    with pytest.raises(LctxError, match="empty"):
        read_text(empty)
    with pytest.raises(LctxError, match="does not exist"):
        load_corpus([tmp_path / "nope"])
    d = tmp_path / "nodocs"
    d.mkdir()
    (d / "x.md").write_text("not a txt")
    with pytest.raises(LctxError, match=r"no \*\.txt"):
        load_corpus(d)
    with pytest.raises(LctxError):
        load_corpus([])


def test_load_corpus_dir_sorted_and_files(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("bee\n")
    (d / "a.txt").write_text("ay\n")
    (d / "sub" / "c.txt").write_text("see\n")
    (d / "skip.md").write_text("no\n")
    single = tmp_path / "single.txt"
    single.write_text("one\n")
    docs = load_corpus([d, single])
    assert [n for n, _ in docs] == ["corpus/a.txt", "corpus/b.txt", "corpus/sub/c.txt", "single.txt"]
    assert [t for _, t in docs] == ["ay\n", "bee\n", "see\n", "one\n"]
    assert load_corpus(str(single)) == [("single.txt", "one\n")]


def test_pydoc_corpus():
    docs = pydoc_corpus()
    names = [n for n, _ in docs]
    assert len(docs) > 20 and names == sorted(names)
    assert all(t.strip() and "\r" not in t for _, t in docs)
    assert sum(len(t) for _, t in docs) > 100_000


def test_gutenberg_real_book(data_dir):
    """Real PG e-text (UTF-8 BOM, CRLF) from ../shared/data (LCTX_DATA_DIR); skipped when absent."""
    path = data_dir / "books" / "pg1342_pride_and_prejudice.txt"
    if not path.exists():
        pytest.skip(f"{path} not present")
    raw = path.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and b"\r\n" in raw
    text = read_text(path)
    assert "\r" not in text and not text.startswith("\ufeff")
    assert "START OF THIS PROJECT GUTENBERG" not in text and "END OF THIS PROJECT GUTENBERG" not in text
    assert "Project Gutenberg License" not in text and "End of the Project Gutenberg EBook" not in text
    assert "It is a truth universally acknowledged" in text
    assert text.rstrip().endswith("the means of uniting them.")
    assert 600_000 < len(text) < len(raw)


@pytest.mark.parametrize("cmd", ["run", "train"])
@pytest.mark.usefixtures("isolated_digests")
def test_binary_file_as_text_data(tmp_path, capsys, cmd):
    """Issue 10 item 15: a binary file as --ppl-data or --data is one line: not a text file."""
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(4096))
    if cmd == "run":
        args = ["run", "--tasks", "ppl", "--ppl-data", f, "--lengths", "256", "--out", tmp_path / "o"]
    else:
        args = ["train", "--data", f, "--steps", "1", "--out", tmp_path / "m"]
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "not a text file")


@pytest.mark.usefixtures("isolated_digests")
def test_binary_detection_keeps_real_text():
    """Issue 10 item 15: the binary check keeps latin-1 text and the control characters of real text."""
    from lctx.tasks.textdata import binary_reason

    latin1 = "Caf\u00e9 \u00e0 la cr\u00e8me, na\u00efve. " * 50
    assert binary_reason(latin1.encode("latin-1"), latin1) is None
    assert binary_reason(b"tab\tand\r\nlines\f", "tab\tand\r\nlines\f") is None
    assert "NUL" in binary_reason("hi".encode("utf-16"), "x")


def test_a_file_past_the_cap_is_refused_by_its_size_before_it_is_read(tmp_path):
    """Issue 42 item 5: a 1.2 GB book took 6 GB in 50 s. read_text(max_bytes=) refuses a file past the cap by its
    size, naming the file, its size and the cap, having read nothing (a sparse 1.2 GB file: tracemalloc's peak stays
    under 1 MB); a file within the cap reads as before (control), and one that holds more than its size said (it
    grew) is refused after reading at most cap + 1 bytes."""
    import tracemalloc

    from lctx.tasks.textdata import MAX_TEXT_BYTES, check_file_size

    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(1200 << 20)  # sparse: 1.2 GB of size, no disk
    tracemalloc.start()
    try:
        with pytest.raises(LctxError) as e:
            read_text(huge, MAX_TEXT_BYTES, "haystack book")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value).startswith(f"haystack book '{huge}' is 1200.0 MiB (1258291200 bytes), above the 16.0 MiB")
    assert "\n" not in str(e.value) and peak < 1 << 20
    ok = tmp_path / "ok.txt"
    ok.write_text("Some words.\n" * 100)
    assert read_text(ok, 2000) == "Some words.\n" * 100 and check_file_size(ok, 2000) == 1200
    with pytest.raises(LctxError, match=r"\(1200 bytes\), above the"):
        read_text(ok, 1000)
    assert load_corpus([ok], max_bytes=2000) == [("ok.txt", "Some words.\n" * 100)]
    with pytest.raises(LctxError, match="above the"):
        load_corpus([tmp_path], max_bytes=2000)  # the folder's huge.txt


def test_a_haystack_book_past_the_cap_is_refused_when_the_task_is_built(tmp_path):
    """babi/mrcr check their books' sizes in the constructor (before torch, before any book is hashed or read) and
    ppl its --ppl-data files: one line naming the file and the cap; control: the same folder without it builds."""
    import lctx
    from lctx.tasks import get_task

    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("A sentence. " * 500)
    get_task("babi_qa1")(data_dir=tmp_path)  # control
    with open(books / "huge.txt", "wb") as f:
        f.truncate(1200 << 20)
    for task in ("babi_qa1", "mrcr"):
        with pytest.raises(LctxError, match=rf"^{task}'s haystack book '.*huge.txt' is 1200.0 MiB \(1258291200 bytes\), "
                                            r"above the 16.0 MiB lctx reads of one file"):
            get_task(task)(data_dir=tmp_path)
    with pytest.raises(LctxError, match=r"^--ppl-data file '.*huge.txt' is 1200.0 MiB"):
        lctx.evaluate(None, "ppl", ppl_data=[str(books)], out=tmp_path / "o", log=lambda m: None)
    assert not (tmp_path / "o").exists()
