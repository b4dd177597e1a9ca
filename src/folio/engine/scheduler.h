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
//      manager's watermark and starts its first chunk. A swapped one also needs room for the
//      next step's decodes (one block for each running sequence, itself included, whose next
//      token starts a block): without it, it would be the first victim of their appends and go
//      out again before it ran (thrashing that only spends its max_preemptions). A candidate that
//      does not fit now is skipped and those behind it are tried (no head-of-line blocking), unless
//      it has waited starvation_threshold or longer: then admission stops behind it until it fits,
//      so no request starves. One that can never fit fails.
// Logits rows: a step asks for at most max_logit_rows (the runner's limit): one per decode and
// per completing prefill chunk, and one per token of a chunk of a sequence that wants its prompt
// logits (sequence.h); such chunks are cut to the rows left (chunked even without chunked
// prefill), and a completing chunk that finds no row left stops one token short.
// Preemption by recompute frees the sequence's blocks (computed full blocks stay CACHED) and
// re-queues it as WAITING; by swap (decoding sequences, when configured and the host swap space
// has room) copies its blocks to host memory. A partial prefill is always recomputed. Mode
// kCheaper decides per decoding victim by cost (preemption_cost.h): the seconds to move its
// blocks out and back in against the seconds to prefill its context again, from the IR's cost
// annotations; set_prefer_cheaper_preemption(true) makes the other modes decide so too (the
// lead's critical-pressure switch). A swap the host swap space has no room for is a recompute.
// A sequence preempted more than max_preemptions times fails.
// A preempted sequence comes back: appends ignore the block manager's watermark, so a running
// sequence may grow past max_sequence_blocks - watermark_blocks, which neither swap-in nor
// allocation (both under the watermark) would admit again. Such a sequence (and only a
// preempted one: a new prompt that large never fits) comes back ignoring the watermark, when
//   - nothing is more important: every candidate ahead of it in this step's admission order
//     has been admitted or has failed, and no other sequence is running past the watermark;
//   - then, while it does not fit, admission stops behind it for the step (the freed blocks
//     are kept for it: running sequences finish or are preempted, nothing new takes them);
//   - once back it is never the preemption victim while another running sequence can be: it
//     is the latest arrival's victim only when it runs alone, and alone it fits, since its
//     prompt plus max_tokens fit max_sequence_blocks. When it asks for a block and only
//     sequences already scheduled in this step could give one, it skips this step's decode
//     instead of preempting itself.
// So it cannot livelock (at most one such sequence at a time, never preempted for another),
// and every request whose prompt plus max_tokens fits max_sequence_blocks completes, in every
// mode (unless max_preemptions is reached first).
// Adapters (lora/adapter_manager.h): a sequence runs only with its adapter resident and held;
// one whose adapter is loading is skipped like one that does not fit (it keeps its place in
// the order, so a rare adapter is not starved by popular ones: admission order is priority and
// arrival, never the adapter's queue depth). Each step, after admission, the adapters of the
// first prefetch_lookahead sequences still waiting start loading. Preemption and finishing
// release the adapter.
//
// Memory pressure (set_pressure, from memory_pressure_handler.h): may stop new admissions
// (waiting sequences that never ran; preempted ones still come back), stop adapter prefetching,
// cut the prefill chunk, and ask for preemptions before a step is scheduled (never of the last
// running sequence; a step that preempted admits nothing, as above).
//
// Phase split (PhaseSplit; a tuner may move it between steps, phase_budget_tuner.h):
//   - Tokens: in a step that runs decodes, prefill chunks (step 2) and admissions' first chunks
//     (step 3) together take at most ceil(prefill_token_share * max_num_batched_tokens) tokens.
//     The rest is not a reservation for decodes (they always fit: max_num_batched_tokens >=
//     max_num_sequences) but a bound on the prefill work riding along with them, which is what
//     sets their time per token. A step without decodes is work-conserving: prefill may take the
//     whole budget, since there is no decode to protect.
//   - KV: while anything runs, a WAITING sequence is admitted only if at least
//     ceil(decode_kv_share * max_sequence_blocks) blocks stay obtainable after its whole context
//     (counted without prefix hits, so conservatively) is allocated: running decodes keep room
//     to grow instead of being preempted. Held back, it is treated like one that does not fit
//     now (those behind it are tried unless it starves). Swapped sequences (decodes) are not
//     held; with nothing running, nothing is held (nothing to protect, and it must progress).
//   The default split (1, 0) is the scheduler without a split.
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
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "folio/base/result.h"
#include "folio/engine/clock.h"
#include "folio/engine/preemption_cost.h"
#include "folio/engine/sequence.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/kv_cache.h"
#include "folio/lora/adapter_manager.h"

namespace folio::engine {

// kCheaper: per victim, the cheaper of the two by cost (preemption_cost.h); needs a swap space
// and a PreemptionCostModel (set_preemption_cost).
enum class PreemptionMode : uint8_t { kRecompute, kSwap, kCheaper };
std::string_view preemption_mode_name(PreemptionMode mode);

// How one step's token budget and the KV cache are split between prefill and decode (see the
// file comment). Defaults: no split.
struct PhaseSplit {
  // Share of max_num_batched_tokens that prefill may take in a step that runs decodes; (0, 1].
  double prefill_token_share = 1.0;
  // Share of the KV cache that admitting new prefills keeps free for running decodes; [0, 1).
  double decode_kv_share = 0.0;

  Status validate() const;
  bool operator==(const PhaseSplit&) const = default;
};

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
  PhaseSplit phase_split;  // the initial split; set_phase_split() moves it

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

// What memory pressure asks of the scheduler (memory_pressure_handler.h), set before each
// schedule(); the default asks nothing.
struct SchedulerPressure {
  bool admit_new = true;  // false: waiting sequences never admitted before stay waiting
  bool prefetch_adapters = true;
  int32_t prefill_chunk_limit = 0;  // > 0: at most this many prefill tokens per sequence a step
  bool prefer_cheaper_preemption =
      false;  // a victim is swapped or recomputed, whichever costs less
  // Sequences to preempt (the usual victims) before scheduling; never the last one running.
  int32_t preemptions = 0;
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
  // Of the preemptions above, those memory pressure asked for (SchedulerPressure::preemptions)
  // rather than a failed append.
  int32_t num_preempted_for_pressure = 0;
  // Phase split outcome: prefill tokens scheduled (chunks and admissions), the most the split
  // allowed them (max_num_batched_tokens when it allowed the whole budget), whether prefill
  // work was left over because of that cap, and the waiting sequences held back by the KV share.
  int32_t num_prefill_tokens = 0;
  int32_t prefill_token_cap = 0;
  bool prefill_limited_by_split = false;
  int32_t num_held_by_kv_share = 0;
  // Decisions the cost model made (kCheaper, or prefer_cheaper_preemption), by its choice; a
  // swap chosen but refused for lack of host swap space still counts as chosen.
  int32_t num_cost_chose_recompute = 0;
  int32_t num_cost_chose_swap = 0;

  bool empty() const { return segments.empty(); }
};

class Scheduler {
 public:
  // Errors: invalid options, or a swap mode without a host swap space (or with a cache that
  // does not swap: a KV-parallel group). `kv_cache`: one block manager or a KV-parallel group
  // (kv/kv_cache.h); admission asks it in tokens, so one code path serves both.
  // `adapters` (null: nothing is held; the runner serves any adapter itself) must outlive the
  // scheduler.
  static Result<std::unique_ptr<Scheduler>> create(const SchedulerOptions& options,
                                                   kv::KvCache& kv_cache, bool has_swap_space,
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

  // Applies to every schedule() from now on, until set again.
  void set_pressure(const SchedulerPressure& pressure) {
    pressure_ = pressure;
    prefer_cheaper_preemption_ = pressure.prefer_cheaper_preemption;
  }
  const SchedulerPressure& pressure() const { return pressure_; }

  StepPlan schedule(TimePoint now);
  // Records that the plan's segments ran: their tokens' KV is now written.
  void complete(const StepPlan& plan);
  // Recovery (step_runner.h, the runner lost the whole KV cache): every RUNNING sequence goes
  // back to WAITING as preemption by recompute sends it (its KV released, its tokens kept), but
  // without counting a preemption: its KV was lost, not taken for memory. A plan scheduled and
  // not completed is void afterwards. SWAPPED sequences keep their KV in the host swap space and
  // stay. Returns how many sequences it sent back.
  int32_t recompute_running();

  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  // The RUNNING sequences, in no particular order.
  const std::vector<Sequence*>& running() const { return running_; }
  // The prefill chunk in force: the option's, cut by memory pressure.
  int32_t prefill_chunk_size() const;
  // Running sequences plus the choices they will fork: what max_num_sequences bounds.
  int32_t num_running_slots() const { return num_running() + num_reserved_forks_; }
  int32_t num_swapped() const { return static_cast<int32_t>(swapped_.size()); }
  bool has_unfinished() const {
    return !waiting_.empty() || !running_.empty() || !swapped_.empty();
  }
  const SchedulerOptions& options() const { return options_; }
  // Takes effect from the next schedule(). Errors (nothing changes): an invalid split.
  Status set_phase_split(const PhaseSplit& split);
  const PhaseSplit& phase_split() const { return options_.phase_split; }
  // The arrival of the sequence waiting longest (WAITING or SWAPPED); nullopt when none waits.
  std::optional<TimePoint> oldest_waiting_arrival() const;
  // The cost model kCheaper (and prefer_cheaper_preemption) decides with; null: none (kCheaper
  // then swaps like kSwap). Must outlive the scheduler.
  void set_preemption_cost(const PreemptionCostModel* cost) { preemption_cost_ = cost; }
  // True: every decoding victim is recomputed or swapped by cost, whatever the mode, when a
  // cost model and a host swap space exist (at critical memory pressure). False: the mode
  // decides (kCheaper still by cost).
  void set_prefer_cheaper_preemption(bool prefer) { prefer_cheaper_preemption_ = prefer; }
  bool prefers_cheaper_preemption() const { return prefer_cheaper_preemption_; }
  // The running sequence that came back past the watermark (see above), or null.
  const Sequence* past_watermark() const { return past_watermark_; }
  // Aborts unless the invariants above hold (and the sequences' own, sequence.h).
  void check_invariants() const;

 private:
  Scheduler(const SchedulerOptions& options, kv::KvCache& kv_cache, bool has_swap_space,
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
  Result<kv::AllocateOutcome> allocate(Sequence* sequence, bool apply_watermark);
  int64_t blocks_for(int32_t num_tokens) const;
  // Blocks the next step's decodes may take, with `resumed` running beside them.
  int64_t next_step_growth(const Sequence* resumed) const;
  // Whether a preempted sequence of this many tokens can come back only past the watermark.
  bool beyond_watermark(int32_t num_tokens) const;
  // Whether `sequence` may come back past the watermark now (nothing more important).
  bool may_pass_watermark(const Sequence* sequence) const;
  // Whether another candidate holds admission for this step (it comes back past the watermark).
  bool admission_held_against(const Sequence* sequence) const;
  void hold_admission(const Sequence* sequence);
  // Adds a prefill chunk of `sequence` if the budget allows; returns whether it did.
  bool add_prefill_chunk(Sequence* sequence, StepPlan& plan, int32_t& budget) const;
  // Whether the split's KV share holds this WAITING sequence back (file comment).
  bool held_by_kv_share(const Sequence& sequence) const;
  int32_t logit_rows_left(const StepPlan& plan) const;
  // The victim for `asking`, which found no block in cache member `member` (0 for one block
  // manager); only a sequence spanning that member (or `asking` itself) frees a block there.
  // Null when `asking` runs past the watermark and only sequences already scheduled in this step
  // could give it one, or when no other sequence holds blocks in the member.
  Sequence* pick_victim(const Sequence* asking, int32_t member = 0) const;
  void preempt(Sequence* victim, StepPlan& plan);
  // Whether a decoding victim is swapped (else recomputed), counting cost decisions in `plan`.
  bool swap_victim(const Sequence& victim, StepPlan& plan) const;
  void preempt_by_recompute(Sequence* victim);
  void fail(Sequence* sequence, Status error, StepPlan& plan);
  void release_kv(Sequence* sequence);
  void add_running(Sequence* sequence);
  void remove_running(Sequence* sequence);
  int64_t aged_priority(const Sequence& sequence, TimePoint now) const;

  void preempt_for_pressure(StepPlan& plan);

  SchedulerOptions options_;
  SchedulerPressure pressure_;
  kv::KvCache& kv_cache_;
  lora::AdapterManager* const adapters_;
  const bool has_swap_space_;
  const PreemptionCostModel* preemption_cost_ = nullptr;
  bool prefer_cheaper_preemption_ = false;
  // The running sequence brought back past the watermark; cleared when it leaves running_.
  Sequence* past_watermark_ = nullptr;
  // A past-the-watermark candidate that did not fit holds admission for the rest of its step.
  const Sequence* admission_holder_ = nullptr;
  int64_t admission_held_step_ = -1;
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
