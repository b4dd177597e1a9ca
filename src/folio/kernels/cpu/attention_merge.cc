#include "folio/kernels/cpu/attention_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "folio/base/check.h"
#include "folio/kernels/cpu/work_partition.h"

namespace folio::kernels::cpu {

void attention_merge_body(const AttentionMergeArguments& arguments, int64_t begin, int64_t end,
                          int /*thread_index*/) {
  const int64_t heads = arguments.num_heads;
  const int64_t head_dim = arguments.head_dim;
  const int64_t part_elements = attention_partial_elements(arguments.num_tokens, heads, head_dim);
  const int64_t lse_offset = int64_t{arguments.num_tokens} * heads * head_dim;
  constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
  for (int64_t token = begin; token < end; ++token) {
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t row = token * heads + head;
      float best = kNegativeInfinity;
      for (int32_t part = 0; part < arguments.num_parts; ++part) {
        best = std::max(best, arguments.partials[part * part_elements + lse_offset + row]);
      }
      float* output = arguments.output + row * head_dim;
      std::fill(output, output + head_dim, 0.0f);
      if (best == kNegativeInfinity) {  // no part saw a key: a padding or fully masked row
        if (arguments.lse != nullptr) arguments.lse[row] = kNegativeInfinity;
        continue;
      }
      float total = 0.0f;
      for (int32_t part = 0; part < arguments.num_parts; ++part) {
        const float* partial = arguments.partials + part * part_elements;
        const float part_lse = partial[lse_offset + row];
        if (part_lse == kNegativeInfinity) continue;  // a neutral part (its output is zeros)
        const float weight = std::exp(part_lse - best);
        total += weight;
        const float* values = partial + row * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) output[d] += weight * values[d];
      }
      const float inverse = 1.0f / total;  // total >= 1: the best part's weight is exp(0)
      for (int64_t d = 0; d < head_dim; ++d) output[d] *= inverse;
      if (arguments.lse != nullptr) arguments.lse[row] = best + std::log(total);
    }
  }
}

void attention_merge(device::HostStream& stream, const AttentionMergeArguments& arguments) {
  FOLIO_CHECK(arguments.num_parts >= 1 && arguments.num_tokens >= 0 && arguments.num_heads >= 1 &&
                  arguments.head_dim >= 1,
              "attention_merge: {} parts of {} tokens x {} heads x {}", arguments.num_parts,
              arguments.num_tokens, arguments.num_heads, arguments.head_dim);
  const int64_t work_per_token =
      int64_t{arguments.num_parts} * arguments.num_heads * (arguments.head_dim + 1);
  stream.launch(device::HostKernel::make<AttentionMergeArguments, &attention_merge_body>(
      "attention_merge", arguments, arguments.num_tokens, grain_for(work_per_token)));
}

}  // namespace folio::kernels::cpu
