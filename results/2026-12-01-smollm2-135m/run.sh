#!/usr/bin/env bash
# The SmolLM2-135M-Instruct evaluation of issue 11 (GGUF Q4_1, dequantised to float32), scaled down to fit
# about an hour of one shared CPU core (see README.md for the reductions), plus lm-eval run directly on the
# same weights, data and --limit for the MMLU/ARC cross-check.
# Usage (from the repository root): bash results/2026-12-01-smollm2-135m/run.sh [OUT]
#   LCTX_DATA_DIR  data root (default ../shared/data)
#   JOB_PREFIX     command put before each job, e.g. "flock /work/heavy.lock nice -n 5" (default: none)
# Each job writes OUT/<job>/ (an lctx run directory or lm-eval output), OUT/<job>.log (with /usr/bin/time -v:
# wall time and peak RSS) and a line "job start end rc" in OUT/timings.tsv. Jobs resume: rerunning skips
# the finished samples of lctx jobs.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
OUT=${1:-$HERE/run}
P=${JOB_PREFIX:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
PG=books/pg98_a_tale_of_two_cities.txt
mkdir -p "$OUT"
C=(--data-dir "$DATA" --device cpu --no-progress --cache-dir "$OUT/cache")
stamp() { date -u +%FT%TZ; }
job() {  # job NAME lctx run options...
  local name=$1; shift; local t0; t0=$(stamp)
  $P /usr/bin/time -v lctx run --model "$G" "$@" "${C[@]}" --out "$OUT/$name" >> "$OUT/$name.log" 2>&1
  local rc=$?; printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(stamp)" "$rc" >> "$OUT/timings.tsv"
}
direct() {  # direct NAME lm_eval options...  (lm-eval's own CLI on the dequantised HF directory)
  local name=$1; shift; local t0; t0=$(stamp)
  $P /usr/bin/time -v lm_eval --model hf --model_args "pretrained=$OUT/smollm2-hf,dtype=float32" --device cpu \
    --batch_size 32 --include_path "$OUT/direct/tasks" --log_samples "$@" --output_path "$OUT/direct/out-$name" \
    >> "$OUT/direct-$name.log" 2>&1
  local rc=$?; printf '%s\t%s\t%s\t%s\n' "direct-$name" "$t0" "$(stamp)" "$rc" >> "$OUT/timings.tsv"
}
# the same weights as an HF directory (lctx's own GGUF dequantisation) and lm-eval task YAMLs reading the
# same local data files as lctx (lm-eval's YAMLs with only the data source replaced)
[ -f "$OUT/smollm2-hf/model.safetensors" ] || lctx convert gguf "$G" --out "$OUT/smollm2-hf"
[ -f "$OUT/direct/mmlu_tasks.txt" ] || python "$HERE/lmeval_direct.py" prepare --data-dir "$DATA" --work "$OUT/direct"
# passkey (chat off) + ppl on pg98 + the flatness rows derived from them; T = 8192 = max_position_embeddings
CORE=(--tasks flatness --train-length 8192 --depths 0,0.5,1 --samples 1 --ppl-data "$PG" --ppl-max-tokens 8192)
job core "${CORE[@]}" --lengths 1k,2k,4k
job arc --tasks arc_easy,arc_challenge --num-fewshot 0 --limit 100
direct arc --tasks direct_arc_easy,direct_arc_challenge --num_fewshot 0 --limit 100
job passkey-chat --tasks passkey --lengths 1k,2k,4k --depths 0,0.5,1 --samples 1 --chat-template on
job niah --tasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,niah_multiquery \
  --lengths 1k,2k --depths 0.5 --samples 1
job mmlu --tasks mmlu --num-fewshot 5 --limit 1
direct mmlu --tasks "$(cat "$OUT/direct/mmlu_tasks.txt")" --num_fewshot 5 --limit 1
job core "${CORE[@]}" --lengths 1k,2k,4k,8k
job ppl-short --tasks ppl --lengths 256,512 --ppl-data "$PG" --ppl-max-tokens 8192
job passkey-16k --tasks passkey --lengths 16k --depths 0.5 --samples 1 --allow-beyond-max
