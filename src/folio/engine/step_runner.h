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
// run() is called, so the cache is consistent when the step starts. A runner whose KV caches
// live elsewhere (a pipeline of workers) takes the copy-on-write copies itself (copy_blocks():
// the engine's copier forwards them); swap copies are not relayed (no host swap with workers).
//
// Recovery (issue 16, docs/design/dist.md "Plan for issue 16"): a runner whose state lives
// elsewhere (a pipeline of worker processes) can lose part of it. run() then fails, and the
// engine asks recover() to re-form the runner. On success the engine rebuilds the KV that
// recover() reports lost, from tokens it holds: with kStageKv by replay() steps over every
// running sequence's computed tokens, with kAllKv by preempting every running sequence by
// recompute. Then it runs the failed step again. The commit rule: a step's tokens are accepted
// (sampled, streamed) only from a run() that succeeded, so the step in flight at a failure
// yields nothing twice, and each sampler's state advances only with accepted tokens.
//
// Thread-safety: run(), copy_blocks(), recover() and replay() are called from the engine's
// driving thread only, one at a time; supports_adapter() and available() from any thread.
#pragma once

#include <cstdint>
#include <span>

#include "folio/base/result.h"
#include "folio/ir/step_batch.h"
#include "folio/kv/kv_types.h"

namespace folio::engine {

// What a recovery lost, so what the engine must rebuild before the failed step runs again.
struct RunnerRecovery {
  enum class LostKv {
    // Nothing: the KV cache is intact (the step can simply run again).
    kNone,
    // The KV of the layers of stages 0..replay_through_stage may be lost; later stages kept
    // theirs. Rebuilt by replay(step, replay_through_stage) over each running sequence's
    // computed tokens. Stages before the lost one rewrite the same bytes (every kernel is
    // deterministic and batch-invariant), so they need no exception.
    kStageKv,
    // All of it (the layers moved, or the runner cannot replay part of the model): every
    // running sequence is recomputed from its tokens, and cached prefix blocks are dropped.
    kAllKv,
  };
  LostKv lost_kv = LostKv::kAllKv;
  int32_t replay_through_stage = -1;  // with kStageKv: the last stage replay() must run
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Runs one step. An error leaves the KV cache of the step's sequences unspecified; the engine
  // then calls recover(), and either runs the same step again (nothing of the failed run is
  // used: the commit rule) or fails the requests scheduled in it with this status and frees
  // their KV.
  virtual Result<ir::StepOutput> run(const ir::StepBatch& step) = 0;
  // Copy-on-write copies into the runner's own KV caches, for a runner whose caches live
  // elsewhere (ModelEngine's copier forwards the block manager's copies here when the runner is
  // remote). Each pair's destination block gets the source's K and V of every layer; the batch
  // follows kv/block_copier.h's rule (no block both a source and a destination, no destination
  // twice), and copying it again before the next run() is harmless (the source is unchanged).
  // Batches must reach the cache in the order they were given.
  // The block manager calls this while the scheduler allocates blocks as well as before a step,
  // and an error there cannot be recovered from: a runner whose copies cross a wire queues
  // them and sends them at the start of the next run() or replay() (before the step's writes,
  // and before a replay's), so a lost worker fails that call and goes through recover(); the
  // queued copies survive the recovery and go again. An error here means a malformed batch.
  // The default refuses: the KV cache is the engine's own.
  virtual Status copy_blocks(std::span<const kv::BlockCopy> copies) {
    return failed_precondition(
        "{} KV block copies: this step runner holds no KV cache of its own to copy into",
        copies.size());
  }
  // Columns of every StepOutput.
  virtual int32_t vocab_size() const = 0;
  // The most logits rows one step may ask for (ir::StepBatch::logit_indices); 0: no limit. The
  // engine's scheduler keeps every step within it.
  virtual int32_t max_logit_rows() const { return 0; }
  // Whether requests may name this adapter; called by Engine::submit, so from any thread. The
  // base model (0) always.
  virtual bool supports_adapter(int64_t adapter_id) const { return adapter_id == 0; }

  // After run() or replay() failed with `failure`: re-forms the runner (a lost worker replaced)
  // and says which KV the failure lost. An error: not recoverable (the default: the engine then
  // fails the step's requests as before), or not now (no worker to take the lost one's place:
  // available() is then false, the engine ends every request with kUnavailable and calls
  // recover() again every EngineOptions::recovery_retry_interval). The runner stays
  // unavailable() until a later recover() succeeds. After every success the engine drops the
  // prefix cache's ref-0 blocks, whatever the loss.
  // The losses of consecutive failures add up: after a replay() that failed, the engine
  // rebuilds what both recoveries reported (the later stage bound; all KV wins).
  virtual Result<RunnerRecovery> recover(const Status& failure) { return failure; }
  // Writes the KV of `step`'s tokens in the stages 0..through_stage only, and computes no
  // logits (step.logit_indices is empty). Called after recover() returned kStageKv, with steps
  // the engine builds from every running sequence's computed tokens: prefill chunks within the
  // scheduler's limits (max_num_batched_tokens, max_num_sequences, prefill_chunk_size), one
  // segment per sequence and step, each KV slot written once over all of them (blocks shared
  // by several sequences are replayed by the first), every position after the positions before
  // it. An error: the engine calls recover() again.
  virtual Status replay(const ir::StepBatch& step, int32_t through_stage) {
    (void)step;
    return failed_precondition("this step runner cannot replay stage {}: it never reports lost KV",
                               through_stage);
  }
  // False from a failure that recover() could not repair until one that did: new requests are
  // refused (kUnavailable) meanwhile. From any thread.
  virtual bool available() const { return true; }
};

}  // namespace folio::engine
