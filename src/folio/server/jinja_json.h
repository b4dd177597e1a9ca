// JSON as chat templates print it: the `tojson` filter of Hugging Face transformers, which is
// Python's json.dumps(value, ensure_ascii=False, indent=indent). Models were trained on prompts
// written this way, so a tool schema or call in a prompt must match it byte for byte.
//
// Terms and rules (Python's, which differ from C++ JSON libraries in each point):
//   - one line (indent < 0): items separated by ", ", keys by ": ";
//   - indented: "," ends each line, every level indented by `indent` more spaces, ": " after
//     keys; empty containers stay "{}" and "[]";
//   - strings escape only '"', '\' and control characters below 0x20 (\n, \r, \t, \b, \f by
//     name, the rest as lowercase \u00XX); non-ASCII, '/' and 0x7f are written as they are;
//   - floats as Python's repr: the shortest digits that read back to the same double,
//     positional when the decimal point is at most 16 digits after the first digit and at most
//     4 places before it ("1000000000000000.0", "0.0001", "-0.0"), exponent form otherwise with
//     at least two exponent digits ("1e+16", "1e-05"); integers, true, false, null as usual;
//   - keys in the order of the value (nlohmann::ordered_json keeps the order they were read
//     in, which is the client's; Python dicts keep it too).
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace folio::server {

std::string jinja_tojson(const nlohmann::ordered_json& value, int indent = -1);

// Appends `text` as a JSON string (quoted and escaped as above). Requires: valid UTF-8.
void append_jinja_json_string(std::string_view text, std::string& out);

}  // namespace folio::server
