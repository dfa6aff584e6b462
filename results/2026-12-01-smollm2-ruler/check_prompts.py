"""Rebuild every sample of a run with this checkout's generators (no model forward) and compare it with the
run's records: prompt length (n_tokens), where the needle/first statement landed (depth_actual) and the expected
answer. Used to check that run-1k/ (made at git_rev c6e1d68) has the inputs this code builds, for all tasks.

Usage (repository root): python results/2026-12-01-smollm2-ruler/check_prompts.py RUN/records.jsonl DATA_DIR
"""

import inspect
import json
import sys

from lctx.harness.lm import load_lm
from lctx.tasks import Cell, get_task

records = [json.loads(line) for line in open(sys.argv[1])]
data_dir = sys.argv[2]
lm = load_lm(json.load(open(sys.argv[1].replace("records.jsonl", "run.json")))["models"][0], device="cpu",
             chat_template=records[0]["task_options"].get("chat_template") == "on")
tasks, same, diffs = {}, 0, []
for r in records:
    if r["task"] not in tasks:
        opts = {k: v for k, v in r["task_options"].items() if k not in ("chat_template",)}
        cls = get_task(r["task"])
        auto = {"data_dir": data_dir} if "data_dir" in inspect.signature(cls.__init__).parameters else {}
        tasks[r["task"]] = cls(cache=False, **auto, **opts)
    s = tasks[r["task"]].build(lm, Cell(r["length"], r["depth"], r["sample"]), r["seed"])
    answer = s.meta.get("answer", s.meta.get("answers"))
    answer = "|".join(answer) if isinstance(answer, (list, tuple)) else str(answer)
    got = (s.n_tokens, None if s.depth is None else round(s.depth, 9), answer)
    want = (r["n_tokens"], None if r["depth_actual"] is None else round(r["depth_actual"], 9),
            str(r["extra"].get("answer")))
    if got == want:
        same += 1
    else:
        diffs.append((r["task"], r["depth"], r["sample"], got, want))
for d in diffs:
    print("DIFFERS", d)
print(f"{same} of {len(records)} samples rebuilt with the same n_tokens, depth_actual and answer "
      f"(records' git_rev {records[0]['git_rev']})")
