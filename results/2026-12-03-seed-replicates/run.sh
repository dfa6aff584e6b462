#!/usr/bin/env bash
# The seeds' claims with three training seeds each, from one commit, nothing tuned per
# variant (the model, data and recipes of results/2026-12-01-seed00*/run.sh; seeds_lib.sh), each seed a separate
# training run (`lctx train --seed S`; acc_rot's random increments take the same S, `acc_rot_seed=S`).
#
#     bash results/2026-12-03-seed-replicates/run.sh [OUT_DIR]   # default OUT_DIR: a new temporary folder
#     python results/2026-12-03-seed-replicates/make_tables.py OUT_DIR/run > .../tables.md
#
#   SEEDS   training seeds (default "0 1 2")
#   SETS  which experiments, in this order (default all): bam (seed 000: ggd_bam, alibi; passkey to 64x with
#           20 prompts per length), id (seed 002: interdomain against S4D with its state matched, s4d_modes=32),
#           rot (seed 004: acc_rot QK / QK+V at spread 0.25 and 0.5, RoPE and ALiBi beside them; 8 seeded ppl
#           windows per length, 8 x 16K = 128K tokens at 128x), lsh (seed 003: alibi_lsh s=16 and alibi
#           trained on a half-retrieval mix, 2000 steps, seed 0), once (PaTH in the rot set-up, sinusoidal in
#           the bam set-up, interdomain on the bam retrieval recipe; seed 0)
#   STEPS   training steps for every model (default: each recipe's own, 3000 / 1200 / 2000); a small STEPS is
#           the fresh-clone check (`STEPS=20 SEEDS=0 SETS=bam bash ... /tmp/x`)
#   JOBS    models trained / evaluated side by side (default 2, one thread each; seeds_lib.sh)
# Resumable: a trained checkpoint is not retrained, an lctx run directory resumes. Each model is evaluated as soon
# as it is trained, so a stopped run still has every finished model's numbers. OUT_DIR/run/<name>/ per model,
# <name> = <group>_<variant>_s<seed>; OUT_DIR/diag/<name>/ the learned GGD priors.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../seeds_lib.sh"
read -r -a SEED_LIST <<< "${SEEDS:-0 1 2}"
read -r -a SET_LIST <<< "${SETS:-bam id rot lsh once}"
for g in "${SET_LIST[@]}"; do
  case "$g" in bam|id|rot|lsh|once) ;; *) echo "error: unknown group '$g' in SETS; use bam id rot lsh once" >&2
    exit 2 ;; esac
done
mkdir -p "$OUT/logs"
source "$HERE/recipes.sh"

for g in "${SET_LIST[@]}"; do
  case "$g" in
    bam) for s in "${SEED_LIST[@]}"; do
           par job "bam_ggd_bam_s$s" ggd_bam BAM_TRAIN BAM_EVAL "$s"
           par job "bam_alibi_s$s" alibi BAM_TRAIN BAM_EVAL "$s"
         done ;;
    id) for s in "${SEED_LIST[@]}"; do
          par job "id_interdomain_s$s" interdomain PLAIN_TRAIN ID_EVAL "$s"
          # state matched: interdomain keeps U and Gamma, 2 x 16 complex modes x D per head; S4D keeps N x D
          par job "id_s4d32_s$s" s4d PLAIN_TRAIN ID_EVAL "$s" --option s4d_modes=32
        done ;;
    rot) for s in "${SEED_LIST[@]}"; do
           for sp in 0.25 0.5; do
             par job "rot_qk_sp${sp}_s$s" acc_rot PLAIN_TRAIN ROT_EVAL "$s" --option "acc_rot_spread=$sp" \
               --option "acc_rot_seed=$s"
             par job "rot_qkv_sp${sp}_s$s" acc_rot PLAIN_TRAIN ROT_EVAL "$s" --option "acc_rot_spread=$sp" \
               --option "acc_rot_seed=$s" --option rotate_values=true
           done
           par job "rot_rope_s$s" rope PLAIN_TRAIN ROT_EVAL "$s"
           par job "rot_alibi_s$s" alibi PLAIN_TRAIN ROT_EVAL "$s"
         done ;;
    lsh) par job lsh_alibi_lsh_s16_s0 alibi_lsh LSH_TRAIN LSH_EVAL 0 --option lsh_samples=16
         par job lsh_alibi_s0 alibi LSH_TRAIN LSH_EVAL 0 ;;
    once) par job rot_path_s0 path PLAIN_TRAIN ROT_EVAL 0
          par job bam_sinusoidal_s0 sinusoidal BAM_TRAIN BAM_EVAL 0
          par job bam_interdomain_s0 interdomain BAM_TRAIN BAM_EVAL 0 ;;
  esac
done
wait
times > "$OUT/.times"
echo "wall $(( $(date +%s) - START )) s; CPU user/sys of the commands (children): $(tail -1 "$OUT/.times")" \
  | tee -a "$OUT/time.txt"
# what the tables are made from, per model: its summary, run record, training log and learned prior (small files;
# the checkpoints stay in OUT), copied to $PUB/runs/<name>/ (OUT/results, or this folder with FORCE=1)
for d in "$OUT"/run/*/; do
  n=$(basename "$d"); mkdir -p "$PUB/runs/$n"
  cp "$d/summary.csv" "$d/run.json" "$PUB/runs/$n/" 2>/dev/null || true
  cp "$OUT/ckpt/$n/train_log.json" "$PUB/runs/$n/" 2>/dev/null || true
  cp "$OUT/diag/$n/prior_params.csv" "$PUB/runs/$n/" 2>/dev/null || true
done
cp "$OUT/provenance.txt" "$OUT/time.txt" "$PUB/"
[ -f "$OUT/failed.txt" ] && cp "$OUT/failed.txt" "$PUB/" && cat "$OUT/failed.txt" >&2
python "$HERE/make_tables.py" "$PUB/runs" > "$PUB/tables.md"
echo "tables: $PUB/tables.md" >&2
