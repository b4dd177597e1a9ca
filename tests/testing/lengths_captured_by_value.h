// LengthsCapturedByValue: the executor fault the replay tests exist for, injected through
// exec::AttentionCaptureHook. At each paged-attention launch being captured it copies the
// persistent context lengths (seq_lens, S entries) and points the launch at the copy: a per-step
// value captured by value, so every replay reads the lengths of the step that captured it.
// Replay after the lengths change must then disagree with eager execution
// (tests/exec/replay_test.cc, docs/design/exec.md invariant 2).
//
// Thread-safety: none; one executor's driving thread. Must outlive the executor it is given to
// (the captured launches read its copies).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "folio/exec/attention_capture_hook.h"

namespace folio::testing {

class LengthsCapturedByValue final : public exec::AttentionCaptureHook {
 public:
  void on_capture(kernels::cpu::PagedAttentionArguments& arguments) override;

  // Launches redirected so far.
  int64_t num_redirected() const { return static_cast<int64_t>(snapshots_.size()); }

 private:
  // One copy per launch; a deque never moves the copies already handed out.
  std::deque<std::vector<int32_t>> snapshots_;
};

}  // namespace folio::testing
