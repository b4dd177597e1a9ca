// The exposition validator must reject what the format forbids, or tests that rely on it to
// check render() would pass vacuously.
#include "exposition_validator.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace folio::metrics::testing {
namespace {

constexpr char kValid[] =
    "# HELP a_seconds Latency \\\\ and \\n more.\n"
    "# TYPE a_seconds histogram\n"
    "a_seconds_bucket{k=\"x \\\"y\\\" \\\\ \\n\",le=\"0.5\"} 1\n"
    "a_seconds_bucket{k=\"x \\\"y\\\" \\\\ \\n\",le=\"+Inf\"} 2\n"
    "a_seconds_sum{k=\"x \\\"y\\\" \\\\ \\n\"} 1.5e+00\n"
    "a_seconds_count{k=\"x \\\"y\\\" \\\\ \\n\"} 2\n"
    "# HELP b \n"
    "# TYPE b gauge\n"
    "b -Inf\n"
    "b{z=\"1\"} NaN\n";

TEST(ExpositionValidatorTest, AcceptsValidTextAndUnescapes) {
  auto parsed = parse_exposition(kValid);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ(parsed->at(0).help, "Latency \\ and \n more.");
  EXPECT_EQ(parsed->at(0).type, "histogram");
  EXPECT_EQ(parsed->at(0).samples.at(0).labels.at("k"), "x \"y\" \\ \n");
  EXPECT_EQ(parsed->at(0).samples.at(2).value, 1.5);
  EXPECT_EQ(parsed->at(1).samples.size(), 2u);
}

struct BrokenText {
  std::string rule;
  std::string text;
};

TEST(ExpositionValidatorTest, RejectsEachBrokenRule) {
  const std::string family = "# HELP m Help.\n# TYPE m counter\n";
  const std::string histogram = "# HELP h Help.\n# TYPE h histogram\n";
  const std::vector<BrokenText> broken = {
      {"no final newline", family + "m 1"},
      {"empty line", family + "m 1\n\n"},
      {"invalid UTF-8", family + "m{a=\"\xc3\x28\"} 1\n"},
      {"bad help escape", "# HELP m a \\t b\n# TYPE m counter\nm 1\n"},
      {"bad metric name", "# HELP 1m Help.\n# TYPE 1m counter\n1m 1\n"},
      {"unknown type", "# HELP m Help.\n# TYPE m countr\nm 1\n"},
      {"other comment", family + "# hello\nm 1\n"},
      {"sample before TYPE", "# HELP m Help.\nm 1\n# TYPE m counter\n"},
      {"TYPE twice", family + "# TYPE m counter\nm 1\n"},
      {"family without samples", family + "# HELP n Help.\n# TYPE n counter\nn 1\n"},
      {"families out of order", "# HELP n H.\n# TYPE n gauge\nn 1\n" + family + "m 1\n"},
      {"family split in two", family + "m{a=\"1\"} 1\n# HELP n H.\n# TYPE n gauge\nn 1\n" + family},
      {"sample of another family", family + "n 1\n"},
      {"bad label name", family + "m{1a=\"x\"} 1\n"},
      {"reserved label name", family + "m{__a=\"x\"} 1\n"},
      {"unquoted label value", family + "m{a=x} 1\n"},
      {"bad label escape", family + "m{a=\"\\t\"} 1\n"},
      {"unterminated label value", family + "m{a=\"x} 1\n"},
      {"duplicate label", family + "m{a=\"1\",a=\"2\"} 1\n"},
      {"trailing comma", family + "m{a=\"1\",} 1\n"},
      {"duplicate series", family + "m{a=\"1\"} 1\nm{a=\"1\"} 2\n"},
      {"bad value", family + "m 1.2.3\n"},
      {"lowercase inf", family + "m inf\n"},
      {"timestamp", family + "m 1 1700000000\n"},
      {"two spaces", family + "m  1\n"},
      {"bucket without le", histogram + "h_bucket 1\nh_sum 1\nh_count 1\n"},
      {"no +Inf bucket", histogram + "h_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n"},
      {"buckets not cumulative",
       histogram + "h_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"},
      {"le not increasing",
       histogram + "h_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\n"
                   "h_sum 1\nh_count 1\n"},
      {"count differs from +Inf", histogram + "h_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n"},
      {"missing _sum", histogram + "h_bucket{le=\"+Inf\"} 2\nh_count 2\n"},
      {"bucket after _count", histogram + "h_sum 1\nh_count 1\nh_bucket{le=\"+Inf\"} 1\n"},
  };
  for (const BrokenText& text : broken) {
    auto parsed = parse_exposition(text.text);
    EXPECT_FALSE(parsed.ok()) << "accepted text breaking: " << text.rule;
  }
}

}  // namespace
}  // namespace folio::metrics::testing
