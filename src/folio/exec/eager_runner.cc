#include "folio/exec/eager_runner.h"

#include <vector>

#include "folio/exec/host_buffer.h"
#include "folio/ir/lifetime.h"

namespace folio::exec {

Result<ir::BufferPlan> plan_step_activations(const PreparedGraph& graph) {
  const std::vector<ir::OpId> order = program_order(graph.graph());
  std::vector<ir::TensorLifetime> lifetimes = ir::analyze_lifetimes(graph.graph(), order);
  const int32_t num_tensors = graph.graph().num_tensors();
  for (size_t position = 0; position < order.size(); ++position) {
    const int64_t bytes = graph.ops()[static_cast<size_t>(order[position].value())].workspace_bytes;
    if (bytes == 0) continue;
    const auto at = static_cast<int32_t>(position);
    lifetimes.push_back(ir::TensorLifetime{ir::TensorId(num_tensors + at), at, at, bytes});
  }
  return ir::plan_buffers(lifetimes, ir::BufferPlanOptions{static_cast<int64_t>(kBufferAlignment)});
}

Status run_eager(const PreparedGraph& graph, const ir::BufferPlan& plan,
                 std::span<std::byte> scratch, std::span<std::byte* const> output_addresses,
                 device::HostStream& stream) {
  FOLIO_CHECK(!stream.is_capturing(), "eager execution on a capturing stream");
  if (static_cast<int64_t>(scratch.size()) < plan.peak_bytes) {
    return invalid_argument("an eager step needs {} bytes of scratch memory; {} were given",
                            plan.peak_bytes, scratch.size());
  }
  const ir::Graph& ir_graph = graph.graph();
  std::vector<std::byte*> addresses(graph.external_addresses().begin(),
                                    graph.external_addresses().end());
  for (const ir::TensorInfo& tensor : ir_graph.tensors()) {
    const auto index = static_cast<size_t>(tensor.id.value());
    switch (tensor.residency) {
      case ir::Residency::kOutput:
        if (index >= output_addresses.size() || output_addresses[index] == nullptr) {
          return invalid_argument("output '{}' has no buffer to run into", tensor.name);
        }
        addresses[index] = output_addresses[index];
        break;
      case ir::Residency::kActivation: {
        const ir::BufferAssignment* assignment = plan.find(tensor.id);
        addresses[index] = assignment == nullptr ? nullptr : scratch.data() + assignment->offset;
        break;
      }
      case ir::Residency::kWeight:
      case ir::Residency::kInput:
      case ir::Residency::kKvCache:
        break;
    }
  }
  const std::vector<ir::OpId> order = program_order(ir_graph);
  for (size_t position = 0; position < order.size(); ++position) {
    const ir::BufferAssignment* workspace =
        plan.find(ir::TensorId(ir_graph.num_tensors() + static_cast<int32_t>(position)));
    graph.launch(static_cast<size_t>(order[position].value()), addresses,
                 workspace == nullptr ? nullptr : scratch.data() + workspace->offset, stream);
  }
  return Status();
}

}  // namespace folio::exec
