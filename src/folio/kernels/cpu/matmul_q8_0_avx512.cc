// q8_0 weights on AVX-512 VNNI: 16 weight rows (a *panel*) at a time, one output column per
// lane. The row kernels of matmul_body.inc hold a pair (weight row, row of x) per vector and
// pay a conversion, a scale multiply and an FMA for every 64 products, plus a horizontal sum
// at the end; with a column per lane, the 8 vpdpbusd of a block (32 values x 16 columns) share
// one conversion, multiply and FMA, and x's 4-value groups are broadcast loads (load ports
// only). Before, q8_0 prefill reached about 14% of the VNNI peak on 2 threads and batched
// decode under 4% (docs/notes/speed-vs-llama-cpp.md, batch-scaling.md; perf: 67-72% of a q8_0
// prefill in quantized_tile).
//
// Arithmetic (the definition every M and tile shape computes, so a row's result never depends
// on the batch): per output element, over the blocks b of K in order,
//   sum = fma(float(dot_b), d_w,b * d_x,b, sum), from sum = 0; output = sum + bias,
// dot_b the exact integer dot product of the block's 32 weight and x values (|dot_b| <= 32 *
// 128 * 127 < 2^24, so the conversion is exact too). The weights enter vpdpbusd as unsigned
// bytes, q + 128; x's block correction, -128 * (sum of the block's q), starts the integer sum
// and removes the offset exactly (matmul_kernels.h, has_block_corrections).
//
// A panel's block is 8 vectors, vector j holding values 4j..4j+3 of every column, so each
// vpdpbusd multiplies all 16 columns by one broadcast group of x. Loading 4 rows' 16-byte
// chunks into the 4 chunks of a vector and transposing 4x4 dwords within chunks leaves lane L
// holding column lane_column(L) = 4 (L % 4) + L / 4; the scales are gathered in the same
// order and the results put back in column order by one permute at the store. With one tile of
// x or less (decode) a block is transposed in registers and used at once; with more, the panel
// is transposed once per pass into the thread's scratch and every tile of x reads it there.
// Weights packed at load (DType::kQ8_0Panels, q8_0_panels.h) are already in that order, +128,
// with f16 scales: every path reads their blocks as they lie, with no transpose and no scratch.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "folio/kernels/cpu/matmul.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/kernels/cpu/simd_target.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quant_blocks.h"
#include "folio/tensor/quantize.h"

FOLIO_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")

namespace folio::kernels::cpu::internal {
namespace {

constexpr int kColumns = static_cast<int>(kQ8_0PanelColumns);
static_assert(kQ8_0PanelColumns == kQ8_0PanelRows);
constexpr int64_t kBlock = kQuantBlockElements;
constexpr int kGroupsPerBlock = static_cast<int>(kBlock / 4);  // vpdpbusd lanes take 4 values
// Rows of x per tile: 8 f32 sums, the block's 8 weight vectors and its scales stay in registers.
constexpr int kTileRows = 8;

constexpr int64_t kCacheLineBytes = 64;

constexpr int lane_column(int lane) {
  return q8_0_panel_lane_column(lane);
}

// Where a panel's blocks come from: W's 16 rows in GGUF order, fewer rows (W's last panel), or
// a panel packed at load (q8_0_panels.h). One instantiation each, so that the loops over
// blocks carry no branch on it.
enum class PanelSource { kWholeRows, kPartialRows, kPacked };

// A packed panel's block: its 8 group vectors lie at kPanelGroupBytes * block, its 16 f16
// scales after all the blocks' groups.
constexpr int64_t kPanelGroupBytes = kGroupsPerBlock * 64;
constexpr int64_t kPanelScaleBytes = kColumns * 2;

// One block of a panel, as vpdpbusd takes it (as AMX's tdpbssd takes it: signed, no +128).
struct PanelBlock {
  __m512i groups[kGroupsPerBlock];  // lane L: values 4j..4j+3 + 128 of column lane_column(L)
  __m512 scales;                    // lane L: d of column lane_column(L)
};

// What a panel block occupies in the scratch: the 8 group vectors, then the scales.
constexpr int64_t kPackedBlockBytes = (kGroupsPerBlock + 1) * 64;

inline __m128i load_chunk(const std::byte* pointer) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(pointer));
}

// Block `block` of a whole panel (16 rows from `rows`, `row_bytes` apart), in registers; the
// values as stored when kSigned (for AMX), else + 128.
template <bool kSigned>
__attribute__((always_inline)) inline void transpose_block(const std::byte* rows, int64_t row_bytes,
                                                           int64_t block, PanelBlock& out) {
  const std::byte* first = rows + block * static_cast<int64_t>(sizeof(BlockQ8_0));
  const __m512i offset = _mm512_set1_epi8(kSigned ? 0 : static_cast<char>(0x80));
  for (int half = 0; half < 2; ++half) {
    // chunks[q], 128-bit chunk i: values 16 half .. 16 half + 15 of row 4 q + i.
    __m512i chunks[4];
    for (int q = 0; q < 4; ++q) {
      const std::byte* values = first + 4 * q * row_bytes + offsetof(BlockQ8_0, values) + 16 * half;
      // Broadcast loads merged under a mask: a load and a blend (ports 0 and 5) each, where
      // vinserti32x4 would queue every chunk on the one 512-bit shuffle port.
      __m512i vector = _mm512_broadcast_i32x4(load_chunk(values));
      vector = _mm512_mask_broadcast_i32x4(vector, 0x00f0, load_chunk(values + row_bytes));
      vector = _mm512_mask_broadcast_i32x4(vector, 0x0f00, load_chunk(values + 2 * row_bytes));
      vector = _mm512_mask_broadcast_i32x4(vector, 0xf000, load_chunk(values + 3 * row_bytes));
      chunks[q] = vector;
    }
    // Per chunk i, a 4x4 transpose of dwords: group 4 half + e takes dword e of chunks[0..3],
    // so its lane 4 i + q is row 4 q + i.
    const __m512i low01 = _mm512_unpacklo_epi32(chunks[0], chunks[1]);
    const __m512i high01 = _mm512_unpackhi_epi32(chunks[0], chunks[1]);
    const __m512i low23 = _mm512_unpacklo_epi32(chunks[2], chunks[3]);
    const __m512i high23 = _mm512_unpackhi_epi32(chunks[2], chunks[3]);
    __m512i* groups = out.groups + 4 * half;
    groups[0] = _mm512_xor_si512(_mm512_unpacklo_epi64(low01, low23), offset);
    groups[1] = _mm512_xor_si512(_mm512_unpackhi_epi64(low01, low23), offset);
    groups[2] = _mm512_xor_si512(_mm512_unpacklo_epi64(high01, high23), offset);
    groups[3] = _mm512_xor_si512(_mm512_unpackhi_epi64(high01, high23), offset);
  }
  // The f16 d of each lane's row (a 4-byte read at the block's start: d and 2 values).
  const __m512i row_offsets = _mm512_mullo_epi32(
      _mm512_setr_epi32(lane_column(0), lane_column(1), lane_column(2), lane_column(3),
                        lane_column(4), lane_column(5), lane_column(6), lane_column(7),
                        lane_column(8), lane_column(9), lane_column(10), lane_column(11),
                        lane_column(12), lane_column(13), lane_column(14), lane_column(15)),
      _mm512_set1_epi32(static_cast<int>(row_bytes)));
  const __m512i words = _mm512_i32gather_epi32(row_offsets, first, 1);
  out.scales = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
}

// Block `block` of a panel of `count` < 16 rows (the last panel of W), the same bytes as
// transpose_block would give, absent columns 0 (they are never stored).
template <bool kSigned>
void gather_partial_block(const std::byte* rows, int64_t row_bytes, int64_t count, int64_t block,
                          PanelBlock& out) {
  alignas(64) uint8_t bytes[kGroupsPerBlock][kColumns][4] = {};
  alignas(64) float scales[kColumns] = {};
  for (int lane = 0; lane < kColumns; ++lane) {
    const int column = lane_column(lane);
    if (column >= count) continue;
    const auto* source = reinterpret_cast<const BlockQ8_0*>(rows + column * row_bytes) + block;
    scales[lane] = f16_to_f32(source->scale);
    for (int group = 0; group < kGroupsPerBlock; ++group) {
      for (int i = 0; i < 4; ++i) {
        bytes[group][lane][i] =
            static_cast<uint8_t>(source->values[4 * group + i]) ^ (kSigned ? 0 : 0x80);
      }
    }
  }
  for (int group = 0; group < kGroupsPerBlock; ++group) {
    out.groups[group] = _mm512_load_si512(bytes[group]);
  }
  out.scales = _mm512_load_ps(scales);
}

// Block `block` of a panel packed at load (`panel`: its first byte), as stored (+128).
__attribute__((always_inline)) inline void read_packed_block(const std::byte* panel,
                                                             int64_t num_blocks, int64_t block,
                                                             PanelBlock& out) {
  const std::byte* groups = panel + block * kPanelGroupBytes;
  for (int group = 0; group < kGroupsPerBlock; ++group) {
    out.groups[group] = _mm512_loadu_si512(groups + 64 * group);
  }
  out.scales = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
      panel + num_blocks * kPanelGroupBytes + block * kPanelScaleBytes)));
}

// The block from `rows` (W's rows, or the packed panel), as PanelBlock holds it; kSigned only
// from W's rows (the packed values are +128).
template <PanelSource kSource, bool kSigned>
__attribute__((always_inline)) inline void load_block(const std::byte* rows, int64_t row_bytes,
                                                      int64_t count, int64_t num_blocks,
                                                      int64_t block, PanelBlock& out) {
  if constexpr (kSource == PanelSource::kWholeRows) {
    transpose_block<kSigned>(rows, row_bytes, block, out);
  } else if constexpr (kSource == PanelSource::kPartialRows) {
    gather_partial_block<kSigned>(rows, row_bytes, count, block, out);
  } else {
    static_assert(!kSigned, "packed panels hold q + 128");
    read_packed_block(rows, num_blocks, block, out);
  }
}

// x's tile: kRows rows from `values` (K apart), their block corrections and lane scales.
struct TileInput {
  const int8_t* values;
  const int32_t* corrections;  // row t's block b: corrections[t * K / 4 + b]
  const float* lane_scales;    // row t's block b: lane_scales[t * K / 4 + 8 b]
  int64_t input_features;
};

// sums[t] += the block's products for row t (the arithmetic of the file comment).
template <int kRows>
__attribute__((always_inline)) inline void multiply_block(const PanelBlock& weights,
                                                          const TileInput& x, int64_t block,
                                                          __m512 (&sums)[kRows]) {
  const int64_t lanes_per_row = x.input_features / 4;
#pragma GCC unroll 16
  for (int t = 0; t < kRows; ++t) {
    const int8_t* values = x.values + t * x.input_features + block * kBlock;
    __m512i dot = _mm512_set1_epi32(x.corrections[t * lanes_per_row + block]);
#pragma GCC unroll 8
    for (int group = 0; group < kGroupsPerBlock; ++group) {
      int32_t four;
      std::memcpy(&four, values + 4 * group, sizeof(four));
      dot = _mm512_dpbusd_epi32(dot, weights.groups[group], _mm512_set1_epi32(four));
    }
    const __m512 scales = _mm512_mul_ps(
        weights.scales,
        _mm512_set1_ps(x.lane_scales[t * lanes_per_row + block * kLanesPerActivationBlock]));
    sums[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scales, sums[t]);
  }
}

// Rows t of the tile's output: the lanes back in column order, plus bias, `count` columns.
template <int kRows>
__attribute__((always_inline)) inline void store_tile(const __m512 (&sums)[kRows],
                                                      const float* bias, int64_t count,
                                                      float* output, int64_t output_stride) {
  // lane_column is its own inverse: column c is in lane lane_column(c).
  const __m512i lanes =
      _mm512_setr_epi32(lane_column(0), lane_column(1), lane_column(2), lane_column(3),
                        lane_column(4), lane_column(5), lane_column(6), lane_column(7),
                        lane_column(8), lane_column(9), lane_column(10), lane_column(11),
                        lane_column(12), lane_column(13), lane_column(14), lane_column(15));
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  const __m512 bias_vector =
      bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int t = 0; t < kRows; ++t) {
    _mm512_mask_storeu_ps(output + t * output_stride, mask,
                          _mm512_add_ps(_mm512_permutexvar_ps(lanes, sums[t]), bias_vector));
  }
}

// Where a panel's tiles write: its first column's output and bias.
struct PanelOutput {
  const float* bias;  // null without bias
  int64_t count;      // columns in the panel, <= 16
  float* output;      // row 0 of the tile, the panel's first column
  int64_t output_stride;
};

// One tile of kRows <= kTileRows rows of x against a panel read from W itself, each block
// transposed in registers or read as packed: the path of decode (M <= kTileRows), where a panel
// meets one tile. Never inlined, as the tiles of matmul_body.inc: each has the register file to
// itself.
template <int kRows, PanelSource kSource>
__attribute__((noinline)) void direct_tile(const std::byte* rows, int64_t row_bytes,
                                           const TileInput& x, const PanelOutput& out,
                                           Prefetch prefetch) {
  __m512 sums[kRows];
  for (int t = 0; t < kRows; ++t) sums[t] = _mm512_setzero_ps();
  const int64_t num_blocks = x.input_features / kBlock;
  for (int64_t block = 0; block < num_blocks; ++block) {
    prefetch.step();
    PanelBlock weights;
    load_block<kSource, false>(rows, row_bytes, out.count, num_blocks, block, weights);
    multiply_block<kRows>(weights, x, block, sums);
  }
  store_tile<kRows>(sums, out.bias, out.count, out.output, out.output_stride);
}

// One tile against a panel transposed into `packed` (pack_panel), or, kFromPanel, against a
// panel packed at load.
template <int kRows, bool kFromPanel>
__attribute__((noinline)) void packed_tile(const std::byte* packed, const TileInput& x,
                                           const PanelOutput& out) {
  __m512 sums[kRows];
  for (int t = 0; t < kRows; ++t) sums[t] = _mm512_setzero_ps();
  const int64_t num_blocks = x.input_features / kBlock;
  for (int64_t block = 0; block < num_blocks; ++block) {
    PanelBlock weights;
    if constexpr (kFromPanel) {
      read_packed_block(packed, num_blocks, block, weights);
    } else {
      const std::byte* source = packed + block * kPackedBlockBytes;
      for (int group = 0; group < kGroupsPerBlock; ++group) {
        weights.groups[group] = _mm512_load_si512(source + 64 * group);
      }
      weights.scales = _mm512_load_ps(source + 64 * kGroupsPerBlock);
    }
    multiply_block<kRows>(weights, x, block, sums);
  }
  store_tile<kRows>(sums, out.bias, out.count, out.output, out.output_stride);
}

// The whole panel, block by block, into `packed` (kPackedBlockBytes per block).
template <PanelSource kSource, bool kSigned>
void pack_panel(const std::byte* rows, int64_t row_bytes, int64_t count, int64_t num_blocks,
                std::byte* packed) {
  for (int64_t block = 0; block < num_blocks; ++block) {
    PanelBlock weights;
    load_block<kSource, kSigned>(rows, row_bytes, count, num_blocks, block, weights);
    std::byte* target = packed + block * kPackedBlockBytes;
    for (int group = 0; group < kGroupsPerBlock; ++group) {
      _mm512_store_si512(target + 64 * group, weights.groups[group]);
    }
    _mm512_store_ps(target + 64 * kGroupsPerBlock, weights.scales);
  }
}

// Calls tile(std::integral_constant<int, rows>()) for 0 < rows <= kTileRows.
template <int kRows = kTileRows, typename Tile>
__attribute__((always_inline)) inline void with_tile_rows(int64_t rows, Tile&& tile) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      tile(std::integral_constant<int, kRows>());
      return;
    }
    with_tile_rows<kRows - 1>(rows, tile);
  }
}

}  // namespace
}  // namespace folio::kernels::cpu::internal

FOLIO_SIMD_TARGET_END

// AMX: a tile of 16 rows of x against a panel packed with signed values, one tdpbssd per block
// (16 x 16 x 32 products, exact in i32) instead of 8 x 16 vpdpbusd; the products go through
// memory to the same conversion, scale product and FMA as multiply_block's, so the results are
// the VNNI tiles' bit for bit. The vector work left per block (3 operations per row) is a
// third of the VNNI tile's.
FOLIO_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,amx-tile,amx-int8")

namespace folio::kernels::cpu::internal {
namespace {

constexpr int kAmxRows = 16;

// Tiles 0 and 1: x's 16 rows of an even and an odd block (16 x 32 bytes); 4 and 5: the panel's
// blocks (8 rows of 64 bytes: the packed groups); 2 and 3: their 16 x 16 i32 products.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t column_bytes[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

constexpr TileConfig panel_tile_config() {
  TileConfig config;
  for (int tile : {0, 1}) {
    config.rows[tile] = kAmxRows;
    config.column_bytes[tile] = kBlock;
  }
  for (int tile : {2, 3}) {
    config.rows[tile] = kAmxRows;
    config.column_bytes[tile] = 64;
  }
  for (int tile : {4, 5}) {
    config.rows[tile] = kGroupsPerBlock;
    config.column_bytes[tile] = 64;
  }
  return config;
}

// A constant in memory: GCC 12 does not see ldtilecfg's builtin read a local configuration and
// dropped the stores that filled one (the tiles then faulted as unconfigured).
constexpr TileConfig kPanelTileConfig = panel_tile_config();

void configure_tiles() {
  _tile_loadconfig(&kPanelTileConfig);
}

void release_tiles() {
  _tile_release();
}

// sums[r] += the block's products for row r of the tile, from `products` (16 x 16 i32);
// kCorrected: the products were of the unsigned (+128) weights, and x's block correction
// removes the offset (exactly, in i32, as the VNNI tile's starting value does).
template <bool kCorrected>
__attribute__((always_inline)) inline void add_block_products(const int32_t* products,
                                                              __m512 weight_scales,
                                                              const TileInput& x, int64_t block,
                                                              __m512 (&sums)[kAmxRows]) {
  const int64_t lanes_per_row = x.input_features / 4;
  for (int row = 0; row < kAmxRows; ++row) {
    __m512i dot = _mm512_load_si512(products + kColumns * row);
    if constexpr (kCorrected) {
      dot = _mm512_add_epi32(dot, _mm512_set1_epi32(x.corrections[row * lanes_per_row + block]));
    }
    const __m512 scales = _mm512_mul_ps(
        weight_scales,
        _mm512_set1_ps(x.lane_scales[row * lanes_per_row + block * kLanesPerActivationBlock]));
    sums[row] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scales, sums[row]);
  }
}

// The B tile's source for a block and the block's weight scales: a panel transposed signed
// into the scratch (pack_panel<..., true>), or a panel packed at load (unsigned, f16 scales).
template <bool kFromPanel>
struct AmxWeights {
  const std::byte* packed;
  int64_t num_blocks;

  const std::byte* groups(int64_t block) const {
    return packed + block * (kFromPanel ? kPanelGroupBytes : kPackedBlockBytes);
  }
  __m512 scales(int64_t block) const {
    if constexpr (kFromPanel) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          packed + num_blocks * kPanelGroupBytes + block * kPanelScaleBytes)));
    } else {
      return _mm512_load_ps(groups(block) + 64 * kGroupsPerBlock);
    }
  }
};

// Tile `product` = x's tile `x_tile` times weight tile `weight_tile`: tdpbssd on signed weights,
// tdpbsud (x signed, weights unsigned) on a panel packed at load.
#define FOLIO_AMX_BLOCK_PRODUCT(product, x_tile, weight_tile) \
  do {                                                        \
    if constexpr (kFromPanel) {                               \
      _tile_dpbsud(product, x_tile, weight_tile);             \
    } else {                                                  \
      _tile_dpbssd(product, x_tile, weight_tile);             \
    }                                                         \
  } while (false)

// One tile of 16 rows of x against a panel packed signed (pack_panel<..., true>), or packed at
// load (kFromPanel); requires the tiles configured (configure_tiles) on this thread.
template <bool kFromPanel>
__attribute__((always_inline)) inline void amx_tile_body(const std::byte* packed,
                                                         const TileInput& x,
                                                         const PanelOutput& out) {
  alignas(64) int32_t products[2][kAmxRows * kColumns];
  __m512 sums[kAmxRows];
  for (int row = 0; row < kAmxRows; ++row) sums[row] = _mm512_setzero_ps();
  const int64_t num_blocks = x.input_features / kBlock;
  const AmxWeights<kFromPanel> weights{packed, num_blocks};
  const int64_t stride = x.input_features;
  int64_t block = 0;
  // Two blocks per iteration in separate tiles, so the second's tdpbssd can run while the
  // first's products are scaled.
  for (; block + 2 <= num_blocks; block += 2) {
    _tile_loadd(0, x.values + block * kBlock, stride);
    _tile_loadd(4, weights.groups(block), 64);
    _tile_zero(2);
    FOLIO_AMX_BLOCK_PRODUCT(2, 0, 4);
    _tile_loadd(1, x.values + (block + 1) * kBlock, stride);
    _tile_loadd(5, weights.groups(block + 1), 64);
    _tile_zero(3);
    FOLIO_AMX_BLOCK_PRODUCT(3, 1, 5);
    _tile_stored(2, products[0], 64);
    add_block_products<kFromPanel>(products[0], weights.scales(block), x, block, sums);
    _tile_stored(3, products[1], 64);
    add_block_products<kFromPanel>(products[1], weights.scales(block + 1), x, block + 1, sums);
  }
  if (block < num_blocks) {
    _tile_loadd(0, x.values + block * kBlock, stride);
    _tile_loadd(4, weights.groups(block), 64);
    _tile_zero(2);
    FOLIO_AMX_BLOCK_PRODUCT(2, 0, 4);
    _tile_stored(2, products[0], 64);
    add_block_products<kFromPanel>(products[0], weights.scales(block), x, block, sums);
  }
  store_tile<kAmxRows>(sums, out.bias, out.count, out.output, out.output_stride);
}

#undef FOLIO_AMX_BLOCK_PRODUCT

// The instantiations, defined here under the AMX target (a template instantiated from the
// caller's region would not be).
__attribute__((noinline)) void amx_tile(const std::byte* scratch, const TileInput& x,
                                        const PanelOutput& out) {
  amx_tile_body<false>(scratch, x, out);
}
__attribute__((noinline)) void amx_tile_from_panel(const std::byte* panel, const TileInput& x,
                                                   const PanelOutput& out) {
  amx_tile_body<true>(panel, x, out);
}

}  // namespace
}  // namespace folio::kernels::cpu::internal

FOLIO_SIMD_TARGET_END

FOLIO_SIMD_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")

namespace folio::kernels::cpu::internal {

int64_t q8_0_panel_scratch_bytes(int64_t input_features) {
  return align_up(input_features / kBlock * kPackedBlockBytes);
}

void q8_0_panel_rows_avx512(const MatmulArguments& arguments,
                            const QuantizedActivations& activations, int64_t panel_begin,
                            int64_t panel_end, std::byte* scratch, bool use_amx) {
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  const int64_t num_blocks = input_features / kBlock;
  // Both layouts: a panel is 16 q8_0 rows' bytes, panel p at p * panel_bytes.
  const int64_t weight_row_bytes = row_bytes(DType::kQ8_0, input_features);
  const int64_t panel_bytes = kColumns * weight_row_bytes;
  const bool packed_weights = arguments.weight_dtype == DType::kQ8_0Panels;
  const auto* weight = static_cast<const std::byte*>(arguments.weight);
  Prefetch::warm_up(weight + panel_begin * panel_bytes, panel_bytes,
                    (panel_end - panel_begin) * panel_bytes);
  // x takes 3 bytes per value (matmul_body.inc's quantized_rows): its rows of a pass stay in L2.
  const int64_t pass_rows = rows_per_pass(input_features * 3);
  bool tiles_configured = false;  // AMX's, on this thread, until released at the end
  for (int64_t first_row = 0; first_row < arguments.num_rows; first_row += pass_rows) {
    const int64_t end_row = std::min(arguments.num_rows, first_row + pass_rows);
    for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
      const int64_t column = panel * kColumns;
      const std::byte* rows = weight + panel * panel_bytes;
      const int64_t count = std::min<int64_t>(kColumns, output_features - column);
      const auto tile_input = [&](int64_t row) {
        return TileInput{activations.values + row * input_features,
                         activations.corrections + row * (input_features / 4),
                         activations.lane_scales + row * (input_features / 4), input_features};
      };
      const auto tile_output = [&](int64_t row) {
        return PanelOutput{arguments.bias != nullptr ? arguments.bias + column : nullptr, count,
                           arguments.output + row * output_features + column, output_features};
      };
      if (end_row - first_row <= kTileRows) {
        with_tile_rows(end_row - first_row, [&](auto tile_rows) {
          constexpr int kRows = decltype(tile_rows)::value;
          const Prefetch prefetch(rows, panel_bytes, num_blocks);
          const TileInput x = tile_input(first_row);
          const PanelOutput out = tile_output(first_row);
          if (packed_weights) {
            direct_tile<kRows, PanelSource::kPacked>(rows, weight_row_bytes, x, out, prefetch);
          } else if (count == kColumns) {
            direct_tile<kRows, PanelSource::kWholeRows>(rows, weight_row_bytes, x, out, prefetch);
          } else {
            direct_tile<kRows, PanelSource::kPartialRows>(rows, weight_row_bytes, x, out, prefetch);
          }
        });
        continue;
      }
      // The next panel goes into L2 while this one's tiles run, a share of its lines per
      // tile: prefetched only during the pack (as the row kernels do), the pack stalled on its
      // loads, 16% of a prefill's matmul time (perf).
      auto prefetch_share = [&, next_panel = rows + panel_bytes](int64_t tiles) mutable {
        const int64_t lines = (panel_bytes / kCacheLineBytes + tiles) / tiles;
        for (int64_t line = 0; line < lines; ++line) {
          __builtin_prefetch(next_panel, /*read*/ 0, /*locality: L2*/ 2);
          next_panel += kCacheLineBytes;
        }
      };
      // Tiles of 16 rows through AMX, then the rest in tiles of up to 8 through VNNI (the
      // panel packed again, unsigned): the same results either way. A panel packed at load is
      // read where it lies by both.
      const int64_t amx_tiles = use_amx ? (end_row - first_row) / kAmxRows : 0;
      const int64_t vnni_tiles =
          (end_row - first_row - amx_tiles * kAmxRows + kTileRows - 1) / kTileRows;
      int64_t row = first_row;
      if (amx_tiles > 0) {
        if (!tiles_configured) {
          configure_tiles();
          tiles_configured = true;
        }
        if (!packed_weights) {
          if (count == kColumns) {
            pack_panel<PanelSource::kWholeRows, true>(rows, weight_row_bytes, count, num_blocks,
                                                      scratch);
          } else {
            pack_panel<PanelSource::kPartialRows, true>(rows, weight_row_bytes, count, num_blocks,
                                                        scratch);
          }
        }
        for (; row + kAmxRows <= end_row; row += kAmxRows) {
          prefetch_share(amx_tiles + vnni_tiles);
          if (packed_weights) {
            amx_tile_from_panel(rows, tile_input(row), tile_output(row));
          } else {
            amx_tile(scratch, tile_input(row), tile_output(row));
          }
        }
      }
      if (row == end_row) continue;
      if (!packed_weights) {
        if (count == kColumns) {
          pack_panel<PanelSource::kWholeRows, false>(rows, weight_row_bytes, count, num_blocks,
                                                     scratch);
        } else {
          pack_panel<PanelSource::kPartialRows, false>(rows, weight_row_bytes, count, num_blocks,
                                                       scratch);
        }
      }
      for (; row < end_row; row += kTileRows) {
        prefetch_share(amx_tiles + vnni_tiles);
        with_tile_rows(std::min<int64_t>(kTileRows, end_row - row), [&](auto tile_rows) {
          constexpr int kRows = decltype(tile_rows)::value;
          if (packed_weights) {
            packed_tile<kRows, true>(rows, tile_input(row), tile_output(row));
          } else {
            packed_tile<kRows, false>(scratch, tile_input(row), tile_output(row));
          }
        });
      }
    }
  }
  if (tiles_configured) release_tiles();
}

}  // namespace folio::kernels::cpu::internal

FOLIO_SIMD_TARGET_END
