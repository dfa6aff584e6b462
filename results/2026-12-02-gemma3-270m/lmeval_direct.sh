#!/usr/bin/env bash
# lm-eval run directly (its own CLI and `hf` model) on the same Gemma 3 270M weights as lctx's arc / mmlu jobs:
# the packaged GGUF dequantised to float32 by `lctx convert gguf` (what `lctx run --model gemma3-270m` loads), the
# same local ARC / MMLU files read into lm-eval's own task YAMLs with only the data source replaced
# (../2026-12-01-smollm2-135m/lmeval_direct.py prepare), the same subsets (ARC: the first 100 test questions
# of each, 0-shot; MMLU: the first question of each of the 57 subjects, 5-shot), then the per-question comparison
# with lctx's run directories (lmeval_direct.py compare -> OUT/direct-compare/lmeval_crosscheck.csv).
# Usage: bash lmeval_direct.sh OUT   (run.sh's `direct` job; OUT/arc and OUT/mmlu hold lctx's runs)
# Batch sizes are small because lm-eval's hf model keeps every position's logits: 262,144 float32 per token.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
source "$HERE/../out_lib.sh"
out_init gemma3-270m-direct "${1:?usage: lmeval_direct.sh OUT}"  # refuses an OUT inside the repository; provenance
L="$HERE/../2026-12-01-smollm2-135m/lmeval_direct.py"
GG=$(python -c "from lctx.model_files import resolve_model_path; print(resolve_model_path('gemma3-270m')[0])") || exit 2
[ -f "$OUT/gemma3-hf/config.json" ] || lctx convert gguf "$GG" --out "$OUT/gemma3-hf" || exit 1
[ -f "$OUT/direct/mmlu_tasks.txt" ] || python "$L" prepare --data-dir "$DATA" --work "$OUT/direct" || exit 1
D=(lm_eval --model hf --model_args "pretrained=$OUT/gemma3-hf,dtype=float32" --device cpu
   --include_path "$OUT/direct/tasks" --log_samples --use_cache "$OUT/direct/requests")
"${D[@]}" --batch_size 8 --tasks direct_arc_easy,direct_arc_challenge --num_fewshot 0 --limit 100 \
  --output_path "$OUT/direct/out-arc" || exit 1
"${D[@]}" --batch_size 2 --tasks "$(cat "$OUT/direct/mmlu_tasks.txt")" --num_fewshot 5 --limit 1 \
  --output_path "$OUT/direct/out-mmlu" || exit 1
R=(); for d in arc mmlu; do [ -f "$OUT/$d/records.jsonl" ] && R+=("$OUT/$d"); done
if [ ${#R[@]} -eq 0 ]; then
  echo "lm-eval direct done; no lctx arc / mmlu run in $OUT to compare with (run.sh's arc and mmlu jobs)"; exit 0
fi
python "$L" compare --work "$OUT/direct" --lctx "${R[@]}" --out "$OUT/direct-compare"
