#!/usr/bin/env bash
# Regenerates the golden logits the end-to-end model tests compare against: makes each test
# model with `folio make-model` (deterministic: the tests make the same bytes in memory) and runs
# the independent PyTorch reference (llama_reference.py) over the prompts in prompts.json.
# Needs Debian's python3-torch (apt-get install python3-torch) and a release build.
#   tests/data/reference/regenerate.sh [build/release]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build/release}
folio="$build/apps/folio/folio"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | make-model arguments (keep in sync with kReferenceModels in tests/model/)
models=(
  "llama_f32_gqa|--preset small --dtype f32 --seed 11"
  "llama_q8_0_gqa|--preset small --dtype q8_0 --seed 12"
  "qwen2_f16_tied|--preset small --arch qwen2 --dtype f16 --tie-embeddings --seed 13"
)
for entry in "${models[@]}"; do
  name=${entry%%|*}
  arguments=${entry#*|}
  # shellcheck disable=SC2086
  "$folio" make-model -o "$work/$name.gguf" $arguments
  /usr/bin/python3 "$here/llama_reference.py" "$work/$name.gguf" "$here/prompts.json" \
    "$here/$name.json"
  echo "wrote $here/$name.json"
done
