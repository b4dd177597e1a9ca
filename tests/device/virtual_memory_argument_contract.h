// The VirtualMemory contract, failure part: every bad argument is refused with the documented
// code and changes nothing, and a randomized sequence of operations checked against a model of
// which granule of which memory every view shows. Instantiated like virtual_memory_contract.h.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "virtual_memory_test_util.h"

namespace folio::device::testing {

template <typename Backend>
class VirtualMemoryArgumentTest : public VirtualMemoryFixture<Backend> {
 protected:
  // Which (memory index, granule) a granule of a view shows, if any.
  using Slot = std::optional<std::pair<size_t, size_t>>;
  // The word last written into each granule of each memory; unknown until written (CUDA memory
  // starts as junk).
  using Words = std::vector<std::vector<std::optional<uint64_t>>>;

  // Reads back every granule of every view that shows a granule with a known word.
  void expect_views_show(const std::vector<AddressRange>& views,
                         const std::vector<std::vector<Slot>>& shown, const Words& words,
                         int step) {
    for (size_t view = 0; view < views.size(); ++view) {
      for (size_t i = 0; i < shown[view].size(); ++i) {
        if (!shown[view][i]) continue;
        const std::optional<uint64_t> word = words[shown[view][i]->first][shown[view][i]->second];
        if (!word) continue;
        ASSERT_EQ(this->read_word(views[view], i * this->granule_), *word)
            << "step " << step << ", view " << view << ", granule " << i;
      }
    }
  }
};

TYPED_TEST_SUITE_P(VirtualMemoryArgumentTest);

TYPED_TEST_P(VirtualMemoryArgumentTest, BadSizesAreInvalidArguments) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  FOLIO_EXPECT_CODE(vm.reserve(0).status(), StatusCode::kInvalidArgument);
  FOLIO_EXPECT_CODE(vm.reserve(g + 1).status(), StatusCode::kInvalidArgument);
  FOLIO_EXPECT_CODE(vm.create(0).status(), StatusCode::kInvalidArgument);
  FOLIO_EXPECT_CODE(vm.create(g / 2).status(), StatusCode::kInvalidArgument);
  PhysicalMemory memory = this->create(2 * g);
  FOLIO_EXPECT_CODE(vm.grow(memory, g), StatusCode::kInvalidArgument);
  FOLIO_EXPECT_CODE(vm.grow(memory, 2 * g + 1), StatusCode::kInvalidArgument);
  EXPECT_EQ(memory.size, 2 * g);
  EXPECT_EQ(vm.resident_bytes(memory).value_or(0), 2 * g);
}

TYPED_TEST_P(VirtualMemoryArgumentTest, BadMapRegionsAreRefusedAndChangeNothing) {
  const size_t g = this->granule_;
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(2 * g);
  const AddressRange range = this->reserve(4 * g);
  FOLIO_EXPECT_OK(vm.map(range, g, memory, 0, 2 * g));
  this->write_word(range, g, 77);
  const auto refused = [&](size_t range_offset, size_t memory_offset, size_t bytes) {
    FOLIO_EXPECT_CODE(vm.map(range, range_offset, memory, memory_offset, bytes),
                      StatusCode::kInvalidArgument);
  };
  refused(1, 0, g);                 // misaligned range offset
  refused(0, 1, g);                 // misaligned memory offset
  refused(0, 0, 0);                 // empty
  refused(0, 0, g - 1);             // misaligned size
  refused(3 * g, 0, 2 * g);         // past the end of the range
  refused(0, g, 2 * g);             // past the end of the memory
  refused(kMax - g + 1, 0, 2 * g);  // range offset + bytes wraps around
  refused(0, kMax - g + 1, 2 * g);  // memory offset + bytes wraps around
  refused(g, 0, g);                 // exactly over a mapping
  refused(0, 0, 2 * g);             // partly over a mapping
  refused(2 * g, 0, 2 * g);         // partly over a mapping, from inside it
  EXPECT_EQ(this->read_word(range, g), 77u);
  // The free granules at both ends still map.
  FOLIO_EXPECT_OK(vm.map(range, 0, memory, g, g));
  FOLIO_EXPECT_OK(vm.map(range, 3 * g, memory, 0, g));
  EXPECT_EQ(this->read_word(range, 3 * g), 77u);
}

TYPED_TEST_P(VirtualMemoryArgumentTest, BadUnmapAndSetAccessRegionsAreRefused) {
  const size_t g = this->granule_;
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(g);
  const AddressRange range = this->reserve(3 * g);
  FOLIO_EXPECT_OK(vm.map(range, g, memory, 0, g));
  this->write_word(range, g, 5);
  for (auto [offset, bytes] : std::vector<std::pair<size_t, size_t>>{{1, g},
                                                                     {g, 1},
                                                                     {g, 0},
                                                                     {0, g},
                                                                     {0, 2 * g},
                                                                     {g, 2 * g},
                                                                     {2 * g, 2 * g},
                                                                     {kMax - g + 1, 2 * g}}) {
    FOLIO_EXPECT_CODE(vm.unmap(range, offset, bytes), StatusCode::kInvalidArgument);
    FOLIO_EXPECT_CODE(vm.set_access(range, offset, bytes, Access::kNone),
                      StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(this->read_word(range, g), 5u);
  FOLIO_EXPECT_OK(vm.unmap(range, g, g));
  FOLIO_EXPECT_CODE(vm.unmap(range, g, g), StatusCode::kInvalidArgument);
}

TYPED_TEST_P(VirtualMemoryArgumentTest, StaleAndForeignHandlesAreFailedPreconditions) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  Result<std::unique_ptr<VirtualMemory>> other_made = TypeParam::make();
  ASSERT_TRUE(other_made.ok()) << other_made.status().to_string();
  VirtualMemory& other = **other_made;
  const AddressRange range = this->reserve(g);
  PhysicalMemory memory = this->create(g);
  const AddressRange foreign_range = *other.reserve(g);
  PhysicalMemory foreign_memory = *other.create(g);
  constexpr StatusCode kStale = StatusCode::kFailedPrecondition;
  FOLIO_EXPECT_CODE(vm.map(foreign_range, 0, memory, 0, g), kStale);
  FOLIO_EXPECT_CODE(vm.map(range, 0, foreign_memory, 0, g), kStale);
  FOLIO_EXPECT_CODE(vm.release(foreign_range), kStale);
  FOLIO_EXPECT_CODE(vm.release(foreign_memory), kStale);
  FOLIO_EXPECT_CODE(vm.grow(foreign_memory, 2 * g), kStale);
  FOLIO_EXPECT_CODE(vm.map(AddressRange{}, 0, memory, 0, g), kStale);
  FOLIO_EXPECT_CODE(vm.map(range, 0, PhysicalMemory{}, 0, g), kStale);
  // A live id with a forged base or size is not the range it names.
  FOLIO_EXPECT_CODE(vm.map(AddressRange{range.id, range.base + g, g}, 0, memory, 0, g), kStale);
  FOLIO_EXPECT_CODE(vm.release(AddressRange{range.id, range.base, 2 * g}), kStale);
  // Handles of the other instance are still live there.
  FOLIO_EXPECT_OK(other.map(foreign_range, 0, foreign_memory, 0, g));
  FOLIO_EXPECT_OK(vm.map(range, 0, memory, 0, g));
  FOLIO_EXPECT_OK(vm.release(range));
  FOLIO_EXPECT_OK(vm.release(memory));
  FOLIO_EXPECT_CODE(vm.release(range), kStale);
  FOLIO_EXPECT_CODE(vm.release(memory), kStale);
}

// Model: for each view, which (memory, granule) each of its granules shows; for each memory,
// the word last written into each granule. Every step picks a random verb with random (often
// bad) arguments, predicts from the model whether it is legal, checks the implementation agrees,
// and then reads every mapped granule of every view back.
TYPED_TEST_P(VirtualMemoryArgumentTest, RandomOperationsMatchAModel) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  constexpr size_t kViewGranules = 6;
  constexpr int kSteps = 300;
  std::mt19937_64 random(20240601);
  std::vector<PhysicalMemory> memories = {this->create(2 * g), this->create(3 * g)};
  typename TestFixture::Words words(2);
  words[0].resize(2);
  words[1].resize(3);
  std::vector<AddressRange> views = {this->reserve(kViewGranules * g),
                                     this->reserve(kViewGranules * g)};
  using Slot = typename TestFixture::Slot;
  std::vector<std::vector<Slot>> shown(views.size(), std::vector<Slot>(kViewGranules));
  const auto pick = [&](size_t bound) { return static_cast<size_t>(random() % bound); };
  for (int step = 0; step < kSteps; ++step) {
    const size_t v = pick(views.size());
    const size_t m = pick(memories.size());
    const size_t first = pick(kViewGranules + 1);
    const size_t count = pick(4);
    const size_t memory_first = pick(4);
    std::vector<Slot>& slots = shown[v];
    const bool inside = count > 0 && first + count <= kViewGranules;
    bool any_mapped = false;
    bool all_mapped = inside;
    for (size_t i = first; inside && i < first + count; ++i) {
      any_mapped |= slots[i].has_value();
      all_mapped &= slots[i].has_value();
    }
    switch (pick(4)) {
      case 0: {
        const bool legal = inside && !any_mapped && memory_first + count <= words[m].size();
        const Status status = vm.map(views[v], first * g, memories[m], memory_first * g, count * g);
        ASSERT_EQ(status.ok(), legal) << "step " << step << ": " << status.to_string();
        for (size_t i = 0; legal && i < count; ++i) slots[first + i] = {{m, memory_first + i}};
        break;
      }
      case 1: {
        const Status status = vm.unmap(views[v], first * g, count * g);
        ASSERT_EQ(status.ok(), all_mapped) << "step " << step << ": " << status.to_string();
        for (size_t i = 0; all_mapped && i < count; ++i) slots[first + i].reset();
        break;
      }
      case 2: {
        if (first >= kViewGranules || !slots[first]) break;
        const uint64_t word = random();
        this->write_word(views[v], first * g, word);
        words[slots[first]->first][slots[first]->second] = word;
        break;
      }
      case 3: {
        const size_t new_granules = words[m].size() + count;
        ASSERT_TRUE(vm.grow(memories[m], new_granules * g).ok()) << "step " << step;
        words[m].resize(new_granules);
        break;
      }
    }
    this->expect_views_show(views, shown, words, step);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

REGISTER_TYPED_TEST_SUITE_P(VirtualMemoryArgumentTest, BadSizesAreInvalidArguments,
                            BadMapRegionsAreRefusedAndChangeNothing,
                            BadUnmapAndSetAccessRegionsAreRefused,
                            StaleAndForeignHandlesAreFailedPreconditions,
                            RandomOperationsMatchAModel);

}  // namespace folio::device::testing
