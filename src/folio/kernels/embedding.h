// Embedding lookup: output[t, :] = table[token_ids[t], :] as f32, the first op of a forward
// pass. The table is a model tensor in any weight dtype (f32, f16, bf16, q8_0, q4_0), one row
// of `hidden` values per vocabulary entry. Token ids are read through a pointer at run time
// (they change every step of a replayed graph); the shapes are fixed per padded step.
//
// The engine validates token ids before a step; a kernel meeting an id outside [0, vocab_size)
// anyway is a bug: it fails a debug check, and in release writes zeros for that token.
#pragma once

#include <cstdint>

#include "folio/tensor/dtype.h"

namespace folio::kernels {

struct EmbeddingArguments {
  const int32_t* token_ids = nullptr;  // i32 [num_tokens]
  const void* table = nullptr;         // table_dtype [vocab_size, hidden]
  float* output = nullptr;             // f32 [num_tokens, hidden]
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t hidden = 0;  // a multiple of 32 for the quantized dtypes
  DType table_dtype = DType::kF32;
};

}  // namespace folio::kernels
