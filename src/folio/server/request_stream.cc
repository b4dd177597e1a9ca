#include "folio/server/request_stream.h"

#include "folio/base/check.h"

namespace folio::server {

void RequestStream::attach(const std::shared_ptr<RequestStream>& stream, engine::Request& request) {
  request.on_token = [stream](const engine::TokenEvent& event) { stream->push_text(event.text); };
  request.on_finish = [stream](const engine::Completion& completion) {
    stream->finish(completion);
  };
}

void RequestStream::set_notify(std::function<void()> notify) {
  MutexLock lock(mutex_);
  notify_ = std::move(notify);
  notified_ = false;
  if (!pieces_.empty() || (completion_.has_value() && !completion_taken_)) notify_locked();
}

void RequestStream::notify_locked() {
  if (notified_ || !notify_) return;
  notified_ = true;
  notify_();
}

void RequestStream::push_text(std::string_view text) {
  if (text.empty()) return;
  MutexLock lock(mutex_);
  FOLIO_CHECK(!completion_.has_value(), "text after the request finished");
  pieces_.emplace_back(text);
  notify_locked();
}

void RequestStream::finish(const engine::Completion& completion) {
  MutexLock lock(mutex_);
  FOLIO_CHECK(!completion_.has_value(), "request {} finished twice", completion.request);
  completion_ = completion;
  notify_locked();
}

RequestStream::Update RequestStream::take() {
  MutexLock lock(mutex_);
  notified_ = false;
  Update update;
  update.pieces.swap(pieces_);
  update.completion = completion_;
  if (completion_.has_value()) completion_taken_ = true;
  return update;
}

}  // namespace folio::server
