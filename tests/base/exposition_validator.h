// A strict, independent reader of the Prometheus text exposition format 0.0.4, for tests of
// metrics::Registry::render(). It checks each line against the format's grammar (comment lines,
// metric and label names, label value escapes, sample values) and the rules that span lines
// (one HELP and one TYPE per family before its samples, a family's lines contiguous, no
// duplicate series, histograms with cumulative buckets ending in le="+Inf" and a _count equal to
// it), plus what Folio promises on top (families sorted by name, every family has a sample, no
// timestamps, no empty or other comment lines). It returns the samples with escapes undone, so
// tests can compare them against a model of what was registered.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"

namespace folio::metrics::testing {

struct ParsedSample {
  std::string name;                           // as rendered, e.g. "latency_bucket"
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0;
};

struct ParsedFamily {
  std::string name;
  std::string help;  // unescaped
  std::string type;  // counter, gauge, histogram, summary or untyped
  std::vector<ParsedSample> samples;
};

// Errors (kInvalidArgument) name the 1-based line and the rule it breaks.
Result<std::vector<ParsedFamily>> parse_exposition(std::string_view text);

}  // namespace folio::metrics::testing
