#include "folio/ir/kv_cache_geometry.h"

namespace folio::ir {

Status KvCacheGeometry::validate() const {
  if (block_size != 8 && block_size != 16 && block_size != 32) {
    return invalid_argument("KV block size {} is not supported; use 8, 16 or 32 tokens",
                            block_size);
  }
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0) {
    return invalid_argument(
        "KV cache geometry needs positive sizes, got {} layers, {} KV heads, head dim {}",
        num_layers, num_kv_heads, head_dim);
  }
  if (dtype != DType::kF32 && dtype != DType::kF16) {
    return invalid_argument("KV cache element type must be f32 or f16, got {}", dtype_name(dtype));
  }
  return Status();
}

}  // namespace folio::ir
