#include "folio/kv/prefix_hash.h"

#include <bit>

namespace folio::kv {

namespace {

// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
uint64_t mix(uint64_t value) {
  value ^= value >> 33;
  value *= 0xff51afd7ed558ccdULL;
  value ^= value >> 33;
  value *= 0xc4ceb9fe1a85ec53ULL;
  value ^= value >> 33;
  return value;
}

}  // namespace

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens,
                    const CacheNamespace& cache_namespace) {
  // The namespace and length enter through independent multiplies (one mix, not four); each
  // pair of tokens costs one multiply and a rotate; the final mix spreads every input bit over
  // the key. Collisions only cost a cache miss (hits are verified), so speed wins over strength.
  uint64_t hash = mix(
      parent_hash ^ static_cast<uint64_t>(cache_namespace.adapter_id) * 0x9e3779b97f4a7c15ULL ^
      cache_namespace.cache_salt * 0xc2b2ae3d27d4eb4fULL ^ tokens.size() * 0x165667b19e3779f9ULL);
  size_t index = 0;
  for (; index + 1 < tokens.size(); index += 2) {
    const uint64_t pair = (uint64_t{static_cast<uint32_t>(tokens[index])} << 32) |
                          static_cast<uint32_t>(tokens[index + 1]);
    hash = std::rotl((hash ^ pair) * 0x87c37b91114253d5ULL, 31);
  }
  if (index < tokens.size()) {
    hash = std::rotl((hash ^ static_cast<uint32_t>(tokens[index])) * 0x4cf5ad432745937fULL, 31);
  }
  return mix(hash);
}

void append_full_block_hashes(uint64_t parent_hash, std::span<const int32_t> tokens,
                              int32_t block_size, const CacheNamespace& cache_namespace,
                              std::vector<uint64_t>& hashes) {
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size);
  uint64_t hash = parent_hash;
  for (size_t block = 0; block < num_full; ++block) {
    hash = hash_block(hash, tokens.subspan(block * block_size, block_size), cache_namespace);
    hashes.push_back(hash);
  }
}

}  // namespace folio::kv
