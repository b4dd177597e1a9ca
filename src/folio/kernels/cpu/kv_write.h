// Writing a step's keys and values into the paged KV cache: token t's K and V rows (all kv
// heads) go to cache slot slot_mapping[t] of one layer (see paged_kv_layout.h), converted to the
// cache's element type (f32 copied, f16 rounded to nearest even). The slot mapping is read
// through a pointer at run time. One work item is one token.
//
// Items never race as long as the tokens written have distinct slots. Padding tokens of a padded
// step may all point at one reserved dummy slot: two threads writing that slot would race, so
// tokens at or after *num_valid_tokens (when given) are skipped, as is any token whose slot is
// negative.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"
#include "folio/kernels/paged_kv_layout.h"

namespace folio::kernels::cpu {

struct KvWriteArguments {
  // f32 [num_tokens, key_row_stride]; a row's first num_kv_heads * head_dim values are the K of
  // every kv head, head-major (the K columns of a fused QKV projection qualify).
  const float* key;
  // f32 [num_tokens, value_row_stride], laid out like key.
  const float* value;
  int64_t key_row_stride = 0;
  int64_t value_row_stride = 0;
  const int32_t* slot_mapping;  // i32 [num_tokens]: destination slot, or < 0 to skip
  // i32 scalar: tokens [*num_valid_tokens, num_tokens) are padding and are skipped; nullptr
  // writes every token with a non-negative slot.
  const int32_t* num_valid_tokens = nullptr;
  PagedKvLayout cache;
  int32_t layer = 0;
  int64_t num_tokens = 0;  // the step's padded token count
};

void kv_write_body(const KvWriteArguments& arguments, int64_t begin, int64_t end, int thread_index);

// Requires: cache.validate() is OK, 0 <= layer < cache.num_layers, num_tokens >= 0, row strides
// >= num_kv_heads * head_dim.
void kv_write(device::HostStream& stream, const KvWriteArguments& arguments);

}  // namespace folio::kernels::cpu
