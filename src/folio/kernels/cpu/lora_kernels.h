// Internal to the CPU LoRA kernel: the per-instruction-set update of one token that lora.cc
// launches. Not for use outside kernels/cpu.
//
// Every function computes, for one token of one adapter (rank > 0):
//   low_rank[j] = scale * dot(A[j, :], input)                     for j < rank  (shrink)
//   output[c]   = base[c] + sum over j, in order, low_rank[j] * B^T[j, c]        (expand)
// with one f32 accumulator per (j) and per (c), each a chain of fused multiply-adds (the
// portable path multiplies then adds) whose order depends only on the format, rank, K, N and
// the instruction set, never on the caller: this is what makes a token's update independent of
// the batch and the thread count. The three instantiations share their loops (lora_body.inc);
// only their `Simd` traits differ (simd_<instruction set>.inc).
#pragma once

#include <cstdint>

#include "folio/kernels/lora.h"

namespace folio::kernels::cpu::internal {

// Requires: weights.rank > 0, a and b valid matrices of weights.format (rank x input_features
// and rank x output_features), low_rank holds weights.rank floats, output equals base or does
// not overlap it.
using LoraTokenFunction = void (*)(const LoraSlotWeights& weights, int64_t input_features,
                                   int64_t output_features,
                                   const float* input,  // f32 [input_features]
                                   const float* base,   // f32 [output_features]
                                   float* output,       // f32 [output_features]
                                   float* low_rank);    // f32 [rank], scratch

// The instantiations, one per instruction set (lora_<instruction set>.cc): constants, so that
// each file names its loops in one line instead of repeating a forwarding function.
extern const LoraTokenFunction lora_token_portable;
extern const LoraTokenFunction lora_token_avx2;
extern const LoraTokenFunction lora_token_avx512;

}  // namespace folio::kernels::cpu::internal
