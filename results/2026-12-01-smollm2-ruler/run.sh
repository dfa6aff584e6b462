#!/usr/bin/env bash
# RULER (lctx's `ruler` group) on SmolLM2-135M-Instruct (the GGUF Q4_1 file of ../shared/data, dequantised to
# float32), chat template on, greedy, CPU, single-threaded. qa_1/qa_2 are left out: SQuAD v2 dev and HotpotQA dev
# are not in ../shared/data (lctx never downloads). See README.md for what was run and what each number is.
# Usage (from the repository root of a fresh clone, with `lctx` installed):
#   bash results/2026-12-01-smollm2-ruler/run.sh [OUTDIR]        # default OUTDIR: lctx-out/smollm2-ruler
#   STAGES="1k 2k 4k" bash ...  to choose the stages (default: 1k 2k, the ones committed here)
# Costs measured on the shared 2-core machine: the 1K stage took 1063 s of sample wall time (110 samples, load
# ~2-3); the 2K stage at load ~9-10 took 42-100 s per sample (2239 s for 33 samples).
set -euo pipefail
DATA=${LCTX_DATA_DIR:-../shared/data}
OUT=${1:-lctx-out/smollm2-ruler}
HERE=$(dirname "$0")
M="$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
common=(--model "$M" --tasks ruler --samples 1 --chat-template on --data-dir "$DATA" --device cpu --no-progress)
for stage in ${STAGES:-1k 2k}; do
  case $stage in
    # run-1k/: 5 depths x 2 samples = 10 samples per task (cwe/fwe: 10 samples, no depth axis)
    1k) lctx run "${common[@]}" --lengths 1k --depths 0,0.25,0.5,0.75,1 --samples 2 --out "$OUT/run-1k" ;;
    # run-2k/: grown by resume, 1 sample per depth: depth 0.5 first, then 0 and 1 (as committed; append
    # 0,0.25,0.5,0.75,1 for the 10 per task); the last command alone gives the same table.md
    2k) for d in 0.5 0,0.5,1; do
          lctx run "${common[@]}" --lengths 2k --depths "$d" --out "$OUT/run-2k"; done ;;
    4k) lctx run "${common[@]}" --lengths 4k --depths 0,0.25,0.5,0.75,1 --out "$OUT/run-4k" ;;
  esac
done
runs=(); for s in ${STAGES:-1k 2k}; do runs+=("$OUT/run-$s"); done
lctx report "${runs[@]}" --out "$OUT/report" --at 1k,2k,4k --title "RULER on SmolLM2-135M-Instruct (Q4_1 GGUF)"
# one table over the runs (lctx report gives each run of the same model its own RULER block)
python "$HERE/ruler_table.py" "${runs[@]}" > "$OUT/table.md"
# the checks of README.md: run-1k's inputs rebuilt by this checkout, and its outputs against a rerun
python "$HERE/check_prompts.py" "$OUT/run-1k/records.jsonl" "$DATA" || true
