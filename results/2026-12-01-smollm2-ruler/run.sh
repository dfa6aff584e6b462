#!/usr/bin/env bash
# RULER (lctx's `ruler` group: RULER's 13 tasks, QA left out when its data is absent) on SmolLM2-135M-Instruct
# (the GGUF Q4_1 file of ../shared/data, dequantised to float32), chat template on, at 1K, 2K and 4K tokens,
# 5 depths x 2 samples per length for the depth tasks and 10 samples per length for cwe and fwe.
# Usage: bash results/2026-12-01-smollm2-ruler/run.sh [OUT]   (from the repository root; CPU: hours)
# The lengths go 1k, then 1k,2k, then 1k,2k,4k into the same OUT, each run resuming the one before, so
# that partial results exist early; the last command alone gives the same table.
set -euo pipefail
DATA=${LCTX_DATA_DIR:-../shared/data}
OUT=${1:-results/2026-12-01-smollm2-ruler/run}
for LENGTHS in 1k 1k,2k 1k,2k,4k; do
  lctx run --model "$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" \
    --tasks ruler --lengths "$LENGTHS" --depths 0,0.25,0.5,0.75,1 --samples 2 --chat-template on \
    --data-dir "$DATA" --device cpu --no-progress --out "$OUT"
done
lctx report "$OUT" --out "$(dirname "$OUT")/report" --at 1k,2k,4k --title "RULER on SmolLM2-135M-Instruct (Q4_1 GGUF)"
