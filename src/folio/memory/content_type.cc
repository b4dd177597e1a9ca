#include "folio/memory/content_type.h"

namespace folio::memory {

std::string_view content_type_name(ContentType content) {
  switch (content) {
    case ContentType::kTemporary:
      return "temporary";
    case ContentType::kActivation:
      return "activation";
    case ContentType::kAdapterWeights:
      return "adapter_weights";
    case ContentType::kGraphArena:
      return "graph_arena";
    case ContentType::kKvCache:
      return "kv_cache";
  }
  return "unknown";
}

}  // namespace folio::memory
