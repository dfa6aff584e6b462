#!/usr/bin/env bash
# The grid that fits one session (RULES.md, amendment of 2026-12-05): SmolLM2-135M-Instruct (8K)
# as shipped and under six positional methods, side by side in one `lctx run` per phase.
# Usage (from the repository root of a clean clone or worktree):
#   bash results/2026-12-04-position-methods/run-reduced.sh [OUT]
#   OUT            default: a new temporary folder (printed); one inside the repository is refused unless FORCE=1
#   LCTX_DATA_DIR  data root (default ../shared/data): books/, essays and the SmolLM2 GGUF
#   ONLY / SKIP    space-separated phase names (P1 Q1 P2 Q2 N) to run only / to leave out
# Each phase writes an lctx run directory OUT/<phase>/, OUT/<phase>.log (/usr/bin/time -v) and a line in
# OUT/timings.tsv; rerunning resumes (finished samples are skipped).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
DATA=$(cd "$DATA" && pwd)
source "$HERE/../out_lib.sh"
out_init position-methods "$@"
export OMP_NUM_THREADS=2 LCTX_NUM_THREADS=2 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || { echo "error: $G not found; set LCTX_DATA_DIR to the shared data folder" >&2; exit 2; }
C=(--data-dir "$DATA" --device cpu --no-progress --seed 0 --train-length 8192 --allow-beyond-max)
METHODS=(shipped linear:factor=2 dynamic:factor=4 yarn:factor=2 yarn:factor=4 sinks:n_sink=4,window=2048
         self_extend:window=1024,group=8)
P=(); for m in "${METHODS[@]}"; do P+=(--position "$m"); done
printf '%s\n' "${METHODS[@]}" > "$OUT/methods.txt"
# depths 0-0.75, not 1 (RULES.md: shipped SmolLM2 fails a needle next to the question by format at every length)
PK=(--tasks passkey --depths 0,0.25,0.5,0.75 --samples 1)
NIAH=(--tasks niah_single_2 --depths 0,0.25,0.5,0.75 --samples 1)
PPL=(--tasks ppl --ppl-data books --ppl-max-tokens 0 --task-option ppl.windows=2)  # lctx takes 2 or more
wanted() {
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return 1; fi
  [[ " ${SKIP:-} " != *" $1 "* ]]
}
phase() {  # phase NAME ARGS...: one lctx run into OUT/NAME under /usr/bin/time -v, a line in timings.tsv
  local name=$1; shift; local t0; t0=$(date -u +%FT%TZ)
  /usr/bin/time -v lctx run -m "$G" "${P[@]}" "$@" "${C[@]}" --out "$OUT/$name" >> "$OUT/$name.log" 2>&1
  local rc=$?  # before the date's command substitution resets $?
  printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(date -u +%FT%TZ)" "$rc" >> "$OUT/timings.tsv"
}
lctx plan --model "$G" --length 16k > "$OUT/plan-16k.txt" 2>&1 || { cat "$OUT/plan-16k.txt" >&2; exit 2; }
wanted P1 && phase P1 "${PK[@]}" --lengths 4k,8k
wanted Q1 && phase Q1 "${PPL[@]}" --lengths 8k
wanted P2 && phase P2 "${PK[@]}" --lengths 16k
wanted Q2 && phase Q2 "${PPL[@]}" --lengths 16k
wanted N && phase N "${NIAH[@]}" --lengths 4k,8k
R=(); for d in "$OUT"/*/; do [ -f "$d/records.jsonl" ] && R+=("$d"); done
if [ ${#R[@]} -gt 0 ]; then
  lctx report "${R[@]}" --out "$OUT/report" \
    --title "Positional methods on SmolLM2-135M-Instruct (8K context)" > "$OUT/report.log" 2>&1
  python "$HERE/make_tables.py" "$OUT" > "$OUT/tables.md"
  mkdir -p "$PUB"; cp "$OUT/tables.md" "$OUT/timings.tsv" "$OUT/provenance.txt" "$PUB/" 2>/dev/null
  cp -r "$OUT/report" "$PUB/" 2>/dev/null
fi
