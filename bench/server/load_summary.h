// LoadSummary: the figures of one load run (load_runner.h), as a table and as JSON, plus the
// change of the server's own counters over the run, read from its Prometheus /metrics text.
//
// Definitions. The *benchmark time* runs from the start of the measurement window to the end
// of the last counted request (at least the window's end), so requests still streaming when the
// window closes count whole and the rates are not inflated. requests/s = succeeded requests /
// benchmark time; output tokens/s = output tokens of the succeeded requests / benchmark time.
// Latency percentiles (TTFT, TPOT, inter-token gap, end-to-end) are over succeeded requests
// only; TPOT is per request (tokens after the first / time after the first), the inter-token
// gaps are pooled over every request. Percentiles are folio::percentile's (base/percentile.h:
// linear interpolation between the closest ranks, numpy's default), the same as `folio bench`.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/server/load_runner.h"

namespace folio::bench {

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution distribution_of(std::vector<double> values);

struct LoadSummary {
  int32_t num_clients = 0;
  std::string endpoint;  // "completions" or "chat"
  int32_t max_tokens = 0;
  double window_seconds = 0;     // the measurement window's length
  double benchmark_seconds = 0;  // the window's start to the last counted request's end
  int64_t num_warmup_requests = 0;
  std::array<int64_t, kNumRequestOutcomes> num_requests_by_outcome{};
  int64_t num_failed = 0;
  int64_t output_tokens = 0;  // of the succeeded requests
  double requests_per_second = 0;
  double output_tokens_per_second = 0;
  Distribution ttft_ms, tpot_ms, inter_token_ms, end_to_end_ms, output_tokens_per_request;
  std::string first_error;  // the first failed request's error, for the reader to act on
  std::map<std::string, double> server_counter_deltas;  // nonzero changes of server counters
};

LoadSummary summarize(const LoadRun& run);

nlohmann::json to_json(const LoadSummary& summary);
// The human-readable table server_load prints.
std::string format_summary(const LoadSummary& summary);

// The counters of a Prometheus text exposition (format 0.0.4): for each family whose `# TYPE`
// is counter, the sum of its samples over all label sets. Lines it cannot read are skipped, so
// a partial scrape yields the counters it does contain.
std::map<std::string, double> parse_prometheus_counters(std::string_view text);

// after - before for every counter in `after` whose value changed (a counter missing before
// counts from 0).
std::map<std::string, double> counter_deltas(const std::map<std::string, double>& before,
                                             const std::map<std::string, double>& after);

}  // namespace folio::bench
