// The Llama step graph for tests of the layers it passes through below the model (ir/ passes,
// exec/): the model layer's own emitter (model::build_llama_step_graph) at a small model shape,
// one step shape and a paged KV cache, so these tests run the graphs the engine runs and there is
// one Llama emitter. Linking it needs folio_model.
#pragma once

#include <cstdint>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/step_graph.h"
#include "folio/model/llama_graph.h"
#include "folio/model/llama_model_file.h"

namespace folio::testing {

struct LlamaTestGraphConfig {
  // LlamaShape's defaults: vocabulary 512, hidden 64, two layers, four heads of 16 over two KV
  // heads, FFN 128, f32. Qwen 2 (kQwen2) adds Q/K/V biases and NeoX RoPE.
  model::LlamaShape model;
  // T 16 tokens, S 4 sequence slots, R 4 logit rows; a prefill bucket (ir::Phase::kMixed).
  ir::StepShape step{16, 4, 4, ir::StepPhase::kPrefill};
  int64_t num_blocks = 32;
  int32_t block_size = 16;
  int32_t max_blocks_per_sequence = 4;
  DType kv_dtype = DType::kF32;

  ir::KvCacheShape kv_cache() const {
    return ir::KvCacheShape{model::llama_kv_cache_geometry(model, block_size, kv_dtype), num_blocks,
                            max_blocks_per_sequence};
  }
};

inline Result<ir::Graph> build_llama_test_graph(const LlamaTestGraphConfig& config = {}) {
  return model::build_llama_step_graph(config.model, config.step, config.kv_cache());
}

}  // namespace folio::testing
