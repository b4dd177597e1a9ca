#include "bench/server/stand_in_server.h"

#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "folio/base/check.h"

namespace folio::bench::testing {
namespace {

std::string chunk_event(bool chat, int index) {
  const std::string text = " w" + std::to_string(index);
  nlohmann::json choice = {{"index", 0}};
  if (chat) {
    choice["delta"] = {{"content", text}};
  } else {
    choice["text"] = text;
  }
  return "data: " + nlohmann::json{{"choices", {choice}}}.dump() + "\n\n";
}

// The events of one response, in order. kStall's endless stream is produced by the caller.
std::vector<std::string> response_events(StandInMode mode, bool chat, int max_tokens,
                                         bool include_usage) {
  std::vector<std::string> events;
  if (chat)
    events.push_back(R"(data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]})"
                     "\n\n");
  for (int i = 0; i < max_tokens; ++i) {
    events.push_back(chunk_event(chat, i));
    if (i == 0 && mode == StandInMode::kMalformed) events.push_back("data: {not json\n\n");
    if (i == 0 && mode == StandInMode::kErrorEvent) {
      events.push_back(R"(data: {"error":{"message":"stand-in error event"}})"
                       "\n\n");
    }
  }
  if (include_usage) {
    events.push_back("data: " +
                     nlohmann::json{{"choices", nlohmann::json::array()},
                                    {"usage", {{"completion_tokens", max_tokens}}}}
                         .dump() +
                     "\n\n");
  }
  if (mode != StandInMode::kNoDone) events.push_back("data: [DONE]\n\n");
  return events;
}

// Writes `event` in pieces of 1 to 16 bytes. False when the client has gone.
bool write_in_pieces(httplib::DataSink& sink, const std::string& event, std::mt19937_64& random) {
  for (size_t offset = 0; offset < event.size();) {
    const size_t size = std::min<size_t>(1 + random() % 16, event.size() - offset);
    if (!sink.is_writable() || !sink.write(event.data() + offset, size)) return false;
    offset += size;
  }
  return true;
}

// Whether `body` has the shape folio_server_load must send to the stand-in.
bool well_formed_request(const nlohmann::json& body, bool chat) {
  if (!body.is_object() || body.value("model", "") != "stand-in" || !body.value("stream", false) ||
      !body.contains("max_tokens") || !body["max_tokens"].is_number_integer()) {
    return false;
  }
  if (!chat) return body.contains("prompt") && body["prompt"].is_string();
  return body.contains("messages") && body["messages"].is_array() && !body["messages"].empty() &&
         body["messages"][0].value("role", "") == "user";
}

}  // namespace

StandInServer::StandInServer(std::string api_key, std::chrono::milliseconds first_chunk_delay,
                             std::chrono::milliseconds chunk_gap)
    : api_key_(std::move(api_key)), first_chunk_delay_(first_chunk_delay), chunk_gap_(chunk_gap) {
  server_.set_keep_alive_timeout(1);
  server_.Get("/v1/models", [this](const httplib::Request& request, httplib::Response& response) {
    if (!authorized(request, response)) return;
    response.set_content(R"({"object":"list","data":[{"id":"stand-in","object":"model"}]})",
                         "application/json");
  });
  server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, /*chat=*/false);
  });
  server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(req, res, /*chat=*/true);
  });
  port_ = server_.bind_to_any_port("127.0.0.1");
  FOLIO_CHECK(port_ > 0, "stand-in server: cannot bind a port on 127.0.0.1");
  listener_ = std::thread([this] { server_.listen_after_bind(); });
  while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

StandInServer::~StandInServer() {
  stopping_.store(true, std::memory_order_relaxed);
  server_.stop();
  listener_.join();
}

bool StandInServer::authorized(const httplib::Request& request, httplib::Response& response) const {
  if (api_key_.empty() || request.get_header_value("Authorization") == "Bearer " + api_key_) {
    return true;
  }
  response.status = 401;
  response.set_content(R"({"error":{"message":"invalid API key"}})", "application/json");
  return false;
}

void StandInServer::handle_generation(const httplib::Request& request, httplib::Response& response,
                                      bool chat) {
  num_generation_requests_.fetch_add(1, std::memory_order_relaxed);
  if (!authorized(request, response)) return;
  const nlohmann::json body = nlohmann::json::parse(request.body, nullptr, false);
  if (!well_formed_request(body, chat)) {
    num_bad_requests_.fetch_add(1, std::memory_order_relaxed);
    response.status = 400;
    response.set_content(R"({"error":{"message":"stand-in: unexpected request body"}})",
                         "application/json");
    return;
  }
  const StandInMode mode = mode_.load(std::memory_order_relaxed);
  if (mode == StandInMode::kHttpError) {
    response.status = 500;
    response.set_content(R"({"error":{"message":"stand-in failure"}})", "application/json");
    return;
  }
  const bool include_usage =
      body.contains("stream_options") && body["stream_options"].value("include_usage", false);
  if (include_usage) num_usage_requests_.fetch_add(1, std::memory_order_relaxed);
  auto events = std::make_shared<std::vector<std::string>>(
      response_events(mode, chat, body["max_tokens"].get<int>(), include_usage));
  const uint64_t seed = num_seeds_.fetch_add(1, std::memory_order_relaxed);
  if (mode == StandInMode::kStall) {
    // Chunked, and never finished: the client's drain deadline has to cut it off.
    response.set_chunked_content_provider(
        "text/event-stream", [this, chat, seed](size_t, httplib::DataSink& sink) {
          std::mt19937_64 random(seed);
          std::this_thread::sleep_for(first_chunk_delay_);
          for (int i = 0; !stopping_.load(std::memory_order_relaxed); ++i) {
            if (!write_in_pieces(sink, chunk_event(chat, i), random)) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
          return false;
        });
    return;
  }
  // Finite streams are framed by Content-Length rather than chunked: ending a chunked response
  // touches a function-local static inside the (uninstrumented) httplib library, which
  // ThreadSanitizer reports as a race between server threads. The client reads both framings
  // the same way; the stall mode above keeps chunked framing covered.
  size_t length = 0;
  for (const std::string& event : *events) length += event.size();
  response.set_content_provider(
      length, "text/event-stream",
      [this, events, seed](size_t offset, size_t, httplib::DataSink& sink) {
        if (offset != 0) return false;  // everything is written by the first call
        std::mt19937_64 random(seed);
        std::this_thread::sleep_for(first_chunk_delay_);
        for (size_t i = 0; i < events->size(); ++i) {
          if (i > 0) std::this_thread::sleep_for(chunk_gap_);
          if (!write_in_pieces(sink, (*events)[i], random)) return false;
        }
        return true;
      });
}

}  // namespace folio::bench::testing
