#include "folio/model/llama_model.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <vector>

#include "folio/base/log.h"
#include "folio/kernels/cpu/q8_0_panels.h"

namespace folio::model {
namespace {

// Weights straight from the GGUF mapping, or from their q8_0 panels where packed at load; a
// projection of a fused matrix (Phi-3's attn_qkv, ffn_up) is the view of its rows
// (llama_matrix_location): panel p of a matrix lies where its row 16 p would, and a packed
// projection starts on a panel. The mapping is read-only and kernels only read weights, so
// handing out a mutable TensorView pointer never leads to a write.
class GgufWeightSource final : public ir::WeightSource {
 public:
  GgufWeightSource(const gguf::GgufFile& file, const LlamaShape& shape,
                   const std::map<std::string, std::byte*, std::less<>>& packed)
      : file_(file), shape_(shape), packed_(packed) {}

  Result<TensorView> find_weight(std::string_view name) const override {
    const LlamaMatrixLocation location = llama_matrix_location(shape_, name);
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor tensor, file_.tensor(location.tensor));
    // GGUF lists dimensions fastest first; a TensorView slowest first.
    std::vector<int64_t> shape(tensor.info->dimensions.rbegin(), tensor.info->dimensions.rend());
    if (shape.empty()) shape.push_back(1);
    auto* data = const_cast<std::byte*>(tensor.data.data());
    DType dtype = tensor.dtype;
    if (const auto packed = packed_.find(location.tensor); packed != packed_.end()) {
      data = packed->second;
      dtype = DType::kQ8_0Panels;
    }
    if (location.rows > 0) {
      const int64_t row_length = tensor.info->dimensions[0];
      if (shape.size() != 2 || location.first_row + location.rows > shape[0]) {
        return invalid_argument("tensor {} has shape [{}]; {} needs rows [{}, {})", location.tensor,
                                fmt::join(tensor.info->dimensions, ", "), name, location.first_row,
                                location.first_row + location.rows);
      }
      data += location.first_row * row_bytes(tensor.dtype, row_length);
      shape[0] = location.rows;
    }
    return TensorView::make(data, dtype, shape);
  }

 private:
  const gguf::GgufFile& file_;
  const LlamaShape& shape_;
  const std::map<std::string, std::byte*, std::less<>>& packed_;
};

}  // namespace

LlamaModel::LlamaModel(gguf::GgufFile file, LlamaShape shape, tokenizer::Tokenizer tokenizer)
    : file_(std::move(file)), shape_(shape), tokenizer_(std::move(tokenizer)) {
  weights_ = std::make_unique<GgufWeightSource>(file_, shape_, packed_);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::open(const std::string& path,
                                                     const LlamaLoadOptions& options) {
  Result<gguf::GgufFile> file = gguf::GgufFile::open(path);
  if (!file.ok()) return file.status();
  Result<std::unique_ptr<LlamaModel>> model = from_file(std::move(*file), options);
  if (!model.ok()) return model.status().with_context(path);
  return model;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_file(gguf::GgufFile file,
                                                          const LlamaLoadOptions& options) {
  FOLIO_ASSIGN_OR_RETURN(LlamaShape shape, read_llama_shape(file));
  FOLIO_RETURN_IF_ERROR(validate_llama_shape(shape));
  FOLIO_ASSIGN_OR_RETURN(tokenizer::Tokenizer tokenizer, tokenizer::Tokenizer::from_gguf(file));
  if (tokenizer.vocab_size() != shape.vocab_size) {
    return invalid_argument("tokenizer has {} tokens but token_embd.weight has {} rows",
                            tokenizer.vocab_size(), shape.vocab_size);
  }
  std::unique_ptr<LlamaModel> model(new LlamaModel(std::move(file), shape, std::move(tokenizer)));
  // Bind every weight of a one-token graph now, so a missing or malformed tensor is an error at
  // load time, not at the first step.
  // A shard (llama_model_file.h's LlamaShard) binds the graph of its layers only: it holds no
  // other weight.
  FOLIO_ASSIGN_OR_RETURN(const std::optional<LlamaShard> shard, read_llama_shard(model->file_));
  LlamaGraphOptions probe_options;
  int64_t probe_layers = shape.num_layers;
  if (shard.has_value()) {
    probe_options.first_layer = shard->first_layer;
    probe_options.end_layer = shard->end_layer;
    probe_layers = shard->end_layer - shard->first_layer;
  }
  const ir::StepShape probe{1, 1, 1, ir::StepPhase::kPrefill};
  const ir::KvCacheShape probe_cache{
      llama_stage_kv_cache_geometry(shape, probe_layers, 16, DType::kF32), 1, 1};
  FOLIO_ASSIGN_OR_RETURN(ir::Graph graph,
                         build_llama_step_graph(shape, probe, probe_cache, probe_options));
  if (options.pack_q8_0_panels && kernels::cpu::q8_0_panels_preferred()) {
    FOLIO_RETURN_IF_ERROR(model->pack_q8_0_matrices(graph));
    // The graph of the packed shape, whose weight tensors name the packed dtype.
    FOLIO_ASSIGN_OR_RETURN(
        graph, build_llama_step_graph(model->shape_, probe, probe_cache, probe_options));
  }
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency != ir::Residency::kWeight) continue;
    FOLIO_RETURN_IF_ERROR(ir::bind_weight(tensor, model->weights()).status());
  }
  return model;
}

Status LlamaModel::pack_q8_0_matrices(const ir::Graph& probe) {
  // Which GGUF tensors to pack: q8_0 matrices that a matmul reads, read by nothing but matmuls
  // and the embedding lookup, every projection of which starts on a panel.
  std::map<std::string, bool, std::less<>> packable;  // GGUF name -> may be packed
  std::set<std::string, std::less<>> read_by_matmul;
  for (const ir::Op& op : probe.ops()) {
    for (size_t position = 0; position < op.inputs.size(); ++position) {
      const ir::TensorInfo& tensor = probe.tensor(op.inputs[position]);
      if (tensor.residency != ir::Residency::kWeight || tensor.dtype != DType::kQ8_0 ||
          tensor.shape.rank != 2) {
        continue;
      }
      const LlamaMatrixLocation location = llama_matrix_location(shape_, tensor.name);
      const bool matmul =
          op.kind == ir::OpKind::kMatMul && static_cast<int>(position) == ir::matmul_input::kWeight;
      const bool embedding = op.kind == ir::OpKind::kEmbedding &&
                             static_cast<int>(position) == ir::embedding_input::kTable;
      if (matmul) read_by_matmul.insert(location.tensor);
      const bool fits =
          (matmul || embedding) && location.first_row % kernels::cpu::kQ8_0PanelRows == 0;
      const auto [entry, inserted] = packable.try_emplace(location.tensor, fits);
      if (!inserted) entry->second = entry->second && fits;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  // One allocation for every packed matrix (each 64-byte aligned in it), on 2 MiB boundaries
  // with transparent huge pages asked for: a decode step streams it all, and 4 KiB pages would
  // cost a TLB miss every 4 KiB (a per-matrix allocation would round each up to 2 MiB instead).
  std::vector<std::pair<std::string, int64_t>> offsets;  // GGUF name, offset in the arena
  int64_t total_bytes = 0;
  for (const auto& [name, fits] : packable) {
    if (!fits || !read_by_matmul.contains(name)) continue;
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor tensor, file_.tensor(name));
    offsets.emplace_back(name, total_bytes);
    total_bytes +=
        (kernels::cpu::q8_0_panels_bytes(static_cast<int64_t>(tensor.info->dimensions[1]),
                                         static_cast<int64_t>(tensor.info->dimensions[0])) +
         63) /
        64 * 64;
  }
  if (offsets.empty()) return Status();
  constexpr int64_t kHugePageBytes = int64_t{2} << 20;
  const int64_t arena_bytes = (total_bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  packed_arena_.reset(static_cast<std::byte*>(std::aligned_alloc(kHugePageBytes, arena_bytes)));
  if (packed_arena_ == nullptr) {
    return resource_exhausted("packing q8_0 weights as panels: {} bytes not available",
                              arena_bytes);
  }
  // Advice only: without huge pages the panels are the same, a little slower to stream.
  ::madvise(packed_arena_.get(), arena_bytes, MADV_HUGEPAGE);
  for (const auto& [name, offset] : offsets) {
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor tensor, file_.tensor(name));
    const auto input_features = static_cast<int64_t>(tensor.info->dimensions[0]);
    const auto rows = static_cast<int64_t>(tensor.info->dimensions[1]);
    std::byte* panels = packed_arena_.get() + offset;
    kernels::cpu::pack_q8_0_panels(
        tensor.data.data(), rows, input_features, 0,
        (rows + kernels::cpu::kQ8_0PanelRows - 1) / kernels::cpu::kQ8_0PanelRows, panels);
    file_.drop_resident_pages(*tensor.info);
    shape_.tensor_dtypes[name] = DType::kQ8_0Panels;
    packed_.emplace(name, panels);
  }
  const int64_t packed_bytes = total_bytes;
  if (!packed_.empty()) {
    log::info("packed {} q8_0 matrices ({:.1f} MB) as panels in {:.0f} ms", packed_.size(),
              static_cast<double>(packed_bytes) / 1e6,
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count());
  }
  return Status();
}

std::vector<std::string> LlamaModel::packed_tensors() const {
  std::vector<std::string> names;
  for (const auto& entry : packed_) names.push_back(entry.first);
  return names;
}

int64_t LlamaModel::weight_bytes() const {
  int64_t total = 0;
  for (const gguf::GgufTensorInfo& info : file_.tensors())
    total += static_cast<int64_t>(info.byte_size);
  return total;
}

uint64_t LlamaModel::prefault_weights(
    FunctionRef<void(int64_t done, int64_t total)> progress) const {
  constexpr size_t kPageBytes = 4096;  // the smallest page a mapping can fault in
  const int64_t total = weight_bytes();
  int64_t done = 0;
  uint64_t checksum = 0;
  for (const gguf::GgufTensorInfo& info : file_.tensors()) {
    // A packed tensor's pages were dropped on purpose; its panels are resident already.
    if (packed_.contains(info.name)) {
      done += static_cast<int64_t>(info.byte_size);
      progress(done, total);
      continue;
    }
    const std::span<const std::byte> bytes = file_.tensor_bytes(info);
    for (size_t offset = 0; offset < bytes.size(); offset += kPageBytes) {
      checksum = checksum * 31 + std::to_integer<uint64_t>(bytes[offset]);
    }
    done += static_cast<int64_t>(info.byte_size);
    progress(done, total);
  }
  return checksum;
}

ir::KvCacheGeometry LlamaModel::kv_cache_geometry(int32_t block_size, DType dtype) const {
  return llama_kv_cache_geometry(shape_, block_size, dtype);
}

ir::GraphFactory LlamaModel::graph_factory(const ir::KvCacheShape& kv_cache,
                                           const LlamaGraphOptions& options) const {
  return [shape = shape_, kv_cache, options](const ir::StepShape& step) -> Result<ir::Graph> {
    return build_llama_step_graph(shape, step, kv_cache, options);
  };
}

}  // namespace folio::model
