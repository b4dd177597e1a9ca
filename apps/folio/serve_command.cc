// folio serve: the OpenAI-compatible HTTP server over one model (and its LoRA adapters), until
// SIGINT or SIGTERM, which shut it down gracefully (new requests get 503, requests in flight
// finish).
#include <pthread.h>
#include <sys/resource.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "apps/folio/commands.h"
#include "apps/folio/engine_options.h"
#include "apps/folio/shutdown_signals.h"
#include "folio/server/server.h"

namespace folio::app {
namespace {

struct ServeOptions {
  EngineCommandOptions engine;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model_name;
  std::string api_key;
  std::string chat_template;  // empty: from the model
  std::string default_chat_template = "chatml";
  int64_t max_body_kib = 1024;
  int32_t max_prompt_tokens = 0;
  int32_t max_tokens = 4096;
  int32_t max_queued = 256;
  int32_t default_priority = 0;
  int32_t idle_timeout_seconds = 60;
  int32_t header_timeout_seconds = 10;
  int32_t body_timeout_seconds = 30;
  int32_t write_timeout_seconds = 30;
  int32_t io_threads = 2;
  int64_t max_connections = 16384;
  int32_t shutdown_grace_seconds = 30;
  bool allow_lora_loading = false;
};

Result<server::ServerOptions> server_options(const ServeOptions& options) {
  server::ServerOptions result;
  result.host = options.host;
  result.api_key = options.api_key;
  if (result.api_key.empty()) {
    if (const char* key = std::getenv("FOLIO_API_KEY")) result.api_key = key;
  }
  result.max_body_bytes = static_cast<size_t>(options.max_body_kib) << 10;
  result.max_prompt_tokens = options.max_prompt_tokens;
  result.protocol.max_tokens = options.max_tokens;
  result.max_pending_requests = options.max_queued;
  result.default_priority = options.default_priority;
  result.idle_timeout = std::chrono::seconds(options.idle_timeout_seconds);
  result.header_timeout = std::chrono::seconds(options.header_timeout_seconds);
  result.body_timeout = std::chrono::seconds(options.body_timeout_seconds);
  result.write_timeout = std::chrono::seconds(options.write_timeout_seconds);
  result.num_io_threads = options.io_threads;
  result.max_connections = options.max_connections;
  result.allow_lora_loading = options.allow_lora_loading;
  FOLIO_ASSIGN_OR_RETURN(result.default_chat_template,
                         server::chat_template_from_name(options.default_chat_template));
  if (!options.chat_template.empty()) {
    FOLIO_ASSIGN_OR_RETURN(result.chat_template_override,
                           server::chat_template_from_name(options.chat_template));
  }
  return result;
}

void run_serve(const ServeOptions& options) {
  ShutdownSignals shutdown_signals;  // before any thread starts
  // Each connection is a descriptor: the soft limit (often 1024) would cap --max-connections
  // long before memory does, so take the hard limit.
  rlimit open_files{};
  if (getrlimit(RLIMIT_NOFILE, &open_files) == 0 && open_files.rlim_cur < open_files.rlim_max) {
    open_files.rlim_cur = open_files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &open_files);
  }

  Result<server::ServerOptions> server_settings = server_options(options);
  check_command(server_settings.status());
  EngineCommandOptions engine_options = options.engine;
  // Adapters loaded later need the adapter-aware graphs and the manager from the start.
  engine_options.adapters = engine_options.adapters || options.allow_lora_loading;
  Result<std::unique_ptr<engine::ModelEngine>> bundle = start_model_engine(engine_options);
  check_command(bundle.status());
  engine::ModelEngine& model_engine = **bundle;
  const std::string name = options.model_name.empty()
                               ? std::filesystem::path(options.engine.model_path).stem().string()
                               : options.model_name;
  model_engine.engine().start();
  Result<std::unique_ptr<server::Server>> server =
      server::Server::create(*server_settings, server::serve_model_engine(model_engine, name));
  check_command(server.status());
  Result<int> port = (*server)->start(options.port);
  check_command(port.status());
  std::fprintf(stderr, "folio serve: model '%s', chat template %s, listening on http://%s:%d\n",
               name.c_str(),
               std::string(server::chat_template_name((*server)->chat_template())).c_str(),
               options.host.c_str(), *port);
  if (lora::AdapterManager* adapters = model_engine.adapters()) {
    std::fprintf(
        stderr,
        "folio serve: LoRA adapters: %zu registered (requests name one in 'model'), "
        "loading at run time %s\n",
        adapters->list().size(),
        options.allow_lora_loading ? "on (/v1/load_lora_adapter)" : "off (--allow-lora-loading)");
  }
  std::fflush(stderr);
  const int received = shutdown_signals.wait();
  std::fprintf(stderr, "folio serve: signal %d, shutting down (requests in flight: %lld)\n",
               received, static_cast<long long>((*server)->num_in_flight()));
  (*server)->shutdown(std::chrono::seconds(options.shutdown_grace_seconds));
  model_engine.engine().stop();
  std::fprintf(stderr, "folio serve: stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* command = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible API");
  add_engine_options(*command, options->engine);
  command->add_option("--host", options->host, "Address to bind (loopback by default)")
      ->capture_default_str();
  command->add_option("--port", options->port, "TCP port (0: any free port)")
      ->capture_default_str();
  command->add_option("--model-name", options->model_name,
                      "Model id clients send (default: the file name without extension)");
  command->add_option("--api-key", options->api_key,
                      "Require 'Authorization: Bearer KEY' on /v1 (or set FOLIO_API_KEY)");
  command->add_option("--chat-template", options->chat_template,
                      "Override the model's chat template: chatml, llama3, llama2, mistral-v1, "
                      "mistral-v3, zephyr, phi3, gemma");
  command
      ->add_option("--default-chat-template", options->default_chat_template,
                   "Template when the model's is missing or not recognised")
      ->capture_default_str();
  command->add_option("--max-body-kib", options->max_body_kib, "Largest request body, KiB")
      ->capture_default_str();
  command->add_option("--max-prompt-tokens", options->max_prompt_tokens,
                      "Longest prompt (0: the context length minus one)");
  command->add_option("--max-tokens-limit", options->max_tokens, "Largest max_tokens accepted")
      ->capture_default_str();
  command
      ->add_option("--default-priority", options->default_priority,
                   "Priority of requests that send none; as the API's `priority`, lower runs "
                   "first (admitted before, preempted after higher values)")
      ->capture_default_str();
  command
      ->add_option("--max-queued", options->max_queued,
                   "Requests in flight before new ones get 429")
      ->capture_default_str();
  command
      ->add_option("--idle-timeout", options->idle_timeout_seconds,
                   "Seconds a connection may wait without beginning a request (new or kept "
                   "alive)")
      ->capture_default_str();
  command
      ->add_option("--header-timeout", options->header_timeout_seconds,
                   "Seconds from a request's first byte to the end of its header")
      ->capture_default_str();
  command
      ->add_option("--body-timeout", options->body_timeout_seconds,
                   "Seconds to read a request body after its header")
      ->capture_default_str();
  command
      ->add_option("--write-timeout", options->write_timeout_seconds,
                   "Seconds one write may wait for the client; a client that stops reading "
                   "longer is dropped and its request cancelled")
      ->capture_default_str();
  command
      ->add_option("--io-threads", options->io_threads,
                   "Threads serving every connection (an event loop: a connection holds no "
                   "thread)")
      ->capture_default_str();
  command
      ->add_option("--max-connections", options->max_connections,
                   "Open client connections; more are closed at once")
      ->capture_default_str();
  command
      ->add_option("--shutdown-grace", options->shutdown_grace_seconds,
                   "Seconds requests in flight get to finish on SIGINT/SIGTERM")
      ->capture_default_str();
  command->add_flag("--allow-lora-loading", options->allow_lora_loading,
                    "Turn on POST /v1/load_lora_adapter and /v1/unload_lora_adapter (any client "
                    "may then make the server open a file: use --api-key)");
  command->callback([options] { run_serve(*options); });
}

}  // namespace folio::app
