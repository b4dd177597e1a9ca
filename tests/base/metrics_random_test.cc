// Randomized operation sequences against metrics::Registry, checked after every step against an
// independent model of what the registry should hold (which registrations succeed, with which
// code, and every rendered sample's value), with the output read back by the exposition
// validator.
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "exposition_validator.h"
#include "folio/base/metrics.h"

namespace folio::metrics {
namespace {

using LabelMap = std::map<std::string, std::string>;
using SampleKey = std::pair<std::string, LabelMap>;  // rendered name, labels

enum class Kind { kCounter, kGauge, kHistogram };

struct ModelSeries {
  bool is_function = false;
  std::unique_ptr<double> function_value;  // read by the gauge function's callback
  Counter* counter = nullptr;
  Gauge* gauge = nullptr;
  Histogram* histogram = nullptr;
  double value = 0;               // counter or gauge
  std::vector<uint64_t> buckets;  // histogram, non-cumulative, last is +Inf
  double sum = 0;
};

struct ModelFamily {
  Kind kind;
  std::string help;
  std::set<std::string> label_names;
  std::vector<double> bounds;
  std::map<LabelMap, ModelSeries> series;
};

const std::vector<std::string> kNames = {"alpha",    "alpha_count", "beta",
                                         "beta_sum", "gamma_total", "job:rate"};
const std::vector<std::string> kHelps = {"Help one.", "Help \\ two\nlines \"quoted\"."};
const std::vector<std::vector<std::string>> kLabelNameSets = {{}, {"kind"}, {"kind", "shard"}};
const std::vector<std::string> kLabelValues = {"a",         "\"q\"",       "back\\slash",
                                               "new\nline", "caf\xc3\xa9", ""};
const std::vector<std::vector<double>> kBoundSets = {{1, 2, 4}, {0.5, 1}};

class RegistryModel {
 public:
  explicit RegistryModel(uint32_t seed) : rng_(seed) {}

  void step() {
    // Each name has a usual kind, help, label names and bounds, used 4 times in 5, so that
    // registrations often succeed (new series, same series again) and sometimes conflict.
    const size_t name_index = rng_() % kNames.size();
    const std::string& name = kNames[name_index];
    const bool usual = rng_() % 5 != 0;
    const std::string help = usual ? kHelps[name_index % kHelps.size()] : pick(kHelps);
    const std::vector<std::string> names =
        usual ? kLabelNameSets[name_index % kLabelNameSets.size()] : pick(kLabelNameSets);
    const std::vector<double> bounds =
        usual ? kBoundSets[name_index % kBoundSets.size()] : pick(kBoundSets);
    const Kind kinds[] = {Kind::kCounter, Kind::kGauge, Kind::kHistogram};
    const Kind kind = usual ? kinds[name_index % 3] : kinds[rng_() % 3];
    LabelMap labels;
    for (const std::string& label : names) labels[label] = pick(kLabelValues);
    Labels given(labels.begin(), labels.end());
    std::shuffle(given.begin(), given.end(), rng_);
    switch (rng_() % 5) {
      case 0:
      case 1:
        register_metric(kind, name, help, labels, given,
                        kind == Kind::kHistogram ? bounds : std::vector<double>{});
        break;
      case 2:
        if (kind == Kind::kGauge) {
          register_function(name, help, labels, given);
        } else {
          remove_function(name, labels, given);
        }
        break;
      default:
        update_random_series();
        break;
    }
  }

  // Renders, validates and compares every sample with the model.
  void check() const {
    const std::string text = registry_.render();
    auto parsed = testing::parse_exposition(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
    ASSERT_EQ(parsed->size(), families_.size()) << text;
    std::map<SampleKey, double> actual;
    size_t index = 0;
    for (const auto& [name, family] : families_) {
      const testing::ParsedFamily& got = parsed->at(index++);
      EXPECT_EQ(got.name, name);
      EXPECT_EQ(got.help, family.help);
      EXPECT_EQ(got.type, kind_name(family.kind));
      for (const auto& sample : got.samples) actual[{sample.name, sample.labels}] = sample.value;
    }
    const std::map<SampleKey, double> expected = expected_samples();
    ASSERT_EQ(actual.size(), expected.size()) << text;
    for (const auto& [key, value] : expected) {
      auto it = actual.find(key);
      ASSERT_NE(it, actual.end()) << "missing " << key.first << "\n" << text;
      if (std::isnan(value)) {
        EXPECT_TRUE(std::isnan(it->second)) << key.first;
      } else {
        EXPECT_EQ(it->second, value) << key.first << "\n" << text;
      }
    }
  }

  int num_accepted() const { return num_accepted_; }
  int num_rejected() const { return num_rejected_; }

 private:
  static std::string kind_name(Kind kind) {
    switch (kind) {
      case Kind::kCounter:
        return "counter";
      case Kind::kGauge:
        return "gauge";
      case Kind::kHistogram:
        return "histogram";
    }
    return "";
  }

  template <typename T>
  const T& pick(const std::vector<T>& options) {
    return options[rng_() % options.size()];
  }

  // The code a registration of a new or existing series should get, by the documented rules.
  StatusCode predict(Kind kind, const std::string& name, const std::string& help,
                     const LabelMap& labels, const std::vector<double>& bounds) const {
    std::set<std::string> names;
    for (const auto& [label, value] : labels) names.insert(label);
    auto family = families_.find(name);
    if (family != families_.end()) {
      const ModelFamily& existing = family->second;
      const bool same = existing.kind == kind && existing.help == help &&
                        existing.label_names == names && existing.bounds == bounds;
      return same ? StatusCode::kOk : StatusCode::kInvalidArgument;
    }
    for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
      if (name.ends_with(suffix)) {
        auto base = families_.find(name.substr(0, name.size() - suffix.size()));
        if (base != families_.end() && base->second.kind == Kind::kHistogram) {
          return StatusCode::kInvalidArgument;
        }
      }
      if (kind == Kind::kHistogram && families_.contains(name + suffix)) {
        return StatusCode::kInvalidArgument;
      }
    }
    return StatusCode::kOk;
  }

  ModelSeries* find_series(const std::string& name, const LabelMap& labels) {
    auto family = families_.find(name);
    if (family == families_.end()) return nullptr;
    auto series = family->second.series.find(labels);
    return series == family->second.series.end() ? nullptr : &series->second;
  }

  ModelSeries& add_series(Kind kind, const std::string& name, const std::string& help,
                          const LabelMap& labels, const std::vector<double>& bounds) {
    ModelFamily& family =
        families_.try_emplace(name, ModelFamily{kind, help, {}, bounds, {}}).first->second;
    for (const auto& [label, value] : labels) family.label_names.insert(label);
    ModelSeries& series = family.series[labels];
    if (kind == Kind::kHistogram) series.buckets.assign(bounds.size() + 1, 0);
    return series;
  }

  void register_metric(Kind kind, const std::string& name, const std::string& help,
                       const LabelMap& labels, const Labels& given,
                       const std::vector<double>& bounds) {
    StatusCode expected = predict(kind, name, help, labels, bounds);
    ModelSeries* existing = expected == StatusCode::kOk ? find_series(name, labels) : nullptr;
    if (existing != nullptr && existing->is_function) expected = StatusCode::kAlreadyExists;
    Status status;
    void* pointer = nullptr;
    if (kind == Kind::kCounter) {
      auto result = registry_.counter(name, help, given);
      status = result.status();
      if (result.ok()) pointer = *result;
    } else if (kind == Kind::kGauge) {
      auto result = registry_.gauge(name, help, given);
      status = result.status();
      if (result.ok()) pointer = *result;
    } else {
      auto result = registry_.histogram(name, help, bounds, given);
      status = result.status();
      if (result.ok()) pointer = *result;
    }
    ASSERT_EQ(status.code(), expected) << status << " registering " << name;
    if (!status.ok()) {
      ++num_rejected_;
      return;
    }
    ++num_accepted_;
    if (existing != nullptr) {
      const void* known = kind == Kind::kCounter ? static_cast<void*>(existing->counter)
                          : kind == Kind::kGauge ? static_cast<void*>(existing->gauge)
                                                 : static_cast<void*>(existing->histogram);
      ASSERT_EQ(pointer, known) << "same (name, labels) must return the same object";
      return;
    }
    ModelSeries& series = add_series(kind, name, help, labels, bounds);
    series.counter = kind == Kind::kCounter ? static_cast<Counter*>(pointer) : nullptr;
    series.gauge = kind == Kind::kGauge ? static_cast<Gauge*>(pointer) : nullptr;
    series.histogram = kind == Kind::kHistogram ? static_cast<Histogram*>(pointer) : nullptr;
  }

  void register_function(const std::string& name, const std::string& help, const LabelMap& labels,
                         const Labels& given) {
    StatusCode expected = predict(Kind::kGauge, name, help, labels, {});
    if (expected == StatusCode::kOk && find_series(name, labels) != nullptr) {
      expected = StatusCode::kAlreadyExists;
    }
    auto value = std::make_unique<double>(static_cast<double>(rng_() % 100) - 50);
    const double* read = value.get();
    const Status status = registry_.gauge_function(name, help, given, [read] { return *read; });
    ASSERT_EQ(status.code(), expected) << status;
    if (!status.ok()) {
      ++num_rejected_;
      return;
    }
    ++num_accepted_;
    ModelSeries& series = add_series(Kind::kGauge, name, help, labels, {});
    series.is_function = true;
    series.function_value = std::move(value);
  }

  void remove_function(const std::string& name, const LabelMap& labels, const Labels& given) {
    ModelSeries* series = find_series(name, labels);
    const bool expected_ok = series != nullptr && series->is_function;
    const Status status = registry_.remove_gauge_function(name, given);
    ASSERT_EQ(status.ok(), expected_ok) << status;
    if (!expected_ok) {
      EXPECT_EQ(status.code(), StatusCode::kNotFound);
      return;
    }
    ModelFamily& family = families_.at(name);
    family.series.erase(labels);
    if (family.series.empty()) families_.erase(name);
  }

  void update_random_series() {
    if (families_.empty()) return;
    auto family = std::next(families_.begin(), static_cast<long>(rng_() % families_.size()));
    auto entry = std::next(family->second.series.begin(),
                           static_cast<long>(rng_() % family->second.series.size()));
    ModelSeries& series = entry->second;
    // Small integers and halves keep every sum exact, so the model can compare with ==.
    const double amount = static_cast<double>(rng_() % 21) / 2 - 3;
    if (series.is_function) {
      *series.function_value = amount;
    } else if (series.counter != nullptr) {
      series.counter->increment(std::fabs(amount));
      series.value += std::fabs(amount);
    } else if (series.gauge != nullptr) {
      const double special[] = {amount, std::numeric_limits<double>::infinity(),
                                std::numeric_limits<double>::quiet_NaN()};
      const double value = special[rng_() % 8 == 0 ? 1 + rng_() % 2 : 0];
      if (rng_() % 2 == 0 && std::isfinite(series.value)) {
        series.gauge->add(value);
        series.value += value;
      } else {
        series.gauge->set(value);
        series.value = value;
      }
    } else {
      series.histogram->observe(amount);
      const std::vector<double>& bounds = family->second.bounds;
      size_t bucket = 0;
      while (bucket < bounds.size() && amount > bounds[bucket]) ++bucket;
      ++series.buckets[bucket];
      series.sum += amount;
    }
  }

  std::map<SampleKey, double> expected_samples() const {
    std::map<SampleKey, double> expected;
    for (const auto& [name, family] : families_) {
      for (const auto& [labels, series] : family.series) {
        if (family.kind != Kind::kHistogram) {
          expected[{name, labels}] = series.is_function ? *series.function_value : series.value;
          continue;
        }
        uint64_t cumulative = 0;
        for (size_t i = 0; i < series.buckets.size(); ++i) {
          cumulative += series.buckets[i];
          LabelMap with_le = labels;
          with_le["le"] = i < family.bounds.size() ? fmt::format("{}", family.bounds[i]) : "+Inf";
          expected[{name + "_bucket", with_le}] = static_cast<double>(cumulative);
        }
        expected[{name + "_sum", labels}] = series.sum;
        expected[{name + "_count", labels}] = static_cast<double>(cumulative);
      }
    }
    return expected;
  }

  std::mt19937 rng_;
  Registry registry_;
  std::map<std::string, ModelFamily> families_;
  int num_accepted_ = 0;
  int num_rejected_ = 0;
};

TEST(MetricsRandomTest, RandomOperationSequencesMatchModelAndRenderValidText) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    SCOPED_TRACE(fmt::format("seed {}", seed));
    RegistryModel model(seed);
    for (int step = 0; step < 300; ++step) {
      ASSERT_NO_FATAL_FAILURE(model.step()) << "step " << step;
      ASSERT_NO_FATAL_FAILURE(model.check()) << "step " << step;
    }
    // Both outcomes must have been exercised for the comparison to mean anything.
    EXPECT_GT(model.num_accepted(), 30);
    EXPECT_GT(model.num_rejected(), 30);
  }
}

}  // namespace
}  // namespace folio::metrics
