#include "folio/kernels/cpu/q8_0_panels.h"

#include <cstring>

#include "folio/base/check.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quant_blocks.h"

namespace folio::kernels::cpu {
namespace {

constexpr int64_t kGroupBytes = 64;                       // 16 lanes of 4 values
constexpr int64_t kBlockGroupBytes = 8 * kGroupBytes;     // a block's 32 values, 16 rows
constexpr int64_t kBlockScaleBytes = kQ8_0PanelRows * 2;  // 16 f16

int64_t panel_bytes(int64_t input_features) {
  return kQ8_0PanelRows * (input_features / kQuantBlockElements) *
         static_cast<int64_t>(sizeof(BlockQ8_0));
}

}  // namespace

int64_t q8_0_panels_bytes(int64_t rows, int64_t input_features) {
  return (rows + kQ8_0PanelRows - 1) / kQ8_0PanelRows * panel_bytes(input_features);
}

bool q8_0_panels_supported() {
  return detected_simd_level() == SimdLevel::kAvx512;
}

bool q8_0_panels_preferred() {
  return q8_0_panels_supported() && active_simd_level() == SimdLevel::kAvx512;
}

void pack_q8_0_panels(const void* q8_0, int64_t rows, int64_t input_features, int64_t panel_begin,
                      int64_t panel_end, std::byte* panels) {
  FOLIO_CHECK(input_features % kQuantBlockElements == 0 && rows >= 0 && panel_begin >= 0 &&
                  panel_end * kQ8_0PanelRows < rows + kQ8_0PanelRows,
              "pack_q8_0_panels: panels [{}, {}) of {} rows with K = {}", panel_begin, panel_end,
              rows, input_features);
  const int64_t num_blocks = input_features / kQuantBlockElements;
  const auto* source = static_cast<const BlockQ8_0*>(q8_0);
  for (int64_t panel = panel_begin; panel < panel_end; ++panel) {
    auto* groups = reinterpret_cast<uint8_t*>(panels + panel * panel_bytes(input_features));
    uint8_t* scales = groups + num_blocks * kBlockGroupBytes;
    for (int lane = 0; lane < kQ8_0PanelRows; ++lane) {
      const int64_t row = panel * kQ8_0PanelRows + q8_0_panel_lane_column(lane);
      const BlockQ8_0* blocks = row < rows ? source + row * num_blocks : nullptr;
      for (int64_t block = 0; block < num_blocks; ++block) {
        uint8_t* values = groups + block * kBlockGroupBytes + 4 * lane;
        uint16_t scale = 0;
        for (int value = 0; value < kQuantBlockElements; ++value) {
          const int8_t q = blocks != nullptr ? blocks[block].values[value] : 0;
          values[value / 4 * kGroupBytes + value % 4] = static_cast<uint8_t>(q) ^ 0x80;
        }
        if (blocks != nullptr) scale = blocks[block].scale;
        std::memcpy(scales + block * kBlockScaleBytes + 2 * lane, &scale, sizeof(scale));
      }
    }
  }
}

void dequantize_q8_0_panels_row(const std::byte* panels, int64_t input_features, int64_t row,
                                float* output) {
  const int64_t num_blocks = input_features / kQuantBlockElements;
  const auto* groups =
      reinterpret_cast<const uint8_t*>(panels + row / kQ8_0PanelRows * panel_bytes(input_features));
  const uint8_t* scales = groups + num_blocks * kBlockGroupBytes;
  // lane_column is its own inverse: the row's lane is lane_column(its column).
  const int lane = q8_0_panel_lane_column(static_cast<int>(row % kQ8_0PanelRows));
  for (int64_t block = 0; block < num_blocks; ++block) {
    uint16_t scale_bits;
    std::memcpy(&scale_bits, scales + block * kBlockScaleBytes + 2 * lane, sizeof(scale_bits));
    const float scale = f16_to_f32(scale_bits);
    const uint8_t* values = groups + block * kBlockGroupBytes + 4 * lane;
    for (int value = 0; value < kQuantBlockElements; ++value) {
      const auto q = static_cast<int8_t>(values[value / 4 * kGroupBytes + value % 4] ^ 0x80);
      output[block * kQuantBlockElements + value] = scale * static_cast<float>(q);
    }
  }
}

}  // namespace folio::kernels::cpu
