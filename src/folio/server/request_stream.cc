#include "folio/server/request_stream.h"

#include "folio/base/check.h"

namespace folio::server {

void RequestStream::attach(const std::shared_ptr<RequestStream>& stream, engine::Request& request) {
  request.on_token = [stream](const engine::TokenEvent& event) { stream->push_text(event.text); };
  request.on_finish = [stream](const engine::Completion& completion) {
    stream->finish(completion);
  };
}

void RequestStream::push_text(std::string_view text) {
  if (text.empty()) return;
  {
    MutexLock lock(mutex_);
    FOLIO_CHECK(!completion_.has_value(), "text after the request finished");
    pieces_.emplace_back(text);
  }
  changed_.notify_all();
}

void RequestStream::finish(const engine::Completion& completion) {
  {
    MutexLock lock(mutex_);
    FOLIO_CHECK(!completion_.has_value(), "request {} finished twice", completion.request);
    completion_ = completion;
  }
  changed_.notify_all();
}

RequestStream::Update RequestStream::take(std::chrono::milliseconds timeout) {
  MutexLock lock(mutex_);
  lock.wait_for(changed_, timeout, [&]() FOLIO_REQUIRES(mutex_) {
    return !pieces_.empty() || completion_.has_value();
  });
  Update update;
  update.pieces.swap(pieces_);
  update.completion = completion_;
  return update;
}

}  // namespace folio::server
