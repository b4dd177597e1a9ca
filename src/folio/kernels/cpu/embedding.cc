#include "folio/kernels/cpu/embedding.h"

#include <algorithm>

#include "folio/base/check.h"
#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu {
namespace {

// A task below this many values is not worth handing to another thread.
constexpr int64_t kMinTaskValues = 1 << 14;

void embedding_body(const EmbeddingArguments& arguments, int64_t begin, int64_t end,
                    int thread_index) {
  const int64_t hidden = arguments.hidden;
  const int64_t table_row_bytes = row_bytes(arguments.table_dtype, hidden);
  const auto* table = static_cast<const std::byte*>(arguments.table);
  for (int64_t token = begin; token < end; ++token) {
    const int32_t id = arguments.token_ids[token];
    float* output = arguments.output + token * hidden;
    const bool valid = id >= 0 && id < arguments.vocab_size;
    FOLIO_DCHECK(valid, "token id {} at position {} is outside the vocabulary of {}", id, token,
                 arguments.vocab_size);
    if (!valid) {
      std::fill(output, output + hidden, 0.0f);
      continue;
    }
    if (arguments.table_dtype == DType::kQ8_0Panels) {
      dequantize_q8_0_panels_row(table, hidden, id, output);
    } else {
      dequantize_row(arguments.table_dtype, table + id * table_row_bytes, output, hidden);
    }
  }
}

}  // namespace

void embedding(device::HostStream& stream, const EmbeddingArguments& arguments) {
  // q8_0 panels: a tied embedding table that is also the LM head, kept once, as panels.
  FOLIO_CHECK(is_weight_dtype(arguments.table_dtype) || arguments.table_dtype == DType::kQ8_0Panels,
              "embedding table dtype {} is not supported", dtype_name(arguments.table_dtype));
  FOLIO_CHECK(arguments.num_tokens >= 0 && arguments.vocab_size > 0 && arguments.hidden > 0 &&
                  arguments.hidden % dtype_info(arguments.table_dtype).block_elements == 0,
              "embedding shape tokens={} vocab={} hidden={}", arguments.num_tokens,
              arguments.vocab_size, arguments.hidden);
  if (arguments.num_tokens == 0) return;
  FOLIO_CHECK(
      arguments.token_ids != nullptr && arguments.table != nullptr && arguments.output != nullptr,
      "embedding with a null token id, table or output pointer");
  const int64_t grain = std::max<int64_t>(1, kMinTaskValues / arguments.hidden);
  stream.launch(device::HostKernel::make<EmbeddingArguments, embedding_body>(
      "embedding", arguments, arguments.num_tokens, grain));
}

}  // namespace folio::kernels::cpu
