#include "folio/ir/buffer_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace folio::ir {
namespace {

Status validate_request(std::span<const TensorLifetime> lifetimes,
                        const BufferPlanOptions& options) {
  if (options.alignment <= 0 || (options.alignment & (options.alignment - 1)) != 0) {
    return invalid_argument("buffer alignment {} is not a positive power of two",
                            options.alignment);
  }
  std::vector<int32_t> ids;
  ids.reserve(lifetimes.size());
  for (const TensorLifetime& lifetime : lifetimes) {
    if (!lifetime.tensor.is_valid() || lifetime.first < 0 || lifetime.last < lifetime.first ||
        lifetime.bytes < 0) {
      return invalid_argument(
          "tensor {} has lifetime [{}, {}] and {} bytes; expected a valid id, "
          "0 <= first <= last and bytes >= 0",
          lifetime.tensor.value(), lifetime.first, lifetime.last, lifetime.bytes);
    }
    if (lifetime.bytes > std::numeric_limits<int64_t>::max() / 4) {
      return invalid_argument("tensor {} of {} bytes is too large to plan", lifetime.tensor.value(),
                              lifetime.bytes);
    }
    ids.push_back(lifetime.tensor.value());
  }
  std::sort(ids.begin(), ids.end());
  if (auto duplicate = std::adjacent_find(ids.begin(), ids.end()); duplicate != ids.end()) {
    return invalid_argument("tensor {} is listed twice", *duplicate);
  }
  return Status();
}

int64_t round_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Lowest-waste offset for `size` bytes among the occupied ranges of overlapping tensors:
// the smallest gap that fits, else just above all of them.
int64_t best_fit_offset(std::vector<std::pair<int64_t, int64_t>>& occupied, int64_t size) {
  std::sort(occupied.begin(), occupied.end());
  int64_t cursor = 0;  // end of the occupied prefix scanned so far
  int64_t best_offset = -1;
  int64_t best_gap = std::numeric_limits<int64_t>::max();
  for (const auto& [begin, end] : occupied) {
    const int64_t gap = begin - cursor;
    if (gap >= size && gap < best_gap) {
      best_gap = gap;
      best_offset = cursor;
    }
    cursor = std::max(cursor, end);
  }
  return best_offset >= 0 ? best_offset : cursor;
}

}  // namespace

const BufferAssignment* BufferPlan::find(TensorId tensor) const {
  if (!tensor.is_valid() ||
      static_cast<size_t>(tensor.value()) >= assignment_index_by_tensor.size()) {
    return nullptr;
  }
  const int32_t index = assignment_index_by_tensor[static_cast<size_t>(tensor.value())];
  return index < 0 ? nullptr : &assignments[static_cast<size_t>(index)];
}

Result<BufferPlan> plan_buffers(std::span<const TensorLifetime> lifetimes,
                                const BufferPlanOptions& options) {
  FOLIO_RETURN_IF_ERROR(validate_request(lifetimes, options));
  BufferPlan plan;
  plan.alignment = options.alignment;
  plan.assignments.resize(lifetimes.size());
  int32_t max_id = -1;
  for (size_t index = 0; index < lifetimes.size(); ++index) {
    const TensorLifetime& lifetime = lifetimes[index];
    plan.assignments[index] =
        BufferAssignment{lifetime.tensor, 0, round_up(lifetime.bytes, options.alignment),
                         lifetime.first, lifetime.last};
    plan.total_bytes_without_reuse += plan.assignments[index].size;
    max_id = std::max(max_id, lifetime.tensor.value());
  }
  std::vector<size_t> by_size(lifetimes.size());
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::sort(by_size.begin(), by_size.end(), [&](size_t a, size_t b) {
    const BufferAssignment& x = plan.assignments[a];
    const BufferAssignment& y = plan.assignments[b];
    if (x.size != y.size) return x.size > y.size;
    if (x.first != y.first) return x.first < y.first;
    return x.tensor < y.tensor;
  });
  std::vector<size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> occupied;
  for (size_t index : by_size) {
    BufferAssignment& assignment = plan.assignments[index];
    occupied.clear();
    for (size_t other_index : placed) {
      const BufferAssignment& other = plan.assignments[other_index];
      if (other.first <= assignment.last && assignment.first <= other.last && other.size > 0) {
        occupied.emplace_back(other.offset, other.offset + other.size);
      }
    }
    assignment.offset = best_fit_offset(occupied, assignment.size);
    plan.peak_bytes = std::max(plan.peak_bytes, assignment.offset + assignment.size);
    placed.push_back(index);
  }
  plan.assignment_index_by_tensor.assign(static_cast<size_t>(max_id + 1), -1);
  for (size_t index = 0; index < plan.assignments.size(); ++index) {
    plan.assignment_index_by_tensor[static_cast<size_t>(plan.assignments[index].tensor.value())] =
        static_cast<int32_t>(index);
  }
  return plan;
}

}  // namespace folio::ir
