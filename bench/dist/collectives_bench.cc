// Collectives of a 2-rank group: gloo over loopback TCP against the in-process backend (shared
// memory between threads), measured in the same run. Report gloo / in-process time ratios.
//
//   BM_AllReduceSum/<backend>/<floats>: one all_reduce_sum of 768 (a small model's hidden
//     row), 4096 (a 7B model's) and 1M floats per iteration.
//   BM_AllGather/<backend>/<floats>: all_gather of the same rows, for comparison.
//   BM_SendRecv/<backend>/3072: rank 0 sends 768 f32 (3072 bytes, one token's activation row
//     at a pipeline cut) to rank 1 each iteration.
//   BM_PingPong/<backend>/3072: the same bytes there and back: one round trip per iteration.
//
// Rank 0 is the benchmark's thread; rank 1 is a thread that runs the same number of calls
// (state.max_iterations, plus the warm-up). "Time" is wall-clock per call (UseRealTime);
// "CPU" is the whole process's CPU time per call (MeasureProcessCPUTime: both ranks, gloo's
// I/O threads, the kernel's loopback work charged to them). On a loaded machine of 2 shared
// cores the wall-clock of gloo's calls is mostly waiting to be scheduled (each message wakes
// several threads), so the CPU column is the steadier measure of cost.
#include <benchmark/benchmark.h>

#include <functional>
#include <thread>
#include <vector>

#include "folio/base/check.h"
#include "testing/collective_groups.h"

namespace folio::dist {
namespace {

using folio::testing::Members;
using namespace std::chrono_literals;

enum class Backend { kInProcess, kGloo };

constexpr int kWarmupCalls = 20;

Members& group(Backend backend) {
  switch (backend) {
    case Backend::kInProcess: {
      static Members members = make_in_process_group(2, 60s).value();
      return members;
    }
    case Backend::kGloo: {
      static folio::testing::TemporaryDirectory directory;
      static Members members =
          folio::testing::make_gloo_group_in_threads(directory.path(), 2, 60s, "bench").value();
      return members;
    }
  }
  FOLIO_CHECK(false, "unknown backend");
  return group(Backend::kInProcess);
}

// Runs call(member, rank) on both ranks: rank 1 on a thread of its own.
void run_pair(benchmark::State& state, Backend backend,
              const std::function<Status(Collectives&, int)>& call) {
  Members& members = group(backend);
  const int64_t calls = state.max_iterations + kWarmupCalls;
  std::thread peer([&] {
    for (int64_t i = 0; i < calls; ++i) {
      const Status status = call(*members[1], 1);
      FOLIO_CHECK(status.ok(), "rank 1: {}", status.to_string());
    }
  });
  for (int i = 0; i < kWarmupCalls; ++i) {
    const Status status = call(*members[0], 0);
    FOLIO_CHECK(status.ok(), "rank 0: {}", status.to_string());
  }
  for (auto _ : state) {
    const Status status = call(*members[0], 0);
    FOLIO_CHECK(status.ok(), "rank 0: {}", status.to_string());
  }
  peer.join();
}

void BM_AllReduceSum(benchmark::State& state, Backend backend) {
  const auto count = static_cast<size_t>(state.range(0));
  // Zeros stay zeros however often they are summed (no overflow, no subnormal slow paths).
  std::vector<std::vector<float>> values(2, std::vector<float>(count, 0.0f));
  run_pair(state, backend,
           [&](Collectives& member, int rank) { return member.all_reduce_sum(values[rank]); });
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(count * sizeof(float)));
}

// For comparison with all_reduce_sum: gathering every rank's row (which a rank-order sum could
// follow) moves the same bytes on 2 ranks in one exchange instead of the ring's four steps.
void BM_AllGather(benchmark::State& state, Backend backend) {
  const auto count = static_cast<size_t>(state.range(0));
  std::vector<std::vector<float>> inputs(2, std::vector<float>(count, 0.0f));
  std::vector<std::vector<float>> outputs(2, std::vector<float>(2 * count, 0.0f));
  run_pair(state, backend, [&](Collectives& member, int rank) {
    return member.all_gather(std::span<const float>(inputs[rank]), outputs[rank]);
  });
}

void BM_SendRecv(benchmark::State& state, Backend backend) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<std::vector<std::byte>> buffers(2, std::vector<std::byte>(bytes));
  run_pair(state, backend, [&](Collectives& member, int rank) {
    return rank == 0 ? member.send(buffers[0], 1) : member.recv(buffers[1], 0);
  });
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}

void BM_PingPong(benchmark::State& state, Backend backend) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<std::vector<std::byte>> buffers(2, std::vector<std::byte>(bytes));
  run_pair(state, backend, [&](Collectives& member, int rank) {
    if (rank == 0) {
      FOLIO_RETURN_IF_ERROR(member.send(buffers[0], 1));
      return member.recv(buffers[0], 1);
    }
    FOLIO_RETURN_IF_ERROR(member.recv(buffers[1], 0));
    return member.send(buffers[1], 0);
  });
}

void all_reduce_sizes(benchmark::internal::Benchmark* benchmark) {
  benchmark->Arg(768)->Arg(4096)->Arg(1 << 20)->MeasureProcessCPUTime()->UseRealTime()->Unit(
      benchmark::kMicrosecond);
}
void message_size(benchmark::internal::Benchmark* benchmark) {
  // 3 KiB (a decode token's residual stream of hidden 768), and the sizes BM_WorkerPingPayload
  // moves over gRPC (worker_bench.cc).
  benchmark->Arg(768 * 4)
      ->Arg(2 << 10)
      ->Arg(256 << 10)
      ->Arg(4 << 20)
      ->MeasureProcessCPUTime()
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_AllReduceSum, in_process, Backend::kInProcess)->Apply(all_reduce_sizes);
BENCHMARK_CAPTURE(BM_AllReduceSum, gloo, Backend::kGloo)->Apply(all_reduce_sizes);
BENCHMARK_CAPTURE(BM_AllGather, in_process, Backend::kInProcess)->Apply(all_reduce_sizes);
BENCHMARK_CAPTURE(BM_AllGather, gloo, Backend::kGloo)->Apply(all_reduce_sizes);
BENCHMARK_CAPTURE(BM_SendRecv, in_process, Backend::kInProcess)->Apply(message_size);
BENCHMARK_CAPTURE(BM_SendRecv, gloo, Backend::kGloo)->Apply(message_size);
BENCHMARK_CAPTURE(BM_PingPong, in_process, Backend::kInProcess)->Apply(message_size);
BENCHMARK_CAPTURE(BM_PingPong, gloo, Backend::kGloo)->Apply(message_size);

}  // namespace
}  // namespace folio::dist

BENCHMARK_MAIN();
