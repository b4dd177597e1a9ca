#include "folio/model/llama_adapter_targets.h"

#include <fmt/format.h>

namespace folio::model {

std::string_view llama_projection_name(LlamaProjection projection) {
  switch (projection) {
    case LlamaProjection::kQuery:
      return "attn_q";
    case LlamaProjection::kKey:
      return "attn_k";
    case LlamaProjection::kValue:
      return "attn_v";
    case LlamaProjection::kAttentionOutput:
      return "attn_output";
    case LlamaProjection::kGate:
      return "ffn_gate";
    case LlamaProjection::kUp:
      return "ffn_up";
    case LlamaProjection::kDown:
      return "ffn_down";
  }
  return "?";
}

int32_t llama_adapter_target_index(int64_t layer, LlamaProjection projection) {
  return static_cast<int32_t>(layer) * kLlamaProjectionsPerLayer + static_cast<int32_t>(projection);
}

std::optional<int32_t> llama_output_adapter_target_index(const LlamaShape& shape) {
  if (shape.tie_embeddings) return std::nullopt;
  return static_cast<int32_t>(shape.num_layers) * kLlamaProjectionsPerLayer;
}

std::vector<AdapterTarget> llama_adapter_targets(const LlamaShape& shape) {
  const int64_t hidden = shape.hidden_size;
  const int64_t q_width = shape.num_heads * shape.head_dim();
  const int64_t kv_width = shape.kv_dim();
  const int64_t ffn = shape.ffn_size;
  std::vector<AdapterTarget> targets;
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    auto add = [&](LlamaProjection projection, int64_t input, int64_t output) {
      targets.push_back(
          AdapterTarget{llama_adapter_target_index(layer, projection),
                        fmt::format("blk.{}.{}.weight", layer, llama_projection_name(projection)),
                        input, output});
    };
    add(LlamaProjection::kQuery, hidden, q_width);
    add(LlamaProjection::kKey, hidden, kv_width);
    add(LlamaProjection::kValue, hidden, kv_width);
    add(LlamaProjection::kAttentionOutput, q_width, hidden);
    add(LlamaProjection::kGate, hidden, ffn);
    add(LlamaProjection::kUp, hidden, ffn);
    add(LlamaProjection::kDown, ffn, hidden);
  }
  if (std::optional<int32_t> output = llama_output_adapter_target_index(shape)) {
    targets.push_back(AdapterTarget{*output, "output.weight", hidden, shape.vocab_size});
  }
  return targets;
}

std::optional<AdapterTarget> find_llama_adapter_target(const LlamaShape& shape,
                                                       std::string_view weight_name) {
  for (AdapterTarget& target : llama_adapter_targets(shape)) {
    if (target.weight_name == weight_name) return std::move(target);
  }
  return std::nullopt;
}

}  // namespace folio::model
