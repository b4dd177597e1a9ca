#include "bench/server/stream_recorder.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "folio/base/check.h"

namespace folio::bench {
namespace {

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The generated text of one chunk's first choice: nullopt when the chunk does not have the
// shape of `endpoint`'s chunks; an empty string when it carries no text (a role-only delta, the
// usage chunk with no choices, a finish_reason chunk, null content).
std::optional<std::string> chunk_text(const nlohmann::json& chunk, Endpoint endpoint) {
  const auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array()) return std::nullopt;
  if (choices->empty()) return std::string();
  const nlohmann::json& choice = (*choices)[0];
  if (!choice.is_object()) return std::nullopt;
  const nlohmann::json* holder = &choice;
  const char* key = "text";
  switch (endpoint) {
    case Endpoint::kCompletions:
      break;
    case Endpoint::kChat: {
      const auto delta = choice.find("delta");
      if (delta == choice.end() || !delta->is_object()) return std::nullopt;
      holder = &*delta;
      key = "content";
      break;
    }
  }
  const auto text = holder->find(key);
  // A chat delta may omit its content (the role-only first delta, the finish_reason one); a
  // completions choice always carries its text, possibly "".
  if (text == holder->end()) {
    return endpoint == Endpoint::kChat ? std::optional<std::string>("") : std::nullopt;
  }
  if (text->is_null()) return std::string();
  if (!text->is_string()) return std::nullopt;
  return text->get<std::string>();
}

}  // namespace

std::string_view outcome_name(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kSucceeded:
      return "succeeded";
    case RequestOutcome::kConnectionFailed:
      return "connection_failed";
    case RequestOutcome::kHttpError:
      return "http_error";
    case RequestOutcome::kMalformedStream:
      return "malformed_stream";
    case RequestOutcome::kErrorEvent:
      return "error_event";
    case RequestOutcome::kMissingDone:
      return "missing_done";
    case RequestOutcome::kCancelled:
      return "cancelled";
  }
  FOLIO_CHECK(false, "unknown RequestOutcome {}", static_cast<int>(outcome));
  return "";
}

double RequestRecord::end_to_end_seconds() const {
  return seconds_between(start, end);
}

double RequestRecord::time_to_first_token_seconds() const {
  FOLIO_CHECK(first_token.has_value(), "time to first token of a request without tokens");
  return seconds_between(start, *first_token);
}

std::optional<double> RequestRecord::time_per_output_token_seconds() const {
  const int64_t tokens = output_tokens();
  if (!first_token || tokens < 2) return std::nullopt;
  return seconds_between(*first_token, last_token) / static_cast<double>(tokens - 1);
}

StreamRecorder::StreamRecorder(Endpoint endpoint, Clock::time_point start) : endpoint_(endpoint) {
  record_.start = start;
  record_.last_token = start;
}

void StreamRecorder::on_response(int http_status, std::string_view content_type) {
  record_.http_status = http_status;
  if (http_status != 200) {
    fail(RequestOutcome::kHttpError, fmt::format("HTTP {}", http_status));
  } else if (content_type.substr(0, content_type.find(';')) != "text/event-stream") {
    fail(RequestOutcome::kMalformedStream,
         fmt::format("Content-Type '{}', expected text/event-stream", content_type));
  }
}

bool StreamRecorder::on_body(std::string_view bytes, Clock::time_point now) {
  if (record_.http_status != 200) {
    // Keep the start of the error body: it usually says what was wrong with the request.
    const size_t room = kMaxErrorBodyBytes - std::min(kMaxErrorBodyBytes, error_body_.size());
    error_body_.append(bytes.substr(0, room));
    return true;
  }
  if (failure_) return false;
  const Status status = parser_.feed(bytes, [&](const SseEvent& event) { on_event(event, now); });
  if (!status.ok()) fail(RequestOutcome::kMalformedStream, std::string(status.message()));
  return !failure_;
}

void StreamRecorder::on_event(const SseEvent& event, Clock::time_point now) {
  if (failure_) return;
  if (saw_done_) {
    fail(RequestOutcome::kMalformedStream, fmt::format("event after [DONE]: '{}'", event.data));
  } else if (event.data == "[DONE]") {
    saw_done_ = true;
  } else {
    on_chunk(event.data, now);
  }
}

void StreamRecorder::on_chunk(std::string_view data, Clock::time_point now) {
  const nlohmann::json chunk = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!chunk.is_object()) {
    fail(RequestOutcome::kMalformedStream,
         fmt::format("event data is not a JSON object: '{}'", data.substr(0, 200)));
    return;
  }
  if (const auto error = chunk.find("error"); error != chunk.end() && !error->is_null()) {
    fail(RequestOutcome::kErrorEvent, fmt::format("error event: {}", error->dump()));
    return;
  }
  const std::optional<std::string> text = chunk_text(chunk, endpoint_);
  if (!text) {
    fail(RequestOutcome::kMalformedStream,
         fmt::format("chunk without the choices of a {} stream: '{}'",
                     endpoint_ == Endpoint::kChat ? "chat" : "completions", data.substr(0, 200)));
    return;
  }
  if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    const auto tokens = usage->find("completion_tokens");
    if (tokens != usage->end() && tokens->is_number_integer()) {
      record_.usage_completion_tokens = tokens->get<int64_t>();
    }
  }
  if (text->empty()) return;
  if (record_.first_token) {
    record_.inter_token_gaps_seconds.push_back(seconds_between(record_.last_token, now));
  } else {
    record_.first_token = now;
  }
  record_.last_token = now;
  ++record_.num_text_chunks;
}

void StreamRecorder::fail(RequestOutcome outcome, std::string error) {
  if (failure_) return;  // the first failure is the cause; later ones follow from it
  failure_ = outcome;
  record_.error = std::move(error);
}

RequestRecord StreamRecorder::finish(Clock::time_point now,
                                     std::optional<std::string> transport_error, bool cancelled) {
  record_.end = now;
  if (cancelled && !failure_) {
    fail(RequestOutcome::kCancelled, "cut off at the drain deadline");
  } else if (record_.http_status == 0) {
    fail(RequestOutcome::kConnectionFailed, transport_error.value_or("no HTTP response"));
  } else if (record_.http_status == 200 && !saw_done_) {
    std::string error = parser_.at_boundary() ? "stream ended without data: [DONE]"
                                              : "stream ended inside an event, without [DONE]";
    if (transport_error) error += fmt::format(" ({})", *transport_error);
    fail(RequestOutcome::kMissingDone, std::move(error));
  }
  if (failure_ == RequestOutcome::kHttpError && !error_body_.empty()) {
    record_.error += ": " + error_body_;
  }
  record_.outcome = failure_.value_or(RequestOutcome::kSucceeded);
  return std::move(record_);
}

}  // namespace folio::bench
