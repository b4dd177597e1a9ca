// HttpExchange: one HTTP request and its answer, as the event-driven front end (http_listener.h)
// hands them to the application (HttpService), with no socket or library type in sight.
//
// Terms: the *connection* is one client socket served by one HttpConnection on its strand (a
// serial executor of the listener's io_context: at most one of its handlers runs at a time). An
// *exchange* is one request on it and its answer: either a whole answer (`respond`) or a chunked
// stream (`begin_stream`, `write`*, `end_stream`). The exchange is *complete* once the answer's
// last byte is written (delivered) or the connection failed first (abandoned: the client closed
// it, a write did not finish within the write timeout, the server stopped); the completion
// callback then runs exactly once, on the strand.
//
// Invariants: an exchange is answered once (respond xor begin_stream); nothing is written after
// end_stream; calls made after the exchange completed are ignored (the answer has no reader).
//
// Thread-safety: every method may be called from any thread; answering calls run on the
// connection's strand in the order one thread made them (they are dispatched: inline when the
// caller is already on the strand). `post` runs a task on the strand later, never inline: the
// engine's callbacks use it to hand output over without ever blocking.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace folio::server {

class HttpConnection;

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string path;                                          // the request target without its query
  std::vector<std::pair<std::string, std::string>> headers;  // as received
  std::string body;

  // The first header named `name` (ASCII case-insensitive), or "" when absent.
  std::string_view header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;  // a whole answer's body; ignored when it opens a stream
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
};

class HttpExchange {
 public:
  // `connection` serves the exchange; `sequence` tells it apart from later exchanges there.
  HttpExchange(std::shared_ptr<HttpConnection> connection, uint64_t sequence)
      : connection_(std::move(connection)), sequence_(sequence) {}

  // Runs once, on the strand, when the exchange completes: true when the answer was delivered,
  // false when it was abandoned. Set it before the first answering call.
  void on_complete(std::function<void(bool delivered)> callback);

  // A whole answer (Content-Length framing).
  void respond(HttpResponse response);
  // Opens a chunked answer with `head`'s status, content type and headers.
  void begin_stream(HttpResponse head);
  // One piece of the stream (empty pieces are dropped). Requires: begin_stream was called.
  void write(std::string data);
  // The stream's last chunk; the exchange completes once it is written.
  void end_stream();

  // Runs `task` on the connection's strand, later (never inline). Safe from any thread.
  void post(std::function<void()> task);

 private:
  const std::shared_ptr<HttpConnection> connection_;
  const uint64_t sequence_;
};

// What the front end serves. Both methods run on a connection's strand (an io thread) and must
// not block: work that waits (engine output, a file read) answers later through the exchange.
class HttpService {
 public:
  virtual ~HttpService() = default;
  // One complete request (header and body read, within the limits).
  virtual void handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) = 0;
  // The answer to a request the front end refuses by itself: 400 (unparseable), 413 (body above
  // the limit), 431 (header above the limit). `target` is the request's target when known.
  virtual HttpResponse refusal(int status, std::string_view target) = 0;
};

}  // namespace folio::server
