// The projections of a Llama-family model a LoRA adapter may update, each with a fixed index:
// the row of the adapter table (kernels/lora.h) that a step graph's lora op for that projection
// reads. Per layer, in this order: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up,
// ffn_down (index = layer * kLlamaProjectionsPerLayer + projection); then the LM head
// (output.weight) when the model has one (untied). The token embedding is not a target: it is a
// row gather, not a projection.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "folio/model/llama_model_file.h"

namespace folio::model {

enum class LlamaProjection : uint8_t { kQuery, kKey, kValue, kAttentionOutput, kGate, kUp, kDown };
inline constexpr int32_t kLlamaProjectionsPerLayer = 7;

// "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down".
std::string_view llama_projection_name(LlamaProjection projection);

struct AdapterTarget {
  int32_t index = 0;
  std::string weight_name;      // the base weight's GGUF name, e.g. "blk.3.attn_q.weight"
  int64_t input_features = 0;   // K: the base matrix's row length
  int64_t output_features = 0;  // N: the base matrix's rows
};

// Every target of `shape`, in index order.
std::vector<AdapterTarget> llama_adapter_targets(const LlamaShape& shape);
int32_t llama_adapter_target_index(int64_t layer, LlamaProjection projection);
// The LM head's index, or nullopt when the output is tied to the embedding.
std::optional<int32_t> llama_output_adapter_target_index(const LlamaShape& shape);
// The target whose base weight is `weight_name`, or nullopt.
std::optional<AdapterTarget> find_llama_adapter_target(const LlamaShape& shape,
                                                       std::string_view weight_name);

}  // namespace folio::model
