#include "folio/server/server.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <httplib.h>

#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/server/generation_handler.h"

namespace folio::server {
namespace {

// Route label of a path, from a fixed set so a client cannot grow the metric's series.
std::string_view route_label(const std::string& path) {
  for (std::string_view route : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                                 "/metrics", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"}) {
    if (path == route) return route;
  }
  return "other";
}

// Compares without an early exit, so the time taken does not reveal how much of a guessed key
// was right.
bool equal_in_constant_time(std::string_view a, std::string_view b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  const size_t size = std::min(a.size(), b.size());
  for (size_t index = 0; index < size; ++index) {
    difference |= static_cast<unsigned char>(a[index] ^ b[index]);
  }
  return difference == 0;
}

// The body of an error httplib answered by itself (no route, body too large, unreadable
// request), or that a handler left without a body.
void fill_error_body(const httplib::Request& request, httplib::Response& response,
                     size_t max_body_bytes) {
  switch (response.status) {
    case 404:
      send_error(response, 404, fmt::format("no route for {} {}", request.method, request.path),
                 kInvalidRequestError, "not_found");
      return;
    case 413:
      send_error(response, 413,
                 fmt::format("the request body exceeds the limit of {} bytes", max_body_bytes),
                 kInvalidRequestError, "body_too_large");
      return;
    default:
      send_error(response, response.status,
                 fmt::format("the request could not be served (HTTP {})", response.status),
                 response.status >= 500 ? kServerError : kInvalidRequestError);
  }
}

}  // namespace

ServedModel serve_model_engine(engine::ModelEngine& model_engine, std::string name) {
  ServedModel served;
  served.engine = &model_engine.engine();
  served.tokenizer = &model_engine.model().tokenizer();
  served.registry = &model_engine.registry();
  served.name = std::move(name);
  served.context_length = model_engine.block_manager().options().max_context_tokens;
  if (Result<std::string_view> source =
          model_engine.model().file().get_string("tokenizer.chat_template");
      source.ok()) {
    served.chat_template_source = std::string(*source);
  }
  exec::Executor* executor = &model_engine.executor();
  served.graph_stats = [executor] { return executor->stats(); };
  served.adapters = model_engine.adapters();
  return served;
}

Result<std::unique_ptr<Server>> Server::create(const ServerOptions& options, ServedModel model) {
  if (model.engine == nullptr || model.tokenizer == nullptr || model.registry == nullptr) {
    return invalid_argument("a served model needs an engine, a tokenizer and a registry");
  }
  if (model.context_length < 2) {
    return invalid_argument("the context length must be at least 2, got {}", model.context_length);
  }
  if (options.max_pending_requests < 1 || options.num_http_threads < 1 ||
      options.max_body_bytes < 1 || options.protocol.max_tokens < 1 ||
      options.protocol.default_max_tokens < 1) {
    return invalid_argument(
        "server limits (queue, threads, body bytes, max tokens) must be "
        "positive");
  }
  FOLIO_ASSIGN_OR_RETURN(ModelCatalog catalog, ModelCatalog::create(model.name, model.adapters,
                                                                    options.allow_lora_loading));
  ChatTemplate chat_template = options.default_chat_template;
  if (options.chat_template_override.has_value()) {
    chat_template = *options.chat_template_override;
  } else if (std::optional<ChatTemplate> detected =
                 detect_chat_template(model.chat_template_source)) {
    chat_template = *detected;
  }
  FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<ServerMetrics> metrics,
                         ServerMetrics::create(*model.registry, model.graph_stats));
  return std::unique_ptr<Server>(
      new Server(options, std::move(model), std::move(catalog), chat_template, std::move(metrics)));
}

Server::Server(const ServerOptions& options, ServedModel model, ModelCatalog catalog,
               ChatTemplate chat_template, std::unique_ptr<ServerMetrics> metrics)
    : options_(options),
      model_(std::move(model)),
      catalog_(std::move(catalog)),
      chat_template_(chat_template),
      created_seconds_(std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count()),
      metrics_(std::move(metrics)),
      http_(std::make_unique<httplib::Server>()),
      handlers_(std::make_unique<Handlers>(*this)) {
  httplib::Server& http = *http_;
  const auto threads = static_cast<size_t>(options_.num_http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options_.max_body_bytes);
  // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds each one
  // until the client's (delayed) ACK, adding tens of milliseconds to every token's latency.
  http.set_tcp_nodelay(true);
  http.set_read_timeout(options_.read_timeout);
  http.set_write_timeout(options_.write_timeout);
  http.set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(options_.keep_alive_timeout).count()));
  http.set_pre_routing_handler(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (options_.api_key.empty() || request.path.rfind("/v1/", 0) != 0) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        const std::string header = request.get_header_value("Authorization");
        if (equal_in_constant_time(header, "Bearer " + options_.api_key)) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        send_error(response, 401, "a valid API key is required: Authorization: Bearer <key>",
                   kAuthenticationError, "invalid_api_key");
        return httplib::Server::HandlerResponse::Handled;
      });
  http.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (response.body.empty()) fill_error_body(request, response, options_.max_body_bytes);
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& exception) {
          what = exception.what();
        } catch (...) {
        }
        log::error("server: a handler threw: {}", what);
        send_error(response, 500, "internal server error", kServerError);
      });
  // Called once per answered request, after its last byte (also for httplib's own errors).
  http.set_logger([this](const httplib::Request& request, const httplib::Response& response) {
    metrics_->on_response(route_label(request.path), response.status);
  });
  http.Post("/v1/completions",
            [this](const httplib::Request& request, httplib::Response& response) {
              handlers_->generate(Endpoint::kCompletions, request, response);
            });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& request, httplib::Response& response) {
              handlers_->generate(Endpoint::kChatCompletions, request, response);
            });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(format_model_list(catalog_.models(), created_seconds_),
                         "application/json");
  });
  http.Post("/v1/load_lora_adapter",
            [this](const httplib::Request& request, httplib::Response& response) {
              load_adapter(request, response);
            });
  http.Post("/v1/unload_lora_adapter",
            [this](const httplib::Request& request, httplib::Response& response) {
              unload_adapter(request, response);
            });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    MutexLock lock(mutex_);
    if (shutting_down_) return send_error(response, 503, "shutting down", kServerError);
    response.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(model_.registry->render(), std::string(metrics::kExpositionContentType));
  });
}

Server::~Server() {
  shutdown(std::chrono::milliseconds(0));
}

Result<int> Server::start(int port) {
  FOLIO_CHECK(!listen_thread_.joinable(), "Server::start() called twice");
  // Debian's compiled cpp-httplib listens with a backlog of 5: a burst of clients overflows
  // the accept queue, and the kernel's SYN-cookie fallback then loses some connections (seen
  // as failed reads in the 32-client test). The socket-options hook hands us the listening
  // socket (the last one it sees is the one that bound); listen() again raises the backlog.
  int listening_socket = -1;
  http_->set_socket_options([&listening_socket](socket_t socket) {
    httplib::default_socket_options(socket);
    listening_socket = socket;
  });
  const int bound = port == 0 ? http_->bind_to_any_port(options_.host)
                              : (http_->bind_to_port(options_.host, port) ? port : -1);
  if (bound <= 0) {
    return unavailable("cannot listen on {}:{} (in use, or not an address of this machine)",
                       options_.host, port);
  }
  if (listening_socket < 0 || ::listen(listening_socket, SOMAXCONN) != 0) {
    return internal_error("cannot raise the listen backlog on {}:{}: {}", options_.host, bound,
                          std::strerror(errno));
  }
  listen_thread_ = std::thread([this] { http_->listen_after_bind(); });
  return bound;
}

void Server::shutdown(std::chrono::milliseconds grace) {
  {
    MutexLock lock(mutex_);
    if (stopped_) return;
    shutting_down_ = true;
    const auto nothing_in_flight = [&]() FOLIO_REQUIRES(mutex_) { return in_flight_ == 0; };
    if (!lock.wait_for(drained_, grace, nothing_in_flight)) {
      // Past the grace period: end what is still running; each answer then completes (as a 503
      // or an error event) and releases its slot.
      for (engine::RequestId id : running_) model_.engine->cancel(id);
      lock.wait_for(drained_, std::chrono::seconds(10), nothing_in_flight);
    }
    stopped_ = true;
  }
  http_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
}

void Server::load_adapter(const httplib::Request& request, httplib::Response& response) {
  // Off is answered before the body is read, so a client learns how to turn it on whatever it
  // sent.
  if (const Status off = catalog_.check_loading_allowed(); !off.ok()) {
    return send_error(response, 404, off.message(), kInvalidRequestError, "lora_loading_disabled");
  }
  Result<LoadAdapterRequest> parsed = parse_load_adapter_request(request.body);
  if (!parsed.ok()) {
    return send_error(response, 400, parsed.status().message(), kInvalidRequestError);
  }
  // Every refusal is about what the client asked for (a file that is missing, corrupt or made
  // for another model, a name in use): 400, and nothing was registered.
  Result<ModelEntry> loaded = catalog_.load(*parsed);
  if (!loaded.ok()) {
    return send_error(response, 400, loaded.status().message(), kInvalidRequestError,
                      loaded.status().code() == StatusCode::kAlreadyExists ? "adapter_exists"
                                                                           : "invalid_adapter");
  }
  log::info("server: loaded LoRA adapter '{}' from {}", parsed->name, parsed->path);
  response.set_content(format_model(*loaded, created_seconds_), "application/json");
}

void Server::unload_adapter(const httplib::Request& request, httplib::Response& response) {
  if (const Status off = catalog_.check_loading_allowed(); !off.ok()) {
    return send_error(response, 404, off.message(), kInvalidRequestError, "lora_loading_disabled");
  }
  Result<std::string> name = parse_unload_adapter_request(request.body);
  if (!name.ok()) return send_error(response, 400, name.status().message(), kInvalidRequestError);
  const Status unloaded = catalog_.unload(*name);
  if (!unloaded.ok()) {
    const bool unknown = unloaded.code() == StatusCode::kNotFound;
    return send_error(response, unknown ? 404 : 400, unloaded.message(), kInvalidRequestError,
                      unknown ? "model_not_found" : std::string_view());
  }
  log::info("server: unloaded LoRA adapter '{}'", *name);
  response.set_content(format_deleted_model(*name), "application/json");
}

int64_t Server::num_in_flight() const {
  MutexLock lock(mutex_);
  return in_flight_;
}

Server::Admission Server::admit() {
  MutexLock lock(mutex_);
  if (shutting_down_) return Admission::kShuttingDown;
  if (in_flight_ >= options_.max_pending_requests) return Admission::kQueueFull;
  ++in_flight_;
  metrics_->add_in_flight(1);
  return Admission::kAdmitted;
}

void Server::release() {
  {
    MutexLock lock(mutex_);
    FOLIO_CHECK(in_flight_ > 0, "released more requests than were admitted");
    --in_flight_;
    metrics_->add_in_flight(-1);
  }
  drained_.notify_all();
}

void Server::register_cancellable(engine::RequestId id) {
  MutexLock lock(mutex_);
  running_.push_back(id);
}

void Server::unregister_cancellable(engine::RequestId id) {
  MutexLock lock(mutex_);
  const auto entry = std::find(running_.begin(), running_.end(), id);
  if (entry != running_.end()) running_.erase(entry);
}

}  // namespace folio::server
