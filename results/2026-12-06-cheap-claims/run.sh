#!/usr/bin/env bash
# The seeds' cheap untested claims (RULES.md, committed before the run): seed 003's LSH error rate and LSH
# trained on the retrieval recipe where ALiBi learns; seed 004's learned rotations and PaTH; seed 002's readout
# ablation. Three training seeds per model, controls retrained here, the seed replicates' recipes.
#
#     bash results/2026-12-06-cheap-claims/run.sh [OUT_DIR]    # default: a new temporary folder, printed
#
#   SEEDS  training seeds (default "0 1 2");  SETS  which groups, in this order (default "id rot lshbam")
#   STEPS  training steps for every model (default: each recipe's own); JOBS (default 2, one thread each)
# Resumable: a trained checkpoint is not retrained, an lctx run directory resumes. Writes OUT/results/
# (runs/<name>/ per model, lsh_error.csv, token_acc.csv, tables.md), over this folder's copies with FORCE=1.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../seeds_lib.sh"
read -r -a SEED_LIST <<< "${SEEDS:-0 1 2}"
read -r -a SET_LIST <<< "${SETS:-id rot lshbam}"
for g in "${SET_LIST[@]}"; do
  case "$g" in id|rot|lshbam) ;; *) echo "error: unknown group '$g' in SETS; use id rot lshbam" >&2; exit 2 ;; esac
done
mkdir -p "$OUT/logs"
source "$HERE/../2026-12-03-seed-replicates/recipes.sh"
python "$HERE/lsh_error.py" > "$OUT/lsh_error.csv"   # seconds, no model
LSH_OPTS=(--option lsh_samples=16 --option lsh_exact_dispatch=false)  # LSH in training and in evaluation
for g in "${SET_LIST[@]}"; do
  for s in "${SEED_LIST[@]}"; do
    case "$g" in
      id) par job "id_interdomain_s$s" interdomain PLAIN_TRAIN ID_EVAL "$s"
          par job "id_idconst_s$s" interdomain PLAIN_TRAIN ID_EVAL "$s" --option id_query=const
          par job "id_s4d32_s$s" s4d PLAIN_TRAIN ID_EVAL "$s" --option s4d_modes=32 ;;
      rot) par job "rot_rope_s$s" rope PLAIN_TRAIN ROT_EVAL "$s"
           par job "rot_accl_s$s" acc_rot PLAIN_TRAIN ROT_EVAL "$s" --option acc_rot_mode=learned
           par job "rot_path_s$s" path PLAIN_TRAIN ROT_EVAL "$s" ;;
      lshbam) par job "lshbam_alibi_s$s" alibi BAM_TRAIN BAM_EVAL "$s"
              par job "lshbam_alibilsh_s$s" alibi_lsh BAM_TRAIN BAM_EVAL "$s" "${LSH_OPTS[@]}" ;;
    esac
  done
done
wait
times > "$OUT/.times"
echo "wall $(( $(date +%s) - START )) s; CPU user/sys of the commands (children): $(tail -1 "$OUT/.times")" \
  | tee -a "$OUT/time.txt"
ls -d "$OUT"/ckpt/lshbam_* > /dev/null 2>&1 && python "$HERE/token_acc.py" "$HELDOUT" "$OUT"/ckpt/lshbam_* \
  > "$OUT/token_acc.csv"
for d in "$OUT"/run/*/; do
  n=$(basename "$d"); mkdir -p "$PUB/runs/$n"
  cp "$d/summary.csv" "$d/run.json" "$PUB/runs/$n/" 2>/dev/null || true
  cp "$OUT/ckpt/$n/train_log.json" "$PUB/runs/$n/" 2>/dev/null || true
done
cp "$OUT/provenance.txt" "$OUT/time.txt" "$OUT/lsh_error.csv" "$PUB/"
[ -f "$OUT/token_acc.csv" ] && cp "$OUT/token_acc.csv" "$PUB/"
[ -f "$OUT/failed.txt" ] && cp "$OUT/failed.txt" "$PUB/" && cat "$OUT/failed.txt" >&2
python "$HERE/tables.py" "$PUB" > "$PUB/tables.md"
echo "tables: $PUB/tables.md" >&2
