#!/usr/bin/env bash
# The third session's (helper real4) order of run.sh's jobs, one after the other (run.sh runs the jobs of one
# ONLY list in its own file order, so each step is its own call). Started as
#   STOP_AT=11:10 nohup flock /work/heavy2.lock nice -n 5 bash chain-real4.sh OUT
# after `STOP_AT=11:10 ONLY=direct-arc-c bash run.sh OUT` (lm-eval's side of ARC-Challenge) ran first.
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../out_lib.sh"
out_init smollm2-135m "$@"  # one OUT for every step (default a new temporary folder; see ../out_lib.sh)
for only in "arc-c" "passkey-16k-5d1" "passkey-chat-4k8k" "ppl-short" "passkey-16k-5d" "arc-e direct-arc-e" \
            "mmlu20 direct-mmlu20"; do
  ONLY="$only" bash "$HERE/run.sh" "$OUT"
done
