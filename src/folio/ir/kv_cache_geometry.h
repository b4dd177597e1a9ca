// KvCacheGeometry: the shape of one paged KV block, what a model's attention layers need per
// token. The KV cache (kv/) carves blocks of this shape out of pool pages; a model (model/)
// emits step graphs whose KV tensors have it; the kernels address blocks through the layout
// derived from it (kernels/paged_kv_layout.h).
//
// A block holds the K and V of `block_size` consecutive tokens of one sequence, for every layer,
// laid out as [layer][0 = K, 1 = V][token_in_block][kv_head][head_dim].
#pragma once

#include <cstdint>

#include "folio/base/status.h"
#include "folio/tensor/dtype.h"

namespace folio::ir {

struct KvCacheGeometry {
  int32_t block_size = 16;  // tokens per block: 8, 16 or 32
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF16;  // kF32 or kF16

  int64_t element_bytes() const { return dtype == DType::kF16 ? 2 : 4; }
  // Bytes of one block: num_layers * 2 * block_size * num_kv_heads * head_dim * element_bytes.
  int64_t block_bytes() const {
    return int64_t{num_layers} * 2 * block_size * num_kv_heads * head_dim * element_bytes();
  }
  // Requires nothing; says what is wrong with the numbers, if anything.
  Status validate() const;
  friend bool operator==(const KvCacheGeometry&, const KvCacheGeometry&) = default;
};

}  // namespace folio::ir
