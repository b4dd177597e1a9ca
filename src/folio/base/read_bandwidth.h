// Read bandwidth: how many bytes per second the machine's memory delivers to a streaming read,
// measured now, on the threads of a pool. The denominator of a memory-bound roofline (batch-1
// decode streams every weight once per token): measure it in the same run as the figure it is
// compared with, since a shared machine's bandwidth varies from minute to minute.
//
// The read: each thread sums (64-bit integer adds, which the compiler vectorizes freely) its
// slice of a buffer far larger than the last-level cache, touched once before any timing; the
// best of several passes is kept, as the roofline is what the memory system can deliver.
// (bench/kernels/matmul_bench.cc measures the same with an AVX-512 float sum over 2 GiB.)
//
// Thread-safety: uses the pool like any parallel_for caller.
#pragma once

#include <cstdint>

#include "folio/base/thread_pool.h"

namespace folio {

struct ReadBandwidthOptions {
  int64_t buffer_bytes = int64_t{1} << 30;  // several times a large last-level cache
  int passes = 3;
};

// Bytes per second, the best of options.passes parallel reads over the buffer on `pool`.
// Requires: buffer_bytes >= 1 MiB, passes >= 1.
double measure_read_bandwidth(ThreadPool& pool, const ReadBandwidthOptions& options = {});

}  // namespace folio
