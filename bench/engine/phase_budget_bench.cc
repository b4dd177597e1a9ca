// folio_phase_budget_bench: the phase tuner (phase_budget_tuner.h) against fixed phase splits,
// on a real model through ModelEngine, under two synthetic open-loop loads:
//   prefill-heavy: long prompts, short outputs;  decode-heavy: short prompts, long outputs.
// Each load runs with a sweep of fixed prefill token shares and with the tuner on (starting
// from no split), in the same run, in rotated order per pass; the report gives goodput
// (completed requests per second that met both the TTFT and the TPOT target) and p99 TTFT and
// TPOT per configuration, and the tuner's goodput as a ratio of the best fixed split's.
// Not a timed test (benchmarks do not run in CI); it prints the figures.
//
// Usage: folio_phase_budget_bench --model models/demo/kjv-q8_0.gguf [--requests 160]
//          [--prefill-rate 12] [--decode-rate 12] [--ttft-ms 1000] [--tpot-ms 100] [--passes 3]
// Arrivals are Poisson at the load's rate (fixed seed, the same for every configuration). The
// bench drives the engine from its thread (Engine::step), submitting each request once its
// arrival time has passed; TTFT counts from the arrival time, not the submission, so a late
// submission is charged to the configuration.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>

#include "folio/base/percentile.h"
#include "folio/engine/model_engine.h"
#include "folio/model/llama_model.h"

namespace {

using namespace folio;
using Clock = std::chrono::steady_clock;

struct Load {
  std::string name;
  int32_t min_prompt = 0, max_prompt = 0;
  int32_t min_output = 0, max_output = 0;
  double rate = 0;  // requests per second
};

struct Configuration {
  std::string name;
  engine::PhaseSplit split;
  bool tuner = false;
};

struct Targets {
  double ttft_seconds = 1.0;
  double tpot_seconds = 0.06;
};

struct Outcome {
  double goodput = 0;  // requests/s meeting both targets
  double throughput = 0;
  double p99_ttft_ms = 0;
  double p99_tpot_ms = 0;
  int32_t errors = 0;
  engine::EngineStats stats;
};

struct Arrival {
  double at_seconds = 0;
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
};

std::vector<Arrival> make_arrivals(const Load& load, int32_t count, int32_t vocab, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::exponential_distribution<double> gap(load.rate);
  std::uniform_int_distribution<int32_t> prompt(load.min_prompt, load.max_prompt);
  std::uniform_int_distribution<int32_t> output(load.min_output, load.max_output);
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<Arrival> arrivals(static_cast<size_t>(count));
  double at = 0;
  for (Arrival& arrival : arrivals) {
    at += gap(random);
    arrival.at_seconds = at;
    arrival.prompt.resize(static_cast<size_t>(prompt(random)));
    for (int32_t& value : arrival.prompt) value = token(random);
    arrival.max_tokens = output(random);
  }
  return arrivals;
}

Outcome run(const std::string& model_path, const engine::ModelEngineOptions& base,
            const Configuration& configuration, const std::vector<Arrival>& arrivals,
            const Targets& targets) {
  engine::ModelEngineOptions options = base;
  options.scheduler.phase_split = configuration.split;
  options.phase_tuner.enabled = configuration.tuner;
  options.phase_tuner.ttft_target = std::chrono::duration_cast<engine::Duration>(
      std::chrono::duration<double>(targets.ttft_seconds));
  options.phase_tuner.tpot_target = std::chrono::duration_cast<engine::Duration>(
      std::chrono::duration<double>(targets.tpot_seconds));
  auto model_engine = std::move(
      engine::ModelEngine::create(std::move(model::LlamaModel::open(model_path).value()), options)
          .value());
  engine::Engine& engine = model_engine->engine();
  // Completions arrive inside step(), on this thread.
  std::unordered_map<int64_t, double> submit_lag;  // seconds from arrival to submission
  std::vector<std::pair<int64_t, engine::Completion>> completions;
  const Clock::time_point start = Clock::now();
  size_t next = 0;
  while (completions.size() < arrivals.size()) {
    const double now = std::chrono::duration<double>(Clock::now() - start).count();
    while (next < arrivals.size() && arrivals[next].at_seconds <= now) {
      engine::Request request;
      request.prompt = arrivals[next].prompt;
      request.max_tokens = arrivals[next].max_tokens;
      request.ignore_eos = true;
      request.sampling.temperature = 0.0f;
      request.on_finish = [&completions](const engine::Completion& completion) {
        completions.emplace_back(completion.request.value(), completion);
      };
      const engine::RequestId id = engine.submit(std::move(request)).value();
      submit_lag[id.value()] = now - arrivals[next].at_seconds;
      ++next;
    }
    if (!engine.step() && next < arrivals.size()) {
      // Idle until the next arrival.
      std::this_thread::sleep_until(start +
                                    std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(arrivals[next].at_seconds)));
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  Outcome outcome;
  std::vector<double> ttft, tpot;
  int32_t good = 0;
  for (const auto& [id, completion] : completions) {
    if (completion.reason == engine::FinishReason::kError) {
      ++outcome.errors;
      continue;
    }
    const double first =
        engine::to_seconds(completion.timing.time_to_first_token) + submit_lag.at(id);
    const double per_token = engine::to_seconds(completion.timing.time_per_output_token);
    ttft.push_back(first);
    if (completion.num_generated_tokens >= 2) tpot.push_back(per_token);
    good += first <= targets.ttft_seconds && per_token <= targets.tpot_seconds ? 1 : 0;
  }
  outcome.goodput = good / seconds;
  outcome.throughput = static_cast<double>(completions.size()) / seconds;
  outcome.p99_ttft_ms = percentile(ttft, 0.99) * 1e3;
  outcome.p99_tpot_ms = percentile(tpot, 0.99) * 1e3;
  outcome.stats = engine.stats();
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The phase tuner against the best fixed phase split, on two loads"};
  std::string model_path;
  int32_t requests = 160;
  int32_t passes = 3;
  int32_t threads = 2;
  double prefill_rate = 12;
  double decode_rate = 12;
  Targets targets;
  double ttft_ms = 1000, tpot_ms = 100;
  std::vector<double> shares = {1.0, 0.5, 0.25, 0.125};
  app.add_option("--model", model_path, "GGUF model")->required();
  app.add_option("--requests", requests, "Requests per load and configuration");
  app.add_option("--passes", passes, "Passes over the configurations (rotated order)");
  app.add_option("--threads", threads, "Engine threads");
  app.add_option("--prefill-rate", prefill_rate, "Arrivals per second of the prefill-heavy load");
  app.add_option("--decode-rate", decode_rate, "Arrivals per second of the decode-heavy load");
  app.add_option("--ttft-ms", ttft_ms, "TTFT target of goodput (and the tuner's)");
  app.add_option("--tpot-ms", tpot_ms, "TPOT target of goodput (and the tuner's)");
  app.add_option("--shares", shares, "Fixed prefill token shares swept")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  targets.ttft_seconds = ttft_ms / 1e3;
  targets.tpot_seconds = tpot_ms / 1e3;

  engine::ModelEngineOptions options;
  options.num_threads = threads;
  const auto vocab =
      static_cast<int32_t>(model::LlamaModel::open(model_path).value()->shape().vocab_size);
  const std::vector<Load> loads = {
      {"prefill-heavy", 160, 240, 2, 8, prefill_rate},
      {"decode-heavy", 8, 24, 96, 128, decode_rate},
  };
  std::vector<Configuration> configurations;
  for (double share : shares) {
    configurations.push_back({fmt::format("fixed {:.3f}", share), {share, 0.0}, false});
  }
  configurations.push_back({"tuner", {}, true});
  std::printf("targets: TTFT <= %.0f ms, TPOT <= %.0f ms; %d requests per run, %d passes\n",
              ttft_ms, tpot_ms, requests, passes);
  for (const Load& load : loads) {
    const std::vector<Arrival> arrivals = make_arrivals(load, requests, vocab, 42);
    std::vector<std::vector<Outcome>> outcomes(configurations.size());
    for (int32_t pass = 0; pass < passes; ++pass) {
      for (size_t offset = 0; offset < configurations.size(); ++offset) {
        const size_t index = (offset + static_cast<size_t>(pass)) % configurations.size();
        outcomes[index].push_back(
            run(model_path, options, configurations[index], arrivals, targets));
      }
    }
    std::printf("\n%s (prompts %d-%d, outputs %d-%d, %.1f req/s)\n", load.name.c_str(),
                load.min_prompt, load.max_prompt, load.min_output, load.max_output, load.rate);
    std::printf("%-12s %9s %9s %10s %10s %6s %14s\n", "split", "goodput", "req/s", "p99 TTFT",
                "p99 TPOT", "errors", "final split");
    double best_fixed = 0, tuner = 0;
    for (size_t index = 0; index < configurations.size(); ++index) {
      // Medians over passes (the middle pass by goodput).
      std::vector<Outcome> sorted = outcomes[index];
      std::sort(sorted.begin(), sorted.end(), [](const Outcome& left, const Outcome& right) {
        return left.goodput < right.goodput;
      });
      const Outcome& median = sorted[sorted.size() / 2];
      std::printf("%-12s %9.2f %9.2f %8.0fms %8.1fms %6d %7.3f/%.3f (%lld moves)\n",
                  configurations[index].name.c_str(), median.goodput, median.throughput,
                  median.p99_ttft_ms, median.p99_tpot_ms, median.errors,
                  median.stats.prefill_token_share, median.stats.decode_kv_share,
                  static_cast<long long>(median.stats.phase_split_moves));
      if (configurations[index].tuner) {
        tuner = median.goodput;
      } else {
        best_fixed = std::max(best_fixed, median.goodput);
      }
    }
    std::printf("tuner goodput / best fixed: %.2f\n", best_fixed > 0 ? tuner / best_fixed : 0.0);
  }
  return 0;
}
