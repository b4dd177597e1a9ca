#include "folio/model/llama_graph.h"

#include <cmath>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "folio/ir/builder.h"
#include "folio/model/llama_adapter_targets.h"
#include "folio/model/llama_attention_metadata.h"

namespace folio::model {
namespace {

using ir::GraphBuilder;
using ir::TensorId;

struct StepInputs {
  std::optional<TensorId> token_ids;      // the first stage only
  std::optional<TensorId> hidden;         // every stage but the first: the residual stream
  std::optional<TensorId> logit_indices;  // the last stage only
  TensorId positions, slot_mapping;
  std::optional<TensorId> token_adapter_slots;  // graphs with adapters only
  std::optional<TensorId> logit_adapter_slots;  // graphs with adapters, last stage only
  ir::AttentionMetadata attention;
};

// The layer range of a stage and where it sits in the model.
struct StageRange {
  int64_t first_layer = 0;
  int64_t end_layer = 0;
  bool first = true;  // starts at layer 0: embeds token ids
  bool last = true;   // ends at the last layer: emits logits
};

StageRange stage_range(const LlamaShape& model, const LlamaGraphOptions& options) {
  const int64_t end = options.end_layer.value_or(model.num_layers);
  return StageRange{options.first_layer, end, options.first_layer == 0, end == model.num_layers};
}

Result<StepInputs> declare_inputs(GraphBuilder& builder, const LlamaShape& model,
                                  const ir::StepShape& step, const ir::KvCacheShape& kv_cache,
                                  const StageRange& stage, bool adapters) {
  StepInputs inputs;
  const int64_t tokens = step.num_tokens;
  const int64_t sequences = step.num_sequence_slots;
  auto input = [&](std::string_view name, ir::Shape shape) {
    return builder.input(std::string(name), DType::kI32, std::move(shape));
  };
  if (stage.first) {
    FOLIO_ASSIGN_OR_RETURN(inputs.token_ids, input(ir::kInputTokenIds, {tokens}));
  } else {
    FOLIO_ASSIGN_OR_RETURN(inputs.hidden, builder.input(std::string(ir::kInputHidden), DType::kF32,
                                                        {tokens, model.hidden_size}));
  }
  FOLIO_ASSIGN_OR_RETURN(inputs.positions, input(ir::kInputPositions, {tokens}));
  FOLIO_ASSIGN_OR_RETURN(inputs.slot_mapping, input(ir::kInputSlotMapping, {tokens}));
  FOLIO_ASSIGN_OR_RETURN(inputs.attention.seq_lens, input(ir::kInputSeqLens, {sequences}));
  FOLIO_ASSIGN_OR_RETURN(inputs.attention.query_start,
                         input(ir::kInputQueryStart, {sequences + 1}));
  FOLIO_ASSIGN_OR_RETURN(
      inputs.attention.block_tables,
      input(ir::kInputBlockTables, {sequences, kv_cache.max_blocks_per_sequence}));
  if (stage.last) {
    FOLIO_ASSIGN_OR_RETURN(inputs.logit_indices,
                           input(ir::kInputLogitIndices, {step.num_logit_rows}));
  }
  if (adapters) {
    FOLIO_ASSIGN_OR_RETURN(inputs.token_adapter_slots,
                           input(ir::kInputTokenAdapterSlots, {tokens}));
    if (stage.last) {
      FOLIO_ASSIGN_OR_RETURN(inputs.logit_adapter_slots,
                             input(ir::kInputLogitAdapterSlots, {step.num_logit_rows}));
    }
  }
  return inputs;
}

class LlamaEmitter {
 public:
  LlamaEmitter(const LlamaShape& model, const ir::StepShape& step, const ir::KvCacheShape& kv_cache,
               const LlamaGraphOptions& options)
      : model_(model),
        step_(step),
        kv_cache_(kv_cache),
        options_(options),
        stage_(stage_range(model, options)),
        split_(options.tensor_split),
        num_heads_(split_.part(model.num_heads)),
        num_kv_heads_(split_.part(model.num_kv_heads)),
        ffn_size_(split_.part(model.ffn_size)),
        builder_(step.ir_phase()) {}

  Result<ir::Graph> emit() {
    FOLIO_ASSIGN_OR_RETURN(
        inputs_, declare_inputs(builder_, model_, step_, kv_cache_, stage_, options_.adapters));
    std::optional<TensorId> table;
    TensorId hidden;
    if (stage_.first) {
      FOLIO_ASSIGN_OR_RETURN(table, token_embedding());
      FOLIO_ASSIGN_OR_RETURN(hidden, builder_.embedding(*inputs_.token_ids, *table, "embed"));
      if (llama_is_gemma(model_.architecture)) {
        FOLIO_ASSIGN_OR_RETURN(
            hidden, builder_.scale(hidden, std::sqrt(static_cast<float>(model_.hidden_size)),
                                   "embed_scale"));
      }
    } else {
      hidden = *inputs_.hidden;
    }
    if (model_.rope_frequency_factors) {
      FOLIO_ASSIGN_OR_RETURN(
          rope_frequency_factors_,
          builder_.weight("rope_freqs.weight", DType::kF32, {model_.head_dim() / 2}));
    }
    for (int64_t layer = stage_.first_layer; layer < stage_.end_layer; ++layer) {
      builder_.set_layer(static_cast<int32_t>(layer));
      FOLIO_ASSIGN_OR_RETURN(hidden, attention_block(layer, hidden));
      // A stage that hands on the residual stream names its last add ir::kOutputHidden.
      const bool hands_on = !stage_.last && layer + 1 == stage_.end_layer;
      FOLIO_ASSIGN_OR_RETURN(
          hidden, feed_forward_block(
                      layer, hidden,
                      hands_on ? std::optional<std::string>(ir::kOutputHidden) : std::nullopt));
    }
    builder_.set_layer(-1);
    if (!stage_.last) {
      FOLIO_RETURN_IF_ERROR(builder_.mark_output(hidden));
      return builder_.finish();
    }
    FOLIO_ASSIGN_OR_RETURN(TensorId normed, norm(hidden, "output_norm"));
    FOLIO_ASSIGN_OR_RETURN(TensorId rows,
                           builder_.gather_rows(normed, *inputs_.logit_indices, "logit_rows"));
    TensorId head;
    if (model_.tie_embeddings) {
      if (!table) {
        FOLIO_ASSIGN_OR_RETURN(table, token_embedding());
      }
      head = *table;
    } else {
      FOLIO_ASSIGN_OR_RETURN(head,
                             builder_.weight("output.weight", model_.matrix_dtype("output.weight"),
                                             {model_.vocab_size, model_.hidden_size}));
    }
    const std::optional<int32_t> head_target = llama_output_adapter_target_index(model_);
    const bool adapted_head = inputs_.token_adapter_slots.has_value() && head_target.has_value();
    const bool capped = model_.final_logit_soft_cap > 0;
    // The last op of the head produces the output, named ir::kOutputLogits.
    const std::string logits_name(ir::kOutputLogits);
    FOLIO_ASSIGN_OR_RETURN(
        TensorId logits,
        builder_.matmul(rows, head, adapted_head || capped ? "output" : logits_name));
    if (adapted_head) {
      FOLIO_ASSIGN_OR_RETURN(logits,
                             builder_.lora(rows, logits, *inputs_.logit_adapter_slots, *head_target,
                                           capped ? "output.lora" : logits_name));
    }
    if (capped) {
      FOLIO_ASSIGN_OR_RETURN(logits,
                             builder_.soft_cap(logits, model_.final_logit_soft_cap, logits_name));
    }
    FOLIO_RETURN_IF_ERROR(builder_.mark_output(logits));
    return builder_.finish();
  }

 private:
  Result<TensorId> token_embedding() {
    return builder_.weight("token_embd.weight", model_.matrix_dtype("token_embd.weight"),
                           {model_.vocab_size, model_.hidden_size});
  }

  // RMSNorm with the f32 weight "<name>.weight".
  Result<TensorId> norm(TensorId x, const std::string& name) {
    FOLIO_ASSIGN_OR_RETURN(TensorId weight,
                           builder_.weight(name + ".weight", DType::kF32, {model_.hidden_size}));
    return builder_.rms_norm(x, weight, model_.rms_norm_epsilon, name);
  }

  // RMSNorm of each head of x [T, heads * head_dim] with the f32 weight "<name>.weight"
  // [head_dim] (Qwen 3's q and k norms).
  Result<TensorId> head_norm(TensorId x, const std::string& name) {
    FOLIO_ASSIGN_OR_RETURN(TensorId weight,
                           builder_.weight(name + ".weight", DType::kF32, {model_.head_dim()}));
    return builder_.rms_norm(x, weight, model_.rms_norm_epsilon, name);
  }

  // x [T, in] * "blk.<layer>.<projection>.weight" [out, in]^T, plus the f32 bias when `bias`,
  // plus each token's adapter update when the graph has adapters.
  Result<TensorId> projection(TensorId x, int64_t layer, LlamaProjection projection,
                              int64_t out_features, int64_t in_features, bool bias) {
    const std::string name = fmt::format("blk.{}.{}", layer, llama_projection_name(projection));
    FOLIO_ASSIGN_OR_RETURN(TensorId weight,
                           builder_.weight(name + ".weight", model_.matrix_dtype(name + ".weight"),
                                           {out_features, in_features}));
    TensorId projected;
    if (bias) {
      FOLIO_ASSIGN_OR_RETURN(TensorId bias_tensor,
                             builder_.weight(name + ".bias", DType::kF32, {out_features}));
      FOLIO_ASSIGN_OR_RETURN(projected, builder_.matmul(x, weight, bias_tensor, name));
    } else {
      FOLIO_ASSIGN_OR_RETURN(projected, builder_.matmul(x, weight, name));
    }
    if (!inputs_.token_adapter_slots) return reduce_if_split(projected, projection, name);
    return builder_.lora(x, projected, *inputs_.token_adapter_slots,
                         llama_adapter_target_index(layer, projection), name + ".lora");
  }

  // A row-split projection's result is this rank's partial sum: the group adds them.
  Result<TensorId> reduce_if_split(TensorId projected, LlamaProjection projection,
                                   const std::string& name) {
    const bool row_split =
        projection == LlamaProjection::kAttentionOutput || projection == LlamaProjection::kDown;
    if (!split_.is_split() || !row_split) return projected;
    return builder_.all_reduce_sum(projected, name + ".all_reduce");
  }

  // RoPE on x with the model's frequency factors (rope_freqs.weight) when it has them.
  Result<TensorId> apply_rope(TensorId x, const ir::RopeAttributes& rope, std::string name) {
    if (rope_frequency_factors_) {
      return builder_.rope(x, inputs_.positions, *rope_frequency_factors_, rope, std::move(name));
    }
    return builder_.rope(x, inputs_.positions, rope, std::move(name));
  }

  // The layer's attention output: the whole sequence's, or a KV-parallel member's partial
  // merged with every other member's.
  Result<TensorId> attend(TensorId query, TensorId k_cache, TensorId v_cache,
                          const ir::AttentionAttributes& attention, const std::string& prefix) {
    if (!attention.is_kv_parallel()) {
      return builder_.paged_attention(query, k_cache, v_cache, inputs_.attention, attention,
                                      prefix + ".attention");
    }
    FOLIO_ASSIGN_OR_RETURN(
        const ir::PartialAttention partial,
        builder_.paged_attention_partial(query, k_cache, v_cache, inputs_.attention, attention,
                                         prefix + ".attention_partial"));
    return builder_.attention_merge(partial.output, partial.lse, prefix + ".attention");
  }

  Result<TensorId> attention_block(int64_t layer, TensorId hidden) {
    const std::string prefix = fmt::format("blk.{}", layer);
    const int64_t head_dim = model_.head_dim();
    const int64_t q_width = num_heads_ * head_dim;
    const int64_t kv_width = num_kv_heads_ * head_dim;
    const bool bias = llama_has_attention_bias(model_.architecture);
    FOLIO_ASSIGN_OR_RETURN(TensorId normed, norm(hidden, prefix + ".attn_norm"));
    const int64_t hidden_size = model_.hidden_size;
    FOLIO_ASSIGN_OR_RETURN(
        TensorId q, projection(normed, layer, LlamaProjection::kQuery, q_width, hidden_size, bias));
    FOLIO_ASSIGN_OR_RETURN(
        TensorId k, projection(normed, layer, LlamaProjection::kKey, kv_width, hidden_size, bias));
    FOLIO_ASSIGN_OR_RETURN(TensorId v, projection(normed, layer, LlamaProjection::kValue, kv_width,
                                                  hidden_size, bias));
    ir::RopeAttributes rope;
    rope.num_heads = num_heads_;
    rope.head_dim = head_dim;
    rope.rotary_dim = head_dim;
    rope.theta = model_.rope_theta;
    rope.style = llama_rope_style(model_.architecture);
    rope.scaling = model_.rope_scaling;
    const bool sliding = model_.is_sliding_window_layer(layer);
    // Gemma 3's local layers rotate with their own base and no scaling.
    if (sliding && model_.architecture == LlamaArchitecture::kGemma3) {
      rope.theta = kGemmaLocalRopeTheta;
      rope.scaling = ir::RopeScaling{};
    }
    if (llama_has_query_key_norm(model_.architecture)) {
      FOLIO_ASSIGN_OR_RETURN(q, head_norm(q, prefix + ".attn_q_norm"));
      FOLIO_ASSIGN_OR_RETURN(k, head_norm(k, prefix + ".attn_k_norm"));
    }
    FOLIO_ASSIGN_OR_RETURN(TensorId q_rope, apply_rope(q, rope, prefix + ".q_rope"));
    rope.num_heads = num_kv_heads_;
    FOLIO_ASSIGN_OR_RETURN(TensorId k_rope, apply_rope(k, rope, prefix + ".k_rope"));
    const ir::Shape cache_shape{kv_cache_.num_blocks, kv_cache_.geometry.block_size, num_kv_heads_,
                                head_dim};
    FOLIO_ASSIGN_OR_RETURN(
        TensorId k_cache,
        builder_.kv_cache(llama_key_cache_name(layer), kv_cache_.geometry.dtype, cache_shape));
    FOLIO_ASSIGN_OR_RETURN(
        TensorId v_cache,
        builder_.kv_cache(llama_value_cache_name(layer), kv_cache_.geometry.dtype, cache_shape));
    FOLIO_RETURN_IF_ERROR(builder_.kv_cache_write(k_rope, v, inputs_.slot_mapping, k_cache, v_cache,
                                                  prefix + ".kv_write"));
    const ir::AttentionAttributes attention{.num_heads = num_heads_,
                                            .num_kv_heads = num_kv_heads_,
                                            .head_dim = head_dim,
                                            .scale = model_.attention_scale(),
                                            .sliding_window = sliding ? model_.sliding_window : 0,
                                            .logit_soft_cap = model_.attention_logit_soft_cap,
                                            .kv_range_begin = options_.kv_range_begin,
                                            .kv_range_end = options_.kv_range_end};
    FOLIO_ASSIGN_OR_RETURN(TensorId attended, attend(q_rope, k_cache, v_cache, attention, prefix));
    FOLIO_ASSIGN_OR_RETURN(TensorId projected,
                           projection(attended, layer, LlamaProjection::kAttentionOutput,
                                      hidden_size, q_width, false));
    if (llama_is_gemma(model_.architecture)) {
      FOLIO_ASSIGN_OR_RETURN(projected, norm(projected, prefix + ".post_attention_norm"));
    }
    return builder_.add(hidden, projected, prefix + ".attn_residual");
  }

  // `output_name`: the name of the residual add (default "blk.N.ffn_residual").
  Result<TensorId> feed_forward_block(int64_t layer, TensorId hidden,
                                      std::optional<std::string> output_name) {
    const std::string prefix = fmt::format("blk.{}", layer);
    const int64_t hidden_size = model_.hidden_size;
    const int64_t ffn = ffn_size_;
    FOLIO_ASSIGN_OR_RETURN(TensorId normed, norm(hidden, prefix + ".ffn_norm"));
    FOLIO_ASSIGN_OR_RETURN(
        TensorId gate, projection(normed, layer, LlamaProjection::kGate, ffn, hidden_size, false));
    FOLIO_ASSIGN_OR_RETURN(
        TensorId up, projection(normed, layer, LlamaProjection::kUp, ffn, hidden_size, false));
    const bool gemma = llama_is_gemma(model_.architecture);
    FOLIO_ASSIGN_OR_RETURN(TensorId activated,
                           gemma ? builder_.geglu(gate, up, prefix + ".ffn_geglu")
                                 : builder_.swiglu(gate, up, prefix + ".ffn_swiglu"));
    FOLIO_ASSIGN_OR_RETURN(TensorId down, projection(activated, layer, LlamaProjection::kDown,
                                                     hidden_size, ffn, false));
    if (gemma) {
      FOLIO_ASSIGN_OR_RETURN(down, norm(down, prefix + ".post_ffw_norm"));
    }
    return builder_.add(hidden, down, output_name.value_or(prefix + ".ffn_residual"));
  }

  const LlamaShape& model_;
  const ir::StepShape& step_;
  const ir::KvCacheShape& kv_cache_;
  const LlamaGraphOptions options_;
  const StageRange stage_;
  const LlamaTensorSplit split_;
  // This rank's share of the heads, KV heads and FFN features (the whole model's unsplit).
  const int64_t num_heads_;
  const int64_t num_kv_heads_;
  const int64_t ffn_size_;
  GraphBuilder builder_;
  StepInputs inputs_;
  std::optional<TensorId> rope_frequency_factors_;  // f32 [head_dim / 2], rope_freqs.weight
};

Status validate_step_shape(const LlamaShape& model, const ir::StepShape& step,
                           const ir::KvCacheShape& kv_cache, const StageRange& stage,
                           const LlamaTensorSplit& split) {
  auto positive = [](const char* field, int64_t value) -> Status {
    if (value <= 0)
      return invalid_argument("step shape: {} must be positive, got {}", field, value);
    return Status();
  };
  FOLIO_RETURN_IF_ERROR(positive("num_tokens", step.num_tokens));
  FOLIO_RETURN_IF_ERROR(positive("num_sequence_slots", step.num_sequence_slots));
  FOLIO_RETURN_IF_ERROR(positive("num_logit_rows", step.num_logit_rows));
  FOLIO_RETURN_IF_ERROR(positive("max_blocks_per_sequence", kv_cache.max_blocks_per_sequence));
  FOLIO_RETURN_IF_ERROR(positive("num_kv_blocks", kv_cache.num_blocks));
  const ir::KvCacheGeometry& geometry = kv_cache.geometry;
  FOLIO_RETURN_IF_ERROR(geometry.validate());
  if (stage.first_layer < 0 || stage.first_layer >= stage.end_layer ||
      stage.end_layer > model.num_layers) {
    return invalid_argument(
        "the stage's layers [{}, {}) are not a non-empty range of the model's {} layers",
        stage.first_layer, stage.end_layer, model.num_layers);
  }
  const int64_t stage_layers = stage.end_layer - stage.first_layer;
  const int64_t kv_heads = split.part(model.num_kv_heads);
  if (geometry.num_layers != stage_layers || geometry.num_kv_heads != kv_heads ||
      geometry.head_dim != model.head_dim()) {
    return invalid_argument(
        "the KV cache has {} layers of {} KV heads of {} dimensions; the model's layers [{}, {}) "
        "need {} of {} of {}{}",
        geometry.num_layers, geometry.num_kv_heads, geometry.head_dim, stage.first_layer,
        stage.end_layer, stage_layers, kv_heads, model.head_dim(),
        split.is_split() ? fmt::format(" (tensor rank {} of {})", split.rank, split.num_ranks)
                         : std::string());
  }
  return Status();
}

}  // namespace

ir::KvCacheGeometry llama_kv_cache_geometry(const LlamaShape& model, int32_t block_size,
                                            DType dtype) {
  return llama_stage_kv_cache_geometry(model, model.num_layers, block_size, dtype);
}

ir::KvCacheGeometry llama_stage_kv_cache_geometry(const LlamaShape& model, int64_t num_layers,
                                                  int32_t block_size, DType dtype,
                                                  const LlamaTensorSplit& split) {
  return ir::KvCacheGeometry{block_size, static_cast<int32_t>(num_layers),
                             static_cast<int32_t>(split.part(model.num_kv_heads)),
                             static_cast<int32_t>(model.head_dim()), dtype};
}

std::string llama_key_cache_name(int64_t layer) {
  return fmt::format("blk.{}.k_cache", layer);
}
std::string llama_value_cache_name(int64_t layer) {
  return fmt::format("blk.{}.v_cache", layer);
}

Result<ir::Graph> build_llama_step_graph(const LlamaShape& model, const ir::StepShape& step,
                                         const ir::KvCacheShape& kv_cache,
                                         const LlamaGraphOptions& options) {
  FOLIO_RETURN_IF_ERROR(validate_llama_shape(model));
  FOLIO_RETURN_IF_ERROR(validate_llama_tensor_split(model, options.tensor_split));
  if (options.tensor_split.is_split() && options.adapters) {
    return invalid_argument(
        "adapters are not supported with tensor parallelism (rank {} of {}): their updates would "
        "need splitting like the projections they follow",
        options.tensor_split.rank, options.tensor_split.num_ranks);
  }
  if (options.tensor_split.is_split() && options.kv_range_end > 0) {
    // An executor is the member of one group: the all-reduces would need the tensor group and
    // the attention merges the KV-parallel one.
    return invalid_argument(
        "tensor parallelism (rank {} of {}) and a KV-parallel range [{}, {}) do not combine: an "
        "executor belongs to one group",
        options.tensor_split.rank, options.tensor_split.num_ranks, options.kv_range_begin,
        options.kv_range_end);
  }
  FOLIO_RETURN_IF_ERROR(validate_step_shape(model, step, kv_cache, stage_range(model, options),
                                            options.tensor_split));
  return LlamaEmitter(model, step, kv_cache, options).emit();
}

}  // namespace folio::model
