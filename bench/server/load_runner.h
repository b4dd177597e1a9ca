// The load: N client threads, each with its own HTTP connection, sending streaming requests to
// an OpenAI-compatible server back to back (a closed loop: a client sends its next request when
// the previous one ends) for a fixed time.
//
// Timeline: requests sent during the warm-up [start, start + warmup) are run but not counted;
// the measurement window [start + warmup, start + warmup + duration) is when counted requests
// start; after it no request starts and the ones in flight may run until the drain deadline
// (window end + drain timeout), when they are cut off and counted as cancelled. Prompts are runs
// of words drawn from a fixed list by a generator seeded with (seed, client index), so a run's
// requests are the same from one run to the next.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/server/stream_recorder.h"
#include "folio/base/random.h"
#include "folio/base/result.h"

namespace folio::bench {

struct LoadOptions {
  std::string url = "http://127.0.0.1:8080";  // scheme://host:port, no path
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;    // the `model` field sent; empty: the first id /v1/models lists
  std::string api_key;  // sent as `Authorization: Bearer KEY` when not empty
  int32_t num_clients = 1;
  double duration_seconds = 10;
  double warmup_seconds = 0;
  double drain_timeout_seconds = 30;
  double request_timeout_seconds = 60;  // the longest silence on a connection before giving up
  int32_t max_tokens = 64;
  int32_t prompt_words_min = 16;
  int32_t prompt_words_max = 64;
  uint64_t seed = 1;
  bool ignore_eos = false;    // send `ignore_eos: true` (a vLLM extension) for fixed-length outputs
  bool request_usage = true;  // send stream_options.include_usage
};

// Checks the ranges of `options` (clients >= 1, durations > 0, 1 <= min words <= max words,
// max tokens >= 1); the message names the option to fix.
Status validate(const LoadOptions& options);

struct LoadRun {
  LoadOptions options;  // with `model` filled in
  Clock::time_point window_start;
  Clock::time_point window_end;        // no request starts at or after it
  Clock::time_point last_end;          // when the last counted request ended (window_start if none)
  std::vector<RequestRecord> records;  // requests started inside the window, by start time
  int64_t num_warmup_requests = 0;
};

// The prompt of one request: `num_words` words from a fixed list, separated by spaces.
class PromptGenerator {
 public:
  PromptGenerator(uint64_t seed, int32_t words_min, int32_t words_max);
  std::string next();

 private:
  Xoshiro256StarStar random_;
  int32_t words_min_, words_max_;
};

// The JSON body of one streaming request.
std::string make_request_body(const LoadOptions& options, const std::string& prompt);

// Asks GET /v1/models for the id of the first model served.
Result<std::string> fetch_model_id(const LoadOptions& options);

// Runs the load and returns every counted request. Fails (without sending load) when the options
// are out of range or the server does not answer /v1/models; a failing request during the run is
// a record, not an error.
Result<LoadRun> run_load(LoadOptions options);

}  // namespace folio::bench
