#!/usr/bin/env bash
# Seed 002 (interdomain attention): is the fixed-state mixer flat in length past its training context, and
# better than plain S4D? Variants: interdomain, s4d, rope, and two ablations of interdomain's step-size
# range: id_dt_min = 1e-2 (slowest mode forgets within ~100 tokens; default 1e-3, ~1000) and 1e-4.
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed002-interdomain/run.sh [OUT_DIR]  # default OUT_DIR: a new temporary folder
# Same size, steps and data for every variant (nothing tuned per variant). Resumable.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../seeds_lib.sh"
STEPS="${STEPS:-1200}"
TRAIN_ARGS=("${MODEL_ARGS[@]}" --steps "$STEPS" --eval-every 200)
mkdir -p "$OUT/logs"
par train_model interdomain interdomain
par train_model s4d s4d
par train_model rope rope
par train_model interdomain_dtmin1e-2 interdomain --option id_dt_min=0.01
par train_model interdomain_dtmin1e-4 interdomain --option id_dt_min=0.0001
wait
for n in interdomain s4d rope interdomain_dtmin1e-2 interdomain_dtmin1e-4; do
  par eval_model "$n" --task flatness --relative 1,2,3.5,4,8 --task-option flatness.retrieval=none \
    --ppl-data "$HELDOUT" --ppl-max-tokens 16384 --attn-impl fast
done; wait
finish "Seed 002: interdomain vs S4D vs RoPE, perplexity ratio at 1x-8x the training length"
python "$HERE/../seeds_table.py" "$OUT"/run/* --out "$PUB/table.md" --metric flatness.ppl_ratio --metric ppl.ppl
