// folio bench: an offline load through the engine: N requests with prompt and output lengths
// drawn from ranges, at most C in flight, reporting throughput, latency percentiles, KV and
// graph statistics and peak pool memory by content type (text, and JSON with --json).
//
// The batch-1 decode roofline is always reported: the weight bytes one decode token streams
// (the one-token decode graph's weights, ir::weight_bytes_read) over the read bandwidth measured
// on the engine's threads right after the run (base/read_bandwidth.h), against the run's TPOT
// p50 (a batch-1 figure only at --concurrency 1). With --profile every step is timed per op
// kind (exec/op_profile.h) and the report adds, for decode steps and for steps with prefill, each
// kind's time per step, share of the step and calls per step.
//
// With --adapters N (bench_adapters.h), N random LoRA adapters are registered and each request
// runs with one drawn by popularity. Each of --passes passes then runs its requests twice: on an
// engine without adapters (the base pass, unless --no-base-pass) and with their adapters on an
// engine serving them, so the throughput ratio comes from one run on one (noisy) machine. Both
// engines are driven from the bench's thread (Engine::step), which lets it ask the adapter
// manager, an engine-thread object, what tier each request's adapter is in as it is submitted.
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "apps/folio/bench_adapters.h"
#include "apps/folio/commands.h"
#include "apps/folio/engine_options.h"
#include "apps/folio/process_memory.h"
#include "apps/folio/progress_bar.h"
#include "folio/base/percentile.h"
#include "folio/base/read_bandwidth.h"
#include "folio/kernels/cpu/simd_level.h"

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
  AdapterBenchOptions adapters;
  int32_t passes = 1;  // with adapters: passes of fresh requests (seeds seed, seed + 1, ...)
  bool profile = false;
  int64_t bandwidth_buffer_mib = 1024;  // the read-bandwidth measurement's buffer; 0: skip it
};

// The batch-1 decode roofline: weight bytes per decode token over the measured read bandwidth.
struct Roofline {
  int64_t weight_bytes_per_token = 0;
  double read_bytes_per_second = 0;  // 0: not measured
  double tpot_ms() const {
    return read_bytes_per_second > 0
               ? 1e3 * static_cast<double>(weight_bytes_per_token) / read_bytes_per_second
               : 0.0;
  }
};

Roofline measure_roofline(const BenchOptions& options, engine::ModelEngine& model_engine) {
  Roofline roofline;
  Result<int64_t> bytes = model_engine.executor().step_weight_bytes(1, ir::StepPhase::kDecode);
  check_command(bytes.status());
  roofline.weight_bytes_per_token = *bytes;
  if (options.bandwidth_buffer_mib > 0) {
    ReadBandwidthOptions read;
    read.buffer_bytes = options.bandwidth_buffer_mib << 20;
    roofline.read_bytes_per_second = measure_read_bandwidth(model_engine.thread_pool(), read);
  }
  return roofline;
}

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
  // The process's proportional set size, the most seen by the samples (sample_run_memory).
  int64_t peak_pss_bytes = 0;
  std::chrono::steady_clock::time_point last_pss_sample;
  int64_t pool_pages_at_last_pss_sample = -1;
  exec::GraphCacheStats graphs_before, graphs_after;
  engine::EngineStats engine_stats;  // at the end of the run
  // Memory pressure handling's totals at the end of the run; absent when it is off.
  std::optional<engine::PressureCounts> pressure;
  // The recompute-or-swap cost model's rates at the end of the run (--preemption cheaper).
  std::optional<engine::PreemptionRates> preemption_rates;
  int num_threads = 0;
  size_t page_size = 0;
  int64_t pool_pages = 0;
  int64_t weight_bytes = 0;
  // Driven by drive_stepped: the tier each completion's adapter was in when its request was
  // submitted (nullopt: no adapter), in the order of `completions`.
  std::vector<std::optional<lora::AdapterTier>> submit_tiers;
};

// Raises the run's peaks to what the pool and the process hold now. Reading PSS walks every
// mapping, the weights' page tables included (about 2 ms for a 130 MB model, 3% of a prefill
// run when read every 50 ms), so it is read when the pool holds more pages than at the last
// reading (the process's peak follows the pool's), at most every 50 ms, and else once a second.
void sample_run_memory(BenchRun& run, const memory::PagePool& pool) {
  const memory::PoolStats stats = pool.stats();
  int64_t pool_pages_in_use = 0;
  for (int i = 0; i < memory::kNumContentTypes; ++i) {
    run.peak_pages[i] = std::max(run.peak_pages[i], stats.per_content[i].pages_in_use);
    pool_pages_in_use += stats.per_content[i].pages_in_use;
  }
  const auto since_last = std::chrono::steady_clock::now() - run.last_pss_sample;
  const bool pool_grew = pool_pages_in_use > run.pool_pages_at_last_pss_sample;
  if ((pool_grew && since_last >= std::chrono::milliseconds(50)) ||
      since_last >= std::chrono::seconds(1)) {
    run.last_pss_sample = std::chrono::steady_clock::now();
    run.pool_pages_at_last_pss_sample = pool_pages_in_use;
    run.peak_pss_bytes = std::max(run.peak_pss_bytes, proportional_set_bytes());
  }
}

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
  run.weight_bytes = model_engine.model().weight_bytes();
  auto sample_memory = [&] { sample_run_memory(run, model_engine.pool()); };

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
  if (model_engine.pressure() != nullptr) run.pressure = model_engine.pressure()->counts();
  if (const engine::PreemptionCostModel* cost = model_engine.preemption_cost()) {
    run.preemption_rates = cost->rates();  // the engine has stopped: no step calibrates now
  }
  std::lock_guard lock(collected.mutex);  // the engine has stopped; no callback is left to race
  run.completions = std::move(collected.completions);
  return run;
}

// Drives the engine from this thread (Engine::step; the engine must not be started), keeping
// at most options.concurrency requests in flight and submitting as soon as one finishes. As the
// engine thread, it may ask the adapter manager for each request's adapter tier as it submits
// it. A step that runs nothing while requests are left (all wait on adapter loads) is followed
// by a 1 ms wait, as in the engine's own loop. The pool is sampled after every step.
BenchRun drive_stepped(const BenchOptions& options, engine::ModelEngine& model_engine,
                       std::vector<engine::Request> requests) {
  std::vector<engine::Completion> completions;  // on_finish runs on this thread, inside step()
  for (engine::Request& request : requests) {
    request.on_finish = [&completions](const engine::Completion& completion) {
      completions.push_back(completion);
    };
  }
  BenchRun run;
  run.num_threads = model_engine.thread_pool().num_threads();
  run.page_size = model_engine.pool().page_size();
  run.pool_pages = model_engine.pool().num_pages();
  run.weight_bytes = model_engine.model().weight_bytes();
  engine::Engine& engine = model_engine.engine();
  lora::AdapterManager* adapters = model_engine.adapters();
  std::unordered_map<engine::RequestId, std::optional<lora::AdapterTier>> tiers;
  run.graphs_before = model_engine.executor().stats();
  const auto start = std::chrono::steady_clock::now();
  size_t next = 0;
  ProgressBar bar("bench", static_cast<int64_t>(requests.size()), ProgressUnit::kItems, "requests",
                  !options.engine.quiet);
  while (completions.size() < requests.size()) {
    while (next < requests.size() &&
           next - completions.size() < static_cast<size_t>(options.concurrency)) {
      std::optional<lora::AdapterTier> tier;
      if (adapters != nullptr && requests[next].adapter_id != 0) {
        tier = adapters->tier(requests[next].adapter_id);
      }
      Result<engine::RequestId> id = engine.submit(std::move(requests[next]));
      check_command(id.status());
      tiers.emplace(*id, tier);
      ++next;
    }
    if (!engine.step()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    sample_run_memory(run, model_engine.pool());
    bar.update(static_cast<int64_t>(completions.size()));
  }
  bar.finish();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.engine_stats = engine.stats();
  run.graphs_after = model_engine.executor().stats();
  if (model_engine.pressure() != nullptr) run.pressure = model_engine.pressure()->counts();
  for (const engine::Completion& completion : completions) {
    run.submit_tiers.push_back(tiers.at(completion.request));
  }
  run.completions = std::move(completions);
  return run;
}

// One run of several passes on one engine: completions and seconds add up, peaks are the
// highest, the counters are the last pass's (the engine's totals) against the first's start.
void merge_run(BenchRun& total, BenchRun pass) {
  if (total.completions.empty()) {
    total = std::move(pass);
    return;
  }
  total.completions.insert(total.completions.end(), pass.completions.begin(),
                           pass.completions.end());
  total.submit_tiers.insert(total.submit_tiers.end(), pass.submit_tiers.begin(),
                            pass.submit_tiers.end());
  total.seconds += pass.seconds;
  for (int i = 0; i < memory::kNumContentTypes; ++i) {
    total.peak_pages[i] = std::max(total.peak_pages[i], pass.peak_pages[i]);
  }
  total.peak_pss_bytes = std::max(total.peak_pss_bytes, pass.peak_pss_bytes);
  total.graphs_after = pass.graphs_after;
  total.engine_stats = pass.engine_stats;
  total.pressure = pass.pressure;
}

struct LatencyPercentiles {
  double p50 = 0, p99 = 0;
};

// The report's numbers, in the units it prints them in.
struct BenchSummary {
  int64_t num_requests = 0;
  int num_threads = 0;
  int64_t num_errors = 0;
  std::string first_error;  // the first failed request's message
  int64_t prompt_tokens = 0, generated_tokens = 0;
  double seconds = 0;
  double output_tokens_per_second = 0, total_tokens_per_second = 0;
  LatencyPercentiles ttft_ms, tpot_ms, latency_ms;
  int64_t preemptions = 0;
  int64_t preemptions_by_swap = 0;
  int64_t cost_chose_recompute = 0, cost_chose_swap = 0;
  double host_copy_gib_per_second = 0;  // 0: no cost model
  double prefill_gflops = 0;            // calibrated IR GFLOP/s; 0: unknown
  double prefix_hit_rate = 0;           // of the blocks looked up in the prefix cache
  double graph_hit_rate = 0;            // of the steps this run took
  int64_t graph_captures = 0;           // the executor's total, not the change over the run
  double padding_ratio = 0;             // likewise
  double peak_kv_utilization = 0;       // of the pool's pages
  std::array<int64_t, memory::kNumContentTypes> peak_pool_bytes{};
  // The process's peak resident set (getrusage ru_maxrss, so since start-up, model load
  // included) and peak proportional set (sampled while requests ran) against the pool's budget
  // and the weights (mmapped, resident once touched). RSS counts an arena page once per captured
  // graph's view of it; PSS counts it once (process_memory.h).
  int64_t peak_rss_bytes = 0, peak_pss_bytes = 0, pool_budget_bytes = 0, weight_bytes = 0;
  std::optional<engine::PressureCounts> pressure;
  std::optional<Roofline> roofline;
  std::optional<exec::OpProfile> profile;  // a copy, taken when the engine had stopped
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
  summary.num_requests = static_cast<int64_t>(run.completions.size());
  summary.num_threads = run.num_threads;
  std::vector<double> ttft_ms, tpot_ms, latency_ms;
  for (const engine::Completion& completion : run.completions) {
    if (completion.reason == engine::FinishReason::kError) {
      if (summary.num_errors++ == 0) summary.first_error = completion.error.to_string();
    }
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
  summary.preemptions_by_swap = stats.preemptions_by_swap;
  summary.cost_chose_recompute = stats.cost_chose_recompute;
  summary.cost_chose_swap = stats.cost_chose_swap;
  if (run.preemption_rates.has_value()) {
    summary.host_copy_gib_per_second = run.preemption_rates->host_copy_bytes_per_second / (1 << 30);
    summary.prefill_gflops = run.preemption_rates->flops_per_second / 1e9;
  }
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
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) == 0) summary.peak_rss_bytes = int64_t{usage.ru_maxrss} << 10;
  summary.peak_pss_bytes = run.peak_pss_bytes;
  summary.pressure = run.pressure;
  summary.pool_budget_bytes = run.pool_pages * static_cast<int64_t>(run.page_size);
  summary.weight_bytes = run.weight_bytes;
  return summary;
}

nlohmann::json percentiles_json(const LatencyPercentiles& percentiles) {
  return {{"p50", percentiles.p50}, {"p99", percentiles.p99}};
}

// Null when pressure handling was off.
nlohmann::json pressure_json(const std::optional<engine::PressureCounts>& pressure) {
  if (!pressure.has_value()) return nullptr;
  nlohmann::json steps = nlohmann::json::object();
  for (memory::PressureLevel level : memory::kAllPressureLevels) {
    steps[std::string(memory::pressure_level_name(level))] =
        pressure->steps_at_level[static_cast<size_t>(level)];
  }
  return {{"steps_at_level", steps},
          {"pages_evicted", pressure->pages_evicted},
          {"adapter_pages_evicted", pressure->adapter_pages_evicted},
          {"kv_pages_evicted", pressure->kv_pages_evicted},
          {"graph_bytes_released", pressure->graph_bytes_released},
          {"preemptions", pressure->preemptions}};
}

nlohmann::json roofline_json(const BenchSummary& summary) {
  if (!summary.roofline.has_value()) return nullptr;
  const Roofline& roofline = *summary.roofline;
  const double tpot = roofline.tpot_ms();
  return {{"weight_bytes_per_token", roofline.weight_bytes_per_token},
          {"read_bandwidth_gbps", roofline.read_bytes_per_second / 1e9},
          {"roofline_tpot_ms", tpot},
          {"fraction", summary.tpot_ms.p50 > 0 ? tpot / summary.tpot_ms.p50 : 0.0}};
}

// One line of a phase's profile.
struct ProfileLine {
  std::string kind;
  double ms_per_step = 0, share = 0, calls_per_step = 0;
};

// The rows that saw time or calls, in ProfileRow order, then "other" (what no row explains).
std::vector<ProfileLine> profile_lines(const exec::PhaseProfile& phase) {
  std::vector<ProfileLine> lines;
  if (phase.steps == 0) return lines;
  const auto steps = static_cast<double>(phase.steps);
  auto line = [&](std::string_view kind, double seconds, int64_t calls) {
    lines.push_back({std::string(kind), 1e3 * seconds / steps,
                     phase.step_seconds > 0 ? seconds / phase.step_seconds : 0.0,
                     static_cast<double>(calls) / steps});
  };
  for (int index = 0; index < exec::kNumProfileRows; ++index) {
    const auto row = static_cast<size_t>(index);
    if (phase.rows.seconds[row] == 0 && phase.rows.calls[row] == 0) continue;
    line(exec::profile_row_name(static_cast<exec::ProfileRow>(index)), phase.rows.seconds[row],
         phase.rows.calls[row]);
  }
  line("other", phase.other_seconds(), 0);
  return lines;
}

nlohmann::json profile_json(const BenchSummary& summary) {
  if (!summary.profile.has_value()) return nullptr;
  nlohmann::json json = nlohmann::json::object();
  for (exec::ProfilePhase phase : {exec::ProfilePhase::kDecode, exec::ProfilePhase::kPrefill}) {
    const exec::PhaseProfile& totals = summary.profile->phase(phase);
    nlohmann::json ops = nlohmann::json::array();
    for (const ProfileLine& line : profile_lines(totals)) {
      ops.push_back({{"kind", line.kind},
                     {"ms_per_step", line.ms_per_step},
                     {"share", line.share},
                     {"calls_per_step", line.calls_per_step}});
    }
    json[std::string(exec::profile_phase_name(phase))] = {
        {"steps", totals.steps},
        {"step_ms", totals.steps > 0 ? 1e3 * totals.step_seconds / totals.steps : 0.0},
        {"ops", ops}};
  }
  return json;
}

nlohmann::json bench_json(const BenchOptions& options, const BenchSummary& summary) {
  nlohmann::json peak = nlohmann::json::object();
  for (memory::ContentType content : memory::kAllContentTypes) {
    peak[std::string(memory::content_type_name(content))] =
        summary.peak_pool_bytes[static_cast<int>(content)];
  }
  return {
      {"requests", summary.num_requests},
      {"concurrency", options.concurrency},
      {"graphs", !options.engine.no_graphs},
      {"threads", summary.num_threads},
      {"kernels", kernels::cpu::active_kernels_name()},
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
      {"preemptions_by_swap", summary.preemptions_by_swap},
      {"preemption_cost_chose",
       {{"recompute", summary.cost_chose_recompute}, {"swap", summary.cost_chose_swap}}},
      {"host_copy_gib_per_second", summary.host_copy_gib_per_second},
      {"calibrated_prefill_gflops", summary.prefill_gflops},
      {"prefix_hit_rate", summary.prefix_hit_rate},
      {"graph_hit_rate", summary.graph_hit_rate},
      {"graph_captures", summary.graph_captures},
      {"padding_ratio", summary.padding_ratio},
      {"peak_kv_utilization", summary.peak_kv_utilization},
      {"peak_pool_bytes", peak},
      {"peak_rss_bytes", summary.peak_rss_bytes},
      {"peak_pss_bytes", summary.peak_pss_bytes},
      {"pool_budget_bytes", summary.pool_budget_bytes},
      {"weight_bytes", summary.weight_bytes},
      {"pressure", pressure_json(summary.pressure)},
      {"roofline", roofline_json(summary)},
      {"profile", profile_json(summary)},
  };
}

double peak_mib(const BenchSummary& summary, memory::ContentType content) {
  return static_cast<double>(summary.peak_pool_bytes[static_cast<int>(content)]) / (1 << 20);
}

void print_roofline(const BenchOptions& options, const BenchSummary& summary) {
  if (!summary.roofline.has_value()) return;
  const Roofline& roofline = *summary.roofline;
  constexpr double kMiB = 1 << 20;
  if (roofline.read_bytes_per_second <= 0) {
    std::printf("  roofline        %.1f MiB of weights per decode token; bandwidth not measured\n",
                static_cast<double>(roofline.weight_bytes_per_token) / kMiB);
    return;
  }
  const double tpot = roofline.tpot_ms();
  std::printf(
      "  roofline        %.1f MiB of weights per decode token / read bandwidth %.2f GB/s = "
      "TPOT %.3f ms; achieved/roofline %.2f (TPOT p50%s)\n",
      static_cast<double>(roofline.weight_bytes_per_token) / kMiB,
      roofline.read_bytes_per_second / 1e9, tpot,
      summary.tpot_ms.p50 > 0 ? tpot / summary.tpot_ms.p50 : 0.0,
      options.concurrency == 1 ? ", batch 1" : "; batch-1 only at --concurrency 1");
}

void print_profile(const BenchSummary& summary) {
  if (!summary.profile.has_value()) return;
  for (exec::ProfilePhase phase : {exec::ProfilePhase::kDecode, exec::ProfilePhase::kPrefill}) {
    const exec::PhaseProfile& totals = summary.profile->phase(phase);
    const std::string name(exec::profile_phase_name(phase));
    if (totals.steps == 0) {
      std::printf("  profile %-7s  no steps\n", name.c_str());
      continue;
    }
    std::printf("  profile %-7s  %lld steps, mean step %.3f ms\n", name.c_str(),
                static_cast<long long>(totals.steps), 1e3 * totals.step_seconds / totals.steps);
    std::printf("    %-26s %10s %7s %11s\n", "kind", "ms/step", "share", "calls/step");
    for (const ProfileLine& line : profile_lines(totals)) {
      std::printf("    %-26s %10.4f %6.1f%% %11.1f\n", line.kind.c_str(), line.ms_per_step,
                  100 * line.share, line.calls_per_step);
    }
  }
}

// Prints the text report on stdout.
void print_bench(const BenchOptions& options, const BenchSummary& summary) {
  std::printf("folio bench: %lld requests, concurrency %d, graphs %s, %d threads, %s kernels\n",
              static_cast<long long>(summary.num_requests), options.concurrency,
              options.engine.no_graphs ? "off" : "on", summary.num_threads,
              kernels::cpu::active_kernels_name().c_str());
  std::printf("  throughput      %.1f output tokens/s, %.1f total tokens/s (%.2f s, %lld errors)\n",
              summary.output_tokens_per_second, summary.total_tokens_per_second, summary.seconds,
              static_cast<long long>(summary.num_errors));
  if (summary.num_errors > 0) {
    std::printf("  first error     %s\n", summary.first_error.c_str());
  }
  std::printf("  TTFT            p50 %.1f ms, p99 %.1f ms\n", summary.ttft_ms.p50,
              summary.ttft_ms.p99);
  std::printf("  TPOT            p50 %.2f ms, p99 %.2f ms\n", summary.tpot_ms.p50,
              summary.tpot_ms.p99);
  if (const std::optional<dist::PipelineTraffic> traffic = pipeline_traffic()) {
    const double tokens = static_cast<double>(std::max<int64_t>(1, traffic->tokens));
    std::printf(
        "  pipeline        %lld steps, %.0f bytes on the wire per step token (%.0f sent, "
        "%.0f received)\n",
        static_cast<long long>(traffic->steps),
        static_cast<double>(traffic->request_bytes + traffic->reply_bytes) / tokens,
        static_cast<double>(traffic->request_bytes) / tokens,
        static_cast<double>(traffic->reply_bytes) / tokens);
  }
  if (const std::optional<dist::TensorParallelTraffic> traffic = tensor_parallel_traffic()) {
    const double tokens = static_cast<double>(std::max<int64_t>(1, traffic->tokens));
    const double steps = static_cast<double>(std::max<int64_t>(1, traffic->steps));
    std::printf(
        "  tensor par.     %lld ranks, %lld steps; among ranks per step token: %.0f bytes "
        "all-reduced, %.0f bytes on the wire from each rank (ring), %.1f us in collectives "
        "(rank 0, %.1f us per step); coordinator %.0f bytes per step token\n",
        static_cast<long long>(traffic->num_ranks), static_cast<long long>(traffic->steps),
        static_cast<double>(traffic->reduced_bytes) / tokens,
        static_cast<double>(traffic->wire_bytes_per_rank()) / tokens,
        static_cast<double>(traffic->communication_ns) * 1e-3 / tokens,
        static_cast<double>(traffic->communication_ns) * 1e-3 / steps,
        static_cast<double>(traffic->request_bytes + traffic->reply_bytes) / tokens);
  }
  if (const std::optional<dist::KvParallelTraffic> traffic = kv_parallel_traffic()) {
    const double tokens = static_cast<double>(std::max<int64_t>(1, traffic->tokens));
    const double steps = static_cast<double>(std::max<int64_t>(1, traffic->steps));
    std::printf(
        "  KV parallel     %lld members, %lld steps; per step token: %.0f bytes gathered by "
        "member 0 from the others, %.1f us in its all_gathers (%.1f us per step); coordinator "
        "%.0f bytes per step token\n",
        static_cast<long long>(traffic->num_members), static_cast<long long>(traffic->steps),
        static_cast<double>(traffic->gathered_bytes) / tokens,
        static_cast<double>(traffic->communication_ns) * 1e-3 / tokens,
        static_cast<double>(traffic->communication_ns) * 1e-3 / steps,
        static_cast<double>(traffic->request_bytes + traffic->reply_bytes) / tokens);
  }
  std::printf("  preemptions     %lld (%lld by swap); prefix hit rate %.1f%%\n",
              static_cast<long long>(summary.preemptions),
              static_cast<long long>(summary.preemptions_by_swap), 100 * summary.prefix_hit_rate);
  if (summary.host_copy_gib_per_second > 0) {
    std::printf(
        "  by cost         chose recompute %lld, swap %lld; host copy %.2f GiB/s, prefill %.3f "
        "GFLOP/s (calibrated)\n",
        static_cast<long long>(summary.cost_chose_recompute),
        static_cast<long long>(summary.cost_chose_swap), summary.host_copy_gib_per_second,
        summary.prefill_gflops);
  }
  std::printf("  graphs          hit rate %.1f%%, %lld captures, padding %.1f%% of tokens\n",
              100 * summary.graph_hit_rate, static_cast<long long>(summary.graph_captures),
              100 * summary.padding_ratio);
  std::printf("  peak pool       KV %.1f MiB (%.1f%% of budget), graph arena %.1f MiB\n",
              peak_mib(summary, memory::ContentType::kKvCache), 100 * summary.peak_kv_utilization,
              peak_mib(summary, memory::ContentType::kGraphArena));
  if (summary.peak_pool_bytes[static_cast<int>(memory::ContentType::kAdapterWeights)] > 0) {
    std::printf("                  hot adapter pages %.1f MiB\n",
                peak_mib(summary, memory::ContentType::kAdapterWeights));
  }
  if (summary.pressure.has_value()) {
    const engine::PressureCounts& pressure = *summary.pressure;
    std::printf(
        "  pressure        steps normal/warning/critical/oom %lld/%lld/%lld/%lld; evicted %lld "
        "pages (adapters %lld, KV %lld), gave back %.1f MiB of idle graph memory, %lld "
        "preemptions\n",
        static_cast<long long>(pressure.steps_at_level[0]),
        static_cast<long long>(pressure.steps_at_level[1]),
        static_cast<long long>(pressure.steps_at_level[2]),
        static_cast<long long>(pressure.steps_at_level[3]),
        static_cast<long long>(pressure.pages_evicted),
        static_cast<long long>(pressure.adapter_pages_evicted),
        static_cast<long long>(pressure.kv_pages_evicted),
        static_cast<double>(pressure.graph_bytes_released) / (1 << 20),
        static_cast<long long>(pressure.preemptions));
  } else {
    std::printf("  pressure        handling off\n");
  }
  constexpr double kMiB = 1 << 20;
  std::printf(
      "  memory          peak PSS %.1f MiB (RSS %.1f MiB, counting each graph view's mapping), "
      "pool budget %.1f MiB, weights %.1f MiB\n",
      static_cast<double>(summary.peak_pss_bytes) / kMiB,
      static_cast<double>(summary.peak_rss_bytes) / kMiB,
      static_cast<double>(summary.pool_budget_bytes) / kMiB,
      static_cast<double>(summary.weight_bytes) / kMiB);
  print_roofline(options, summary);
  print_profile(summary);
}

void write_json(const std::string& path, const nlohmann::json& json) {
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  if (!out) check_command(internal_error("cannot write {}", path));
}

// Prints the text report on stdout and, with --json, writes the same numbers as JSON.
void report_bench(const BenchOptions& options, const BenchSummary& summary) {
  print_bench(options, summary);
  if (!options.json_path.empty()) write_json(options.json_path, bench_json(options, summary));
}

// TTFT of the adapter passes' requests by the tier their adapter was in when submitted.
std::array<AdapterBenchReport::TierTtft, 3> ttft_by_tier(const BenchRun& run) {
  std::array<std::vector<double>, 3> ttft_ms;
  for (size_t i = 0; i < run.completions.size(); ++i) {
    if (!run.submit_tiers[i]) continue;
    ttft_ms[static_cast<size_t>(*run.submit_tiers[i])].push_back(
        to_milliseconds(run.completions[i].timing.time_to_first_token));
  }
  std::array<AdapterBenchReport::TierTtft, 3> result;
  for (size_t tier = 0; tier < ttft_ms.size(); ++tier) {
    result[tier].requests = static_cast<int64_t>(ttft_ms[tier].size());
    const LatencyPercentiles percentiles = percentiles_of(std::move(ttft_ms[tier]));
    result[tier].p50_ms = percentiles.p50;
    result[tier].p99_ms = percentiles.p99;
  }
  return result;
}

double output_tokens_per_second(const BenchRun& run) {
  int64_t tokens = 0;
  for (const engine::Completion& completion : run.completions) {
    tokens += completion.num_generated_tokens;
  }
  return static_cast<double>(tokens) / run.seconds;
}

std::unique_ptr<engine::ModelEngine> start_or_fail(
    const EngineCommandOptions& options,
    const std::function<void(engine::ModelEngineOptions&)>& customize = nullptr) {
  Result<std::unique_ptr<engine::ModelEngine>> bundle = start_model_engine(options, customize);
  check_command(bundle.status());
  return std::move(*bundle);
}

// --adapters N: the base engine (unless --no-base-pass) and the adapter engine side by side,
// each pass's requests through both, then the report of the adapter passes with the adapter
// lines and the comparison.
void run_adapter_bench(const BenchOptions& options, Range prompt, Range output) {
  const AdapterBenchOptions& adapter_options = options.adapters;
  if (adapter_options.rank < 1 || options.passes < 1) {
    check_command(invalid_argument("--adapter-rank and --passes must be at least 1"));
  }
  Result<AdapterPopularity> popularity = AdapterPopularity::create(
      adapter_options.popularity, adapter_options.num_adapters, adapter_options.zipf_exponent);
  check_command(popularity.status());
  std::unique_ptr<engine::ModelEngine> base_engine;
  if (adapter_options.base_pass) {
    EngineCommandOptions base = options.engine;
    base.adapters = false;
    base.loras.clear();
    base.lora_dir.clear();
    base_engine = start_or_fail(base);
  }
  EngineCommandOptions served = options.engine;
  served.adapters = true;
  // Declared before the engine, so the files outlive the loader thread that reads them.
  std::optional<AdapterFiles> files;
  std::unique_ptr<engine::ModelEngine> adapter_engine =
      start_or_fail(served, [&](engine::ModelEngineOptions& engine_options) {
        if (adapter_options.prefetch_lookahead >= 0) {
          engine_options.adapter_options.prefetch_lookahead = adapter_options.prefetch_lookahead;
        }
      });
  const model::LlamaModel& model = adapter_engine->model();
  Result<AdapterFiles> prepared = AdapterFiles::prepare(adapter_options, options.engine.model_path,
                                                        model.shape(), options.engine.quiet);
  check_command(prepared.status());
  files.emplace(std::move(*prepared));
  AdapterBenchReport report;
  report.options = adapter_options;
  report.files_written = files->num_written();
  lora::AdapterManager& adapters = *adapter_engine->adapters();
  Result<AdapterRegistration> registration = register_bench_adapters(adapters, files->paths());
  check_command(registration.status());
  report.registration = std::move(*registration);
  if (!options.engine.quiet) {
    std::fprintf(stderr, "registered %d adapters from %s in %.2f s (%d files written)\n",
                 adapter_options.num_adapters, files->directory().c_str(),
                 report.registration.seconds, report.files_written);
  }

  const AdapterCounters before = read_adapter_counters(adapter_engine->registry());
  // Its own stream, so the prompts are those of a bench without adapters at the same seed.
  std::mt19937_64 adapter_random(options.seed ^ 0x9e3779b97f4a7c15ULL);
  BenchRun base_total, adapter_total;
  for (int32_t pass = 0; pass < options.passes; ++pass) {
    BenchOptions pass_options = options;
    pass_options.seed = options.seed + static_cast<uint64_t>(pass);
    std::vector<engine::Request> requests =
        make_requests(pass_options, prompt, output, static_cast<int32_t>(model.shape().vocab_size),
                      model.tokenizer().bos());
    if (base_engine) {
      BenchRun base_run = drive_stepped(options, *base_engine, requests);
      report.base_tokens_per_second.push_back(output_tokens_per_second(base_run));
      merge_run(base_total, std::move(base_run));
    }
    for (engine::Request& request : requests) {
      request.adapter_id =
          report.registration.ids[static_cast<size_t>(popularity->draw(adapter_random))];
    }
    BenchRun adapter_run = drive_stepped(options, *adapter_engine, std::move(requests));
    report.adapter_tokens_per_second.push_back(output_tokens_per_second(adapter_run));
    merge_run(adapter_total, std::move(adapter_run));
  }
  report.counters = read_adapter_counters(adapter_engine->registry()).minus(before);
  report.end = adapters.stats();
  report.ttft_by_tier = ttft_by_tier(adapter_total);
  if (base_engine) {
    const BenchSummary base_summary = summarize_run(base_total);
    report.base_ttft_p50_ms = base_summary.ttft_ms.p50;
    report.base_ttft_p99_ms = base_summary.ttft_ms.p99;
  }

  const BenchSummary summary = summarize_run(adapter_total);
  print_bench(options, summary);
  print_adapter_report(report);
  if (!options.json_path.empty()) {
    nlohmann::json json = bench_json(options, summary);
    json["passes"] = options.passes;
    json["adapters"] = adapter_report_json(report);
    write_json(options.json_path, json);
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
  if (options.adapters.num_adapters > 0) {
    if (options.profile) {
      check_command(invalid_argument(
          "--profile times one engine; run it without --adapters (the adapter bench drives two)"));
    }
    run_adapter_bench(options, *prompt, *output);
    return;
  }
  std::unique_ptr<engine::ModelEngine> bundle =
      start_or_fail(options.engine, [&](engine::ModelEngineOptions& engine_options) {
        engine_options.profile = options.profile;
      });
  engine::ModelEngine& model_engine = *bundle;
  const model::LlamaModel& model = model_engine.model();
  std::vector<engine::Request> requests =
      make_requests(options, *prompt, *output, static_cast<int32_t>(model.shape().vocab_size),
                    model.tokenizer().bos());
  const BenchRun run = drive_requests(options, model_engine, std::move(requests));
  BenchSummary summary = summarize_run(run);
  // Right after the run, on the engine's threads (idle now), and after the summary took the
  // peak RSS, which the measurement's buffer would otherwise inflate by its size.
  summary.roofline = measure_roofline(options, model_engine);
  // The engine has stopped (drive_requests joined its thread): the profile is quiet.
  if (model_engine.profile() != nullptr) summary.profile = *model_engine.profile();
  report_bench(options, summary);
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
  command->add_flag("--profile", options->profile,
                    "Time every step per op kind and print where decode and prefill steps spend "
                    "their time");
  command
      ->add_option("--bandwidth-buffer-mib", options->bandwidth_buffer_mib,
                   "Buffer of the read-bandwidth measurement behind the roofline (0: skip it)")
      ->capture_default_str();
  AdapterBenchOptions& adapters = options->adapters;
  command->add_option("--adapters", adapters.num_adapters,
                      "Random LoRA adapters to register; each request runs with one (0: none)");
  command->add_option("--adapter-rank", adapters.rank, "Rank of the random adapters")
      ->capture_default_str();
  command
      ->add_option("--adapter-popularity", adapters.popularity,
                   "How requests pick adapters: uniform or zipf (over the adapter index)")
      ->capture_default_str();
  command->add_option("--zipf-exponent", adapters.zipf_exponent, "Exponent of zipf popularity")
      ->capture_default_str();
  command->add_option("--adapter-dir", adapters.dir,
                      "Keep the adapter files here and reuse those present (default: a "
                      "temporary directory)");
  command->add_option("--adapter-prefetch", adapters.prefetch_lookahead,
                      "Waiting requests whose adapters are prefetched (0: no prefetch; default: "
                      "the engine's)");
  command->add_flag("!--no-base-pass", adapters.base_pass,
                    "With --adapters, skip the pass without adapters (and the ratio)");
  command
      ->add_option("--passes", options->passes,
                   "With --adapters, passes of fresh requests (seeds seed, seed + 1, ...)")
      ->capture_default_str();
  command->callback([options] { run_bench(*options); });
}

}  // namespace folio::app
