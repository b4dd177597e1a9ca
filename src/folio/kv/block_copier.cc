#include "folio/kv/block_copier.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "folio/base/check.h"

namespace folio::kv {

Status HostKvBlockCopier::copy_blocks(const KvLayoutNumbers& layout,
                                      std::span<const BlockCopy> copies) {
  const auto bytes = static_cast<size_t>(layout.block_bytes);
  for (const BlockCopy& copy : copies) {
    std::memcpy(layout.block_pointer(copy.destination), layout.block_pointer(copy.source), bytes);
  }
  return Status();
}

Status HostKvBlockCopier::copy_to_host(const KvLayoutNumbers& layout, HostSwapSpace& host,
                                       std::span<const BlockCopy> copies) {
  FOLIO_CHECK(host.block_bytes() == layout.block_bytes);
  const auto bytes = static_cast<size_t>(layout.block_bytes);
  for (const BlockCopy& copy : copies) {
    std::memcpy(host.block_address(copy.destination), layout.block_pointer(copy.source), bytes);
  }
  return Status();
}

Status HostKvBlockCopier::copy_to_device(const KvLayoutNumbers& layout, const HostSwapSpace& host,
                                         std::span<const BlockCopy> copies) {
  FOLIO_CHECK(host.block_bytes() == layout.block_bytes);
  const auto bytes = static_cast<size_t>(layout.block_bytes);
  for (const BlockCopy& copy : copies) {
    std::memcpy(layout.block_pointer(copy.destination), host.block_address(copy.source), bytes);
  }
  return Status();
}

double measure_host_copy_bytes_per_second(int64_t bytes, int32_t runs) {
  FOLIO_CHECK(bytes > 0 && runs >= 1, "copy bandwidth of {} bytes over {} runs", bytes, runs);
  std::vector<std::byte> source(static_cast<size_t>(bytes), std::byte{1});
  std::vector<std::byte> destination(static_cast<size_t>(bytes));
  std::memcpy(destination.data(), source.data(), source.size());
  double best_seconds = 0;
  for (int32_t run = 0; run < runs; ++run) {
    // Alternate the direction so no run copies bytes already equal to their destination's.
    std::vector<std::byte>& from = run % 2 == 0 ? destination : source;
    std::vector<std::byte>& to = run % 2 == 0 ? source : destination;
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), from.size());
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    // Read back, so the copy cannot be dropped as a store to memory never read.
    [[maybe_unused]] volatile std::byte sink = to[to.size() / 2];
    if (run == 0 || elapsed.count() < best_seconds) best_seconds = elapsed.count();
  }
  // A clock too coarse to see the copy: one tick of it at most.
  best_seconds = std::max(best_seconds, 1e-9);
  return static_cast<double>(bytes) / best_seconds;
}

}  // namespace folio::kv
