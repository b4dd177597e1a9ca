// How the long-running commands (serve, worker) stop: SIGINT and SIGTERM are blocked in the
// calling thread, and so in every thread it starts afterwards (the server's, gRPC's), and the
// command waits for one of them in wait(), then shuts down in order. SIGPIPE is ignored: a peer
// that vanishes mid-write must be an error on that socket, not the end of the process.
//
// Threads started before the constructor (OpenBLAS starts its pool when the library loads) do
// not block the two signals. The kernel hands a process-directed signal to any thread that does
// not block it when the waiting thread is not inside sigwait (as after SIGSTOP and SIGCONT, which
// interrupt the wait), and the default action would end the process. So the constructor also
// installs a handler: run on such a thread, it forwards the signal to the waiting thread, where
// wait() takes it. request() asks for the same stop from inside the process (a coordinator's
// Shutdown call), directed at the waiting thread only.
#pragma once

#include <pthread.h>

#include <csignal>

namespace folio::app {

class ShutdownSignals {
 public:
  // Call before starting any thread, on the thread that will call wait(). One at a time.
  ShutdownSignals();
  ~ShutdownSignals();
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  // Blocks until SIGINT or SIGTERM arrives; returns its number.
  int wait();
  // Makes wait() return `signal_number` (SIGINT or SIGTERM); from any thread.
  void request(int signal_number) const;

 private:
  sigset_t signals_;
  pthread_t waiting_thread_;
};

}  // namespace folio::app
