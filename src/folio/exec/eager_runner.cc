#include "folio/exec/eager_runner.h"

#include <vector>

#include "folio/exec/host_buffer.h"
#include "folio/ir/lifetime.h"

namespace folio::exec {

Status run_eager(const PreparedGraph& graph, std::span<std::byte* const> output_addresses,
                 device::HostStream& stream) {
  FOLIO_CHECK(!stream.is_capturing(), "eager execution on a capturing stream");
  const ir::Graph& ir_graph = graph.graph();
  std::vector<std::byte*> addresses(graph.external_addresses().begin(),
                                    graph.external_addresses().end());
  for (const ir::TensorInfo& tensor : ir_graph.tensors()) {
    if (tensor.residency != ir::Residency::kOutput) continue;
    const auto index = static_cast<size_t>(tensor.id.value());
    if (index >= output_addresses.size() || output_addresses[index] == nullptr) {
      return invalid_argument("output '{}' has no buffer to run into", tensor.name);
    }
    addresses[index] = output_addresses[index];
  }

  const std::vector<ir::OpId> order = program_order(ir_graph);
  // dead_after[p]: the activations whose last consumer is the op at position p.
  std::vector<std::vector<ir::TensorId>> dead_after(order.size());
  for (const ir::TensorLifetime& lifetime : ir::analyze_lifetimes(ir_graph, order)) {
    dead_after[static_cast<size_t>(lifetime.last)].push_back(lifetime.tensor);
  }
  std::vector<HostBuffer> activations(static_cast<size_t>(ir_graph.num_tensors()));
  for (size_t position = 0; position < order.size(); ++position) {
    const ir::Op& op = ir_graph.op(order[position]);
    for (ir::TensorId output : op.outputs) {
      const ir::TensorInfo& tensor = ir_graph.tensor(output);
      if (tensor.residency != ir::Residency::kActivation) continue;
      HostBuffer& buffer = activations[static_cast<size_t>(output.value())];
      buffer = HostBuffer(static_cast<size_t>(tensor.bytes()));
      addresses[static_cast<size_t>(output.value())] = buffer.data();
    }
    const HostBuffer workspace(static_cast<size_t>(graph.ops()[position].workspace_bytes));
    graph.launch(position, addresses, workspace.data(), stream);
    for (ir::TensorId dead : dead_after[position]) {
      activations[static_cast<size_t>(dead.value())] = HostBuffer();
      addresses[static_cast<size_t>(dead.value())] = nullptr;
    }
  }
  return Status();
}

}  // namespace folio::exec
