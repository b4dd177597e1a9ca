#include "folio/dist/rendezvous_store.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <grpcpp/grpcpp.h>

#include "folio/dist/worker.grpc.pb.h"

namespace folio::dist {
namespace {

// The time a wait's reply may take beyond the wait itself (the round trip, a busy worker).
constexpr std::chrono::milliseconds kReplyMargin{2000};

std::vector<std::string> missing_keys(const std::map<std::string, std::string>* scope,
                                      const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (scope == nullptr || scope->find(key) == scope->end()) missing.push_back(key);
  }
  return missing;
}

}  // namespace

Status RendezvousStore::set(const std::string& group_id, uint64_t epoch, const std::string& key,
                            std::string value) {
  {
    const MutexLock lock(mutex_);
    if (closed_) return unavailable("the rendezvous store is closed (its worker is exiting)");
    FOLIO_RETURN_IF_ERROR(check_epoch(group_id, epoch));
    if (value.size() > kMaxValueBytes) {
      return resource_exhausted("rendezvous key '{}' has {} bytes, more than the {} allowed", key,
                                value.size(), kMaxValueBytes);
    }
    Scope& scope = scopes_[{group_id, epoch}];
    if (scope.size() >= kMaxKeysPerScope) {
      return resource_exhausted("group '{}' epoch {} holds {} rendezvous keys already", group_id,
                                epoch, scope.size());
    }
    if (!scope.emplace(key, std::move(value)).second) {
      return already_exists(
          "rendezvous key '{}' of group '{}' epoch {} already exists (a group is formed once per "
          "epoch)",
          key, group_id, epoch);
    }
  }
  changed_.notify_all();
  return Status();
}

Result<std::vector<std::string>> RendezvousStore::wait(const std::string& group_id, uint64_t epoch,
                                                       const std::vector<std::string>& keys,
                                                       std::chrono::milliseconds timeout) {
  const auto scope_key = std::make_pair(group_id, epoch);
  MutexLock lock(mutex_);
  FOLIO_RETURN_IF_ERROR(check_epoch(group_id, epoch));
  const auto find_scope = [&]() FOLIO_REQUIRES(mutex_) -> const Scope* {
    const auto found = scopes_.find(scope_key);
    return found == scopes_.end() ? nullptr : &found->second;
  };
  const bool ready = lock.wait_for(changed_, timeout, [&]() FOLIO_REQUIRES(mutex_) {
    return closed_ || missing_keys(find_scope(), keys).empty();
  });
  if (closed_) return unavailable("the rendezvous store is closed (its worker is exiting)");
  const Scope* scope = find_scope();
  if (!ready) {
    return deadline_exceeded("rendezvous of group '{}' epoch {}: key(s) {} not set within {} ms",
                             group_id, epoch, fmt::join(missing_keys(scope, keys), ", "),
                             timeout.count());
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(scope->at(key));
  return values;
}

Status RendezvousStore::check_epoch(const std::string& group_id, uint64_t epoch) const {
  if (epoch >= oldest_epoch_) return Status();
  return failed_precondition(
      "rendezvous of group '{}' epoch {}: this worker has moved on to epoch {} (the group was "
      "superseded; form it again in the coordinator's current epoch)",
      group_id, epoch, oldest_epoch_);
}

void RendezvousStore::drop_before(uint64_t epoch) {
  const MutexLock lock(mutex_);
  oldest_epoch_ = std::max(oldest_epoch_, epoch);
  std::erase_if(scopes_, [&](const auto& entry) { return entry.first.second < epoch; });
}

void RendezvousStore::close() {
  {
    const MutexLock lock(mutex_);
    closed_ = true;
    scopes_.clear();
  }
  changed_.notify_all();
}

size_t RendezvousStore::num_scopes() const {
  const MutexLock lock(mutex_);
  return scopes_.size();
}

struct RendezvousStoreClient::State {
  std::string address;
  std::string group_id;
  uint64_t epoch = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Worker::Stub> stub;
};

namespace {

Status store_call_status(const std::string& address, std::string_view call,
                         const grpc::Status& status) {
  const std::string where = fmt::format("rendezvous store at member 0's worker {}", address);
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return unavailable("{}: {} failed: the worker cannot be reached ({})", where, call,
                         status.error_message());
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return deadline_exceeded("{}: {}: {}", where, call, status.error_message());
    case grpc::StatusCode::ALREADY_EXISTS:
      return already_exists("{}: {}: {}", where, call, status.error_message());
    case grpc::StatusCode::FAILED_PRECONDITION:
      return failed_precondition("{}: {}: {}", where, call, status.error_message());
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return resource_exhausted("{}: {}: {}", where, call, status.error_message());
    case grpc::StatusCode::UNIMPLEMENTED:
      return failed_precondition(
          "{}: {}: the worker serves no rendezvous store (a worker older than protocol revision "
          "9)",
          where, call);
    default:
      return internal_error("{}: {} failed: gRPC {}: {}", where, call,
                            static_cast<int>(status.error_code()), status.error_message());
  }
}

}  // namespace

RendezvousStoreClient::RendezvousStoreClient(std::string address, std::string group_id,
                                             uint64_t epoch)
    : state_(std::make_unique<State>()) {
  state_->address = std::move(address);
  state_->group_id = std::move(group_id);
  state_->epoch = epoch;
  grpc::ChannelArguments arguments;
  // Its own connection, not one shared with the coordinator's clients of the same worker.
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  state_->channel =
      grpc::CreateCustomChannel(state_->address, grpc::InsecureChannelCredentials(), arguments);
  state_->stub = v1::Worker::NewStub(state_->channel);
}

RendezvousStoreClient::~RendezvousStoreClient() = default;

const std::string& RendezvousStoreClient::address() const {
  return state_->address;
}

Status RendezvousStoreClient::set(const std::string& key, const std::string& value,
                                  std::chrono::milliseconds timeout) {
  v1::StoreSetRequest request;
  request.set_group_id(state_->group_id);
  request.set_epoch(state_->epoch);
  request.set_key(key);
  request.set_value(value);
  v1::StoreSetReply reply;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  const grpc::Status status = state_->stub->StoreSet(&context, request, &reply);
  if (!status.ok()) return store_call_status(state_->address, fmt::format("set '{}'", key), status);
  return Status();
}

Result<std::vector<std::string>> RendezvousStoreClient::wait(const std::vector<std::string>& keys,
                                                             std::chrono::milliseconds timeout,
                                                             bool want_values) {
  v1::StoreWaitRequest request;
  request.set_group_id(state_->group_id);
  request.set_epoch(state_->epoch);
  for (const std::string& key : keys) request.add_keys(key);
  request.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(0, timeout.count())));
  request.set_want_values(want_values);
  v1::StoreWaitReply reply;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout + kReplyMargin);
  const grpc::Status status = state_->stub->StoreWait(&context, request, &reply);
  if (!status.ok()) {
    return store_call_status(state_->address, fmt::format("wait for {}", fmt::join(keys, ", ")),
                             status);
  }
  std::vector<std::string> values(reply.values().begin(), reply.values().end());
  if (want_values && values.size() != keys.size()) {
    return internal_error("rendezvous store at {}: {} values for {} keys", state_->address,
                          values.size(), keys.size());
  }
  return values;
}

}  // namespace folio::dist
