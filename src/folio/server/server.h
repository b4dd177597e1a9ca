// Server: the OpenAI-compatible HTTP API over one served model (docs/design/server.md).
//
// Routes: POST /v1/completions, POST /v1/chat/completions (JSON answers, or server-sent events
// with "stream": true), GET /v1/models, GET /health, GET /metrics (Prometheus text), and POST
// /v1/load_lora_adapter, /v1/unload_lora_adapter (only with ServerOptions::allow_lora_loading).
// Every error is an OpenAI-style JSON body: 400 bad input (or an adapter that cannot be loaded),
// 401 a missing or wrong API key, 404 an unknown route, model or adapter, 413 a body above the
// limit, 429 the queue is full, 500 the engine failed a request, 503 the server is shutting
// down.
//
// Models: a request's `model` names the base model (its served name) or a LoRA adapter
// registered with the engine's adapter manager, by name (model_catalog.h).
//
// Lifecycle: create() -> start() (binds, serves on its own threads) -> shutdown() (new
// requests get 503, requests in flight finish, then the listener stops). The engine is
// borrowed: the caller starts it before start() and stops it after shutdown().
//
// Requests in flight: a generation request counts from acceptance until its answer is written
// (or its client is gone). At most ServerOptions::max_pending_requests are in flight; more get
// 429. A client that disconnects (or, streaming, stops reading for the write timeout) has its
// request cancelled in the engine, which frees its KV blocks at the next step.
//
// Front end: an event loop (http_listener.h) on a few io threads serves every connection; no
// thread waits for a client or for tokens. Slow or idle clients hold memory, not threads, up to
// max_connections, each bounded by the header, body and write limits and timeouts.
//
// Thread-safety: start() and shutdown() from one controlling thread; requests are handled on
// the listener's io threads and talk to the engine only through Engine::submit / cancel and the
// request's RequestStream (request_stream.h); the adapter routes register and unregister
// adapters through the (thread-safe) adapter manager, on the listener's blocking thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "folio/base/metrics.h"
#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/engine/engine.h"
#include "folio/engine/model_engine.h"
#include "folio/exec/graph_cache.h"
#include "folio/server/chat_template.h"
#include "folio/server/http_exchange.h"
#include "folio/server/http_listener.h"
#include "folio/server/model_catalog.h"
#include "folio/server/openai_protocol.h"
#include "folio/server/request_stream.h"
#include "folio/server/server_metrics.h"
#include "folio/tokenizer/tokenizer.h"

namespace folio::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback only unless asked
  std::string api_key;             // non-empty: /v1/* need "Authorization: Bearer <key>"
  size_t max_body_bytes = size_t{1} << 20;
  int32_t max_prompt_tokens = 0;  // 0: the context length minus one
  int32_t max_pending_requests = 256;
  // The priority of requests that bring none (vLLM's convention: lower runs first).
  int32_t default_priority = 0;
  ProtocolLimits protocol;
  // Connections (http_listener.h): a few io threads serve them all.
  int32_t num_io_threads = 2;
  int64_t max_connections = 16384;                   // open sockets; more are closed at once
  size_t max_header_bytes = size_t{16} << 10;        // more: 431
  std::chrono::milliseconds idle_timeout{60'000};    // no request begun (new or kept alive)
  std::chrono::milliseconds header_timeout{10'000};  // first byte to the end of the header
  std::chrono::milliseconds body_timeout{30'000};    // end of the header to the end of the body
  std::chrono::milliseconds write_timeout{30'000};   // each write; a client that stops reading
                                                     // longer is dropped, its request cancelled
  int32_t send_buffer_bytes = 0;  // SO_SNDBUF of client sockets; 0: the system's default
  // Used when the model's template is not one the server recognises (or it has none).
  ChatTemplate default_chat_template = ChatTemplate::kChatMl;
  std::optional<ChatTemplate> chat_template_override;  // set: ignore the model's template
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter register and unregister adapters;
  // off, they answer 404. Any client may then make the server open a file of its choosing (it
  // is only parsed as an adapter, never shown), so pair it with an API key. Needs
  // ServedModel::adapters.
  bool allow_lora_loading = false;
  // GET /health answers 503 when the engine has work and its loop has not finished a step for
  // this long (a stuck step: a worker that hangs without closing its connection).
  std::chrono::milliseconds liveness_timeout{60'000};
};

// What the server serves; everything borrowed must outlive the server.
struct ServedModel {
  engine::Engine* engine = nullptr;                    // required; started by the caller
  const tokenizer::Tokenizer* tokenizer = nullptr;     // required; the engine's text decoder's
  metrics::Registry* registry = nullptr;               // required; rendered by /metrics
  std::string name;                                    // the model id clients send and see
  int32_t context_length = 0;                          // the engine's context limit, > 1
  std::string chat_template_source;                    // tokenizer.chat_template, "" when absent
  std::function<exec::GraphCacheStats()> graph_stats;  // optional
  // The engine's adapters (requests may name them); null: the base model alone.
  lora::AdapterManager* adapters = nullptr;
};

// The model behind a ModelEngine, named `name`, with its adapters when it has them.
ServedModel serve_model_engine(engine::ModelEngine& model_engine, std::string name);

class Server {
 public:
  // Errors (kInvalidArgument): missing parts, a context length below 2, non-positive limits,
  // allow_lora_loading without adapters, an adapter with the served model's name; the
  // registry's errors for conflicting metric families.
  static Result<std::unique_ptr<Server>> create(const ServerOptions& options, ServedModel model);
  // Shuts down if still running.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds options.host:port (0: any free port) and starts serving. Returns the bound port.
  // kUnavailable when the address cannot be bound. Requires: not started.
  Result<int> start(int port);
  // Stops taking requests (503), waits up to `grace` for requests in flight to finish, cancels
  // those still running after it, then stops the listener and joins its threads. Idempotent.
  void shutdown(std::chrono::milliseconds grace = std::chrono::seconds(30));

  ChatTemplate chat_template() const { return chat_template_; }
  int64_t num_in_flight() const;
  // Client sockets open now (0 before start()).
  int64_t num_connections() const;

 private:
  class Handlers;
  friend class Handlers;
  class Service;
  friend class Service;

  Server(const ServerOptions& options, ServedModel model, ModelCatalog catalog,
         ChatTemplate chat_template, std::unique_ptr<ServerMetrics> metrics);
  // Run on the listener's blocking thread (a load reads and checks a file).
  HttpResponse load_adapter(const HttpRequest& request);
  HttpResponse unload_adapter(const HttpRequest& request);

  // Admission: false (and nothing counted) when shutting down or full; see `refusal`.
  enum class Admission : uint8_t { kAdmitted, kShuttingDown, kQueueFull };
  Admission admit();
  void release();
  // Counts the answer in the metrics and sends it. Any thread.
  void answer(HttpExchange& exchange, std::string_view route, HttpResponse response);
  // A submitted request whose completion has not been drained yet: cancelled on a late
  // shutdown, and its stream's notify hook cleared when the listener stops.
  void register_running(engine::RequestId id, std::shared_ptr<RequestStream> stream);
  void unregister_running(engine::RequestId id);

  const ServerOptions options_;
  const ServedModel model_;
  const ModelCatalog catalog_;
  const ChatTemplate chat_template_;
  const int64_t created_seconds_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Handlers> handlers_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<HttpListener> listener_;
  std::atomic<int64_t> next_response_id_{1};

  mutable Mutex mutex_;
  std::condition_variable drained_;  // notified when in_flight_ drops, under no lock
  int64_t in_flight_ FOLIO_GUARDED_BY(mutex_) = 0;
  bool shutting_down_ FOLIO_GUARDED_BY(mutex_) = false;
  bool stopped_ FOLIO_GUARDED_BY(mutex_) = false;
  std::unordered_map<engine::RequestId, std::shared_ptr<RequestStream>> running_
      FOLIO_GUARDED_BY(mutex_);
};

}  // namespace folio::server
