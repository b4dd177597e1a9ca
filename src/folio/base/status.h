// Status: the outcome of an operation that can fail in an expected way (bad input, out of
// memory, a lost peer). An OK status carries nothing and costs one null pointer; an error
// carries a code and a message written for the user who has to act on it ("page size 3000 is
// not a power of two between 4 KiB and 4 MiB"), not for the developer.
//
// Broken invariants are not statuses: they abort through FOLIO_CHECK (check.h).
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace folio {

enum class StatusCode {
  kOk,
  kInvalidArgument,     // the caller passed something malformed; retrying will not help
  kOutOfRange,          // an index, offset or length outside what exists
  kNotFound,            // a named thing (file, id, model) does not exist
  kAlreadyExists,       // creating something that is already there
  kFailedPrecondition,  // the object is in the wrong state for this call (double free, stale
                        // handle)
  kResourceExhausted,   // out of memory or another quota; may succeed later
  kUnavailable,         // a peer or device cannot be reached right now
  kCancelled,           // the caller asked to stop
  kDeadlineExceeded,    // a time limit passed
  kDataLoss,            // a file or message is corrupt or truncated
  kInternal,            // a third-party library or the OS failed unexpectedly
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status ok_status() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty for OK.
  std::string_view message() const { return state_ ? std::string_view(state_->message) : ""; }
  // "RESOURCE_EXHAUSTED: page pool has 3 free pages, 8 requested"
  std::string to_string() const;

  // Returns a copy whose message is prefixed with `context: `, for callers that add where the
  // failure happened ("loading model.gguf: tensor 'blk.0.attn_q.weight': ...").
  Status with_context(std::string_view context) const;

  // Marks a status as deliberately dropped (e.g. in destructors).
  void ignore() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  // Shared and immutable, so copies are cheap and thread-safe.
  std::shared_ptr<const State> state_;
};

// Builders with fmt-style messages: invalid_argument("page size {} is not a power of two", n).
#define FOLIO_DEFINE_STATUS_BUILDER(name, code)                            \
  template <typename... Args>                                              \
  Status name(fmt::format_string<Args...> format, Args&&... args) {        \
    return Status(code, fmt::format(format, std::forward<Args>(args)...)); \
  }
FOLIO_DEFINE_STATUS_BUILDER(invalid_argument, StatusCode::kInvalidArgument)
FOLIO_DEFINE_STATUS_BUILDER(out_of_range, StatusCode::kOutOfRange)
FOLIO_DEFINE_STATUS_BUILDER(not_found, StatusCode::kNotFound)
FOLIO_DEFINE_STATUS_BUILDER(already_exists, StatusCode::kAlreadyExists)
FOLIO_DEFINE_STATUS_BUILDER(failed_precondition, StatusCode::kFailedPrecondition)
FOLIO_DEFINE_STATUS_BUILDER(resource_exhausted, StatusCode::kResourceExhausted)
FOLIO_DEFINE_STATUS_BUILDER(unavailable, StatusCode::kUnavailable)
FOLIO_DEFINE_STATUS_BUILDER(cancelled, StatusCode::kCancelled)
FOLIO_DEFINE_STATUS_BUILDER(deadline_exceeded, StatusCode::kDeadlineExceeded)
FOLIO_DEFINE_STATUS_BUILDER(data_loss, StatusCode::kDataLoss)
FOLIO_DEFINE_STATUS_BUILDER(internal_error, StatusCode::kInternal)
#undef FOLIO_DEFINE_STATUS_BUILDER

// Writes to_string(), so tests can stream a status (`EXPECT_TRUE(s.ok()) << s`).
std::ostream& operator<<(std::ostream& out, const Status& status);

// Status from the current errno, naming the call that failed: errno_status("mmap", "reserving 4
// GiB").
Status errno_status(std::string_view call, std::string_view what);

}  // namespace folio

template <>
struct fmt::formatter<folio::Status> : fmt::formatter<std::string> {
  auto format(const folio::Status& status, fmt::format_context& context) const {
    return fmt::formatter<std::string>::format(status.to_string(), context);
  }
};

// Returns early from the enclosing function (which returns Status or Result<T>) on error.
#define FOLIO_RETURN_IF_ERROR(expression)          \
  do {                                             \
    ::folio::Status folio_status_ = (expression);  \
    if (!folio_status_.ok()) return folio_status_; \
  } while (false)
