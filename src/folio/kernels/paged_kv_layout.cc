#include "folio/kernels/paged_kv_layout.h"

namespace folio::kernels {

Status PagedKvLayout::validate() const {
  if (base == nullptr) return invalid_argument("paged KV layout has no base address");
  if (block_size <= 0 || num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0) {
    return invalid_argument(
        "paged KV layout needs positive sizes, got block_size {} num_layers {} num_kv_heads {} "
        "head_dim {}",
        block_size, num_layers, num_kv_heads, head_dim);
  }
  if (dtype != DType::kF32 && dtype != DType::kF16) {
    return invalid_argument("paged KV cache element type must be f32 or f16, got {}",
                            dtype_name(dtype));
  }
  const int64_t expected =
      compute_block_bytes(num_layers, block_size, num_kv_heads, head_dim, dtype);
  if (block_bytes != expected) {
    return invalid_argument("paged KV layout block_bytes is {} but its shape needs {}", block_bytes,
                            expected);
  }
  if (blocks_per_page <= 0 || int64_t{blocks_per_page} * block_bytes > page_bytes) {
    return invalid_argument("{} blocks of {} bytes do not fit a page of {} bytes", blocks_per_page,
                            block_bytes, page_bytes);
  }
  return Status();
}

}  // namespace folio::kernels
