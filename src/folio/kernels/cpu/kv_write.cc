#include "folio/kernels/cpu/kv_write.h"

#include <algorithm>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/vector_launch.h"
#include "folio/kernels/cpu/vector_ops.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {
namespace {

void write_row(const VectorOps& ops, std::byte* destination, const float* source, int64_t count,
               DType dtype) {
  if (dtype == DType::kF16) {
    ops.f32_to_f16(reinterpret_cast<uint16_t*>(destination), source, count);
  } else {
    std::memcpy(destination, source, static_cast<size_t>(count) * sizeof(float));
  }
}

void kv_write_tokens(const KvWriteArguments& arguments, const VectorOps& ops, int64_t begin,
                     int64_t end, int /*thread_index*/) {
  const PagedKvLayout& cache = arguments.cache;
  const int64_t row_elements = cache.token_stride();
  if (arguments.num_valid_tokens) end = std::min<int64_t>(end, *arguments.num_valid_tokens);
  for (int64_t token = begin; token < end; ++token) {
    const int64_t slot = arguments.slot_mapping[token];
    if (slot < 0) continue;
    write_row(ops, cache.key_pointer(arguments.layer, slot),
              arguments.key + token * arguments.key_row_stride, row_elements, cache.dtype);
    write_row(ops, cache.value_pointer(arguments.layer, slot),
              arguments.value + token * arguments.value_row_stride, row_elements, cache.dtype);
  }
}

}  // namespace

void kv_write_body(const KvWriteArguments& arguments, int64_t begin, int64_t end,
                   int thread_index) {
  kv_write_tokens(arguments, vector_ops(), begin, end, thread_index);
}

void kv_write(device::HostStream& stream, const KvWriteArguments& arguments) {
  const Status valid = arguments.cache.validate();
  FOLIO_CHECK(valid.ok(), "kv_write: {}", valid);
  FOLIO_CHECK(arguments.layer >= 0 && arguments.layer < arguments.cache.num_layers,
              "kv_write: layer {} of {}", arguments.layer, arguments.cache.num_layers);
  FOLIO_CHECK(arguments.num_tokens >= 0, "kv_write over {} tokens", arguments.num_tokens);
  const int64_t row_elements = arguments.cache.token_stride();
  FOLIO_CHECK(
      arguments.key_row_stride >= row_elements && arguments.value_row_stride >= row_elements,
      "kv_write: row strides ({}, {}) shorter than a K/V row of {} values",
      arguments.key_row_stride, arguments.value_row_stride, row_elements);
  stream.launch(make_vector_kernel<KvWriteArguments, &kv_write_tokens>(
      "kv_write", arguments, arguments.num_tokens, grain_for(2 * row_elements)));
}

}  // namespace folio::kernels::cpu
