// StreamRecorder: what one streaming request to an OpenAI-compatible server measured, worked out
// from the bytes of its response and the moment each arrived.
//
// Terms: a *text chunk* is an event of the stream whose choice carries non-empty text
// (`choices[0].text` for /v1/completions, `choices[0].delta.content` for /v1/chat/completions);
// the server sends one per generated token or a few. *TTFT* (time to first token) runs from the
// moment the request was sent to the first text chunk; the *inter-token gaps* are the times
// between consecutive text chunks; *end-to-end latency* runs to the end of the response. The
// output token count is the server's `usage.completion_tokens` when the stream carries a usage
// object (stream_options.include_usage), otherwise the number of text chunks. A well-formed
// stream is HTTP 200 with Content-Type text/event-stream, events whose data is a JSON chunk, and
// a last event `data: [DONE]`.
//
// The recorder takes time points as arguments instead of reading a clock, so tests can check its
// arithmetic exactly.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/server/sse_parser.h"

namespace folio::bench {

using Clock = std::chrono::steady_clock;

enum class Endpoint { kCompletions, kChat };

// How one request ended. Every outcome but kSucceeded is a failure and is counted on its own.
enum class RequestOutcome {
  kSucceeded,         // HTTP 200 and a well-formed event stream ended by [DONE]
  kConnectionFailed,  // no HTTP response at all (refused, reset, timed out before the headers)
  kHttpError,         // an HTTP status other than 200
  kMalformedStream,   // not an event stream, an event that is not a JSON chunk, data after [DONE]
  kErrorEvent,        // the stream carried an `error` object instead of a chunk
  kMissingDone,       // HTTP 200 but the stream ended (or broke) without `data: [DONE]`
  kCancelled,         // still running at the drain deadline and cut off by the load generator
};
inline constexpr int kNumRequestOutcomes = 7;

// A short snake_case name, used as the JSON key and in the printed table.
std::string_view outcome_name(RequestOutcome outcome);

struct RequestRecord {
  RequestOutcome outcome = RequestOutcome::kConnectionFailed;
  int http_status = 0;  // 0 when no response arrived
  Clock::time_point start;
  std::optional<Clock::time_point> first_token;  // the first text chunk's arrival
  Clock::time_point last_token;                  // the last text chunk's; start when none
  Clock::time_point end;
  int64_t num_text_chunks = 0;
  std::optional<int64_t> usage_completion_tokens;
  std::vector<double> inter_token_gaps_seconds;  // num_text_chunks - 1 entries, in order
  std::string error;                             // why the request failed; empty on success

  int64_t output_tokens() const { return usage_completion_tokens.value_or(num_text_chunks); }
  double end_to_end_seconds() const;
  // Requires: first_token.
  double time_to_first_token_seconds() const;
  // (last token - first token) / (output tokens - 1); nullopt with fewer than 2 tokens.
  std::optional<double> time_per_output_token_seconds() const;
};

// Thread-safety: none; one recorder per request, fed by the thread that runs the request.
// Invariant: once a failure is noted (failure_ set), later bytes are ignored and finish()
// reports that failure.
class StreamRecorder {
 public:
  StreamRecorder(Endpoint endpoint, Clock::time_point start);

  // The status line and Content-Type arrived.
  void on_response(int http_status, std::string_view content_type);
  // Body bytes that arrived at `now`. Returns false when reading on is pointless (the stream is
  // already known to be malformed), which tells the HTTP client to drop the connection.
  bool on_body(std::string_view bytes, Clock::time_point now);
  // The exchange is over at `now`. `transport_error` is set when the HTTP client reported a
  // failure (connection refused, read timeout, reset); `cancelled` when the load generator cut
  // the request off.
  RequestRecord finish(Clock::time_point now, std::optional<std::string> transport_error,
                       bool cancelled);

 private:
  void on_event(const SseEvent& event, Clock::time_point now);
  // Reads one JSON chunk; notes a failure when it has the wrong shape.
  void on_chunk(std::string_view data, Clock::time_point now);
  void fail(RequestOutcome outcome, std::string error);

  static constexpr size_t kMaxErrorBodyBytes = 512;

  Endpoint endpoint_;
  SseParser parser_;
  RequestRecord record_;
  bool saw_done_ = false;
  std::optional<RequestOutcome> failure_;
  std::string error_body_;  // the first bytes of a non-200 response, for the error message
};

}  // namespace folio::bench
