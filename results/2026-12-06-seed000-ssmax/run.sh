#!/usr/bin/env bash
# Seed 000 as stated: GGD-BAM + SSMax on a recipe where it can learn (RULES.md, written before the run).
# One command, from the repository root, with ../shared/data beside the clone (or LCTX_DATA_DIR):
#     bash results/2026-12-06-seed000-ssmax/run.sh [OUT_DIR]    # default: a new temporary folder, printed
# Trains VARIANTS x SEEDS (JOBS=2 single-threaded at a time), evaluates each as soon as it is trained, writes
# OUT/results/tables.md (tables.py). Resumable: a trained checkpoint is not retrained, an lctx run resumes.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../out_lib.sh"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
B="$DATA/books"
HELDOUT="$B/pg98_a_tale_of_two_cities.txt"
BOOKS=()
for f in "$B"/pg*.txt; do [ "$f" = "$HELDOUT" ] || BOOKS+=(--data "$f"); done
[ "${#BOOKS[@]}" -eq 14 ] && [ -f "$HELDOUT" ] || { echo "error: $B must hold the eight PG books (lctx data --out" \
  "DIR --only books, then LCTX_DATA_DIR=DIR)" >&2; exit 2; }
out_init seed000-ssmax "$@"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
JOBS="${JOBS:-2}"
STEPS="${STEPS:-4000}"
read -r -a SEEDS <<< "${SEEDS:-0 1}"
read -r -a VARIANTS <<< "${VARIANTS:-ggd_bam+ssmax:linear ggd_bam+ssmax ggd_bam alibi}"  # slowest first
RECIPE=(--context-length 256 --hidden-size 64 --layers 2 --heads 4 --vocab-size 1024 --batch-size 16 --lr 3e-3
        --warmup 50 --steps "$STEPS" --retrieval-fraction 1.0 --retrieval passkey --retrieval-min-length 64
        --eval-every 250 --no-progress)
mkdir -p "$OUT/ckpt" "$OUT/logs" "$OUT/run"
par() { while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done; "$@" & }
one() {  # one VARIANT[:linear] SEED
  local v="${1%%:*}" init="" n
  [ "$1" != "$v" ] && init="${1#*:}"
  n="${v/+/_}${init:+_$init}_s$2"
  [ -f "$OUT/ckpt/$n/model.safetensors" ] || lctx train --variant "$v" ${init:+--option ggd_beta_init=$init} \
    --seed "$2" "${BOOKS[@]}" "${RECIPE[@]}" --out "$OUT/ckpt/$n" > "$OUT/logs/train_$n.log" 2>&1
  lctx run -m "$OUT/ckpt/$n" --tasks flatness --relative 1,2,4,8,16,32 --depths 0,0.25,0.5,0.75,1 --samples 8 \
    --seed "$((100 + $2))" --ppl-data "$HELDOUT" --ppl-max-tokens 16384 --no-progress --out "$OUT/run/$n" \
    > "$OUT/logs/run_$n.log" 2>&1
}
START=$(date +%s)
for s in "${SEEDS[@]}"; do for v in "${VARIANTS[@]}"; do par one "$v" "$s"; done; done
wait
echo "wall $(( $(date +%s) - START )) s" | tee "$OUT/time.txt"
mkdir -p "$PUB"
python "$HERE/tables.py" "$OUT" > "$PUB/tables.md"
cp "$OUT/time.txt" "$OUT/provenance.txt" "$PUB/"
for d in "$OUT"/ckpt/*/; do cp "$d/train_log.json" "$PUB/train_log_$(basename "$d").json"; done
for d in "$OUT"/run/*/; do mkdir -p "$PUB/runs/$(basename "$d")"; cp "$d/summary.csv" "$d/run.json" "$PUB/runs/$(basename "$d")/"; done
