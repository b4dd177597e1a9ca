#include "exposition_validator.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <utility>

namespace folio::metrics::testing {
namespace {

bool is_letter_or_underscore(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; without ':' for label names.
bool is_name(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!is_letter_or_underscore(c) && !(allow_colon && c == ':') && !(i > 0 && is_digit(c))) {
      return false;
    }
  }
  return true;
}
bool is_metric_name(std::string_view name) {
  return is_name(name, true);
}
bool is_label_name(std::string_view name) {
  return is_name(name, false);
}

// Go's ParseFloat decimal syntax, as the Prometheus parser accepts it:
// [-+]?(digits[.digits*]|.digits)([eE][-+]?digits)?
bool is_decimal_float(std::string_view text) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && is_digit(text[i])) ++i;
    return i - start;
  };
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
  size_t mantissa_digits = digits();
  if (i < text.size() && text[i] == '.') {
    ++i;
    mantissa_digits += digits();
  }
  if (mantissa_digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};

bool valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    int extra = 0;  // continuation bytes after the lead byte
    if (lead >= 0xC2 && lead < 0xE0) {
      extra = 1;
    } else if (lead >= 0xE0 && lead < 0xF0) {
      extra = 2;
    } else if (lead >= 0xF0 && lead < 0xF5) {
      extra = 3;
    } else if (lead >= 0x80) {
      return false;
    }
    if (i + static_cast<size_t>(extra) >= text.size()) return false;
    uint32_t code_point = extra == 0 ? lead : lead & (0x7F >> (extra + 1));
    for (int k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      if ((next >> 6) != 2) return false;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    const bool overlong =
        (extra == 2 && code_point < 0x800) || (extra == 3 && code_point < 0x10000);
    const bool surrogate = code_point >= 0xD800 && code_point <= 0xDFFF;
    if (overlong || surrogate || code_point > 0x10FFFF) return false;
    i += static_cast<size_t>(extra) + 1;
  }
  return true;
}

Result<double> parse_value(const std::string& token) {
  if (token == "+Inf") return std::numeric_limits<double>::infinity();
  if (token == "-Inf") return -std::numeric_limits<double>::infinity();
  if (token == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (!is_decimal_float(token)) return invalid_argument("'{}' is not a float", token);
  return std::strtod(token.c_str(), nullptr);
}

// Undoes escapes; `allowed` lists the characters that may follow a backslash.
Result<std::string> unescape(std::string_view text, std::string_view allowed) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      out += text[i];
      continue;
    }
    if (i + 1 == text.size() || allowed.find(text[i + 1]) == std::string_view::npos) {
      return invalid_argument("invalid escape in '{}'", text);
    }
    ++i;
    out += text[i] == 'n' ? '\n' : text[i];
  }
  return out;
}

// Parses `name{a="x",b="y"} value` (braces optional).
Result<ParsedSample> parse_sample_line(const std::string& line) {
  ParsedSample sample;
  size_t position = line.find_first_of("{ ");
  if (position == std::string::npos) return invalid_argument("sample without a value");
  sample.name = line.substr(0, position);
  if (!is_metric_name(sample.name)) {
    return invalid_argument("bad metric name '{}'", sample.name);
  }
  if (line[position] == '{') {
    ++position;
    while (true) {
      const size_t equals = line.find('=', position);
      if (equals == std::string::npos) return invalid_argument("label without '='");
      const std::string label = line.substr(position, equals - position);
      if (!is_label_name(label) || label.starts_with("__")) {
        return invalid_argument("bad label name '{}'", label);
      }
      if (equals + 1 >= line.size() || line[equals + 1] != '"') {
        return invalid_argument("label value of '{}' is not quoted", label);
      }
      size_t end = equals + 2;
      while (end < line.size() && line[end] != '"') end += line[end] == '\\' ? 2 : 1;
      if (end >= line.size()) return invalid_argument("unterminated label value");
      auto value = unescape(std::string_view(line).substr(equals + 2, end - equals - 2), "\\\"n");
      if (!value.ok()) return value.status();
      if (!sample.labels.emplace(label, *value).second) {
        return invalid_argument("label '{}' given twice", label);
      }
      position = end + 1;
      if (position < line.size() && line[position] == ',') {
        ++position;
        continue;
      }
      if (position >= line.size() || line[position] != '}') {
        return invalid_argument("expected ',' or '}}' after a label");
      }
      ++position;
      break;
    }
  }
  if (position >= line.size() || line[position] != ' ') {
    return invalid_argument("expected one space before the value");
  }
  const std::string value_token = line.substr(position + 1);
  if (value_token.find(' ') != std::string::npos) {
    return invalid_argument("timestamps or extra fields are not emitted by Folio");
  }
  auto value = parse_value(value_token);
  if (!value.ok()) return value.status();
  sample.value = *value;
  return sample;
}

bool sample_belongs_to(const std::string& sample_name, const ParsedFamily& family) {
  if (family.type == "histogram") {
    return sample_name == family.name + "_bucket" || sample_name == family.name + "_sum" ||
           sample_name == family.name + "_count";
  }
  if (family.type == "summary") {
    return sample_name == family.name || sample_name == family.name + "_sum" ||
           sample_name == family.name + "_count";
  }
  return sample_name == family.name;
}

// Buckets ascending in le, cumulative, ending with +Inf; then _sum and _count, equal to +Inf.
Status check_histogram(const ParsedFamily& family) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    int num_sums = 0;
    int num_counts = 0;
    double count = 0;
  };
  std::map<std::map<std::string, std::string>, Series> series;
  for (const ParsedSample& sample : family.samples) {
    std::map<std::string, std::string> labels_without_le = sample.labels;
    labels_without_le.erase("le");
    Series& one = series[labels_without_le];
    if (sample.name == family.name + "_bucket") {
      auto le = sample.labels.find("le");
      if (le == sample.labels.end()) return invalid_argument("{}: bucket without le", family.name);
      auto bound = parse_value(le->second);
      if (!bound.ok()) return bound.status();
      if (one.num_sums + one.num_counts > 0) {
        return invalid_argument("{}: bucket after _sum/_count", family.name);
      }
      if (!one.buckets.empty() && !(*bound > one.buckets.back().first)) {
        return invalid_argument("{}: le not increasing", family.name);
      }
      if (!one.buckets.empty() && sample.value < one.buckets.back().second) {
        return invalid_argument("{}: buckets not cumulative", family.name);
      }
      one.buckets.emplace_back(*bound, sample.value);
    } else if (sample.labels.contains("le")) {
      return invalid_argument("{}: le on a non-bucket sample", family.name);
    } else if (sample.name == family.name + "_sum") {
      ++one.num_sums;
    } else {
      ++one.num_counts;
      one.count = sample.value;
    }
  }
  for (const auto& [labels, one] : series) {
    if (one.buckets.empty() ||
        one.buckets.back().first != std::numeric_limits<double>::infinity()) {
      return invalid_argument("{}: a series lacks the le=\"+Inf\" bucket", family.name);
    }
    if (one.num_sums != 1 || one.num_counts != 1) {
      return invalid_argument("{}: a series needs exactly one _sum and one _count", family.name);
    }
    if (one.count != one.buckets.back().second) {
      return invalid_argument("{}: _count {} differs from the +Inf bucket {}", family.name,
                              one.count, one.buckets.back().second);
    }
  }
  return Status();
}

// Handles one line; `families` grows as HELP lines open new families.
Status parse_line(const std::string& line, std::vector<ParsedFamily>& families,
                  std::set<std::string>& family_names, std::set<std::string>& series_seen) {
  if (line.empty()) return invalid_argument("empty line");
  if (line.starts_with("# HELP ")) {
    const size_t space = line.find(' ', 7);
    if (space == std::string::npos) return invalid_argument("HELP without a space after the name");
    ParsedFamily family;
    family.name = line.substr(7, space - 7);
    if (!is_metric_name(family.name)) {
      return invalid_argument("bad metric name '{}' in HELP", family.name);
    }
    auto help = unescape(std::string_view(line).substr(space + 1), "\\n");
    if (!help.ok()) return help.status();
    family.help = *help;
    if (!family_names.insert(family.name).second) {
      return invalid_argument("second HELP for '{}' (families must be contiguous)", family.name);
    }
    if (!families.empty() && !(families.back().name < family.name)) {
      return invalid_argument("family '{}' after '{}' is out of order", family.name,
                              families.back().name);
    }
    if (!families.empty() && families.back().samples.empty()) {
      return invalid_argument("family '{}' has no samples", families.back().name);
    }
    families.push_back(std::move(family));
    return Status();
  }
  if (families.empty()) return invalid_argument("a line before any HELP");
  ParsedFamily& family = families.back();
  if (line.starts_with("# TYPE ")) {
    const std::string prefix = "# TYPE " + family.name + " ";
    if (!line.starts_with(prefix) || !kTypes.contains(line.substr(prefix.size()))) {
      return invalid_argument("TYPE line does not name '{}' and a known type", family.name);
    }
    if (!family.type.empty() || !family.samples.empty()) {
      return invalid_argument("TYPE for '{}' repeated or after samples", family.name);
    }
    family.type = line.substr(prefix.size());
    return Status();
  }
  if (line.starts_with("#")) return invalid_argument("a comment that is neither HELP nor TYPE");
  if (family.type.empty()) return invalid_argument("a sample before TYPE");
  auto sample = parse_sample_line(line);
  if (!sample.ok()) return sample.status();
  if (!sample_belongs_to(sample->name, family)) {
    return invalid_argument("sample '{}' does not belong to {} '{}'", sample->name, family.type,
                            family.name);
  }
  if (!series_seen.insert(line.substr(0, line.rfind(' '))).second) {
    return invalid_argument("duplicate series");
  }
  family.samples.push_back(*std::move(sample));
  return Status();
}

}  // namespace

Result<std::vector<ParsedFamily>> parse_exposition(std::string_view text) {
  std::vector<ParsedFamily> families;
  if (text.empty()) return families;
  if (text.back() != '\n') return invalid_argument("text does not end with a newline");
  if (!valid_utf8(text)) return invalid_argument("text is not valid UTF-8");
  std::set<std::string> family_names;
  std::set<std::string> series_seen;
  size_t line_number = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    const std::string line(text.substr(begin, end - begin));
    ++line_number;
    Status status = parse_line(line, families, family_names, series_seen);
    if (!status.ok()) {
      return invalid_argument("line {}: {}: {:?}", line_number, status.message(), line);
    }
    begin = end + 1;
  }
  if (families.back().samples.empty()) {
    return invalid_argument("family '{}' has no samples", families.back().name);
  }
  for (const ParsedFamily& family : families) {
    if (family.type == "histogram") FOLIO_RETURN_IF_ERROR(check_histogram(family));
  }
  return families;
}

}  // namespace folio::metrics::testing
