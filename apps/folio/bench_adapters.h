// The adapter side of `folio bench --adapters N`: N random LoRA adapters for the bench's base
// model written to a directory and registered with the engine's adapter manager, the popularity
// each request's adapter is drawn from, and what the manager counted while the requests ran.
//
// Terms: an adapter's *index* is its place in popularity order (0 is the most popular under
// Zipf; under uniform popularity the order means nothing). Adapter i is named bench-<i> (five
// digits), is written with seed i + 1 (so every adapter differs; f16, all seven projections of
// every layer) and lives in <dir>/<model stem>-r<rank>-<i>.gguf: a directory given with
// --adapter-dir is reused by a later run with the same model and rank, which writes only the
// files missing there.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/lora/adapter_manager.h"
#include "folio/model/llama_model_file.h"

namespace folio::app {

struct AdapterBenchOptions {
  int32_t num_adapters = 0;  // 0: no adapters, the bench exactly as without these options
  int64_t rank = 16;
  std::string popularity = "uniform";  // or "zipf"
  double zipf_exponent = 1.0;
  std::string dir;                  // empty: a temporary directory, removed at the end
  int32_t prefetch_lookahead = -1;  // waiting requests prefetched for; -1: the manager's default
  bool base_pass = true;            // also run every pass's requests without adapters
};

// Draws adapter indices in [0, num_adapters): uniformly, or by Zipf's law over the index
// (P(i) proportional to 1 / (i + 1)^exponent).
class AdapterPopularity {
 public:
  // kInvalidArgument: a kind other than uniform or zipf, no adapters, an exponent <= 0.
  static Result<AdapterPopularity> create(const std::string& kind, int32_t num_adapters,
                                          double exponent);
  int32_t draw(std::mt19937_64& random) const;

 private:
  explicit AdapterPopularity(int32_t num_adapters) : num_adapters_(num_adapters) {}

  int32_t num_adapters_ = 0;
  std::vector<double> cumulative_;  // Zipf's CDF by index, ending at 1; empty: uniform
};

// The adapter files of one bench. Removes the directory at destruction when it made a
// temporary one (whatever it holds), never one it was given.
class AdapterFiles {
 public:
  // Writes the files missing from options.dir (made if absent) or from a new temporary
  // directory. Errors: the directory cannot be made, a file cannot be written; an invalid rank
  // (make_random_adapter_writer's message).
  static Result<AdapterFiles> prepare(const AdapterBenchOptions& options,
                                      const std::string& model_path, const model::LlamaShape& base,
                                      bool quiet);
  AdapterFiles(AdapterFiles&& other) noexcept;
  AdapterFiles& operator=(AdapterFiles&&) = delete;
  AdapterFiles(const AdapterFiles&) = delete;
  ~AdapterFiles();

  const std::vector<std::string>& paths() const { return paths_; }
  const std::filesystem::path& directory() const { return directory_; }
  int32_t num_written() const { return num_written_; }

 private:
  AdapterFiles() = default;

  std::filesystem::path directory_;
  bool temporary_ = false;
  std::vector<std::string> paths_;  // by index
  int32_t num_written_ = 0;
};

// What registering the files cost.
struct AdapterRegistration {
  std::vector<int64_t> ids;  // by index
  double seconds = 0;
  int64_t rss_bytes_added = 0;  // the process's resident set grew by this much (may be < 0)
  int64_t hot_bytes = 0;        // of one adapter (all have the same shape)
  int64_t warm_bytes = 0;
};

// Registers paths[i] as bench-<i>. Errors: the registry's, naming the adapter.
Result<AdapterRegistration> register_bench_adapters(lora::AdapterManager& adapters,
                                                    const std::vector<std::string>& paths);

// The manager's cumulative counters (its folio_lora_* metrics), indexed by lora::AdapterTier.
// requests[kCold] counts misses that started a demand load; loads exist for hot and warm only.
struct AdapterCounters {
  std::array<double, 3> requests{};
  std::array<double, 3> loads{};
  std::array<double, 3> load_seconds{};
  double promotions = 0, demotions = 0, evictions = 0, load_failures = 0;

  AdapterCounters minus(const AdapterCounters& before) const;
};

// Reads them from the registry's exposition text (a series never observed reads 0).
AdapterCounters read_adapter_counters(const metrics::Registry& registry);

// What the adapter passes measured besides their requests' own report (bench_command.cc).
struct AdapterBenchReport {
  AdapterBenchOptions options;
  int32_t files_written = 0;
  AdapterRegistration registration;
  lora::AdapterManagerStats end;  // the tiers after the last pass
  AdapterCounters counters;       // over the adapter passes
  struct TierTtft {
    int64_t requests = 0;
    double p50_ms = 0, p99_ms = 0;
  };
  // TTFT of the requests whose adapter was in each tier (by lora::AdapterTier) when submitted.
  std::array<TierTtft, 3> ttft_by_tier;
  // Output tokens per second of each pass, without adapters (empty: no base pass) and with.
  std::vector<double> base_tokens_per_second, adapter_tokens_per_second;
  double base_ttft_p50_ms = 0, base_ttft_p99_ms = 0;  // over the base passes
};

// The median of `values` (the mean of the middle two when even); 0 when empty.
double median_of(std::vector<double> values);

void print_adapter_report(const AdapterBenchReport& report);  // on stdout
nlohmann::json adapter_report_json(const AdapterBenchReport& report);

}  // namespace folio::app
