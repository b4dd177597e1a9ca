// Result<T>: a value or the Status saying why there is none. The return type of every fallible
// function that produces something; `FOLIO_ASSIGN_OR_RETURN` unwraps it or propagates the error.
#pragma once

#include <utility>
#include <variant>

#include "folio/base/check.h"
#include "folio/base/status.h"

namespace folio {

template <typename T>
class [[nodiscard]] Result {
 public:
  // Implicit from a value or an error status, so `return value;` and `return status;` both work.
  Result(T value) : storage_(std::in_place_index<0>, std::move(value)) {}        // NOLINT
  Result(Status status) : storage_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    FOLIO_CHECK(!std::get<1>(storage_).ok(),
                "Result constructed from an OK status without a value");
  }

  bool ok() const { return storage_.index() == 0; }
  // OK when a value is held.
  Status status() const { return ok() ? Status() : std::get<1>(storage_); }

  // Requires: ok().
  T& value() & {
    check_has_value();
    return std::get<0>(storage_);
  }
  const T& value() const& {
    check_has_value();
    return std::get<0>(storage_);
  }
  T&& value() && {
    check_has_value();
    return std::get<0>(std::move(storage_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  T value_or(T fallback) const& { return ok() ? std::get<0>(storage_) : std::move(fallback); }

 private:
  void check_has_value() const {
    FOLIO_CHECK(ok(), "value() of a failed Result: {}", std::get<1>(storage_).to_string());
  }
  std::variant<T, Status> storage_;
};

}  // namespace folio

#define FOLIO_RESULT_CONCAT_INNER(a, b) a##b
#define FOLIO_RESULT_CONCAT(a, b) FOLIO_RESULT_CONCAT_INNER(a, b)
#define FOLIO_ASSIGN_OR_RETURN_IMPL(result, lhs, expression) \
  auto result = (expression);                                \
  if (!result.ok()) return result.status();                  \
  lhs = std::move(result).value()
// FOLIO_ASSIGN_OR_RETURN(auto file, open_file(path)); declares/assigns or returns the error.
#define FOLIO_ASSIGN_OR_RETURN(lhs, expression) \
  FOLIO_ASSIGN_OR_RETURN_IMPL(FOLIO_RESULT_CONCAT(folio_result_, __LINE__), lhs, expression)
