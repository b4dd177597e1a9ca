// RequestStream: the hand-off of one request's output from the engine thread, which produces it
// in callbacks that must never block, to the connection's strand that writes it to the client.
//
// The engine's callbacks append tokens (with their text and logprobs), prompt logprobs and each
// choice's completion, under a mutex held only
// for the append, then call the stream's notify hook, which posts a drain task to the
// connection's strand (post only queues; it never waits). Notifications coalesce: the hook is
// called only when the stream goes from "nothing to take" to "something to take", so however
// fast the engine produces, at most one drain is queued per stream; the drain takes everything
// queued at once. The stream is shared (std::shared_ptr) between the request's callbacks and the
// server side, so whichever finishes last frees it: a client that went away leaves a stream the
// engine can still finish into.
//
// Thread-safety: all methods may be called from any thread. The hook is called with the
// stream's mutex held (so clearing it with set_notify(nullptr) returns only once no call is in
// progress, after which the hook's captures can be destroyed safely); it must only queue work.
// Invariants: no token of a choice is added after its completion; at most the expected number
// of completions arrive.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/engine/request.h"

namespace folio::server {

class RequestStream {
 public:
  // The stream gathers `expected_completions` choices (over one or more engine requests).
  explicit RequestStream(int32_t expected_completions = 1)
      : expected_completions_(expected_completions) {}

  // Points `request`'s callbacks at `stream`. The request's choices are choices
  // [choice_offset, choice_offset + request.num_choices) of the answer, and its prompt is prompt
  // `prompt_index` (for prompt logprobs).
  static void attach(const std::shared_ptr<RequestStream>& stream, engine::Request& request,
                     int32_t choice_offset = 0, int32_t prompt_index = 0);

  // Called (under the stream's mutex) when something becomes available to take. Empty: none.
  // Replaces the previous hook; if something is already waiting, the new hook is called.
  void set_notify(std::function<void()> notify);

  // One generated token of one choice, as the answer needs it.
  struct Token {
    int32_t choice = 0;
    int32_t id = 0;
    std::string text;  // the text made final by this token (may be empty)
    std::optional<engine::TokenLogprobs> logprobs;
  };
  // Engine thread: one token (`choice` already offset). Requires: its choice has not finished.
  void push_token(int32_t choice, const engine::TokenEvent& event);
  // Engine thread: prompt `prompt_index`'s logprobs (entries for its tokens 1 .. N - 1).
  void push_prompt_logprobs(int32_t prompt_index, std::span<const engine::TokenLogprobs> entries);
  // Engine thread: one choice ended (`completion.choice` already offset). Requires: once per
  // choice, at most expected_completions in all.
  void finish(const engine::Completion& completion);

  struct Update {
    std::vector<Token> tokens;  // in order, since the last take
    std::vector<std::pair<int32_t, std::vector<engine::TokenLogprobs>>> prompt_logprobs;
    std::vector<engine::Completion> completions;  // choices ended since the last take
    bool finished = false;  // every expected choice has ended (true in every later take too)
  };
  // Takes what is queued now, without waiting. Re-enables the notify hook.
  Update take();

 private:
  void notify_locked() FOLIO_REQUIRES(mutex_);
  bool has_news_locked() const FOLIO_REQUIRES(mutex_);

  const int32_t expected_completions_;
  Mutex mutex_;
  std::function<void()> notify_ FOLIO_GUARDED_BY(mutex_);
  bool notified_ FOLIO_GUARDED_BY(mutex_) = false;  // a notification is not yet taken
  std::vector<Token> tokens_ FOLIO_GUARDED_BY(mutex_);
  std::vector<std::pair<int32_t, std::vector<engine::TokenLogprobs>>> prompt_logprobs_
      FOLIO_GUARDED_BY(mutex_);
  std::vector<engine::Completion> completions_ FOLIO_GUARDED_BY(mutex_);
  int32_t num_completions_ FOLIO_GUARDED_BY(mutex_) = 0;
  bool finished_taken_ FOLIO_GUARDED_BY(mutex_) = false;
};

}  // namespace folio::server
