// SseParser: an incremental parser of a server-sent-event stream (the WHATWG HTML "event stream"
// format), the body an OpenAI-compatible server sends for `stream: true`.
//
// Terms (the specification's): the stream is a sequence of *lines*, each ended by CRLF, LF or a
// lone CR. A line `field: value` sets a field (one space after the colon is dropped); a line that
// starts with `:` is a comment; a blank line *dispatches* the event gathered since the previous
// blank line. Several `data` lines join with "\n". An event with no data line is not dispatched
// (the specification's rule, so a comment-only keep-alive produces nothing).
//
// Bytes arrive from the socket split at arbitrary points, mid-line, mid-UTF-8 sequence or
// between the CR and the LF of a CRLF; feed() keeps the unfinished line and the half-built event
// across calls, so the events it produces do not depend on where the splits fall. Not handled,
// because OpenAI-compatible servers never send them: a leading byte-order mark and `retry`.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "folio/base/function_ref.h"
#include "folio/base/status.h"

namespace folio::bench {

struct SseEvent {
  std::string type = "message";  // the `event` field; "message" when the event names none
  std::string data;              // the `data` lines joined with "\n"
  std::string id;                // the `id` field, empty when absent

  friend bool operator==(const SseEvent&, const SseEvent&) = default;
};

// Thread-safety: none; one parser per stream, used by one thread at a time.
// Invariants: line_ never contains CR or LF; line_.size() <= max_line_bytes.
class SseParser {
 public:
  // A line longer than this is treated as a broken stream rather than buffered without bound.
  static constexpr size_t kDefaultMaxLineBytes = 1 << 20;

  explicit SseParser(size_t max_line_bytes = kDefaultMaxLineBytes)
      : max_line_bytes_(max_line_bytes) {}

  // Parses `bytes`, calling `on_event` for each event the bytes complete, in stream order.
  // Returns kDataLoss when a line exceeds the limit; the parser is then left failed and every
  // later call returns the same error without parsing.
  Status feed(std::string_view bytes, FunctionRef<void(const SseEvent&)> on_event);

  // True when the bytes fed so far end exactly at an event boundary or between whole events:
  // no unterminated line and no undispatched field. A stream that ends otherwise was truncated.
  bool at_boundary() const { return line_.empty() && !event_has_fields_; }

  size_t num_events_dispatched() const { return num_events_dispatched_; }

 private:
  void process_line(std::string_view line, FunctionRef<void(const SseEvent&)> on_event);
  void dispatch(FunctionRef<void(const SseEvent&)> on_event);

  size_t max_line_bytes_;
  std::string line_;                // the current line, not yet terminated
  bool pending_line_feed_ = false;  // the last byte was a CR: an LF right after it is skipped
  SseEvent event_;                  // the event being built
  bool event_has_data_ = false;     // a data line was seen (the data itself may be empty)
  bool event_has_fields_ = false;   // any field line was seen since the last blank line
  size_t num_events_dispatched_ = 0;
  Status failure_;  // OK until a line exceeds the limit
};

}  // namespace folio::bench
