#!/usr/bin/env bash
# Regenerates the golden logits the end-to-end model tests compare against: makes each test
# model with `folio make-model` (deterministic: the tests make the same bytes in memory) and runs
# the independent PyTorch reference (llama_reference.py) over the prompts in prompts.json; then
# the same for those models with LoRA adapters made by `folio make-adapter` (the `adapters`
# table below).
# Needs Debian's python3-torch (apt-get install python3-torch) and a release build.
#   tests/data/reference/regenerate.sh [build/release [GOLDEN NAME...]]
# With names, only those goldens are written (each LoRA golden also needs its base's name).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build/release}
shift || true
wanted=("$@")
# Whether golden $1 is to be written: every one without names, else the named ones.
want() {
  [[ ${#wanted[@]} -eq 0 ]] && return 0
  local name
  for name in "${wanted[@]}"; do [[ $name == "$1" ]] && return 0; done
  return 1
}
folio="$build/apps/folio/folio"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | make-model arguments (keep in sync with kReferenceModels in tests/model/)
models=(
  "llama_f32_gqa|--preset small --dtype f32 --seed 11"
  "llama_q8_0_gqa|--preset small --dtype q8_0 --seed 12"
  "qwen2_f16_tied|--preset small --arch qwen2 --dtype f16 --tie-embeddings --seed 13"
  "llama_mixed_dtypes|--preset small --dtype f32 --seed 14 --tensor-dtype token_embd.weight=q8_0 --tensor-dtype output.weight=q8_0 --tensor-dtype blk.*.attn_v.weight=f16 --tensor-dtype blk.0.ffn_down.weight=q4_0 --tensor-dtype blk.1.attn_q.weight=bf16"
  "llama_head_dim_32|--preset small --dtype f16 --seed 15 --head-dim 32"
  "llama_rope_linear|--preset small --seed 16 --rope-scaling linear --rope-scaling-factor 4"
  "llama_rope_llama3|--preset small --seed 17 --rope-scaling llama3 --rope-scaling-factor 8 --rope-original-context 64"
  "qwen2_rope_yarn|--preset small --arch qwen2 --seed 18 --rope-scaling yarn --rope-scaling-factor 4 --rope-original-context 64"
  "llama_rope_freqs|--preset small --seed 19 --rope-freqs --rope-scaling linear --rope-scaling-factor 2"
  "qwen3_f16_head_dim_32|--preset small --arch qwen3 --dtype f16 --head-dim 32 --seed 20"
  "llama_sliding_window_6|--preset small --seed 21 --sliding-window 6"
  "phi3_f16|--preset small --arch phi3 --dtype f16 --seed 22"
  "gemma2_f16|--preset small --arch gemma2 --dtype f16 --head-dim 32 --sliding-window 6 --attn-soft-cap 2 --final-soft-cap 4 --seed 23"
  "gemma3_f16|--preset small --arch gemma3 --dtype f16 --head-dim 32 --layers 6 --sliding-window 6 --rope-scaling linear --rope-scaling-factor 8 --seed 24"
)
for entry in "${models[@]}"; do
  name=${entry%%|*}
  arguments=${entry#*|}
  want "$name" || continue
  # shellcheck disable=SC2086
  "$folio" make-model -o "$work/$name.gguf" $arguments
  /usr/bin/python3 "$here/llama_reference.py" "$work/$name.gguf" "$here/prompts.json" \
    "$here/$name.json"
  echo "wrote $here/$name.json"
done

# LoRA goldens, lora_<base>_<adapter>.json: a base model of the table above with an adapter made
# by `folio make-adapter -m <base>.gguf` (deterministic: lora::make_random_adapter_writer with
# the same options makes the same bytes in memory) and applied at a user scale. Each JSON has the
# base goldens' layout plus "adapter", "adapter_fnv1a64" and "adapter_scale". The C++ test that
# runs the engine with these adapters mirrors this table.
#   golden name | base (a name above) | make-adapter arguments | user scale
# Scales (user scale * alpha / rank, alpha defaulting to the rank): 1, 0.5, 0.5, 1, 1 (alpha 0:
# the user scale), 0.5. q8_0 adapters have rank 32 so that lora_b's rows (rank values) are whole
# q8_0 blocks too; two adapters include the LM head (output), one only some projections. Each
# adapted projection moves by about a quarter of its size (adapter_writer.h); the logits move by
# 0.4 to 0.75 of their RMS, far beyond every tolerance of the base goldens' tests.
adapters=(
  "lora_llama_f32_gqa_f16|llama_f32_gqa|--rank 16 --dtype f16 --targets q,k,v,o,gate,up,down,output --seed 21|1.0"
  "lora_llama_f32_gqa_q8_0|llama_f32_gqa|--rank 32 --dtype q8_0 --alpha 16 --seed 22|1.0"
  "lora_qwen2_f16_tied_f16|qwen2_f16_tied|--rank 8 --dtype f16 --seed 23|0.5"
  "lora_qwen2_f16_tied_q8_0|qwen2_f16_tied|--rank 32 --dtype q8_0 --seed 24|1.0"
  "lora_llama_q8_0_gqa_f16|llama_q8_0_gqa|--rank 8 --dtype f16 --targets q,v,down --alpha 0 --seed 25|1.0"
  "lora_llama_q8_0_gqa_q8_0|llama_q8_0_gqa|--rank 32 --dtype q8_0 --targets q,k,v,o,gate,up,down,output --seed 26|0.5"
)
for entry in "${adapters[@]}"; do
  IFS='|' read -r name base arguments scale <<<"$entry"
  want "$name" || continue
  # shellcheck disable=SC2086
  "$folio" make-adapter -m "$work/$base.gguf" -o "$work/$name.gguf" $arguments
  /usr/bin/python3 "$here/llama_reference.py" "$work/$base.gguf" "$here/prompts.json" \
    "$here/$name.json" --lora "$work/$name.gguf:$scale"
  echo "wrote $here/$name.json"
done
