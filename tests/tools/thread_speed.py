"""Wall and CPU time of one small ``lctx run`` under different CPU thread settings (README "Threads"), measured
side by side in one process: every round runs the same command once per setting as a fresh process (the order
alternates per round, so a busy shared CPU slows all alike); the result is each setting's per-round ratio to
the first setting, median over the rounds. The seconds themselves are noise on a shared machine.

    python tests/tools/thread_speed.py --rounds 3
    python tests/tools/thread_speed.py --setting 1 --setting 2:SPIN --setting 2 -- --tasks ppl --lengths 1k

A setting is ``N`` (``LCTX_NUM_THREADS=N``, and the wait policy lctx chooses: PASSIVE, README "Threads"),
``N:PASSIVE`` / ``N:ACTIVE`` (also ``OMP_WAIT_POLICY``: PASSIVE lets an OpenMP thread that waits at a barrier
sleep, ACTIVE spins) or ``N:SPIN`` (GNU OpenMP's own default, which lctx used before it chose PASSIVE: spin
300,000 times, then sleep; ``GOMP_SPINCOUNT=300000``, no ``OMP_WAIT_POLICY``). Arguments after ``--`` go to
``lctx run`` (default: the bundled model on ``ppl`` at 256 to 2K tokens, no progress bar).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its sibling
from startup_speed import _LCTX, run_once  # noqa: E402

#: the ``lctx run`` arguments timed when none are given after ``--``: the default run's ppl half
DEFAULT_ARGS = ["run", "--tasks", "ppl", "--no-progress"]


def setting_env(setting: str) -> dict[str, str]:
    """The environment variables of one setting: ``"2"`` -> LCTX_NUM_THREADS=2, ``"2:PASSIVE"`` -> also
    OMP_WAIT_POLICY=PASSIVE, ``"2:SPIN"`` -> GOMP_SPINCOUNT=300000 (the thread-related variables already in
    the environment are dropped, so every setting says all it changes).

    Raises:
        ValueError: not ``N`` or ``N:PASSIVE|ACTIVE|SPIN`` with N a positive integer.
    """
    n, _, policy = setting.partition(":")
    policy = policy.upper()
    if not n.isdigit() or int(n) < 1 or policy not in ("", "PASSIVE", "ACTIVE", "SPIN"):
        raise ValueError(f"setting {setting!r} is not N or N:PASSIVE|ACTIVE|SPIN (e.g. 2 or 2:SPIN)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "LCTX_NUM_THREADS")}
    env["LCTX_NUM_THREADS"] = n
    if policy == "SPIN":
        env["GOMP_SPINCOUNT"] = "300000"  # libgomp's default without OMP_WAIT_POLICY (env.c)
    elif policy:
        env["OMP_WAIT_POLICY"] = policy
    return env


def measure(settings: list[str], args: list[str], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """{setting: [(wall s, CPU s)] per round}; each run writes a fresh run directory (nothing resumed)."""
    out: dict[str, list[tuple[float, float]]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="lctx-threads-") as tmp:
        for r in range(rounds):
            for i, s in enumerate(settings if r % 2 == 0 else settings[::-1]):
                env = setting_env(s)
                cmd = _LCTX + args + ["--out", os.path.join(tmp, f"r{r}-{i}")]
                old = dict(os.environ)
                os.environ.clear()
                os.environ.update(env)  # run_once's child inherits it
                try:
                    out[s].append(run_once(cmd))
                finally:
                    os.environ.clear()
                    os.environ.update(old)
    return out


def main() -> None:
    argv = sys.argv[1:]
    run_args = argv[argv.index("--") + 1:] if "--" in argv else DEFAULT_ARGS
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each runs every setting once)")
    ap.add_argument("--setting", action="append", help="N or N:PASSIVE|ACTIVE|SPIN (repeatable; default 1, 2:SPIN, 2)")
    a = ap.parse_args(argv)
    settings = a.setting or ["1", "2:SPIN", "2"]
    for s in settings:
        setting_env(s)  # refuse a bad one before any run
    if run_args[:1] != ["run"]:
        run_args = ["run"] + run_args
    load0 = os.getloadavg()[0]
    res = measure(settings, run_args, a.rounds)
    print(f"lctx {' '.join(run_args)}: {a.rounds} interleaved rounds, {os.cpu_count()} CPUs, nice "
          f"{os.nice(0)}; 1-min load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"| setting | wall s median (min-max) | CPU s median | wall / {settings[0]}, median of rounds (min-max) |")
    print("|---|---|---|---|")
    base = res[settings[0]]
    for s, v in res.items():
        w, c = [x[0] for x in v], [x[1] for x in v]
        rw = [x[0] / b[0] for x, b in zip(v, base)]
        print(f"| {s} | {statistics.median(w):.1f} ({min(w):.1f}-{max(w):.1f}) | {statistics.median(c):.1f} | "
              f"{statistics.median(rw):.2f} ({min(rw):.2f}-{max(rw):.2f}) |")


if __name__ == "__main__":
    main()
