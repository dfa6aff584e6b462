#!/usr/bin/env bash
# The server backend's measurements: lctx through a real llama.cpp server (llama-cpp-python 0.3.36's,
# portable CPU build) against lctx's in-process run of the same GGUF, per cell; lctx's overhead per sample at 2K; and
# --concurrency over two servers. Needs `pip install -e '.[server]'` (see .ci/run for the CMAKE_ARGS used here).
# Usage (from the repository root): bash results/2026-12-02-server-backend/run.sh [OUT]
#   OUT            default: a new temporary folder (printed); one inside the repository is refused unless FORCE=1,
#                  and OUT/provenance.txt records the git revision (../out_lib.sh)
#   LCTX_DATA_DIR  data root (default ../shared/data)
# Writes OUT/crosscheck.csv, OUT/overhead.csv, OUT/concurrency.csv and the run directories behind them, then the
# tables (tables.md) into OUT/results (FORCE=1: into this folder).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../out_lib.sh"
out_init server-backend "$@"
export LCTX_DATA_DIR=${LCTX_DATA_DIR:-$(cd ../shared/data && pwd)}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
/usr/bin/time -v python "$HERE/crosscheck.py" "$OUT" > "$OUT/crosscheck.log" 2>&1
mkdir -p "$PUB"
cp "$OUT"/crosscheck.csv "$OUT"/overhead.csv "$OUT"/concurrency.csv "$PUB"/
python "$HERE/make_tables.py" "$PUB" > "$PUB/tables.md"
echo "wrote $PUB/tables.md"
