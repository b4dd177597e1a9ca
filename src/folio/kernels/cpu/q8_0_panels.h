// q8_0 panels: q8_0 weights repacked once, at load, into the order the AVX-512 panel kernel
// (matmul_q8_0_avx512.cc) holds them in its registers, so a decode step streams W sequentially
// and does no per-step transpose (reading W in GGUF order, the kernel transposed every block it
// read, about 50 vector operations per 512 weight bytes, and a panel read 16 rows that lie 34 K /
// 32 bytes apart). The layout's dtype is DType::kQ8_0Panels, which no file holds.
//
// Layout of W [N, K] (num_blocks = K / 32): ceil(N / 16) panels, panel p holding rows 16 p ..
// 16 p + 15 in exactly 16 q8_0 rows' bytes (16 * 34 * num_blocks), panels contiguous:
//   groups, num_blocks * 512 bytes: block b's group j (values 32 b + 4 j .. + 3) at
//     512 b + 64 j, lane L's 4 bytes at + 4 L: q + 128 (unsigned, vpdpbusd's side) of row
//     16 p + lane_column(L);
//   then scales, num_blocks * 32 bytes: block b's f16 d of lane L's row at 512 num_blocks +
//     32 b + 2 L.
// lane_column(L) = 4 (L % 4) + L / 4 (its own inverse) is the column order the kernel's
// in-register transpose produced; the stored panels keep it, so every path shares the store.
// Rows past N in the last panel are q = 0, d = 0 (never stored by the kernel). The values are
// the file's, bit for bit: a matmul on the panels gives the q8_0 matmul's results exactly.
#pragma once

#include <cstddef>
#include <cstdint>

namespace folio::kernels::cpu {

inline constexpr int64_t kQ8_0PanelRows = 16;

constexpr int q8_0_panel_lane_column(int lane) {
  return 4 * (lane % 4) + lane / 4;
}

// Bytes of W [rows, input_features] as panels (the last panel padded to 16 rows).
// Requires: input_features a multiple of 32.
int64_t q8_0_panels_bytes(int64_t rows, int64_t input_features);

// Whether the matmul can run q8_0 panels on this CPU (AVX-512 with VNNI): where it cannot,
// nothing should pack.
bool q8_0_panels_supported();
// Whether weights loaded now should be packed: supported, and the active SIMD level is AVX-512
// (a process that forced a lower level, e.g. `--simd=avx2`, measures that level's q8_0 kernel).
bool q8_0_panels_preferred();

// Packs panels [panel_begin, panel_end) of the q8_0 matrix `q8_0` [rows, input_features] into
// `panels` (the whole matrix's q8_0_panels_bytes; panel p written at its own offset), so that
// disjoint panel ranges can be packed by different threads.
void pack_q8_0_panels(const void* q8_0, int64_t rows, int64_t input_features, int64_t panel_begin,
                      int64_t panel_end, std::byte* panels);

// Row `row` of a packed matrix, dequantized to f32 (d * q, as dequantize_row_q8_0 gives it):
// the embedding lookup of a tied table kept only as panels.
void dequantize_q8_0_panels_row(const std::byte* panels, int64_t input_features, int64_t row,
                                float* output);

}  // namespace folio::kernels::cpu
