#!/usr/bin/env bash
# Gemma 3 270M (base, Q4_K_M GGUF, 32K context) end to end: passkey 1K-32K and past the declared
# maximum, RULER, sliding-window perplexity, MMLU / ARC beside lm-eval direct, and the side-by-side report with
# SmolLM2-135M. The model comes from its pinned package: pip install 'lctx[gemma3]' (then --model gemma3-270m;
# lctx joins the package's chunks into its cache once and dequantises the GGUF once, ~1-7 min; nothing is
# downloaded at run time).
# Usage (from the repository root of a fresh clone): bash results/2026-12-02-gemma3-270m/run.sh [OUT]
#   OUT            default: a new temporary folder (printed); one inside the repository is refused unless FORCE=1,
#                  and OUT/provenance.txt records the git revision (../out_lib.sh)
#   LCTX_DATA_DIR  data root (default ../shared/data)
#   ONLY / SKIP    space-separated job names (as in timings.tsv) to run only / to leave out; two shells with
#                  disjoint ONLY lists run two lanes at once (each job writes its own run directory)
#   STOP_AT        HH:MM (UTC, today): a job still running then is stopped (lctx keeps its finished samples;
#                  rerunning resumes), later ones are skipped (default: none)
# Each job writes an lctx run directory OUT/<dir>/, OUT/<job>.log (/usr/bin/time -v: wall, CPU, peak RSS) and a
# line "job start end rc" in OUT/timings.tsv. Jobs resume: rerunning skips the finished samples.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
source "$HERE/../out_lib.sh"
out_init gemma3-270m "$@"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} LCTX_NUM_THREADS=${LCTX_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# the model by its packaged name: a one-line error naming the pip command when the package is missing
lctx plan --model gemma3-270m --length 1k > /dev/null || exit 2
C=(--model gemma3-270m --data-dir "$DATA" --device cpu --no-progress)
stamp() { date -u +%FT%TZ; }
left() {  # seconds to STOP_AT (HH:MM UTC), 0 = no limit (timeout 0 runs without one)
  if [ -z "${STOP_AT:-}" ]; then echo 0; else echo $(( $(date -u -d "$STOP_AT" +%s) - $(date -u +%s) )); fi
}
wanted() {  # wanted NAME: the job passes the ONLY / SKIP filters
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return 1; fi
  [[ " ${SKIP:-} " != *" $1 "* ]]
}
timed() {  # timed NAME CMD...: CMD under /usr/bin/time -v, stopped at STOP_AT; a line in timings.tsv
  local name=$1; shift; local t0 t rc; t0=$(stamp); t=$(left)
  wanted "$name" || return 0
  if [ -n "${STOP_AT:-}" ] && [ "$t" -lt 120 ]; then
    printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$t0" "skipped: past STOP_AT" >> "$OUT/timings.tsv"; return; fi
  timeout "$t" /usr/bin/time -v "$@" >> "$OUT/$name.log" 2>&1; rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(stamp)" "$rc" >> "$OUT/timings.tsv"
}
job() {  # DIR=run-dir job NAME lctx run options...
  local name=$1; shift
  timed "$name" lctx run "${C[@]}" "$@" --out "$OUT/${DIR:?}"
}
T=(--train-length 32768)  # the context length the GGUF declares (gemma3.context_length): the report's 1x
D5=(--depths 0,0.25,0.5,0.75,1)
# Lanes (one thread each): session 1 ran ONLY="passkey-1 beyond-1 ppl passkey-3" and ONLY="ruler-4k ruler-8k
# ruler-16k ruler-32k" in two shells, then ONLY="arc mmlu direct", then ONLY=report; session 2 resumed with
# ONLY="passkey-3 beyond-d3 beyond-3" and ONLY="ruler-32k ruler-16k-5" (STOP_AT set), then ONLY=report; without
# ONLY every job runs in turn). A run directory takes one lctx run at a time, so everything that the report's
# flatness rows read (passkey and ppl) runs in one lane, into one directory. The llama.cpp cross-check is its own
# script: python crosscheck.py OUT/crosscheck, then crosscheck.py OUT/crosscheck-explain 32768 (README).
# passkey: every cell once first, then past the declared maximum (the global layers' RoPE beyond 32K), then the
# perplexity sweep, then the second and third samples (resuming; a stop leaves every length with a score); past
# the maximum at 3 depths once (beyond-d3), then 3 samples each (beyond-3)
DIR=passkey job passkey-1 --tasks passkey "${T[@]}" "${D5[@]}" --samples 1 --lengths 1k,2k,4k,8k,16k,32k
DIR=passkey job beyond-1 --tasks passkey "${T[@]}" --depths 0.5 --samples 1 --lengths 48k,64k --allow-beyond-max
# perplexity on pg98 (A Tale of Two Cities; never used to train lctx's models; what SmolLM2's run scored): its first
# 32,768 tokens, windows 1K-32K at a stride of half the window (each token scored once, with at least half a window
# of context past the first window), in the passkey run directory so that the flatness rows come from one run
PPL=(--tasks ppl "${T[@]}" --ppl-data books/pg98_a_tale_of_two_cities.txt --ppl-max-tokens 32768 --stride 0.5)
DIR=passkey job ppl "${PPL[@]}" --lengths 1k,2k,4k,8k,16k,32k
DIR=passkey job passkey-3 --tasks passkey "${T[@]}" "${D5[@]}" --samples 3 --lengths 1k,2k,4k,8k,16k,32k
DIR=passkey job beyond-d3 --tasks passkey "${T[@]}" --depths 0,0.5,1 --samples 1 --lengths 48k,64k --allow-beyond-max
DIR=passkey job beyond-3 --tasks passkey "${T[@]}" --depths 0,0.5,1 --samples 3 --lengths 48k,64k --allow-beyond-max
# RULER (lctx's group: its 13 tasks less qa_1 / qa_2, whose SQuAD / HotpotQA files are not in the shared data),
# no chat template (a base model), 5 depths x 1 sample per task at 4K and 8K, 1 at 32K (depth 0.5); 16K first at
# depth 0.5 (ruler-16k), then after 32K at all 5 depths (ruler-16k-5 resumes it: 5 samples per task)
DIR=ruler job ruler-4k --tasks ruler "${T[@]}" "${D5[@]}" --samples 1 --lengths 4k
DIR=ruler job ruler-8k --tasks ruler "${T[@]}" "${D5[@]}" --samples 1 --lengths 8k
DIR=ruler job ruler-16k --tasks ruler "${T[@]}" --depths 0.5 --samples 1 --lengths 16k
DIR=ruler job ruler-32k --tasks ruler "${T[@]}" --depths 0.5 --samples 1 --lengths 32k
DIR=ruler job ruler-16k-5 --tasks ruler "${T[@]}" "${D5[@]}" --samples 1 --lengths 16k
# MMLU (the first question of each of the 57 subjects, 5-shot) and ARC (the first 100 test questions of each,
# 0-shot), lctx and lm-eval direct (lm-eval's own hf model on the same dequantised weights): lmeval_direct.sh
DIR=arc job arc --tasks arc_easy,arc_challenge --num-fewshot 0 --limit 100
DIR=mmlu job mmlu --tasks mmlu --num-fewshot 5 --limit 1
wanted direct && timed direct bash "$HERE/lmeval_direct.sh" "$OUT"
# the reports: Gemma 3 alone, and beside SmolLM2-135M-Instruct (its committed passkey run, 1K-16K)
R=()
for d in passkey ruler arc mmlu; do [ -f "$OUT/$d/records.jsonl" ] && R+=("$OUT/$d"); done
if [ ${#R[@]} -gt 0 ] && wanted report; then
  lctx report "${R[@]}" --out "$OUT/report" --at 4k,8k,16k,32k,64k --title "Gemma 3 270M (Q4_K_M GGUF) to 64K"
  S="$HERE/../2026-12-01-smollm2-135m/runs/passkey"
  [ -f "$OUT/passkey/records.jsonl" ] && lctx report "$S" "$OUT/passkey" --out "$OUT/report-vs-smollm2" \
    --at 1k,2k,4k,8k,16k,32k,64k --title "Where retrieval breaks: SmolLM2-135M (8K) beside Gemma 3 270M (32K)"
fi
