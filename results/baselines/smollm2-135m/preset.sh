#!/usr/bin/env bash
# The real-model regression gate: SmolLM2-135M-Instruct (Q4_1 GGUF from the shared data) on passkey at 1K and
# 2K tokens, needle depths 0 and 0.5, one sample each, CPU, float32 (deterministic). The first run on a
# machine dequantises the GGUF into the lctx cache (about 40 s of CPU); later runs load it in seconds.
# Usage: preset.sh OUT_DIR [more lctx run options]; the GGUF is found under $LCTX_DATA_DIR (or ../shared/data).
set -euo pipefail
out="${1:?usage: preset.sh OUT_DIR [lctx run options]}"
shift
data="${LCTX_DATA_DIR:-$(dirname "$0")/../../../../shared/data}"
exec lctx run -m "$data/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" --tasks passkey \
    --lengths 1k,2k --depths 0,0.5 --samples 1 --seed 0 --device cpu --dtype float32 --no-progress --out "$out" "$@"
