// Eager execution: a prepared step graph run op by op in program order, the baseline and the
// reference every captured program is tested against (bit for bit on the CPU). Each activation
// gets its own allocation when its producer runs and is freed after its last consumer; each op's
// workspace lives only for its launch. No planner, no arena, no capture.
#pragma once

#include <span>

#include "folio/base/status.h"
#include "folio/device/host_stream.h"
#include "folio/exec/prepared_graph.h"

namespace folio::exec {

// output_addresses[t] is where output tensor t is written (indexed by tensor id; at least the
// tensor's bytes). kInvalidArgument, before anything runs, when an output has no address.
// Requires: `stream` is not capturing and its pool has graph.num_threads() threads.
Status run_eager(const PreparedGraph& graph, std::span<std::byte* const> output_addresses,
                 device::HostStream& stream);

}  // namespace folio::exec
