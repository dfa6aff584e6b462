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
import mmap
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

from lctx.defaults import DTYPE
from lctx.errors import LctxError
from lctx.model_files import (GGUF_STRING_ARRAY_LIMIT, SkippedArray, check_header, read_gguf_header,  # noqa: F401
                               sha256_file, user_cache_root)  # the header reader lives below torch: lctx run's checks use it

META_FILE = "lctx_gguf.json"  # provenance of a converted directory (source file, sha256, dtype)

#: architectures whose config transformers derives from more than the metadata keys (tensor shapes, special
#: cases in ``load_gguf_checkpoint``) or through its own metadata reader: :func:`gguf_config` leaves them to
#: ``AutoConfig.from_pretrained(..., gguf_file=...)``
_GGUF_CONFIG_BY_TRANSFORMERS = ("t5", "t5encoder", "umt5", "stablelm", "gpt_oss", "gpt-oss", "lfm2",
                                "minimax-m2", "qwen35", "qwen35moe")


def gguf_config_dict(meta: dict, tensor_names: list[str]) -> dict | None:
    """The transformers config dict of a GGUF file from its header (:func:`read_gguf_header`), built as
    transformers' ``load_gguf_checkpoint(path, return_tensors=False)["config"]`` builds it (transformers
    ``modeling_gguf_pytorch_utils.py``: the architecture renames, ``tie_word_embeddings`` from the absence of
    ``output.weight``, ``GGUF_CONFIG_DEFAULTS_MAPPING``, the keys renamed by ``GGUF_CONFIG_MAPPING``, Gemma 3/4's
    text model types, ``vocab_size`` from the vocabulary's length) but without reading the vocabulary.
    ``None`` for the architectures transformers treats specially (:data:`_GGUF_CONFIG_BY_TRANSFORMERS`).

    Raises:
        ValueError: an architecture transformers cannot load from GGUF (``... is not supported yet``, the
            message :func:`_load_error` recognises).
    """
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING  # lazy: loads transformers

    try:  # transformers >= 4.50
        from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING  # lazy: loads transformers
    except ImportError:
        GGUF_CONFIG_DEFAULTS_MAPPING = {}
    arch = str(meta["general.architecture"])
    if arch in _GGUF_CONFIG_BY_TRANSFORMERS:
        return None
    name = meta.get("general.name")
    updated = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}.get(arch, arch)
    if "llama" in arch and name == "mistral":  # transformers: `"mistral" in [general.name]`
        updated = "mistral"
    if arch not in GGUF_CONFIG_MAPPING and updated not in GGUF_CONFIG_MAPPING:
        raise ValueError(f"GGUF model with architecture {arch} is not supported yet.")
    config: dict = {"tie_word_embeddings": "output.weight" not in tensor_names or arch in ("falcon", "bloom")}
    for k, v in (GGUF_CONFIG_DEFAULTS_MAPPING.get(updated) or GGUF_CONFIG_DEFAULTS_MAPPING.get(arch) or {}).items():
        config.setdefault(k, v)
    for key, v in meta.items():
        prefix, _, sub = key.replace(arch, updated).partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(sub, -1)
        if renamed in (-1, None) or isinstance(v, SkippedArray):
            continue
        if isinstance(v, list) and len(v) == 1:
            v = v[0]
        if isinstance(v, str) and arch in v:
            v = v.replace(arch, updated)
        config[renamed] = v
    if config.get("model_type") in ("gemma3", "gemma4"):  # the GGUF holds the text backbone only
        config["model_type"] += "_text"
        if config["model_type"] == "gemma4_text":
            config["eos_token_id"] = [1, 106, 50]
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in meta:
        config["vocab_size"] = int(meta["tokenizer.ggml.tokens"] if isinstance(meta["tokenizer.ggml.tokens"], int)
                                   else len(meta["tokenizer.ggml.tokens"]))
    return config


def gguf_config(path: str | os.PathLike):
    """The transformers config of a GGUF file, read from its header (:func:`read_gguf_header`,
    :func:`gguf_config_dict`; well under a second, no tensor read, nothing written), as ``AutoConfig`` builds it
    from the same dict. Architectures transformers treats specially go through
    ``AutoConfig.from_pretrained(dir, gguf_file=name)`` (reads the whole header with ``gguf.GGUFReader``).

    Raises:
        LctxError: not a GGUF file, a damaged header, or an architecture transformers cannot load from GGUF.
    """
    from transformers import AutoConfig  # lazy: loads transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # lazy: loads transformers

    path = Path(path)
    meta, names = read_gguf_header(path)
    try:
        config = gguf_config_dict(meta, names)
        if config is None:
            return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        out = CONFIG_MAPPING[config["model_type"]].from_dict(config)
        out.name_or_path = str(path.parent)  # as AutoConfig.from_pretrained(path.parent, gguf_file=...) sets it
        return out
    except LctxError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; classify into one line
        raise _load_error(path, e) from None


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


def convert_gguf(src: str | os.PathLike, out: str | os.PathLike, dtype: str = DTYPE,
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


def cached_gguf_dir(src: str | os.PathLike, dtype: str = DTYPE, cache_dir: str | os.PathLike | None = None,
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
