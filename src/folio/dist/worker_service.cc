#include "folio/dist/worker_service.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "folio/base/log.h"
#include "folio/base/mutex.h"
#include "folio/dist/gloo_collectives.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/rendezvous_store.h"
#include "folio/dist/shard_manifest.h"
#include "folio/dist/weight_cache.h"
#include "folio/dist/worker.grpc.pb.h"

namespace folio::dist {
namespace {

// Non-zero, so that 0 can mean "no incarnation" in messages.
uint64_t draw_incarnation() {
  std::random_device device;
  uint64_t value = 0;
  while (value == 0) value = (uint64_t{device()} << 32) | uint64_t{device()};
  return value;
}

std::string host_name() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0) return "unknown";
  return std::string(name.data());
}

// "HOST:PORT" with a port of digits; gRPC would accept more forms (unix:, dns:), but a worker
// listens on TCP.
Status check_listen_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  const bool has_port = colon != std::string::npos && colon + 1 < address.size() &&
                        address.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  if (colon == 0 || !has_port) {
    return invalid_argument("listen address '{}' is not HOST:PORT (e.g. 0.0.0.0:5555)", address);
  }
  return Status();
}

// The gRPC code a stage error travels as (the client maps it back, naming the worker).
grpc::Status to_grpc(const Status& status) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case StatusCode::kResourceExhausted:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case StatusCode::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case StatusCode::kAlreadyExists:
      code = grpc::StatusCode::ALREADY_EXISTS;
      break;
    case StatusCode::kDeadlineExceeded:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
    case StatusCode::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    default:
      break;
  }
  return grpc::Status(code, status.to_string());
}

template <typename T>
std::span<const T> span_of(const google::protobuf::RepeatedField<T>& field) {
  return std::span<const T>(field.data(), static_cast<size_t>(field.size()));
}

grpc::Status refuse(std::string message) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::move(message));
}

std::string stale_epoch_message(uint64_t epoch, uint64_t current) {
  return fmt::format(
      "stale epoch {}, this worker is at epoch {}: a newer coordinator epoch superseded the "
      "caller's",
      epoch, current);
}

// The manifest of an OfferShard request; kInvalidArgument naming the first malformed field.
Result<ShardManifest> manifest_from(const v1::OfferShardRequest& request) {
  ShardManifest manifest;
  manifest.model_hash = request.model_hash();
  manifest.shard = model::LlamaShard{static_cast<int64_t>(request.first_layer()),
                                     static_cast<int64_t>(request.end_layer())};
  manifest.metadata.assign(request.metadata_gguf().begin(), request.metadata_gguf().end());
  for (const v1::ShardTensor& tensor : request.tensors()) {
    const std::optional<DType> dtype = dtype_from_name(tensor.dtype());
    if (!dtype.has_value()) {
      return invalid_argument("tensor {} has dtype '{}', not one Folio knows", tensor.name(),
                              tensor.dtype());
    }
    FOLIO_ASSIGN_OR_RETURN(const ContentHash hash, ContentHash::parse(tensor.content_hash()));
    manifest.tensors.push_back(
        ShardTensor{.name = tensor.name(),
                    .dtype = *dtype,
                    .dimensions = {tensor.dimensions().begin(), tensor.dimensions().end()},
                    .hash = hash,
                    .byte_size = static_cast<int64_t>(tensor.byte_size())});
  }
  FOLIO_RETURN_IF_ERROR(check_shard_manifest(manifest));
  return manifest;
}

// Names a shard model: the same layers of the same bytes are the same model.
std::string shard_identity(const ShardManifest& manifest) {
  std::string identity = fmt::format("{}:{}:{}", manifest.model_hash, manifest.shard.first_layer,
                                     manifest.shard.end_layer);
  for (const ShardTensor& tensor : manifest.tensors) {
    identity += ':';
    identity += tensor.hash.to_string();
  }
  return identity;
}

class WorkerImpl final : public v1::Worker::Service {
 public:
  WorkerImpl(const WorkerServiceOptions& options, uint64_t incarnation,
             std::unique_ptr<WeightCache> cache)
      : options_(options),
        incarnation_(incarnation),
        host_name_(host_name()),
        cache_(std::move(cache)) {}

  // Ends every Watch stream at once (before the server shuts down, which would otherwise wait
  // for each stream's next beat).
  void stop_watches() {
    store_.close();  // also ends every rendezvous wait
    {
      const MutexLock lock(watch_mutex_);
      stopping_ = true;
    }
    watch_wakeup_.notify_all();
  }
  bool shutdown_requested() const { return shutdown_requested_.load(std::memory_order_acquire); }
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  void inject_unavailable(int calls) {
    const MutexLock lock(mutex_);
    injected_unavailable_ = calls;
  }

  grpc::Status Hello(grpc::ServerContext* context, const v1::HelloRequest* request,
                     v1::HelloReply* reply) override {
    if (request->protocol_version() != options_.protocol_version) {
      log::warn("folio worker: refused coordinator '{}' at {}: protocol v{}, this worker v{}",
                request->coordinator_id(), context->peer(), request->protocol_version(),
                options_.protocol_version);
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          fmt::format("this worker speaks protocol v{}, the coordinator v{}: run the same folio "
                      "version on the coordinator and its workers",
                      options_.protocol_version, request->protocol_version()));
    }
    log::info("folio worker: hello from coordinator '{}' at {} (model '{}', {})",
              request->coordinator_id(), context->peer(), request->model_name(),
              request->model_hash().empty() ? "no hash" : request->model_hash());
    reply->set_protocol_version(options_.protocol_version);
    reply->set_worker_incarnation(incarnation_);
    reply->set_memory_budget_bytes(options_.memory_budget_bytes);
    reply->set_threads(options_.threads);
    reply->set_host_name(host_name_);
    reply->set_model_hash(options_.model.hash);
    reply->set_model_name(options_.model.name);
    return grpc::Status::OK;
  }

  // The address this worker's gloo member listens on for its peers: the host it serves gRPC on,
  // or loopback where that is a wildcard.
  std::string collective_host() const {
    std::string host = options_.listen_address.substr(0, options_.listen_address.rfind(':'));
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    if (host.empty() || host == "0.0.0.0" || host == "::") return "127.0.0.1";
    return host;
  }

  grpc::Status Ping(grpc::ServerContext* /*context*/, const v1::PingRequest* request,
                    v1::PingReply* reply) override {
    if (request->reply_payload_bytes() > kMaxPingPayloadBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          fmt::format("a Ping reply carries at most {} bytes; {} were asked for",
                                      kMaxPingPayloadBytes, request->reply_payload_bytes()));
    }
    reply->set_sequence(request->sequence());
    reply->set_worker_incarnation(incarnation_);
    reply->mutable_payload()->resize(static_cast<size_t>(request->reply_payload_bytes()));
    return grpc::Status::OK;
  }

  grpc::Status PrepareStage(grpc::ServerContext* context, const v1::PrepareStageRequest* request,
                            v1::PrepareStageReply* reply) override {
    if (options_.model_path.empty() && cache_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this worker holds no model: start it with -m MODEL, or with "
                          "--cache-dir DIR to be sent its stage's weights, to run stages");
    }
    if (!options_.model_path.empty() && !request->model_hash().empty() &&
        request->model_hash() != options_.model.hash) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          fmt::format("this worker holds model {} ('{}'), the coordinator's stage is of model {}: "
                      "start the worker with the coordinator's model file",
                      options_.model.hash, options_.model.name, request->model_hash()));
    }
    const MutexLock lock(mutex_);
    const uint64_t current = epoch_.load(std::memory_order_relaxed);
    if (request->epoch() < current) return refuse(stale_epoch_message(request->epoch(), current));
    epoch_.store(request->epoch(), std::memory_order_release);
    // The rendezvous keys of older epochs' groups are of no use any more (their groups formed
    // or failed); this epoch's may be set already by members that got their request first.
    store_.drop_before(request->epoch());
    stage_.reset();  // the old stage's memory goes before the new one takes its own
    // A tensor-parallel rank slices the file's matrices (llama_tensor_shard.h): a model opened
    // with q8_0 panels is opened again without them (and the other way round).
    const bool tensor_split = request->tensor_ranks() > 1;
    if (tensor_split && options_.model_path.empty()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "a tensor-parallel rank needs the model file: start the worker with -m "
                          "MODEL (shards from the weight cache serve pipeline stages only)");
    }
    if (model_ != nullptr && model_packed_for_pipeline_ == tensor_split) model_.reset();
    if (options_.model_path.empty()) {
      if (grpc::Status opened = open_offered_shard(*request); !opened.ok()) return opened;
    } else if (model_ == nullptr) {
      Result<std::unique_ptr<model::LlamaModel>> opened =
          model::LlamaModel::open(options_.model_path, {.pack_q8_0_panels = !tensor_split});
      model_packed_for_pipeline_ = !tensor_split;
      if (!opened.ok()) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            fmt::format("this worker cannot open its model {}: {}",
                                        options_.model_path, opened.status().to_string()));
      }
      model_ = std::move(opened).value();
    }
    PipelineStageSpec spec;
    spec.first_layer = request->first_layer();
    spec.end_layer = request->end_layer();
    spec.num_kv_blocks = static_cast<int64_t>(request->num_kv_blocks());
    spec.block_size = static_cast<int32_t>(request->block_size());
    spec.max_blocks_per_sequence = static_cast<int32_t>(request->max_blocks_per_sequence());
    if (request->kv_dtype() == "f32") {
      spec.kv_dtype = DType::kF32;
    } else if (request->kv_dtype() == "f16") {
      spec.kv_dtype = DType::kF16;
    } else {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          fmt::format("KV dtype '{}' is not f32 or f16", request->kv_dtype()));
    }
    spec.first_dummy_block = static_cast<int64_t>(request->first_dummy_block());
    spec.num_dummy_blocks = static_cast<int32_t>(request->num_dummy_blocks());
    spec.bucket_ladder.assign(request->bucket_ladder().begin(), request->bucket_ladder().end());
    spec.max_num_tokens = static_cast<int32_t>(request->max_num_tokens());
    spec.max_sequences = static_cast<int32_t>(request->max_sequences());
    spec.max_logit_rows = static_cast<int32_t>(request->max_logit_rows());
    spec.use_graphs = request->use_graphs();
    spec.pool_bytes = static_cast<int64_t>(request->pool_bytes());
    spec.tensor_rank = request->tensor_rank();
    spec.tensor_ranks = std::max<int64_t>(1, request->tensor_ranks());
    spec.kv_member = request->kv_member();
    spec.kv_members = std::max<int64_t>(1, request->kv_members());
    spec.kv_tokens_per_member = request->kv_tokens_per_member();
    spec.collective_store = request->collective_store();
    spec.collective_store_address = request->collective_store_address();
    spec.collective_group_id = request->collective_group_id();
    spec.collective_timeout =
        std::chrono::milliseconds(std::max<uint32_t>(1000, request->collective_timeout_ms()));
    if (spec.in_group() && spec.group_rank() >= spec.group_size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          fmt::format("{} names no member of its group", spec.describe()));
    }
    const model::LlamaModel& model = options_.model_path.empty() ? *shard_model_ : *model_;
    Result<int64_t> weight_bytes = llama_stage_weight_bytes(
        model.shape(), spec.first_layer, spec.end_layer, {spec.tensor_rank, spec.tensor_ranks});
    if (!weight_bytes.ok()) return to_grpc(weight_bytes.status());
    const auto needed = static_cast<uint64_t>(*weight_bytes + spec.pool_bytes);
    if (options_.memory_budget_bytes > 0 && needed > options_.memory_budget_bytes) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          fmt::format("the stage of layers [{}, {}) needs {} bytes ({} of weights, a pool of {}), "
                      "more than this worker's memory budget of {} bytes: give it fewer layers, "
                      "fewer KV blocks or more memory (--memory)",
                      spec.first_layer, spec.end_layer, needed, *weight_bytes, spec.pool_bytes,
                      options_.memory_budget_bytes));
    }
    std::unique_ptr<Collectives> group;
    if (spec.in_group()) {
      Result<std::unique_ptr<Collectives>> formed = form_stage_group(*request, spec);
      if (!formed.ok()) return to_grpc(formed.status());
      group = std::move(formed).value();
    }
    Result<std::unique_ptr<PipelineStage>> stage = PipelineStage::create(
        model, spec, static_cast<int>(std::max(1u, options_.threads)), std::move(group));
    if (!stage.ok()) return to_grpc(stage.status());
    stage_ = std::move(stage).value();
    stage_id_ = draw_incarnation();
    stage_epoch_ = request->epoch();
    reply->set_stage_id(stage_id_);
    reply->set_epoch(request->epoch());
    reply->set_worker_incarnation(incarnation_);
    reply->set_hidden_input_size(static_cast<uint32_t>(stage_->hidden_input_size()));
    reply->set_hidden_output_size(static_cast<uint32_t>(stage_->hidden_output_size()));
    reply->set_vocab_size(static_cast<uint32_t>(stage_->vocab_size()));
    reply->set_weight_bytes(static_cast<uint64_t>(stage_->weight_bytes()));
    reply->set_kv_cache_bytes(static_cast<uint64_t>(stage_->kv_cache_bytes()));
    log::info("folio worker: prepared stage {:016x} (layers [{}, {}), {} KV blocks) for {}",
              stage_id_, spec.first_layer, spec.end_layer, spec.num_kv_blocks, context->peer());
    return grpc::Status::OK;
  }

  // The fence of the calls on the prepared stage (RunStage, CopyBlocks): the worker's current
  // epoch, the stage held, and the stage prepared (or fenced) in that epoch. OK: the call may
  // use stage_.
  grpc::Status check_stage_call(uint64_t epoch, uint64_t stage_id) FOLIO_REQUIRES(mutex_) {
    if (injected_unavailable_ > 0) {
      --injected_unavailable_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "injected failure (test)");
    }
    const uint64_t current = epoch_.load(std::memory_order_relaxed);
    if (epoch < current) return refuse(stale_epoch_message(epoch, current));
    if (epoch > current) {
      return refuse(
          fmt::format("epoch {} is newer than this worker's epoch {}: prepare its stage or fence "
                      "it in epoch {} first",
                      epoch, current, epoch));
    }
    if (stage_ == nullptr || stage_id != stage_id_) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          stage_ == nullptr
              ? fmt::format("no stage {:016x} here: this worker holds none; prepare it again",
                            stage_id)
              : fmt::format("no stage {:016x} here: this worker holds stage {:016x}; prepare it "
                            "again",
                            stage_id, stage_id_));
    }
    if (stage_epoch_ != current) {
      return refuse(
          fmt::format("stage {:016x} was prepared in epoch {}, this worker is at epoch {}: "
                      "prepare it again, or fence the worker keeping the stage",
                      stage_id_, stage_epoch_, current));
    }
    return grpc::Status::OK;
  }

  grpc::Status CopyBlocks(grpc::ServerContext* /*context*/, const v1::CopyBlocksRequest* request,
                          v1::CopyBlocksReply* reply) override {
    const MutexLock lock(mutex_);
    if (grpc::Status fenced = check_stage_call(request->epoch(), request->stage_id());
        !fenced.ok()) {
      return fenced;
    }
    copies_.clear();
    for (const v1::BlockCopyPair& pair : request->copies()) {
      if (pair.source() > INT32_MAX || pair.destination() > INT32_MAX) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            fmt::format("KV block copy {} -> {} names a block id past int32",
                                        pair.source(), pair.destination()));
      }
      copies_.push_back(kv::BlockCopy{static_cast<int32_t>(pair.source()),
                                      static_cast<int32_t>(pair.destination())});
    }
    if (Status copied = stage_->copy_blocks(copies_); !copied.ok()) return to_grpc(copied);
    reply->set_epoch(request->epoch());
    reply->set_worker_incarnation(incarnation_);
    return grpc::Status::OK;
  }

  grpc::Status RunStage(grpc::ServerContext* /*context*/, const v1::RunStageRequest* request,
                        v1::RunStageReply* reply) override {
    const MutexLock lock(mutex_);
    if (grpc::Status fenced = check_stage_call(request->epoch(), request->stage_id());
        !fenced.ok()) {
      return fenced;
    }
    const uint64_t current = request->epoch();
    const std::string& hidden_bytes = request->hidden_in();
    if (hidden_bytes.size() % sizeof(float) != 0) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          fmt::format("hidden_in has {} bytes, not whole f32 values", hidden_bytes.size()));
    }
    // A copy: the message's bytes need not be aligned for floats.
    hidden_in_.resize(hidden_bytes.size() / sizeof(float));
    if (!hidden_bytes.empty())
      std::memcpy(hidden_in_.data(), hidden_bytes.data(), hidden_bytes.size());
    const ir::StepBatch step{span_of(request->token_ids()),
                             span_of(request->positions()),
                             span_of(request->slot_mapping()),
                             span_of(request->query_start()),
                             span_of(request->seq_lens()),
                             span_of(request->block_tables()),
                             span_of(request->logit_indices()),
                             {},
                             static_cast<int32_t>(request->max_blocks_per_sequence()),
                             {}};
    const CommunicationStats before = stage_->communication();
    Result<ir::StepOutput> output = stage_->run(step, hidden_in_);
    if (!output.ok()) return to_grpc(output.status());
    const CommunicationStats after = stage_->communication();
    reply->set_communication_ns(static_cast<uint64_t>(after.nanoseconds - before.nanoseconds));
    reply->set_reduced_bytes(static_cast<uint64_t>(after.reduced_bytes - before.reduced_bytes));
    reply->set_gathered_bytes(static_cast<uint64_t>(after.gathered_bytes - before.gathered_bytes));
    if (!output->hidden.empty()) {
      reply->set_hidden_out(output->hidden.data(), output->hidden.size_bytes());
    }
    // Every tensor rank (every KV-parallel member) computes the same logits; rank 0's travel.
    if (!output->logits.empty() && stage_->spec().group_rank() == 0) {
      reply->set_logits(output->logits.data(), output->logits.size_bytes());
    }
    reply->set_num_rows(static_cast<uint32_t>(output->num_rows));
    reply->set_vocab_size(static_cast<uint32_t>(output->vocab_size));
    reply->set_epoch(current);
    reply->set_worker_incarnation(incarnation_);
    return grpc::Status::OK;
  }

  grpc::Status Fence(grpc::ServerContext* context, const v1::FenceRequest* request,
                     v1::FenceReply* reply) override {
    const MutexLock lock(mutex_);
    const uint64_t current = epoch_.load(std::memory_order_relaxed);
    if (request->epoch() < current) return refuse(stale_epoch_message(request->epoch(), current));
    if (request->stage_id() != 0 && (stage_ == nullptr || request->stage_id() != stage_id_)) {
      return refuse(fmt::format(
          "no stage {:016x} here to keep in epoch {}: this worker holds {}; prepare it again",
          request->stage_id(), request->epoch(),
          stage_ == nullptr ? std::string("none") : fmt::format("stage {:016x}", stage_id_)));
    }
    epoch_.store(request->epoch(), std::memory_order_release);
    store_.drop_before(request->epoch());
    if (request->stage_id() != 0) stage_epoch_ = request->epoch();
    reply->set_epoch(request->epoch());
    reply->set_worker_incarnation(incarnation_);
    reply->set_stage_id(request->stage_id());
    log::info("folio worker: fenced into epoch {} (from {}) keeping stage {:016x}, for {}",
              request->epoch(), current, request->stage_id(), context->peer());
    return grpc::Status::OK;
  }

  // The rendezvous store (revision 9, rendezvous_store.h): served without mutex_, which
  // PrepareStage holds while its own member waits in the store for the others.
  grpc::Status StoreSet(grpc::ServerContext* /*context*/, const v1::StoreSetRequest* request,
                        v1::StoreSetReply* /*reply*/) override {
    const Status status =
        store_.set(request->group_id(), request->epoch(), request->key(), request->value());
    return status.ok() ? grpc::Status::OK : to_grpc(status);
  }

  grpc::Status StoreWait(grpc::ServerContext* context, const v1::StoreWaitRequest* request,
                         v1::StoreWaitReply* reply) override {
    // Bounded by the request's timeout and by the caller's deadline, whichever comes first.
    auto timeout = std::chrono::milliseconds(request->timeout_ms());
    const auto until_deadline = std::chrono::duration_cast<std::chrono::milliseconds>(
        context->deadline() - std::chrono::system_clock::now());
    timeout = std::max(std::chrono::milliseconds(0), std::min(timeout, until_deadline));
    const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
    Result<std::vector<std::string>> values =
        store_.wait(request->group_id(), request->epoch(), keys, timeout);
    if (!values.ok()) return to_grpc(values.status());
    if (request->want_values()) {
      for (std::string& value : *values) reply->add_values(std::move(value));
    }
    return grpc::Status::OK;
  }

  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                     grpc::ServerWriter<v1::Beat>* writer) override {
    if (request->interval_ms() == 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a lease interval of 0 ms");
    }
    const auto interval = std::chrono::milliseconds(request->interval_ms());
    log::info("folio worker: lease for {}, a beat every {} ms", context->peer(), interval.count());
    v1::Beat beat;
    beat.set_worker_incarnation(incarnation_);
    for (uint64_t sequence = 1;; ++sequence) {
      beat.set_epoch(epoch());
      beat.set_sequence(sequence);
      if (context->IsCancelled() || !writer->Write(beat)) break;
      MutexLock lock(watch_mutex_);
      if (lock.wait_for(watch_wakeup_, interval,
                        [&]() FOLIO_REQUIRES(watch_mutex_) { return stopping_; })) {
        break;
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest* request,
                        v1::ShutdownReply* reply) override {
    log::warn("folio worker: told to exit by {} (epoch {}): {}", context->peer(), request->epoch(),
              request->reason());
    reply->set_worker_incarnation(incarnation_);
    if (!shutdown_requested_.exchange(true, std::memory_order_acq_rel) &&
        options_.on_shutdown_request) {
      options_.on_shutdown_request();
    }
    return grpc::Status::OK;
  }

  // The weight cache (protocol revision 6).
  grpc::Status OfferShard(grpc::ServerContext* context, const v1::OfferShardRequest* request,
                          v1::OfferShardReply* reply) override {
    if (grpc::Status usable = check_cache_worker(); !usable.ok()) return usable;
    Result<ShardManifest> manifest = manifest_from(*request);
    if (!manifest.ok()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          fmt::format("malformed shard manifest: {}", manifest.status().to_string()));
    }
    {
      const MutexLock lock(mutex_);
      const uint64_t current = epoch_.load(std::memory_order_relaxed);
      if (request->epoch() < current) return refuse(stale_epoch_message(request->epoch(), current));
    }
    // Before anything is verified or sent: a shard that cannot fit is not worth fetching.
    if (grpc::Status fits =
            check_shard_fits(manifest->shard, manifest->tensor_bytes(), request->pool_bytes());
        !fits.ok()) {
      return fits;
    }
    // Verified outside the stage mutex: reading the entries takes a while, and the cache is safe
    // to use from any thread.
    uint64_t cached_bytes = 0, missing_bytes = 0;
    uint32_t corrupted = 0;
    for (const ShardTensor& tensor : manifest->tensors) {
      Result<int64_t> verified = cache_->verify(tensor.hash);
      if (verified.ok() && *verified == tensor.byte_size) {
        cached_bytes += static_cast<uint64_t>(tensor.byte_size);
        continue;
      }
      if (!verified.ok() && verified.status().code() == StatusCode::kDataLoss) {
        ++corrupted;
        log::warn("folio worker: tensor {}: {}", tensor.name, verified.status().to_string());
      } else if (!verified.ok() && verified.status().code() != StatusCode::kNotFound) {
        return to_grpc(verified.status());
      }
      reply->add_missing_hashes(tensor.hash.to_string());
      missing_bytes += static_cast<uint64_t>(tensor.byte_size);
    }
    reply->set_cached_bytes(cached_bytes);
    reply->set_missing_bytes(missing_bytes);
    reply->set_corrupted_entries(corrupted);
    reply->set_worker_incarnation(incarnation_);
    log::info(
        "folio worker: offered the shard of layers [{}, {}) by {}: {} bytes cached, {} "
        "bytes in {} tensors to fetch{}",
        manifest->shard.first_layer, manifest->shard.end_layer, context->peer(), cached_bytes,
        missing_bytes, reply->missing_hashes_size(),
        corrupted > 0 ? fmt::format(" ({} corrupted entries dropped)", corrupted) : "");
    const MutexLock lock(mutex_);
    offered_ = std::move(manifest).value();
    return grpc::Status::OK;
  }

  grpc::Status PushTensors(grpc::ServerContext* /*context*/,
                           grpc::ServerReader<v1::TensorChunk>* reader,
                           v1::PushTensorsReply* reply) override {
    if (grpc::Status usable = check_cache_worker(); !usable.ok()) return usable;
    std::map<ContentHash, const ShardTensor*> expected;
    ShardManifest offered;
    {
      const MutexLock lock(mutex_);
      if (!offered_.has_value()) {
        return refuse("no shard was offered to this worker: call OfferShard before PushTensors");
      }
      offered = *offered_;
    }
    for (const ShardTensor& tensor : offered.tensors) expected.emplace(tensor.hash, &tensor);
    std::unique_ptr<WeightCache::Writer> writer;
    const ShardTensor* current = nullptr;
    uint64_t received = 0;
    uint32_t stored = 0;
    v1::TensorChunk chunk;
    auto invalid = [](std::string message) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(message));
    };
    while (reader->Read(&chunk)) {
      if (writer == nullptr) {
        Result<ContentHash> hash = ContentHash::parse(chunk.content_hash());
        if (!hash.ok()) return invalid(hash.status().to_string());
        const auto found = expected.find(*hash);
        if (found == expected.end()) {
          return invalid(
              fmt::format("tensor {} is not in the shard offered to this worker: offer it first",
                          chunk.content_hash()));
        }
        current = found->second;
        if (chunk.byte_size() != static_cast<uint64_t>(current->byte_size)) {
          return invalid(fmt::format("tensor {} ({}) is streamed as {} bytes, the manifest says {}",
                                     current->name, chunk.content_hash(), chunk.byte_size(),
                                     current->byte_size));
        }
        Result<std::unique_ptr<WeightCache::Writer>> begun =
            cache_->begin(current->hash, current->byte_size);
        if (!begun.ok()) return to_grpc(begun.status());
        writer = std::move(begun).value();
      } else if (chunk.content_hash() != current->hash.to_string()) {
        return invalid(fmt::format("tensor {} ended after {} of its {} bytes", current->name,
                                   writer->bytes_written(), current->byte_size));
      }
      if (chunk.offset() != static_cast<uint64_t>(writer->bytes_written())) {
        return invalid(fmt::format("tensor {}: a chunk at offset {}, expected {}", current->name,
                                   chunk.offset(), writer->bytes_written()));
      }
      const std::string& data = chunk.data();
      if (Status appended = writer->append(std::as_bytes(std::span(data.data(), data.size())));
          !appended.ok()) {
        return to_grpc(appended.with_context(fmt::format("tensor {}", current->name)));
      }
      received += data.size();
      if (writer->bytes_written() == current->byte_size) {
        if (Status committed = writer->commit(); !committed.ok()) {
          return grpc::Status(
              committed.code() == StatusCode::kInvalidArgument ? grpc::StatusCode::DATA_LOSS
                                                               : grpc::StatusCode::UNAVAILABLE,
              fmt::format("tensor {}: {}: the manifest's hash does not match the streamed bytes "
                          "(the coordinator's model file changed, or the bytes were corrupted "
                          "on the way); nothing was stored",
                          current->name, committed.to_string()));
        }
        writer.reset();
        ++stored;
      }
    }
    if (writer != nullptr) {
      return invalid(fmt::format("the stream ended in tensor {} after {} of its {} bytes",
                                 current->name, writer->bytes_written(), current->byte_size));
    }
    reply->set_bytes_received(received);
    reply->set_tensors_stored(stored);
    reply->set_worker_incarnation(incarnation_);
    return grpc::Status::OK;
  }

 private:
  // The group of a stage that is one member of a worker group (tensor ranks, KV-parallel
  // members): gloo over the request's rendezvous directory and group id, in the request's
  // epoch. Every member's worker calls this at once (the coordinator prepares them together).
  Result<std::unique_ptr<Collectives>> form_stage_group(const v1::PrepareStageRequest& request,
                                                        const PipelineStageSpec& spec) const {
    Result<std::unique_ptr<Collectives>> formed =
        connect_gloo_group(GlooGroupOptions{.rank = static_cast<int>(spec.group_rank()),
                                            .size = static_cast<int>(spec.group_size()),
                                            .store_directory = spec.collective_store,
                                            .store_address = spec.collective_store_address,
                                            .group_id = spec.collective_group_id,
                                            .epoch = request.epoch(),
                                            .host = collective_host(),
                                            .timeout = spec.collective_timeout});
    if (!formed.ok()) {
      return formed.status().with_context(
          fmt::format("{} forming its gloo group", spec.describe()));
    }
    return formed;
  }

  grpc::Status check_cache_worker() const {
    if (!options_.model_path.empty()) {
      return refuse(fmt::format("this worker reads its model file {} and takes no shard",
                                options_.model_path));
    }
    if (cache_ == nullptr) {
      return refuse("this worker has no weight cache: start it with --cache-dir DIR");
    }
    return grpc::Status::OK;
  }

  // RESOURCE_EXHAUSTED when the shard's weights and a stage pool of `pool_bytes` exceed the
  // memory budget (none: no limit).
  grpc::Status check_shard_fits(const model::LlamaShard& shard, int64_t weight_bytes,
                                uint64_t pool_bytes) const {
    const auto needed = static_cast<uint64_t>(weight_bytes) + pool_bytes;
    if (options_.memory_budget_bytes == 0 || needed <= options_.memory_budget_bytes) {
      return grpc::Status::OK;
    }
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        fmt::format("the stage of layers [{}, {}) needs {} bytes ({} of weights, a pool of {}), "
                    "more than this worker's memory budget of {} bytes: give it fewer layers, "
                    "fewer KV blocks or more memory (--memory)",
                    shard.first_layer, shard.end_layer, needed, weight_bytes, pool_bytes,
                    options_.memory_budget_bytes));
  }

  // Builds shard_model_ from the cache for the layers `request` prepares, from the shard
  // offered last; keeps the one built before when it is the same shard.
  grpc::Status open_offered_shard(const v1::PrepareStageRequest& request) FOLIO_REQUIRES(mutex_) {
    if (!offered_.has_value() || offered_->shard.first_layer != request.first_layer() ||
        offered_->shard.end_layer != request.end_layer()) {
      return refuse(fmt::format(
          "this worker has no model file and was offered no shard of layers [{}, {}): the "
          "coordinator offers the stage's shard (OfferShard) before preparing it",
          request.first_layer(), request.end_layer()));
    }
    if (!request.model_hash().empty() && request.model_hash() != offered_->model_hash) {
      return refuse(fmt::format("the stage is of model {}, the shard offered of model {}",
                                request.model_hash(), offered_->model_hash));
    }
    // Refused before the shard is read into memory (the check after building the stage would
    // come too late to keep a worker within its budget).
    if (grpc::Status fits =
            check_shard_fits(offered_->shard, offered_->tensor_bytes(), request.pool_bytes());
        !fits.ok()) {
      return fits;
    }
    const std::string identity = shard_identity(*offered_);
    if (shard_model_ != nullptr && identity == shard_model_identity_) return grpc::Status::OK;
    shard_model_.reset();
    const auto start = std::chrono::steady_clock::now();
    Result<std::unique_ptr<model::LlamaModel>> opened = open_shard_model(*offered_, *cache_);
    if (!opened.ok()) {
      return refuse(
          fmt::format("this worker cannot build the shard of layers [{}, {}) from its "
                      "weight cache: {}; offer the shard again to fetch what is missing",
                      request.first_layer(), request.end_layer(), opened.status().to_string()));
    }
    shard_model_ = std::move(opened).value();
    shard_model_identity_ = identity;
    log::info(
        "folio worker: built the shard of layers [{}, {}) from the weight cache ({} bytes) "
        "in {:.1f} ms",
        request.first_layer(), request.end_layer(), offered_->tensor_bytes(),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    return grpc::Status::OK;
  }

  const WorkerServiceOptions options_;
  const uint64_t incarnation_;
  const std::string host_name_;
  Mutex mutex_;  // serializes the stage calls
  std::unique_ptr<model::LlamaModel> model_ FOLIO_GUARDED_BY(mutex_);
  // Whether model_ was opened for pipeline stages (q8_0 panels allowed) or for tensor ranks.
  bool model_packed_for_pipeline_ FOLIO_GUARDED_BY(mutex_) = true;
  // Without a model file: the weight cache, the shard offered last and the model built from it.
  const std::unique_ptr<WeightCache> cache_;
  std::optional<ShardManifest> offered_ FOLIO_GUARDED_BY(mutex_);
  std::unique_ptr<model::LlamaModel> shard_model_ FOLIO_GUARDED_BY(mutex_);
  std::string shard_model_identity_ FOLIO_GUARDED_BY(mutex_);
  std::unique_ptr<PipelineStage> stage_ FOLIO_GUARDED_BY(mutex_);
  uint64_t stage_id_ FOLIO_GUARDED_BY(mutex_) = 0;
  // The epoch stage_ was prepared in, or last fenced into; it runs steps only in that epoch.
  uint64_t stage_epoch_ FOLIO_GUARDED_BY(mutex_) = 0;
  std::vector<float> hidden_in_ FOLIO_GUARDED_BY(mutex_);
  std::vector<kv::BlockCopy> copies_ FOLIO_GUARDED_BY(mutex_);
  // Written under mutex_ (PrepareStage, Fence), read without it by Watch, whose beats must not
  // wait behind a running step.
  std::atomic<uint64_t> epoch_{0};
  Mutex watch_mutex_;
  std::condition_variable watch_wakeup_;
  bool stopping_ FOLIO_GUARDED_BY(watch_mutex_) = false;
  std::atomic<bool> shutdown_requested_{false};
  int injected_unavailable_ FOLIO_GUARDED_BY(mutex_) = 0;
  // The rendezvous store of the groups this worker is member 0 of; locked on its own.
  RendezvousStore store_;
};

}  // namespace

struct WorkerService::State {
  std::unique_ptr<WorkerImpl> impl;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;
  uint64_t incarnation = 0;
  bool shut_down = false;
};

Result<std::unique_ptr<WorkerService>> WorkerService::start(WorkerServiceOptions options) {
  FOLIO_RETURN_IF_ERROR(check_listen_address(options.listen_address));
  auto state = std::make_unique<State>();
  state->incarnation = draw_incarnation();
  std::unique_ptr<WeightCache> cache;
  if (options.model_path.empty() && !options.cache_directory.empty()) {
    FOLIO_ASSIGN_OR_RETURN(cache, WeightCache::open(options.cache_directory));
  }
  state->impl = std::make_unique<WorkerImpl>(options, state->incarnation, std::move(cache));
  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(),
                           &selected_port);
  builder.RegisterService(state->impl.get());
  // Accept the coordinator's keepalive pings, also between calls.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(options.min_keepalive_interval.count()));
  // Activations and logits of large steps exceed gRPC's default 4 MiB per message.
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  // A lone listener per address: a second worker on the same port must fail, not share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  state->server = builder.BuildAndStart();
  if (state->server == nullptr || selected_port == 0) {
    return unavailable(
        "cannot listen on {}: the port is in use or the host is not an address of this machine",
        options.listen_address);
  }
  state->port = selected_port;
  const std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  state->address = fmt::format("{}:{}", host, selected_port);
  return std::unique_ptr<WorkerService>(new WorkerService(std::move(state)));
}

WorkerService::WorkerService(std::unique_ptr<State> state) : state_(std::move(state)) {}

WorkerService::~WorkerService() {
  shutdown(std::chrono::milliseconds(0));
}

int WorkerService::port() const {
  return state_->port;
}
const std::string& WorkerService::address() const {
  return state_->address;
}
uint64_t WorkerService::incarnation() const {
  return state_->incarnation;
}

uint64_t WorkerService::epoch() const {
  return state_->impl->epoch();
}

bool WorkerService::shutdown_requested() const {
  return state_->impl->shutdown_requested();
}

void WorkerService::inject_unavailable(int calls) {
  state_->impl->inject_unavailable(calls);
}

void WorkerService::shutdown(std::chrono::milliseconds grace) {
  if (state_->shut_down) return;
  state_->shut_down = true;
  state_->impl->stop_watches();
  state_->server->Shutdown(std::chrono::system_clock::now() + grace);
  state_->server->Wait();
}

}  // namespace folio::dist
