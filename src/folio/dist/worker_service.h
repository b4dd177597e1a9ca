// WorkerService: the worker's side of the control plane, the gRPC service `Worker` of
// worker.proto served on HOST:PORT. It answers the coordinator's handshake (Hello) with what
// this worker declares (incarnation, memory budget, threads, host name, model hash) and answers
// Ping at once, for link latency measurement. With a model file (model_path) it runs one
// pipeline stage (pipeline_stage.h): PrepareStage opens the model on first use and builds the
// stage (replacing any earlier one) after checking the coordinator's model hash and that the
// stage's weights and pool fit the declared memory budget; RunStage runs one step of it;
// CopyBlocks (protocol revision 4) copies blocks in its KV cache (copy-on-write of forked
// sequences), fenced like RunStage. Without a model file but with a weight cache
// (cache_directory, protocol revision 6), OfferShard checks a stage's manifest against the cache
// (verifying every entry it holds) and answers the hashes it lacks, PushTensors stores the
// streamed tensors after checking each one's hash, and PrepareStage builds the stage of the
// offered shard from the cache (shard_manifest.h).
//
// Recovery (protocol revision 3): the worker holds an epoch (0 at start), raised by PrepareStage
// and Fence and never lowered; it refuses a stage call of an older epoch ("stale epoch N, this
// worker is at epoch M"), a RunStage of a newer one, and a step for a stage prepared in another
// epoch than its current one unless Fence carried the stage over. Watch streams a beat every
// interval the coordinator asks for, until the call is cancelled or the service shuts down.
// Shutdown answers, then calls on_shutdown_request (the `folio worker` process exits).
//
// Terms:
// - Incarnation: a random non-zero 64-bit number drawn when the service starts. A worker that
//   restarts at the same address is another incarnation; the coordinator tells them apart by it.
// - Protocol version: a Hello whose protocol_version differs from this service's is refused
//   with FAILED_PRECONDITION and a message naming both versions (docs/design/dist.md).
//
// gRPC stays behind this header (the implementation is private to folio_dist), so users of the
// layer need neither gRPC's headers nor its build flags.
//
// Thread safety: the handlers run on gRPC's threads; Hello and Ping read only what start()
// fixed, the stage calls (PrepareStage, RunStage, CopyBlocks, Fence) are serialized by a mutex (one
// stage, one step at a time); Watch reads the epoch from an atomic, so beats never wait behind a
// step. OfferShard and PushTensors read and write the weight cache outside that mutex (the cache
// is safe from any thread) and take it only to record or copy the offered manifest.
// epoch(), shutdown_requested() and inject_unavailable() may be called from any thread;
// shutdown() and the destructor from any one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "folio/base/result.h"
#include "folio/dist/worker_protocol.h"

namespace folio::dist {

struct WorkerServiceOptions {
  // HOST:PORT to listen on; port 0 picks a free port (see WorkerService::port()).
  std::string listen_address = "127.0.0.1:0";
  // Tests set another to check the refusal; production leaves the default.
  uint32_t protocol_version = kProtocolVersion;
  // What the worker declares it may use (bytes) and its compute threads.
  uint64_t memory_budget_bytes = 0;
  uint32_t threads = 1;
  // The model this worker holds; empty hash when none.
  ModelIdentity model;
  // The model's file, opened at the first PrepareStage (the handshake needs only its hash);
  // empty: the worker runs no stages.
  std::string model_path;
  // Without a model file: the weight cache's directory (weight_cache.h). The coordinator offers
  // each stage's manifest (OfferShard), streams the tensors the cache lacks (PushTensors) and
  // the stage is built from the cache alone (protocol revision 6). Ignored with model_path.
  std::string cache_directory;
  // The shortest interval between keepalive pings the service accepts from a coordinator
  // without data in flight (gRPC's default, 5 min, would make it hang up on the coordinator's
  // 10 s keepalive with "too many pings").
  std::chrono::milliseconds min_keepalive_interval{5000};
  // Called (once, on a gRPC thread, after the first Shutdown call is answered or about to be)
  // when a coordinator tells this worker to exit; must not block. `folio worker` raises SIGTERM
  // to itself, so its main thread shuts the service down with the usual grace. Empty: the
  // request is only recorded (shutdown_requested()).
  std::function<void()> on_shutdown_request;
};

class WorkerService {
 public:
  // Starts serving. kInvalidArgument for a malformed address, kUnavailable when it cannot be
  // bound (in use, not an address of this machine) or when the cache directory cannot be
  // created or written.
  static Result<std::unique_ptr<WorkerService>> start(WorkerServiceOptions options);

  ~WorkerService();
  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  // The port bound (the chosen one when the options asked for port 0).
  int port() const;
  // "HOST:PORT" with the bound port, for clients on this machine.
  const std::string& address() const;
  uint64_t incarnation() const;
  // The epoch the worker is at (0 until a coordinator prepares a stage or fences it).
  uint64_t epoch() const;
  // Whether a coordinator called Shutdown.
  bool shutdown_requested() const;
  // Fault injection for tests: the next `calls` RunStage or CopyBlocks calls answer UNAVAILABLE
  // without running (a transient failure of a worker that is fine).
  void inject_unavailable(int calls);

  // Stops accepting calls; calls in flight get until `grace` to finish, then are cancelled.
  // Idempotent; the destructor calls it with no grace.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct State;
  explicit WorkerService(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace folio::dist
