// HostKernel: one CPU kernel launch as plain data: the function, its arguments by value, and
// its work partition. A kernel runs function(arguments, begin, end, thread_index) over slices
// [begin, end) of [0, num_items), each slice at least `grain` items.
//
// Because a launch is data, a HostStream can record it instead of running it (capture), and a
// HostGraph can run the recorded list again (replay) with no allocation, shape inference or
// graph building: the host analogue of a CUDA graph. The same rule as on CUDA follows: every
// pointer in the arguments must stay valid while the graph lives, and any value that changes
// between replays (sequence lengths, block tables, token counts) must be read through a pointer
// at run time, never copied into the arguments by value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace folio::device {

struct HostKernel {
  static constexpr size_t kMaxArgumentBytes = 256;
  using Function = void (*)(const void* arguments, int64_t begin, int64_t end, int thread_index);

  Function function = nullptr;
  const char* name = "";
  int64_t num_items = 0;
  int64_t grain = 1;
  // Set by the stream at launch (HostStream::set_launch_tag), for observers: who launched it
  // (-1: untagged), and whether it is the first kernel of that tagged unit of work.
  int32_t tag = -1;
  bool first_of_tag = false;
  alignas(16) std::byte arguments[kMaxArgumentBytes] = {};

  // Builds a launch of `Body(const Arguments&, begin, end, thread_index)`.
  template <typename Arguments,
            void (*Body)(const Arguments&, int64_t begin, int64_t end, int thread_index)>
  static HostKernel make(const char* name, const Arguments& arguments, int64_t num_items,
                         int64_t grain = 1) {
    static_assert(std::is_trivially_copyable_v<Arguments>,
                  "kernel arguments are copied as bytes; they must be trivially copyable");
    static_assert(sizeof(Arguments) <= kMaxArgumentBytes, "kernel arguments too large");
    static_assert(alignof(Arguments) <= 16, "kernel arguments over-aligned");
    HostKernel kernel;
    kernel.function = [](const void* raw, int64_t begin, int64_t end, int thread_index) {
      Body(*static_cast<const Arguments*>(raw), begin, end, thread_index);
    };
    kernel.name = name;
    kernel.num_items = num_items;
    kernel.grain = grain;
    std::memcpy(kernel.arguments, &arguments, sizeof(Arguments));
    return kernel;
  }

  template <typename Arguments>
  const Arguments& arguments_as() const {
    return *reinterpret_cast<const Arguments*>(arguments);
  }
};

}  // namespace folio::device
