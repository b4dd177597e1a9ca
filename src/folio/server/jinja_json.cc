#include "folio/server/jinja_json.h"

#include <array>
#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

namespace folio::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

// A float as Python's repr writes it: the shortest digits that read back to the same double,
// positional when the decimal point falls within 16 digits of the first one and not more than 4
// places before it ("1000000000000000.0", "0.0001", "2.5", "-0.0"), otherwise in exponent form
// with at least two exponent digits ("1e+16", "1e-05", "1.5e+300").
void append_python_float(double value, std::string& out) {
  std::array<char, 64> buffer{};
  const std::to_chars_result written = std::to_chars(buffer.data(), buffer.data() + buffer.size(),
                                                     value, std::chars_format::scientific);
  const std::string_view scientific(buffer.data(), written.ptr - buffer.data());
  const size_t e = scientific.find('e');
  std::string_view mantissa = scientific.substr(0, e);
  if (mantissa.starts_with('-')) {
    out += '-';
    mantissa.remove_prefix(1);
  }
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  const int exponent = std::stoi(std::string(scientific.substr(e + 1)));
  const int point = exponent + 1;  // digits before the decimal point
  const int num_digits = static_cast<int>(digits.size());
  // Built by appends: GCC 12 reports a false -Werror=restrict on "literal" + std::string here.
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out.append("0.");
      out.append(static_cast<size_t>(-point), '0');
      out.append(digits);
    } else if (point >= num_digits) {
      out.append(digits);
      out.append(static_cast<size_t>(point - num_digits), '0');
      out.append(".0");
    } else {
      out.append(digits, 0, static_cast<size_t>(point));
      out += '.';
      out.append(digits, static_cast<size_t>(point));
    }
    return;
  }
  out += digits[0];
  if (num_digits > 1) {
    out += '.';
    out.append(digits, 1);
  }
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
}

// indent < 0: one line.
void append_value(const OrderedJson& value, int indent, int depth, std::string& out) {
  const auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  if (value.is_string()) {
    append_jinja_json_string(value.get_ref<const std::string&>(), out);
  } else if (value.is_object() || value.is_array()) {
    const bool object = value.is_object();
    if (value.empty()) {
      out += object ? "{}" : "[]";
      return;
    }
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!first) out += indent < 0 ? ", " : ",";
      first = false;
      if (indent >= 0) newline(depth + 1);
      if (object) {
        append_jinja_json_string(it.key(), out);
        out += ": ";
      }
      append_value(it.value(), indent, depth + 1, out);
    }
    if (indent >= 0) newline(depth);
    out += object ? '}' : ']';
  } else if (value.is_number_float()) {
    append_python_float(value.get<double>(), out);
  } else {
    out += value.dump();  // integers, booleans, null
  }
}

}  // namespace

void append_jinja_json_string(std::string_view text, std::string& out) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

std::string jinja_tojson(const OrderedJson& value, int indent) {
  std::string out;
  append_value(value, indent, 0, out);
  return out;
}

}  // namespace folio::server
