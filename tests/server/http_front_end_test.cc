// The event-driven HTTP front end over loopback sockets (also run under ThreadSanitizer): a
// good request is answered while thousands of idle and slow connections are held open; a client
// that never finishes its header, or never begins a request, is closed after its timeout; a
// streaming client that stops reading is dropped after the write timeout and its request
// cancelled; a non-streamed request whose client closes is cancelled; connections above the
// limit are closed at once; keep-alive serves several requests on one connection.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "folio/server/server.h"
#include "server_test_util.h"

namespace folio::server {
namespace {

using testing::HttpAnswer;
using testing::Json;
using testing::post;

// Connections held open while a good request is served (the fd limit here is 20,000; each
// connection costs two descriptors in this process, the client's and the server's).
constexpr int kSlowHeaderConnections = 1000;
constexpr int kSlowBodyConnections = 500;
constexpr int kIdleConnections = 500;

// A client socket (closed on destruction).
class RawClient {
 public:
  // `receive_buffer_bytes` > 0: SO_RCVBUF, set before connecting so the window is small.
  explicit RawClient(int port, int receive_buffer_bytes = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd_, 0);
    if (receive_buffer_bytes > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer_bytes, sizeof(receive_buffer_bytes));
    }
    // Every receive below is bounded: a server that never answers fails the test, not hangs it.
    timeval timeout{};
    timeout.tv_sec = 20;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    EXPECT_TRUE(connected_) << std::strerror(errno);
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool send(std::string_view bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // True when the server closed the connection (end of stream or reset) before 20 s passed.
  bool closed_by_server() {
    char buffer[4096];
    for (;;) {
      const ssize_t got = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (got == 0) return true;
      if (got < 0) return errno == ECONNRESET;
    }
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string completion_request(const std::string& body) {
  return fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: {}\r\n\r\n{}",
      body.size(), body);
}

double metric(int port, const std::string& series) {
  return testing::metric_value(testing::get(port, "/metrics").body, series).value_or(-1);
}

// Polls `series` until `done(value)` or 20 s pass; returns the last value.
double wait_for_metric(int port, const std::string& series,
                       const std::function<bool(double)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  double value = metric(port, series);
  while (!done(value) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    value = metric(port, series);
  }
  return value;
}

// Polls until `done()` or 20 s pass; returns done().
bool wait_until(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return done();
}

const std::string kCancelled = "folio_engine_requests_finished_total{reason=\"cancelled\"}";

TEST(HttpFrontEndTest, GoodRequestIsAnsweredAmongThousandsOfIdleAndSlowConnections) {
  testing::ToyServedEngine toy;
  ServerOptions options;
  // Long enough that a server which waited on the slow clients would hold the good requests
  // past their own 20 s bound: the test then fails instead of passing slowly.
  options.header_timeout = std::chrono::seconds(60);
  options.body_timeout = std::chrono::seconds(60);
  options.idle_timeout = std::chrono::seconds(60);
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), options, &port);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int index = 0; index < kSlowHeaderConnections; ++index) {
    held.push_back(std::make_unique<RawClient>(port));
    ASSERT_TRUE(held.back()->send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-"));
  }
  for (int index = 0; index < kSlowBodyConnections; ++index) {
    held.push_back(std::make_unique<RawClient>(port));
    ASSERT_TRUE(held.back()->send(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"mod"));
  }
  for (int index = 0; index < kIdleConnections; ++index) {
    held.push_back(std::make_unique<RawClient>(port));
  }
  const int64_t num_held = kSlowHeaderConnections + kSlowBodyConnections + kIdleConnections;
  ASSERT_TRUE(wait_until([&] { return server->num_connections() >= num_held; }))
      << server->num_connections();
  const std::string body =
      Json{{"model", "toy"}, {"prompt", "hello"}, {"max_tokens", 8}, {"temperature", 0}}.dump();
  // At most 20 s each, a third of the slow clients' timeouts.
  const auto bounded_post = [&](const std::string& request_body) -> HttpAnswer {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(std::chrono::seconds(20));
    client.set_read_timeout(std::chrono::seconds(20));
    httplib::Result result = client.Post("/v1/completions", request_body, "application/json");
    if (!result) return {0, httplib::to_string(result.error())};
    return {result->status, result->body};
  };
  const HttpAnswer whole = bounded_post(body);
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(whole.json()["usage"]["completion_tokens"], 8);
  Json streamed_body = Json::parse(body);
  streamed_body["stream"] = true;
  const HttpAnswer streamed = bounded_post(streamed_body.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(testing::streamed_text(streamed.body), whole.json()["choices"][0]["text"]);
  // The slow clients are still held, not dropped to make room.
  EXPECT_GE(server->num_connections(), num_held);
  held.clear();
  EXPECT_TRUE(wait_until([&] { return server->num_connections() == 0; }));
  server->shutdown();
}

TEST(HttpFrontEndTest, UnfinishedHeaderAndSilentClientAreClosedAfterTheirTimeouts) {
  testing::ToyServedEngine toy;
  ServerOptions options;
  options.header_timeout = std::chrono::milliseconds(100);
  options.idle_timeout = std::chrono::milliseconds(100);
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), options, &port);
  RawClient unfinished(port);
  ASSERT_TRUE(unfinished.send("GET /health HTTP/1.1\r\nHost: 127."));
  EXPECT_TRUE(unfinished.closed_by_server());
  RawClient silent(port);
  EXPECT_TRUE(silent.closed_by_server());
  EXPECT_EQ(metric(port, "folio_server_timeouts_total{kind=\"header\"}"), 1);
  EXPECT_GE(metric(port, "folio_server_timeouts_total{kind=\"idle\"}"), 1);
  // A client that finishes in time is served.
  EXPECT_EQ(testing::get(port, "/health").status, 200);
  server->shutdown();
}

TEST(HttpFrontEndTest, StreamingClientThatStopsReadingIsDroppedAndItsRequestCancelled) {
  testing::ToyServedEngine toy(nullptr, /*max_context_tokens=*/1024);
  toy.set_step_delay(std::chrono::milliseconds(1));
  ServerOptions options;
  options.write_timeout = std::chrono::milliseconds(200);
  options.send_buffer_bytes = 4096;  // small socket buffers fill after a few dozen tokens
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), options, &port);
  RawClient stalled(port, /*receive_buffer_bytes=*/2048);
  // 1000 tokens at 1 ms or more a step: still generating long after the buffers are full.
  ASSERT_TRUE(stalled.send(completion_request(
      Json{{"model", "toy"}, {"prompt", "hello"}, {"max_tokens", 1000}, {"stream", true}}.dump())));
  EXPECT_EQ(wait_for_metric(port, "folio_server_timeouts_total{kind=\"write\"}",
                            [](double value) { return value >= 1; }),
            1);
  EXPECT_EQ(wait_for_metric(port, kCancelled, [](double value) { return value >= 1; }), 1);
  EXPECT_EQ(metric(port, "folio_server_client_disconnects_total"), 1);
  EXPECT_EQ(wait_for_metric(port, "folio_server_requests_in_flight",
                            [](double value) { return value == 0; }),
            0);
  EXPECT_TRUE(stalled.closed_by_server());
  server->shutdown();
}

TEST(HttpFrontEndTest, NonStreamedRequestWhoseClientClosesIsCancelled) {
  testing::ToyServedEngine toy(nullptr, /*max_context_tokens=*/1024);
  toy.set_step_delay(std::chrono::milliseconds(2));
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), {}, &port);
  {
    RawClient leaving(port);
    // 1000 tokens at 2 ms or more a step: seconds, unless it is cancelled.
    ASSERT_TRUE(leaving.send(completion_request(
        Json{{"model", "toy"}, {"prompt", "hello"}, {"max_tokens", 1000}}.dump())));
    ASSERT_TRUE(wait_until([&] { return server->num_in_flight() == 1; }));
  }
  EXPECT_EQ(wait_for_metric(port, kCancelled, [](double value) { return value >= 1; }), 1);
  EXPECT_EQ(metric(port, "folio_server_client_disconnects_total"), 1);
  EXPECT_TRUE(wait_until([&] { return server->num_in_flight() == 0; }));
  // Everyone else is still served.
  EXPECT_EQ(
      post(port, "/v1/completions", R"({"model": "toy", "prompt": "hi", "max_tokens": 2})").status,
      200);
  server->shutdown();
}

TEST(HttpFrontEndTest, ConnectionsAboveTheLimitAreClosedAtOnce) {
  testing::ToyServedEngine toy;
  ServerOptions options;
  options.max_connections = 3;
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), options, &port);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int index = 0; index < 3; ++index) held.push_back(std::make_unique<RawClient>(port));
  ASSERT_TRUE(wait_until([&] { return server->num_connections() == 3; }));
  RawClient refused(port);
  EXPECT_TRUE(refused.closed_by_server());
  held.pop_back();  // room for the metrics request
  ASSERT_TRUE(wait_until([&] { return server->num_connections() == 2; }));
  EXPECT_EQ(metric(port, "folio_server_connections_refused_total"), 1);
  server->shutdown();
}

TEST(HttpFrontEndTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  testing::ToyServedEngine toy;
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served(), {}, &port);
  std::unique_ptr<httplib::Client> client = testing::client(port);
  client->set_keep_alive(true);
  const std::string body = R"({"model": "toy", "prompt": "hi", "max_tokens": 3})";
  for (int index = 0; index < 3; ++index) {
    httplib::Result result = client->Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(result) << httplib::to_string(result.error());
    EXPECT_EQ(result->status, 200);
    httplib::Result health = client->Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
  httplib::Result metrics = client->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(testing::metric_value(metrics->body, "folio_server_connections_accepted_total"), 1);
  server->shutdown();
}

}  // namespace
}  // namespace folio::server
