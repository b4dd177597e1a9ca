// How the long-running commands (serve, worker) stop: SIGINT and SIGTERM are blocked in the
// calling thread, and so in every thread it starts afterwards (the server's, gRPC's), and the
// command waits for one of them in wait(), then shuts down in order. SIGPIPE is ignored: a peer
// that vanishes mid-write must be an error on that socket, not the end of the process.
#pragma once

#include <csignal>

namespace folio::app {

class ShutdownSignals {
 public:
  // Call before starting any thread.
  ShutdownSignals();
  // Blocks until SIGINT or SIGTERM arrives; returns its number.
  int wait();

 private:
  sigset_t signals_;
};

}  // namespace folio::app
