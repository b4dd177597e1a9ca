// AttentionCaptureHook: the executor's fault-injection seam at capture (in the manner of
// LevelDB's Env), so tests can make capture do what it must never do and check that the replay
// tests notice.
//
// Capture fixes every argument of a paged-attention launch except what the kernel reads through
// pointers when it runs: the number of sequences, query starts, context lengths, block tables
// and positions, all in the persistent input buffers (exec.md, invariant 2). A hook sees the
// PagedAttentionArguments of each paged-attention launch being captured, once per launch (in a
// full-graph program while the launch is recorded; in a piecewise program when its
// AttentionRunner is made), and may rewrite them: a test hook can point seq_lens at a copy
// taken at capture, a per-step value captured by value, which replay after the lengths change
// must expose (tests/exec/replay_test.cc; the hook itself is in tests/testing/).
//
// The product passes none (ExecutorOptions::attention_capture_hook is null), and no hook is
// called then. Eager launches never call it.
//
// Thread-safety: called on the thread that captures (an executor's driving thread); a hook
// shared by several executors driven from different threads must be thread-safe. It must
// outlive every program captured with it: the arguments it rewrites may point into it.
#pragma once

#include "folio/kernels/cpu/paged_attention.h"

namespace folio::exec {

class AttentionCaptureHook {
 public:
  virtual ~AttentionCaptureHook() = default;

  // `arguments` are what the captured launch will read at every replay; the hook may change
  // them. Requires (of the hook): whatever it points them at stays valid while the program
  // lives.
  virtual void on_capture(kernels::cpu::PagedAttentionArguments& arguments) = 0;
};

}  // namespace folio::exec
