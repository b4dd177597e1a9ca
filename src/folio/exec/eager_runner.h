// Eager execution: a prepared step graph run op by op in program order, the baseline and the
// reference every captured program is tested against (bit for bit on the CPU). No capture: each
// op is launched as it comes. Its activations and workspaces live in one block of scratch
// memory the caller provides (the executor takes it from the page pool: step_memory.h), laid
// out by the same lifetime-based plan a captured program uses (plan_step_activations), so an
// eager step needs the same peak bytes as the capture of its shape would.
#pragma once

#include <span>

#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/device/host_stream.h"
#include "folio/exec/prepared_graph.h"
#include "folio/ir/buffer_plan.h"

namespace folio::exec {

// The plan of `graph`'s activations in program order, plus each op's workspace as a scratch
// tensor (id num_tensors + position) live only at the op's own position; offsets are aligned to
// kBufferAlignment. Captured programs (program.h) and eager steps both use it.
Result<ir::BufferPlan> plan_step_activations(const PreparedGraph& graph);

// output_addresses[t] is where output tensor t is written (indexed by tensor id; at least the
// tensor's bytes). `plan` is plan_step_activations(graph) and `scratch` holds at least its
// peak_bytes. kInvalidArgument, before anything runs, when an output has no address or the
// scratch is too small. Requires: `stream` is not capturing and its pool has
// graph.num_threads() threads.
Status run_eager(const PreparedGraph& graph, const ir::BufferPlan& plan,
                 std::span<std::byte> scratch, std::span<std::byte* const> output_addresses,
                 device::HostStream& stream);

}  // namespace folio::exec
