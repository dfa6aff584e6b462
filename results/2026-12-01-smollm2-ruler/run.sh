#!/usr/bin/env bash
# RULER (lctx's `ruler` group) on SmolLM2-135M-Instruct (the GGUF Q4_1 file of ../shared/data, dequantised to
# float32), chat template on, greedy, CPU, single-threaded. qa_1/qa_2 are left out: SQuAD v2 dev and HotpotQA dev
# are not in ../shared/data (lctx never downloads). The group gives the niah_* tasks RULER's generation budget
# (128 tokens; vt 30, cwe 120, fwe 50 are the tasks' defaults). See README.md for what was run.
# Usage (from the repository root of a fresh clone, with `lctx` installed):
#   bash results/2026-12-01-smollm2-ruler/run.sh [OUTDIR]        # default OUTDIR: lctx-out/smollm2-ruler
#   STAGES   the stages, in order (default "1k 2k 4k4 4k"): 1k, 2k: 10 samples per task (5 depths x 2; cwe/fwe
#            10); 4k4: 4K at 5 per task (5 depths x 1), then 4k: grown by resume to 10 per task
#   STOP_AT  HH:MM (UTC): a stage still running then is stopped (lctx keeps its finished samples; rerunning
#            resumes), later stages are skipped (default: none)
# Each stage logs to OUTDIR/<stage>.log and adds "stage start end rc" to OUTDIR/timings.tsv (rc 124: stopped at
# STOP_AT). The committed run was made as
#   flock /work/heavy.lock nice -n 5 env STOP_AT=08:05 bash results/2026-12-01-smollm2-ruler/run.sh OUT
# Costs measured on the shared 2-core machine: see README.md.
set -uo pipefail
DATA=${LCTX_DATA_DIR:-../shared/data}
OUT=${1:-lctx-out/smollm2-ruler}
HERE=$(cd "$(dirname "$0")" && pwd)
M="$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} LCTX_NUM_THREADS=${LCTX_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
D5=0,0.25,0.5,0.75,1
common=(--model "$M" --tasks ruler --depths "$D5" --chat-template on --data-dir "$DATA" --device cpu --no-progress)
mkdir -p "$OUT"
stamp() { date -u +%FT%TZ; }
left() {  # seconds to STOP_AT (HH:MM UTC), 0 = no limit (timeout 0 runs without one)
  if [ -z "${STOP_AT:-}" ]; then echo 0; else echo $(( $(date -u -d "$STOP_AT" +%s) - $(date -u +%s) )); fi
}
stage() {  # stage NAME lctx run options...: stopped at STOP_AT, a line in timings.tsv
  local name=$1; shift; local t0 t rc; t0=$(stamp); t=$(left)
  if [ -n "${STOP_AT:-}" ] && [ "$t" -lt 60 ]; then
    printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$t0" "skipped: past STOP_AT" >> "$OUT/timings.tsv"; return; fi
  timeout "$t" /usr/bin/time -v lctx run "${common[@]}" "$@" >> "$OUT/$name.log" 2>&1; rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(stamp)" "$rc" >> "$OUT/timings.tsv"
}
runs=()
for s in ${STAGES:-1k 2k 4k4 4k}; do
  case $s in
    1k)  stage 1k  --lengths 1k --samples 2 --out "$OUT/run-1k" ;;
    2k)  stage 2k  --lengths 2k --samples 2 --out "$OUT/run-2k" ;;
    4k4) stage 4k4 --lengths 4k --samples 1 --out "$OUT/run-4k" ;;  # 5 per task first, so a stop leaves a table
    4k)  stage 4k  --lengths 4k --samples 2 --out "$OUT/run-4k" ;;  # resumes 4k4's samples, adds the second
  esac
  r="$OUT/run-${s%4}"; [[ -f "$r/records.jsonl" && " ${runs[*]:-} " != *" $r "* ]] && runs+=("$r")
done
[ ${#runs[@]} -gt 0 ] || exit 0
lctx report "${runs[@]}" --out "$OUT/report" --at 1k,2k,4k --title "RULER on SmolLM2-135M-Instruct (Q4_1 GGUF)"
# one table over the runs (lctx report gives each run of the same model its own RULER block)
python "$HERE/ruler_table.py" "${runs[@]}" > "$OUT/table.md"
