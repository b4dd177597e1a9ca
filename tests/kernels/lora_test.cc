#include "folio/kernels/cpu/lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "aligned_buffer.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/simd_level.h"
#include "folio/kernels/lora.h"
#include "folio/tensor/half.h"

namespace folio::kernels::cpu {
namespace {

constexpr double kUnitRoundoff = 1.0 / (1 << 24);
constexpr int64_t kInt8BlockValues = 32;

// An adapter's shape in a test: its rank and format (rank 0: the slot has no matrices).
struct AdapterSpec {
  int32_t rank;
  LoraWeightFormat format;
};

using testing::AlignedBuffer;

// Random values whose magnitude changes from one 32-column block to the next (by factors of 2
// up to 8), so that an int8 value multiplied by the scale of the wrong block is off by at least
// a factor of 2 and fails the tolerance.
std::vector<float> block_varying_values(std::mt19937& generator, int64_t rows, int64_t columns) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(rows * columns);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t column = 0; column < columns; ++column) {
      const int exponent = static_cast<int>((row + column / kInt8BlockValues) % 4) - 2;
      values[row * columns + column] = std::ldexp(uniform(generator), exponent);
    }
  }
  return values;
}

// A batch of tokens over a table of adapter slots, as the engine would pass it, with every
// matrix written by write_lora_matrix. Matrices start at an odd byte address, so no load may
// assume alignment.
class LoraProblem {
 public:
  LoraProblem(int64_t input_features, int64_t output_features, int64_t rows,
              const std::vector<AdapterSpec>& adapters, uint32_t seed)
      : input_features_(input_features), output_features_(output_features), rows_(rows) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    input_.resize(rows * input_features);
    for (float& value : input_) value = uniform(generator);
    base_.resize(rows * output_features);
    for (float& value : base_) value = uniform(generator);
    storage_.resize(adapters.size());
    for (size_t slot = 0; slot < adapters.size(); ++slot) {
      const AdapterSpec& spec = adapters[slot];
      LoraSlotWeights weights;
      weights.rank = spec.rank;
      weights.format = spec.format;
      weights.scale = std::uniform_real_distribution<float>(0.25f, 2.0f)(generator);
      max_rank_ = std::max(max_rank_, spec.rank);
      if (spec.rank > 0) {
        const int64_t a_bytes = lora_matrix_bytes(spec.format, spec.rank, input_features);
        const int64_t b_bytes = lora_matrix_bytes(spec.format, spec.rank, output_features);
        storage_[slot].resize(1 + a_bytes + 1 + b_bytes);
        std::byte* a = storage_[slot].data() + 1;
        std::byte* b = a + a_bytes + 1;
        write_lora_matrix(spec.format,
                          block_varying_values(generator, spec.rank, input_features).data(),
                          spec.rank, input_features, a);
        write_lora_matrix(spec.format,
                          block_varying_values(generator, spec.rank, output_features).data(),
                          spec.rank, output_features, b);
        weights.a = a;
        weights.b = b;
      }
      slots_.push_back(weights);
    }
    // Every slot appears when there are enough rows; the rest are random.
    const auto num_slots = static_cast<int32_t>(slots_.size());
    for (int64_t row = 0; row < rows; ++row) {
      token_slots_.push_back(
          row < num_slots ? static_cast<int32_t>((row * 5 + 1) % num_slots)
                          : std::uniform_int_distribution<int32_t>(0, num_slots - 1)(generator));
    }
  }

  int64_t rows() const { return rows_; }
  int64_t output_features() const { return output_features_; }
  std::vector<int32_t>& token_slots() { return token_slots_; }
  std::vector<LoraSlotWeights>& slots() { return slots_; }
  const std::vector<float>& base() const { return base_; }

  // The arguments for rows [first_row, first_row + rows) of the batch.
  LoraArguments arguments(float* output, std::byte* workspace, int64_t workspace_bytes,
                          int64_t first_row = 0, int64_t rows = -1) const {
    LoraArguments arguments;
    arguments.input = input_.data() + first_row * input_features_;
    arguments.base = base_.data() + first_row * output_features_;
    arguments.output = output;
    arguments.token_slots = token_slots_.data() + first_row;
    arguments.slots = slots_.data();
    arguments.num_slots = static_cast<int32_t>(slots_.size());
    arguments.max_rank = max_rank_;
    arguments.workspace = workspace;
    arguments.workspace_bytes = workspace_bytes;
    arguments.num_rows = rows < 0 ? rows_ : rows;
    arguments.input_features = input_features_;
    arguments.output_features = output_features_;
    return arguments;
  }

  // Runs rows [first_row, first_row + rows) into a NaN-filled output, so an element never
  // written shows.
  std::vector<float> run(device::HostStream& stream, int64_t first_row = 0,
                         int64_t rows = -1) const {
    const int64_t count = rows < 0 ? rows_ : rows;
    std::vector<float> output(count * output_features_, std::numeric_limits<float>::quiet_NaN());
    const int64_t bytes = lora_workspace_bytes(max_rank_, stream.pool().num_threads());
    AlignedBuffer workspace(bytes);
    lora(stream, arguments(output.data(), workspace.data(), bytes, first_row, count));
    return output;
  }

  // Runs the whole batch in place: output is a copy of base, passed as both.
  std::vector<float> run_in_place(device::HostStream& stream) const {
    std::vector<float> output = base_;
    const int64_t bytes = lora_workspace_bytes(max_rank_, stream.pool().num_threads());
    AlignedBuffer workspace(bytes);
    LoraArguments in_place = arguments(output.data(), workspace.data(), bytes);
    in_place.base = output.data();
    lora(stream, in_place);
    return output;
  }

  // The double-precision reference of every output element, from the values read_lora_value
  // reads (so int8 quantization is not part of the tolerance), and its error bound.
  //
  // The kernel computes s_j = fl(scale * h_j), h_j a K-term f32 dot product (lanes of fused
  // multiply-add chains, then a reduction tree: error <= K u sum_k |A_jk x_k| to first order),
  // then y_c = base_c + s_0 B_0c + s_1 B_1c + ..., rank fused multiply-adds (error <=
  // rank u (|base_c| + sum_j |s_j B_jc|)). The bound is twice the sum of the two, +2 terms of
  // slack: the factor 2 covers the portable path, which multiplies then adds (two roundings per
  // step), and second-order terms. Rank-0 rows must equal base exactly (bound 0).
  void reference(std::vector<double>& expected, std::vector<double>& bound) const {
    expected.assign(rows_ * output_features_, 0.0);
    bound.assign(rows_ * output_features_, 0.0);
    for (int64_t row = 0; row < rows_; ++row) {
      const LoraSlotWeights& weights = slots_[token_slots_[row]];
      const int32_t rank = weights.rank;
      std::vector<double> projected(rank);
      std::vector<double> projected_magnitude(rank);
      for (int32_t j = 0; j < rank; ++j) {
        for (int64_t k = 0; k < input_features_; ++k) {
          const double product = static_cast<double>(read_lora_value(weights.format, weights.a,
                                                                     rank, input_features_, j, k)) *
                                 input_[row * input_features_ + k];
          projected[j] += product;
          projected_magnitude[j] += std::fabs(product);
        }
      }
      const double scale = weights.scale;
      for (int64_t column = 0; column < output_features_; ++column) {
        const double base = base_[row * output_features_ + column];
        double sum = 0.0;
        double dot_error = 0.0;
        double expand_magnitude = std::fabs(base);
        for (int32_t j = 0; j < rank; ++j) {
          const double value =
              read_lora_value(weights.format, weights.b, rank, output_features_, j, column);
          sum += projected[j] * value;
          dot_error += std::fabs(value) * projected_magnitude[j];
          expand_magnitude += std::fabs(scale * projected[j] * value);
        }
        expected[row * output_features_ + column] = base + scale * sum;
        bound[row * output_features_ + column] =
            rank == 0
                ? 0.0
                : 2 * kUnitRoundoff *
                      ((static_cast<double>(input_features_) + 2) * std::fabs(scale) * dot_error +
                       (rank + 2) * expand_magnitude);
      }
    }
  }

 private:
  int64_t input_features_;
  int64_t output_features_;
  int64_t rows_;
  int32_t max_rank_ = 0;
  std::vector<float> input_;  // f32 [rows, input_features]
  std::vector<float> base_;   // f32 [rows, output_features]
  std::vector<int32_t> token_slots_;
  std::vector<std::vector<std::byte>> storage_;  // per slot: a byte of offset, A, a byte, B^T
  std::vector<LoraSlotWeights> slots_;
};

void expect_within_bound(const std::vector<float>& actual, const std::vector<double>& expected,
                         const std::vector<double>& bound, int64_t columns) {
  int failures = 0;
  for (size_t i = 0; i < actual.size() && failures < 5; ++i) {
    if (std::fabs(actual[i] - expected[i]) <= bound[i]) continue;
    ++failures;
    ADD_FAILURE() << "row " << static_cast<int64_t>(i) / columns << " column "
                  << static_cast<int64_t>(i) % columns << ": " << actual[i] << " vs " << expected[i]
                  << " (bound " << bound[i] << ")";
  }
}

// Slot 0 has no adapter; slot 5 is an adapter that does not target this projection (rank 0).
std::vector<AdapterSpec> mixed_adapters(LoraWeightFormat first, LoraWeightFormat second) {
  return {{0, first}, {1, first}, {8, second}, {16, first}, {64, second}, {0, second}};
}

struct FormatMix {
  const char* name;
  LoraWeightFormat first;
  LoraWeightFormat second;
};

constexpr FormatMix kFormatMixes[] = {
    {"f16", LoraWeightFormat::kF16, LoraWeightFormat::kF16},
    {"int8", LoraWeightFormat::kInt8, LoraWeightFormat::kInt8},
    {"mixed", LoraWeightFormat::kF16, LoraWeightFormat::kInt8},
};

struct Shape {
  int64_t input_features;
  int64_t output_features;
};

// A typical projection; N = 100 (int8 rows padded to 128, not a multiple of 16 or 8 either);
// K = 72 and N = 37 (partial vectors on both sides, K not a multiple of 32).
constexpr Shape kShapes[] = {{768, 768}, {256, 100}, {72, 37}};
constexpr int64_t kRowCounts[] = {1, 2, 3, 5, 8, 16, 31, 33, 64, 67};

class LoraTest : public ::testing::Test {
 protected:
  ThreadPool single_thread_{1};
  ThreadPool two_threads_{2};
};

TEST_F(LoraTest, MatchesDoubleReferenceForEveryFormatShapeAndSimdLevel) {
  device::HostStream stream(two_threads_);
  uint32_t seed = 1;
  for (const FormatMix& mix : kFormatMixes) {
    for (const Shape& shape : kShapes) {
      for (int64_t rows : kRowCounts) {
        const LoraProblem problem(shape.input_features, shape.output_features, rows,
                                  mixed_adapters(mix.first, mix.second), ++seed);
        std::vector<double> expected;
        std::vector<double> bound;
        problem.reference(expected, bound);
        for (SimdLevel level : supported_simd_levels()) {
          ScopedSimdLevel scoped(level);
          SCOPED_TRACE(std::string(simd_level_name(level)) + " " + mix.name +
                       " K=" + std::to_string(shape.input_features) + " N=" +
                       std::to_string(shape.output_features) + " rows=" + std::to_string(rows));
          const std::vector<float> output = problem.run(stream);
          expect_within_bound(output, expected, bound, shape.output_features);
          // In place computes the same sequence of operations.
          const std::vector<float> in_place = problem.run_in_place(stream);
          ASSERT_EQ(std::memcmp(in_place.data(), output.data(), output.size() * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST_F(LoraTest, RowsWithoutAnAdapterCopyBaseExactly) {
  device::HostStream stream(single_thread_);
  LoraProblem problem(64, 100, 9, mixed_adapters(LoraWeightFormat::kF16, LoraWeightFormat::kInt8),
                      3);
  for (int32_t& slot : problem.token_slots()) slot = slot % 2 == 0 ? 0 : 5;
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    const std::vector<float> output = problem.run(stream);
    EXPECT_EQ(std::memcmp(output.data(), problem.base().data(), output.size() * sizeof(float)), 0);
    const std::vector<float> in_place = problem.run_in_place(stream);
    EXPECT_EQ(std::memcmp(in_place.data(), problem.base().data(), output.size() * sizeof(float)),
              0);
  }
}

// Batch invariance (a product guarantee): a token's row is bitwise the same alone as inside a
// mixed batch, and on one thread as on two.
TEST_F(LoraTest, TokenResultsDoNotDependOnTheBatchOrTheThreadCount) {
  device::HostStream one_thread(single_thread_);
  device::HostStream two_thread(two_threads_);
  for (SimdLevel level : supported_simd_levels()) {
    ScopedSimdLevel scoped(level);
    for (const FormatMix& mix : kFormatMixes) {
      for (const Shape& shape : kShapes) {
        SCOPED_TRACE(std::string(simd_level_name(level)) + " " + mix.name +
                     " N=" + std::to_string(shape.output_features));
        const int64_t columns = shape.output_features;
        const LoraProblem problem(shape.input_features, columns, 67,
                                  mixed_adapters(mix.first, mix.second), 11);
        const std::vector<float> batched = problem.run(two_thread);
        const std::vector<float> single_threaded = problem.run(one_thread);
        ASSERT_EQ(
            std::memcmp(batched.data(), single_threaded.data(), batched.size() * sizeof(float)), 0);
        for (int64_t row : {0, 1, 2, 3, 4, 5, 33, 66}) {
          const std::vector<float> alone = problem.run(two_thread, row, 1);
          ASSERT_EQ(
              std::memcmp(alone.data(), batched.data() + row * columns, columns * sizeof(float)), 0)
              << "row " << row;
        }
      }
    }
  }
}

// token_slots and the slot table are read when the kernel runs: a replay with new slots (an
// adapter loaded into a slot, tokens moved between adapters) computes what an eager launch
// with those slots computes.
TEST_F(LoraTest, ReplayReadsTheSlotsOfTheStep) {
  device::HostStream stream(two_threads_);
  LoraProblem problem(256, 100, 12, mixed_adapters(LoraWeightFormat::kF16, LoraWeightFormat::kInt8),
                      21);
  std::vector<float> output(12 * 100);
  const int64_t bytes = lora_workspace_bytes(64, 2);
  AlignedBuffer workspace(bytes);
  stream.begin_capture();
  lora(stream, problem.arguments(output.data(), workspace.data(), bytes));
  const device::HostGraph graph = stream.end_capture();
  ASSERT_EQ(graph.num_kernels(), 1u);

  std::reverse(problem.token_slots().begin(), problem.token_slots().end());
  std::swap(problem.slots()[1], problem.slots()[4]);
  problem.slots()[2].scale = -3.0f;
  stream.replay(graph);
  const std::vector<float> eager = problem.run(stream);
  EXPECT_EQ(std::memcmp(output.data(), eager.data(), output.size() * sizeof(float)), 0);
  std::vector<double> expected;
  std::vector<double> bound;
  problem.reference(expected, bound);
  expect_within_bound(output, expected, bound, 100);
}

TEST(LoraWorkspaceTest, OneCacheLineAlignedSliceOfMaxRankFloatsPerThread) {
  EXPECT_EQ(lora_workspace_bytes(0, 4), 0);
  EXPECT_EQ(lora_workspace_bytes(1, 1), 64);
  EXPECT_EQ(lora_workspace_bytes(16, 2), 128);
  EXPECT_EQ(lora_workspace_bytes(17, 3), 3 * 128);
}

TEST(LoraDeathTest, RefusesSlotsOutOfRangeRanksAboveMaxRankAndSmallWorkspaces) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ThreadPool pool(1);
  device::HostStream stream(pool);
  LoraProblem problem(64, 40, 4, mixed_adapters(LoraWeightFormat::kF16, LoraWeightFormat::kInt8),
                      5);
  std::vector<float> output(4 * 40);
  const int64_t bytes = lora_workspace_bytes(64, 1);
  AlignedBuffer workspace(bytes);
  EXPECT_DEATH(lora(stream, problem.arguments(output.data(), workspace.data(), bytes - 4)),
               "lora workspace");
  LoraArguments shifted = problem.arguments(output.data(), workspace.data(), bytes);
  shifted.base = output.data() + 1;
  EXPECT_DEATH(lora(stream, shifted), "overlaps base");
  LoraArguments low_max_rank = problem.arguments(output.data(), workspace.data(), bytes);
  low_max_rank.max_rank = 16;  // slot 4 has rank 64
  problem.token_slots()[2] = 4;
  EXPECT_DEATH(lora(stream, low_max_rank), "rank 64, outside \\[0, max_rank 16\\]");
  problem.token_slots()[2] = 6;
  EXPECT_DEATH(lora(stream, problem.arguments(output.data(), workspace.data(), bytes)),
               "has slot 6 of 6");
}

// write_lora_matrix's int8 values are within half a quantization step (scale = block max / 127)
// of the f32 values, up to the f32 rounding of v / scale and scale * q (381 u of a step at
// most); padding is zero and a block of zeros has scale 0. f16 values are within half an f16
// ulp (relative 2^-11).
TEST(LoraMatrixTest, WrittenValuesAreWithinHalfAQuantizationStep) {
  constexpr int64_t kRows = 5;
  constexpr int64_t kColumns = 100;  // 4 blocks, the last one 4 values and 28 of padding
  std::mt19937 generator(7);
  std::vector<float> values = block_varying_values(generator, kRows, kColumns);
  for (int64_t column = 32; column < 64; ++column) values[kColumns + column] = 0.0f;
  values[2 * kColumns + 5] = 1e-30f;  // a tiny value in a block of ordinary ones
  std::vector<std::byte> int8_matrix(lora_matrix_bytes(LoraWeightFormat::kInt8, kRows, kColumns));
  write_lora_matrix(LoraWeightFormat::kInt8, values.data(), kRows, kColumns, int8_matrix.data());
  constexpr int64_t kPadded = 128;
  const auto* quantized = reinterpret_cast<const int8_t*>(int8_matrix.data());
  for (int64_t row = 0; row < kRows; ++row) {
    for (int64_t column = 0; column < kPadded; ++column) {
      if (column >= kColumns) {
        EXPECT_EQ(quantized[row * kPadded + column], 0) << row << " " << column;
        continue;
      }
      const int64_t block = column / kInt8BlockValues;
      float largest = 0.0f;
      for (int64_t i = block * kInt8BlockValues;
           i < std::min(kColumns, (block + 1) * kInt8BlockValues); ++i) {
        largest = std::max(largest, std::fabs(values[row * kColumns + i]));
      }
      const double step = largest / 127.0;
      const double value = values[row * kColumns + column];
      const double read = read_lora_value(LoraWeightFormat::kInt8, int8_matrix.data(), kRows,
                                          kColumns, row, column);
      EXPECT_LE(std::fabs(read - value), step * (0.5 + 381 * kUnitRoundoff))
          << "row " << row << " column " << column;
      EXPECT_LE(std::abs(quantized[row * kPadded + column]), 127);
    }
  }
  EXPECT_EQ(read_lora_value(LoraWeightFormat::kInt8, int8_matrix.data(), kRows, kColumns, 1, 40),
            0.0f);

  std::vector<std::byte> f16_matrix(lora_matrix_bytes(LoraWeightFormat::kF16, kRows, kColumns));
  write_lora_matrix(LoraWeightFormat::kF16, values.data(), kRows, kColumns, f16_matrix.data());
  for (int64_t i = 0; i < kRows * kColumns; ++i) {
    if (std::fabs(values[i]) < 1e-4f) continue;  // below the f16 normal range
    const double read = read_lora_value(LoraWeightFormat::kF16, f16_matrix.data(), kRows, kColumns,
                                        i / kColumns, i % kColumns);
    EXPECT_LE(std::fabs(read - values[i]), std::fabs(values[i]) / 2048.0) << i;
  }
}

}  // namespace
}  // namespace folio::kernels::cpu
