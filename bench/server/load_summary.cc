#include "bench/server/load_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <set>

#include "folio/base/percentile.h"

namespace folio::bench {
namespace {

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

nlohmann::json distribution_json(const Distribution& distribution) {
  return {{"count", distribution.count}, {"mean", distribution.mean}, {"p50", distribution.p50},
          {"p90", distribution.p90},     {"p99", distribution.p99},   {"max", distribution.max}};
}

std::string_view trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(" \t\r");
  return text.substr(begin, end - begin + 1);
}

// Splits a sample line `name{labels} value [timestamp]` into its name and value; false when the
// line is not one.
bool parse_sample(std::string_view line, std::string_view& name, double& value) {
  size_t position = line.find_first_of("{ \t");
  if (position == std::string_view::npos) return false;
  name = line.substr(0, position);
  if (line[position] == '{') {
    bool in_quotes = false;
    for (++position; position < line.size(); ++position) {
      const char c = line[position];
      if (in_quotes && c == '\\') {
        ++position;  // an escaped character, possibly a quote
      } else if (c == '"') {
        in_quotes = !in_quotes;
      } else if (!in_quotes && c == '}') {
        break;
      }
    }
    if (position >= line.size()) return false;
    ++position;
  }
  const std::string rest(trim(line.substr(position)));
  if (rest.empty()) return false;
  char* end = nullptr;
  value = std::strtod(rest.c_str(), &end);
  return end != rest.c_str() && (*end == '\0' || *end == ' ' || *end == '\t');
}

}  // namespace

Distribution distribution_of(std::vector<double> values) {
  Distribution distribution;
  if (values.empty()) return distribution;
  std::sort(values.begin(), values.end());
  distribution.count = static_cast<int64_t>(values.size());
  distribution.mean =
      std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  distribution.p50 = percentile_of_sorted(values, 0.5);
  distribution.p90 = percentile_of_sorted(values, 0.9);
  distribution.p99 = percentile_of_sorted(values, 0.99);
  distribution.max = values.back();
  return distribution;
}

LoadSummary summarize(const LoadRun& run) {
  LoadSummary summary;
  summary.num_clients = run.options.num_clients;
  summary.endpoint = run.options.endpoint == Endpoint::kChat ? "chat" : "completions";
  summary.max_tokens = run.options.max_tokens;
  summary.window_seconds = seconds_between(run.window_start, run.window_end);
  summary.benchmark_seconds =
      seconds_between(run.window_start, std::max(run.window_end, run.last_end));
  summary.num_warmup_requests = run.num_warmup_requests;
  std::vector<double> ttft, tpot, gaps, end_to_end, tokens;
  for (const RequestRecord& record : run.records) {
    ++summary.num_requests_by_outcome[static_cast<size_t>(record.outcome)];
    if (record.outcome != RequestOutcome::kSucceeded) {
      if (summary.first_error.empty()) summary.first_error = record.error;
      ++summary.num_failed;
      continue;
    }
    summary.output_tokens += record.output_tokens();
    tokens.push_back(static_cast<double>(record.output_tokens()));
    end_to_end.push_back(1e3 * record.end_to_end_seconds());
    if (record.first_token) ttft.push_back(1e3 * record.time_to_first_token_seconds());
    if (const auto per_token = record.time_per_output_token_seconds()) {
      tpot.push_back(1e3 * *per_token);
    }
    for (const double gap : record.inter_token_gaps_seconds) gaps.push_back(1e3 * gap);
  }
  const int64_t num_succeeded =
      summary.num_requests_by_outcome[static_cast<size_t>(RequestOutcome::kSucceeded)];
  if (summary.benchmark_seconds > 0) {
    summary.requests_per_second = static_cast<double>(num_succeeded) / summary.benchmark_seconds;
    summary.output_tokens_per_second =
        static_cast<double>(summary.output_tokens) / summary.benchmark_seconds;
  }
  summary.ttft_ms = distribution_of(std::move(ttft));
  summary.tpot_ms = distribution_of(std::move(tpot));
  summary.inter_token_ms = distribution_of(std::move(gaps));
  summary.end_to_end_ms = distribution_of(std::move(end_to_end));
  summary.output_tokens_per_request = distribution_of(std::move(tokens));
  return summary;
}

nlohmann::json to_json(const LoadSummary& summary) {
  nlohmann::json outcomes = nlohmann::json::object();
  for (int i = 0; i < kNumRequestOutcomes; ++i) {
    outcomes[std::string(outcome_name(static_cast<RequestOutcome>(i)))] =
        summary.num_requests_by_outcome[static_cast<size_t>(i)];
  }
  return {{"clients", summary.num_clients},
          {"endpoint", summary.endpoint},
          {"max_tokens", summary.max_tokens},
          {"window_seconds", summary.window_seconds},
          {"benchmark_seconds", summary.benchmark_seconds},
          {"warmup_requests", summary.num_warmup_requests},
          {"requests", outcomes},
          {"requests_failed", summary.num_failed},
          {"output_tokens", summary.output_tokens},
          {"requests_per_second", summary.requests_per_second},
          {"output_tokens_per_second", summary.output_tokens_per_second},
          {"ttft_ms", distribution_json(summary.ttft_ms)},
          {"tpot_ms", distribution_json(summary.tpot_ms)},
          {"inter_token_ms", distribution_json(summary.inter_token_ms)},
          {"e2e_ms", distribution_json(summary.end_to_end_ms)},
          {"output_tokens_per_request", distribution_json(summary.output_tokens_per_request)},
          {"first_error", summary.first_error},
          {"server_counter_deltas", summary.server_counter_deltas}};
}

std::string format_summary(const LoadSummary& summary) {
  std::string text = fmt::format(
      "server load: {} clients, {} endpoint, max_tokens {}, window {:.1f} s (benchmark time "
      "{:.2f} s, {} warm-up requests not counted)\n",
      summary.num_clients, summary.endpoint, summary.max_tokens, summary.window_seconds,
      summary.benchmark_seconds, summary.num_warmup_requests);
  text += fmt::format("  requests        {} succeeded, {} failed",
                      summary.num_requests_by_outcome[0], summary.num_failed);
  for (int i = 1; i < kNumRequestOutcomes; ++i) {
    const int64_t count = summary.num_requests_by_outcome[static_cast<size_t>(i)];
    if (count > 0)
      text += fmt::format(", {} {}", outcome_name(static_cast<RequestOutcome>(i)), count);
  }
  text += fmt::format(
      "\n  throughput      {:.2f} requests/s, {:.1f} output tokens/s ({} tokens, "
      "{:.1f} per request)\n",
      summary.requests_per_second, summary.output_tokens_per_second, summary.output_tokens,
      summary.output_tokens_per_request.mean);
  const auto line = [&](const char* label, const Distribution& d) {
    text += fmt::format("  {:<15} p50 {:8.2f} ms  p90 {:8.2f} ms  p99 {:8.2f} ms  ({} samples)\n",
                        label, d.p50, d.p90, d.p99, d.count);
  };
  line("TTFT", summary.ttft_ms);
  line("TPOT", summary.tpot_ms);
  line("inter-token", summary.inter_token_ms);
  line("end-to-end", summary.end_to_end_ms);
  if (!summary.first_error.empty())
    text += fmt::format("  first error     {}\n", summary.first_error);
  if (!summary.server_counter_deltas.empty()) {
    text += "  server counters (change over the run):\n";
    for (const auto& [name, delta] : summary.server_counter_deltas) {
      text += fmt::format("    {:<40} {:g}\n", name, delta);
    }
  }
  return text;
}

std::map<std::string, double> parse_prometheus_counters(std::string_view text) {
  std::set<std::string, std::less<>> counter_families;
  std::map<std::string, double> counters;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    const std::string_view line = trim(text.substr(0, newline));
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    if (line.starts_with("# TYPE ")) {
      const std::string_view rest = trim(line.substr(7));
      const size_t space = rest.find_first_of(" \t");
      if (space != std::string_view::npos && trim(rest.substr(space)) == "counter") {
        counter_families.emplace(rest.substr(0, space));
      }
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    std::string_view name;
    double value = 0;
    if (!parse_sample(line, name, value)) continue;
    // A 0.0.4 counter's samples carry the family name; OpenMetrics adds `_total` to it.
    std::string_view family = name;
    if (!counter_families.contains(family) && family.ends_with("_total")) {
      family.remove_suffix(6);
    }
    if (counter_families.contains(family)) counters[std::string(name)] += value;
  }
  return counters;
}

std::map<std::string, double> counter_deltas(const std::map<std::string, double>& before,
                                             const std::map<std::string, double>& after) {
  std::map<std::string, double> deltas;
  for (const auto& [name, value] : after) {
    const auto old = before.find(name);
    const double delta = value - (old == before.end() ? 0.0 : old->second);
    if (delta != 0) deltas[name] = delta;
  }
  return deltas;
}

}  // namespace folio::bench
