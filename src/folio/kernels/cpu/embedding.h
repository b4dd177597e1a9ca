// CPU embedding lookup (folio/kernels/embedding.h): one work item per token, each row of the
// table widened to f32 with the portable row conversions of folio/tensor/quantize.h. Needs no
// workspace.
#pragma once

#include "folio/device/host_stream.h"
#include "folio/kernels/embedding.h"

namespace folio::kernels::cpu {

// Requires: num_tokens >= 0, vocab_size > 0, hidden > 0 (a multiple of 32 for q8_0 / q4_0),
// table_dtype in {f32, f16, bf16, q8_0, q4_0}, non-null pointers when num_tokens > 0.
void embedding(device::HostStream& stream, const EmbeddingArguments& arguments);

}  // namespace folio::kernels::cpu
