// Recovery (issue 16) from a network partition: one `folio worker` of a PP=2 pipeline runs in a
// network namespace of its own, reached over a veth pair; the other runs beside the coordinator.
// Taking the host's end of the veth down cuts the link silently (packets are dropped, nothing
// answers, no RST: unlike a killed process, whose connection breaks at once). The next step
// waits on the silent stage until the lease gives it up (interval x misses, not the step's 30 s
// deadline), recover() puts a worker spawned beside the coordinator in its place, the steps
// already run are replayed through the lost stage, and every logits row equals the whole model's
// in this process bit for bit. Healed, the old worker's beats reach the coordinator again: they
// are counted as stale, it is told to exit and it does, and later steps stay bit-equal. A last
// test measures the lease's detection times over repeated partitions and prints their p50.
//
// Needs root and iproute2's `ip`; skips (saying why) without them, or where a network namespace
// cannot be made (a container without CAP_NET_ADMIN). Every namespace, veth pair and route it
// makes is removed again, on failure too (NetworkNamespace's destructor).
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "folio/dist/pipeline_step_runner.h"
#include "folio/dist/worker_lease_monitor.h"
#include "pipeline_test_model.h"
#include "process_pipeline.h"
#include "testing/worker_process.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using engine::RunnerRecovery;
using folio::testing::WorkerProcess;
using testing::expect_bit_equal;
using ::testing::HasSubstr;
using testing::ModelOnDisk;
using Clock = std::chrono::steady_clock;

// The pipeline's lease, as in pipeline_recovery_process_test.cc: long enough for a busy survivor
// on a loaded 2-core machine.
using testing::kLeaseInterval;
using testing::kPipelineLeaseMisses;
using testing::ProcessPipeline;
using testing::wait_for;
using testing::WorkerPlacement;
// The detection measurement's lease (the process test measures SIGKILL and SIGSTOP with it).
constexpr int32_t kLeaseMisses = 3;

// iproute2's `ip`, or empty.
std::string find_ip() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// Runs `ip arguments...`: empty when it exited 0, else what it printed (and its status).
std::string run_ip(const std::string& ip, std::vector<std::string> arguments) {
  const std::string command = fmt::format("ip {}", fmt::join(arguments, " "));
  arguments.insert(arguments.begin(), ip);
  folio::testing::ChildProcess child(std::move(arguments), /*capture_output=*/true);
  if (child.pid() <= 0) return command + ": could not be started";
  // Bounded: a hung `ip` is killed by the destructor and reported.
  if (!child.read_to_end(30s)) return command + ": did not finish within 30 s";
  const int status = child.wait();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return fmt::format("{}: exit status {}: {}", command, status, child.output());
}

// A network namespace joined to this one by a veth pair: the first address of a /30 of
// 10.213.0.0/16 on the host's end, the second on the namespace's, loopback up inside. A blackhole
// route for the /30 (behind the link's own) keeps packets for the namespace from leaving by the
// default route while the link is down: they are dropped here, silently. Names and addresses are
// unique per process and instance. Thread-safety: none (the test's thread).
class NetworkNamespace {
 public:
  // The namespace, or null with `why_not` set (whatever was made is removed).
  static std::unique_ptr<NetworkNamespace> create(std::string& why_not) {
    const std::string ip = find_ip();
    if (ip.empty()) {
      why_not = "iproute2's `ip` was not found";
      return nullptr;
    }
    static std::atomic<int> counter{0};
    const int instance = counter.fetch_add(1);
    const auto pid = static_cast<uint32_t>(getpid());
    // 16384 /30 subnets of 10.213.0.0/16.
    const uint32_t subnet = (pid * 16 + static_cast<uint32_t>(instance)) % 16384;
    const std::string prefix = fmt::format("10.213.{}.", subnet / 64);
    const uint32_t base = (subnet % 64) * 4;
    std::unique_ptr<NetworkNamespace> space(new NetworkNamespace(
        ip, fmt::format("folio_partition_{}_{}", pid, instance),
        fmt::format("fpt{}h{}", pid, instance), fmt::format("fpt{}n{}", pid, instance),
        prefix + std::to_string(base + 1), prefix + std::to_string(base + 2),
        fmt::format("{}{}/30", prefix, base)));
    why_not = space->set_up();
    if (!why_not.empty()) return nullptr;  // the destructor removes what was made
    return space;
  }

  ~NetworkNamespace() {
    // Deleting either end deletes the pair; the namespace's end goes with the namespace only
    // once no process is left in it, so the host's end is deleted first.
    if (made_veth_) (void)run_ip(ip_, {"link", "del", host_veth_});
    if (made_route_) (void)run_ip(ip_, {"route", "del", "blackhole", subnet_, "metric", "4000"});
    if (made_namespace_) (void)run_ip(ip_, {"netns", "del", name_});
  }
  NetworkNamespace(const NetworkNamespace&) = delete;
  NetworkNamespace& operator=(const NetworkNamespace&) = delete;

  const std::string& inner_address() const { return inner_address_; }
  // Runs a binary inside the namespace (`ip netns exec` execs it in place).
  std::vector<std::string> launcher() const { return {ip_, "netns", "exec", name_}; }
  // Takes the host's end of the link down (the partition) or up again (healed); empty or why not.
  std::string set_link(bool up) {
    return run_ip(ip_, {"link", "set", host_veth_, up ? "up" : "down"});
  }

 private:
  NetworkNamespace(std::string ip, std::string name, std::string host_veth, std::string inner_veth,
                   std::string host_address, std::string inner_address, std::string subnet)
      : ip_(std::move(ip)),
        name_(std::move(name)),
        host_veth_(std::move(host_veth)),
        inner_veth_(std::move(inner_veth)),
        host_address_(std::move(host_address)),
        inner_address_(std::move(inner_address)),
        subnet_(std::move(subnet)) {}

  // Empty, or the first step that failed.
  std::string set_up() {
    std::string error = run_ip(ip_, {"netns", "add", name_});
    if (!error.empty()) return error;
    made_namespace_ = true;
    error = run_ip(ip_, {"link", "add", host_veth_, "type", "veth", "peer", "name", inner_veth_});
    if (!error.empty()) return error;
    made_veth_ = true;
    error = run_ip(ip_, {"route", "add", "blackhole", subnet_, "metric", "4000"});
    if (!error.empty()) return error;
    made_route_ = true;
    const std::vector<std::vector<std::string>> steps = {
        {"link", "set", inner_veth_, "netns", name_},
        {"addr", "add", host_address_ + "/30", "dev", host_veth_},
        {"link", "set", host_veth_, "up"},
        {"-n", name_, "addr", "add", inner_address_ + "/30", "dev", inner_veth_},
        {"-n", name_, "link", "set", inner_veth_, "up"},
        {"-n", name_, "link", "set", "lo", "up"},
    };
    for (const std::vector<std::string>& step : steps) {
      error = run_ip(ip_, step);
      if (!error.empty()) return error;
    }
    return "";
  }

  const std::string ip_, name_, host_veth_, inner_veth_, host_address_, inner_address_, subnet_;
  bool made_namespace_ = false;
  bool made_veth_ = false;
  bool made_route_ = false;
};

// The namespace, or the reason the test skips.
std::unique_ptr<NetworkNamespace> namespace_or_skip_reason(std::string& reason) {
  if (geteuid() != 0) {
    reason =
        "a network namespace needs root (this test runs as uid " + std::to_string(geteuid()) + ")";
    return nullptr;
  }
  std::unique_ptr<NetworkNamespace> space = NetworkNamespace::create(reason);
  if (space == nullptr) reason = "no network namespace could be made: " + reason;
  return space;
}

// A PP=2 pipeline whose stage `partitioned_stage` runs in the namespace, the other beside the
// coordinator (as do the replacements).
std::function<WorkerPlacement(int32_t)> partitioned_placement(const NetworkNamespace& space,
                                                              int32_t partitioned_stage) {
  return [&space, partitioned_stage](int32_t stage) {
    WorkerPlacement placement;
    if (stage != partitioned_stage) return placement;
    placement.host = space.inner_address();
    placement.launcher = space.launcher();
    // gRPC sets TCP_USER_TIMEOUT on a client's connection to its keepalive timeout (strace
    // shows 5000 ms by default): with that, a partition that outlasts it (a slow recovery on a
    // loaded machine) would drop the connection, and the worker, never heard from again, would
    // not be told to exit. Here the connection outlives any partition of the test.
    placement.client_options.keepalive_timeout = std::chrono::seconds(60);
    return placement;
  };
}

double percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const auto index = static_cast<size_t>(fraction * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

// The parameter: which stage's worker is behind the link.
class PipelinePartitionTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(PipelinePartitionTest, PartitionedWorkerIsReplacedAndToldToExitOnceTheLinkHeals) {
  const int32_t partitioned = GetParam();
  std::string skip_reason;
  const std::unique_ptr<NetworkNamespace> space = namespace_or_skip_reason(skip_reason);
  if (space == nullptr) GTEST_SKIP() << skip_reason;

  const ModelOnDisk model(DType::kF32);
  const std::vector<std::vector<float>> expected =
      testing::reference_logits(model, testing::stage_spec(0, testing::kNumLayers, true));
  const std::vector<folio::testing::PipelineStepArrays> steps = testing::script_steps();
  ProcessPipeline pipeline(model, partitioned_placement(*space, partitioned));
  PipelineStepRunner& runner = pipeline.runner();
  const std::string lost_address = runner.worker_info(partitioned).address;
  ASSERT_THAT(lost_address, HasSubstr(space->inner_address()));
  constexpr size_t kFailingStep = 4;
  constexpr size_t kFirstStepAfterHealing = 7;
  for (size_t index = 0; index < kFailingStep; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }

  // The partition: the next step's call to the stage behind the link gets no answer, nor any
  // error; the lease gives the worker up and cancels the call.
  ASSERT_EQ(space->set_link(false), "");
  const Clock::time_point cut = Clock::now();
  const Result<ir::StepOutput> failed = runner.run(steps[kFailingStep].batch());
  const double waited = std::chrono::duration<double>(Clock::now() - cut).count();
  ASSERT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  const std::string message(failed.status().message());
  EXPECT_THAT(message, HasSubstr(fmt::format("pipeline stage {}", partitioned)));
  EXPECT_THAT(message, HasSubstr(lost_address));
  // The lease, not the step's 30 s deadline nor a broken connection, ended the wait.
  EXPECT_THAT(message, HasSubstr(fmt::format("no lease beat for {} intervals of {} ms",
                                             kPipelineLeaseMisses, kLeaseInterval.count())));
  ASSERT_EQ(runner.recovery_counters().detection_seconds.size(), 1u);
  std::printf(
      "partition of stage %d: the step failed %.1f ms after the link went down; declared lost "
      "%.1f ms after the last beat (lease %d x %lld ms)\n",
      partitioned, waited * 1e3, runner.recovery_counters().detection_seconds.front() * 1e3,
      kPipelineLeaseMisses, static_cast<long long>(kLeaseInterval.count()));

  // Still partitioned: recovery onto a worker spawned beside the coordinator, the steps already
  // run replayed through the lost stage, and the script goes on, bit-equal.
  const Result<RunnerRecovery> recovery = runner.recover(failed.status());
  ASSERT_TRUE(recovery.ok()) << recovery.status();
  EXPECT_EQ(recovery->lost_kv, RunnerRecovery::LostKv::kStageKv);
  EXPECT_EQ(recovery->replay_through_stage, partitioned);
  EXPECT_EQ(runner.epoch(), kFirstEpoch + 1);
  EXPECT_EQ(pipeline.num_processes(), 3u);
  EXPECT_THAT(runner.worker_info(partitioned).address, HasSubstr("127.0.0.1"));
  for (size_t index = 0; index < kFailingStep; ++index) {
    ASSERT_TRUE(runner.replay(steps[index].batch(), recovery->replay_through_stage).ok());
  }
  for (size_t index = kFailingStep; index < kFirstStepAfterHealing; ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }

  // Healed: whatever the old worker sends now cannot change a result (it is fenced by the
  // epoch and no stage calls it), and its beats, stale, get it told to exit.
  ASSERT_EQ(space->set_link(true), "");
  expect_bit_equal(runner.run(steps[kFirstStepAfterHealing].batch()),
                   expected[kFirstStepAfterHealing], kFirstStepAfterHealing);
  WorkerProcess& old_worker = pipeline.worker(static_cast<size_t>(partitioned));
  ASSERT_TRUE(wait_for([&] { return runner.recovery_counters().shutdowns_sent >= 1; }))
      << old_worker.output();
  EXPECT_GE(runner.recovery_counters().stale_beats, 1);
  EXPECT_EQ(runner.recovery_counters().stale_replies, 0);
  EXPECT_TRUE(old_worker.read_to_end(60s)) << old_worker.output();
  const int status = old_worker.wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << old_worker.output();
  EXPECT_THAT(old_worker.output(), HasSubstr("told to exit"));
  for (size_t index = kFirstStepAfterHealing + 1; index < steps.size(); ++index) {
    expect_bit_equal(runner.run(steps[index].batch()), expected[index], index);
  }
  EXPECT_EQ(runner.recovery_counters().workers_lost, 1);
  EXPECT_EQ(runner.recovery_counters().recoveries, 1);
}

INSTANTIATE_TEST_SUITE_P(BothStageOrders, PipelinePartitionTest, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return fmt::format("Stage{}BehindTheLink", info.param);
                         });

// Not a benchmark with a pass mark: every partition must be declared (the flag set, the time
// recorded); the times are printed. Each round leases the worker afresh (a new monitor and
// client), cuts the link once a beat came, waits for the declaration and heals the link.
TEST(PipelinePartitionDetectionTest, DetectionTimesOverRepeatedPartitions) {
  std::string skip_reason;
  const std::unique_ptr<NetworkNamespace> space = namespace_or_skip_reason(skip_reason);
  if (space == nullptr) GTEST_SKIP() << skip_reason;
  std::string address;
  WorkerProcess worker({"--listen", space->inner_address() + ":0"}, "worker", space->launcher());
  address = worker.wait_for_listening(60s);
  ASSERT_FALSE(address.empty()) << worker.output();

  constexpr int kRounds = 10;
  RecoveryStats stats;
  std::vector<double> from_cut;
  for (int round = 0; round < kRounds; ++round) {
    {
      Result<std::unique_ptr<WorkerClient>> client = WorkerClient::connect(address, {});
      ASSERT_TRUE(client.ok()) << client.status();
      std::shared_ptr<WorkerClient> shared = std::move(client).value();
      WorkerLeaseMonitor monitor(
          1, LeaseOptions{.interval = kLeaseInterval, .misses = kLeaseMisses}, stats);
      ASSERT_TRUE(monitor.watch(0, shared, kFirstEpoch).ok());
      ASSERT_TRUE(wait_for([&] { return monitor.beats_received(0) >= 1; }));
      ASSERT_EQ(space->set_link(false), "");
      const Clock::time_point cut = Clock::now();
      ASSERT_TRUE(wait_for([&] { return monitor.lost(0); }));
      from_cut.push_back(std::chrono::duration<double>(Clock::now() - cut).count());
      ASSERT_TRUE(shared->abandoned());
    }  // the lease ends (its stream cancelled) before the link heals: no stale beat, no Shutdown
    ASSERT_EQ(space->set_link(true), "");
  }
  const std::vector<double> from_beat = stats.snapshot().detection_seconds;
  ASSERT_EQ(from_beat.size(), static_cast<size_t>(kRounds));
  std::printf(
      "partition x %d (lease %d x %lld ms): declared lost after the link went down p50 %.1f ms "
      "max %.1f ms; after the last beat p50 %.1f ms max %.1f ms\n",
      kRounds, kLeaseMisses, static_cast<long long>(kLeaseInterval.count()),
      percentile(from_cut, 0.5) * 1e3, percentile(from_cut, 1.0) * 1e3,
      percentile(from_beat, 0.5) * 1e3, percentile(from_beat, 1.0) * 1e3);
  // The worker is still serving: the partitions were the link's, not the process's.
  Result<std::unique_ptr<WorkerClient>> after = WorkerClient::connect(address, {});
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE((*after)->ping().ok());
}

}  // namespace
}  // namespace folio::dist
