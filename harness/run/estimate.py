"""What a run will cost, said before it starts: the samples per (model, task, length) and an estimate of the time.

``lctx run`` prints :func:`plan_lines` after the models load and every check has passed, before the first sample;
``--dry-run`` prints them and stops. The time estimate comes from a short calibration on this machine
(:func:`calibrate`: two timed prefills per in-process model, at a short and a longer length, fitted to
``t(T) = a·T + b·T²`` seconds for one prefill of ``T`` tokens: the linear term is the weights' work per token, the
quadratic the attention's) applied to each sample's cost in prefill tokens (:meth:`lctx.tasks.Task.cost`: the
prefill plus :data:`lctx.tasks.base.DECODE_STEP_TOKENS` per greedy decode step, every window of a ppl sample).
A served model is not timed (a request's time is the server's, and a calibration request would warm its cache):
its rows say so, and the progress bar's time-left takes over once samples finish.

The estimate is a guide, not a promise: the attention term is fitted on lengths far below a long run's, and a
loaded machine runs slower than it calibrated. It was checked against two real runs (docs/evaluate.md, "Cost before
the run").
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Optional

from lctx.harness.run.console import count, format_length

#: the calibration's prefill lengths in tokens: the shorter of this and the run's shortest length, and the shorter of
#: :data:`CAL_LONG` and its longest (a calibration costs about one sample at the run's longer lengths)
CAL_SHORT, CAL_LONG = 256, 1024
#: text whose token ids, shuffled, make the calibration prompts (content does not matter for the time; shuffled so
#: that a prefix cache, in-process ``prefix_reuse``, finds nothing to reuse)
CAL_TEXT = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
            "A quick brown fox jumps over the lazy dog; seven wise men sat by 1,234 old trees. ")
#: an estimate above this many seconds is said as a note with the ways to make the run shorter
LONG_RUN_S = 600.0


@dataclass
class Calibration:
    """Seconds per prefill of one model on this machine: ``t(T) = a·T + b·T²`` (``a`` s/token, ``b`` s/token²),
    fitted to the timed points ``points`` [(tokens, seconds)]; ``took`` seconds spent calibrating."""

    a: float
    b: float
    points: list = field(default_factory=list)
    took: float = 0.0

    def seconds(self, tokens: float) -> float:
        """Seconds for one prefill of ``tokens`` tokens (>= 0)."""
        return max(0.0, self.a * tokens + self.b * tokens * tokens)


@dataclass
class PlanRow:
    """One (model, task, length) of the plan: ``samples`` to run, their ``cost`` in prefill tokens (decode steps
    counted as :data:`~lctx.tasks.base.DECODE_STEP_TOKENS` each) and ``seconds`` estimated (None: not estimated).
    ``length`` is None for lm-eval's questions (no length axis)."""

    model: str
    task: str
    length: Optional[int]
    samples: int
    cost: float
    seconds: Optional[float] = None


def plan_rows(passes) -> list[PlanRow]:
    """The samples each (model, task, length) will run, from the sweeps ``passes`` [(models, tasks,
    :class:`~lctx.harness.run.runner.RunSpec`)] (:func:`lctx.harness.evaluate._sweep_passes`), cells below a task's
    shortest length left out as the runner leaves them. Samples a resumed run has recorded are counted too."""
    from lctx.harness.run.runner import sample_cost  # the progress bar's weights (lazy: loads torch)

    rows: dict[tuple, PlanRow] = {}
    for lms, tasks, spec in passes:
        for lm in lms:
            for task in tasks:
                below = spec.skip_below.get((lm.name, task.name), 0)
                for cell in task.cells(spec.lengths, spec.depths, spec.samples):
                    if cell.length is not None and cell.length < below:
                        continue
                    key = (lm.name, task.name, cell.length)
                    row = rows.setdefault(key, PlanRow(lm.name, task.name, cell.length, 0, 0.0))
                    row.samples += 1
                    row.cost += sample_cost(task, lm, cell)
    return list(rows.values())


def calibrate(lm, lengths: list[int], seed: int = 0) -> Optional[Calibration]:
    """Time ``lm.prefix`` (the protocol's prefill) on shuffled token ids at ``min(CAL_SHORT, shortest)`` tokens (after one
    untimed warm-up call) and at ``min(CAL_LONG, longest)`` tokens, and fit :class:`Calibration` through the two points
    (one point: ``b = 0``); the short point is the median of three. Returns None for a served model (``capabilities(lm).concurrency`` set) and for a model
    whose prefill fails here (the run then says so itself); never raises for a model's failure."""
    from lctx.models.adapters.protocol import capabilities  # lazy: loads lctx.models

    if capabilities(lm).concurrency is not None or not lengths:
        return None
    short = max(8, min(CAL_SHORT, min(lengths)))
    long_ = max(short, min(CAL_LONG, max(lengths)))
    rng = random.Random(seed)
    try:
        base = [int(i) for i in lm.encode(CAL_TEXT)] or [0]
    except Exception:  # noqa: BLE001 - an estimate only; a broken encode is the run's to report
        return None

    def ids(n: int) -> list[int]:
        out = []
        while len(out) < n:
            chunk = base[:]
            rng.shuffle(chunk)
            out += chunk
        return out[:n]

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        handle = lm.prefix(ids(n))
        dt = time.perf_counter() - t0
        del handle
        return dt

    t_start = time.perf_counter()
    try:
        timed(short)  # warm-up: lazy initialisation, kernels, caches
        t1 = sorted(timed(short) for _ in range(3))[1]  # the median: a shared machine's contention included
        points = [(short, t1)]
        if long_ >= 2 * short:
            points.append((long_, timed(long_)))
    except Exception:  # noqa: BLE001 - an estimate only
        return None
    finally:
        free = getattr(lm, "free_memory", None)
        if callable(free):
            try:
                free()
            except Exception:  # noqa: BLE001
                pass
    (n1, s1) = points[0]
    a, b = s1 / n1, 0.0
    if len(points) == 2:
        (n2, s2) = points[1]
        r1, r2 = s1 / n1, s2 / n2  # seconds per token at each length: r(T) = a + b·T
        b = max(0.0, (r2 - r1) / (n2 - n1))
        a = max(0.0, r1 - b * n1)
        if a == 0.0:  # the longer prefill ran faster per token than the fit allows: keep it linear
            a, b = r2, 0.0
    return Calibration(a=a, b=b, points=points, took=time.perf_counter() - t_start)


def estimate(rows: list[PlanRow], cals: dict) -> None:
    """Fill each row's ``seconds`` from its model's :class:`Calibration` in ``cals`` ({model name: Calibration or
    None}): ``cost / L · t(L)`` for a row of length ``L`` (the prefill's time scaled by the sample's cost in prefill
    tokens), ``cost · t(CAL_SHORT) / CAL_SHORT`` for lm-eval's questions."""
    for r in rows:
        cal = cals.get(r.model)
        if cal is None:
            continue
        if r.length:
            r.seconds = r.cost / r.length * cal.seconds(r.length)
        else:
            r.seconds = r.cost * cal.seconds(CAL_SHORT) / CAL_SHORT


def say_seconds(s: float) -> str:
    """A duration for a person: ``< 0.1 s``, ``2.5 s``, ``45 s``, ``3 min 20 s``, ``2 h 05 min``."""
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else ("< 0.1 s" if s < 0.05 else f"{s:.1f} s")
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def plan_table(rows: list[PlanRow]) -> tuple[list[str], list[list]]:
    """The plan as (header, rows) for :func:`lctx.harness.run.console.print_table`: one row per (model, task), the
    samples per length in columns (``questions`` for lm-eval's), and the row's estimated time."""
    lengths = sorted({r.length for r in rows if r.length is not None})
    header = ["model", "task"] + [format_length(n) for n in lengths] + (
        ["questions"] if any(r.length is None for r in rows) else []) + ["time (est.)"]
    table: dict[tuple, dict] = {}
    for r in rows:
        t = table.setdefault((r.model, r.task), {"seconds": 0.0, "unknown": False})
        t[r.length] = r.samples
        if r.seconds is None:
            t["unknown"] = True
        else:
            t["seconds"] += r.seconds
    out = []
    for (model, task), t in table.items():
        cells = [t.get(n, "") for n in lengths] + ([t.get(None, "")] if "questions" in header else [])
        out.append([model, task, *cells, "not estimated" if t["unknown"] else say_seconds(t["seconds"])])
    return header, out


def plan_lines(rows: list[PlanRow], cals: dict, device: str) -> list[str]:
    """The plan's summary lines under its table: the samples and tokens in all, the estimated time and how it was
    made, and a note when it is long (:data:`LONG_RUN_S`)."""
    n = sum(r.samples for r in rows)
    tokens = sum(r.cost for r in rows)
    known = [r.seconds for r in rows if r.seconds is not None]
    total = sum(known)
    timed = {m: c for m, c in cals.items() if c is not None}
    how = ", ".join(f"{m}: prefill of {' and '.join(str(p[0]) for p in c.points)} tokens" for m, c in timed.items())
    lines = [f"plan: {count(n, 'sample')}, {format_length(tokens)} prefill tokens (a decode step counted as "
             f"{_decode_tokens()})"]
    if known:
        part = "" if len(known) == len(rows) else " for the models timed (served models are not)"
        lines.append(f"estimated time of the samples{part}: {say_seconds(total)} on {device} (calibrated here in "
                     f"{say_seconds(sum(c.took for c in timed.values()))}: {how}); the progress bar refines it")
    else:
        lines.append("estimated time: not estimated (served models are not timed before the run); the progress bar "
                     "says once the first samples finish")
    if total > LONG_RUN_S:
        lines.append(f"note: this run is estimated at {say_seconds(total)}; fewer --lengths, --depths or --samples "
                     "make it shorter, and --dry-run prints this plan without running")
    return lines


def _decode_tokens() -> int:
    from lctx.tasks.base import DECODE_STEP_TOKENS  # lazy: loads lctx.tasks

    return DECODE_STEP_TOKENS

