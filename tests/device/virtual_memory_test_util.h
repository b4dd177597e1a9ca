// VirtualMemoryFixture: the shared fixture of the VirtualMemory contract suites, generic over a
// Backend type that provides:
//   static Result<std::unique_ptr<VirtualMemory>> make();   // fails (the suites skip) when the
//                                                           // device is absent
//   static Status write(std::byte* address, const void* source, size_t bytes);
//   static Status read(const std::byte* address, void* destination, size_t bytes);
// where write/read copy between host memory and an address inside a mapped view (a plain memcpy
// on the host; a driver copy on CUDA).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/result.h"
#include "folio/device/virtual_memory.h"

namespace folio::device::testing {

template <typename Backend>
class VirtualMemoryFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<VirtualMemory>> made = Backend::make();
    if (!made.ok()) GTEST_SKIP() << "no device for this backend: " << made.status().to_string();
    vm_ = std::move(made).value();
    granule_ = vm_->granularity();
  }

  AddressRange reserve(size_t bytes) {
    Result<AddressRange> range = vm_->reserve(bytes);
    EXPECT_TRUE(range.ok()) << range.status().to_string();
    return range.ok() ? *range : AddressRange{};
  }
  PhysicalMemory create(size_t bytes) {
    Result<PhysicalMemory> memory = vm_->create(bytes);
    EXPECT_TRUE(memory.ok()) << memory.status().to_string();
    return memory.ok() ? *memory : PhysicalMemory{};
  }

  // Writes `word` into the first and last 8 bytes of the granule at `offset` of `range`.
  void write_word(const AddressRange& range, size_t offset, uint64_t word) {
    ASSERT_TRUE(Backend::write(range.base + offset, &word, sizeof(word)).ok());
    ASSERT_TRUE(
        Backend::write(range.base + offset + granule_ - sizeof(word), &word, sizeof(word)).ok());
  }
  // The word at the start of the granule at `offset`; checks the last 8 bytes agree.
  uint64_t read_word(const AddressRange& range, size_t offset) {
    uint64_t first = 0;
    uint64_t last = 0;
    EXPECT_TRUE(Backend::read(range.base + offset, &first, sizeof(first)).ok());
    EXPECT_TRUE(
        Backend::read(range.base + offset + granule_ - sizeof(last), &last, sizeof(last)).ok());
    EXPECT_EQ(first, last) << "granule at offset " << offset << " is torn";
    return first;
  }

  std::unique_ptr<VirtualMemory> vm_;
  size_t granule_ = 0;
};

#define FOLIO_EXPECT_OK(expression)                   \
  do {                                                \
    const ::folio::Status status_ = (expression);     \
    EXPECT_TRUE(status_.ok()) << status_.to_string(); \
  } while (false)
#define FOLIO_EXPECT_CODE(expression, expected_code)                                        \
  do {                                                                                      \
    const ::folio::Status status_ = (expression);                                           \
    EXPECT_EQ(status_.code(), expected_code) << #expression << ": " << status_.to_string(); \
    EXPECT_FALSE(status_.message().empty());                                                \
  } while (false)

}  // namespace folio::device::testing
