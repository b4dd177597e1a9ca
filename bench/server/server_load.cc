// folio_server_load: a bounded load on an OpenAI-compatible server from a separate process: N
// concurrent streaming clients for T seconds, reporting throughput and latency percentiles
// (TTFT, TPOT, inter-token gap, end-to-end), failures by kind, and the change of the server's
// counters over the run (from /metrics, when the server has one).
//
//   folio_server_load --url http://127.0.0.1:8080 --clients 8 --duration 10 --max-tokens 64
#include <httplib.h>

#include <cstdio>
#include <fstream>
#include <optional>

#include <CLI/CLI.hpp>

#include "bench/server/load_runner.h"
#include "bench/server/load_summary.h"

namespace folio::bench {
namespace {

// The server's counters, or nullopt when it serves no /metrics (the figures are optional).
std::optional<std::map<std::string, double>> scrape_counters(const LoadOptions& options) {
  httplib::Client client(options.url);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(10, 0);
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  const httplib::Result result = client.Get("/metrics", headers);
  if (!result || result->status != 200) return std::nullopt;
  return parse_prometheus_counters(result->body);
}

Result<std::pair<int32_t, int32_t>> parse_range(const std::string& text) {
  const size_t colon = text.find(':');
  try {
    const int32_t low = std::stoi(text.substr(0, colon));
    const int32_t high = colon == std::string::npos ? low : std::stoi(text.substr(colon + 1));
    return std::pair{low, high};
  } catch (const std::exception&) {
    return invalid_argument("--prompt-len '{}': expected MIN:MAX or N words", text);
  }
}

int run(LoadOptions options, const std::string& json_path, bool quiet) {
  const std::optional<std::map<std::string, double>> before = scrape_counters(options);
  Result<LoadRun> run = run_load(std::move(options));
  if (!run.ok()) {
    std::fprintf(stderr, "folio_server_load: %s\n", run.status().to_string().c_str());
    return 1;
  }
  LoadSummary summary = summarize(*run);
  if (before) {
    if (const auto after = scrape_counters(run->options)) {
      summary.server_counter_deltas = counter_deltas(*before, *after);
    }
  }
  if (!quiet) std::fputs(format_summary(summary).c_str(), stdout);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << to_json(summary).dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "folio_server_load: cannot write --json '%s'\n", json_path.c_str());
      return 1;
    }
  }
  // Failed requests are reported, not fatal: a load test of an overloaded server is still a
  // result. No successful request at all is, since then no figure means anything.
  return summary.num_requests_by_outcome[0] > 0 ? 0 : 2;
}

}  // namespace
}  // namespace folio::bench

int main(int argc, char** argv) {
  using folio::bench::Endpoint;
  folio::bench::LoadOptions options;
  std::string prompt_length = "16:64";
  std::string json_path;
  bool quiet = false, no_usage = false;
  CLI::App app{
      "folio_server_load: N concurrent streaming clients against an OpenAI-compatible "
      "server for T seconds; prints throughput and latency percentiles"};
  app.add_option("--url", options.url, "server address, scheme://host:port")->capture_default_str();
  app.add_option("--clients,-c", options.num_clients, "concurrent streaming clients")
      ->capture_default_str();
  app.add_option("--duration,-t", options.duration_seconds,
                 "seconds during which counted requests start")
      ->capture_default_str();
  app.add_option("--warmup", options.warmup_seconds, "seconds of load before counting starts")
      ->capture_default_str();
  app.add_option("--drain-timeout", options.drain_timeout_seconds,
                 "seconds in-flight requests may run after --duration before being cut off")
      ->capture_default_str();
  app.add_option("--request-timeout", options.request_timeout_seconds,
                 "seconds of silence on a connection before a request fails")
      ->capture_default_str();
  app.add_option("--max-tokens,-n", options.max_tokens, "max_tokens of each request")
      ->capture_default_str();
  app.add_option("--prompt-len", prompt_length, "prompt length in words, MIN:MAX or N")
      ->capture_default_str();
  std::string endpoint = "completions";
  app.add_option("--endpoint", endpoint, "completions (/v1/completions) or chat (/v1/chat/...)")
      ->check(CLI::IsMember({"completions", "chat"}))
      ->capture_default_str();
  app.add_option("--model", options.model, "model name sent (default: the first /v1/models id)");
  app.add_option("--api-key", options.api_key, "sent as Authorization: Bearer KEY");
  app.add_option("--seed", options.seed, "seed of the prompt generator")->capture_default_str();
  app.add_flag("--ignore-eos", options.ignore_eos,
               "send ignore_eos: true (vLLM's extension) so every output is max_tokens long");
  app.add_flag("--no-usage", no_usage,
               "do not ask for a usage chunk; output tokens are then the text chunks counted");
  app.add_option("--json", json_path, "also write the figures as JSON to this file");
  app.add_flag("--quiet,-q", quiet, "print nothing (with --json)");
  CLI11_PARSE(app, argc, argv);
  options.request_usage = !no_usage;
  options.endpoint = endpoint == "chat" ? Endpoint::kChat : Endpoint::kCompletions;
  const auto range = folio::bench::parse_range(prompt_length);
  if (!range.ok()) {
    std::fprintf(stderr, "folio_server_load: %s\n", range.status().to_string().c_str());
    return 1;
  }
  options.prompt_words_min = range->first;
  options.prompt_words_max = range->second;
  return folio::bench::run(std::move(options), json_path, quiet);
}
