// A randomized driver for BlockManager: a stream of operations drawn with a fixed seed, run
// against the manager and a model of what each sequence holds (its tokens, adapter, how many
// positions have KV, whether it is swapped out). After every operation the manager's
// invariants are checked; every few operations the KV bytes of every resident sequence are
// compared with what a fresh prefill would have written (KvContents), which catches a block
// shared when it should not be, a lost copy-on-write, a swap that loses bytes, or an owned
// block whose page was evicted.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "folio/kv/block_manager.h"
#include "testing/kv_test_util.h"

namespace folio::kv::testing {

class RandomWorkload {
 public:
  // With concurrent_evictions, eviction notices may arrive at any time, so a failed call is not
  // expected to leave the state unchanged (processing notices is part of every call).
  RandomWorkload(BlockManager& manager, uint32_t seed, bool concurrent_evictions = false)
      : manager_(manager), random_(seed), concurrent_evictions_(concurrent_evictions) {
    std::uniform_int_distribution<int32_t> token(0, 50);
    for (auto& prefix : shared_prefixes_) {
      for (int32_t index = 0; index < 40; ++index) prefix.push_back(token(random_));
    }
  }

  // Runs one random operation; returns false (with a gtest failure) if something went wrong.
  bool step() {
    const int choice = pick(0, 99);
    if (choice < 20) return allocate();
    if (choice < 50) return decode_step();
    if (choice < 58) return compute_one();
    if (choice < 73) return free_one();
    if (choice < 80) return fork_one();
    if (choice < 87) return swap_out_some();
    if (choice < 94) return swap_in_some();
    return bad_input();
  }

  bool verify_contents() {
    for (const auto& [id, model] : sequences_) {
      if (model.swapped) continue;
      const auto result = KvContents::verify(manager_, SeqId(id), model.tokens,
                                             model.cache_namespace, model.computed);
      EXPECT_TRUE(result);
      if (!result) return false;
    }
    return true;
  }

  int64_t num_sequences() const { return static_cast<int64_t>(sequences_.size()); }
  int64_t num_admitted() const { return num_admitted_; }
  int64_t num_refused() const { return num_refused_; }

 private:
  struct Model {
    std::vector<int32_t> tokens;
    CacheNamespace cache_namespace;
    int32_t computed = 0;
    bool swapped = false;
  };

  int pick(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }

  // A random existing sequence in the wanted state, or -1.
  int64_t pick_sequence(bool swapped) {
    std::vector<int64_t> ids;
    for (const auto& [id, model] : sequences_) {
      if (model.swapped == swapped) ids.push_back(id);
    }
    return ids.empty() ? -1 : ids[static_cast<size_t>(pick(0, static_cast<int>(ids.size()) - 1))];
  }

  // Writes the KV of positions [computed, end) and reports them computed: a forward pass.
  bool compute(int64_t id, int32_t end) {
    Model& model = sequences_.at(id);
    KvContents::write(manager_, SeqId(id), model.tokens, model.cache_namespace, model.computed,
                      end);
    const Status status = manager_.mark_computed(SeqId(id), end);
    EXPECT_TRUE(status.ok()) << status.to_string();
    model.computed = end;
    return status.ok();
  }

  bool allocate() {
    Model model;
    if (pick(0, 2) > 0) {  // most prompts start with a shared system prompt
      const auto& prefix = shared_prefixes_[static_cast<size_t>(pick(0, 2))];
      model.tokens.assign(prefix.begin(), prefix.begin() + pick(1, 40));
    }
    const int suffix = pick(model.tokens.empty() ? 1 : 0, 30);
    for (int index = 0; index < suffix; ++index) model.tokens.push_back(pick(0, 50));
    model.cache_namespace.adapter_id = pick(0, 3) == 0 ? 1 : 0;
    const int64_t id = next_id_++;
    const auto outcome = manager_.allocate(SeqId(id), model.tokens, model.cache_namespace);
    EXPECT_TRUE(outcome.ok()) << outcome.status().to_string();
    if (!outcome.ok()) return false;
    if (outcome->admission != Admission::kAdmitted) {
      ++num_refused_;
      return true;
    }
    ++num_admitted_;
    model.computed = outcome->num_cached_tokens;
    EXPECT_LT(model.computed, static_cast<int32_t>(model.tokens.size()));
    const auto size = static_cast<int32_t>(model.tokens.size());
    sequences_.emplace(id, std::move(model));
    // Most prompts are prefilled at once; some wait (chunked or delayed prefill).
    return pick(0, 4) == 0 || compute(id, size);
  }

  // Appends a token to a few resident sequences, runs the step's copies as one batch, then
  // writes the new tokens' KV.
  bool decode_step() {
    std::vector<int64_t> appended;
    for (int count = pick(1, 4); count > 0; --count) {
      const int64_t id = pick_sequence(false);
      if (id < 0) break;
      Model& model = sequences_.at(id);
      const int32_t token = pick(0, 50);
      const auto outcome = manager_.append_slot(SeqId(id), token);
      if (!outcome.ok()) {
        EXPECT_EQ(outcome.status().code(), StatusCode::kOutOfRange) << outcome.status().to_string();
        if (outcome.status().code() != StatusCode::kOutOfRange) return false;
        continue;
      }
      if (outcome->status != AppendStatus::kAppended) continue;
      model.tokens.push_back(token);
      appended.push_back(id);
    }
    const Status status = manager_.apply_pending_copies();
    EXPECT_TRUE(status.ok()) << status.to_string();
    for (int64_t id : appended) {
      Model& model = sequences_.at(id);
      if (model.computed + 1 == static_cast<int32_t>(model.tokens.size())) {
        if (!compute(id, model.computed + 1)) return false;
      }
    }
    return status.ok();
  }

  bool compute_one() {
    const int64_t id = pick_sequence(false);
    if (id < 0) return true;
    const auto size = static_cast<int32_t>(sequences_.at(id).tokens.size());
    const Status status = manager_.apply_pending_copies();
    EXPECT_TRUE(status.ok());
    return compute(id, pick(sequences_.at(id).computed, size));
  }

  bool free_one() {
    const int64_t id = pick_sequence(pick(0, 4) == 0);
    if (id < 0) return true;
    const Status status = manager_.free(SeqId(id));
    EXPECT_TRUE(status.ok()) << status.to_string();
    sequences_.erase(id);
    return status.ok();
  }

  bool fork_one() {
    const int64_t parent = pick_sequence(false);
    if (parent < 0) return true;
    const int64_t child = next_id_++;
    const Status status = manager_.fork(SeqId(parent), SeqId(child));
    EXPECT_TRUE(status.ok()) << status.to_string();
    sequences_.emplace(child, sequences_.at(parent));
    return status.ok();
  }

  std::vector<SeqId> pick_distinct(bool swapped) {
    std::vector<SeqId> seqs;
    for (int count = pick(1, 2); count > 0; --count) {
      const int64_t id = pick_sequence(swapped);
      if (id >= 0 && std::find(seqs.begin(), seqs.end(), SeqId(id)) == seqs.end()) {
        seqs.emplace_back(id);
      }
    }
    return seqs;
  }

  bool swap_out_some() {
    const std::vector<SeqId> seqs = pick_distinct(false);
    if (seqs.empty()) return true;
    const auto outcome = manager_.swap_out(seqs);
    EXPECT_TRUE(outcome.ok()) << outcome.status().to_string();
    if (!outcome.ok()) return false;
    if (outcome->status == SwapStatus::kSwapped) {
      for (SeqId seq : seqs) sequences_.at(seq.value()).swapped = true;
    }
    return true;
  }

  bool swap_in_some() {
    const std::vector<SeqId> seqs = pick_distinct(true);
    if (seqs.empty()) return true;
    const auto outcome = manager_.swap_in(seqs);
    EXPECT_TRUE(outcome.ok()) << outcome.status().to_string();
    if (!outcome.ok()) return false;
    if (outcome->status == SwapStatus::kSwapped) {
      for (SeqId seq : seqs) sequences_.at(seq.value()).swapped = false;
    }
    return true;
  }

  // A call that must fail with an error and leave the manager exactly as it was.
  bool bad_input() {
    // Eviction notices the pool queued are processed by any call; process them first so that
    // only the failed call itself is under test.
    EXPECT_TRUE(manager_.process_evictions().ok());
    std::vector<SeqId> known;
    for (const auto& [id, model] : sequences_) known.emplace_back(id);
    const ManagerSnapshot before = ManagerSnapshot::take(manager_, known);
    Status status;
    const int64_t swapped = pick_sequence(true);
    switch (pick(0, 3)) {
      case 0:
        status = manager_.free(SeqId(next_id_ + 1000));
        break;
      case 1:
        status = swapped >= 0 ? manager_.append_slot(SeqId(swapped), 1).status()
                              : manager_.append_slot(SeqId(-7), 1).status();
        break;
      case 2: {
        std::vector<int32_t> too_long(
            static_cast<size_t>(manager_.options().max_context_tokens + 1), 3);
        status = manager_.allocate(SeqId(next_id_++), too_long).status();
        break;
      }
      case 3: {
        const int64_t id = pick_sequence(false);
        status = id >= 0 ? manager_.fork(SeqId(id), SeqId(id)) : manager_.free(SeqId(-3));
        break;
      }
    }
    EXPECT_FALSE(status.ok());
    const bool unchanged =
        concurrent_evictions_ || ManagerSnapshot::take(manager_, known) == before;
    EXPECT_TRUE(unchanged) << "a failed call changed state: " << status.to_string();
    return !status.ok() && unchanged;
  }

  BlockManager& manager_;
  std::mt19937 random_;
  bool concurrent_evictions_;
  std::vector<int32_t> shared_prefixes_[3];
  std::map<int64_t, Model> sequences_;
  int64_t next_id_ = 0;
  int64_t num_admitted_ = 0;
  int64_t num_refused_ = 0;
};

}  // namespace folio::kv::testing
