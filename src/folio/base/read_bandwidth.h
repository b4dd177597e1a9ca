// Read bandwidth: how many bytes per second the machine's memory delivers to a streaming read,
// measured now, on the threads of a pool. The denominator of a memory-bound roofline (batch-1
// decode streams every weight once per token): measure it in the same run as the figure it is
// compared with, since a shared machine's bandwidth varies from minute to minute.
//
// The read: each thread sums (64-bit integer adds, which the compiler vectorizes freely) its
// slice of a buffer far larger than the last-level cache, touched once before any timing; the
// best of several passes is kept, as the roofline is what the memory system can deliver.
// bench/kernels/matmul_bench.cc keeps one ReadBandwidthBuffer for its whole run and reads it
// before each roofline figure; `folio bench` measures once, with measure_read_bandwidth.
//
// Thread-safety: uses the pool like any parallel_for caller; one read of a buffer at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "folio/base/thread_pool.h"

namespace folio {

struct ReadBandwidthOptions {
  int64_t buffer_bytes = int64_t{1} << 30;  // several times a large last-level cache
  int passes = 3;
};

// A buffer allocated and touched once (by the threads of the pool it is made with, so first
// touch places its pages near them), then read as often as wanted.
class ReadBandwidthBuffer {
 public:
  // Requires: bytes >= 1 MiB.
  ReadBandwidthBuffer(ThreadPool& pool, int64_t bytes);

  // One parallel read of the whole buffer on `pool` (any thread count): bytes per second.
  double read_pass(ThreadPool& pool);
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_;
  std::unique_ptr<uint64_t[]> words_;
};

// Bytes per second, the best of options.passes parallel reads over a new buffer on `pool`.
// Requires: buffer_bytes >= 1 MiB, passes >= 1.
double measure_read_bandwidth(ThreadPool& pool, const ReadBandwidthOptions& options = {});

}  // namespace folio
