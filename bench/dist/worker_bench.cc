// The control plane over loopback: a WorkerService in this process and a WorkerClient, to
// compare with the collectives' round trip in the same run (BM_PingPong in
// collectives_bench.cc).
//
//   BM_WorkerHandshake: WorkerClient::connect per iteration: a new channel (TCP connection,
//     HTTP/2 set-up) and the Hello call; what joining a worker costs on the wire.
//   BM_WorkerPing: one Ping round trip on a connected client (the link latency the coordinator
//     measures at join).
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

BENCHMARK(BM_WorkerHandshake)->UseRealTime()->MeasureProcessCPUTime();
BENCHMARK(BM_WorkerPing)->UseRealTime()->MeasureProcessCPUTime();

}  // namespace
}  // namespace folio::dist
