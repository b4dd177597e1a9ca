// The server under concurrent clients over loopback sockets (also run under ThreadSanitizer):
// 32 streaming clients at once each get exactly their non-streamed greedy answer; a client that
// disconnects mid-stream has its request cancelled and its KV blocks freed (seen in /metrics);
// a graceful shutdown lets every request in flight finish.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "folio/server/server.h"
#include "server_test_util.h"

namespace folio::server {
namespace {

using testing::HttpAnswer;
using testing::Json;
using testing::post;

Json request_body(int index, bool chat, bool stream) {
  const std::string text = "Request number " + std::to_string(index) + " says";
  Json body{{"model", "tiny"}, {"max_tokens", 8 + index % 5}, {"temperature", 0}};
  if (chat) {
    body["messages"] = Json::array({{{"role", "user"}, {"content", text}}});
  } else {
    body["prompt"] = text;
  }
  if (stream) body["stream"] = true;
  return body;
}

TEST(ServerConcurrencyTest, ThirtyTwoStreamingClientsEachMatchTheirWholeAnswer) {
  std::unique_ptr<engine::ModelEngine> model_engine = testing::start_tiny_model_engine();
  int port = 0;
  std::unique_ptr<Server> server =
      testing::start_server(serve_model_engine(*model_engine, "tiny"), {}, &port);
  constexpr int kClients = 32;
  std::vector<std::string> whole(kClients);
  for (int index = 0; index < kClients; ++index) {
    const bool chat = index % 2 == 1;
    const HttpAnswer answer = post(port, chat ? "/v1/chat/completions" : "/v1/completions",
                                   request_body(index, chat, false).dump());
    ASSERT_EQ(answer.status, 200) << answer.body;
    const Json choice = answer.json()["choices"][0];
    whole[index] = chat ? choice["message"]["content"] : choice["text"];
  }
  std::vector<HttpAnswer> streamed(kClients);
  std::atomic<int> ready{0};
  std::vector<std::thread> clients;
  const auto start = std::chrono::steady_clock::now();
  for (int index = 0; index < kClients; ++index) {
    clients.emplace_back([&, index] {
      const bool chat = index % 2 == 1;
      // Start together, so the engine batches them.
      ready.fetch_add(1);
      while (ready.load() < kClients) std::this_thread::yield();
      streamed[index] = post(port, chat ? "/v1/chat/completions" : "/v1/completions",
                             request_body(index, chat, true).dump());
    });
  }
  for (std::thread& client : clients) client.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::testing::Test::RecordProperty("streaming_32_clients_ms", static_cast<int>(seconds * 1000));
  for (int index = 0; index < kClients; ++index) {
    SCOPED_TRACE(index);
    ASSERT_EQ(streamed[index].status, 200) << streamed[index].body;
    EXPECT_EQ(testing::streamed_text(streamed[index].body), whole[index]);
  }
  server->shutdown();
  model_engine->engine().stop();
}

// Sends a streaming request over a raw socket, reads until the first event arrives, runs
// `while_streaming`, and closes the connection without reading the rest.
void stream_then_disconnect(int port, const std::string& body,
                            const std::function<void()>& while_streaming) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string received;
  char buffer[4096];
  while (received.find("data: ") == std::string::npos) {
    const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
    ASSERT_GT(got, 0) << "the server closed before the first event";
    received.append(buffer, static_cast<size_t>(got));
  }
  while_streaming();
  ::close(fd);
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

TEST(ServerConcurrencyTest, DisconnectingClientIsCancelledAndItsBlocksFreed) {
  testing::ToyServedEngine toy;
  toy.set_step_delay(std::chrono::milliseconds(2));
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served("tiny"), {}, &port);
  const std::string owned = "folio_engine_kv_blocks{state=\"owned\"}";
  const std::string cancelled = "folio_engine_requests_finished_total{reason=\"cancelled\"}";
  // Idle, the requests own no block (the padding block is its own state; the gauge is updated
  // after each step, so a request's answer can arrive before it: wait for it to settle).
  ASSERT_EQ(post(port, "/v1/completions", request_body(0, false, false).dump()).status, 200);
  ASSERT_EQ(wait_for_metric(port, owned, [](double value) { return value == 0; }), 0);
  EXPECT_EQ(metric(port, "folio_engine_kv_blocks{state=\"padding\"}"), 1);
  Json body = request_body(1, false, true);
  body["max_tokens"] = 100;  // 200 ms or more at 2 ms a step: still running at the disconnect
  stream_then_disconnect(port, body.dump(), [&] {
    EXPECT_GT(wait_for_metric(port, owned, [](double value) { return value > 0; }), 0)
        << "the streaming request holds KV blocks";
  });
  // The next write fails, the request is cancelled, its blocks are freed at the next step.
  EXPECT_EQ(wait_for_metric(port, cancelled, [](double value) { return value >= 1; }), 1);
  EXPECT_EQ(wait_for_metric(port, owned, [](double value) { return value == 0; }), 0);
  EXPECT_EQ(wait_for_metric(port, "folio_server_requests_in_flight",
                            [](double value) { return value == 0; }),
            0);
  // Everyone else is still served.
  EXPECT_EQ(post(port, "/v1/completions", request_body(2, false, false).dump()).status, 200);
  server->shutdown();
}

TEST(ServerConcurrencyTest, GracefulShutdownFinishesRequestsInFlight) {
  testing::ToyServedEngine toy;
  toy.set_step_delay(std::chrono::milliseconds(1));
  int port = 0;
  std::unique_ptr<Server> server = testing::start_server(toy.served("tiny"), {}, &port);
  // Steps wait at the closed gate until every request is in flight and shutdown has begun, so
  // no request can finish early however slowly the clients start (e.g. under TSAN).
  toy.set_gate(false);
  constexpr int kRequests = 6;
  std::vector<HttpAnswer> answers(kRequests);
  std::vector<std::thread> clients;
  for (int index = 0; index < kRequests; ++index) {
    clients.emplace_back([&, index] {
      Json body = request_body(index, index % 3 == 0, index % 2 == 0);
      body["max_tokens"] = 40;
      body["ignore_eos"] = true;  // chat turns also end at the vocabulary's end tokens
      answers[index] =
          post(port, index % 3 == 0 ? "/v1/chat/completions" : "/v1/completions", body.dump());
    });
  }
  while (server->num_in_flight() < kRequests) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::thread shutdown([&] { server->shutdown(std::chrono::seconds(60)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // shutdown is under way
  toy.set_gate(true);
  shutdown.join();
  for (std::thread& client : clients) client.join();
  for (int index = 0; index < kRequests; ++index) {
    SCOPED_TRACE(index);
    ASSERT_EQ(answers[index].status, 200) << answers[index].body;
    if (index % 2 == 0) {
      std::string finish_reason;
      testing::streamed_text(answers[index].body, &finish_reason);
      EXPECT_EQ(finish_reason, "length");
    } else {
      EXPECT_EQ(answers[index].json()["usage"]["completion_tokens"], 40);
    }
  }
  // After shutdown nothing answers.
  EXPECT_EQ(testing::get(port, "/health").status, 0);
}

}  // namespace
}  // namespace folio::server
