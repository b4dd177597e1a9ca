#include "folio/ir/step_batch.h"

#include <algorithm>

#include "folio/base/check.h"

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

StepBatch StepBatch::for_kv_member(int32_t member) const {
  FOLIO_CHECK(member >= 0 && member < num_kv_members(), "member {} of {}", member,
              num_kv_members());
  StepBatch view = *this;
  view.slot_mapping = kv_members[static_cast<size_t>(member)].slot_mapping;
  view.block_tables = kv_members[static_cast<size_t>(member)].block_tables;
  view.kv_members = {};
  return view;
}

}  // namespace folio::ir
