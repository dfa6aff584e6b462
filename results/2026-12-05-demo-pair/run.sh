#!/usr/bin/env bash
# The bundled demo pair, models/checkpoints/pydoc-passkey-{alibi,ggd_bam}: what `lctx run` evaluates with no
# arguments. Two tiny models of one recipe that differ only in the positional variant, trained where they learn
# passkey retrieval at their training length (128 tokens), so the default run shows what happens past it.
#
# One command, from the repository root; no ../shared needed (the text is Python's own pydoc topics, the
# passkey filler is generated):
#     bash results/2026-12-05-demo-pair/run.sh [OUT_DIR]   # default: a new temporary folder, printed
# Trains VARIANTS (alibi ggd_bam; run 1 was rope alibi, RULES.md) x SEEDS (0 1), JOBS=2 single-threaded at a time, then runs `lctx run` (the
# default tasks and lengths) on each checkpoint. RULES.md says how the shipped pair is chosen, decided before
# the run. Copy OUT/ckpt/pydoc-passkey-<variant>-s0 to models/checkpoints/pydoc-passkey-<variant> to ship it.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../out_lib.sh"
out_init demo-pair "$@"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # tiny models: one thread per process, JOBS side by side
JOBS="${JOBS:-2}"
STEPS="${STEPS:-3000}"
read -r -a SEEDS <<< "${SEEDS:-0 1}"
read -r -a VARIANTS <<< "${VARIANTS:-alibi ggd_bam}"
# the recipe of results/seeds_lib.sh (ctx 128, d 64, 2 layers, 4 heads, BPE 1024, every window starts with a
# passkey document of 64-128 tokens), on the default corpus (pydoc topics, train split) instead of PG books
RECIPE=(--context-length 128 --hidden-size 64 --layers 2 --heads 4 --vocab-size 1024 --batch-size 16 --lr 3e-3
        --warmup 50 --steps "$STEPS" --retrieval-fraction 1.0 --retrieval passkey --eval-every 250 --no-progress)
mkdir -p "$OUT/ckpt" "$OUT/logs" "$OUT/run"
par() {  # run "$@" in the background, at most JOBS at a time
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  "$@" &
}
one() {  # one VARIANT SEED: train (skipped when the checkpoint exists), then the default evaluation
  local n="pydoc-passkey-$1-s$2"
  [ -f "$OUT/ckpt/$n/model.safetensors" ] || lctx train --variant "$1" --seed "$2" "${RECIPE[@]}" \
    --out "$OUT/ckpt/$n" > "$OUT/logs/train_$n.log" 2>&1
  lctx run -m "$OUT/ckpt/$n" --relative 1,2,4,8 --no-progress --out "$OUT/run/$n" > "$OUT/logs/run_$n.log" 2>&1
}
START=$(date +%s)
for s in "${SEEDS[@]}"; do for v in "${VARIANTS[@]}"; do par one "$v" "$s"; done; done
wait
echo "wall $(( $(date +%s) - START )) s" | tee "$OUT/time.txt"
mkdir -p "$PUB"
python "$HERE/tables.py" "$OUT" > "$PUB/tables.md"
cp "$OUT/time.txt" "$OUT/provenance.txt" "$PUB/"
for d in "$OUT"/ckpt/*/; do cp "$d/train_log.json" "$PUB/train_log_$(basename "$d").json"; done
