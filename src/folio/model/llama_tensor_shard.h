// LlamaTensorShard: the weights one tensor-parallel rank reads (issue 15, slice 4), an
// ir::WeightSource serving the graphs of LlamaGraphOptions::tensor_split under the tensors'
// GGUF names with the rank's shapes (llama_tensor_split.h):
// - column-split tensors (q, k, v, gate, up and the q/k/v biases): the rank's run of rows,
//   copied out of the model's (contiguous: a GGUF matrix's rows are whole blocks);
// - row-split tensors (attn_output, ffn_down): the rank's run of columns of every row, copied
//   into a dense matrix of its own (the source's rows are strided for it; a legal split never
//   cuts a quantization block, so the copy moves whole blocks and converts nothing);
// - replicated tensors: the model's own views, served as they are.
// Where the CPU prefers q8_0 panels (kernels/cpu/q8_0_panels.h), the rank's q8_0 copies (and an
// untied q8_0 LM head) are packed as panels, as LlamaModel packs a whole model, and shape()'s
// tensor_dtypes names them kQ8_0Panels so the graphs the rank emits agree.
//
// The rank reads only its slices of the split matrices: the other ranks' rows of a column split
// are never touched, so their pages of the file mapping are never faulted in.
//
// Thread-safety: immutable after create; find_weight may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "folio/base/result.h"
#include "folio/ir/step_graph.h"
#include "folio/model/llama_model_file.h"
#include "folio/model/llama_tensor_split.h"

namespace folio::model {

struct LlamaTensorShardOptions {
  // Pack the rank's q8_0 matrices as panels where the CPU prefers them (above).
  bool pack_q8_0_panels = true;
};

class LlamaTensorShard final : public ir::WeightSource {
 public:
  // The shard of rank `split.rank` over `source`, the whole model's weights of `shape` in their
  // file layout (a LlamaModel opened with LlamaLoadOptions::pack_q8_0_panels = false: panels
  // interleave rows and cannot be sliced by columns). `source` must outlive the shard.
  // Errors: an illegal split (validate_llama_tensor_split, kInvalidArgument), a missing or
  // malformed weight (the source's error), a source serving packed panels
  // (kFailedPrecondition), no memory for the copies (kResourceExhausted).
  static Result<std::unique_ptr<LlamaTensorShard>> create(const LlamaShape& shape,
                                                          const ir::WeightSource& source,
                                                          const LlamaTensorSplit& split,
                                                          const LlamaTensorShardOptions& options);

  Result<TensorView> find_weight(std::string_view name) const override;

  // The model's shape, but for the rank's matrices packed as panels (tensor_dtypes names them
  // kQ8_0Panels): what the rank's graphs must be emitted from.
  const LlamaShape& shape() const { return shape_; }
  const LlamaTensorSplit& split() const { return split_; }
  // Bytes of the rank's own copies (its slices, packed or not).
  int64_t owned_bytes() const { return owned_bytes_; }
  // How many of the rank's matrices are packed as panels.
  int64_t num_packed() const { return num_packed_; }

 private:
  struct FreeDeleter {
    void operator()(std::byte* bytes) const { std::free(bytes); }
  };

  LlamaTensorShard(const LlamaShape& shape, const ir::WeightSource& source,
                   const LlamaTensorSplit& split)
      : shape_(shape), source_(source), split_(split) {}

  LlamaShape shape_;
  const ir::WeightSource& source_;
  const LlamaTensorSplit split_;
  std::unique_ptr<std::byte, FreeDeleter> arena_;         // every copy, 64-byte aligned in it
  std::map<std::string, TensorView, std::less<>> owned_;  // GGUF name -> view into arena_
  int64_t owned_bytes_ = 0;
  int64_t num_packed_ = 0;
};

}  // namespace folio::model
