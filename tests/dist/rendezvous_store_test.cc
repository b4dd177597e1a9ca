// The rendezvous store served over gRPC (rendezvous_store.h, protocol revision 9): the store
// itself (set, wait, the timeout naming the missing keys, scopes of group and epoch, dropping old
// epochs, closing), the same calls through a WorkerService on loopback with
// RendezvousStoreClient (a worker that cannot be reached; a Fence into a newer epoch drops the
// older scopes), and a gloo group of three members on threads meeting in the store of a
// WorkerService, with no directory.
#include "folio/dist/rendezvous_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "folio/dist/gloo_collectives.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_service.h"

namespace folio::dist {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(RendezvousStoreTest, WaitReturnsValuesOnceEveryKeyIsSet) {
  RendezvousStore store;
  ASSERT_TRUE(store.set("g", 1, "a", "alpha").ok());
  std::thread setter([&] {
    // Set while the wait below is blocked (or before it: either way it must see it).
    EXPECT_TRUE(store.set("g", 1, "b", std::string("b\0eta", 5)).ok());
  });
  Result<std::vector<std::string>> values = store.wait("g", 1, {"a", "b"}, 20s);
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  ASSERT_EQ(values->size(), 2u);
  EXPECT_EQ((*values)[0], "alpha");
  EXPECT_EQ((*values)[1], std::string("b\0eta", 5));
}

TEST(RendezvousStoreTest, TimeoutNamesTheMissingKeys) {
  RendezvousStore store;
  ASSERT_TRUE(store.set("g", 1, "rank_0", "x").ok());
  const Status status = store.wait("g", 1, {"rank_0", "rank_1", "rank_2"}, 50ms).status();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank_1, rank_2 not set within 50 ms"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("group 'g' epoch 1"));
}

TEST(RendezvousStoreTest, ScopesAreGroupAndEpoch) {
  RendezvousStore store;
  ASSERT_TRUE(store.set("g", 1, "k", "one").ok());
  // The same key in another epoch or group is another key.
  ASSERT_TRUE(store.set("g", 2, "k", "two").ok());
  ASSERT_TRUE(store.set("h", 1, "k", "other").ok());
  EXPECT_EQ(store.wait("g", 2, {"k"}, 0ms)->front(), "two");
  EXPECT_EQ(store.wait("h", 1, {"k"}, 0ms)->front(), "other");
  EXPECT_EQ(store.wait("g", 3, {"k"}, 0ms).status().code(), StatusCode::kDeadlineExceeded);
  // A key is set once per scope.
  const Status again = store.set("g", 1, "k", "again");
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.message()), HasSubstr("already exists"));
  // Dropping epochs before 2 leaves epoch 2 only.
  EXPECT_EQ(store.num_scopes(), 3u);
  store.drop_before(2);
  EXPECT_EQ(store.num_scopes(), 1u);
  // A dropped epoch is not brought back.
  EXPECT_EQ(store.wait("g", 1, {"k"}, 0ms).status().code(), StatusCode::kFailedPrecondition);
  const Status late = store.set("h", 1, "late", "v");
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(late.message()), HasSubstr("moved on to epoch 2"));
  EXPECT_EQ(store.num_scopes(), 1u);
  EXPECT_EQ(store.wait("g", 2, {"k"}, 0ms)->front(), "two");
}

TEST(RendezvousStoreTest, CloseEndsWaits) {
  RendezvousStore store;
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    store.close();
  });
  const Status status = store.wait("g", 1, {"never"}, 60s).status();
  closer.join();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(store.set("g", 1, "k", "v").code(), StatusCode::kUnavailable);
}

TEST(RendezvousStoreTest, RefusesValuesPastTheBound) {
  RendezvousStore store;
  const Status status =
      store.set("g", 1, "big", std::string(RendezvousStore::kMaxValueBytes + 1, 'x'));
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
}

std::unique_ptr<WorkerService> start_service() {
  WorkerServiceOptions options;
  options.model = ModelIdentity{.hash = "fnv1a64:0123456789abcdef", .name = "tiny"};
  auto service = WorkerService::start(std::move(options));
  EXPECT_TRUE(service.ok()) << service.status();
  return service.ok() ? std::move(*service) : nullptr;
}

TEST(RendezvousStoreServiceTest, SetAndWaitThroughTheWorker) {
  auto service = start_service();
  ASSERT_NE(service, nullptr);
  RendezvousStoreClient first(service->address(), "grp", 1);
  RendezvousStoreClient second(service->address(), "grp", 1);
  ASSERT_TRUE(first.set("rank_0", "addr0", 5s).ok());
  std::thread setter([&] { EXPECT_TRUE(second.set("rank_1", "addr1", 5s).ok()); });
  Result<std::vector<std::string>> values = first.wait({"rank_0", "rank_1"}, 20s, true);
  setter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<std::string>{"addr0", "addr1"}));
  // Without values: only the wait.
  Result<std::vector<std::string>> waited = first.wait({"rank_1"}, 1s, false);
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_TRUE(waited->empty());

  const Status missing = first.wait({"rank_0", "rank_2"}, 100ms, true).status();
  EXPECT_EQ(missing.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.message()), HasSubstr("rank_2 not set within 100 ms"));
  EXPECT_THAT(std::string(missing.message()), HasSubstr(service->address()));
  const Status twice = second.set("rank_1", "again", 5s);
  EXPECT_EQ(twice.code(), StatusCode::kAlreadyExists) << twice;
}

TEST(RendezvousStoreServiceTest, FenceIntoANewerEpochDropsOlderScopes) {
  auto service = start_service();
  ASSERT_NE(service, nullptr);
  RendezvousStoreClient old_epoch(service->address(), "grp", 0);
  ASSERT_TRUE(old_epoch.set("rank_0", "addr0", 5s).ok());
  ASSERT_TRUE(old_epoch.wait({"rank_0"}, 0ms, true).ok());
  auto client = WorkerClient::connect(
      service->address(), ModelIdentity{.hash = "fnv1a64:0123456789abcdef", .name = "tiny"});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->fence(1, 0).ok());
  const Status dropped = old_epoch.wait({"rank_0"}, 0ms, true).status();
  EXPECT_EQ(dropped.code(), StatusCode::kFailedPrecondition) << dropped;
  EXPECT_THAT(std::string(dropped.message()), HasSubstr("moved on to epoch 1"));
}

TEST(RendezvousStoreServiceTest, AnUnreachableWorkerIsUnavailable) {
  std::string address;
  {
    auto service = start_service();
    ASSERT_NE(service, nullptr);
    address = service->address();
  }
  RendezvousStoreClient client(address, "grp", 1);
  const Status status = client.set("rank_0", "x", 5s);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("member 0's worker " + address));
}

// Three gloo members on threads meet in a WorkerService's store (no directory), then sum.
TEST(RendezvousStoreServiceTest, GlooGroupFormsWithoutADirectory) {
  auto service = start_service();
  ASSERT_NE(service, nullptr);
  constexpr int kSize = 3;
  std::vector<Result<std::unique_ptr<Collectives>>> members;
  for (int rank = 0; rank < kSize; ++rank) members.emplace_back(internal_error("not formed"));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank) {
    threads.emplace_back([&, rank] {
      members[rank] = connect_gloo_group(GlooGroupOptions{.rank = rank,
                                                          .size = kSize,
                                                          .store_directory = "",
                                                          .store_address = service->address(),
                                                          .group_id = "grpc-store",
                                                          .epoch = 4,
                                                          .host = "127.0.0.1",
                                                          .timeout = 20s});
      if (!members[rank].ok()) return;
      std::vector<float> values{static_cast<float>(rank + 1)};
      EXPECT_TRUE((*members[rank])->all_reduce_sum(values).ok());
      EXPECT_EQ(values[0], 6.0f);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_TRUE(members[rank].ok()) << members[rank].status();
  }
}

// A member alone times out naming the ranks that never joined.
TEST(RendezvousStoreServiceTest, AMissingMemberIsNamed) {
  auto service = start_service();
  ASSERT_NE(service, nullptr);
  const Status status = connect_gloo_group(GlooGroupOptions{.rank = 0,
                                                            .size = 2,
                                                            .store_directory = "",
                                                            .store_address = service->address(),
                                                            .group_id = "lonely",
                                                            .epoch = 1,
                                                            .host = "127.0.0.1",
                                                            .timeout = 300ms})
                            .status();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 1 did not join within 300 ms"));
}

TEST(RendezvousStoreServiceTest, NoStoreAtAllIsRefused) {
  const Status status = connect_gloo_group(GlooGroupOptions{.rank = 0,
                                                            .size = 2,
                                                            .store_directory = "",
                                                            .store_address = "",
                                                            .group_id = "none",
                                                            .epoch = 0,
                                                            .host = "127.0.0.1",
                                                            .timeout = 1s})
                            .status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no rendezvous store"));
}

}  // namespace
}  // namespace folio::dist
