#!/usr/bin/env bash
# Ablation for experiment 7: ggd_bam+ssmax with the SSMax factor on the content logits only
# (--option ssmax_scale_bias=false), everything else as run.sh (same size, steps, data, retrieval mix, seed).
# Asks: is the reference's "SSMax also scales the prior" (ssmax_prior=True) why ggd_bam+ssmax never
# learned retrieval? One command, from the repository root (../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed000-bam/ablation_ssmax.sh [OUT_DIR]  # default OUT_DIR: a new temporary folder
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JOBS=1
source "$HERE/../seeds_lib.sh"
STEPS="${STEPS:-3000}"
TRAIN_ARGS=("${MODEL_ARGS[@]}" --steps "$STEPS" "${RETRIEVAL_ARGS[@]}")
mkdir -p "$OUT/logs"
train_model ggd_bam_ssmax_content ggd_bam+ssmax --option ssmax_scale_bias=false
eval_model ggd_bam_ssmax_content --task flatness --relative 1,2,4,8,16,32 --depths 0,0.25,0.5,0.75,1 --samples 2 \
  --ppl-data "$HELDOUT" --ppl-max-tokens 4096 --attn-impl fast
lctx diagnose prior -m "$OUT/ckpt/ggd_bam_ssmax_content" --out "$OUT/diag" > "$OUT/logs/prior.log"
