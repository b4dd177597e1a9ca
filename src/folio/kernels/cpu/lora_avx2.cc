// AVX2 + FMA + F16C LoRA token update: the loops of lora_body.inc over 8-lane vectors
// (simd_avx2.inc). Compiled for those extensions only inside this file; called only when the
// active SimdLevel is kAvx2. Tails use maskload / maskstore for f32 and a zero-filled copy for
// f16, so no byte past a row's end is read.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/lora_kernels.h"
#include "folio/kernels/cpu/simd_target.h"
#include "folio/kernels/lora.h"

FOLIO_SIMD_TARGET_BEGIN("avx2,fma,f16c")

namespace folio::kernels::cpu::internal {
namespace {

#include "folio/kernels/cpu/simd_avx2.inc"

using Simd = SimdAvx2;

#include "folio/kernels/cpu/lora_body.inc"

}  // namespace

constinit const LoraTokenFunction lora_token_avx2 = token_update_any_format;

}  // namespace folio::kernels::cpu::internal

FOLIO_SIMD_TARGET_END
