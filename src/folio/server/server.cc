#include "folio/server/server.h"

#include <algorithm>

#include <fmt/format.h>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/server/generation_handler.h"

namespace folio::server {
namespace {

// Route label of a path, from a fixed set so a client cannot grow the metric's series.
std::string_view route_label(const std::string& path) {
  for (std::string_view route :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
        "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/tokenize", "/detokenize"}) {
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

// The routes: authentication, then dispatch by method and path. Runs on io threads.
class Server::Service final : public HttpService {
 public:
  explicit Service(Server& server) : server_(server) {}

  void handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override {
    Server& server = server_;
    const std::string_view route = route_label(request.path);
    if (!server.options_.api_key.empty() && request.path.rfind("/v1/", 0) == 0 &&
        !equal_in_constant_time(request.header("Authorization"),
                                "Bearer " + server.options_.api_key)) {
      return server.answer(
          *exchange, route,
          error_response(401, "a valid API key is required: Authorization: Bearer <key>",
                         kAuthenticationError, "invalid_api_key"));
    }
    const bool get = request.method == "GET";
    const bool post = request.method == "POST";
    if (post && request.path == "/v1/completions") {
      return server.handlers_->generate(Endpoint::kCompletions, request, exchange);
    }
    if (post && request.path == "/v1/chat/completions") {
      return server.handlers_->generate(Endpoint::kChatCompletions, request, exchange);
    }
    if (post && request.path == "/tokenize") {
      return server.answer(*exchange, route, server.handlers_->tokenize(request));
    }
    if (post && request.path == "/detokenize") {
      return server.answer(*exchange, route, server.handlers_->detokenize(request));
    }
    if (get && request.path == "/v1/models") {
      HttpResponse response;
      response.body = format_model_list(server.catalog_.models(), server.created_seconds_);
      return server.answer(*exchange, route, std::move(response));
    }
    if (post &&
        (request.path == "/v1/load_lora_adapter" || request.path == "/v1/unload_lora_adapter")) {
      // A load reads and checks a file: off the io threads.
      server.listener_->run_blocking(
          [&server, route, request = std::move(request), exchange = std::move(exchange)] {
            server.answer(*exchange, route,
                          request.path == "/v1/load_lora_adapter" ? server.load_adapter(request)
                                                                  : server.unload_adapter(request));
          });
      return;
    }
    if (get && request.path == "/health") {
      bool shutting_down = false;
      {
        MutexLock lock(server.mutex_);
        shutting_down = server.shutting_down_;
      }
      if (shutting_down) {
        return server.answer(*exchange, route, error_response(503, "shutting down", kServerError));
      }
      // Never 200 over an engine that cannot serve: a pipeline with a worker lost and not yet
      // replaced, or a loop stuck in a step (liveness) while requests wait.
      const engine::EngineHealth health = server.model_.engine->health();
      if (!health.runner_available) {
        return server.answer(
            *exchange, route,
            error_response(503,
                           "the engine's step runner is unavailable (no complete worker group)",
                           kServerError));
      }
      const double liveness_seconds =
          std::chrono::duration<double>(server.options_.liveness_timeout).count();
      if (health.has_work && health.seconds_since_progress > liveness_seconds) {
        return server.answer(
            *exchange, route,
            error_response(
                503,
                fmt::format("the engine loop has not advanced for {:.1f} s (limit {:.1f} s)",
                            health.seconds_since_progress, liveness_seconds),
                kServerError));
      }
      HttpResponse response;
      response.body = "{\"status\":\"ok\"}";
      return server.answer(*exchange, route, std::move(response));
    }
    if (get && request.path == "/metrics") {
      HttpResponse response;
      response.content_type = std::string(metrics::kExpositionContentType);
      response.body = server.model_.registry->render();
      return server.answer(*exchange, route, std::move(response));
    }
    server.answer(
        *exchange, route,
        error_response(404, fmt::format("no route for {} {}", request.method, request.path),
                       kInvalidRequestError, "not_found"));
  }

  HttpResponse refusal(int status, std::string_view target) override {
    const std::string path(target.substr(0, target.find('?')));
    HttpResponse response;
    switch (status) {
      case 413:
        response = error_response(413,
                                  fmt::format("the request body exceeds the limit of {} bytes",
                                              server_.options_.max_body_bytes),
                                  kInvalidRequestError, "body_too_large");
        break;
      case 431:
        response = error_response(431,
                                  fmt::format("the request header exceeds the limit of {} bytes",
                                              server_.options_.max_header_bytes),
                                  kInvalidRequestError, "header_too_large");
        break;
      case 400:
        response = error_response(400, "the request is not valid HTTP/1.1", kInvalidRequestError);
        break;
      default:
        response = error_response(status, "internal server error", kServerError);
        break;
    }
    server_.metrics_->on_response(route_label(path), status);
    return response;
  }

 private:
  Server& server_;
};

Result<std::unique_ptr<Server>> Server::create(const ServerOptions& options, ServedModel model) {
  if (model.engine == nullptr || model.tokenizer == nullptr || model.registry == nullptr) {
    return invalid_argument("a served model needs an engine, a tokenizer and a registry");
  }
  if (model.context_length < 2) {
    return invalid_argument("the context length must be at least 2, got {}", model.context_length);
  }
  if (options.max_pending_requests < 1 || options.max_body_bytes < 1 ||
      options.protocol.max_tokens < 1 || options.protocol.default_max_tokens < 1) {
    return invalid_argument("server limits (queue, body bytes, max tokens) must be positive");
  }
  if (options.default_priority < -kMaxRequestPriority ||
      options.default_priority > kMaxRequestPriority) {
    return invalid_argument("default priority {} must be within [-{}, {}]",
                            options.default_priority, kMaxRequestPriority, kMaxRequestPriority);
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
  metrics::Registry& registry = *model.registry;
  std::unique_ptr<Server> server(
      new Server(options, std::move(model), std::move(catalog), chat_template, std::move(metrics)));
  HttpListenerOptions listener_options;
  listener_options.host = options.host;
  listener_options.num_io_threads = options.num_io_threads;
  listener_options.max_connections = options.max_connections;
  listener_options.max_header_bytes = options.max_header_bytes;
  listener_options.max_body_bytes = options.max_body_bytes;
  listener_options.idle_timeout = options.idle_timeout;
  listener_options.header_timeout = options.header_timeout;
  listener_options.body_timeout = options.body_timeout;
  listener_options.write_timeout = options.write_timeout;
  listener_options.send_buffer_bytes = options.send_buffer_bytes;
  FOLIO_ASSIGN_OR_RETURN(server->listener_,
                         HttpListener::create(listener_options, *server->service_, registry));
  return server;
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
      handlers_(std::make_unique<Handlers>(*this)),
      service_(std::make_unique<Service>(*this)) {}
Server::~Server() {
  shutdown(std::chrono::milliseconds(0));
}

Result<int> Server::start(int port) {
  return listener_->start(port);
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
      for (const auto& [id, stream] : running_) model_.engine->cancel(id);
      lock.wait_for(drained_, std::chrono::seconds(10), nothing_in_flight);
    }
    stopped_ = true;
  }
  if (listener_ != nullptr) listener_->stop();  // null only when create() failed half way
  // Requests the engine has not finished yet (abandoned, or cancelled above) keep their streams
  // in the engine's callbacks: their hooks, which refer to connections and the io_context, go
  // now, while the io_context still exists.
  std::unordered_map<engine::RequestId, std::shared_ptr<RequestStream>> running;
  {
    MutexLock lock(mutex_);
    running.swap(running_);
  }
  for (const auto& [id, stream] : running) stream->set_notify(nullptr);
}

void Server::answer(HttpExchange& exchange, std::string_view route, HttpResponse response) {
  metrics_->on_response(route, response.status);
  exchange.respond(std::move(response));
}

HttpResponse Server::load_adapter(const HttpRequest& request) {
  // Off is answered before the body is read, so a client learns how to turn it on whatever it
  // sent.
  if (const Status off = catalog_.check_loading_allowed(); !off.ok()) {
    return error_response(404, off.message(), kInvalidRequestError, "lora_loading_disabled");
  }
  Result<LoadAdapterRequest> parsed = parse_load_adapter_request(request.body);
  if (!parsed.ok()) {
    return error_response(400, parsed.status().message(), kInvalidRequestError);
  }
  // Every refusal is about what the client asked for (a file that is missing, corrupt or made
  // for another model, a name in use): 400, and nothing was registered.
  Result<ModelEntry> loaded = catalog_.load(*parsed);
  if (!loaded.ok()) {
    return error_response(400, loaded.status().message(), kInvalidRequestError,
                          loaded.status().code() == StatusCode::kAlreadyExists ? "adapter_exists"
                                                                               : "invalid_adapter");
  }
  log::info("server: loaded LoRA adapter '{}' from {}", parsed->name, parsed->path);
  HttpResponse response;
  response.body = format_model(*loaded, created_seconds_);
  return response;
}

HttpResponse Server::unload_adapter(const HttpRequest& request) {
  if (const Status off = catalog_.check_loading_allowed(); !off.ok()) {
    return error_response(404, off.message(), kInvalidRequestError, "lora_loading_disabled");
  }
  Result<std::string> name = parse_unload_adapter_request(request.body);
  if (!name.ok()) return error_response(400, name.status().message(), kInvalidRequestError);
  const Status unloaded = catalog_.unload(*name);
  if (!unloaded.ok()) {
    const bool unknown = unloaded.code() == StatusCode::kNotFound;
    return error_response(unknown ? 404 : 400, unloaded.message(), kInvalidRequestError,
                          unknown ? "model_not_found" : std::string_view());
  }
  log::info("server: unloaded LoRA adapter '{}'", *name);
  HttpResponse response;
  response.body = format_deleted_model(*name);
  return response;
}

int64_t Server::num_in_flight() const {
  MutexLock lock(mutex_);
  return in_flight_;
}

int64_t Server::num_connections() const {
  return listener_ != nullptr ? listener_->num_connections() : 0;
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

void Server::register_running(engine::RequestId id, std::shared_ptr<RequestStream> stream) {
  MutexLock lock(mutex_);
  running_.emplace(id, std::move(stream));
}

void Server::unregister_running(engine::RequestId id) {
  MutexLock lock(mutex_);
  running_.erase(id);
}

}  // namespace folio::server
