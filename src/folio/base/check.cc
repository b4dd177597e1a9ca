#include "folio/base/check.h"

#include <cstdio>
#include <cstdlib>

namespace folio::detail {

void check_failed(const char* file, int line, const char* expression, const std::string& message) {
  std::fprintf(stderr, "folio: invariant broken at %s:%d: %s%s%s\n", file, line, expression,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace folio::detail
