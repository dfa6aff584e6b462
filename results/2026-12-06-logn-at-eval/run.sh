#!/usr/bin/env bash
# SSMax at evaluation time (RULES.md, written before the run): the bundled demo pair as shipped and with
# --position logn, passkey at 1x-32x. No ../shared needed. From the repository root:
#     bash results/2026-12-06-logn-at-eval/run.sh [OUT_DIR]     # default: a new temporary folder, printed
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../out_lib.sh"
out_init logn-at-eval "$@"
CK="$HERE/../../models/checkpoints"
START=$(date +%s)
lctx run -m "$CK/pydoc-passkey-alibi" -m "$CK/pydoc-passkey-ggd_bam" --position shipped --position logn \
  --tasks passkey --relative 1,2,4,8,16,32 --depths 0,0.25,0.5,0.75,1 --samples 8 --seed 7 --no-progress \
  --out "$OUT/run" > "$OUT/run.log" 2>&1
echo "wall $(( $(date +%s) - START )) s" | tee "$OUT/time.txt"
mkdir -p "$PUB"
python "$HERE/tables.py" "$OUT/run" > "$PUB/tables.md"
cp "$OUT/time.txt" "$OUT/provenance.txt" "$OUT/run/summary.csv" "$OUT/run/run.json" "$PUB/"
