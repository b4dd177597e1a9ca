#include "folio/dist/worker_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "folio/base/check.h"
#include "folio/base/mutex.h"
#include "folio/dist/worker.grpc.pb.h"

namespace folio::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::system_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

// gRPC's reason for a failed connection, shortened to what a user recognises.
std::string connection_reason(const grpc::Status& status) {
  const std::string& message = status.error_message();
  if (message.find("Connection refused") != std::string::npos) return "connection refused";
  if (message.find("No route to host") != std::string::npos) return "no route to host";
  if (message.find("Network is unreachable") != std::string::npos) return "network unreachable";
  if (message.find("DNS resolution failed") != std::string::npos) {
    return "its host name does not resolve";
  }
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return "no answer";
  return message;
}

// A call that failed after the handshake (or a handshake that reached the worker): the gRPC
// code becomes the Status code, the message says which worker and what it means.
Status call_status(const std::string& address, std::string_view call, const grpc::Status& status,
                   std::chrono::milliseconds timeout) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return Status();
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return deadline_exceeded(
          "worker {} did not answer {} within {} ms: it is stopped, overloaded or the link is "
          "down",
          address, call, timeout.count());
    case grpc::StatusCode::UNAVAILABLE:
      return unavailable(
          "worker {} is gone ({}) during {}: it exited or its machine is "
          "unreachable; restart it and connect again",
          address, connection_reason(status), call);
    case grpc::StatusCode::UNIMPLEMENTED:
      return failed_precondition(
          "worker {} does not serve folio.dist.v1.Worker.{}: it runs another major version of "
          "folio (or is not a folio worker); run the same folio version on both sides",
          address, call);
    case grpc::StatusCode::FAILED_PRECONDITION:
      return failed_precondition("worker {} refused {}: {}", address, call, status.error_message());
    case grpc::StatusCode::CANCELLED:
      return cancelled("{} to worker {} was cancelled: {}", call, address, status.error_message());
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return resource_exhausted("worker {} is out of resources for {}: {}", address, call,
                                status.error_message());
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return invalid_argument("worker {} rejected {}: {}", address, call, status.error_message());
    case grpc::StatusCode::NOT_FOUND:
      return not_found("worker {}: {}: {}", address, call, status.error_message());
    case grpc::StatusCode::ALREADY_EXISTS:
      return already_exists("worker {}: {}: {}", address, call, status.error_message());
    case grpc::StatusCode::DATA_LOSS:
      return data_loss("worker {}: {}: {}", address, call, status.error_message());
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::DO_NOT_USE:
      break;
  }
  return internal_error("worker {}: {} failed: gRPC {}: {}", address, call,
                        static_cast<int>(status.error_code()), status.error_message());
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address,
                                            const WorkerClientOptions& options) {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options.keepalive_time.count()));
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                   static_cast<int>(options.keepalive_timeout.count()));
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  arguments.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A worker that is still starting is retried within the handshake's deadline, not after
  // gRPC's default first backoff of 1 s.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Activations and logits of large steps exceed gRPC's default 4 MiB per message.
  arguments.SetMaxReceiveMessageSize(-1);
  arguments.SetMaxSendMessageSize(-1);
  // Each client its own connection: two workers' clients must not share (and lose) one.
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments);
}

}  // namespace

struct WorkerClient::State {
  WorkerInfo info;
  WorkerClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Worker::Stub> stub;
  std::atomic<uint64_t> next_sequence{1};
  // The stage call in flight (its context lives on the calling thread's stack between
  // begin_call and end_call), so that abandon() can cancel it from another thread.
  mutable Mutex mutex;
  grpc::ClientContext* call_in_flight FOLIO_GUARDED_BY(mutex) = nullptr;
  bool abandoned FOLIO_GUARDED_BY(mutex) = false;
  std::string abandon_reason FOLIO_GUARDED_BY(mutex);

  // Registers `context` as the call in flight: an error when the client was abandoned (the call
  // must not start).
  Status begin_call(grpc::ClientContext* context, std::string_view call) {
    const MutexLock lock(mutex);
    if (abandoned) return abandoned_status(call);
    call_in_flight = context;
    return Status();
  }
  void end_call() {
    const MutexLock lock(mutex);
    call_in_flight = nullptr;
  }
  Status abandoned_status(std::string_view call) const FOLIO_REQUIRES(mutex) {
    return cancelled("{} to worker {} was not answered: the worker was given up on ({})", call,
                     info.address, abandon_reason);
  }
  // A call's status: the abandonment, when that is why it ended, or call_status's.
  Status finish_call(std::string_view call, const grpc::Status& status,
                     std::chrono::milliseconds timeout) {
    end_call();
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      const MutexLock lock(mutex);
      if (abandoned) return abandoned_status(call);
    }
    return call_status(info.address, call, status, timeout);
  }
};

// Watch's stream on a completion queue of its own, polled without waiting. Tags name the
// operation that completed; at most one is pending at a time.
struct WorkerWatch::State {
  enum Tag : intptr_t { kStart = 1, kRead = 2, kFinish = 3 };
  std::string address;
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncReader<v1::Beat>> reader;
  v1::Beat beat;
  grpc::Status finish_status;
  bool finished = false;  // Finish completed: nothing is pending on the queue
  Status error;           // why the stream ended, once finished

  static void* tag(Tag value) { return reinterpret_cast<void*>(value); }

  // Handles one completed operation and starts the next one.
  void handle(Tag completed, bool ok, std::vector<WorkerBeat>* beats) {
    switch (completed) {
      case kStart:
      case kRead:
        if (!ok) {
          reader->Finish(&finish_status, tag(kFinish));
          return;
        }
        if (completed == kRead && beats != nullptr) {
          beats->push_back(WorkerBeat{.epoch = beat.epoch(),
                                      .incarnation = beat.worker_incarnation(),
                                      .sequence = beat.sequence()});
        }
        reader->Read(&beat, tag(kRead));
        return;
      case kFinish:
        finished = true;
        error = finish_status.ok()
                    ? unavailable("worker {} ended its lease stream (Watch)", address)
                    : call_status(address, "Watch", finish_status, std::chrono::milliseconds(0));
        return;
    }
  }
};

Result<std::unique_ptr<WorkerClient>> WorkerClient::connect(const std::string& address,
                                                            const ModelIdentity& model,
                                                            WorkerClientOptions options) {
  auto state = std::make_unique<State>();
  state->options = options;
  state->info.address = address;
  state->channel = make_channel(address, options);
  state->stub = v1::Worker::NewStub(state->channel);

  v1::HelloRequest request;
  request.set_protocol_version(options.protocol_version);
  request.set_coordinator_id(options.coordinator_id);
  request.set_model_hash(model.hash);
  request.set_model_name(model.name);
  v1::HelloReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(options.connect_timeout));
  // Wait for the connection until the deadline: the worker may still be starting.
  context.set_wait_for_ready(true);
  const grpc::Status status = state->stub->Hello(&context, request, &reply);
  if (!status.ok()) {
    const grpc_connectivity_state channel_state = state->channel->GetState(false);
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        channel_state != GRPC_CHANNEL_READY) {
      // Never connected: ask once more without waiting, for gRPC's reason (refused, no route).
      grpc::ClientContext probe_context;
      probe_context.set_deadline(deadline_after(std::chrono::milliseconds(200)));
      v1::HelloReply probe_reply;
      const grpc::Status probe = state->stub->Hello(&probe_context, request, &probe_reply);
      return unavailable(
          "worker {} is unreachable ({}) after {} ms: check that `folio worker --listen {}` "
          "runs there and that the address and port are right",
          address, connection_reason(probe), options.connect_timeout.count(), address);
    }
    return call_status(address, "Hello", status, options.connect_timeout);
  }
  if (reply.protocol_version() != options.protocol_version) {
    return failed_precondition(
        "worker {} speaks protocol v{}, this coordinator v{}: run the same folio version on the "
        "coordinator and its workers",
        address, reply.protocol_version(), options.protocol_version);
  }
  if (!model.hash.empty() && !reply.model_hash().empty() && reply.model_hash() != model.hash) {
    return failed_precondition(
        "worker {} has model hash {} ('{}'), the coordinator's model is {} ('{}'): start the "
        "worker with the same model file (-m), or without one",
        address, reply.model_hash(), reply.model_name(), model.hash, model.name);
  }
  WorkerInfo& info = state->info;
  info.protocol_version = reply.protocol_version();
  info.incarnation = reply.worker_incarnation();
  info.memory_budget_bytes = reply.memory_budget_bytes();
  info.threads = reply.threads();
  info.host_name = reply.host_name();
  info.model = ModelIdentity{.hash = reply.model_hash(), .name = reply.model_name()};
  return std::unique_ptr<WorkerClient>(new WorkerClient(std::move(state)));
}

WorkerClient::WorkerClient(std::unique_ptr<State> state) : state_(std::move(state)) {}
WorkerClient::~WorkerClient() = default;

const WorkerInfo& WorkerClient::info() const {
  return state_->info;
}

const WorkerClientOptions& WorkerClient::options() const {
  return state_->options;
}

Result<std::chrono::nanoseconds> WorkerClient::ping() {
  return ping(0);
}

Result<std::chrono::nanoseconds> WorkerClient::ping(int64_t payload_bytes) {
  if (payload_bytes < 0 || static_cast<uint64_t>(payload_bytes) > kMaxPingPayloadBytes) {
    return invalid_argument("a Ping payload of {} bytes is outside [0, {}]", payload_bytes,
                            kMaxPingPayloadBytes);
  }
  v1::PingRequest request;
  request.set_sequence(state_->next_sequence.fetch_add(1, std::memory_order_relaxed));
  request.mutable_payload()->resize(static_cast<size_t>(payload_bytes));
  request.set_reply_payload_bytes(static_cast<uint64_t>(payload_bytes));
  v1::PingReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.call_timeout));
  {
    const MutexLock lock(state_->mutex);
    if (state_->abandoned) return state_->abandoned_status("Ping");
  }
  const Clock::time_point start = Clock::now();
  const grpc::Status status = state_->stub->Ping(&context, request, &reply);
  const Clock::duration elapsed = Clock::now() - start;
  FOLIO_RETURN_IF_ERROR(
      call_status(state_->info.address, "Ping", status, state_->options.call_timeout));
  if (reply.worker_incarnation() != state_->info.incarnation) {
    return failed_precondition(
        "worker {} restarted: incarnation {:016x} answers, the handshake was with {:016x}; "
        "connect to it again",
        state_->info.address, reply.worker_incarnation(), state_->info.incarnation);
  }
  if (reply.sequence() != request.sequence()) {
    return internal_error("worker {} answered Ping {} with sequence {}", state_->info.address,
                          request.sequence(), reply.sequence());
  }
  if (static_cast<int64_t>(reply.payload().size()) != payload_bytes) {
    return internal_error("worker {} answered a Ping asking for {} bytes with {}",
                          state_->info.address, payload_bytes, reply.payload().size());
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed);
}

double WorkerLink::transfer_seconds(int64_t bytes) const {
  const double latency_seconds = std::chrono::duration<double>(latency.median).count() / 2;
  if (bandwidth.bytes_per_second <= 0) return latency_seconds;
  return latency_seconds + static_cast<double>(bytes) / bandwidth.bytes_per_second;
}

Result<WorkerLink> WorkerClient::measure_link(int count) {
  FOLIO_ASSIGN_OR_RETURN(const LinkLatency latency, measure_latency(count));
  FOLIO_ASSIGN_OR_RETURN(const LinkBandwidth bandwidth, measure_bandwidth(kLinkProbeBytes, count));
  return WorkerLink{.latency = latency, .bandwidth = bandwidth};
}

Result<LinkBandwidth> WorkerClient::measure_bandwidth(int64_t payload_bytes, int count) {
  FOLIO_CHECK(count > 0, "measure_bandwidth needs at least one Ping, got {}", count);
  FOLIO_CHECK(payload_bytes > 0 && static_cast<uint64_t>(payload_bytes) <= kMaxPingPayloadBytes,
              "a bandwidth Ping carries 1 to {} bytes, got {}", kMaxPingPayloadBytes,
              payload_bytes);
  FOLIO_ASSIGN_OR_RETURN(const LinkLatency latency, measure_latency(count));
  std::vector<std::chrono::nanoseconds> round_trips;
  round_trips.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    FOLIO_ASSIGN_OR_RETURN(std::chrono::nanoseconds round_trip, ping(payload_bytes));
    round_trips.push_back(round_trip);
  }
  std::sort(round_trips.begin(), round_trips.end());
  const std::chrono::nanoseconds median = round_trips[round_trips.size() / 2];
  const std::chrono::nanoseconds transfer =
      median > latency.median ? median - latency.median : median;
  return LinkBandwidth{
      .count = count,
      .payload_bytes = payload_bytes,
      .median = median,
      .bytes_per_second =
          2.0 * static_cast<double>(payload_bytes) /
          std::chrono::duration<double>(std::max(transfer, std::chrono::nanoseconds(1))).count()};
}

Result<LinkLatency> WorkerClient::measure_latency(int count) {
  FOLIO_CHECK(count > 0, "measure_latency needs at least one Ping, got {}", count);
  std::vector<std::chrono::nanoseconds> round_trips;
  round_trips.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    FOLIO_ASSIGN_OR_RETURN(std::chrono::nanoseconds round_trip, ping());
    round_trips.push_back(round_trip);
  }
  std::sort(round_trips.begin(), round_trips.end());
  return LinkLatency{.count = count,
                     .median = round_trips[round_trips.size() / 2],
                     .min = round_trips.front(),
                     .max = round_trips.back()};
}

Result<PreparedStage> WorkerClient::prepare_stage(const PipelineStageSpec& spec,
                                                  const std::string& model_hash, uint64_t epoch) {
  v1::PrepareStageRequest request;
  request.set_epoch(epoch);
  request.set_model_hash(model_hash);
  request.set_first_layer(static_cast<uint32_t>(spec.first_layer));
  request.set_end_layer(static_cast<uint32_t>(spec.end_layer));
  request.set_num_kv_blocks(static_cast<uint64_t>(spec.num_kv_blocks));
  request.set_block_size(static_cast<uint32_t>(spec.block_size));
  request.set_max_blocks_per_sequence(static_cast<uint32_t>(spec.max_blocks_per_sequence));
  request.set_kv_dtype(std::string(dtype_name(spec.kv_dtype)));
  request.set_first_dummy_block(static_cast<uint64_t>(spec.first_dummy_block));
  request.set_num_dummy_blocks(static_cast<uint32_t>(spec.num_dummy_blocks));
  for (int32_t bucket : spec.bucket_ladder) request.add_bucket_ladder(bucket);
  request.set_max_num_tokens(static_cast<uint32_t>(spec.max_num_tokens));
  request.set_max_sequences(static_cast<uint32_t>(spec.max_sequences));
  request.set_max_logit_rows(static_cast<uint32_t>(spec.max_logit_rows));
  request.set_use_graphs(spec.use_graphs);
  request.set_pool_bytes(static_cast<uint64_t>(spec.pool_bytes));
  // Tensor parallelism (revision 5).
  request.set_tensor_rank(static_cast<uint32_t>(spec.tensor_rank));
  request.set_tensor_ranks(static_cast<uint32_t>(spec.tensor_ranks));
  request.set_collective_store(spec.collective_store);
  request.set_collective_store_address(spec.collective_store_address);
  request.set_collective_group_id(spec.collective_group_id);
  request.set_collective_timeout_ms(static_cast<uint32_t>(spec.collective_timeout.count()));
  // KV-parallel members (revision 8).
  request.set_kv_member(static_cast<uint32_t>(spec.kv_member));
  request.set_kv_members(static_cast<uint32_t>(spec.kv_members));
  request.set_kv_tokens_per_member(static_cast<uint32_t>(spec.kv_tokens_per_member));
  v1::PrepareStageReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.prepare_timeout));
  FOLIO_RETURN_IF_ERROR(state_->begin_call(&context, "PrepareStage"));
  const grpc::Status status = state_->stub->PrepareStage(&context, request, &reply);
  FOLIO_RETURN_IF_ERROR(
      state_->finish_call("PrepareStage", status, state_->options.prepare_timeout));
  return PreparedStage{.stage_id = reply.stage_id(),
                       .hidden_input_size = reply.hidden_input_size(),
                       .hidden_output_size = reply.hidden_output_size(),
                       .vocab_size = static_cast<int32_t>(reply.vocab_size()),
                       .weight_bytes = static_cast<int64_t>(reply.weight_bytes()),
                       .kv_cache_bytes = static_cast<int64_t>(reply.kv_cache_bytes()),
                       .epoch = reply.epoch(),
                       .incarnation = reply.worker_incarnation()};
}

Status WorkerClient::run_stage(uint64_t stage_id, const ir::StepBatch& step,
                               std::span<const float> hidden_in, StageStepResult& result,
                               uint64_t epoch) {
  v1::RunStageRequest request;
  request.set_stage_id(stage_id);
  request.set_epoch(epoch);
  auto copy = [](std::span<const int32_t> values, google::protobuf::RepeatedField<int32_t>* field) {
    field->Add(values.begin(), values.end());
  };
  copy(step.token_ids, request.mutable_token_ids());
  copy(step.positions, request.mutable_positions());
  copy(step.slot_mapping, request.mutable_slot_mapping());
  copy(step.query_start, request.mutable_query_start());
  copy(step.seq_lens, request.mutable_seq_lens());
  copy(step.block_tables, request.mutable_block_tables());
  copy(step.logit_indices, request.mutable_logit_indices());
  request.set_max_blocks_per_sequence(static_cast<uint32_t>(step.max_blocks_per_sequence));
  if (!hidden_in.empty()) {
    request.set_hidden_in(reinterpret_cast<const char*>(hidden_in.data()), hidden_in.size_bytes());
  }
  v1::RunStageReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.step_timeout));
  FOLIO_RETURN_IF_ERROR(state_->begin_call(&context, "RunStage"));
  const grpc::Status status = state_->stub->RunStage(&context, request, &reply);
  FOLIO_RETURN_IF_ERROR(state_->finish_call("RunStage", status, state_->options.step_timeout));
  auto floats = [&](const std::string& bytes, std::vector<float>& out,
                    std::string_view what) -> Status {
    if (bytes.size() % sizeof(float) != 0) {
      return data_loss("worker {} sent {} of {} bytes, not whole f32 values", state_->info.address,
                       what, bytes.size());
    }
    out.resize(bytes.size() / sizeof(float));
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return Status();
  };
  FOLIO_RETURN_IF_ERROR(floats(reply.hidden_out(), result.hidden_out, "hidden_out"));
  FOLIO_RETURN_IF_ERROR(floats(reply.logits(), result.logits, "logits"));
  result.num_rows = static_cast<int32_t>(reply.num_rows());
  result.vocab_size = static_cast<int32_t>(reply.vocab_size());
  result.request_bytes = static_cast<int64_t>(request.ByteSizeLong());
  result.reply_bytes = static_cast<int64_t>(reply.ByteSizeLong());
  result.epoch = reply.epoch();
  result.incarnation = reply.worker_incarnation();
  result.communication_ns = static_cast<int64_t>(reply.communication_ns());
  result.reduced_bytes = static_cast<int64_t>(reply.reduced_bytes());
  result.gathered_bytes = static_cast<int64_t>(reply.gathered_bytes());
  return Status();
}

Result<std::pair<uint64_t, uint64_t>> WorkerClient::copy_blocks(
    uint64_t stage_id, std::span<const kv::BlockCopy> copies, uint64_t epoch) {
  v1::CopyBlocksRequest request;
  request.set_stage_id(stage_id);
  request.set_epoch(epoch);
  request.mutable_copies()->Reserve(static_cast<int>(copies.size()));
  for (const kv::BlockCopy& copy : copies) {
    FOLIO_CHECK(copy.source >= 0 && copy.destination >= 0, "KV block copy {} -> {}", copy.source,
                copy.destination);
    v1::BlockCopyPair* pair = request.add_copies();
    pair->set_source(static_cast<uint32_t>(copy.source));
    pair->set_destination(static_cast<uint32_t>(copy.destination));
  }
  v1::CopyBlocksReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.step_timeout));
  FOLIO_RETURN_IF_ERROR(state_->begin_call(&context, "CopyBlocks"));
  const grpc::Status status = state_->stub->CopyBlocks(&context, request, &reply);
  FOLIO_RETURN_IF_ERROR(state_->finish_call("CopyBlocks", status, state_->options.step_timeout));
  return std::pair<uint64_t, uint64_t>{reply.epoch(), reply.worker_incarnation()};
}

Result<uint64_t> WorkerClient::fence(uint64_t epoch, uint64_t stage_id) {
  v1::FenceRequest request;
  request.set_epoch(epoch);
  request.set_stage_id(stage_id);
  v1::FenceReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.call_timeout));
  FOLIO_RETURN_IF_ERROR(state_->begin_call(&context, "Fence"));
  const grpc::Status status = state_->stub->Fence(&context, request, &reply);
  FOLIO_RETURN_IF_ERROR(state_->finish_call("Fence", status, state_->options.call_timeout));
  if (reply.epoch() != epoch || reply.stage_id() != stage_id) {
    return internal_error(
        "worker {} answered Fence to epoch {} (stage {:016x}) with epoch {} "
        "(stage {:016x})",
        state_->info.address, epoch, stage_id, reply.epoch(), reply.stage_id());
  }
  return reply.worker_incarnation();
}

Result<std::unique_ptr<WorkerWatch>> WorkerClient::watch(uint64_t epoch,
                                                         std::chrono::milliseconds interval) {
  FOLIO_CHECK(interval.count() > 0, "a lease interval must be positive, got {} ms",
              interval.count());
  {
    const MutexLock lock(state_->mutex);
    if (state_->abandoned) return state_->abandoned_status("Watch");
  }
  auto watch_state = std::make_unique<WorkerWatch::State>();
  watch_state->address = state_->info.address;
  v1::WatchRequest request;
  request.set_epoch(epoch);
  request.set_interval_ms(static_cast<uint32_t>(interval.count()));
  // No deadline: the stream lives as long as the lease; the monitor bounds every wait for a
  // beat, and destroying the watch cancels the call.
  watch_state->reader =
      state_->stub->PrepareAsyncWatch(&watch_state->context, request, &watch_state->queue);
  watch_state->reader->StartCall(WorkerWatch::State::tag(WorkerWatch::State::kStart));
  return std::unique_ptr<WorkerWatch>(new WorkerWatch(std::move(watch_state)));
}

Status WorkerClient::shutdown(uint64_t epoch, const std::string& reason) {
  v1::ShutdownRequest request;
  request.set_epoch(epoch);
  request.set_reason(reason);
  v1::ShutdownReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.call_timeout));
  // Not refused when abandoned: telling a superseded worker to exit is what it is for.
  const grpc::Status status = state_->stub->Shutdown(&context, request, &reply);
  return call_status(state_->info.address, "Shutdown", status, state_->options.call_timeout);
}

namespace {

// prepare_timeout plus `bytes` at the options' slowest transfer rate.
std::chrono::milliseconds transfer_timeout(const WorkerClientOptions& options, int64_t bytes) {
  const int64_t rate = std::max<int64_t>(1, options.min_transfer_bytes_per_second);
  return options.prepare_timeout +
         std::chrono::milliseconds(bytes / rate * 1000 + bytes % rate * 1000 / rate);
}

}  // namespace

Result<ShardOffer> WorkerClient::offer_shard(const ShardManifest& manifest, uint64_t epoch,
                                             int64_t pool_bytes) {
  v1::OfferShardRequest request;
  request.set_pool_bytes(static_cast<uint64_t>(std::max<int64_t>(0, pool_bytes)));
  request.set_model_hash(manifest.model_hash);
  request.set_first_layer(static_cast<uint32_t>(manifest.shard.first_layer));
  request.set_end_layer(static_cast<uint32_t>(manifest.shard.end_layer));
  request.set_metadata_gguf(manifest.metadata.data(), manifest.metadata.size());
  request.set_epoch(epoch);
  for (const ShardTensor& tensor : manifest.tensors) {
    v1::ShardTensor* entry = request.add_tensors();
    entry->set_name(tensor.name);
    entry->set_dtype(std::string(dtype_name(tensor.dtype)));
    for (const int64_t dimension : tensor.dimensions) entry->add_dimensions(dimension);
    entry->set_content_hash(tensor.hash.to_string());
    entry->set_byte_size(static_cast<uint64_t>(tensor.byte_size));
  }
  v1::OfferShardReply reply;
  grpc::ClientContext context;
  // The worker reads and hashes every entry it holds of the shard.
  const std::chrono::milliseconds timeout =
      transfer_timeout(state_->options, manifest.tensor_bytes());
  context.set_deadline(deadline_after(timeout));
  FOLIO_RETURN_IF_ERROR(state_->begin_call(&context, "OfferShard"));
  const grpc::Status status = state_->stub->OfferShard(&context, request, &reply);
  FOLIO_RETURN_IF_ERROR(state_->finish_call("OfferShard", status, timeout));
  ShardOffer offer;
  for (const std::string& text : reply.missing_hashes()) {
    Result<ContentHash> hash = ContentHash::parse(text);
    if (!hash.ok()) {
      return hash.status().with_context(
          fmt::format("worker {} answered OfferShard", state_->info.address));
    }
    offer.missing.push_back(*hash);
  }
  offer.cached_bytes = static_cast<int64_t>(reply.cached_bytes());
  offer.missing_bytes = static_cast<int64_t>(reply.missing_bytes());
  offer.corrupted_entries = static_cast<int32_t>(reply.corrupted_entries());
  return offer;
}

Result<int64_t> WorkerClient::push_tensors(std::span<const TensorUpload> tensors,
                                           int64_t chunk_bytes) {
  FOLIO_CHECK(chunk_bytes > 0, "chunk_bytes {}", chunk_bytes);
  int64_t total_bytes = 0;
  for (const TensorUpload& tensor : tensors)
    total_bytes += static_cast<int64_t>(tensor.bytes.size());
  const std::chrono::milliseconds timeout = transfer_timeout(state_->options, total_bytes);
  v1::PushTensorsReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(timeout));
  FOLIO_RETURN_IF_ERROR(state_->begin_call(&context, "PushTensors"));
  std::unique_ptr<grpc::ClientWriter<v1::TensorChunk>> writer =
      state_->stub->PushTensors(&context, &reply);
  v1::TensorChunk chunk;
  bool open = true;
  for (const TensorUpload& tensor : tensors) {
    chunk.set_content_hash(tensor.hash.to_string());
    chunk.set_byte_size(tensor.bytes.size());
    size_t offset = 0;
    do {
      const size_t size = std::min(tensor.bytes.size() - offset, static_cast<size_t>(chunk_bytes));
      chunk.set_offset(offset);
      chunk.set_data(tensor.bytes.data() + offset, size);
      // A failed write means the stream ended (the worker refused or is gone): Finish says why.
      open = writer->Write(chunk);
      offset += size;
    } while (open && offset < tensor.bytes.size());
    if (!open) break;
  }
  if (open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  FOLIO_RETURN_IF_ERROR(state_->finish_call("PushTensors", status, timeout));
  return static_cast<int64_t>(reply.bytes_received());
}

void WorkerClient::abandon(const std::string& reason) {
  const MutexLock lock(state_->mutex);
  if (state_->abandoned) return;
  state_->abandoned = true;
  state_->abandon_reason = reason;
  if (state_->call_in_flight != nullptr) state_->call_in_flight->TryCancel();
}

bool WorkerClient::abandoned() const {
  const MutexLock lock(state_->mutex);
  return state_->abandoned;
}

WorkerWatch::WorkerWatch(std::unique_ptr<State> state) : state_(std::move(state)) {}

WorkerWatch::~WorkerWatch() {
  State& state = *state_;
  if (!state.finished) {
    state.context.TryCancel();
    // Every operation started completes after the cancel; Finish ends the chain.
    while (!state.finished) {
      void* tag = nullptr;
      bool ok = false;
      if (!state.queue.Next(&tag, &ok)) break;
      state.handle(static_cast<State::Tag>(reinterpret_cast<intptr_t>(tag)), ok, nullptr);
    }
  }
  state.queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (state.queue.Next(&tag, &ok)) {
  }
}

Status WorkerWatch::poll(std::vector<WorkerBeat>& beats) {
  State& state = *state_;
  while (!state.finished) {
    void* tag = nullptr;
    bool ok = false;
    // A deadline in the past: take what completed, never wait.
    const grpc::CompletionQueue::NextStatus next =
        state.queue.AsyncNext(&tag, &ok, std::chrono::system_clock::time_point());
    if (next != grpc::CompletionQueue::GOT_EVENT) break;
    state.handle(static_cast<State::Tag>(reinterpret_cast<intptr_t>(tag)), ok, &beats);
  }
  return state.finished ? state.error : Status();
}

}  // namespace folio::dist
