#include "folio/base/read_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "folio/base/check.h"

namespace folio {
namespace {

constexpr int64_t kSliceAlignment = 4096;
constexpr int kLanes = 8;

// Eight independent sums, so the adds vectorize and no dependency chain limits the reads;
// cloned per instruction set (chosen once, at load time), since the baseline build's 16-byte
// loads leave one core short of what it can stream.
__attribute__((target_clones("avx512f", "avx2", "default"))) uint64_t sum_words(
    const uint64_t* words, int64_t count) {
  uint64_t sums[kLanes] = {};
  for (int64_t i = 0; i + kLanes <= count; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) sums[lane] += words[i + lane];
  }
  uint64_t total = 0;
  for (uint64_t sum : sums) total += sum;
  return total;
}

}  // namespace

ReadBandwidthBuffer::ReadBandwidthBuffer(ThreadPool& pool, int64_t bytes)
    : bytes_(bytes / kSliceAlignment * kSliceAlignment) {
  FOLIO_CHECK(bytes >= (int64_t{1} << 20), "read bandwidth over {} bytes", bytes);
  const auto num_words = static_cast<size_t>(bytes_) / sizeof(uint64_t);
  words_.reset(new uint64_t[num_words]);
  // Nonzero bytes, so no page is the shared zero page; each thread touches its own part.
  const int threads = pool.num_threads();
  const int64_t part = bytes_ / threads / kSliceAlignment * kSliceAlignment;
  pool.parallel_for(threads, [&](int64_t task, int) {
    const int64_t begin = task * part;
    const int64_t end = task + 1 == threads ? bytes_ : begin + part;
    std::memset(reinterpret_cast<std::byte*>(words_.get()) + begin, 1,
                static_cast<size_t>(end - begin));
  });
}

double ReadBandwidthBuffer::read_pass(ThreadPool& pool) {
  const int threads = pool.num_threads();
  const int64_t slice = bytes_ / threads / kSliceAlignment * kSliceAlignment;
  const auto words_per_slice = slice / static_cast<int64_t>(sizeof(uint64_t));
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  const auto start = std::chrono::steady_clock::now();
  pool.parallel_for(threads, [&](int64_t task, int) {
    sums[static_cast<size_t>(task)] =
        sum_words(words_.get() + task * words_per_slice, words_per_slice);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The sums are used, so the reads cannot be optimized away.
  volatile uint64_t sink = 0;
  for (uint64_t sum : sums) sink = sink + sum;
  return static_cast<double>(slice) * threads / seconds;
}

double measure_read_bandwidth(ThreadPool& pool, const ReadBandwidthOptions& options) {
  FOLIO_CHECK(options.buffer_bytes >= (int64_t{1} << 20) && options.passes >= 1,
              "read bandwidth over {} bytes in {} passes", options.buffer_bytes, options.passes);
  ReadBandwidthBuffer buffer(pool, options.buffer_bytes);
  double best = 0;
  for (int pass = 0; pass < options.passes; ++pass) best = std::max(best, buffer.read_pass(pool));
  return best;
}

}  // namespace folio
