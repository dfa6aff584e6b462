# Shared by results/2026-12-01-seed*/run.sh; source it, do not run it.
# OUT_DIR (the script's first argument): see out_lib.sh (default a new temporary folder; the tables and plots
# go to OUT_DIR/results, over the committed ones in the script's folder only with FORCE=1; provenance.txt).
#
# Tiny models on CPU: one thread per process is 2-3x more CPU-efficient than two for these sizes
# (measured: a 172K-parameter training step at 16 x 128 tokens took 0.10 CPU-s with 1 thread and 0.34
# with 2, on a shared 2-core machine), so each training / evaluation runs single-threaded and JOBS of
# them (default 2, one per core) run side by side.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
JOBS="${JOBS:-2}"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
B="$DATA/books"
BOOKS=(--data "$B/pg1342_pride_and_prejudice.txt" --data "$B/pg1661_adventures_of_sherlock_holmes.txt"
       --data "$B/pg345_dracula.txt")
HELDOUT="$B/pg98_a_tale_of_two_cities.txt"
for f in "${BOOKS[@]}" "$HELDOUT"; do  # a missing book is a set-up mistake: say so in one line, exit 2
  [ "$f" = --data ] || [ -f "$f" ] || { echo "error: $f not found; put shared/data beside the clone" \
    "(../shared/data from the repository root) or set LCTX_DATA_DIR to the data folder" >&2; exit 2; }
done
source "$(dirname "${BASH_SOURCE[0]}")/out_lib.sh"
out_init "${HERE##*/}" "$@"
echo "tables and plots: $PUB" >&2
START=$(date +%s)
# The tiny model every seed experiment trains (same size for every variant), and the retrieval set-up of
# experiment 7 (every training window starts with a passkey document), which experiments
# 7 and 10 and the SSMax ablation share. A script sets STEPS, then TRAIN_ARGS=("${MODEL_ARGS[@]}" ...).
MODEL_ARGS=(--context-length 128 --hidden-size 64 --layers 2 --heads 4 --vocab-size 1024 --batch-size 16
            --lr 3e-3 --warmup 50 --seed 0)
RETRIEVAL_ARGS=(--retrieval-fraction 1.0 --retrieval passkey --eval-every 100)

par() {  # run "$@" in the background, at most JOBS at a time; `wait` (set -e) reports a failure
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  "$@" &
}

train_model() {  # train_model NAME VARIANT [lctx train args ...]: skipped when the checkpoint exists
  local n="$1" v="$2"; shift 2
  [ -f "$OUT/ckpt/$n/model.safetensors" ] && return 0
  lctx train --variant "$v" "${BOOKS[@]}" "${TRAIN_ARGS[@]}" "$@" --no-progress --out "$OUT/ckpt/$n" \
    > "$OUT/logs/train_$n.log" 2>&1
}

eval_model() {  # eval_model NAME [lctx run args ...]: one run directory per model (resumable)
  local n="$1"; shift
  eval_as "$n" "$n" "$@"
}

eval_as() {  # eval_as RUN NAME [lctx run args ...]: model NAME evaluated into run directory RUN
  local r="$1" n="$2"; shift 2
  lctx run -m "$OUT/ckpt/$n" "$@" --no-progress --out "$OUT/run/$r" > "$OUT/logs/run_$r.log" 2>&1
}

finish() {  # finish TITLE [lctx report args ...]: report, timing, copies into $PUB (out_lib.sh)
  local title="$1"; shift
  lctx report "$OUT"/run/* --out "$OUT/report" --title "$title" "$@" > "$OUT/logs/report.log" 2>&1
  # `times` must run in this shell: inside $(...) it would report the subshell's children (none), i.e. 0 s
  times > "$OUT/.times"
  echo "wall $(( $(date +%s) - START )) s; CPU user/sys of the commands (children): $(tail -1 "$OUT/.times")" \
    | tee "$OUT/time.txt"
  mkdir -p "$PUB/plots"
  cp "$OUT/report/report.md" "$OUT/report/summary.csv" "$OUT/time.txt" "$OUT/provenance.txt" "$PUB/"
  cp "$OUT"/report/plots/*.png "$PUB/plots/"
  for d in "$OUT"/ckpt/*/; do cp "$d/train_log.json" "$PUB/train_log_$(basename "$d").json"; done
}
