"""Fast paths (Triton / FlexAttention / fla-core) of the attention variants.

The dense PyTorch references in :mod:`lctx.models` are the source of truth; every kernel here has a
test comparing it to its reference. One module per op (flat files, so packaging needs no new entry):

- ``flash_prior``: causal flash attention with a positional prior read from a Toeplitz table (ALiBi /
  GGD-BAM / none) and the Scalable-Softmax per-query scale; Triton, FlexAttention, and the blocked CPU path.
- ``lsh_blocks``: block-local attention over the sampled positional-LSH bins (alibi_lsh).
- ``interdomain_scan``: chunked scan of the complex-diagonal S4D state (interdomain / s4d): Triton, the
  CPU form vectorised over chunks, and the decode step.

Which path runs is ``config.attn_impl`` (``lctx run --attn-impl``), an entry of the one registry
:data:`lctx.attn_impl.ATTN_IMPL_REGISTRY` that layers look up where their forward starts (its attributes, not
the name, decide: ``kernels`` tries this package's kernels, ``explicit`` is the reference, ``fallback`` runs
where a call has no kernel):

- ``"reference"``: the dense PyTorch reference.
- ``"sdpa"``: the reference maths through ``scaled_dot_product_attention`` (bias as a float mask).
- ``"fast"``: the variant's kernel: Triton where Triton can run (:func:`triton_runs`), else the best
  CPU path (``blocked``: SDPA per query block with the prior as a view of its Toeplitz table;
  ``alibi_lsh``'s ``lsh-blocks`` kernel, or ``lsh-exact-alibi``: exact ALiBi where that is estimated cheaper;
  ``vectorized``: the fixed-state scans over all chunks at once); a variant without a fast path uses
  ``"sdpa"``. Every variant picks its kernel by one rule, :func:`choose_kernel`. The path that actually
  ran (``sdpa`` and PaTH's ``fla`` / ``reference`` included) is reported by :func:`record_impl` /
  :func:`impls_used` and lands in the results table (``attn_kernel``).

Threads on CPU: :func:`default_threads` / :func:`configure_threads` (the CLI's policy) and
:func:`scan_threads` / :func:`intra_op_threads` (the fixed-state scans); docs/kernels-and-bench.md#threads.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

_USED: dict[str, list[str]] = {}


def triton_runs(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run for tensors on ``device``: a CUDA device with triton importable,
    or any device under the Triton interpreter (``TRITON_INTERPRET=1``, fp32 only: bf16 ``tl.dot`` is
    broken in the interpreter)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    dev = torch.device(device)
    return dev.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1"


def choose_kernel(variant: str, device: torch.device | str, *, needs_grad: bool, dtype: torch.dtype | None = None,
                  flex: bool = True, cpu: str = "blocked", record: bool = True) -> str:
    """The one rule by which every variant's ``attn_impl="fast"`` picks its kernel, noted with
    :func:`record_impl` (unless ``record=False``: the caller refines the choice and records it itself).

    ``"triton"`` when no gradient is needed (the Triton kernels are forward-only), Triton runs on
    ``device`` (:func:`triton_runs`) and, off CUDA (the interpreter), ``dtype`` is float32 or not given
    (bf16 ``tl.dot`` is broken in the interpreter) and ``LCTX_INTERPRETED_KERNELS`` is not ``0`` (the test
    suite sets it to 0 outside its kernel tests: with ``fast`` the default path, every model test would
    otherwise run the interpreter, hundreds of times slower than the CPU forms); else ``"flex"`` (compiled FlexAttention) on CUDA when
    the variant has a Flex form (``flex``); else ``cpu``, the variant's PyTorch fast form (``"blocked"``,
    ``"vectorized"``). Returns the name chosen.
    """
    dev = torch.device(device)
    interpreted_ok = dev.type == "cuda" or (dtype in (None, torch.float32)
                                            and os.environ.get("LCTX_INTERPRETED_KERNELS", "1") != "0")
    if not needs_grad and triton_runs(dev) and interpreted_ok:
        impl = "triton"
    elif dev.type == "cuda" and flex:
        impl = "flex"
    else:
        impl = cpu
    if record:
        record_impl(variant, impl)
    return impl


def record_impl(variant: str, impl: str) -> None:
    """Note that ``variant``'s attention ran through ``impl`` (e.g. ``"triton"``, ``"flex"``,
    ``"sdpa"``, ``"reference"``, ``"chunked"``) in this process; read back with :func:`impls_used`."""
    seen = _USED.setdefault(variant, [])
    if impl not in seen:
        seen.append(impl)


def impls_used(reset: bool = False) -> dict[str, str]:
    """{variant: implementation} of the attention calls since the last reset; a variant whose calls took
    different paths (e.g. ``alibi_lsh``: exact ALiBi for a short first chunk, LSH later) lists them in the
    order they first ran, joined by ``+``."""
    out = {k: "+".join(v) for k, v in _USED.items()}
    if reset:
        _USED.clear()
    return out


def scan_threads() -> int:
    """Intra-op threads for the fixed-state mixers' CPU scans (``interdomain``, ``s4d``): the environment
    variable ``LCTX_SCAN_THREADS`` (a positive integer, or 0 for torch's current setting), default 1.

    Why 1: those scans are tens of medium-sized ops (batched matmuls, einsums), and every parallel op
    ends in a barrier that waits for the slowest thread; on a machine whose cores are shared (load above
    the core count) a descheduled thread costs the barrier a scheduler time slice. Measured on 2 cores
    at load ~10 (one layer, 16K tokens, one head of dim 64): s4d 0.14 s with 1 thread and
    5.8 s with 2; interdomain 0.23 s and 0.88 s; the model's per-chunk form 0.52 s and 4.5 s.
    """
    try:
        n = int(os.environ.get("LCTX_SCAN_THREADS", "1"))
    except ValueError:
        n = 1
    return max(0, n)


@contextmanager
def intra_op_threads(n: int, device="cpu"):
    """Run the block with torch's intra-op thread count lowered to ``n`` on CPU (restored after); a no-op on
    other devices, for ``n`` <= 0, or when torch already uses ``n`` threads or fewer."""
    old = torch.get_num_threads()
    if torch.device(device).type != "cpu" or n <= 0 or n >= old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


#: torch's own intra-op thread count when lctx was imported (its default: the physical cores, or
#: OMP_NUM_THREADS), before any command changed it
_TORCH_DEFAULT_THREADS = torch.get_num_threads()


def default_threads() -> tuple[int, str]:
    """(intra-op threads, why) lctx uses on CPU: ``LCTX_NUM_THREADS``, else ``OMP_NUM_THREADS``, else torch's
    default (one thread per physical core). A fixed rule, so that two runs of one command on one machine use
    the same count whatever else runs: the count can change timings several-fold under contention and the
    last bits of parallel reductions, so it must not follow other processes' load (docs/kernels-and-bench.md#threads).

    Why not fewer threads on a busy machine: measured on a 2-core machine at load ~9, SDPA
    causal at 16K took 1.3 s with 1 thread and 1.4 s with 2, and the many-op paths lost most (RoPE's old
    rotation, the fixed-state scans); RoPE now computes its tables once and the scans run with
    :func:`scan_threads` (1 by default) whatever this count, so the rest is left to ``LCTX_NUM_THREADS=1``
    on a shared machine.
    """
    for var in THREAD_VARS:
        val = os.environ.get(var, "").strip()
        if val.isdigit() and int(val) > 0:
            return int(val), var
    return max(1, _TORCH_DEFAULT_THREADS), "torch's default (physical cores)"


#: the variables that set lctx's CPU thread count, first one set wins (:func:`default_threads`)
THREAD_VARS = ("LCTX_NUM_THREADS", "OMP_NUM_THREADS")


def configure_threads() -> int:
    """Set torch's intra-op thread count to :func:`default_threads` (call once, at the start of a command
    that computes on CPU). Returns the count.

    Raises:
        LctxError: ``LCTX_NUM_THREADS`` or ``OMP_NUM_THREADS`` is set to something other than a positive whole
            number (it was ignored without a word, while lctx's own busy-machine note recommends the variable).
    """
    from lctx.errors import LctxError  # lazy: kernels stays import-light

    for var in THREAD_VARS:  # default_threads skips an unusable value; here it is the user's mistake
        val = os.environ.get(var, "").strip()
        if val and not (val.isdigit() and int(val) > 0):
            raise LctxError(f"{var}={os.environ[var]!r} is not a positive whole number of threads; write e.g. "
                            f"{var}=1, or unset it")
    n, _ = default_threads()
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n


#: OMP_WAIT_POLICY when torch (and with it OpenMP, which reads it once) was loaded, as far as lctx can tell:
#: lctx.kernels loads right after torch on every lctx path. The CLI sets PASSIVE unless the user chose.
_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")


def thread_settings() -> dict:
    """What decides CPU speed and the last bits of parallel sums, for ``run.json``: ``threads`` (torch's
    intra-op count now), ``threads_source`` (:func:`default_threads`' why) and ``omp_wait_policy`` (None: the
    OpenMP runtime's own, spin then sleep)."""
    return {"threads": torch.get_num_threads(), "threads_source": default_threads()[1],
            "omp_wait_policy": _OMP_WAIT_POLICY}


def busy_note() -> str | None:
    """One line for the start of a CPU command when the machine is busy (1-minute load average above the CPUs
    this process may use) and lctx chose more than one thread itself (no LCTX_NUM_THREADS / OMP_NUM_THREADS):
    the count is not changed (it is a fixed rule, :func:`default_threads`), the user is told the measured
    cost and the fix. None when there is nothing to say (or no load average on this system)."""
    n, why = default_threads()
    if n <= 1 or why.endswith("NUM_THREADS"):
        return None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load <= cpus:
        return None
    return (f"note: this machine is busy (load {load:.1f} on {cpus} CPUs) and lctx runs torch on {n} threads, which "
            f"then wait for each other (measured on 2 cores at load 4-6: a ppl run took 1.0-1.6x its time on 1 thread); "
            f"LCTX_NUM_THREADS=1 lctx ... avoids it (docs/kernels-and-bench.md#threads)")
