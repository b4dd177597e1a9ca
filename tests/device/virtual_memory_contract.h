// The VirtualMemory contract, behaviour part: a typed GoogleTest suite run over every
// implementation (see virtual_memory_test_util.h for the Backend it is instantiated with):
//   INSTANTIATE_TYPED_TEST_SUITE_P(Host, VirtualMemoryContractTest, HostBackend);
#pragma once

#include "virtual_memory_test_util.h"

namespace folio::device::testing {

template <typename Backend>
using VirtualMemoryContractTest = VirtualMemoryFixture<Backend>;

TYPED_TEST_SUITE_P(VirtualMemoryContractTest);

TYPED_TEST_P(VirtualMemoryContractTest, BytesWrittenThroughOneViewAreReadThroughAnother) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(2 * g);
  const AddressRange first = this->reserve(2 * g);
  const AddressRange second = this->reserve(4 * g);
  FOLIO_EXPECT_OK(vm.map(first, 0, memory, 0, 2 * g));
  FOLIO_EXPECT_OK(vm.map(second, 2 * g, memory, 0, 2 * g));
  this->write_word(first, 0, 0x1111);
  this->write_word(first, g, 0x2222);
  EXPECT_EQ(this->read_word(second, 2 * g), 0x1111u);
  EXPECT_EQ(this->read_word(second, 3 * g), 0x2222u);
  this->write_word(second, 3 * g, 0x3333);
  EXPECT_EQ(this->read_word(first, g), 0x3333u);
  FOLIO_EXPECT_OK(vm.release(first));
  FOLIO_EXPECT_OK(vm.release(second));
  FOLIO_EXPECT_OK(vm.release(memory));
}

TYPED_TEST_P(VirtualMemoryContractTest, MapAtMemoryOffsetShowsThoseBytes) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(4 * g);
  const AddressRange whole = this->reserve(4 * g);
  const AddressRange window = this->reserve(2 * g);
  FOLIO_EXPECT_OK(vm.map(whole, 0, memory, 0, 4 * g));
  for (size_t i = 0; i < 4; ++i) this->write_word(whole, i * g, 100 + i);
  // Granules 1 and 2 of the memory, in reverse order, one map call each.
  FOLIO_EXPECT_OK(vm.map(window, 0, memory, 2 * g, g));
  FOLIO_EXPECT_OK(vm.map(window, g, memory, g, g));
  EXPECT_EQ(this->read_word(window, 0), 102u);
  EXPECT_EQ(this->read_word(window, g), 101u);
}

TYPED_TEST_P(VirtualMemoryContractTest, GrowKeepsExistingViewsAndTheirBytes) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  PhysicalMemory memory = this->create(g);
  const AddressRange first = this->reserve(3 * g);
  FOLIO_EXPECT_OK(vm.map(first, 0, memory, 0, g));
  this->write_word(first, 0, 0xAAAA);
  FOLIO_EXPECT_OK(vm.grow(memory, 3 * g));
  EXPECT_EQ(memory.size, 3 * g);
  EXPECT_EQ(this->read_word(first, 0), 0xAAAAu);
  FOLIO_EXPECT_OK(vm.map(first, g, memory, g, 2 * g));
  const AddressRange second = this->reserve(3 * g);
  FOLIO_EXPECT_OK(vm.map(second, 0, memory, 0, 3 * g));
  EXPECT_EQ(this->read_word(second, 0), 0xAAAAu);
  this->write_word(second, 2 * g, 0xBBBB);
  EXPECT_EQ(this->read_word(first, 2 * g), 0xBBBBu);
  // Growing to the same size is a no-op.
  FOLIO_EXPECT_OK(vm.grow(memory, 3 * g));
  EXPECT_EQ(memory.size, 3 * g);
}

TYPED_TEST_P(VirtualMemoryContractTest, UnmappingOneViewLeavesTheOthersValid) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(2 * g);
  const AddressRange first = this->reserve(2 * g);
  const AddressRange second = this->reserve(2 * g);
  FOLIO_EXPECT_OK(vm.map(first, 0, memory, 0, 2 * g));
  FOLIO_EXPECT_OK(vm.map(second, 0, memory, 0, 2 * g));
  this->write_word(first, g, 7);
  FOLIO_EXPECT_OK(vm.unmap(first, 0, 2 * g));
  EXPECT_EQ(this->read_word(second, g), 7u);
  this->write_word(second, g, 8);
  // The unmapped region can be mapped again, and sees the bytes written meanwhile.
  FOLIO_EXPECT_OK(vm.map(first, 0, memory, 0, 2 * g));
  EXPECT_EQ(this->read_word(first, g), 8u);
}

TYPED_TEST_P(VirtualMemoryContractTest, PartialUnmapSplitsAMapping) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(3 * g);
  const PhysicalMemory other = this->create(g);
  const AddressRange range = this->reserve(3 * g);
  FOLIO_EXPECT_OK(vm.map(range, 0, memory, 0, 3 * g));
  for (size_t i = 0; i < 3; ++i) this->write_word(range, i * g, 10 + i);
  FOLIO_EXPECT_OK(vm.unmap(range, g, g));
  FOLIO_EXPECT_OK(vm.map(range, g, other, 0, g));
  this->write_word(range, g, 99);
  EXPECT_EQ(this->read_word(range, 0), 10u);
  EXPECT_EQ(this->read_word(range, 2 * g), 12u);
  // One unmap may span pieces of different mappings.
  FOLIO_EXPECT_OK(vm.unmap(range, 0, 3 * g));
  FOLIO_EXPECT_OK(vm.map(range, 0, memory, g, g));
  EXPECT_EQ(this->read_word(range, 0), 11u);
}

TYPED_TEST_P(VirtualMemoryContractTest, ReleasingARangeUnmapsEverythingInIt) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(2 * g);
  const AddressRange range = this->reserve(4 * g);
  FOLIO_EXPECT_OK(vm.map(range, 0, memory, 0, g));
  FOLIO_EXPECT_OK(vm.map(range, 2 * g, memory, g, g));
  this->write_word(range, 2 * g, 55);
  FOLIO_EXPECT_OK(vm.release(range));
  FOLIO_EXPECT_CODE(vm.release(range), StatusCode::kFailedPrecondition);
  FOLIO_EXPECT_CODE(vm.unmap(range, 0, g), StatusCode::kFailedPrecondition);
  FOLIO_EXPECT_CODE(vm.map(range, g, memory, 0, g), StatusCode::kFailedPrecondition);
  // The memory is untouched and maps elsewhere.
  const AddressRange again = this->reserve(2 * g);
  FOLIO_EXPECT_OK(vm.map(again, 0, memory, 0, 2 * g));
  EXPECT_EQ(this->read_word(again, g), 55u);
}

TYPED_TEST_P(VirtualMemoryContractTest, ReleasedMemoryLivesUntilItsLastViewGoes) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  PhysicalMemory memory = this->create(2 * g);
  const AddressRange range = this->reserve(2 * g);
  FOLIO_EXPECT_OK(vm.map(range, 0, memory, 0, 2 * g));
  this->write_word(range, g, 42);
  FOLIO_EXPECT_OK(vm.release(memory));
  EXPECT_EQ(this->read_word(range, g), 42u);
  this->write_word(range, 0, 43);
  EXPECT_EQ(this->read_word(range, 0), 43u);
  FOLIO_EXPECT_CODE(vm.release(memory), StatusCode::kFailedPrecondition);
  FOLIO_EXPECT_CODE(vm.grow(memory, 4 * g), StatusCode::kFailedPrecondition);
  FOLIO_EXPECT_CODE(vm.resident_bytes(memory).status(), StatusCode::kFailedPrecondition);
  const AddressRange other = this->reserve(2 * g);
  FOLIO_EXPECT_CODE(vm.map(other, 0, memory, 0, g), StatusCode::kFailedPrecondition);
  // Unmapping the last view is still legal; its bytes go with it.
  FOLIO_EXPECT_OK(vm.unmap(range, 0, 2 * g));
}

TYPED_TEST_P(VirtualMemoryContractTest, ResidentBytesCountEachPhysicalByteOnce) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  PhysicalMemory memory = this->create(2 * g);
  Result<size_t> resident = vm.resident_bytes(memory);
  ASSERT_TRUE(resident.ok()) << resident.status().to_string();
  EXPECT_EQ(*resident, 2 * g);
  std::vector<AddressRange> views;
  for (int i = 0; i < 3; ++i) {
    views.push_back(this->reserve(2 * g));
    FOLIO_EXPECT_OK(vm.map(views.back(), 0, memory, 0, 2 * g));
    this->write_word(views.back(), 0, i);
    this->write_word(views.back(), g, i);
  }
  EXPECT_EQ(vm.resident_bytes(memory).value_or(0), 2 * g);
  FOLIO_EXPECT_OK(vm.grow(memory, 5 * g));
  EXPECT_EQ(vm.resident_bytes(memory).value_or(0), 5 * g);
}

TYPED_TEST_P(VirtualMemoryContractTest, SetAccessRoundTripKeepsTheBytes) {
  const size_t g = this->granule_;
  VirtualMemory& vm = *this->vm_;
  const PhysicalMemory memory = this->create(2 * g);
  const AddressRange range = this->reserve(2 * g);
  FOLIO_EXPECT_OK(vm.map(range, 0, memory, 0, 2 * g));
  this->write_word(range, g, 31);
  FOLIO_EXPECT_OK(vm.set_access(range, g, g, Access::kNone));
  this->write_word(range, 0, 30);  // the other granule stays writable
  FOLIO_EXPECT_OK(vm.set_access(range, g, g, Access::kReadWrite));
  EXPECT_EQ(this->read_word(range, g), 31u);
  EXPECT_EQ(this->read_word(range, 0), 30u);
  FOLIO_EXPECT_OK(vm.set_access(range, 0, 2 * g, Access::kNone));
  FOLIO_EXPECT_OK(vm.unmap(range, 0, 2 * g));
  FOLIO_EXPECT_CODE(vm.set_access(range, 0, g, Access::kReadWrite), StatusCode::kInvalidArgument);
}

REGISTER_TYPED_TEST_SUITE_P(VirtualMemoryContractTest,
                            BytesWrittenThroughOneViewAreReadThroughAnother,
                            MapAtMemoryOffsetShowsThoseBytes, GrowKeepsExistingViewsAndTheirBytes,
                            UnmappingOneViewLeavesTheOthersValid, PartialUnmapSplitsAMapping,
                            ReleasingARangeUnmapsEverythingInIt,
                            ReleasedMemoryLivesUntilItsLastViewGoes,
                            ResidentBytesCountEachPhysicalByteOnce,
                            SetAccessRoundTripKeepsTheBytes);

}  // namespace folio::device::testing
