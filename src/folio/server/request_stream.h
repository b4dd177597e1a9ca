// RequestStream: the hand-off of one request's output from the engine thread, which produces it
// in callbacks that must never block, to the connection's strand that writes it to the client.
//
// The engine's callbacks append text pieces and, once, the completion, under a mutex held only
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
// Invariants: no piece is added after the completion; the completion is set at most once.
#pragma once

#include <functional>
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

  // Called (under the stream's mutex) when something becomes available to take. Empty: none.
  // Replaces the previous hook; if something is already waiting, the new hook is called.
  void set_notify(std::function<void()> notify);

  // Engine thread: one token's text (empty text is not queued).
  void push_text(std::string_view text);
  // Engine thread: the request ended. Requires: called once.
  void finish(const engine::Completion& completion);

  struct Update {
    std::vector<std::string> pieces;               // text in order, since the last take
    std::optional<engine::Completion> completion;  // set once the request ended
  };
  // Takes what is queued now, without waiting. The completion stays readable: every later take
  // returns it again. Re-enables the notify hook.
  Update take();

 private:
  void notify_locked() FOLIO_REQUIRES(mutex_);

  Mutex mutex_;
  std::function<void()> notify_ FOLIO_GUARDED_BY(mutex_);
  bool notified_ FOLIO_GUARDED_BY(mutex_) = false;  // a notification is not yet taken
  std::vector<std::string> pieces_ FOLIO_GUARDED_BY(mutex_);
  std::optional<engine::Completion> completion_ FOLIO_GUARDED_BY(mutex_);
  bool completion_taken_ FOLIO_GUARDED_BY(mutex_) = false;
};

}  // namespace folio::server
