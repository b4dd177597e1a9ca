// RequestStream: the hand-off of one request's output from the engine thread, which produces it
// in callbacks that must never block, to the HTTP thread that writes it to the client.
//
// The engine's callbacks append text pieces and, once, the completion, under a mutex held only
// for the append; the HTTP thread waits on a condition variable and takes everything queued at
// once. The stream is shared (std::shared_ptr) between the request's callbacks and the HTTP
// handler, so whichever side finishes last frees it: a client that went away leaves a stream the
// engine can still finish into.
//
// Thread-safety: all methods may be called from any thread. Invariants: no piece is added after
// the completion; the completion is set at most once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/engine/request.h"

namespace folio::server {

class RequestStream {
 public:
  // Points `request`'s callbacks at `stream`.
  static void attach(const std::shared_ptr<RequestStream>& stream, engine::Request& request);

  // Engine thread: one token's text (empty text is not queued).
  void push_text(std::string_view text);
  // Engine thread: the request ended. Requires: called once.
  void finish(const engine::Completion& completion);

  struct Update {
    std::vector<std::string> pieces;               // text in order, since the last take
    std::optional<engine::Completion> completion;  // set once the request ended
  };
  // HTTP thread: waits until text or the completion is queued, or `timeout` passes, and takes
  // it. The completion stays readable: every later take returns it again.
  Update take(std::chrono::milliseconds timeout);

 private:
  Mutex mutex_;
  std::condition_variable changed_;  // notified after every append, under no lock
  std::vector<std::string> pieces_ FOLIO_GUARDED_BY(mutex_);
  std::optional<engine::Completion> completion_ FOLIO_GUARDED_BY(mutex_);
};

}  // namespace folio::server
