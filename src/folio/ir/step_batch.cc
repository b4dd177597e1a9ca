#include "folio/ir/step_batch.h"

#include <algorithm>

namespace folio::ir {

std::string_view step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::kDecode:
      return "decode";
    case StepPhase::kPrefill:
      return "prefill";
  }
  return "unknown";
}

int32_t StepBatch::max_query_length() const {
  int32_t longest = 0;
  for (size_t s = 0; s + 1 < query_start.size(); ++s) {
    longest = std::max(longest, query_start[s + 1] - query_start[s]);
  }
  return longest;
}

}  // namespace folio::ir
