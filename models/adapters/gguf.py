"""GGUF checkpoints (llama.cpp's single-file format) as Hugging Face directories, through transformers' own
GGUF support (``from_pretrained(dir, gguf_file=...)``, the ``gguf`` package; reference: transformers
``modeling_gguf_pytorch_utils.py`` and the GGUF spec in ggml-org/ggml ``docs/gguf.md``).

transformers reads the config, the tokenizer (with its chat template) and the tensors from the file and
dequantises every tensor (Q4_0, Q4_1, Q8_0, K-quants, ...) to float; lctx then saves the result as a plain
Hugging Face directory (``model.safetensors``, ``config.json``, tokenizer files, ``lctx_gguf.json`` naming
the source file and its SHA-256). That directory is cached under ``<cache root>/gguf/<sha256>-<dtype>/``,
keyed by the file's **content** hash, so the next load of the same bytes takes seconds and a changed file
(same name, same size, same mtime or not) never meets a stale cache. The cache root is ``--cache-dir`` /
``LCTX_CACHE_DIR`` when given, else the user cache directory (``$XDG_CACHE_HOME/lctx``, default
``~/.cache/lctx``).

Dequantised weights are not the original weights: a Q4_1 file gives the values llama.cpp computes with,
stored exactly in float32 (``--dtype bfloat16`` rounds them once more).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from lctx.errors import LctxError
from lctx.model_files import check_header, sha256_file, user_cache_root

META_FILE = "lctx_gguf.json"  # provenance of a converted directory (source file, sha256, dtype)


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]


def _expected_size(path: Path) -> int | None:
    """Bytes a complete file needs (end of its last tensor) when the header and tensor table parse."""
    try:
        from gguf import GGUFReader  # lazy: loads gguf and numpy (lctx.cli imports this module)

        r = GGUFReader(str(path))
        return max(int(t.data_offset) + int(t.n_bytes) for t in r.tensors) if r.tensors else None
    except Exception:  # noqa: BLE001 - a damaged table: the caller reports the original error
        return None


def _load_error(path: Path, e: BaseException) -> LctxError:
    """Turn a transformers/gguf failure on ``path`` into one line: unsupported architecture, truncated
    file, or damaged file."""
    msg = _first_line(e)
    if "is not supported yet" in msg or "architecture" in msg.lower() and "support" in msg.lower():
        import transformers  # lazy: loads transformers
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES  # lazy: loads torch, transformers

        arch = msg.split("architecture", 1)[-1].split("is not", 1)[0].strip() or "?"
        return LctxError(f"GGUF file {str(path)!r} holds a {arch!r} model, an architecture transformers "
                         f"{transformers.__version__} cannot load from GGUF (it can: "
                         f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); use a Hugging Face directory of "
                         "the model instead")
    size = path.stat().st_size
    need = _expected_size(path)
    if need is not None and need > size:
        return LctxError(f"GGUF file {str(path)!r} is truncated ({size:,} bytes; its tensors need {need:,}); "
                         "download or copy it again")
    return LctxError(f"GGUF file {str(path)!r} is truncated or damaged ({type(e).__name__}: {msg}); "
                     "download or copy it again")


@contextlib.contextmanager
def _gguf_progress(enabled: bool):
    """Within the block, transformers' "Converting and de-quantizing GGUF tensors" bar shows only when
    ``enabled``: that bar is a plain ``tqdm.auto.tqdm`` of ``transformers.modeling_gguf_pytorch_utils``, which
    ``transformers.utils.logging.disable_progress_bar`` does not reach (transformers 5.x), so ``--no-progress``
    swaps the module's ``tqdm`` for a disabled one and restores it after."""
    mod = None
    if not enabled:
        try:
            import transformers.modeling_gguf_pytorch_utils as mod  # lazy: loads transformers
        except ImportError:  # another layout: nothing to silence
            mod = None
    bar = getattr(mod, "tqdm", None)
    if bar is not None:
        mod.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            mod.tqdm = bar


def convert_gguf(src: str | os.PathLike, out: str | os.PathLike, dtype: str = "float32",
                 sha256: str | None = None, progress: bool = True) -> Path:
    """Dequantise a GGUF checkpoint into a Hugging Face directory ``out`` (written whole, then moved into
    place): ``model.safetensors`` in ``dtype``, ``config.json``, the tokenizer (its chat template
    included) and ``lctx_gguf.json`` = {source, source_name, sha256, size_bytes, dtype, transformers}.

    Returns ``out``. Takes about 30 s for a 135M-parameter Q4_1 file on 2 CPU cores; ``progress`` False hides
    transformers' de-quantising bar (``lctx run --no-progress``).

    Raises:
        LctxError: not a GGUF file, truncated or damaged, an architecture transformers cannot load from
            GGUF, or an unknown dtype.
    """
    import torch  # noqa: F401  (lazy: loads torch; fails early without it)
    import transformers  # lazy: loads transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: loads transformers
    from transformers.utils import logging as hf_logging  # lazy: loads transformers

    from lctx.models.adapters.devices import resolve_dtype  # lazy: loads torch

    src = Path(src)
    if not src.is_file():
        raise LctxError(f"GGUF file {str(src)!r} does not exist; pass the path of a .gguf file")
    check_header(src)
    dt = resolve_dtype(dtype)
    digest = sha256 or sha256_file(src)
    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        with _gguf_progress(progress):
            model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=dt)
    except LctxError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers/gguf raise many kinds; classify into one line
        raise _load_error(src, e) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    # transformers marks a GGUF-loaded model as "quantized" (its GGUF quantizer only dequantised the
    # tensors) and refuses to save it; the weights are plain tensors now, so drop the marks
    model.hf_quantizer = None
    for attr in ("is_quantized", "quantization_method"):
        if attr in model.__dict__:
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / META_FILE).write_text(json.dumps(
            {"source": str(src.resolve()), "source_name": src.name, "sha256": digest,
             "size_bytes": src.stat().st_size, "dtype": str(dt).replace("torch.", ""),
             "transformers": transformers.__version__}, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def cached_gguf_dir(src: str | os.PathLike, dtype: str = "float32", cache_dir: str | os.PathLike | None = None,
                    log=None, progress: bool = True) -> tuple[Path, str]:
    """The Hugging Face directory of a GGUF file, converted on first use into
    ``<cache root>/gguf/<sha256>-<dtype>/`` (see the module docstring); returns (directory, sha256).

    A cache entry counts only when complete (its ``lctx_gguf.json`` names the same hash); a half-written
    one from a killed process is rebuilt. Two processes converting at once each write a private temporary
    directory and the later rename wins, so neither sees a partial directory. ``progress``: as
    :func:`convert_gguf`.

    Raises:
        LctxError: as :func:`convert_gguf`, or a cache root that cannot be written.
    """
    from lctx.models.adapters.devices import resolve_dtype  # lazy: loads torch

    src = Path(src)
    check_header(src)
    dt = str(resolve_dtype(dtype)).replace("torch.", "")
    digest = sha256_file(src)
    root = Path(cache_dir) if cache_dir not in (None, "") else user_cache_root()
    target = root / "gguf" / f"{digest}-{dt}"
    try:
        meta = json.loads((target / META_FILE).read_text())
        if meta.get("sha256") == digest and any(target.glob("*.safetensors")):
            return target, digest
    except (OSError, ValueError):
        pass
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LctxError(f"cannot write the GGUF cache under {str(root)!r} ({e.strerror or e}); pass a writable "
                        "--cache-dir") from None

    t0 = time.perf_counter()
    convert_gguf(src, target, dtype=dt, sha256=digest, progress=progress)
    if log:  # after the conversion, so that a refused file gets its one error line alone
        log(f"dequantised {src.name} to {dt} in {time.perf_counter() - t0:.0f} s; cached in {target}")
    return target, digest
