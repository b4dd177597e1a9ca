// BucketPolicy: which padded shape a step runs at. A step's token count is rounded up through a
// ladder of bucket sizes (default 1, 2, 4, 8, then steps of 8 to 64, then of 16 to 512), so a
// handful of captured graphs cover every batch; a count above the largest bucket runs eagerly.
// The ladder is expanded once into a lookup table indexed by token count, so choosing a bucket
// on the per-step path is one array read.
//
// BucketKey names a captured graph: the padded token count and the step's phase, with room for
// more fields (anything that changes launch shapes, workspace or tiling belongs in the key).
//
// Thread-safety: immutable after construction.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/ir/step_batch.h"

namespace folio::exec {

struct BucketKey {
  int32_t num_tokens = 0;  // padded token count
  ir::StepPhase phase = ir::StepPhase::kDecode;

  auto operator<=>(const BucketKey&) const = default;
};

class BucketPolicy {
 public:
  // The default ladder: 1, 2, 4, 8, 16, ..., 64 (steps of 8), 80, ..., 512 (steps of 16).
  static std::vector<int32_t> default_ladder();

  // Requires nothing; errors: empty ladder, a non-positive size, sizes not strictly increasing.
  static Result<BucketPolicy> create(std::vector<int32_t> ladder);
  // "1,2,4,8-64:8,80-512:16" style is not supported; a plain comma-separated list is.
  static Result<BucketPolicy> parse(const std::string& comma_separated_sizes);

  // The padded size for `num_tokens`, or nullopt when it is above the largest bucket (run
  // eagerly). Requires: num_tokens >= 1.
  std::optional<int32_t> padded_size(int32_t num_tokens) const {
    if (num_tokens > largest()) return std::nullopt;
    return padded_by_count_[static_cast<size_t>(num_tokens)];
  }

  int32_t largest() const { return ladder_.back(); }
  // The most padding tokens any count gets (padded_size(n) - n, maximized over n).
  int32_t max_padding() const;
  const std::vector<int32_t>& ladder() const { return ladder_; }

 private:
  explicit BucketPolicy(std::vector<int32_t> ladder);

  std::vector<int32_t> ladder_;
  // padded_by_count_[n] = the smallest ladder size >= n, for n in [1, largest()].
  std::vector<int32_t> padded_by_count_;
};

}  // namespace folio::exec

template <>
struct std::hash<folio::exec::BucketKey> {
  size_t operator()(const folio::exec::BucketKey& key) const noexcept {
    return std::hash<int64_t>()((int64_t{key.num_tokens} << 8) | static_cast<int64_t>(key.phase));
  }
};
