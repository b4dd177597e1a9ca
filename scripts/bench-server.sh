#!/usr/bin/env bash
# Serving benchmark: starts `folio serve` on a free local port in the background, waits for
# /health, runs folio_server_load (bench/server/) at several client counts for a few seconds
# each, prints one table row per count and stops the server. The model is the one given, or the
# demo's default (a random-weight "tiny" Llama, q8_0), generated when missing; random weights
# mean the text is noise, so requests ask for ignore_eos and every answer is max_tokens long.
#   scripts/bench-server.sh [build dir]
# Settings (environment): FOLIO_BENCH_MODEL (a GGUF file), CLIENTS ("1 8 32"), DURATION (5 s),
# WARMUP (1 s), MAX_TOKENS (64), PROMPT_LEN (16:64 words), ENDPOINT (completions or chat),
# API_KEY (the server requires it, the clients send it), SERVE_ARGS (extra `folio serve`
# options), OUT_DIR (where JSON and the server log go).
set -euo pipefail
build=${1:-build/release}
folio="$build/apps/folio/folio"
load="$build/bench/server/folio_server_load"
model=${FOLIO_BENCH_MODEL:-$build/models/demo-tiny-q8_0.gguf}
clients=${CLIENTS:-1 8 32}
duration=${DURATION:-5}
warmup=${WARMUP:-1}
max_tokens=${MAX_TOKENS:-64}
prompt_len=${PROMPT_LEN:-16:64}
endpoint=${ENDPOINT:-completions}
out_dir=${OUT_DIR:-$build/bench-server}
read -r -a serve_args <<<"${SERVE_ARGS:-}"
key_args=()
auth_header=()
if [ -n "${API_KEY:-}" ]; then
  key_args=(--api-key "$API_KEY")
  auth_header=(-H "Authorization: Bearer $API_KEY")
fi

for binary in "$folio" "$load"; do
  if [ ! -x "$binary" ]; then
    echo "bench-server: $binary is missing; build it (cmake --build --preset release)" >&2
    exit 1
  fi
done
mkdir -p "$out_dir" "$(dirname "$model")"
if [ ! -f "$model" ]; then
  echo "bench-server: generating $model (tiny shape, q8_0, seed 1)"
  "$folio" make-model -o "$model" --preset tiny --dtype q8_0 --seed 1
fi

# Port 0: the server binds any free port and prints it ("listening on http://HOST:PORT").
log="$out_dir/serve.log"
"$folio" serve -m "$model" --host 127.0.0.1 --port 0 "${key_args[@]}" "${serve_args[@]}" \
  >"$log" 2>&1 &
server_pid=$!
stop_server() {
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT

url=""
for _ in $(seq 1 600); do  # up to 60 s: loading a large model takes a while
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "bench-server: folio serve exited during start-up; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  url=$(grep -o 'listening on http://[0-9.:]*' "$log" | head -n 1 | sed 's/listening on //' || true)
  if [ -n "$url" ] && curl -sf "${auth_header[@]}" "$url/health" >/dev/null 2>&1; then break; fi
  url=""
  sleep 0.1
done
if [ -z "$url" ]; then
  echo "bench-server: no healthy server after 60 s; its log:" >&2
  cat "$log" >&2
  exit 1
fi
echo "bench-server: $model served at $url ($endpoint, max_tokens $max_tokens, ${duration} s per row)"

results=()
for count in $clients; do
  json="$out_dir/server-load-c$count.json"
  status=0
  "$load" --url "$url" --clients "$count" --duration "$duration" --warmup "$warmup" \
    --max-tokens "$max_tokens" --prompt-len "$prompt_len" --endpoint "$endpoint" --ignore-eos "${key_args[@]}" \
    --json "$json" -q || status=$?
  if [ "$status" -ne 0 ] && [ ! -f "$json" ]; then
    echo "bench-server: folio_server_load failed at $count clients (exit $status)" >&2
    exit 1
  fi
  results+=("$json")
done

python3 - "${results[@]}" <<'PY'
import json, sys
header = (f"{'clients':>7} {'req/s':>7} {'out tok/s':>9} {'TTFT p50':>9} {'p90':>8} {'p99':>8} "
          f"{'TPOT p50':>9} {'p99':>7} {'e2e p50':>8} {'p99':>8} {'failed':>6} {'preempt':>7} "
          f"{'prefix hit':>10}")
print(header)
print("-" * len(header))
for path in sys.argv[1:]:
    r = json.load(open(path))
    deltas = r["server_counter_deltas"]
    preemptions = deltas.get("folio_engine_preemptions_total", 0)
    queried = deltas.get("folio_engine_prefix_cache_queried_blocks_total", 0)
    hits = deltas.get("folio_engine_prefix_cache_hit_blocks_total", 0)
    hit_rate = f"{100 * hits / queried:.1f}%" if queried else "-"
    t, p, e = r["ttft_ms"], r["tpot_ms"], r["e2e_ms"]
    print(f"{r['clients']:>7} {r['requests_per_second']:>7.2f} "
          f"{r['output_tokens_per_second']:>9.1f} {t['p50']:>7.1f}ms {t['p90']:>6.1f}ms "
          f"{t['p99']:>6.1f}ms {p['p50']:>7.2f}ms {p['p99']:>5.2f}ms {e['p50']:>6.0f}ms "
          f"{e['p99']:>6.0f}ms {r['requests_failed']:>6} {preemptions:>7g} {hit_rate:>10}")
    if r["first_error"]:
        print(f"        first error: {r['first_error']}")
PY
echo "bench-server: JSON per row and the server log in $out_dir"
