// EvictionIndex against a brute-force reference: the seed's score computed for every evictable
// allocation.
#include "folio/memory/eviction_index.h"

#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>

namespace folio::memory {
namespace {

constexpr uint32_t kPages = 256;

class EvictionIndexTest : public ::testing::Test {
 protected:
  // Makes an unpinned allocation headed at `head` and links it.
  void add(uint32_t head, uint32_t pages, ContentType content, uint64_t last_use) {
    PageSlot& slot = table_[head];
    slot.allocation_pages.store(pages);
    slot.content.store(static_cast<uint8_t>(content));
    slot.last_use.store(last_use);
    slot.word.store(PageWord::make(PageState::kUnpinned, true, 0, 1).bits());
    index_.link(head);
  }
  void set_pins(uint32_t head, uint32_t pins) {
    std::atomic<uint64_t>& word = table_[head].word;
    word.store(PageWord(word.load()).with_pins(pins).bits());
  }
  // Claims the victim as the pool does and returns it.
  uint32_t evict(uint64_t now) {
    const uint32_t victim = index_.select_victim(now);
    if (victim == kNoPage) return victim;
    std::atomic<uint64_t>& word = table_[victim].word;
    EXPECT_EQ(PageWord(word.load()).state(), PageState::kUnpinned);
    word.store(PageWord(word.load()).with_state(PageState::kReleasing).with_linked(false).bits());
    index_.remove(victim);
    return victim;
  }

  PageTable table_{kPages};
  EvictionIndex index_{table_, EvictionWeights{}, kDefaultContentPriority};
};

TEST_F(EvictionIndexTest, LowerContentPriorityGoesFirst) {
  add(0, 1, ContentType::kKvCache, 5);
  add(1, 1, ContentType::kTemporary, 5);
  add(2, 1, ContentType::kAdapterWeights, 5);
  EXPECT_EQ(evict(10), 1u);
  EXPECT_EQ(evict(10), 2u);
  EXPECT_EQ(evict(10), 0u);
  EXPECT_EQ(evict(10), kNoPage);
}

TEST_F(EvictionIndexTest, LeastRecentlyUsedGoesFirstWithinAContentType) {
  add(0, 1, ContentType::kKvCache, 7);
  add(1, 1, ContentType::kKvCache, 3);
  add(2, 1, ContentType::kKvCache, 9);
  EXPECT_EQ(evict(10), 1u);
  EXPECT_EQ(evict(10), 0u);
  EXPECT_EQ(evict(10), 2u);
}

TEST_F(EvictionIndexTest, RecentUseCanOutweighOnePriorityLevel) {
  // Seed weights: a temporary used this very step scores 0.6 + 0.2 = 0.8; an activation (one
  // level up) unused for 100 steps scores 0.006 + 0.4.
  add(0, 1, ContentType::kTemporary, 100);
  add(1, 1, ContentType::kActivation, 0);
  EXPECT_EQ(evict(100), 1u);
}

TEST_F(EvictionIndexTest, PinnedEntriesAreSkippedAndDroppedLazily) {
  add(0, 1, ContentType::kTemporary, 1);
  add(1, 1, ContentType::kTemporary, 2);
  set_pins(0, 1);
  EXPECT_EQ(index_.select_victim(5), 1u);
  EXPECT_FALSE(index_.contains(0));
  EXPECT_FALSE(PageWord(table_[0].word.load()).linked()) << "a dropped entry must be relinked "
                                                            "by its next unpin";
  index_.check_invariants();
}

TEST_F(EvictionIndexTest, TouchedEntriesAreReKeyedBeforeBeingChosen) {
  add(0, 1, ContentType::kKvCache, 1);
  add(1, 1, ContentType::kKvCache, 2);
  table_[0].last_use.store(8);  // a touch: only the atomic changes
  EXPECT_EQ(evict(10), 1u);
  EXPECT_EQ(table_[0].heap_key, 8u);
  index_.check_invariants();
}

// Random links, pins, unpins, touches and evictions. Each victim must be evictable and score
// within the size-class slack of the best evictable allocation; with single pages only the
// choice is exact.
class RandomIndexRun {
 public:
  RandomIndexRun(uint32_t seed, uint32_t max_pages) : random_(seed), max_pages_(max_pages) {
    // Allocations are 8 pages apart, so up to 8 pages long.
    for (uint32_t head = 0; head < table_.num_pages(); head += 8) free_heads_.push_back(head);
  }

  void run(int steps) {
    for (int step = 0; step < steps; ++step) {
      now_ += random_() % 3;
      const int op = static_cast<int>(random_() % 10);
      if (op < 3 && !free_heads_.empty()) {
        add();
      } else if (op < 8 && !pins_of_.empty()) {
        use(op);
      } else {
        evict();
      }
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << "step " << step;
        return;
      }
      index_.check_invariants();
    }
  }

 private:
  void add() {
    const uint32_t head = free_heads_.back();
    free_heads_.pop_back();
    PageSlot& slot = table_[head];
    slot.allocation_pages.store(1 + random_() % max_pages_);
    slot.content.store(static_cast<uint8_t>(random_() % kNumContentTypes));
    slot.last_use.store(now_);
    slot.word.store(PageWord::make(PageState::kUnpinned, true, 0, 1).bits());
    index_.link(head);
    pins_of_[head] = 0;
  }

  // Pin, unpin (relinking as the pool does) or touch a random allocation.
  void use(int op) {
    auto it = pins_of_.begin();
    std::advance(it, random_() % pins_of_.size());
    std::atomic<uint64_t>& word = table_[it->first].word;
    const PageWord current(word.load());
    if (op < 5) {
      word.store(current.with_pins(current.pins() + 1).bits());
      ++it->second;
    } else if (op < 7 && it->second > 0) {
      word.store(current.with_pins(current.pins() - 1).bits());
      --it->second;
      table_[it->first].last_use.store(now_);
      if (it->second == 0 && !current.linked()) {
        word.store(PageWord(word.load()).with_linked(true).bits());
        index_.link(it->first);
      }
    } else {
      table_[it->first].last_use.store(now_);
    }
  }

  double score_of(uint32_t head) const {
    const PageSlot& slot = table_[head];
    return index_.score(slot.last_use.load(), slot.allocation_pages.load(),
                        static_cast<ContentType>(slot.content.load()), now_);
  }

  void evict() {
    double best = std::numeric_limits<double>::infinity();
    for (const auto& [head, pins] : pins_of_) {
      if (pins == 0) best = std::min(best, score_of(head));
    }
    const uint32_t victim = index_.select_victim(now_);
    if (best == std::numeric_limits<double>::infinity()) {
      ASSERT_EQ(victim, kNoPage);
      return;
    }
    ASSERT_NE(victim, kNoPage);
    ASSERT_EQ(pins_of_.at(victim), 0u) << "chose a pinned allocation";
    const double slack =
        max_pages_ == 1 ? 1e-12 : index_.size_class_slack(table_[victim].allocation_pages.load());
    ASSERT_LE(score_of(victim), best + slack);
    std::atomic<uint64_t>& word = table_[victim].word;
    word.store(PageWord(word.load()).with_state(PageState::kReleasing).with_linked(false).bits());
    index_.remove(victim);
    pins_of_.erase(victim);
    free_heads_.push_back(victim);
  }

  PageTable table_{kPages};
  EvictionIndex index_{table_, EvictionWeights{}, kDefaultContentPriority};
  std::map<uint32_t, uint32_t> pins_of_;  // live allocations, head -> pins
  std::vector<uint32_t> free_heads_;
  std::mt19937 random_;
  uint32_t max_pages_;
  uint64_t now_ = 1;
};

void run_randomized(uint32_t seed, uint32_t max_pages) {
  RandomIndexRun(seed, max_pages).run(4000);
}

TEST(EvictionIndexRandomTest, SinglePageChoicesAreExactlyTheSeedsScoreOrder) {
  for (uint32_t seed : {11u, 12u, 13u}) run_randomized(seed, 1);
}

TEST(EvictionIndexRandomTest, MixedSizeChoicesAreWithinTheSizeClassSlack) {
  for (uint32_t seed : {21u, 22u, 23u}) run_randomized(seed, 8);
}

}  // namespace
}  // namespace folio::memory
