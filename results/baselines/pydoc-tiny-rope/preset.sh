#!/usr/bin/env bash
# The regression-gate preset of .ci/run: the bundled pydoc-tiny-rope checkpoint on passkey and sliding-window
# perplexity (held-out pydoc topics, 2048 tokens) at 256 and 512 tokens (1x and 2x its training length),
# on CPU in float32 so the numbers are deterministic. About 20 s on 2 cores.
# Usage: preset.sh OUT_DIR [more lctx run options]
set -euo pipefail
out="${1:?usage: preset.sh OUT_DIR [lctx run options]}"
shift
exec lctx run --tasks passkey,ppl --lengths 256,512 --depths 0.5 --samples 1 --seed 0 --ppl-max-tokens 2048 \
    --device cpu --dtype float32 --no-progress --out "$out" "$@"
