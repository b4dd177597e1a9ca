#include "folio/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "folio/base/check.h"
#include "folio/base/log.h"

namespace folio::engine {

namespace {

// Submission order, choices of one request by index: a total order, so run order and the
// choice of a preemption victim (its reverse) never disagree about sibling choices.
bool arrives_before(const Sequence* left, const Sequence* right) {
  if (left->arrival_order != right->arrival_order) {
    return left->arrival_order < right->arrival_order;
  }
  return left->choice < right->choice;
}

// Run order: most important first, then first come.
bool runs_before(const Sequence* left, const Sequence* right) {
  if (left->priority != right->priority) return left->priority > right->priority;
  return arrives_before(left, right);
}

void remove_from(std::vector<Sequence*>& queue, Sequence* sequence) {
  const auto entry = std::find(queue.begin(), queue.end(), sequence);
  FOLIO_CHECK(entry != queue.end(), "sequence of request {} is not in the {} queue",
              sequence->request, sequence_status_name(sequence->status));
  queue.erase(entry);
}

}  // namespace

std::string_view preemption_mode_name(PreemptionMode mode) {
  switch (mode) {
    case PreemptionMode::kRecompute:
      return "recompute";
    case PreemptionMode::kSwap:
      return "swap";
    case PreemptionMode::kCheaper:
      return "cheaper";
  }
  FOLIO_UNREACHABLE("bad PreemptionMode");
}

std::string_view sequence_status_name(SequenceStatus status) {
  switch (status) {
    case SequenceStatus::kWaiting:
      return "waiting";
    case SequenceStatus::kRunning:
      return "running";
    case SequenceStatus::kSwapped:
      return "swapped";
    case SequenceStatus::kFinished:
      return "finished";
  }
  FOLIO_UNREACHABLE("bad SequenceStatus");
}

Status PhaseSplit::validate() const {
  // Negated comparisons so NaN fails too.
  if (!(prefill_token_share > 0.0 && prefill_token_share <= 1.0)) {
    return invalid_argument("prefill_token_share must be in (0, 1], got {}", prefill_token_share);
  }
  if (!(decode_kv_share >= 0.0 && decode_kv_share < 1.0)) {
    return invalid_argument("decode_kv_share must be in [0, 1), got {}", decode_kv_share);
  }
  return Status();
}

Status SchedulerOptions::validate() const {
  if (max_num_sequences < 1) {
    return invalid_argument("max_num_sequences must be at least 1, got {}", max_num_sequences);
  }
  if (max_num_batched_tokens < max_num_sequences) {
    return invalid_argument(
        "max_num_batched_tokens ({}) must be at least max_num_sequences ({}) so every running "
        "sequence can decode in each step",
        max_num_batched_tokens, max_num_sequences);
  }
  if (prefill_chunk_size < 1) {
    return invalid_argument("prefill_chunk_size must be at least 1, got {}", prefill_chunk_size);
  }
  if (max_preemptions < 0) {
    return invalid_argument("max_preemptions must not be negative, got {}", max_preemptions);
  }
  if (aging_interval <= Duration::zero()) {
    return invalid_argument("aging_interval must be positive");
  }
  if (starvation_threshold < Duration::zero()) {
    return invalid_argument("starvation_threshold must not be negative");
  }
  if (max_logit_rows != 0 && max_logit_rows < max_num_sequences) {
    return invalid_argument(
        "max_logit_rows ({}) must be 0 (no limit) or at least max_num_sequences ({}) so every "
        "running sequence can decode in each step; give the executor more logit rows",
        max_logit_rows, max_num_sequences);
  }
  return phase_split.validate();
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(const SchedulerOptions& options,
                                                     kv::KvCache& kv_cache, bool has_swap_space,
                                                     lora::AdapterManager* adapters) {
  FOLIO_RETURN_IF_ERROR(options.validate());
  if (options.preemption_mode != PreemptionMode::kRecompute && !has_swap_space) {
    return invalid_argument(
        "preemption by {} needs a host swap space; give the block manager one or preempt by "
        "recompute",
        preemption_mode_name(options.preemption_mode));
  }
  if (kv_cache.num_members() > 1 && !kv_cache.supports_swap() &&
      (has_swap_space || options.preemption_mode != PreemptionMode::kRecompute)) {
    return invalid_argument(
        "preemption by {} with a swap space, but the KV cache ({} members) does not swap: a "
        "KV-parallel group preempts by recompute only",
        preemption_mode_name(options.preemption_mode), kv_cache.num_members());
  }
  return std::unique_ptr<Scheduler>(new Scheduler(options, kv_cache, has_swap_space, adapters));
}

Scheduler::Scheduler(const SchedulerOptions& options, kv::KvCache& kv_cache, bool has_swap_space,
                     lora::AdapterManager* adapters)
    : options_(options),
      kv_cache_(kv_cache),
      adapters_(adapters),
      has_swap_space_(has_swap_space) {}

bool Scheduler::hold_adapter(Sequence* sequence, StepPlan& plan) {
  // Without a manager the runner serves adapters itself (EngineParts::adapters): nothing to hold.
  if (sequence->adapter_id == 0 || sequence->holds_adapter || adapters_ == nullptr) return true;
  Result<lora::AdapterReadiness> readiness = adapters_->acquire(sequence->adapter_id);
  if (!readiness.ok()) {
    fail(sequence, readiness.status(), plan);
    return false;
  }
  if (*readiness == lora::AdapterReadiness::kLoading) return false;
  sequence->holds_adapter = true;
  return true;
}

void Scheduler::drop_adapter(Sequence* sequence) {
  if (!sequence->holds_adapter) return;
  adapters_->release(sequence->adapter_id);
  sequence->holds_adapter = false;
}

void Scheduler::prefetch_adapters() {
  if (adapters_ == nullptr || !pressure_.prefetch_adapters) return;
  int32_t looked = 0;
  for (Sequence* sequence : waiting_) {
    if (looked++ >= adapters_->prefetch_lookahead()) break;
    if (sequence->adapter_id != 0 && !sequence->holds_adapter) {
      adapters_->prefetch(sequence->adapter_id);
    }
  }
}

void Scheduler::add(Sequence* sequence) {
  FOLIO_DCHECK(sequence->status == SequenceStatus::kWaiting && sequence->num_allocated == 0);
  FOLIO_DCHECK(std::find(waiting_.begin(), waiting_.end(), sequence) == waiting_.end());
  waiting_.push_back(sequence);
}

void Scheduler::finish(Sequence* sequence) {
  switch (sequence->status) {
    case SequenceStatus::kWaiting:
      remove_from(waiting_, sequence);
      break;
    case SequenceStatus::kRunning:
      remove_running(sequence);
      break;
    case SequenceStatus::kSwapped:
      remove_from(swapped_, sequence);
      break;
    case SequenceStatus::kFinished:
      FOLIO_UNREACHABLE("request {} finished twice", sequence->request);
  }
  release_kv(sequence);
  sequence->status = SequenceStatus::kFinished;
}

void Scheduler::add_running(Sequence* sequence) {
  running_.push_back(sequence);
  num_reserved_forks_ += sequence->num_pending_forks;
}

void Scheduler::remove_running(Sequence* sequence) {
  remove_from(running_, sequence);
  if (sequence == past_watermark_) past_watermark_ = nullptr;
  num_reserved_forks_ -= sequence->num_pending_forks;
}

void Scheduler::fork(Sequence* parent, Sequence* child) {
  FOLIO_CHECK(parent->status == SequenceStatus::kRunning && parent->num_pending_forks > 0 &&
                  parent->num_computed == parent->num_allocated &&
                  parent->num_allocated == static_cast<int32_t>(parent->tokens.size()),
              "request {}: fork of a sequence that is not a completed prefill with forks pending",
              parent->request);
  FOLIO_CHECK(child->status == SequenceStatus::kWaiting && child->num_allocated == 0);
  const Status forked = kv_cache_.fork(parent->seq, child->seq);
  FOLIO_CHECK(forked.ok(), "forking the KV of request {}: {}", parent->request, forked.to_string());
  child->tokens = parent->tokens;
  child->num_prompt_tokens = parent->num_prompt_tokens;
  child->num_allocated = parent->num_allocated;
  child->num_computed = parent->num_computed;
  child->num_cached_prompt_tokens = parent->num_cached_prompt_tokens;
  child->scheduled_once = parent->scheduled_once;
  child->last_scheduled_step = parent->last_scheduled_step;
  child->status = SequenceStatus::kRunning;
  if (parent->holds_adapter) {
    // Resident and held by the parent: a second hold succeeds at once.
    Result<lora::AdapterReadiness> readiness = adapters_->acquire(child->adapter_id);
    FOLIO_CHECK(readiness.ok() && *readiness == lora::AdapterReadiness::kReady,
                "request {}: holding the adapter its parent holds", parent->request);
    child->holds_adapter = true;
  }
  // The child takes one of the slots the parent reserved.
  --parent->num_pending_forks;
  --num_reserved_forks_;
  running_.push_back(child);
}

void Scheduler::release_kv(Sequence* sequence) {
  drop_adapter(sequence);
  if (sequence->status == SequenceStatus::kRunning ||
      sequence->status == SequenceStatus::kSwapped) {
    const Status status = kv_cache_.free(sequence->seq);
    FOLIO_CHECK(status.ok(), "freeing the KV of request {}: {}", sequence->request,
                status.to_string());
  }
  sequence->num_allocated = 0;
  sequence->num_computed = 0;
}

Status Scheduler::set_phase_split(const PhaseSplit& split) {
  FOLIO_RETURN_IF_ERROR(split.validate());
  options_.phase_split = split;
  return Status();
}

std::optional<TimePoint> Scheduler::oldest_waiting_arrival() const {
  std::optional<TimePoint> oldest;
  for (const std::vector<Sequence*>* queue : {&waiting_, &swapped_}) {
    for (const Sequence* sequence : *queue) {
      if (!oldest.has_value() || sequence->arrival < *oldest) oldest = sequence->arrival;
    }
  }
  return oldest;
}

StepPlan Scheduler::schedule(TimePoint now) {
  ++step_index_;
  StepPlan plan;
  int32_t budget = options_.max_num_batched_tokens;
  preempt_for_pressure(plan);
  // Both lists are taken before any decode appends its token: from then on a decoding sequence
  // looks like a one-token prefill.
  decodes_.clear();
  prefills_.clear();
  for (Sequence* sequence : running_) {
    (sequence->is_decoding() ? decodes_ : prefills_).push_back(sequence);
  }
  std::sort(decodes_.begin(), decodes_.end(), runs_before);
  std::sort(prefills_.begin(), prefills_.end(), runs_before);
  schedule_decodes(plan, budget);
  // The split's prefill cap binds only in a step with decodes (work-conserving otherwise).
  const auto max_tokens = static_cast<double>(options_.max_num_batched_tokens);
  const int32_t cap = std::max(
      1, static_cast<int32_t>(std::ceil(options_.phase_split.prefill_token_share * max_tokens)));
  plan.prefill_token_cap = plan.num_tokens > 0 ? cap : options_.max_num_batched_tokens;
  const int32_t withheld = std::max(0, budget - plan.prefill_token_cap);
  budget -= withheld;
  schedule_prefill_chunks(plan, budget);
  if (plan.num_preempted_by_recompute == 0 && plan.num_preempted_by_swap == 0) {
    admit(plan, budget, now);
  }
  if (withheld > 0 && budget < 1) {
    // The cap ran out: was prefill work left over (a cut or unscheduled chunk, a waiting
    // sequence)?
    bool left_over = !waiting_.empty();
    for (const Sequence* sequence : running_) {
      left_over =
          left_over || (sequence->is_prefilling() && sequence->last_scheduled_step != step_index_);
    }
    for (const ScheduledSegment& segment : plan.segments) {
      left_over = left_over || (!segment.is_decode && !segment.wants_logits);
    }
    plan.prefill_limited_by_split = left_over;
  }
  return plan;
}

void Scheduler::preempt_for_pressure(StepPlan& plan) {
  for (int32_t index = 0; index < pressure_.preemptions && running_.size() > 1; ++index) {
    Sequence* victim = pick_victim(/*asking=*/nullptr);
    if (victim == nullptr) break;
    preempt(victim, plan);
    ++plan.num_preempted_for_pressure;
  }
}

int32_t Scheduler::prefill_chunk_size() const {
  return pressure_.prefill_chunk_limit > 0
             ? std::min(options_.prefill_chunk_size, pressure_.prefill_chunk_limit)
             : options_.prefill_chunk_size;
}

void Scheduler::schedule_decodes(StepPlan& plan, int32_t& budget) {
  for (Sequence* sequence : decodes_) {
    // Preempted earlier in this loop (as a victim) or the budget ran out.
    if (sequence->status != SequenceStatus::kRunning || budget < 1) continue;
    while (true) {
      Result<kv::AppendedToken> outcome =
          kv_cache_.append_token(sequence->seq, sequence->tokens.back());
      FOLIO_CHECK(outcome.ok(), "append_slot for request {}: {}", sequence->request,
                  outcome.status().to_string());
      if (outcome->status == kv::AppendStatus::kAppended) {
        ++sequence->num_allocated;
        sequence->last_scheduled_step = step_index_;
        plan.segments.push_back(ScheduledSegment{sequence, sequence->num_allocated - 1, 1,
                                                 /*wants_logits=*/true, /*is_decode=*/true,
                                                 /*all_logits=*/false});
        plan.num_tokens += 1;
        plan.num_logit_rows += 1;
        budget -= 1;
        break;
      }
      Sequence* victim = pick_victim(sequence, outcome->member);
      if (victim == nullptr) break;  // past the watermark: waits for this step's decodes
      // Scheduled decodes outrank the one asking (run order), so the victim never has a segment
      // in this step already.
      FOLIO_CHECK(victim->last_scheduled_step != step_index_,
                  "preemption victim {} is already scheduled", victim->request);
      preempt(victim, plan);
      if (victim == sequence) break;
    }
  }
}

void Scheduler::schedule_prefill_chunks(StepPlan& plan, int32_t& budget) {
  for (Sequence* sequence : prefills_) {
    if (sequence->status == SequenceStatus::kRunning) add_prefill_chunk(sequence, plan, budget);
  }
}

bool Scheduler::add_prefill_chunk(Sequence* sequence, StepPlan& plan, int32_t& budget) const {
  const int32_t remaining = sequence->num_allocated - sequence->num_computed;
  const int32_t rows_left = logit_rows_left(plan);
  const bool all_logits = sequence->wants_prompt_logits;
  int32_t chunk = 0;
  if (all_logits) {
    // A row per token: always chunked, to the rows left (an over-budget chunk alone in its step
    // still gets the whole budget, which is positive then).
    chunk = std::min({remaining, budget, rows_left,
                      options_.chunked_prefill ? prefill_chunk_size() : remaining});
  } else if (options_.chunked_prefill) {
    chunk = std::min({remaining, prefill_chunk_size(), budget});
  } else if (remaining <= budget || plan.segments.empty()) {
    // Alone in its step, an over-budget prefill still runs: it would otherwise never run.
    chunk = remaining;
  }
  // A completing chunk needs a sampling row; without one left it stops a token short.
  if (!all_logits && chunk == remaining && rows_left < 1) chunk = remaining - 1;
  if (chunk <= 0) return false;
  const bool completes = chunk == remaining;
  sequence->last_scheduled_step = step_index_;
  const ScheduledSegment segment{sequence,
                                 sequence->num_computed,
                                 chunk,
                                 /*wants_logits=*/completes,
                                 /*is_decode=*/false,
                                 all_logits};
  plan.segments.push_back(segment);
  plan.num_tokens += chunk;
  plan.num_prefill_tokens += chunk;
  plan.num_logit_rows += segment.num_logit_rows();
  budget = std::max(0, budget - chunk);
  return true;
}

int32_t Scheduler::logit_rows_left(const StepPlan& plan) const {
  if (options_.max_logit_rows == 0) return std::numeric_limits<int32_t>::max();
  return options_.max_logit_rows - plan.num_logit_rows;
}

void Scheduler::admit(StepPlan& plan, int32_t& budget, TimePoint now) {
  candidates_.clear();
  candidates_.insert(candidates_.end(), swapped_.begin(), swapped_.end());
  candidates_.insert(candidates_.end(), waiting_.begin(), waiting_.end());
  std::sort(candidates_.begin(), candidates_.end(),
            [&](const Sequence* left, const Sequence* right) {
              const int64_t left_priority = aged_priority(*left, now);
              const int64_t right_priority = aged_priority(*right, now);
              if (left_priority != right_priority) return left_priority > right_priority;
              return arrives_before(left, right);
            });
  // Admission moves sequences between the queues, never in or out of candidates_.
  for (Sequence* sequence : candidates_) {
    if (num_running_slots() >= options_.max_num_sequences || budget < 1) break;
    // Critical memory pressure admits no new request; preempted ones are not new.
    if (!pressure_.admit_new && sequence->num_preemptions == 0) continue;
    // A sequence with choices to fork needs their slots too.
    const bool has_slots =
        num_running_slots() + 1 + sequence->num_pending_forks <= options_.max_num_sequences;
    const bool held =
        has_slots && sequence->status == SequenceStatus::kWaiting && held_by_kv_share(*sequence);
    plan.num_held_by_kv_share += held ? 1 : 0;
    const bool resumed =
        has_slots && !held &&
        (sequence->status == SequenceStatus::kSwapped ? try_resume_swapped(sequence, plan)
                                                      : try_admit_waiting(sequence, plan, budget));
    if (resumed || sequence->status == SequenceStatus::kFinished) continue;
    // Did not fit now. Those behind it may still be tried, unless it is starving: then the
    // capacity freed from now on is kept for it.
    if (now - sequence->arrival >= options_.starvation_threshold) break;
  }
  // After admission, not before: a sequence admission tried has asked for its adapter itself
  // (a demand load, counted as a cold miss, ahead of background jobs); prefetching it first
  // would have queued its load as a background job and hidden the miss.
  prefetch_adapters();
}

bool Scheduler::held_by_kv_share(const Sequence& sequence) const {
  if (options_.phase_split.decode_kv_share <= 0.0 || running_.empty()) return false;
  // Each member it would span keeps the share of its capacity free after taking its part.
  return !kv_cache_.has_room_for(
      kv::RoomQuery{.num_tokens = static_cast<int32_t>(sequence.tokens.size()),
                    .apply_watermark = false,
                    .reserve_blocks = 0,
                    .reserve_fraction = options_.phase_split.decode_kv_share});
}

bool Scheduler::try_resume_swapped(Sequence* sequence, StepPlan& plan) {
  if (admission_held_against(sequence)) return false;
  // Appends ignore the watermark, so a sequence may have grown past what swap-in under the
  // watermark admits: it comes back past it when nothing is more important (scheduler.h).
  // Its pending token needs a block the cache cannot give: it outgrew the cache (a request
  // whose prompt plus max_tokens does not fit).
  const auto num_tokens = static_cast<int32_t>(sequence->tokens.size());
  if (!kv_cache_.fits_ever(num_tokens, /*apply_watermark=*/false)) {
    fail(sequence,
         resource_exhausted(
             "request's context of {} tokens has outgrown the KV cache ({} blocks of {} tokens); "
             "lower max_tokens or give the KV cache more memory",
             num_tokens, kv_cache_.total_sequence_blocks(), kv_cache_.cache_block_size()),
         plan);
    return false;
  }
  const bool past_watermark = beyond_watermark(sequence->num_allocated);
  if (past_watermark && !may_pass_watermark(sequence)) return false;
  // Room for the next step's decodes too, its own pending token included: otherwise the first
  // of them to cross a block boundary would preempt it (usually the latest arrival) before it
  // ran, a swap out and in without progress that only spends its max_preemptions. Appends may
  // use the watermark's blocks, so the room is the larger of the two; alone it always fits (its
  // pending token fits the cache, checked above).
  if (!kv_cache_.has_room_for(kv::RoomQuery{.num_tokens = sequence->num_allocated,
                                            .apply_watermark = !past_watermark,
                                            .reserve_blocks = next_step_growth(sequence),
                                            .reserve_fraction = 0.0})) {
    if (past_watermark) hold_admission(sequence);
    return false;
  }
  if (!hold_adapter(sequence, plan)) return false;
  const kv::SeqId seqs[] = {sequence->seq};
  Result<kv::SwapOutcome> outcome = kv_cache_.swap_in(seqs, !past_watermark);
  if (!outcome.ok()) {
    fail(sequence, outcome.status().with_context("swapping the request's KV back in"), plan);
    return false;
  }
  if (outcome->status == kv::SwapStatus::kNoCapacityNow) {
    drop_adapter(sequence);
    if (past_watermark) hold_admission(sequence);
    return false;
  }
  remove_from(swapped_, sequence);
  sequence->status = SequenceStatus::kRunning;
  add_running(sequence);
  if (past_watermark) past_watermark_ = sequence;
  // Its pending token runs in the next step's decode phase (appending now could fail, and
  // admission never preempts).
  return true;
}

bool Scheduler::try_admit_waiting(Sequence* sequence, StepPlan& plan, int32_t& budget) {
  if (admission_held_against(sequence)) return false;
  const auto num_tokens = static_cast<int32_t>(sequence->tokens.size());
  if (!options_.chunked_prefill && num_tokens > budget && !plan.segments.empty()) return false;
  // A sequence preempted by recompute may have grown past what allocation under the watermark
  // admits: like a swapped one it comes back past it when nothing is more important. A new
  // sequence that large never fits.
  const bool past_watermark = sequence->num_preemptions > 0 && beyond_watermark(num_tokens) &&
                              kv_cache_.fits_ever(num_tokens, /*apply_watermark=*/false);
  if (past_watermark && !may_pass_watermark(sequence)) return false;
  // Held before the KV allocation, which could otherwise evict the adapter's pages.
  if (!hold_adapter(sequence, plan)) return false;
  Result<kv::AllocateOutcome> outcome = allocate(sequence, !past_watermark);
  if (!outcome.ok()) {
    fail(sequence, outcome.status().with_context("allocating the request's KV"), plan);
    return false;
  }
  switch (outcome->admission) {
    case kv::Admission::kAdmitted:
      break;
    case kv::Admission::kNoCapacityNow:
      drop_adapter(sequence);
      if (past_watermark) hold_admission(sequence);
      return false;
    case kv::Admission::kNeverFits:
      fail(sequence,
           resource_exhausted(
               "request needs KV for {} tokens, more than the KV cache can ever hold above its "
               "watermark{}; shorten the prompt or max_tokens, or give the KV cache more memory",
               num_tokens,
               kv_cache_.num_members() > 1
                   ? fmt::format(" (a KV-parallel group of {} members holds at most {} tokens)",
                                 kv_cache_.num_members(), kv_cache_.context_limit())
                   : std::string()),
           plan);
      return false;
  }
  remove_from(waiting_, sequence);
  sequence->status = SequenceStatus::kRunning;
  add_running(sequence);
  if (past_watermark) past_watermark_ = sequence;
  sequence->num_allocated = num_tokens;
  sequence->num_computed = outcome->num_cached_tokens;
  if (sequence->num_cached_prompt_tokens < 0) {
    sequence->num_cached_prompt_tokens =
        std::min(outcome->num_cached_tokens, sequence->num_prompt_tokens);
  }
  add_prefill_chunk(sequence, plan, budget);
  return true;
}

Result<kv::AllocateOutcome> Scheduler::allocate(Sequence* sequence, bool apply_watermark) {
  kv::BlockAllocationRequest request;
  request.tokens = sequence->tokens;
  request.cache_namespace = sequence->cache_namespace;
  request.apply_watermark = apply_watermark;
  // Nothing from the prefix cache when it wants its prompt logits: every prompt position must
  // run to give them.
  if (sequence->wants_prompt_logits) request.max_hit_tokens = 0;
  return kv_cache_.allocate_sequence(sequence->seq, request);
}

int64_t Scheduler::blocks_for(int32_t num_tokens) const {
  const int32_t block_size = kv_cache_.cache_block_size();
  return (int64_t{num_tokens} + block_size - 1) / block_size;
}

int64_t Scheduler::next_step_growth(const Sequence* resumed) const {
  // A sequence whose allocated tokens end on a block boundary takes a new block with its next
  // token (running prefills are counted too, though only completing ones will: a bound).
  const int32_t block_size = kv_cache_.cache_block_size();
  int64_t growth = resumed->num_allocated % block_size == 0 ? 1 : 0;
  for (const Sequence* running : running_) {
    if (running->num_allocated % block_size == 0) ++growth;
  }
  return growth;
}

bool Scheduler::beyond_watermark(int32_t num_tokens) const {
  return !kv_cache_.fits_ever(num_tokens, /*apply_watermark=*/true);
}

bool Scheduler::may_pass_watermark(const Sequence* sequence) const {
  if (past_watermark_ != nullptr) return false;
  // candidates_ is this step's admission order; those ahead still waiting or swapped did not
  // fit (or wait for an adapter): they are more important.
  for (const Sequence* ahead : candidates_) {
    if (ahead == sequence) return true;
    if (ahead->status == SequenceStatus::kWaiting || ahead->status == SequenceStatus::kSwapped) {
      return false;
    }
  }
  return false;
}

bool Scheduler::admission_held_against(const Sequence* sequence) const {
  return admission_held_step_ == step_index_ && admission_holder_ != sequence;
}

void Scheduler::hold_admission(const Sequence* sequence) {
  admission_holder_ = sequence;
  admission_held_step_ = step_index_;
}

Sequence* Scheduler::pick_victim(const Sequence* asking, int32_t member) const {
  FOLIO_CHECK(!running_.empty(), "preemption with nothing running");
  // A decode scheduled in this step has appended its token, so it looks like a prefill of one;
  // it is not a partial prefill.
  auto partial_prefill = [&](const Sequence* sequence) {
    return sequence->is_prefilling() && sequence->last_scheduled_step != step_index_;
  };
  // The sequence past the watermark is never the victim while another can be (scheduler.h);
  // when it asks itself, those scheduled in this step cannot give up their blocks.
  auto eligible = [&](const Sequence* sequence) {
    if (running_.size() == 1) return true;
    // Preempting a sequence that holds nothing in the short member frees nothing there.
    if (sequence != asking && kv_cache_.members_spanned(sequence->num_allocated) <= member) {
      return false;
    }
    if (sequence == past_watermark_) return false;
    return asking != past_watermark_ || sequence->last_scheduled_step != step_index_;
  };
  // Lowest priority first; among equals partial prefills (the least work lost), then the latest
  // arrival.
  Sequence* victim = nullptr;
  for (Sequence* candidate : running_) {
    if (!eligible(candidate)) continue;
    if (victim == nullptr) {
      victim = candidate;
    } else if (candidate->priority != victim->priority) {
      if (candidate->priority < victim->priority) victim = candidate;
    } else if (partial_prefill(candidate) != partial_prefill(victim)) {
      if (partial_prefill(candidate)) victim = candidate;
    } else if (arrives_before(victim, candidate)) {
      victim = candidate;
    }
  }
  return victim;
}

bool Scheduler::swap_victim(const Sequence& victim, StepPlan& plan) const {
  // A partial prefill has little KV worth moving and no pending token to resume with.
  if (!victim.is_decoding()) return false;
  const bool by_cost =
      (options_.preemption_mode == PreemptionMode::kCheaper || prefer_cheaper_preemption_) &&
      has_swap_space_ && preemption_cost_ != nullptr;
  if (!by_cost) {
    switch (options_.preemption_mode) {
      case PreemptionMode::kRecompute:
        return false;
      case PreemptionMode::kSwap:
      case PreemptionMode::kCheaper:  // without a cost model: swap, like kSwap
        return true;
    }
    FOLIO_UNREACHABLE("bad PreemptionMode");
  }
  const PreemptionChoice choice =
      preemption_cost_->choose(blocks_for(victim.num_allocated), victim.num_allocated);
  switch (choice) {
    case PreemptionChoice::kRecompute:
      ++plan.num_cost_chose_recompute;
      return false;
    case PreemptionChoice::kSwap:
      ++plan.num_cost_chose_swap;
      return true;
  }
  FOLIO_UNREACHABLE("bad PreemptionChoice");
}

void Scheduler::preempt(Sequence* victim, StepPlan& plan) {
  ++victim->num_preemptions;
  if (victim->num_preemptions > options_.max_preemptions) {
    fail(victim,
         resource_exhausted(
             "request was preempted {} times (limit {}) for lack of KV cache memory; lower the "
             "load, raise max_preemptions, or give the KV cache more memory",
             victim->num_preemptions, options_.max_preemptions),
         plan);
    return;
  }
  if (swap_victim(*victim, plan)) {
    const kv::SeqId seqs[] = {victim->seq};
    Result<kv::SwapOutcome> outcome = kv_cache_.swap_out(seqs);
    if (outcome.ok() && outcome->status == kv::SwapStatus::kSwapped) {
      drop_adapter(victim);
      remove_running(victim);
      victim->status = SequenceStatus::kSwapped;
      swapped_.push_back(victim);
      ++plan.num_preempted_by_swap;
      return;
    }
    if (!outcome.ok()) {
      log::warn("swap-out of request {} failed ({}); preempting by recompute", victim->request,
                outcome.status().to_string());
    }
    // The host swap space is full (or failed): recompute instead.
  }
  preempt_by_recompute(victim);
  ++plan.num_preempted_by_recompute;
}

void Scheduler::preempt_by_recompute(Sequence* victim) {
  remove_running(victim);
  release_kv(victim);
  victim->status = SequenceStatus::kWaiting;
  waiting_.push_back(victim);
}

int32_t Scheduler::recompute_running() {
  const auto num_sent = static_cast<int32_t>(running_.size());
  // preempt_by_recompute takes each out of running_.
  while (!running_.empty()) preempt_by_recompute(running_.back());
  return num_sent;
}

void Scheduler::fail(Sequence* sequence, Status error, StepPlan& plan) {
  finish(sequence);
  plan.failed.emplace_back(sequence, std::move(error));
}

void Scheduler::complete(const StepPlan& plan) {
  for (const ScheduledSegment& segment : plan.segments) {
    Sequence* sequence = segment.sequence;
    FOLIO_CHECK(sequence->status == SequenceStatus::kRunning &&
                    sequence->num_computed == segment.first_position,
                "request {} changed between scheduling and completing its step", sequence->request);
    sequence->num_computed += segment.num_tokens;
    const Status status = kv_cache_.mark_computed(sequence->seq, sequence->num_computed);
    FOLIO_CHECK(status.ok(), "mark_computed for request {}: {}", sequence->request,
                status.to_string());
  }
}

int64_t Scheduler::aged_priority(const Sequence& sequence, TimePoint now) const {
  const int64_t levels = (now - sequence.arrival) / options_.aging_interval;
  return int64_t{sequence.priority} + std::max<int64_t>(levels, 0);
}

void Scheduler::check_invariants() const {
  auto check_queue = [&](const std::vector<Sequence*>& queue, SequenceStatus status) {
    for (const Sequence* sequence : queue) {
      FOLIO_CHECK(sequence->status == status, "request {} is {} but queued as {}",
                  sequence->request, sequence_status_name(sequence->status),
                  sequence_status_name(status));
      const auto num_tokens = static_cast<int32_t>(sequence->tokens.size());
      FOLIO_CHECK(sequence->num_computed <= sequence->num_allocated &&
                  sequence->num_allocated <= num_tokens);
      const bool held = kv_cache_.contains(sequence->seq);
      if (status == SequenceStatus::kWaiting) {
        FOLIO_CHECK(!held && sequence->num_allocated == 0, "waiting request {} holds KV",
                    sequence->request);
        continue;
      }
      FOLIO_CHECK(held, "{} request {} holds no KV", sequence_status_name(status),
                  sequence->request);
      FOLIO_CHECK(*kv_cache_.num_tokens(sequence->seq) == sequence->num_allocated);
      FOLIO_CHECK(*kv_cache_.is_swapped(sequence->seq) == (status == SequenceStatus::kSwapped));
      FOLIO_CHECK(sequence->num_allocated == num_tokens ||
                      (sequence->num_allocated == num_tokens - 1 &&
                       sequence->num_computed == sequence->num_allocated),
                  "request {}: {} tokens, {} allocated, {} computed", sequence->request, num_tokens,
                  sequence->num_allocated, sequence->num_computed);
    }
  };
  check_queue(waiting_, SequenceStatus::kWaiting);
  check_queue(running_, SequenceStatus::kRunning);
  check_queue(swapped_, SequenceStatus::kSwapped);
  FOLIO_CHECK(kv_cache_.num_sequences() == static_cast<int64_t>(running_.size() + swapped_.size()));
  int32_t num_reserved = 0;
  for (const Sequence* sequence : running_) num_reserved += sequence->num_pending_forks;
  FOLIO_CHECK(num_reserved == num_reserved_forks_, "{} fork slots reserved, {} counted",
              num_reserved, num_reserved_forks_);
  FOLIO_CHECK(num_running_slots() <= options_.max_num_sequences);
}

}  // namespace folio::engine
