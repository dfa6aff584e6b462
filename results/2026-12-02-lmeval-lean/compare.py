"""Per-question comparison of an lctx MMLU run with lm-eval run directly (run.sh's `compare` job).

    python compare.py --lctx RUN_DIR --direct LM_EVAL_OUTPUT_DIR --out DIR

Answers: lctx's records.jsonl (``extra.pred`` per question) against lm-eval's ``--log_samples`` files (the argmax
of its choices' log-likelihoods). Log-likelihoods: lctx's records keep 4 decimals, so each choice's full-precision
value is read from lctx's lm-eval request cache (``partial/*/lmeval-requests-bs*_rank0.db``, lm-eval's
``CachingLM`` sqlite, keyed by ``lm_eval.api.model.hash_args("loglikelihood", (context, continuation))``) and
compared with lm-eval's ``resps`` for the same (context, continuation). Writes DIR/compare.csv and compare.md.
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

import pandas as pd
from lm_eval.api.model import hash_args
from sqlitedict import SqliteDict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lctx", type=Path, required=True)
    ap.add_argument("--direct", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    cache = {}
    for db in glob.glob(str(a.lctx / "partial" / "*" / "lmeval-requests-bs*_rank0.db")):
        with SqliteDict(db, flag="r") as d:
            cache.update(d.items())
    lctx = {}
    for line in open(a.lctx / "records.jsonl"):
        r = json.loads(line)
        if r["task"] == "mmlu" and r["status"] == "ok":
            lctx[(r["task_options"]["subject"], int(r["sample"]))] = r["extra"]["pred"]
    rows = []
    for f in sorted(glob.glob(str(a.direct / "**" / "samples_direct_mmlu_*.jsonl"), recursive=True)):
        subject = Path(f).name[len("samples_direct_mmlu_"):].rsplit("_", 1)[0]
        for line in open(f):
            s = json.loads(line)
            lls = [float(r[0][0]) for r in s["resps"]]
            deltas = []
            for arg, ll in zip(s["arguments"].values(), lls):
                key = hash_args("loglikelihood", (arg["arg_0"], arg["arg_1"]))
                deltas.append(abs(float(cache[key][0]) - ll) if key in cache else float("nan"))
            pred = "ABCD"[max(range(len(lls)), key=lls.__getitem__)]
            rows.append({"subject": subject, "sample": int(s["doc_id"]), "pred_lm_eval": pred,
                         "pred_lctx": lctx.get((subject, int(s["doc_id"]))), "max_abs_ll_delta": max(deltas),
                         "choices_compared": sum(d == d for d in deltas)})
    q = pd.DataFrame(rows)
    t = q.groupby("subject").agg(questions=("sample", "size"),
                                 questions_differing=("pred_lctx", lambda v: int((v != q.loc[v.index, "pred_lm_eval"]).sum())),
                                 choices_compared=("choices_compared", "sum"),
                                 max_abs_ll_delta=("max_abs_ll_delta", "max")).reset_index()
    t.loc[len(t)] = ["all", int(t["questions"].sum()), int(t["questions_differing"].sum()),
                     int(t["choices_compared"].sum()), float(t["max_abs_ll_delta"].max())]
    a.out.mkdir(parents=True, exist_ok=True)
    t.to_csv(a.out / "compare.csv", index=False)
    (a.out / "compare.md").write_text(t.to_markdown(index=False, floatfmt=".2e") + "\n")
    print(t.to_string(index=False))


if __name__ == "__main__":
    main()
