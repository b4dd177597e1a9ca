// Vocabulary of the paged KV cache (kv/).
//
// The KV cache stores, for every token a sequence has seen, the keys and values of every layer.
// It is carved in two granularities (DESIGN.md "Memory: two granularities, one budget"):
// - a page (the page pool's physical granule, 2 MiB by default) holds `blocks_per_page` blocks;
// - a block holds the K and V of `block_size` consecutive tokens of one sequence, for every
//   layer, laid out as [layer][0 = K, 1 = V][token_in_block][kv_head][head_dim]; its shape is an
//   ir::KvCacheGeometry (ir/kv_cache_geometry.h), which models emit their graphs for.
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
#include "folio/ir/kv_cache_geometry.h"

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

// Where a slot's K and V live: the attention kernels' own layout struct, so the numbers the
// block manager exports are the ones the kernels read (kernels/paged_kv_layout.h).
using KvLayoutNumbers = kernels::PagedKvLayout;

}  // namespace folio::kv
