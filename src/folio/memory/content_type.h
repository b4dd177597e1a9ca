// ContentType: what an allocation of the page pool holds. The pool is Folio's one memory budget
// (DESIGN.md, "two granularities, one budget"): KV cache pages, LoRA adapter weights, graph
// arenas and scratch buffers all come from it, and the content type is what lets eviction prefer
// cheap-to-lose content (a scratch buffer) over expensive content (cached KV, which costs a
// prefill to rebuild). It also splits the pool's statistics.
//
// Eviction priority (seed 001 §7.2): 1 is evicted first, 5 last. The defaults below follow the
// seed's table; the seed's "LoRA weight (warm)" level 4 is given to graph arenas, because a
// warm adapter is pinned while its batch runs and is therefore not evictable at all, whereas an
// unpinned graph arena costs a re-capture to rebuild.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace folio::memory {

enum class ContentType : uint8_t {
  kTemporary,       // scratch space for one computation
  kActivation,      // intermediate activations kept across a layer or a pass
  kAdapterWeights,  // LoRA adapter A/B matrices
  kGraphArena,      // the shared physical arena of captured graphs
  kKvCache,         // paged key/value cache
};

inline constexpr int kNumContentTypes = 5;

inline constexpr std::array<ContentType, kNumContentTypes> kAllContentTypes = {
    ContentType::kTemporary, ContentType::kActivation, ContentType::kAdapterWeights,
    ContentType::kGraphArena, ContentType::kKvCache};

constexpr int content_index(ContentType content) {
  return static_cast<int>(content);
}

// "temporary", "activation", "adapter_weights", "graph_arena", "kv_cache": also the value of the
// `content` label of the pool's metrics.
std::string_view content_type_name(ContentType content);

// Seed 001 §7.2, indexed by content_index(): temporary 1, activation 2, adapter weights 3,
// graph arena 4, KV cache 5.
inline constexpr std::array<int, kNumContentTypes> kDefaultContentPriority = {1, 2, 3, 4, 5};

}  // namespace folio::memory
