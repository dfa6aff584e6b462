"""The methods phase B (32K) runs: the best ``k`` of phase A by RULES.md rule 5, printed one spec per line.

Usage: python pick.py OUT K. Reads OUT/methods.txt (the specs run.sh ran, one per line) and each method's phase-A
run directory OUT/A-<slug>/records.jsonl. Rule 5 (written before the run): among the methods other than shipped,
rank by (effective length at 0.8 over 2K-16K, passkey exact at 16K, at 8K), higher first; ties keep run.sh's order.
Every sample counts: an errored sample is a miss (0), never left out.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

THRESHOLD = 0.8
LENGTHS = (2048, 4096, 8192, 16384)


def slug(spec: str) -> str:
    """run.sh's slug of a spec: ':' and ',' to '_', '=' to '-'."""
    return spec.translate(str.maketrans({":": "_", ",": "_", "=": "-"}))


def passkey_by_length(run: Path) -> dict[int, float]:
    """{length: mean passkey exact over every sample (an error counts 0)} of one run directory."""
    hits: dict[int, list[float]] = defaultdict(list)
    for line in (run / "records.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("task") != "passkey":
            continue
        ok = r.get("status") == "ok" and r.get("metrics", {}).get("exact") is not None
        hits[int(r["length"])].append(float(r["metrics"]["exact"]) if ok else 0.0)
    return {L: sum(v) / len(v) for L, v in hits.items() if v}


def effective(means: dict[int, float]) -> int:
    """The longest of LENGTHS with every tested length up to it at >= THRESHOLD (0 when 2K is not)."""
    best = 0
    for L in LENGTHS:
        if means.get(L, 0.0) < THRESHOLD:
            break
        best = L
    return best


def main(out: str, k: int) -> None:
    o = Path(out)
    specs = [s.strip() for s in (o / "methods.txt").read_text().splitlines() if s.strip()]
    ranked = []
    for i, spec in enumerate(specs):
        run = o / f"A-{slug(spec)}"
        if spec == "shipped" or not (run / "records.jsonl").is_file():
            continue
        m = passkey_by_length(run)
        ranked.append(((effective(m), m.get(16384, 0.0), m.get(8192, 0.0)), -i, spec))
    ranked.sort(reverse=True)
    for _, _, spec in ranked[:k]:
        print(spec)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
