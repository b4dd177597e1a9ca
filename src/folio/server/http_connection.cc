#include "folio/server/http_connection.h"

#include <sys/socket.h>

#include <cerrno>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include "folio/base/check.h"
#include "folio/base/log.h"

namespace folio::server {
namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;
using boost::system::error_code;

// Room in the read buffer beyond the header limit: one read may bring the header's end and the
// start of the body.
constexpr size_t kReadSlackBytes = 8 << 10;
// A stream whose client reads slower than the engine writes accumulates output; past this much
// unwritten the client is treated as having stopped reading (as the write deadline would).
constexpr size_t kMaxStreamBacklogBytes = size_t{4} << 20;
// After a refusal (413, 400, 431) the client may still be sending its body: it is read and
// dropped for at most this long and this much, so that closing does not reset the connection
// before the client has read the answer.
constexpr std::chrono::milliseconds kLingerTimeout{2'000};
constexpr size_t kLingerDiscardBytes = size_t{16} << 20;
constexpr size_t kDiscardBufferBytes = 4096;

bool ascii_equal_ignoring_case(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    return lower(x) == lower(y);
  });
}

std::string_view to_std(boost::beast::string_view view) {
  return {view.data(), view.size()};
}

// The refusal status of a parse error (Beast's http category).
int refusal_status(const error_code& error) {
  if (error == http::error::header_limit) return 431;
  if (error == http::error::body_limit) return 413;
  return 400;
}

}  // namespace

std::string_view HttpRequest::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (ascii_equal_ignoring_case(key, name)) return value;
  }
  return {};
}

void HttpExchange::on_complete(std::function<void(bool delivered)> callback) {
  connection_->set_on_complete(sequence_, std::move(callback));
}
void HttpExchange::respond(HttpResponse response) {
  connection_->respond(sequence_, std::move(response));
}
void HttpExchange::begin_stream(HttpResponse head) {
  connection_->begin_stream(sequence_, std::move(head));
}
void HttpExchange::write(std::string data) {
  connection_->write(sequence_, std::move(data));
}
void HttpExchange::end_stream() {
  connection_->end_stream(sequence_);
}
void HttpExchange::post(std::function<void()> task) {
  connection_->post(std::move(task));
}

bool HttpConnectionContext::try_open() {
  int64_t open = num_open.load();
  do {
    if (open >= options.max_connections) return false;
  } while (!num_open.compare_exchange_weak(open, open + 1));
  metrics.connections_open->add(1);
  metrics.connections_accepted->increment();
  return true;
}

void HttpConnectionContext::registered(uint64_t id, std::weak_ptr<HttpConnection> connection) {
  MutexLock lock(mutex_);
  open_.emplace(id, std::move(connection));
}

void HttpConnectionContext::closed(uint64_t id) {
  metrics.connections_open->add(-1);
  {
    MutexLock lock(mutex_);
    open_.erase(id);
    if (num_open.fetch_sub(1) != 1) return;
  }
  all_closed_.notify_all();
}

std::vector<std::shared_ptr<HttpConnection>> HttpConnectionContext::open_connections() {
  std::vector<std::shared_ptr<HttpConnection>> result;
  MutexLock lock(mutex_);
  for (const auto& [id, connection] : open_) {
    if (std::shared_ptr<HttpConnection> alive = connection.lock()) result.push_back(alive);
  }
  return result;
}

bool HttpConnectionContext::wait_all_closed(std::chrono::milliseconds timeout) {
  MutexLock lock(mutex_);
  return lock.wait_for(all_closed_, timeout, [&] { return num_open.load() == 0; });
}

HttpConnection::HttpConnection(net::ip::tcp::socket socket, HttpConnectionContext& context,
                               uint64_t id)
    : socket_(std::move(socket)),
      timer_(socket_.get_executor()),
      context_(context),
      id_(id),
      buffer_(context.options.max_header_bytes + kReadSlackBytes) {}

HttpConnection::~HttpConnection() {
  // Destroyed without closing only when the io_context is torn down with handlers pending.
  if (!closed_) context_.closed(id_);
}

template <class Function>
void HttpConnection::on_strand(Function function) {
  net::dispatch(
      socket_.get_executor(),
      [self = shared_from_this(), function = std::move(function)]() mutable { function(*self); });
}

void HttpConnection::start() {
  context_.registered(id_, weak_from_this());
  on_strand([](HttpConnection& self) { self.await_request(); });
}

void HttpConnection::close_for_stop() {
  on_strand([](HttpConnection& self) { self.close(CloseReason::kServerStopped); });
}

void HttpConnection::await_request() {
  if (closed_) return;
  if (buffer_.size() > 0) return read_header();
  arm(HttpTimeout::kIdle, context_.options.idle_timeout);
  if (!watching_) watch();
}

void HttpConnection::watch() {
  watching_ = true;
  socket_.async_wait(
      net::socket_base::wait_read,
      [self = shared_from_this()](const error_code& error) { self->on_readable(error); });
}

void HttpConnection::on_readable(const error_code& error) {
  watching_ = false;
  if (closed_) return;
  if (error) return close(exchange_active_ ? CloseReason::kClientGone : CloseReason::kDone);
  // Readiness is a hint, not a fact: with edge-triggered epoll and several io threads, an event
  // for bytes a read has already taken can complete a later wait. A peek says what is there.
  char byte = 0;
  const ssize_t peeked = ::recv(socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    return watch();  // nothing there yet: keep waiting, under the same deadline
  }
  if (exchange_active_) {
    // While answering: either the client closed (end of stream, or an error such as a reset)
    // or it already sent its next request, which stays in the socket until its turn.
    if (peeked > 0) {
      pipelined_ = true;
      return;
    }
    // Gone. With a write under way, its completion decides: the answer may be all in the
    // kernel already (a client that read it and closed was served).
    if (writing_) {
      peer_gone_ = true;
      return;
    }
    return close(CloseReason::kClientGone);
  }
  read_header();
}

void HttpConnection::read_header() {
  parser_ = std::make_unique<http::request_parser<http::string_body>>();
  parser_->header_limit(
      static_cast<std::uint32_t>(std::min<size_t>(context_.options.max_header_bytes, UINT32_MAX)));
  parser_->body_limit(context_.options.max_body_bytes);
  target_.clear();
  arm(HttpTimeout::kHeader, context_.options.header_timeout);
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](const error_code& error, size_t) { self->on_header(error); });
}

void HttpConnection::on_header(const error_code& error) {
  if (closed_) return;
  if (error) return on_read_error(error);
  target_ = std::string(to_std(parser_->get().target()));
  if (parser_->is_done()) return dispatch();
  if (ascii_equal_ignoring_case(to_std(parser_->get()[http::field::expect]), "100-continue")) {
    // The client waits for this before it sends the body (curl does for bodies above 1 KiB).
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    arm(HttpTimeout::kWrite, context_.options.write_timeout);
    net::async_write(socket_, net::buffer(kContinue.data(), kContinue.size()),
                     [self = shared_from_this()](const error_code& write_error, size_t) {
                       if (self->closed_) return;
                       if (write_error) return self->close(CloseReason::kDone);
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void HttpConnection::read_body() {
  arm(HttpTimeout::kBody, context_.options.body_timeout);
  http::async_read(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](const error_code& error, size_t) { self->on_body(error); });
}

void HttpConnection::on_body(const error_code& error) {
  if (closed_) return;
  if (error) return on_read_error(error);
  dispatch();
}

void HttpConnection::on_read_error(const error_code& error) {
  // Beast's parse errors (the http category, but for a stream that ended) get an answer; a
  // client that closed (or reset) between or inside requests gets nothing.
  if (error.category() == http::make_error_code(http::error::bad_target).category() &&
      error != http::error::end_of_stream && error != http::error::partial_message) {
    return refuse(error);
  }
  close(CloseReason::kDone);
}

void HttpConnection::dispatch() {
  disarm();  // no deadline while the service works; writes arm their own
  http::request<http::string_body> message = parser_->release();
  parser_.reset();
  HttpRequest request;
  request.method = std::string(to_std(message.method_string()));
  const std::string_view target = to_std(message.target());
  request.path = std::string(target.substr(0, target.find('?')));
  for (const auto& field : message) {
    request.headers.emplace_back(std::string(to_std(field.name_string())),
                                 std::string(to_std(field.value())));
  }
  request.body = std::move(message.body());
  keep_alive_ = message.keep_alive();
  ++sequence_;
  exchange_active_ = true;
  answer_ = Answer::kPending;
  pipelined_ = buffer_.size() > 0;
  peer_gone_ = false;
  auto exchange = std::make_shared<HttpExchange>(shared_from_this(), sequence_);
  try {
    context_.service.handle(std::move(request), std::move(exchange));
  } catch (const std::exception& exception) {
    log::error("server: a handler threw: {}", exception.what());
    if (answer_ == Answer::kPending) respond(sequence_, context_.service.refusal(500, target_));
  }
  // Watch the socket while the answer is pending, so a client that closes abandons it now
  // rather than at a write that may be minutes away.
  if (!closed_ && exchange_active_ && !watching_ && !pipelined_) watch();
}

void HttpConnection::refuse(const error_code& error) {
  const int status = refusal_status(error);
  parser_.reset();
  HttpResponse response = context_.service.refusal(status, target_);
  ++sequence_;
  exchange_active_ = true;
  answer_ = Answer::kPending;
  keep_alive_ = false;
  lingering_ = true;  // after the answer, drain and close
  respond(sequence_, std::move(response));
}

void HttpConnection::set_on_complete(uint64_t sequence, std::function<void(bool)> callback) {
  on_strand([sequence, callback = std::move(callback)](HttpConnection& self) mutable {
    if (sequence != self.sequence_ || !self.exchange_active_) {
      // Already abandoned (closed before the service got here): tell it now.
      if (sequence == self.sequence_ && callback) callback(false);
      return;
    }
    self.on_complete_ = std::move(callback);
  });
}

void HttpConnection::respond(uint64_t sequence, HttpResponse response) {
  on_strand([sequence, response = std::move(response)](HttpConnection& self) mutable {
    if (sequence != self.sequence_ || !self.exchange_active_ || self.closed_ ||
        self.answer_ != Answer::kPending) {
      return;
    }
    self.answer_ = Answer::kWhole;
    self.output_ = std::make_unique<Output>();
    auto& message = self.output_->whole.emplace(static_cast<http::status>(response.status), 11);
    message.set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) message.set(name, value);
    message.body() = std::move(response.body);
    message.keep_alive(self.keep_alive_ && !self.context_.stopping.load());
    message.prepare_payload();
    self.write_whole();
  });
}

void HttpConnection::begin_stream(uint64_t sequence, HttpResponse head) {
  on_strand([sequence, head = std::move(head)](HttpConnection& self) {
    if (sequence != self.sequence_ || !self.exchange_active_ || self.closed_ ||
        self.answer_ != Answer::kPending) {
      return;
    }
    self.answer_ = Answer::kStream;
    self.output_ = std::make_unique<Output>();
    auto& message = self.output_->stream_head.emplace(static_cast<http::status>(head.status), 11);
    message.set(http::field::content_type, head.content_type);
    for (const auto& [name, value] : head.headers) message.set(name, value);
    message.keep_alive(self.keep_alive_ && !self.context_.stopping.load());
    message.chunked(true);
    self.output_->stream_serializer.emplace(message);
    self.stream_head_written_ = false;
    self.stream_ended_ = false;
    self.pump_stream();
  });
}

void HttpConnection::write(uint64_t sequence, std::string data) {
  if (data.empty()) return;
  on_strand([sequence, data = std::move(data)](HttpConnection& self) {
    if (sequence != self.sequence_ || !self.exchange_active_ || self.closed_ ||
        self.answer_ != Answer::kStream || self.stream_ended_) {
      return;
    }
    self.stream_pending_ += data;
    if (self.stream_pending_.size() > kMaxStreamBacklogBytes) {
      self.context_.metrics.timeouts(HttpTimeout::kWrite).increment();
      return self.close(CloseReason::kClientGone);
    }
    self.pump_stream();
  });
}

void HttpConnection::end_stream(uint64_t sequence) {
  on_strand([sequence](HttpConnection& self) {
    if (sequence != self.sequence_ || !self.exchange_active_ || self.closed_ ||
        self.answer_ != Answer::kStream) {
      return;
    }
    self.stream_ended_ = true;
    self.pump_stream();
  });
}

void HttpConnection::post(std::function<void()> task) {
  net::post(socket_.get_executor(), std::move(task));
}

void HttpConnection::write_whole() {
  writing_ = true;
  arm(HttpTimeout::kWrite, context_.options.write_timeout);
  http::async_write(socket_, *output_->whole,
                    [self = shared_from_this()](const error_code& error, size_t) {
                      self->on_whole_written(error);
                    });
}

void HttpConnection::on_whole_written(const error_code& error) {
  writing_ = false;
  if (closed_) return;
  if (error) return close(CloseReason::kClientGone);
  const bool keep_alive = output_->whole->keep_alive() && !peer_gone_;
  output_.reset();
  finish_exchange(keep_alive);
}

void HttpConnection::pump_stream() {
  if (writing_ || closed_) return;
  auto done = [self = shared_from_this()](bool last) {
    return [self, last](const error_code& error, size_t) { self->on_stream_written(error, last); };
  };
  if (!stream_head_written_) {
    writing_ = true;
    arm(HttpTimeout::kWrite, context_.options.write_timeout);
    http::async_write_header(socket_, *output_->stream_serializer, done(false));
    return;
  }
  if (stream_pending_.empty() && !stream_ended_) {
    disarm();  // waiting for the engine is no write
    return;
  }
  // One chunk with everything queued (and the last chunk when the stream ended), so a slow
  // client gets fewer, larger writes.
  stream_in_flight_.clear();
  if (!stream_pending_.empty()) {
    stream_in_flight_ = fmt::format("{:x}\r\n", stream_pending_.size());
    stream_in_flight_ += stream_pending_;
    stream_in_flight_ += "\r\n";
    stream_pending_.clear();
  }
  const bool last = stream_ended_;
  if (last) stream_in_flight_ += "0\r\n\r\n";
  writing_ = true;
  arm(HttpTimeout::kWrite, context_.options.write_timeout);
  net::async_write(socket_, net::buffer(stream_in_flight_), done(last));
}

void HttpConnection::on_stream_written(const error_code& error, bool last) {
  writing_ = false;
  if (closed_) return;
  if (error) return close(CloseReason::kClientGone);
  if (!stream_head_written_) stream_head_written_ = true;
  if (!last) return peer_gone_ ? close(CloseReason::kClientGone) : pump_stream();
  const bool keep_alive = output_->stream_head->keep_alive() && !peer_gone_;
  output_.reset();
  stream_in_flight_ = std::string();
  stream_pending_ = std::string();
  finish_exchange(keep_alive);
}

void HttpConnection::finish_exchange(bool keep_alive) {
  complete_exchange(/*delivered=*/true);
  if (lingering_) return linger_then_close();
  if (!keep_alive || context_.stopping.load()) {
    error_code ignored;
    socket_.shutdown(net::ip::tcp::socket::shutdown_send, ignored);
    return close(CloseReason::kDone);
  }
  // A buffer the exchange grew is given back while the connection waits (idle connections hold
  // none).
  if (buffer_.size() == 0) buffer_.shrink_to_fit();
  await_request();
}

void HttpConnection::complete_exchange(bool delivered) {
  if (!exchange_active_) return;
  exchange_active_ = false;
  answer_ = Answer::kNone;
  std::function<void(bool)> callback = std::move(on_complete_);
  on_complete_ = nullptr;
  if (callback) callback(delivered);
}

void HttpConnection::arm(HttpTimeout kind, std::chrono::milliseconds timeout) {
  const uint64_t generation = ++deadline_generation_;
  deadline_kind_ = kind;
  timer_.expires_after(timeout);
  timer_.async_wait([self = shared_from_this(), generation](const error_code& error) {
    if (error || self->closed_ || generation != self->deadline_generation_) return;
    if (self->lingering_) return self->close(CloseReason::kDone);
    self->context_.metrics.timeouts(self->deadline_kind_).increment();
    self->close(self->exchange_active_ && self->deadline_kind_ == HttpTimeout::kWrite
                    ? CloseReason::kClientGone
                    : CloseReason::kTimeout);
  });
}

void HttpConnection::disarm() {
  ++deadline_generation_;
  timer_.cancel();
}

void HttpConnection::linger_then_close() {
  error_code ignored;
  socket_.shutdown(net::ip::tcp::socket::shutdown_send, ignored);
  if (!discard_) {
    discard_ = std::make_unique<char[]>(kDiscardBufferBytes);
    arm(HttpTimeout::kBody, kLingerTimeout);
  }
  socket_.async_read_some(net::buffer(discard_.get(), kDiscardBufferBytes),
                          [self = shared_from_this()](const error_code& error, size_t bytes) {
                            if (self->closed_) return;
                            self->discarded_bytes_ += bytes;
                            if (error || self->discarded_bytes_ > kLingerDiscardBytes) {
                              return self->close(CloseReason::kDone);
                            }
                            self->linger_then_close();
                          });
}

void HttpConnection::close(CloseReason reason) {
  if (closed_) return;
  closed_ = true;
  disarm();
  error_code ignored;
  socket_.shutdown(net::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  context_.closed(id_);
  if (exchange_active_) {
    switch (reason) {
      case CloseReason::kClientGone:
      case CloseReason::kTimeout:
        context_.metrics.client_disconnects->increment();
        break;
      case CloseReason::kDone:
      case CloseReason::kServerStopped:
        break;
    }
    complete_exchange(/*delivered=*/false);
  }
  release_buffers();
}

void HttpConnection::release_buffers() {
  // What no cancelled operation refers to; the read buffer, the parser and the message being
  // written are freed with the object once those operations have completed.
  stream_pending_ = std::string();
  target_ = std::string();
}

}  // namespace folio::server
