// KvBlockCopier: whole-block copies for copy-on-write and swap, issued as batches of
// (source, destination) pairs so a device backend can run each batch as one operation (one
// batched copy kernel or one cudaMemcpyBatchAsync) instead of one call per block.
//
// The block manager guarantees that within one batch no block is both a source and a
// destination and no destination repeats, so the pairs may be copied in any order or in
// parallel. Device blocks are addressed through KvLayoutNumbers (kv_types.h); host blocks
// through HostSwapSpace.
//
// Thread-safety: a copier is used by the block manager's thread; the host implementation is
// stateless.
#pragma once

#include <cstdint>
#include <span>

#include "folio/base/status.h"
#include "folio/kv/host_swap_space.h"
#include "folio/kv/kv_types.h"

namespace folio::kv {

class KvBlockCopier {
 public:
  virtual ~KvBlockCopier() = default;
  // Device block -> device block (copy-on-write).
  virtual Status copy_blocks(const KvLayoutNumbers& layout, std::span<const BlockCopy> copies) = 0;
  // Device block -> host swap block (swap out).
  virtual Status copy_to_host(const KvLayoutNumbers& layout, HostSwapSpace& host,
                              std::span<const BlockCopy> copies) = 0;
  // Host swap block -> device block (swap in).
  virtual Status copy_to_device(const KvLayoutNumbers& layout, const HostSwapSpace& host,
                                std::span<const BlockCopy> copies) = 0;
};

// memcpy of block_bytes per pair, for KV caches in host memory.
class HostKvBlockCopier final : public KvBlockCopier {
 public:
  Status copy_blocks(const KvLayoutNumbers& layout, std::span<const BlockCopy> copies) override;
  Status copy_to_host(const KvLayoutNumbers& layout, HostSwapSpace& host,
                      std::span<const BlockCopy> copies) override;
  Status copy_to_device(const KvLayoutNumbers& layout, const HostSwapSpace& host,
                        std::span<const BlockCopy> copies) override;
};

// The host's copy bandwidth in bytes per second: one memcpy of `bytes` between two host buffers,
// the best of `runs` timed runs after one untimed run that touches every page. What
// HostKvBlockCopier's swap copies move per second at best; measured at start-up for the
// scheduler's recompute-or-swap decision (engine/preemption_cost.h). Takes 2 * bytes of memory
// for the call. Requires: bytes > 0, runs >= 1.
double measure_host_copy_bytes_per_second(int64_t bytes = int64_t{8} << 20, int32_t runs = 3);

}  // namespace folio::kv
