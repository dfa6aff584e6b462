"""One RULER table for one model from several run directories (here one per length): RULER's score per task and
length in percent, the samples behind each cell, the average over the tasks and the effective length over all the
lengths (lctx.harness.ruler.ruler_table on the runs' rows together).

`lctx report RUN1 RUN2` keeps runs of the same model apart (the later one is labelled model@run, so samples made
with other settings never mix), so its RULER section has one block per run; this script joins them, after
checking that the runs used the same model file and task options.

Usage: python ruler_table.py RUN_DIR... > table.md
"""

import json
import sys

import pandas as pd

from lctx.harness.plots import format_length
from lctx.harness.report import load_run
from lctx.harness.ruler import GROUP, RulerSpec, derive_records, ruler_table, task_metric
from lctx.harness.tables import to_table

tables, models = [], set()
for d in sys.argv[1:]:
    t, meta = load_run(d)
    models.add(tuple(meta["models"]))
    # cwe/fwe (no depth axis) run `samples` = --samples x depths; a run grown by resume over depths made them again
    # under the new option, and its tables keep the superseded records too (run.json's `current` names both
    # labels; see README): keep the records of the last request only
    want = len(meta["depths"]) * int(meta["samples"])
    keep = [k not in ("cwe", "fwe") or json.loads(o).get("samples", 1) == want
            for k, o in zip(t["task"], t["task_options"].astype(str))]
    t = t[keep]
    spec = RulerSpec(threshold=float(meta["ruler"]["threshold"]), tasks=tuple(meta["ruler"]["tasks"]),
                     left_out=tuple(meta["ruler"]["left_out"].items()))
    tables.append(t[t["task"] != GROUP])  # the average and effective length are derived again below, over all
rows = pd.concat(tables, ignore_index=True)
rows["model"] = rows["model"].astype(str).str.replace(r" \[.*\]$", "", regex=True)  # load_run's option tags
rows = pd.concat([rows, to_table(derive_records(rows, spec))], ignore_index=True)
if len(models) != 1 or rows["model"].nunique() != 1:
    sys.exit(f"error: the runs are of different models ({sorted(models)}); pass runs of one model")
def _settings(o):  # the options that make a sample (cwe/fwe's `samples` is how many the group asked for)
    return json.dumps({k: v for k, v in json.loads(o).items() if k != "samples"}, sort_keys=True)


opts = rows[rows["task"] != GROUP].assign(s=rows["task_options"].astype(str).map(_settings)).groupby("task")["s"].nunique()
if (opts > 1).any():
    sys.exit(f"error: task options differ between the runs for {', '.join(opts[opts > 1].index)}")
grid, info = ruler_table(rows)
ok = rows[(rows["status"] == "ok") & (rows["task"] != GROUP)]
n = {(t, int(L)): len(ok[(ok["task"] == t) & (ok["length"] == L) & (ok["metric"] == task_metric(t))])
     for t in grid.index if t != "average" for L in grid.columns}
cols = [format_length(L) for L in grid.columns]
print("| task | " + " | ".join(f"{c} (n)" for c in cols) + " |")
print("|---|" + "---:|" * len(cols))
for t, row in grid.iterrows():
    cells = [f"{v:.1f}" + (f" ({n[(t, int(L))]})" if t != "average" else "") for L, v in row.items()]
    print(f"| {'**average**' if t == 'average' else t} | " + " | ".join(cells) + " |")
e = info["effective_length"]
print(f"\nEffective length (average >= {info['threshold']:g} at every length up to it): "
      + (f"< {format_length(min(grid.columns))}" if e == 0 else format_length(e))
      + f". Average over {len(info['tasks'])} tasks" + (f" ({', '.join(info['left_out'])} left out)" if info['left_out'] else "")
      + f"; runs: {', '.join(sys.argv[1:])}; git_rev {', '.join(sorted(set(rows['git_rev'].astype(str))))}.")
