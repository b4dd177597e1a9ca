// AVX-512 LoRA token update (F/BW/VL + F16C + FMA): the loops of lora_body.inc over 16-lane
// vectors (simd_avx512.inc) with masked tails. Compiled for those extensions only inside this
// file, so the rest of the binary still runs on any x86-64; called only when the active
// SimdLevel is kAvx512.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/lora_kernels.h"
#include "folio/kernels/cpu/simd_target.h"
#include "folio/kernels/lora.h"

FOLIO_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,fma,f16c")

namespace folio::kernels::cpu::internal {
namespace {

#include "folio/kernels/cpu/simd_avx512.inc"

struct Simd : SimdAvx512 {
  // f16 from unaligned bytes, lanes from `count` on 0: a masked load (AVX-512BW), so no byte
  // past the row's end is touched.
  static Vector load_f16_partial(const std::byte* pointer, int64_t count) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(first_lanes(count), pointer));
  }
};

#include "folio/kernels/cpu/lora_body.inc"

}  // namespace

constinit const LoraTokenFunction lora_token_avx512 = token_update_any_format;

}  // namespace folio::kernels::cpu::internal

FOLIO_SIMD_TARGET_END
