// Helpers for tests that drive a Scheduler directly over a real block manager: hand-made
// sequences, and one step "run" without a model.
#pragma once

#include <cstdint>
#include <memory>

#include "folio/engine/scheduler.h"
#include "folio/kv/block_manager.h"

namespace folio::engine::testing {

// A WAITING sequence of request and KV id `id`, arriving at `arrival` in `id` order, whose prompt
// is prompt_length consecutive tokens from first_token (distinct per id by default: no prefix
// sharing).
inline std::unique_ptr<Sequence> make_sequence(int64_t id, int32_t prompt_length, TimePoint arrival,
                                               int32_t first_token = -1) {
  auto sequence = std::make_unique<Sequence>();
  sequence->request = RequestId(id);
  sequence->seq = kv::SeqId(id);
  sequence->arrival = arrival;
  sequence->arrival_order = id;
  if (first_token < 0) first_token = static_cast<int32_t>(id) * 1000;
  for (int32_t index = 0; index < prompt_length; ++index) {
    sequence->tokens.push_back(first_token + index);
  }
  sequence->num_prompt_tokens = prompt_length;
  return sequence;
}

// One step: schedule, "run" (complete), give every sampling row the token 7, and check both
// the scheduler's and the block manager's invariants.
inline StepPlan run_step(Scheduler& scheduler, kv::BlockManager& manager, TimePoint now) {
  StepPlan plan = scheduler.schedule(now);
  scheduler.complete(plan);
  for (const ScheduledSegment& segment : plan.segments) {
    if (segment.wants_logits) segment.sequence->tokens.push_back(7);
  }
  scheduler.check_invariants();
  manager.check_invariants();
  return plan;
}

}  // namespace folio::engine::testing
