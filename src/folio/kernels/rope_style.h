// RopeStyle: which elements of a head rotary position embedding rotates together. One enum for
// the IR's rope op (ir/op.h) and the kernels that run it, so the two can never disagree.
#pragma once

#include <cstdint>

namespace folio::kernels {

enum class RopeStyle : uint8_t {
  kNormal,  // adjacent pairs (x[2i], x[2i+1]): Llama as stored in GGUF
  kNeox,    // halves (x[i], x[i + rotary_dim / 2]): Qwen2, GPT-NeoX
};

}  // namespace folio::kernels
