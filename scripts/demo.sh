#!/usr/bin/env bash
# The main job (`make demo`): generates the default model (a deterministic random-weight
# Llama of the "tiny" benchmark shape, q8_0 weights, a 32,000-token vocabulary), shows what is
# in it, generates text from a prompt through the engine, and runs an offline load benchmark
# with graphs on and off. A random-weight model prints noise: the demo shows the machinery
# (memory pool, paged KV cache, captured graphs, continuous batching), not language.
#   scripts/demo.sh [build dir]
set -euo pipefail
build=${1:-build/release}
folio="$build/apps/folio/folio"
model=${FOLIO_DEMO_MODEL:-$build/models/demo-tiny-q8_0.gguf}
mkdir -p "$(dirname "$model")"

section() { printf '\n== %s\n' "$1"; }

if [ ! -f "$model" ]; then
  section "folio make-model (the embedded default: tiny shape, q8_0, seed 1)"
  "$folio" make-model -o "$model" --preset tiny --dtype q8_0 --seed 1
fi

section "folio inspect --summary"
"$folio" inspect "$model" --summary | head -n 20

section "folio generate (greedy, 32 tokens)"
"$folio" generate -m "$model" -p "Once upon a time" -n 32 --temperature 0

section "folio bench: 64 requests, concurrency 16, graphs on"
"$folio" bench -m "$model" --requests 64 --concurrency 16 --prompt-len 16:96 --output-len 16:48 \
  --shared-prefix 32 -q --json "$build/bench-graphs.json"

section "folio bench: the same load, graphs off (every step eager)"
"$folio" bench -m "$model" --requests 64 --concurrency 16 --prompt-len 16:96 --output-len 16:48 \
  --shared-prefix 32 -q --no-graphs --json "$build/bench-eager.json"

section "summary"
python3 - "$build/bench-graphs.json" "$build/bench-eager.json" <<'PY' 2>/dev/null || true
import json, sys
graphs, eager = (json.load(open(path)) for path in sys.argv[1:3])
print(f"output tokens/s: graphs {graphs['output_tokens_per_second']:.0f}, "
      f"eager {eager['output_tokens_per_second']:.0f} "
      f"(ratio {graphs['output_tokens_per_second'] / eager['output_tokens_per_second']:.2f})")
print(f"TPOT p50: graphs {graphs['tpot_ms']['p50']:.2f} ms, eager {eager['tpot_ms']['p50']:.2f} ms")
print(f"prefix hit rate {100 * graphs['prefix_hit_rate']:.1f}%, graph hit rate "
      f"{100 * graphs['graph_hit_rate']:.1f}%, padding {100 * graphs['padding_ratio']:.1f}%")
PY
