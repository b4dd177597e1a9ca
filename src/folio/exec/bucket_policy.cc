#include "folio/exec/bucket_policy.h"

#include <algorithm>
#include <charconv>

namespace folio::exec {

std::vector<int32_t> BucketPolicy::default_ladder() {
  std::vector<int32_t> ladder = {1, 2, 4};
  for (int32_t size = 8; size <= 64; size += 8) ladder.push_back(size);
  for (int32_t size = 80; size <= 512; size += 16) ladder.push_back(size);
  return ladder;
}

BucketPolicy::BucketPolicy(std::vector<int32_t> ladder) : ladder_(std::move(ladder)) {
  padded_by_count_.assign(static_cast<size_t>(ladder_.back()) + 1, 0);
  size_t bucket = 0;
  for (int32_t count = 1; count <= ladder_.back(); ++count) {
    while (ladder_[bucket] < count) ++bucket;
    padded_by_count_[static_cast<size_t>(count)] = ladder_[bucket];
  }
}

int32_t BucketPolicy::max_padding() const {
  // The worst count is one above the previous bucket (or 1 for the first).
  int32_t padding = ladder_.front() - 1;
  for (size_t i = 1; i < ladder_.size(); ++i) {
    padding = std::max(padding, ladder_[i] - ladder_[i - 1] - 1);
  }
  return padding;
}

Result<BucketPolicy> BucketPolicy::create(std::vector<int32_t> ladder) {
  if (ladder.empty()) return invalid_argument("bucket ladder is empty; give at least one size");
  for (size_t i = 0; i < ladder.size(); ++i) {
    if (ladder[i] <= 0) {
      return invalid_argument("bucket size {} at position {} is not positive", ladder[i], i);
    }
    if (i > 0 && ladder[i] <= ladder[i - 1]) {
      return invalid_argument("bucket sizes must increase: {} follows {} at position {}", ladder[i],
                              ladder[i - 1], i);
    }
  }
  constexpr int32_t kMaxBucket = 1 << 16;
  if (ladder.back() > kMaxBucket) {
    return invalid_argument("largest bucket {} exceeds the limit of {} tokens", ladder.back(),
                            kMaxBucket);
  }
  return BucketPolicy(std::move(ladder));
}

Result<BucketPolicy> BucketPolicy::parse(const std::string& comma_separated_sizes) {
  std::vector<int32_t> ladder;
  size_t start = 0;
  while (start <= comma_separated_sizes.size()) {
    size_t end = comma_separated_sizes.find(',', start);
    if (end == std::string::npos) end = comma_separated_sizes.size();
    const char* first = comma_separated_sizes.data() + start;
    const char* last = comma_separated_sizes.data() + end;
    int32_t value = 0;
    const auto [pointer, error] = std::from_chars(first, last, value);
    if (error != std::errc() || pointer != last) {
      return invalid_argument("bucket list '{}': '{}' is not a whole number", comma_separated_sizes,
                              std::string(first, last));
    }
    ladder.push_back(value);
    start = end + 1;
  }
  return create(std::move(ladder));
}

}  // namespace folio::exec
