// folio bench: an offline load through the engine: N requests with prompt and output lengths
// drawn from ranges, at most C in flight, reporting throughput, latency percentiles, KV and
// graph statistics and peak pool memory by content type (text, and JSON with --json).
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/folio/commands.h"
#include "apps/folio/engine_options.h"
#include "apps/folio/progress_bar.h"
#include "folio/base/percentile.h"

namespace folio::app {
namespace {

struct BenchOptions {
  EngineCommandOptions engine;
  int32_t num_requests = 64;
  int32_t concurrency = 8;
  std::string prompt_lengths = "32:128";
  std::string output_lengths = "32:64";
  int32_t shared_prefix = 0;  // tokens of a system prompt every request starts with
  uint64_t seed = 1;
  std::string json_path;
};

struct Range {
  int32_t low = 0, high = 0;
};

Result<Range> parse_range(const std::string& text, const char* flag) {
  Range range;
  const size_t colon = text.find(':');
  try {
    range.low = std::stoi(text.substr(0, colon));
    range.high = colon == std::string::npos ? range.low : std::stoi(text.substr(colon + 1));
  } catch (const std::exception&) {
    return invalid_argument("{} '{}': expected MIN:MAX or N", flag, text);
  }
  if (range.low < 1 || range.high < range.low) {
    return invalid_argument("{} '{}': need 1 <= MIN <= MAX", flag, text);
  }
  return range;
}

struct Collected {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<engine::Completion> completions;  // guarded by mutex
};

std::vector<engine::Request> make_requests(const BenchOptions& options, Range prompt, Range output,
                                           int32_t vocab, std::optional<int32_t> bos) {
  std::mt19937_64 random(options.seed);
  auto draw = [&](int32_t low, int32_t high) {
    return low + static_cast<int32_t>(random() % static_cast<uint64_t>(high - low + 1));
  };
  std::vector<int32_t> prefix;
  for (int32_t i = 0; i < options.shared_prefix; ++i) prefix.push_back(draw(3, vocab - 1));
  std::vector<engine::Request> requests(static_cast<size_t>(options.num_requests));
  for (engine::Request& request : requests) {
    if (bos) request.prompt.push_back(*bos);
    request.prompt.insert(request.prompt.end(), prefix.begin(), prefix.end());
    const int32_t length = draw(prompt.low, prompt.high);
    while (static_cast<int32_t>(request.prompt.size()) < length) {
      request.prompt.push_back(draw(3, vocab - 1));
    }
    request.max_tokens = draw(output.low, output.high);
    request.ignore_eos = true;  // fixed output lengths make runs comparable
    request.sampling.temperature = 0.0f;
  }
  return requests;
}

// What one run measured, before any arithmetic: every request's completion, the wall time from
// the engine's start to the last completion, and the engine's counters around the run.
struct BenchRun {
  std::vector<engine::Completion> completions;
  double seconds = 0;
  // Pages in use per content type, the most seen by the samples taken while requests ran.
  std::array<int64_t, memory::kNumContentTypes> peak_pages{};
  exec::GraphCacheStats graphs_before, graphs_after;
  engine::EngineStats engine_stats;  // at the end of the run
  int num_threads = 0;
  size_t page_size = 0;
  int64_t pool_pages = 0;
};

// Submits the requests keeping at most options.concurrency in flight, waits for all to finish,
// and stops the engine. The pool is sampled whenever a request finishes and at least every
// 20 ms, so a peak shorter than that can be missed.
BenchRun drive_requests(const BenchOptions& options, engine::ModelEngine& model_engine,
                        std::vector<engine::Request> requests) {
  Collected collected;
  for (engine::Request& request : requests) {
    request.on_finish = [&collected](const engine::Completion& completion) {
      std::lock_guard lock(collected.mutex);
      collected.completions.push_back(completion);
      collected.changed.notify_all();
    };
  }
  BenchRun run;
  run.num_threads = model_engine.thread_pool().num_threads();
  run.page_size = model_engine.pool().page_size();
  run.pool_pages = model_engine.pool().num_pages();
  auto sample_memory = [&] {
    const memory::PoolStats stats = model_engine.pool().stats();
    for (int i = 0; i < memory::kNumContentTypes; ++i) {
      run.peak_pages[i] = std::max(run.peak_pages[i], stats.per_content[i].pages_in_use);
    }
  };

  engine::Engine& engine = model_engine.engine();
  run.graphs_before = model_engine.executor().stats();
  const auto start = std::chrono::steady_clock::now();
  engine.start();
  size_t next = 0;
  size_t finished = 0;
  ProgressBar bar("bench", options.num_requests, ProgressUnit::kItems, "requests",
                  !options.engine.quiet);
  while (finished < requests.size()) {
    while (next < requests.size() && next - finished < static_cast<size_t>(options.concurrency)) {
      check_command(engine.submit(std::move(requests[next])).status());
      ++next;
    }
    std::unique_lock lock(collected.mutex);
    collected.changed.wait_for(lock, std::chrono::milliseconds(20),
                               [&] { return collected.completions.size() > finished; });
    const size_t now_finished = collected.completions.size();
    lock.unlock();
    sample_memory();
    if (now_finished != finished) {
      finished = now_finished;
      bar.update(static_cast<int64_t>(finished));
    }
  }
  bar.finish();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  engine.stop();
  run.engine_stats = engine.stats();
  run.graphs_after = model_engine.executor().stats();
  std::lock_guard lock(collected.mutex);  // the engine has stopped; no callback is left to race
  run.completions = std::move(collected.completions);
  return run;
}

struct LatencyPercentiles {
  double p50 = 0, p99 = 0;
};

// The report's numbers, in the units it prints them in.
struct BenchSummary {
  int num_threads = 0;
  int64_t num_errors = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double seconds = 0;
  double output_tokens_per_second = 0, total_tokens_per_second = 0;
  LatencyPercentiles ttft_ms, tpot_ms, latency_ms;
  int64_t preemptions = 0;
  double prefix_hit_rate = 0;      // of the blocks looked up in the prefix cache
  double graph_hit_rate = 0;       // of the steps this run took
  int64_t graph_captures = 0;      // the executor's total, not the change over the run
  double padding_ratio = 0;        // likewise
  double peak_kv_utilization = 0;  // of the pool's pages
  std::array<int64_t, memory::kNumContentTypes> peak_pool_bytes{};
};

template <typename Rep, typename Period>
double to_milliseconds(std::chrono::duration<Rep, Period> duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

LatencyPercentiles percentiles_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {percentile_of_sorted(values, 0.5), percentile_of_sorted(values, 0.99)};
}

// 0 when there was nothing to count, so an idle cache reads as 0%, not NaN.
double ratio_or_zero(int64_t part, int64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

BenchSummary summarize_run(const BenchRun& run) {
  BenchSummary summary;
  summary.num_threads = run.num_threads;
  std::vector<double> ttft_ms, tpot_ms, latency_ms;
  for (const engine::Completion& completion : run.completions) {
    if (completion.reason == engine::FinishReason::kError) ++summary.num_errors;
    summary.prompt_tokens += completion.num_prompt_tokens;
    summary.generated_tokens += completion.num_generated_tokens;
    ttft_ms.push_back(to_milliseconds(completion.timing.time_to_first_token));
    // One token has no gap after it: a TPOT of 0 would drag the percentiles down.
    if (completion.num_generated_tokens > 1) {
      tpot_ms.push_back(to_milliseconds(completion.timing.time_per_output_token));
    }
    latency_ms.push_back(to_milliseconds(completion.timing.total_time));
  }
  summary.seconds = run.seconds;
  summary.output_tokens_per_second = summary.generated_tokens / run.seconds;
  summary.total_tokens_per_second =
      (summary.prompt_tokens + summary.generated_tokens) / run.seconds;
  summary.ttft_ms = percentiles_of(std::move(ttft_ms));
  summary.tpot_ms = percentiles_of(std::move(tpot_ms));
  summary.latency_ms = percentiles_of(std::move(latency_ms));

  const engine::EngineStats& stats = run.engine_stats;
  summary.preemptions = stats.preemptions_by_recompute + stats.preemptions_by_swap;
  summary.prefix_hit_rate =
      ratio_or_zero(stats.prefix_cache_hit_blocks, stats.prefix_cache_queried_blocks);
  const exec::GraphCacheStats& before = run.graphs_before;
  const exec::GraphCacheStats& after = run.graphs_after;
  const int64_t graph_steps = (after.hits + after.misses + after.eager_fallbacks) -
                              (before.hits + before.misses + before.eager_fallbacks);
  summary.graph_hit_rate = ratio_or_zero(after.hits - before.hits, graph_steps);
  summary.graph_captures = after.captures;
  summary.padding_ratio = after.padding_ratio();
  for (int i = 0; i < memory::kNumContentTypes; ++i) {
    summary.peak_pool_bytes[i] = run.peak_pages[i] * static_cast<int64_t>(run.page_size);
  }
  summary.peak_kv_utilization =
      static_cast<double>(run.peak_pages[static_cast<int>(memory::ContentType::kKvCache)]) /
      static_cast<double>(run.pool_pages);
  return summary;
}

nlohmann::json percentiles_json(const LatencyPercentiles& percentiles) {
  return {{"p50", percentiles.p50}, {"p99", percentiles.p99}};
}

nlohmann::json bench_json(const BenchOptions& options, const BenchSummary& summary) {
  nlohmann::json peak = nlohmann::json::object();
  for (memory::ContentType content : memory::kAllContentTypes) {
    peak[std::string(memory::content_type_name(content))] =
        summary.peak_pool_bytes[static_cast<int>(content)];
  }
  return {
      {"requests", options.num_requests},
      {"concurrency", options.concurrency},
      {"graphs", !options.engine.no_graphs},
      {"threads", summary.num_threads},
      {"errors", summary.num_errors},
      {"seconds", summary.seconds},
      {"prompt_tokens", summary.prompt_tokens},
      {"generated_tokens", summary.generated_tokens},
      {"output_tokens_per_second", summary.output_tokens_per_second},
      {"total_tokens_per_second", summary.total_tokens_per_second},
      {"ttft_ms", percentiles_json(summary.ttft_ms)},
      {"tpot_ms", percentiles_json(summary.tpot_ms)},
      {"latency_ms", percentiles_json(summary.latency_ms)},
      {"preemptions", summary.preemptions},
      {"prefix_hit_rate", summary.prefix_hit_rate},
      {"graph_hit_rate", summary.graph_hit_rate},
      {"graph_captures", summary.graph_captures},
      {"padding_ratio", summary.padding_ratio},
      {"peak_kv_utilization", summary.peak_kv_utilization},
      {"peak_pool_bytes", peak},
  };
}

double peak_mib(const BenchSummary& summary, memory::ContentType content) {
  return static_cast<double>(summary.peak_pool_bytes[static_cast<int>(content)]) / (1 << 20);
}

// Prints the text report on stdout and, with --json, writes the same numbers as JSON.
void report_bench(const BenchOptions& options, const BenchSummary& summary) {
  std::printf("folio bench: %d requests, concurrency %d, graphs %s, %d threads\n",
              options.num_requests, options.concurrency, options.engine.no_graphs ? "off" : "on",
              summary.num_threads);
  std::printf("  throughput      %.1f output tokens/s, %.1f total tokens/s (%.2f s, %lld errors)\n",
              summary.output_tokens_per_second, summary.total_tokens_per_second, summary.seconds,
              static_cast<long long>(summary.num_errors));
  std::printf("  TTFT            p50 %.1f ms, p99 %.1f ms\n", summary.ttft_ms.p50,
              summary.ttft_ms.p99);
  std::printf("  TPOT            p50 %.2f ms, p99 %.2f ms\n", summary.tpot_ms.p50,
              summary.tpot_ms.p99);
  std::printf("  preemptions     %lld; prefix hit rate %.1f%%\n",
              static_cast<long long>(summary.preemptions), 100 * summary.prefix_hit_rate);
  std::printf("  graphs          hit rate %.1f%%, %lld captures, padding %.1f%% of tokens\n",
              100 * summary.graph_hit_rate, static_cast<long long>(summary.graph_captures),
              100 * summary.padding_ratio);
  std::printf("  peak pool       KV %.1f MiB (%.1f%% of budget), graph arena %.1f MiB\n",
              peak_mib(summary, memory::ContentType::kKvCache), 100 * summary.peak_kv_utilization,
              peak_mib(summary, memory::ContentType::kGraphArena));
  if (!options.json_path.empty()) {
    std::ofstream out(options.json_path);
    out << bench_json(options, summary).dump(2) << "\n";
    if (!out) check_command(internal_error("cannot write {}", options.json_path));
  }
}

void run_bench(const BenchOptions& options) {
  Result<Range> prompt = parse_range(options.prompt_lengths, "--prompt-len");
  check_command(prompt.status());
  Result<Range> output = parse_range(options.output_lengths, "--output-len");
  check_command(output.status());
  if (options.num_requests < 1 || options.concurrency < 1) {
    check_command(invalid_argument("--requests and --concurrency must be at least 1"));
  }
  Result<std::unique_ptr<engine::ModelEngine>> bundle = start_model_engine(options.engine);
  check_command(bundle.status());
  engine::ModelEngine& model_engine = **bundle;
  const model::LlamaModel& model = model_engine.model();
  std::vector<engine::Request> requests =
      make_requests(options, *prompt, *output, static_cast<int32_t>(model.shape().vocab_size),
                    model.tokenizer().bos());
  const BenchRun run = drive_requests(options, model_engine, std::move(requests));
  report_bench(options, summarize_run(run));
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand("bench", "Offline load benchmark through the engine");
  add_engine_options(*command, options->engine);
  command->add_option("--requests", options->num_requests, "Requests")->capture_default_str();
  command->add_option("--concurrency", options->concurrency, "Requests in flight")
      ->capture_default_str();
  command->add_option("--prompt-len", options->prompt_lengths, "Prompt tokens, MIN:MAX")
      ->capture_default_str();
  command->add_option("--output-len", options->output_lengths, "Output tokens, MIN:MAX")
      ->capture_default_str();
  command->add_option("--shared-prefix", options->shared_prefix,
                      "Tokens of a system prompt shared by every request");
  command->add_option("--seed", options->seed, "Seed of the synthetic requests");
  command->add_option("--json", options->json_path, "Also write the report as JSON here");
  command->callback([options] { run_bench(*options); });
}

}  // namespace folio::app
