#!/usr/bin/env bash
# Seed 003 (positional LSH): does ALiBi approximated by s random contiguous bin masks (alibi_lsh) match
# exact ALiBi at s ~ 10-20, with an error falling like 1/sqrt(s)? Two measurements:
#  1. trained from scratch: alibi_lsh with s in {1, 4, 16, 64} against alibi (same size, steps, data and
#     retrieval mix), perplexity and passkey at 1x-8x the training length;
#  2. at inference: the trained ALiBi model with its attention replaced by the LSH approximation
#     (lctx run --attn-override alibi_lsh:s=N), s in {1, 4, 16, 64}: how far its perplexity moves from exact.
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed003-lsh/run.sh [OUT_DIR]          # default OUT_DIR: runs/seed003-lsh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
OUT="${1:-runs/seed003-lsh}"
STEPS="${STEPS:-1200}"
B="$DATA/books"
mkdir -p "$OUT"
START=$(date +%s)
train() {  # train NAME VARIANT [--option K=V ...]
  local n="$1" v="$2"; shift 2
  [ -f "$OUT/ckpt/$n/model.safetensors" ] || lctx train --variant "$v" "$@" \
    --data "$B/pg1342_pride_and_prejudice.txt" --data "$B/pg1661_adventures_of_sherlock_holmes.txt" \
    --data "$B/pg345_dracula.txt" --context-length 128 --hidden-size 64 --layers 2 --heads 4 \
    --vocab-size 1024 --batch-size 16 --steps "$STEPS" --lr 3e-3 --warmup 50 --seed 0 \
    --retrieval-fraction 0.5 --retrieval passkey --eval-every 400 --no-progress --out "$OUT/ckpt/$n"
}
train alibi alibi
for s in 1 4 16 64; do train "alibi_lsh_s$s" alibi_lsh --option lsh_samples=$s; done
NAMES="alibi alibi_lsh_s1 alibi_lsh_s4 alibi_lsh_s16 alibi_lsh_s64"
MODELS=(); for n in $NAMES; do MODELS+=(-m "$OUT/ckpt/$n"); done
lctx run "${MODELS[@]}" --task flatness --relative 1,2,4,8 --depths 0,0.25,0.5,0.75,1 --samples 2 \
  --ppl-data "$B/pg98_a_tale_of_two_cities.txt" --ppl-max-tokens 8192 --attn-impl fast --no-progress \
  --out "$OUT/run"
OVR=()
for s in 1 4 16 64; do
  lctx run -m "$OUT/ckpt/alibi" --attn-override "alibi_lsh:s=$s" --tasks ppl --lengths 128,512 \
    --ppl-data "$B/pg98_a_tale_of_two_cities.txt" --ppl-max-tokens 8192 --no-progress --out "$OUT/override_s$s"
  OVR+=("$OUT/override_s$s")
done
lctx report "$OUT/run" "${OVR[@]}" --out "$OUT/report" --at 1x,2x,4x,8x \
  --title "Seed 003: positional LSH vs ALiBi"
echo "wall $(( $(date +%s) - START )) s; CPU user/sys of the commands: $(times | tail -1)" | tee "$OUT/time.txt"
python "$HERE/../seeds_table.py" "$OUT/run" --out "$HERE/table.md" --metric ppl.ppl --metric flatness.ppl_ratio \
  --metric passkey.exact --metric passkey.digit_acc
python "$HERE/../seeds_table.py" "$OUT/run" "${OVR[@]}" --out "$HERE/table_override.md" --metric ppl.ppl
mkdir -p "$HERE/plots"
cp "$OUT/report/report.md" "$OUT/report/summary.csv" "$HERE/"
cp "$OUT"/report/plots/*.png "$HERE/plots/"
for n in $NAMES; do cp "$OUT/ckpt/$n/train_log.json" "$HERE/train_log_$n.json"; done
cp "$OUT/time.txt" "$HERE/time.txt"
