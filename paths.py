"""Data paths: where a data file given on the command line is found, and how it is named in records.

Torch-free and import-light (the CLI resolves paths before torch loads); below every layer, so tasks
(:class:`lctx.tasks.ppl.Perplexity`) and the harness (``lctx diagnose far-mass``) share it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def data_path(p: str, data_dir: Optional[Path]) -> str:
    """``p`` as given when it exists (or no data dir), else ``data_dir / p`` when that exists (else ``p``, which
    the reader then refuses with its own one-line error)."""
    if os.path.exists(p) or data_dir is None:
        return p
    cand = Path(data_dir) / p
    return str(cand) if cand.exists() else p


def data_key(p: str | os.PathLike, data_dir: Optional[Path]) -> str:
    """How a data file or folder is named in a task's recorded options (and so in the resume key and in
    ``lctx compare``'s option check): its path relative to ``data_dir`` (posix separators) when it lies below
    it, else its absolute real path. The same file typed as ``../shared/data/books/x.txt``, as
    ``/work/shared/data/books/x.txt`` or as ``books/x.txt`` (with ``--data-dir``) gets one key, as the NIAH
    tasks, which record no path at all, always did; its content is in the record's ``data_fingerprint``."""
    real = Path(os.path.realpath(p))
    if data_dir is not None:
        try:
            return real.relative_to(os.path.realpath(data_dir)).as_posix()
        except ValueError:
            pass
    return real.as_posix()
