#include "folio/base/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "folio/base/check.h"

namespace folio::metrics {
namespace detail {

enum class MetricType { kCounter, kGauge, kHistogram };

std::string_view type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  FOLIO_UNREACHABLE("metric type {}", static_cast<int>(type));
}

}  // namespace detail

using detail::MetricType;

// What a registration asks for; the family it names must match it.
struct Registry::FamilySpec {
  const std::string& name;
  const std::string& help;
  MetricType type;
  const std::vector<double>* upper_bounds;  // histograms only, already validated
};

// One series: exactly one alternative, fixed when the series is added.
struct Registry::Series {
  std::variant<std::unique_ptr<Counter>, std::unique_ptr<Gauge>, std::unique_ptr<Histogram>,
               std::function<double()>>
      metric;
};

struct Registry::Family {
  MetricType type;
  std::string help;
  std::vector<std::string> label_names;  // sorted, unique
  std::vector<double> upper_bounds;      // histograms only
  // Keyed by label values in label_names order; never empty while the family is registered.
  std::map<std::vector<std::string>, Series> series;
};

namespace {

// The registry whose render() is running on this thread, to catch a gauge function calling back.
thread_local const Registry* tls_rendering_registry = nullptr;

constexpr std::string_view kMetricNamePattern = "[a-zA-Z_:][a-zA-Z0-9_:]*";
constexpr std::string_view kLabelNamePattern = "[a-zA-Z_][a-zA-Z0-9_]*";
constexpr std::string_view kHistogramSuffixes[] = {"_bucket", "_sum", "_count"};

bool is_ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Metric names may contain ':' (reserved for recording rules, but valid); label names may not.
Status validate_name(std::string_view what, const std::string& name, bool allow_colon) {
  const std::string_view pattern = allow_colon ? kMetricNamePattern : kLabelNamePattern;
  if (name.empty()) return invalid_argument("{} is empty; it must match {}", what, pattern);
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool valid = is_ascii_letter(c) || c == '_' || (allow_colon && c == ':') ||
                       (i > 0 && c >= '0' && c <= '9');
    if (!valid) {
      return invalid_argument("{} {:?} has {:?} at position {}; it must match {}", what, name, c, i,
                              pattern);
    }
  }
  return Status();
}

// The byte offset of the first byte that does not start a valid UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are invalid), or npos.
size_t find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint32_t code_point = 0;
    uint32_t smallest = 0;
    if ((lead & 0xE0) == 0xC0) {
      length = 2, code_point = lead & 0x1F, smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, code_point = lead & 0x0F, smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, code_point = lead & 0x07, smallest = 0x10000;
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return i;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    if (code_point < smallest || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

Status validate_utf8(std::string_view what, const std::string& metric, std::string_view text) {
  const size_t offset = find_invalid_utf8(text);
  if (offset == std::string_view::npos) return Status();
  return invalid_argument("{} of metric '{}' is not valid UTF-8 (byte {} at offset {}); {:?}", what,
                          metric, static_cast<unsigned char>(text[offset]), offset, text);
}

struct CanonicalLabels {
  std::vector<std::string> names;   // sorted
  std::vector<std::string> values;  // in names' order
};

Result<CanonicalLabels> canonicalize_labels(const std::string& metric, const Labels& labels,
                                            MetricType type) {
  std::vector<const std::pair<std::string, std::string>*> sorted;
  sorted.reserve(labels.size());
  for (const auto& label : labels) sorted.push_back(&label);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  CanonicalLabels canonical;
  for (const auto* label : sorted) {
    const std::string& name = label->first;
    FOLIO_RETURN_IF_ERROR(validate_name("label name", name, /*allow_colon=*/false)
                              .with_context(fmt::format("metric '{}'", metric)));
    if (name.starts_with("__")) {
      return invalid_argument(
          "metric '{}': label name '{}' starts with \"__\", which Prometheus "
          "reserves for its own labels",
          metric, name);
    }
    if (type == MetricType::kHistogram && name == "le") {
      return invalid_argument("histogram '{}': label name 'le' is reserved for bucket bounds",
                              metric);
    }
    if (!canonical.names.empty() && canonical.names.back() == name) {
      return invalid_argument("metric '{}': label '{}' is given twice", metric, name);
    }
    FOLIO_RETURN_IF_ERROR(validate_utf8(fmt::format("label '{}'", name), metric, label->second));
    canonical.names.push_back(name);
    canonical.values.push_back(label->second);
  }
  return canonical;
}

// Drops a trailing +Inf; the rest must be finite and strictly increasing.
Status normalize_bounds(const std::string& metric, std::vector<double>& bounds) {
  if (!bounds.empty() && bounds.back() == std::numeric_limits<double>::infinity()) {
    bounds.pop_back();
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return invalid_argument(
          "histogram '{}': bucket bound {} is {}; bounds must be finite (only "
          "a last bound may be +Inf, which is implicit anyway)",
          metric, i, format_value(bounds[i]));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return invalid_argument(
          "histogram '{}': bucket bounds must be strictly increasing, but "
          "bound {} ({}) follows {}",
          metric, i, format_value(bounds[i]), format_value(bounds[i - 1]));
    }
  }
  return Status();
}

std::string describe_labels(const std::vector<std::string>& names) {
  return fmt::format("{{{}}}", fmt::join(names, ", "));
}

// {a="x", b="y"} for messages (values shown with escapes, so control characters stay visible).
std::string describe_labels(const Labels& labels) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : labels) parts.push_back(fmt::format("{}={:?}", name, value));
  return describe_labels(parts);
}

// Prometheus's escaping: help text escapes \ and newline; label values also escape ".
void append_escaped(std::string& out, std::string_view text, bool escape_quote) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && escape_quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// `a="x",b="y"` (no braces), or empty without labels.
std::string format_labels(const std::vector<std::string>& names,
                          const std::vector<std::string>& values) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    append_escaped(out, values[i], /*escape_quote=*/true);
    out += '"';
  }
  return out;
}

void append_sample(std::string& out, std::string_view name, std::string_view suffix,
                   std::string_view labels, double value) {
  out += name;
  out += suffix;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += format_value(value);
  out += '\n';
}

void append_histogram(std::string& out, std::string_view name, const std::string& labels,
                      const Histogram& histogram) {
  // One snapshot of the buckets gives both the cumulative lines and _count, so _count always
  // equals the +Inf bucket even while observations arrive.
  const std::vector<uint64_t> cumulative = histogram.cumulative_bucket_counts();
  const std::vector<double>& bounds = histogram.upper_bounds();
  const std::string prefix = labels.empty() ? std::string() : labels + ",";
  for (size_t i = 0; i <= bounds.size(); ++i) {
    const std::string bound = i < bounds.size() ? format_value(bounds[i]) : "+Inf";
    append_sample(out, name, "_bucket", fmt::format("{}le=\"{}\"", prefix, bound),
                  static_cast<double>(cumulative[i]));
  }
  append_sample(out, name, "_sum", labels, histogram.sum());
  append_sample(out, name, "_count", labels, static_cast<double>(cumulative.back()));
}

}  // namespace

void Counter::increment(double by) {
  FOLIO_DCHECK(by >= 0, "counter increment by {}; counters only go up (use a Gauge)", by);
  value_.fetch_add(by, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      bucket_counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) bucket_counts_[i].store(0);
}

void Histogram::observe(double value) {
  size_t bucket = upper_bounds_.size();  // +Inf; NaN compares false with every bound
  if (!std::isnan(value)) {
    bucket =
        static_cast<size_t>(std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) -
                            upper_bounds_.begin());
  }
  bucket_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

uint64_t Histogram::count() const {
  uint64_t total = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    total += bucket_counts_[i].load(std::memory_order_relaxed);
  }
  return total;
}

std::vector<uint64_t> Histogram::cumulative_bucket_counts() const {
  std::vector<uint64_t> cumulative(upper_bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += bucket_counts_[i].load(std::memory_order_relaxed);
    cumulative[i] = running;
  }
  return cumulative;
}

Registry::Registry() = default;
Registry::~Registry() = default;

void Registry::check_not_rendering() const {
  FOLIO_CHECK(tls_rendering_registry != this,
              "a gauge function called back into the metrics registry that is rendering it; "
              "gauge functions must only compute their value");
}

Status Registry::check_name_is_free(const FamilySpec& spec) const {
  for (const std::string_view suffix : kHistogramSuffixes) {
    if (spec.name.ends_with(suffix)) {
      const std::string base = spec.name.substr(0, spec.name.size() - suffix.size());
      auto it = families_.find(base);
      if (it != families_.end() && it->second->type == MetricType::kHistogram) {
        return invalid_argument(
            "metric '{}' collides with the '{}' series of histogram '{}'; choose another name",
            spec.name, suffix, base);
      }
    }
    if (spec.type == MetricType::kHistogram &&
        families_.contains(spec.name + std::string(suffix))) {
      return invalid_argument(
          "histogram '{}' would render '{}{}', which is already a metric; choose another name",
          spec.name, spec.name, suffix);
    }
  }
  return Status();
}

Status Registry::check_compatible(const Family& family, const FamilySpec& spec,
                                  const std::vector<std::string>& label_names) const {
  if (family.type != spec.type) {
    return invalid_argument("metric '{}' is already registered as a {}, not a {}; use another name",
                            spec.name, detail::type_name(family.type),
                            detail::type_name(spec.type));
  }
  if (family.help != spec.help) {
    return invalid_argument(
        "metric '{}' is already registered with help {:?}; every registration must give the "
        "same help, got {:?}",
        spec.name, family.help, spec.help);
  }
  if (family.label_names != label_names) {
    return invalid_argument(
        "metric '{}' has label names {}, got {}; every series of a metric has the same label "
        "names",
        spec.name, describe_labels(family.label_names), describe_labels(label_names));
  }
  if (spec.upper_bounds != nullptr && family.upper_bounds != *spec.upper_bounds) {
    return invalid_argument(
        "histogram '{}' is already registered with bucket bounds [{}], got [{}]", spec.name,
        fmt::join(family.upper_bounds, ", "), fmt::join(*spec.upper_bounds, ", "));
  }
  return Status();
}

Result<Registry::Series*> Registry::find_or_add_series(const FamilySpec& spec, const Labels& labels,
                                                       FunctionRef<Series()> make, bool* added) {
  FOLIO_RETURN_IF_ERROR(validate_name("metric name", spec.name, /*allow_colon=*/true));
  FOLIO_RETURN_IF_ERROR(validate_utf8("help", spec.name, spec.help));
  FOLIO_ASSIGN_OR_RETURN(CanonicalLabels canonical,
                         canonicalize_labels(spec.name, labels, spec.type));
  *added = false;
  if (auto it = families_.find(spec.name); it != families_.end()) {
    Family& family = *it->second;
    FOLIO_RETURN_IF_ERROR(check_compatible(family, spec, canonical.names));
    auto [series, inserted] = family.series.try_emplace(std::move(canonical.values));
    if (inserted) series->second = make();
    *added = inserted;
    return &series->second;
  }
  FOLIO_RETURN_IF_ERROR(check_name_is_free(spec));
  auto family = std::make_unique<Family>();
  family->type = spec.type;
  family->help = spec.help;
  family->label_names = std::move(canonical.names);
  if (spec.upper_bounds != nullptr) family->upper_bounds = *spec.upper_bounds;
  Series* series = &family->series.emplace(std::move(canonical.values), make()).first->second;
  families_.emplace(spec.name, std::move(family));
  *added = true;
  return series;
}

Result<Counter*> Registry::counter(const std::string& name, const std::string& help,
                                   const Labels& labels) {
  check_not_rendering();
  MutexLock lock(mutex_);
  bool added = false;
  FOLIO_ASSIGN_OR_RETURN(
      Series * series, find_or_add_series(
                           {name, help, MetricType::kCounter, nullptr}, labels,
                           [] { return Series{std::unique_ptr<Counter>(new Counter())}; }, &added));
  return std::get<std::unique_ptr<Counter>>(series->metric).get();
}

Result<Gauge*> Registry::gauge(const std::string& name, const std::string& help,
                               const Labels& labels) {
  check_not_rendering();
  MutexLock lock(mutex_);
  bool added = false;
  FOLIO_ASSIGN_OR_RETURN(Series * series,
                         find_or_add_series(
                             {name, help, MetricType::kGauge, nullptr}, labels,
                             [] { return Series{std::unique_ptr<Gauge>(new Gauge())}; }, &added));
  auto* gauge = std::get_if<std::unique_ptr<Gauge>>(&series->metric);
  if (gauge == nullptr) {
    return already_exists(
        "gauge '{}' with labels {} is registered as a gauge function, so it has no Gauge to "
        "return; remove the gauge function first",
        name, describe_labels(labels));
  }
  return gauge->get();
}

Result<Histogram*> Registry::histogram(const std::string& name, const std::string& help,
                                       std::vector<double> bucket_upper_bounds,
                                       const Labels& labels) {
  check_not_rendering();
  FOLIO_RETURN_IF_ERROR(normalize_bounds(name, bucket_upper_bounds));
  MutexLock lock(mutex_);
  bool added = false;
  FOLIO_ASSIGN_OR_RETURN(
      Series * series,
      find_or_add_series(
          {name, help, MetricType::kHistogram, &bucket_upper_bounds}, labels,
          [&] { return Series{std::unique_ptr<Histogram>(new Histogram(bucket_upper_bounds))}; },
          &added));
  return std::get<std::unique_ptr<Histogram>>(series->metric).get();
}

Status Registry::gauge_function(const std::string& name, const std::string& help,
                                const Labels& labels, std::function<double()> read) {
  check_not_rendering();
  if (!read) return invalid_argument("gauge function '{}': the read callback is empty", name);
  MutexLock lock(mutex_);
  bool added = false;
  FOLIO_ASSIGN_OR_RETURN(Series * series, find_or_add_series(
                                              {name, help, MetricType::kGauge, nullptr}, labels,
                                              [&] { return Series{std::move(read)}; }, &added));
  (void)series;
  if (!added) {
    return already_exists(
        "gauge '{}' with labels {} is already registered; remove the old gauge "
        "function first (a plain gauge cannot be replaced)",
        name, describe_labels(labels));
  }
  return Status();
}

Status Registry::remove_gauge_function(const std::string& name, const Labels& labels) {
  check_not_rendering();
  FOLIO_ASSIGN_OR_RETURN(CanonicalLabels canonical,
                         canonicalize_labels(name, labels, MetricType::kGauge));
  MutexLock lock(mutex_);
  auto family = families_.find(name);
  if (family != families_.end() && family->second->label_names == canonical.names) {
    auto series = family->second->series.find(canonical.values);
    if (series != family->second->series.end() &&
        std::holds_alternative<std::function<double()>>(series->second.metric)) {
      family->second->series.erase(series);
      if (family->second->series.empty()) families_.erase(family);
      return Status();
    }
  }
  return not_found("no gauge function '{}' with labels {} is registered", name,
                   describe_labels(labels));
}

std::string Registry::render() const {
  check_not_rendering();
  MutexLock lock(mutex_);
  const Registry* const outer = tls_rendering_registry;
  tls_rendering_registry = this;
  std::string out;
  for (const auto& [name, family] : families_) render_family(name, *family, out);
  tls_rendering_registry = outer;
  return out;
}

void Registry::render_family(const std::string& name, const Family& family,
                             std::string& out) const {
  out += "# HELP ";
  out += name;
  out += ' ';
  append_escaped(out, family.help, /*escape_quote=*/false);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += detail::type_name(family.type);
  out += '\n';
  for (const auto& [values, series] : family.series) {
    const std::string labels = format_labels(family.label_names, values);
    if (const auto* counter = std::get_if<std::unique_ptr<Counter>>(&series.metric)) {
      append_sample(out, name, "", labels, (*counter)->value());
    } else if (const auto* gauge = std::get_if<std::unique_ptr<Gauge>>(&series.metric)) {
      append_sample(out, name, "", labels, (*gauge)->value());
    } else if (const auto* read = std::get_if<std::function<double()>>(&series.metric)) {
      append_sample(out, name, "", labels, (*read)());
    } else {
      append_histogram(out, name, labels, *std::get<std::unique_ptr<Histogram>>(series.metric));
    }
  }
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  FOLIO_CHECK(start > 0 && factor > 1 && count >= 1,
              "exponential_buckets(start={}, factor={}, count={}) needs start > 0, factor > 1 and "
              "count >= 1",
              start, factor, count);
  std::vector<double> bounds(static_cast<size_t>(count));
  double bound = start;
  for (double& out : bounds) {
    out = bound;
    bound *= factor;
  }
  return bounds;
}

std::vector<double> linear_buckets(double start, double width, int count) {
  FOLIO_CHECK(width > 0 && count >= 1,
              "linear_buckets(start={}, width={}, count={}) needs width > 0 and count >= 1", start,
              width, count);
  std::vector<double> bounds(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) bounds[static_cast<size_t>(i)] = start + i * width;
  return bounds;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // fmt's default is the shortest text that reads back to the same double, in fixed notation
  // while the exponent is below 16: every integer up to 2^53 (exact in a double) prints plainly.
  return fmt::format("{}", value);
}

}  // namespace folio::metrics
