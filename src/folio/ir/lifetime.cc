#include "folio/ir/lifetime.h"

#include <algorithm>

#include "folio/base/check.h"

namespace folio::ir {

std::vector<TensorLifetime> analyze_lifetimes(const Graph& graph, std::span<const OpId> order) {
  FOLIO_CHECK(order.size() == static_cast<size_t>(graph.num_ops()),
              "order of {} ops for a graph of {}", order.size(), graph.num_ops());
  constexpr int32_t kUnset = -1;
  const auto num_tensors = static_cast<size_t>(graph.num_tensors());
  std::vector<int32_t> first(num_tensors, kUnset);
  std::vector<int32_t> last(num_tensors, kUnset);
  for (size_t at = 0; at < order.size(); ++at) {
    const Op& op = graph.op(order[at]);
    const auto position = static_cast<int32_t>(at);
    for (TensorId output : op.outputs) {
      first[static_cast<size_t>(output.value())] = position;
      int32_t& end = last[static_cast<size_t>(output.value())];
      end = std::max(end, position);
    }
    for (TensorId input : op.inputs) {
      int32_t& end = last[static_cast<size_t>(input.value())];
      end = std::max(end, position);
    }
  }
  std::vector<TensorLifetime> lifetimes;
  for (const TensorInfo& tensor : graph.tensors()) {
    if (!is_arena_planned(tensor.residency)) continue;
    const auto index = static_cast<size_t>(tensor.id.value());
    FOLIO_CHECK(first[index] != kUnset && last[index] >= first[index],
                "activation '{}' is not produced before its uses; verify the order first",
                tensor.name);
    lifetimes.push_back(TensorLifetime{tensor.id, first[index], last[index], tensor.bytes()});
  }
  return lifetimes;
}

}  // namespace folio::ir
