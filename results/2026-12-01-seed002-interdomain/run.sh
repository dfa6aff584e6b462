#!/usr/bin/env bash
# Seed 002 (interdomain attention): is the fixed-state mixer flat in length past its training context, and
# better than plain S4D? Variants: interdomain, s4d, rope, and interdomain with the step-size range
# narrowed to short memories (id_dt_min = 1e-2, slowest mode ~100 tokens; default 1e-3, ~1000 tokens) and
# widened to long ones (id_dt_min = 1e-4).
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed002-interdomain/run.sh [OUT_DIR]  # default OUT_DIR: runs/seed002-interdomain
# Same size, steps and data for every variant (nothing tuned per variant). Resumable.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
OUT="${1:-runs/seed002-interdomain}"
STEPS="${STEPS:-1200}"
B="$DATA/books"
mkdir -p "$OUT"
START=$(date +%s)
train() {  # train NAME VARIANT [--option K=V ...]
  local n="$1" v="$2"; shift 2
  [ -f "$OUT/ckpt/$n/model.safetensors" ] || lctx train --variant "$v" "$@" \
    --data "$B/pg1342_pride_and_prejudice.txt" --data "$B/pg1661_adventures_of_sherlock_holmes.txt" \
    --data "$B/pg345_dracula.txt" --context-length 128 --hidden-size 64 --layers 2 --heads 4 \
    --vocab-size 1024 --batch-size 16 --steps "$STEPS" --lr 3e-3 --warmup 50 --seed 0 \
    --eval-every 400 --no-progress --out "$OUT/ckpt/$n"
}
train interdomain interdomain
train s4d s4d
train rope rope
train interdomain_dtmin1e-2 interdomain --option id_dt_min=0.01
train interdomain_dtmin1e-4 interdomain --option id_dt_min=0.0001
NAMES="interdomain s4d rope interdomain_dtmin1e-2 interdomain_dtmin1e-4"
MODELS=(); for n in $NAMES; do MODELS+=(-m "$OUT/ckpt/$n"); done
lctx run "${MODELS[@]}" --task flatness --relative 1,2,3.5,4,8 --task-option flatness.retrieval=none \
  --ppl-data "$B/pg98_a_tale_of_two_cities.txt" --ppl-max-tokens 16384 --attn-impl fast --no-progress \
  --out "$OUT/run"
lctx report "$OUT/run" --out "$OUT/report" --title "Seed 002: interdomain vs S4D vs RoPE, PPL ratio 1x-8x"
echo "wall $(( $(date +%s) - START )) s; CPU user/sys of the commands: $(times | tail -1)" | tee "$OUT/time.txt"
python "$HERE/../seeds_table.py" "$OUT/run" --out "$HERE/table.md" --metric flatness.ppl_ratio --metric ppl.ppl
mkdir -p "$HERE/plots"
cp "$OUT/report/report.md" "$OUT/report/summary.csv" "$HERE/"
cp "$OUT"/report/plots/*.png "$HERE/plots/"
for n in $NAMES; do cp "$OUT/ckpt/$n/train_log.json" "$HERE/train_log_$n.json"; done
cp "$OUT/time.txt" "$HERE/time.txt"
