// Vocabulary of the paged KV cache (kv/).
//
// The KV cache stores, for every token a sequence has seen, the keys and values of every layer.
// It is carved in two granularities (DESIGN.md "Memory: two granularities, one budget"):
// - a page (the page pool's physical granule, 2 MiB by default) holds `blocks_per_page` blocks;
// - a block holds the K and V of `block_size` consecutive tokens of one sequence, for every
//   layer, laid out as [layer][0 = K, 1 = V][token_in_block][kv_head][head_dim].
// Block b lives at base + (b / blocks_per_page) * page_bytes + (b % blocks_per_page) *
// block_bytes, where base is the start of the page pool's address range, so a block id is a
// global index any attention kernel can turn into an address (KvLayoutNumbers). A slot is one
// token's place: slot = block * block_size + token_in_block.
#pragma once

#include "folio/kernels/paged_kv_layout.h"

#include <cstddef>
#include <cstdint>

#include "folio/base/status.h"
#include "folio/base/strong_id.h"
#include "folio/tensor/dtype.h"

namespace folio::kv {

struct SeqIdTag {};
// A sequence known to the KV cache (one per request, one per sample of parallel sampling).
using SeqId = StrongId<SeqIdTag, int64_t>;

struct BlockIdTag {};
// A global block index (see the file comment); exported to kernels as int32.
using BlockId = StrongId<BlockIdTag, int32_t>;

// What, besides the tokens, decides whether cached KV may be reused: KV computed under one
// adapter differs from KV computed under another, and a cache salt keeps tenants apart.
struct CacheNamespace {
  int64_t adapter_id = 0;   // 0: the base model
  uint64_t cache_salt = 0;  // 0: no salt
  friend bool operator==(const CacheNamespace&, const CacheNamespace&) = default;
};

// One whole-block copy. For device-to-device copies both are block ids; for swap the host side
// is a host swap block index (HostSwapSpace).
struct BlockCopy {
  int32_t source = 0;
  int32_t destination = 0;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

// The shape of one block: what a model's attention layers need per token.
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
};

// Where a slot's K and V live: the attention kernels' own layout struct, so the numbers the
// block manager exports are the ones the kernels read (kernels/paged_kv_layout.h).
using KvLayoutNumbers = kernels::PagedKvLayout;

}  // namespace folio::kv
