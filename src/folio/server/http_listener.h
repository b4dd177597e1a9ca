// HttpListener: the server's HTTP/1.1 front end, an event loop (Boost.Asio, with Boost.Beast's
// parser) that serves every client socket from a small fixed set of io threads.
//
// Terms: an *io thread* runs the listener's io_context; a *connection* (http_connection.h) is
// one accepted socket, served on its own strand, so its handlers never run concurrently and need
// no lock. No io thread ever waits: a connection waiting for a request, a body, or the engine's
// output holds only memory (a socket, a timer, its buffers), never a thread.
//
// Per connection, in order: wait for the first byte of a request (idle timeout; a new socket
// and a kept-alive one alike); read the header (header timeout, counted from that first byte,
// at most max_header_bytes); read the body (body timeout, at most max_body_bytes, else 413);
// hand the request to the HttpService; write the answer (write timeout per write: a client that
// stops reading is closed and its exchange abandoned). While an answer is pending the socket is
// watched for readability, so a client that closes is noticed at once and its exchange
// abandoned (the service then cancels the engine request). A client that half-closes (shutdown
// of its sending side) after the request counts as gone, as nginx treats it.
//
// Memory per connection is bounded: the read buffer holds at most max_header_bytes plus one read
// (a waiting connection holds none: it waits for readability, not in a read), the body at most
// max_body_bytes, a stream's unwritten output is bounded by the write timeout. Above
// max_connections open sockets a new one is closed at once (counted).
//
// Thread-safety: start() and stop() from one controlling thread; num_connections() and
// run_blocking() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/server/http_exchange.h"

namespace folio::server {

struct HttpListenerOptions {
  std::string host = "127.0.0.1";
  int32_t num_io_threads = 2;
  int64_t max_connections = 16384;
  size_t max_header_bytes = size_t{16} << 10;
  size_t max_body_bytes = size_t{1} << 20;
  std::chrono::milliseconds idle_timeout{60'000};    // no request begun (new or kept alive)
  std::chrono::milliseconds header_timeout{10'000};  // first byte to the end of the header
  std::chrono::milliseconds body_timeout{30'000};    // end of the header to the end of the body
  std::chrono::milliseconds write_timeout{30'000};   // each write of an answer
  int32_t send_buffer_bytes = 0;  // SO_SNDBUF of client sockets; 0: the system's default
};

class HttpListener {
 public:
  // Errors (kInvalidArgument): non-positive limits or timeouts; the registry's for conflicting
  // metric families. `service` and `registry` must outlive the listener.
  static Result<std::unique_ptr<HttpListener>> create(const HttpListenerOptions& options,
                                                      HttpService& service,
                                                      metrics::Registry& registry);
  // Stops if still running.
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Binds host:port (0: any free port), starts the io threads; returns the bound port.
  // kUnavailable when the address cannot be bound. Requires: not started.
  Result<int> start(int port);
  // Stops accepting, closes every connection (exchanges still pending are abandoned: their
  // completion callbacks run with false), waits up to `linger` for them to close, then stops
  // and joins the io threads. Idempotent.
  void stop(std::chrono::milliseconds linger = std::chrono::seconds(2));

  // Runs `task` on the listener's blocking thread (one task at a time, in order): for work that
  // may wait, such as reading a file, which must not run on an io thread.
  void run_blocking(std::function<void()> task);

  int64_t num_connections() const;

 private:
  struct State;
  explicit HttpListener(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace folio::server
