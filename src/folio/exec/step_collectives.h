// StepCollectives: the executor's view of the group of executors a step graph runs in, one per
// member, for the IR's collective ops (all_reduce_sum: tensor parallelism's sum of partial
// projections). The dist layer provides it over a worker group (dist/group_step_collectives.h);
// exec cannot use dist, so the interface lives here.
//
// Every member's executor runs the same step at the same padded shape, so the collective
// launches of a step meet their peers' in the same order with the same sizes (padding rows
// included): the contract of dist/collectives.h.
//
// Kernels cannot return a status: a collective launch that fails records its failure in the
// executor's CollectiveFailures, the step's later collective launches are skipped (the group is
// broken anyway), and Executor::execute returns the first failure once the step has run. The
// step's outputs are then undefined.
#pragma once

#include <span>
#include <utility>

#include "folio/base/status.h"

namespace folio::exec {

class StepCollectives {
 public:
  virtual ~StepCollectives() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Replaces values[i] on every member by the sum over members of their values[i]; the same
  // result, bit for bit, on every member.
  virtual Status all_reduce_sum(std::span<float> values) = 0;
  // output = the inputs of members 0, 1, ..., size-1, one after the other. Requires:
  // output.size() == input.size() * size(), no overlap.
  virtual Status all_gather(std::span<const float> input, std::span<float> output) = 0;
};

// The first failure among one step's collective launches. Written by the pool thread that runs
// a collective launch (a one-item kernel), read by the executor's thread after the launch
// returned: the pool's join orders the two, and no two launches run at once (a stream runs its
// launches one after another).
class CollectiveFailures {
 public:
  void record(Status status) {
    if (first_.ok()) first_ = std::move(status);
  }
  bool any() const { return !first_.ok(); }
  // The first failure since the last take(), or OK; clears it.
  Status take() { return std::exchange(first_, Status()); }

 private:
  Status first_;
};

}  // namespace folio::exec
