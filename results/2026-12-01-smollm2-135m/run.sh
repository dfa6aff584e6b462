#!/usr/bin/env bash
# The SmolLM2-135M-Instruct evaluation of issue 11 (GGUF Q4_1, dequantised to float32), scaled down to fit
# about an hour of one shared CPU core (see README.md for the reductions), plus lm-eval run directly on the
# same weights, data and --limit for the MMLU/ARC cross-check.
# Usage (from the repository root): bash results/2026-12-01-smollm2-135m/run.sh [OUT]
#   LCTX_DATA_DIR  data root (default ../shared/data)
#   JOB_PREFIX     command put before each job, e.g. "flock /work/heavy.lock nice -n 5" (default: none)
#   STOP_AT        HH:MM (UTC): a job still running then is stopped (lctx keeps its finished samples), later
#                  ones are skipped (default: none)
#   ONLY / SKIP    space-separated job names (as in timings.tsv) to run only / to leave out
#   MMLU_SUBJECTS  how many MMLU subjects (alphabetical) the MMLU cross-check covers (default 57)
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
left() {  # seconds to STOP_AT (an HH:MM UTC time, optional), 0 = no limit (timeout 0 runs without one)
  if [ -z "${STOP_AT:-}" ]; then echo 0; else echo $(( $(date -u -d "$STOP_AT" +%s) - $(date -u +%s) )); fi
}
timed() {  # timed NAME CMD...: CMD under JOB_PREFIX and /usr/bin/time -v, stopped at STOP_AT; a line in timings.tsv
  local name=$1; shift; local t0 t rc; t0=$(stamp); t=$(left)
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  if [[ " ${SKIP:-} " == *" $name "* ]]; then return; fi
  if [ -n "${STOP_AT:-}" ] && [ "$t" -lt 120 ]; then
    printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$t0" "skipped: past STOP_AT" >> "$OUT/timings.tsv"; return; fi
  timeout "$t" $P /usr/bin/time -v "$@" >> "$OUT/$name.log" 2>&1; rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(stamp)" "$rc" >> "$OUT/timings.tsv"
}
job() {  # job NAME lctx run options...
  local name=$1; shift
  timed "$name" lctx run --model "$G" "$@" "${C[@]}" --out "$OUT/$name"
}
direct() {  # direct NAME lm_eval options...  (lm-eval's own CLI on the dequantised HF directory)
  local name=$1; shift
  timed "direct-$name" lm_eval --model hf --model_args "pretrained=$OUT/smollm2-hf,dtype=float32" --device cpu \
    --batch_size 32 --include_path "$OUT/direct/tasks" --log_samples "$@" --output_path "$OUT/direct/out-$name"
}
# the same weights as an HF directory (lctx's own GGUF dequantisation) and lm-eval task YAMLs reading the
# same local data files as lctx (lm-eval's YAMLs with only the data source replaced)
[ -f "$OUT/smollm2-hf/model.safetensors" ] || lctx convert gguf "$G" --out "$OUT/smollm2-hf"
[ -f "$OUT/direct/mmlu_tasks.txt" ] || python "$HERE/lmeval_direct.py" prepare --data-dir "$DATA" --work "$OUT/direct"
# T = 8192 (max_position_embeddings) is the training length the report's flatness columns use
T=(--train-length 8192)
PK=(--tasks passkey "${T[@]}" --depths 0,0.5,1 --samples 1)
PPL=(--tasks ppl "${T[@]}" --ppl-data "$PG" --ppl-max-tokens 8192 --stride 1)  # first 8192 tokens, disjoint windows
job passkey "${PK[@]}" --lengths 1k,2k,4k
job arc --tasks arc_easy,arc_challenge --num-fewshot 0 --limit 50
direct arc --tasks direct_arc_easy,direct_arc_challenge --num_fewshot 0 --limit 50
job passkey-chat "${PK[@]}" --lengths 1k,2k,4k --chat-template on
# item 6: lctx's passkey sample against a transformers generate loop, same prompt, one process
timed speed-4k python -m lctx.harness.generate_speed --model "$G" --length 4k --repeats 1 --cache-dir "$OUT/cache"
job niah --tasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,niah_multiquery \
  "${T[@]}" --lengths 1k --depths 0.5 --samples 1
job ppl "${PPL[@]}" --lengths 256,512,1k,2k,4k
# MMLU: the first question of each of the first MMLU_SUBJECTS subjects (alphabetical; default all 57), 5-shot
SUBJ=$(tr ',' '\n' < "$OUT/direct/mmlu_tasks.txt" | head -n "${MMLU_SUBJECTS:-57}" | paste -sd, -)
job mmlu --tasks "${SUBJ//direct_mmlu_/mmlu_}" --num-fewshot 5 --limit 1
direct mmlu --tasks "$SUBJ" --num_fewshot 5 --limit 1
job passkey "${PK[@]}" --lengths 1k,2k,4k,8k
job ppl "${PPL[@]}" --lengths 256,512,1k,2k,4k,8k
# past max_position_embeddings; the job's peak RSS (/usr/bin/time -v in passkey-16k.log) is the 16K figure
job passkey-16k --tasks passkey "${T[@]}" --lengths 16k --depths 0.5 --samples 1 --allow-beyond-max
