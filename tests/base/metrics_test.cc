#include "folio/base/metrics.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exposition_validator.h"

namespace folio::metrics {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Renders and checks the output against the format before a test compares it to a golden.
std::string render_checked(const Registry& registry) {
  std::string text = registry.render();
  auto parsed = testing::parse_exposition(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  return text;
}

TEST(MetricsTest, EmptyRegistryRendersNothing) {
  Registry registry;
  EXPECT_EQ(registry.render(), "");
}

TEST(MetricsTest, CounterRendersGolden) {
  Registry registry;
  Counter* requests = registry.counter("folio_requests", "Requests served.").value();
  requests->increment();
  requests->increment(2.5);
  EXPECT_EQ(requests->value(), 3.5);
  EXPECT_EQ(render_checked(registry),
            "# HELP folio_requests Requests served.\n"
            "# TYPE folio_requests counter\n"
            "folio_requests 3.5\n");
}

TEST(MetricsTest, LabelsRenderSortedByNameAndSeriesSortedByValues) {
  Registry registry;
  registry.counter("tokens_total", "Tokens.", {{"phase", "prefill"}, {"model", "b"}})
      .value()
      ->increment(7);
  registry.counter("tokens_total", "Tokens.", {{"model", "a"}, {"phase", "decode"}})
      .value()
      ->increment(1e6);
  EXPECT_EQ(render_checked(registry),
            "# HELP tokens_total Tokens.\n"
            "# TYPE tokens_total counter\n"
            "tokens_total{model=\"a\",phase=\"decode\"} 1000000\n"
            "tokens_total{model=\"b\",phase=\"prefill\"} 7\n");
}

TEST(MetricsTest, SameNameAndLabelsReturnSameObjectInAnyLabelOrder) {
  Registry registry;
  Counter* first = registry.counter("c", "help", {{"a", "1"}, {"b", "2"}}).value();
  Counter* again = registry.counter("c", "help", {{"b", "2"}, {"a", "1"}}).value();
  Counter* other = registry.counter("c", "help", {{"a", "1"}, {"b", "3"}}).value();
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  Gauge* gauge = registry.gauge("g", "help").value();
  EXPECT_EQ(registry.gauge("g", "help").value(), gauge);
  Histogram* histogram = registry.histogram("h", "help", {1, 2}).value();
  EXPECT_EQ(registry.histogram("h", "help", {1, 2, kInf}).value(), histogram);
}

TEST(MetricsTest, GaugeRendersSpecialValuesGolden) {
  Registry registry;
  Gauge* gauge = registry.gauge("temperature", "Degrees.", {{"where", "a"}}).value();
  gauge->set(-1.25);
  gauge->add(0.5);
  EXPECT_EQ(gauge->value(), -0.75);
  registry.gauge("temperature", "Degrees.", {{"where", "b"}}).value()->set(kInf);
  registry.gauge("temperature", "Degrees.", {{"where", "c"}}).value()->set(-kInf);
  registry.gauge("temperature", "Degrees.", {{"where", "d"}}).value()->set(kNaN);
  EXPECT_EQ(render_checked(registry),
            "# HELP temperature Degrees.\n"
            "# TYPE temperature gauge\n"
            "temperature{where=\"a\"} -0.75\n"
            "temperature{where=\"b\"} +Inf\n"
            "temperature{where=\"c\"} -Inf\n"
            "temperature{where=\"d\"} NaN\n");
}

TEST(MetricsTest, HistogramRendersCumulativeBucketsGolden) {
  Registry registry;
  Histogram* latency =
      registry.histogram("latency_seconds", "Step latency.", {0.25, 1, 4}, {{"phase", "decode"}})
          .value();
  for (double value : {0.1, 0.25, 0.5, 1.0, 3.0, 100.0}) latency->observe(value);
  EXPECT_EQ(latency->count(), 6u);
  EXPECT_EQ(latency->sum(), 104.85);
  EXPECT_EQ(render_checked(registry),
            "# HELP latency_seconds Step latency.\n"
            "# TYPE latency_seconds histogram\n"
            "latency_seconds_bucket{phase=\"decode\",le=\"0.25\"} 2\n"
            "latency_seconds_bucket{phase=\"decode\",le=\"1\"} 4\n"
            "latency_seconds_bucket{phase=\"decode\",le=\"4\"} 5\n"
            "latency_seconds_bucket{phase=\"decode\",le=\"+Inf\"} 6\n"
            "latency_seconds_sum{phase=\"decode\"} 104.85\n"
            "latency_seconds_count{phase=\"decode\"} 6\n");
}

TEST(MetricsTest, HistogramWithoutBoundsHasOnlyInfBucket) {
  Registry registry;
  Histogram* histogram = registry.histogram("sizes", "Sizes.", {}).value();
  histogram->observe(3);
  EXPECT_EQ(render_checked(registry),
            "# HELP sizes Sizes.\n"
            "# TYPE sizes histogram\n"
            "sizes_bucket{le=\"+Inf\"} 1\n"
            "sizes_sum 3\n"
            "sizes_count 1\n");
}

TEST(MetricsTest, HistogramBucketsAreCumulativeAndBoundsInclusive) {
  Registry registry;
  Histogram* histogram = registry.histogram("h", "help", {-1, 0, 1}).value();
  // Observations exactly on a bound count in that bound's bucket ("le" = less or equal).
  for (double value : {-2.0, -1.0, -0.5, 0.0, 0.0, 1.0, 1.5, kInf, kNaN}) histogram->observe(value);
  EXPECT_THAT(histogram->cumulative_bucket_counts(), ::testing::ElementsAre(2, 5, 6, 9));
  EXPECT_EQ(histogram->count(), 9u);
  EXPECT_TRUE(std::isnan(histogram->sum()));  // NaN poisons the sum, as in Prometheus clients
  EXPECT_THAT(histogram->upper_bounds(), ::testing::ElementsAre(-1, 0, 1));
}

TEST(MetricsTest, GaugeFunctionIsReadAtRenderAndCanBeRemoved) {
  Registry registry;
  double bytes_in_use = 4096;
  ASSERT_TRUE(registry
                  .gauge_function("pool_bytes", "Bytes in use.", {{"pool", "kv"}},
                                  [&] { return bytes_in_use; })
                  .ok());
  EXPECT_EQ(render_checked(registry),
            "# HELP pool_bytes Bytes in use.\n"
            "# TYPE pool_bytes gauge\n"
            "pool_bytes{pool=\"kv\"} 4096\n");
  bytes_in_use = 0.5;
  EXPECT_THAT(render_checked(registry), HasSubstr("pool_bytes{pool=\"kv\"} 0.5\n"));
  ASSERT_TRUE(registry.remove_gauge_function("pool_bytes", {{"pool", "kv"}}).ok());
  EXPECT_EQ(registry.render(), "");  // the family went with its last series
  // The name is free again, even for another type and help.
  EXPECT_TRUE(registry.counter("pool_bytes", "Other help.").ok());
}

TEST(MetricsTest, GaugeFunctionAndGaugeShareAFamily) {
  Registry registry;
  registry.gauge("pages", "Pages.", {{"state", "free"}}).value()->set(3);
  ASSERT_TRUE(
      registry.gauge_function("pages", "Pages.", {{"state", "used"}}, [] { return 5.0; }).ok());
  EXPECT_EQ(render_checked(registry),
            "# HELP pages Pages.\n"
            "# TYPE pages gauge\n"
            "pages{state=\"free\"} 3\n"
            "pages{state=\"used\"} 5\n");
  ASSERT_TRUE(registry.remove_gauge_function("pages", {{"state", "used"}}).ok());
  EXPECT_THAT(registry.render(), HasSubstr("pages{state=\"free\"} 3\n"));
}

TEST(MetricsTest, FamiliesRenderSortedByName) {
  Registry registry;
  registry.gauge("b", "B.").value()->set(2);
  registry.counter("a_c", "A.").value()->increment();
  registry.histogram("a", "H.", {1}).value();
  registry.counter("_x:y", "X.").value();
  const std::string text = render_checked(registry);
  EXPECT_LT(text.find("# HELP _x:y"), text.find("# HELP a H."));
  EXPECT_LT(text.find("# HELP a H."), text.find("# HELP a_c"));
  EXPECT_LT(text.find("# HELP a_c"), text.find("# HELP b"));
}

TEST(MetricsTest, EscapesHelpAndLabelValues) {
  Registry registry;
  registry
      .counter("escapes", "Back\\slash, \"quotes\" and\nnewline.",
               {{"path", "C:\\dir\\\"x\"\nend"}, {"utf8", "caf\xc3\xa9 \xf0\x9f\x98\x80"}})
      .value()
      ->increment();
  EXPECT_EQ(
      render_checked(registry),
      "# HELP escapes Back\\\\slash, \"quotes\" and\\nnewline.\n"
      "# TYPE escapes counter\n"
      "escapes{path=\"C:\\\\dir\\\\\\\"x\\\"\\nend\",utf8=\"caf\xc3\xa9 \xf0\x9f\x98\x80\"} 1\n");
  auto parsed = testing::parse_exposition(registry.render());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->at(0).help, "Back\\slash, \"quotes\" and\nnewline.");
  EXPECT_EQ(parsed->at(0).samples.at(0).labels.at("path"), "C:\\dir\\\"x\"\nend");
}

TEST(MetricsTest, EmptyHelpAndEmptyLabelValueRender) {
  Registry registry;
  registry.gauge("g", "", {{"a", ""}}).value()->set(1);
  EXPECT_EQ(render_checked(registry), "# HELP g \n# TYPE g gauge\ng{a=\"\"} 1\n");
}

TEST(MetricsTest, FormatsValuesAsPrometheusExpects) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(-0.0), "-0");
  EXPECT_EQ(format_value(1), "1");
  EXPECT_EQ(format_value(-42), "-42");
  EXPECT_EQ(format_value(1048576), "1048576");
  EXPECT_EQ(format_value(123456789012.0), "123456789012");
  EXPECT_EQ(format_value(0x1p53 - 1), "9007199254740991");
  EXPECT_EQ(format_value(1e15), "1000000000000000");
  EXPECT_EQ(format_value(1e16), "1e+16");  // beyond 2^53: shortest round-trip text
  EXPECT_EQ(format_value(0.25), "0.25");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(1e-9), "1e-09");
  EXPECT_EQ(format_value(-2.5e300), "-2.5e+300");
  EXPECT_EQ(format_value(kInf), "+Inf");
  EXPECT_EQ(format_value(-kInf), "-Inf");
  EXPECT_EQ(format_value(kNaN), "NaN");
  // Shortest text that reads back to the same double.
  for (double value :
       {0.1 + 0.2, 1.0 / 3, 6.02214076e23, 5e-324, 1.7976931348623157e308, 0x1p60, 0x1p53 + 2}) {
    EXPECT_EQ(std::strtod(format_value(value).c_str(), nullptr), value);
  }
}

TEST(MetricsTest, BucketLadders) {
  EXPECT_THAT(exponential_buckets(0.001, 2, 4), ::testing::ElementsAre(0.001, 0.002, 0.004, 0.008));
  EXPECT_THAT(exponential_buckets(1, 10, 1), ::testing::ElementsAre(1));
  EXPECT_THAT(linear_buckets(-1, 0.5, 5), ::testing::ElementsAre(-1, -0.5, 0, 0.5, 1));
  Registry registry;
  EXPECT_TRUE(registry.histogram("ladder", "help", exponential_buckets(1e-6, 4, 16)).ok());
}

TEST(MetricsDeathTest, BucketLaddersRejectBadArguments) {
  EXPECT_DEATH(exponential_buckets(0, 2, 3), "start > 0");
  EXPECT_DEATH(exponential_buckets(1, 1, 3), "factor > 1");
  EXPECT_DEATH(exponential_buckets(1, 2, 0), "count >= 1");
  EXPECT_DEATH(linear_buckets(0, 0, 3), "width > 0");
}

TEST(MetricsDeathTest, GaugeFunctionCallingBackIntoRegistryAborts) {
  Registry registry;
  ASSERT_TRUE(registry
                  .gauge_function("g", "help", {},
                                  [&] { return registry.counter("c", "help").ok() ? 1.0 : 0.0; })
                  .ok());
  EXPECT_DEATH(registry.render(), "called back into the metrics registry");
}

#if !defined(NDEBUG) || defined(FOLIO_DEBUG_CHECKS)
TEST(MetricsDeathTest, CounterDecrementAbortsInDebugBuilds) {
  Registry registry;
  Counter* counter = registry.counter("c", "help").value();
  EXPECT_DEATH(counter->increment(-1), "counters only go up");
  EXPECT_DEATH(counter->increment(kNaN), "counters only go up");
}
#endif

// One rejected registration: what it tries, the code and a phrase the message must contain.
struct BadRegistration {
  std::string description;
  std::function<Status(Registry&)> attempt;
  StatusCode code;
  std::string message;
};

Status as_status(const auto& result) {
  return result.status();
}

std::vector<BadRegistration> bad_registrations() {
  auto counter = [](std::string name, Labels labels = {}, std::string help = "help") {
    return [=](Registry& r) { return as_status(r.counter(name, help, labels)); };
  };
  auto histogram = [](std::string name, std::vector<double> bounds, Labels labels = {},
                      std::string help = "help") {
    return [=](Registry& r) { return as_status(r.histogram(name, help, bounds, labels)); };
  };
  const StatusCode invalid = StatusCode::kInvalidArgument;
  return {
      {"empty metric name", counter(""), invalid, "metric name is empty"},
      {"metric name starts with a digit", counter("1abc"), invalid, "position 0"},
      {"metric name with a dash", counter("a-b"), invalid, "'-' at position 1"},
      {"metric name with a space", counter("a b"), invalid, "[a-zA-Z_:][a-zA-Z0-9_:]*"},
      {"metric name with non-ASCII", counter("caf\xc3\xa9"), invalid, "position 3"},
      {"empty label name", counter("m", {{"", "v"}}), invalid, "label name is empty"},
      {"label name starts with a digit", counter("m", {{"1a", "v"}}), invalid,
       "[a-zA-Z_][a-zA-Z0-9_]*"},
      {"label name with a colon", counter("m", {{"a:b", "v"}}), invalid, "':' at position 1"},
      {"reserved label name", counter("m", {{"__name", "v"}}), invalid, "reserves"},
      {"duplicate label name", counter("m", {{"a", "1"}, {"b", "2"}, {"a", "3"}}), invalid,
       "label 'a' is given twice"},
      {"label value not UTF-8", counter("m", {{"a", "\xc3("}}), invalid, "not valid UTF-8"},
      {"overlong UTF-8 in label value", counter("m", {{"a", "\xc0\xaf"}}), invalid,
       "not valid UTF-8"},
      {"surrogate in label value", counter("m", {{"a", "\xed\xa0\x80"}}), invalid,
       "not valid UTF-8"},
      {"help not UTF-8", counter("m", {}, "\xff"), invalid,
       "help of metric 'm' is not valid UTF-8"},
      {"le label on a histogram", histogram("h2", {1}, {{"le", "1"}}), invalid, "'le' is reserved"},
      {"bounds decreasing", histogram("h2", {1, 0.5}), invalid, "strictly increasing"},
      {"bounds repeated", histogram("h2", {1, 1}), invalid, "bound 1 (1) follows 1"},
      {"NaN bound", histogram("h2", {kNaN}), invalid, "is NaN"},
      {"-Inf bound", histogram("h2", {-kInf, 1}), invalid, "is -Inf"},
      {"+Inf bound not last", histogram("h2", {1, kInf, 2}), invalid, "is +Inf"},
      {"name reused as another type",
       [](Registry& r) {
         return as_status(r.gauge("existing_counter", "Existing.", {{"k", "v"}}));
       },
       invalid, "already registered as a counter, not a gauge"},
      {"name reused with other help", counter("existing_counter", {{"k", "v"}}, "Other."), invalid,
       "same help"},
      {"name reused with fewer labels", counter("existing_counter", {}, "Existing."), invalid,
       "has label names {k}, got {}"},
      {"name reused with other labels", counter("existing_counter", {{"j", "v"}}, "Existing."),
       invalid, "label names {k}, got {j}"},
      {"histogram reused with other bounds",
       histogram("existing_histogram", {1, 3}, {}, "Existing."), invalid,
       "bucket bounds [1, 2], got [1, 3]"},
      {"name of a histogram's _count", counter("existing_histogram_count"), invalid,
       "collides with the '_count' series"},
      {"name of a histogram's _bucket", counter("existing_histogram_bucket"), invalid,
       "'_bucket' series"},
      {"histogram whose _sum exists", histogram("existing", {1}), invalid,
       "would render 'existing_sum'"},
      {"gauge on a gauge function",
       [](Registry& r) { return as_status(r.gauge("existing_function", "Existing.")); },
       StatusCode::kAlreadyExists, "remove the gauge function first"},
      {"gauge function on a gauge",
       [](Registry& r) {
         return r.gauge_function("existing_gauge", "Existing.", {}, [] { return 1.0; });
       },
       StatusCode::kAlreadyExists, "already registered"},
      {"gauge function registered twice",
       [](Registry& r) {
         return r.gauge_function("existing_function", "Existing.", {}, [] { return 1.0; });
       },
       StatusCode::kAlreadyExists, "already registered"},
      {"gauge function without callback",
       [](Registry& r) { return r.gauge_function("new_function", "help", {}, nullptr); }, invalid,
       "callback is empty"},
      {"removing a plain gauge",
       [](Registry& r) { return r.remove_gauge_function("existing_gauge", {}); },
       StatusCode::kNotFound, "no gauge function 'existing_gauge'"},
      {"removing an unknown gauge function",
       [](Registry& r) {
         return r.remove_gauge_function("nothing", {{"a", "b"}});
       },
       StatusCode::kNotFound, "no gauge function 'nothing' with labels {a=\"b\"}"},
      {"removing with the wrong labels",
       [](Registry& r) {
         return r.remove_gauge_function("existing_function", {{"a", "b"}});
       },
       StatusCode::kNotFound, "no gauge function"},
  };
}

TEST(MetricsTest, RejectsBadRegistrationsWithActionableMessagesAndNoChange) {
  Registry registry;
  registry.counter("existing_counter", "Existing.", {{"k", "v"}}).value()->increment(3);
  registry.histogram("existing_histogram", "Existing.", {1, 2}).value()->observe(1.5);
  registry.counter("existing_sum", "Existing.").value();
  registry.gauge("existing_gauge", "Existing.").value()->set(2);
  ASSERT_TRUE(
      registry.gauge_function("existing_function", "Existing.", {}, [] { return 9.0; }).ok());
  const std::string before = render_checked(registry);
  for (const BadRegistration& bad : bad_registrations()) {
    SCOPED_TRACE(bad.description);
    const Status status = bad.attempt(registry);
    EXPECT_EQ(status.code(), bad.code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad.message));
    EXPECT_EQ(registry.render(), before);  // bad input changes nothing
  }
}

TEST(MetricsTest, TrailingInfBoundIsDroppedAndNameWithColonIsValid) {
  Registry registry;
  Histogram* histogram = registry.histogram("job:latency", "help", {1, kInf}).value();
  EXPECT_THAT(histogram->upper_bounds(), ::testing::ElementsAre(1));
  EXPECT_THAT(render_checked(registry), HasSubstr("job:latency_bucket{le=\"+Inf\"} 0\n"));
}

}  // namespace
}  // namespace folio::metrics
