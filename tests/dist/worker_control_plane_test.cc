// The control plane in one process: a WorkerService on loopback (port 0) and WorkerClients
// that connect to it. What the handshake reports is checked against what the service was told
// to declare; every refusal against the message a user needs to act on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

WorkerServiceOptions declared_options() {
  WorkerServiceOptions options;
  options.memory_budget_bytes = uint64_t{48} << 30;
  options.threads = 7;
  options.model = ModelIdentity{.hash = "fnv1a64:0123456789abcdef", .name = "tiny"};
  return options;
}

std::unique_ptr<WorkerService> start_service(WorkerServiceOptions options) {
  auto service = WorkerService::start(std::move(options));
  EXPECT_TRUE(service.ok()) << service.status();
  return service.ok() ? std::move(*service) : nullptr;
}

TEST(WorkerControlPlaneTest, HandshakeReportsWhatTheWorkerDeclared) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  EXPECT_GT(service->port(), 0);
  EXPECT_NE(service->incarnation(), 0u);
  auto client = WorkerClient::connect(service->address(), declared_options().model);
  ASSERT_TRUE(client.ok()) << client.status();
  const WorkerInfo& info = (*client)->info();
  EXPECT_EQ(info.address, service->address());
  EXPECT_EQ(info.protocol_version, kProtocolVersion);
  EXPECT_EQ(info.incarnation, service->incarnation());
  EXPECT_EQ(info.memory_budget_bytes, uint64_t{48} << 30);
  EXPECT_EQ(info.threads, 7u);
  EXPECT_FALSE(info.host_name.empty());
  EXPECT_EQ(info.model.hash, "fnv1a64:0123456789abcdef");
  EXPECT_EQ(info.model.name, "tiny");
}

TEST(WorkerControlPlaneTest, TwoServicesAreTwoIncarnations) {
  auto first = start_service(declared_options());
  auto second = start_service(declared_options());
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(first->incarnation(), second->incarnation());
  EXPECT_NE(first->port(), second->port());
}

TEST(WorkerControlPlaneTest, WorkerOfAnotherProtocolVersionIsRefusedNamingBoth) {
  WorkerServiceOptions options = declared_options();
  options.protocol_version = kProtocolVersion + 1;
  auto service = start_service(options);
  ASSERT_NE(service, nullptr);
  auto client = WorkerClient::connect(service->address(), {});
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition);
  const std::string message(client.status().message());
  EXPECT_THAT(message, HasSubstr("worker " + service->address()));
  EXPECT_THAT(message, HasSubstr(fmt::format("protocol v{}", kProtocolVersion + 1)));
  EXPECT_THAT(message, HasSubstr(fmt::format("coordinator v{}", kProtocolVersion)));
}

TEST(WorkerControlPlaneTest, CoordinatorOfAnotherProtocolVersionIsRefusedNamingBoth) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  WorkerClientOptions options;
  options.protocol_version = kProtocolVersion + 1;
  auto client = WorkerClient::connect(service->address(), {}, options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition);
  const std::string message(client.status().message());
  EXPECT_THAT(message, HasSubstr(fmt::format("protocol v{}", kProtocolVersion)));
  EXPECT_THAT(message, HasSubstr(fmt::format("coordinator v{}", kProtocolVersion + 1)));
}

TEST(WorkerControlPlaneTest, WorkerWithAnotherModelIsRefusedNamingBothHashes) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  const ModelIdentity coordinator_model{.hash = "fnv1a64:fedcba9876543210", .name = "other"};
  auto client = WorkerClient::connect(service->address(), coordinator_model);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kFailedPrecondition);
  const std::string message(client.status().message());
  EXPECT_THAT(message, HasSubstr("worker " + service->address()));
  EXPECT_THAT(message, HasSubstr("has model hash fnv1a64:0123456789abcdef"));
  EXPECT_THAT(message, HasSubstr("the coordinator's model is fnv1a64:fedcba9876543210"));
}

TEST(WorkerControlPlaneTest, WorkerWithoutModelIsAccepted) {
  WorkerServiceOptions options = declared_options();
  options.model = {};
  auto service = start_service(options);
  ASSERT_NE(service, nullptr);
  auto client = WorkerClient::connect(service->address(), declared_options().model);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->info().model.hash.empty());
}

TEST(WorkerControlPlaneTest, UnreachableAddressFailsWithinTheDeadlineNamingTheCause) {
  // A port that was just free: bound by a service, which is then shut down.
  std::string address;
  {
    auto service = start_service(declared_options());
    ASSERT_NE(service, nullptr);
    address = service->address();
  }
  WorkerClientOptions options;
  options.connect_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  auto client = WorkerClient::connect(address, {}, options);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  const std::string message(client.status().message());
  EXPECT_THAT(message, HasSubstr("worker " + address + " is unreachable (connection refused)"));
  EXPECT_THAT(message, HasSubstr("after 300 ms"));
  // Bounded by the deadline (plus the 200 ms probe for the cause), not by gRPC's default of
  // none; the margin is for a loaded machine.
  EXPECT_LT(elapsed, 10s);
}

TEST(WorkerControlPlaneTest, PingMeasuresTheLinkAndChecksTheIncarnation) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  auto client = WorkerClient::connect(service->address(), {});
  ASSERT_TRUE(client.ok()) << client.status();
  auto latency = (*client)->measure_latency(9);
  ASSERT_TRUE(latency.ok()) << latency.status();
  EXPECT_EQ(latency->count, 9);
  EXPECT_GT(latency->min.count(), 0);
  EXPECT_LE(latency->min, latency->median);
  EXPECT_LE(latency->median, latency->max);
}

TEST(WorkerControlPlaneTest, PingPayloadsMeasureTheBandwidthAndAreBounded) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  auto client = WorkerClient::connect(service->address(), {});
  ASSERT_TRUE(client.ok()) << client.status();
  // The client checks that the reply carried the bytes it asked for.
  ASSERT_TRUE((*client)->ping(300 << 10).ok());
  auto link = (*client)->measure_link(3);
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->bandwidth.payload_bytes, kLinkProbeBytes);
  EXPECT_EQ(link->bandwidth.count, 3);
  EXPECT_GT(link->bandwidth.bytes_per_second, 0);
  // The estimated transfer time grows with the bytes moved.
  EXPECT_GT(link->transfer_seconds(64 << 20), link->transfer_seconds(1 << 10));
  // Over the limit: refused by the client before sending, and by the worker if asked.
  auto too_big = (*client)->ping(static_cast<int64_t>(kMaxPingPayloadBytes) + 1);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_big.status().message()), HasSubstr("outside [0, 67108864]"));
  // The link still works after a refusal.
  EXPECT_TRUE((*client)->ping().ok());
}

TEST(WorkerControlPlaneTest, ServiceGoneAfterTheHandshakeFailsTheNextCall) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  auto client = WorkerClient::connect(service->address(), {});
  ASSERT_TRUE(client.ok()) << client.status();
  service->shutdown(0ms);
  service.reset();
  auto round_trip = (*client)->ping();
  ASSERT_FALSE(round_trip.ok());
  EXPECT_EQ(round_trip.status().code(), StatusCode::kUnavailable) << round_trip.status();
  EXPECT_THAT(std::string(round_trip.status().message()), HasSubstr("is gone"));
}

TEST(WorkerControlPlaneTest, RestartedWorkerAtTheSameAddressIsAnotherIncarnation) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  const std::string address = service->address();
  auto client = WorkerClient::connect(address, {});
  ASSERT_TRUE(client.ok()) << client.status();
  service.reset();
  WorkerServiceOptions options = declared_options();
  options.listen_address = address;
  service = start_service(options);
  ASSERT_NE(service, nullptr);
  // The channel reconnects to the new incarnation, which the Ping reply reveals; until it has,
  // pings fail as unavailable (fail fast), so try a bounded number of times.
  Result<std::chrono::nanoseconds> round_trip = (*client)->ping();
  for (int attempt = 0;
       attempt < 100 && !round_trip.ok() && round_trip.status().code() == StatusCode::kUnavailable;
       ++attempt) {
    std::this_thread::sleep_for(50ms);
    round_trip = (*client)->ping();
  }
  ASSERT_FALSE(round_trip.ok());
  EXPECT_EQ(round_trip.status().code(), StatusCode::kFailedPrecondition) << round_trip.status();
  EXPECT_THAT(std::string(round_trip.status().message()), HasSubstr("restarted"));
}

TEST(WorkerControlPlaneTest, PortInUseIsUnavailable) {
  auto service = start_service(declared_options());
  ASSERT_NE(service, nullptr);
  WorkerServiceOptions options = declared_options();
  options.listen_address = service->address();
  auto second = WorkerService::start(options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(service->address()));
}

TEST(WorkerControlPlaneTest, MalformedListenAddressIsInvalid) {
  for (const std::string address : {"127.0.0.1", "127.0.0.1:", ":5555", "host:12x"}) {
    WorkerServiceOptions options = declared_options();
    options.listen_address = address;
    auto service = WorkerService::start(options);
    ASSERT_FALSE(service.ok()) << address;
    EXPECT_EQ(service.status().code(), StatusCode::kInvalidArgument) << address;
  }
}

}  // namespace
}  // namespace folio::dist
