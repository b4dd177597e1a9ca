#include "folio/model/llama_model.h"

#include <algorithm>
#include <vector>

namespace folio::model {
namespace {

// Weights straight from the GGUF mapping; a projection of a fused matrix (Phi-3's attn_qkv,
// ffn_up) is the view of its rows (llama_matrix_location). The mapping is read-only and kernels
// only read weights, so handing out a mutable TensorView pointer never leads to a write.
class GgufWeightSource final : public ir::WeightSource {
 public:
  GgufWeightSource(const gguf::GgufFile& file, const LlamaShape& shape)
      : file_(file), shape_(shape) {}

  Result<TensorView> find_weight(std::string_view name) const override {
    const LlamaMatrixLocation location = llama_matrix_location(shape_, name);
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor tensor, file_.tensor(location.tensor));
    // GGUF lists dimensions fastest first; a TensorView slowest first.
    std::vector<int64_t> shape(tensor.info->dimensions.rbegin(), tensor.info->dimensions.rend());
    if (shape.empty()) shape.push_back(1);
    auto* data = const_cast<std::byte*>(tensor.data.data());
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
    return TensorView::make(data, tensor.dtype, shape);
  }

 private:
  const gguf::GgufFile& file_;
  const LlamaShape& shape_;
};

}  // namespace

LlamaModel::LlamaModel(gguf::GgufFile file, LlamaShape shape, tokenizer::Tokenizer tokenizer)
    : file_(std::move(file)), shape_(shape), tokenizer_(std::move(tokenizer)) {
  weights_ = std::make_unique<GgufWeightSource>(file_, shape_);
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::open(const std::string& path) {
  Result<gguf::GgufFile> file = gguf::GgufFile::open(path);
  if (!file.ok()) return file.status();
  Result<std::unique_ptr<LlamaModel>> model = from_file(std::move(*file));
  if (!model.ok()) return model.status().with_context(path);
  return model;
}

Result<std::unique_ptr<LlamaModel>> LlamaModel::from_file(gguf::GgufFile file) {
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
  const ir::StepShape probe{1, 1, 1, ir::StepPhase::kPrefill};
  const ir::KvCacheShape probe_cache{model->kv_cache_geometry(16, DType::kF32), 1, 1};
  FOLIO_ASSIGN_OR_RETURN(ir::Graph graph, build_llama_step_graph(shape, probe, probe_cache));
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency != ir::Residency::kWeight) continue;
    FOLIO_RETURN_IF_ERROR(ir::bind_weight(tensor, model->weights()).status());
  }
  return model;
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
