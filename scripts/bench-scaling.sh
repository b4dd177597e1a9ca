#!/usr/bin/env bash
# Batched decode scaling (issue 19): `folio bench` at concurrency 1, 2, 4, 8, 16, 32 and 64 on one
# model, short prompts and enough output tokens that decode dominates, one `--json` report per
# point; then the machine's peak (bench/kernels/peak_bench: f32 FMA and int8 dot-product
# throughput on 1 and 2 threads) once. scripts/plot-bench.py OUT_DIR plots tokens/s against
# concurrency and the fraction of the peak each point reaches.
#
#   scripts/bench-scaling.sh MODEL.gguf [OUT_DIR]
#
# OUT_DIR (default: bench-scaling-<model name> in the current directory) gets
#   c<N>-r<R>.json    folio bench --json at concurrency N, repeat R
#   profile-c<N>.json the same with --profile at the lowest and highest concurrency, when folio
#                     bench has --profile (apart from the timed points, which it would slow)
#   peak.json         peak_bench --benchmark_format=json
#   model.txt         the model's absolute path (plot-bench.py reads its parameter count)
# Environment: BUILD (build/release), THREADS (folio's default: all cores), REPEATS (1),
# PROMPT_LEN (8), OUTPUT_LEN (64), CONCURRENCY ("1 2 4 8 16 32 64"), and FOLIO_BENCH_ARGS, extra
# flags for every folio bench run. Each point runs max(N, 4) requests, so every point is one or
# a few waves of equal-length requests and lasts seconds. The read-bandwidth roofline, where
# folio bench measures it, is measured at concurrency 1 only.
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -ge 1 ] && exit 0
  exit 2
fi
model=$1
if [ ! -f "$model" ]; then
  echo "bench-scaling: no model file $model (make one with: folio make-model -o $model --preset base --dtype q8_0)" >&2
  exit 2
fi
out=${2:-bench-scaling-$(basename "$model" .gguf)}
build=${BUILD:-build/release}
folio="$build/apps/folio/folio"
peak_bench="$build/bench/kernels/peak_bench"
for binary in "$folio" "$peak_bench"; do
  if [ ! -x "$binary" ]; then
    echo "bench-scaling: $binary is missing; build it: cmake --build --preset release --target $(basename "$binary")" >&2
    exit 2
  fi
done
repeats=${REPEATS:-1}
prompt_len=${PROMPT_LEN:-8}
output_len=${OUTPUT_LEN:-64}
concurrencies=${CONCURRENCY:-1 2 4 8 16 32 64}
read -r -a extra <<<"${FOLIO_BENCH_ARGS:-}"
[ -n "${THREADS:-}" ] && extra+=(--threads "$THREADS")

help=$("$folio" bench --help)
mkdir -p "$out"
realpath "$model" >"$out/model.txt"

run_point() {  # concurrency json-file [flags...]
  local concurrency=$1 json=$2
  shift 2
  local requests=$((concurrency > 4 ? concurrency : 4))
  # The read-bandwidth roofline is a batch-1 figure: measured at concurrency 1 only.
  local roofline=()
  if [ "$concurrency" -gt 1 ] && grep -q -- '--bandwidth-buffer-mib' <<<"$help"; then
    roofline=(--bandwidth-buffer-mib 0)
  fi
  "$folio" bench -m "$model" --requests "$requests" --concurrency "$concurrency" \
    --max-seqs "$((concurrency > 64 ? concurrency : 64))" \
    --prompt-len "$prompt_len:$prompt_len" --output-len "$output_len:$output_len" --seed 1 -q \
    "${roofline[@]}" "${extra[@]}" "$@" --json "$json" >/dev/null
}

printf '%11s | %8s | %13s | %12s\n' concurrency repeat "output tok/s" "TPOT p50 ms"
# Repeats outermost, so background load drifting over the minutes hits every point alike.
for repeat in $(seq "$repeats"); do
  for concurrency in $concurrencies; do
    json="$out/c$concurrency-r$repeat.json"
    run_point "$concurrency" "$json"
    python3 - "$json" "$repeat" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{d['concurrency']:>11} | {sys.argv[2]:>8} | {d['output_tokens_per_second']:>13.1f} |"
      f" {d['tpot_ms']['p50']:>12.2f}")
PY
  done
done

if grep -q -- '--profile' <<<"$help"; then
  read -r -a points <<<"$concurrencies"
  for concurrency in "${points[0]}" "${points[-1]}"; do
    run_point "$concurrency" "$out/profile-c$concurrency.json" --profile
  done
  echo "bench-scaling: profiles at concurrency ${points[0]} and ${points[-1]} in $out/profile-c*.json"
fi

# Repetitions: plot-bench.py takes the best, the peak being what the units can deliver.
"$peak_bench" --benchmark_repetitions=3 --benchmark_format=json >"$out/peak.json"
echo "bench-scaling: reports in $out; plot with: scripts/plot-bench.py $out"
