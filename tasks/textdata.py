"""Plain-text corpora for training and perplexity: local files and directories, and an embedded default.

* :func:`read_text` reads one file robustly (UTF-8 with a latin-1 fallback, BOM stripped, CRLF/CR
  normalised to LF) and keeps only the body of a Project Gutenberg e-text (the text between its
  ``*** START OF ... ***`` and ``*** END OF ... ***`` lines, without the licence header and footer).
* :func:`load_corpus` turns files and directories (every ``*.txt`` below, sorted) into
  ``(name, text)`` documents.
* :func:`pydoc_corpus` is the corpus that ships with Python itself (``pydoc_data.topics``): about
  465K characters of English technical prose, available offline everywhere, so lctx can train and
  evaluate a tiny model without any download.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from lctx.errors import LctxError

# "*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***", "*** START OF THE PROJECT GUTENBERG EBOOK ...",
# older "***START OF THE PROJECT GUTENBERG EBOOK" (no space) and "E-TEXT"/"ETEXT" spellings; one line each.
_PG_START = re.compile(
    r"^[ \t]*\*{3}[ \t]*START OF (?:THIS|THE) PROJECT GUTENBERG E-?(?:BOOK|TEXT)\b[^\n]*$",
    re.IGNORECASE | re.MULTILINE,
)
_PG_END = re.compile(
    r"^[ \t]*\*{3}[ \t]*END OF (?:THIS|THE) PROJECT GUTENBERG E-?(?:BOOK|TEXT)\b[^\n]*$",
    re.IGNORECASE | re.MULTILINE,
)
# The boilerplate paragraph just before the END marker in many e-texts, possibly wrapped over lines:
# "End of the Project Gutenberg EBook of Pride and Prejudice, by Jane Austen",
# "End of Project Gutenberg’s Moby Dick; or The Whale, by Herman Melville".
_PG_END_LINE = re.compile(
    r"(?:\A|\n)[ \t]*End of (?:the |this )?Project Gutenberg\S*[^\n]*(?:\n[ \t]*\S[^\n]*)*\s*\Z",
    re.IGNORECASE,
)


def decode_bytes(data: bytes) -> str:
    """Bytes -> text: UTF-8 (a leading BOM removed), or latin-1 when the bytes are not valid UTF-8
    (latin-1 maps every byte, so it never fails). Line endings are left as they are."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text[1:] if text.startswith("\ufeff") else text


_WS_CONTROLS = frozenset("\t\n\r\f\v")

#: The largest text file a task reads whole (a haystack book of babi/mrcr, a ``--ppl-data`` document, RULER's essay
#: and word lists), bytes: 16 MiB, about 5 times the longest book of the bundled data (War and Peace, 3.4 MB). A
#: prompt uses a window of its longest length, so a bigger file is a mistake (a dump, a whole corpus in one file):
#: a 1.2 GB book took 6 GB in 50 s, split into words for a 1K prompt. Refused by its size
#: (:func:`check_file_size`) before a byte is read.
MAX_TEXT_BYTES = 16 << 20


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def check_file_size(path: str | os.PathLike, cap: int = MAX_TEXT_BYTES, what: str = "text file",
                    why: str = "5 times the longest bundled book") -> int:
    """The size of ``path`` in bytes, refused past ``cap`` before it is read (``what``: how the message names the
    file, e.g. "babi_qa1's haystack book"; ``why``: where the cap comes from). A path that is no regular file is
    left to the reader's own error.

    Raises:
        LctxError: the file is larger than ``cap`` (one line naming the file, its size, the cap and the fix).
    """
    p = Path(path)
    try:
        size = p.stat().st_size if p.is_file() else 0
    except OSError:
        return 0
    if size > cap:
        raise LctxError(f"{what} '{p}' is {_mib(size)} ({size} bytes), above the {_mib(cap)} lctx reads of one file "
                        f"({why}); a prompt uses a small window of it: pass a smaller file (e.g. its first part, "
                        f"head -c {cap} FILE > part.txt)")
    return size


def binary_reason(data: bytes, text: str) -> str | None:
    """Why bytes that decoded to ``text`` are not a text file, or None: a NUL byte (binary, or UTF-16/32
    text), or C0 control characters (other than tab, newlines, form feed) making up more than 1% of the
    characters (random bytes give ~10%; text has next to none)."""
    nul = data.find(b"\x00")
    if nul >= 0:
        return f"a NUL byte at offset {nul}: a binary file, or UTF-16/32 text"
    ctrl = sum(1 for c in text if (c < " " and c not in _WS_CONTROLS) or c == "\x7f")
    if ctrl > max(4, 0.01 * len(text)):
        return f"{ctrl} control characters in {len(text)} characters: a binary file"
    return None


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR -> LF (Windows and classic-Mac line endings to Unix)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_gutenberg(text: str) -> str:
    """Keep the body of a Project Gutenberg e-text, or return ``text`` unchanged if it has no START marker.

    The body is everything after the ``*** START OF THIS|THE PROJECT GUTENBERG EBOOK ... ***`` line and
    before the matching ``*** END OF ...`` line (to the end of the text when no END line is found),
    without the "End of the Project Gutenberg EBook of ..." line that often precedes the END marker,
    and with surrounding blank lines removed. Expects LF line endings (see :func:`normalize_newlines`).
    """
    start = _PG_START.search(text)
    if start is None:
        return text
    body = text[start.end():]
    end = _PG_END.search(body)
    if end is not None:
        body = body[: end.start()]
    body = _PG_END_LINE.sub("", body)
    return body.strip("\n").rstrip() + "\n" if body.strip() else ""


def read_text(path: str | os.PathLike, max_bytes: int | None = None, what: str = "text file") -> str:
    """Read a text file as clean LF text; a Project Gutenberg e-text is reduced to its body.

    Decoding: UTF-8, else latin-1 (:func:`decode_bytes`); a UTF-8 BOM is stripped; CRLF and CR become
    LF; Gutenberg header/footer removed by :func:`strip_gutenberg`. ``max_bytes`` (None: no cap): a file larger is
    refused by its size before it is read (:func:`check_file_size`, naming it as ``what``), and at most
    ``max_bytes + 1`` bytes are ever read (a file that grows, or reports no size, is refused as well).

    Returns:
        The text (``str``, LF line endings, never empty or whitespace-only).

    Raises:
        LctxError: the file does not exist, is a directory, cannot be read, is larger than ``max_bytes``, is binary
            (:func:`binary_reason`), or holds no text (after stripping the Gutenberg boilerplate).
    """
    p = Path(path)
    if not p.exists():
        raise LctxError(f"text file '{p}' does not exist; check the path (or --data-dir)")
    if p.is_dir():
        raise LctxError(f"'{p}' is a directory, not a text file; use load_corpus for directories")
    if not p.is_file():  # a device or FIFO: reading it may never end
        raise LctxError(f"'{p}' is not a regular file (a device, FIFO or socket); pass a text file")
    if max_bytes is not None:
        check_file_size(p, max_bytes, what)
    try:
        if max_bytes is None:
            data = p.read_bytes()
        else:
            with open(p, "rb") as f:
                data = f.read(max_bytes + 1)
    except OSError as e:
        raise LctxError(f"cannot read text file '{p}' ({e.strerror or e}); check its permissions") from e
    if max_bytes is not None and len(data) > max_bytes:  # it grew since its size was checked
        raise LctxError(f"{what} '{p}' holds more than {_mib(max_bytes)}, the most lctx reads of one file; pass a "
                        f"smaller file (e.g. head -c {max_bytes} FILE > part.txt)")
    decoded = decode_bytes(data)
    why = binary_reason(data, decoded)
    if why:
        raise LctxError(f"'{p}' is not a text file ({why}); pass UTF-8 or latin-1 text")
    text = strip_gutenberg(normalize_newlines(decoded))
    if not text.strip():
        raise LctxError(f"text file '{p}' is empty (no text after Gutenberg stripping); remove it or pass "
                        "a file with text")
    return text


def corpus_files(raw: str | os.PathLike) -> list[Path]:
    """The text files one corpus path stands for, read by nothing: the path itself, or a directory's ``*.txt``
    files below it (recursively, sorted by relative path). :func:`load_corpus` reads them; ``ppl`` checks its
    ``--ppl-data`` with it when built, before torch loads.

    Raises:
        LctxError: the path does not exist, or is a directory holding no ``*.txt`` file.
    """
    p = Path(raw)
    if not p.exists():
        several = "," in str(raw) and all(Path(x.strip()).exists() for x in str(raw).split(",") if x.strip())
        raise LctxError(f"corpus path '{p}' does not exist; pass existing text files or directories"
                        + ("; for several files repeat the flag (--ppl-data a.txt --ppl-data b.txt)"
                           if several else ""))
    if not p.is_dir():
        return [p]
    files = sorted((f for f in p.rglob("*.txt") if f.is_file()), key=lambda f: f.relative_to(p).as_posix())
    if not files:
        raise LctxError(f"corpus directory '{p}' holds no *.txt files; point at a folder of .txt documents")
    return files


def load_corpus(paths: str | os.PathLike | Iterable[str | os.PathLike],
                max_bytes: int | None = None) -> list[tuple[str, str]]:
    """Documents from text files and directories.

    Args:
        paths: one path or several. A file is one document named by its file name; a directory
            contributes every ``*.txt`` file below it (recursively, sorted by relative path), each
            named ``<directory name>/<relative path>``.
        max_bytes: the largest file read (:func:`read_text`); None: no cap.

    Returns:
        ``[(name, text), ...]`` in the order given (text as from :func:`read_text`).

    Raises:
        LctxError: a path does not exist, a directory holds no ``*.txt`` file, a file is unreadable, empty or
            larger than ``max_bytes``, or ``paths`` is empty.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    docs: list[tuple[str, str]] = []
    n_paths = 0
    for raw in paths:
        n_paths += 1
        p, files = Path(raw), corpus_files(raw)
        if p.is_dir():
            docs.extend((f"{p.name or p.resolve().name}/{f.relative_to(p).as_posix()}", read_text(f, max_bytes))
                        for f in files)
        else:
            docs.append((p.name, read_text(p, max_bytes)))
    if not n_paths:
        raise LctxError("no corpus paths given; pass at least one text file or directory")
    return docs


PYDOC_HELDOUT_EVERY = 10


def pydoc_corpus(split: str = "all") -> list[tuple[str, str]]:
    """The embedded default corpus: Python's own help topics (``pydoc_data.topics.topics``).

    ``split``: ``"all"``; ``"heldout"``, every 10th topic in sorted order (the default ``ppl`` data);
    ``"train"``, the others (what the bundled checkpoint was trained on).

    Returns:
        ``[(topic, text), ...]``, one document per topic, sorted by topic name, LF line endings
        (79 documents and about 465K characters on CPython 3.11).

    Raises:
        LctxError: this Python ships without ``pydoc_data`` (some minimal distributions strip it).
    """
    try:
        from pydoc_data.topics import topics  # not in every Python build (hence the try)
    except ImportError as e:  # pragma: no cover - depends on the Python build
        raise LctxError("this Python has no pydoc_data module; pass a corpus with --corpus PATH instead") from e
    if split not in ("all", "train", "heldout"):
        raise LctxError(f"unknown pydoc split {split!r}; use all, train or heldout")
    docs = [(k, normalize_newlines(topics[k])) for k in sorted(topics) if topics[k].strip()]
    if split == "all":
        return docs
    held = split == "heldout"
    return [d for i, d in enumerate(docs) if (i % PYDOC_HELDOUT_EVERY == 0) == held]
