#include "folio/server/http_listener.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include "folio/base/check.h"
#include "folio/base/log.h"
#include "folio/server/http_connection.h"

namespace folio::server {
namespace {

namespace net = boost::asio;
using boost::system::error_code;
using net::ip::tcp;

// After an accept fails for lack of descriptors (EMFILE, ENFILE), the next try waits this long,
// so the loop does not spin while the process is at its limit.
constexpr std::chrono::milliseconds kAcceptRetryDelay{50};

}  // namespace

// Member order is destruction order reversed: the io_context (and with it every connection a
// pending handler still holds) goes before the context the connections refer to.
struct HttpListener::State {
  State(const HttpListenerOptions& options, HttpService& service, HttpMetrics metrics)
      : context(options, service, metrics),
        io(options.num_io_threads),
        acceptor(net::make_strand(io)),
        retry_timer(acceptor.get_executor()) {}

  void accept();
  void on_accept(const error_code& error, tcp::socket socket);

  HttpConnectionContext context;
  net::io_context io;
  tcp::acceptor acceptor;
  net::steady_timer retry_timer;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::optional<net::thread_pool> blocking;
  uint64_t next_connection_id = 1;  // the acceptor's strand only
  bool out_of_descriptors = false;  // the acceptor's strand only: the last accept hit EMFILE
  bool started = false;
  bool stopped = false;
};

void HttpListener::State::accept() {
  acceptor.async_accept(net::make_strand(io), [this](const error_code& error, tcp::socket socket) {
    on_accept(error, std::move(socket));
  });
}

void HttpListener::State::on_accept(const error_code& error, tcp::socket socket) {
  if (context.stopping.load() || error == net::error::operation_aborted) return;
  if (error) {
    if (error == net::error::no_descriptors || error.value() == ENFILE) {
      // Once per run of failures, not every retry.
      if (!out_of_descriptors) {
        log::warn(
            "server: cannot accept connections: {} (raise the open-file limit, ulimit -n, "
            "or lower max_connections); retrying",
            error.message());
      }
      out_of_descriptors = true;
      retry_timer.expires_after(kAcceptRetryDelay);
      retry_timer.async_wait([this](const error_code& wait_error) {
        if (!wait_error && !context.stopping.load()) accept();
      });
      return;
    }
    log::warn("server: accepting a connection failed: {}", error.message());
    return accept();
  }
  out_of_descriptors = false;
  if (!context.try_open()) {
    context.metrics.connections_refused->increment();
    error_code ignored;
    socket.close(ignored);
    return accept();
  }
  error_code option_error;
  // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds each one
  // until the client's (delayed) ACK, adding tens of milliseconds to every token's latency.
  socket.set_option(tcp::no_delay(true), option_error);
  if (context.options.send_buffer_bytes > 0) {
    socket.set_option(net::socket_base::send_buffer_size(context.options.send_buffer_bytes),
                      option_error);
  }
  std::make_shared<HttpConnection>(std::move(socket), context, next_connection_id++)->start();
  accept();
}

Result<std::unique_ptr<HttpListener>> HttpListener::create(const HttpListenerOptions& options,
                                                           HttpService& service,
                                                           metrics::Registry& registry) {
  if (options.num_io_threads < 1 || options.max_connections < 1 || options.max_header_bytes < 1 ||
      options.max_body_bytes < 1 || options.send_buffer_bytes < 0) {
    return invalid_argument(
        "HTTP limits (io threads, connections, header and body bytes) must be positive");
  }
  for (const std::chrono::milliseconds timeout : {options.idle_timeout, options.header_timeout,
                                                  options.body_timeout, options.write_timeout}) {
    if (timeout.count() <= 0) return invalid_argument("HTTP timeouts must be positive");
  }
  FOLIO_ASSIGN_OR_RETURN(HttpMetrics metrics, HttpMetrics::create(registry));
  return std::unique_ptr<HttpListener>(
      new HttpListener(std::make_unique<State>(options, service, metrics)));
}

HttpListener::HttpListener(std::unique_ptr<State> state) : state_(std::move(state)) {}

HttpListener::~HttpListener() {
  stop(std::chrono::milliseconds(0));
}

Result<int> HttpListener::start(int port) {
  State& state = *state_;
  FOLIO_CHECK(!state.started, "HttpListener::start() called twice");
  error_code error;
  const net::ip::address address = net::ip::make_address(state.context.options.host, error);
  if (error) {
    return invalid_argument("'{}' is not an IP address: {}", state.context.options.host,
                            error.message());
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
  state.acceptor.open(endpoint.protocol(), error);
  if (!error) state.acceptor.set_option(net::socket_base::reuse_address(true), error);
  if (!error) state.acceptor.bind(endpoint, error);
  if (!error) state.acceptor.listen(net::socket_base::max_listen_connections, error);
  if (error) {
    return unavailable("cannot listen on {}:{} ({})", state.context.options.host, port,
                       error.message());
  }
  const int bound = state.acceptor.local_endpoint().port();
  state.started = true;
  state.work.emplace(state.io.get_executor());
  state.blocking.emplace(1);
  net::post(state.acceptor.get_executor(), [&state] { state.accept(); });
  for (int32_t index = 0; index < state.context.options.num_io_threads; ++index) {
    state.threads.emplace_back([&state] {
      for (;;) {
        try {
          state.io.run();
          return;
        } catch (const std::exception& exception) {
          log::error("server: an io handler threw: {}", exception.what());
        }
      }
    });
  }
  return bound;
}

void HttpListener::stop(std::chrono::milliseconds linger) {
  State& state = *state_;
  if (!state.started || state.stopped) return;
  state.stopped = true;
  state.context.stopping.store(true);
  net::post(state.acceptor.get_executor(), [&state] {
    error_code ignored;
    state.acceptor.close(ignored);
    state.retry_timer.cancel();
  });
  for (const std::shared_ptr<HttpConnection>& connection : state.context.open_connections()) {
    connection->close_for_stop();
  }
  if (!state.context.wait_all_closed(linger)) {
    log::warn("server: {} connections still open at stop", state.context.num_open.load());
  }
  state.work.reset();
  state.io.stop();
  for (std::thread& thread : state.threads) thread.join();
  state.threads.clear();
  state.blocking->join();
  // The posted close may not have run before the io_context stopped; no io thread runs now.
  error_code ignored;
  state.acceptor.close(ignored);
}

void HttpListener::run_blocking(std::function<void()> task) {
  FOLIO_CHECK(state_->blocking.has_value(), "run_blocking() before start()");
  net::post(*state_->blocking, std::move(task));
}

int64_t HttpListener::num_connections() const {
  return state_->context.num_open.load();
}

}  // namespace folio::server
