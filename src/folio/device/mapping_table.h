// MappingTable: the bookkeeping of one AddressRange: which regions of it are mapped, and to which
// bytes of which PhysicalMemory. TrackedVirtualMemory (every backend's VirtualMemory) keeps one
// per range and asks it whether a map / unmap / set_access is legal before touching the OS or the
// driver, so a bad call is refused before anything changes.
//
// Terms: a Mapping is one contiguous piece [range_offset, range_offset + bytes) of the range,
// backed by [memory_offset, memory_offset + bytes) of `memory`. Unmapping part of a mapping
// splits it; the pieces left keep their memory and their (shifted) memory offsets.
//
// Invariants: mappings never overlap and have bytes > 0. Adjacent mappings are not merged (they
// may come from different memories), so num_mappings() counts map() calls net of splits.
//
// Thread-safety: none; the owning TrackedVirtualMemory serializes access under its mutex.
#pragma once

#include <cstddef>
#include <map>
#include <string_view>
#include <vector>

#include "folio/base/status.h"
#include "folio/device/virtual_memory.h"

namespace folio::device {

struct Mapping {
  size_t range_offset = 0;
  size_t bytes = 0;
  PhysicalMemoryId memory;
  size_t memory_offset = 0;

  friend bool operator==(const Mapping&, const Mapping&) = default;
};

class MappingTable {
 public:
  // True when no byte of [offset, offset + bytes) is mapped.
  bool is_unmapped(size_t offset, size_t bytes) const;
  // True when every byte of [offset, offset + bytes) is mapped (by one mapping or several).
  bool is_fully_mapped(size_t offset, size_t bytes) const;

  // Requires: is_unmapped(mapping.range_offset, mapping.bytes), mapping.bytes > 0.
  void insert(const Mapping& mapping);
  // Removes [offset, offset + bytes), splitting the mappings that straddle its edges.
  // Requires: is_fully_mapped(offset, bytes).
  void erase(size_t offset, size_t bytes);

  // Every mapping, in address order.
  std::vector<Mapping> mappings() const;
  bool empty() const { return mappings_.empty(); }
  size_t num_mappings() const { return mappings_.size(); }
  size_t num_mapped_bytes() const { return num_mapped_bytes_; }

 private:
  // Makes a mapping start exactly at `offset` when one covers it, by splitting that mapping.
  void split_at(size_t offset);

  std::map<size_t, Mapping> mappings_;  // keyed by range_offset
  size_t num_mapped_bytes_ = 0;         // sum of bytes over mappings_
};

// Argument checks made by TrackedVirtualMemory. Each returns kInvalidArgument with a message
// naming `what` (e.g. "map: range offset") when the check fails.

// `bytes` is a positive multiple of `granularity`.
Status check_granular_size(size_t bytes, size_t granularity, std::string_view what);
// [offset, offset + bytes) is non-empty, granular, and inside [0, limit); the end is computed
// with checked arithmetic, so an offset near SIZE_MAX is refused rather than wrapping around.
Status check_region(size_t offset, size_t bytes, size_t limit, size_t granularity,
                    std::string_view what);

// A process-wide unique, positive handle id, so a handle from one VirtualMemory instance is never
// mistaken for a live handle of another.
int64_t next_virtual_memory_handle_id();

}  // namespace folio::device
