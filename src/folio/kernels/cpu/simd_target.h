// Internal to the CPU kernels: compiling one region of a file for extra instruction-set
// extensions. Not for use outside kernels/cpu.
//
// FOLIO_SIMD_TARGET_BEGIN("avx2,fma,f16c") ... FOLIO_SIMD_TARGET_END gives every function
// defined in between the target attribute (GCC: `#pragma GCC target`; clang has no such pragma,
// so `#pragma clang attribute` applies the attribute to each function instead). The rest of the
// binary stays baseline x86-64; a function of the region runs only after its caller checked the
// CPU (simd_level.h, vector_ops.h). Regions do not nest.
#pragma once

#define FOLIO_SIMD_PRAGMA(tokens) _Pragma(#tokens)

#if defined(__clang__)
#define FOLIO_SIMD_TARGET_BEGIN(targets) \
  FOLIO_SIMD_PRAGMA(clang attribute push(__attribute__((target(targets))), apply_to = function))
#define FOLIO_SIMD_TARGET_END FOLIO_SIMD_PRAGMA(clang attribute pop)
#else
#define FOLIO_SIMD_TARGET_BEGIN(targets) \
  FOLIO_SIMD_PRAGMA(GCC push_options) FOLIO_SIMD_PRAGMA(GCC target(targets))
#define FOLIO_SIMD_TARGET_END FOLIO_SIMD_PRAGMA(GCC pop_options)
#endif

// GCC 12 warns inside its own intrinsics (_mm512_undefined_ps and friends) when they are
// inlined into target-specific functions (GCC bug 105593, fixed in GCC 13): off for the rest of
// every file that includes this header.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
