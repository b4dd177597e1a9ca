#include "folio/base/status.h"

#include <cerrno>
#include <cstring>
#include <ostream>

namespace folio {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kCancelled:
      return "CANCELLED";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kDataLoss:
      return "DATA_LOSS";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", status_code_name(code()), message());
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code(), fmt::format("{}: {}", context, message()));
}

std::ostream& operator<<(std::ostream& out, const Status& status) {
  return out << status.to_string();
}

Status errno_status(std::string_view call, std::string_view what) {
  const int error = errno;
  const StatusCode code = (error == ENOMEM || error == ENOSPC) ? StatusCode::kResourceExhausted
                          : (error == ENOENT)                  ? StatusCode::kNotFound
                          : (error == EINVAL)                  ? StatusCode::kInvalidArgument
                                                               : StatusCode::kInternal;
  return Status(code, fmt::format("{}: {} failed: {}", what, call, std::strerror(error)));
}

}  // namespace folio
