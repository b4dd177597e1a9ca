// The control plane over loopback: a WorkerService in this process and a WorkerClient, to
// compare with the collectives' round trip in the same run (BM_PingPong in
// collectives_bench.cc).
//
//   BM_WorkerHandshake: WorkerClient::connect per iteration: a new channel (TCP connection,
//     HTTP/2 set-up) and the Hello call; what joining a worker costs on the wire.
//   BM_WorkerPing: one Ping round trip on a connected client (the link latency the coordinator
//     measures at join).
//   BM_WorkerPingPayload/N: a Ping carrying N bytes each way: the gRPC counterpart of the gloo
//     send/recv round trip (BM_PingPong/N in collectives_bench.cc), so the two ways to move a
//     pipeline's activations compare at the same sizes in one run (2 KiB: a decode token's
//     residual stream of hidden 512; 256 KiB: a 128-token prefill's).
#include <benchmark/benchmark.h>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"

namespace folio::dist {
namespace {

WorkerService& service() {
  // The service logs each Hello at info; a line per iteration would be measured too.
  log::set_log_level("warn").ignore();
  static std::unique_ptr<WorkerService> worker = WorkerService::start({}).value();
  return *worker;
}

void BM_WorkerHandshake(benchmark::State& state) {
  for (auto _ : state) {
    auto client = WorkerClient::connect(service().address(), {});
    FOLIO_CHECK(client.ok(), "{}", client.status());
    benchmark::DoNotOptimize(client);
  }
}

void BM_WorkerPing(benchmark::State& state) {
  auto client = WorkerClient::connect(service().address(), {}).value();
  for (auto _ : state) {
    auto round_trip = client->ping();
    FOLIO_CHECK(round_trip.ok(), "{}", round_trip.status());
  }
}

void BM_WorkerPingPayload(benchmark::State& state) {
  auto client = WorkerClient::connect(service().address(), {}).value();
  for (auto _ : state) {
    auto round_trip = client->ping(state.range(0));
    FOLIO_CHECK(round_trip.ok(), "{}", round_trip.status());
  }
  state.SetBytesProcessed(int64_t{2} * state.range(0) * static_cast<int64_t>(state.iterations()));
}

BENCHMARK(BM_WorkerHandshake)->UseRealTime()->MeasureProcessCPUTime();
BENCHMARK(BM_WorkerPing)->UseRealTime()->MeasureProcessCPUTime();
BENCHMARK(BM_WorkerPingPayload)
    ->Arg(2 << 10)
    ->Arg(256 << 10)
    ->Arg(4 << 20)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

}  // namespace
}  // namespace folio::dist
