// Reading a whole input file (a text to score, a weights manifest) for the commands, with the
// errors a user can act on: kNotFound naming the path when it cannot be opened, kDataLoss when
// reading fails midway.
#pragma once

#include <string>

#include "folio/base/result.h"

namespace folio::app {

// The file's bytes, unchanged (opened in binary mode).
Result<std::string> read_file(const std::string& path);

}  // namespace folio::app
