// StepRunner: the engine's narrow view of the model, one forward step at a time.
//
// The scheduler decides which tokens of which sequences run in a step; the engine lays that out
// as the flat int32 arrays the graph executor takes (docs/design/exec.md "Step"), and a runner
// turns them into one logits row per sequence whose logits are wanted. The real runner (exec/
// over model/) pads to a bucket, copies the arrays into persistent buffers and replays or runs
// the step; the tests' runner (tests/testing/toy_step_runner.h) reads and writes the same paged
// KV cache through the same arrays, so scheduling bugs show up as wrong tokens.
//
// The step's arrays and their terms are ir::StepBatch's (ir/step_batch.h).
//
// Copies: copy-on-write and swap copies are run by the block manager's KvBlockCopier before
// run() is called, so the cache is consistent when the step starts.
//
// Thread-safety: run() is called from the engine's driving thread only, one step at a time;
// supports_adapter() from any thread.
#pragma once

#include <cstdint>

#include "folio/base/result.h"
#include "folio/ir/step_batch.h"

namespace folio::engine {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Runs one step. An error fails the requests scheduled in it (with this status) and leaves
  // the KV cache of their sequences unspecified; the engine frees them.
  virtual Result<ir::StepOutput> run(const ir::StepBatch& step) = 0;
  // Columns of every StepOutput.
  virtual int32_t vocab_size() const = 0;
  // The most logits rows one step may ask for (ir::StepBatch::logit_indices); 0: no limit. The
  // engine's scheduler keeps every step within it.
  virtual int32_t max_logit_rows() const { return 0; }
  // Whether requests may name this adapter; called by Engine::submit, so from any thread. The
  // base model (0) always.
  virtual bool supports_adapter(int64_t adapter_id) const { return adapter_id == 0; }
};

}  // namespace folio::engine
