#!/usr/bin/env bash
# The regression-gate preset of .ci/run: what `lctx run` does with no arguments (the bundled demo pair, ALiBi and
# GGD-BAM, on passkey and held-out pydoc perplexity at 1x-8x their 128-token training length, flatness derived), on
# CPU in float32 with seed 0 so the numbers are deterministic. About 20 s on 2 cores.
# Usage: preset.sh OUT_DIR [more lctx run options]
set -euo pipefail
out="${1:?usage: preset.sh OUT_DIR [lctx run options]}"
shift
exec lctx run --seed 0 --device cpu --dtype float32 --no-progress --no-plan --out "$out" "$@"
