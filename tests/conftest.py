"""Shared fixtures: a tiny tokenizer and model factory, the shared data directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The repository root must not be on sys.path (``python -m pytest`` puts the working directory there): its
# top-level ``kernels/`` folder would shadow the ``kernels`` package transformers >= 5.25 depends on and imports
# at start-up (found on a fresh CI install, 2026-12-03: 34 modules failed to import). lctx itself is imported as
# installed (``lctx.kernels``), never from the folder's own name.
_REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _REPO]

import torch  # noqa: E402

# Without a GPU, Triton kernels run under Triton's interpreter (fp32; it must be chosen before any
# kernel module is imported, because @triton.jit reads it at decoration time). With a GPU they compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# ... but only the kernel tests (KERNEL_TEST_MODULES) run attn_impl="fast" through the interpreter; every other
# test's fast path (the default since issue 28) takes the CPU forms, as a CPU user's does
# (lctx.kernels.choose_kernel reads LCTX_INTERPRETED_KERNELS per call).
os.environ["LCTX_INTERPRETED_KERNELS"] = "0"
KERNEL_TEST_MODULES = {"test_flash_prior", "test_interdomain_scan", "test_kernels", "test_attn_impl", "test_lsh",
                       "test_interdomain", "test_bam", "test_path", "test_variants"}

# One intra-op thread unless the caller chose a count: the tests' models are tiny, and on a shared 2-core
# machine two OpenMP threads spin against the other processes (measured at load 5: test_runner's
# test_every_other_input_changes_the_key[chunk_size] took 96 s wall / 52 s CPU with torch's default 2 threads,
# 18 s / 13 s with 1). The CLI (lctx.kernels.configure_threads) and subprocesses read the same variable;
# tests/test_threads.py sets its own.
# lctx.kernels is imported first, so that it records torch's own default (test_threads.py reads it).
if not (os.environ.get("LCTX_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")):
    import lctx.kernels  # noqa: E402,F401

    os.environ["LCTX_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

import pytest  # noqa: E402

from helpers import tiny_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Root of ../shared/data (override with LCTX_DATA_DIR); tests needing it skip when absent."""
    p = Path(os.environ.get("LCTX_DATA_DIR", REPO.parent / "shared" / "data"))
    if not p.is_dir():
        pytest.skip(f"shared data not found at {p}; set LCTX_DATA_DIR")
    return p


@pytest.fixture(scope="session")
def tokenizer():
    """A 400-token byte-level BPE trained on Python's pydoc topics (digits split individually)."""
    from lctx.tasks.textdata import pydoc_corpus
    from lctx.models.tokenizer import train_tokenizer

    docs = pydoc_corpus()
    return train_tokenizer([t for _, t in docs[:60]], 400)


@pytest.fixture
def make_checkpoint(tmp_path, tokenizer):
    """make_checkpoint(variant, **config) -> path of a saved random-init checkpoint with the tiny tokenizer."""
    from transformers.utils import logging as hf_logging

    from lctx.models import LctxForCausalLM

    def make(variant: str = "rope", name: str | None = None, **kw) -> Path:
        torch.manual_seed(0)
        model = LctxForCausalLM(tiny_config(variant, vocab_size=len(tokenizer), **kw))
        out = tmp_path / (name or f"ck_{variant}")
        hf_logging.disable_progress_bar()  # transformers' "Writing model shards" bar would land in the test's
        model.save_pretrained(out)  # captured stderr, which one-line-error tests read (run alone, nothing else disables it)
        tokenizer.save_pretrained(out)
        return out

    return make


@pytest.fixture
def data(tmp_path) -> Path:
    """A small text file (helpers.TEXT) for ppl runs."""
    from helpers import TEXT

    p = tmp_path / "doc.txt"
    p.write_text(TEXT)
    return p


@pytest.fixture
def isolated_digests(monkeypatch, tmp_path):
    """No data dir from the environment; the file-digest cache (LCTX_HASH_CACHE) in the test's own folder, so a
    test that rewrites a file in place sees only its own entries (issue 10's and trial 21's tests)."""
    monkeypatch.delenv("LCTX_DATA_DIR", raising=False)
    monkeypatch.setenv("LCTX_HASH_CACHE", str(tmp_path / "digests.json"))


@pytest.fixture
def plain_console(monkeypatch):
    """Output as off a terminal (issue 16's tests): no data dir nor table format from the environment, and the
    80 columns rich assumes off a terminal (where cells used to be cut)."""
    monkeypatch.delenv("LCTX_DATA_DIR", raising=False)
    monkeypatch.delenv("LCTX_TABLE_FORMAT", raising=False)
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture(autouse=True)
def _interpreted_kernels(request, monkeypatch):
    """The kernel test modules (KERNEL_TEST_MODULES) run attn_impl="fast" through the Triton interpreter."""
    if request.module.__name__.rsplit(".", 1)[-1] in KERNEL_TEST_MODULES:
        monkeypatch.setenv("LCTX_INTERPRETED_KERNELS", "1")


# ---------------------------------------------------------------------------------------------------------------
# CPU time per test (issue 42 item 10): `--cpu-durations=N` prints the N tests that used the most CPU time (this
# process and its waited-for children: os.times), beside their wall time, and names every test of the run that is
# not marked slow yet used more than FAST_CPU_BUDGET_S of CPU. CPU time is what a busy machine does not stretch
# (wall time at load 13 was 2-4x a quiet machine's), so it is the load-independent check of the fast subset's
# promise; nothing asserts it (a report, not a test).
# ---------------------------------------------------------------------------------------------------------------

#: CPU seconds a test of the fast subset may use (setup + call + teardown): half the 5 s the fast subset promises in
#: wall time, so that it still holds with the other core busy
FAST_CPU_BUDGET_S = 2.5
_CPU_TIMES: dict = {}


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="print the N tests with the most CPU time (os.times, children included) and every test "
                          f"not marked slow over {FAST_CPU_BUDGET_S} CPU s")


def _cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import time

    cpu0, wall0 = _cpu_now(), time.perf_counter()
    yield
    _CPU_TIMES[item.nodeid] = (_cpu_now() - cpu0, time.perf_counter() - wall0, item.get_closest_marker("slow") is None)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("--cpu-durations")
    if n is None or not _CPU_TIMES:
        return
    rows = sorted(_CPU_TIMES.items(), key=lambda kv: -kv[1][0])
    tr = terminalreporter
    tr.write_sep("=", f"{n} tests with the most CPU time (cpu s / wall s)")
    for nodeid, (cpu, wall, _) in rows[:n]:
        tr.write_line(f"{cpu:7.2f} {wall:7.2f}  {nodeid}")
    over = [(k, v) for k, v in rows if v[2] and v[0] > FAST_CPU_BUDGET_S]
    tr.write_sep("=", f"{len(over)} tests not marked slow over {FAST_CPU_BUDGET_S} CPU s")
    for nodeid, (cpu, wall, _) in over:
        tr.write_line(f"{cpu:7.2f} {wall:7.2f}  {nodeid}")
    tr.write_line(f"total: {sum(v[0] for v in _CPU_TIMES.values()):.1f} CPU s over {len(_CPU_TIMES)} tests")


@pytest.fixture(autouse=True)
def _forget_secrets():
    """Secrets a test registered (lctx.outside.register_secret: an --api-key-env key) are forgotten after it, so a
    later test's text is not redacted by another test's key."""
    yield
    from lctx.outside import forget_secrets

    forget_secrets()
