// build_random_test_graph: a random valid graph from a seed, mixing every op kind (silu and mul
// included, which no model emits) with activations of varied sizes and lifetimes, for property
// tests of the ir/ passes. The Llama step graph tests use is the model layer's own
// (testing/llama_test_graph.h).
#pragma once

#include <cstdint>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/op.h"

namespace folio::ir::testing {

struct RandomGraphOptions {
  int32_t num_ops = 40;
  int64_t num_tokens = 8;
  // Probability (in percent) that a step emits attention (with its KV-cache write).
  int32_t attention_percent = 15;
};

Result<Graph> build_random_test_graph(uint64_t seed, const RandomGraphOptions& options = {});

}  // namespace folio::ir::testing
