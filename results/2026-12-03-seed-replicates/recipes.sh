# The training recipes, evaluations and the per-model job of the seed replicates, shared by their run.sh and by
# later experiments that add models to the same recipes (results/2026-12-06-cheap-claims). Source it after
# seeds_lib.sh (it uses MODEL_ARGS, RETRIEVAL_ARGS, HELDOUT, train_model, eval_model); do not run it.
# seed 000's recipe (results/2026-12-01-seed000-bam/run.sh): 3000 steps, every window starts with a passkey document
BAM_TRAIN=("${MODEL_ARGS[@]}" --steps "${STEPS:-3000}" "${RETRIEVAL_ARGS[@]}")
# seeds 002 / 004 (plain book text, 1200 steps); seed 003's new mix: half the windows start with a passkey document
PLAIN_TRAIN=("${MODEL_ARGS[@]}" --steps "${STEPS:-1200}" --eval-every 200)
LSH_TRAIN=("${MODEL_ARGS[@]}" --steps "${STEPS:-2000}" --retrieval-fraction 0.5 --retrieval passkey --eval-every 100)
# evaluations: bam to 64x (8192 tokens), 5 depths x 4 samples = 20 prompts per length; id as seed 002; rot as seed
# 004 but with 8 seeded ppl windows per length (whole held-out book), so every ratio has an interval
BAM_EVAL=(--task flatness --relative 1,2,4,8,16,32,64 --depths 0,0.25,0.5,0.75,1 --samples 4 --ppl-data "$HELDOUT"
          --ppl-max-tokens 16384 --attn-impl fast)
ID_EVAL=(--task flatness --relative 1,2,3.5,4,8 --task-option flatness.retrieval=none --ppl-data "$HELDOUT"
         --ppl-max-tokens 16384 --attn-impl fast)
ROT_EVAL=(--task flatness --relative 1,2,4,8,16,128 --task-option flatness.retrieval=none --ppl-data "$HELDOUT"
          --ppl-max-tokens 0 --task-option ppl.windows=8 --attn-impl fast)
LSH_EVAL=(--tasks ppl,passkey --lengths 128,512 --depths 0,0.25,0.5,0.75,1 --samples 4 --ppl-data "$HELDOUT"
          --ppl-max-tokens 8192)

job() {  # job NAME VARIANT TRAIN_ARRAY EVAL_ARRAY SEED [lctx train --option ...]: train, evaluate, read the prior
  local n="$1" v="$2" s="$5"; local -n tr="$3" ev="$4"; shift 5
  TRAIN_ARGS=("${tr[@]}")
  # a failure is recorded and the other models go on (a failed job must not stop the queue: `par`'s wait -n)
  train_model "$n" "$v" --seed "$s" "$@" || { echo "$n: training failed (logs/train_$n.log)" >> "$OUT/failed.txt"; return 0; }
  eval_model "$n" "${ev[@]}" || { echo "$n: evaluation failed (logs/run_$n.log)" >> "$OUT/failed.txt"; return 0; }
  if [ "$v" = ggd_bam ] && [ ! -f "$OUT/diag/$n/prior_params.csv" ]; then
    lctx diagnose prior -m "$OUT/ckpt/$n" --out "$OUT/diag/$n" > "$OUT/logs/prior_$n.log" \
      || echo "$n: lctx diagnose prior failed (logs/prior_$n.log)" >> "$OUT/failed.txt"
  fi
}

