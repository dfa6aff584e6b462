"""The measured-vs-plan table of run.sh: one row per OUT/rows/NAME.{plan.txt,json,time.txt}.

    python table.py OUT_DIR > table.md

plan: `lctx plan`'s total (made again on every run.sh start); run's plan: the plan the run's own memory check made
when it ran (HFAdapter.memory_plan); measured: the plan's weights + the working set measure.py read (peak RSS during the
sample above the RSS after loading, warm-up and page-in); ratio = measured / plan (the done-when band is
0.7-1.3); process peak: /usr/bin/time -v's maximum resident set size (runtime and loading included, and the
higher of it and the pre-reset VmHWM)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

GIB = 1024**3
MIB = 1024**2


def plan_total(text: str) -> tuple[int, int, str]:
    """(total bytes, weights bytes, path) from `lctx plan`'s printed table."""
    total = int(re.search(r"^\|\s*total\s*\|\s*([\d,]+)", text, re.M).group(1).replace(",", ""))
    weights = int(re.search(r"^\|\s*weights\s*\|\s*([\d,]+)", text, re.M).group(1).replace(",", ""))
    path = re.search(r"attn_impl (\S+) \(([^)]*)\)", text)
    return total, weights, f"{path.group(1)} ({path.group(2)})" if path else "?"


ORDER = {"bundled": 0, "smollm2": 1, "gemma3": 2}


def _tokens(length: str) -> int:
    return int(float(length[:-1]) * 1024) if length.lower().endswith("k") else int(length)


def main(out: str) -> None:
    rows = []
    for js in Path(out, "rows").glob("*.json"):
        name = js.name[:-5]
        model, task, length, impl = name.split("__")
        key = (ORDER.get(model, 9), model, task, _tokens(length), impl)
        m = json.loads(js.read_text())
        total, weights, path = plan_total(Path(out, "rows", name + ".plan.txt").read_text())
        tv = Path(out, "rows", name + ".time.txt").read_text()
        rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", tv).group(1)) * 1024
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", tv).group(1)
        own = m["plans"][-1]["total"] if m["plans"] else None
        head = f"| {model} | {task} | {length} | {impl} | {path} | {total / MIB:,.0f}"
        if m.get("working_bytes") is None or m.get("exit_code"):
            rows.append((key, f"{head} | | failed (exit {m.get('exit_code')}) | | | {wall} |"))
            continue
        measured = weights + m["working_bytes"]
        proc = max(rss, m.get("load_hwm_bytes") or 0)
        rows.append((key, f"{head} | {own / MIB:,.0f} | {measured / MIB:,.0f} | {measured / total:.2f} | "
                          f"{proc / GIB:.2f} | {wall} |"))
    print("| model | task | length | --attn-impl | plan path | plan MiB | run's plan MiB | measured MiB | ratio "
          "| process peak GiB | wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(r for _, r in sorted(rows)))


if __name__ == "__main__":
    main(sys.argv[1])
