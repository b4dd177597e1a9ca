#include "bench/server/load_summary.h"

#include <gtest/gtest.h>

namespace folio::bench {
namespace {

using std::chrono::milliseconds;

TEST(DistributionTest, SummarizesUnsortedValues) {
  const Distribution d = distribution_of({3, 1, 2, 10});
  EXPECT_EQ(d.count, 4);
  EXPECT_DOUBLE_EQ(d.mean, 4);
  EXPECT_DOUBLE_EQ(d.p50, 2.5);
  EXPECT_DOUBLE_EQ(d.max, 10);
}

RequestRecord record_at(Clock::time_point start, int ttft_ms, int tokens, int gap_ms) {
  RequestRecord record;
  record.outcome = RequestOutcome::kSucceeded;
  record.http_status = 200;
  record.start = start;
  record.first_token = start + milliseconds(ttft_ms);
  record.last_token = *record.first_token + milliseconds(gap_ms * (tokens - 1));
  record.end = record.last_token + milliseconds(1);
  record.num_text_chunks = tokens;
  for (int i = 1; i < tokens; ++i) record.inter_token_gaps_seconds.push_back(gap_ms * 1e-3);
  return record;
}

TEST(SummarizeTest, RatesUseTheBenchmarkTimeAndLatenciesOnlySuccesses) {
  LoadRun run;
  run.options.num_clients = 2;
  run.window_start = Clock::time_point() + std::chrono::hours(1);
  run.window_end = run.window_start + milliseconds(1000);
  // Two successes; the second ends 1,000 ms after the window closes, so benchmark time is 2 s.
  run.records.push_back(record_at(run.window_start, 100, 11, 10));  // ends at 201 ms
  run.records.push_back(record_at(run.window_start + milliseconds(900), 300, 21, 40));
  RequestRecord failed;
  failed.outcome = RequestOutcome::kHttpError;
  failed.error = "HTTP 503: busy";
  failed.start = failed.end = run.window_start + milliseconds(5);
  run.records.push_back(failed);
  run.last_end = run.records[1].end;  // 900 + 300 + 800 + 1 = 2,001 ms
  run.num_warmup_requests = 4;

  const LoadSummary summary = summarize(run);
  EXPECT_DOUBLE_EQ(summary.benchmark_seconds, 2.001);
  EXPECT_DOUBLE_EQ(summary.window_seconds, 1.0);
  EXPECT_EQ(summary.num_requests_by_outcome[0], 2);
  EXPECT_EQ(summary.num_requests_by_outcome[static_cast<size_t>(RequestOutcome::kHttpError)], 1);
  EXPECT_EQ(summary.num_failed, 1);
  EXPECT_EQ(summary.first_error, "HTTP 503: busy");
  EXPECT_EQ(summary.output_tokens, 32);
  EXPECT_DOUBLE_EQ(summary.requests_per_second, 2 / 2.001);
  EXPECT_DOUBLE_EQ(summary.output_tokens_per_second, 32 / 2.001);
  EXPECT_EQ(summary.ttft_ms.count, 2);
  EXPECT_NEAR(summary.ttft_ms.p50, 200, 1e-9);
  EXPECT_NEAR(summary.tpot_ms.p50, 25, 1e-9);   // per request 10 and 40
  EXPECT_EQ(summary.inter_token_ms.count, 30);  // 10 + 20 gaps pooled
  EXPECT_NEAR(summary.inter_token_ms.p50, 40, 1e-9);
  EXPECT_NEAR(summary.end_to_end_ms.max, 1101, 1e-9);

  const nlohmann::json json = to_json(summary);
  EXPECT_EQ(json["requests"]["succeeded"], 2);
  EXPECT_EQ(json["requests"]["http_error"], 1);
  EXPECT_EQ(json["warmup_requests"], 4);
  EXPECT_DOUBLE_EQ(json["tpot_ms"]["p50"].get<double>(), summary.tpot_ms.p50);
  const std::string text = format_summary(summary);
  EXPECT_NE(text.find("2 succeeded, 1 failed, http_error 1"), std::string::npos) << text;
}

TEST(SummarizeTest, EmptyRunHasZeroRates) {
  LoadRun run;
  run.window_start = run.last_end = Clock::time_point() + std::chrono::hours(1);
  run.window_end = run.window_start + milliseconds(500);
  const LoadSummary summary = summarize(run);
  EXPECT_DOUBLE_EQ(summary.benchmark_seconds, 0.5);
  EXPECT_EQ(summary.requests_per_second, 0);
  EXPECT_EQ(summary.ttft_ms.count, 0);
}

TEST(PrometheusTest, SumsCounterSeriesAndSkipsOtherTypes) {
  const std::string text =
      "# HELP folio_preemptions Requests preempted.\n"
      "# TYPE folio_preemptions counter\n"
      "folio_preemptions{reason=\"kv_full\"} 3\n"
      "folio_preemptions{reason=\"a \\\"} b\"} 4 1700000000000\n"
      "# TYPE folio_requests_running gauge\n"
      "folio_requests_running 7\n"
      "# TYPE folio_step_seconds histogram\n"
      "folio_step_seconds_bucket{le=\"+Inf\"} 10\n"
      "folio_step_seconds_count 10\n"
      "# TYPE http_requests counter\n"
      "http_requests_total 12\n"  // OpenMetrics-style sample name
      "garbage line\n"
      "folio_preemptions{unterminated 9\n";
  const std::map<std::string, double> counters = parse_prometheus_counters(text);
  const std::map<std::string, double> expected = {{"folio_preemptions", 7},
                                                  {"http_requests_total", 12}};
  EXPECT_EQ(counters, expected);
}

TEST(PrometheusTest, DeltasKeepOnlyChangedCounters) {
  const std::map<std::string, double> before = {{"a", 1}, {"b", 5}};
  const std::map<std::string, double> after = {{"a", 4}, {"b", 5}, {"c", 2}};
  const std::map<std::string, double> expected = {{"a", 3}, {"c", 2}};
  EXPECT_EQ(counter_deltas(before, after), expected);
}

}  // namespace
}  // namespace folio::bench
