// OpProfile: where a step's time goes, without a profiler (issue 19). Every kernel the
// executor's stream runs, eager or replayed, is timed where it runs (device::HostStream with an
// observer) and charged to the profile row of the IR op that launched it; the executor adds its
// own work (input preparation, graph capture) and the engine adds step building and sampling.
// At the end of each step the engine folds the step's rows into the totals of its phase
// (decode-only steps, steps with prefill) together with the step's wall time; what no row
// explains is "other" (step time minus the rows, >= 0 because the rows are disjoint intervals
// of the step on one thread).
//
// Rows (ProfileRow): matmuls by the weight they multiply, named as the model graph names them
// (attn_q/k/v/qkv -> matmul_qkv, attn_output, ffn_gate/ffn_up -> matmul_ffn_gate_up,
// ffn_down, output or a tied token_embd -> matmul_lm_head); paged attention; rms norms; rope;
// activations (swiglu, geglu); embedding; kv write; adds (the residuals); gather_rows (the
// logit rows); lora; other ops (scale, soft cap); and thread_wait: the part of each kernel's
// wall time the pool's threads were idle on average, (wall * threads - busy) / threads, from
// load imbalance, wake-up latency and kernels too small to split. A kernel's wall time is split
// between its op's row (busy / threads) and thread_wait, so the rows still sum to the wall
// time.
//
// Calls count IR ops, not kernels (a q8_0 matmul launches two, a rope two): the first kernel of
// each op's launches counts one call.
//
// Cost: off (no profile given to the executor) the stream checks one null pointer per kernel
// and the executor one per step; on, two clock reads per kernel slice and two per kernel.
//
// Thread-safety: one thread drives it (the thread that drives the executor and the engine);
// on_kernel() is called on that thread by its stream.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "folio/device/host_kernel_observer.h"
#include "folio/ir/graph.h"

namespace folio::exec {

enum class ProfileRow : uint8_t {
  kMatmulQkv,
  kMatmulAttentionOutput,
  kMatmulFfnGateUp,
  kMatmulFfnDown,
  kMatmulLmHead,
  kMatmulOther,
  kAttention,
  kRmsNorm,
  kRope,
  kActivation,
  kEmbedding,
  kKvWrite,
  kAdd,
  kGatherRows,
  kLora,
  kCommunication,  // collective ops: waiting for and exchanging with the group's other members
  kOtherOps,
  kThreadWait,
  kInputPreparation,  // the executor: validate the step, write the persistent inputs, look up
  kGraphCapture,      // the executor: building, preparing and capturing a bucket's program
  kStepBuilding,      // the engine: schedule, KV block copies, lay out the step batch
  kSampling,          // the engine: sampling, appending tokens, detokenizing, callbacks
};
inline constexpr int kNumProfileRows = static_cast<int>(ProfileRow::kSampling) + 1;

std::string_view profile_row_name(ProfileRow row);

// The row the launches of `op` (an op of `graph`) are charged to.
ProfileRow profile_row_of(const ir::Graph& graph, const ir::Op& op);

enum class ProfilePhase : uint8_t { kDecode, kPrefill };
inline constexpr int kNumProfilePhases = 2;
std::string_view profile_phase_name(ProfilePhase phase);

// Seconds and calls per row.
struct ProfileTimes {
  std::array<double, kNumProfileRows> seconds{};
  std::array<int64_t, kNumProfileRows> calls{};

  double total_seconds() const;
  void add(const ProfileTimes& other);
};

struct PhaseProfile {
  int64_t steps = 0;
  double step_seconds = 0;  // the steps' wall time
  ProfileTimes rows;
  // Step time no row explains (clamped at 0).
  double other_seconds() const;
};

class OpProfile final : public device::HostKernelObserver {
 public:
  // Charges `seconds` and `calls` to `row` of the current step.
  void add(ProfileRow row, double seconds, int64_t calls = 1) {
    const auto index = static_cast<size_t>(row);
    current_.seconds[index] += seconds;
    current_.calls[index] += calls;
  }
  // Folds the current step into `phase`'s totals with its wall time, and starts a new step.
  void end_step(ProfilePhase phase, double step_seconds);
  // Forgets the current step's rows (work outside any step: start-up captures, a failed step).
  void discard_step() { current_ = ProfileTimes{}; }
  void reset();

  const ProfileTimes& current_step() const { return current_; }
  const PhaseProfile& phase(ProfilePhase phase) const {
    return phases_[static_cast<size_t>(phase)];
  }

  void on_kernel(const device::HostKernel& kernel, const device::KernelTiming& timing) override;

 private:
  ProfileTimes current_;
  std::array<PhaseProfile, kNumProfilePhases> phases_{};
};

}  // namespace folio::exec
