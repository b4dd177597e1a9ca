#include "folio/dist/worker_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "folio/base/check.h"
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

Result<std::chrono::nanoseconds> WorkerClient::ping() {
  v1::PingRequest request;
  request.set_sequence(state_->next_sequence.fetch_add(1, std::memory_order_relaxed));
  v1::PingReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.call_timeout));
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
  return std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed);
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
                                                  const std::string& model_hash) {
  v1::PrepareStageRequest request;
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
  v1::PrepareStageReply reply;
  grpc::ClientContext context;
  context.set_deadline(deadline_after(state_->options.prepare_timeout));
  const grpc::Status status = state_->stub->PrepareStage(&context, request, &reply);
  FOLIO_RETURN_IF_ERROR(
      call_status(state_->info.address, "PrepareStage", status, state_->options.prepare_timeout));
  return PreparedStage{.stage_id = reply.stage_id(),
                       .hidden_input_size = reply.hidden_input_size(),
                       .hidden_output_size = reply.hidden_output_size(),
                       .vocab_size = static_cast<int32_t>(reply.vocab_size()),
                       .weight_bytes = static_cast<int64_t>(reply.weight_bytes()),
                       .kv_cache_bytes = static_cast<int64_t>(reply.kv_cache_bytes())};
}

Status WorkerClient::run_stage(uint64_t stage_id, const ir::StepBatch& step,
                               std::span<const float> hidden_in, StageStepResult& result) {
  v1::RunStageRequest request;
  request.set_stage_id(stage_id);
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
  const grpc::Status status = state_->stub->RunStage(&context, request, &reply);
  FOLIO_RETURN_IF_ERROR(
      call_status(state_->info.address, "RunStage", status, state_->options.step_timeout));
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
  return Status();
}

}  // namespace folio::dist
