// AlignedBuffer: test memory with the 64-byte alignment the CPU kernels require of workspaces
// and tiles (matmul, lora).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace folio::kernels::cpu::testing {

class AlignedBuffer {
 public:
  explicit AlignedBuffer(int64_t bytes) : storage_(static_cast<size_t>(bytes) + 64) {}
  std::byte* data() {
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    return storage_.data() + (64 - address % 64) % 64;
  }

 private:
  std::vector<std::byte> storage_;
};

}  // namespace folio::kernels::cpu::testing
