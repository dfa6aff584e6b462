#!/usr/bin/env bash
# Seed 003 (positional LSH): does ALiBi approximated by s random contiguous bin masks (alibi_lsh) match
# exact ALiBi at s ~ 10-20, with an error falling like 1/sqrt(s)? Two measurements:
#  1. trained from scratch: alibi_lsh with s in {1, 4, 16, 64} against alibi (same size, steps, data and
#     retrieval mix), perplexity and passkey at 1x-8x the training length;
#  2. at inference: the trained ALiBi model with its attention replaced by the LSH approximation
#     (lctx run --attn-override alibi_lsh:s=N), s in {1, 4, 16, 64}: how far its perplexity moves.
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-01-seed003-lsh/run.sh [OUT_DIR]          # default OUT_DIR: runs/seed003-lsh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-runs/seed003-lsh}"
source "$HERE/../seeds_lib.sh"
STEPS="${STEPS:-1200}"
TRAIN_ARGS=(--context-length 128 --hidden-size 64 --layers 2 --heads 4 --vocab-size 1024 --batch-size 16
            --steps "$STEPS" --lr 3e-3 --warmup 50 --seed 0 --retrieval-fraction 0.5 --retrieval passkey
            --eval-every 100)
mkdir -p "$OUT/logs"
par train_model alibi alibi
for s in 1 4 16 64; do par train_model "alibi_lsh_s$s" alibi_lsh --option lsh_samples=$s; done
wait
for n in alibi alibi_lsh_s1 alibi_lsh_s4 alibi_lsh_s16 alibi_lsh_s64; do
  par eval_model "$n" --task flatness --relative 1,2,4,8 --depths 0,0.25,0.5,0.75,1 --samples 2 \
    --ppl-data "$HELDOUT" --ppl-max-tokens 8192 --attn-impl fast
done
for s in 1 4 16 64; do  # the exact ALiBi model, its attention replaced at inference
  par eval_as "alibi_override_s$s" alibi --attn-override "alibi_lsh:s=$s" --tasks ppl --lengths 128,512,1k \
    --ppl-data "$HELDOUT" --ppl-max-tokens 8192
done; wait
finish "Seed 003: positional LSH against ALiBi" --at 1x,2x,4x,8x
python "$HERE/../seeds_table.py" "$OUT"/run/* --out "$HERE/table.md" --metric ppl.ppl \
  --metric flatness.ppl_ratio --metric passkey.exact --metric passkey.digit_acc
