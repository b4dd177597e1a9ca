#!/usr/bin/env bash
# The main job (`make demo`): takes the shipped demo model (models/demo/kjv-q8_0.gguf: a
# 5-million-parameter Llama trained on the King James Bible, see models/README.md), shows what
# is in it, generates text from a prompt through the engine, shows the shipped LoRA adapters
# (models/lora/) on one prompt and on held-out text, quantizes the f16 model to Q4_K_M (a
# different block type per tensor, as downloaded files have) and scores it on the same held-out
# text, and runs an offline load benchmark with graphs on and off, and one larger than its KV
# cache with memory pressure handling on and off; between them a folio worker's handshake, and
# the model split over two local worker processes (pipeline parallelism) giving one process's
# text, losing workers, and workers without the model file fetching their shards into a weight
# cache once (a cold start fetches them, a warm one nothing). FOLIO_DEMO_MODEL picks another GGUF file (the prompt stays).
#   scripts/demo.sh [build dir]
set -euo pipefail
build=${1:-build/release}
folio="$build/apps/folio/folio"
model=${FOLIO_DEMO_MODEL:-models/demo/kjv-q8_0.gguf}

section() { printf '\n== %s\n' "$1"; }

if [ ! -f "$model" ]; then
  echo "demo: $model is missing (the shipped model lives in models/demo/; see models/README.md)" >&2
  exit 1
fi

section "folio inspect --summary"
"$folio" inspect "$model" --summary | head -n 20

section "folio generate (greedy, 32 tokens)"
"$folio" generate -m "$model" -p "And God said" -n 32 --temperature 0

section "folio generate (sampled: temperature 0.8, top-p 0.95, seed 7, 48 tokens)"
"$folio" generate -m "$model" -p "In the beginning" -n 48 --temperature 0.8 --top-p 0.95 --seed 7

section "folio perplexity on the held-out chapters (text the model never saw)"
"$folio" perplexity -m "$model" -f models/kjv-heldout.txt -q --json "$build/perplexity.json"

section "LoRA adapters: the same prompt on the base and three fine-tunes (Psalms, Proverbs, Gospels)"
loras=(--lora psalms=models/lora/kjv-psalms-f16.gguf --lora proverbs=models/lora/kjv-proverbs-f16.gguf
  --lora gospels=models/lora/kjv-gospels-f16.gguf)
for adapter in base psalms proverbs gospels; do
  printf '[%s] ' "$adapter"
  "$folio" generate -m "$model" "${loras[@]}" --adapter "$adapter" -p "And he said" -n 24 \
    --temperature 0 -q 2>/dev/null
done

section "LoRA: held-out perplexity of the Proverbs adapter on Proverbs it never saw, and of the base"
"$folio" perplexity -m "$model" "${loras[@]}" --adapter proverbs -f models/lora/kjv-proverbs-heldout.txt \
  -c 256 --stride 128 -q --json "$build/perplexity-proverbs.json"
"$folio" perplexity -m "$model" -f models/lora/kjv-proverbs-heldout.txt -c 256 --stride 128 -q \
  --json "$build/perplexity-proverbs-base.json"

section "folio quantize: the f16 model to Q4_K_M (q4_K, q6_K for the LM head and some layers' attn_v / ffn_down)"
f16_model=models/demo/kjv-f16.gguf
"$folio" quantize "$f16_model" "$build/kjv-q4_k_m.gguf" --type Q4_K_M
"$folio" generate -m "$build/kjv-q4_k_m.gguf" -p "And God said" -n 32 --temperature 0
"$folio" perplexity -m "$build/kjv-q4_k_m.gguf" -f models/kjv-heldout.txt -q \
  --json "$build/perplexity-q4_k_m.json"

section "folio serve: structured output, echo + logprobs scoring, n = 3 choices on shared KV"
serve_log="$build/serve-demo.log"
"$folio" serve -m "$model" --model-name kjv --port 0 -q 2>"$serve_log" &
serve_pid=$!
trap 'kill "$serve_pid" 2>/dev/null || true' EXIT
python3 - "$serve_log" <<'PY'
import json, re, sys, time, urllib.request
log = sys.argv[1]
for _ in range(300):
    match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
    if match:
        break
    time.sleep(0.1)
base = f"http://127.0.0.1:{match.group(1)}"
def post(path, body):
    request = urllib.request.Request(base + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=120))
model = "kjv"
# The demo model knows no JSON; the grammar's mask makes every answer fit the schema anyway.
schema = {"type": "object", "properties": {
    "book": {"enum": ["Genesis", "Exodus", "Psalms", "Proverbs"]}, "chapter": {"type": "integer"}},
    "required": ["book", "chapter"], "additionalProperties": False}
answer = post("/v1/chat/completions", {"model": model, "max_tokens": 200, "temperature": 0,
    "messages": [{"role": "user", "content": "Quote a verse."}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "verse", "strict": True,
                                                               "schema": schema}}})
content = answer["choices"][0]["message"]["content"]
print(f"json_schema answer (finish_reason {answer['choices'][0]['finish_reason']}), parsed: "
      f"{json.loads(content)}")
text = "In the beginning God created the heaven and the earth."
answer = post("/v1/completions", {"model": model, "prompt": text, "echo": True, "logprobs": 1,
                                  "max_tokens": 0})
logprobs = answer["choices"][0]["logprobs"]["token_logprobs"][1:]
print(f"echo + logprobs: log-likelihood of {text!r} = {sum(logprobs):.3f} over {len(logprobs)} "
      f"tokens (what lm-evaluation-harness sends)")
answer = post("/v1/completions", {"model": model, "prompt": "And God said", "n": 3,
                                  "max_tokens": 12, "temperature": 0.9, "seed": 1})
for choice in answer["choices"]:
    print(f"n=3 choice {choice['index']}: {choice['text']!r}")
PY
kill "$serve_pid"
wait "$serve_pid" || true
trap - EXIT

section "folio worker + workers-check: the gRPC control plane (handshake, model hash, latency)"
worker_log="$build/worker-demo.log"
"$folio" worker --listen 127.0.0.1:0 -m "$model" 2>"$worker_log" &
worker_pid=$!
trap 'kill "$worker_pid" 2>/dev/null || true' EXIT
worker_address=""
for _ in $(seq 1 300); do
  worker_address=$(sed -n 's/^folio worker: listening on \([^ ]*\).*/\1/p' "$worker_log")
  [ -n "$worker_address" ] && break
  sleep 0.1
done
"$folio" workers-check --workers "$worker_address" -m "$model" || true
kill "$worker_pid"
wait "$worker_pid" || true
trap - EXIT

section "pipeline parallelism: folio plan, then the greedy text over 2 local worker processes"
"$folio" plan -m "$model" --workers 2
one_process=$("$folio" generate -m "$model" -p "And God said" -n 24 --temperature 0 -q 2>/dev/null)
pipelined=$("$folio" generate -m "$model" -p "And God said" -n 24 --temperature 0 -q \
  --local-workers 2 2>/dev/null)
printf '[one process] %s\n[2 workers  ] %s\n' "$one_process" "$pipelined"
if [ "$one_process" = "$pipelined" ]; then echo "same text"; else echo "texts differ" >&2; exit 1; fi

section "losing a worker: the same text while a local worker is SIGKILLed every 6 steps, 3 times"
recovery_log="$build/recovery-demo.log"
recovered=$("$folio" generate -m "$model" -p "And God said" -n 24 --temperature 0 \
  --local-workers 2 --kill-local-worker-every 6 --kill-rounds 3 2>"$recovery_log")
grep -E "replacing it with|recovered from a lost worker" "$recovery_log" || true
printf '[one process    ] %s\n[3 workers lost ] %s\n' "$one_process" "$recovered"
if [ "$one_process" = "$recovered" ]; then echo "same text"; else echo "texts differ" >&2; exit 1; fi

section "the weight cache: local workers without the model file, a cold start then a warm one"
weight_cache="$build/demo-weight-cache"
rm -rf "$weight_cache"
for start in cold warm; do
  cache_log="$build/weight-cache-$start.log"
  cached=$("$folio" generate -m "$model" -p "And God said" -n 24 --temperature 0 -q \
    --local-workers 2 --local-worker-cache "$weight_cache" 2>"$cache_log")
  fetched=$(sed -n 's/.*fetched \([0-9]*\) weight bytes.*/\1/p' "$cache_log" |
    awk '{ total += $1 } END { print total + 0 }')
  printf '[%s start] workers fetched %s weight bytes: %s\n' "$start" "$fetched" "$cached"
  if [ "$one_process" != "$cached" ]; then echo "texts differ" >&2; exit 1; fi
done
echo "same text"

section "KV-parallel group: 2 local workers hold 16 positions each, so neither holds the context"
"$folio" plan -m "$model" --workers 2 --kv-parallel 2 --kv-tokens-per-member 16 | head -4
kv_parallel=$("$folio" generate -m "$model" -p "And God said" -n 24 --temperature 0 -q \
  --local-workers 2 --kv-parallel 2 --kv-tokens-per-member 16 2>/dev/null)
printf '[one process ] %s\n[2 KV members] %s\n' "$one_process" "$kv_parallel"
if [ "$one_process" = "$kv_parallel" ]; then echo "same text"; else echo "texts differ" >&2; exit 1; fi

section "folio bench: 64 requests, concurrency 16, graphs on"
"$folio" bench -m "$model" --requests 64 --concurrency 16 --prompt-len 16:96 --output-len 16:48 \
  --shared-prefix 32 -q --json "$build/bench-graphs.json"

section "folio bench: the same load, graphs off (every step eager)"
"$folio" bench -m "$model" --requests 64 --concurrency 16 --prompt-len 16:96 --output-len 16:48 \
  --shared-prefix 32 -q --no-graphs --json "$build/bench-eager.json"

section "memory pressure: 128 requests at once into a 2 MiB KV cache, with swap, handling on then off"
for handling in on off; do
  flag=(); [ "$handling" = off ] && flag=(--no-pressure-handling)
  "$folio" bench -m "$model" --requests 128 --concurrency 64 --kv-cache-mib 2 --output-len 64:128 \
    --swap-mib 64 --preemption cheaper -q "${flag[@]}" --json "$build/bench-pressure-$handling.json" |
    grep -E "throughput|first error|TTFT|TPOT|preemptions|by cost|pressure"
done

section "summary"
python3 - "$build/bench-graphs.json" "$build/bench-eager.json" "$build/perplexity.json" \
  models/kjv.json <<'PY' 2>/dev/null || true
import json, sys
graphs, eager, perplexity, card = (json.load(open(path)) for path in sys.argv[1:5])
print(f"held-out perplexity {perplexity['perplexity']:.3f} over {perplexity['scored_tokens']} tokens; "
      f"PyTorch measured {card['perplexity']['q8_0_weights_float32']:.3f} for these q8_0 weights "
      f"at training time")
quantized = json.load(open(f"{sys.argv[1].rsplit('/', 1)[0]}/perplexity-q4_k_m.json"))
print(f"held-out perplexity of the Q4_K_M quantization: {quantized['perplexity']:.3f} "
      f"(q8_0 above: {perplexity['perplexity']:.3f})")
print(f"output tokens/s: graphs {graphs['output_tokens_per_second']:.0f}, "
      f"eager {eager['output_tokens_per_second']:.0f} "
      f"(ratio {graphs['output_tokens_per_second'] / eager['output_tokens_per_second']:.2f})")
print(f"TPOT p50: graphs {graphs['tpot_ms']['p50']:.2f} ms, eager {eager['tpot_ms']['p50']:.2f} ms")
adapted, base = (json.load(open(f"{sys.argv[1].rsplit('/', 1)[0]}/{name}.json"))
                 for name in ("perplexity-proverbs", "perplexity-proverbs-base"))
print(f"Proverbs held-out perplexity: adapter {adapted['perplexity']:.3f}, base "
      f"{base['perplexity']:.3f}")
on, off = (json.load(open(f"{sys.argv[1].rsplit('/', 1)[0]}/bench-pressure-{name}.json"))
           for name in ("on", "off"))
print(f"under memory pressure: output tokens/s with handling / without "
      f"{on['output_tokens_per_second'] / off['output_tokens_per_second']:.2f}, p99 TPOT "
      f"{on['tpot_ms']['p99']:.2f} / {off['tpot_ms']['p99']:.2f} ms, errors {on['errors']} / "
      f"{off['errors']}")
print(f"prefix hit rate {100 * graphs['prefix_hit_rate']:.1f}%, graph hit rate "
      f"{100 * graphs['graph_hit_rate']:.1f}%, padding {100 * graphs['padding_ratio']:.1f}%")
PY
