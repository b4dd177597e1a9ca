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
// Epochs (protocol revision 3, docs/design/dist.md "Recovery"): every stage call carries the
// coordinator's epoch, and the replies carry it back with the worker's incarnation
// (StageStepResult, PreparedStage) for the coordinator to check. fence() moves a surviving
// worker to a new epoch keeping its stage; watch() opens its lease (a stream of beats);
// shutdown() tells a superseded worker to exit. abandon() cancels the call in flight and fails
// every later one at once: what the lease monitor does to a worker it declared lost, so that a
// stopped worker is given up on after its lease, not after the step's deadline.
//
// Thread safety: ping(), measure_latency(), shutdown() and abandon() may be called from several
// threads at once (gRPC channels and stubs are thread-safe); info() and options() are fixed
// after connect(); the stage calls (prepare_stage, run_stage, copy_blocks, fence) from one thread
// at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/shard_manifest.h"
#include "folio/dist/weight_cache.h"
#include "folio/dist/worker_protocol.h"
#include "folio/ir/step_batch.h"
#include "folio/kv/kv_types.h"

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
  // Bounds PrepareStage (the worker opens its model and builds the stage) and each RunStage.
  std::chrono::milliseconds prepare_timeout{60000};
  std::chrono::milliseconds step_timeout{30000};
  // The weight cache's calls (offer_shard, push_tensors) move or read a shard's bytes: each is
  // bounded by prepare_timeout plus its bytes at this rate, the slowest link or disk a transfer
  // may meet (a 4 GB shard gets 60 s + about 76 s at the default 50 MiB/s).
  int64_t min_transfer_bytes_per_second = int64_t{50} << 20;
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

// Round trips of `count` Pings carrying `payload_bytes` each way, one after another: the link's
// bandwidth as a coordinator sees it for activations (serialization and gRPC included).
struct LinkBandwidth {
  int count = 0;
  int64_t payload_bytes = 0;  // each way
  std::chrono::nanoseconds median{0};
  // 2 * payload_bytes over the median round trip less the empty Ping's median (the latency);
  // the whole round trip when that is not shorter.
  double bytes_per_second = 0;
};

// A link as measured when a worker joins: the empty Ping's round trip and the bandwidth of
// kLinkProbeBytes each way.
struct WorkerLink {
  LinkLatency latency;
  LinkBandwidth bandwidth;
  // Seconds to move `bytes` one way: half the empty round trip plus bytes at the bandwidth.
  double transfer_seconds(int64_t bytes) const;
};
inline constexpr int64_t kLinkProbeBytes = int64_t{1} << 20;

// The epoch a coordinator starts in; a worker starts at epoch 0, so the first PrepareStage moves
// it there.
inline constexpr uint64_t kFirstEpoch = 1;

// What a worker answered to PrepareStage.
struct PreparedStage {
  uint64_t stage_id = 0;
  int64_t hidden_input_size = 0;   // 0: the first stage (it embeds token ids)
  int64_t hidden_output_size = 0;  // 0: the last stage (it returns logits)
  int32_t vocab_size = 0;          // logits columns, last stage only
  int64_t weight_bytes = 0;
  int64_t kv_cache_bytes = 0;
  uint64_t epoch = 0;        // the epoch the worker prepared it in
  uint64_t incarnation = 0;  // the worker's
};

// One beat of a worker's lease (worker.proto Beat).
struct WorkerBeat {
  uint64_t epoch = 0;  // the worker's epoch when it sent the beat
  uint64_t incarnation = 0;
  uint64_t sequence = 0;  // 1, 2, ... per stream
};

// An open Watch stream (WorkerClient::watch): beats arrive in the background and poll() hands
// over those that came. Destroying it cancels the call.
// Thread safety: none; one thread at a time (the lease monitor's).
class WorkerWatch {
 public:
  ~WorkerWatch();
  WorkerWatch(const WorkerWatch&) = delete;
  WorkerWatch& operator=(const WorkerWatch&) = delete;

  // Appends the beats that arrived since the last call to `beats`, without waiting. OK while
  // the stream is open; once it ended (the worker is gone, it refused, the call was cancelled),
  // the error that ended it, naming the worker, on this and every later call.
  Status poll(std::vector<WorkerBeat>& beats);

 private:
  friend class WorkerClient;
  struct State;
  explicit WorkerWatch(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// One step's answer from a stage, with the sizes of both messages on the wire.
struct StageStepResult {
  std::vector<float> hidden_out;  // f32 [tokens, hidden_output_size]
  std::vector<float> logits;      // f32 [num_rows, vocab_size]
  int32_t num_rows = 0;
  int32_t vocab_size = 0;
  int64_t request_bytes = 0;
  int64_t reply_bytes = 0;
  uint64_t epoch = 0;        // the reply's: the coordinator drops a reply of another epoch
  uint64_t incarnation = 0;  // the worker's, as the reply states it
  // A tensor-parallel rank's step: time inside its collectives and the f32 bytes it reduced.
  int64_t communication_ns = 0;
  int64_t reduced_bytes = 0;
  // A KV-parallel member's step: the bytes its all_gathers received from the other members.
  int64_t gathered_bytes = 0;
};

// A worker's answer to a shard manifest (worker.proto OfferShardReply).
struct ShardOffer {
  std::vector<ContentHash> missing;  // in the manifest's order
  int64_t cached_bytes = 0;
  int64_t missing_bytes = 0;
  int32_t corrupted_entries = 0;
};

// One tensor to stream: the hash it is sent under and its bytes.
struct TensorUpload {
  ContentHash hash;
  std::span<const std::byte> bytes;
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
  const WorkerClientOptions& options() const;

  // One Ping round trip. kFailedPrecondition when the worker answering is another incarnation
  // than the one of the handshake (it restarted: what the coordinator knew of it is stale).
  Result<std::chrono::nanoseconds> ping();

  // `count` Pings one after another. Requires: count > 0.
  Result<LinkLatency> measure_latency(int count);
  // One Ping round trip carrying `payload_bytes` to the worker and as many back.
  // kInvalidArgument above kMaxPingPayloadBytes; the errors of ping() otherwise.
  Result<std::chrono::nanoseconds> ping(int64_t payload_bytes);
  // `count` Pings of `payload_bytes` each way after `count` empty ones (the latency to take
  // off). Requires: count > 0, 0 < payload_bytes <= kMaxPingPayloadBytes.
  Result<LinkBandwidth> measure_bandwidth(int64_t payload_bytes, int count);
  // measure_bandwidth(kLinkProbeBytes, count), with its latency: what joining measures.
  Result<WorkerLink> measure_link(int count = 3);

  // Prepares `spec` on the worker, which must hold the model of `model_hash` (empty: not
  // checked). Errors name the worker: kFailedPrecondition (no model, another model, a model it
  // cannot open), kResourceExhausted (the stage does not fit its memory budget),
  // kInvalidArgument (a malformed spec), and the call errors above.
  // The worker moves to `epoch` (refused, kFailedPrecondition "stale epoch", when it is at a
  // newer one).
  Result<PreparedStage> prepare_stage(const PipelineStageSpec& spec, const std::string& model_hash,
                                      uint64_t epoch = kFirstEpoch);
  // Runs one step of stage `stage_id` in `epoch` with `hidden_in` (empty for the first stage)
  // and fills `result` (its buffers are reused). kFailedPrecondition when the worker no longer
  // holds the stage (it restarted or prepared another) or is at another epoch than `epoch`.
  Status run_stage(uint64_t stage_id, const ir::StepBatch& step, std::span<const float> hidden_in,
                   StageStepResult& result, uint64_t epoch = kFirstEpoch);
  // Copies KV blocks in stage `stage_id`'s cache (copy-on-write, worker.proto CopyBlocks) in
  // `epoch`; fenced and refused like run_stage(), and kInvalidArgument for a block id outside
  // the stage's cache or a batch that breaks kv/block_copier.h's rule. Returns the epoch and the
  // incarnation the reply states, for the coordinator to check.
  Result<std::pair<uint64_t, uint64_t>> copy_blocks(uint64_t stage_id,
                                                    std::span<const kv::BlockCopy> copies,
                                                    uint64_t epoch = kFirstEpoch);
  // Moves the worker to `epoch`, keeping stage `stage_id` (0: none) and its KV cache.
  // kFailedPrecondition when the worker is at a newer epoch or no longer holds the stage; the
  // call errors above. Returns the incarnation that answered.
  Result<uint64_t> fence(uint64_t epoch, uint64_t stage_id);
  // Opens the worker's lease: a beat every `interval`. Returns at once (the stream opens in the
  // background; a worker that is gone shows as an error of the first poll()).
  Result<std::unique_ptr<WorkerWatch>> watch(uint64_t epoch, std::chrono::milliseconds interval);
  // Tells the worker process to exit once it has answered; `reason` goes to its log.
  Status shutdown(uint64_t epoch, const std::string& reason);
  // The weight cache (protocol revision 6), for a worker without the model file (its
  // info().model.hash is empty); both calls are bounded by prepare_timeout plus their bytes at
  // min_transfer_bytes_per_second. offer_shard() sends the stage's manifest; the worker verifies
  // what its cache holds and answers what it lacks (kFailedPrecondition: the worker has no cache
  // or reads a model file; kInvalidArgument: a manifest it finds malformed). push_tensors()
  // streams `tensors` (each labelled with the hash the manifest gave it) in chunks of at most
  // `chunk_bytes`, one client-streaming call bounded as above; the worker hashes each
  // tensor as it arrives and refuses, storing nothing of that tensor, bytes that do not hash to
  // their label (kDataLoss naming the tensor). Returns the bytes the worker stored.
  // `pool_bytes`: the pool the stage will be prepared with (kResourceExhausted when the worker's
  // budget cannot hold it and the shard's weights).
  Result<ShardOffer> offer_shard(const ShardManifest& manifest, uint64_t epoch = kFirstEpoch,
                                 int64_t pool_bytes = 0);
  Result<int64_t> push_tensors(std::span<const TensorUpload> tensors,
                               int64_t chunk_bytes = int64_t{1} << 20);

  // Cancels the call in flight, if any, and makes every later call fail at once (kCancelled,
  // "abandoned"): the worker was declared lost. Irreversible; from any thread.
  void abandon(const std::string& reason);
  bool abandoned() const;

 private:
  struct State;
  explicit WorkerClient(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace folio::dist
