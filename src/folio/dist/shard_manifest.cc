#include "folio/dist/shard_manifest.h"

#include <set>

#include "folio/gguf/gguf_writer.h"

namespace folio::dist {
namespace {

// The most tensors and dimensions a manifest may name: a layer has at most a dozen tensors, and
// the limits keep a malformed manifest from costing memory in proportion to its counts.
constexpr size_t kMaxShardTensors = 1 << 16;

Result<int64_t> tensor_byte_size(const ShardTensor& tensor) {
  if (tensor.dimensions.empty() || tensor.dimensions.size() > 4) {
    return invalid_argument("tensor {} has {} dimensions, not 1 to 4", tensor.name,
                            tensor.dimensions.size());
  }
  const DTypeInfo info = dtype_info(tensor.dtype);
  if (info.ggml_type < 0) {
    return invalid_argument("tensor {} has dtype {}, which a GGUF file does not hold", tensor.name,
                            dtype_name(tensor.dtype));
  }
  int64_t rows = 1;
  for (size_t i = 1; i < tensor.dimensions.size(); ++i) {
    if (tensor.dimensions[i] <= 0 || rows > (int64_t{1} << 40) / tensor.dimensions[i]) {
      return invalid_argument("tensor {} has a dimension of {}", tensor.name, tensor.dimensions[i]);
    }
    rows *= tensor.dimensions[i];
  }
  const int64_t row_length = tensor.dimensions[0];
  if (row_length <= 0 || row_length > (int64_t{1} << 32) || row_length % info.block_elements != 0) {
    return invalid_argument("tensor {} has rows of {} values, not whole {} blocks", tensor.name,
                            row_length, dtype_name(tensor.dtype));
  }
  return rows * row_bytes(tensor.dtype, row_length);
}

}  // namespace

int64_t ShardManifest::tensor_bytes() const {
  int64_t total = 0;
  for (const ShardTensor& tensor : tensors) total += tensor.byte_size;
  return total;
}

Result<ShardManifest> make_shard_manifest(const gguf::GgufFile& model_file, std::string model_hash,
                                          const model::LlamaShard& shard) {
  FOLIO_ASSIGN_OR_RETURN(const model::LlamaShape shape, model::read_llama_shape(model_file));
  FOLIO_ASSIGN_OR_RETURN(const std::vector<std::string> names,
                         model::llama_shard_tensor_names(shape, shard));
  ShardManifest manifest;
  manifest.model_hash = std::move(model_hash);
  manifest.shard = shard;
  gguf::GgufWriter metadata;
  for (const gguf::GgufKeyValue& entry : model_file.metadata()) {
    if (entry.key.starts_with("folio.shard.")) continue;  // a shard of a shard: its own keys
    metadata.set(entry.key, entry.value);
  }
  model::set_llama_shard_keys(metadata, shape, shard);
  FOLIO_ASSIGN_OR_RETURN(manifest.metadata, metadata.write_to_buffer());
  for (const std::string& name : names) {
    FOLIO_ASSIGN_OR_RETURN(const gguf::GgufTensor tensor, model_file.tensor(name));
    manifest.tensors.push_back(ShardTensor{.name = name,
                                           .dtype = tensor.dtype,
                                           .dimensions = tensor.info->dimensions,
                                           .hash = ContentHash::of(tensor.data),
                                           .byte_size = static_cast<int64_t>(tensor.data.size())});
  }
  return manifest;
}

Status check_shard_manifest(const ShardManifest& manifest) {
  if (manifest.tensors.empty() || manifest.tensors.size() > kMaxShardTensors) {
    return invalid_argument("a shard manifest of {} tensors (1 to {})", manifest.tensors.size(),
                            kMaxShardTensors);
  }
  std::set<std::string_view> names;
  for (const ShardTensor& tensor : manifest.tensors) {
    if (tensor.name.empty() || !names.insert(tensor.name).second) {
      return invalid_argument("the shard manifest names tensor '{}' {}", tensor.name,
                              tensor.name.empty() ? "(empty)" : "twice");
    }
    FOLIO_ASSIGN_OR_RETURN(const int64_t bytes, tensor_byte_size(tensor));
    if (bytes != tensor.byte_size) {
      return invalid_argument("tensor {} of {} [{}] has {} bytes, not the {} the manifest says",
                              tensor.name, dtype_name(tensor.dtype),
                              fmt::join(tensor.dimensions, ", "), bytes, tensor.byte_size);
    }
  }
  Result<gguf::GgufFile> metadata =
      gguf::GgufFile::parse(manifest.metadata, "the shard manifest's metadata");
  if (!metadata.ok()) return metadata.status();
  FOLIO_ASSIGN_OR_RETURN(const std::optional<model::LlamaShard> shard,
                         model::read_llama_shard(*metadata));
  if (!shard.has_value() || shard->first_layer != manifest.shard.first_layer ||
      shard->end_layer != manifest.shard.end_layer) {
    return invalid_argument("the shard manifest's metadata does not describe layers [{}, {})",
                            manifest.shard.first_layer, manifest.shard.end_layer);
  }
  return Status();
}

Result<std::unique_ptr<model::LlamaModel>> open_shard_model(const ShardManifest& manifest,
                                                            const WeightCache& cache) {
  FOLIO_RETURN_IF_ERROR(check_shard_manifest(manifest));
  FOLIO_ASSIGN_OR_RETURN(const gguf::GgufFile metadata,
                         gguf::GgufFile::parse(manifest.metadata, "the shard manifest"));
  gguf::GgufWriter writer;
  for (const gguf::GgufKeyValue& entry : metadata.metadata()) writer.set(entry.key, entry.value);
  for (const ShardTensor& tensor : manifest.tensors) {
    // The fill runs while the writer writes: each tensor is read (and verified) straight into
    // the assembled file's buffer, once.
    FOLIO_RETURN_IF_ERROR(
        writer.add_tensor(tensor.name, tensor.dtype, tensor.dimensions,
                          [&cache, &tensor](std::span<std::byte> destination) -> Status {
                            Status read = cache.read(tensor.hash, destination);
                            if (!read.ok())
                              return read.with_context(fmt::format("tensor {}", tensor.name));
                            return read;
                          }));
  }
  FOLIO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, writer.write_to_buffer());
  FOLIO_ASSIGN_OR_RETURN(
      gguf::GgufFile file,
      gguf::GgufFile::parse_owned(
          std::move(bytes), fmt::format("shard [{}, {}) of model {}", manifest.shard.first_layer,
                                        manifest.shard.end_layer, manifest.model_hash)));
  return model::LlamaModel::from_file(std::move(file));
}

}  // namespace folio::dist
