#!/bin/bash
# Why did 1-6% of requests fail on llama-server at >= 21 req/s in bench/tune.py --backend llamacpp? vLLM's benchmark
# client against llama-server (tiny GGUF, --parallel 8, -c 16384, -ub 512, -t 1) at 30 and 45 req/s: its defaults,
# --threads-http 64, and the client sending Connection: close; twice each, in turns. Needs the exports of
# scripts/setup-real-servers.sh. Results: bench/results/2026-11-29-0744-llama-keepalive.md.  bash bench/llama_keepalive.sh
: "${TUNER_LLAMA_SERVER:?}" "${TUNER_TINY_GGUF:?}" "${TUNER_VLLM_PYTHON:?}" "${TUNER_TINY_MODEL:?}"
OUT=${OUT:-/tmp/llama-keepalive}; mkdir -p $OUT
CLIENT='import argparse, sys
from vllm.benchmarks.serve import add_cli_args, main
p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))'
run() {  # name, extra server args..., -- client extra args
  name=$1; shift
  srv=(); while [ "$1" != "--" ]; do srv+=("$1"); shift; done; shift
  $TUNER_LLAMA_SERVER -m $TUNER_TINY_GGUF -c 16384 --parallel 8 -ub 512 -t 1 --host 127.0.0.1 --port 18999 --metrics "${srv[@]}" > $OUT/$name.server.log 2>&1 &
  pid=$!
  for i in $(seq 60); do curl -sf http://127.0.0.1:18999/health >/dev/null && break; sleep 1; done
  for rate in 30 45; do
    $TUNER_VLLM_PYTHON -c "$CLIENT" --backend openai --base-url http://127.0.0.1:18999 --endpoint /v1/completions \
      --model tiny --tokenizer $TUNER_TINY_MODEL --dataset-name random --random-input-len 43 --random-output-len 19 --random-range-ratio 0.5 \
      --num-prompts $((rate*20)) --request-rate $rate --burstiness 0.55 --ignore-eos --seed 1 --num-warmups 2 --disable-tqdm \
      --save-result --save-detailed --result-dir $OUT --result-filename $name-$rate.json --ready-check-timeout-sec 0 "$@" > $OUT/$name-$rate.client.log 2>&1
    python3 -c "
import json,collections;d=json.load(open('$OUT/$name-$rate.json'))
errs=[e for e in d.get('errors',[]) if e]
print('$name', $rate, 'completed', d.get('completed'), 'of', d.get('num_prompts'), 'failed', len(errs), collections.Counter(e.strip().splitlines()[-1][:80] for e in errs).most_common(3), 'req/s', round(d.get('request_throughput',0),1))"
  done
  grep -m1 -i "threads_http\|n_threads_http\|http threads" $OUT/$name.server.log
  kill $pid; wait $pid 2>/dev/null
}
for rep in 1 2; do
run default --
run threads64 --threads-http 64 --
run close -- --header Connection=close
done
