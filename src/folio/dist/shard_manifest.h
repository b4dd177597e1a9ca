// ShardManifest: what a pipeline worker without the model file needs to build its stage
// (issue 15, slice 5): the stage's tensors by name, dtype, shape, size and content hash, and the
// model's GGUF metadata with the shard keys (model/llama_model_file.h's LlamaShard). The
// coordinator makes it from its model file; the worker checks it, keeps what its weight cache
// holds (weight_cache.h), is sent the rest, and opens the shard as a model of its layers only.
//
// A shard holds layers [first_layer, end_layer) and what their step graph reads besides: the
// embedding for the first stage, the final norm and LM head for the last (the embedding again
// when they are tied), rope_freqs where the model has it (llama_shard_tensor_names).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/weight_cache.h"
#include "folio/gguf/gguf_file.h"
#include "folio/model/llama_model.h"
#include "folio/model/llama_model_file.h"
#include "folio/tensor/dtype.h"

namespace folio::dist {

struct ShardTensor {
  std::string name;                 // GGUF name
  DType dtype = DType::kF32;        // as in the file (never a packed dtype)
  std::vector<int64_t> dimensions;  // ggml order
  ContentHash hash;                 // of its bytes
  int64_t byte_size = 0;
};

struct ShardManifest {
  std::string model_hash;  // the coordinator's model file ("fnv1a64:...")
  model::LlamaShard shard;
  // A GGUF file of no tensors: the model's metadata and the shard keys.
  std::vector<uint8_t> metadata;
  std::vector<ShardTensor> tensors;  // sorted by name

  int64_t tensor_bytes() const;
};

// The manifest of `shard`'s layers of the model in `model_file` (hashing each tensor's bytes).
// Errors: the file's shape (read_llama_shape), a layer range outside the model.
Result<ShardManifest> make_shard_manifest(const gguf::GgufFile& model_file, std::string model_hash,
                                          const model::LlamaShard& shard);

// What a worker checks before using a manifest from the wire: tensor names unique and non-empty,
// sizes that match dtype and dimensions, a metadata block that parses with the same shard keys.
// kInvalidArgument naming the first fault.
Status check_shard_manifest(const ShardManifest& manifest);

// The model of the shard's layers, assembled from `cache` (every read verified: a corrupted
// entry is kDataLoss and deleted, an absent one kNotFound, both naming the tensor). Only the
// shard's tensors are read; the model holds them in memory (its file is the assembled shard).
Result<std::unique_ptr<model::LlamaModel>> open_shard_model(const ShardManifest& manifest,
                                                            const WeightCache& cache);

}  // namespace folio::dist
