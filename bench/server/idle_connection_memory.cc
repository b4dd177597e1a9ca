// folio_server_idle_memory: the front end's memory per held connection, measured as the growth
// of this process's resident set while N client sockets (N = --connections) are held open
// against an HttpListener (http_listener.h) in the same process, divided by N. Two kinds:
// idle sockets (connected, nothing sent: what keep-alive clients and idle connections cost) and
// slow ones (half a request header sent: the parser and read buffer are then allocated).
//
// The clients' sockets are kernel objects, so they add no user-space memory; socket buffers are
// kernel memory too and are not counted (they are bounded by the kernel's per-socket limits).
// Then the latency of a plain request with and without those connections held. Not a timed
// benchmark with baselines: it prints the figures once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "folio/base/metrics.h"
#include "folio/server/http_listener.h"

namespace {

using folio::server::HttpExchange;
using folio::server::HttpRequest;
using folio::server::HttpResponse;

// Answers every request with 200 and an empty JSON object.
class EmptyService final : public folio::server::HttpService {
 public:
  void handle(HttpRequest, std::shared_ptr<HttpExchange> exchange) override {
    HttpResponse response;
    response.body = "{}";
    exchange->respond(std::move(response));
  }
  HttpResponse refusal(int status, std::string_view) override {
    HttpResponse response;
    response.status = status;
    return response;
  }
};

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  int64_t resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    std::perror("connect");
    std::exit(1);
  }
  return fd;
}

void wait_for_connections(const folio::server::HttpListener& listener, int64_t count) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (listener.num_connections() != count) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "only %lld of %lld connections open\n",
                   static_cast<long long>(listener.num_connections()),
                   static_cast<long long>(count));
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Let the io threads finish what the last connections started (a header read's first
  // allocation) before the resident set is read.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

// Opens `count` more connections (sending `greeting` on each) and returns the resident growth
// per connection; they stay open (in `sockets`), so each measurement sees fresh memory rather
// than what earlier connections freed.
double bytes_per_connection(const folio::server::HttpListener& listener, int port, int count,
                            const std::string& greeting, std::vector<int>& sockets) {
  const int64_t before = resident_bytes();
  const size_t first = sockets.size();
  for (int index = 0; index < count; ++index) {
    sockets.push_back(connect_to(port));
    if (!greeting.empty()) {
      (void)::send(sockets.back(), greeting.data(), greeting.size(), MSG_NOSIGNAL);
    }
  }
  wait_for_connections(listener, static_cast<int64_t>(first) + count);
  return static_cast<double>(resident_bytes() - before) / count;
}

// Median and worst latency, in microseconds, of `count` requests, each on a new connection:
// connect, send a whole GET, read until the answer's end.
std::pair<double, double> request_latency_us(int port, int count) {
  std::vector<double> latencies;
  const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  for (int index = 0; index < count; ++index) {
    const auto start = std::chrono::steady_clock::now();
    const int fd = connect_to(port);
    (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    char buffer[1024];
    while (::recv(fd, buffer, sizeof(buffer), 0) > 0) {
    }
    ::close(fd);
    latencies.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(latencies.begin(), latencies.end());
  return {latencies[latencies.size() / 2], latencies.back()};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Memory per held connection of the HTTP front end"};
  int connections = 5000;
  int io_threads = 2;
  app.add_option("--connections", connections, "Connections held at once")->capture_default_str();
  app.add_option("--io-threads", io_threads, "The listener's io threads")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // Each connection costs two descriptors here (the client's and the server's).
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);

  folio::metrics::Registry registry;
  EmptyService service;
  folio::server::HttpListenerOptions options;
  options.num_io_threads = io_threads;
  options.idle_timeout = std::chrono::minutes(10);
  options.header_timeout = std::chrono::minutes(10);
  auto listener = folio::server::HttpListener::create(options, service, registry);
  if (!listener.ok()) {
    std::fprintf(stderr, "%s\n", listener.status().to_string().c_str());
    return 1;
  }
  auto port = (*listener)->start(0);
  if (!port.ok()) {
    std::fprintf(stderr, "%s\n", port.status().to_string().c_str());
    return 1;
  }
  const auto [quiet_median, quiet_worst] = request_latency_us(*port, 200);
  std::vector<int> sockets;
  sockets.reserve(static_cast<size_t>(connections) * 2);  // not the server's memory
  const double idle = bytes_per_connection(**listener, *port, connections, "", sockets);
  const double slow =
      bytes_per_connection(**listener, *port, connections,
                           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-", sockets);
  std::printf("connections held: %d idle, then %d slow more; io threads: %d\n", connections,
              connections, io_threads);
  std::printf("idle connection (nothing sent):   %8.0f bytes each (resident set growth / N)\n",
              idle);
  std::printf("slow connection (half a header):  %8.0f bytes each (resident set growth / N)\n",
              slow);
  const auto [held_median, held_worst] = request_latency_us(*port, 200);
  std::printf(
      "a request (connect, GET, read to close), 200 times: median %.0f us, worst %.0f us "
      "with no other connection; median %.0f us, worst %.0f us with the %d held\n",
      quiet_median, quiet_worst, held_median, held_worst, 2 * connections);
  for (int fd : sockets) ::close(fd);
  (*listener)->stop();
  return 0;
}
