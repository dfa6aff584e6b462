#!/usr/bin/env bash
# Seed 003 (positional LSH): does ALiBi approximated by s random contiguous bin masks (alibi_lsh) match
# exact ALiBi at s ~ 10-20, with an error falling like 1/sqrt(s)?
# Measured at inference on one trained ALiBi model (its attention replaced by the LSH approximation,
# the code of `lctx run --attn-override alibi_lsh:s=N`), s in {1, 4, 16, 64}:
#  1. lsh_error.py: ppl error and layer-0 attention-output error vs exact ALiBi, 4 LSH seeds per s,
#     windows of 128 (1x) and 512 (4x) tokens of the held-out book, fitted exponent of err ~ s^a;
#  2. lctx run: ppl at 128/512 and passkey at 1x (128) for exact ALiBi and each s (LSH seed 0).
# RUN_TRAINED=1 adds alibi_lsh trained from scratch at each s (s = 1, 4, 16 run once; see README).
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed003-lsh/run.sh [OUT_DIR]  # default OUT_DIR: a new temporary folder
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JOBS="${JOBS:-1}"  # one job at a time (a shared machine); seeds_lib.sh defaults to 2
source "$HERE/../seeds_lib.sh"
STEPS="${STEPS:-1000}"
# the retrieval set-up of experiment 7: every training window starts with a passkey document
TRAIN_ARGS=("${MODEL_ARGS[@]}" --steps "$STEPS" "${RETRIEVAL_ARGS[@]}")
mkdir -p "$OUT/logs"
train_model alibi alibi
if [ "${RUN_TRAINED:-0}" = 1 ]; then
  for s in 1 4 16 64; do par train_model "alibi_lsh_s$s" alibi_lsh --option lsh_samples=$s; done; wait
fi
[ -f "$OUT/lsh_error/lsh_error_fit.txt" ] ||  # resumable: done once per model
  python "$HERE/lsh_error.py" "$OUT/ckpt/alibi" "$HELDOUT" --out "$OUT/lsh_error" --s 1,4,16,64 --seeds 4 \
    --windows 128:32,512:8 > "$OUT/logs/lsh_error.log" 2>&1
eval_model alibi --tasks ppl,passkey --lengths 128,512 --depths 0,0.25,0.5,0.75,1 --samples 4 \
  --ppl-data "$HELDOUT" --ppl-max-tokens 8192
for s in 1 4 16 64; do  # the exact ALiBi model, its attention replaced at inference
  eval_as "alibi_override_s$s" alibi --attn-override "alibi_lsh:s=$s" --tasks ppl,passkey --lengths 128,512 \
    --depths 0,0.25,0.5,0.75,1 --samples 4 --ppl-data "$HELDOUT" --ppl-max-tokens 8192
done
if [ "${RUN_TRAINED:-0}" = 1 ]; then
  for s in 1 4 16 64; do eval_model "alibi_lsh_s$s" --tasks ppl,passkey --lengths 128,512 \
    --depths 0,0.25,0.5,0.75,1 --samples 4 --ppl-data "$HELDOUT" --ppl-max-tokens 8192; done
fi
finish "Seed 003: positional LSH against ALiBi"
cp "$OUT"/lsh_error/lsh_error*.csv "$OUT"/lsh_error/lsh_error_fit.txt "$PUB/"
cp "$OUT"/lsh_error/lsh_error.png "$PUB/plots/"
python "$HERE/../seeds_table.py" "$OUT"/run/* --out "$PUB/table.md" --metric ppl.ppl \
  --metric passkey.exact --metric passkey.digit_acc
