#include "folio/kv/kv_parallel_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "folio/kv/fixed_page_source.h"
#include "testing/kv_test_util.h"
#include "testing/tokens.h"

namespace folio::kv {
namespace {

using folio::testing::tokens;

using testing::ManagerSnapshot;

constexpr int32_t kBlockSize = 8;
constexpr int64_t kBlockBytes = kBlockSize * 32;
constexpr int32_t kTokensPerGroup = 32;

// Three groups, each a block manager on its own page source (its own device).
class KvParallelCacheTest : public ::testing::Test {
 protected:
  void make(std::vector<int32_t> pages_per_group) {
    for (int32_t pages : pages_per_group) {
      sources_.push_back(std::make_unique<FixedPageSource>(kBlockBytes * 4, pages));
      BlockManagerOptions options;
      options.geometry = testing::tiny_geometry(kBlockSize);
      options.max_context_tokens = kTokensPerGroup;
      options.watermark = 0.0;
      auto manager = BlockManager::create(options, *sources_.back(), copier_);
      ASSERT_TRUE(manager.ok()) << manager.status().to_string();
      managers_.push_back(std::move(manager).value());
    }
    std::vector<BlockManager*> groups;
    for (auto& manager : managers_) groups.push_back(manager.get());
    auto cache = KvParallelCache::create(groups, kTokensPerGroup);
    ASSERT_TRUE(cache.ok()) << cache.status().to_string();
    cache_ = std::move(cache).value();
  }

  // Allocates seq in one group alone and computes it: fills that group's prefix cache.
  void prefill_group(int32_t group, SeqId seq, std::span<const int32_t> prompt,
                     uint64_t parent_hash = kRootPrefixHash) {
    BlockAllocationRequest request;
    request.tokens = prompt;
    request.parent_hash = parent_hash;
    auto reservation = managers_[group]->prepare_allocate(seq, request);
    ASSERT_TRUE(reservation.ok());
    ASSERT_EQ(reservation->outcome().admission, Admission::kAdmitted);
    managers_[group]->commit(std::move(reservation).value());
    ASSERT_TRUE(managers_[group]->mark_computed(seq, static_cast<int32_t>(prompt.size())).ok());
  }

  std::vector<ManagerSnapshot> snapshots(std::span<const SeqId> seqs) {
    std::vector<ManagerSnapshot> result;
    for (auto& manager : managers_) result.push_back(ManagerSnapshot::take(*manager, seqs));
    return result;
  }

  void check_all() {
    for (auto& manager : managers_) manager->check_invariants();
  }

  std::vector<std::unique_ptr<FixedPageSource>> sources_;
  HostKvBlockCopier copier_;
  std::vector<std::unique_ptr<BlockManager>> managers_;
  std::unique_ptr<KvParallelCache> cache_;
};

// A member's step export: its block table rows hold its range's blocks from entry 0 (dummy
// rows for sequences that do not reach it), and each token's slot is in the member owning its
// position, -1 in every other member; the slots agree with the member's block table.
TEST_F(KvParallelCacheTest, MemberExportPutsEachTokenInTheMemberOwningItsPosition) {
  make({8, 8, 8});
  ASSERT_TRUE(cache_->allocate(SeqId(1), tokens(70)).ok());  // groups 0, 1, 2 (6 tokens)
  ASSERT_TRUE(cache_->allocate(SeqId(2), tokens(10)).ok());  // group 0 only
  const std::vector<SeqId> seqs = {SeqId(1), SeqId(2)};
  // A step: sequence 1's positions [28, 70) (a chunk across two boundaries), sequence 2's all.
  const std::vector<StepSegment> segments = {{SeqId(1), 28, 42}, {SeqId(2), 0, 10}};
  constexpr int32_t kColumns = 5;
  for (int32_t group = 0; group < 3; ++group) {
    std::vector<int32_t> tables(2 * kColumns, -7);
    ASSERT_TRUE(cache_->fill_block_tables(group, seqs, kColumns, tables).ok());
    const auto own = managers_[group]->block_table(SeqId(1));
    ASSERT_TRUE(own.ok());
    for (size_t b = 0; b < own->size(); ++b) EXPECT_EQ(tables[b], (*own)[b]);
    EXPECT_EQ(tables[kColumns - 1], managers_[group]->dummy_block().value());
    if (group > 0) {  // sequence 2 does not reach groups 1 and 2
      for (int32_t b = 0; b < kColumns; ++b) {
        EXPECT_EQ(tables[kColumns + b], managers_[group]->dummy_block().value());
      }
    }
    std::vector<int32_t> slots(56, 123);  // 52 tokens and 4 of padding
    ASSERT_TRUE(cache_->fill_slot_mapping(group, segments, slots).ok());
    for (int32_t token = 0; token < 56; ++token) {
      const int32_t seq = token < 42 ? 1 : 2;
      const int32_t position = token < 42 ? 28 + token : token - 42;
      const bool mine = token < 52 && position / kTokensPerGroup == group;
      if (!mine) {
        EXPECT_EQ(slots[token], -1) << "group " << group << " token " << token;
        continue;
      }
      const auto table = managers_[group]->block_table(SeqId(seq));
      ASSERT_TRUE(table.ok());
      const int32_t offset = position - group * kTokensPerGroup;
      EXPECT_EQ(slots[token], (*table)[offset / kBlockSize] * kBlockSize + offset % kBlockSize)
          << "group " << group << " token " << token;
    }
  }
  std::vector<int32_t> slots(8);
  EXPECT_EQ(cache_->fill_slot_mapping(3, segments, slots).code(), StatusCode::kInvalidArgument);
  const std::vector<StepSegment> too_far = {{SeqId(2), 5, 6}};
  EXPECT_EQ(cache_->fill_slot_mapping(0, too_far, slots).code(), StatusCode::kOutOfRange);
  const std::vector<SeqId> unknown = {SeqId(9)};
  std::vector<int32_t> tables(kColumns);
  EXPECT_EQ(cache_->fill_block_tables(0, unknown, kColumns, tables).code(), StatusCode::kNotFound);
}

TEST_F(KvParallelCacheTest, LongSequenceSpansGroupsByTokenRange) {
  make({8, 8, 8});
  const auto outcome = cache_->allocate(SeqId(1), tokens(80));
  ASSERT_TRUE(outcome.ok()) << outcome.status().to_string();
  EXPECT_EQ(outcome->admission, Admission::kAdmitted);
  EXPECT_EQ(outcome->num_groups, 3);
  EXPECT_EQ(*managers_[0]->num_tokens(SeqId(1)), 32);
  EXPECT_EQ(*managers_[1]->num_tokens(SeqId(1)), 32);
  EXPECT_EQ(*managers_[2]->num_tokens(SeqId(1)), 16);
  EXPECT_EQ(managers_[2]->block_table(SeqId(1))->size(), 2u);
  // Appends fill group 2's range, then run out of groups.
  for (int32_t token = 0; token < 16; ++token) {
    const auto appended = cache_->append_slot(SeqId(1), token);
    ASSERT_TRUE(appended.ok());
    EXPECT_EQ(appended->group, 2);
  }
  EXPECT_EQ(cache_->append_slot(SeqId(1), 0).status().code(), StatusCode::kOutOfRange);
  check_all();
  ASSERT_TRUE(cache_->free(SeqId(1)).ok());
  for (auto& manager : managers_) EXPECT_FALSE(manager->contains(SeqId(1)));
  EXPECT_EQ(cache_->free(SeqId(1)).code(), StatusCode::kNotFound);
  check_all();
}

TEST_F(KvParallelCacheTest, AppendPastAGroupOpensTheNextGroup) {
  make({8, 8, 8});
  ASSERT_TRUE(cache_->allocate(SeqId(1), tokens(32)).ok());
  EXPECT_FALSE(managers_[1]->contains(SeqId(1)));
  const auto appended = cache_->append_slot(SeqId(1), 9);
  ASSERT_TRUE(appended.ok());
  EXPECT_EQ(appended->status, AppendStatus::kAppended);
  EXPECT_EQ(appended->group, 1);
  EXPECT_EQ(appended->slot, int64_t{(*managers_[1]->block_table(SeqId(1)))[0]} * kBlockSize);
  EXPECT_EQ(*cache_->num_groups_spanned(SeqId(1)), 2);
  check_all();
}

TEST_F(KvParallelCacheTest, PrefixReuseChainsAcrossGroups) {
  make({8, 8, 8});
  std::vector<int32_t> prompt = tokens(41);
  ASSERT_TRUE(cache_->allocate(SeqId(1), std::span(prompt).first(40)).ok());
  ASSERT_TRUE(cache_->mark_computed(SeqId(1), 40).ok());
  ASSERT_TRUE(cache_->free(SeqId(1)).ok());
  const auto outcome = cache_->allocate(SeqId(2), prompt);
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->num_cached_tokens, 40);
  // Group 1's cached block is keyed under group 0's chain: other earlier tokens, no reuse.
  std::vector<int32_t> other = prompt;
  other[0] = 7;
  EXPECT_EQ(cache_->allocate(SeqId(3), other)->num_cached_tokens, 0);
  check_all();
}

TEST_F(KvParallelCacheTest, CachedTokensStopAtTheFirstGroupThatMisses) {
  make({2, 8, 8});  // group 0: 7 usable blocks
  const std::vector<int32_t> prompt = tokens(65);
  ASSERT_TRUE(cache_->allocate(SeqId(1), std::span(prompt).first(64)).ok());
  ASSERT_TRUE(cache_->mark_computed(SeqId(1), 64).ok());
  ASSERT_TRUE(cache_->free(SeqId(1)).ok());
  // Group 0 loses the tail of the cached range (the LRU evicts it first); group 1 keeps its
  // blocks, but they may not be served after a gap.
  prefill_group(0, SeqId(2), tokens(24, 3000));
  prefill_group(0, SeqId(3), tokens(8, 4000));
  ASSERT_EQ(managers_[0]->prefix_stats().evicted_blocks, 1);
  ASSERT_TRUE(managers_[0]->free(SeqId(2)).ok());
  const auto outcome = cache_->allocate(SeqId(4), prompt);
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(outcome->admission, Admission::kAdmitted);
  EXPECT_EQ(outcome->num_cached_tokens, 24);
  check_all();
}

// Group 0 would serve prefix hits (reviving CACHED blocks), group 1 would reuse its own CACHED
// blocks, group 2 has no room: the allocation fails and all three groups are as they were.
TEST_F(KvParallelCacheTest, FailedMultiGroupAllocationChangesNoGroup) {
  make({3, 2, 1});
  const std::vector<int32_t> prompt = tokens(80);
  prefill_group(0, SeqId(10), std::span(prompt).first(32));
  ASSERT_TRUE(managers_[0]->free(SeqId(10)).ok());
  prefill_group(1, SeqId(11), tokens(24, 5000));  // with the next: every block but the dummy
  prefill_group(1, SeqId(13), tokens(32, 6000));
  ASSERT_TRUE(managers_[1]->free(SeqId(11)).ok());
  ASSERT_TRUE(managers_[1]->free(SeqId(13)).ok());
  ASSERT_EQ(managers_[1]->counts().free, 0);
  prefill_group(2, SeqId(12), tokens(24, 9000));  // group 2 keeps these blocks
  ASSERT_GT(managers_[0]->counts().cached, 0);
  ASSERT_GT(managers_[1]->counts().cached, 0);
  const std::vector<SeqId> seqs{SeqId(1), SeqId(12)};
  const auto before = snapshots(seqs);
  std::vector<FixedPageSource::Counts> pools_before;
  for (auto& source : sources_) pools_before.push_back(source->counts());

  const auto outcome = cache_->allocate(SeqId(1), prompt);
  ASSERT_TRUE(outcome.ok()) << outcome.status().to_string();
  EXPECT_EQ(outcome->admission, Admission::kNoCapacityNow);
  EXPECT_FALSE(cache_->contains(SeqId(1)));
  EXPECT_EQ(snapshots(seqs), before);
  for (size_t group = 0; group < sources_.size(); ++group) {
    EXPECT_EQ(sources_[group]->counts().free, pools_before[group].free) << group;
    EXPECT_EQ(sources_[group]->counts().pinned, pools_before[group].pinned) << group;
  }
  check_all();
  // With room in group 2 the same allocation succeeds and uses group 0's cached prefix.
  ASSERT_TRUE(managers_[2]->free(SeqId(12)).ok());
  const auto retried = cache_->allocate(SeqId(1), prompt);
  ASSERT_TRUE(retried.ok());
  EXPECT_EQ(retried->admission, Admission::kAdmitted);
  EXPECT_EQ(retried->num_cached_tokens, 32);
  check_all();
}

TEST_F(KvParallelCacheTest, BadInputIsAnErrorAndChangesNoGroup) {
  make({8, 8, 8});
  ASSERT_TRUE(cache_->allocate(SeqId(1), tokens(40)).ok());
  const std::vector<SeqId> seqs{SeqId(1), SeqId(2)};
  const auto before = snapshots(seqs);
  EXPECT_EQ(cache_->allocate(SeqId(2), tokens(97)).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache_->allocate(SeqId(1), tokens(4)).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cache_->append_slot(SeqId(2), 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->fork(SeqId(2), SeqId(3)).code(), StatusCode::kNotFound);
  EXPECT_EQ(cache_->fork(SeqId(1), SeqId(1)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(cache_->mark_computed(SeqId(1), 41).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(snapshots(seqs), before);
  check_all();
}

// Random allocations, appends, forks and frees over three groups with little memory; after
// every operation each group's invariants hold and each group holds exactly the sequence's
// token range.
TEST_F(KvParallelCacheTest, RandomOperationsKeepGroupsConsistent) {
  make({5, 4, 3});
  std::mt19937 random(17);
  const auto pick = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  std::map<int64_t, std::vector<int32_t>> model;
  int64_t next_id = 0;
  for (int operation = 0; operation < 1500; ++operation) {
    const int choice = pick(0, 9);
    if (choice < 3) {
      std::vector<int32_t> prompt = tokens(pick(1, 90), pick(0, 2) * 1000);
      const int64_t id = next_id++;
      const auto outcome = cache_->allocate(SeqId(id), prompt);
      ASSERT_TRUE(outcome.ok());
      if (outcome->admission == Admission::kAdmitted) {
        ASSERT_TRUE(cache_->mark_computed(SeqId(id), static_cast<int32_t>(prompt.size())).ok());
        model.emplace(id, std::move(prompt));
      }
    } else if (!model.empty()) {
      auto entry = model.begin();
      std::advance(entry, pick(0, static_cast<int>(model.size()) - 1));
      const SeqId seq(entry->first);
      if (choice < 7) {
        const auto appended = cache_->append_slot(seq, pick(0, 99));
        if (appended.ok() && appended->status == AppendStatus::kAppended) {
          entry->second.push_back(0);
          for (auto& manager : managers_) ASSERT_TRUE(manager->apply_pending_copies().ok());
        }
      } else if (choice < 8) {
        ASSERT_TRUE(cache_->fork(seq, SeqId(next_id)).ok());
        model.emplace(next_id++, entry->second);
      } else {
        ASSERT_TRUE(cache_->free(seq).ok());
        model.erase(entry);
      }
    }
    check_all();
    for (const auto& [id, prompt] : model) {
      const auto size = static_cast<int32_t>(prompt.size());
      ASSERT_EQ(*cache_->num_tokens(SeqId(id)), size);
      for (int32_t group = 0; group < 3; ++group) {
        const int32_t expected = std::clamp(size - group * kTokensPerGroup, 0, kTokensPerGroup);
        ASSERT_EQ(managers_[group]->contains(SeqId(id)), expected > 0);
        if (expected > 0) {
          ASSERT_EQ(*managers_[group]->num_tokens(SeqId(id)), expected);
        }
      }
    }
  }
}

}  // namespace
}  // namespace folio::kv
