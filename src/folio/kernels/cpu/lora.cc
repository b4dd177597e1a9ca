#include "folio/kernels/cpu/lora.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/lora_kernels.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {
namespace {

// Alignment of each thread's workspace slice (a cache line: no two threads share one).
constexpr int64_t kWorkspaceAlignment = 64;

int64_t slice_bytes(int32_t max_rank) {
  const int64_t bytes = static_cast<int64_t>(max_rank) * static_cast<int64_t>(sizeof(float));
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

struct LoraLaunch {
  LoraArguments arguments;
  SimdLevel level;
};

internal::LoraTokenFunction token_function(SimdLevel level) {
  switch (level) {
    case SimdLevel::kPortable:
      return internal::lora_token_portable;
    case SimdLevel::kAvx2:
      return internal::lora_token_avx2;
    case SimdLevel::kAvx512:
      return internal::lora_token_avx512;
  }
  FOLIO_UNREACHABLE("SIMD level {}", static_cast<int>(level));
}

// Items are tokens. token_slots and the slot table are read here, when the body runs, since the
// engine rewrites them between replays of a captured graph.
void lora_body(const LoraLaunch& launch, int64_t begin, int64_t end, int thread_index) {
  const LoraArguments& arguments = launch.arguments;
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  const int64_t slice = slice_bytes(arguments.max_rank);
  FOLIO_CHECK((thread_index + 1) * slice <= arguments.workspace_bytes,
              "lora workspace of {} bytes has no slice for thread {}", arguments.workspace_bytes,
              thread_index);
  auto* low_rank = reinterpret_cast<float*>(arguments.workspace + thread_index * slice);
  const internal::LoraTokenFunction update = token_function(launch.level);
  for (int64_t token = begin; token < end; ++token) {
    const int32_t slot = arguments.token_slots[token];
    FOLIO_CHECK(slot >= 0 && slot < arguments.num_slots, "lora token {} has slot {} of {}", token,
                slot, arguments.num_slots);
    const LoraSlotWeights& weights = arguments.slots[slot];
    FOLIO_CHECK(weights.rank >= 0 && weights.rank <= arguments.max_rank,
                "lora slot {} has rank {}, outside [0, max_rank {}]", slot, weights.rank,
                arguments.max_rank);
    const float* base = arguments.base + token * output_features;
    float* output = arguments.output + token * output_features;
    if (weights.rank == 0) {
      if (output != base) {
        std::memcpy(output, base, static_cast<size_t>(output_features) * sizeof(float));
      }
      continue;
    }
    FOLIO_DCHECK(weights.a != nullptr && weights.b != nullptr,
                 "lora slot {} of rank {} has no matrices", slot, weights.rank);
    update(weights, input_features, output_features, arguments.input + token * input_features, base,
           output, low_rank);
  }
}

bool overlaps(const void* first, int64_t first_bytes, const void* second, int64_t second_bytes) {
  const auto* a = static_cast<const std::byte*>(first);
  const auto* b = static_cast<const std::byte*>(second);
  return first_bytes > 0 && second_bytes > 0 && a < b + second_bytes && b < a + first_bytes;
}

void check_arguments(const device::HostStream& stream, const LoraArguments& arguments) {
  const int64_t rows = arguments.num_rows;
  FOLIO_CHECK(rows >= 0 && arguments.input_features > 0 && arguments.output_features >= 0 &&
                  arguments.max_rank >= 0,
              "lora shape: {} rows, {} input features, {} output features, max rank {}", rows,
              arguments.input_features, arguments.output_features, arguments.max_rank);
  if (rows == 0 || arguments.output_features == 0) return;
  FOLIO_CHECK(arguments.num_slots >= 1 && arguments.input != nullptr && arguments.base != nullptr &&
                  arguments.output != nullptr && arguments.token_slots != nullptr &&
                  arguments.slots != nullptr,
              "lora with {} slots or a null input, base, output, token_slots or slots",
              arguments.num_slots);
  const int64_t needed = lora_workspace_bytes(arguments.max_rank, stream.pool().num_threads());
  FOLIO_CHECK(
      arguments.workspace_bytes >= needed && (needed == 0 || arguments.workspace != nullptr),
      "lora workspace of {} bytes; {} needed", arguments.workspace_bytes, needed);
  FOLIO_CHECK(reinterpret_cast<uintptr_t>(arguments.workspace) % kWorkspaceAlignment == 0,
              "lora workspace is not {}-byte aligned", kWorkspaceAlignment);
  const int64_t output_bytes =
      rows * arguments.output_features * static_cast<int64_t>(sizeof(float));
  // In place is one row read then written by the same item; a shifted overlap would let one
  // token's output overwrite another's base.
  FOLIO_CHECK(arguments.output == arguments.base ||
                  !overlaps(arguments.output, output_bytes, arguments.base, output_bytes),
              "lora output overlaps base without being equal to it");
  FOLIO_CHECK(
      !overlaps(arguments.output, output_bytes, arguments.input,
                rows * arguments.input_features * static_cast<int64_t>(sizeof(float))) &&
          !overlaps(arguments.output, output_bytes, arguments.workspace, arguments.workspace_bytes),
      "lora output overlaps its input or workspace");
}

}  // namespace

int64_t lora_workspace_bytes(int32_t max_rank, int num_threads) {
  FOLIO_CHECK(max_rank >= 0 && num_threads >= 1, "lora workspace for max rank {} on {} threads",
              max_rank, num_threads);
  return num_threads * slice_bytes(max_rank);
}

void lora(device::HostStream& stream, const LoraArguments& arguments) {
  check_arguments(stream, arguments);
  const int64_t rows = arguments.num_rows;
  if (rows == 0 || arguments.output_features == 0) return;
  // A token reads up to max_rank * (K + N) weights and writes N values.
  const int64_t elements_per_token = static_cast<int64_t>(arguments.max_rank) *
                                         (arguments.input_features + arguments.output_features) +
                                     arguments.output_features;
  stream.launch(device::HostKernel::make<LoraLaunch, lora_body>(
      "lora", LoraLaunch{arguments, active_simd_level()}, rows, grain_for(elements_per_token)));
}

}  // namespace folio::kernels::cpu
