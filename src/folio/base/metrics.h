// Metrics: counters, gauges and histograms kept in a Registry and rendered in the Prometheus
// text exposition format, version 0.0.4, for the server's /metrics endpoint.
//
// Terms (Prometheus's): a *family* is a metric name with its help text, its type and its set of
// label names; a *series* (a child) is one assignment of values to those labels. A Counter only
// goes up (requests served, tokens generated); a Gauge goes up and down (requests running, pages
// free); a Histogram counts observations into cumulative buckets `le` ("less than or equal to")
// each upper bound, plus their sum and count (step latency). A gauge function is a gauge whose
// value is read by a callback when the registry is rendered (bytes in use of a pool that already
// keeps that number).
//
// Components look their metrics up once, keep the pointer and update it on hot paths:
//   FOLIO_ASSIGN_OR_RETURN(metrics::Counter* tokens,
//                          registry.counter("folio_tokens_generated", "Tokens generated."));
//   tokens->increment();
// Registering the same (name, labels) again returns the same object, so two components that
// share a metric need no coordination. Label order does not matter: {a, b} and {b, a} name the
// same series, and labels are rendered sorted by name.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "folio/base/function_ref.h"
#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/base/status.h"

namespace folio::metrics {

// Label (name, value) pairs. Names match [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__"
// (reserved by Prometheus); values are any UTF-8 text.
using Labels = std::vector<std::pair<std::string, std::string>>;

// The Content-Type an HTTP server sends with render()'s output.
inline constexpr std::string_view kExpositionContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Updates of Counter, Gauge and Histogram are lock-free and use relaxed atomics: each metric is
// a statistic standing on its own, no other data is published through it, so only atomicity
// (no lost update) is needed. A render that runs concurrently with updates sees each value as
// it was at some moment during the render, but two values need not be from the same moment.

// Thread-safety: all methods may be called concurrently.
class Counter {
 public:
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Requires: by >= 0 (a value that can fall is a Gauge). NaN is rejected the same way.
  void increment(double by = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class Registry;
  Counter() = default;
  std::atomic<double> value_{0.0};
};

// Thread-safety: all methods may be called concurrently.
class Gauge {
 public:
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class Registry;
  Gauge() = default;
  std::atomic<double> value_{0.0};
};

// Thread-safety: all methods may be called concurrently.
// Invariants: upper_bounds() is strictly increasing and finite; the implicit last bucket is +Inf,
// so every observation lands in exactly one (non-cumulative) bucket.
class Histogram {
 public:
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` in the first bucket whose upper bound is >= value (NaN goes to +Inf only, as
  // in Prometheus's clients) and adds it to the sum.
  void observe(double value);
  // The number of observations: the sum of the buckets, so it always equals the +Inf bucket.
  uint64_t count() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  // Finite upper bounds, strictly increasing; the +Inf bucket is implicit.
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }
  // One entry per bucket, cumulative as rendered: element i counts observations <=
  // upper_bounds()[i]; the last element (index upper_bounds().size()) is the +Inf bucket and
  // equals the count of this snapshot.
  std::vector<uint64_t> cumulative_bucket_counts() const;

 private:
  friend class Registry;
  explicit Histogram(std::vector<double> upper_bounds);

  const std::vector<double> upper_bounds_;
  // Non-cumulative counts, upper_bounds_.size() + 1 of them (the last is the +Inf bucket).
  // Kept non-cumulative so observe() touches one bucket; render() accumulates.
  std::unique_ptr<std::atomic<uint64_t>[]> bucket_counts_;
  std::atomic<double> sum_{0.0};
};

// A set of metric families, rendered together.
//
// Thread-safety: all methods may be called concurrently. Registration, removal and render take
// one mutex; the metrics they hand out are updated without it. A gauge function's callback runs
// inside render() with that mutex held: it must not call back into the registry (that aborts
// with a message rather than deadlocking), and once remove_gauge_function() returns the
// callback is never called again, so an object may unregister in its destructor.
//
// Invariants: every family has at least one series; all series of a family have the family's
// type and label names; histogram series of a family share its bucket bounds; no family's name
// equals a `_bucket`, `_sum` or `_count` name rendered for a histogram family. Pointers
// returned stay valid, and keep their identity, for the registry's lifetime.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Same (name, labels) returns the same object. Errors (kInvalidArgument): a metric name not
  // matching [a-zA-Z_:][a-zA-Z0-9_:]*, an invalid or duplicate label name (or "le" on a
  // histogram), help or label values that are not UTF-8, a name registered before with a
  // different type, help, label names or (histograms) bounds, or a name that collides with a
  // histogram's `_bucket` / `_sum` / `_count` series. kAlreadyExists: gauge() on a series that
  // is registered as a gauge function.
  Result<Counter*> counter(const std::string& name, const std::string& help,
                           const Labels& labels = {});
  Result<Gauge*> gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // bucket_upper_bounds: strictly increasing, finite; a trailing +Inf is accepted and dropped
  // (the +Inf bucket is always present). Empty means only the +Inf bucket.
  Result<Histogram*> histogram(const std::string& name, const std::string& help,
                               std::vector<double> bucket_upper_bounds, const Labels& labels = {});

  // A gauge whose value is read(), called at render time. Errors as gauge(); kAlreadyExists
  // if the series is already registered (as a gauge or a gauge function); kInvalidArgument if
  // read is empty.
  Status gauge_function(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> read);
  // Removes a gauge function series; its family goes too when it was the last series.
  // kNotFound if no gauge function is registered under (name, labels).
  Status remove_gauge_function(const std::string& name, const Labels& labels);

  // Prometheus text exposition format 0.0.4: families sorted by name, each with one `# HELP`
  // and one `# TYPE` line, then its series sorted by label values.
  std::string render() const;

 private:
  struct Family;
  struct Series;
  struct FamilySpec;

  // Requires: mutex_ held. Validates everything about (spec, labels), then returns the existing
  // series or adds one made by `make`; `*added` says which. Bad input changes nothing.
  Result<Series*> find_or_add_series(const FamilySpec& spec, const Labels& labels,
                                     FunctionRef<Series()> make, bool* added)
      FOLIO_REQUIRES(mutex_);
  // Requires: mutex_ held. OK when an existing family can take a series of this spec.
  Status check_compatible(const Family& family, const FamilySpec& spec,
                          const std::vector<std::string>& label_names) const FOLIO_REQUIRES(mutex_);
  // Requires: mutex_ held. OK when `name` may be used for a new family of this spec.
  Status check_name_is_free(const FamilySpec& spec) const FOLIO_REQUIRES(mutex_);
  void render_family(const std::string& name, const Family& family, std::string& out) const;
  // Aborts when called from inside render() on the same thread (a gauge function calling back).
  void check_not_rendering() const;

  mutable Mutex mutex_;
  // Sorted by name, so render() is deterministic.
  std::map<std::string, std::unique_ptr<Family>> families_ FOLIO_GUARDED_BY(mutex_);
};

// Bucket ladders: `count` bounds start, start*factor, start*factor^2, ...
// Requires: start > 0, factor > 1, count >= 1.
std::vector<double> exponential_buckets(double start, double factor, int count);
// `count` bounds start, start+width, start+2*width, ...  Requires: width > 0, count >= 1.
std::vector<double> linear_buckets(double start, double width, int count);

// Formats a sample value as the exposition format expects: "+Inf", "-Inf", "NaN", otherwise
// the shortest text that reads back to the same double ("0.25", "1e-09"), without exponent or
// fraction for integers below 10^16 in magnitude ("1048576"), so every exact integer count does.
std::string format_value(double value);

}  // namespace folio::metrics
