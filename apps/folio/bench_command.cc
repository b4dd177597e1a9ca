// folio bench: an offline load through the engine: N requests with prompt and output lengths
// drawn from ranges, at most C in flight, reporting throughput, latency percentiles, KV and
// graph statistics and peak pool memory by content type (text, and JSON with --json).
#include <algorithm>
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

  Collected collected;
  for (engine::Request& request : requests) {
    request.on_finish = [&collected](const engine::Completion& completion) {
      std::lock_guard lock(collected.mutex);
      collected.completions.push_back(completion);
      collected.changed.notify_all();
    };
  }
  std::array<int64_t, memory::kNumContentTypes> peak_pages{};
  auto sample_memory = [&] {
    const memory::PoolStats stats = model_engine.pool().stats();
    for (int i = 0; i < memory::kNumContentTypes; ++i) {
      peak_pages[i] = std::max(peak_pages[i], stats.per_content[i].pages_in_use);
    }
  };

  engine::Engine& engine = model_engine.engine();
  const exec::GraphCacheStats graphs_before = model_engine.executor().stats();
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
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  engine.stop();

  int64_t prompt_tokens = 0, generated = 0, errors = 0;
  std::vector<double> ttft_ms, tpot_ms, latency_ms;
  for (const engine::Completion& completion : collected.completions) {
    if (completion.reason == engine::FinishReason::kError) ++errors;
    prompt_tokens += completion.num_prompt_tokens;
    generated += completion.num_generated_tokens;
    ttft_ms.push_back(
        std::chrono::duration<double, std::milli>(completion.timing.time_to_first_token).count());
    if (completion.num_generated_tokens > 1) {
      tpot_ms.push_back(
          std::chrono::duration<double, std::milli>(completion.timing.time_per_output_token)
              .count());
    }
    latency_ms.push_back(
        std::chrono::duration<double, std::milli>(completion.timing.total_time).count());
  }
  const engine::EngineStats stats = engine.stats();
  exec::GraphCacheStats graphs = model_engine.executor().stats();
  const int64_t graph_steps =
      (graphs.hits + graphs.misses + graphs.eager_fallbacks) -
      (graphs_before.hits + graphs_before.misses + graphs_before.eager_fallbacks);
  const double graph_hit_rate =
      graph_steps == 0 ? 0.0 : static_cast<double>(graphs.hits - graphs_before.hits) / graph_steps;
  const double prefix_hit_rate =
      stats.prefix_cache_queried_blocks == 0
          ? 0.0
          : static_cast<double>(stats.prefix_cache_hit_blocks) / stats.prefix_cache_queried_blocks;
  const size_t page_size = model_engine.pool().page_size();
  const int64_t pool_pages = model_engine.pool().num_pages();

  nlohmann::json report = {
      {"requests", options.num_requests},
      {"concurrency", options.concurrency},
      {"graphs", !options.engine.no_graphs},
      {"threads", model_engine.thread_pool().num_threads()},
      {"errors", errors},
      {"seconds", seconds},
      {"prompt_tokens", prompt_tokens},
      {"generated_tokens", generated},
      {"output_tokens_per_second", generated / seconds},
      {"total_tokens_per_second", (prompt_tokens + generated) / seconds},
      {"ttft_ms", {{"p50", percentile(ttft_ms, 0.5)}, {"p99", percentile(ttft_ms, 0.99)}}},
      {"tpot_ms", {{"p50", percentile(tpot_ms, 0.5)}, {"p99", percentile(tpot_ms, 0.99)}}},
      {"latency_ms", {{"p50", percentile(latency_ms, 0.5)}, {"p99", percentile(latency_ms, 0.99)}}},
      {"preemptions", stats.preemptions_by_recompute + stats.preemptions_by_swap},
      {"prefix_hit_rate", prefix_hit_rate},
      {"graph_hit_rate", graph_hit_rate},
      {"graph_captures", graphs.captures},
      {"padding_ratio", graphs.padding_ratio()},
      {"peak_kv_utilization",
       static_cast<double>(peak_pages[static_cast<int>(memory::ContentType::kKvCache)]) /
           static_cast<double>(pool_pages)},
  };
  nlohmann::json peak = nlohmann::json::object();
  for (memory::ContentType content : memory::kAllContentTypes) {
    peak[std::string(memory::content_type_name(content))] =
        peak_pages[static_cast<int>(content)] * static_cast<int64_t>(page_size);
  }
  report["peak_pool_bytes"] = peak;

  std::printf("folio bench: %d requests, concurrency %d, graphs %s, %d threads\n",
              options.num_requests, options.concurrency, options.engine.no_graphs ? "off" : "on",
              model_engine.thread_pool().num_threads());
  std::printf("  throughput      %.1f output tokens/s, %.1f total tokens/s (%.2f s, %lld errors)\n",
              generated / seconds, (prompt_tokens + generated) / seconds, seconds,
              static_cast<long long>(errors));
  std::printf("  TTFT            p50 %.1f ms, p99 %.1f ms\n", percentile(ttft_ms, 0.5),
              percentile(ttft_ms, 0.99));
  std::printf("  TPOT            p50 %.2f ms, p99 %.2f ms\n", percentile(tpot_ms, 0.5),
              percentile(tpot_ms, 0.99));
  std::printf("  preemptions     %lld; prefix hit rate %.1f%%\n",
              static_cast<long long>(stats.preemptions_by_recompute + stats.preemptions_by_swap),
              100 * prefix_hit_rate);
  std::printf("  graphs          hit rate %.1f%%, %lld captures, padding %.1f%% of tokens\n",
              100 * graph_hit_rate, static_cast<long long>(graphs.captures),
              100 * graphs.padding_ratio());
  std::printf("  peak pool       KV %.1f MiB (%.1f%% of budget), graph arena %.1f MiB\n",
              peak["kv_cache"].get<double>() / (1 << 20),
              100 * report["peak_kv_utilization"].get<double>(),
              peak["graph_arena"].get<double>() / (1 << 20));
  if (!options.json_path.empty()) {
    std::ofstream out(options.json_path);
    out << report.dump(2) << "\n";
    if (!out) check_command(internal_error("cannot write {}", options.json_path));
  }
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
