#!/usr/bin/env bash
# Seed 000 (BAM, arXiv 2505.22842): does GGD-BAM + SSMax retrieve a passkey far past the training length
# where ALiBi, RoPE and NoPE do not, and do its heads learn beta <= 0?
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed000-bam/run.sh [OUT_DIR]        # default OUT_DIR: runs/seed000-bam
# Trains five tiny models (same size, steps, data and retrieval mix; nothing tuned per variant), sweeps
# passkey (5 depths x 2 samples) and sliding-window perplexity at 1x-32x the training length, plots the
# learned priors, writes the lctx report, and copies the tables and plots here. Resumable: a finished
# checkpoint or sample is not redone.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
OUT="${1:-runs/seed000-bam}"
STEPS="${STEPS:-1200}"
VARIANTS="ggd_bam+ssmax ggd_bam alibi rope nope+ssmax"
B="$DATA/books"
mkdir -p "$OUT"
START=$(date +%s)
for v in $VARIANTS; do
  n="${v//+/_}"
  [ -f "$OUT/ckpt/$n/model.safetensors" ] || lctx train --variant "$v" \
    --data "$B/pg1342_pride_and_prejudice.txt" --data "$B/pg1661_adventures_of_sherlock_holmes.txt" \
    --data "$B/pg345_dracula.txt" --context-length 128 --hidden-size 64 --layers 2 --heads 4 \
    --vocab-size 1024 --batch-size 16 --steps "$STEPS" --lr 3e-3 --warmup 50 --seed 0 \
    --retrieval-fraction 0.5 --retrieval passkey --eval-every 400 --no-progress --out "$OUT/ckpt/$n"
done
MODELS=(); for v in $VARIANTS; do MODELS+=(-m "$OUT/ckpt/${v//+/_}"); done
lctx run "${MODELS[@]}" --task flatness --relative 1,2,4,8,16,32 --depths 0,0.25,0.5,0.75,1 --samples 2 \
  --ppl-data "$B/pg98_a_tale_of_two_cities.txt" --ppl-max-tokens 8192 --attn-impl fast --no-progress \
  --out "$OUT/run"
for n in ggd_bam_ssmax ggd_bam; do lctx diagnose prior -m "$OUT/ckpt/$n" --out "$OUT/diag/$n"; done
lctx report "$OUT/run" --out "$OUT/report" --at 1x,2x,4x,8x,16x,32x --title "Seed 000: BAM passkey, 1x-32x"
echo "wall $(( $(date +%s) - START )) s; CPU user/sys of the commands: $(times | tail -1)" | tee "$OUT/time.txt"
python "$HERE/../seeds_table.py" "$OUT/run" --out "$HERE/table.md" --metric passkey.exact \
  --metric passkey.digit_acc --metric flatness.ppl_ratio \
  --prior "$OUT/diag/ggd_bam_ssmax/prior_params.csv" --prior "$OUT/diag/ggd_bam/prior_params.csv"
mkdir -p "$HERE/plots"
cp "$OUT/report/report.md" "$OUT/report/summary.csv" "$HERE/"
cp "$OUT"/report/plots/*.png "$OUT"/diag/*/plots/*.png "$HERE/plots/"
for n in $VARIANTS; do cp "$OUT/ckpt/${n//+/_}/train_log.json" "$HERE/train_log_${n//+/_}.json"; done
cp "$OUT/time.txt" "$HERE/time.txt"
