// ReferenceInterpreter: an independent, naive evaluator of IR step graphs in double precision,
// written from the op semantics in ir/op.h and nothing of exec/ or kernels/. It checks that
// the executor's dispatch (operand positions, strides, the KV-cache mapping, the persistent
// input binding) computes what the graph means. It keeps its own KV store, keyed by cache
// tensor name and slot, across steps.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exec_test_util.h"
#include "folio/base/result.h"
#include "folio/ir/graph.h"

namespace folio::exec::testing {

class ReferenceInterpreter {
 public:
  explicit ReferenceInterpreter(const RandomWeights& weights) : weights_(weights) {}

  // Runs `graph` (emitted for the step's exact shape: T = tokens, S = sequences, R = logit
  // rows) on `step` and returns its output "logits", row-major [R, vocab].
  Result<std::vector<double>> run(const ir::Graph& graph, const ir::StepBatch& step);

 private:
  using Values = std::vector<double>;
  Status evaluate(const ir::Graph& graph, const ir::Op& op, std::vector<Values>& values);
  Values input_values(const ir::TensorInfo& tensor, const ir::StepBatch& step) const;
  void attention(const ir::Graph& graph, const ir::Op& op, std::vector<Values>& values) const;
  void kv_write(const ir::Graph& graph, const ir::Op& op, const std::vector<Values>& values);

  const RandomWeights& weights_;
  std::map<std::pair<std::string, int64_t>, Values> kv_;  // (cache tensor, slot) -> row
};

}  // namespace folio::exec::testing
