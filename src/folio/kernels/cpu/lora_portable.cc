// Portable LoRA token update (any CPU): the loops of lora_body.inc over eight-float arrays
// (simd_portable.inc), the lane count and reduction tree of the AVX2 path, with multiply then
// add (two roundings: there is no fused multiply-add in baseline x86-64).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/lora_kernels.h"
#include "folio/kernels/lora.h"
#include "folio/tensor/half.h"

namespace folio::kernels::cpu::internal {
namespace {

#include "folio/kernels/cpu/simd_portable.inc"

using Simd = SimdPortable;

#include "folio/kernels/cpu/lora_body.inc"

}  // namespace

constinit const LoraTokenFunction lora_token_portable = token_update_any_format;

}  // namespace folio::kernels::cpu::internal
