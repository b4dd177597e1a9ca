#include "folio/model/llama_tensor_split.h"

#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "folio/model/llama_model_file.h"

namespace folio::model {
namespace {

bool ends_with(std::string_view name, std::string_view suffix) {
  return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
}

// The first reason `num_ranks` ranks cannot split `model` (empty when they can).
std::string split_problem(const LlamaShape& model, int64_t num_ranks) {
  if (model.num_kv_heads % num_ranks != 0) {
    return fmt::format(
        "the model's {} KV heads do not divide over {} ranks (each rank holds whole "
        "heads)",
        model.num_kv_heads, num_ranks);
  }
  if (model.num_heads % num_ranks != 0) {
    return fmt::format("the model's {} query heads do not divide over {} ranks", model.num_heads,
                       num_ranks);
  }
  if (model.ffn_size % num_ranks != 0) {
    return fmt::format("the model's feed-forward width {} does not divide over {} ranks",
                       model.ffn_size, num_ranks);
  }
  // Row-split matrices: each rank's run of input features must be whole blocks.
  for (int64_t layer = 0; layer < model.num_layers; ++layer) {
    const std::pair<std::string, int64_t> row_split[] = {
        {fmt::format("blk.{}.attn_output.weight", layer), model.q_dim()},
        {fmt::format("blk.{}.ffn_down.weight", layer), model.ffn_size}};
    for (const auto& [name, input_features] : row_split) {
      const DType dtype = model.matrix_dtype(name);
      const int64_t block = dtype_info(dtype).block_elements;
      const int64_t per_rank = input_features / num_ranks;
      if (per_rank % block != 0) {
        return fmt::format(
            "{} ({}, {} input features) would be cut inside its quantization blocks: each of {} "
            "ranks would hold {} input features, not a multiple of {}'s block of {} values",
            name, dtype_name(dtype), input_features, num_ranks, per_rank, dtype_name(dtype), block);
      }
    }
  }
  return {};
}

}  // namespace

LlamaSplitAxis llama_split_axis(std::string_view name) {
  for (std::string_view column :
       {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q.bias", "attn_k.bias",
        "attn_v.bias", "ffn_gate.weight", "ffn_up.weight"}) {
    if (ends_with(name, column) && name.size() > column.size() &&
        name[name.size() - column.size() - 1] == '.') {
      return LlamaSplitAxis::kColumns;
    }
  }
  if (ends_with(name, ".attn_output.weight") || ends_with(name, ".ffn_down.weight")) {
    return LlamaSplitAxis::kRows;
  }
  return LlamaSplitAxis::kReplicated;
}

std::string_view llama_split_axis_name(LlamaSplitAxis axis) {
  switch (axis) {
    case LlamaSplitAxis::kReplicated:
      return "replicated";
    case LlamaSplitAxis::kColumns:
      return "column split";
    case LlamaSplitAxis::kRows:
      return "row split";
  }
  return "invalid";
}

Status validate_llama_tensor_split(const LlamaShape& model, const LlamaTensorSplit& split) {
  if (split.num_ranks < 1 || split.rank < 0 || split.rank >= split.num_ranks) {
    return invalid_argument("tensor split: rank {} of {} ranks is not a rank of a group",
                            split.rank, split.num_ranks);
  }
  if (!split.is_split()) return Status();
  const std::string problem = split_problem(model, split.num_ranks);
  if (problem.empty()) return Status();
  std::vector<int64_t> legal;
  for (int64_t ranks = 2; ranks <= model.num_kv_heads; ++ranks) {
    if (split_problem(model, ranks).empty()) legal.push_back(ranks);
  }
  if (legal.empty()) {
    return invalid_argument(
        "tensor parallelism over {} ranks: {}; no rank count above 1 splits this model (use "
        "pipeline placement)",
        split.num_ranks, problem);
  }
  return invalid_argument(
      "tensor parallelism over {} ranks: {}; rank counts that split this "
      "model: {}",
      split.num_ranks, problem, fmt::join(legal, ", "));
}

}  // namespace folio::model
