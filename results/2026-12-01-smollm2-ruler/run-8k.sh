#!/usr/bin/env bash
# The six NIAH tasks at 8K on SmolLM2-135M-Instruct (Q4_1 GGUF, float32), chat template on, RULER's
# 128-token budget (the `ruler` group's), depths 0, 0.5, 1, one sample each: the options of run.sh's stages at
# 8K, for the six tasks only (lctx has no subset of the group). Stop 22 ran it as two processes on the two cores
# (run-8k: niah_single_1..3 and niah_multikey_1; run-8k-b: niah_multiquery, niah_multivalue; README.md), which is
# the same as this one call: the records' fingerprints do not depend on which process made them.
# Usage (repository root): bash results/2026-12-01-smollm2-ruler/run-8k.sh [OUTDIR]   (~110-150 s per sample, one thread)
# OUTDIR: default a new temporary folder (printed; one inside the repository is refused unless FORCE=1; ../out_lib.sh)
set -uo pipefail
DATA=${LCTX_DATA_DIR:-../shared/data}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../out_lib.sh"
out_init smollm2-ruler-8k "$@"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} LCTX_NUM_THREADS=${LCTX_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
M="$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
T=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,niah_multiquery
opts=(); for t in ${T//,/ }; do opts+=(--task-option "$t.max_new_tokens=128"); done
lctx run --model "$M" --tasks "$T" "${opts[@]}" --chat-template on --data-dir "$DATA" --device cpu --no-progress \
  --lengths 8k --depths 0,0.5,1 --samples 1 --out "$OUT/run-8k"
