// TimedStepCollectives: an exec::StepCollectives that forwards every call to another and counts
// what it cost: calls, bytes handed to the all-reduces (each member's own input), bytes the
// all_gathers received from the other members (KV-parallel groups' exchange), and the wall time
// spent inside the calls, which includes waiting for the slowest member. What tensor
// parallelism's figures report as "time in communication" and "bytes on the wire" per token
// (a ring all-reduce of B bytes sends 2 (n - 1) / n B from each member; the count here is B, the
// reduced bytes, which wire_bytes() converts).
//
// Thread-safety: the calls, like the wrapped object's, from one thread at a time; stats() from
// any thread (the counters are atomics).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>

#include "folio/base/status.h"
#include "folio/exec/step_collectives.h"

namespace folio::dist {

struct CommunicationStats {
  int64_t calls = 0;
  int64_t reduced_bytes = 0;   // f32 bytes of each all_reduce_sum's input, summed
  int64_t gathered_bytes = 0;  // f32 bytes each all_gather received from the other members
  int64_t nanoseconds = 0;     // wall time inside the calls
  int64_t group_size = 1;

  // Bytes one member sends for reduced_bytes by a ring all-reduce: 2 (n - 1) / n of them.
  int64_t wire_bytes() const {
    return group_size > 1 ? reduced_bytes * 2 * (group_size - 1) / group_size : 0;
  }
};

class TimedStepCollectives final : public exec::StepCollectives {
 public:
  // `inner` must outlive this object.
  explicit TimedStepCollectives(exec::StepCollectives& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }

  Status all_reduce_sum(std::span<float> values) override {
    const auto start = std::chrono::steady_clock::now();
    Status status = inner_.all_reduce_sum(values);
    count(start, static_cast<int64_t>(values.size_bytes()));
    return status;
  }

  Status all_gather(std::span<const float> input, std::span<float> output) override {
    const auto start = std::chrono::steady_clock::now();
    Status status = inner_.all_gather(input, output);
    count(start, 0);
    gathered_.fetch_add(static_cast<int64_t>(output.size_bytes() - input.size_bytes()),
                        std::memory_order_relaxed);
    return status;
  }

  CommunicationStats stats() const {
    return CommunicationStats{calls_.load(std::memory_order_relaxed),
                              bytes_.load(std::memory_order_relaxed),
                              gathered_.load(std::memory_order_relaxed),
                              nanoseconds_.load(std::memory_order_relaxed), inner_.size()};
  }

 private:
  void count(std::chrono::steady_clock::time_point start, int64_t bytes) {
    const auto elapsed = std::chrono::steady_clock::now() - start;
    calls_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    nanoseconds_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count(),
                           std::memory_order_relaxed);
  }

  exec::StepCollectives& inner_;
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> gathered_{0};
  std::atomic<int64_t> nanoseconds_{0};
};

}  // namespace folio::dist
