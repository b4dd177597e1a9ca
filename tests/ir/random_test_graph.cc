#include "random_test_graph.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "folio/ir/builder.h"

namespace folio::ir::testing {
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
