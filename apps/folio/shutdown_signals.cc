#include "apps/folio/shutdown_signals.h"

#include <pthread.h>

namespace folio::app {

ShutdownSignals::ShutdownSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

int ShutdownSignals::wait() {
  int received = 0;
  sigwait(&signals_, &received);
  return received;
}

}  // namespace folio::app
