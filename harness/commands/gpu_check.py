"""One command for a short GPU lease: the kernel tests on CUDA, the fused prior kernel against FlexAttention, the
chunk split against its reference, a 125M-class model's 512K prefill, and random-weight models of real shapes.

Run from the repository root on the GPU machine (no install there: the script makes ``import lctx`` load the
checkout it sits in; the machine's image has torch, triton, transformers, pandas, typer and pytest, and no package
registry, so nothing is installed)::

    python3 harness/commands/gpu_check.py --out "$OUT"          # on the GPU machine, within ~8 minutes
    python3 harness/commands/gpu_check.py --rehearse --out /tmp/gc  # every step at tiny sizes on CPU, < 2 minutes
    python3 harness/commands/gpu_check.py --estimate                # the time estimate below, and exit

(``lctx gpu-check`` is the same command where lctx is installed.) Each step runs in a process of its own, under
a time budget that is its timeout, so a step that fails, hangs, or breaks the CUDA context is recorded and the
next one starts; the budgets total :data:`TOTAL_BUDGET_S` seconds, under the lease's 10 minutes per command
whatever the estimate's errors. Every row of a step's table is written to its CSV as soon as it is measured.
``--out`` ends with at most :data:`MAX_FILES` files directly in it and no folder (what the device tool brings
back: 8 files, two folders deep): the log and one CSV per step, and only if something else was written, one
tar archive of it (:func:`pack_out`).

- ``gpu_check.log``: each step's banner, its process's output (pytest's included), and the summary.
- ``kernel_tests.csv``: pytest ``-m gpu`` over :data:`GPU_TEST_FILES` (compiled Triton and FlexAttention): one
  row per test (outcome, seconds, the first line of a failure).
- ``prior_vs_flex.csv``: the fused prior kernel (Triton) and FlexAttention (compiled), bf16, H=12, D=64: error
  against the dense float32 reference at 4K (every prior kind, +ssmax for Triton) with the tolerance derived
  in the row and a control, then forward time of both and SDPA causal at 4K, 128K and 32K.
- ``chunk_split.csv``: a chunk's attention over its KV cache in bf16 (:func:`lctx.kernels.chunk_attention.
  chunk_attention`, the FlexAttention split on CUDA) against :func:`~lctx.kernels.chunk_attention.
  chunk_attention_reference`, the masked SDPA call it replaces, and the fused Triton kernel with past keys:
  errors with their derived tolerance and a control, then times at 16K queries over 128K and 512K keys.
- ``prefill_512k.csv``: a passkey-shaped 512K-token chunked prefill (16K chunks) of a 125M-class random lctx
  model (d 768, 12 layers, 12 heads, vocab 32000) per variant: seconds, tokens/s, peak bytes, the kernel that ran.
- ``real_models.csv``: random-weight models of SmolLM2-135M's and Gemma 3 270M's shapes (their GGUFs, 98 MB and
  ~250 MB, do not fit the 64 MiB that travels with a call, and the GPU machine can download nothing) at 32K, 64K
  and 128K passkey-shaped prompts in bf16, through ``lctx_sdpa`` (the lean path) and transformers' ``sdpa`` (the
  masked path): seconds, tokens/s, peak bytes, and the masked path's last logits against the lean path's; then
  YaRN (``--position yarn:factor=16``, :mod:`lctx.models.position.yarn`) on the SmolLM2 shape.

Time estimate (H200: 790 TFLOP/s bf16 dense, 4.8 TB/s HBM; attention kernels assumed at 40 % of the FLOP peak,
copies at 70 % of the bandwidth; a step's process start 12 s; one Triton compile 1.5 s, one FlexAttention graph
6 s; :func:`estimate`, printed by ``--estimate``; budget: the step's timeout, :data:`STEPS`):

.. estimate-table

======================  =========  =========  ========  ========  ========  ========
step                        TFLOP   GB moved    work s   compile   total s  budget s
======================  =========  =========  ========  ========  ========  ========
kernel_tests                  0.0        0.0      16.0      85.5     113.5       120
prior_vs_flex              1179.0        9.7       3.7      63.0      78.7        85
chunk_split                 714.3     2087.4       2.9      28.5      43.4        55
prefill_512k              20711.5     1594.5      71.0      27.0     115.0       125
real_models                3736.0    12446.8      21.4      36.0      78.4        85
total                                                                429.1       470
======================  =========  =========  ========  ========  ========  ========

.. end-estimate-table

What the estimate counts (per step, :func:`estimate`): kernel_tests: ~80 tests, ~25 Triton specialisations, 8
FlexAttention graphs (the split's four masks in float32 and bf16), 0.2 s a test; prior_vs_flex: 2 T^2 H D FLOPs a
causal call, 7 calls (Triton and Flex per kind, SDPA) x 6 (warm-up + 5) per length, 9 Flex graphs (3 kinds x 3
lengths, static shapes); chunk_split: 4 Tq Tk H D FLOPs a call (the whole rectangle: the masked call computes it
all, the split the past part whole and half its own), the masked call's bool mask and its bf16 copy read once a
head, 3 implementations x 4 calls per size, 4 Flex graphs; prefill_512k: 2 T^2 H D L attention FLOPs per
full-attention variant (4 of them) + 2 x params x T for the projections, the KV cache read once a chunk, 2 Flex
graphs for the split; real_models: the same per model, path and length (the masked path's mask read once a
head and layer), 6 Flex graphs (head dims 64 and 256, windowed and not).

Raises:
    LctxError (one line, exit 2): no CUDA device without ``--rehearse``, ``--out`` unwritable or holding other
    files than this command's, an unknown step name.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

if __name__ == "__main__":  # run as a file from a checkout: import lctx from it (see _bootstrap)
    _HERE = Path(__file__).resolve()

    def _bootstrap() -> None:
        """Make ``import lctx`` load the checkout this file sits in (the repository root is the package ``lctx``;
        the GPU machine has no install): a link named ``lctx`` to the root in a folder under the temp dir, put
        first on ``sys.path`` and in ``PYTHONPATH`` (for the steps' processes). This file's own folder and the
        root leave ``sys.path``: their modules (``data``, ``train``, ``kernels``...) would shadow packages."""
        repo = _HERE.parents[2]
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (_HERE.parent, repo)]
        shim = Path(tempfile.gettempdir()) / f"lctx-import-{hashlib.sha1(str(repo).encode()).hexdigest()[:12]}"
        link = shim / "lctx"
        if not (link.is_symlink() and link.resolve() == repo):
            shim.mkdir(parents=True, exist_ok=True)
            tmp = shim / f".lctx-{os.getpid()}"
            tmp.symlink_to(repo, target_is_directory=True)
            os.replace(tmp, link)  # atomic: a step starting meanwhile sees the old link or the new one
        sys.path.insert(0, str(shim))
        rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(shim)]
        os.environ["PYTHONPATH"] = os.pathsep.join([str(shim)] + rest)

    _bootstrap()

import click  # noqa: E402
import typer  # noqa: E402

from lctx.errors import EXIT_USAGE, LctxError  # noqa: E402
from lctx.harness.args import check_writable_dir  # noqa: E402

#: the lease's command limit is 10 minutes; the steps' budgets (their timeouts) total this, the estimate less
LEASE_S = 480
#: files the device tool brings back from a folder: at most this many directly under --out
MAX_FILES = 6
LOG_NAME = "gpu_check.log"
ARCHIVE_NAME = "extras.tar"
#: H200 figures the estimate uses: bf16 dense matrix FLOP/s and HBM bytes/s (the device tool's KINDS.md: 788
#: TFLOP/s measured on an 8192^3 bf16 product, ~4.3 TB/s measured device-to-device)
PEAK_FLOPS = 790e12
PEAK_BYTES_S = 4.8e12
#: the estimate's assumptions: attention kernels' share of the FLOP peak, copies' share of the bandwidth, one
#: step's process start (python, torch, CUDA context, transformers), one Triton compile, one FlexAttention graph
ATTN_EFF, BW_EFF, START_S, TRITON_COMPILE_S, FLEX_GRAPH_S = 0.4, 0.7, 12.0, 1.5, 6.0
#: the test files whose ``gpu``-marked tests the kernel_tests step runs (-m gpu), most important first
GPU_TEST_FILES = ("tests/test_chunk_attention.py", "tests/test_flash_prior.py", "tests/test_interdomain_scan.py",
                  "tests/test_path.py")
#: packages lctx can use that the GPU machine's image lacks (the device tool's KINDS.md): the rehearsal's step
#: processes refuse to import them, so a step that needs one fails here first
MISSING_ON_GPU = ("gguf", "lm_eval", "datasets", "openai", "tenacity", "fla")


@dataclass(frozen=True)
class Step:
    """One step of the check: ``name`` (its CSV is ``name.csv``), its ``budget_s`` (wall seconds, its process's
    timeout on the GPU) and what it measures."""

    name: str
    budget_s: float
    what: str

    @property
    def csv(self) -> str:
        """The file name of the step's table under ``--out``."""
        return f"{self.name}.csv"


#: the steps in the order they run (the most needed first: a lease cut short keeps them)
STEPS = (
    Step("kernel_tests", 120, "pytest -m gpu over the kernel test files, compiled on CUDA"),
    Step("prior_vs_flex", 85, "fused prior kernel (Triton) vs FlexAttention: bf16 error at 4K, time 4K-128K"),
    Step("chunk_split", 55, "chunk split (Flex on CUDA) vs its reference, the masked SDPA and the fused kernel"),
    Step("prefill_512k", 125, "125M-class random lctx model, 512K passkey-shaped prefill per variant"),
    Step("real_models", 85, "SmolLM2-135M / Gemma 3 270M shapes, 32K-128K, lean vs masked path, + YaRN"),
)
TOTAL_BUDGET_S = sum(s.budget_s for s in STEPS)
#: the rehearsal: every step at tiny sizes on CPU; its budget per step and in all
REHEARSE_STEP_S, REHEARSE_TOTAL_S = 60, 115
#: a step that would get less than this many seconds is skipped (recorded) instead of started
MIN_STEP_S = 5.0

SMOLLM2 = "smollm2-135m"
GEMMA3 = "gemma3-270m"


def sizes(rehearse: bool) -> dict:
    """{step name: its sizes}: the GPU run's, or the rehearsal's tiny ones (CPU, float32: Triton's interpreter
    cannot do bf16 dot products). Lengths in tokens."""
    if not rehearse:
        return {
            "kernel_tests": {"args": ["-m", "gpu", *GPU_TEST_FILES], "tests": 80, "triton": 25, "flex": 8},
            "prior_vs_flex": {"H": 12, "D": 64, "acc_T": 4096, "lengths": [4096, 131072, 32768], "reps": 5},
            "chunk_split": {"H": 12, "D": 64, "reps": 3,
                            "acc": [(4096, 16384, None), (4096, 16384, 512), (2048, 2048, 512), (1000, 9000, None)],
                            "time": [(16384, 131072, None), (16384, 524288, None), (16384, 524288, 512)]},
            "prefill_512k": {"length": 524288, "chunk": 16384, "vocab": 32000, "hidden": 768, "layers": 12,
                             "heads": 12, "variants": [("rope", "fast"), ("rope", "sdpa"), ("ggd_bam+ssmax", "fast"),
                                                       ("alibi", "fast"), ("alibi_lsh", "fast")]},
            "real_models": {"lengths": [32768, 65536, 131072], "chunk": 8192, "models": [SMOLLM2, GEMMA3],
                            "position": (SMOLLM2, "yarn:factor=16")},
        }
    return {
        "kernel_tests": {"args": ["tests/test_chunk_attention.py", "-k", "by_hand or cuda"], "tests": 5, "triton": 0,
                         "flex": 0},
        "prior_vs_flex": {"H": 2, "D": 16, "acc_T": 64, "lengths": [64, 130], "reps": 1},
        "chunk_split": {"H": 2, "D": 16, "reps": 1, "acc": [(48, 160, None), (48, 160, 16), (32, 32, 16)],
                        "time": [(64, 256, None), (64, 256, 16)]},
        "prefill_512k": {"length": 256, "chunk": 64, "vocab": 256, "hidden": 64, "layers": 2, "heads": 4,
                         "variants": [("rope", "fast"), ("rope", "sdpa"), ("ggd_bam+ssmax", "fast"), ("alibi", "fast"),
                                      ("alibi_lsh", "fast")]},
        "real_models": {"lengths": [96, 160], "chunk": 64, "models": [SMOLLM2, GEMMA3], "position": (SMOLLM2, "yarn:factor=4")},
    }


# -- the written-down estimate -------------------------------------------------------------------------------------
def model_shape(name: str, rehearse: bool = False) -> dict:
    """The shape of a real model lctx evaluates, as its GGUF's header gives it (read here with transformers'
    GGUF config loader from ``SmolLM2-135M-Instruct.Q4_1.gguf`` and ``gemma-3-270m-q4_k_m.gguf``): hidden size,
    intermediate size, layers, heads, KV heads, head dim, vocabulary, RoPE bases, sliding window and layer pattern;
    ``rehearse``: a tiny model of the same family (same layer pattern, window 16).

    Raises:
        ValueError: an unknown name.
    """
    if name == SMOLLM2:
        if rehearse:
            return dict(family="llama", vocab=256, hidden=64, inter=128, layers=2, heads=4, kv=2, head_dim=16,
                        max_pos=64, rope_theta=100000.0)
        return dict(family="llama", vocab=49152, hidden=576, inter=1536, layers=30, heads=9, kv=3, head_dim=64,
                    max_pos=8192, rope_theta=100000.0)
    if name == GEMMA3:
        if rehearse:
            return dict(family="gemma3", vocab=256, hidden=64, inter=128, layers=6, heads=4, kv=1, head_dim=16,
                        max_pos=512, window=16)
        return dict(family="gemma3", vocab=262144, hidden=640, inter=2048, layers=18, heads=4, kv=1, head_dim=256,
                    max_pos=32768, window=512)
    raise ValueError(f"unknown model shape {name!r}; known: {SMOLLM2}, {GEMMA3}")


def _attn_s(flops: float) -> float:
    return flops / (ATTN_EFF * PEAK_FLOPS)


def _bytes_s(n: float) -> float:
    return n / (BW_EFF * PEAK_BYTES_S)


def estimate(sz: dict | None = None) -> list[dict]:
    """The time estimate of each step on an H200 (module docstring): rows {step, flops, bytes, work_s, compile_s,
    total_s, budget_s} for the GPU run's :func:`sizes` (or ``sz``). FLOPs of attention count 2 per multiply-add
    (2 T^2 H D for a causal T-token call: half of the T x T scores, each a D-long dot product and a D-long
    weighted sum); bytes are the dominant HBM traffic (masks, KV caches). An estimate, not a measurement: the
    budgets, not these numbers, bound the run."""
    sz = sz or sizes(False)
    rows = []

    def add(step, flops, nbytes, work, compile_s, extra=0.0):
        rows.append({"step": step, "flops": flops, "bytes": nbytes, "work_s": work, "compile_s": compile_s,
                     "total_s": START_S + work + compile_s + extra,
                     "budget_s": next(s.budget_s for s in STEPS if s.name == step)})

    k = sz["kernel_tests"]
    add("kernel_tests", 0.0, 0.0, 0.2 * k["tests"], k["triton"] * TRITON_COMPILE_S + k["flex"] * FLEX_GRAPH_S)

    p = sz["prior_vs_flex"]
    HD = p["H"] * p["D"]
    calls = 7 * (p["reps"] + 1)  # Triton + Flex per kind (3) + SDPA, warm-up + reps
    fl = sum(calls * 2 * T * T * HD for T in p["lengths"]) + 12 * 2 * p["acc_T"] ** 2 * HD
    by = 3 * 4 * p["acc_T"] ** 2 * p["H"] * 4  # the dense reference's scores and probabilities (float32), 12 calls
    add("prior_vs_flex", fl, by, _attn_s(fl) + _bytes_s(by), 6 * TRITON_COMPILE_S + 3 * len(p["lengths"]) * FLEX_GRAPH_S)

    c = sz["chunk_split"]
    HD = c["H"] * c["D"]
    fl = sum(3 * (c["reps"] + 1) * 4 * Tq * Tk * HD for Tq, Tk, _ in c["time"])
    fl += sum(4 * 4 * Tq * Tk * HD for Tq, Tk, _ in c["acc"])  # split, masked, fused, reference
    by = sum((c["reps"] + 1) * Tq * Tk * (1 + 2 + 2 * c["H"]) for Tq, Tk, _ in c["time"])  # mask, bf16 copy, per head
    add("chunk_split", fl, by, _attn_s(fl) + _bytes_s(by), 3 * TRITON_COMPILE_S + 4 * FLEX_GRAPH_S)

    f = sz["prefill_512k"]
    T, L, d = f["length"], f["layers"], f["hidden"]
    params = L * 12 * d * d  # attention 4 d^2 + SwiGLU 8 d^2 (intermediate 8/3 d, three matrices)
    full = sum(1 for v, _ in f["variants"] if v != "alibi_lsh")
    fl = full * 2 * T * T * d * L + len(f["variants"]) * 2 * params * T
    chunks = T // f["chunk"]
    by = len(f["variants"]) * L * sum(2 * (i + 1) * f["chunk"] * d * 2 for i in range(chunks))  # K, V read per chunk
    lsh = 5.0  # alibi_lsh: O(T * window * samples), a few seconds at 512K
    add("prefill_512k", fl, by, _attn_s(fl) + _bytes_s(by) + lsh, 10 * TRITON_COMPILE_S + 2 * FLEX_GRAPH_S,
        extra=len(f["variants"]) * 1.0)  # one model build each

    r = sz["real_models"]
    fl = by = 0.0
    for name in r["models"] + [r["position"][0]]:
        m = model_shape(name)
        HD = m["heads"] * m["head_dim"]
        n_full = m["layers"] if m["family"] == "llama" else m["layers"] // 6
        n_slide = m["layers"] - n_full
        dense = m["layers"] * (4 * m["hidden"] * HD + 3 * m["hidden"] * m["inter"])
        for T in r["lengths"]:  # the lean and the masked path
            att = 2 * T * T * HD * n_full + 4 * T * m.get("window", 0) * HD * n_slide
            fl += 2 * (att + 2 * dense * T)
            by += T * T / 2 * 2 * m["heads"] * n_full  # the masked path's bf16 mask, read once a head and layer
    add("real_models", fl, by, _attn_s(fl) * 1.5 + _bytes_s(by), 6 * FLEX_GRAPH_S, extra=3 * 3.0)  # 3 builds
    return rows


def estimate_table(rows: list[dict] | None = None) -> str:
    """The estimate as the module docstring's table (reStructuredText simple table)."""
    rows = rows or estimate()
    rule = "  ".join(["=" * 22] + ["=" * 9] * 2 + ["=" * 8] * 4)
    out = [rule, f"{'step':<22}  {'TFLOP':>9}  {'GB moved':>9}  {'work s':>8}  {'compile':>8}  {'total s':>8}  "
                 f"{'budget s':>8}", rule]
    for r in rows:
        out.append(f"{r['step']:<22}  {r['flops'] / 1e12:>9.1f}  {r['bytes'] / 1e9:>9.1f}  {r['work_s']:>8.1f}  "
                   f"{r['compile_s']:>8.1f}  {r['total_s']:>8.1f}  {r['budget_s']:>8.0f}")
    out.append(f"{'total':<22}  {'':>9}  {'':>9}  {'':>8}  {'':>8}  {sum(r['total_s'] for r in rows):>8.1f}  "
               f"{sum(r['budget_s'] for r in rows):>8.0f}")
    out.append(rule)
    return "\n".join(out)


# -- tables and the files under --out -----------------------------------------------------------------------------
class Table:
    """A step's CSV, rewritten whole after every row (so a process killed mid-step leaves every finished row).

    path: the CSV file. Columns: the union of the rows' keys, in first-seen order. Each row is also printed as
    one JSON line (to the step's log)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.rows: list[dict] = []

    def add(self, **row) -> None:
        """Append ``row`` (column -> value) and rewrite the file."""
        self.rows.append(row)
        print("\nrow " + json.dumps(row, default=str), flush=True)  # own line: pytest -v ends its lines later
        write_csv(self.path, self.rows)


def write_csv(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` to ``path`` (header: the union of their keys in first-seen order), through a temporary
    file and a rename, so a reader never sees half a file."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, restval="")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def read_csv(path: Path) -> list[dict]:
    """The rows of a CSV written by :func:`write_csv` (all values as text); [] when it does not exist."""
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def own_files(steps=STEPS) -> list[str]:
    """The names this command writes directly under ``--out``, in the order they are kept when room runs out:
    the log, then the steps' CSVs in step order, then the archive."""
    return [LOG_NAME] + [s.csv for s in steps] + [ARCHIVE_NAME]


def pack_out(out: Path, keep: list[str] | None = None, limit: int = MAX_FILES) -> list[str]:
    """Leave at most ``limit`` files directly in ``out`` and no folder: the names in ``keep`` (default
    :func:`own_files` without the archive) stay, in that order of priority; anything else (a stray file or folder a
    step wrote, a previous archive) goes into ``out/extras.tar`` with the lowest-priority kept files that leave no
    room for it, and is removed. Nothing is packed when nothing else is there. Returns the names left, sorted.

    Raises:
        LctxError: ``limit`` < 2 with something to pack (the archive needs a place beside the log).
    """
    keep = keep if keep is not None else own_files()[:-1]
    present = [n for n in keep if (out / n).is_file()]
    strays = sorted(p for p in out.iterdir() if p.name not in present)
    new = [p for p in strays if not (p.name == ARCHIVE_NAME and p.is_file())]  # an earlier call's archive may stay
    if not new and len(present) + len(strays) <= limit:
        return sorted(present + [p.name for p in strays])
    if limit < 2:
        raise LctxError(f"cannot pack {out} into {limit} file(s): the log and the archive need two")
    stay, move = present[:limit - 1], present[limit - 1:]
    fd, tmp = tempfile.mkstemp(suffix=".tar")
    os.close(fd)
    with tarfile.open(tmp, "w") as tar:
        for p in strays + [out / n for n in move]:
            tar.add(p, arcname=p.name)
    for p in strays + [out / n for n in move]:
        if p.is_dir() and not p.is_symlink():
            _rmtree(p)
        else:
            p.unlink()
    os.replace(tmp, out / ARCHIVE_NAME) if _same_fs(tmp, out) else _move(tmp, out / ARCHIVE_NAME)
    return sorted(stay + [ARCHIVE_NAME])


def _rmtree(p: Path) -> None:
    import shutil  # lazy: only when a step left a folder

    shutil.rmtree(p)


def _same_fs(a, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def _move(src, dst: Path) -> None:
    import shutil  # lazy: only when the temp dir is on another file system

    shutil.move(str(src), str(dst))


def check_out(out: Path) -> None:
    """Refuse an ``--out`` this command cannot fill: not writable (:func:`lctx.harness.args.check_writable_dir`),
    or holding files other than this command's own (:func:`own_files`: they would be packed away into its
    archive).

    Raises:
        LctxError: as above.
    """
    check_writable_dir(out)
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if p.name not in own_files())
        if other:
            raise LctxError(f"--out {str(out)!r} holds files that are not the GPU check's ({', '.join(other[:3])}"
                            f"{', ...' if len(other) > 3 else ''}); pass an empty or new folder, e.g. --out \"$OUT\"")


# -- the steps (each in its own process: run_step) ----------------------------------------------------------------
class _Ctx:
    """What a step's function gets: ``dev`` (torch device), ``dtype``, ``rehearse``, ``sz`` (its sizes), ``table``
    (its :class:`Table`), ``out`` (the --out folder)."""

    def __init__(self, name: str, out: Path, rehearse: bool):
        import torch  # lazy: loads torch (the parent process never does)

        self.torch = torch
        self.rehearse = rehearse
        self.dev = torch.device("cpu" if rehearse else "cuda")
        self.dtype = torch.float32 if rehearse else torch.bfloat16
        self.sz = sizes(rehearse)[name]
        self.table = Table(out / f"{name}.csv")
        self.out = out

    def sync(self) -> None:
        """Wait for the device (CUDA), so a wall-clock time covers the work."""
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def seconds(self, fn: Callable, reps: int) -> float:
        """Median seconds of ``reps`` calls of ``fn()`` after one warm-up (compiles), CUDA events on a GPU."""
        torch = self.torch
        fn()
        self.sync()
        times = []
        for _ in range(max(1, reps)):
            if self.dev.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1000)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    def reset_peak(self) -> None:
        """Reset CUDA's peak-allocation counter (nothing on CPU)."""
        if self.dev.type == "cuda":
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> tuple[int, str]:
        """(peak bytes, how): CUDA max allocated since :meth:`reset_peak`, or on CPU the process's peak RSS."""
        if self.dev.type == "cuda":
            return int(self.torch.cuda.max_memory_allocated()), "cuda_max_allocated"
        import resource  # lazy: CPU rehearsal only

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_peak_rss"

    def free(self) -> None:
        """Return cached CUDA memory after a row (an OOM in one row must not starve the next)."""
        import gc  # lazy: between rows only

        gc.collect()
        if self.dev.type == "cuda":
            self.torch.cuda.empty_cache()

    def row(self, fn: Callable[[], dict], **key) -> None:
        """Add the row ``key | fn()``; an exception in ``fn`` is recorded in the row (``status``) and the step goes
        on with its next row."""
        try:
            res = fn()
            self.table.add(**key, **res, status="ok")
        except Exception as e:  # noqa: BLE001 - a failing row is recorded, the step goes on
            traceback.print_exc()
            self.table.add(**key, status=f"error: {type(e).__name__}: {_first_line(e)}")
        finally:
            self.free()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _tol(ref, v, dtype, Tk: int) -> float:
    """The error an output may show against the float32 reference of the same (rounded) inputs: bf16/fp16
    rounds each partial output (|o| <= max |v|) and the result (|ref|) to its mantissa, 2^-(m+1) relative each, so
    2^-m (max|v| + max|ref|) bounds their sum (m = 8 for bf16, 11 for fp16); float32 is the summation-order bound
    Tk * eps * max|v| over Tk keys (as tests/test_chunk_attention.py)."""
    import torch  # lazy: loads torch

    vmax, rmax = float(v.float().abs().max()), float(ref.float().abs().max())
    if dtype == torch.bfloat16:
        return 2.0 ** -8 * (vmax + rmax)
    if dtype == torch.float16:
        return 2.0 ** -11 * (vmax + rmax)
    return Tk * torch.finfo(torch.float32).eps * vmax


def step_kernel_tests(c: _Ctx) -> None:
    """pytest over the ``gpu``-marked kernel tests, in this process (its output goes to the log), one table row
    per test as it finishes: test id, outcome, seconds, the first line of a failure."""
    import pytest  # lazy: the test runner, this step only

    table = c.table

    class Rows:
        """pytest plugin: a row per test report that decides the outcome."""

        def pytest_runtest_logreport(self, report):
            if report.when == "call" or (report.when == "setup" and not report.passed) or \
                    (report.when == "teardown" and report.failed):
                msg = ""
                if report.failed:
                    msg = str(getattr(report.longrepr, "reprcrash", None) or report.longrepr).splitlines()[0][:300]
                elif report.skipped and isinstance(report.longrepr, tuple):
                    msg = str(report.longrepr[2])[:300]
                table.add(test=report.nodeid, outcome=report.outcome, when=report.when,
                          seconds=round(report.duration, 3), message=msg, status="ok")

    args = ["-v", "-rfE", "-p", "no:cacheprovider", *c.sz["args"]]
    print("pytest " + " ".join(args), flush=True)
    rc = pytest.main(args, plugins=[Rows()])
    table.add(test="(pytest exit status)", outcome=f"exit {int(rc)}",
              status="ok" if int(rc) in (0, 5) else f"error: rc {int(rc)}")


def _prior_spec(kind: str, H: int, ssmax: bool, dev):
    """A PriorSpec as the variants build it: no prior, ALiBi slopes, or a GGD prior (reference form) with beta in
    [0.5, 1.5); +ssmax: s_h = 1."""
    import torch  # lazy: loads torch

    from lctx.kernels.flash_prior import PriorSpec  # lazy: loads triton
    from lctx.models.bam import GGDPrior  # lazy: loads lctx.models
    from lctx.models.variants import alibi_bias, alibi_slopes  # lazy: loads lctx.models

    g = torch.Generator().manual_seed(0)
    sl = alibi_slopes(H).float().to(dev)
    prior = GGDPrior(H)
    with torch.no_grad():
        prior.beta.copy_(0.5 + torch.rand(H, generator=g))
    bias = {"none": None, "alibi": lambda d: alibi_bias(sl, d), "ggd": prior.to(dev).bias}[kind]
    return PriorSpec(kind=kind, bias=bias, ssmax=(torch.ones(H, device=dev) if ssmax else None))


def step_prior_vs_flex(c: _Ctx) -> None:
    """The fused prior kernel (Triton) and FlexAttention (compiled on CUDA, eager in the rehearsal) against the
    dense float32 reference on the same rounded inputs (error, derived tolerance, and a control: the error against
    another prior's reference, which must exceed it), then the forward time of both and of SDPA causal per length
    (with the log-sum-exp, as the kernel always returns it)."""
    import torch  # lazy: loads torch
    import torch.nn.functional as F  # lazy: loads torch

    from lctx.kernels.flash_prior import dense_prior_attention, flash_prior_flex, flash_prior_triton  # lazy: loads triton

    p, dev, dt = c.sz, c.dev, c.dtype
    H, D, T = p["H"], p["D"], p["acc_T"]
    compiled = dev.type == "cuda"
    if compiled:  # this sweep compiles flash_prior_flex's static graphs of 3 kinds x 3 lengths, 9 of one function:
        # past dynamo's 8 per code object the ninth would run eagerly (the scores materialised); this process only
        import torch._dynamo  # lazy: the compiler's configuration, this step only

        for name in ("recompile_limit", "cache_size_limit"):  # the limit's name since torch 2.7, and before
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 32))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, generator=g).to(dt).to(dev) for _ in range(3))
    qf, kf, vf = q.float(), k.float(), v.float()
    for kind in ("none", "alibi", "ggd"):
        for ssmax in (False, True):
            spec = _prior_spec(kind, H, ssmax, dev)
            ref = dense_prior_attention(qf, kf, vf, spec)[0]
            other = dense_prior_attention(qf, kf, vf, _prior_spec("alibi" if kind == "none" else "none", H, ssmax, dev))[0]
            impls = [("triton", lambda: flash_prior_triton(q, k, v, spec)[0][0])]
            if not ssmax:  # Flex +ssmax is another graph per length: left out of the lease
                impls.append(("flex", lambda: flash_prior_flex(q, k, v, spec, compile=compiled)[0][0]))
            for impl, fn in impls:
                def acc(fn=fn, ref=ref, other=other):
                    o = fn().float()
                    tol = _tol(ref, v, dt, T)
                    err, ctrl = float((o - ref).abs().max()), float((o - other).abs().max())
                    return {"max_abs_err": err, "tol": tol, "control_err": ctrl, "ok": err <= tol < ctrl}
                c.row(acc, part="accuracy", T=T, kind=kind, ssmax=ssmax, impl=impl)
    del q, k, v, qf, kf, vf
    for T in p["lengths"]:
        q, k, v = (torch.randn(1, H, T, D, device=dev, dtype=dt) for _ in range(3))
        flops = 2 * T * T * H * D
        c.row(lambda: _timed(c, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), p["reps"], flops),
              part="time", T=T, kind="none", ssmax=False, impl="sdpa_causal")
        for kind in ("none", "alibi", "ggd"):
            spec = _prior_spec(kind, H, False, dev)
            c.row(lambda: _timed(c, lambda: flash_prior_triton(q, k, v, spec), p["reps"], flops),
                  part="time", T=T, kind=kind, ssmax=False, impl="triton")
            c.row(lambda: _timed(c, lambda: flash_prior_flex(q, k, v, spec, compile=compiled), p["reps"], flops),
                  part="time", T=T, kind=kind, ssmax=False, impl="flex")
        del q, k, v


def _timed(c: _Ctx, fn: Callable, reps: int, flops: float) -> dict:
    """{"ms", "tflops"} of ``fn`` (:meth:`_Ctx.seconds`), TFLOP/s from the given FLOP count."""
    s = c.seconds(fn, reps)
    return {"ms": float(f"{s * 1000:.5g}"), "tflops": float(f"{flops / s / 1e12:.4g}")}


def step_chunk_split(c: _Ctx) -> None:
    """A chunk's attention over its KV cache: the split (:func:`~lctx.kernels.chunk_attention.chunk_attention`:
    FlexAttention compiled on CUDA; :func:`~lctx.kernels.chunk_attention.flex_split_attention` eagerly in the
    rehearsal), the masked SDPA call it replaces, and the fused Triton kernel with past keys (windows as key
    lower bounds), each against :func:`~lctx.kernels.chunk_attention.chunk_attention_reference` on the same
    rounded inputs (per head: the reference holds a [Tq, Tk] float32 tile), with the derived tolerance and a
    control (the window one token wider, or the past part dropped, must exceed it); then their times."""
    import torch  # lazy: loads torch
    import torch.nn.functional as F  # lazy: loads torch

    from lctx.kernels.chunk_attention import (chunk_attention, chunk_attention_reference, chunk_mask,  # lazy: loads torch
                                              flex_split_attention)
    from lctx.kernels.flash_prior import PriorSpec, flash_prior_triton  # lazy: loads triton

    p, dev, dt = c.sz, c.dev, c.dtype
    H, D = p["H"], p["D"]

    def split(q, k, v, w):
        if dev.type == "cuda":
            return chunk_attention(q, k, v, window=w)
        return flex_split_attention(q, k, v, window=w, compile=False)

    def masked(q, k, v, w):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=chunk_mask(q.shape[2], k.shape[2], w, dev))

    def fused(q, k, v, w):
        Tq, Tk = q.shape[2], k.shape[2]
        ks = None
        if w is not None:  # query i (key index Tk - Tq + i) sees keys from Tk - Tq + i - w + 1
            lo = (torch.arange(Tq, device=dev) + Tk - Tq - w + 1).clamp_min(0)
            ks = lo.expand(1, H, Tq).contiguous()
        return flash_prior_triton(q, k, v, PriorSpec(), past=Tk - Tq, kstart=ks)[0][0].to(q.dtype)

    impls = {"split": split, "masked_sdpa": masked, "fused_triton": fused}
    for Tq, Tk, w in p["acc"]:
        g = torch.Generator().manual_seed(Tq + Tk)
        q, k, v = (torch.randn(1, H, t, D, generator=g).to(dt).to(dev) for t in (Tq, Tk, Tk))
        ref = torch.cat([chunk_attention_reference(q[:, h:h + 1].float(), k[:, h:h + 1].float(), v[:, h:h + 1].float(),
                                                   window=w) for h in range(H)], 1)
        tol = _tol(ref, v, dt, Tk)
        for impl, fn in impls.items():
            def acc(fn=fn):
                o = fn(q, k, v, w).float()
                err = float((o - ref).abs().max())
                out = {"max_abs_err": err, "tol": tol, "ok": err <= tol}
                if impl == "split":  # the control: a real change shows above the tolerance
                    if w is not None and w < Tk:
                        bad = split(q, k, v, w + 1)
                    else:
                        bad = split(q, k[:, :, Tk - Tq:], v[:, :, Tk - Tq:], w)
                    out["control_err"] = float((bad.float() - ref).abs().max())
                    out["ok"] = err <= tol < out["control_err"]
                return out
            c.row(acc, part="accuracy", Tq=Tq, Tk=Tk, window=w, impl=impl)
        del q, k, v, ref
    for Tq, Tk, w in p["time"]:
        q, k, v = (torch.randn(1, H, t, D, device=dev, dtype=dt) for t in (Tq, Tk, Tk))
        flops = 4 * Tq * Tk * H * D
        for impl, fn in impls.items():
            c.row(lambda fn=fn: _timed(c, lambda: fn(q, k, v, w), p["reps"], flops) | _peak_of(c, lambda: fn(q, k, v, w)),
                  part="time", Tq=Tq, Tk=Tk, window=w, impl=impl)
        del q, k, v


def _peak_of(c: _Ctx, fn: Callable) -> dict:
    """{"peak_bytes"} of one call of ``fn`` on CUDA (the rehearsal: nothing)."""
    if c.dev.type != "cuda":
        return {}
    c.reset_peak()
    before = c.torch.cuda.memory_allocated()
    fn()
    c.sync()
    return {"peak_bytes": int(c.torch.cuda.max_memory_allocated() - before)}


def passkey_ids(length: int, vocab: int, seed: int = 0, depth: float = 0.5) -> list[int]:
    """A passkey-shaped prompt of ``length`` token ids without a tokenizer (none exists on the GPU machine): random
    filler ids in [3, vocab), a 5-token key planted at ``depth`` (fraction of the prompt) and repeated at the end.
    Random weights cannot retrieve it: the prompt gives a prefill its length and shape, nothing more.

    Raises:
        ValueError: length < 12 or vocab < 4.
    """
    import random  # lazy: cheap, here only

    if length < 12 or vocab < 4:
        raise ValueError(f"passkey_ids needs length >= 12 and vocab >= 4, got {length}, {vocab}")
    rng = random.Random(seed)
    ids = [rng.randrange(3, vocab) for _ in range(length)]
    key = [rng.randrange(3, vocab) for _ in range(5)]
    at = min(int(depth * length), length - 10)
    ids[at:at + 5] = key
    ids[-5:] = key
    return ids


def step_prefill_512k(c: _Ctx) -> None:
    """A chunked prefill of a passkey-shaped prompt through a random 125M-class lctx model per (variant,
    attn_impl), into a preallocated KV cache, keeping the last logits only: seconds, tokens/s, peak bytes, and the
    kernel each variant's attention ran (:func:`lctx.kernels.impls_used`)."""
    import torch  # lazy: loads torch

    from lctx.kernels import impls_used  # lazy: loads torch
    from lctx.models import LctxConfig, LctxForCausalLM  # lazy: loads transformers
    from lctx.models.cache import PreallocatedKVCache  # lazy: loads torch

    p, dev, dt = c.sz, c.dev, c.dtype
    T, chunk = p["length"], p["chunk"]
    ids = torch.tensor(passkey_ids(T, p["vocab"]), device=dev)[None]
    for variant, impl in p["variants"]:
        def run(variant=variant, impl=impl):
            torch.manual_seed(0)
            cfg = LctxConfig(vocab_size=p["vocab"], hidden_size=p["hidden"], num_hidden_layers=p["layers"],
                             num_attention_heads=p["heads"], variant=variant, attn_impl=impl, train_length=2048)
            model = LctxForCausalLM(cfg).to(dev, dt).eval()  # initialised on CPU, as a checkpoint loads
            impls_used(reset=True)
            c.reset_peak()
            c.sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                cache = PreallocatedKVCache(T + 64)
                for s in range(0, T, chunk):
                    logits = model(ids[:, s:s + chunk], cache=cache, use_cache=True, logits_to_keep=1).logits
            c.sync()
            sec = time.perf_counter() - t0
            peak, how = c.peak()
            return {"seconds": round(sec, 3), "tokens_per_s": round(T / sec, 1), "peak_bytes": peak, "peak_how": how,
                    "kernel": ";".join(f"{k}={v}" for k, v in impls_used(reset=True).items()),
                    "finite": bool(torch.isfinite(logits).all())}
        c.row(run, variant=variant, attn_impl=impl, length=T, chunk=chunk, dtype=str(dt).replace("torch.", ""))


def hf_config(name: str, rehearse: bool = False, position: str | None = None):
    """A transformers config of :func:`model_shape` ``name`` (LlamaConfig or Gemma3TextConfig), with a positional
    method applied (``position``, e.g. ``"yarn:factor=16"``: :func:`lctx.models.position.parse_position`, its
    check and ``apply_config`` per layer type, as ``lctx run --position`` does).

    Raises:
        ValueError: an unknown name. LctxError: a method that does not apply.
    """
    from transformers import Gemma3TextConfig, LlamaConfig  # lazy: loads transformers

    m = model_shape(name, rehearse)
    common = dict(vocab_size=m["vocab"], hidden_size=m["hidden"], intermediate_size=m["inter"],
                  num_hidden_layers=m["layers"], num_attention_heads=m["heads"], num_key_value_heads=m["kv"],
                  head_dim=m["head_dim"], max_position_embeddings=m["max_pos"], tie_word_embeddings=True)
    if m["family"] == "llama":
        cfg = LlamaConfig(**common, rope_theta=m["rope_theta"], rms_norm_eps=1e-5)
    else:
        cfg = Gemma3TextConfig(**common, sliding_window=m["window"], query_pre_attn_scalar=m["head_dim"],
                               rms_norm_eps=1e-6)
    if position:
        from lctx.models.position import parse_position  # lazy: loads lctx.models

        method = parse_position(position)
        method.check(cfg, "hf")
        for layer_type in method.layer_types(cfg):
            method.apply_config(cfg, layer_type)
    return cfg


def step_real_models(c: _Ctx) -> None:
    """Random-weight models of the real shapes (:func:`hf_config`), bf16, prefilled through lctx's adapter
    (:class:`lctx.models.adapters.hf.HFAdapter`, chunked into transformers' DynamicCache, sliding layers keeping
    their window) on the lean path (``lctx_sdpa``) and the masked path (transformers' ``sdpa``), per length:
    seconds, tokens/s, peak bytes, and the masked path's last logits against the lean path's (max abs difference,
    relative to the largest logit, and whether the top token agrees); then the positional method on its model."""
    import torch  # lazy: loads torch
    from transformers import AutoModelForCausalLM  # lazy: loads transformers

    from lctx.models.adapters.hf import HFAdapter  # lazy: loads transformers
    from lctx.models.adapters.hf_attention import register  # lazy: loads transformers

    p, dev, dt = c.sz, c.dev, c.dtype
    lean = register()
    runs = [(name, None) for name in p["models"]] + [p["position"]]
    for name, position in runs:
        try:
            cfg = hf_config(name, c.rehearse, position)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, dtype=dt).to(dev).eval()  # initialised on CPU
        except Exception as e:  # noqa: BLE001 - recorded, the next model goes on
            traceback.print_exc()
            c.table.add(model=name, position=position or "shipped", status=f"error: {type(e).__name__}: {_first_line(e)}")
            continue
        lm = HFAdapter(model=model, tokenizer=None, name=name, path="", variant=cfg.model_type, train_length=None,
                       max_length=None, device=dev, dtype=dt, chunk_size=p["chunk"], attn_impl=f"hf:{lean}")
        for T in p["lengths"]:
            ids = passkey_ids(T, cfg.vocab_size, seed=T)
            last = {}
            for path, impl in (("lean", lean), ("masked", "sdpa")):
                def run(path=path, impl=impl):
                    model.set_attn_implementation(impl)
                    c.reset_peak()
                    c.sync()
                    t0 = time.perf_counter()
                    prefix, _ = lm.prefill(ids)
                    c.sync()
                    sec = time.perf_counter() - t0
                    peak, how = c.peak()
                    last[path] = prefix.last_logits.float()
                    out = {"seconds": round(sec, 3), "tokens_per_s": round(T / sec, 1), "peak_bytes": peak,
                           "peak_how": how}
                    if path == "masked" and "lean" in last:
                        d = float((last["masked"] - last["lean"]).abs().max())
                        out.update(max_abs_logit_diff=d, rel_logit_diff=d / max(float(last["lean"].abs().max()), 1e-9),
                                   top1_agree=bool(last["masked"].argmax() == last["lean"].argmax()))
                    del prefix
                    return out
                c.row(run, model=name, position=position or "shipped", length=T, path=path, attn=impl,
                      chunk=p["chunk"], dtype=str(dt).replace("torch.", ""))
        del lm, model


STEP_FUNCTIONS: dict[str, Callable[[_Ctx], None]] = {
    "kernel_tests": step_kernel_tests, "prior_vs_flex": step_prior_vs_flex, "chunk_split": step_chunk_split,
    "prefill_512k": step_prefill_512k, "real_models": step_real_models}


def run_step(name: str, out: Path, rehearse: bool) -> int:
    """A step's process: print the device, run the step's function (its rows go to ``out/NAME.csv``). Returns 0,
    or 1 when the step raised (its traceback printed; the rows written so far stay)."""
    if rehearse:
        _refuse_imports(MISSING_ON_GPU)
    c = _Ctx(name, out, rehearse)
    torch = c.torch
    dev = torch.cuda.get_device_name() if c.dev.type == "cuda" else "CPU (rehearsal)"
    try:
        import triton  # lazy: only to print its version (the kernels import it themselves)

        tv = triton.__version__
    except ImportError:
        tv = "none"
    import transformers  # lazy: only to print its version

    print(f"step {name}: device {dev}; torch {torch.__version__}, triton {tv}, transformers "
          f"{transformers.__version__}; TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}", flush=True)
    try:
        STEP_FUNCTIONS[name](c)
    except Exception:  # noqa: BLE001 - the parent records the failure
        traceback.print_exc()
        return 1
    return 0


def _refuse_imports(names) -> None:
    """Make ``import X`` fail for each top-level package in ``names`` in this process (the rehearsal: what the GPU
    machine's image lacks, :data:`MISSING_ON_GPU`)."""
    import importlib.abc  # lazy: the rehearsal only
    import importlib.machinery  # lazy: the rehearsal only

    class Refuse(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        """Finds each refused package, with a loader that fails: ``import X`` raises ImportError (a probe such as
        ``importlib.util.find_spec`` still sees it; the GPU machine would say it is absent)."""

        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] in names:
                return importlib.machinery.ModuleSpec(fullname, self)
            return None

        def create_module(self, spec):
            raise ImportError(f"{spec.name} is not installed on the GPU machine (gpu_check --rehearse refuses it)")

        def exec_module(self, module):  # never reached: create_module raises
            raise ImportError(module.__name__)

    sys.meta_path.insert(0, Refuse())


# -- the parent: one process per step under its budget --------------------------------------------------------------
def run_check(out: Path, rehearse: bool = False, steps: Optional[str] = None, budget_s: Optional[float] = None,
              echo: Callable[[str], None] = print) -> int:
    """Run the steps (``steps``: comma-separated names, default all, in :data:`STEPS` order), each in a process of
    its own (this file, ``--child NAME``) with its budget as timeout, all within ``budget_s`` (default
    :data:`TOTAL_BUDGET_S`; the rehearsal's :data:`REHEARSE_TOTAL_S`); the processes' output goes to the log. A
    step that exits non-zero, times out, or gets no time left is recorded as a row of its CSV and in the log, and
    the next one starts. Then :func:`pack_out`. Returns 0 when every step ran to the end, 1 when one failed, timed
    out or was skipped (the results so far are in the files either way).

    Raises:
        LctxError: ``--out`` unusable (:func:`check_out`), an unknown step, or no CUDA device without ``rehearse``.
    """
    check_out(out)
    chosen = _chosen_steps(steps)
    if not rehearse:
        _require_cuda()
    out.mkdir(parents=True, exist_ok=True)
    total = budget_s if budget_s is not None else (REHEARSE_TOTAL_S if rehearse else TOTAL_BUDGET_S)
    deadline = time.monotonic() + total
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if rehearse:  # Triton's interpreter must be chosen before triton is imported: set for the steps' processes;
        # one CPU thread (on a shared CPU, torch's default threads spin against other processes: a tiny model's
        # 64-token forward took 0.25 s instead of 4 ms at load 3 on 2 cores)
        env.update(TRITON_INTERPRET="1", LCTX_INTERPRETED_KERNELS="1", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                   LCTX_NUM_THREADS="1")
    repo = Path(__file__).resolve().parents[2]
    log_path = out / LOG_NAME
    summary = []
    with open(log_path, "a", buffering=1) as log:
        head = (f"gpu_check {'REHEARSAL (CPU, tiny sizes)' if rehearse else 'on the GPU'}: steps "
                f"{', '.join(s.name for s in chosen)}; budget {total:.0f} s; {time.strftime('%Y-%m-%d %H:%M:%S')}; "
                f"code {_revision(repo)} ({repo})")
        log.write(head + "\n" + ("" if rehearse else estimate_table() + "\n"))
        echo(head)
        for step in chosen:
            left = deadline - time.monotonic()
            budget = min(REHEARSE_STEP_S if rehearse else step.budget_s, left)
            if budget < MIN_STEP_S:
                status, sec = "skipped (no time left in the budget)", 0.0
            else:
                log.write(f"\n===== step {step.name} (budget {budget:.0f} s): {step.what}\n")
                log.flush()
                status, sec = _run_child(child_command(step.name, out, rehearse), budget, env, log, repo)
            if status != "ok":
                rows = read_csv(out / step.csv)
                write_csv(out / step.csv, rows + [{"status": f"step {status}", "seconds": round(sec, 1)}])
            line = f"step {step.name}: {status}" + (f" in {sec:.0f} s" if status in ("ok",) or
                                                     status.startswith("failed") else "")
            log.write(line + "\n")
            echo(line)
            summary.append({"step": step.name, "status": status, "seconds": round(sec, 1),
                            "rows": len(read_csv(out / step.csv))})
        log.write("\n===== summary\n" + "\n".join(json.dumps(s) for s in summary) + "\n")
    left = pack_out(out)
    with open(log_path, "a") as log:  # appending to the log changes no count
        log.write(f"files: {', '.join(left)}\n")
    echo(f"files under {out}: {', '.join(left)}")
    partial = [s["step"] for s in summary if s["status"] != "ok"]
    if partial:
        echo(f"not every step ran to the end ({', '.join(partial)}): the reasons are in the log and each step's CSV")
    return 1 if partial else 0


def _revision(repo: Path) -> str:
    """``git describe --always --dirty`` of the checkout the script runs from, or "no git revision" (the device
    machine gets a copy of the working tree with its .git folder; a copy without one says so)."""
    try:
        r = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty", "--abbrev=12"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or "no git revision"
    except (OSError, subprocess.SubprocessError):
        return "no git revision"


def child_command(name: str, out: Path, rehearse: bool) -> list[str]:
    """The command line of step ``name``'s process: this file run by this Python with ``--child NAME``."""
    return ([sys.executable, str(Path(__file__).resolve()), "--child", name, "--out", str(out)]
            + (["--rehearse"] if rehearse else []))


def _run_child(cmd: list[str], budget: float, env: dict, log, cwd: Path) -> tuple[str, float]:
    """Run a step's process (its own process group, output to ``log``) for at most ``budget`` seconds; returns
    (status: "ok", "failed (exit N)" or "timed out (budget B s)", seconds). A process past its budget is killed
    with its group (pytest's workers, compile workers), and so is one whose parent is interrupted (Ctrl-C): the
    interruption is written to the log and raised again."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    try:
        rc = proc.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        _end_group(proc.pid)
        proc.wait()
        return f"timed out (budget {budget:.0f} s)", time.monotonic() - t0
    except BaseException:  # Ctrl-C or a kill of this process: its own session would outlive us, writing on
        _end_group(proc.pid)
        proc.wait()
        log.write(f"\n===== interrupted: the step's process group was killed after {time.monotonic() - t0:.0f} s\n")
        raise
    _end_group(proc.pid)  # compile workers a step left behind
    return ("ok" if rc == 0 else f"failed (exit {rc})"), time.monotonic() - t0


def _end_group(pgid: int) -> None:
    """Kill what is left of a finished step's process group (inductor's compile workers outlive their parent)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _chosen_steps(steps: Optional[str]) -> list[Step]:
    """The steps named in ``steps`` (comma-separated), in :data:`STEPS` order; all when ``None``.

    Raises:
        LctxError: an unknown name.
    """
    if not steps:
        return list(STEPS)
    names = [s.strip() for s in steps.split(",") if s.strip()]
    known = {s.name for s in STEPS}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise LctxError(f"--steps {steps!r}: unknown step {', '.join(bad) or '(none given)'}; the steps are "
                        f"{', '.join(s.name for s in STEPS)}")
    return [s for s in STEPS if s.name in names]


def _require_cuda() -> None:
    """Raises LctxError when torch sees no CUDA device (``--rehearse`` runs on CPU)."""
    import torch  # lazy: loads torch (only to ask for a device; no CUDA context is made)

    if not torch.cuda.is_available():
        raise LctxError("gpu-check needs a CUDA device (torch sees none); run it on the GPU machine, or rehearse it "
                        "here with --rehearse")


# -- command line ------------------------------------------------------------------------------------------------------
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, help=__doc__.splitlines()[0])


def _out_arg(value) -> Path:
    """``--out`` as typed, to a Path; an empty one is refused (a script's ``--out "$OUT"`` with OUT unset)."""
    if not str(value).strip():
        raise LctxError("--out is empty; pass a folder for the results, e.g. --out \"$OUT\" (OUT unset?)")
    return Path(value)


@app.command()
def _cli(out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_out_arg, help="Folder for the log and the "
                                            "tables (at most 6 files); new, empty, or an earlier gpu_check's."),
         rehearse: bool = typer.Option(False, "--rehearse", help="Every step at tiny sizes on CPU (Triton's "
                                       "interpreter), under 2 minutes: the script is known to run before a lease."),
         steps: Optional[str] = typer.Option(None, "--steps", help="Only these steps, comma-separated: "
                                             + ", ".join(s.name for s in STEPS) + "."),
         budget: Optional[float] = typer.Option(None, "--budget", min=10, help=f"Seconds for all steps (default "
                                                f"{TOTAL_BUDGET_S:.0f}; rehearsal {REHEARSE_TOTAL_S})."),
         show_estimate: bool = typer.Option(False, "--estimate", help="Print the time estimate and exit."),
         child: Optional[str] = typer.Option(None, "--child", hidden=True)) -> None:
    """The GPU lease script (module docstring)."""
    if show_estimate:
        print(estimate_table())
        raise typer.Exit(0)
    if out is None:
        raise LctxError("--out is required: the folder for the log and the tables, e.g. --out \"$OUT\"")
    if child:
        raise typer.Exit(run_step(child, out, rehearse))
    raise typer.Exit(run_check(out, rehearse=rehearse, steps=steps, budget_s=budget))


def main(argv: list[str] | None = None) -> int:
    """``python harness/commands/gpu_check.py ...``: returns the exit status; a user mistake (LctxError, a bad
    option) is one ``error:`` line on stderr and status 2, never a traceback."""
    usage_errors = tuple({getattr(typer, "TyperException", click.ClickException), click.ClickException})
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="gpu_check")
        return rv if isinstance(rv, int) else 0
    except LctxError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (typer.Exit, click.exceptions.Exit) as e:
        return e.exit_code
    except usage_errors as e:
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        print(f"error: {' '.join(msg.split())}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    from lctx.harness.commands.gpu_check import main as _main  # the package's copy of this module (after _bootstrap)

    sys.exit(_main())
