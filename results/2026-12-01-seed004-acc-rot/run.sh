#!/usr/bin/env bash
# Seed 004 (why accumulated transforms extrapolate): perplexity ratio PPL(L)/PPL(T) and attention far mass
# of RoPE, ALiBi and accumulated random SO(2) rotations (QK only, and QK + values) and learned rotations.
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed004-acc-rot/run.sh [OUT_DIR]     # default OUT_DIR: runs/seed004-acc-rot
# Same size, steps and data for every variant (nothing tuned per variant); acc_rot uses its default spread
# (0.25 rad: a 32-token mixing window). Resumable: a finished checkpoint or sample is not redone.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
OUT="${1:-runs/seed004-acc-rot}"
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
train rope rope
train alibi alibi
train acc_rot_random acc_rot
train acc_rot_random_values acc_rot --option rotate_values=true
train acc_rot_learned acc_rot --option acc_rot_mode=learned
NAMES="rope alibi acc_rot_random acc_rot_random_values acc_rot_learned"
MODELS=(); for n in $NAMES; do MODELS+=(-m "$OUT/ckpt/$n"); done
lctx run "${MODELS[@]}" --task flatness --relative 1,2,4,8,16,128 --task-option flatness.retrieval=none \
  --ppl-data "$B/pg98_a_tale_of_two_cities.txt" --ppl-max-tokens 16384 --attn-impl fast --no-progress \
  --out "$OUT/run"
lctx diagnose far-mass "${MODELS[@]}" --lengths 128,256,512,1k,2k --distance 64 \
  --data "$B/pg98_a_tale_of_two_cities.txt" --out "$OUT/diag"
lctx report "$OUT/run" --out "$OUT/report" --title "Seed 004: accumulated rotations, PPL ratio 1x-128x"
echo "wall $(( $(date +%s) - START )) s; CPU user/sys of the commands: $(times | tail -1)" | tee "$OUT/time.txt"
python "$HERE/../seeds_table.py" "$OUT/run" --out "$HERE/table.md" --metric flatness.ppl_ratio --metric ppl.ppl \
  --far-mass "$OUT/diag/far_mass.csv"
mkdir -p "$HERE/plots"
cp "$OUT/report/report.md" "$OUT/report/summary.csv" "$HERE/"
cp "$OUT"/report/plots/*.png "$OUT"/diag/plots/*.png "$HERE/plots/"
for n in $NAMES; do cp "$OUT/ckpt/$n/train_log.json" "$HERE/train_log_$n.json"; done
cp "$OUT/time.txt" "$HERE/time.txt"
