// Engine: recovery of the step runner (engine.h "Recovery", step_runner.h, docs/design/engine.md
// "Recovery"). A failed run() is followed by recover(); on success the KV the runner lost is
// rebuilt from the tokens the engine holds and the failed step's plan runs again; on failure,
// with the runner unavailable, every request ends and the engine waits for the runner.
//
// Why rebuilding by replay is exact: every kernel is deterministic and batch-invariant, so the
// same tokens at the same positions write the same KV bytes whatever the chunking; the replay
// steps are cut differently from the steps that first wrote the KV, and the tests check that
// the output is bit-equal to an uninterrupted run.
#include <algorithm>
#include <span>
#include <unordered_set>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/engine/engine.h"
#include "folio/engine/engine_request_state.h"

namespace folio::engine {

namespace {

// The loss two failures in a row leave (a replay that failed, then another recover()): the
// larger of the two.
RunnerRecovery merge_losses(const RunnerRecovery& earlier, const RunnerRecovery& later) {
  using LostKv = RunnerRecovery::LostKv;
  if (earlier.lost_kv == LostKv::kAllKv || later.lost_kv == LostKv::kAllKv) {
    return RunnerRecovery{LostKv::kAllKv, -1};
  }
  if (earlier.lost_kv == LostKv::kNone) return later;
  if (later.lost_kv == LostKv::kNone) return earlier;
  return RunnerRecovery{LostKv::kStageKv,
                        std::max(earlier.replay_through_stage, later.replay_through_stage)};
}

}  // namespace

Engine::StepRecovery Engine::recover_step(StepPlan& plan, Status failure) {
  const TimePoint started = clock_.now();
  // What is lost and not rebuilt yet, over every recover() of this failure.
  RunnerRecovery lost{RunnerRecovery::LostKv::kNone, -1};
  // Bounded: each successful recover() counts against every request with a running sequence
  // and ends those past max_recoveries_per_request, so after that many rounds nothing runs and
  // the rebuild (a replay of nothing) cannot fail; a failed recover() ends the loop.
  while (true) {
    Result<RunnerRecovery> recovery = runner_.recover(failure);
    if (!recovery.ok()) {
      metrics_.on_recovery_failure();
      metrics_.on_recovery_time(clock_.now() - started);
      if (!runner_.available()) {
        log::error("the step runner did not recover ({}) after: {}", recovery.status().to_string(),
                   failure.to_string());
        enter_runner_unavailable(recovery.status());
        return StepRecovery::kFailed;
      }
      // Not recoverable (a runner without recovery): the step's requests fail, as they always
      // did. KV that an earlier recover() of this failure reported lost is recomputed.
      fail_segments(plan, failure.with_context("model step"));
      if (lost.lost_kv != RunnerRecovery::LostKv::kNone) {
        scheduler_->recompute_running();
        drop_cached_prefixes();
      }
      return StepRecovery::kFailed;
    }
    const int64_t num_recovered = count_recovery(&plan);
    metrics_.on_recovery(num_recovered);
    log::warn("the step runner recovered from: {} ({} requests running)", failure.to_string(),
              num_recovered);
    lost = merge_losses(lost, *recovery);
    Status rebuilt = rebuild_lost_kv(lost);
    if (!rebuilt.ok()) {
      failure = rebuilt;
      continue;
    }
    metrics_.on_recovery_time(clock_.now() - started);
    switch (lost.lost_kv) {
      case RunnerRecovery::LostKv::kNone:
        return StepRecovery::kRunAgain;
      case RunnerRecovery::LostKv::kStageKv:
        return replays_lost_stages() ? StepRecovery::kRunAgain : StepRecovery::kRecomputing;
      case RunnerRecovery::LostKv::kAllKv:
        return StepRecovery::kRecomputing;
    }
    FOLIO_UNREACHABLE("bad RunnerRecovery::LostKv");
  }
}

int64_t Engine::count_recovery(StepPlan* plan) {
  std::vector<RequestId> running;
  running.reserve(scheduler_->running().size());
  for (const Sequence* sequence : scheduler_->running()) running.push_back(sequence->request);
  std::sort(running.begin(), running.end());
  running.erase(std::unique(running.begin(), running.end()), running.end());
  std::vector<RequestId> over_limit;
  for (RequestId id : running) {
    RequestState& state = *requests_.at(id);
    if (++state.num_recoveries > options_.max_recoveries_per_request) over_limit.push_back(id);
  }
  if (over_limit.empty()) return static_cast<int64_t>(running.size());
  if (plan != nullptr) {
    // Out of the plan before they end: ending a request destroys its sequences.
    std::erase_if(plan->segments, [&](const ScheduledSegment& segment) {
      return std::binary_search(over_limit.begin(), over_limit.end(), segment.sequence->request);
    });
    plan->num_tokens = 0;
    plan->num_logit_rows = 0;
    plan->num_prefill_tokens = 0;
    for (const ScheduledSegment& segment : plan->segments) {
      plan->num_tokens += segment.num_tokens;
      plan->num_logit_rows += segment.num_logit_rows();
      if (!segment.is_decode) plan->num_prefill_tokens += segment.num_tokens;
    }
  }
  for (RequestId id : over_limit) {
    const int32_t num_recoveries = requests_.at(id)->num_recoveries;
    finish_request(id, FinishReason::kError,
                   unavailable("request {} lost its KV cache in {} recoveries of the step runner; "
                               "the limit is {} (max_recoveries_per_request)",
                               id, num_recoveries, options_.max_recoveries_per_request));
  }
  return static_cast<int64_t>(running.size() - over_limit.size());
}

Status Engine::rebuild_lost_kv(const RunnerRecovery& lost) {
  // Whatever was lost, ref-0 blocks may hold KV the runner no longer has, and nothing would
  // rewrite them before a prefix hit read them.
  drop_cached_prefixes();
  switch (lost.lost_kv) {
    case RunnerRecovery::LostKv::kNone:
      return Status();
    case RunnerRecovery::LostKv::kStageKv:
      if (replays_lost_stages()) return replay_running_kv(lost.replay_through_stage);
      [[fallthrough]];
    case RunnerRecovery::LostKv::kAllKv: {
      const int32_t num_sent = scheduler_->recompute_running();
      // Their blocks just became CACHED: drop those too.
      drop_cached_prefixes();
      log::warn("the step runner lost every KV block: {} sequences recompute theirs", num_sent);
      return Status();
    }
  }
  FOLIO_UNREACHABLE("bad RunnerRecovery::LostKv");
}

Status Engine::replay_running_kv(int32_t through_stage) {
  // Each running sequence's tokens whose KV was written, [0, num_computed), as prefill chunks
  // without logits, each KV slot written once: a step may not write a slot twice (the executor
  // refuses it), and blocks shared by several sequences (forked choices, prefix-cache hits)
  // need writing only once. Shared blocks are always leading blocks (a prefix hit, a fork, a
  // copy-on-write of the last block), so a sequence replays from the first position no earlier
  // sequence claimed, once the steps that rewrite its leading positions have run. A sequence
  // takes at most one segment per step (its chunks depend on each other's KV) of at most the
  // prefill chunk in force (memory pressure may cut it); steps hold at most max_num_batched_tokens
  // tokens and max_num_sequences sequences: the limits the runner's steps were sized for.
  struct Cursor {
    Sequence* sequence;
    std::span<const int32_t> blocks;  // its block table
    int32_t first = 0;                // positions [0, first) are another sequence's to replay
    int32_t next = 0;                 // the first position not replayed yet
    bool ready = false;               // positions [0, first) are rewritten
  };
  if (block_manager_ == nullptr) {
    return failed_precondition(
        "replaying lost KV is not supported for a KV-parallel group; set replay_lost_stages "
        "false so that the running sequences recompute");
  }
  const int64_t block_size = block_manager_->options().geometry.block_size;
  std::vector<Cursor> cursors;
  for (Sequence* sequence : scheduler_->running()) {
    if (sequence->num_computed == 0) continue;
    Result<std::span<const int32_t>> table = block_manager_->block_table(sequence->seq);
    FOLIO_CHECK(table.ok(), "{}", table.status().to_string());
    cursors.push_back(Cursor{sequence, *table});
  }
  // Run order, so the replay is the same from run to run.
  std::sort(cursors.begin(), cursors.end(), [](const Cursor& left, const Cursor& right) {
    if (left.sequence->arrival_order != right.sequence->arrival_order) {
      return left.sequence->arrival_order < right.sequence->arrival_order;
    }
    return left.sequence->choice < right.sequence->choice;
  });
  const auto slot_of = [&](const Cursor& cursor, int32_t position) {
    return int64_t{cursor.blocks[static_cast<size_t>(position / block_size)]} * block_size +
           position % block_size;
  };
  std::unordered_set<int64_t> claimed;
  for (Cursor& cursor : cursors) {
    const int32_t num_computed = cursor.sequence->num_computed;
    while (cursor.first < num_computed && claimed.contains(slot_of(cursor, cursor.first))) {
      ++cursor.first;
    }
    for (int32_t position = cursor.first; position < num_computed; ++position) {
      FOLIO_CHECK(claimed.insert(slot_of(cursor, position)).second,
                  "request {}: KV slot of position {} is shared, but not its earlier ones",
                  cursor.sequence->request, position);
    }
    cursor.next = cursor.first;
  }
  std::unordered_set<int64_t> rewritten;
  const SchedulerOptions& limits = scheduler_->options();
  while (true) {
    StepPlan replay;
    int32_t budget = limits.max_num_batched_tokens;
    for (Cursor& cursor : cursors) {
      if (budget < 1 || static_cast<int32_t>(replay.segments.size()) >= limits.max_num_sequences) {
        break;
      }
      const int32_t remaining = cursor.sequence->num_computed - cursor.next;
      if (remaining == 0) continue;
      if (!cursor.ready) {
        cursor.ready = true;
        for (int32_t position = 0; position < cursor.first && cursor.ready; ++position) {
          cursor.ready = rewritten.contains(slot_of(cursor, position));
        }
        if (!cursor.ready) continue;
      }
      const int32_t chunk = std::min({remaining, budget, scheduler_->prefill_chunk_size()});
      replay.segments.push_back(ScheduledSegment{cursor.sequence, cursor.next, chunk,
                                                 /*wants_logits=*/false, /*is_decode=*/false,
                                                 /*all_logits=*/false});
      replay.num_tokens += chunk;
      replay.num_prefill_tokens += chunk;
      budget -= chunk;
    }
    if (replay.empty()) break;
    Result<ir::StepBatch> built = build_step(replay);
    FOLIO_CHECK(built.ok(), "laying out a replay step: {}", built.status().to_string());
    FOLIO_RETURN_IF_ERROR(runner_.replay(*built, through_stage)
                              .with_context(fmt::format("replaying the KV of {} running "
                                                        "sequences through stage {}",
                                                        cursors.size(), through_stage)));
    for (const ScheduledSegment& segment : replay.segments) {
      for (Cursor& cursor : cursors) {
        if (cursor.sequence != segment.sequence) continue;
        for (int32_t position = cursor.next; position < cursor.next + segment.num_tokens;
             ++position) {
          rewritten.insert(slot_of(cursor, position));
        }
        cursor.next += segment.num_tokens;
      }
    }
  }
  // The first unfinished cursor is always ready (what it waits for comes from earlier ones,
  // all finished), so the loop ends only when every cursor has finished.
  for (const Cursor& cursor : cursors) {
    FOLIO_CHECK(cursor.next == cursor.sequence->num_computed,
                "request {}: replay stopped at position {} of {}", cursor.sequence->request,
                cursor.next, cursor.sequence->num_computed);
  }
  return Status();
}

void Engine::drop_cached_prefixes() {
  if (kv_parallel_cache_ != nullptr) {
    for (int32_t member = 0; member < kv_parallel_cache_->num_groups(); ++member) {
      Result<int64_t> dropped = kv_parallel_cache_->group(member).drop_cached_blocks();
      FOLIO_CHECK(dropped.ok(), "dropping the lost prefix cache of KV-parallel member {}: {}",
                  member, dropped.status().to_string());
    }
    return;
  }
  Result<int64_t> dropped = block_manager_->drop_cached_blocks();
  FOLIO_CHECK(dropped.ok(), "dropping the lost prefix cache: {}", dropped.status().to_string());
}

void Engine::enter_runner_unavailable(const Status& recover_error) {
  runner_failure_ = recover_error;
  {
    MutexLock lock(inbox_mutex_);
    unavailable_cause_ = recover_error.message();
  }
  // Release: pairs with the acquire in submit() and health().
  runner_unavailable_.store(true, std::memory_order_release);
  fail_all_requests(
      unavailable("the model's step runner is unavailable: {}", recover_error.message()));
}

bool Engine::restore_runner() {
  const TimePoint started = clock_.now();
  Result<RunnerRecovery> recovery = runner_.recover(runner_failure_);
  if (!recovery.ok()) {
    metrics_.on_recovery_failure();
    runner_failure_ = recovery.status();
    MutexLock lock(inbox_mutex_);
    unavailable_cause_ = recovery.status().message();
    return false;
  }
  // Nothing runs (every request ended when the runner became unavailable), so no request
  // counts this recovery; what was cached is dropped, and there is nothing to replay.
  metrics_.on_recovery(count_recovery(nullptr));
  const Status rebuilt = rebuild_lost_kv(*recovery);
  metrics_.on_recovery_time(clock_.now() - started);
  if (!rebuilt.ok()) {
    runner_failure_ = rebuilt;
    return false;
  }
  log::info("the step runner is available again");
  {
    MutexLock lock(inbox_mutex_);
    unavailable_cause_.clear();
  }
  // Release: pairs with the acquire in submit() and health().
  runner_unavailable_.store(false, std::memory_order_release);
  return true;
}

void Engine::fail_all_requests(const Status& error) {
  std::vector<RequestId> unfinished;
  unfinished.reserve(requests_.size());
  for (const auto& [id, state] : requests_) unfinished.push_back(id);
  std::sort(unfinished.begin(), unfinished.end());
  for (RequestId id : unfinished) finish_request(id, FinishReason::kError, error);
}

}  // namespace folio::engine
