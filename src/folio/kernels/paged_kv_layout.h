// PagedKvLayout: where the keys and values of a token live in the paged KV cache.
//
// The cache is a set of blocks; a block holds the K and V of `block_size` consecutive tokens of
// one sequence, for every layer. Blocks are carved out of pages (the memory pool's granule):
// block b lives at
//   base + (b / blocks_per_page) * page_bytes + (b % blocks_per_page) * block_bytes,
// and inside a block the elements are laid out as
//   [layer][0 = K, 1 = V][token_in_block][kv_head][head_dim]   (f32 or f16),
// so block_bytes = num_layers * 2 * block_size * num_kv_heads * head_dim * sizeof(element).
// A token's global slot is block * block_size + token_in_block; a sequence's block table maps
// its logical block i (positions [i * block_size, (i + 1) * block_size)) to a physical block.
//
// Within a block, the rows of one layer's K (or V) for consecutive tokens are contiguous:
// token t + 1 starts `token_stride()` elements after token t. Attention kernels walk a block's
// keys for one kv head with that stride.
//
// The struct is plain data (trivially copyable) so it can sit by value in kernel arguments; it
// describes memory owned elsewhere (kv/ allocates the pages) and owns nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/base/status.h"
#include "folio/tensor/dtype.h"

namespace folio::kernels {

struct PagedKvLayout {
  std::byte* base = nullptr;  // start of the first page
  int64_t page_bytes = 0;     // distance between consecutive pages
  int32_t blocks_per_page = 0;
  int64_t block_bytes = 0;  // == compute_block_bytes(...) for the fields below
  int32_t block_size = 0;   // tokens per block
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType dtype = DType::kF32;  // element type: kF32 or kF16

  static constexpr int64_t element_bytes_of(DType dtype) { return dtype == DType::kF16 ? 2 : 4; }

  static constexpr int64_t compute_block_bytes(int32_t num_layers, int32_t block_size,
                                               int32_t num_kv_heads, int32_t head_dim,
                                               DType dtype) {
    return int64_t{num_layers} * 2 * block_size * num_kv_heads * head_dim * element_bytes_of(dtype);
  }

  int64_t element_bytes() const { return element_bytes_of(dtype); }
  // Elements between the rows of consecutive tokens of one layer's K (or V) inside a block.
  int64_t token_stride() const { return int64_t{num_kv_heads} * head_dim; }

  std::byte* block_pointer(int64_t block) const {
    return base + (block / blocks_per_page) * page_bytes + (block % blocks_per_page) * block_bytes;
  }

  // The K row of `slot` in `layer`: [num_kv_heads][head_dim] elements of `dtype`.
  // Requires: 0 <= layer < num_layers, slot >= 0 and inside the allocated blocks.
  std::byte* key_pointer(int32_t layer, int64_t slot) const { return row_pointer(layer, 0, slot); }
  // The V row of `slot` in `layer`, laid out like the K row.
  std::byte* value_pointer(int32_t layer, int64_t slot) const {
    return row_pointer(layer, 1, slot);
  }

  // OK when the fields describe a layout the CPU kernels can use: positive sizes, an f32 or f16
  // element type, block_bytes matching the other fields, and whole blocks fitting in a page.
  Status validate() const;

 private:
  std::byte* row_pointer(int32_t layer, int32_t key_or_value, int64_t slot) const {
    const int64_t block = slot / block_size;
    const int64_t token_in_block = slot % block_size;
    const int64_t row = (int64_t{layer} * 2 + key_or_value) * block_size + token_in_block;
    return block_pointer(block) + row * token_stride() * element_bytes();
  }
};

}  // namespace folio::kernels
