// The exact merge of KV-parallel partial attention (issue 15, slice 6; dist.md "KV-parallel
// groups"). Each member of a KV-parallel group attends over its own range of key positions
// (paged_attention.h with kv_range_begin/kv_range_end and lse) and gets, per query token t and
// head h, a partial output o_p (the softmax-weighted mean of the values it saw) and the
// log-sum-exp l_p of the scores it saw (-inf: it saw none). Attention over the union of the
// ranges is then exactly
//   m = max_p l_p,  w_p = exp(l_p - m),  o = (sum_p w_p o_p) / (sum_p w_p),  l = m + log sum_p w_p
// (the softmax of the union is the members' softmaxes reweighted by their shares of the
// normalizer). Parts are summed in part order (member order), so every member that merges the
// same gathered parts computes bit-identical outputs. A row no part saw (every l_p = -inf,
// padding tokens) merges to zeros and -inf, never NaN.
//
// Exchange layout: one member's partial is one contiguous f32 buffer of
// attention_partial_elements(T, heads, head_dim) floats, the outputs [T, heads * head_dim]
// then the log-sum-exps [T, heads], so that an all_gather of the members' partials is the
// merge's input as it stands. One work item is one token.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"

namespace folio::kernels::cpu {

// Floats of one member's packed partial: T * heads * (head_dim + 1).
constexpr int64_t attention_partial_elements(int64_t num_tokens, int64_t num_heads,
                                             int64_t head_dim) {
  return num_tokens * num_heads * (head_dim + 1);
}

struct AttentionMergeArguments {
  // f32 [num_parts, attention_partial_elements(num_tokens, num_heads, head_dim)], part p in
  // member order, each packed as above.
  const float* partials;
  float* output;  // f32 [num_tokens, num_heads * head_dim]; must not overlap partials
  float* lse;     // f32 [num_tokens, num_heads] (the merged log-sum-exp), or null
  int32_t num_parts = 0;
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
};

void attention_merge_body(const AttentionMergeArguments& arguments, int64_t begin, int64_t end,
                          int thread_index);

// Requires: num_parts >= 1, num_tokens >= 0, num_heads >= 1, head_dim >= 1.
void attention_merge(device::HostStream& stream, const AttentionMergeArguments& arguments);

}  // namespace folio::kernels::cpu
