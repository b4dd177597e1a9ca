// WorkerClient: the coordinator's view of one worker. connect() opens a gRPC channel to the
// worker's HOST:PORT and does the handshake (Hello); the client then holds what the worker
// declared (WorkerInfo) and can measure the link's latency with Pings.
//
// Deadlines: gRPC sets none by default, so every call here carries one: the handshake
// `connect_timeout` (it waits for the connection to come up until then), every later call
// `call_timeout` (it fails at once when the connection is lost: a worker that is gone is not
// waited for).
//
// Errors: gRPC status codes become Status values that name the worker's address and say what
// to do (docs/design/dist.md, "Error mapping"):
// - nothing listening / no route:   kUnavailable "worker A is unreachable (connection refused)
//                                   after 2000 ms: ..."
// - another protocol revision:       kFailedPrecondition "worker A speaks protocol v2, this
//                                   coordinator v1: ..."
// - another major version (the service is not there): kFailedPrecondition
// - another model:                   kFailedPrecondition "worker A has model hash X, the
//                                   coordinator's model is Y: ..."
// - no answer in time:               kDeadlineExceeded
// - connection lost after the handshake: kUnavailable
// A worker that holds no model is accepted (it will be sent its shard: issue 15, slice 5).
//
// Keepalive: the channel pings the worker every `keepalive_time` even without calls in flight
// and drops the connection when an answer takes longer than `keepalive_timeout`, so a worker
// whose machine vanished is noticed without waiting for the next call's deadline.
//
// Thread safety: ping() and measure_latency() may be called from several threads at once
// (gRPC channels and stubs are thread-safe); info() is fixed after connect().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "folio/base/result.h"
#include "folio/dist/worker_protocol.h"

namespace folio::dist {

struct WorkerClientOptions {
  // Names this coordinator in the worker's log.
  std::string coordinator_id = "coordinator";
  // Tests set another to check the refusal; production leaves the default.
  uint32_t protocol_version = kProtocolVersion;
  // Bounds the handshake, connecting included.
  std::chrono::milliseconds connect_timeout{2000};
  // Bounds every call after the handshake.
  std::chrono::milliseconds call_timeout{2000};
  std::chrono::milliseconds keepalive_time{10000};
  std::chrono::milliseconds keepalive_timeout{5000};
};

// What the worker declared at the handshake.
struct WorkerInfo {
  std::string address;  // as given to connect()
  uint32_t protocol_version = 0;
  uint64_t incarnation = 0;
  uint64_t memory_budget_bytes = 0;
  uint32_t threads = 0;
  std::string host_name;
  ModelIdentity model;  // empty hash: the worker has no model yet
};

// Round trips of `count` Pings, one after another.
struct LinkLatency {
  int count = 0;
  std::chrono::nanoseconds median{0};
  std::chrono::nanoseconds min{0};
  std::chrono::nanoseconds max{0};
};

class WorkerClient {
 public:
  // Connects to `address` (HOST:PORT) and does the handshake, comparing the worker's model with
  // `model` when both are known. Errors as listed above.
  static Result<std::unique_ptr<WorkerClient>> connect(const std::string& address,
                                                       const ModelIdentity& model,
                                                       WorkerClientOptions options = {});

  ~WorkerClient();
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  const WorkerInfo& info() const;

  // One Ping round trip. kFailedPrecondition when the worker answering is another incarnation
  // than the one of the handshake (it restarted: what the coordinator knew of it is stale).
  Result<std::chrono::nanoseconds> ping();

  // `count` Pings one after another. Requires: count > 0.
  Result<LinkLatency> measure_latency(int count);

 private:
  struct State;
  explicit WorkerClient(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace folio::dist
