#include "folio/ir/op.h"

namespace folio::ir {

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kEmbedding:
      return "embedding";
    case OpKind::kRmsNorm:
      return "rms_norm";
    case OpKind::kMatMul:
      return "matmul";
    case OpKind::kAdd:
      return "add";
    case OpKind::kMul:
      return "mul";
    case OpKind::kSilu:
      return "silu";
    case OpKind::kSwiGlu:
      return "swiglu";
    case OpKind::kRope:
      return "rope";
    case OpKind::kKvCacheWrite:
      return "kv_cache_write";
    case OpKind::kPagedAttention:
      return "paged_attention";
    case OpKind::kGatherRows:
      return "gather_rows";
    case OpKind::kLora:
      return "lora";
    case OpKind::kGeGlu:
      return "geglu";
    case OpKind::kScale:
      return "scale";
    case OpKind::kSoftCap:
      return "soft_cap";
    case OpKind::kAllReduceSum:
      return "all_reduce_sum";
    case OpKind::kAttentionMerge:
      return "attention_merge";
  }
  return "invalid";
}

}  // namespace folio::ir
