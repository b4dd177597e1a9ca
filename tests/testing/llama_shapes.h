// Named Llama model shapes shared by tests that generate a model file (model::LlamaShape). Only
// shapes that really are the same are shared; a test whose golden data depends on its shape
// keeps its own numbers (the reference models: LlamaShape's defaults with an architecture and
// dtype, tests/data/reference).
#pragma once

#include <cstdint>

#include "folio/model/llama_model_file.h"

namespace folio::testing {

// One layer, hidden 32, two heads over one KV head, vocabulary 300 (above the generated
// vocabulary's minimum of 259), context 256: the smallest model a server or file-tool test loads.
inline model::LlamaShape tiny_llama_shape() {
  model::LlamaShape shape;
  shape.vocab_size = 300;
  shape.hidden_size = 32;
  shape.num_layers = 1;
  shape.num_heads = 2;
  shape.num_kv_heads = 1;
  shape.ffn_size = 64;
  shape.context_length = 256;
  return shape;
}

// Two layers, hidden 64, four heads over two KV heads, FFN 96, context 128, in `weight_dtype`:
// the model-file round-trip tests' shape (each keeps its own vocabulary size).
inline model::LlamaShape small_llama_shape(DType weight_dtype, int64_t vocab_size) {
  model::LlamaShape shape;
  shape.vocab_size = vocab_size;
  shape.hidden_size = 64;
  shape.num_layers = 2;
  shape.num_heads = 4;
  shape.num_kv_heads = 2;
  shape.ffn_size = 96;
  shape.context_length = 128;
  shape.weight_dtype = weight_dtype;
  return shape;
}

}  // namespace folio::testing
