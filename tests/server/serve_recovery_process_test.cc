// `folio serve` over local worker processes (the real binary and its real workers) losing a
// worker while streams decode (issue 16): every stream completes with exactly the text the same
// request gets from a server that runs every layer itself, through one recovery; the metrics say
// so and /health answers 200 again. The chaos case kills a random worker every few steps, several
// times, under load. With every worker gone and none to take their place the server answers 503
// and comes back when a worker does.
#include <dirent.h>
#include <signal.h>
#include <sys/types.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server_test_util.h"
#include "testing/child_process.h"
#include "testing/worker_process.h"

namespace folio::server::testing {
namespace {

using namespace std::chrono_literals;

const std::string kModel = std::string(FOLIO_SOURCE_DIR) + "/models/demo/kjv-f16.gguf";

// A `folio serve` process on a free port.
class ServeProcess : public folio::testing::ChildProcess {
 public:
  explicit ServeProcess(std::vector<std::string> extra)
      : ChildProcess(arguments(std::move(extra)), /*capture_output=*/true) {}

  // The port of its "listening on http://HOST:PORT" line; 0 if it ended or printed none in time.
  int wait_for_port(std::chrono::milliseconds timeout) {
    int port = 0;
    read_until(timeout, [&](const std::string& text) {
      const std::string marker = "listening on http://127.0.0.1:";
      const size_t found = text.find(marker);
      if (found == std::string::npos) return false;
      const size_t start = found + marker.size();
      size_t end = start;
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      if (end == start || end == text.size()) return false;
      port = std::stoi(text.substr(start, end - start));
      return true;
    });
    return port;
  }

 private:
  static std::vector<std::string> arguments(std::vector<std::string> extra) {
    std::vector<std::string> all = {FOLIO_BINARY_PATH, "serve", "-m",        kModel,
                                    "--port",          "0",     "--threads", "1",
                                    "--model-name",    "demo"};
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  }
};

// The processes whose parent is `parent` (its local workers), from /proc/*/stat.
std::vector<pid_t> child_processes(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return children;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 1));
    char state = 0;
    pid_t parent_pid = 0;
    rest >> state >> parent_pid;
    if (parent_pid == parent && state != 'Z') children.push_back(pid);
  }
  closedir(proc);
  std::sort(children.begin(), children.end());
  return children;
}

// Eight completions: greedy and seeded sampling, four prompts.
std::vector<Json> completion_requests(int count) {
  const std::vector<std::string> prompts = {"In the beginning", "And God said",
                                            "The LORD is my shepherd", "Blessed are the"};
  std::vector<Json> requests;
  for (int index = 0; index < count; ++index) {
    Json request = {{"model", "demo"},
                    {"prompt", prompts[static_cast<size_t>(index) % prompts.size()]},
                    {"max_tokens", 64},
                    {"stream", true}};
    if (index % 2 == 0) {
      request["temperature"] = 0;
    } else {
      request["temperature"] = 0.9;
      request["top_p"] = 0.95;
      request["seed"] = 1000 + index;
    }
    requests.push_back(std::move(request));
  }
  return requests;
}

// Streams every request at once. `on_progress(chunks)` is called with the events each stream
// has received so far (finished streams count as many as any threshold) whenever one arrives,
// from the streams' threads.
struct StreamRound {
  std::vector<std::string> bodies;
  std::vector<int> statuses;
};
StreamRound stream_all(int port, const std::vector<Json>& requests,
                       const std::function<void(const std::vector<int>&)>& on_progress = {}) {
  StreamRound round;
  round.bodies.resize(requests.size());
  round.statuses.resize(requests.size());
  std::mutex mutex;
  std::vector<int> chunks(requests.size(), 0);
  std::vector<std::thread> threads;
  for (size_t index = 0; index < requests.size(); ++index) {
    threads.emplace_back([&, index] {
      httplib::Client http("127.0.0.1", port);
      http.set_read_timeout(std::chrono::seconds(120));
      httplib::Request request;
      request.method = "POST";
      request.path = "/v1/completions";
      request.body = requests[index].dump();
      request.set_header("Content-Type", "application/json");
      std::string& body = round.bodies[index];
      request.content_receiver = [&, index](const char* data, size_t length, uint64_t, uint64_t) {
        body.append(data, length);
        std::vector<int> snapshot;
        {
          const std::lock_guard<std::mutex> lock(mutex);
          ++chunks[index];
          snapshot = chunks;
        }
        if (on_progress) on_progress(snapshot);
        return true;
      };
      httplib::Result result = http.send(request);
      {
        const std::lock_guard<std::mutex> lock(mutex);
        round.statuses[index] = result ? result->status : 0;
        chunks[index] = 1 << 20;  // done: past any threshold
      }
      if (on_progress) {
        std::vector<int> snapshot;
        {
          const std::lock_guard<std::mutex> lock(mutex);
          snapshot = chunks;
        }
        on_progress(snapshot);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return round;
}

// The texts a server that runs every layer itself gives `requests`.
std::vector<std::string> reference_texts(const std::vector<Json>& requests) {
  ServeProcess alone({});
  const int port = alone.wait_for_port(60s);
  EXPECT_GT(port, 0) << alone.output();
  const StreamRound round = stream_all(port, requests);
  std::vector<std::string> texts;
  for (size_t index = 0; index < requests.size(); ++index) {
    EXPECT_EQ(round.statuses[index], 200) << round.bodies[index];
    texts.push_back(streamed_text(round.bodies[index]));
    EXPECT_FALSE(texts.back().empty());
  }
  return texts;
}

double metric(int port, const std::string& series) {
  const HttpAnswer answer = get(port, "/metrics");
  EXPECT_EQ(answer.status, 200);
  const std::optional<double> value = metric_value(answer.body, series);
  EXPECT_TRUE(value.has_value()) << series << " missing in\n" << answer.body;
  return value.value_or(-1);
}

// `recovery`: --recovery replay (the lost stage's lineage only) or recompute (every layer).
void kill_a_worker_mid_decode(const std::string& recovery) {
  const std::vector<Json> requests = completion_requests(8);
  const std::vector<std::string> expected = reference_texts(requests);

  // A long lease: only the kill may count as a loss, however loaded the machine.
  ServeProcess served({"--local-workers", "2", "--local-worker-threads", "1", "--lease-misses",
                       "20", "--recovery", recovery});
  const int port = served.wait_for_port(120s);
  ASSERT_GT(port, 0) << served.output();
  const std::vector<pid_t> workers = child_processes(served.pid());
  ASSERT_EQ(workers.size(), 2u) << served.output();

  // Killed once every stream has its first tokens (or ended): mid-decode for all of them.
  std::atomic<bool> killed{false};
  const StreamRound round = stream_all(port, requests, [&](const std::vector<int>& chunks) {
    for (int received : chunks) {
      if (received < 3) return;
    }
    if (!killed.exchange(true)) kill(workers[1], SIGKILL);
  });
  ASSERT_TRUE(killed.load());
  for (size_t index = 0; index < requests.size(); ++index) {
    EXPECT_EQ(round.statuses[index], 200) << round.bodies[index];
    std::string finish_reason;
    EXPECT_EQ(streamed_text(round.bodies[index], &finish_reason), expected[index])
        << "request " << index << " (" << requests[index].dump() << ")";
  }
  EXPECT_EQ(metric(port, "folio_dist_recoveries_total"), 1);
  EXPECT_EQ(metric(port, "folio_dist_recovery_failures_total"), 0);
  EXPECT_GE(metric(port, "folio_dist_requests_recovered_total"), 1);
  EXPECT_EQ(metric(port, "folio_dist_epoch"), 2);
  EXPECT_EQ(get(port, "/health").status, 200);
  // The replacement took the lost worker's place.
  const std::vector<pid_t> now = child_processes(served.pid());
  EXPECT_EQ(now.size(), 2u);
  EXPECT_EQ(std::count(now.begin(), now.end(), workers[1]), 0);
}

TEST(ServeRecoveryProcessTest, AWorkerKilledMidDecodeLosesNoStreamAndChangesNoText) {
  kill_a_worker_mid_decode("replay");
}
TEST(ServeRecoveryProcessTest, RecomputingInsteadOfReplayingGivesTheSameTexts) {
  kill_a_worker_mid_decode("recompute");
}

// Chaos: a random worker killed every 5 steps, 4 times, while 16 streams run: no request lost,
// no token lost or repeated (each text equals the reference), no recovery failed.
TEST(ServeRecoveryProcessTest, KillingRandomWorkersUnderLoadChangesNoText) {
  const std::vector<Json> requests = completion_requests(16);
  const std::vector<std::string> expected = reference_texts(requests);

  ServeProcess served({"--local-workers", "2", "--local-worker-threads", "1",
                       "--kill-local-worker-every", "5", "--kill-rounds", "4", "--kill-seed", "7",
                       "--max-recoveries", "8"});
  const int port = served.wait_for_port(120s);
  ASSERT_GT(port, 0) << served.output();
  const StreamRound round = stream_all(port, requests);
  for (size_t index = 0; index < requests.size(); ++index) {
    EXPECT_EQ(round.statuses[index], 200) << round.bodies[index];
    EXPECT_EQ(streamed_text(round.bodies[index]), expected[index])
        << "request " << index << " (" << requests[index].dump() << ")";
  }
  EXPECT_GE(metric(port, "folio_dist_recoveries_total"), 1);
  EXPECT_EQ(metric(port, "folio_dist_recovery_failures_total"), 0);
  EXPECT_EQ(get(port, "/health").status, 200);
}

// A `folio worker` process on `listen` (HOST:PORT; port 0: any free one).
std::unique_ptr<folio::testing::WorkerProcess> start_worker(const std::string& listen) {
  return std::make_unique<folio::testing::WorkerProcess>(
      std::vector<std::string>{"--listen", listen, "-m", kModel, "--threads", "1"});
}

// Every worker gone, with no replacement: the request in flight ends with an error, /health and
// new requests answer 503, the server stays up, and once a worker listens at the address again
// the engine's loop re-forms the pipeline and serves the same text as before.
TEST(ServeRecoveryProcessTest, WithEveryWorkerGoneItAnswers503AndRecoversWhenOneReturns) {
  const std::vector<Json> requests = completion_requests(1);
  const std::vector<std::string> expected = reference_texts(requests);
  Json plain = requests[0];
  plain["stream"] = false;

  std::unique_ptr<folio::testing::WorkerProcess> worker = start_worker("127.0.0.1:0");
  const std::string address = worker->wait_for_listening(60s);
  ASSERT_FALSE(address.empty()) << worker->output();
  ServeProcess served({"--workers", address, "--lease-misses", "20"});
  const int port = served.wait_for_port(120s);
  ASSERT_GT(port, 0) << served.output();
  HttpAnswer answer = post(port, "/v1/completions", plain.dump());
  ASSERT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(answer.json()["choices"][0]["text"], expected[0]);
  EXPECT_EQ(get(port, "/health").status, 200);

  worker->signal(SIGKILL);
  worker->wait();
  worker.reset();
  answer = post(port, "/v1/completions", plain.dump());
  EXPECT_EQ(answer.status, 503) << answer.body;
  EXPECT_EQ(get(port, "/health").status, 503);
  answer = post(port, "/v1/completions", plain.dump());
  EXPECT_EQ(answer.status, 503) << answer.body;
  EXPECT_GE(metric(port, "folio_dist_recovery_failures_total"), 1);

  // The same address again (the loop retries recover() every second).
  const std::unique_ptr<folio::testing::WorkerProcess> returned = start_worker(address);
  ASSERT_EQ(returned->wait_for_listening(60s), address) << returned->output();
  int health = 0;
  for (int attempt = 0; attempt < 300 && health != 200; ++attempt) {
    health = get(port, "/health").status;
    if (health != 200) std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(health, 200);
  answer = post(port, "/v1/completions", plain.dump());
  ASSERT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(answer.json()["choices"][0]["text"], expected[0]);
}

}  // namespace
}  // namespace folio::server::testing
