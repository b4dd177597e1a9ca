// The Collectives contract (collectives.h) as one typed GoogleTest suite, run over every
// backend: INSTANTIATE_TYPED_TEST_SUITE_P(Gloo, CollectivesContractTest, GlooBackend). A
// Backend has make(directory, size, timeout, group_id) -> Result<Members> and
// sums_in_rank_order(size): whether its all_reduce_sum adds in rank order for that size.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "collectives_script.h"
#include "collectives_test_util.h"
#include "testing/collective_groups.h"

namespace folio::dist::testing {

using folio::testing::Members;
using folio::testing::run_on_ranks;
using namespace std::chrono_literals;

// Long enough never to fire in a healthy run (a loaded 2-core machine included).
constexpr std::chrono::milliseconds kHealthyTimeout = 60s;
// Short, for the tests where a peer is missing: the failure comes after this long.
constexpr std::chrono::milliseconds kFailureTimeout = 1000ms;

template <typename Backend>
class CollectivesContractTest : public ::testing::Test {
 protected:
  Members make(int size, std::chrono::milliseconds timeout = kHealthyTimeout) {
    const std::string group_id = "contract" + std::to_string(next_group_++);
    auto members = Backend::make(directory_.path(), size, timeout, group_id);
    EXPECT_TRUE(members.ok()) << members.status();
    return members.ok() ? std::move(members).value() : Members();
  }

  folio::testing::TemporaryDirectory directory_;
  int next_group_ = 0;
};

TYPED_TEST_SUITE_P(CollectivesContractTest);

TYPED_TEST_P(CollectivesContractTest, AllReduceSumIsExactEnoughAndBitIdenticalOnEveryRank) {
  for (int size : {1, 2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    Members members = this->make(size);
    ASSERT_EQ(members.size(), static_cast<size_t>(size));
    const auto& counts = script_reduce_counts();
    // results[rank][count index]
    std::vector<std::vector<std::vector<float>>> results(size);
    run_on_ranks(size, [&](int rank) {
      for (size_t count : counts) {
        std::vector<float> values = rank_values(rank, count);
        FOLIO_EXPECT_OK(members[rank]->all_reduce_sum(values));
        results[rank].push_back(std::move(values));
      }
    });
    for (size_t c = 0; c < counts.size(); ++c) {
      SCOPED_TRACE("count " + std::to_string(counts[c]));
      std::vector<std::vector<float>> inputs;
      for (int rank = 0; rank < size; ++rank) inputs.push_back(rank_values(rank, counts[c]));
      expect_within_summation_bound(results[0][c], inputs);
      for (int rank = 1; rank < size; ++rank) {
        EXPECT_TRUE(bit_equal(results[rank][c], results[0][c])) << "rank " << rank;
      }
      if (TypeParam::sums_in_rank_order(size)) {
        EXPECT_TRUE(bit_equal(results[0][c], rank_order_sum(inputs)));
      }
    }
  }
}

TYPED_TEST_P(CollectivesContractTest, AllGatherConcatenatesTheInputsInRankOrder) {
  for (int size : {1, 2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    Members members = this->make(size);
    ASSERT_EQ(members.size(), static_cast<size_t>(size));
    run_on_ranks(size, [&](int rank) {
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{3072}}) {
        std::vector<std::byte> output(bytes * size);
        FOLIO_EXPECT_OK(members[rank]->all_gather(rank_bytes(rank, bytes), output));
        std::vector<std::byte> expected;
        for (int from = 0; from < size; ++from) {
          const auto part = rank_bytes(from, bytes);
          expected.insert(expected.end(), part.begin(), part.end());
        }
        EXPECT_EQ(output, expected) << "rank " << rank << ", " << bytes << " bytes";
      }
      const std::vector<float> input = rank_values(rank, 5);
      std::vector<float> output(5 * size);
      FOLIO_EXPECT_OK(members[rank]->all_gather(std::span<const float>(input), output));
      for (int from = 0; from < size; ++from) {
        EXPECT_TRUE(bit_equal(std::span(output).subspan(from * 5, 5), rank_values(from, 5)));
      }
    });
  }
}

TYPED_TEST_P(CollectivesContractTest, BroadcastCopiesTheRootsBytesFromEveryRoot) {
  for (int size : {1, 2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    Members members = this->make(size);
    ASSERT_EQ(members.size(), static_cast<size_t>(size));
    run_on_ranks(size, [&](int rank) {
      for (int root = 0; root < size; ++root) {
        for (size_t bytes : {size_t{1}, size_t{4099}}) {
          std::vector<std::byte> buffer =
              rank == root ? rank_bytes(root, bytes) : std::vector<std::byte>(bytes);
          FOLIO_EXPECT_OK(members[rank]->broadcast(buffer, root));
          EXPECT_EQ(buffer, rank_bytes(root, bytes)) << "rank " << rank << ", root " << root;
        }
      }
    });
  }
}

TYPED_TEST_P(CollectivesContractTest, SendRecvPassesMessagesDownAPipelineInOrder) {
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    Members members = this->make(size);
    ASSERT_EQ(members.size(), static_cast<size_t>(size));
    std::vector<Status> outcomes(size);
    run_on_ranks(size, [&](int rank) {
      std::vector<std::byte> transcript;
      outcomes[rank] = run_script(*members[rank], transcript);
    });
    for (int rank = 0; rank < size; ++rank) FOLIO_EXPECT_OK(outcomes[rank]);
  }
}

TYPED_TEST_P(CollectivesContractTest, BarrierWaitsForEveryRank) {
  constexpr int kSize = 3;
  Members members = this->make(kSize);
  ASSERT_EQ(members.size(), static_cast<size_t>(kSize));
  std::atomic<int> entered[3] = {0, 0, 0};
  run_on_ranks(kSize, [&](int rank) {
    for (int round = 1; round <= 3; ++round) {
      entered[rank].store(round);
      FOLIO_EXPECT_OK(members[rank]->barrier());
      for (int other = 0; other < kSize; ++other) EXPECT_GE(entered[other].load(), round);
    }
  });
}

TYPED_TEST_P(CollectivesContractTest, BadArgumentsAreRefusedAndLeaveTheGroupUsable) {
  constexpr int kSize = 2;
  Members members = this->make(kSize);
  ASSERT_EQ(members.size(), static_cast<size_t>(kSize));
  run_on_ranks(kSize, [&](int rank) {
    Collectives& member = *members[rank];
    std::vector<std::byte> bytes(8);
    for (int peer : {-1, kSize, rank}) {
      const Status sent = member.send(bytes, peer);
      EXPECT_EQ(sent.code(), StatusCode::kInvalidArgument) << sent;
      EXPECT_NE(sent.message().find("rank " + std::to_string(rank)), std::string_view::npos);
      EXPECT_EQ(member.recv(bytes, peer).code(), StatusCode::kInvalidArgument);
    }
    EXPECT_EQ(member.broadcast(bytes, kSize).code(), StatusCode::kInvalidArgument);
    std::vector<std::byte> output(8 * kSize + 1);
    EXPECT_EQ(member.all_gather(bytes, output).code(), StatusCode::kInvalidArgument);
    std::vector<std::byte> shared(8 * kSize);
    EXPECT_EQ(member.all_gather(std::span(shared).subspan(0, 8), shared).code(),
              StatusCode::kInvalidArgument);
    // Still whole: a real collective succeeds afterwards.
    std::vector<float> values = {static_cast<float>(rank + 1)};
    FOLIO_EXPECT_OK(member.all_reduce_sum(values));
    EXPECT_EQ(values[0], 3.0f);
  });
}

TYPED_TEST_P(CollectivesContractTest, AMissingPeerFailsTheCallAndBreaksTheGroup) {
  Members members = this->make(2, kFailureTimeout);
  ASSERT_EQ(members.size(), 2u);
  std::vector<float> values(768, 1.0f);
  // Rank 1 does not take part: rank 0 waits out the timeout.
  const Status first = members[0]->all_reduce_sum(values);
  EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first;
  EXPECT_NE(first.message().find("rank 0"), std::string_view::npos) << first;
  EXPECT_NE(first.message().find("all_reduce_sum"), std::string_view::npos) << first;
  EXPECT_NE(first.message().find(std::to_string(kFailureTimeout.count()) + " ms"),
            std::string_view::npos)
      << first;
  const Status second = members[0]->barrier();
  EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition) << second;
  EXPECT_NE(second.message().find("broken"), std::string_view::npos) << second;
  // The late rank finds the group broken (in-process) or its peer gone (gloo closed the
  // connections after the timeout): an error either way, within its timeout.
  EXPECT_FALSE(members[1]->all_reduce_sum(values).ok());
}

TYPED_TEST_P(CollectivesContractTest, ARecvWithoutASenderTimesOutNamingThePeer) {
  Members members = this->make(2, kFailureTimeout);
  ASSERT_EQ(members.size(), 2u);
  std::vector<std::byte> buffer(768 * 4);
  const Status status = members[1]->recv(buffer, 0);
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(status.message().find("from rank 0"), std::string_view::npos) << status;
  EXPECT_NE(status.message().find("3072 bytes"), std::string_view::npos) << status;
}

TYPED_TEST_P(CollectivesContractTest, SizesThatDifferBetweenRanksFailOnEveryRank) {
  {
    Members members = this->make(2, kFailureTimeout);
    ASSERT_EQ(members.size(), 2u);
    std::vector<Status> outcomes(2);
    run_on_ranks(2, [&](int rank) {
      std::vector<float> values(768 + rank, 1.0f);
      outcomes[rank] = members[rank]->all_reduce_sum(values);
    });
    EXPECT_FALSE(outcomes[0].ok());
    EXPECT_FALSE(outcomes[1].ok());
  }
  {
    Members members = this->make(2, kFailureTimeout);
    ASSERT_EQ(members.size(), 2u);
    std::vector<Status> outcomes(2);
    run_on_ranks(2, [&](int rank) {
      // Rank 0 sends more than rank 1 expects: gloo would abort the process on this if the
      // two calls met.
      std::vector<std::byte> buffer(rank == 0 ? 4096 : 3072);
      outcomes[rank] = rank == 0 ? members[0]->send(buffer, 1) : members[1]->recv(buffer, 0);
    });
    EXPECT_FALSE(outcomes[0].ok()) << outcomes[0];
    EXPECT_FALSE(outcomes[1].ok()) << outcomes[1];
    EXPECT_NE(outcomes[1].message().find("3072 bytes"), std::string_view::npos) << outcomes[1];
  }
}

TYPED_TEST_P(CollectivesContractTest, APeerThatLeavesFailsTheOthers) {
  Members members = this->make(2, kFailureTimeout);
  ASSERT_EQ(members.size(), 2u);
  members[1].reset();
  std::vector<float> values(768, 1.0f);
  const Status status = members[0]->all_reduce_sum(values);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("rank 0"), std::string_view::npos) << status;
}

REGISTER_TYPED_TEST_SUITE_P(
    CollectivesContractTest, AllReduceSumIsExactEnoughAndBitIdenticalOnEveryRank,
    AllGatherConcatenatesTheInputsInRankOrder, BroadcastCopiesTheRootsBytesFromEveryRoot,
    SendRecvPassesMessagesDownAPipelineInOrder, BarrierWaitsForEveryRank,
    BadArgumentsAreRefusedAndLeaveTheGroupUsable, AMissingPeerFailsTheCallAndBreaksTheGroup,
    ARecvWithoutASenderTimesOutNamingThePeer, SizesThatDifferBetweenRanksFailOnEveryRank,
    APeerThatLeavesFailsTheOthers);

}  // namespace folio::dist::testing
