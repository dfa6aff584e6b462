"""Cross-check: MMLU and ARC on the dequantised SmolLM2 with lm-eval run directly (its CLI, `hf` backend),
on the same local data as `lctx run --data-dir`, read here independently of lctx (pandas / json into
parquet, lm-eval's own task YAMLs with only the data source replaced). Then per-question comparison with
the lctx run directories.

    python lmeval_direct.py prepare --data-dir ../shared/data --work W        # parquet + task YAMLs
    lm_eval --model hf --model_args pretrained=HF_DIR,dtype=float32 --device cpu --batch_size 32 \\
        --include_path W/tasks --tasks direct_arc_easy,direct_arc_challenge --num_fewshot 0 \\
        --log_samples --output_path W/out-arc
    lm_eval ... --tasks $(cat W/mmlu_tasks.txt) --num_fewshot 5 --limit 10 --log_samples --output_path W/out-mmlu
    python lmeval_direct.py compare --work W --lctx RUN_DIR [RUN_DIR ...] --out DIR
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from pathlib import Path

import pandas as pd


def lm_eval_tasks_dir() -> Path:
    import importlib.util

    return Path(list(importlib.util.find_spec("lm_eval").submodule_search_locations)[0]) / "tasks"


def prepare(data_dir: Path, work: Path) -> None:
    pq, cfg = work / "parquet", work / "tasks"
    pq.mkdir(parents=True, exist_ok=True)
    cfg.mkdir(parents=True, exist_ok=True)
    tdir = lm_eval_tasks_dir()
    # MMLU: hendrycks/test CSVs (no header; question, A, B, C, D, answer letter) -> cais/mmlu columns
    subjects = sorted(p.stem[len("mmlu_"):] for p in (tdir / "mmlu" / "default").glob("mmlu_*.yaml"))
    names = []
    for s in subjects:
        files = {}
        for split in ("dev", "test"):
            df = pd.read_csv(data_dir / "mmlu" / split / f"{s}_{split}.csv", header=None, dtype=str,
                             keep_default_na=False, names=["question", "A", "B", "C", "D", "ans"])
            out = pd.DataFrame({"question": df["question"], "subject": s,
                                "choices": df[["A", "B", "C", "D"]].values.tolist(),
                                "answer": df["ans"].str.strip().map("ABCD".index)})
            files[split] = str(pq / f"mmlu_{s}_{split}.parquet")
            out.to_parquet(files[split], index=False)
        name = f"direct_mmlu_{s}"
        (cfg / f"{name}.yaml").write_text(
            f"include: {tdir / 'mmlu' / 'default' / f'mmlu_{s}.yaml'}\ntask: {name}\ntag: direct_lmeval\n"
            f"task_alias: {s}\ndataset_path: parquet\ndataset_name: null\n"
            f"dataset_kwargs: {json.dumps({'data_files': files})}\n")
        names.append(name)
    (work / "mmlu_tasks.txt").write_text(",".join(names))
    # ARC: ARC-V1 JSONL -> allenai/ai2_arc columns
    for task, stem in (("arc_easy", "ARC-Easy"), ("arc_challenge", "ARC-Challenge")):
        files = {}
        for split, suffix in (("test", "Test"), ("validation", "Dev")):
            rows = []
            for line in open(data_dir / "arc" / f"{stem}-{suffix}.jsonl", encoding="utf-8"):
                if line.strip():
                    r = json.loads(line)
                    rows.append({"id": r["id"], "question": r["question"]["stem"],
                                 "choices": {"text": [c["text"] for c in r["question"]["choices"]],
                                             "label": [c["label"] for c in r["question"]["choices"]]},
                                 "answerKey": r["answerKey"].strip()})
            files[split] = str(pq / f"{task}_{split}.parquet")
            pd.DataFrame(rows).to_parquet(files[split], index=False)
        (cfg / f"direct_{task}.yaml").write_text(
            f"include: {tdir / 'arc' / f'{task}.yaml'}\ntask: direct_{task}\ntag: direct_lmeval\n"
            f"dataset_path: parquet\ndataset_name: null\ntraining_split: null\n"
            f"dataset_kwargs: {json.dumps({'data_files': files})}\n")
    print(f"wrote {cfg} ({len(names)} MMLU subjects, 2 ARC tasks)")


def direct_samples(work: Path) -> pd.DataFrame:
    """Per-question acc/acc_norm from lm-eval's --log_samples files."""
    rows = []
    # oldest first (lm-eval stamps each file with its run's start time), so that a question two runs scored
    # (out-arc's first 50 and out-arc-c's full set) is kept once, from the later run
    files = sorted(glob.glob(str(work / "out-*" / "**" / "samples_*.jsonl"), recursive=True),
                   key=lambda f: Path(f).stem.rsplit("_", 1)[1])
    for f in files:
        name = Path(f).name[len("samples_"):].rsplit("_", 1)[0]
        for line in open(f):
            s = json.loads(line)
            task = name[len("direct_"):]
            subject = None
            if task.startswith("mmlu_"):
                task, subject = "mmlu", task[len("mmlu_"):]
            rows.append({"task": task, "subject": subject, "sample": int(s["doc_id"]), "acc": float(s["acc"]),
                         "acc_norm": float(s["acc_norm"]) if "acc_norm" in s else math.nan,
                         "ll": [float(r[0]) for r in s["filtered_resps"]]})
    d = pd.DataFrame(rows)
    twice = d[d.duplicated(["task", "subject", "sample"], keep=False)]
    if len(twice):  # the same question scored by two lm-eval runs must have the same answers
        spread = twice.groupby(["task", "subject", "sample"], dropna=False)["ll"].agg(
            lambda v: max(abs(a - b) for x in v for y in v for a, b in zip(x, y)))
        print(f"lm-eval: {len(spread)} questions scored by two runs; largest ll difference between runs "
              f"{spread.max():.2e} nats")
    return d.drop_duplicates(["task", "subject", "sample"], keep="last")


def lctx_samples(run_dirs: list[Path]) -> pd.DataFrame:
    rows = []
    for d in run_dirs:
        for line in open(d / "records.jsonl"):
            r = json.loads(line)
            if r.get("status") != "ok" or r["task"] not in ("mmlu", "arc_easy", "arc_challenge"):
                continue
            rows.append({"task": r["task"], "subject": r["task_options"].get("subject"), "sample": int(r["sample"]),
                         "acc": r["metrics"]["acc"], "acc_norm": r["metrics"].get("acc_norm", math.nan),
                         "ll": r["extra"]["ll"]})
    return pd.DataFrame(rows).drop_duplicates(["task", "subject", "sample"], keep="last")


def compare(work: Path, run_dirs: list[Path], out: Path) -> pd.DataFrame:
    a, b = lctx_samples(run_dirs), direct_samples(work)
    m = a.merge(b, on=["task", "subject", "sample"], how="outer", suffixes=("_lctx", "_lm_eval"), indicator=True)
    rows = []
    for task, g in m.groupby("task"):
        both = g[g["_merge"] == "both"]
        for metric in ("acc", "acc_norm"):
            x, y = both[f"{metric}_lctx"], both[f"{metric}_lm_eval"]
            if x.isna().all():
                continue
            n = len(both)
            se = lambda v: float(v.std(ddof=1) / math.sqrt(len(v)))  # noqa: E731  lm-eval's mean_stderr
            rows.append({"task": task, "metric": metric, "n": n, "only_lctx": int((g["_merge"] == "left_only").sum()),
                         "only_lm_eval": int((g["_merge"] == "right_only").sum()),
                         "lctx": round(float(x.mean()), 4), "lctx_stderr": round(se(x), 4),
                         "lm_eval": round(float(y.mean()), 4), "lm_eval_stderr": round(se(y), 4),
                         "questions_differing": int((x != y).sum()),
                         # choice log-likelihoods (nats; lctx keeps 4 decimals): the largest difference
                         "max_ll_diff": round(max(abs(u - v) for a_, b_ in zip(both["ll_lctx"], both["ll_lm_eval"])
                                                  for u, v in zip(a_, b_)), 4)})
    t = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    t.to_csv(out / "lmeval_crosscheck.csv", index=False)
    (out / "lmeval_crosscheck.md").write_text(t.to_markdown(index=False) + "\n")
    print(t.to_string(index=False))
    return t


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("--work", type=Path, required=True)
    c.add_argument("--lctx", type=Path, nargs="+", required=True)
    c.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.data_dir, a.work)
    else:
        compare(a.work, a.lctx, a.out)
