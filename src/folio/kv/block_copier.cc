#include "folio/kv/block_copier.h"

#include <cstring>

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

}  // namespace folio::kv
