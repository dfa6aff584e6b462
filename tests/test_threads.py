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


def test_busy_machine_gets_a_note_not_another_count(monkeypatch):
    # the fresh-user trial: torch's 2 threads made a ppl run 15x slower than 1 thread at load > cores, and the
    # README's advice (LCTX_NUM_THREADS=1) never reached the user; the count stays a fixed rule, the note says it
    import lctx.kernels as K

    for var in ("LCTX_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(K, "_TORCH_DEFAULT_THREADS", 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (6.5, 6.0, 5.0))
    note = K.busy_note()
    assert note and "load 6.5 on 4 CPUs" in note and "4 threads" in note and "LCTX_NUM_THREADS=1" in note
    assert K.default_threads() == (4, "torch's default (physical cores)")  # unchanged by the load
    monkeypatch.setattr(os, "getloadavg", lambda: (3.9, 6.0, 5.0))
    assert K.busy_note() is None  # not busy: the load fits the CPUs
    monkeypatch.setattr(os, "getloadavg", lambda: (6.5, 6.0, 5.0))
    monkeypatch.setenv("LCTX_NUM_THREADS", "2")
    assert K.busy_note() is None  # the user chose the count


def _wait_policy_after_cli(env_extra: dict) -> str:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(env_extra)
    code = ("import os; from lctx.cli import main; main(['list', 'tasks']); "
            "print(repr(os.environ.get('OMP_WAIT_POLICY')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def test_cli_sets_a_passive_omp_wait_policy_unless_the_user_chose():
    # measured (README "Threads"): at load 4-6 on 2 cores a ppl run on 2 spinning threads took 2.9-5.6x the time
    # of 1 thread, 1.0-1.6x with OMP_WAIT_POLICY=PASSIVE; OpenMP reads it once, when torch loads: the CLI sets it first
    assert _wait_policy_after_cli({}) == "'PASSIVE'"
    assert _wait_policy_after_cli({"OMP_WAIT_POLICY": "active"}) == "'active'"
    assert _wait_policy_after_cli({"GOMP_SPINCOUNT": "300000"}) == "None"  # GNU OpenMP's own spin setting


def test_run_json_records_the_thread_settings(monkeypatch):
    import lctx.kernels as K

    monkeypatch.setenv("LCTX_NUM_THREADS", "1")
    monkeypatch.setattr(K, "_OMP_WAIT_POLICY", "PASSIVE")
    s = K.thread_settings()
    assert s == {"threads": K.torch.get_num_threads(), "threads_source": "LCTX_NUM_THREADS",
                 "omp_wait_policy": "PASSIVE"}
