// HostBuffer: an owned, 64-byte aligned block of host memory, the unit the executor allocates
// outside the graph arena: persistent input and output buffers, the eager mode's per-op outputs
// and workspaces, and constants a captured program keeps (RoPE frequency factors). Contents
// start zeroed, so a buffer never exposes another allocation's bytes.
//
// Thread-safety: a value type; the bytes are shared by whoever holds the pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

namespace folio::exec {

inline constexpr size_t kBufferAlignment = 64;

inline size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

class HostBuffer {
 public:
  HostBuffer() = default;
  // Zero-filled; bytes == 0 gives an empty buffer with a null data().
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    data_.reset(static_cast<std::byte*>(
        ::operator new (round_up(bytes, kBufferAlignment), std::align_val_t{kBufferAlignment})));
    std::memset(data_.get(), 0, bytes);
  }

  std::byte* data() const { return data_.get(); }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  struct AlignedDelete {
    void operator()(std::byte* pointer) const {
      ::operator delete (pointer, std::align_val_t{kBufferAlignment});
    }
  };
  std::unique_ptr<std::byte, AlignedDelete> data_;
  size_t bytes_ = 0;
};

}  // namespace folio::exec
