"""Safe reading and writing of a run directory: damaged, hostile or unwritable files give one line, never
a traceback and never lost results.

- :func:`run_dir_lock`: one process at a time per run directory (``OUT/.lctx.lock``, ``flock``); a second
  ``lctx run`` on the same ``--out`` refuses, naming the PID that holds it. The kernel drops the lock when
  its holder dies (``kill -9`` included), so no stale lock survives a crash.
- :func:`read_records`: ``records.jsonl`` line by line; a line that is not UTF-8, not JSON or not a record
  (:func:`record_problem`) is skipped and counted (its sample reruns), never fatal.
- :func:`read_json`: ``run.json``; damaged, it is refused with the line and column. :func:`declared_tasks`:
  the tasks' declared metadata it records (``task_meta``).
- :func:`check_regular`: refuses a directory, a device (``/dev/full``, ``/dev/zero``), a FIFO or a socket
  where a regular file belongs (reading a device never ends).
- :class:`RecordWriter`: appends one fsync'ed line per finished sample; a full disk or an unwritable file
  becomes an :class:`LctxError` that says how many samples are kept and that rerunning resumes.
- :func:`atomic_write`: tables and metadata go to a temporary file renamed over the target, so a failed
  write (full disk) leaves the previous version intact.
- :func:`sign_record` / :func:`record_digest`: each record carries a digest binding it to its invocation's
  entry in ``run.json`` (:data:`SALT`), so a line appended or edited by hand is told apart from the runner's
  (:func:`lctx.harness.run.tables.vet_records` leaves it out of the tables).

Nothing written here holds a secret: a record is redacted (:func:`lctx.outside.clean`: the API key and
credential patterns in every string, keys included) before it is signed and again as it is written, ``run.json`` and
every JSON written through :func:`atomic_write_json` likewise, and the lock file's command line too. Their raw control
characters are left to JSON, which writes C0 as ``\\u001b``-style escapes and, ASCII-only, every C1 and bidi
character too. Outside text quoted in a message here (a lock file's holder, a symlink's target, a damaged record's
field) is capped (:func:`lctx.outside.quote`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform
import secrets
import socket
import stat
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from lctx.errors import LctxError
from lctx.outside import clean, quote, redact

LOCK_NAME = ".lctx.lock"
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket"}


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def check_regular(path: Path, what: str | None = None, fix: str | None = None) -> bool:
    """Whether ``path`` exists as a regular file (a symlink counts by its target).

    ``fix``: the remedy the error names (default: move it away or pass another ``--out``).

    Returns False when nothing is there. Raises:
        LctxError: something else is there (directory, device, FIFO, socket, dangling symlink), or it
            cannot be inspected.
    """
    what = what or str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise LctxError(f"{what} is a symlink to a missing file ({quote(repr(os.readlink(path)), 200)}); remove it or "
                            "point it at a regular file") from None
        return False
    except OSError as e:
        raise LctxError(f"cannot inspect {what} ({_why(e)}); check the run directory's permissions") from None
    if stat.S_ISREG(st.st_mode):
        return True
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
    raise LctxError(f"{what} is {kind}, not a regular file; " + (fix or "move it away (lctx keeps its results "
                                                                   "in regular files) or pass another --out"))


# ---------------------------------------------------------------------------------------------- JSON

def read_json(path: Path, what: str | None = None) -> dict | None:
    """The JSON object in ``path`` (e.g. ``run.json``), or None when the file does not exist.

    Raises:
        LctxError: not a regular file, unreadable, not UTF-8, not JSON (line and column named) or not an
            object.
    """
    what = what or str(path)
    if not check_regular(path, what):
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise LctxError(f"cannot read {what} ({_why(e)}); check its permissions") from None
    fix = ("restore it, or move it away to start a new run id (the records stay in records.jsonl, but no "
           "run.json vouches for them: they are left out of the tables and their samples rerun)")
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise LctxError(f"{what} is damaged (not UTF-8 text at byte {e.start}); {fix}") from None
    except json.JSONDecodeError as e:
        raise LctxError(f"{what} is damaged (invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}); "
                        f"{fix}") from None
    if not isinstance(obj, dict):
        raise LctxError(f"{what} is damaged (a JSON {type(obj).__name__}, not an object); {fix}")
    return obj


#: The key of ``run.json`` under which each task's declared metadata is recorded when a run starts,
#: {task name: :meth:`lctx.tasks.Task.declaration`}, merged over the runs into one directory.
TASK_META = "task_meta"


def declared_tasks(meta: dict | None) -> dict[str, dict]:
    """The tasks' declared metadata a ``run.json`` (``meta``) records under :data:`TASK_META`: {task name:
    {"headline_metric", "higher_is_better" ({metric: bool}), "retrieval", "secondary_metric", "axes",
    "uses_seed", ...}}; entries that are not objects are left out, and a run directory written before they
    were recorded gives {} (its readers fall back to the task registry). Torch-free: ``lctx compare`` reads it."""
    tm = (meta or {}).get(TASK_META)
    return {str(k): v for k, v in tm.items() if isinstance(v, dict)} if isinstance(tm, dict) else {}


# ---------------------------------------------------------------------------------------------- records

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def record_problem(rec) -> str | None:
    """Why ``rec`` (one parsed ``records.jsonl`` line) is not a usable record, or None when it is.

    A record is a JSON object with ``model`` and ``task`` (non-empty strings), ``status`` (``"ok"`` or
    ``"error"``), ``metrics`` (an object of numbers, or nulls in an errored record), ``sample`` (an
    integer), ``length`` (an integer or null) and ``depth`` (a number or null); ``unavailable``, when there, is
    an object {metric: reason} of metrics the model could not give, none of them in ``metrics``.
    """
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    for k in ("model", "task"):
        if not isinstance(rec.get(k), str) or not rec.get(k):
            return f"no {k!r}"
    if rec.get("status") not in ("ok", "error"):
        return "no status ok/error"
    m = rec.get("metrics")
    if not isinstance(m, dict):
        return "no 'metrics' object"
    for k, v in m.items():
        if not isinstance(k, str) or not (_is_num(v) or (v is None and rec["status"] != "ok")):
            return f"metric {k!r} is not a number"
        if rec["status"] == "ok" and not math.isfinite(v):
            return f"metric {k!r} is not finite in an ok record"
    u = rec.get("unavailable", {})
    if not isinstance(u, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in u.items()):
        return "'unavailable' is not an object of reasons (text)"
    if set(u) & set(m):
        return f"metric {min(set(u) & set(m))!r} is both a value and unavailable"
    if not _is_int(rec.get("sample")):
        return "no integer 'sample'"
    if rec.get("length") is not None and not _is_int(rec.get("length")):
        return "'length' is not an integer"
    if rec.get("depth") is not None and not _is_num(rec.get("depth")):
        return "'depth' is not a number"
    return None


def read_records(path: Path, report: Callable[[str], None] | None = None) -> list[dict]:
    """The valid records of a ``records.jsonl`` (empty when it does not exist).

    Lines that are not UTF-8, not JSON or not a record (:func:`record_problem`) are skipped: their samples
    count as not done and rerun. ``report``, if given, is called once with a warning that counts them and
    names the first few line numbers (a torn last line is what a killed run leaves).

    Raises:
        LctxError: the path is not a regular file (:func:`check_regular`) or cannot be read.
    """
    if not check_regular(path):
        return []
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise LctxError(f"cannot read {path} ({_why(e)}); check its permissions") from None
    out, bad = [], []
    lines = data.split(b"\n")
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            bad.append((i, "torn write" if i == len(lines) else "not JSON"))
            continue
        why = record_problem(rec)
        if why is not None:
            bad.append((i, why))
            continue
        out.append(rec)
    if bad and report is not None:
        shown = ", ".join(f"{i} ({quote(why, 120)})" for i, why in bad[:5])  # a reason can quote the line's keys
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        report(f"warning: {path}: {len(bad)} line{'s' if len(bad) != 1 else ''} could not be read and "
               f"{'are' if len(bad) != 1 else 'is'} skipped (line {shown}{more}); their samples rerun")
    return out


#: The key of a ``run.json`` invocation entry (``invocations``) that holds the salt of its records' digests
#: (:func:`record_digest`); an entry without one was written before records carried digests (legacy).
SALT = "record_salt"
#: The record field holding its digest.
DIGEST = "digest"


def new_salt() -> str:
    """A fresh random salt for one invocation's record digests (32 hex digits)."""
    return secrets.token_hex(16)


def record_digest(rec: dict, salt: str) -> str:
    """The digest of a record (32 hex digits): SHA-256 over the salt of its invocation (``run.json``'s
    ``invocations[i][SALT]``), its ``invocation`` id and its canonical JSON (keys sorted, no spaces; every
    field but :data:`DIGEST` itself), as written to ``records.jsonl`` and read back.

    Not a signature and not meant as cryptographic security: the salt is no secret, it sits in ``run.json``
    beside the records, so whoever edits both can forge a record. What it catches is a line of
    ``records.jsonl`` appended, copied or edited after it was written (another value, another model, an
    invocation that is not the record's own) and a record of another run directory pasted in (its salt is
    not this directory's).
    """
    body = json.loads(json.dumps({k: v for k, v in rec.items() if k != DIGEST}))  # as read back from the file
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{salt}\n{rec.get('invocation')}\n{canon}".encode()).hexdigest()[:32]


def sign_record(rec: dict, salt: str) -> dict:
    """Redact ``rec`` in place (:func:`lctx.outside.clean`: a sample's error that quotes a server echoing the API key,
    a task option or a model id holding it), then set ``rec[DIGEST]`` to :func:`record_digest` of what is left
    (``rec`` complete: invocation and every other field set), so the digest matches the line written; returns
    ``rec``."""
    cleaned = clean(rec)
    rec.clear()
    rec.update(cleaned)
    rec[DIGEST] = record_digest(rec, salt)
    return rec


class RecordWriter:
    """Appends records to ``records.jsonl``: one ``os.write`` of a whole line, then ``fsync``, per sample.

    Raises (from the constructor and :meth:`write`):
        LctxError: the file is not a regular file, cannot be opened for appending (read-only, immutable,
            a directory) or a write fails (full disk, quota); the message counts the samples kept.
    """

    def __init__(self, path: Path, kept: int = 0):
        self.path, self.written, self.kept = Path(path), 0, kept
        check_regular(self.path)
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise LctxError(f"cannot append to {self.path} ({_why(e)}); make it writable (chmod u+w, "
                            "chattr -i) or pass another --out") from None
        try:  # a run killed mid-write leaves a torn last line: end it, so the next record starts clean
            size = os.fstat(self.fd).st_size
            if size:
                with open(self.path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        self._write(b"\n")
        except OSError as e:
            self.close()
            raise self._error(e) from None

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def _error(self, e: OSError) -> LctxError:
        n = self.kept + self.written
        return LctxError(f"cannot write {self.path} ({_why(e)}); {n} finished sample{'s are' if n != 1 else ' is'} "
                         "kept: free space (or fix the permissions) and rerun the same command to resume")

    def write(self, rec: dict) -> None:
        """Append ``rec`` as one JSON line and fsync it, redacted (:func:`lctx.outside.clean`; a record
        :func:`sign_record` signed is redacted already, so its digest still matches)."""
        try:
            self._write((json.dumps(clean(rec)) + "\n").encode())
            os.fsync(self.fd)
        except OSError as e:
            raise self._error(e) from None
        self.written += 1

    def close(self) -> None:
        """Close the file (idempotent)."""
        if getattr(self, "fd", None) is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- writes

def atomic_write(path: Path, write: Callable[[Path], None], what: str | None = None) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, fsync it and rename it over ``path``, so a
    failed write leaves the previous ``path`` intact (and a symlink at ``path`` is replaced, not followed).

    Raises:
        LctxError: the write or the rename fails (full disk, permissions); the message says the records
            are safe and a rerun rewrites the file.
    """
    path = Path(path)
    fd, tmp = None, None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        fd = None
        write(Path(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise LctxError(f"cannot write {what or path} ({_why(e)}); the records are safe in records.jsonl: "
                        "free space (or fix the permissions) and rerun the same command to rewrite it") from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


def atomic_write_text(path: Path, text: str, what: str | None = None) -> Path:
    """:func:`atomic_write` of a text."""
    return atomic_write(path, lambda p: p.write_text(text), what)


def atomic_write_json(path: Path, obj: dict, what: str | None = None) -> Path:
    """:func:`atomic_write` of a JSON object (indented), redacted (:func:`lctx.outside.clean`: ``run.json``'s trust
    probe reason that quotes a server echoing the API key, an argv or a model id holding it); a value JSON cannot
    hold is written as its ``str()``, redacted too."""
    return atomic_write_text(path, json.dumps(clean(obj), indent=2, default=lambda o: redact(str(o))), what)


# ---------------------------------------------------------------------------------------------- lock

_HELD: dict[str, list] = {}  # realpath of a run dir -> [fd or None, depth]: re-entrant within a process


def _holder(path: Path) -> str:
    for _ in range(10):  # the holder writes its PID right after locking: give it a moment
        try:
            info = json.loads(Path(path).read_text() or "null")
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and info.get("pid"):  # the lock file is outside text: each field quoted
            host = info.get("host")
            here = host in (None, socket.gethostname())
            return (f"PID {quote(info['pid'], 20)}{'' if here else ' on ' + quote(host, 80)}"
                    + (f", started {quote(info['started'], 40)}" if info.get("started") else ""))
        time.sleep(0.05)
    return "PID unknown"


def _acquire(out_dir: Path):
    path = out_dir / LOCK_NAME
    check_regular(path, f"lock file {path}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise LctxError(f"cannot create the lock file {path} ({_why(e)}); pass a writable --out") from None

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LctxError(f"{out_dir} is in use by another lctx run ({_holder(path)}); wait for it to finish, "
                        "or pass another --out") from None
    except OSError as e:  # a file system without locks (some network mounts): go on, say so
        print(f"warning: cannot lock {out_dir} ({_why(e)}); do not start a second run on it", file=sys.stderr)
        return fd
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": redact(" ".join(sys.argv))[:500], "python": platform.python_version()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError:
        pass  # a full disk: the lock holds all the same, only the PID is not on record
    return fd


def check_not_locked(out_dir: Path) -> None:
    """Refuse, before any model or data loads, a run directory another process holds (:func:`run_dir_lock`),
    so a second ``lctx run`` on a busy ``--out`` answers at once instead of after loading everything. A
    shared probe of the lock file (it creates nothing; shared locks do not block each other, so torchrun
    ranks probing together do not either); the lock itself is still taken by :func:`run_dir_lock`.

    Raises:
        LctxError: another process holds the lock (the message names its PID).
    """
    path = Path(out_dir) / LOCK_NAME
    if os.path.realpath(out_dir) in _HELD or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # run_dir_lock says what is wrong with it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LctxError(f"{out_dir} is in use by another lctx run ({_holder(path)}); wait for it to finish, "
                        "or pass another --out") from None
    except OSError:
        pass  # no locks on this file system: run_dir_lock warns
    finally:
        os.close(fd)  # drops the probe's shared lock


def _release(fd) -> None:
    try:
        os.ftruncate(fd, 0)  # the next holder's PID, not a stale one, is what a refused run reads
    except OSError:
        pass
    os.close(fd)  # closing drops the flock


@contextlib.contextmanager
def run_dir_lock(out_dir: Path, dinfo=None) -> Iterator[None]:
    """Hold the run directory's lock for the duration of the ``with`` block (re-entrant in one process;
    the directory is created if needed). Under ``torchrun`` (``dinfo.distributed``) rank 0 takes it for
    the job and every rank learns whether it got it.

    Raises:
        LctxError: another process holds the lock (the message names its PID), or the directory or the
            lock file cannot be created.
    """
    out_dir = Path(out_dir)
    distributed = dinfo is not None and dinfo.distributed
    is_main = dinfo is None or dinfo.is_main
    key = os.path.realpath(out_dir)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    fd, err = None, None
    if is_main:
        try:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LctxError(f"cannot create --out {str(out_dir)!r} ({_why(e)}); pass a writable directory") from None
            fd = _acquire(out_dir)
        except LctxError as e:
            err = str(e)
    if distributed:
        err = dinfo.broadcast(err)  # [distributed] every rank learns whether rank 0 got the lock
    if err:
        if fd is not None:
            _release(fd)
        raise LctxError(err)
    _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            del _HELD[key]
            if fd is not None:
                _release(fd)
