"""Content fingerprints: which bytes a number was computed from.

A result is only trustworthy when the inputs that made it are named beside it, so lctx identifies inputs
by their *content*, never by a path, a size or a modification time (``cp -p`` and ``rsync -a`` restore
mtimes to the nanosecond, and retraining into the same file can keep its size):

- :func:`file_digest`: SHA-256 of a file's bytes;
- :func:`checkpoint_files` / :func:`checkpoint_fingerprint`: every file of a checkpoint directory that
  loading reads or that describes the model (weights, ``config.json``, tokenizer files, generation config,
  shipped code), hashed file by file;
- :func:`digest_texts` / :func:`digest_json`: SHA-256 of documents as a task sees them, or of options.

Hashing costs one read of each file: about 0.25 s for a 98 MB GGUF on one core of this machine
(SHA-256 with the CPU's SHA extensions, ~400 MB/s under load; measured on this project's 2-core machine), a few
seconds for a multi-GB checkpoint. So that a large checkpoint is not re-read on every run, a digest is
cached (in ``$LCTX_HASH_CACHE``, default ``~/.cache/lctx/file-digests.json``; ``LCTX_HASH_CACHE=off``
turns the cache off) under the file's (device, inode, size, mtime_ns, ctime_ns). The ctime (inode change
time) cannot be set from user space: writing the file, ``touch -r``/``os.utime`` restoring its mtime, or
replacing it (``cp -p``, ``rsync -a``: a new inode) all give it a new ctime, so a changed file never
matches a cached entry. An entry is trusted only when it was hashed more than :data:`RACY_S` seconds
after the file's last change (the "racy" rule of git's index: a change within the same timestamp tick
as the hashing could otherwise go unseen).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import Iterable

from lctx.errors import LctxError

#: seconds between a file's last change (ctime) and its hashing before the cached digest is trusted
RACY_S = 2.0
#: the cache keeps at most this many entries (the oldest are dropped)
CACHE_MAX = 20000
_BLOCK = 1 << 22

# Files of a checkpoint directory that never change what the model computes: training leftovers, docs,
# and weights of other frameworks (transformers loads safetensors, else PyTorch .bin; never these).
IGNORED = ("*.md", ".gitattributes", ".gitignore", ".DS_Store", "train_log.json", "trainer_state.json",
           "training_args.bin", "optimizer.pt", "optimizer.bin", "scheduler.pt", "rng_state*.pth",
           "*.h5", "*.msgpack", "*.ot", "*.onnx", "*.onnx_data", "*.tflite", "*.mlmodel", "*.lock")
TORCH_WEIGHTS = ("*.bin", "*.pt", "*.pth")


def _cache_path() -> Path | None:
    raw = os.environ.get("LCTX_HASH_CACHE")
    if raw is not None and raw.strip().lower() in ("", "0", "off", "no", "false"):
        return None
    if raw:
        return Path(raw)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lctx" / "file-digests.json"


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


class _DigestCache:
    """The on-disk digest cache: {realpath: {"stat": key, "sha256": hex, "at_ns": when hashed}}. Read once,
    written back (atomically, merged with what other processes wrote) after new digests; any failure to
    read or write it only costs a re-hash."""

    def __init__(self):
        self.path = _cache_path()
        self.entries: dict | None = None
        self.dirty = False

    def load(self) -> dict:
        path = _cache_path()
        if path != self.path:  # LCTX_HASH_CACHE changed (tests, embedding programs)
            self.path, self.entries, self.dirty = path, None, False
        if self.entries is None:
            self.entries = self._read()
        return self.entries

    def _read(self) -> dict:
        if self.path is None:
            return {}
        try:
            st = os.stat(self.path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 64 << 20:
                return {}
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, real: str, st: os.stat_result) -> str | None:
        e = self.load().get(real)
        if not isinstance(e, dict) or e.get("stat") != _stat_key(st):
            return None
        if not isinstance(e.get("at_ns"), int) or e["at_ns"] - st.st_ctime_ns < RACY_S * 1e9:
            return None  # hashed within the same moment the file last changed: not trusted
        h = e.get("sha256")
        return h if isinstance(h, str) and len(h) == 64 else None

    def put(self, real: str, st: os.stat_result, digest: str, at_ns: int) -> None:
        self.load()[real] = {"stat": _stat_key(st), "sha256": digest, "at_ns": at_ns}
        self.dirty = True

    def flush(self) -> None:
        if not self.dirty or self.path is None:
            return
        self.dirty = False
        try:
            merged = self._read()
            merged.update(self.entries or {})
            if len(merged) > CACHE_MAX:
                keep = sorted(merged.items(), key=lambda kv: kv[1].get("at_ns", 0) if isinstance(kv[1], dict) else 0)
                merged = dict(keep[-CACHE_MAX:])
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".file-digests-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(merged, f)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self.entries = merged
        except OSError:
            pass  # a read-only or full home directory: the next run hashes again


_CACHE = _DigestCache()


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(_BLOCK)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def file_digest(path: str | os.PathLike, use_cache: bool = True) -> str:
    """SHA-256 (hex) of a regular file's bytes, through the ctime-keyed cache (module docstring).

    Raises:
        LctxError: the path is missing, not a regular file (a directory, a device, a FIFO) or unreadable.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise LctxError(f"cannot read {str(p)!r} ({e.strerror or e}); check the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise LctxError(f"{str(p)!r} is not a regular file; lctx reads inputs from regular files only")
    real = os.path.realpath(p)
    if use_cache:
        hit = _CACHE.get(real, st)
        if hit is not None:
            return hit
    at = time.time_ns()
    try:
        digest = _hash_file(p)
    except OSError as e:
        raise LctxError(f"cannot read {str(p)!r} ({e.strerror or e}); check its permissions") from None
    if use_cache:
        try:
            after = os.stat(p)
        except OSError:
            after = None
        if after is not None and _stat_key(after) == _stat_key(st):  # unchanged while being read
            _CACHE.put(real, st, digest, at)
    return digest


def content_key(*paths: str | os.PathLike) -> tuple[str, ...]:
    """The SHA-256 of each file (:func:`file_digest`, served from the digest cache when the file is
    unchanged): the key under which a task caches data parsed from those files in memory, so that a file
    rewritten in place (same path, size and mtime) within one process is read again rather than served
    stale while the record's fingerprint names the new content.

    Raises:
        LctxError: as :func:`file_digest`.
    """
    return tuple(file_digest(p) for p in paths)


def flush_cache() -> None:
    """Write new cached digests to disk (errors ignored). Called after each batch of hashing."""
    _CACHE.flush()


def checkpoint_files(path: str | os.PathLike) -> list[Path]:
    """The files of a checkpoint that its fingerprint covers, sorted by name.

    A file path (e.g. a ``.gguf``) is itself. A directory contributes every regular file at its top level
    (what ``from_pretrained`` reads: config, tokenizer files, generation config, weights, shipped ``*.py``)
    except :data:`IGNORED` (docs, training leftovers, other frameworks' weights) and, when it has
    ``*.safetensors`` (which lctx loads in preference), its PyTorch ``*.bin``/``*.pt``.

    Raises:
        LctxError: the path does not exist.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise LctxError(f"checkpoint {str(path)!r} does not exist; check the path")
    files = []
    for f in p.iterdir():
        try:
            if not stat.S_ISREG(os.stat(f).st_mode):
                continue
        except OSError:
            continue
        files.append(f)
    has_safetensors = any(f.name.endswith(".safetensors") for f in files)
    out = []
    for f in files:
        if any(fnmatch(f.name, pat) for pat in IGNORED):
            continue
        if has_safetensors and any(fnmatch(f.name, pat) for pat in TORCH_WEIGHTS):
            continue
        out.append(f)
    return sorted(out, key=lambda f: f.name)


def checkpoint_digests(path: str | os.PathLike) -> dict[str, str]:
    """{file name: SHA-256} of :func:`checkpoint_files` (what ``run.json`` records per model)."""
    try:
        return {f.name: file_digest(f) for f in checkpoint_files(path)}
    finally:
        flush_cache()


def checkpoint_fingerprint(path: str | os.PathLike) -> str:
    """16 hex digits identifying a checkpoint's content: SHA-256 over (file name, file SHA-256) of
    :func:`checkpoint_files`. Equal for byte-identical copies anywhere; different after any change of the
    weights, config.json, tokenizer or shipped code, whatever the files' sizes and mtimes.

    Raises:
        LctxError: as :func:`file_digest`.
    """
    return digest_json(checkpoint_digests(path))


def digest_json(obj) -> str:
    """16 hex digits: SHA-256 of ``obj`` as canonical JSON (sorted keys; non-JSON values via ``str``)."""
    blob = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def digest_texts(docs: Iterable[tuple[str, str]]) -> str:
    """16 hex digits: SHA-256 over (name, text) documents, each length-prefixed (so no two different
    document lists hash alike by moving text between documents)."""
    h = hashlib.sha256()
    for name, text in docs:
        for part in (name, text):
            b = part.encode("utf-8", "surrogatepass")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()[:16]


def digest_files(files: dict[str, str | os.PathLike]) -> str:
    """16 hex digits over {name: SHA-256 of the file's content} of ``files`` ({name: path}; the names,
    e.g. paths relative to a data root, are part of the identity, where the files live is not).

    Raises:
        LctxError: as :func:`file_digest`.
    """
    try:
        return digest_json({str(k): file_digest(p) for k, p in files.items()})
    finally:
        flush_cache()
