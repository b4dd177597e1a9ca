// HttpConnection: one accepted client socket of the HTTP front end (http_listener.h), served on
// its own strand; private to the server layer (it is the one place Beast's parser and Asio's
// socket operations live, so only http_connection.cc and http_listener.cc compile them).
//
// States, in order, for each request on the socket:
//   waiting  : no request byte yet; the socket is watched for readability (no read buffer is
//              held); idle deadline.
//   header   : reading the header into the read buffer; header deadline from the first byte.
//   body     : reading the body; body deadline.
//   answering: the service holds the exchange; the socket is watched, so a client that closes
//              abandons it at once; while a write is under way, the write deadline.
// then back to waiting (keep-alive) or closed. An expired deadline closes the socket and
// counts the timeout by kind; a pending exchange is abandoned.
//
// Invariants (on the strand): at most one read or readability wait and at most one write are
// outstanding; at most one deadline is armed; an exchange completes exactly once; once closed,
// no operation is started and buffers are released (the object may outlive the socket while an
// engine request still refers to its exchange).
//
// Thread-safety: every member function other than the constructor runs on the strand or posts
// itself there.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/string_body.hpp>

#include "folio/base/mutex.h"
#include "folio/server/http_exchange.h"
#include "folio/server/http_listener.h"
#include "folio/server/http_metrics.h"

namespace folio::server {

// What every connection of one listener shares: its options, service and metrics, and the
// registry of open connections that stop() closes.
struct HttpConnectionContext {
  HttpConnectionContext(const HttpListenerOptions& listener_options, HttpService& http_service,
                        HttpMetrics http_metrics)
      : options(listener_options), service(http_service), metrics(http_metrics) {}

  // Counts an accepted socket; false (nothing counted) when max_connections are open.
  bool try_open();
  void registered(uint64_t id, std::weak_ptr<HttpConnection> connection);
  // Exactly once per opened socket.
  void closed(uint64_t id);
  // The connections open now (for stop()).
  std::vector<std::shared_ptr<HttpConnection>> open_connections();
  // Waits until no connection is open, up to `timeout`; true when none is.
  bool wait_all_closed(std::chrono::milliseconds timeout);

  const HttpListenerOptions options;
  HttpService& service;
  const HttpMetrics metrics;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> num_open{0};

 private:
  Mutex mutex_;
  std::condition_variable all_closed_;  // notified when num_open reaches 0
  std::unordered_map<uint64_t, std::weak_ptr<HttpConnection>> open_ FOLIO_GUARDED_BY(mutex_);
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  // `socket`'s executor is the connection's strand; it was counted by context.try_open().
  HttpConnection(boost::asio::ip::tcp::socket socket, HttpConnectionContext& context, uint64_t id);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  void start();
  // Closes the socket (from stop()); a pending exchange is abandoned.
  void close_for_stop();

  // HttpExchange's calls, for exchange `sequence` (stale ones are ignored).
  void set_on_complete(uint64_t sequence, std::function<void(bool)> callback);
  void respond(uint64_t sequence, HttpResponse response);
  void begin_stream(uint64_t sequence, HttpResponse head);
  void write(uint64_t sequence, std::string data);
  void end_stream(uint64_t sequence);
  void post(std::function<void()> task);

 private:
  enum class Answer : uint8_t { kNone, kPending, kWhole, kStream };
  enum class CloseReason : uint8_t { kDone, kClientGone, kTimeout, kServerStopped };

  template <class Function>
  void on_strand(Function function);

  void await_request();
  void watch();
  void on_readable(const boost::system::error_code& error);
  void read_header();
  void on_header(const boost::system::error_code& error);
  void read_body();
  void on_body(const boost::system::error_code& error);
  // A failed header or body read: a parse error is refused (400/413/431), anything else closes.
  void on_read_error(const boost::system::error_code& error);
  void dispatch();
  void refuse(const boost::system::error_code& error);

  void write_whole();
  void on_whole_written(const boost::system::error_code& error);
  void pump_stream();
  void on_stream_written(const boost::system::error_code& error, bool last);
  void finish_exchange(bool keep_alive);
  void complete_exchange(bool delivered);

  void arm(HttpTimeout kind, std::chrono::milliseconds timeout);
  void disarm();
  void linger_then_close();
  void close(CloseReason reason);
  void release_buffers();

  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer timer_;
  HttpConnectionContext& context_;
  const uint64_t id_;

  boost::beast::flat_buffer buffer_;
  // Heap-held while used, so a waiting connection carries neither (about 1 KiB together).
  std::unique_ptr<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::string target_;  // of the request being read, for refusals

  uint64_t deadline_generation_ = 0;  // an expiry of an older arming is stale
  HttpTimeout deadline_kind_ = HttpTimeout::kIdle;
  bool closed_ = false;
  bool watching_ = false;   // a readability wait is outstanding
  bool pipelined_ = false;  // the next request's bytes arrived while answering
  bool peer_gone_ = false;  // the client closed while an answer's write was under way
  bool lingering_ = false;  // refused: draining the client's bytes before closing

  uint64_t sequence_ = 0;  // the current (or last) exchange
  Answer answer_ = Answer::kNone;
  bool keep_alive_ = false;
  bool exchange_active_ = false;
  std::function<void(bool)> on_complete_;

  bool writing_ = false;
  struct Output {
    std::optional<boost::beast::http::response<boost::beast::http::string_body>> whole;
    std::optional<boost::beast::http::response<boost::beast::http::empty_body>> stream_head;
    std::optional<boost::beast::http::response_serializer<boost::beast::http::empty_body>>
        stream_serializer;
  };
  std::unique_ptr<Output> output_;  // the answer being written
  bool stream_head_written_ = false;
  bool stream_ended_ = false;
  std::string stream_pending_;    // chunk payloads not yet written
  std::string stream_in_flight_;  // the framed chunk being written
  std::unique_ptr<char[]> discard_;
  size_t discarded_bytes_ = 0;
};

}  // namespace folio::server
