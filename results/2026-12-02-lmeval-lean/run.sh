#!/usr/bin/env bash
# SmolLM2-135M-Instruct 5-shot MMLU at lm-eval batch 32 through lctx's continuation-only lm-eval
# model (peak RSS), and lm-eval run directly (its `hf` model) on the same dequantised weights, data and questions
# (per-question answers and log-likelihoods). See README.md.
# Usage (from the repository root): bash results/2026-12-02-lmeval-lean/run.sh [OUT]
#   OUT            default: a new temporary folder (printed); one inside the repository is refused unless FORCE=1
#   LCTX_DATA_DIR  data root (default ../shared/data)
#   PY, LCTX, LM_EVAL   the python, lctx and lm_eval commands (default: python, lctx, lm_eval on PATH)
#   ONLY           space-separated job names to run only (lean, direct, compare)
# Each job appends `/usr/bin/time -v` (wall time, CPU time, peak RSS) to OUT/<job>.log.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
source "$HERE/../out_lib.sh"
out_init lmeval-lean "$@"
PY=${PY:-python} LCTX=${LCTX:-lctx} LM_EVAL=${LM_EVAL:-lm_eval}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
SUBJECTS=(high_school_european_history abstract_algebra anatomy)  # the longest 5-shot prompts (3,000+ tokens), two short
LIMIT=32  # questions per subject: high_school_european_history's 32 rows are one lm-eval batch of 32
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
timed() { local name=$1; shift; wanted "$name" || return 0
  { echo "# $(date -u +%FT%TZ) load: $(cat /proc/loadavg)"; echo "# $*"; } >> "$OUT/$name.log"
  /usr/bin/time -v "$@" >> "$OUT/$name.log" 2>&1
  echo "# $(date -u +%FT%TZ) rc $? load: $(cat /proc/loadavg)" >> "$OUT/$name.log"; }

# lctx: lm-eval as the engine, LctxHFLM computing logits at the continuation only, batch 32 asked explicitly
timed lean $LCTX run --model "$G" --tasks "$(printf 'mmlu_%s,' "${SUBJECTS[@]}" | sed 's/,$//')" --num-fewshot 5 \
  --limit $LIMIT --batch-size 32 --dtype float32 --device cpu --no-progress --data-dir "$DATA" --out "$OUT/lean"

# lm-eval direct: its own `hf` model on the folder lctx dequantised the GGUF into (the same float32 weights), its own
# task YAMLs with only the data source replaced (results/2026-12-01-smollm2-135m/lmeval_direct.py prepare); batch 4:
# its full logits at 32 would be 32 x 3,094 x 49,152 x 4 B x 2 copies = 39 GB
if wanted direct; then
  HF=$($PY -c "from lctx.models.adapters.gguf import cached_gguf_dir; print(cached_gguf_dir('$G', 'float32')[0])")
  echo "$HF" > "$OUT/hf_dir.txt"
  $PY "$HERE/../2026-12-01-smollm2-135m/lmeval_direct.py" prepare --data-dir "$DATA" --work "$OUT/direct"
fi
timed direct $LM_EVAL --model hf --model_args "pretrained=$(cat "$OUT/hf_dir.txt" 2>/dev/null),dtype=float32" \
  --device cpu --batch_size 4 --include_path "$OUT/direct/tasks" \
  --tasks "$(printf 'direct_mmlu_%s,' "${SUBJECTS[@]}" | sed 's/,$//')" --num_fewshot 5 --limit $LIMIT \
  --log_samples --output_path "$OUT/direct/out"

# per question and per choice: lctx's records and request cache (full-precision log-likelihoods) against lm-eval's
wanted compare && $PY "$HERE/compare.py" --lctx "$OUT/lean" --direct "$OUT/direct/out" --out "$PUB"
