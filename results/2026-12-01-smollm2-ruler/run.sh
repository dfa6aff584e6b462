#!/usr/bin/env bash
# RULER (lctx's `ruler` group) on SmolLM2-135M-Instruct (the GGUF Q4_1 file of ../shared/data, dequantised to
# float32), chat template on, greedy, CPU, single-threaded. qa_1/qa_2 are left out: SQuAD v2 dev and HotpotQA dev
# are not in ../shared/data (lctx never downloads). The group gives the niah_* tasks RULER's generation budget
# (128 tokens; vt 30, cwe 120, fwe 50 are the tasks' defaults). See README.md for what was run.
# Usage (from the repository root of a fresh clone, with `lctx` installed):
#   bash results/2026-12-01-smollm2-ruler/run.sh [OUTDIR]   # default OUTDIR: a new temporary folder (printed;
#            one inside the repository is refused unless FORCE=1; OUTDIR/provenance.txt: ../out_lib.sh)
#   STAGES   the stages, in order (default "1k 2k5 2k 4k1 4k3 4k5 4k"; the committed run: 1k, then 2k5 2k 4k1, see README.md). A stage is a length and the samples per
#            task it brings the run to, grown by resume so that a stop (STOP_AT) leaves every task of a length
#            with a score: 1 (depth 0.5), 3 (depths 0, 0.5, 1), 5 (depths 0, .25, .5, .75, 1) or 10 (those 5 x 2
#            samples); cwe/fwe (no depth axis) run as many samples. "1k" alone = "1k10".
#   STOP_AT  HH:MM (UTC): a stage still running then is stopped (lctx keeps its finished samples; rerunning
#            resumes), later stages are skipped (default: none)
# Each stage logs to OUTDIR/<stage>.log and adds "stage start end rc" to OUTDIR/timings.tsv (rc 124: stopped at
# STOP_AT). The committed run was made as
#   flock /work/heavy.lock nice -n 5 env STOP_AT=08:05 bash results/2026-12-01-smollm2-ruler/run.sh OUT
# Costs measured on the shared 2-core machine (README.md): ~10-30 s per 1K sample, 15-60 s per 2K, 40-150 s per 4K.
set -uo pipefail
DATA=${LCTX_DATA_DIR:-../shared/data}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../out_lib.sh"
out_init smollm2-ruler "$@"
M="$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} LCTX_NUM_THREADS=${LCTX_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
common=(--model "$M" --tasks ruler --chat-template on --data-dir "$DATA" --device cpu --no-progress)
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
for s in ${STAGES:-1k 2k5 2k 4k1 4k3 4k5 4k}; do
  L=${s%%k*}k; n=${s#*k}; n=${n:-10}
  case $n in
    1)  opts=(--depths 0.5 --samples 1) ;;
    3)  opts=(--depths 0,0.5,1 --samples 1) ;;
    5)  opts=(--depths 0,0.25,0.5,0.75,1 --samples 1) ;;
    10) opts=(--depths 0,0.25,0.5,0.75,1 --samples 2) ;;
    *)  echo "error: stage $s: samples per task must be 1, 3, 5 or 10" >&2; exit 2 ;;
  esac
  stage "$s" --lengths "$L" "${opts[@]}" --out "$OUT/run-$L"
  r="$OUT/run-$L"; [[ -f "$r/records.jsonl" && " ${runs[*]:-} " != *" $r "* ]] && runs+=("$r")
done
[ ${#runs[@]} -gt 0 ] || exit 0
lctx report "${runs[@]}" --out "$OUT/report" --at 1k,2k,4k --title "RULER on SmolLM2-135M-Instruct (Q4_1 GGUF)"
# one table over the runs (lctx report gives each run of the same model its own RULER block)
python "$HERE/ruler_table.py" "${runs[@]}" > "$OUT/table.md"
