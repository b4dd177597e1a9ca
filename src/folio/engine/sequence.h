// Sequence: the scheduler's record of one request's tokens and where its KV is.
//
// A sequence's tokens are its prompt followed by the tokens generated so far. The KV cache
// (kv::BlockManager) holds the first `num_allocated` of them (slots allocated) and has the KV of
// the first `num_computed` written. The lifecycle:
//
//   WAITING --admit (allocate)--> RUNNING --finish--> FINISHED
//      ^                            |  ^
//      +--preempt by recompute------+  +--swap in-- SWAPPED <--preempt by swap-- RUNNING
//   (any state) --cancel / error--> FINISHED
//
// A RUNNING sequence is *prefilling* while num_computed < num_allocated (its next step runs a
// chunk of those tokens) and *decoding* once they are equal: then it holds exactly one token
// more than the cache (the last sampled one), which the next step appends and computes.
// Preemption by recompute forgets the KV (num_allocated = num_computed = 0) but keeps the
// tokens, so nothing generated is lost and nothing is sampled twice; its computed full blocks
// stay CACHED, so re-admission mostly hits the prefix cache.
//
// Invariants: num_computed <= num_allocated <= tokens.size(); WAITING => num_allocated == 0;
// RUNNING or SWAPPED => num_allocated == tokens.size() or (decoding) tokens.size() - 1.
// Thread-safety: owned by the engine thread.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "folio/engine/clock.h"
#include "folio/engine/request.h"
#include "folio/kv/kv_types.h"

namespace folio::engine {

enum class SequenceStatus : uint8_t { kWaiting, kRunning, kSwapped, kFinished };
std::string_view sequence_status_name(SequenceStatus status);

struct Sequence {
  RequestId request;
  int32_t choice = 0;  // which choice of the request (request.h) this sequence generates
  kv::SeqId seq;
  int32_t priority = 0;
  TimePoint arrival;
  int64_t arrival_order = 0;  // submission order: ties in arrival time break by it
  kv::CacheNamespace cache_namespace;
  int64_t adapter_id = 0;      // the request's adapter (0: the base model)
  bool holds_adapter = false;  // it holds its adapter resident (running with it)

  std::vector<int32_t> tokens;  // prompt then generated
  int32_t num_prompt_tokens = 0;
  int32_t num_allocated = 0;
  int32_t num_computed = 0;

  SequenceStatus status = SequenceStatus::kWaiting;
  int32_t num_preemptions = 0;
  int32_t num_cached_prompt_tokens = -1;  // prefix hits at first admission; -1 before it
  bool scheduled_once = false;
  // Every prompt position's logits are wanted (Request::prompt_logprobs) and not yet delivered:
  // admission takes nothing from the prefix cache (cached tokens would have no logits) and each
  // prefill chunk asks for a logits row per token. The engine clears it on delivery.
  bool wants_prompt_logits = false;
  // Choices still to fork from this one when its prompt's prefill completes (n > 1: choice 0,
  // until the fork). Admission reserves a running slot for each, so the fork never exceeds
  // max_num_sequences.
  int32_t num_pending_forks = 0;
  int64_t last_scheduled_step = -1;  // the scheduler's step index when last given a segment

  int32_t num_generated() const { return static_cast<int32_t>(tokens.size()) - num_prompt_tokens; }
  bool is_prefilling() const {
    return status == SequenceStatus::kRunning && num_computed < num_allocated;
  }
  bool is_decoding() const {
    return status == SequenceStatus::kRunning && num_computed == num_allocated;
  }
};

}  // namespace folio::engine
