// Prefix hashes: the keys of the prefix cache.
//
// A full block is keyed by a hash chain: hash(parent hash, the block's token ids, the adapter
// id, the cache salt), where the parent hash is the key of the block before it (kRootPrefixHash
// for a sequence's first block). Two blocks get the same key only if everything before them and
// in them is the same, under the same adapter and salt, so a cached block can stand in for a
// fresh prefill of the same prefix. The hash is 64 bits; the block allocator additionally
// compares the tokens, parent hash and namespace of a candidate before reusing it, so a hash
// collision costs a cache miss, never wrong KV.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "folio/kv/kv_types.h"

namespace folio::kv {

inline constexpr uint64_t kRootPrefixHash = 0x6a09e667f3bcc908ULL;

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens,
                    const CacheNamespace& cache_namespace);

// Appends to `hashes` the chain hash of every full block of `tokens`, starting after
// `parent_hash`: hashes[i] keys tokens [i * block_size, (i + 1) * block_size).
void append_full_block_hashes(uint64_t parent_hash, std::span<const int32_t> tokens,
                              int32_t block_size, const CacheNamespace& cache_namespace,
                              std::vector<uint64_t>& hashes);

}  // namespace folio::kv
