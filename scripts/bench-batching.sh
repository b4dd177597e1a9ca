#!/usr/bin/env bash
# The engine's batching table (issue 5): `folio bench` at concurrency 1, 8, 32 and 64, with graphs
# on and off, on one model; prints output tokens/s, TPOT p50, the batching gain (tokens/s at 32
# / tokens/s at 1) and graphs / eager per concurrency. Runs are interleaved (graphs, eager, graphs,
# eager, ...) and repeated, and the median is reported, so background load on a shared machine
# hits both sides alike.
#   scripts/bench-batching.sh [build dir] [model file] [repeats]
set -euo pipefail
build=${1:-build/release}
folio="$build/apps/folio/folio"
model=${2:-$build/models/bench-small-q8_0.gguf}
repeats=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ ! -f "$model" ]; then
  mkdir -p "$(dirname "$model")"
  "$folio" make-model -o "$model" --preset small --dtype q8_0 --seed 1 >/dev/null
fi
for repeat in $(seq "$repeats"); do
  for concurrency in 1 8 32 64; do
    for mode in graphs eager; do
      flags=()
      [ "$mode" = eager ] && flags+=(--no-graphs)
      "$folio" bench -m "$model" --requests 128 --concurrency "$concurrency" --prompt-len 16:64 \
        --output-len 32:32 -q "${flags[@]}" --json "$out/$mode-$concurrency-$repeat.json" \
        >/dev/null
    done
  done
done
python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def median(mode, concurrency, key, sub=None):
    values = []
    for repeat in range(1, repeats + 1):
        data = json.load(open(f"{out}/{mode}-{concurrency}-{repeat}.json"))
        values.append(data[key][sub] if sub else data[key])
    return statistics.median(values)
print(f"{'concurrency':>11} | {'graphs tok/s':>12} | {'eager tok/s':>11} | {'graphs/eager':>12} |"
      f" {'TPOT p50 graphs':>15} | {'TPOT p50 eager':>14}")
for c in (1, 8, 32, 64):
    g, e = median("graphs", c, "output_tokens_per_second"), median("eager", c, "output_tokens_per_second")
    print(f"{c:>11} | {g:>12.0f} | {e:>11.0f} | {g / e:>12.2f} | "
          f"{median('graphs', c, 'tpot_ms', 'p50'):>12.2f} ms | {median('eager', c, 'tpot_ms', 'p50'):>11.2f} ms")
for mode in ("graphs", "eager"):
    gain = median(mode, 32, "output_tokens_per_second") / median(mode, 1, "output_tokens_per_second")
    print(f"batching gain ({mode}): tokens/s at 32 / at 1 = {gain:.2f}")
PY
