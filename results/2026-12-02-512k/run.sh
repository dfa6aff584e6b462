#!/usr/bin/env bash
# Passkey end to end at 16K-512K tokens on this CPU.
#   - a near-linear variant: a tiny interdomain model (fixed S4D state, O(T) prefill), trained here first
#     (the seed experiments' tiny model, every window a passkey document, STEPS steps), at 16K..512K;
#   - exact attention: the bundled pydoc-tiny-rope checkpoint (RoPE, softmax over every key) at 16K..128K.
# One `lctx run` per (model, length) under /usr/bin/time -v, so each row has its own wall time, CPU time and
# peak RSS; summarise.py writes the table and the time exponent (least squares of log t on log T).
#
#     bash results/2026-12-02-512k/run.sh [OUT_DIR]   # default OUT_DIR: a new temporary folder
# Env: STEPS (default 1000), LIN_LENGTHS, EXACT_LENGTHS (comma lists), OMP_NUM_THREADS (default 2).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../seeds_lib.sh"
export OMP_NUM_THREADS="${OMP_NUM_THREADS_RUN:-2}"  # seeds_lib sets 1 for its side-by-side jobs; one job here
STEPS="${STEPS:-1000}"
LIN_LENGTHS="${LIN_LENGTHS:-16k,32k,64k,128k,256k,512k}"
EXACT_LENGTHS="${EXACT_LENGTHS:-16k,32k,64k,128k}"
mkdir -p "$OUT/logs" "$OUT/time"
[ -f "$OUT/ckpt/interdomain/model.safetensors" ] || \
  lctx train --variant interdomain "${BOOKS[@]}" "${MODEL_ARGS[@]}" "${RETRIEVAL_ARGS[@]}" --steps "$STEPS" \
    --no-progress --out "$OUT/ckpt/interdomain" > "$OUT/logs/train_interdomain.log" 2>&1
one() {  # one NAME MODEL LENGTH
  local n="$1" m="$2" L="$3"
  [ -f "$OUT/run/$n-$L/results.csv" ] && return 0
  /usr/bin/time -v -o "$OUT/time/$n-$L.txt" lctx run -m "$m" --tasks passkey --lengths "$L" --depths 0.5 \
    --samples 1 --no-progress --out "$OUT/run/$n-$L" > "$OUT/logs/run_$n-$L.log" 2>&1
}
IFS=, read -ra LL <<< "$LIN_LENGTHS"
for L in "${LL[@]}"; do one interdomain "$OUT/ckpt/interdomain" "$L"; done
IFS=, read -ra EL <<< "$EXACT_LENGTHS"
for L in "${EL[@]}"; do one bundled-rope "$HERE/../../models/checkpoints/pydoc-tiny-rope" "$L"; done
mkdir -p "$PUB"
python "$HERE/summarise.py" "$OUT" --out "$PUB/README-table.md"
cp "$OUT/provenance.txt" "$PUB/"
