#include "apps/folio/bench_adapters.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "apps/folio/process_memory.h"
#include "apps/folio/progress_bar.h"
#include "folio/lora/adapter_writer.h"

namespace folio::app {

Result<AdapterPopularity> AdapterPopularity::create(const std::string& kind, int32_t num_adapters,
                                                    double exponent) {
  if (num_adapters < 1) {
    return invalid_argument("adapter popularity needs at least one adapter, got {}", num_adapters);
  }
  AdapterPopularity popularity(num_adapters);
  if (kind == "uniform") return popularity;
  if (kind != "zipf") {
    return invalid_argument("--adapter-popularity '{}': use uniform or zipf", kind);
  }
  if (!(exponent > 0) || !std::isfinite(exponent)) {
    return invalid_argument("--zipf-exponent must be positive, got {}", exponent);
  }
  popularity.cumulative_.resize(static_cast<size_t>(num_adapters));
  double total = 0;
  for (int32_t i = 0; i < num_adapters; ++i) {
    total += std::pow(static_cast<double>(i) + 1.0, -exponent);
    popularity.cumulative_[static_cast<size_t>(i)] = total;
  }
  for (double& value : popularity.cumulative_) value /= total;
  popularity.cumulative_.back() = 1.0;
  return popularity;
}

int32_t AdapterPopularity::draw(std::mt19937_64& random) const {
  if (cumulative_.empty()) {
    return static_cast<int32_t>(random() % static_cast<uint64_t>(num_adapters_));
  }
  // 53 random bits, so the draw does not depend on the library's distributions.
  const double u = static_cast<double>(random() >> 11) * 0x1p-53;
  const auto found = std::upper_bound(cumulative_.begin(), cumulative_.end(), u);
  return static_cast<int32_t>(
      std::min<ptrdiff_t>(found - cumulative_.begin(), static_cast<ptrdiff_t>(num_adapters_) - 1));
}

namespace {

Result<std::filesystem::path> make_temporary_directory() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "folio-bench-adapters-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return internal_error("cannot make a temporary directory {}", pattern);
  }
  return std::filesystem::path(pattern);
}

}  // namespace

AdapterFiles::AdapterFiles(AdapterFiles&& other) noexcept
    : directory_(std::move(other.directory_)),
      temporary_(std::exchange(other.temporary_, false)),
      paths_(std::move(other.paths_)),
      num_written_(other.num_written_) {}

AdapterFiles::~AdapterFiles() {
  if (!temporary_) return;
  std::error_code ignored;
  std::filesystem::remove_all(directory_, ignored);
}

Result<AdapterFiles> AdapterFiles::prepare(const AdapterBenchOptions& options,
                                           const std::string& model_path,
                                           const model::LlamaShape& base, bool quiet) {
  AdapterFiles files;
  if (options.dir.empty()) {
    FOLIO_ASSIGN_OR_RETURN(files.directory_, make_temporary_directory());
    files.temporary_ = true;
  } else {
    files.directory_ = options.dir;
    std::error_code error;
    std::filesystem::create_directories(files.directory_, error);
    if (error) return invalid_argument("--adapter-dir {}: {}", options.dir, error.message());
  }
  const std::string stem = std::filesystem::path(model_path).stem().string();
  ProgressBar bar("writing adapters", options.num_adapters, ProgressUnit::kItems, "adapters",
                  !quiet);
  for (int32_t i = 0; i < options.num_adapters; ++i) {
    const std::filesystem::path path =
        files.directory_ / fmt::format("{}-r{}-{:05}.gguf", stem, options.rank, i);
    files.paths_.push_back(path.string());
    bar.update(i + 1);
    if (std::filesystem::exists(path)) continue;
    lora::RandomAdapterOptions random;  // all seven projections, f16
    random.rank = options.rank;
    random.seed = static_cast<uint64_t>(i) + 1;
    random.name = fmt::format("bench-{}", i);
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer, lora::make_random_adapter_writer(base, random));
    FOLIO_RETURN_IF_ERROR(writer.write_file(path.string()).with_context(path.string()));
    ++files.num_written_;
  }
  bar.finish();
  return files;
}

Result<AdapterRegistration> register_bench_adapters(lora::AdapterManager& adapters,
                                                    const std::vector<std::string>& paths) {
  AdapterRegistration registration;
  const int64_t rss_before = resident_set_bytes();
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string name = fmt::format("bench-{:05}", i);
    Result<lora::AdapterInfo> info = adapters.register_adapter(name, paths[i]);
    if (!info.ok()) return info.status().with_context(fmt::format("adapter {}", name));
    registration.ids.push_back(info->id);
    registration.hot_bytes = info->hot_bytes;
    registration.warm_bytes = info->warm_bytes;
  }
  registration.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  registration.rss_bytes_added = resident_set_bytes() - rss_before;
  return registration;
}

AdapterCounters AdapterCounters::minus(const AdapterCounters& before) const {
  AdapterCounters result = *this;
  for (size_t i = 0; i < requests.size(); ++i) {
    result.requests[i] -= before.requests[i];
    result.loads[i] -= before.loads[i];
    result.load_seconds[i] -= before.load_seconds[i];
  }
  result.promotions -= before.promotions;
  result.demotions -= before.demotions;
  result.evictions -= before.evictions;
  result.load_failures -= before.load_failures;
  return result;
}

AdapterCounters read_adapter_counters(const metrics::Registry& registry) {
  // Exposition lines are `name{labels} value`: a map from everything before the last space.
  std::istringstream text(registry.render());
  std::map<std::string, double> samples;
  for (std::string line; std::getline(text, line);) {
    if (line.empty() || line[0] == '#' || line.rfind("folio_lora_", 0) != 0) continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    samples[line.substr(0, space)] = std::strtod(line.c_str() + space + 1, nullptr);
  }
  auto sample = [&](const std::string& series) {
    const auto found = samples.find(series);
    return found == samples.end() ? 0.0 : found->second;
  };
  AdapterCounters counters;
  for (const lora::AdapterTier tier :
       {lora::AdapterTier::kCold, lora::AdapterTier::kWarm, lora::AdapterTier::kHot}) {
    const auto index = static_cast<size_t>(tier);
    const std::string labels = fmt::format("{{tier=\"{}\"}}", lora::adapter_tier_name(tier));
    counters.requests[index] = sample("folio_lora_requests_total" + labels);
    counters.loads[index] = sample("folio_lora_load_seconds_count" + labels);
    counters.load_seconds[index] = sample("folio_lora_load_seconds_sum" + labels);
  }
  counters.promotions = sample("folio_lora_promotions_total");
  counters.demotions = sample("folio_lora_demotions_total");
  counters.evictions = sample("folio_lora_evictions_total");
  counters.load_failures = sample("folio_lora_load_failures_total");
  return counters;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

namespace {

// adapter / base output tokens per second, pass by pass (empty without base passes).
std::vector<double> throughput_ratios(const AdapterBenchReport& report) {
  std::vector<double> ratios;
  for (size_t i = 0; i < report.base_tokens_per_second.size(); ++i) {
    ratios.push_back(report.adapter_tokens_per_second[i] / report.base_tokens_per_second[i]);
  }
  return ratios;
}

int64_t cold_adapters(const lora::AdapterManagerStats& stats) {
  return stats.registered - stats.hot.adapters - stats.warm.adapters;
}

double mean_load_ms(const AdapterCounters& counters, lora::AdapterTier tier) {
  const auto index = static_cast<size_t>(tier);
  return counters.loads[index] == 0 ? 0.0
                                    : 1e3 * counters.load_seconds[index] / counters.loads[index];
}

constexpr lora::AdapterTier kTiers[] = {lora::AdapterTier::kHot, lora::AdapterTier::kWarm,
                                        lora::AdapterTier::kCold};

}  // namespace

void print_adapter_report(const AdapterBenchReport& report) {
  const AdapterBenchOptions& options = report.options;
  const AdapterRegistration& registration = report.registration;
  std::printf("  adapters        %d registered (rank %lld, %s", options.num_adapters,
              static_cast<long long>(options.rank), options.popularity.c_str());
  if (options.popularity == "zipf") std::printf(" %.2f", options.zipf_exponent);
  std::printf("), %.1f KiB hot / %.1f KiB warm each; %d files written\n",
              static_cast<double>(registration.hot_bytes) / 1024,
              static_cast<double>(registration.warm_bytes) / 1024, report.files_written);
  std::printf("  registration    %.2f s, RSS %+.1f MiB (%.0f B per adapter)\n",
              registration.seconds, static_cast<double>(registration.rss_bytes_added) / (1 << 20),
              static_cast<double>(registration.rss_bytes_added) / options.num_adapters);
  const lora::AdapterManagerStats& end = report.end;
  std::printf(
      "  tiers at end    hot %lld (%.1f MiB), warm %lld (%.1f MiB), cold %lld\n",
      static_cast<long long>(end.hot.adapters), static_cast<double>(end.hot.bytes) / (1 << 20),
      static_cast<long long>(end.warm.adapters), static_cast<double>(end.warm.bytes) / (1 << 20),
      static_cast<long long>(cold_adapters(end)));
  const AdapterCounters& counters = report.counters;
  std::printf("  acquired        hot %.0f, warm %.0f; cold misses %.0f (demand loads started)\n",
              counters.requests[static_cast<size_t>(lora::AdapterTier::kHot)],
              counters.requests[static_cast<size_t>(lora::AdapterTier::kWarm)],
              counters.requests[static_cast<size_t>(lora::AdapterTier::kCold)]);
  std::printf(
      "  loads           to hot %.0f (mean %.2f ms), to warm %.0f (mean %.2f ms); promotions "
      "%.0f, demotions %.0f, evictions %.0f, failures %.0f\n",
      counters.loads[static_cast<size_t>(lora::AdapterTier::kHot)],
      mean_load_ms(counters, lora::AdapterTier::kHot),
      counters.loads[static_cast<size_t>(lora::AdapterTier::kWarm)],
      mean_load_ms(counters, lora::AdapterTier::kWarm), counters.promotions, counters.demotions,
      counters.evictions, counters.load_failures);
  std::printf("  TTFT by tier    (the adapter's tier when the request was submitted)\n");
  for (const lora::AdapterTier tier : kTiers) {
    const AdapterBenchReport::TierTtft& ttft = report.ttft_by_tier[static_cast<size_t>(tier)];
    std::printf("    %-5s         %lld requests, p50 %.1f ms, p99 %.1f ms\n",
                std::string(lora::adapter_tier_name(tier)).c_str(),
                static_cast<long long>(ttft.requests), ttft.p50_ms, ttft.p99_ms);
  }
  if (report.base_tokens_per_second.empty()) return;
  const std::vector<double> ratios = throughput_ratios(report);
  std::printf(
      "  base only       %.1f output tokens/s (median of %zu passes), TTFT p50 %.1f ms, p99 "
      "%.1f ms\n",
      median_of(report.base_tokens_per_second), report.base_tokens_per_second.size(),
      report.base_ttft_p50_ms, report.base_ttft_p99_ms);
  std::printf("  adapters/base   %.3f (median; passes:", median_of(ratios));
  for (const double ratio : ratios) std::printf(" %.3f", ratio);
  std::printf(")\n");
}

nlohmann::json adapter_report_json(const AdapterBenchReport& report) {
  const AdapterBenchOptions& options = report.options;
  nlohmann::json tiers_at_end = {{"hot", report.end.hot.adapters},
                                 {"warm", report.end.warm.adapters},
                                 {"cold", cold_adapters(report.end)},
                                 {"hot_bytes", report.end.hot.bytes},
                                 {"warm_bytes", report.end.warm.bytes}};
  nlohmann::json acquired = nlohmann::json::object();
  nlohmann::json ttft = nlohmann::json::object();
  for (const lora::AdapterTier tier : kTiers) {
    const auto index = static_cast<size_t>(tier);
    const std::string name(lora::adapter_tier_name(tier));
    acquired[name] = report.counters.requests[index];
    const AdapterBenchReport::TierTtft& tier_ttft = report.ttft_by_tier[index];
    ttft[name] = {
        {"requests", tier_ttft.requests}, {"p50", tier_ttft.p50_ms}, {"p99", tier_ttft.p99_ms}};
  }
  const AdapterCounters& counters = report.counters;
  nlohmann::json json = {
      {"adapters", options.num_adapters},
      {"rank", options.rank},
      {"popularity", options.popularity},
      {"zipf_exponent", options.zipf_exponent},
      {"files_written", report.files_written},
      {"hot_bytes_each", report.registration.hot_bytes},
      {"warm_bytes_each", report.registration.warm_bytes},
      {"registration_seconds", report.registration.seconds},
      {"registration_rss_bytes", report.registration.rss_bytes_added},
      {"tiers_at_end", tiers_at_end},
      {"acquired", acquired},
      {"loads",
       {{"hot", counters.loads[static_cast<size_t>(lora::AdapterTier::kHot)]},
        {"warm", counters.loads[static_cast<size_t>(lora::AdapterTier::kWarm)]},
        {"hot_mean_ms", mean_load_ms(counters, lora::AdapterTier::kHot)},
        {"warm_mean_ms", mean_load_ms(counters, lora::AdapterTier::kWarm)}}},
      {"promotions", counters.promotions},
      {"demotions", counters.demotions},
      {"evictions", counters.evictions},
      {"load_failures", counters.load_failures},
      {"ttft_ms_by_submit_tier", ttft},
      {"adapter_output_tokens_per_second", report.adapter_tokens_per_second},
  };
  if (!report.base_tokens_per_second.empty()) {
    json["base_output_tokens_per_second"] = report.base_tokens_per_second;
    json["base_ttft_ms"] = {{"p50", report.base_ttft_p50_ms}, {"p99", report.base_ttft_p99_ms}};
    const std::vector<double> ratios = throughput_ratios(report);
    json["throughput_ratios"] = ratios;
    json["throughput_ratio"] = median_of(ratios);
  }
  return json;
}

}  // namespace folio::app
