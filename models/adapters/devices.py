"""Device and dtype names as users write them (``--device auto``, ``--dtype bf16``) resolved to torch objects;
one resolver for every command (the model adapter, training, ``plan``, ``bench``, GGUF conversion)."""

from __future__ import annotations

import torch

from lctx.errors import LctxError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    """Map a dtype name (float32/fp32, bfloat16/bf16, float16/fp16) to a torch dtype.

    Raises:
        LctxError: unknown name.
    """
    if name not in DTYPES:
        raise LctxError(f"unknown dtype {name!r}; use one of float32, bfloat16, float16")
    return DTYPES[name]


def resolve_device(name) -> torch.device:
    """``"auto"`` -> cuda if available else cpu; otherwise the named device (``cpu``, ``cuda``, ``cuda:N``,
    ``mps``), checked to exist on this machine.

    Raises:
        LctxError: the name is not a device, or it names a CUDA device (or index) or MPS this machine lacks.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise LctxError(f"unknown device {name!r}; use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LctxError(f"device {name!r} requested but this machine has no CUDA GPU; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise LctxError(f"device {name!r} does not exist ({torch.cuda.device_count()} GPU(s)); pass cuda:0")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise LctxError(f"device {name!r} requested but MPS is not available here; use --device cpu")
    return dev
