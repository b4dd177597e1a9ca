#include "folio/server/request_stream.h"

#include "folio/base/check.h"

namespace folio::server {

void RequestStream::attach(const std::shared_ptr<RequestStream>& stream, engine::Request& request,
                           int32_t choice_offset, int32_t prompt_index) {
  request.on_token = [stream, choice_offset](const engine::TokenEvent& event) {
    stream->push_token(choice_offset + event.choice, event);
  };
  request.on_finish = [stream, choice_offset](const engine::Completion& completion) {
    engine::Completion offset = completion;
    offset.choice += choice_offset;
    stream->finish(offset);
  };
  if (request.prompt_logprobs) {
    request.on_prompt_logprobs = [stream,
                                  prompt_index](std::span<const engine::TokenLogprobs> entries) {
      stream->push_prompt_logprobs(prompt_index, entries);
    };
  }
}

void RequestStream::set_notify(std::function<void()> notify) {
  MutexLock lock(mutex_);
  notify_ = std::move(notify);
  notified_ = false;
  if (has_news_locked()) notify_locked();
}

bool RequestStream::has_news_locked() const {
  const bool finished = num_completions_ == expected_completions_;
  return !tokens_.empty() || !prompt_logprobs_.empty() || !completions_.empty() ||
         (finished && !finished_taken_);
}

void RequestStream::notify_locked() {
  if (notified_ || !notify_) return;
  notified_ = true;
  notify_();
}

void RequestStream::push_token(int32_t choice, const engine::TokenEvent& event) {
  MutexLock lock(mutex_);
  FOLIO_CHECK(num_completions_ < expected_completions_, "a token after every choice finished");
  Token token;
  token.choice = choice;
  token.id = event.token;
  token.text = std::string(event.text);
  if (event.logprobs != nullptr) token.logprobs = *event.logprobs;
  tokens_.push_back(std::move(token));
  notify_locked();
}

void RequestStream::push_prompt_logprobs(int32_t prompt_index,
                                         std::span<const engine::TokenLogprobs> entries) {
  MutexLock lock(mutex_);
  prompt_logprobs_.emplace_back(prompt_index,
                                std::vector<engine::TokenLogprobs>(entries.begin(), entries.end()));
  notify_locked();
}

void RequestStream::finish(const engine::Completion& completion) {
  MutexLock lock(mutex_);
  FOLIO_CHECK(num_completions_ < expected_completions_, "request {} finished more choices than {}",
              completion.request, expected_completions_);
  ++num_completions_;
  completions_.push_back(completion);
  notify_locked();
}

RequestStream::Update RequestStream::take() {
  MutexLock lock(mutex_);
  notified_ = false;
  Update update;
  update.tokens.swap(tokens_);
  update.prompt_logprobs.swap(prompt_logprobs_);
  update.completions.swap(completions_);
  update.finished = num_completions_ == expected_completions_;
  if (update.finished) finished_taken_ = true;
  return update;
}

}  // namespace folio::server
