#include "llama_like_test_graph.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "folio/ir/builder.h"

namespace folio::ir::testing {
namespace {

struct StepInputs {
  TensorId token_ids, positions, slot_mapping, logit_indices;
  AttentionMetadata attention;
};

Result<StepInputs> declare_inputs(GraphBuilder& builder, const LlamaLikeConfig& config) {
  StepInputs inputs;
  const int64_t tokens = config.num_tokens;
  const int64_t sequences = config.num_sequences;
  FOLIO_ASSIGN_OR_RETURN(inputs.token_ids, builder.input("token_ids", DType::kI32, {tokens}));
  FOLIO_ASSIGN_OR_RETURN(inputs.positions, builder.input("positions", DType::kI32, {tokens}));
  FOLIO_ASSIGN_OR_RETURN(inputs.slot_mapping, builder.input("slot_mapping", DType::kI32, {tokens}));
  FOLIO_ASSIGN_OR_RETURN(inputs.attention.seq_lens,
                         builder.input("seq_lens", DType::kI32, {sequences}));
  FOLIO_ASSIGN_OR_RETURN(inputs.attention.query_start,
                         builder.input("query_start", DType::kI32, {sequences + 1}));
  FOLIO_ASSIGN_OR_RETURN(
      inputs.attention.block_tables,
      builder.input("block_tables", DType::kI32, {sequences, config.max_blocks_per_sequence}));
  FOLIO_ASSIGN_OR_RETURN(inputs.logit_indices,
                         builder.input("logit_indices", DType::kI32, {config.num_logit_rows}));
  return inputs;
}

// Q, K or V projection with the optional bias.
Result<TensorId> projection(GraphBuilder& builder, const LlamaLikeConfig& config, TensorId x,
                            const std::string& prefix, const char* which, int64_t out_features) {
  FOLIO_ASSIGN_OR_RETURN(TensorId weight,
                         builder.weight(fmt::format("{}.attn_{}.weight", prefix, which),
                                        config.weight_dtype, {out_features, config.hidden}));
  const std::string name = fmt::format("{}.{}", prefix, which);
  if (!config.qkv_bias) return builder.matmul(x, weight, name);
  FOLIO_ASSIGN_OR_RETURN(
      TensorId bias,
      builder.weight(fmt::format("{}.attn_{}.bias", prefix, which), DType::kF32, {out_features}));
  return builder.matmul(x, weight, bias, name);
}

Result<TensorId> attention_block(GraphBuilder& builder, const LlamaLikeConfig& config,
                                 const StepInputs& inputs, TensorId hidden,
                                 const std::string& prefix) {
  const int64_t q_width = config.num_heads * config.head_dim;
  const int64_t kv_width = config.num_kv_heads * config.head_dim;
  FOLIO_ASSIGN_OR_RETURN(TensorId norm_weight, builder.weight(prefix + ".attn_norm.weight",
                                                              DType::kF32, {config.hidden}));
  FOLIO_ASSIGN_OR_RETURN(TensorId normed, builder.rms_norm(hidden, norm_weight, config.epsilon,
                                                           prefix + ".attn_norm"));
  FOLIO_ASSIGN_OR_RETURN(TensorId q, projection(builder, config, normed, prefix, "q", q_width));
  FOLIO_ASSIGN_OR_RETURN(TensorId k, projection(builder, config, normed, prefix, "k", kv_width));
  FOLIO_ASSIGN_OR_RETURN(TensorId v, projection(builder, config, normed, prefix, "v", kv_width));
  RopeAttributes rope{config.num_heads,  config.head_dim,   config.head_dim,
                      config.rope_theta, config.rope_style, {}};
  FOLIO_ASSIGN_OR_RETURN(TensorId q_rope,
                         builder.rope(q, inputs.positions, rope, prefix + ".q_rope"));
  rope.num_heads = config.num_kv_heads;
  FOLIO_ASSIGN_OR_RETURN(TensorId k_rope,
                         builder.rope(k, inputs.positions, rope, prefix + ".k_rope"));
  const Shape cache_shape{config.num_blocks, config.block_size, config.num_kv_heads,
                          config.head_dim};
  FOLIO_ASSIGN_OR_RETURN(TensorId k_cache,
                         builder.kv_cache(prefix + ".k_cache", config.kv_dtype, cache_shape));
  FOLIO_ASSIGN_OR_RETURN(TensorId v_cache,
                         builder.kv_cache(prefix + ".v_cache", config.kv_dtype, cache_shape));
  FOLIO_RETURN_IF_ERROR(builder.kv_cache_write(k_rope, v, inputs.slot_mapping, k_cache, v_cache,
                                               prefix + ".kv_write"));
  const AttentionAttributes attention{config.num_heads, config.num_kv_heads, config.head_dim,
                                      1.0f / std::sqrt(static_cast<float>(config.head_dim))};
  FOLIO_ASSIGN_OR_RETURN(TensorId attended,
                         builder.paged_attention(q_rope, k_cache, v_cache, inputs.attention,
                                                 attention, prefix + ".attention"));
  FOLIO_ASSIGN_OR_RETURN(TensorId out_weight,
                         builder.weight(prefix + ".attn_output.weight", config.weight_dtype,
                                        {config.hidden, q_width}));
  FOLIO_ASSIGN_OR_RETURN(TensorId projected,
                         builder.matmul(attended, out_weight, prefix + ".attn_output"));
  return builder.add(hidden, projected, prefix + ".attn_residual");
}

Result<TensorId> feed_forward_block(GraphBuilder& builder, const LlamaLikeConfig& config,
                                    TensorId hidden, const std::string& prefix) {
  FOLIO_ASSIGN_OR_RETURN(TensorId norm_weight,
                         builder.weight(prefix + ".ffn_norm.weight", DType::kF32, {config.hidden}));
  FOLIO_ASSIGN_OR_RETURN(
      TensorId normed, builder.rms_norm(hidden, norm_weight, config.epsilon, prefix + ".ffn_norm"));
  FOLIO_ASSIGN_OR_RETURN(TensorId gate_weight,
                         builder.weight(prefix + ".ffn_gate.weight", config.weight_dtype,
                                        {config.ffn, config.hidden}));
  FOLIO_ASSIGN_OR_RETURN(
      TensorId up_weight,
      builder.weight(prefix + ".ffn_up.weight", config.weight_dtype, {config.ffn, config.hidden}));
  FOLIO_ASSIGN_OR_RETURN(TensorId down_weight,
                         builder.weight(prefix + ".ffn_down.weight", config.weight_dtype,
                                        {config.hidden, config.ffn}));
  FOLIO_ASSIGN_OR_RETURN(TensorId gate, builder.matmul(normed, gate_weight, prefix + ".ffn_gate"));
  FOLIO_ASSIGN_OR_RETURN(TensorId up, builder.matmul(normed, up_weight, prefix + ".ffn_up"));
  FOLIO_ASSIGN_OR_RETURN(TensorId activated, builder.swiglu(gate, up, prefix + ".ffn_swiglu"));
  FOLIO_ASSIGN_OR_RETURN(TensorId down,
                         builder.matmul(activated, down_weight, prefix + ".ffn_down"));
  return builder.add(hidden, down, prefix + ".ffn_residual");
}

}  // namespace

Result<Graph> build_llama_like_test_graph(const LlamaLikeConfig& config) {
  GraphBuilder builder(config.phase);
  FOLIO_ASSIGN_OR_RETURN(StepInputs inputs, declare_inputs(builder, config));
  FOLIO_ASSIGN_OR_RETURN(TensorId table, builder.weight("token_embd.weight", config.weight_dtype,
                                                        {config.vocab, config.hidden}));
  FOLIO_ASSIGN_OR_RETURN(TensorId hidden, builder.embedding(inputs.token_ids, table, "embed"));
  for (int64_t layer = 0; layer < config.num_layers; ++layer) {
    builder.set_layer(static_cast<int32_t>(layer));
    const std::string prefix = fmt::format("blk.{}", layer);
    FOLIO_ASSIGN_OR_RETURN(hidden, attention_block(builder, config, inputs, hidden, prefix));
    FOLIO_ASSIGN_OR_RETURN(hidden, feed_forward_block(builder, config, hidden, prefix));
  }
  builder.set_layer(-1);
  FOLIO_ASSIGN_OR_RETURN(TensorId norm_weight,
                         builder.weight("output_norm.weight", DType::kF32, {config.hidden}));
  FOLIO_ASSIGN_OR_RETURN(TensorId normed,
                         builder.rms_norm(hidden, norm_weight, config.epsilon, "output_norm"));
  FOLIO_ASSIGN_OR_RETURN(TensorId rows,
                         builder.gather_rows(normed, inputs.logit_indices, "logit_rows"));
  FOLIO_ASSIGN_OR_RETURN(TensorId head, builder.weight("output.weight", config.weight_dtype,
                                                       {config.vocab, config.hidden}));
  FOLIO_ASSIGN_OR_RETURN(TensorId logits, builder.matmul(rows, head, "logits"));
  FOLIO_RETURN_IF_ERROR(builder.mark_output(logits));
  return builder.finish();
}

namespace {

// Emits random ops over a pool of activations. Draws come straight from mt19937_64 (whose output
// the standard fixes), so a seed gives the same graph with every standard library.
class RandomGraphEmitter {
 public:
  RandomGraphEmitter(uint64_t seed, const RandomGraphOptions& options)
      : options_(options), random_(seed), builder_(Phase::kMixed) {}

  Result<Graph> build() {
    FOLIO_RETURN_IF_ERROR(declare_inputs());
    while (builder_.graph().num_ops() < options_.num_ops) {
      if (draw(100) < static_cast<uint64_t>(options_.attention_percent)) {
        FOLIO_RETURN_IF_ERROR(emit_attention());
      } else {
        FOLIO_RETURN_IF_ERROR(emit_other());
      }
    }
    FOLIO_RETURN_IF_ERROR(builder_.mark_output(activations_.back()));
    return builder_.finish();
  }

 private:
  static constexpr int64_t kHeads = 2, kKvHeads = 1, kHeadDim = 16;

  uint64_t draw(uint64_t bound) { return random_() % bound; }
  std::string next_name(const char* what) { return fmt::format("{}{}", what, counter_++); }

  Status declare_inputs() {
    const int64_t tokens = options_.num_tokens;
    FOLIO_ASSIGN_OR_RETURN(ids_, builder_.input("token_ids", DType::kI32, {tokens}));
    FOLIO_ASSIGN_OR_RETURN(positions_, builder_.input("positions", DType::kI32, {tokens}));
    FOLIO_ASSIGN_OR_RETURN(slots_, builder_.input("slot_mapping", DType::kI32, {tokens}));
    FOLIO_ASSIGN_OR_RETURN(half_rows_, builder_.input("rows", DType::kI32, {tokens / 2 + 1}));
    FOLIO_ASSIGN_OR_RETURN(metadata_.seq_lens, builder_.input("seq_lens", DType::kI32, {2}));
    FOLIO_ASSIGN_OR_RETURN(metadata_.query_start, builder_.input("query_start", DType::kI32, {3}));
    FOLIO_ASSIGN_OR_RETURN(metadata_.block_tables,
                           builder_.input("block_tables", DType::kI32, {2, 3}));
    FOLIO_ASSIGN_OR_RETURN(TensorId table, builder_.weight("table", DType::kF32, {50, 32}));
    FOLIO_ASSIGN_OR_RETURN(TensorId first, builder_.embedding(ids_, table, "embed"));
    activations_.push_back(first);
    return Status();
  }

  // Mostly one of the latest few activations (short lifetimes), sometimes any (long ones).
  TensorId pick() {
    const uint64_t count = activations_.size();
    if (draw(4) == 0) return activations_[draw(count)];
    return activations_[count - 1 - draw(std::min<uint64_t>(count, 4))];
  }
  const Shape& shape_of(TensorId id) const { return builder_.graph().tensor(id).shape; }
  bool has_token_rows(TensorId id) const { return shape_of(id)[0] == options_.num_tokens; }

  Result<TensorId> project(TensorId x, int64_t width) {
    FOLIO_ASSIGN_OR_RETURN(TensorId weight,
                           builder_.weight(next_name("w"), DType::kF32, {width, shape_of(x)[1]}));
    return builder_.matmul(x, weight, next_name("matmul"));
  }

  // A [T, *] activation: a picked one if it has T rows, else the embedding (always [T, 32]).
  TensorId pick_token_rows() {
    const TensorId picked = pick();
    return has_token_rows(picked) ? picked : activations_.front();
  }

  Status emit_attention() {
    const TensorId source = pick_token_rows();
    FOLIO_ASSIGN_OR_RETURN(TensorId q, project(source, kHeads * kHeadDim));
    FOLIO_ASSIGN_OR_RETURN(TensorId k, project(pick_token_rows(), kKvHeads * kHeadDim));
    FOLIO_ASSIGN_OR_RETURN(TensorId v, project(pick_token_rows(), kKvHeads * kHeadDim));
    const RopeAttributes rope{kHeads, kHeadDim, kHeadDim, 10000.0f, kernels::RopeStyle::kNeox, {}};
    FOLIO_ASSIGN_OR_RETURN(TensorId q_rope, builder_.rope(q, positions_, rope, next_name("rope")));
    const Shape cache{4, 8, kKvHeads, kHeadDim};
    FOLIO_ASSIGN_OR_RETURN(TensorId k_cache,
                           builder_.kv_cache(next_name("k_cache"), DType::kF32, cache));
    FOLIO_ASSIGN_OR_RETURN(TensorId v_cache,
                           builder_.kv_cache(next_name("v_cache"), DType::kF32, cache));
    FOLIO_RETURN_IF_ERROR(
        builder_.kv_cache_write(k, v, slots_, k_cache, v_cache, next_name("write")));
    const AttentionAttributes attributes{kHeads, kKvHeads, kHeadDim, 0.25f};
    FOLIO_ASSIGN_OR_RETURN(TensorId out,
                           builder_.paged_attention(q_rope, k_cache, v_cache, metadata_, attributes,
                                                    next_name("attention")));
    activations_.insert(activations_.end(), {q, k, v, q_rope, out});
    return Status();
  }

  // A partner with the same shape as `a` among the activations, or `a` itself.
  TensorId same_shape_as(TensorId a) {
    std::vector<TensorId> partners;
    for (TensorId id : activations_) {
      if (shape_of(id) == shape_of(a)) partners.push_back(id);
    }
    return partners[draw(partners.size())];
  }

  Status emit_other() {
    const TensorId a = pick();
    TensorId out;
    switch (draw(7)) {
      case 0: {
        FOLIO_ASSIGN_OR_RETURN(out, builder_.silu(a, next_name("silu")));
        break;
      }
      case 1: {
        FOLIO_ASSIGN_OR_RETURN(out, builder_.add(a, same_shape_as(a), next_name("add")));
        break;
      }
      case 2: {
        FOLIO_ASSIGN_OR_RETURN(out, builder_.mul(a, same_shape_as(a), next_name("mul")));
        break;
      }
      case 3: {
        FOLIO_ASSIGN_OR_RETURN(out, builder_.swiglu(a, same_shape_as(a), next_name("swiglu")));
        break;
      }
      case 4: {
        FOLIO_ASSIGN_OR_RETURN(TensorId weight,
                               builder_.weight(next_name("norm_w"), DType::kF32, {shape_of(a)[1]}));
        FOLIO_ASSIGN_OR_RETURN(out, builder_.rms_norm(a, weight, 1e-6f, next_name("norm")));
        break;
      }
      case 5: {
        FOLIO_ASSIGN_OR_RETURN(
            out, builder_.gather_rows(pick_token_rows(), half_rows_, next_name("gather")));
        break;
      }
      default: {
        constexpr int64_t kWidths[] = {16, 32, 48, 96, 160};
        FOLIO_ASSIGN_OR_RETURN(out, project(a, kWidths[draw(5)]));
        break;
      }
    }
    activations_.push_back(out);
    return Status();
  }

  RandomGraphOptions options_;
  std::mt19937_64 random_;
  GraphBuilder builder_;
  TensorId ids_, positions_, slots_, half_rows_;
  AttentionMetadata metadata_;
  std::vector<TensorId> activations_;
  int counter_ = 0;
};

}  // namespace

Result<Graph> build_random_test_graph(uint64_t seed, const RandomGraphOptions& options) {
  if (options.num_ops < 1 || options.num_tokens < 2) {
    return invalid_argument("random graph needs num_ops >= 1 and num_tokens >= 2");
  }
  RandomGraphEmitter emitter(seed, options);
  return emitter.build();
}

}  // namespace folio::ir::testing
