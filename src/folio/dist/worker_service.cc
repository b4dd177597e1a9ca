#include "folio/dist/worker_service.h"

#include <unistd.h>

#include <array>
#include <random>

#include <grpcpp/grpcpp.h>

#include "folio/base/log.h"
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

class WorkerImpl final : public v1::Worker::Service {
 public:
  WorkerImpl(const WorkerServiceOptions& options, uint64_t incarnation)
      : options_(options), incarnation_(incarnation), host_name_(host_name()) {}

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

  grpc::Status Ping(grpc::ServerContext* /*context*/, const v1::PingRequest* request,
                    v1::PingReply* reply) override {
    reply->set_sequence(request->sequence());
    reply->set_worker_incarnation(incarnation_);
    return grpc::Status::OK;
  }

 private:
  const WorkerServiceOptions options_;
  const uint64_t incarnation_;
  const std::string host_name_;
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
  state->impl = std::make_unique<WorkerImpl>(options, state->incarnation);
  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(),
                           &selected_port);
  builder.RegisterService(state->impl.get());
  // Accept the coordinator's keepalive pings, also between calls.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(options.min_keepalive_interval.count()));
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

void WorkerService::shutdown(std::chrono::milliseconds grace) {
  if (state_->shut_down) return;
  state_->shut_down = true;
  state_->server->Shutdown(std::chrono::system_clock::now() + grace);
  state_->server->Wait();
}

}  // namespace folio::dist
