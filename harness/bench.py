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
and ``sdpa_bias`` (the same with an explicit float mask [B, H, T, T] holding the causal -inf and the ALiBi
bias, built before the timed call; its memory counts the mask). Every variant row gets ``ratio_sdpa`` =
time / sdpa_causal time; rows of variants with a logit bias (``score_bias`` not ``None``) also get
``ratio_sdpa_bias``.

Timing: ``warmup`` untimed calls, then the median (and min) of ``repeats`` timed calls (CUDA: synchronised
``perf_counter``). Memory (``mem_method`` column):

- CUDA: ``torch.cuda.max_memory_allocated`` minus the allocation before the call (peak stats reset first).
- CPU: the peak resident set size of the process around one call after the warm-up: glibc's
  ``malloc_trim(0)`` first returns freed heap pages to the system, then Linux's ``/proc/self/clear_refs``
  (``5``) resets ``VmHWM`` to the current ``VmRSS``; the peak is ``VmHWM`` after the call minus ``VmRSS``
  before it. By default each measurement runs in a fresh subprocess (``isolate=True``) so memory kept by
  earlier measurements (allocator caches, compiled kernels) cannot hide new allocations; in-process
  measurements (tests) can undercount for that reason.

Combinations predicted not to fit (dense T x T buffers, estimated by :func:`estimate_bytes` against
``mem_limit``) or predicted to take longer than ``time_budget`` seconds (extrapolated from the previous
length of the same variant and implementation) are recorded as ``skipped: <reason>``; failures as
``error: <message>``. The scaling exponent is the least-squares slope of log(time) on log(length)
(:func:`fit_exponent`) over the measured lengths of each variant and implementation.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .errors import LctxError

IMPLS = ("fast", "sdpa", "reference")
BASELINES = ("sdpa_causal", "sdpa_bias")


@dataclass
class BenchCase:
    """One measurement: ``variant`` (a registered name, or a baseline ``sdpa_causal`` / ``sdpa_bias``)
    with ``impl`` (attn_impl; ``"baseline"`` for baselines) at ``length`` tokens; shapes B = ``batch``,
    H = ``heads``, D = ``head_dim``; ``dtype`` name; ``device``; ``options``: variant options."""

    variant: str
    impl: str
    length: int
    batch: int = 1
    heads: int = 1
    head_dim: int = 64
    dtype: str = "float32"
    device: str = "cpu"
    repeats: int = 5
    warmup: int = 1
    options: dict = field(default_factory=dict)
    seed: int = 0


# ---------------------------------------------------------------------------------------------------
# building and calling one layer
# ---------------------------------------------------------------------------------------------------

def _torch_dtype(name: str) -> torch.dtype:
    from .lm import resolve_dtype

    return resolve_dtype(name)


def make_config(variant: str, impl: str, heads: int, head_dim: int, options: dict | None = None):
    """A one-layer :class:`LctxConfig` with ``heads`` x ``head_dim`` channels for ``variant`` and ``impl``.

    Raises:
        LctxError: unknown variant or impl, or sizes the config refuses (e.g. an odd head dim with rope).
    """
    import lctx.models  # noqa: F401  (registers every variant)
    from lctx.models import LctxConfig
    from lctx.models.variants import get_variant

    if impl not in IMPLS:
        raise LctxError(f"unknown attention implementation {impl!r}; use {', '.join(IMPLS)}")
    try:
        get_variant(variant)
    except KeyError as e:
        raise LctxError(f"{e.args[0]}; see `lctx list variants`") from None
    try:
        return LctxConfig(hidden_size=heads * head_dim, num_attention_heads=heads, num_hidden_layers=1,
                          variant=variant, attn_impl=impl, variant_options=dict(options or {}), vocab_size=16)
    except ValueError as e:
        raise LctxError(f"cannot build {variant!r} with {heads} heads of dim {head_dim}: {e}") from None


def make_layer(config, device, dtype: torch.dtype):
    """(variant module, shared module or ``None``) for layer 0 of ``config``, in eval mode on ``device``.

    Raises:
        LctxError: the variant refuses its options (message from the variant).
    """
    from lctx.models.variants import get_variant

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
    from lctx.models.model import positions_and_mask
    from lctx.models.variants import AttnContext

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
    from lctx.models.variants import alibi_slopes

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
        import ctypes

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
            import resource

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
    :mod:`lctx.harness.plan` with chunk = T.
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
        elif case.impl == "reference":
            n += 3 * B * H * T * T * 4 + (B * H * T * T * 4 if probe.get("has_bias") else 0)
    return n


def probe_case(case: BenchCase, length: int = 64) -> dict:
    """Run the case once at ``length`` tokens in-process and report what the path did: ``mask_asked``
    (it read the Tq x Tk pattern), ``float_mask`` (it built the sdpa float mask), ``has_bias`` (its
    ``score_bias`` is not ``None``) and ``ran`` (implementations recorded by :mod:`lctx.kernels`)."""
    from lctx import kernels
    from lctx.models.variants import AttentionVariant

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
# one measurement
# ---------------------------------------------------------------------------------------------------

def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(case: BenchCase) -> dict:
    """Run one measurement in this process: ``warmup`` untimed calls (compilation happens there), one
    call under :class:`PeakMemory` (for ``sdpa_bias`` the mask is rebuilt inside it), then ``repeats``
    timed calls. Returns a dict with ``time_s`` (median
    seconds), ``time_min_s``, ``peak_bytes``, ``mem_method``, ``impl_ran`` and ``status`` ("ok" or
    "error: ...")."""
    from lctx import kernels

    dev, dt = torch.device(case.device), _torch_dtype(case.dtype)
    B, H, T, D = case.batch, case.heads, case.length, case.head_dim
    out = {"time_s": float("nan"), "time_min_s": float("nan"), "peak_bytes": float("nan"), "mem_method": "",
           "impl_ran": "", "status": "ok"}
    try:
        with torch.inference_mode():
            q, k, v, x = make_inputs(B, H, T, D, dev, dt, case.seed)
            if case.variant == "sdpa_causal":
                mask = None

                def call():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif case.variant == "sdpa_bias":
                mask = None

                def call():
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                mod, shared = make_layer(make_config(case.variant, case.impl, H, D, case.options), dev, dt)

                def call():
                    return layer_call(mod, shared, q, k, v, x)
            kernels.impls_used(reset=True)
            if case.variant == "sdpa_bias" and case.warmup:
                mask = bias_mask(B, H, T, dev, dt)
            for _ in range(case.warmup):  # compilation (Triton, torch.compile) happens here, not below
                call()
            mask = None
            _sync(dev)
            with PeakMemory(dev) as pm:
                if case.variant == "sdpa_bias":
                    mask = bias_mask(B, H, T, dev, dt)
                y = call()
                _sync(dev)
                del y
            out["peak_bytes"], out["mem_method"] = pm.peak, pm.method
            times = []
            for _ in range(case.repeats):
                t0 = time.perf_counter()
                call()
                _sync(dev)
                times.append(time.perf_counter() - t0)
        out["time_s"] = float(sorted(times)[len(times) // 2]) if len(times) % 2 else float(
            sum(sorted(times)[len(times) // 2 - 1: len(times) // 2 + 1]) / 2)
        out["time_min_s"] = float(min(times))
        ran = sorted(set(kernels.impls_used(reset=True).values()))
        out["impl_ran"] = ",".join(ran) if ran else ("sdpa" if case.variant in BASELINES else "unrecorded")
    except Exception as e:  # noqa: BLE001 - a failed combination is a row, the bench goes on
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        out["status"] = f"error: {type(e).__name__}: {msg}"
    return out


def measure_isolated(case: BenchCase, timeout: float | None = None) -> dict:
    """:func:`measure` in a fresh ``python -m lctx.harness.bench`` subprocess (honest CPU peak memory: no
    allocator reuse from earlier measurements). Returns the same dict; a crash or a timeout is an
    ``error`` row."""
    cmd = [sys.executable, "-m", "lctx.harness.bench", json.dumps(asdict(case))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"time_s": float("nan"), "time_min_s": float("nan"), "peak_bytes": float("nan"), "mem_method": "",
                "impl_ran": "", "status": f"error: timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:300]
    return {"time_s": float("nan"), "time_min_s": float("nan"), "peak_bytes": float("nan"), "mem_method": "",
            "impl_ran": "", "status": f"error: worker failed ({err})"}


# ---------------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------------

def fit_exponent(lengths, values) -> float:
    """Least-squares slope p of log(value) = p log(length) + c (the scaling exponent: ~1 linear, ~2
    quadratic). Non-finite or non-positive values are ignored; NaN with fewer than two usable lengths."""
    import numpy as np

    x = np.asarray(lengths, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if len(np.unique(x[ok])) < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def default_mem_limit(device) -> int:
    """Bytes one measurement may use: 80% of CPU MemAvailable, or 90% of the GPU's total memory."""
    from .plan import device_memory

    n, _ = device_memory(device)
    return int(n * (0.9 if torch.device(device).type == "cuda" else 0.8))


def run_bench(variants: list[str], impls: list[str], lengths: list[int], heads: int = 1, head_dim: int = 64,
              batch: int = 1, device: str = "cpu", dtype: str = "float32", repeats: int = 5, warmup: int = 1,
              options: dict | None = None, isolate: bool | None = None, mem_limit: int | None = None,
              time_budget: float = 300.0, baselines: bool = True, log=None):
    """Measure every variant x impl x length (plus the SDPA baselines per length) and return
    ``(table, exponents)`` as pandas DataFrames (module docstring for the method and columns).

    variants: registered names (``lctx list variants``, ``+ssmax`` compositions allowed); impls: subset of
    fast/sdpa/reference; lengths: tokens; heads/head_dim/batch: shapes; device: ``cpu``/``cuda[:N]``;
    dtype: name; isolate: one subprocess per measurement (default: on CPU); mem_limit: bytes a
    measurement may use (default :func:`default_mem_limit`); time_budget: seconds a measurement may take
    (warm-up and repeats together, extrapolated); log: ``callable(str)`` for progress lines.

    Raises:
        LctxError: unknown variant / impl / dtype / device, non-positive sizes or repeats.
    """
    import pandas as pd

    import lctx

    from .lm import resolve_device
    from .runner import git_revision

    if not variants or not impls or not lengths:
        raise LctxError("nothing to bench; pass --variants, --impl and --lengths with at least one value each")
    if min(heads, head_dim, batch, repeats) < 1 or warmup < 0:
        raise LctxError(f"--heads ({heads}), --head-dim ({head_dim}), --batch ({batch}) and --repeats ({repeats}) "
                        "must be >= 1 and --warmup >= 0")
    dev = resolve_device(device)
    _torch_dtype(dtype)
    for v in variants:
        for i in impls:
            make_config(v, i, heads, head_dim, options)  # validate everything before any work
    isolate = (dev.type == "cpu") if isolate is None else isolate
    mem_limit = default_mem_limit(dev) if mem_limit is None else mem_limit
    log = log or (lambda s: None)
    lengths = sorted(set(lengths))
    meta = {"batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype, "device": str(dev),
            "lctx_version": lctx.__version__, "git_rev": git_revision(), "torch": torch.__version__}
    cases = []
    if baselines:
        cases += [BenchCase(b, "baseline", 0) for b in BASELINES]
    cases += [BenchCase(v, i, 0) for v in variants for i in impls]
    rows, last_ok = [], {}
    for proto in cases:
        kw = dict(batch=batch, heads=heads, head_dim=head_dim, dtype=dtype, device=str(dev), repeats=repeats,
                  warmup=warmup, options=dict(options or {}))
        probe = None
        if proto.variant not in BASELINES:
            try:
                probe = probe_case(BenchCase(proto.variant, proto.impl, 64, **kw))
            except Exception as e:  # noqa: BLE001 - reported on every length of this combination
                first = (str(e).strip().splitlines() or [""])[0][:200]
                probe = {"error": f"error: {type(e).__name__}: {first}"}
        for T in lengths:
            case = BenchCase(proto.variant, proto.impl, T, **kw)
            est = estimate_bytes(case, probe if probe and "error" not in probe else None)
            row = {"variant": case.variant, "impl": case.impl, "length": T, **meta, "repeats": repeats,
                   "est_bytes": est, "has_bias": bool(probe and probe.get("has_bias"))}
            key = (case.variant, case.impl)
            prev = last_ok.get(key)
            pred = None
            if prev:
                p = max(1.0, min(2.0, prev["exp"])) if math.isfinite(prev["exp"]) else 2.0
                pred = prev["time"] * (T / prev["length"]) ** p * (repeats + warmup)
            if probe and "error" in probe:
                res = {"status": probe["error"]}
            elif est > mem_limit:
                res = {"status": f"skipped: needs ~{est / 2**30:.1f} GiB (estimate) > limit {mem_limit / 2**30:.1f} GiB"}
            elif pred is not None and pred > time_budget:
                res = {"status": f"skipped: predicted {pred:.0f} s > time budget {time_budget:.0f} s"}
            else:
                t0 = time.perf_counter()
                res = measure_isolated(case) if isolate else measure(case)
                log(f"{case.variant:>16s} {case.impl:>9s} T={T:<7d} {res['status']:<6s} "
                    f"time {res.get('time_s', float('nan')):.4g} s  peak {res.get('peak_bytes', float('nan')) / 2**20:.1f} MiB"
                    f"  ({time.perf_counter() - t0:.1f} s wall)")
                if res["status"] == "ok":
                    pts = [r for r in rows if (r["variant"], r["impl"]) == key and r["status"] == "ok"]
                    exp = fit_exponent([r["length"] for r in pts] + [T], [r["time_s"] for r in pts] + [res["time_s"]])
                    last_ok[key] = {"time": res["time_s"], "length": T, "exp": exp}
            if "time_s" not in res:  # skipped, or the probe failed: nothing ran
                log(f"{case.variant:>16s} {case.impl:>9s} T={T:<7d} {res['status']}")
            rows.append({**row, "impl_ran": "", "time_s": float("nan"), "time_min_s": float("nan"),
                         "peak_bytes": float("nan"), "mem_method": "", **res})
    table = pd.DataFrame(rows)
    table["timestamp"] = pd.Timestamp.now(tz="UTC").isoformat()
    base = table[table["status"] == "ok"].set_index(["variant", "length"])["time_s"]

    def ratio(r, b):
        t = base.get((b, r["length"]), float("nan"))
        return r["time_s"] / t if t == t and t > 0 else float("nan")

    table["ratio_sdpa"] = [ratio(r, "sdpa_causal") for _, r in table.iterrows()]
    table["ratio_sdpa_bias"] = [ratio(r, "sdpa_bias") if r["has_bias"] else float("nan") for _, r in table.iterrows()]
    exps = []
    for (v, i), g in table.groupby(["variant", "impl"], sort=False):
        ok = g[g["status"] == "ok"]
        exps.append({"variant": v, "impl": i, "time_exponent": fit_exponent(ok["length"], ok["time_s"]),
                     "mem_exponent": fit_exponent(ok["length"], ok["peak_bytes"]), "n_lengths": len(ok),
                     "lengths": ",".join(str(int(t)) for t in ok["length"])})
    return table, pd.DataFrame(exps)


# ---------------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------------

def plot_bench(table, path: Path) -> Path:
    """Log-log plot: forward time and peak memory vs length, one line per variant/impl (baselines
    dashed). Writes ``path`` (PNG) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[table["status"] == "ok"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for (v, i), g in ok.groupby(["variant", "impl"], sort=False):
        g = g.sort_values("length")
        style = dict(ls="--", color="black" if v == "sdpa_causal" else "grey", lw=2) if v in BASELINES else {}
        label = v if v in BASELINES else f"{v} [{i}]"
        axes[0].plot(g["length"], g["time_s"], marker="o", label=label, **style)
        axes[1].plot(g["length"], g["peak_bytes"] / 2**20, marker="o", label=label, **style)
    for ax, name in zip(axes, ("forward time (s, median)", "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
    r = table.iloc[0] if len(table) else None
    if r is not None:
        fig.suptitle(f"one attention layer: B={r['batch']} H={r['heads']} D={r['head_dim']} {r['dtype']} on {r['device']}")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_bench(table, exponents, out: Path) -> list[Path]:
    """Write ``bench.parquet``, ``bench.csv``, ``exponents.csv`` and ``bench.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.parquet", out / "bench.csv", out / "exponents.csv"]
    table.to_parquet(paths[0], index=False)
    table.to_csv(paths[1], index=False)
    exponents.to_csv(paths[2], index=False)
    if (table["status"] == "ok").any():
        paths.append(plot_bench(table, out / "bench.png"))
    return paths


def print_bench(table, exponents, file=None) -> None:
    """Print the measurements and the exponents as tables (rich on a terminal, Markdown off one: every
    cell whole, see :mod:`lctx.harness.console`)."""
    from .console import print_table

    f = lambda v, fmt: "" if v != v else format(v, fmt)  # noqa: E731
    rows = [[r["variant"], r["impl"], str(r["impl_ran"]), str(r["length"]), f(r["time_s"] * 1e3, ".2f"),
             f(r["peak_bytes"] / 2**20, ".1f"), f(r["ratio_sdpa"], ".2f"), f(r["ratio_sdpa_bias"], ".2f"), r["status"]]
            for _, r in table.iterrows()]
    print_table(["variant", "impl", "ran", "length", "time ms", "peak MiB", "x sdpa", "x sdpa+bias", "status"], rows,
                title="lctx bench: one attention layer forward",
                right=("length", "time ms", "peak MiB", "x sdpa", "x sdpa+bias"), file=file)
    rows = [[r["variant"], r["impl"], f(r["time_exponent"], ".2f"), f(r["mem_exponent"], ".2f"), r["lengths"]]
            for _, r in exponents.iterrows()]
    print_table(["variant", "impl", "time exp", "mem exp", "lengths"], rows,
                title="scaling exponents (least squares on log-log)", right=("time exp", "mem exp"), file=file)


def _worker_main(argv: list[str]) -> int:
    """``python -m lctx.harness.bench '<BenchCase JSON>'``: run :func:`measure` and print its dict as one
    JSON line (used by :func:`measure_isolated`)."""
    case = BenchCase(**json.loads(argv[0]))
    torch.manual_seed(case.seed)
    print(json.dumps(measure(case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
