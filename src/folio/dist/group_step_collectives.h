// GroupStepCollectives: a member of a worker group (collectives.h) as the executor sees it
// (exec/step_collectives.h), so the collective ops of a step graph (tensor parallelism's
// all_reduce_sum) run over the in-process or the gloo backend unchanged.
//
// Thread-safety: that of the Collectives it wraps (one thread at a time: the executor's
// stream runs collective launches one after another, each on one pool thread).
#pragma once

#include "folio/dist/collectives.h"
#include "folio/exec/step_collectives.h"

namespace folio::dist {

class GroupStepCollectives final : public exec::StepCollectives {
 public:
  // Requires: `group` outlives this object.
  explicit GroupStepCollectives(Collectives& group) : group_(group) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Status all_reduce_sum(std::span<float> values) override { return group_.all_reduce_sum(values); }
  Status all_gather(std::span<const float> input, std::span<float> output) override {
    return group_.all_gather(input, output);
  }

 private:
  Collectives& group_;
};

}  // namespace folio::dist
