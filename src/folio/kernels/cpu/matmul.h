// CPU matmul: launches y[M, N] = x[M, K] · W[N, K]^T (+ bias) (folio/kernels/matmul.h) onto a
// HostStream, so a forward pass that calls it can be captured and replayed.
//
// How the work is done (docs/design/kernels.md has the measurements behind each choice):
// - Weight-stationary. Work items are groups of 4 weight rows (output columns); an item
//   computes its columns for ALL M rows of x, reading the group from memory once and keeping it
//   in cache across 4-row tiles of x. Decode (small M) streams each weight byte once per step,
//   so a step with 32 sequences reads no more weight than a step with one. For all but f32
//   weights the first tile prefetches the group after next into L2 (see Prefetch in
//   matmul_kernels.h): without it their decode reaches only 50-75% of the read bandwidth.
// - f32 / f16 / bf16 weights: SIMD FMA dot products; f16 and bf16 are widened to f32 in
//   registers (decode) or, from kConvertedGroupMinRows rows of x, once per group into the
//   per-thread workspace (prefill), so the conversion is not repeated for every tile of x.
// - Quantized weights (q8_0, q4_0 and the other GGUF block types): a first kernel quantizes
//   each row of x to 8 bits (32-value blocks, scale amax / 127) into the workspace; the second
//   decodes weight blocks in registers to small integers and per-4-value scales (and offsets,
//   for the types with minimums), takes int8 dot products (AVX-512 VNNI, AVX2 maddubs, or
//   portable) scaled by both scales and sums them in f32. q8_0 on AVX-512 has a kernel of its
//   own: work items are panels of 16 weight rows, one output column per vector lane, the 8
//   vpdpbusd of a 32-value block sharing one conversion and scale FMA
//   (matmul_q8_0_avx512.cc).
// - f32 weights with M >= kSgemmMinRows and K >= kSgemmMinInputFeatures: OpenBLAS sgemm on
//   fixed 2-D tiles of y, one tile per work item, with OpenBLAS itself single-threaded: Folio's
//   pool is the only source of threads (no oversubscription, the thread count is configured in one
//   place), and fixed tiles keep the result independent of the thread count.
//
// Determinism: every output element is computed by exactly one work item, in an order fixed by
// the shapes, so results are bit-identical for any thread count and for replayed vs eager
// launches. Apart from the f32 sgemm path, a row's result is also independent of M (the other
// rows of the batch): x rows are tiled, never mixed, and the per-element accumulation order is
// the same in every tile shape. The sgemm path rounds differently from Folio's kernel (relative
// differences around 1e-7), so for f32 weights with K >= kSgemmMinInputFeatures a row's result
// depends on whether its step has at least kSgemmMinRows rows.
#pragma once

#include <cstdint>

#include "folio/device/host_stream.h"
#include "folio/kernels/matmul.h"

namespace folio::kernels::cpu {

// f32 weights go to OpenBLAS sgemm from this many rows of x and input features (measured,
// docs/design/kernels.md: below K = 3072 Folio's kernel is ~10% faster than sgemm at every M;
// from K = 3072 and M = 96 sgemm is 8-40% faster, the kernel's 4-row weight groups no longer
// fitting in L1).
inline constexpr int64_t kSgemmMinRows = 96;
inline constexpr int64_t kSgemmMinInputFeatures = 3072;
// From this many rows of x, f16 / bf16 weight groups are converted to f32 once per group.
inline constexpr int64_t kConvertedGroupMinRows = 8;

// Workspace bytes `matmul` needs for these shapes when launched on a pool of `num_threads`
// threads; 0 when it needs none. The same for every SimdLevel.
int64_t matmul_workspace_bytes(DType weight_dtype, int64_t num_rows, int64_t input_features,
                               int num_threads);

// Launches the matmul: one kernel, or two for quantized weights (quantize x, then multiply).
// Requires: num_rows >= 0, input_features > 0 and a multiple of 32 and of the weight dtype's
// block_elements (256 for the k-quants and iq4_xs), output_features >= 0;
// is_weight_dtype(weight_dtype); workspace 64-byte aligned with
// workspace_bytes >= matmul_workspace_bytes(..., stream.pool().num_threads()); output does not
// overlap input or workspace (all of these checked: a violation aborts, being a programming
// error fixed for a captured graph), nor weight or bias. x and W should be 64-byte aligned:
// misaligned rows split every vector load across cache lines (20-30% slower prefill).
void matmul(device::HostStream& stream, const MatmulArguments& arguments);

}  // namespace folio::kernels::cpu
