// KvCache (kv_cache.h), the scheduler's view of a KV cache, over one block manager and over a
// KV-parallel group. Randomized operation sequences through the interface alone, checked
// against an independent reading of the members: admission of n tokens is each spanned
// member's own admission of its share (BlockManager::can_allocate, its watermark and
// capacity), all or nothing (a refused allocation leaves every member's counts as they were);
// a failed append names the member that had no block; every member's invariants hold after
// every operation.
#include "folio/kv/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "folio/kv/kv_parallel_cache.h"
#include "testing/kv_test_util.h"

namespace folio::kv {
namespace {

constexpr int32_t kBlockSize = 8;
constexpr int64_t kBlockBytes = kBlockSize * 32;
constexpr int32_t kBlocksPerPage = 4;

struct Members {
  std::vector<std::unique_ptr<FixedPageSource>> sources;
  HostKvBlockCopier copier;
  std::vector<std::unique_ptr<BlockManager>> managers;
};

std::unique_ptr<BlockManager> make_manager(Members& members, int32_t pages,
                                           int32_t max_context_tokens, double watermark) {
  members.sources.push_back(std::make_unique<FixedPageSource>(kBlockBytes * kBlocksPerPage, pages));
  BlockManagerOptions options;
  options.geometry = testing::tiny_geometry(kBlockSize);
  options.max_context_tokens = max_context_tokens;
  options.watermark = watermark;
  auto manager = BlockManager::create(options, *members.sources.back(), members.copier);
  FOLIO_CHECK(manager.ok(), "{}", manager.status().to_string());
  return std::move(manager).value();
}

// What each member would say about its share of a sequence of num_tokens.
Admission expected_admission(const std::vector<BlockManager*>& members, int32_t tokens_per_member,
                             int32_t num_tokens) {
  if (num_tokens > static_cast<int64_t>(members.size()) * tokens_per_member) {
    return Admission::kNeverFits;
  }
  Admission result = Admission::kAdmitted;
  for (size_t member = 0; member < members.size(); ++member) {
    const int32_t share = std::clamp<int32_t>(
        num_tokens - static_cast<int32_t>(member) * tokens_per_member, 0, tokens_per_member);
    if (share == 0) break;
    const Admission own = members[member]->can_allocate(share);
    if (own == Admission::kNeverFits) return Admission::kNeverFits;
    if (own == Admission::kNoCapacityNow) result = Admission::kNoCapacityNow;
  }
  return result;
}

struct Counts {
  int64_t owned, free, sequences;
  bool operator==(const Counts&) const = default;
};

std::vector<Counts> counts_of(const std::vector<BlockManager*>& members) {
  std::vector<Counts> result;
  for (const BlockManager* member : members) {
    result.push_back(
        Counts{member->counts().owned, member->counts().free, member->num_sequences()});
  }
  return result;
}

// Runs random operations on `cache`, whose members are `members` (one for a block manager),
// each holding tokens_per_member positions of a sequence.
void run_random(KvCache& cache, const std::vector<BlockManager*>& members,
                int32_t tokens_per_member, uint32_t seed) {
  std::mt19937 random(seed);
  const auto pick = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  const int32_t longest = static_cast<int32_t>(members.size()) * tokens_per_member;
  std::map<int64_t, int32_t> lengths;  // the model: each sequence's tokens
  int64_t next_id = 0;
  int32_t num_admitted = 0, num_refused_now = 0, num_never = 0, num_short_appends = 0;
  for (int operation = 0; operation < 2000; ++operation) {
    const int choice = pick(0, 9);
    if (choice < 3 || lengths.empty()) {
      const int32_t length = pick(1, longest + 8);
      // Distinct tokens per sequence: no prefix hits, so admission is the members' arithmetic.
      std::vector<int32_t> tokens(static_cast<size_t>(length));
      for (int32_t& token : tokens) token = pick(0, 1 << 20);
      const Admission expected = expected_admission(members, tokens_per_member, length);
      EXPECT_EQ(cache.fits_ever(length, true), expected != Admission::kNeverFits) << length;
      EXPECT_EQ(cache.has_room_for(RoomQuery{.num_tokens = length,
                                             .apply_watermark = true,
                                             .reserve_blocks = 0,
                                             .reserve_fraction = 0.0}),
                expected == Admission::kAdmitted)
          << length;
      const std::vector<Counts> before = counts_of(members);
      BlockAllocationRequest request;
      request.tokens = tokens;
      const SeqId seq(next_id++);
      Result<AllocateOutcome> outcome = cache.allocate_sequence(seq, request);
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      ASSERT_EQ(outcome->admission, expected) << "sequence of " << length << " tokens";
      if (outcome->admission == Admission::kAdmitted) {
        ++num_admitted;
        lengths.emplace(seq.value(), length);
        ASSERT_TRUE(cache.mark_computed(seq, length).ok());
        EXPECT_EQ(cache.members_spanned(length),
                  (length + tokens_per_member - 1) / tokens_per_member);
      } else {
        (outcome->admission == Admission::kNeverFits ? num_never : num_refused_now) += 1;
        EXPECT_FALSE(cache.contains(seq));
        EXPECT_TRUE(counts_of(members) == before) << "a refused allocation changed a member";
      }
    } else {
      auto entry = lengths.begin();
      std::advance(entry, pick(0, static_cast<int>(lengths.size()) - 1));
      const SeqId seq(entry->first);
      if (choice < 7) {
        if (entry->second >= longest) continue;
        const int32_t member = entry->second / tokens_per_member;
        const bool member_has_block =
            members[static_cast<size_t>(member)]->allocator().num_obtainable_blocks() > 0;
        Result<AppendedToken> appended = cache.append_token(seq, pick(0, 99));
        ASSERT_TRUE(appended.ok()) << appended.status();
        EXPECT_EQ(appended->member, member);
        if (appended->status == AppendStatus::kAppended) {
          ++entry->second;
          ASSERT_TRUE(cache.apply_pending_copies().ok());
          ASSERT_TRUE(cache.mark_computed(seq, entry->second).ok());
        } else {
          ++num_short_appends;
          // A new block (a boundary, or a copy of a shared last block) the member lacked.
          EXPECT_FALSE(member_has_block)
              << "append refused though member " << member << " had a block";
        }
      } else if (choice < 8) {
        ASSERT_TRUE(cache.fork(seq, SeqId(next_id)).ok());
        lengths.emplace(next_id++, entry->second);
      } else {
        ASSERT_TRUE(cache.free(seq).ok());
        lengths.erase(entry);
      }
    }
    cache.check_cache_invariants();
    ASSERT_EQ(cache.num_sequences(), static_cast<int64_t>(lengths.size()));
    for (const auto& [id, length] : lengths) {
      ASSERT_EQ(*cache.num_tokens(SeqId(id)), length);
      ASSERT_FALSE(*cache.is_swapped(SeqId(id)));
    }
  }
  // The workload must reach every outcome, or the test checks less than it claims.
  EXPECT_GT(num_admitted, 0);
  EXPECT_GT(num_refused_now, 0);
  EXPECT_GT(num_never, 0);
  EXPECT_GT(num_short_appends, 0);
}

class KvCacheRandomTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(KvCacheRandomTest, GroupAdmitsPerMemberAllOrNothing) {
  Members members;
  constexpr int32_t kTokensPerMember = 32;
  // Members of different sizes (the last one, 3 usable blocks, cannot hold its whole range of
  // 4) and a watermark: admission must be each member's own.
  for (int32_t pages : {5, 3, 1}) {
    members.managers.push_back(make_manager(members, pages, kTokensPerMember, 0.1));
  }
  std::vector<BlockManager*> pointers;
  for (auto& manager : members.managers) pointers.push_back(manager.get());
  auto cache = KvParallelCache::create(pointers, kTokensPerMember);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->num_members(), 3);
  EXPECT_EQ((*cache)->context_limit(), 3 * kTokensPerMember);
  EXPECT_FALSE((*cache)->supports_swap());
  EXPECT_EQ((*cache)->swap_out({}).status().code(), StatusCode::kFailedPrecondition);
  run_random(**cache, pointers, kTokensPerMember, GetParam());
}

TEST_P(KvCacheRandomTest, BlockManagerIsAOneMemberCache) {
  Members members;
  std::unique_ptr<BlockManager> manager = make_manager(members, 6, 96, 0.1);
  std::vector<BlockManager*> pointers = {manager.get()};
  EXPECT_EQ(manager->num_members(), 1);
  run_random(*manager, pointers, 96, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvCacheRandomTest, ::testing::Values(1u, 2u, 3u, 4u));

}  // namespace
}  // namespace folio::kv
