// Scheduler: continuous batching over the paged KV cache. Each step it picks which tokens of
// which sequences run, admitting, preempting and resuming sequences as memory allows
// (DESIGN.md "One step of the engine", seed 003).
//
// Queues: WAITING (new and recompute-preempted sequences), RUNNING (prefilling or decoding),
// SWAPPED (preempted to host memory). One step, under a budget of max_num_batched_tokens query
// tokens and at most max_num_sequences running:
//   1. Decodes first, most important first (priority desc, then arrival). Each appends its
//      pending token's slot; when the cache has no block, the scheduler preempts the running
//      sequence with the lowest priority, among those partial prefills first, then the latest
//      arrival (possibly the decoding sequence itself), and retries.
//   2. Chunks of running prefills, in the same order: min(remaining, prefill_chunk_size,
//      budget left) tokens each. Without chunked prefill a prefill runs whole, when it fits the
//      budget left or is alone in the step.
//   3. Unless step 1 preempted anything (admitting right after evicting is thrashing), resume
//      and admit, over SWAPPED and WAITING together in order of aged priority (priority plus
//      one per aging_interval waited), then arrival: a swapped sequence is swapped in, a
//      waiting one gets its whole context allocated (prefix hits included) under the block
//      manager's watermark and starts its first chunk. A candidate that does not fit now is
//      skipped and those behind it are tried (no head-of-line blocking), unless it has waited
//      starvation_threshold or longer: then admission stops behind it until it fits, so no
//      request starves. One that can never fit fails.
// Logits rows: a step asks for at most max_logit_rows (the runner's limit): one per decode and
// per completing prefill chunk, and one per token of a chunk of a sequence that wants its prompt
// logits (sequence.h); such chunks are cut to the rows left (chunked even without chunked
// prefill), and a completing chunk that finds no row left stops one token short.
// Preemption by recompute frees the sequence's blocks (computed full blocks stay CACHED) and
// re-queues it as WAITING; by swap (decoding sequences, when configured and the host swap space
// has room) copies its blocks to host memory. A partial prefill is always recomputed. A
// sequence preempted more than max_preemptions times fails.
// Adapters (lora/adapter_manager.h): a sequence runs only with its adapter resident and held;
// one whose adapter is loading is skipped like one that does not fit (it keeps its place in
// the order, so a rare adapter is not starved by popular ones: admission order is priority and
// arrival, never the adapter's queue depth). Each step, after admission, the adapters of the
// first prefetch_lookahead sequences still waiting start loading. Preemption and finishing
// release the adapter.
//
// Choices (n > 1): a sequence with pending forks (sequence.h) is admitted only when the running
// queue has a slot for it and for each choice to fork; fork() then adds the choices as RUNNING
// sequences sharing its blocks (kv::BlockManager::fork). After that each is an ordinary
// sequence: preempted, swapped, recomputed and finished on its own.
//
// Invariants: every sequence handed to add() or fork() is in exactly one queue matching its status
// until finish() or a failure reported in a StepPlan; the block manager holds a sequence iff it is
// RUNNING or SWAPPED.
// Thread-safety: owned by one thread (the engine's), like the block manager it drives.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "folio/base/result.h"
#include "folio/engine/clock.h"
#include "folio/engine/sequence.h"
#include "folio/kv/block_manager.h"
#include "folio/lora/adapter_manager.h"

namespace folio::engine {

enum class PreemptionMode : uint8_t { kRecompute, kSwap };
std::string_view preemption_mode_name(PreemptionMode mode);

struct SchedulerOptions {
  int32_t max_num_batched_tokens = 2048;  // query tokens per step; >= max_num_sequences
  int32_t max_num_sequences = 64;         // running sequences
  bool chunked_prefill = true;
  int32_t prefill_chunk_size = 512;  // most prefill tokens of one sequence per step
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  int32_t max_preemptions = 16;  // per request; one more fails it
  Duration aging_interval = std::chrono::seconds(1);
  // Waiting this long makes a request block admissions behind it until it fits; 0 admits in
  // strict (aged) priority order.
  Duration starvation_threshold = std::chrono::seconds(30);
  // Logits rows one step may ask for (the runner's limit, StepRunner::max_logit_rows); 0: no
  // limit. Otherwise >= max_num_sequences, so every running sequence can decode in each step.
  int32_t max_logit_rows = 0;

  Status validate() const;
};

// One sequence's share of a step: query tokens [first_position, first_position + num_tokens).
struct ScheduledSegment {
  Sequence* sequence = nullptr;
  int32_t first_position = 0;
  int32_t num_tokens = 0;
  bool wants_logits = false;  // completes the prefill, or decodes: its last token's row samples
  bool is_decode = false;     // the sequence's pending token (else a prefill chunk)
  // Every token of the chunk wants its logits row (prompt logprobs); the last one's is also the
  // sampling row when wants_logits.
  bool all_logits = false;

  int32_t num_logit_rows() const { return all_logits ? num_tokens : (wants_logits ? 1 : 0); }
};

struct StepPlan {
  std::vector<ScheduledSegment> segments;  // decodes first, then prefill chunks
  // Sequences that failed while scheduling (never fit, preempted too often, a KV copy error).
  // The scheduler has already released them and set them FINISHED; the caller reports them.
  std::vector<std::pair<Sequence*, Status>> failed;
  int32_t num_tokens = 0;
  int32_t num_logit_rows = 0;
  int32_t num_preempted_by_recompute = 0;
  int32_t num_preempted_by_swap = 0;

  bool empty() const { return segments.empty(); }
};

class Scheduler {
 public:
  // Errors: invalid options, or a swap mode without a host swap space.
  // `adapters` (null: nothing is held; the runner serves any adapter itself) must outlive the
  // scheduler.
  static Result<std::unique_ptr<Scheduler>> create(const SchedulerOptions& options,
                                                   kv::BlockManager& block_manager,
                                                   bool has_swap_space,
                                                   lora::AdapterManager* adapters = nullptr);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new sequence. Requires: status WAITING, num_allocated == 0, not already added.
  void add(Sequence* sequence);
  // Adds `child` as a RUNNING copy of `parent` sharing its KV blocks (a choice of the same
  // request), using one of the parent's reserved slots. Requires: parent RUNNING with its whole
  // context computed (num_computed == num_allocated == tokens.size()) and a pending fork;
  // child not added, with the request's fixed fields (priority, arrival, adapter) set.
  void fork(Sequence* parent, Sequence* child);
  // Removes the sequence from its queue and releases its KV; status becomes FINISHED.
  // Requires: added and not finished.
  void finish(Sequence* sequence);

  StepPlan schedule(TimePoint now);
  // Records that the plan's segments ran: their tokens' KV is now written.
  void complete(const StepPlan& plan);

  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // Running sequences plus the choices they will fork: what max_num_sequences bounds.
  int32_t num_running_slots() const { return num_running() + num_reserved_forks_; }
  int32_t num_swapped() const { return static_cast<int32_t>(swapped_.size()); }
  bool has_unfinished() const {
    return !waiting_.empty() || !running_.empty() || !swapped_.empty();
  }
  const SchedulerOptions& options() const { return options_; }
  // Aborts unless the invariants above hold (and the sequences' own, sequence.h).
  void check_invariants() const;

 private:
  Scheduler(const SchedulerOptions& options, kv::BlockManager& block_manager,
            lora::AdapterManager* adapters);
  // Holds the sequence's adapter resident before it runs: true when held (or none is needed);
  // false while it loads (the sequence waits, those behind it are tried); a load error fails
  // the sequence.
  bool hold_adapter(Sequence* sequence, StepPlan& plan);
  void drop_adapter(Sequence* sequence);
  void prefetch_adapters();

  void schedule_decodes(StepPlan& plan, int32_t& budget);
  void schedule_prefill_chunks(StepPlan& plan, int32_t& budget);
  void admit(StepPlan& plan, int32_t& budget, TimePoint now);
  // One admission candidate; false when it did not fit now.
  bool try_resume_swapped(Sequence* sequence, StepPlan& plan);
  bool try_admit_waiting(Sequence* sequence, StepPlan& plan, int32_t& budget);
  // The sequence's whole context, from the prefix cache unless it wants its prompt logits.
  Result<kv::AllocateOutcome> allocate(Sequence* sequence);
  // Adds a prefill chunk of `sequence` if the budget allows; returns whether it did.
  bool add_prefill_chunk(Sequence* sequence, StepPlan& plan, int32_t& budget) const;
  int32_t logit_rows_left(const StepPlan& plan) const;
  Sequence* pick_victim() const;
  void preempt(Sequence* victim, StepPlan& plan);
  void preempt_by_recompute(Sequence* victim);
  void fail(Sequence* sequence, Status error, StepPlan& plan);
  void release_kv(Sequence* sequence);
  void add_running(Sequence* sequence);
  void remove_running(Sequence* sequence);
  int64_t aged_priority(const Sequence& sequence, TimePoint now) const;

  SchedulerOptions options_;
  kv::BlockManager& block_manager_;
  lora::AdapterManager* const adapters_;
  int64_t step_index_ = 0;  // schedule() calls so far
  std::vector<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  std::vector<Sequence*> swapped_;
  int32_t num_reserved_forks_ = 0;  // sum of num_pending_forks over running_
  // Per-step scratch, in run order.
  std::vector<Sequence*> decodes_;
  std::vector<Sequence*> prefills_;
  std::vector<Sequence*> candidates_;
};

}  // namespace folio::engine
