#include "apps/folio/shutdown_signals.h"

#include <atomic>

#include "folio/base/check.h"

namespace folio::app {
namespace {

// The thread that waits, for the forwarding handler. Written before the handler is installed and
// read only by it; an atomic because a signal handler may read nothing else shared.
std::atomic<pthread_t> waiting_thread_for_handler;

// Runs on a thread that does not block the signal: hand it to the waiting thread, which blocks
// it, so it stays pending there until wait() takes it. pthread_kill is async-signal-safe.
void forward_to_waiting_thread(int signal_number) {
  pthread_kill(waiting_thread_for_handler.load(std::memory_order_relaxed), signal_number);
}

}  // namespace

ShutdownSignals::ShutdownSignals() : waiting_thread_(pthread_self()) {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  waiting_thread_for_handler.store(waiting_thread_, std::memory_order_relaxed);
  struct sigaction forward = {};
  forward.sa_handler = forward_to_waiting_thread;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  FOLIO_CHECK(
      sigaction(SIGINT, &forward, nullptr) == 0 && sigaction(SIGTERM, &forward, nullptr) == 0,
      "installing the shutdown signals' handler");
}

ShutdownSignals::~ShutdownSignals() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

int ShutdownSignals::wait() {
  int received = 0;
  sigwait(&signals_, &received);
  return received;
}

void ShutdownSignals::request(int signal_number) const {
  FOLIO_CHECK(signal_number == SIGINT || signal_number == SIGTERM, "signal {}", signal_number);
  pthread_kill(waiting_thread_, signal_number);
}

}  // namespace folio::app
