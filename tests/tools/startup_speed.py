"""Start-up time of the light ``lctx`` commands against ``python -c "import torch"`` (issue 15 item 4), measured
side by side in one process: every round runs each command once as a fresh process (the order alternates per
round, so a busy shared CPU slows all alike), and the result is the per-round ratio to ``import torch``, median
over the rounds, for wall time and for the child's CPU time (user + sys). The seconds themselves are noise on a
shared machine; the ratios are the result.

    python tests/tools/startup_speed.py --rounds 7

Target (README "Start-up"): ``lctx list variants`` <= 1.3x ``import torch``; ``lctx --help``, ``lctx list
tasks`` and the one-line errors import no torch at all (``tests/test_startup.py`` checks the imports).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

#: what each row runs (a fresh interpreter each; ``lctx`` as its console script does: ``lctx.cli.main``)
_LCTX = [sys.executable, "-c", "import sys; from lctx.cli import main; sys.argv[0] = 'lctx'; main()"]
COMMANDS = {"import torch": [sys.executable, "-c", "import torch"],
            "lctx --help": _LCTX + ["--help"],
            "lctx list variants": _LCTX + ["list", "variants"],
            "lctx list tasks": _LCTX + ["list", "tasks"]}


def run_once(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user + sys of the child) of one run of ``cmd``.

    Raises:
        RuntimeError: the command exits non-zero (its stderr's tail is quoted).
    """
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-400:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def measure(rounds: int) -> dict[str, list[tuple[float, float]]]:
    """{command: [(wall s, CPU s)] per round}, after one untimed warm-up run of each (page cache)."""
    for cmd in COMMANDS.values():
        run_once(cmd)
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in COMMANDS}
    for r in range(rounds):
        for name in (list(COMMANDS) if r % 2 == 0 else list(COMMANDS)[::-1]):
            out[name].append(run_once(COMMANDS[name]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (each runs every command once)")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    res = measure(a.rounds)
    base = res["import torch"]
    print(f"{a.rounds} interleaved rounds; 1-min load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print("| command | wall s median (min-max) | CPU s median | wall / import torch, median of rounds (min-max) "
          "| CPU / import torch |")
    print("|---|---|---|---|---|")
    for name, v in res.items():
        w, c = [x[0] for x in v], [x[1] for x in v]
        rw = [x[0] / b[0] for x, b in zip(v, base)]
        rc = [x[1] / b[1] for x, b in zip(v, base)]
        print(f"| {name} | {statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | {statistics.median(c):.2f} | "
              f"{statistics.median(rw):.2f} ({min(rw):.2f}-{max(rw):.2f}) | {statistics.median(rc):.2f} |")


if __name__ == "__main__":
    main()
