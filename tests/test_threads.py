"""How lctx chooses CPU threads (README "Threads", issue 14 item 4): a fixed rule, not the machine's load."""

from __future__ import annotations

import os


def test_default_threads_ignore_other_processes_load(monkeypatch):
    # two runs of one command on one machine must use the same count whatever else runs (timings and the
    # last bits of parallel reductions depend on it): the load average must not enter the rule
    import lctx.kernels as K

    for var in ("LCTX_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    quiet = K.default_threads()
    monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 50.0, 50.0))
    assert K.default_threads() == quiet
    assert quiet[0] == K._TORCH_DEFAULT_THREADS >= 1


def test_thread_overrides(monkeypatch):
    import lctx.kernels as K

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("LCTX_NUM_THREADS", raising=False)
    assert K.default_threads() == (3, "OMP_NUM_THREADS")
    monkeypatch.setenv("LCTX_NUM_THREADS", "2")  # lctx's own variable wins
    assert K.default_threads() == (2, "LCTX_NUM_THREADS")
    monkeypatch.setenv("LCTX_NUM_THREADS", "zero")  # not a positive integer: ignored
    assert K.default_threads() == (3, "OMP_NUM_THREADS")
