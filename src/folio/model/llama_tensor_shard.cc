#include "folio/model/llama_tensor_shard.h"

#include <sys/mman.h>

#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/model/llama_adapter_targets.h"

namespace folio::model {
namespace {

constexpr int64_t kAlignment = 64;

int64_t aligned(int64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// One tensor the rank holds a copy of.
struct ShardTensor {
  std::string name;
  LlamaSplitAxis axis = LlamaSplitAxis::kReplicated;
  TensorView full;                   // the source's whole tensor
  std::vector<int64_t> shard_shape;  // the rank's part
  bool pack = false;                 // stored as q8_0 panels
  int64_t bytes = 0;                 // of the copy (packed or not)
  int64_t offset = 0;                // in the arena
};

// The split tensors of every layer (their GGUF names as the graph uses them), and the untied LM
// head (replicated, copied only to be packed).
std::vector<std::string> split_tensor_names(const LlamaShape& shape) {
  std::vector<std::string> names;
  const bool bias = llama_has_attention_bias(shape.architecture);
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    for (LlamaProjection projection :
         {LlamaProjection::kQuery, LlamaProjection::kKey, LlamaProjection::kValue,
          LlamaProjection::kAttentionOutput, LlamaProjection::kGate, LlamaProjection::kUp,
          LlamaProjection::kDown}) {
      const std::string prefix = fmt::format("blk.{}.{}", layer, llama_projection_name(projection));
      names.push_back(prefix + ".weight");
      const bool attention_input = projection == LlamaProjection::kQuery ||
                                   projection == LlamaProjection::kKey ||
                                   projection == LlamaProjection::kValue;
      if (bias && attention_input) names.push_back(prefix + ".bias");
    }
  }
  return names;
}

// Copies the rank's part of `tensor.full` into `destination` in the file layout.
void copy_part(const ShardTensor& tensor, const LlamaTensorSplit& split, std::byte* destination) {
  const TensorView& full = tensor.full;
  const DTypeInfo info = dtype_info(full.dtype());
  switch (tensor.axis) {
    case LlamaSplitAxis::kReplicated:
      std::memcpy(destination, full.data(), static_cast<size_t>(full.size_bytes()));
      return;
    case LlamaSplitAxis::kColumns: {
      if (full.rank() == 1) {  // a bias: a run of values
        const int64_t part = split.part(full.dim(0));
        const int64_t bytes = row_bytes(full.dtype(), part);
        std::memcpy(destination,
                    full.data() + split.first(full.dim(0)) / info.block_elements * info.block_bytes,
                    static_cast<size_t>(bytes));
        return;
      }
      const int64_t part = split.part(full.dim(0));
      std::memcpy(destination, full.row(split.first(full.dim(0))),
                  static_cast<size_t>(part * full.row_bytes()));
      return;
    }
    case LlamaSplitAxis::kRows: {
      const int64_t columns = full.dim(1);
      const int64_t part_bytes = row_bytes(full.dtype(), split.part(columns));
      const int64_t first_byte = row_bytes(full.dtype(), split.first(columns));
      for (int64_t row = 0; row < full.dim(0); ++row) {
        std::memcpy(destination + row * part_bytes, full.row(row) + first_byte,
                    static_cast<size_t>(part_bytes));
      }
      return;
    }
  }
}

}  // namespace

Result<std::unique_ptr<LlamaTensorShard>> LlamaTensorShard::create(
    const LlamaShape& shape, const ir::WeightSource& source, const LlamaTensorSplit& split,
    const LlamaTensorShardOptions& options) {
  FOLIO_RETURN_IF_ERROR(validate_llama_tensor_split(shape, split));
  std::unique_ptr<LlamaTensorShard> shard(new LlamaTensorShard(shape, source, split));
  const bool pack = options.pack_q8_0_panels && kernels::cpu::q8_0_panels_preferred();

  std::vector<std::string> names = split_tensor_names(shape);
  if (!shape.tie_embeddings && pack) names.push_back("output.weight");
  std::vector<ShardTensor> tensors;
  int64_t total = 0;
  for (const std::string& name : names) {
    ShardTensor tensor;
    tensor.name = name;
    tensor.axis = llama_split_axis(name);
    FOLIO_ASSIGN_OR_RETURN(tensor.full, source.find_weight(name));
    if (tensor.full.dtype() == DType::kQ8_0Panels) {
      return failed_precondition(
          "tensor shard: {} is packed as q8_0 panels, which cannot be sliced; open the model "
          "without packing (LlamaLoadOptions::pack_q8_0_panels = false): the shard packs its "
          "own slices",
          name);
    }
    tensor.shard_shape.assign(tensor.full.shape().begin(), tensor.full.shape().end());
    const int axis = tensor.axis == LlamaSplitAxis::kRows ? 1 : 0;
    if (tensor.axis != LlamaSplitAxis::kReplicated) {
      if (tensor.full.rank() <= axis) {
        return invalid_argument("tensor shard: {} is {}, which has no axis {} to split", name,
                                tensor.full.to_string(), axis);
      }
      tensor.shard_shape[static_cast<size_t>(axis)] = split.part(tensor.full.dim(axis));
    }
    const bool matrix = tensor.full.rank() == 2;
    tensor.pack = pack && matrix && tensor.full.dtype() == DType::kQ8_0;
    if (tensor.axis == LlamaSplitAxis::kReplicated && !tensor.pack) continue;
    if (tensor.pack) {
      tensor.bytes = kernels::cpu::q8_0_panels_bytes(tensor.shard_shape[0], tensor.shard_shape[1]);
    } else {
      FOLIO_ASSIGN_OR_RETURN(TensorView probe,
                             TensorView::make(nullptr, tensor.full.dtype(), tensor.shard_shape));
      tensor.bytes = probe.size_bytes();
    }
    tensor.offset = total;
    total += aligned(tensor.bytes);
    tensors.push_back(std::move(tensor));
  }
  if (total == 0) return shard;

  // One allocation on 2 MiB boundaries with transparent huge pages asked for, as LlamaModel
  // packs: a decode step streams all of it.
  constexpr int64_t kHugePageBytes = int64_t{2} << 20;
  const int64_t arena_bytes = (total + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  shard->arena_.reset(static_cast<std::byte*>(std::aligned_alloc(kHugePageBytes, arena_bytes)));
  if (shard->arena_ == nullptr) {
    return resource_exhausted(
        "tensor shard of rank {} of {}: {} bytes for its weights are not "
        "available",
        split.rank, split.num_ranks, arena_bytes);
  }
  ::madvise(shard->arena_.get(), arena_bytes, MADV_HUGEPAGE);  // advice only
  std::vector<std::byte> staging;
  for (const ShardTensor& tensor : tensors) {
    std::byte* destination = shard->arena_.get() + tensor.offset;
    DType dtype = tensor.full.dtype();
    if (tensor.pack) {
      const int64_t rows = tensor.shard_shape[0];
      const int64_t columns = tensor.shard_shape[1];
      staging.resize(static_cast<size_t>(rows * row_bytes(DType::kQ8_0, columns)));
      copy_part(tensor, split, staging.data());
      kernels::cpu::pack_q8_0_panels(
          staging.data(), rows, columns, 0,
          (rows + kernels::cpu::kQ8_0PanelRows - 1) / kernels::cpu::kQ8_0PanelRows, destination);
      dtype = DType::kQ8_0Panels;
      shard->shape_.tensor_dtypes[llama_matrix_location(shape, tensor.name).tensor] = dtype;
      ++shard->num_packed_;
    } else {
      copy_part(tensor, split, destination);
    }
    FOLIO_ASSIGN_OR_RETURN(TensorView view,
                           TensorView::make(destination, dtype, tensor.shard_shape));
    shard->owned_.emplace(tensor.name, view);
  }
  shard->owned_bytes_ = total;
  return shard;
}

Result<TensorView> LlamaTensorShard::find_weight(std::string_view name) const {
  if (const auto owned = owned_.find(name); owned != owned_.end()) return owned->second;
  if (split_.is_split() && llama_split_axis(name) != LlamaSplitAxis::kReplicated) {
    return not_found("tensor shard of rank {} of {} holds no {}", split_.rank, split_.num_ranks,
                     name);
  }
  return source_.find_weight(name);
}

}  // namespace folio::model
