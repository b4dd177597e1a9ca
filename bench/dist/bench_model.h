// The model of the dist benchmarks: 8 layers, hidden 512, 8 heads over 4 KV heads, FFN 1536,
// vocabulary 4096, f16 weights (testing/random_model_file.h writes it, seed 7), so the pipeline,
// tensor-parallel and weight-cache figures are of one model.
#pragma once

#include <cstdint>

#include "folio/model/llama_model.h"
#include "testing/random_model_file.h"

namespace folio::dist {

inline model::LlamaShape bench_model_shape(int64_t context_length) {
  model::LlamaShape shape;
  shape.vocab_size = 4096;
  shape.hidden_size = 512;
  shape.num_layers = 8;
  shape.num_heads = 8;
  shape.num_kv_heads = 4;
  shape.ffn_size = 1536;
  shape.context_length = context_length;
  shape.weight_dtype = DType::kF16;
  return shape;
}

}  // namespace folio::dist
