#include "folio/device/mapping_table.h"

#include <atomic>
#include <iterator>

#include "folio/base/check.h"

namespace folio::device {

bool MappingTable::is_unmapped(size_t offset, size_t bytes) const {
  const size_t end = offset + bytes;
  auto next = mappings_.lower_bound(offset);
  if (next != mappings_.end() && next->first < end) return false;
  if (next == mappings_.begin()) return true;
  const Mapping& previous = std::prev(next)->second;
  return previous.range_offset + previous.bytes <= offset;
}

bool MappingTable::is_fully_mapped(size_t offset, size_t bytes) const {
  const size_t end = offset + bytes;
  auto it = mappings_.upper_bound(offset);
  if (it == mappings_.begin()) return false;
  --it;  // the last mapping starting at or before offset
  size_t covered_until = offset;
  for (; it != mappings_.end() && it->first <= covered_until; ++it) {
    covered_until = std::max(covered_until, it->first + it->second.bytes);
    if (covered_until >= end) return true;
  }
  return false;
}

void MappingTable::insert(const Mapping& mapping) {
  FOLIO_CHECK(mapping.bytes > 0, "empty mapping at offset {}", mapping.range_offset);
  FOLIO_CHECK(is_unmapped(mapping.range_offset, mapping.bytes),
              "mapping [{}, +{}) overlaps an existing one", mapping.range_offset, mapping.bytes);
  mappings_.emplace(mapping.range_offset, mapping);
  num_mapped_bytes_ += mapping.bytes;
}

void MappingTable::split_at(size_t offset) {
  auto it = mappings_.upper_bound(offset);
  if (it == mappings_.begin()) return;
  Mapping& left = std::prev(it)->second;
  const size_t left_end = left.range_offset + left.bytes;
  if (left.range_offset == offset || left_end <= offset) return;
  const size_t cut = offset - left.range_offset;
  Mapping right{offset, left.bytes - cut, left.memory, left.memory_offset + cut};
  left.bytes = cut;
  mappings_.emplace(offset, right);
}

void MappingTable::erase(size_t offset, size_t bytes) {
  FOLIO_CHECK(is_fully_mapped(offset, bytes), "erase of [{}, +{}) which is not fully mapped",
              offset, bytes);
  const size_t end = offset + bytes;
  split_at(offset);
  split_at(end);
  auto first = mappings_.lower_bound(offset);
  auto last = mappings_.lower_bound(end);
  for (auto it = first; it != last; ++it) num_mapped_bytes_ -= it->second.bytes;
  mappings_.erase(first, last);
}

std::vector<Mapping> MappingTable::mappings() const {
  std::vector<Mapping> result;
  result.reserve(mappings_.size());
  for (const auto& [offset, mapping] : mappings_) result.push_back(mapping);
  return result;
}

Status check_granular_size(size_t bytes, size_t granularity, std::string_view what) {
  if (bytes == 0)
    return invalid_argument("{}: size is 0; it must be a positive multiple of {}", what,
                            granularity);
  if (bytes % granularity != 0) {
    return invalid_argument("{}: size {} is not a multiple of the granularity {}", what, bytes,
                            granularity);
  }
  return Status::ok_status();
}

Status check_region(size_t offset, size_t bytes, size_t limit, size_t granularity,
                    std::string_view what) {
  if (offset % granularity != 0) {
    return invalid_argument("{}: offset {} is not a multiple of the granularity {}", what, offset,
                            granularity);
  }
  FOLIO_RETURN_IF_ERROR(check_granular_size(bytes, granularity, what));
  size_t end = 0;
  if (__builtin_add_overflow(offset, bytes, &end) || end > limit) {
    return invalid_argument("{}: region at offset {} of {} bytes ends past the limit of {} bytes",
                            what, offset, bytes, limit);
  }
  return Status::ok_status();
}

int64_t next_virtual_memory_handle_id() {
  // Only uniqueness matters, so relaxed ordering suffices.
  static std::atomic<int64_t> next_id{1};
  return next_id.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace folio::device
