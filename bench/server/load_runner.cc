#include "bench/server/load_runner.h"

#include <httplib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

namespace folio::bench {
namespace {

// Common English words, so a tokenizer splits prompts much as it would split prose.
constexpr std::array<std::string_view, 64> kWords = {
    "the",     "of",     "and",   "to",    "in",    "is",    "was",   "that",  "for",    "on",
    "with",    "as",     "by",    "at",    "from",  "his",   "her",   "they",  "which",  "one",
    "time",    "people", "year",  "way",   "day",   "man",   "world", "life",  "hand",   "part",
    "child",   "eye",    "woman", "place", "work",  "week",  "case",  "point", "number", "group",
    "problem", "fact",   "good",  "new",   "first", "last",  "long",  "great", "little", "own",
    "other",   "old",    "right", "big",   "high",  "small", "large", "next",  "early",  "young",
    "water",   "river",  "stone", "light"};

constexpr std::chrono::milliseconds kBackoffAfterConnectionFailure{50};

std::chrono::microseconds to_microseconds(double seconds) {
  return std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

httplib::Headers request_headers(const LoadOptions& options) {
  httplib::Headers headers = {{"Accept", "text/event-stream"}};
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  return headers;
}

// What the client threads share with the thread that runs the load.
struct SharedState {
  SharedState(const LoadOptions& options, Clock::time_point run_start)
      : options(options),
        window_start(run_start + to_microseconds(options.warmup_seconds)),
        window_end(window_start + to_microseconds(options.duration_seconds)),
        num_clients_running(options.num_clients) {}

  const LoadOptions& options;
  const Clock::time_point window_start, window_end;
  // Set by the coordinating thread at the drain deadline; read by every client's content
  // receiver. Relaxed: nothing else is published through the flag, and the requests are also
  // cut off by stop() on the clients, which takes httplib's socket mutex.
  std::atomic<bool> cancel{false};

  std::mutex mutex;
  std::condition_variable client_finished;
  int32_t num_clients_running;                 // guarded by mutex
  std::vector<httplib::Client*> live_clients;  // guarded by mutex; so stop() can reach them
  std::vector<RequestRecord> records;          // guarded by mutex
  int64_t num_warmup_requests = 0;             // guarded by mutex
};

void configure(httplib::Client& client, const LoadOptions& options) {
  const auto timeout = to_microseconds(options.request_timeout_seconds);
  client.set_connection_timeout(std::chrono::duration_cast<std::chrono::seconds>(timeout).count(),
                                timeout.count() % 1000000);
  client.set_read_timeout(timeout.count() / 1000000, timeout.count() % 1000000);
  client.set_write_timeout(timeout.count() / 1000000, timeout.count() % 1000000);
  client.set_keep_alive(true);
  // httplib writes the request line and headers, then the body, in separate sends; with Nagle's
  // algorithm the body then waits for the server's delayed ACK (about 40 ms on Linux), which
  // would be added to every TTFT.
  client.set_tcp_nodelay(true);
}

RequestRecord send_one(httplib::Client& client, SharedState& shared, const std::string& body) {
  httplib::Request request;
  request.method = "POST";
  request.path =
      shared.options.endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
  request.headers = request_headers(shared.options);
  request.set_header("Content-Type", "application/json");
  request.body = body;
  StreamRecorder recorder(shared.options.endpoint, Clock::now());
  request.response_handler = [&](const httplib::Response& response) {
    recorder.on_response(response.status, response.get_header_value("Content-Type"));
    return true;
  };
  request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (shared.cancel.load(std::memory_order_relaxed)) return false;
    return recorder.on_body(std::string_view(data, size), Clock::now());
  };
  const httplib::Result result = client.send(request);
  const Clock::time_point end = Clock::now();
  std::optional<std::string> transport_error;
  if (!result) transport_error = httplib::to_string(result.error());
  const bool cut_off = !result && shared.cancel.load(std::memory_order_relaxed);
  return recorder.finish(end, std::move(transport_error), cut_off);
}

void run_client(int32_t client_index, SharedState& shared) {
  const LoadOptions& options = shared.options;
  httplib::Client client(options.url);
  configure(client, options);
  {
    std::lock_guard lock(shared.mutex);
    shared.live_clients.push_back(&client);
  }
  PromptGenerator prompts(options.seed * 1000003 + static_cast<uint64_t>(client_index),
                          options.prompt_words_min, options.prompt_words_max);
  std::vector<RequestRecord> records;
  int64_t num_warmup_requests = 0;
  while (Clock::now() < shared.window_end && !shared.cancel.load(std::memory_order_relaxed)) {
    RequestRecord record = send_one(client, shared, make_request_body(options, prompts.next()));
    const bool connection_failed = record.outcome == RequestOutcome::kConnectionFailed;
    if (record.start < shared.window_start) {
      ++num_warmup_requests;
    } else {
      records.push_back(std::move(record));
    }
    // A server that refuses connections would otherwise be hammered in a tight loop.
    if (connection_failed) std::this_thread::sleep_for(kBackoffAfterConnectionFailure);
  }
  std::lock_guard lock(shared.mutex);
  std::erase(shared.live_clients, &client);
  std::move(records.begin(), records.end(), std::back_inserter(shared.records));
  shared.num_warmup_requests += num_warmup_requests;
  --shared.num_clients_running;
  shared.client_finished.notify_all();
}

}  // namespace

Status validate(const LoadOptions& options) {
  if (options.num_clients < 1)
    return invalid_argument("--clients {}: need at least 1", options.num_clients);
  if (!(options.duration_seconds > 0)) {
    return invalid_argument("--duration {}: need a positive number of seconds",
                            options.duration_seconds);
  }
  if (!(options.warmup_seconds >= 0) || !(options.drain_timeout_seconds >= 0)) {
    return invalid_argument("--warmup {} / --drain-timeout {}: need 0 or more seconds",
                            options.warmup_seconds, options.drain_timeout_seconds);
  }
  if (!(options.request_timeout_seconds > 0)) {
    return invalid_argument("--request-timeout {}: need a positive number of seconds",
                            options.request_timeout_seconds);
  }
  if (options.max_tokens < 1)
    return invalid_argument("--max-tokens {}: need at least 1", options.max_tokens);
  if (options.prompt_words_min < 1 || options.prompt_words_max < options.prompt_words_min) {
    return invalid_argument("--prompt-len {}:{}: need 1 <= MIN <= MAX words",
                            options.prompt_words_min, options.prompt_words_max);
  }
  return Status();
}

PromptGenerator::PromptGenerator(uint64_t seed, int32_t words_min, int32_t words_max)
    : random_(seed), words_min_(words_min), words_max_(words_max) {}

std::string PromptGenerator::next() {
  const uint64_t span = static_cast<uint64_t>(words_max_ - words_min_) + 1;
  const int32_t num_words = words_min_ + static_cast<int32_t>(random_.next() % span);
  std::string prompt;
  for (int32_t i = 0; i < num_words; ++i) {
    if (i > 0) prompt.push_back(' ');
    prompt.append(kWords[random_.next() % kWords.size()]);
  }
  return prompt;
}

std::string make_request_body(const LoadOptions& options, const std::string& prompt) {
  nlohmann::json body = {
      {"model", options.model}, {"max_tokens", options.max_tokens}, {"stream", true}};
  switch (options.endpoint) {
    case Endpoint::kCompletions:
      body["prompt"] = prompt;
      break;
    case Endpoint::kChat:
      body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", prompt}}});
      break;
  }
  if (options.request_usage) body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

Result<std::string> fetch_model_id(const LoadOptions& options) {
  httplib::Client client(options.url);
  if (!client.is_valid())
    return invalid_argument("--url '{}': not scheme://host:port", options.url);
  configure(client, options);
  const httplib::Result result = client.Get("/v1/models", request_headers(options));
  if (!result) {
    return unavailable("GET {}/v1/models failed (httplib error: {}); is the server running?",
                       options.url, httplib::to_string(result.error()));
  }
  if (result->status != 200) {
    return unavailable("GET {}/v1/models: HTTP {}{}", options.url, result->status,
                       result->status == 401 ? " (pass the server's key with --api-key)" : "");
  }
  const nlohmann::json models = nlohmann::json::parse(result->body, nullptr, false);
  if (!models.is_object() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id") ||
      !models["data"][0]["id"].is_string()) {
    return data_loss("GET {}/v1/models: no data[0].id in '{}'; pass --model", options.url,
                     result->body.substr(0, 200));
  }
  return models["data"][0]["id"].get<std::string>();
}

Result<LoadRun> run_load(LoadOptions options) {
  FOLIO_RETURN_IF_ERROR(validate(options));
  if (options.model.empty()) {
    FOLIO_ASSIGN_OR_RETURN(options.model, fetch_model_id(options));
  }
  SharedState shared(options, Clock::now());
  const Clock::time_point drain_deadline =
      shared.window_end + to_microseconds(options.drain_timeout_seconds);
  std::vector<std::thread> threads;
  for (int32_t i = 0; i < options.num_clients; ++i) {
    threads.emplace_back([i, &shared] { run_client(i, shared); });
  }
  {
    std::unique_lock lock(shared.mutex);
    if (!shared.client_finished.wait_until(lock, drain_deadline,
                                           [&] { return shared.num_clients_running == 0; })) {
      shared.cancel.store(true, std::memory_order_relaxed);
      for (httplib::Client* client : shared.live_clients) client->stop();
    }
  }
  for (std::thread& thread : threads) thread.join();

  LoadRun run{.options = options,
              .window_start = shared.window_start,
              .window_end = shared.window_end,
              .last_end = shared.window_start,
              .records = std::move(shared.records),
              .num_warmup_requests = shared.num_warmup_requests};
  std::sort(run.records.begin(), run.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.start < b.start; });
  for (const RequestRecord& record : run.records) run.last_end = std::max(run.last_end, record.end);
  return run;
}

}  // namespace folio::bench
