"""``lctx bench``: forward time and peak memory of one attention layer per variant x implementation x length.

Each measurement instantiates the variant exactly as the model does (``get_variant(name)(config, 0)`` with
an :class:`lctx.models.LctxConfig` of the asked heads, head dim and ``attn_impl``) and calls it the way
``LctxModel.forward`` does for a fresh prompt: positions from :func:`lctx.models.model.positions_and_mask`
with the lazy pattern (built only if the path asks for it), past = 0, no KV cache, the model-level shared
module (``ggd_bam``'s prior), and a fresh :class:`AttnContext` per call (so per-forward memos, e.g. the
sdpa float mask, are rebuilt as in a real forward). Inputs: random q, k, v [B, H, T, D] and x [B, T, H*D]
(fixed-state and data-dependent variants read x). Nothing here touches a kernel directly: ``attn_impl``
selects the path inside the variant, and :func:`lctx.kernels.impls_used` reports which one ran.

Baselines on the same shapes: ``sdpa_causal`` (``F.scaled_dot_product_attention(q, k, v, is_causal=True)``)
and, for variants with a logit bias (``score_bias`` not ``None``), ``sdpa_bias`` (the same with an explicit
float mask [B, H, T, T] holding the causal -inf and the ALiBi bias, built before timing; skipped when the
mask would exceed a quarter of ``mem_limit``).

Timing is interleaved, because on a shared machine two times taken minutes apart are measured under
different loads and their ratio is not a measurement (ratios of 2.9x-5.9x for the same code).
One process per variant (``isolate``, the default on CPU) measures all its impls and lengths; per
(impl, length) it warms up every function (``warmup`` calls each), measures peak memory, then runs
``repeats`` rounds, each timing SDPA causal, the variant (and SDPA with the bias) back to back, in
alternating order. The row reports the median and min of the variant's times, and of the per-round
ratios variant / baseline (``ratio_sdpa``: median, ``ratio_sdpa_min``: min, ``ratio_sdpa_spread``:
(max - min) / median); ``unstable`` flags a spread above 20 % (the load changed during the row), and
the row records the intra-op thread count and the machine's 1-minute load average before and after.

Memory (``peak_bytes`` for the variant, ``base_peak_bytes`` for SDPA causal; ``mem_method`` column):

- CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before the call (peak stats reset first).
- CPU: the peak resident set size of the process around one call after the warm-up: glibc's
  ``malloc_trim(0)`` first returns freed heap pages to the system, then Linux's ``/proc/self/clear_refs``
  (``5``) resets ``VmHWM`` to the current ``VmRSS``; the peak is ``VmHWM`` after the call minus ``VmRSS``
  before it.

Combinations predicted not to fit (dense T x T buffers, estimated by :func:`estimate_bytes` against
``mem_limit``) or predicted to take longer than ``time_budget`` seconds (extrapolated from the previous
length of the same variant and implementation) are recorded as ``skipped: <reason>``; failures as
``error: <message>``. The scaling exponent is the least-squares slope of log(time) on log(length)
(:func:`fit_exponent`) over the measured lengths of each variant and implementation.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import lctx.models  # noqa: F401  (registers every variant)
from lctx import ATTN_IMPLS, kernels
from lctx.attn_impl import get_attn_impl
from lctx.defaults import CHUNK_SIZE, DTYPE
from lctx.errors import LctxError
from lctx.kernels import default_threads
from lctx.models import LctxConfig
from lctx.models.options import option_schema
from lctx.models.variants import AttentionVariant, AttnContext, alibi_slopes, get_variant

from lctx.harness.run.console import print_table
from lctx.models.adapters.devices import resolve_device, resolve_dtype
from lctx.models.adapters.memory import cache_bytes, device_memory, load_config, plan_memory

IMPLS = ATTN_IMPLS[::-1]  # fastest first
BASELINES = ("sdpa_causal", "sdpa_bias")


@dataclass(kw_only=True)
class _Shapes:
    """The shapes and timing settings a :class:`BenchCase` and a :class:`BenchGroup` share (keyword-only):
    B = ``batch``, H = ``heads``, D = ``head_dim``, ``dtype`` name, ``device``, ``repeats`` timed rounds after
    ``warmup`` untimed calls, variant ``options``, ``seed``."""

    batch: int = 1
    heads: int = 1
    head_dim: int = 64
    dtype: str = DTYPE
    device: str = "cpu"
    repeats: int = 5
    warmup: int = 1
    options: dict = field(default_factory=dict)
    seed: int = 0


@dataclass
class BenchCase(_Shapes):
    """One measurement: ``variant`` (a registered name, or a baseline ``sdpa_causal`` / ``sdpa_bias``)
    with ``impl`` (attn_impl; ``"baseline"`` for baselines) at ``length`` tokens; shapes B = ``batch``,
    H = ``heads``, D = ``head_dim``; ``dtype`` name; ``device``; ``options``: variant options."""

    variant: str
    impl: str
    length: int


# ---------------------------------------------------------------------------------------------------
# building and calling one layer
# ---------------------------------------------------------------------------------------------------

def _torch_dtype(name: str) -> torch.dtype:
    return resolve_dtype(name)


def make_config(variant: str, impl: str, heads: int, head_dim: int, options: dict | None = None):
    """A one-layer :class:`LctxConfig` with ``heads`` x ``head_dim`` channels for ``variant`` and ``impl``.

    Raises:
        LctxError: unknown variant or impl, or sizes the config refuses (e.g. an odd head dim with rope).
    """

    if impl not in IMPLS:
        raise LctxError(f"unknown attention implementation {impl!r}; use {', '.join(IMPLS)}")
    try:
        get_variant(variant)
    except KeyError as e:
        raise LctxError(f"{e.args[0]}; see `lctx list variants`") from None

    schema = option_schema(variant)  # one --option set for several variants: each takes the keys it knows
    opts = {k: v for k, v in (options or {}).items() if schema is None or k in schema}
    try:
        return LctxConfig(hidden_size=heads * head_dim, num_attention_heads=heads, num_hidden_layers=1,
                          variant=variant, attn_impl=impl, variant_options=opts, vocab_size=16)
    except ValueError as e:
        raise LctxError(f"cannot build {variant!r} with {heads} heads of dim {head_dim}: {e}") from None


def make_layer(config, device, dtype: torch.dtype):
    """(variant module, shared module or ``None``) for layer 0 of ``config``, in eval mode on ``device``.

    Raises:
        LctxError: the variant refuses its options (message from the variant).
    """

    cls = get_variant(config.variant)
    try:
        mod = cls(config, 0)
    except ValueError as e:
        raise LctxError(f"variant {config.variant!r}: {e}; fix the --option values") from None
    shared = cls.shared_module(config)
    mod = mod.to(device=device, dtype=dtype).eval()
    if shared is not None:
        shared = shared.to(device=device, dtype=dtype).eval()
    return mod, shared


def make_inputs(B: int, H: int, T: int, D: int, device, dtype: torch.dtype, seed: int = 0):
    """Random q, k, v [B, H, T, D] and x [B, T, H*D] (standard normal, then cast to ``dtype``)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype) for _ in range(3))
    x = torch.randn(B, T, H * D, generator=g).to(device=device, dtype=dtype)
    return q, k, v, x


def make_context(B: int, T: int, device, shared=None):
    """The :class:`AttnContext` ``LctxModel.forward`` builds for T new tokens, no padding, past = 0 and no
    cache: q_pos [B, T], k_pos [B, T], a lazy Tq x Tk pattern, key_valid all true."""
    from lctx.models.model import positions_and_mask  # lazy: loads transformers

    q_pos, k_pos, allowed_fn = positions_and_mask(None, B, T, 0, device, lazy=True)
    return AttnContext(q_pos=q_pos, k_pos=k_pos, allowed_fn=allowed_fn, cache=None, shared=shared,
                       key_valid=torch.ones(B, T, dtype=torch.bool, device=device), padded=False, past=0)


def layer_call(mod, shared, q, k, v, x):
    """One attention forward of a variant as the model makes it (fresh context). Returns [B, H, T, D]."""
    ctx = make_context(q.shape[0], q.shape[2], q.device, shared)
    return mod(q, k, v, ctx, x)


def bias_mask(B: int, H: int, T: int, device, dtype: torch.dtype) -> torch.Tensor:
    """[B, H, T, T] float mask: -inf above the diagonal, ALiBi bias -m_h (i - j) elsewhere (Press et al.
    2022; slopes from :func:`lctx.models.variants.alibi_slopes`)."""

    i = torch.arange(T, device=device)
    dist = (i[:, None] - i[None, :]).to(torch.float32)
    m = -alibi_slopes(H).to(device=device, dtype=torch.float32)[:, None, None] * dist
    m = m.masked_fill(dist < 0, float("-inf")).to(dtype)
    return m[None].expand(B, H, T, T).contiguous()


# ---------------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------------

def _proc_status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Context manager measuring the peak bytes allocated inside it on ``device``; ``.peak`` and
    ``.method`` after exit (see the module docstring: CUDA allocator stats, or VmHWM - VmRSS on CPU with
    a ``clear_refs`` reset; without /proc, ``ru_maxrss`` minus the RSS before, which reads 0 when an
    earlier peak of the process was higher)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.peak, self.method = 0, ""

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.method = "cuda max_memory_allocated - allocated before"
        else:
            _malloc_trim()  # give freed heap pages back, so reusing them shows up in the peak again
            self.base = _proc_status("VmRSS:")
            if self.base is not None and _reset_hwm():
                self.method = "cpu VmHWM - VmRSS (clear_refs reset)"
            else:
                self.base = self.base or 0
                self._ru = True
                self.method = "cpu ru_maxrss - RSS before (lower bound)"
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device) - self.base)
        elif getattr(self, "_ru", False):
            self.peak = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base)
        else:
            self.peak = max(0, (_proc_status("VmHWM:") or 0) - self.base)
        return False


def estimate_bytes(case: BenchCase, probe: dict | None = None) -> int:
    """Estimated peak bytes of one measurement, to skip combinations that cannot fit before running them.

    Inputs and output 5 x B x H x T x D x bytes (q, k, v, out, x) x 2 (copies inside the layer); plus, when
    the path reads the Tq x Tk pattern (``probe["mask_asked"]``, found by :func:`probe_case` at a small
    length): 2 x B x T^2 bytes (pattern and negation); the sdpa float mask (``probe["float_mask"]``)
    2 x B x T^2 x bytes (zeros and the masked_fill copy), and with a bias B x H x T^2 x (4 + bytes); the
    reference path 3 x B x H x T^2 x 4 (scores, masked, probabilities). The same terms as
    :mod:`lctx.models.adapters.memory` with chunk = T.
    Baselines: ``sdpa_bias`` holds its mask B x H x T^2 x bytes. Conservative for blockwise references.
    """
    b = torch.tensor([], dtype=_torch_dtype(case.dtype)).element_size()
    B, H, T, D = case.batch, case.heads, case.length, case.head_dim
    n = 10 * B * H * T * D * b + 32 * B * T
    if case.variant == "sdpa_bias":
        return n + B * H * T * T * b
    if case.variant == "sdpa_causal" or probe is None:
        return n
    if probe.get("mask_asked"):
        n += 2 * B * T * T
        if probe.get("float_mask"):
            n += 2 * B * T * T * b + (B * H * T * T * (4 + b) if probe.get("has_bias") else 0)
        elif get_attn_impl(case.impl).explicit:
            n += 3 * B * H * T * T * 4 + (B * H * T * T * 4 if probe.get("has_bias") else 0)
    return n


def probe_case(case: BenchCase, length: int = 64) -> dict:
    """Run the case once at ``length`` tokens in-process and report what the path did: ``mask_asked``
    (it read the Tq x Tk pattern), ``float_mask`` (it built the sdpa float mask), ``has_bias`` (its
    ``score_bias`` is not ``None``) and ``ran`` (implementations recorded by :mod:`lctx.kernels`)."""

    small = BenchCase(**{**asdict(case), "length": length})
    dev, dt = torch.device(small.device), _torch_dtype(small.dtype)
    mod, shared = make_layer(make_config(small.variant, small.impl, small.heads, small.head_dim, small.options), dev, dt)
    q, k, v, x = make_inputs(small.batch, small.heads, length, small.head_dim, dev, dt, small.seed)
    kernels.impls_used(reset=True)
    ctx = make_context(small.batch, length, dev, shared)
    with torch.inference_mode():
        mod(q, k, v, ctx, x)
        has_bias = (type(mod).score_bias is not AttentionVariant.score_bias
                    and mod.score_bias(ctx.q_pos, ctx.k_pos, ctx) is not None)
    return {"mask_asked": ctx.allowed is not None,
            "float_mask": any(isinstance(key, tuple) and key and key[0] == "mask" for key in ctx.memo),
            "has_bias": bool(has_bias), "ran": ",".join(sorted(set(kernels.impls_used(reset=True).values())))}


# ---------------------------------------------------------------------------------------------------
# one group: a variant's lengths x impls, each timed alternately with its baselines
# ---------------------------------------------------------------------------------------------------

def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return float("nan") if not n else float(s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2)


def load_average() -> float:
    """The machine's 1-minute load average (``os.getloadavg``; NaN where there is none)."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return float("nan")


@dataclass
class BenchGroup(_Shapes):
    """What one worker process measures: ``variant`` x ``impls`` x ``lengths`` with shapes B = ``batch``,
    H = ``heads``, D = ``head_dim``, timing ``repeats`` interleaved rounds after ``warmup`` untimed calls of
    each function, skipping a case estimated above ``mem_limit`` bytes or predicted above ``time_budget``
    seconds; ``baselines`` times SDPA causal (and, for bias variants, SDPA with a bias mask) alongside;
    ``threads``: intra-op thread counts (``torch.set_num_threads``), an int or a list measured in the same
    interleaved rounds (one row each); ``None`` keeps torch's default; ``min_time``: seconds each timing
    spans at least: a function faster than that is called ``ceil(min_time / t)`` times per timing (at most
    :data:`MAX_CALLS`) and its time per call is the timing over the calls, as ``timeit``'s autorange does,
    so that a call of tens of milliseconds is not at the mercy of one scheduler hiccup."""

    variant: str
    impls: list
    lengths: list
    mem_limit: int = 8 << 30
    time_budget: float = 300.0
    baselines: bool = True
    threads: int | list | None = None
    min_time: float = 0.1


MAX_CALLS = 100  # most calls one timing makes (autorange), so a sub-millisecond call cannot stall a bench


def _timed(fn, dev, number: int = 1) -> float:
    """Seconds per call of ``fn``: ``number`` calls back to back, then a device sync, over ``number``."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    _sync(dev)
    return (time.perf_counter() - t0) / number


def calls_per_timing(fns: dict, dev, min_time: float) -> dict:
    """Autorange: for each function of ``fns`` ({name: callable}), the number of calls one timing makes so
    that it spans at least ``min_time`` seconds, from one probe call: ``ceil(min_time / t)``, clamped to
    [1, :data:`MAX_CALLS`]. ``min_time`` <= 0 gives 1 call each (the old one-call timings)."""
    if min_time <= 0:
        return {n: 1 for n in fns}
    out = {}
    for n, fn in fns.items():
        t = _timed(fn, dev)
        out[n] = max(1, min(MAX_CALLS, math.ceil(min_time / t))) if t > 0 else MAX_CALLS
    return out


def interleave(fns: dict, repeats: int, dev, numbers: dict | None = None) -> dict[str, list[float]]:
    """Time every function of ``fns`` ({name: callable}) once per round, ``repeats`` rounds, in an order
    that alternates (forward on even rounds, backward on odd ones) so that a slow drift of the machine
    weighs on each function alike; ``numbers`` ({name: calls per timing}, default 1 each, see
    :func:`calls_per_timing`). Returns {name: [seconds per call, one per round]}."""
    names = list(fns)
    numbers = numbers or {}
    out = {n: [] for n in names}
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            out[n].append(_timed(fns[n], dev, numbers.get(n, 1)))
    return out


def pair_stats(var: list[float], base: list[float]) -> dict:
    """Statistics of the per-round ratios var_r / base_r (each pair timed back to back): min, median and
    spread = (max - min) / median of the ratios."""
    ratios = [a / b for a, b in zip(var, base) if b > 0]
    if not ratios:
        return {"min": float("nan"), "median": float("nan"), "spread": float("nan")}
    med = _median(ratios)
    return {"min": min(ratios), "median": med, "spread": (max(ratios) - min(ratios)) / med if med > 0 else float("nan")}


UNSTABLE = 0.20  # a row whose per-pair ratios spread by more than this fraction of their median is flagged


def _nan_row(group: BenchGroup, impl: str, T: int, status: str) -> dict:
    return {"variant": group.variant, "impl": impl, "length": T, "status": status, "threads": thread_counts(group)[0]}


def thread_counts(group: BenchGroup) -> list[int]:
    """The intra-op thread counts a group measures at: ``group.threads`` (an int or a list), or lctx's
    default (:func:`lctx.kernels.default_threads`: LCTX_NUM_THREADS / OMP_NUM_THREADS, else torch's)."""
    th = group.threads
    if th is None:
        return [default_threads()[0]]
    return [int(t) for t in (th if isinstance(th, (list, tuple)) else [th])]


def _at_threads(n: int, fn):
    def call():
        torch.set_num_threads(n)
        return fn()
    return call


def measure_case(group: BenchGroup, impl: str, T: int, probe: dict | None) -> list[dict]:
    """Measure ``group.variant`` with ``impl`` at T tokens in this process: warm-up, the peak memory of one
    call of the variant and of SDPA causal (:class:`PeakMemory`), then ``repeats`` interleaved rounds of
    (SDPA causal, variant[, SDPA with the ALiBi bias mask]) at each thread count of
    :func:`thread_counts` (all in the same rounds). Returns one row (dict) per thread count: times
    (median, min), ratios to each baseline at that thread count (median and min of the per-round ratios,
    their spread, ``unstable``), ``ratio_threads`` (median per-round time over the time at the first
    thread count), peaks, load average before and after, the kernel that ran and ``status``."""

    dev, dt = torch.device(group.device), _torch_dtype(group.dtype)
    B, H, D = group.batch, group.heads, group.head_dim
    counts = thread_counts(group)
    base_row = {"variant": group.variant, "impl": impl, "length": T, "load_avg_start": load_average(), "status": "ok"}
    rows = [dict(base_row, threads=n) for n in counts]
    try:
        with torch.inference_mode():
            q, k, v, x = make_inputs(B, H, T, D, dev, dt, group.seed)
            mod, shared = make_layer(make_config(group.variant, impl, H, D, group.options), dev, dt)
            one = {"variant": lambda: layer_call(mod, shared, q, k, v, x)}
            if group.baselines:
                one["sdpa_causal"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                bias_bytes = B * H * T * T * dt.itemsize
                if probe and probe.get("has_bias") and bias_bytes <= group.mem_limit // 4:
                    mask = bias_mask(B, H, T, dev, dt)
                    one["sdpa_bias"] = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                elif probe and probe.get("has_bias"):
                    for r in rows:
                        r["note"] = f"sdpa_bias skipped: its {bias_bytes / 2**30:.1f} GiB mask > a quarter of the limit"
            fns = {(name, n): _at_threads(n, fn) for n in counts for name, fn in one.items()}
            kernels.impls_used(reset=True)
            for _ in range(group.warmup):  # compilation (Triton, torch.compile) happens here, not below
                for fn in fns.values():
                    fn()
            _sync(dev)
            peaks = {}
            for name in ("variant", "sdpa_causal"):
                if name in one:
                    with PeakMemory(dev) as pm:
                        y = fns[(name, counts[0])]()
                        _sync(dev)
                        del y
                    peaks[f"{'peak' if name == 'variant' else 'base_peak'}_bytes"] = pm.peak
                    peaks["mem_method"] = pm.method
            numbers = calls_per_timing(fns, dev, group.min_time)
            times = interleave(fns, group.repeats, dev, numbers)
        ran = sorted(set(kernels.impls_used(reset=True).values()))
        for row, n in zip(rows, counts):
            row.update(peaks, impl_ran=",".join(ran) if ran else "unrecorded",
                       calls_per_timing=numbers[("variant", n)],
                       base_calls_per_timing=numbers.get(("sdpa_causal", n), float("nan")))
            tv = times[("variant", n)]
            row["time_s"], row["time_min_s"] = _median(tv), min(tv)
            row["ratio_threads"] = pair_stats(tv, times[("variant", counts[0])])["median"]
            for base, col in (("sdpa_causal", "sdpa"), ("sdpa_bias", "sdpa_bias")):
                if (base, n) in times:
                    st = pair_stats(tv, times[(base, n)])
                    row[f"{'base' if base == 'sdpa_causal' else 'bias'}_time_s"] = _median(times[(base, n)])
                    row[f"ratio_{col}"], row[f"ratio_{col}_min"], row[f"ratio_{col}_spread"] = (
                        st["median"], st["min"], st["spread"])
            row["unstable"] = bool(row.get("ratio_sdpa_spread", 0) > UNSTABLE)
    except Exception as e:  # noqa: BLE001 - a failed combination is a row, the bench goes on
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        for row in rows:
            row["status"] = f"error: {type(e).__name__}: {msg}"
    for row in rows:
        row["load_avg_end"] = load_average()
    return rows


def run_group(group: BenchGroup, emit=None) -> list[dict]:
    """Measure a group in this process: per impl, a probe (:func:`probe_case`) and then each length in
    increasing order, skipping what is estimated not to fit ``mem_limit`` (:func:`estimate_bytes`) or
    predicted (from the previous length's time and exponent) to exceed ``time_budget``. ``emit(row)`` is
    called for each row as it is done. Returns the rows."""
    torch.set_num_threads(thread_counts(group)[0])
    torch.manual_seed(group.seed)
    emit = emit or (lambda r: None)
    rows = []
    n_fns = 1.5 if group.baselines else 1.0  # prev time holds variant + SDPA causal; SDPA+bias ~ half more
    for impl in group.impls:
        kw = dict(batch=group.batch, heads=group.heads, head_dim=group.head_dim, dtype=group.dtype,
                  device=group.device, repeats=group.repeats, warmup=group.warmup, options=dict(group.options))
        try:
            probe = probe_case(BenchCase(group.variant, impl, 64, **kw))
        except Exception as e:  # noqa: BLE001 - reported on every length of this combination
            first = (str(e).strip().splitlines() or [""])[0][:200]
            probe = {"error": f"error: {type(e).__name__}: {first}"}
        prev = None
        for T in sorted(group.lengths):
            est = estimate_bytes(BenchCase(group.variant, impl, T, **kw), None if "error" in probe else probe)
            pred = None
            if prev:
                p = max(1.0, min(2.0, prev["exp"])) if math.isfinite(prev["exp"]) else 2.0
                pred = max(prev["time"] * (T / prev["length"]) ** p, group.min_time * n_fns) * (
                    group.repeats + group.warmup + 1) * n_fns
            if "error" in probe:
                row = _nan_row(group, impl, T, probe["error"])
            elif est > group.mem_limit:
                row = _nan_row(group, impl, T, f"skipped: needs ~{est / 2**30:.1f} GiB (estimate) > limit "
                                               f"{group.mem_limit / 2**30:.1f} GiB")
            elif pred is not None and pred > group.time_budget:
                row = _nan_row(group, impl, T, f"skipped: predicted {pred:.0f} s > time budget {group.time_budget:.0f} s")
            else:
                new = measure_case(group, impl, T, probe)
                row = new[0]
                if row["status"] == "ok":
                    pts = [r for r in rows if r["impl"] == impl and r["status"] == "ok" and r["threads"] == row["threads"]]
                    exp = fit_exponent([r["length"] for r in pts] + [T], [r["time_s"] for r in pts] + [row["time_s"]])
                    prev = {"time": sum(r["time_s"] + r.get("base_time_s", 0.0) for r in new), "length": T, "exp": exp}
            for row in (new if "time_s" in row else [row]):
                row.update(est_bytes=est, has_bias=bool(probe.get("has_bias")))
                rows.append(row)
                emit(row)
    return rows


def worker_env() -> dict:
    """The environment of a measuring process: this one's without ``TRITON_INTERPRET`` (the Triton
    interpreter runs kernels in numpy, for tests; timing it is never a benchmark of lctx's CPU paths)."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def run_group_isolated(group: BenchGroup, emit=None, timeout: float | None = None) -> list[dict]:
    """:func:`run_group` in one fresh ``python -m lctx.harness.commands.bench`` process (its rows stream back as JSON
    lines; ``emit`` sees each as it arrives). A crash or a timeout becomes an ``error`` row for each case
    that did not report."""
    emit = emit or (lambda r: None)
    cmd = [sys.executable, "-m", "lctx.harness.commands.bench", json.dumps(asdict(group))]
    rows: list[dict] = []

    with tempfile.TemporaryFile("w+") as errf:  # a file, not a pipe: a chatty stderr cannot block the worker
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, env=worker_env())
        t0 = time.monotonic()
        err = ""
        try:
            for line in proc.stdout:
                if line.startswith("{"):
                    rows.append(json.loads(line))
                    emit(rows[-1])
                if timeout is not None and time.monotonic() - t0 > timeout:
                    proc.kill()
                    err = f"timed out after {timeout:.0f} s"
                    break
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errf.seek(0)
        err = err or (errf.read().strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:300]
    done = {(r["impl"], r["length"]) for r in rows}
    for impl in group.impls:
        for T in sorted(group.lengths):
            if (impl, T) not in done:
                rows.append(_nan_row(group, impl, T, f"error: worker failed ({err})"))
                emit(rows[-1])
    return rows


# ---------------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------------

def fit_exponent(lengths, values) -> float:
    """Least-squares slope p of log(value) = p log(length) + c (the scaling exponent: ~1 linear, ~2
    quadratic). Non-finite or non-positive values are ignored; NaN with fewer than two usable lengths."""

    x = np.asarray(lengths, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if len(np.unique(x[ok])) < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def default_mem_limit(device) -> int:
    """Bytes one measurement may use: 80% of CPU MemAvailable, or 90% of the GPU's total memory."""

    n, _ = device_memory(device)
    return int(n * (0.9 if torch.device(device).type == "cuda" else 0.8))


def run_bench(variants: list[str], impls: list[str], lengths: list[int], heads: int = 1, head_dim: int = 64,
              batch: int = 1, device: str = "cpu", dtype: str = DTYPE, repeats: int = 5, warmup: int = 1,
              options: dict | None = None, isolate: bool | None = None, mem_limit: int | None = None,
              time_budget: float = 300.0, baselines: bool = True, threads: int | list | None = None, busy: int = 0,
              log=None, min_time: float = 0.1):
    """Measure every variant x impl x length, each timed alternately with SDPA causal (and SDPA with an
    ALiBi bias mask for bias variants) in one process per variant, and return ``(table, exponents)`` as
    pandas DataFrames (module docstring for the method and columns).

    variants: registered names (``lctx list variants``, ``+ssmax`` compositions allowed); impls: subset of
    fast/sdpa/reference; lengths: tokens; heads/head_dim/batch: shapes; device: ``cpu``/``cuda[:N]``;
    dtype: name; repeats: interleaved rounds; isolate: one subprocess per variant (default: on CPU);
    mem_limit: bytes a measurement may use (default :func:`default_mem_limit`); time_budget: seconds a
    measurement may take (warm-up and rounds together, extrapolated); threads: intra-op thread count(s)
    of the workers, a list measured in the same interleaved rounds (default torch's); busy: CPU-bound
    processes to run beside the measurement (a shared machine on purpose; column ``busy``); log:
    ``callable(str)`` for progress lines; min_time: seconds each timing spans at least (calls repeated within
    a timing, :func:`calls_per_timing`; columns ``calls_per_timing``, ``base_calls_per_timing``).

    Raises:
        LctxError: unknown variant / impl / dtype / device, non-positive sizes or repeats.
    """
    import pandas as pd  # lazy: loads pandas

    from lctx.harness.run.runner import git_revision  # lazy: loads transformers, pandas

    if not variants or not impls or not lengths:
        raise LctxError("nothing to bench; pass --variants, --impl and --lengths with at least one value each")
    tl = [] if threads is None else list(threads) if isinstance(threads, (list, tuple)) else [threads]
    if min(heads, head_dim, batch, repeats) < 1 or warmup < 0 or any(t < 1 for t in tl) or busy < 0 or min_time < 0:
        raise LctxError(f"--heads ({heads}), --head-dim ({head_dim}), --batch ({batch}), --repeats ({repeats}) and "
                        f"--threads must be >= 1, --warmup, --busy and --min-time >= 0")
    dev = resolve_device(device)
    _torch_dtype(dtype)
    for v in variants:
        for i in impls:
            make_config(v, i, heads, head_dim, options)  # validate everything before any work

    schemas = [option_schema(v) for v in variants]
    if options and all(sc is not None for sc in schemas):
        unknown = [k for k in options if not any(k in sc for sc in schemas)]
        if unknown:
            raise LctxError(f"--option {unknown[0]} is not an option of any variant benched ({', '.join(variants)}); "
                            "see `lctx list variants` for each variant's options")
    isolate = (dev.type == "cpu") if isolate is None else isolate
    mem_limit = default_mem_limit(dev) if mem_limit is None else mem_limit
    log = log or (lambda s: None)
    lengths = sorted(set(lengths))
    meta = {"batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype, "device": str(dev),
            "repeats": repeats, "min_time_s": min_time, "lctx_version": lctx.__version__, "git_rev": git_revision(),
            "torch": torch.__version__}

    def show(r: dict) -> None:
        ok = r["status"] == "ok"
        extra = (f"time {r['time_s'] * 1e3:.4g} ms  x sdpa {r.get('ratio_sdpa', float('nan')):.2f} (min "
                 f"{r.get('ratio_sdpa_min', float('nan')):.2f}){'  UNSTABLE' if r.get('unstable') else ''}  "
                 f"threads {r.get('threads')}  load {r.get('load_avg_start', float('nan')):.1f}") if ok else r["status"]
        log(f"{r['variant']:>16s} {r['impl']:>9s} T={r['length']:<7d} {extra}")

    rows = []
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        for v in variants:
            group = BenchGroup(v, list(impls), lengths, batch=batch, heads=heads, head_dim=head_dim, dtype=dtype,
                               device=str(dev), repeats=repeats, warmup=warmup, options=dict(options or {}),
                               mem_limit=mem_limit, time_budget=time_budget, baselines=baselines,
                               threads=tl or None, min_time=min_time)
            timeout = 120 + 2 * time_budget * len(impls) * len(lengths) * max(1, len(tl))
            rows += run_group_isolated(group, show, timeout) if isolate else run_group(group, show)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    meta["busy"] = busy
    table = pd.DataFrame([{**{c: float("nan") for c in TABLE_COLUMNS}, **r, **meta} for r in rows])
    table["unstable"] = [bool(u) if u == u else False for u in table["unstable"]]
    for c in ("impl_ran", "mem_method", "note"):
        table[c] = table[c].where(table[c].notna(), "").astype(str)
    table = table[TABLE_COLUMNS + [c for c in table.columns if c not in TABLE_COLUMNS]]
    table["timestamp"] = pd.Timestamp.now(tz="UTC").isoformat()
    exps = []
    for (v, i, th), g in table.groupby(["variant", "impl", "threads"], sort=False, dropna=False):
        ok = g[g["status"] == "ok"]
        exps.append({"variant": v, "impl": i, "threads": th, "time_exponent": fit_exponent(ok["length"], ok["time_s"]),
                     "mem_exponent": fit_exponent(ok["length"], ok["peak_bytes"]), "n_lengths": len(ok),
                     "lengths": ",".join(str(int(t)) for t in ok["length"])})
    return table, pd.DataFrame(exps)


TABLE_COLUMNS = ["variant", "impl", "length", "impl_ran", "time_s", "time_min_s", "base_time_s", "ratio_sdpa",
                 "ratio_sdpa_min", "ratio_sdpa_spread", "unstable", "bias_time_s", "ratio_sdpa_bias",
                 "ratio_sdpa_bias_min", "ratio_sdpa_bias_spread", "peak_bytes", "base_peak_bytes", "mem_method",
                 "threads", "ratio_threads", "calls_per_timing", "base_calls_per_timing", "load_avg_start", "load_avg_end", "est_bytes", "has_bias", "status", "note"]


# ---------------------------------------------------------------------------------------------------
# whole-model prefill (was benchmarks/long_cpu.py): time, peak memory and the memory plan
# ---------------------------------------------------------------------------------------------------

@dataclass
class PrefillCase:
    """One whole-model measurement: a chunked prefill of ``length`` tokens (BOS + seeded uniform ids) of the
    checkpoint ``model`` through ``HFAdapter.prefill`` in chunks of ``chunk`` tokens with ``attn_impl`` = ``impl``
    (``None``: the checkpoint's), then ``decode`` greedy steps; ``warmup_tokens``: a prefill of that many
    tokens first (compiles kernels, not measured); ``threads`` as :class:`BenchGroup`."""

    model: str
    length: int
    impl: str | None = None
    chunk: int = CHUNK_SIZE
    decode: int = 4
    seed: int = 0
    warmup_tokens: int = 0
    threads: int | None = None


def measure_prefill(case: PrefillCase) -> dict:
    """Run :class:`PrefillCase` in this process (call it in a fresh one: peak RSS). Returns a row: prefill
    and total seconds, ``peak_bytes`` (VmHWM - VmRSS around prefill + decode, :class:`PeakMemory`), the
    KV cache actually held, ``plan_bytes`` (:func:`lctx.models.adapters.memory.plan_memory` of the same prefill minus
    the weights, which are resident before the measurement) with its ``plan_path`` and largest item,
    ``plan_error`` = plan / peak - 1, the kernel that ran, threads and load averages."""

    from lctx.models.adapters.hf import load_lm  # lazy: loads transformers

    torch.set_num_threads(int(case.threads or default_threads()[0]))
    torch.manual_seed(case.seed)
    row = {"model": Path(case.model).name, "length": case.length, "chunk": case.chunk,
           "threads": torch.get_num_threads(), "load_avg_start": load_average(), "status": "ok"}
    try:
        lm = load_lm(case.model, device="cpu", chunk_size=case.chunk, attn_impl=case.impl)
        cfg = lm.model.config
        row["impl"] = str(getattr(cfg, "attn_impl", "") or "")
        g = torch.Generator().manual_seed(case.seed)
        ids = lm.with_bos(torch.randint(3, cfg.vocab_size, (case.length - 1,), generator=g).tolist())
        plan = plan_memory(cfg, case.length, chunk_size=case.chunk, dtype=lm.dtype,
                           impl=getattr(cfg, "attn_impl", None) if getattr(cfg, "model_type", "") == "lctx" else None,
                           kv_cache="preallocated" if hasattr(lm, "new_cache") else "dynamic",
                           decode_budget=int(getattr(lm, "decode_budget", 0) or 0))
        if case.warmup_tokens:
            w, _ = lm.prefill(ids[: min(case.length, case.warmup_tokens)])
            lm.greedy(w, case.decode, stop_ids=set())
            del w
        kernels.impls_used(reset=True)
        with PeakMemory("cpu") as pm:
            t0 = time.perf_counter()
            prefix, _ = lm.prefill(ids)
            row["prefill_s"] = time.perf_counter() - t0
            lm.greedy(prefix, case.decode, stop_ids=set())
            row["total_s"] = time.perf_counter() - t0
        row["impl_ran"] = "+".join(sorted(set(kernels.impls_used().values())))
        row["peak_bytes"], row["mem_method"] = pm.peak, pm.method
        row["kv_cache_bytes"] = sum(cache_bytes(prefix.cache, i) for i in range(cfg.num_hidden_layers))
        row["plan_bytes"] = plan.total - plan.get("weights")
        row["plan_path"], row["plan_largest"] = plan.attn_path, plan.largest().name
        row["plan_error"] = row["plan_bytes"] / pm.peak - 1 if pm.peak else float("nan")
        row["logits_finite"] = bool(torch.isfinite(prefix.last_logits).all())
    except Exception as e:  # noqa: BLE001 - a failed length is a row
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        row["status"] = f"error: {type(e).__name__}: {msg}"
    row["load_avg_end"] = load_average()
    return row


def measure_prefill_isolated(case: PrefillCase, timeout: float | None = None) -> dict:
    """:func:`measure_prefill` in a fresh ``python -m lctx.harness.commands.bench --prefill`` process (an honest
    peak RSS: nothing freed earlier can hide an allocation). A crash or timeout is an ``error`` row."""
    cmd = [sys.executable, "-m", "lctx.harness.commands.bench", "--prefill", json.dumps(asdict(case))]
    base = {"model": Path(case.model).name, "impl": case.impl or "", "length": case.length, "chunk": case.chunk}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=worker_env())
    except subprocess.TimeoutExpired:
        return {**base, "status": f"error: timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:300]
    return {**base, "status": f"error: worker failed ({err})"}


def run_prefill_bench(model: str, impls: list[str | None], lengths: list[int], chunk: int = CHUNK_SIZE, decode: int = 4,
                      warmup_tokens: int = 0, threads: int | None = None, log=None):
    """Whole-model chunked prefill of ``model`` per impl x length, each in a fresh process; returns
    ``(table, exponents)`` (pandas): one row per measurement (:func:`measure_prefill`'s columns) and the
    fitted exponents of prefill time, peak memory and the plan vs length per impl.

    Raises:
        LctxError: ``model`` is not a checkpoint directory, or a non-positive length or chunk.
    """
    import pandas as pd  # lazy: loads pandas

    load_config(model)  # a bad --model fails here, before any process starts
    if chunk < 1 or min(lengths) < 2:
        raise LctxError(f"--chunk-size ({chunk}) must be >= 1 and lengths >= 2 tokens")
    log = log or (lambda s: None)
    rows = []
    for impl in impls:
        for T in sorted(set(lengths)):
            r = measure_prefill_isolated(PrefillCase(model, T, impl, chunk, decode, 0, warmup_tokens, threads))
            rows.append(r)
            log(f"{r['model']} {r.get('impl') or impl or ''} T={T}: " + (
                f"prefill {r['prefill_s']:.2f} s  peak {r['peak_bytes'] / 2**20:.1f} MiB  plan "
                f"{r['plan_bytes'] / 2**20:.1f} MiB ({r['plan_error']:+.0%}, {r['plan_path']})  threads "
                f"{r['threads']}  load {r['load_avg_start']:.1f}" if r["status"] == "ok" else r["status"]))
    table = pd.DataFrame(rows)
    exps = []
    for impl, g in table.groupby("impl", sort=False):
        ok = g[g["status"] == "ok"]
        if len(ok):
            exps.append({"model": ok["model"].iloc[0], "impl": impl,
                         "time_exponent": fit_exponent(ok["length"], ok["prefill_s"]),
                         "mem_exponent": fit_exponent(ok["length"], ok["peak_bytes"]),
                         "plan_exponent": fit_exponent(ok["length"], ok["plan_bytes"]),
                         "lengths": ",".join(str(int(t)) for t in ok["length"])})
    return table, pd.DataFrame(exps)


def print_prefill(table, exponents, file=None) -> None:
    """Print the whole-model prefill rows (time, measured peak, plan and its error) and the fitted exponents
    (:func:`lctx.harness.run.console.print_table`)."""

    f = lambda v, fmt: "" if v != v else format(v, fmt)  # noqa: E731
    g = lambda r, c: r.get(c, float("nan"))  # noqa: E731
    num = ["length", "prefill s", "peak MiB", "plan MiB", "plan error", "threads", "load"]
    rows = [[str(r["model"]), str(r.get("impl", "")), str(r.get("impl_ran", "")), str(r["length"]),
             f(g(r, "prefill_s"), ".2f"), f(g(r, "peak_bytes") / 2**20, ".1f"), f(g(r, "plan_bytes") / 2**20, ".1f"),
             f(g(r, "plan_error"), "+.0%"), str(r.get("plan_path", "")), f(g(r, "threads"), ".0f"),
             f(g(r, "load_avg_start"), ".1f"), str(r["status"])] for _, r in table.iterrows()]
    print_table(["model", "impl", "ran"] + num[:5] + ["path"] + num[5:] + ["status"], rows, right=num, file=file,
                title="whole-model chunked prefill: time, peak RSS (fresh process) and lctx plan "
                      "(plan error = plan / peak - 1)")
    for _, r in exponents.iterrows():
        print(f"{r['model']} [{r['impl']}] exponents vs length: time {r['time_exponent']:.2f}, peak memory "
              f"{r['mem_exponent']:.2f}, plan {r['plan_exponent']:.2f}", file=file)


# ---------------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------------

def plot_bench(table, path: Path) -> Path:
    """Log-log plot: forward time and peak memory vs length, one line per variant/impl, and SDPA causal
    (the median of its timings across groups, dashed). Writes ``path`` (PNG) and returns it."""
    import matplotlib  # lazy: loads matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib

    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # lazy: loads matplotlib

    from lctx.harness.outputs.plots import format_length, series_style  # lazy: loads pandas, matplotlib

    ok = table[table["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for k, ((v, i), g) in enumerate(ok.groupby(["variant", "impl"], sort=False)):
        g = g.sort_values("length")
        c, mk, ls = series_style(k)  # distinct (colour, marker) per line, as in the run and report figures
        axes[0].plot(g["length"], g["time_s"], marker=mk, color=c, linestyle=ls, label=f"{v} [{i}]")
        axes[1].plot(g["length"], g["peak_bytes"] / 2**20, marker=mk, color=c, linestyle=ls, label=f"{v} [{i}]")
    base = ok.dropna(subset=["base_time_s"]).groupby("length")[["base_time_s", "base_peak_bytes"]].median()
    if len(base):
        style = dict(ls="--", color="black", lw=2, label="sdpa_causal")
        axes[0].plot(base.index, base["base_time_s"], marker="o", **style)
        axes[1].plot(base.index, base["base_peak_bytes"] / 2**20, marker="o", **style)
    for ax, name in zip(axes, ("forward time (s, median)", "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        if len(ok):  # lengths labelled 256, 512, 1K like the other figures
            ax.xaxis.set_major_locator(FixedLocator(sorted(set(int(x) for x in ok["length"]))))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_length(x)))
            ax.xaxis.set_minor_locator(NullLocator())
        ax.set_yscale("log")
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
    if len(table):
        r = table.iloc[0]
        fig.suptitle(f"one attention layer: B={r['batch']} H={r['heads']} D={r['head_dim']} {r['dtype']} on {r['device']}")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def ratio_pivot(table, stat: str = "ratio_sdpa"):
    """The ratio table (rows ``variant [impl]``, columns lengths) of ``stat`` (``ratio_sdpa``: median of
    the interleaved pairs; ``ratio_sdpa_min``: their minimum), as a pandas DataFrame."""
    ok = table[table["status"] == "ok"].copy()
    ok["row"] = ok["variant"] + " [" + ok["impl"] + "]"
    if ok["threads"].nunique() > 1:
        ok["row"] = ok["row"] + " " + ok["threads"].map(lambda t: f"{int(t)}t")
    return ok.pivot_table(index="row", columns="length", values=stat, sort=False)


def ratio_markdown(table) -> str:
    """The ratio-to-SDPA-causal tables (median, then minimum of the interleaved pairs; rows ``variant
    [impl]``, columns lengths) as Markdown, with the threads and the load average of the run."""
    lines = []
    for stat, what in (("ratio_sdpa", "median"), ("ratio_sdpa_min", "minimum")):
        pv = ratio_pivot(table, stat)
        lines += [f"time / SDPA causal time, {what} of the interleaved pairs", "",
                  "| variant [impl] | " + " | ".join(str(c) for c in pv.columns) + " |",
                  "|---|" + "---|" * len(pv.columns)]
        lines += ["| " + idx + " | " + " | ".join("" if v != v else f"{v:.2f}" for v in row) + " |"
                  for idx, row in pv.iterrows()]
        lines.append("")
    loads = table["load_avg_start"].dropna()
    lines.append(f"threads {sorted(set(int(t) for t in table['threads'].dropna()))}, load average "
                 f"{loads.min():.1f}-{loads.max():.1f} (1 min) during the run; rows flagged unstable: "
                 f"{int(table['unstable'].sum())}")
    return "\n".join(lines) + "\n"


def write_bench(table, exponents, out: Path) -> list[Path]:
    """Write ``bench.parquet``, ``bench.csv``, ``exponents.csv``, ``ratios.md`` (the ratio tables) and
    ``bench.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.parquet", out / "bench.csv", out / "exponents.csv"]
    table.to_parquet(paths[0], index=False)
    table.to_csv(paths[1], index=False)
    exponents.to_csv(paths[2], index=False)
    if (table["status"] == "ok").any():
        (out / "ratios.md").write_text(ratio_markdown(table))
        paths.append(out / "ratios.md")
        paths.append(plot_bench(table, out / "bench.png"))
    return paths


def print_bench(table, exponents, file=None) -> None:
    """Print the measurements, the ratio-to-SDPA-causal table (variant x length; median of the interleaved
    pairs, min in brackets) and the exponents as tables (rich on a terminal, Markdown off one: every cell
    whole, see :mod:`lctx.harness.run.console`), then a warning when rows are flagged unstable."""

    table = table.copy()
    for c in TABLE_COLUMNS:  # a table from an older lctx (or built by hand) may lack the newer columns
        if c not in table.columns:
            table[c] = False if c == "unstable" else ("" if c in ("impl_ran", "note", "mem_method") else float("nan"))
    exponents = exponents.reindex(columns=list(dict.fromkeys(["variant", "impl", "threads", *exponents.columns])))
    f = lambda v, fmt: "" if v != v else format(v, fmt)  # noqa: E731
    num = ["length", "time ms", "peak MiB", "x sdpa", "min", "spread", "x sdpa+bias", "threads", "x 1st thr", "load"]
    rows = [[r["variant"], r["impl"], str(r["impl_ran"]), str(r["length"]), f(r["time_s"] * 1e3, ".2f"),
             f(r["peak_bytes"] / 2**20, ".1f"), f(r["ratio_sdpa"], ".2f"), f(r["ratio_sdpa_min"], ".2f"),
             f(r["ratio_sdpa_spread"], ".0%"), f(r["ratio_sdpa_bias"], ".2f"), f(r["threads"], ".0f"),
             f(r["ratio_threads"], ".2f"), f(r["load_avg_start"], ".1f"),
             r["status"] + (" UNSTABLE" if r["unstable"] else "")] for _, r in table.iterrows()]
    print_table(["variant", "impl", "ran"] + num + ["status"], rows,
                title="lctx bench: one attention layer forward, timed alternately with SDPA causal", right=num,
                file=file)
    if (table["status"] == "ok").any():
        pv, mins = ratio_pivot(table), ratio_pivot(table, "ratio_sdpa_min")
        cols = [str(c) for c in pv.columns]
        lo = lambda i, c: mins.loc[i, c] if i in mins.index and c in mins.columns else float("nan")  # noqa: E731
        rows = [[idx] + ["" if v != v else f"{v:.2f} ({lo(idx, c):.2f})" for c, v in row.items()]
                for idx, row in pv.iterrows()]
        print_table(["variant [impl]"] + cols, rows, right=cols, file=file,
                    title="time / SDPA causal time, median of the interleaved pairs (min)")
    rows = [[r["variant"], r["impl"], f(r["threads"], ".0f"), f(r["time_exponent"], ".2f"), f(r["mem_exponent"], ".2f"),
             r["lengths"]] for _, r in exponents.iterrows()]
    print_table(["variant", "impl", "threads", "time exp", "mem exp", "lengths"], rows,
                title="scaling exponents (least squares on log-log)", right=("threads", "time exp", "mem exp"),
                file=file)
    if table["unstable"].any():
        print(f"warning: {int(table['unstable'].sum())} rows have per-pair ratios that disagree by more than "
              f"{UNSTABLE:.0%} (flagged UNSTABLE): the machine's load changed during them; rerun them", file=file)


def _worker_main(argv: list[str]) -> int:
    """``python -m lctx.harness.commands.bench '<BenchGroup JSON>'``: run :func:`run_group` and print each row as one
    JSON line as it finishes (read by :func:`run_group_isolated`); ``--prefill '<PrefillCase JSON>'``: one
    :func:`measure_prefill` row."""
    if argv and argv[0] == "--prefill":
        print(json.dumps(measure_prefill(PrefillCase(**json.loads(argv[1])))), flush=True)
        return 0
    group = BenchGroup(**json.loads(argv[0]))
    run_group(group, emit=lambda r: print(json.dumps(r), flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
