"""The tables of results/2026-12-05-served-parity from a run.sh output folder: python tables.py OUT > tables.md.
Reads each route's run.json (trust probe), records.jsonl (cached tokens), parity/*/parity.csv and order.tsv."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

OUT = Path(sys.argv[1])
ROUTES = ["gguf", "hf", "vllm", "llama-server", "llama-cpp-python"]


def records(d: Path) -> list[dict]:
    p = d / "records.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.is_file() else []


print("## Trust probe per route\n")
rows = []
for r in ROUTES:
    meta = OUT / r / "run.json"
    if not meta.is_file():
        continue
    m = next(iter(json.loads(meta.read_text())["inputs"]["models"].values()))
    probe = (m.get("server") or {}).get("trust_probe")
    recs = records(OUT / r)
    ok = sum(x["status"] == "ok" for x in recs)
    rows.append({"route": r, "samples ok": f"{ok}/{len(recs)}",
                 "trust probe": "in process" if probe is None else ("passed" if probe.get("ok") else "refused"),
                 "probe max |echo - generated| (nats)": "" if probe is None else probe.get("max_abs_diff"),
                 "reason": "" if probe is None or probe.get("ok") else str(probe.get("reason", ""))[:90]})
print(pd.DataFrame(rows).to_markdown(index=False), "\n")

print("## Seconds per retrieval sample (median over tasks and depths; records' wall_s)\n")
rows = []
for r in ROUTES:
    recs = [x for x in records(OUT / r) if x["status"] == "ok" and x.get("wall_s") is not None]
    if recs:
        t = pd.DataFrame([{"length": x["length"], "wall_s": x["wall_s"]} for x in recs])
        rows.append({"route": r, **{f"{L // 1024}K": round(g.wall_s.median(), 2) for L, g in t.groupby("length")}})
print(pd.DataFrame(rows).to_markdown(index=False), "\n")

print("## Parity per pair (`lctx compare A B`)\n")
rows = []
for d in sorted((OUT / "parity").glob("*")):
    p = d / "parity.csv"
    if not p.is_file():
        continue
    t = pd.read_csv(p)
    row = {"pair": d.name, "samples": len(t)}
    for c in ("prompt_ids", "greedy", "scores", "logprobs"):
        row[c] = f"{(t[c] == 'equal').sum()} equal, {(t[c] == 'differ').sum()} differ" + (
            f", {(t[c] == 'n/a').sum()} n/a" if (t[c] == "n/a").any() else "")
    lp = t["max_logprob_diff"].dropna()
    row["max log-prob diff (nats)"] = f"{lp.max():.2e}" if len(lp) else "n/a"
    rows.append(row)
print(pd.DataFrame(rows).to_markdown(index=False), "\n")

print("## ppl and MMLU per route\n")
rows = []
for r in ROUTES:
    for x in records(OUT / f"{r}-tf"):
        if x["status"] != "ok":
            continue
        if x["task"] == "ppl" and "ppl" in x["metrics"]:
            rows.append({"route": r, "cell": f"ppl {x['length']}", "value": round(x["metrics"]["ppl"], 4)})
    mm = [x for x in records(OUT / f"{r}-tf") if x["task"] != "ppl" and x["status"] == "ok" and "acc" in x["metrics"]]
    un = [x for x in records(OUT / f"{r}-tf") if x.get("unavailable")]
    if mm:
        rows.append({"route": r, "cell": f"mmlu_abstract_algebra acc (n={len(mm)})",
                     "value": round(sum(x["metrics"]["acc"] for x in mm) / len(mm), 4)})
    elif un:
        rows.append({"route": r, "cell": "ppl, mmlu", "value": "unavailable"})
print(pd.DataFrame(rows).to_markdown(index=False), "\n")

order = OUT / "order.tsv"
if order.is_file():
    print("## Prefix-cache order (passkey 4K, 5 depths x 2 samples; cache reset before each run)\n")
    t = pd.read_csv(order, sep="\t", names=["server", "order", "run", "wall_s", "rc"])
    share = []
    for _, row in t.iterrows():
        recs = records(OUT / "order" / f"{row.server}-{row.order}-{row.run}")
        n = sum(x["n_tokens"] for x in recs)
        c = sum((x.get("extra") or {}).get("cached_tokens", 0) for x in recs)
        share.append(round(c / n, 3) if n else None)
    t["cached share"] = share
    print(t.to_markdown(index=False), "\n")
    for s, g in t.groupby("server"):
        c = g[g.order == "cache"].sort_values("run").wall_s.to_numpy()
        sh = g[g.order == "shuffle"].sort_values("run").wall_s.to_numpy()
        if len(c) == len(sh):
            print(f"- {s}: cache / shuffle wall time per interleaved pair: "
                  + ", ".join(f"{a / b:.3f}" for a, b in zip(c, sh)))
