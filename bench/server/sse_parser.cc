#include "bench/server/sse_parser.h"

namespace folio::bench {

Status SseParser::feed(std::string_view bytes, FunctionRef<void(const SseEvent&)> on_event) {
  if (!failure_.ok()) return failure_;
  size_t position = 0;
  if (pending_line_feed_ && !bytes.empty()) {
    // The previous call ended on a CR; an LF opening this call belongs to that CRLF.
    pending_line_feed_ = false;
    if (bytes[0] == '\n') position = 1;
  }
  while (position < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", position);
    const std::string_view piece = bytes.substr(
        position, end == std::string_view::npos ? std::string_view::npos : end - position);
    if (line_.size() + piece.size() > max_line_bytes_) {
      failure_ = data_loss("server-sent event line longer than {} bytes: not an event stream",
                           max_line_bytes_);
      return failure_;
    }
    if (end == std::string_view::npos) {
      line_.append(piece);  // unterminated: wait for the rest
      break;
    }
    if (line_.empty()) {
      process_line(piece, on_event);  // the whole line is in this call: no copy
    } else {
      line_.append(piece);
      process_line(line_, on_event);
      line_.clear();
    }
    position = end + 1;
    if (bytes[end] == '\r') {
      if (position == bytes.size()) {
        pending_line_feed_ = true;
      } else if (bytes[position] == '\n') {
        ++position;
      }
    }
  }
  return Status();
}

void SseParser::process_line(std::string_view line, FunctionRef<void(const SseEvent&)> on_event) {
  if (line.empty()) {
    dispatch(on_event);
    return;
  }
  if (line[0] == ':') return;  // a comment
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  event_has_fields_ = true;
  if (field == "data") {
    if (event_has_data_) event_.data.push_back('\n');
    event_.data.append(value);
    event_has_data_ = true;
  } else if (field == "event") {
    event_.type.assign(value);
  } else if (field == "id") {
    // The specification ignores an id that contains NUL.
    if (value.find('\0') == std::string_view::npos) event_.id.assign(value);
  }
  // Other fields (`retry`, unknown names) are ignored, as the specification says.
}

void SseParser::dispatch(FunctionRef<void(const SseEvent&)> on_event) {
  if (event_has_data_) {
    on_event(event_);
    ++num_events_dispatched_;
  }
  event_ = SseEvent();
  event_has_data_ = false;
  event_has_fields_ = false;
}

}  // namespace folio::bench
