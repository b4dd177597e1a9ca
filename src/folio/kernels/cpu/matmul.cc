#include "folio/kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "folio/base/check.h"
#include "folio/kernels/cpu/matmul_kernels.h"
#include "folio/kernels/cpu/q8_0_panels.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/tensor/quantize.h"

namespace folio::kernels::cpu {
namespace {

using internal::kGroupRows;

// sgemm tile of y: each work item multiplies kSgemmTileRows rows of x by kSgemmTileColumns
// weight rows (measured: bench/kernels, matmul_bench).
constexpr int64_t kSgemmTileRows = 128;
constexpr int64_t kSgemmTileColumns = 128;
// A task below this many multiply-adds is not worth handing to another thread.
constexpr int64_t kMinTaskMultiplyAdds = 1 << 15;

struct RowsLaunch {
  MatmulArguments arguments;
  SimdLevel level;
  bool use_amx = false;  // q8_0 panels on AVX-512: amx_enabled() at launch
};

int64_t group_scratch_bytes(int64_t input_features) {
  return internal::align_up(kGroupRows * input_features * static_cast<int64_t>(sizeof(float)));
}

int64_t ceil_div(int64_t value, int64_t divisor) {
  return (value + divisor - 1) / divisor;
}

void quantize_activations_body(const RowsLaunch& launch, int64_t begin, int64_t end,
                               int thread_index) {
  std::byte* workspace = launch.arguments.workspace;
  switch (launch.level) {
    case SimdLevel::kPortable:
    case SimdLevel::kAvx2:
      return internal::quantize_activation_rows_portable(launch.arguments, workspace, begin, end);
    case SimdLevel::kAvx512:
      return internal::quantize_activation_rows_avx512(launch.arguments, workspace, begin, end);
  }
}

void float_rows_body(const RowsLaunch& launch, int64_t begin, int64_t end, int thread_index) {
  const MatmulArguments& arguments = launch.arguments;
  float* scratch = nullptr;
  if (arguments.weight_dtype != DType::kF32) {
    scratch = reinterpret_cast<float*>(
        arguments.workspace + thread_index * group_scratch_bytes(arguments.input_features));
  }
  const int64_t row_begin = begin * kGroupRows;
  const int64_t row_end = std::min(end * kGroupRows, arguments.output_features);
  switch (launch.level) {
    case SimdLevel::kPortable:
      return internal::float_rows_portable(arguments, row_begin, row_end, scratch);
    case SimdLevel::kAvx2:
      return internal::float_rows_avx2(arguments, row_begin, row_end, scratch);
    case SimdLevel::kAvx512:
      return internal::float_rows_avx512(arguments, row_begin, row_end, scratch);
  }
}

// x quantized by the first launch, in the workspace's arrays.
internal::QuantizedActivations quantized_activations_of(const MatmulArguments& arguments) {
  const internal::QuantizedActivationsLayout layout =
      internal::quantized_activations_layout(arguments.num_rows, arguments.input_features);
  return {reinterpret_cast<const int8_t*>(arguments.workspace + layout.values_offset),
          reinterpret_cast<const int32_t*>(arguments.workspace + layout.corrections_offset),
          reinterpret_cast<const float*>(arguments.workspace + layout.lane_scales_offset)};
}

void quantized_rows_body(const RowsLaunch& launch, int64_t begin, int64_t end, int thread_index) {
  const MatmulArguments& arguments = launch.arguments;
  const internal::QuantizedActivations activations = quantized_activations_of(arguments);
  const int64_t row_begin = begin * kGroupRows;
  const int64_t row_end = std::min(end * kGroupRows, arguments.output_features);
  switch (launch.level) {
    case SimdLevel::kPortable:
      return internal::quantized_rows_portable(arguments, activations, row_begin, row_end);
    case SimdLevel::kAvx2:
      return internal::quantized_rows_avx2(arguments, activations, row_begin, row_end);
    case SimdLevel::kAvx512:
      return internal::quantized_rows_avx512(arguments, activations, row_begin, row_end);
  }
}

// Items are panels of kQ8_0PanelColumns weight rows; the thread's panel scratch follows x's
// quantized arrays in the workspace.
void q8_0_panels_body(const RowsLaunch& launch, int64_t begin, int64_t end, int thread_index) {
  const MatmulArguments& arguments = launch.arguments;
  const internal::QuantizedActivations activations = quantized_activations_of(arguments);
  std::byte* scratch =
      arguments.workspace +
      internal::quantized_activations_layout(arguments.num_rows, arguments.input_features)
          .total_bytes +
      thread_index * internal::q8_0_panel_scratch_bytes(arguments.input_features);
  internal::q8_0_panel_rows_avx512(arguments, activations, begin, end, scratch, launch.use_amx);
}

// Items are tiles of y, column tile major. Every tile is one sgemm call of a shape fixed by
// (M, N, K), so the result does not depend on which thread ran it.
void sgemm_body(const MatmulArguments& arguments, int64_t begin, int64_t end, int thread_index) {
  const int64_t row_tiles = ceil_div(arguments.num_rows, kSgemmTileRows);
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  const auto* weight = static_cast<const float*>(arguments.weight);
  for (int64_t tile = begin; tile < end; ++tile) {
    const int64_t first_row = (tile % row_tiles) * kSgemmTileRows;
    const int64_t first_column = (tile / row_tiles) * kSgemmTileColumns;
    const int64_t rows = std::min(kSgemmTileRows, arguments.num_rows - first_row);
    const int64_t columns = std::min(kSgemmTileColumns, output_features - first_column);
    float* output = arguments.output + first_row * output_features + first_column;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(columns), static_cast<int>(input_features), 1.0f,
                arguments.input + first_row * input_features, static_cast<int>(input_features),
                weight + first_column * input_features, static_cast<int>(input_features), 0.0f,
                output, static_cast<int>(output_features));
    if (arguments.bias == nullptr) continue;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t column = 0; column < columns; ++column) {
        output[row * output_features + column] += arguments.bias[first_column + column];
      }
    }
  }
}

// OpenBLAS runs single-threaded inside Folio's tasks: the pool is the only source of threads.
void make_openblas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

bool overlaps(const void* first, int64_t first_bytes, const void* second, int64_t second_bytes) {
  const auto* a = static_cast<const std::byte*>(first);
  const auto* b = static_cast<const std::byte*>(second);
  return first_bytes > 0 && second_bytes > 0 && a < b + second_bytes && b < a + first_bytes;
}

void check_arguments(const device::HostStream& stream, const MatmulArguments& arguments) {
  const int64_t rows = arguments.num_rows;
  const int64_t input_features = arguments.input_features;
  const int64_t output_features = arguments.output_features;
  FOLIO_CHECK(
      is_weight_dtype(arguments.weight_dtype) || arguments.weight_dtype == DType::kQ8_0Panels,
      "matmul weight dtype {} is not supported", dtype_name(arguments.weight_dtype));
  // Panels exist only where q8_0_panels_supported(): the layout is the AVX-512 kernel's.
  FOLIO_CHECK(arguments.weight_dtype != DType::kQ8_0Panels || q8_0_panels_supported(),
              "matmul on q8_0 panels needs AVX-512 VNNI, which this CPU lacks");
  FOLIO_CHECK(rows >= 0 && output_features >= 0 && input_features > 0 && input_features % 32 == 0,
              "matmul shape M={} N={} K={}: K must be a positive multiple of 32", rows,
              output_features, input_features);
  // The k-quants and iq4_xs have 256-value super-blocks: a row is a whole number of them.
  const int64_t block_elements = dtype_info(arguments.weight_dtype).block_elements;
  FOLIO_CHECK(input_features % block_elements == 0,
              "matmul with {} weights and K={}: K must be a multiple of {}",
              dtype_name(arguments.weight_dtype), input_features, block_elements);
  FOLIO_CHECK(rows == 0 || output_features == 0 ||
                  (arguments.input != nullptr && arguments.weight != nullptr &&
                   arguments.output != nullptr),
              "matmul with a null input, weight or output");
  const int64_t needed = matmul_workspace_bytes(arguments.weight_dtype, rows, input_features,
                                                stream.pool().num_threads());
  FOLIO_CHECK(
      arguments.workspace_bytes >= needed && (needed == 0 || arguments.workspace != nullptr),
      "matmul workspace of {} bytes; {} needed", arguments.workspace_bytes, needed);
  FOLIO_CHECK(reinterpret_cast<uintptr_t>(arguments.workspace) % internal::kWorkspaceAlignment == 0,
              "matmul workspace is not {}-byte aligned", internal::kWorkspaceAlignment);
  const int64_t output_bytes = rows * output_features * static_cast<int64_t>(sizeof(float));
  FOLIO_CHECK(
      !overlaps(arguments.output, output_bytes, arguments.input,
                rows * input_features * static_cast<int64_t>(sizeof(float))) &&
          !overlaps(arguments.output, output_bytes, arguments.workspace, arguments.workspace_bytes),
      "matmul output overlaps its input or workspace");
}

}  // namespace

int64_t matmul_workspace_bytes(DType weight_dtype, int64_t num_rows, int64_t input_features,
                               int num_threads) {
  switch (weight_dtype) {
    case DType::kF32:
      return 0;
    case DType::kF16:
    case DType::kBF16:
      return num_threads * group_scratch_bytes(input_features);
    case DType::kQ8_0:
    case DType::kQ8_0Panels:
      // The panel scratch of AVX-512's q8_0 kernel, whatever the level: the size of a graph's
      // workspace does not depend on the CPU it runs on.
      if (num_rows == 0) return 0;
      return internal::quantized_activations_layout(num_rows, input_features).total_bytes +
             num_threads * internal::q8_0_panel_scratch_bytes(input_features);
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return internal::quantized_activations_layout(num_rows, input_features).total_bytes;
    case DType::kI32:
    case DType::kI8:
      break;
  }
  FOLIO_UNREACHABLE("matmul_workspace_bytes for weight dtype {}", dtype_name(weight_dtype));
}

void matmul(device::HostStream& stream, const MatmulArguments& arguments) {
  check_arguments(stream, arguments);
  const int64_t rows = arguments.num_rows;
  if (rows == 0 || arguments.output_features == 0) return;
  const DType dtype = arguments.weight_dtype;

  if (dtype == DType::kF32 && rows >= kSgemmMinRows &&
      arguments.input_features >= kSgemmMinInputFeatures) {
    make_openblas_single_threaded();
    const int64_t tiles =
        ceil_div(rows, kSgemmTileRows) * ceil_div(arguments.output_features, kSgemmTileColumns);
    stream.launch(
        device::HostKernel::make<MatmulArguments, sgemm_body>("matmul_sgemm", arguments, tiles));
    return;
  }

  // q8_0 panels run the AVX-512 panel kernel whatever level a test forces: no other reads them.
  const SimdLevel level = dtype == DType::kQ8_0Panels ? SimdLevel::kAvx512 : active_simd_level();
  const RowsLaunch launch{arguments, level, level == SimdLevel::kAvx512 && amx_enabled()};
  const int64_t groups = ceil_div(arguments.output_features, kGroupRows);
  const int64_t group_multiply_adds = kGroupRows * arguments.input_features * rows;
  const int64_t grain = std::max<int64_t>(1, kMinTaskMultiplyAdds / group_multiply_adds);
  if (internal::uses_quantized_activations(dtype)) {
    const int64_t quantize_grain =
        std::max<int64_t>(1, kMinTaskMultiplyAdds / arguments.input_features);
    stream.launch(device::HostKernel::make<RowsLaunch, quantize_activations_body>(
        "matmul_quantize_activations", launch, rows, quantize_grain));
    if ((dtype == DType::kQ8_0 || dtype == DType::kQ8_0Panels) &&
        launch.level == SimdLevel::kAvx512) {
      const int64_t panels = ceil_div(arguments.output_features, internal::kQ8_0PanelColumns);
      const int64_t panel_multiply_adds =
          internal::kQ8_0PanelColumns * arguments.input_features * rows;
      stream.launch(device::HostKernel::make<RowsLaunch, q8_0_panels_body>(
          "matmul_q8_0_panels", launch, panels,
          std::max<int64_t>(1, kMinTaskMultiplyAdds / panel_multiply_adds)));
      return;
    }
    stream.launch(device::HostKernel::make<RowsLaunch, quantized_rows_body>("matmul_quantized",
                                                                            launch, groups, grain));
    return;
  }
  stream.launch(
      device::HostKernel::make<RowsLaunch, float_rows_body>("matmul_float", launch, groups, grain));
}

}  // namespace folio::kernels::cpu
