// Invariant checks. A failed FOLIO_CHECK is a bug in Folio, never a user error: it prints where
// and why, then aborts. Expected failures return a Status instead (status.h).
//
// FOLIO_DCHECK runs in debug builds and when FOLIO_DEBUG_CHECKS is defined (the debug and
// sanitizer presets); FOLIO_EXPENSIVE_CHECKS() says whether O(n) invariant walks should run.
#pragma once

#include <string>
#include <utility>

#include <fmt/format.h>

namespace folio::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expression,
                               const std::string& message);
inline std::string check_message() {
  return {};
}
template <typename... Args>
std::string check_message(fmt::format_string<Args...> format, Args&&... args) {
  return fmt::format(format, std::forward<Args>(args)...);
}
}  // namespace folio::detail

#define FOLIO_CHECK(condition, ...)                                               \
  do {                                                                            \
    if (!(condition)) [[unlikely]] {                                              \
      ::folio::detail::check_failed(__FILE__, __LINE__, #condition,               \
                                    ::folio::detail::check_message(__VA_ARGS__)); \
    }                                                                             \
  } while (false)

#if !defined(NDEBUG) || defined(FOLIO_DEBUG_CHECKS)
#define FOLIO_DCHECK(condition, ...) FOLIO_CHECK(condition __VA_OPT__(, ) __VA_ARGS__)
#define FOLIO_EXPENSIVE_CHECKS() true
#else
#define FOLIO_DCHECK(condition, ...) \
  do {                               \
  } while (false && (condition))
#define FOLIO_EXPENSIVE_CHECKS() false
#endif

#define FOLIO_UNREACHABLE(...)                                     \
  ::folio::detail::check_failed(__FILE__, __LINE__, "unreachable", \
                                ::folio::detail::check_message(__VA_ARGS__))
