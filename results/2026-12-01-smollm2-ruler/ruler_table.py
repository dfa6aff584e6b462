"""One RULER table for one model from several run directories (here one per length): RULER's score per task and
length in percent, the samples behind each cell, the average over the tasks and the effective length over all the
lengths (lctx.harness.steps.ruler.ruler_table on the runs' rows together).

`lctx report RUN1 RUN2` keeps runs of the same model apart (the later one is labelled model@run, so samples made
with other settings never mix), so its RULER section has one block per run; this script joins them, after
checking that the runs used the same model file, the same ruler group (tasks, threshold) and the same task options
per task (e.g. the NIAH generation budget).

Usage: python ruler_table.py RUN_DIR... > table.md
"""

import json
import sys

import pandas as pd

from lctx.harness.outputs.plots import format_length
from lctx.harness.outputs.report import load_run
from lctx.harness.steps.ruler import GROUP, RulerSpec, derive_records, latest_options, ruler_table, task_metric
from lctx.harness.run.tables import to_table

tables, models, specs = [], set(), set()
for d in sys.argv[1:]:
    t, meta = load_run(d)
    models.add(tuple(meta["models"]))
    r = meta["ruler"]
    specs.add((float(r["threshold"]), tuple(r["tasks"]), tuple(sorted(r["left_out"].items()))))
    t = t[t["task"] != GROUP]  # the average and effective length are derived again below, over all the runs
    tables.append(latest_options(t))  # within a run: one option set per task, as the run's own ruler rows
if len(models) != 1 or len(specs) != 1:
    sys.exit(f"error: the runs differ in model ({sorted(models)}) or ruler group ({sorted(specs)}); pass runs of "
             "one model and one group")
rows = pd.concat(tables, ignore_index=True)
rows["model"] = rows["model"].astype(str).str.replace(r" \[.*\]$", "", regex=True)  # load_run's option tags
opts = rows.assign(s=rows["task_options"].astype(str)).groupby("task")["s"].nunique()
if (opts > 1).any():
    sys.exit(f"error: task options differ between the runs for {', '.join(opts[opts > 1].index)}")
threshold, tasks, left_out = specs.pop()
spec = RulerSpec(threshold=threshold, tasks=tasks, left_out=left_out)
rows = pd.concat([rows, to_table(derive_records(rows, spec))], ignore_index=True)
grid, info = ruler_table(rows)
ok = rows[(rows["status"] == "ok") & (rows["task"] != GROUP)]
n = {(t, int(L)): len(ok[(ok["task"] == t) & (ok["length"] == L) & (ok["metric"] == task_metric(t))])
     for t in grid.index if t != "average" for L in grid.columns}
cols = [format_length(L) for L in grid.columns]
print("| task | " + " | ".join(f"{c} (n)" for c in cols) + " |")
print("|---|" + "---:|" * len(cols))
for t, row in grid.iterrows():
    cells = [(f"{v:.1f}" if v == v else "–") + (f" ({n[(t, int(L))]})" if t != "average" else "")
             for L, v in row.items()]
    print(f"| {'**average**' if t == 'average' else t} | " + " | ".join(cells) + " |")
e = info["effective_length"]
budgets = {t: json.loads(o).get("max_new_tokens") for t, o in zip(rows["task"], rows["task_options"].astype(str))
           if t != GROUP and t.startswith("niah_")}
print(f"\nEffective length (average >= {info['threshold']:g} at every length up to it): "
      + (f"< {format_length(min(grid.columns))}" if e == 0 else format_length(e))
      + f". Average over {len(info['tasks'])} tasks" + (f" ({', '.join(info['left_out'])} left out)" if info['left_out'] else "")
      + f"; NIAH generation budget (max_new_tokens): {', '.join(sorted({str(b) for b in budgets.values()}))}"
      + f"; runs: {', '.join(sys.argv[1:])}; git_rev {', '.join(sorted(set(rows['git_rev'].dropna().astype(str))))}.")
