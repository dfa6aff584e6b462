#!/usr/bin/env bash
# Seed 004 (why accumulated transforms extrapolate): perplexity ratio PPL(L)/PPL(T) and attention far mass
# of RoPE, ALiBi, accumulated random SO(2) rotations (QK only, and QK + values) and learned rotations.
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed004-acc-rot/run.sh [OUT_DIR]  # default OUT_DIR: a new temporary folder
# Same size, steps and data for every variant (nothing tuned per variant); acc_rot uses its default spread
# (0.25 rad: a 32-token mixing window). Resumable.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../seeds_lib.sh"
STEPS="${STEPS:-1200}"
TRAIN_ARGS=("${MODEL_ARGS[@]}" --steps "$STEPS" --eval-every 200)
mkdir -p "$OUT/logs"
par train_model rope rope
par train_model alibi alibi
par train_model acc_rot_random acc_rot
par train_model acc_rot_random_values acc_rot --option rotate_values=true
par train_model acc_rot_learned acc_rot --option acc_rot_mode=learned
wait
NAMES=(rope alibi acc_rot_random acc_rot_random_values acc_rot_learned)
for n in "${NAMES[@]}"; do
  par eval_model "$n" --task flatness --relative 1,2,4,8,16,128 --task-option flatness.retrieval=none \
    --ppl-data "$HELDOUT" --ppl-max-tokens 16384 --attn-impl fast
done; wait
MODELS=(); for n in "${NAMES[@]}"; do MODELS+=(-m "$OUT/ckpt/$n"); done
lctx diagnose far-mass "${MODELS[@]}" --lengths 128,256,512,1k,2k --distance 64 --data "$HELDOUT" \
  --out "$OUT/diag" > "$OUT/logs/far_mass.log"
finish "Seed 004: accumulated rotations, perplexity ratio at 1x-128x the training length"
python "$HERE/../seeds_table.py" "$OUT"/run/* --out "$PUB/table.md" --metric flatness.ppl_ratio --metric ppl.ppl \
  --far-mass "$OUT/diag/far_mass.csv"
cp "$OUT"/diag/plots/*.png "$PUB/plots/"
