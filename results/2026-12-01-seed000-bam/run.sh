#!/usr/bin/env bash
# Seed 000 (BAM, arXiv 2505.22842): does GGD-BAM + SSMax retrieve a passkey far past the training length
# where ALiBi, RoPE and NoPE do not, and do its heads learn beta <= 0?
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed000-bam/run.sh [OUT_DIR]        # default OUT_DIR: runs/seed000-bam
# Trains five tiny models (same size, steps, data and retrieval mix; nothing tuned per variant), sweeps
# passkey (5 depths x 2 samples) and sliding-window perplexity at 1x-32x the training length, reads the
# learned priors, writes the lctx report and copies the tables and plots here. Resumable.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-runs/seed000-bam}"
source "$HERE/../seeds_lib.sh"
STEPS="${STEPS:-1200}"
TRAIN_ARGS=(--context-length 128 --hidden-size 64 --layers 2 --heads 4 --vocab-size 1024 --batch-size 16
            --steps "$STEPS" --lr 3e-3 --warmup 50 --seed 0 --retrieval-fraction 0.5 --retrieval passkey
            --eval-every 100)
NAMES=(ggd_bam_ssmax ggd_bam alibi rope nope_ssmax)
mkdir -p "$OUT/logs"
for n in "${NAMES[@]}"; do par train_model "$n" "${n/_ssmax/+ssmax}"; done; wait
for n in "${NAMES[@]}"; do
  par eval_model "$n" --task flatness --relative 1,2,4,8,16,32 --depths 0,0.25,0.5,0.75,1 --samples 2 \
    --ppl-data "$HELDOUT" --ppl-max-tokens 8192 --attn-impl fast
done; wait
for n in ggd_bam_ssmax ggd_bam; do
  lctx diagnose prior -m "$OUT/ckpt/$n" --out "$OUT/diag/$n" > "$OUT/logs/prior_$n.log"
done
finish "Seed 000: BAM, passkey and perplexity at 1x-32x the training length" --at 1x,2x,4x,8x,16x,32x
python "$HERE/../seeds_table.py" "$OUT"/run/* --out "$HERE/table.md" --metric passkey.exact \
  --metric passkey.digit_acc --metric flatness.ppl_ratio \
  --prior "$OUT/diag/ggd_bam_ssmax/prior_params.csv" --prior "$OUT/diag/ggd_bam/prior_params.csv"
cp "$OUT"/diag/*/plots/*.png "$HERE/plots/"
