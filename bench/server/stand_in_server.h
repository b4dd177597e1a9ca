// StandInServer: a test fixture, not a server of Folio. A real local HTTP server (cpp-httplib)
// that answers the OpenAI-compatible requests folio_server_load sends with fixed, known streams,
// so the load generator's measurement logic can be checked end to end before and apart from
// `folio serve`. Each response streams `max_tokens` text chunks (" w0", " w1", ...) with a
// known delay before the first and between the others, writes its bytes in randomly sized
// pieces (so the client sees events split at arbitrary points), sends a usage chunk when asked
// and ends with `data: [DONE]`, unless a failure mode says otherwise. Finished streams are framed
// by Content-Length, the endless kStall one is chunked (stand_in_server.cc says why).
//
// Thread-safety: set_mode() and the counters may be used from any thread while the server runs.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace folio::bench::testing {

enum class StandInMode {
  kStream,      // well-formed streams
  kHttpError,   // HTTP 500 with an error body
  kMalformed,   // the second event's data is not JSON
  kNoDone,      // the stream ends without [DONE]
  kErrorEvent,  // an error object after the first chunk
  kStall,       // a chunk every 20 ms until the client goes away or the server stops
};

class StandInServer {
 public:
  // An empty `api_key` accepts every request; otherwise `Authorization: Bearer KEY` is required.
  explicit StandInServer(std::string api_key = "",
                         std::chrono::milliseconds first_chunk_delay = std::chrono::milliseconds(5),
                         std::chrono::milliseconds chunk_gap = std::chrono::milliseconds(1));
  ~StandInServer();
  StandInServer(const StandInServer&) = delete;
  StandInServer& operator=(const StandInServer&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void set_mode(StandInMode mode) { mode_.store(mode, std::memory_order_relaxed); }
  // POST requests that reached a completions handler (including rejected ones).
  int64_t num_generation_requests() const {
    return num_generation_requests_.load(std::memory_order_relaxed);
  }
  // Requests whose body did not have the shape folio_server_load must send.
  int64_t num_bad_requests() const { return num_bad_requests_.load(std::memory_order_relaxed); }
  // Requests that asked for a usage chunk (stream_options.include_usage).
  int64_t num_usage_requests() const { return num_usage_requests_.load(std::memory_order_relaxed); }

 private:
  void handle_generation(const httplib::Request& request, httplib::Response& response, bool chat);
  bool authorized(const httplib::Request& request, httplib::Response& response) const;

  std::string api_key_;
  std::chrono::milliseconds first_chunk_delay_, chunk_gap_;
  httplib::Server server_;
  int port_ = -1;
  std::thread listener_;
  // Relaxed atomics: each is a setting or a statistic standing alone, publishing nothing else.
  std::atomic<StandInMode> mode_{StandInMode::kStream};
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> num_generation_requests_{0};
  std::atomic<int64_t> num_bad_requests_{0};
  std::atomic<int64_t> num_usage_requests_{0};
  std::atomic<uint64_t> num_seeds_{0};  // gives each response its own split points
};

}  // namespace folio::bench::testing
