#!/usr/bin/env bash
# The SmolLM2-135M-Instruct evaluation (GGUF Q4_1, dequantised to float32), scaled to what one
# shared CPU core runs in a session (see README.md for what was run and what was cut), plus lm-eval run
# directly on the same weights, data and --limit for the MMLU/ARC cross-check.
# Usage (from the repository root): bash results/2026-12-01-smollm2-135m/run.sh [OUT]
#   OUT            default: a new temporary folder (printed); one inside the repository is refused unless FORCE=1,
#                  and OUT/provenance.txt records the git revision (../out_lib.sh)
#   LCTX_DATA_DIR  data root (default ../shared/data)
#   JOB_PREFIX     command put before each job, e.g. "flock /work/heavy.lock nice -n 5" (default: none)
#   STOP_AT        HH:MM (UTC): a job still running then is stopped (lctx keeps its finished samples), later
#                  ones are skipped (default: none)
#   ONLY / SKIP    space-separated job names (as in timings.tsv) to run only / to leave out
#   MMLU_SUBJECTS  how many MMLU subjects (alphabetical) the MMLU cross-check covers (default 57)
# Each job writes an lctx run directory (OUT/<job>/, or the one named by DIR=) or lm-eval output, OUT/<job>.log
# (with /usr/bin/time -v: wall time, CPU time and peak RSS) and a line "job start end rc" in OUT/timings.tsv.
# Jobs resume: rerunning skips the finished samples of lctx jobs; jobs sharing a run directory add to it.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
source "$HERE/../out_lib.sh"
out_init smollm2-135m "$@"
P=${JOB_PREFIX:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
PG=books/pg98_a_tale_of_two_cities.txt
C=(--data-dir "$DATA" --device cpu --no-progress --cache-dir "$OUT/cache")
stamp() { date -u +%FT%TZ; }
left() {  # seconds to STOP_AT (an HH:MM UTC time, optional), 0 = no limit (timeout 0 runs without one)
  if [ -z "${STOP_AT:-}" ]; then echo 0; else echo $(( $(date -u -d "$STOP_AT" +%s) - $(date -u +%s) )); fi
}
wanted() {  # wanted NAME: the job passes the ONLY / SKIP filters
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return 1; fi
  [[ " ${SKIP:-} " != *" $1 "* ]]
}
timed() {  # timed NAME CMD...: CMD under JOB_PREFIX and /usr/bin/time -v, stopped at STOP_AT; a line in timings.tsv
  local name=$1; shift; local t0 t rc; t0=$(stamp); t=$(left)
  wanted "$name" || return 0
  if [ -n "${STOP_AT:-}" ] && [ "$t" -lt 120 ]; then
    printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$t0" "skipped: past STOP_AT" >> "$OUT/timings.tsv"; return; fi
  timeout "$t" $P /usr/bin/time -v "$@" >> "$OUT/$name.log" 2>&1; rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(stamp)" "$rc" >> "$OUT/timings.tsv"
}
job() {  # [DIR=run-dir] job NAME lctx run options...  (run directory OUT/DIR, default OUT/NAME)
  local name=$1; shift
  timed "$name" lctx run --model "$G" "$@" "${C[@]}" --out "$OUT/${DIR:-$name}"
}
direct() {  # direct NAME lm_eval options...  (lm-eval's own CLI on the dequantised HF directory); lm-eval's request
  # cache (--use_cache: sqlite, OUT/direct/requests_rank0.db, one answer per request, written as each batch of
  # requests finishes) lets a stopped job resume; its key is the request text, so it holds this one model only
  local name=$1; shift
  timed "direct-$name" lm_eval --model hf --model_args "pretrained=$OUT/smollm2-hf,dtype=float32" --device cpu \
    --batch_size 32 --include_path "$OUT/direct/tasks" --log_samples --use_cache "$OUT/direct/requests" "$@" \
    --output_path "$OUT/direct/out-$name"
}
prepare_direct() {  # the same weights as an HF directory (lctx's own GGUF dequantisation) and lm-eval task YAMLs
  # reading the same local data files as lctx (lm-eval's YAMLs with only the data source replaced)
  [ -f "$OUT/smollm2-hf/model.safetensors" ] || lctx convert gguf "$G" --out "$OUT/smollm2-hf"
  [ -f "$OUT/direct/mmlu_tasks.txt" ] || python "$HERE/lmeval_direct.py" prepare --data-dir "$DATA" --work "$OUT/direct"
}
if wanted mmlu || wanted direct-arc || wanted direct-mmlu || wanted direct-arc-c || wanted direct-arc-e \
  || wanted direct-mmlu20; then prepare_direct; fi
# T = 8192 (max_position_embeddings, the only training length the checkpoint declares) is the training length
# of the report's flatness columns (ppl ratio PPL(L)/PPL(T), flat until, effective length)
T=(--train-length 8192)
D5=(--depths 0,0.25,0.5,0.75,1 --samples 2)
# The jobs in the order this session ran them (a busy 2-core machine, load 4-5, gave each ~40-50 % of a core:
# 1K 9.5 s, 2K 24 s, 4K ~70 s, 8K ~178 s per passkey sample; so the grid was cut to what fits before STOP_AT, and the
# last two jobs complete it on a rerun, resuming):
# a. passkey, chat template off, 1K-8K
job passkey --tasks passkey "${T[@]}" "${D5[@]}" --lengths 1k,2k,4k,8k
# a. 16K (past max_position_embeddings): one sample at depth 0.5 first, in the same run directory; this job's
#    /usr/bin/time -v (passkey-16k.log) is the peak RSS of a 16K sample
DIR=passkey job passkey-16k --tasks passkey "${T[@]}" --depths 0.5 --samples 1 --lengths 16k --allow-beyond-max
# b. passkey, chat template on, 1K-2K (resumes the previous session's 1K-4K x depths 0, 0.5, 1 x 1 sample run;
#    4K and 8K are in the tail below: a 4K sample took ~65 s here)
job passkey-chat --tasks passkey "${T[@]}" "${D5[@]}" --lengths 1k,2k --chat-template on
# c. ppl on pg98 (never used to train lctx's own models): its first 16384 tokens (the fewest a 16K window
#    needs), disjoint windows (--stride 1 = the whole window), in the passkey run directory so that its flatness
#    rows (PPL(L)/PPL(8K), flat until, effective length) come from one run. Windows 8K (T) and 16K (2T) first
#    (flatness needs them; ~6 and ~8 min here), the shorter windows in the tail (ppl-short)
PPL=(--tasks ppl "${T[@]}" --ppl-data "$PG" --ppl-max-tokens 16384 --stride 1)
DIR=passkey job ppl "${PPL[@]}" --lengths 8k,16k --allow-beyond-max
# d. item 6: lctx's passkey sample (prefill chunk 2048, lctx's default, and 4096 = one forward, as generate)
#    against a transformers generate loop, same prompt ids, one process, 2 repeats, each side first in turn;
#    each lctx sample timed by phase; then a cProfile of one more lctx sample
timed speed-4k python tests/tools/generate_speed.py --model "$G" --length 4k --repeats 2 --chunk-sizes 2048,4096 \
  --cache-dir "$OUT/cache" --profile "$OUT/speed-4k.prof"
# the rest of the grid (resumes): ppl at shorter windows, chat template on at 4K and 8K, 16K at 5 depths x 2
DIR=passkey job ppl-short "${PPL[@]}" --lengths 256,512,1k,2k,4k
DIR=passkey-chat job passkey-chat-4k8k --tasks passkey "${T[@]}" "${D5[@]}" --lengths 4k,8k --chat-template on
# (the third session ran the first sample at every 16K depth first, then the second samples)
DIR=passkey job passkey-16k-5d1 --tasks passkey "${T[@]}" --depths 0,0.25,0.5,0.75,1 --samples 1 --lengths 16k \
  --allow-beyond-max
DIR=passkey job passkey-16k-5d --tasks passkey "${T[@]}" "${D5[@]}" --lengths 16k --allow-beyond-max
# Third session (helper real4): the full ARC-Challenge test set, lctx and lm-eval direct, first (resuming the
# first session's arc run directory: its first 50 questions are kept; both sides resume per request)
DIR=arc job arc-c --tasks arc_challenge --num-fewshot 0
direct arc-c --tasks direct_arc_challenge --num_fewshot 0
# then the passkey and ppl remainders above (ppl-short, passkey-chat-4k8k, passkey-16k-5d), then ARC-Easy in full
# and MMLU at 20 questions per subject, 5-shot (the last two: as far as the session's time went; see README)
DIR=arc job arc-e --tasks arc_easy --num-fewshot 0
direct arc-e --tasks direct_arc_easy --num_fewshot 0
if [ -f "$OUT/direct/mmlu_tasks.txt" ]; then
  DIR=mmlu job mmlu20 --tasks mmlu --num-fewshot 5 --limit 20
  # batch 4, not 32: lm-eval keeps the logits of a whole batch (32 x 3,039 tokens x 49,152 x 4 B = 19 GB, then
  # their log-softmax), and the 32-batch job was OOM-killed at 23 GB RSS in its first (longest) batch
  # MMLU_SUBJECTS=N: the first N subjects (alphabetical) only; lm-eval's request cache keeps every answer, so a
  # later call with a larger N computes only the new subjects' questions
  direct mmlu20 --tasks "$(tr ',' '\n' < "$OUT/direct/mmlu_tasks.txt" | head -n "${MMLU_SUBJECTS:-57}" | paste -sd, -)" \
    --num_fewshot 5 --limit 20 --batch_size 4
fi
# ARC (first 50 test questions), MMLU (first question of each subject, 5-shot): lctx and lm-eval direct
job arc --tasks arc_easy,arc_challenge --num-fewshot 0 --limit 50
direct arc --tasks direct_arc_easy,direct_arc_challenge --num_fewshot 0 --limit 50
if [ -f "$OUT/direct/mmlu_tasks.txt" ]; then
  SUBJ=$(tr ',' '\n' < "$OUT/direct/mmlu_tasks.txt" | head -n "${MMLU_SUBJECTS:-57}" | paste -sd, -)
  job mmlu --tasks "${SUBJ//direct_mmlu_/mmlu_}" --num-fewshot 5 --limit 1
  direct mmlu --tasks "$SUBJ" --num_fewshot 5 --limit 1
fi
# RULER NIAH at 1K (see the RULER helper's results/2026-12-01-smollm2-ruler/ for NIAH on this model)
job niah --tasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,niah_multiquery \
  "${T[@]}" --lengths 1k --depths 0.5 --samples 1
